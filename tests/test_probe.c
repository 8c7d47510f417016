/*
 * test_probe.c - nvio_probe on the test directory, on NULL and on a
 * missing directory. Fields are checked against what libc says.
 */
#include <fcntl.h>
#include <linux/magic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "t.h"

static int pow2_or_0(uint64_t v)
{
	return (v & (v - 1)) == 0;
}

static int has_ipc_lock(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	unsigned long long cap = 0;

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, "CapEff:", 7))
			cap = strtoull(line + 7, NULL, 16);
	fclose(f);
	return (cap >> 14) & 1;	/* CAP_IPC_LOCK */
}

static void common(const nvio_probe_t *p)
{
	struct rlimit rl;

	T_EQ_INT(p->engine_ok[NVIO_ENGINE_PSYNC], 1);
	for (int e = NVIO_ENGINE_URING; e < NVIO_ENGINE_COUNT_; e++) {
		T_EQ_INT(p->engine_ok[e], nvio_engine_available(e, NULL, 0));
		if (!p->engine_ok[e])
			T_TRUE(p->engine_why[e][0] != 0);
		T_TRUE(memchr(p->engine_why[e], 0, sizeof(p->engine_why[e])) !=
		       NULL);
	}
	if (!getrlimit(RLIMIT_MEMLOCK, &rl)) {
		T_EQ_U64(p->memlock_cur, rl.rlim_cur == RLIM_INFINITY ?
			 UINT64_MAX : (uint64_t)rl.rlim_cur);
		T_EQ_U64(p->memlock_max, rl.rlim_max == RLIM_INFINITY ?
			 UINT64_MAX : (uint64_t)rl.rlim_max);
		T_EQ_INT(p->can_lock_unlimited,
			 has_ipc_lock() || rl.rlim_cur == RLIM_INFINITY);
	}
	if (!p->cuda_found) {
		T_TRUE(p->cuda_why[0] != 0);
		T_EQ_INT(p->cuda_device_count, 0);
	}
	if (!p->cufile_found)
		T_EQ_INT(p->cufile_mode, NVIO_CUFILE_NONE);
	T_TRUE(p->cufile_mode >= NVIO_CUFILE_NONE &&
	       p->cufile_mode <= NVIO_CUFILE_UNKNOWN);
	T_TRUE(memchr(p->fs_type, 0, sizeof(p->fs_type)) != NULL);
	T_TRUE(memchr(p->device, 0, sizeof(p->device)) != NULL);
}

static void test_dir(void)
{
	const char *dir = t_tmpdir();
	nvio_probe_t p;
	struct statfs sf;
	struct statvfs sv;
	struct stat st;
	char path[T_PATH_MAX];
	uint64_t free_before;
	int fd, direct;

	t_ctx("probe %s", dir);
	memset(&p, 0xa5, sizeof(p));
	p.struct_size = sizeof(p);
	free_before = statvfs(dir, &sv) ? 0 : (uint64_t)sv.f_bavail * sv.f_frsize;
	if (!T_OK(nvio_probe(dir, &p)))
		return;
	common(&p);
	T_TRUE(pow2_or_0(p.dio_mem_align));
	T_TRUE(pow2_or_0(p.dio_offset_align));
	T_TRUE(p.fs_type[0] != 0);
	if (!stat(dir, &st))
		T_EQ_U64(p.fs_block_size, (uint64_t)st.st_blksize);

	/* O_DIRECT as libc sees it. */
	t_path(path, "probe-direct");
	fd = open(path, O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0644);
	direct = fd >= 0;
	if (fd >= 0)
		close(fd);
	unlink(path);
	T_EQ_INT(p.direct_ok, direct);
	if (direct) {
		T_TRUE(p.dio_mem_align > 0 && p.dio_mem_align <= 4096);
		T_TRUE(p.dio_offset_align > 0 && p.dio_offset_align <= 4096);
	} else {
		T_TRUE(p.direct_err < 0 || p.direct_err > 0);
	}

	if (!statfs(dir, &sf)) {
		const char *want = NULL;

		if (sf.f_type == EXT4_SUPER_MAGIC)
			want = "ext4";
		else if (sf.f_type == TMPFS_MAGIC)
			want = "tmpfs";
		else if (sf.f_type == XFS_SUPER_MAGIC)
			want = "xfs";
		else if (sf.f_type == BTRFS_SUPER_MAGIC)
			want = "btrfs";
		if (want && strcmp(p.fs_type, want))
			T_FAILF("fs_type \"%s\", statfs says %s", p.fs_type,
				want);
	}
	if (free_before && !statvfs(dir, &sv)) {
		uint64_t avail = (uint64_t)sv.f_bavail * sv.f_frsize;
		uint64_t lo = avail < free_before ? avail : free_before;
		uint64_t hi = avail < free_before ? free_before : avail;

		/*
		 * Between what statvfs said before and after the probe, give
		 * or take 1 GiB: others write meanwhile (the test command runs
		 * the sanitizer stages beside this one, with files of GiBs).
		 */
		lo = lo > (1ull << 30) ? lo - (1ull << 30) : 0;
		hi += 1ull << 30;
		if (p.fs_free_bytes < lo || p.fs_free_bytes > hi)
			T_FAILF("fs_free_bytes %llu, statvfs says %llu before and %llu after",
				(unsigned long long)p.fs_free_bytes,
				(unsigned long long)free_before, (unsigned long long)avail);
	}
}

static void test_null_and_missing(void)
{
	nvio_probe_t p;
	char missing[T_PATH_MAX];

	t_ctx("probe NULL dir");
	memset(&p, 0, sizeof(p));
	p.struct_size = sizeof(p);
	if (T_OK(nvio_probe(NULL, &p)))
		common(&p);

	t_ctx("probe missing dir");
	t_path(missing, "no/such/dir");
	memset(&p, 0, sizeof(p));
	p.struct_size = sizeof(p);
	T_ERR(nvio_probe(missing, &p), -ENOENT);

	t_ctx("probe out NULL");
	T_ERR(nvio_probe(NULL, NULL), -EINVAL);
}

int main(void)
{
	t_init("probe");
	test_dir();
	test_null_and_missing();
	return t_done();
}
