/*
 * test_args.c - invalid op arguments are rejected at submit with the
 * exact -errno, sync and async, and a rejected async op is never counted
 * by nvio_wait().
 */
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "t.h"

static char good[T_PATH_MAX];	/* a 100-byte file */
static char missing[T_PATH_MAX];
static char dirpath[T_PATH_MAX];
static char big[T_PATH_MAX];	/* 8192 bytes */

enum { OP_PREAD, OP_PWRITE, OP_PREAD_FD, OP_PWRITE_FD, OP_READ_FILE,
       OP_WRITE_FILE };

struct bad_op {
	const char *what;
	int op;
	int null_handle;
	int null_buf;
	uint64_t nbytes;
	const char *path;	/* for the path ops; NULL means NULL */
	int fd;			/* for the fd ops: -2 good O_RDWR, -3 closed,
				 * -4 O_RDONLY, -5 O_WRONLY, -6 a directory */
	int64_t offset;
	unsigned flags;
	int want;		/* exact -errno */
	int want2;		/* also accepted (ambiguous contract), or 0 */
	int late_ok;		/* async: may be accepted and fail at wait */
};

static int fd_rdwr, fd_closed, fd_rdonly, fd_wronly, fd_dir;

static int pick_fd(int code)
{
	switch (code) {
	case -2: return fd_rdwr;
	case -3: return fd_closed;
	case -4: return fd_rdonly;
	case -5: return fd_wronly;
	case -6: return fd_dir;
	default: return code;
	}
}

static int run_op(nvio_handle_t *h, const struct bad_op *b, void *buf,
		  unsigned extra_flags, uint64_t *size_out)
{
	nvio_handle_t *hh = b->null_handle ? NULL : h;
	void *p = b->null_buf ? NULL : buf;
	unsigned fl = b->flags | extra_flags;

	switch (b->op) {
	case OP_PREAD:
		return nvio_pread(hh, p, b->nbytes, b->path, b->offset, fl);
	case OP_PWRITE:
		return nvio_pwrite(hh, p, b->nbytes, b->path, b->offset, fl);
	case OP_PREAD_FD:
		return nvio_pread_fd(hh, p, b->nbytes, pick_fd(b->fd),
				     b->offset, fl);
	case OP_PWRITE_FD:
		return nvio_pwrite_fd(hh, p, b->nbytes, pick_fd(b->fd),
				      b->offset, fl);
	case OP_READ_FILE:
		return nvio_read_file(hh, p, b->nbytes, b->path, size_out, fl);
	case OP_WRITE_FILE:
		return nvio_write_file(hh, p, b->nbytes, b->path, fl);
	}
	return -999;
}

