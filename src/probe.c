/*
 * probe.c - what this machine and a directory support (nvio report).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "internal.h"
#include "sys.h"

int nvio_engine_available(int engine, char *why, size_t why_len)
{
	const struct nvio__engine_ops *eng = nvio__engine(engine);
	char tmp[8];

	if (!eng)
		return -EINVAL;
	if (!why || why_len == 0) {
		why = tmp;
		why_len = sizeof(tmp);
	}
	why[0] = '\0';
	return eng->available(why, why_len);
}

static const char *fs_name(long type)
{
	static const struct { long magic; const char *name; } names[] = {
		{ 0xEF53, "ext4" }, { 0x58465342, "xfs" },
		{ 0x9123683E, "btrfs" }, { 0x01021994, "tmpfs" },
		{ 0x6969, "nfs" }, { 0x65735546, "fuse" },
		{ 0x2FC12FC1, "zfs" }, { 0x794C7630, "overlayfs" },
		{ 0x0BD00BD0, "lustre" }, { 0x47504653, "gpfs" },
		{ 0xF2F52010, "f2fs" }, { 0x858458F6, "ramfs" },
		{ 0x00C36400, "ceph" }, { 0xFF534D42, "cifs" },
		{ 0x5346414F, "afs" }, { 0x73717368, "squashfs" },
	};

	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (names[i].magic == type)
			return names[i].name;
	return "unknown";
}

/* "vda", "nvme0n1": the kernel's name for the device behind st_dev. */
static void device_name(dev_t dev, char *out, size_t len)
{
	char path[128], line[256];
	FILE *f;

	snprintf(out, len, "%u:%u", major(dev), minor(dev));
	snprintf(path, sizeof(path), "/sys/dev/block/%u:%u/uevent", major(dev),
		 minor(dev));
	f = fopen(path, "re");
	if (!f)
		return;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, "DEVNAME=", 8)) {
			line[strcspn(line, "\n")] = '\0';
			snprintf(out, len, "%s", line + 8);
		}
	fclose(f);
}

static int has_cap_ipc_lock(void)
{
	char line[256];
	unsigned long long caps = 0;
	FILE *f = fopen("/proc/self/status", "re");

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "CapEff: %llx", &caps) == 1)
			break;
	fclose(f);
	return (caps >> 14) & 1;	/* CAP_IPC_LOCK */
}

static void probe_dir(const char *dir, nvio_probe_t *out)
{
	char path[4200];
	struct statfs sfs;
	struct statx sx;
	struct stat st;
	int fd;

	if (statfs(dir, &sfs) == 0) {
		snprintf(out->fs_type, sizeof(out->fs_type), "%s", fs_name((long)sfs.f_type));
		out->fs_free_bytes = (uint64_t)sfs.f_bavail * (uint64_t)sfs.f_bsize;
	}
	if (stat(dir, &st) == 0) {
		device_name(st.st_dev, out->device, sizeof(out->device));
		out->fs_block_size = (uint32_t)st.st_blksize;
	}
	/* An unnamed file answers for the file system without leaving one. */
	fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
	if (fd < 0) {
		snprintf(path, sizeof(path), "%s/.nvio-probe-%d", dir, (int)getpid());
		fd = open(path, O_CREAT | O_RDWR | O_CLOEXEC, 0600);
		if (fd >= 0)
			unlink(path);
	}
	if (fd < 0) {
		out->direct_err = -errno;
		return;
	}
	if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 &&
	    (sx.stx_mask & STATX_DIOALIGN)) {
		out->dio_mem_align = sx.stx_dio_mem_align;
		out->dio_offset_align = sx.stx_dio_offset_align;
	}
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	int dfd = open(path, O_RDWR | O_DIRECT | O_CLOEXEC);

	if (dfd >= 0) {
		out->direct_ok = 1;
		close(dfd);
	} else {
		out->direct_err = -errno;
	}
	close(fd);
}

int nvio_probe(const char *dir, nvio_probe_t *out)
{
	struct rlimit rl;
	struct stat st;
	uint32_t size;

	if (!out || out->struct_size < sizeof(*out))
		return -EINVAL;
	size = out->struct_size;
	memset(out, 0, sizeof(*out));
	out->struct_size = size;
	if (dir) {
		if (stat(dir, &st) < 0)
			return -errno;
		if (!S_ISDIR(st.st_mode))
			return -ENOTDIR;
		probe_dir(dir, out);
	}
	if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0) {
		out->memlock_cur = rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : rl.rlim_cur;
		out->memlock_max = rl.rlim_max == RLIM_INFINITY ? UINT64_MAX : rl.rlim_max;
	}
	out->can_lock_unlimited = has_cap_ipc_lock() || out->memlock_cur == UINT64_MAX;
	for (int e = NVIO_ENGINE_URING; e < NVIO_ENGINE_COUNT_; e++)
		out->engine_ok[e] = nvio_engine_available(e, out->engine_why[e],
							  sizeof(out->engine_why[e])) == 1;
	out->engine_ok[NVIO_ENGINE_AUTO] = 1;
	snprintf(out->engine_why[NVIO_ENGINE_AUTO], sizeof(out->engine_why[0]),
		 "picks %s", out->engine_ok[NVIO_ENGINE_URING] ? "io_uring" :
		 out->engine_ok[NVIO_ENGINE_AIO] ? "libaio" : "psync");
	nvio__cuda_probe(out);
	nvio__cufile_probe(out);
	return 0;
}
