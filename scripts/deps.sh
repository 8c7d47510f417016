#!/bin/sh
# Installs what nvio needs to build and test on Debian/Ubuntu:
# a C compiler (gcc and clang), liburing, libaio, fio, groff for the man
# page checks, pkg-config and venv for the packaging checks, and the Python
# test requirements (pytest, pytest-xdist) with auditwheel (torch is pinned to the
# CPU build: an unpinned torch pulls gigabytes of CUDA packages), and
# xfsprogs for the full-disk tests on a loop-mounted xfs.
# Safe to run again: it only installs what is missing.
set -eu

as_root() {
	if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
		echo "deps.sh: need root (or sudo) to run: $*" >&2; exit 1; fi
}

pkgs="build-essential clang liburing-dev libaio-dev fio groff man-db pkg-config python3-dev python3-pip python3-venv xfsprogs"
missing=""
for p in $pkgs; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
	echo "deps.sh: installing$missing"
	as_root apt-get update -qq
	as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
fi

PY=${PYTHON:-python3}
if ! $PY -c "import pytest, numpy" 2>/dev/null; then
	$PY -m pip install -q pytest numpy
fi
# scripts/test.sh runs the Python tests three at a time with pytest-xdist
# (it depends on pytest and execnet only: torch stays as pinned below)
if ! $PY -c "import xdist, sys; sys.exit(xdist.__version__ != '3.8.0')" 2>/dev/null; then
	$PY -m pip install -q "pytest-xdist==3.8.0" || echo "deps.sh: pytest-xdist not installed; the Python tests run one at a time" >&2
fi
if ! $PY -m auditwheel --version >/dev/null 2>&1; then
	$PY -m pip install -q auditwheel || echo "deps.sh: auditwheel not installed; its wheel check will skip" >&2
fi
if [ "${NVIO_NO_TORCH:-0}" != 1 ] && ! $PY -c "import torch" 2>/dev/null; then
	$PY -m pip install -q "torch==2.13.0" || echo "deps.sh: torch not installed; torch tests will skip" >&2
fi
# nvio.safetensors' tests and benchmark compare with these exact versions
# (torch pinned so that pip cannot replace it)
if [ "${NVIO_NO_TORCH:-0}" != 1 ] && ! $PY -c "import safetensors, transformers, sys; sys.exit(safetensors.__version__ != '0.8.0' or transformers.__version__ != '5.23.0')" 2>/dev/null; then
	$PY -m pip install -q "safetensors==0.8.0" "transformers==5.23.0" "torch==2.13.0" || echo "deps.sh: safetensors/transformers not installed; their tests will skip" >&2
fi
# nvio.data's Megatron tests, the DCP stream-extension tests, the
# property tests (hypothesis) and the integrations' tests compare with these (torch pinned so that pip cannot
# replace it); each test skips cleanly where its package is missing.
if [ "${NVIO_NO_TORCH:-0}" != 1 ] && ! $PY -c "import megatron.core, zstandard, expecttest, hypothesis" 2>/dev/null; then
	$PY -m pip install -q "torch==2.13.0" "megatron-core==0.16.1" "zstandard==0.25.0" "expecttest==0.3.0" "hypothesis==6.155.2" || echo "deps.sh: megatron-core/zstandard/expecttest/hypothesis not installed; their tests will skip" >&2
fi
# The integrations' tests (nvio.integrations: Lightning, the HF Trainer,
# DeepSpeed's ZeRO-Infinity); torch pinned as above.
if [ "${NVIO_NO_TORCH:-0}" != 1 ] && ! $PY -c "import lightning, deepspeed, accelerate" 2>/dev/null; then
	$PY -m pip install -q "lightning==2.6.6" "deepspeed==0.19.8" "accelerate==1.15.0" "transformers==5.23.0" "torch==2.13.0" || echo "deps.sh: lightning/deepspeed/accelerate not installed; the integration tests will skip" >&2
fi
