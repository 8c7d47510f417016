/*
 * test_files.c - open files (nvio_file_*): the open flag table with the
 * exact errors, range I/O through an open file against libc, the size
 * nvio tracks, nvio_file_from_fd leaving the caller's descriptor alone,
 * truncate, allocate, sync, ATOMIC replacement (commit, abandon, a failed
 * op, commit twice, FIFO and device paths) and close waiting for tagged
 * ops in flight. Every engine, direct on and off.
 */
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "t.h"
#include "sys.h"

#define BS (64u << 10)
#define MAXF (4u << 20)	/* test_close_waits writes 32 x 100003 bytes */

static unsigned char *want, *got, *buf;
static uint64_t seed = 5000;

/* Opens path with flags, expecting success; NULL (failure recorded) if not. */
static nvio_file_t *open_ok(nvio_handle_t *h, const char *path,
			    unsigned flags)
{
	int err = 12345;
	nvio_file_t *f = nvio_file_open(h, path, flags, &err);

	if (!f)
		T_FAILF("nvio_file_open(%s, 0x%x): %s", path, flags,
			t_errname(err));
	return f;
}

static uint64_t info_size(nvio_file_t *f)
{
	nvio_file_info_t info;

	memset(&info, 0, sizeof(info));
	info.struct_size = sizeof(info);
	if (!T_OK(nvio_file_info(f, &info)))
		return UINT64_MAX;
	return info.size;
}

/* path holds exactly n bytes equal to w (read with libc). */
static void check_file(const char *path, const void *w, size_t n)
{
	size_t sz = 0;

	memset(got, 0, n + 1);
	if (T_OK(t_read_file(path, got, MAXF, &sz)) && T_EQ_U64(sz, n))
		T_MEM_EQ(got, w, n);
}

/* ---- the open flag table ---- */

enum target { MISSING, EXISTING, DIRECTORY, FIFO, DEVNULL };

static const struct open_case {
	const char *what;
	unsigned flags;
	enum target target;
	int err;
} open_cases[] = {
	{ "no flags", 0, EXISTING, -EINVAL },
	{ "CREATE only", NVIO_FILE_CREATE, MISSING, -EINVAL },
	{ "TRUNC only", NVIO_FILE_TRUNC, EXISTING, -EINVAL },
	{ "unknown bit 6", NVIO_FILE_READ | (1u << 6), EXISTING, -EINVAL },
	{ "unknown high bit", NVIO_FILE_WRITE | (1u << 31), EXISTING, -EINVAL },
	{ "ATOMIC|TRUNC", NVIO_FILE_ATOMIC | NVIO_FILE_TRUNC, EXISTING,
	  -EINVAL },
	{ "ATOMIC|EXCL", NVIO_FILE_ATOMIC | NVIO_FILE_EXCL, MISSING, -EINVAL },
	{ "ATOMIC|CREATE|EXCL", NVIO_FILE_ATOMIC | NVIO_FILE_CREATE |
	  NVIO_FILE_EXCL, MISSING, -EINVAL },
	{ "READ missing", NVIO_FILE_READ, MISSING, -ENOENT },
	{ "WRITE missing", NVIO_FILE_WRITE, MISSING, -ENOENT },
	{ "READ|WRITE missing", NVIO_FILE_READ | NVIO_FILE_WRITE, MISSING,
	  -ENOENT },
	{ "CREATE|EXCL existing", NVIO_FILE_WRITE | NVIO_FILE_CREATE |
	  NVIO_FILE_EXCL, EXISTING, -EEXIST },
	{ "READ directory", NVIO_FILE_READ, DIRECTORY, -EISDIR },
	{ "WRITE directory", NVIO_FILE_WRITE, DIRECTORY, -EISDIR },
	{ "ATOMIC directory", NVIO_FILE_ATOMIC, DIRECTORY, -EISDIR },
	{ "ATOMIC FIFO", NVIO_FILE_ATOMIC, FIFO, -EINVAL },
	{ "ATOMIC /dev/null", NVIO_FILE_ATOMIC, DEVNULL, -EINVAL },
};

