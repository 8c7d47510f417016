#!/bin/sh
# On a machine with an NVIDIA GPU and no network (the lent GPU machine):
# build nvio from what is there, run the GPU tests against the real driver
# (libnvio's: test_gpu.py, test_io.py; the applications' on real CUDA
# tensors: test_gpu_apps.py, which takes torch's CUDA device when
# torch.cuda.is_available(); and the simulator's C tests, which need no
# GPU), `nvio bench --gpu/--gds`
# and bench/gpu_bench.py (1 GiB HBM<->file through AioHandle's bounce path
# and GdsHandle, against host memory on the same disk and torch.save/load),
# and print a short table. Results land in $OUT (or ./gpu-results).
#
#   sh scripts/gpu.sh [DIR]      DIR: where the test files go (default /tmp)
#                                SIZE=1G (default) bytes per transfer
#   sh scripts/gpu.sh fetch      (elsewhere) download liburing/libaio .debs
#
# liburing and libaio headers may be missing there; `sh scripts/gpu.sh
# fetch` on a machine with Debian's packages downloads them into
# .gpu-deps/ (git-ignored), which travels with the tree and is unpacked
# into a private prefix here, never into /. Without them nvio still
# builds, with the psync engine only (nvio report says so).
set -eu
cd "$(dirname "$0")/.."
if [ "${1:-}" = fetch ]; then
	mkdir -p .gpu-deps
	cd .gpu-deps
	apt-get download liburing-dev liburing2 libaio-dev libaio1 || apt-get download liburing-dev liburing2 libaio-dev libaio1t64
	exit 0
fi
DIR=${1:-/tmp}
SIZE=${SIZE:-1G}
OUT=${OUT:-$PWD/gpu-results}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
die() { echo "gpu.sh: $*" >&2; exit 1; }

command -v nvidia-smi >/dev/null 2>&1 || die "nvidia-smi not found: no NVIDIA driver here"
nvidia-smi -L >"$OUT/gpus.txt" 2>&1 || die "nvidia-smi -L failed: $(cat "$OUT/gpus.txt")"
cat "$OUT/gpus.txt"
command -v cc >/dev/null 2>&1 || die "no C compiler (cc) to build nvio"
if [ ! -d "$DIR" ] || [ ! -w "$DIR" ]; then
	die "$DIR is not a writable directory"
fi
$PY -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' \
	|| die "torch cannot see a GPU ($PY; torch.cuda.is_available() is False)"

if ls .gpu-deps/*.deb >/dev/null 2>&1; then
	prefix=$(mktemp -d "${TMPDIR:-/tmp}/nvio-deps.XXXXXX")
	for d in .gpu-deps/*.deb; do dpkg -x "$d" "$prefix"; done
	C_INCLUDE_PATH="$prefix/usr/include${C_INCLUDE_PATH:+:$C_INCLUDE_PATH}"
	LIBRARY_PATH="$prefix/usr/lib/x86_64-linux-gnu${LIBRARY_PATH:+:$LIBRARY_PATH}"
	export C_INCLUDE_PATH LIBRARY_PATH
fi

echo "== build"
make -j"$(nproc)" all sim >"$OUT/build.txt" 2>&1 || { tail -n 30 "$OUT/build.txt"; die "make failed (log: $OUT/build.txt)"; }
./build/nvio report "$DIR" | tee "$OUT/report.txt"
$PY -m pip install -q --no-build-isolation --no-deps --no-index . >"$OUT/pip.txt" 2>&1 \
	|| { tail -n 30 "$OUT/pip.txt"; die "pip install of nvio failed (log: $OUT/pip.txt)"; }

set +e
fails=0
echo "== C GPU tests (simulated driver and cuFile; they need no GPU)"
make -j"$(nproc)" build/tests/test_cuda build/tests/test_gpusim build/tests/test_cuda_api >/dev/null 2>&1
sh tests/run.sh build test_cuda test_gpusim test_cuda_api 2>&1 | tee "$OUT/c-tests.txt"
tail -n 1 "$OUT/c-tests.txt" | grep -q ' 0 failed' || fails=$((fails + 1))

echo "== Python GPU tests (real CUDA tensors: libnvio's, then the applications')"
(cd tests/py && $PY -m pytest -q -p no:cacheprovider test_gpu.py test_io.py \
	test_gpu_apps.py 2>&1) | tee "$OUT/py-tests.txt"
tail -n 1 "$OUT/py-tests.txt" | grep -qE 'failed|error' && fails=$((fails + 1))

echo "== nvio bench --gpu / --gds ($SIZE)"
for opt in --mem=locked --gpu --gds; do
	./build/nvio bench --dir "$DIR" --size "$SIZE" --loops 5 "$opt" >"$OUT/bench$opt.txt" 2>&1 \
		|| { fails=$((fails + 1)); echo "nvio bench $opt failed:"; }
	grep -E '^(write|read) ' "$OUT/bench$opt.txt" | sed "s/^/$opt /"
done

echo "== bench/gpu_bench.py"
bytes=$(echo "$SIZE" | awk '/[Gg]$/ { print $0 * 1073741824; next } /[Mm]$/ { print $0 * 1048576; next } { print $0 + 0 }')
$PY bench/gpu_bench.py --dir "$DIR" --size "$bytes" --out "$OUT/gpu_bench.md" 2>"$OUT/gpu_bench.log" \
	|| { fails=$((fails + 1)); tail -n 20 "$OUT/gpu_bench.log"; }

echo "== summary ($(date -u +%Y-%m-%d), $(head -n 1 "$OUT/gpus.txt"))"
printf '%-28s %s\n' "C tests:" "$(tail -n 1 "$OUT/c-tests.txt")"
printf '%-28s %s\n' "Python tests:" "$(tail -n 1 "$OUT/py-tests.txt")"
[ -f "$OUT/gpu_bench.md" ] && grep '^|' "$OUT/gpu_bench.md"
echo "results in $OUT (commit gpu_bench.md to bench/results/ with the machine and date)"
[ "$fails" = 0 ] || die "$fails step(s) failed: see above"
