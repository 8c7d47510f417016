# libnvio, the nvio tool and the C tests.
#
#   make                 library (static + shared) and build/nvio
#   make check           build and run the C test suite
#   make SAN=address     same, under ASan+UBSan, in build-asan/
#   make SAN=thread      same, under TSan, in build-tsan/
#   make CC=clang        any compiler
#   make WERROR=1        warnings are errors (CI and scripts/test.sh set it;
#                        off by default so newer compilers can build releases)
#   make install         header, libraries, nvio.pc, man pages and the tool
#                        under DESTDIR/PREFIX (default /usr/local); make uninstall
#   make check-symbols   libnvio.so exports exactly include/nvio.h's functions
#   (make check also runs tests/cycles_check.sh: no file cycles in src/, tools/)
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
WERROR ?= 0
WARN = -Wall -Wextra $(if $(filter 1,$(WERROR)),-Werror) -Wshadow -Wstrict-prototypes -Wmissing-prototypes \
	-Wno-unused-parameter $(call cc_flag,-Wno-format-truncation)
CFLAGS ?= -O2 -g
NVIO_CFLAGS = -std=c11 -D_GNU_SOURCE -DNVIO_SYMVER=1 -fPIC -fvisibility=hidden -pthread \
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

# The version comes from the header; the shared library is named after it:
# libnvio.so.MAJOR.MINOR.PATCH, its soname libnvio.so.MAJOR (what programs
# record and the loader looks for) and libnvio.so (what -lnvio finds).
nvio_version_part = $(shell sed -n 's/^\#define NVIO_VERSION_$(1) \([0-9]*\).*/\1/p' include/nvio.h)
VERSION := $(call nvio_version_part,MAJOR).$(call nvio_version_part,MINOR).$(call nvio_version_part,PATCH)
SONAME := libnvio.so.$(call nvio_version_part,MAJOR)
SHLIB := libnvio.so.$(VERSION)