static void test_open_table(nvio_handle_t *h)
{
	char missing[T_PATH_MAX], existing[T_PATH_MAX], dir[T_PATH_MAX],
	     fifo[T_PATH_MAX];
	const int nbefore = t_dir_count(t_tmpdir());

	t_path(missing, "missing");
	t_path(existing, "existing");
	t_subdir(dir, "dir");
	t_path(fifo, "fifo");
	T_OK(t_write_file(existing, "old", 3));
	T_OK(mkfifo(fifo, 0644));
	for (size_t i = 0; i < sizeof(open_cases) / sizeof(open_cases[0]); i++) {
		const struct open_case *c = &open_cases[i];
		const char *p = c->target == MISSING ? missing :
				c->target == EXISTING ? existing :
				c->target == DIRECTORY ? dir :
				c->target == FIFO ? fifo : "/dev/null";
		nvio_error_t e;
		nvio_file_t *f;
		int err = 0;

		t_ctx("%s open %s", t_combo(), c->what);
		f = nvio_file_open(h, p, c->flags, &err);
		if (!T_TRUE(f == NULL)) {
			nvio_file_close(f);
			continue;
		}
		T_ERR(err, c->err);
		memset(&e, 0, sizeof(e));
		e.struct_size = sizeof(e);
		T_ERR(nvio_last_error(h, &e), c->err);
		T_EQ_INT(t_file_size(missing), -ENOENT);	/* nothing made */
		T_EQ_INT(t_file_size(existing), 3);
	}
	t_ctx("%s open bad arguments", t_combo());
	{
		int err = 0;

		T_TRUE(nvio_file_open(h, NULL, NVIO_FILE_READ, &err) == NULL);
		T_ERR(err, -EINVAL);
		err = 0;
		T_TRUE(nvio_file_open(NULL, existing, NVIO_FILE_READ, &err) ==
		       NULL);
		T_ERR(err, -EINVAL);
		err = 0;
		T_TRUE(nvio_file_open(h, "", NVIO_FILE_READ, &err) == NULL);
		T_ERR(err, -ENOENT);
	}
	T_OK(nvio_file_close(NULL));

	/* CREATE makes an empty file with 0666 less the umask. */
	t_ctx("%s open CREATE", t_combo());
	{
		mode_t old = umask(027);
		nvio_file_t *f = open_ok(h, missing, NVIO_FILE_READ |
					 NVIO_FILE_WRITE | NVIO_FILE_CREATE);
		struct stat st;

		umask(old);
		if (f) {
			T_EQ_U64(info_size(f), 0);
			T_OK(nvio_file_close(f));
		}
		if (T_OK(stat(missing, &st))) {
			T_EQ_INT(st.st_mode & 0777, 0640);
			T_EQ_INT(st.st_size, 0);
		}
		/* EXCL on a new name works once */
		unlink(missing);
		f = open_ok(h, missing, NVIO_FILE_WRITE | NVIO_FILE_CREATE |
			    NVIO_FILE_EXCL);
		nvio_file_close(f);
		T_EQ_INT(t_file_size(missing), 0);
		unlink(missing);
	}
	/* TRUNC empties an existing file at open. */
	t_ctx("%s open TRUNC", t_combo());
	{
		nvio_file_t *f = open_ok(h, existing, NVIO_FILE_WRITE |
					 NVIO_FILE_TRUNC);
		nvio_file_info_t info;

		if (f) {
			T_EQ_INT(t_file_size(existing), 0);
			memset(&info, 0, sizeof(info));
			info.struct_size = sizeof(info);
			if (T_OK(nvio_file_info(f, &info))) {
				T_EQ_U64(info.size, 0);
				T_EQ_U64(info.flags, NVIO_FILE_WRITE |
					 NVIO_FILE_TRUNC);
				T_TRUE(info.fd >= 0);
				T_EQ_INT(info.committed, 0);
			}
			T_TRUE(strcmp(nvio_file_path(f), existing) == 0);
			T_OK(nvio_file_close(f));
		}
	}
	/* An op the open does not allow. */
	t_ctx("%s op not allowed by the open", t_combo());
	T_OK(t_write_file(existing, "0123456789", 10));
	{
		nvio_file_t *r = open_ok(h, existing, NVIO_FILE_READ);
		nvio_file_t *w = open_ok(h, existing, NVIO_FILE_WRITE);
		char b[4] = "abc";

		if (r)
			T_ERR(nvio_file_pwrite(r, b, 3, 0, 0), -EBADF);
		if (w)
			T_ERR(nvio_file_pread(w, b, 3, 0, 0), -EBADF);
		nvio_file_close(r);
		nvio_file_close(w);
		check_file(existing, "0123456789", 10);
	}
	unlink(existing);
	unlink(fifo);
	rmdir(dir);
	T_EQ_INT(t_dir_count(t_tmpdir()), nbefore);
}