static void test_table(nvio_handle_t *h, const char *combo)
{
	const struct bad_op ops[] = {
		/* NULL handle */
		{ "pread NULL handle", OP_PREAD, 1, 0, 10, good, 0, 0, 0, -EINVAL, 0, 0 },
		{ "pwrite NULL handle", OP_PWRITE, 1, 0, 10, good, 0, 0, 0, -EINVAL, 0, 0 },
		{ "pread_fd NULL handle", OP_PREAD_FD, 1, 0, 10, NULL, -2, 0, 0, -EINVAL, 0, 0 },
		{ "pwrite_fd NULL handle", OP_PWRITE_FD, 1, 0, 10, NULL, -2, 0, 0, -EINVAL, 0, 0 },
		{ "read_file NULL handle", OP_READ_FILE, 1, 0, 200, good, 0, 0, 0, -EINVAL, 0, 0 },
		{ "write_file NULL handle", OP_WRITE_FILE, 1, 0, 10, good, 0, 0, 0, -EINVAL, 0, 0 },
		/* NULL buffer with bytes to move */
		{ "pread NULL buf", OP_PREAD, 0, 1, 10, good, 0, 0, 0, -EINVAL, 0, 0 },
		{ "pwrite NULL buf", OP_PWRITE, 0, 1, 10, good, 0, 0, 0, -EINVAL, 0, 0 },
		{ "pread_fd NULL buf", OP_PREAD_FD, 0, 1, 10, NULL, -2, 0, 0, -EINVAL, 0, 0 },
		{ "pwrite_fd NULL buf", OP_PWRITE_FD, 0, 1, 10, NULL, -2, 0, 0, -EINVAL, 0, 0 },
		{ "read_file NULL buf", OP_READ_FILE, 0, 1, 200, good, 0, 0, 0, -EINVAL, 0, 0 },
		{ "write_file NULL buf", OP_WRITE_FILE, 0, 1, 10, good, 0, 0, 0, -EINVAL, 0, 0 },
		/* negative offsets */
		{ "pread offset -1", OP_PREAD, 0, 0, 10, good, 0, -1, 0, -EINVAL, 0, 0 },
		{ "pwrite offset -1", OP_PWRITE, 0, 0, 10, good, 0, -1, 0, -EINVAL, 0, 0 },
		{ "pread_fd offset -4096", OP_PREAD_FD, 0, 0, 10, NULL, -2, -4096, 0, -EINVAL, 0, 0 },
		{ "pwrite_fd offset INT64_MIN", OP_PWRITE_FD, 0, 0, 10, NULL, -2, INT64_MIN, 0, -EINVAL, 0, 0 },
		/* unknown flag bits */
		{ "pread flag 1<<3", OP_PREAD, 0, 0, 10, good, 0, 0, 1u << 3, -EINVAL, 0, 0 },
		{ "pwrite flag 1<<31", OP_PWRITE, 0, 0, 10, good, 0, 0, 1u << 31, -EINVAL, 0, 0 },
		{ "pread_fd flag 1<<8", OP_PREAD_FD, 0, 0, 10, NULL, -2, 0, 1u << 8, -EINVAL, 0, 0 },
		{ "pwrite_fd flag 1<<16", OP_PWRITE_FD, 0, 0, 10, NULL, -2, 0, 1u << 16, -EINVAL, 0, 0 },
		{ "read_file flag 1<<5", OP_READ_FILE, 0, 0, 200, good, 0, 0, 1u << 5, -EINVAL, 0, 0 },
		{ "write_file flag 1<<30", OP_WRITE_FILE, 0, 0, 10, good, 0, 0, 1u << 30, -EINVAL, 0, 0 },
		/* NULL path */
		{ "pread NULL path", OP_PREAD, 0, 0, 10, NULL, 0, 0, 0, -EINVAL, 0, 0 },
		{ "pwrite NULL path", OP_PWRITE, 0, 0, 10, NULL, 0, 0, 0, -EINVAL, 0, 0 },
		{ "read_file NULL path", OP_READ_FILE, 0, 0, 200, NULL, 0, 0, 0, -EINVAL, 0, 0 },
		{ "write_file NULL path", OP_WRITE_FILE, 0, 0, 10, NULL, 0, 0, 0, -EINVAL, 0, 0 },
		/* missing file */
		{ "pread missing", OP_PREAD, 0, 0, 10, missing, 0, 0, 0, -ENOENT, 0, 0 },
		{ "read_file missing", OP_READ_FILE, 0, 0, 200, missing, 0, 0, 0, -ENOENT, 0, 0 },
		/* past the end of the file */
		{ "pread 101 of 100", OP_PREAD, 0, 0, 101, good, 0, 0, 0, -ENODATA, 0, 0 },
		{ "pread 1 at 100", OP_PREAD, 0, 0, 1, good, 0, 100, 0, -ENODATA, 0, 0 },
		{ "pread 10 at 95", OP_PREAD, 0, 0, 10, good, 0, 95, 0, -ENODATA, 0, 0 },
		{ "pread 0 at 200", OP_PREAD, 0, 0, 0, good, 0, 200, 0, -ENODATA, 0, 0 },
		{ "pread 4097 at 4096 of 8192", OP_PREAD, 0, 0, 4097, big, 0, 4096, 0, -ENODATA, 0, 0 },
		{ "pread_fd 101 of 100", OP_PREAD_FD, 0, 0, 101, NULL, -4, 0, 0, -ENODATA, 0, 0 },
		/* directories */
		{ "pwrite directory", OP_PWRITE, 0, 0, 10, dirpath, 0, 0, 0, -EISDIR, 0, 0 },
		{ "pread directory", OP_PREAD, 0, 0, 10, dirpath, 0, 0, 0, -EISDIR, 0, 1 },
		{ "write_file directory", OP_WRITE_FILE, 0, 0, 10, dirpath, 0, 0, 0, -EISDIR, 0, 0 },
		{ "pwrite_fd directory fd", OP_PWRITE_FD, 0, 0, 10, NULL, -6, 0, 0, -EBADF, -EISDIR, 1 },
		/* bad descriptors */
		{ "pread_fd closed fd", OP_PREAD_FD, 0, 0, 10, NULL, -3, 0, 0, -EBADF, 0, 0 },
		{ "pwrite_fd closed fd", OP_PWRITE_FD, 0, 0, 10, NULL, -3, 0, 0, -EBADF, 0, 0 },
		{ "pread_fd fd -1", OP_PREAD_FD, 0, 0, 10, NULL, -1, 0, 0, -EBADF, -EINVAL, 0 },
		{ "pwrite_fd fd -1", OP_PWRITE_FD, 0, 0, 10, NULL, -1, 0, 0, -EBADF, -EINVAL, 0 },
		{ "pwrite_fd O_RDONLY fd", OP_PWRITE_FD, 0, 0, 10, NULL, -4, 0, 0, -EBADF, 0, 0 },
		{ "pread_fd O_WRONLY fd", OP_PREAD_FD, 0, 0, 10, NULL, -5, 0, 0, -EBADF, 0, 0 },
		/* whole-file read into a buffer too small */
		{ "read_file cap 99 of 100", OP_READ_FILE, 0, 0, 99, good, 0, 0, 0, -EOVERFLOW, 0, 0 },
		{ "read_file cap 0 of 100", OP_READ_FILE, 0, 0, 0, good, 0, 0, 0, -EOVERFLOW, 0, 0 },
		/* whole-file read of something with no size */
		{ "read_file character device", OP_READ_FILE, 0, 0, 200, "/dev/null", 0, 0, 0, -EINVAL, 0, 0 },
		/* offset + nbytes past INT64_MAX (the header names no errno;
		 * -EINVAL is "bad argument", -EFBIG what the kernel says) */
		{ "pwrite end > INT64_MAX", OP_PWRITE, 0, 0, 100, good, 0, INT64_MAX - 10, 0, -EINVAL, -EFBIG, 0 },
		{ "pread end > INT64_MAX", OP_PREAD, 0, 0, 100, good, 0, INT64_MAX - 10, 0, -EINVAL, -ENODATA, 0 },
		{ "pwrite_fd end > INT64_MAX", OP_PWRITE_FD, 0, 0, 100, NULL, -2, INT64_MAX - 10, 0, -EINVAL, -EFBIG, 0 },
		{ "pread nbytes UINT64_MAX", OP_PREAD, 0, 0, UINT64_MAX, good, 0, 0, 0, -EINVAL, -ENODATA, 0 },
		{ "pwrite nbytes UINT64_MAX", OP_PWRITE, 0, 0, UINT64_MAX, good, 0, 0, 0, -EINVAL, -EFBIG, 0 },
		{ "pwrite nbytes 2^63", OP_PWRITE, 0, 0, 1ull << 63, good, 0, 0, 0, -EINVAL, -EFBIG, 0 },
	};
	static char buf[8192];
	unsigned char before[100], after[100];
	size_t sz;

	if (t_read_file(good, before, sizeof(before), &sz) || sz != 100)
		T_FAILF("cannot read %s back", good);
	for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
		for (int async = 0; async < 2; async++) {
			const struct bad_op *b = &ops[i];
			uint64_t size_out = 0;
			int r;

			t_ctx("%s %s%s", combo, b->what, async ? " ASYNC" : "");
			r = run_op(h, b, buf, async ? NVIO_ASYNC : 0,
				   &size_out);
			if (async && r == 0 && b->late_ok) {
				/* Accepted: the error must come from wait. */
				int w = nvio_wait(h);

				if (w != b->want && (!b->want2 || w != b->want2))
					T_ERR(w, b->want);
				T_ERR(nvio_wait(h), 0);
				continue;
			}
			if (r != b->want && (!b->want2 || r != b->want2))
				T_ERR(r, b->want);
			else if (b->want2 && r == b->want2 && !async)
				t_note("%s: %s (the header does not say which "
				       "of %s/%s)", b->what, t_errname(r),
				       t_errname(b->want),
				       t_errname(b->want2));
			T_EQ_U64(nvio_pending(h), 0);
			if (b->op == OP_READ_FILE && b->want == -EOVERFLOW &&
			    r == -EOVERFLOW && size_out != 100 && !async)
				t_note("read_file -EOVERFLOW left *size_out "
				       "%llu, not the file size 100",
				       (unsigned long long)size_out);
			if (!b->null_handle && r < 0) {
				nvio_error_t e = { .struct_size = sizeof(e) };

				memset(&e, 0, sizeof(e));
				e.struct_size = sizeof(e);
				nvio_last_error(h, &e);
				/* refused calls too: each records its own */
				if (e.err != r)
					T_FAILF("last_error().err %s after "
						"a %s", t_errname(e.err),
						t_errname(r));
			}
			/* A rejected async op is never counted. */
			T_ERR(nvio_wait(h), 0);
		}
	}
	/* Nothing above may have changed the good file. */
	t_ctx("%s good file unchanged", combo);
	memset(after, 0, sizeof(after));
	if (!t_read_file(good, after, sizeof(after), &sz)) {
		T_EQ_U64(sz, 100);
		T_MEM_EQ(after, before, 100);
	}
	T_EQ_INT(t_file_size(missing), -ENOENT);
}

