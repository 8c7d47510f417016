/*
 * test_file_faults.c - injected failures at the system calls behind the
 * open-file API (through nvio__sys): open, fstat, fsync, fallocate,
 * rename and close. Each fails its call cleanly with the injected errno:
 * nothing left half done (an ATOMIC path keeps its old content, no stray
 * file in the directory), and the handle goes on working afterwards.
 * A call the implementation does not make for a case is noted, not
 * failed. Every engine, direct on and off.
 */
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "t.h"
#include "sys.h"

static struct nvio__sys real;
static atomic_int calls;	/* calls the armed hook failed */
static int fail_errno;

static int h_open(const char *p, int fl, mode_t m)
{
	atomic_fetch_add(&calls, 1);
	errno = fail_errno;
	return -1;
}

static int h_fstat(int fd, struct stat *st)
{
	atomic_fetch_add(&calls, 1);
	errno = fail_errno;
	return -1;
}

static int h_fsync(int fd)
{
	atomic_fetch_add(&calls, 1);
	errno = fail_errno;
	return -1;
}

static int h_fallocate(int fd, int mode, off_t off, off_t len)
{
	atomic_fetch_add(&calls, 1);
	errno = fail_errno;
	return -1;
}

static int h_rename(const char *a, const char *b)
{
	atomic_fetch_add(&calls, 1);
	errno = fail_errno;
	return -1;
}

/* The descriptor really goes (no leak); the error is reported. */
static int h_close(int fd)
{
	real.close(fd);
	atomic_fetch_add(&calls, 1);
	errno = fail_errno;
	return -1;
}

static void arm(int err)
{
	atomic_store(&calls, 0);
	fail_errno = err;
}

/* 1 if the hook was reached; else a note that the case did not apply. */
static int reached(const char *what)
{
	nvio__sys_reset();
	if (atomic_load(&calls))
		return 1;
	t_note("%s: %s not called by this implementation", t_combo(), what);
	return 0;
}

static void check_content(const char *path, const void *w, size_t n)
{
	unsigned char got[8192];
	size_t sz = 0;

	if (T_OK(t_read_file(path, got, sizeof(got), &sz)) && T_EQ_U64(sz, n))
		T_MEM_EQ(got, w, n);
}