/* ---- range I/O through an open file ---- */

static const struct { uint64_t n; int64_t off; } ranges[] = {
	{ 1, 0 }, { 1, 4095 }, { 4095, 1 }, { 4096, 4096 }, { 4097, 8191 },
	{ 65537, 3 }, { 300001, 12345 }, { 1u << 20, 4096 },
	{ (1u << 20) + 3, 777777 }, { 0, 100 },
};
#define NRANGES (sizeof(ranges) / sizeof(ranges[0]))

static void test_rw(nvio_handle_t *h)
{
	const uint64_t size0 = 2000000;
	char path[T_PATH_MAX];
	nvio_file_t *f;
	uint64_t size = size0;

	t_path(path, "rw");
	t_fill_random(want, size0, seed++);
	if (!T_OK(t_write_file(path, want, size0)))
		return;
	t_ctx("%s rw open", t_combo());
	f = open_ok(h, path, NVIO_FILE_READ | NVIO_FILE_WRITE);
	if (!f)
		return;
	T_EQ_U64(info_size(f), size0);
	for (size_t i = 0; i < NRANGES; i++) {
		uint64_t n = ranges[i].n;
		int64_t off = ranges[i].off;
		int mis = (int)(i % 3);
		unsigned fl = i % 2 ? NVIO_ASYNC : 0;

		t_ctx("%s pread %llu at %lld mis %d%s", t_combo(),
		      (unsigned long long)n, (long long)off, mis,
		      fl ? " async" : "");
		memset(buf, 0xee, n + mis + 1);
		if (T_OK(nvio_file_pread(f, buf + mis, n, off, fl))) {
			if (fl)
				T_EQ_INT(nvio_wait(h), 1);
			T_MEM_EQ(buf + mis, want + off, n);
			T_EQ_INT(buf[mis + n], 0xee);
		}
		t_ctx("%s pwrite %llu at %lld mis %d%s", t_combo(),
		      (unsigned long long)n, (long long)off, mis,
		      fl ? " async" : "");
		t_fill_random(buf + mis, n, seed++);
		if (T_OK(nvio_file_pwrite(f, buf + mis, n, off, fl))) {
			if (fl)
				T_EQ_INT(nvio_wait(h), 1);
			memcpy(want + off, buf + mis, n);
		}
		check_file(path, want, size);
	}
	/* Reads past the size fail before any I/O. */
	t_ctx("%s pread past the size", t_combo());
	T_ERR(nvio_file_pread(f, buf, 1, (int64_t)size, 0), -ENODATA);
	T_ERR(nvio_file_pread(f, buf, 4097, (int64_t)size - 4096, 0), -ENODATA);
	T_ERR(nvio_file_pread(f, buf, 1, (int64_t)size + 5000, NVIO_ASYNC),
	      -ENODATA);
	T_OK(nvio_file_pread(f, buf, 0, (int64_t)size, 0));
	T_ERR(nvio_file_pread(f, buf, 1, -1, 0), -EINVAL);
	T_ERR(nvio_file_pwrite(f, buf, 1, -1, 0), -EINVAL);
	T_ERR(nvio_file_pread(f, buf, 1, 0, 1u << 9), -EINVAL);
	T_ERR(nvio_file_pread(NULL, buf, 1, 0, 0), -EINVAL);
	T_ERR(nvio_file_pread(f, NULL, 1, 0, 0), -EINVAL);

	/* Writes past the end grow the file (a hole between), and the size
	 * nvio reports follows them. */
	t_ctx("%s pwrite past the end", t_combo());
	t_fill_random(buf + 1, 5001, seed++);
	if (T_OK(nvio_file_pwrite(f, buf + 1, 5001, (int64_t)size + 10000, 0))) {
		memset(want + size, 0, 10000);
		memcpy(want + size + 10000, buf + 1, 5001);
		size += 15001;
	}
	T_EQ_U64(info_size(f), size);
	check_file(path, want, size);
	memset(buf, 0, 15001);
	if (T_OK(nvio_file_pread(f, buf, 15001, (int64_t)size - 15001, 0)))
		T_MEM_EQ(buf, want + size - 15001, 15001);
	/* a write inside the file does not change the size */
	T_OK(nvio_file_pwrite(f, buf, 10, 0, 0));
	memcpy(want, buf, 10);
	T_EQ_U64(info_size(f), size);
	T_OK(nvio_file_sync(f));
	T_OK(nvio_file_close(f));
	check_file(path, want, size);
	unlink(path);
}

