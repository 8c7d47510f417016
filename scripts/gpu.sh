#!/bin/sh
# On a machine with an NVIDIA GPU and no network (the lent GPU machine):
# build nvio from what is there, run the GPU tests and the GPU benchmark,
# print a short table. Results land in $OUT (or ./gpu-results).
#
# liburing and libaio headers may be missing there; run
# `sh scripts/gpu.sh fetch` first on a machine with Debian's packages: it
# downloads them into .gpu-deps/ (git-ignored), which travels with the
# tree and is unpacked into a private prefix here, never into /.
set -eu
cd "$(dirname "$0")/.."
if [ "${1:-}" = fetch ]; then
	mkdir -p .gpu-deps && cd .gpu-deps
	apt-get download liburing-dev liburing2 libaio-dev libaio1
	exit 0
fi
OUT=${OUT:-$PWD/gpu-results}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
if ls .gpu-deps/*.deb >/dev/null 2>&1; then
	prefix=/tmp/nvio-deps
	for d in .gpu-deps/*.deb; do dpkg -x "$d" "$prefix"; done
	export C_INCLUDE_PATH="$prefix/usr/include${C_INCLUDE_PATH:+:$C_INCLUDE_PATH}"
	export LIBRARY_PATH="$prefix/usr/lib/x86_64-linux-gnu${LIBRARY_PATH:+:$LIBRARY_PATH}"
fi
nvidia-smi -L || true
make -j"$(nproc)" 2>&1 | tail -n 3
./build/nvio report /tmp | tee "$OUT/report.txt"
$PY -m pip install -q --no-build-isolation --no-deps --no-index . 2>&1 | tail -n 3
set +e
(cd tests/py && $PY -m pytest -q -p no:cacheprovider test_gpu.py test_io.py 2>&1) | tee "$OUT/tests.txt"
$PY bench/gpu_bench.py --dir /tmp --out "$OUT/gpu_bench.md" 2>"$OUT/bench.log"
echo "results in $OUT"
