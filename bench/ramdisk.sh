#!/bin/sh
# bench/ramdisk.sh up [SIZE [FS]] | down | status
#
# A RAM-backed block device with a real file system on it, standing in for a
# fast NVMe RAID (see ../shared/BENCHMARKING.md rule 4): a tmpfs, one image
# file on it, a loop device over the file, ext4 (or FS: ext4, xfs; also
# $NVIO_RAMDISK_FS) on the loop device, mounted.
# O_DIRECT works there (the loop device takes it; tmpfs alone would not).
#
#   sudo bench/ramdisk.sh up 10G     # mounts at $NVIO_RAMDISK (/mnt/nvio-ram)
#   sudo bench/ramdisk.sh down       # unmounts, detaches, frees the memory
#   sudo NVIO_RAMDISK=/mnt/r-xfs NVIO_RAMDISK_BACKING=/mnt/r-xfs-b bench/ramdisk.sh up 8G xfs
#                                    # a second one beside it (its own names)
#
# The tmpfs only uses memory for what is written into it, so SIZE is a
# ceiling, not an allocation; keep it (plus the buffers the benchmark
# allocates, and the page cache) below the machine's RAM.
# Needs root. Idempotent: `up` on a mounted disk and `down` on a missing one
# do nothing.
set -eu

MNT=${NVIO_RAMDISK:-/mnt/nvio-ram}
BACK=${NVIO_RAMDISK_BACKING:-/mnt/nvio-ram-backing}
IMG=$BACK/disk.img

die() { echo "ramdisk.sh: $*" >&2; exit 1; }

loopdev() { losetup -j "$IMG" 2>/dev/null | cut -d: -f1 | head -n 1; }

up() {
	size=${1:-10G}
	fs=${2:-${NVIO_RAMDISK_FS:-ext4}}
	case "$fs" in
	ext4|xfs) ;;
	*) die "file system $fs: ext4 or xfs" ;;
	esac
	[ "$(id -u)" = 0 ] || die "must run as root"
	if mountpoint -q "$MNT"; then
		echo "$MNT already mounted"
		return 0
	fi
	mkdir -p "$BACK" "$MNT"
	mountpoint -q "$BACK" || mount -t tmpfs -o "size=$size,mode=0700" nvio-ram-backing "$BACK"
	# The image is a little smaller than the tmpfs: ext4's own metadata
	# lives inside the image, and tmpfs needs a few pages of its own.
	bytes=$(df -B1 --output=size "$BACK" | tail -n 1 | tr -d ' ')
	img_mb=$((bytes / 1048576 - 64))
	[ "$img_mb" -gt 256 ] || die "tmpfs of $size is too small"
	[ -e "$IMG" ] || truncate -s "${img_mb}M" "$IMG"
	dev=$(loopdev)
	[ -n "$dev" ] || dev=$(losetup --find --show "$IMG")
	if [ "$fs" = xfs ]; then
		command -v mkfs.xfs >/dev/null || die "mkfs.xfs missing (apt-get install -y xfsprogs)"
		mkfs.xfs -q -f "$dev"
	else
		# lazy_itable_init=0: no background zeroing thread to disturb the runs.
		mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "$dev"
	fi
	mount -t "$fs" "$dev" "$MNT"
	chmod 1777 "$MNT"
	echo "$MNT: $fs on $dev (loop over $IMG on tmpfs $size)"
}

down() {
	if mountpoint -q "$MNT"; then
		umount "$MNT"
	fi
	dev=$(loopdev)
	if [ -n "$dev" ]; then
		losetup -d "$dev"
	fi
	if mountpoint -q "$BACK"; then
		umount "$BACK"
	fi
	rmdir "$MNT" "$BACK" 2>/dev/null || true
	echo "ramdisk down"
}

status() {
	if mountpoint -q "$MNT"; then
		echo "$MNT: mounted on $(findmnt -n -o SOURCE "$MNT")"
		df -h "$MNT" "$BACK"
	else
		echo "$MNT: not mounted"
	fi
}

case "${1:-}" in
up) shift; up "$@" ;;
down) down ;;
status) status ;;
*) echo "usage: $0 up [SIZE] | down | status" >&2; exit 2 ;;
esac