/* ---- a file over the caller's descriptor ---- */

static void test_from_fd(nvio_handle_t *h)
{
	const uint64_t n = 300001;
	char path[T_PATH_MAX], name[32];
	nvio_file_t *f;
	int fd, fl, err = 0;

	t_ctx("%s from_fd", t_combo());
	t_path(path, "fromfd");
	t_fill_random(want, n, seed++);
	if (!T_OK(t_write_file(path, want, n)))
		return;
	fd = open(path, O_RDWR | O_CLOEXEC);
	if (!T_TRUE(fd >= 0))
		return;
	T_EQ_INT(lseek(fd, 123, SEEK_SET), 123);
	fl = fcntl(fd, F_GETFL);
	f = nvio_file_from_fd(h, fd, NVIO_FILE_READ | NVIO_FILE_WRITE, &err);
	if (T_TRUE(f != NULL)) {
		snprintf(name, sizeof(name), "fd %d", fd);
		if (strcmp(nvio_file_path(f), name))
			T_FAILF("nvio_file_path = \"%s\", expected \"%s\"",
				nvio_file_path(f), name);
		T_EQ_U64(info_size(f), n);
		memset(buf, 0, n);
		if (T_OK(nvio_file_pread(f, buf + 1, n - 7, 7, 0)))
			T_MEM_EQ(buf + 1, want + 7, n - 7);
		t_fill_random(buf + 3, 70000, seed++);
		if (T_OK(nvio_file_pwrite(f, buf + 3, 70000, 4099, 0)))
			memcpy(want + 4099, buf + 3, 70000);
		t_fill_random(buf, 100, seed++);
		if (T_OK(nvio_file_pwrite(f, buf, 100, (int64_t)n, NVIO_ASYNC)) &&
		    T_EQ_INT(nvio_wait(h), 1))
			memcpy(want + n, buf, 100);
		T_EQ_U64(info_size(f), n + 100);
		T_OK(nvio_file_close(f));
	}
	/* never closed, offset and flags as they were */
	T_EQ_INT(fcntl(fd, F_GETFD) >= 0, 1);
	T_EQ_INT(lseek(fd, 0, SEEK_CUR), 123);
	T_EQ_INT(fcntl(fd, F_GETFL), fl);
	check_file(path, want, n + 100);
	close(fd);

	t_ctx("%s from_fd bad arguments", t_combo());
	fd = open(path, O_RDONLY | O_CLOEXEC);
	err = 0;
	f = nvio_file_from_fd(h, fd, NVIO_FILE_WRITE, &err);
	if (!T_TRUE(f == NULL))
		nvio_file_close(f);
	T_ERR(err, -EBADF);
	err = 0;
	f = nvio_file_from_fd(h, fd, 0, &err);
	if (!T_TRUE(f == NULL))
		nvio_file_close(f);
	T_ERR(err, -EINVAL);
	err = 0;
	f = nvio_file_from_fd(h, fd, NVIO_FILE_READ | NVIO_FILE_ATOMIC, &err);
	if (!T_TRUE(f == NULL))
		nvio_file_close(f);
	T_ERR(err, -EINVAL);
	err = 0;
	f = nvio_file_from_fd(h, -1, NVIO_FILE_READ, &err);
	if (!T_TRUE(f == NULL))
		nvio_file_close(f);
	T_ERR(err, -EBADF);
	T_EQ_INT(fcntl(fd, F_GETFD) >= 0, 1);
	close(fd);
	unlink(path);
}