/* nvio_last_error names the missing file, op and direction. */
static void test_last_error(nvio_handle_t *h, const char *combo)
{
	char buf[64];
	nvio_error_t e = { .struct_size = sizeof(e) };
	int n;

	t_ctx("%s last_error after ENOENT", combo);
	T_ERR(nvio_pread(h, buf, 10, missing, 0, 0), -ENOENT);
	memset(&e, 0, sizeof(e));
	e.struct_size = sizeof(e);
	T_ERR(nvio_last_error(h, &e), -ENOENT);
	T_ERR(e.err, -ENOENT);
	T_EQ_INT(e.is_write, 0);
	if (!strstr(e.path, missing))
		T_FAILF("last_error().path \"%s\" does not name %s", e.path,
			missing);
	{
		char line[2048], tiny[8];

		n = nvio_format_error(&e, line, sizeof(line));
		T_TRUE(n > 0 && (size_t)n == strlen(line));
		T_TRUE(strstr(line, missing) != NULL);
		T_EQ_INT(nvio_format_error(&e, tiny, sizeof(tiny)), n);
		T_EQ_U64(strlen(tiny), sizeof(tiny) - 1);
		T_EQ_INT(nvio_format_error(&e, NULL, 0), n);
	}

	t_ctx("%s last_error after a refused call", combo);
	T_ERR(nvio_pread(h, buf, 10, missing, 0, 0), -ENOENT);
	T_ERR(nvio_pwrite(h, buf, 10, good, 0, 1u << 20), -EINVAL);
	memset(&e, 0, sizeof(e));
	e.struct_size = sizeof(e);
	T_ERR(nvio_last_error(h, &e), -EINVAL);
	T_TRUE(strcmp(e.path, good) == 0);	/* not the missing file */
	T_TRUE(strcmp(e.what, "flags") == 0);
	T_EQ_U64(e.op_seq, 0);
	T_EQ_INT(e.is_write, 1);
	T_ERR(nvio_pread_fd(h, buf, 10, -7, 3, 0), -EBADF);
	T_ERR(nvio_last_error(h, &e), -EBADF);
	T_TRUE(strcmp(e.path, "fd -7") == 0);
	T_EQ_INT(e.offset, 3);
	T_ERR(nvio_read_file(h, buf, 10, NULL, NULL, 0), -EINVAL);
	T_ERR(nvio_last_error(h, &e), -EINVAL);
	T_TRUE(strcmp(e.what, "path (NULL)") == 0);

	t_ctx("%s last_error after read_file of a character device", combo);
	{
		uint64_t size_out = 77;

		T_ERR(nvio_read_file(h, buf, sizeof(buf), "/dev/null",
				     &size_out, 0), -EINVAL);
		memset(&e, 0, sizeof(e));
		e.struct_size = sizeof(e);
		T_ERR(nvio_last_error(h, &e), -EINVAL);
		T_TRUE(strcmp(e.path, "/dev/null") == 0);
		T_TRUE(strstr(e.what, "size") != NULL);
		T_EQ_U64(size_out, 77);
	}

	t_ctx("%s last_error after ENODATA", combo);
	T_ERR(nvio_pread(h, buf, 50, good, 60, 0), -ENODATA);
	memset(&e, 0, sizeof(e));
	e.struct_size = sizeof(e);
	T_ERR(nvio_last_error(h, &e), -ENODATA);
	T_EQ_INT(e.is_write, 0);
	if (!strstr(e.path, good))
		T_FAILF("last_error().path \"%s\" does not name %s", e.path,
			good);

	t_ctx("%s last_error after EISDIR", combo);
	T_ERR(nvio_pwrite(h, buf, 10, dirpath, 0, 0), -EISDIR);
	memset(&e, 0, sizeof(e));
	e.struct_size = sizeof(e);
	T_ERR(nvio_last_error(h, &e), -EISDIR);
	T_EQ_INT(e.is_write, 1);
	if (!strstr(e.path, dirpath))
		T_FAILF("last_error().path \"%s\" does not name %s", e.path,
			dirpath);
	/* The pwrite into a directory must not have created anything. */
	T_EQ_INT(t_dir_count(dirpath), 0);
}