static void cases(nvio_handle_t *h)
{
	char path[T_PATH_MAX];
	unsigned char old[5000], nw[3000];
	nvio_file_t *f;
	int nfiles, err, r;

	t_path(path, "ff");
	t_fill_random(old, sizeof(old), 1);
	t_fill_random(nw, sizeof(nw), 2);
	if (!T_OK(t_write_file(path, old, sizeof(old))))
		return;
	nfiles = t_dir_count(t_tmpdir());

	/* open / fstat at nvio_file_open: NULL and the errno */
	t_ctx("%s open fails", t_combo());
	arm(EMFILE);
	nvio__sys.open = h_open;
	err = 0;
	f = nvio_file_open(h, path, NVIO_FILE_READ, &err);
	if (reached("open")) {
		if (T_TRUE(f == NULL))
			T_ERR(err, -EMFILE);
	}
	nvio_file_close(f);
	arm(EMFILE);
	nvio__sys.open = h_open;
	err = 0;
	f = nvio_file_open(h, path, NVIO_FILE_ATOMIC, &err);
	if (reached("open (ATOMIC)")) {
		if (T_TRUE(f == NULL))
			T_ERR(err, -EMFILE);
	}
	nvio_file_close(f);
	T_EQ_INT(t_dir_count(t_tmpdir()), nfiles);
	t_ctx("%s fstat fails", t_combo());
	arm(EACCES);
	nvio__sys.fstat = h_fstat;
	err = 0;
	f = nvio_file_open(h, path, NVIO_FILE_READ | NVIO_FILE_WRITE, &err);
	if (reached("fstat")) {
		if (T_TRUE(f == NULL))
			T_ERR(err, -EACCES);
	}
	nvio_file_close(f);

	f = nvio_file_open(h, path, NVIO_FILE_READ | NVIO_FILE_WRITE, &err);
	if (!T_TRUE(f != NULL))
		return;
	/* fsync at nvio_file_sync */
	t_ctx("%s fsync fails", t_combo());
	arm(EIO);
	nvio__sys.fsync = h_fsync;
	r = nvio_file_sync(f);
	if (reached("fsync"))
		T_ERR(r, -EIO);
	/* fallocate at nvio_file_allocate: -ENOSPC now, size unchanged */
	t_ctx("%s fallocate fails", t_combo());
	arm(ENOSPC);
	nvio__sys.fallocate = h_fallocate;
	r = nvio_file_allocate(f, 0, 1u << 20);
	if (reached("fallocate")) {
		T_ERR(r, -ENOSPC);
		T_EQ_INT(t_file_size(path), sizeof(old));
	}
	/* growth is allocated up front: -ENOSPC at submit */
	arm(ENOSPC);
	nvio__sys.fallocate = h_fallocate;
	r = nvio_file_pwrite(f, nw, sizeof(nw), 1 << 20, 0);
	if (reached("fallocate (growth)"))
		T_ERR(r, -ENOSPC);
	/* the file still works */
	T_OK(nvio_file_pwrite(f, nw, 100, 0, 0));
	memcpy(old, nw, 100);
	/* close of a written file reports close(2)'s error */
	t_ctx("%s close fails", t_combo());
	arm(EIO);
	nvio__sys.close = h_close;
	r = nvio_file_close(f);
	if (reached("close"))
		T_ERR(r, -EIO);
	check_content(path, old, sizeof(old));

	/* ATOMIC commit: fsync or rename failing leaves the old content */
	for (int k = 0; k < 2; k++) {
		const char *what = k ? "rename" : "fsync";

		t_ctx("%s commit, %s fails", t_combo(), what);
		f = nvio_file_open(h, path, NVIO_FILE_ATOMIC, &err);
		if (!T_TRUE(f != NULL))
			continue;
		T_OK(nvio_file_pwrite(f, nw, sizeof(nw), 0, 0));
		arm(EIO);
		if (k)
			nvio__sys.rename = h_rename;
		else
			nvio__sys.fsync = h_fsync;
		r = nvio_file_commit(f);
		if (reached(what)) {
			T_ERR(r, -EIO);
			check_content(path, old, sizeof(old));
		}
		T_OK(nvio_file_close(f));
		check_content(path, old, sizeof(old));
		T_EQ_INT(t_dir_count(t_tmpdir()), nfiles);
	}
	/* NVIO_FILE_NOSYNC: the commit never calls fsync (a failing fsync
	 * cannot stop it), and the new content is in place */
	t_ctx("%s NOSYNC commit does not fsync", t_combo());
	T_ERR(nvio_file_open(h, path, NVIO_FILE_WRITE | NVIO_FILE_NOSYNC, &err) == NULL ?
	      err : 0, -EINVAL);
	f = nvio_file_open(h, path, NVIO_FILE_ATOMIC | NVIO_FILE_NOSYNC, &err);
	if (T_TRUE(f != NULL)) {
		T_OK(nvio_file_pwrite(f, nw, sizeof(nw), 0, 0));
		arm(EIO);
		nvio__sys.fsync = h_fsync;
		T_OK(nvio_file_commit(f));
		T_EQ_INT(atomic_load(&calls), 0);
		nvio__sys_reset();
		T_OK(nvio_file_close(f));
		check_content(path, nw, sizeof(nw));
		T_OK(t_write_file(path, old, sizeof(old)));
	}
	/* and without faults the same commit works */
	t_ctx("%s commit after the faults", t_combo());
	f = nvio_file_open(h, path, NVIO_FILE_ATOMIC, &err);
	if (T_TRUE(f != NULL)) {
		T_OK(nvio_file_pwrite(f, nw, sizeof(nw), 0, 0));
		T_OK(nvio_file_commit(f));
		T_OK(nvio_file_close(f));
		check_content(path, nw, sizeof(nw));
	}
	T_EQ_INT(t_dir_count(t_tmpdir()), nfiles);
	unlink(path);
}

int main(void)
{
	t_init("file_faults");
	nvio__sys_reset();
	real = nvio__sys;
	T_FOR_EACH_COMBO(e, d) {
		nvio_handle_t *h;

		if (t_handle(&h, e, d, 2, 65536))
			continue;
		cases(h);
		nvio__sys_reset();
		nvio_handle_destroy(h);
	}
	return t_done();
}