/* ---- truncate, allocate ---- */

static void test_truncate_allocate(nvio_handle_t *h)
{
	char path[T_PATH_MAX];
	nvio_file_t *f;
	int r;

	t_ctx("%s truncate", t_combo());
	t_path(path, "trunc");
	t_fill_random(want, 100000, seed++);
	if (!T_OK(t_write_file(path, want, 100000)))
		return;
	f = open_ok(h, path, NVIO_FILE_READ | NVIO_FILE_WRITE);
	if (!f)
		return;
	T_OK(nvio_file_truncate(f, 5001));
	T_EQ_INT(t_file_size(path), 5001);
	T_EQ_U64(info_size(f), 5001);
	check_file(path, want, 5001);
	T_ERR(nvio_file_pread(f, buf, 2, 5000, 0), -ENODATA);
	T_OK(nvio_file_truncate(f, 200000));
	memset(want + 5001, 0, 200000 - 5001);
	T_EQ_U64(info_size(f), 200000);
	check_file(path, want, 200000);
	memset(buf, 0xee, 200000);
	if (T_OK(nvio_file_pread(f, buf + 1, 199999, 1, 0)))
		T_MEM_EQ(buf + 1, want + 1, 199999);
	T_OK(nvio_file_truncate(f, 0));
	T_EQ_INT(t_file_size(path), 0);
	T_EQ_U64(info_size(f), 0);

	t_ctx("%s allocate", t_combo());
	t_fill_random(want, 10000, seed++);
	T_OK(nvio_file_pwrite(f, want, 10000, 0, 0));
	r = nvio_file_allocate(f, 4096, 1u << 20);
	if (r == -EOPNOTSUPP) {
		t_note("%s: fallocate not supported in %s", t_combo(),
		       t_tmpdir());
	} else if (T_OK(r)) {
		int64_t sz = t_file_size(path);

		/* the bytes there unchanged; a growth is to the range's end */
		T_TRUE(sz == 10000 || sz == 4096 + (1 << 20));
		T_EQ_U64(info_size(f), (uint64_t)sz);
		memset(want + 10000, 0, (size_t)sz - 10000);
		check_file(path, want, (size_t)sz);
	}
	T_ERR(nvio_file_allocate(f, -1, 10), -EINVAL);
	T_OK(nvio_file_sync(f));
	T_OK(nvio_file_close(f));

	/* a read-only file cannot be changed */
	f = open_ok(h, path, NVIO_FILE_READ);
	if (f) {
		T_ERR(nvio_file_truncate(f, 1), -EBADF);
		T_OK(nvio_file_close(f));
	}
	unlink(path);
}

/* ---- ATOMIC ---- */

static atomic_int fault_writes;	/* io_result: writes fail with -EIO */

