#!/bin/sh
# The shortest path: install what is needed, build the library, the nvio
# command and the Python package, then show what this machine supports
# and how fast nvio moves 1 GiB to and from a temporary directory on the
# local disk (override with NVIO_DIR=/path/on/nvme and NVIO_SIZE=4G).
set -eu
cd "$(dirname "$0")/.."
sh scripts/deps.sh
make -j"$(nproc)"
${PYTHON:-python3} -m pip install -q .
dir=${NVIO_DIR:-$(mktemp -d "${TMPDIR:-/var/tmp}/nvio-quickstart.XXXXXX")}
trap 'rm -rf "$dir"' EXIT INT TERM
./build/nvio report "$dir"
./build/nvio bench --dir "$dir" --size "${NVIO_SIZE:-1G}" --loops 3
