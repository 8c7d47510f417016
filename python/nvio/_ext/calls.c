/*
 * calls.c - the Handle's one-buffer calls by file name or descriptor
 * (DeepNVMe's pread/pwrite, sync_*, async_*, read, write): the work
 * behind handle.c's argument parsing.
 *
 * Contracts:
 *   - An accepted async op keeps its buffer (and file name) alive in the
 *     handle's holds until the wait() that covers it returns, even when
 *     that wait raises, or until the handle is destroyed.
 *   - A blocking call opens the file, moves its bytes through the
 *     blocking runner (blocking.c: Ctrl-C is seen while it runs), and
 *     closes the file; a file it created and failed to fill is removed
 *     if its name still leads to it.
 */
#include "ext.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *const names[] = { "pread", "pwrite", "read", "write" };

static int kind_writes(int kind)
{
	return kind == EXT_IO_WRITE || kind == EXT_IO_WRITE_FILE;
}

/*
 * Opens the file of a blocking call: by path (a write creates it, noting
 * so in *created) or over the caller's fd. NULL with an exception set.
 */
static nvio_file_t *open_for(ext_handle *self, int kind, const char *path, int fd,
			     PyObject *shown, int *created)
{
	ext_state *st = ext_handle_state(self);
	nvio_handle_t *h = self->h;
	int is_write = kind_writes(kind);
	unsigned fl = kind == EXT_IO_WRITE_FILE ? NVIO_FILE_ATOMIC
		    : is_write ? NVIO_FILE_WRITE : NVIO_FILE_READ;
	nvio_file_t *f;
	int err = 0;

	*created = 0;
	self->busy++;
	Py_BEGIN_ALLOW_THREADS
	if (!path) {
		f = nvio_file_from_fd(h, fd, is_write ? NVIO_FILE_WRITE : NVIO_FILE_READ, &err);
	} else {
		f = nvio_file_open(h, path, fl, &err);
		/* Not there: create it, knowing it is ours to remove on failure. */
		for (int tries = 0; !f && err == -ENOENT && kind == EXT_IO_WRITE && tries < 3;
		     tries++) {
			f = nvio_file_open(h, path, NVIO_FILE_WRITE | NVIO_FILE_CREATE |
					   NVIO_FILE_EXCL, &err);
			if (f)
				*created = 1;
			else if (err == -EEXIST)
				f = nvio_file_open(h, path, fl, &err);
		}
	}
	Py_END_ALLOW_THREADS
	self->busy--;
	if (!f)
		ext_raise_io(st, h, err ? err : -EIO, shown, fd, 0, 0, "open", is_write);
	return f;
}

static void close_private(ext_handle *self, nvio_file_t *f, const char *path, int created,
			  int failed)
{
	struct stat a, b;
	int same = 0;
	nvio_file_info_t fi;

	memset(&fi, 0, sizeof(fi));
	fi.struct_size = sizeof(fi);
	self->busy++;
	Py_BEGIN_ALLOW_THREADS
	/* A file this call created and failed to fill is removed, if its
	 * name still leads to it. */
	if (created && failed && nvio_file_info(f, &fi) == 0 && fstat(fi.fd, &a) == 0 &&
	    stat(path, &b) == 0)
		same = a.st_dev == b.st_dev && a.st_ino == b.st_ino;
	(void)nvio_file_close(f);
	if (same)
		(void)unlink(path);
	Py_END_ALLOW_THREADS
	self->busy--;
}

/* An async op: submitted, its hold kept until a wait() covers it.
 * 0, or -1 with an exception set (x freed either way or kept). */
static int io_async(ext_handle *self, int kind, ext_hold *x, const char *path, int fd,
		    PyObject *shown, int64_t offset, unsigned flags)
{
	nvio_handle_t *h = self->h;
	void *ptr = x->buf.ptr;
	uint64_t n = x->buf.nbytes;
	int rc;

	self->busy++;
	Py_BEGIN_ALLOW_THREADS
	if (kind == EXT_IO_READ)
		rc = path ? nvio_pread(h, ptr, n, path, offset, flags)
			  : nvio_pread_fd(h, ptr, n, fd, offset, flags);
	else
		rc = path ? nvio_pwrite(h, ptr, n, path, offset, flags)
			  : nvio_pwrite_fd(h, ptr, n, fd, offset, flags);
	Py_END_ALLOW_THREADS
	self->busy--;
	if (rc < 0) {
		ext_raise_io(ext_handle_state(self), h, rc, shown, fd, offset, n, names[kind],
			     kind_writes(kind));
		ext_hold_free(x);
		return -1;
	}
	if (ext_holds_add(&self->holds, x) < 0) {
		/* The op is running: it must not lose its buffer. */
		self->busy++;
		Py_BEGIN_ALLOW_THREADS
		(void)nvio_wait(h);
		Py_END_ALLOW_THREADS
		self->busy--;
		ext_hold_free(x);
		return -1;
	}
	return 0;
}

/*
 * read(): the bytes to read from offset, which must be the buffer's n
 * (DeepSpeed's contract; allow_short takes fewer). 0 with *count set, or
 * -1 with the size mismatch raised.
 */