static ssize_t eio_writes(int is_write, int fd, uint64_t off, size_t n,
			  ssize_t res)
{
	if (is_write && atomic_load(&fault_writes))
		return -EIO;
	return res;
}

static void test_atomic(nvio_handle_t *h)
{
	const uint64_t nold = 70001, nnew = 1234567;
	char path[T_PATH_MAX], fresh[T_PATH_MAX];
	unsigned char *old = malloc(nold);
	nvio_file_info_t info;
	nvio_file_t *f;
	struct stat st;
	int nfiles;

	t_path(path, "atomic");
	t_path(fresh, "atomic-fresh");
	if (!old)
		return;
	t_fill_random(old, nold, seed++);
	if (!T_OK(t_write_file(path, old, nold)) || !T_OK(chmod(path, 0640)))
		goto out;
	nfiles = t_dir_count(t_tmpdir());

	t_ctx("%s ATOMIC commit", t_combo());
	f = open_ok(h, path, NVIO_FILE_ATOMIC | NVIO_FILE_READ);
	if (f) {
		T_EQ_U64(info_size(f), 0);	/* starts empty */
		T_ERR(nvio_file_pread(f, buf, 1, 0, 0), -ENODATA);
		t_fill_random(want, nnew, seed++);
		/* in two pieces, the path checked between them */
		T_OK(nvio_file_pwrite(f, want, 600000, 0, 0));
		check_file(path, old, nold);
		memcpy(buf + 1, want + 600000, nnew - 600000);
		T_OK(nvio_file_pwrite(f, buf + 1, nnew - 600000, 600000,
				      NVIO_ASYNC));
		T_EQ_INT(nvio_wait(h), 1);
		check_file(path, old, nold);
		T_OK(nvio_file_commit(f));
		check_file(path, want, nnew);
		if (T_OK(stat(path, &st)))
			T_EQ_INT(st.st_mode & 07777, 0640);
		memset(&info, 0, sizeof(info));
		info.struct_size = sizeof(info);
		if (T_OK(nvio_file_info(f, &info)))
			T_EQ_INT(info.committed, 1);
		/* still open, on the new content */
		memset(buf, 0, 5000);
		if (T_OK(nvio_file_pread(f, buf, 5000, 100, 0)))
			T_MEM_EQ(buf, want + 100, 5000);
		T_ERR(nvio_file_commit(f), -EINVAL);	/* twice */
		T_OK(nvio_file_close(f));
		check_file(path, want, nnew);
		T_EQ_INT(t_dir_count(t_tmpdir()), nfiles);
	}

	t_ctx("%s ATOMIC abandoned", t_combo());
	T_OK(t_write_file(path, old, nold));
	f = open_ok(h, path, NVIO_FILE_ATOMIC);
	if (f) {
		T_OK(nvio_file_pwrite(f, want, 300000, 0, 0));
		check_file(path, old, nold);
		T_OK(nvio_file_close(f));
		check_file(path, old, nold);
		T_EQ_INT(t_dir_count(t_tmpdir()), nfiles);
	}

	t_ctx("%s ATOMIC commit after a failed op", t_combo());
	f = open_ok(h, path, NVIO_FILE_ATOMIC);
	if (f) {
		T_OK(nvio_file_pwrite(f, want, 100000, 0, 0));
		atomic_store(&fault_writes, 1);
		nvio__sys.io_result = eio_writes;
		T_ERR(nvio_file_pwrite(f, want + 100000, 100000, 100000, 0),
		      -EIO);
		nvio__sys_reset();
		atomic_store(&fault_writes, 0);
		T_OK(nvio_file_pwrite(f, want + 200000, 1000, 200000, 0));
		T_ERR(nvio_file_commit(f), -EIO);
		check_file(path, old, nold);
		T_OK(nvio_file_close(f));
		check_file(path, old, nold);
		T_EQ_INT(t_dir_count(t_tmpdir()), nfiles);
	}

	t_ctx("%s ATOMIC to a new name", t_combo());
	{
		mode_t m = umask(022);

		f = open_ok(h, fresh, NVIO_FILE_ATOMIC);
		if (f) {
			T_OK(nvio_file_pwrite(f, want + 1, 4097, 0, 0));
			T_EQ_INT(t_file_size(fresh), -ENOENT);
			T_OK(nvio_file_commit(f));
			check_file(fresh, want + 1, 4097);
			if (T_OK(stat(fresh, &st)))
				T_EQ_INT(st.st_mode & 07777, 0644);
			T_OK(nvio_file_close(f));
		}
		umask(m);
		unlink(fresh);
	}

	t_ctx("%s commit of a file not ATOMIC", t_combo());
	f = open_ok(h, path, NVIO_FILE_WRITE);
	if (f) {
		T_ERR(nvio_file_commit(f), -EINVAL);
		T_OK(nvio_file_close(f));
	}
	T_EQ_INT(t_dir_count(t_tmpdir()), nfiles);
out:
	unlink(path);
	free(old);
}

