# libnvio, the nvio tool and the C tests.
#
#   make                 library (static + shared) and build/nvio
#   make check           build and run the C test suite
#   make SAN=address     same, under ASan+UBSan, in build-asan/
#   make SAN=thread      same, under TSan, in build-tsan/
#   make CC=clang        any compiler; warnings are errors
#
# liburing and libaio are used when their headers are found; an engine
# whose library is missing reports so (nvio report) instead of failing
# the build.

CC ?= cc
SAN ?=
ifeq ($(SAN),)
BUILD ?= build
else ifeq ($(SAN),address)
BUILD ?= build-asan
SANFLAGS = -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all
else ifeq ($(SAN),thread)
BUILD ?= build-tsan
SANFLAGS = -fsanitize=thread -fno-omit-frame-pointer
else
$(error SAN must be empty, address or thread)
endif

# "#" starts a comment in make, so the probe's include comes from a variable.
HASH := \#
have_lib = $(shell printf '$(HASH)include <%s>\nint main(void){return 0;}\n' $(1) | \
	$(CC) -x c - -o /dev/null $(2) 2>/dev/null && echo 1)
HAVE_URING := $(call have_lib,liburing.h,-luring)
HAVE_AIO := $(call have_lib,libaio.h,-laio)

cc_flag = $(shell $(CC) $(1) -Werror -E -x c /dev/null >/dev/null 2>&1 && echo $(1))
WARN = -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wmissing-prototypes \
	-Wno-unused-parameter $(call cc_flag,-Wno-format-truncation)
CFLAGS ?= -O2 -g
NVIO_CFLAGS = -std=c11 -D_GNU_SOURCE -fPIC -fvisibility=hidden -pthread \
	-Iinclude $(WARN) $(SANFLAGS)
LIBS = -pthread -ldl
ifeq ($(HAVE_URING),1)
NVIO_CFLAGS += -DNVIO_HAVE_URING=1
LIBS += -luring
endif
ifeq ($(HAVE_AIO),1)
NVIO_CFLAGS += -DNVIO_HAVE_AIO=1
LIBS += -laio
endif

# -z defs proves the library names every library it uses; sanitizer
# runtimes are resolved by the executable, so it is off under SAN.
ZDEFS = $(if $(SAN),,-Wl,-z,defs)

LIB_SRC = $(wildcard src/*.c)
LIB_OBJ = $(patsubst src/%.c,$(BUILD)/obj/%.o,$(LIB_SRC))
TEST_SRC = $(wildcard tests/*.c)
TEST_BIN = $(patsubst tests/%.c,$(BUILD)/tests/%,$(filter-out tests/t.c,$(TEST_SRC)))

.PHONY: all lib tool check clean print-libs
all: lib tool

lib: $(BUILD)/libnvio.a $(BUILD)/libnvio.so
tool: $(BUILD)/nvio

# Objects depend on the compiler and flags they were built with.
FLAGS_STAMP := $(BUILD)/.flags
FLAGS_NOW := $(CC) $(CFLAGS) $(NVIO_CFLAGS) $(LIBS)
$(shell mkdir -p $(BUILD); echo '$(FLAGS_NOW)' | cmp -s - $(FLAGS_STAMP) || \
	echo '$(FLAGS_NOW)' > $(FLAGS_STAMP))

$(BUILD)/obj/%.o: src/%.c include/nvio.h $(wildcard src/*.h) Makefile $(FLAGS_STAMP)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(NVIO_CFLAGS) -c $< -o $@

$(BUILD)/libnvio.a: $(LIB_OBJ)
	rm -f $@
	ar rcs $@ $^

# Only the public API is exported (src/libnvio.map).
$(BUILD)/libnvio.so: $(LIB_OBJ) src/libnvio.map
	$(CC) -shared -o $@ $(LIB_OBJ) -Wl,-soname,libnvio.so.0 \
		-Wl,--version-script=src/libnvio.map $(ZDEFS) $(SANFLAGS) $(LIBS)

$(BUILD)/nvio: $(wildcard tools/*.c) $(wildcard tools/*.h) $(BUILD)/libnvio.a
	$(CC) $(CFLAGS) $(NVIO_CFLAGS) -o $@ $(filter %.c,$^) $(BUILD)/libnvio.a $(LIBS) -lm

# Tests link the static library so they can reach the syscall table.
$(BUILD)/tests/%: tests/%.c tests/t.c tests/t.h $(BUILD)/libnvio.a
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(NVIO_CFLAGS) -Isrc -o $@ $< tests/t.c $(BUILD)/libnvio.a $(LIBS)

# A stand-in CUDA driver for test_cuda (tests/stub/libcuda.c).
STUB_CUDA = $(BUILD)/tests/stub/libcuda.so.1
$(STUB_CUDA): tests/stub/libcuda.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(NVIO_CFLAGS) -shared -o $@ $< -Wl,-soname,libcuda.so.1

# And one for cuFile (tests/stub/libcufile.c), found via NVIO_CUFILE_LIB.
STUB_CUFILE = $(BUILD)/tests/stub/libcufile.so.0
$(STUB_CUFILE): tests/stub/libcufile.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(NVIO_CFLAGS) -shared -o $@ $< -Wl,-soname,libcufile.so.0

check: all $(TEST_BIN) $(STUB_CUDA) $(STUB_CUFILE)
	@sh tests/run.sh $(BUILD)

print-libs:
	@echo $(LIBS)

clean:
	rm -rf build build-asan build-tsan