/* Size-0 ops are fine and leave everything as it was. */
static void test_zero(nvio_handle_t *h, const char *combo)
{
	char buf[16] = { 0 };
	char p[T_PATH_MAX];
	uint64_t sz = 77;

	t_ctx("%s zero-size ops", combo);
	T_OK(nvio_pread(h, buf, 0, good, 0, 0));
	T_OK(nvio_pread(h, buf, 0, good, 100, 0));
	T_OK(nvio_pwrite(h, buf, 0, good, 50, 0));
	T_EQ_INT(t_file_size(good), 100);
	t_path(p, "zero-file");
	T_OK(nvio_pwrite(h, buf, 0, p, 0, 0));
	T_EQ_INT(t_file_size(p), 0);	/* created, empty */
	T_OK(nvio_write_file(h, buf, 0, p, 0));
	T_EQ_INT(t_file_size(p), 0);
	T_OK(nvio_read_file(h, buf, sizeof(buf), p, &sz, 0));
	T_EQ_U64(sz, 0);
	T_OK(nvio_pread(h, buf, 0, p, 0, NVIO_ASYNC));
	T_EQ_U64(nvio_pending(h), 1);
	T_EQ_INT(nvio_wait(h), 1);
	T_EQ_INT(nvio_file_size(p), 0);
	T_EQ_INT(nvio_file_size(good), 100);
	T_EQ_INT(nvio_file_size(missing), -ENOENT);
	T_EQ_INT(nvio_file_size(NULL), -EINVAL);
	unlink(p);
}