LIB_SRC = $(wildcard src/*.c)
LIB_OBJ = $(patsubst src/%.c,$(BUILD)/obj/%.o,$(LIB_SRC))
TEST_SRC = $(wildcard tests/*.c)
TEST_BIN = $(patsubst tests/%.c,$(BUILD)/tests/%,$(filter-out tests/t.c,$(TEST_SRC)))

.PHONY: all lib tool sim check check-symbols clean print-libs install uninstall
all: lib tool

lib: $(BUILD)/libnvio.a $(BUILD)/libnvio.so $(BUILD)/nvio.pc
tool: $(BUILD)/nvio

# Objects depend on the compiler and flags they were built with.
FLAGS_STAMP := $(BUILD)/.flags
FLAGS_NOW := $(CC) $(CPPFLAGS) $(CFLAGS) $(NVIO_CFLAGS) $(LDFLAGS) $(LIBS)
$(shell mkdir -p $(BUILD); echo '$(FLAGS_NOW)' | cmp -s - $(FLAGS_STAMP) || \
	echo '$(FLAGS_NOW)' > $(FLAGS_STAMP))

$(BUILD)/obj/%.o: src/%.c include/nvio.h $(wildcard src/*.h) Makefile $(FLAGS_STAMP)
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(NVIO_CFLAGS) -c $< -o $@

$(BUILD)/libnvio.a: $(LIB_OBJ)
	rm -f $@
	ar rcs $@ $^

# Only the public API is exported (src/libnvio.map). The links let
# "-Lbuild -lnvio" link and LD_LIBRARY_PATH=build run, as installed.
$(BUILD)/$(SHLIB): $(LIB_OBJ) src/libnvio.map
	$(CC) $(LDFLAGS) -shared -o $@ $(LIB_OBJ) -Wl,-soname,$(SONAME) \
		-Wl,--version-script=src/libnvio.map $(ZDEFS) $(SANFLAGS) $(LIBS)

$(BUILD)/libnvio.so: $(BUILD)/$(SHLIB)
	ln -sf $(SHLIB) $(BUILD)/$(SONAME)
	ln -sf $(SONAME) $@

$(BUILD)/nvio: $(wildcard tools/*.c) $(wildcard tools/*.h) $(BUILD)/libnvio.a
	$(CC) $(CPPFLAGS) $(CFLAGS) $(NVIO_CFLAGS) $(LDFLAGS) -o $@ $(filter %.c,$^) \
		$(BUILD)/libnvio.a $(LIBS) -lm

# Tests link the static library so they can reach the syscall table.
$(BUILD)/tests/%: tests/%.c tests/t.c tests/t.h tests/sim/sim.h $(BUILD)/libnvio.a
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(NVIO_CFLAGS) -Isrc -o $@ $< tests/t.c $(BUILD)/libnvio.a $(LIBS)

# The simulated CUDA driver and cuFile the GPU tests load in place of
# the real ones (tests/sim/: device memory that faults on host access,
# asynchronous copies, per-thread contexts, failures by count).
SIM_CUDA = $(BUILD)/tests/sim/libcuda.so.1
SIM_CUFILE = $(BUILD)/tests/sim/libcufile.so.0
$(SIM_CUDA): tests/sim/libcuda.c tests/sim/sim.h
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(NVIO_CFLAGS) -Wno-missing-prototypes -shared -o $@ $< -Wl,-soname,libcuda.so.1 -pthread

# Like the real one, the simulated cuFile needs the (simulated) driver.
$(SIM_CUFILE): tests/sim/libcufile.c tests/sim/sim.h $(SIM_CUDA)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(NVIO_CFLAGS) -Wno-missing-prototypes -shared -o $@ $< \
		-Wl,-soname,libcufile.so.0 -Wl,--no-as-needed $(SIM_CUDA) -Wl,-rpath,'$$ORIGIN' -ldl -pthread

sim: $(SIM_CUDA) $(SIM_CUFILE)

check: all $(TEST_BIN) $(SIM_CUDA) $(SIM_CUFILE)
	@sh tests/run.sh $(BUILD)
	@CC="$(CC)" sh tests/cycles_check.sh $(BUILD)

check-symbols: $(BUILD)/libnvio.so
	@sh tests/symbols_check.sh $(BUILD)/libnvio.so include/nvio.h

# Installation. DESTDIR stages into a directory (packagers); PREFIX is
# where the files will live, and goes into nvio.pc. Debian would use
# LIBDIR=/usr/lib/$(DEB_HOST_MULTIARCH).
PREFIX ?= /usr/local
BINDIR ?= $(PREFIX)/bin
LIBDIR ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
MANDIR ?= $(PREFIX)/share/man
PKGCONFIGDIR ?= $(LIBDIR)/pkgconfig
INSTALL ?= install

MAN1 = man/nvio.1 $(wildcard man/man1/*.1)
MAN3 = $(wildcard man/man3/*.3)
MAN7 = $(wildcard man/man7/*.7)

# Private libraries are listed for static linking (pkg-config --static).
# nvio.pc names the directories, so it is made again when they change.
DIRS_STAMP := $(BUILD)/.dirs
DIRS_NOW := $(PREFIX) $(LIBDIR) $(INCLUDEDIR)
$(shell echo '$(DIRS_NOW)' | cmp -s - $(DIRS_STAMP) || echo '$(DIRS_NOW)' > $(DIRS_STAMP))

$(BUILD)/nvio.pc: nvio.pc.in include/nvio.h Makefile $(FLAGS_STAMP) $(DIRS_STAMP)
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@LIBDIR@|$(LIBDIR)|' \
		-e 's|@INCLUDEDIR@|$(INCLUDEDIR)|' -e 's|@VERSION@|$(VERSION)|' \
		-e 's|@LIBS_PRIVATE@|$(LIBS)|' nvio.pc.in > $@

install: all
	$(INSTALL) -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBDIR) $(DESTDIR)$(INCLUDEDIR) \
		$(DESTDIR)$(PKGCONFIGDIR) $(DESTDIR)$(MANDIR)/man1 \
		$(DESTDIR)$(MANDIR)/man3 $(DESTDIR)$(MANDIR)/man7
	$(INSTALL) -m 755 $(BUILD)/nvio $(DESTDIR)$(BINDIR)/nvio
	$(INSTALL) -m 644 include/nvio.h $(DESTDIR)$(INCLUDEDIR)/nvio.h
	$(INSTALL) -m 644 $(BUILD)/libnvio.a $(DESTDIR)$(LIBDIR)/libnvio.a
	$(INSTALL) -m 755 $(BUILD)/$(SHLIB) $(DESTDIR)$(LIBDIR)/$(SHLIB)
	ln -sf $(SHLIB) $(DESTDIR)$(LIBDIR)/$(SONAME)
	ln -sf $(SONAME) $(DESTDIR)$(LIBDIR)/libnvio.so
	$(INSTALL) -m 644 $(BUILD)/nvio.pc $(DESTDIR)$(PKGCONFIGDIR)/nvio.pc
	$(INSTALL) -m 644 $(MAN1) $(DESTDIR)$(MANDIR)/man1
	$(INSTALL) -m 644 $(MAN3) $(DESTDIR)$(MANDIR)/man3
	$(INSTALL) -m 644 $(MAN7) $(DESTDIR)$(MANDIR)/man7

# Removes the files install made; directories stay (they may be shared).
uninstall:
	rm -f $(DESTDIR)$(BINDIR)/nvio $(DESTDIR)$(INCLUDEDIR)/nvio.h \
		$(DESTDIR)$(LIBDIR)/libnvio.a $(DESTDIR)$(LIBDIR)/$(SHLIB) \
		$(DESTDIR)$(LIBDIR)/$(SONAME) $(DESTDIR)$(LIBDIR)/libnvio.so \
		$(DESTDIR)$(PKGCONFIGDIR)/nvio.pc \
		$(addprefix $(DESTDIR)$(MANDIR)/man1/,$(notdir $(MAN1))) \
		$(addprefix $(DESTDIR)$(MANDIR)/man3/,$(notdir $(MAN3))) \
		$(addprefix $(DESTDIR)$(MANDIR)/man7/,$(notdir $(MAN7)))

print-libs:
	@echo $(LIBS)

clean:
	rm -rf build build-asan build-tsan
