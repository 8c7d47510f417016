#!/bin/sh
# packaging_check.sh - nvio as a packager, a C user and a pip user meet it.
#
#   sh tests/packaging_check.sh
#
# Checks, each counted as one test:
#   the exported symbols equal include/nvio.h's functions (symbols_check.sh);
#   build/ has libnvio.so -> libnvio.so.MAJOR -> libnvio.so.VERSION, and a
#   program linked with -Lbuild -lnvio runs with LD_LIBRARY_PATH=build;
#   make install PREFIX=/usr DESTDIR=stage puts every file in place, a
#   program built with pkg-config against the staged copy (shared, and
#   static with --static) runs, the staged tool runs, make uninstall
#   leaves no file behind;
#   the sdist holds every file the build reads, and builds a cp311-abi3
#   wheel offline (pip wheel --no-build-isolation --no-deps) in a fresh
#   venv, with the oldest setuptools pyproject.toml allows when the package
#   index can supply it (else skipped); the wheel needs no library outside
#   glibc (readelf -d, and auditwheel show when installed); it installs,
#   imports, round-trips bytes through nvio.AioHandle, runs `nvio report`
#   and `nvio man` from the venv's bin/, and loads in a newer Python when
#   one is found (abi3).
#
# Ends with "N passed, N failed, N skipped"; exits 1 if any check failed.
# WERROR=1 in the environment reaches make. PYTHON picks the interpreter.

set -u
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root" || exit 1
PY=${PYTHON:-python3}
CC=${CC:-cc}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/nvio-pkg.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT INT TERM
pass=0 fail=0 skip=0

ok() { pass=$((pass + 1)); echo "PASS $*"; }
bad() { fail=$((fail + 1)); echo "FAIL $*"; }
skipped() { skip=$((skip + 1)); echo "SKIP $*"; }

# check NAME COMMAND...: one test; the command's output is shown on failure.
check() {
	name=$1; shift
	if "$@" >"$tmp/out" 2>&1; then
		ok "$name"
	else
		bad "$name"
		sed 's/^/    /' "$tmp/out"
	fi
}

part() { sed -n "s/^#define NVIO_VERSION_$1 \\([0-9]*\\).*/\\1/p" include/nvio.h; }
VERSION=$(part MAJOR).$(part MINOR).$(part PATCH)
SONAME=libnvio.so.$(part MAJOR)

# --- the build tree -------------------------------------------------------

check "make builds the library, its links and the tool" make -s -j2 all
check "exports equal the header's NVIO_API functions" \
	sh tests/symbols_check.sh build/libnvio.so include/nvio.h

build_links() {
	[ "$(readlink build/libnvio.so)" = "$SONAME" ] || { echo "build/libnvio.so: $(ls -l build/libnvio.so)"; return 1; }
	[ "$(readlink "build/$SONAME")" = "libnvio.so.$VERSION" ] || { echo "build/$SONAME: $(ls -l "build/$SONAME")"; return 1; }
	[ -f "build/libnvio.so.$VERSION" ] && [ ! -L "build/libnvio.so.$VERSION" ] || return 1
	readelf -d "build/libnvio.so.$VERSION" | grep "SONAME.*\\[$SONAME\\]"
}
check "build/ has libnvio.so -> $SONAME -> libnvio.so.$VERSION" build_links

# The program must find the library through LD_LIBRARY_PATH, and that copy.
run_consumer() {
	libdir=$1; shift
	LD_LIBRARY_PATH=$libdir ldd "$1" | grep -q "$SONAME => $libdir/$SONAME" ||
		{ LD_LIBRARY_PATH=$libdir ldd "$1"; return 1; }
	mkdir -p "$tmp/data" && LD_LIBRARY_PATH=$libdir "$@" "$tmp/data"
}
link_build() {
	$CC -std=c11 -Wall -Wextra -Iinclude -o "$tmp/consumer-build" tests/pkg/consumer.c \
		-Lbuild -lnvio && run_consumer "$root/build" "$tmp/consumer-build"
}
check "a program linked with -Lbuild -lnvio runs with LD_LIBRARY_PATH=build" link_build

# A program linked against 0.1's nvio_error_t gets the 0.1 layout.
abi_v01() {
	$CC -std=c11 -Wall -o "$tmp/abi_v01" tests/pkg/abi_v01.c -Lbuild -lnvio &&
		LD_LIBRARY_PATH=build "$tmp/abi_v01"
}
check "0.1 callers of nvio_last_error/nvio_format_error keep the 0.1 layout" abi_v01