int main(void)
{
	char data[8192];
	char closed_path[T_PATH_MAX];

	t_init("args");
	t_path(good, "good");
	t_path(missing, "missing");
	t_path(big, "big");
	t_subdir(dirpath, "adir");
	t_fill_random(data, sizeof(data), 1);
	if (t_write_file(good, data, 100) || t_write_file(big, data, 8192))
		t_skip("cannot write test files in %s", t_tmpdir());

	fd_rdwr = open(good, O_RDWR | O_CLOEXEC);
	fd_rdonly = open(good, O_RDONLY | O_CLOEXEC);
	fd_wronly = open(good, O_WRONLY | O_CLOEXEC);
	fd_dir = open(dirpath, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	t_path(closed_path, "closed");
	fd_closed = open(closed_path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
	if (fd_rdwr < 0 || fd_rdonly < 0 || fd_wronly < 0 || fd_dir < 0 ||
	    fd_closed < 0)
		t_skip("cannot open test descriptors");
	/* A high number the library's own descriptors will not reuse. */
	{
		int hi = fcntl(fd_closed, F_DUPFD_CLOEXEC, 900);

		close(fd_closed);
		fd_closed = hi;
		if (hi >= 0)
			close(hi);	/* its number now names nothing */
	}

	T_FOR_EACH_COMBO(e, d) {
		const char *combo = t_combo();
		nvio_handle_t *h;

		t_ctx("%s create", combo);
		if (t_handle(&h, e, d, 2, 4096))
			continue;
		test_table(h, combo);
		test_last_error(h, combo);
		test_zero(h, combo);
		t_ctx("%s end", combo);
		T_EQ_U64(nvio_pending(h), 0);
		T_ERR(nvio_wait(h), 0);
		nvio_handle_destroy(h);
	}
	close(fd_rdwr);
	close(fd_rdonly);
	close(fd_wronly);
	close(fd_dir);
	return t_done();
}