static int read_file_count(ext_state *st, nvio_file_t *f, const char *path, PyObject *shown,
			   int64_t offset, uint64_t n, int allow_short, uint64_t *count)
{
	nvio_file_info_t fi;
	memset(&fi, 0, sizeof(fi));
	fi.struct_size = sizeof(fi);
	int rc = nvio_file_info(f, &fi);
	if (rc < 0) {
		ext_raise_plain(st, rc, "nvio_file_info");
		return -1;
	}
	uint64_t left = fi.size > (uint64_t)offset ? fi.size - (uint64_t)offset : 0;
	PyObject *msg = NULL;
	*count = left;
	if (left > n)
		msg = PyUnicode_FromFormat(
			"nvio: read(): %s has %llu bytes from offset %lld but the "
			"buffer holds only %llu bytes", path, (unsigned long long)left,
			(long long)offset, (unsigned long long)n);
	else if (left < n && !allow_short)
		/* A short file (a truncated checkpoint) must not load silently
		 * with a stale tail. */
		msg = PyUnicode_FromFormat(
			"nvio: read(): %s has %llu bytes from offset %lld but the "
			"buffer holds %llu bytes; sizes must match (allow_short=True "
			"reads the %llu bytes there are and returns that count)",
			path, (unsigned long long)left, (long long)offset, (unsigned long long)n,
			(unsigned long long)left);
	if (!msg)
		return PyErr_Occurred() ? -1 : 0;
	PyObject *e = PyObject_CallFunction(st->error, "iOO", left > n ? EOVERFLOW : ENODATA,
					    msg, shown);
	Py_DECREF(msg);
	if (e) {
		PyErr_SetObject(st->error, e);
		Py_DECREF(e);
	}
	return -1;
}

/* The transfer of a blocking call on its open file f, and write()'s
 * commit. 0, a negative errno with *rec set, or EXT_RAISED. */
static int io_transfer(ext_handle *self, int kind, nvio_file_t *f, const char *path,
		       void *ptr, uint64_t count, int64_t offset, unsigned flags,
		       nvio_error_t *rec)
{
	int r = ext_run_sync(self, f, path, kind_writes(kind), ptr, count, offset, flags,
			     NULL, 0, rec);
	if (r == 0 && kind == EXT_IO_WRITE_FILE) {
		/* in place only now that every byte is written */
		self->busy++;
		Py_BEGIN_ALLOW_THREADS
		r = nvio_file_commit(f);
		Py_END_ALLOW_THREADS
		self->busy--;
		if (r < 0)
			ext_record_of(self->h, r, rec);
	}
	return r;
}

/* A blocking call: open, transfer, close. 0 with *moved set, or -1 with
 * an exception set. */
static int io_blocking(ext_handle *self, int kind, ext_buf *b, PyObject *bufobj,
		       const char *path, int fd, PyObject *shown, int64_t offset,
		       unsigned flags, int allow_short, uint64_t *moved)
{
	ext_state *st = ext_handle_state(self);
	int created = 0, own = 0, r = 0, torch = b->keep == bufobj;
	uint64_t count = b->nbytes;
	nvio_file_t *f = open_for(self, kind, path, fd, shown, &created);
	if (!f)
		return -1;
	nvio_error_t *rec = PyMem_Malloc(sizeof(*rec));
	if (!rec) {
		close_private(self, f, path, created, 1);
		PyErr_NoMemory();
		return -1;
	}
	/* a size mismatch of read() is found here, not by libnvio */
	if (kind == EXT_IO_READ_FILE)
		own = read_file_count(st, f, path, shown, offset, b->nbytes, allow_short,
				      &count) < 0;
	if (!own)
		r = io_transfer(self, kind, f, path, b->ptr, count, offset, flags, rec);
	close_private(self, f, path, created, own || r != 0);
	if (torch && !kind_writes(kind) && !own && r == 0 &&
	    ext_torch_bump_version(st, bufobj) < 0)
		r = EXT_RAISED;
	if (!own && r < 0) {
		if (rec->what[0] || rec->path[0])
			ext_raise_record(st, rec, shown);
		else
			ext_raise_io(st, NULL, r, shown, fd, offset, b->nbytes, names[kind],
				     kind_writes(kind));
	}
	PyMem_Free(rec);
	if (own || r != 0)
		return -1;
	*moved = count;
	return 0;
}

int ext_handle_io(ext_handle *self, int kind, PyObject *bufobj, PyObject *filename,
		  PyObject *fdobj, long long offset, unsigned flags, int allow_short,
		  uint64_t *moved)
{
	int is_write = kind_writes(kind), async = (flags & NVIO_ASYNC) != 0, fd;
	ext_state *st = ext_handle_state(self);
	PyObject *pathb, *shown;

	if (ext_handle_check_open(self) < 0)
		return -1;
	if (offset < 0) {
		PyErr_Format(PyExc_ValueError, "nvio: file_offset must be >= 0, not %lld", offset);
		return -1;
	}
	if (ext_parse_target(filename, fdobj, &pathb, &fd, &shown) < 0)
		return -1;
	if ((kind == EXT_IO_READ_FILE || kind == EXT_IO_WRITE_FILE) && !pathb) {
		PyErr_SetString(PyExc_TypeError, "nvio: read()/write() need a filename, not an fd");
		return -1;
	}
	if (kind == EXT_IO_WRITE_FILE && offset != 0)
		kind = EXT_IO_WRITE;	/* at an offset, write() is a pwrite */
	ext_hold *x = ext_hold_new();
	if (!x) {
		Py_XDECREF(pathb);
		return -1;
	}
	x->path = pathb;
	/* a torch tensor (its own keeper): for async ops, its storage too;
	 * converting it ran Python code: the handle may have closed */
	if (ext_borrow(st, bufobj, !is_write, async, &x->buf) < 0 ||
	    ext_handle_check_open(self) < 0) {
		ext_hold_free(x);
		return -1;
	}
	const char *path = pathb ? PyBytes_AsString(pathb) : NULL;
	if (async)
		return io_async(self, kind, x, path, fd, shown, offset, flags);
	int r = io_blocking(self, kind, &x->buf, bufobj, path, fd, shown, offset, flags,
			    allow_short, moved);
	ext_hold_free(x);
	return r;
}