# A program linked against 0.2's nvio_op_t/nvio_completion_t gets 0.2's layouts.
abi_v02() {
	$CC -std=c11 -Wall -o "$tmp/abi_v02" tests/pkg/abi_v02.c -Lbuild -lnvio &&
		mkdir -p "$tmp/data" && LD_LIBRARY_PATH=build "$tmp/abi_v02" "$tmp/data"
}
check "0.2 callers of nvio_submit/nvio_reap/nvio_completion_error keep the 0.2 layouts" abi_v02

# --- make install / uninstall -------------------------------------------

stage=$tmp/stage
check "make install PREFIX=/usr DESTDIR=stage" make -s install PREFIX=/usr DESTDIR="$stage"

installed_files() {
	s=$stage/usr
	for f in include/nvio.h lib/libnvio.a lib/pkgconfig/nvio.pc bin/nvio \
		share/man/man1/nvio.1 share/man/man7/nvio.7; do
		[ -f "$s/$f" ] || { echo "missing $s/$f"; return 1; }
	done
	[ -f "$s/lib/libnvio.so.$VERSION" ] && [ ! -L "$s/lib/libnvio.so.$VERSION" ] ||
		{ echo "libnvio.so.$VERSION is not a file"; return 1; }
	[ "$(readlink "$s/lib/$SONAME")" = "libnvio.so.$VERSION" ] || { echo "bad $SONAME link"; return 1; }
	[ "$(readlink "$s/lib/libnvio.so")" = "$SONAME" ] || { echo "bad libnvio.so link"; return 1; }
	want=$(ls man/man3/*.3 | wc -l)
	got=$(ls "$s/share/man/man3/"*.3 | wc -l)
	[ "$want" = "$got" ] || { echo "man3: $got pages installed of $want"; return 1; }
	grep -qx "prefix=/usr" "$s/lib/pkgconfig/nvio.pc" && grep -qx "Version: $VERSION" "$s/lib/pkgconfig/nvio.pc"
}
check "install put header, libraries, links, nvio.pc, man1/3/7 and the tool in place" installed_files

# pkg-config as a cross or staged build sees it: only the staged .pc files,
# every path prefixed with the staging directory.
pc() {
	PKG_CONFIG_PATH= PKG_CONFIG_LIBDIR=$stage/usr/lib/pkgconfig \
		PKG_CONFIG_SYSROOT_DIR=$stage pkg-config "$@" nvio
}
link_pkgconfig() {
	[ "$(pc --modversion)" = "$VERSION" ] || { pc --modversion; return 1; }
	# shellcheck disable=SC2046
	$CC -std=c11 -Wall -Wextra -o "$tmp/consumer-pc" tests/pkg/consumer.c $(pc --cflags --libs) &&
		run_consumer "$stage/usr/lib" "$tmp/consumer-pc"
}
if command -v pkg-config >/dev/null 2>&1; then
	check "pkg-config --cflags --libs nvio builds a program that runs on the staged library" link_pkgconfig
else
	skipped "pkg-config: not installed (apt-get install pkg-config)"
fi

# Libs.private must name everything libnvio.a needs.
link_static() {
	# shellcheck disable=SC2046
	$CC -std=c11 -o "$tmp/consumer-static" tests/pkg/consumer.c $(pc --cflags) \
		"$stage/usr/lib/libnvio.a" $(pc --static --libs | sed 's/-lnvio//') &&
		! readelf -d "$tmp/consumer-static" | grep -q libnvio &&
		mkdir -p "$tmp/data" && "$tmp/consumer-static" "$tmp/data"
}
if command -v pkg-config >/dev/null 2>&1; then
	check "pkg-config --static links libnvio.a into a program that runs" link_static
else
	skipped "pkg-config --static: not installed"
fi

check "the installed tool runs: nvio --version" sh -c \
	"'$stage/usr/bin/nvio' --version | grep -qx 'nvio $VERSION'"

uninstall_clean() {
	make -s uninstall PREFIX=/usr DESTDIR="$stage" || return 1
	left=$(find "$stage" ! -type d)
	[ -z "$left" ] || { echo "left behind:"; echo "$left"; return 1; }
}
check "make uninstall leaves no file behind" uninstall_clean

# --- Python: sdist -> wheel -> venv ---------------------------------------

# From a copy of the files git would commit: setuptools adds whatever a
# stale python/nvio.egg-info/SOURCES.txt lists, which would hide a file
# missing from MANIFEST.in. Straight through setuptools' PEP 517 hook: no
# network, no 'build' package.
clean_sdist() {
	mkdir -p "$tmp/src" || return 1
	if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
		git ls-files -co --exclude-standard | while read -r f; do
			[ -e "$f" ] && echo "$f"
		done | tar cf - -T - | tar xf - -C "$tmp/src"
	else
		tar cf - --exclude='*.egg-info' --exclude='./build*' . | tar xf - -C "$tmp/src"
	fi || return 1
	(cd "$tmp/src" && "$PY" -c '
import sys
from setuptools import build_meta
print(build_meta.build_sdist(sys.argv[1]))' "$tmp/dist")
}
check "sdist builds" clean_sdist
sdist=$(ls "$tmp"/dist/nvio-*.tar.gz 2>/dev/null | head -n 1)

sdist_complete() {
	tar tzf "$sdist" | sed 's|^[^/]*/||' | sort >"$tmp/sdist.txt"
	missing=0
	for f in setup.py pyproject.toml MANIFEST.in LICENSE CHANGELOG.md README.md include/*.h \
		src/*.c src/*.h src/libnvio.map tools/*.c tools/*.h man/*.1 man/man3/*.3 \
		man/man7/*.7 python/nvio/*.py python/nvio/*.c python/nvio/*.pyi \
		python/nvio/py.typed python/nvio/_ext/*.c python/nvio/_ext/*.h; do
		[ -e "$f" ] || continue   # an unmatched glob
		grep -qx "$f" "$tmp/sdist.txt" || { echo "not in the sdist: $f"; missing=1; }
	done
	return $missing
}
check "the sdist has every file the build reads" sdist_complete

# build_wheel VENV OUTDIR: the sdist to a wheel, offline, no isolation.
build_wheel() {
	"$1/bin/pip" wheel -q --no-build-isolation --no-deps --no-index -w "$2" "$sdist"
}
venv=$tmp/venv
venv_wheel() {
	"$PY" -m venv --system-site-packages "$venv" && build_wheel "$venv" "$tmp/wheels"
}
check "a wheel builds from the sdist in a fresh venv" venv_wheel
wheel=$(ls "$tmp"/wheels/nvio-*.whl 2>/dev/null | head -n 1)

check "the wheel is tagged cp311-abi3" sh -c "echo '$wheel' | grep -q 'nvio-$VERSION-cp311-abi3-linux_'"

# Oldest setuptools: from the package index if it answers, else skipped.
old=$tmp/venv-setuptools64
if "$PY" -m venv "$old" >"$tmp/out" 2>&1 &&
	timeout 120 "$old/bin/pip" install -q "setuptools==64.0.0" wheel >>"$tmp/out" 2>&1; then
	check "a wheel builds from the sdist with setuptools 64.0.0" build_wheel "$old" "$tmp/wheels64"
else
	skipped "setuptools 64.0.0: could not be installed from the package index"
fi

wheel_contents() {
	"$PY" - "$wheel" <<'EOF'
import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
names = set(z.namelist())
bad = []
for need in ("nvio/_bin/nvio", "nvio/_man/man1/nvio.1", "nvio/_man/man7/nvio.7",
             "nvio/_cli.py", "nvio/py.typed"):
    if need not in names:
        bad.append("missing " + need)
if not any(n.startswith("nvio/_man/man3/nvio_") for n in names):
    bad.append("no man3 pages")
if not any(n.startswith("nvio/_nvio.") and n.endswith(".abi3.so") for n in names):
    bad.append("no nvio/_nvio.abi3.so")
if "nvio/_bin/nvio" in names and not (z.getinfo("nvio/_bin/nvio").external_attr >> 16) & 0o111:
    bad.append("nvio/_bin/nvio is not executable in the wheel")
info = [n for n in names if n.endswith(".dist-info/METADATA")]
meta = z.read(info[0]).decode() if info else ""
for line in ("Requires-Python: >=3.11", "Provides-Extra: torch",
             'Requires-Dist: torch>=2.1; extra == "torch"'):
    if line not in meta.splitlines():
        bad.append("METADATA lacks: " + line)
if not any(n.endswith(".dist-info/LICENSE") or "/licenses/LICENSE" in n for n in names):
    bad.append("no LICENSE in dist-info")
ep = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
if not ep or "nvio = nvio._cli:main" not in z.read(ep[0]).decode():
    bad.append("no console script nvio = nvio._cli:main")
print("\n".join(bad))
sys.exit(1 if bad else 0)
EOF
}
check "the wheel holds the tool, man pages, licence, entry point and metadata" wheel_contents

# Every ELF file in the wheel may need glibc's libraries and nothing else:
# liburing and libaio are linked in.
self_contained() {
	mkdir -p "$tmp/unpacked" && (cd "$tmp/unpacked" && "$PY" -m zipfile -e "$wheel" .) || return 1
	status=0
	for f in $(find "$tmp/unpacked" -type f); do
		head -c 4 "$f" | grep -q 'ELF' || continue
		needed=$(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')
		echo "${f#"$tmp/unpacked/"} needs: $needed"
		for lib in $needed; do
			case $lib in
			libc.so.*|libm.so.*|libdl.so.*|libpthread.so.*|librt.so.*|ld-linux*) ;;
			*) echo "  not part of glibc: $lib"; status=1 ;;
			esac
		done
	done
	return $status
}
check "the wheel needs nothing outside glibc (readelf -d)" self_contained
cat "$tmp/out"
if "$PY" -m auditwheel --version >/dev/null 2>&1; then
	check "auditwheel show reads the wheel" "$PY" -m auditwheel show "$wheel"
	sed 's/^/    /' "$tmp/out"
else
	skipped "auditwheel show: auditwheel not installed (the readelf check stands in)"
fi

# --ignore-installed: a copy in the system site-packages must not satisfy it.
check "the wheel installs into the venv" "$venv/bin/pip" install -q --no-deps --no-index \
	--ignore-installed "$wheel"

roundtrip() {
	(cd "$tmp" && "$1" - "$tmp/data" "$2" <<'EOF'
import os, sys
import nvio
if not nvio.__file__.startswith(sys.argv[2]):
    sys.exit("imported %s, not the venv's copy" % nvio.__file__)
data = bytearray(os.urandom((1 << 20) + 3))
path = os.path.join(sys.argv[1], "roundtrip.bin")
h = nvio.AioHandle(intra_op_parallelism=2)
h.sync_pwrite(data, path)
back = bytearray(len(data))
h.sync_pread(back, path)
os.unlink(path)
assert back == data, "bytes read back differ"
print("nvio %s from %s: %d bytes round trip" % (nvio.version(), nvio.__file__, len(data)))
EOF
	)
}
mkdir -p "$tmp/data"
check "import nvio and a write/read round trip with AioHandle (venv)" roundtrip "$venv/bin/python" "$venv"
check "nvio report from the venv's bin/" sh -c "'$venv/bin/nvio' report '$tmp/data' | grep -q psync"
check "nvio --version from the venv's bin/ is $VERSION" sh -c \
	"'$venv/bin/nvio' --version | grep -qx 'nvio $VERSION'"
if command -v man >/dev/null 2>&1; then
	check "nvio man shows nvio(1) and nvio man 3 nvio_pwrite its page" sh -c \
		"MANPAGER=cat MANWIDTH=80 '$venv/bin/nvio' man | grep -q 'nvio - ' && \
		MANPAGER=cat MANWIDTH=80 '$venv/bin/nvio' man 3 nvio_pwrite | grep -q nvio_pwrite"
else
	skipped "nvio man: no man command (apt-get install man-db)"
fi

# abi3: the same wheel in a newer CPython, when one is at hand.
newer=""
for p in ${NVIO_ABI3_PYTHONS:-python3.13 python3.12}; do
	if "$p" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
		newer=$p; break
	fi
done
if [ -z "$newer" ] && command -v pyenv >/dev/null 2>&1; then
	newer=$(ls -d "$(pyenv root)"/versions/3.1[2-9]*/bin/python3 2>/dev/null | tail -n 1)
fi
if [ -n "$newer" ]; then
	v3=$tmp/venv-newer
	ver=$("$newer" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
	check "the abi3 wheel installs in Python $ver" sh -c \
		"'$newer' -m venv '$v3' && '$v3/bin/pip' install -q --no-deps --no-index '$wheel'"
	[ -x "$v3/bin/python" ] &&
		check "import nvio and a round trip in Python $ver" roundtrip "$v3/bin/python" "$v3"
else
	skipped "abi3 on a newer Python: none found (NVIO_ABI3_PYTHONS)"
fi

echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
