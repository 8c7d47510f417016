/*
 * test_no_flock.c - on a file system without flock(2) (ENOLCK, EOPNOTSUPP,
 * ENOSYS: some FUSE and network file systems), saves and reads still work
 * and leave nothing behind. A spare save falls back to a temporary (a
 * spare cannot be told in use without the lock); the spare it made to try
 * must not stay beside the target. Readers read unlocked. The failure is
 * injected at every flock through the nvio__sys table, and descriptors
 * are counted before and after. Every engine, direct I/O on and off.
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "t.h"
#include "sys.h"

#define N 40000

static struct nvio__sys real;
static int fail_errno, calls;
static char dir[T_PATH_MAX], target[T_PATH_MAX];
static unsigned char *buf, *back;

static int h_flock(int fd, int op)
{
	calls++;
	errno = fail_errno;
	return -1;
}

/* Entries of dir other than . and .. */
static int entries(void)
{
	return t_dir_count(dir);
}

static int save(nvio_handle_t *h, uint64_t seed)
{
	nvio_file_t *f;
	int err = 0, r;

	t_fill_random(buf, N, seed);
	f = nvio_file_open(h, target, NVIO_FILE_ATOMIC | NVIO_FILE_SPARE, &err);
	if (!f)
		return err;
	r = nvio_file_pwrite(f, buf, N, 0, 0);
	if (!r)
		r = nvio_file_commit(f);
	if (nvio_file_close(f) < 0 && !r)
		r = -EIO;
	return r;
}

static void one(nvio_handle_t *h, int err)
{
	nvio_file_t *f;
	size_t size = 0;
	int fds, e = 0;

	T_OK(t_write_file(target, "old", 3));
	fds = t_count_fds();
	fail_errno = err;
	calls = 0;
	nvio__sys.flock = h_flock;
	T_OK(save(h, 5));
	T_OK(save(h, 6));
	f = nvio_file_open(h, target, NVIO_FILE_READ, &e);
	T_EQ_INT(e, 0);
	if (f) {
		T_EQ_INT(nvio_file_pread(f, back, N, 0, 0), 0);
		T_EQ_INT(t_check_random_at(back, N, 6, 0), -1);
		T_OK(nvio_file_close(f));
	}
	nvio__sys.flock = real.flock;
	T_EQ_INT(calls > 0, 1);
	T_EQ_INT(t_count_fds(), fds);
	if (T_OK(t_read_file(target, back, N, &size)) && T_EQ_U64(size, N))
		T_EQ_INT(t_check_random_at(back, N, 6, 0), -1);
	/* the target alone: no spare, no temporary */
	T_EQ_INT(entries(), 1);
	unlink(target);
}

int main(void)
{
	static const int errs[] = { ENOLCK, EOPNOTSUPP, ENOSYS, EIO };

	t_init("no_flock");
	real = nvio__sys;
	buf = t_alloc(N);
	back = t_alloc(N);
	t_subdir(dir, "d");
	snprintf(target, sizeof(target), "%s/ck.pt", dir);
	T_FOR_EACH_COMBO(en, d) {
		nvio_handle_t *h;

		if (t_handle(&h, en, d, 2, 0))
			continue;
		for (size_t i = 0; i < sizeof(errs) / sizeof(errs[0]); i++)
			one(h, errs[i]);
		nvio_handle_destroy(h);
	}
	free(buf);
	free(back);
	return t_done();
}