/* ---- close waits for tagged ops in flight ---- */

static void test_close_waits(nvio_handle_t *h)
{
	const int nops = t_quick() ? 8 : 32;
	const uint64_t sz = 100003;
	char path[T_PATH_MAX];
	nvio_op_t ops[32];
	nvio_completion_t c[32];
	int seen[32] = { 0 }, n = 0, r;
	nvio_file_t *f;

	t_ctx("%s close waits for tagged ops", t_combo());
	t_path(path, "closewait");
	f = open_ok(h, path, NVIO_FILE_WRITE | NVIO_FILE_CREATE);
	if (!f)
		return;
	t_fill_random(want, sz * (uint64_t)nops, seed++);
	memset(ops, 0, sizeof(ops));
	for (int i = 0; i < nops; i++) {
		ops[i].opcode = NVIO_OP_WRITE;
		ops[i].file = f;
		ops[i].buf = want + (uint64_t)i * sz;
		ops[i].nbytes = sz;
		ops[i].offset = (int64_t)((uint64_t)i * sz);
		ops[i].user_data = 77 + (uint64_t)i;
	}
	r = nvio_submit(h, ops, (unsigned)nops);
	T_EQ_INT(r, nops);
	T_OK(nvio_file_close(f));
	/* every byte is in the file now, before any reap */
	check_file(path, want, sz * (uint64_t)(r > 0 ? r : 0));
	while (n < r) {
		int k = nvio_reap(h, c, 32, 1, 10ll * 1000 * 1000 * 1000);

		if (!T_TRUE(k > 0))
			break;
		for (int i = 0; i < k; i++) {
			uint64_t u = c[i].user_data - 77;

			if (!T_TRUE(u < (uint64_t)nops) || !T_EQ_INT(seen[u], 0))
				continue;
			seen[u] = 1;
			T_EQ_INT(c[i].res, (int64_t)sz);
		}
		n += k;
	}
	T_EQ_INT(nvio_reap(h, c, 32, 0, 0), 0);
	T_EQ_U64(nvio_inflight(h), 0);
	unlink(path);
}

int main(void)
{
	t_init("files");
	want = t_alloc(MAXF + 1);
	got = t_alloc(MAXF + 1);
	buf = t_alloc(MAXF + 4096);
	T_FOR_EACH_COMBO(e, d) {
		nvio_handle_t *h;

		if (t_handle(&h, e, d, 2, BS))
			continue;
		test_open_table(h);
		test_rw(h);
		test_from_fd(h);
		test_truncate_allocate(h);
		test_atomic(h);
		test_close_waits(h);
		t_ctx("%s end", t_combo());
		T_EQ_U64(nvio_pending(h), 0);
		T_EQ_U64(nvio_inflight(h), 0);
		nvio_handle_destroy(h);
	}
	free(want);
	free(got);
	free(buf);
	return t_done();
}
