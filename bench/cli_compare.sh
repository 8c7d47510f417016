#!/bin/sh
# cli_compare.sh - nvio against fio, interleaved, on the real disk and on a
# RAM-backed ext4 (BENCHMARKING.md): `nvio bench --compare fio` on each.
#
#   sh bench/cli_compare.sh [SIZE] [LOOPS] [DIR]
#
# SIZE defaults to 1G, LOOPS to 5, DIR to $TMPDIR or /tmp (the real disk).
# The RAM disk (a tmpfs, a file on it, a loop device, ext4, mounted) needs
# root and is skipped without it; it is torn down on exit. Prints the
# machine, kernel and file systems, then nvio's output for each disk.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
nvio=$root/build/nvio
size=${1:-1G}
loops=${2:-5}
dir=${3:-${TMPDIR:-/tmp}}
[ -x "$nvio" ] || { echo "cli_compare: build $nvio first (make)" >&2; exit 1; }

ram=
cleanup() {
	[ -n "$ram" ] || return 0
	umount "$ram/mnt" 2>/dev/null || true
	[ -n "${loopdev:-}" ] && losetup -d "$loopdev" 2>/dev/null || true
	umount "$ram/tmpfs" 2>/dev/null || true
	rm -rf "$ram"
}
trap cleanup EXIT INT TERM

echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(uname -sr) $(nproc) CPUs, $(fio --version 2>/dev/null || echo 'no fio')"
echo "# nvio bench --size $size --loops $loops --compare fio"
echo
echo "## real disk: $dir ($(df -T "$dir" | awk 'NR==2 {print $2 " on " $1}'))"
"$nvio" bench --dir "$dir" --size "$size" --loops "$loops" --compare fio -q

if [ "$(id -u)" != 0 ] || ! command -v losetup >/dev/null; then
	echo "## RAM disk: skipped (needs root and losetup)"
	exit 0
fi
ram=$(mktemp -d)
mkdir "$ram/tmpfs" "$ram/mnt"
bytes=$("$nvio" bench --help >/dev/null; python3 -c "
import re,sys; s='$size'; m=re.match(r'(\d+)([KMGT]?)', s)
print(int(m.group(1)) << {'':0,'K':10,'M':20,'G':30,'T':40}[m.group(2)])")
mount -t tmpfs -o size=$((bytes * 2 + (256 << 20))) tmpfs "$ram/tmpfs"
truncate -s $((bytes * 2 + (128 << 20))) "$ram/tmpfs/disk.img"
loopdev=$(losetup --find --show --direct-io=on "$ram/tmpfs/disk.img")
mkfs.ext4 -q "$loopdev"
mount "$loopdev" "$ram/mnt"
echo
echo "## RAM disk: ext4 on $loopdev over tmpfs"
"$nvio" bench --dir "$ram/mnt" --size "$size" --loops "$loops" --compare fio -q
