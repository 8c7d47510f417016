/*
 * stream.c - the Stream type (nvio_stream_open): an append-only writer or
 * a read-ahead reader over a File, made by File.stream().
 *
 * A stream lives in its file: it holds a reference to the File, and the
 * file keeps a list of its open streams, which the file's close() closes
 * first (ext_streams_close_all). While a call runs without the GIL it
 * counts in `busy` of the stream, its file and its handle, and close()
 * of any of them is refused meanwhile.
 */
#include "ext.h"

#include <errno.h>
#include <string.h>

struct ext_stream {
	PyObject_HEAD
	nvio_stream_t *s;	/* NULL once closed */
	ext_file *file;		/* strong */
	int writer;
	int busy;
	ext_stream *next, **pprev;	/* in file->streams while open */
};

#define BUSY_ENTER(hd, fl, sm) do { (hd)->busy++; if (fl) (fl)->busy++; \
	if (sm) (sm)->busy++; } while (0)
#define BUSY_LEAVE(hd, fl, sm) do { (hd)->busy--; if (fl) (fl)->busy--; \
	if (sm) (sm)->busy--; } while (0)
#define METH_KW(f) (PyCFunction)(void (*)(void))(f), METH_VARARGS | METH_KEYWORDS

/*
 * A stream is used by one thread at a time (nvio_stream_open(3)); a
 * second thread arriving while one is inside a call is refused rather
 * than let into the stream's buffers at the same time.
 */
static int stream_check(ext_stream *self, int want_writer)
{
	if (ext_stream_usable(self->s, self->file, self->busy) < 0)
		return -1;
	if (want_writer >= 0 && want_writer != self->writer) {
		PyErr_SetString(PyExc_ValueError, want_writer ? "nvio: stream not open for writing"
							      : "nvio: stream not open for reading");
		return -1;
	}
	return 0;
}

static int stream_close_now(ext_stream *self, unsigned flags, int *rc_out)
{
	nvio_stream_t *s = self->s;
	int rc = 0;
	if (s) {
		self->s = NULL;
		*self->pprev = self->next;
		if (self->next)
			self->next->pprev = self->pprev;
		self->next = NULL;
		self->pprev = NULL;
		ext_file *fl = self->file;
		ext_handle *hd = fl->handle;
		BUSY_ENTER(hd, fl, (ext_stream *)NULL);
		Py_BEGIN_ALLOW_THREADS
		rc = nvio_stream_close(s, flags);
		Py_END_ALLOW_THREADS
		BUSY_LEAVE(hd, fl, (ext_stream *)NULL);
	}
	*rc_out = rc;
	return rc;
}

PyObject *ext_stream_open(PyObject *s, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "mode", "offset", "buffer_bytes", "depth", NULL };
	ext_file *self = (ext_file *)s;
	const char *mode;
	long long off = 0, bb = 0;
	unsigned int depth = 0;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "s|LLI:stream", kwlist, &mode, &off, &bb,
					 &depth))
		return NULL;
	int writer;
	if (!strcmp(mode, "r") || !strcmp(mode, "rb"))
		writer = 0;
	else if (!strcmp(mode, "w") || !strcmp(mode, "wb"))
		writer = 1;
	else {
		PyErr_Format(PyExc_ValueError, "nvio: stream mode must be 'r' or 'w', not '%s'", mode);
		return NULL;
	}
	if (off < 0 || bb < 0) {
		PyErr_SetString(PyExc_ValueError, "nvio: offset and buffer_bytes must be >= 0");
		return NULL;
	}
	if (ext_file_check_open(self) < 0)
		return NULL;
	ext_state *st = ext_file_state(self);
	ext_handle *hd = self->handle;
	nvio_file_t *f = self->f;
	nvio_stream_t *sm;
	int err = 0;
	BUSY_ENTER(hd, self, (ext_stream *)NULL);
	Py_BEGIN_ALLOW_THREADS
	sm = nvio_stream_open(f, writer ? NVIO_STREAM_WRITE : NVIO_STREAM_READ, off,
			      (uint64_t)bb, depth, &err);
	Py_END_ALLOW_THREADS
	BUSY_LEAVE(hd, self, (ext_stream *)NULL);
	if (!sm) {
		if (err == -EINVAL) {
			PyErr_Format(PyExc_ValueError, "nvio: invalid stream arguments (offset=%lld, "
				     "buffer_bytes=%lld, depth=%u)", off, bb, depth);
			return NULL;
		}
		if (err == -EBADF) {
			PyErr_Format(PyExc_ValueError, "nvio: the file is not open for %s",
				     writer ? "writing" : "reading");
			return NULL;
		}
		return ext_raise_plain(st, err ? err : -ENOMEM, "nvio: cannot open a stream");
	}
	allocfunc alloc = (allocfunc)PyType_GetSlot((PyTypeObject *)st->stream_type, Py_tp_alloc);
	ext_stream *so = (ext_stream *)alloc((PyTypeObject *)st->stream_type, 0);
	if (!so) {
		Py_BEGIN_ALLOW_THREADS
		nvio_stream_close(sm, 0);
		Py_END_ALLOW_THREADS
		return NULL;
	}
	so->s = sm;
	so->file = (ext_file *)Py_NewRef(s);
	so->writer = writer;
	so->next = self->streams;
	if (self->streams)
		self->streams->pprev = &so->next;
	self->streams = so;
	so->pprev = &self->streams;
	return (PyObject *)so;
}

static void stream_dealloc(PyObject *o)
{
	ext_stream *self = (ext_stream *)o;
	PyTypeObject *tp = Py_TYPE(o);
	int rc;
	if (self->s)
		stream_close_now(self, 0, &rc);
	Py_CLEAR(self->file);
	freefunc fr = (freefunc)PyType_GetSlot(tp, Py_tp_free);
	fr(o);
	Py_DECREF(tp);
}

static PyObject *stream_raise(ext_stream *self, int64_t rc, const char *op, uint64_t n)
{
	ext_file *fl = self->file;
	return ext_raise_io(ext_file_state(fl), fl->handle->h, (int)rc, fl->name, fl->user_fd,
			    0, n, op, self->writer);
}

/*
 * A stream copies between the caller's memory and its staging buffers
 * with memcpy, which device memory does not take: host memory only.
 */
static int stream_borrow(ext_stream *self, PyObject *obj, int writable, ext_buf *b)
{
	if (ext_borrow(ext_file_state(self->file), obj, writable, 0, b) < 0)
		return -1;
	if (b->keep == obj) {	/* a tensor: is it on the host? */
		PyObject *c = PyObject_GetAttrString(obj, "is_cuda");
		int cuda = c ? c == Py_True : 0;
		Py_XDECREF(c);
		PyErr_Clear();
		if (cuda) {
			ext_buf_release(b);
			PyErr_SetString(PyExc_TypeError, "nvio: streams take host memory; "
					"use File.pread/pwrite for CUDA tensors");
			return -1;
		}
	}
	return 0;
}

static PyObject *st_write(PyObject *s, PyObject *arg)
{
	ext_stream *self = (ext_stream *)s;
	if (stream_check(self, 1) < 0)
		return NULL;
	ext_buf b;
	if (stream_borrow(self, arg, 0, &b) < 0)
		return NULL;
	if (stream_check(self, 1) < 0) {
		ext_buf_release(&b);
		return NULL;
	}
	ext_file *fl = self->file;
	ext_handle *hd = fl->handle;
	nvio_stream_t *sm = self->s;
	int64_t r;
	BUSY_ENTER(hd, fl, self);
	Py_BEGIN_ALLOW_THREADS
	r = nvio_stream_write(sm, b.ptr, b.nbytes);
	Py_END_ALLOW_THREADS
	BUSY_LEAVE(hd, fl, self);
	uint64_t n = b.nbytes;
	ext_buf_release(&b);
	if (r < 0)
		return stream_raise(self, r, "write", n);
	return PyLong_FromLongLong(r);
}

/* Reads into raw memory; the bytes read, or -1 with an exception set. */
static int64_t stream_read_raw(ext_stream *self, void *p, uint64_t n)
{
	ext_file *fl = self->file;
	ext_handle *hd = fl->handle;
	nvio_stream_t *sm = self->s;
	int64_t r;
	BUSY_ENTER(hd, fl, self);
	Py_BEGIN_ALLOW_THREADS
	r = nvio_stream_read(sm, p, n);
	Py_END_ALLOW_THREADS
	BUSY_LEAVE(hd, fl, self);
	if (r < 0) {
		stream_raise(self, r, "read", n);
		return -1;
	}
	return r;
}

static PyObject *st_readinto(PyObject *s, PyObject *arg)
{
	ext_stream *self = (ext_stream *)s;
	if (stream_check(self, 0) < 0)
		return NULL;
	ext_state *st = ext_file_state(self->file);
	ext_buf b;
	if (stream_borrow(self, arg, 1, &b) < 0)
		return NULL;
	int64_t r = -1;
	if (stream_check(self, 0) == 0)
		r = stream_read_raw(self, b.ptr, b.nbytes);
	if (r > 0 && b.keep == arg && ext_torch_bump_version(st, arg) < 0)
		r = -1;
	ext_buf_release(&b);
	return r < 0 ? NULL : PyLong_FromLongLong(r);
}

static PyObject *st_read(PyObject *s, PyObject *args)
{
	ext_stream *self = (ext_stream *)s;
	long long n = -1;
	if (!PyArg_ParseTuple(args, "|L:read", &n))
		return NULL;
	if (stream_check(self, 0) < 0)
		return NULL;
	nvio_file_info_t fi;	/* never allocate past the end of the file */
	memset(&fi, 0, sizeof(fi));
	fi.struct_size = sizeof(fi);
	int rc = nvio_file_info(self->file->f, &fi);
	if (rc < 0)
		return ext_raise_plain(ext_file_state(self->file), rc, "nvio_file_info");
	int64_t pos = nvio_stream_tell(self->s);
	long long left = fi.size > (uint64_t)pos ? (long long)(fi.size - (uint64_t)pos) : 0;
	if (n < 0 || n > left)
		n = left;
	char *buf = PyMem_Malloc(n ? (size_t)n : 1);
	if (!buf)
		return PyErr_NoMemory();
	int64_t r = stream_read_raw(self, buf, (uint64_t)n);
	PyObject *res = r < 0 ? NULL : PyBytes_FromStringAndSize(buf, (Py_ssize_t)r);
	PyMem_Free(buf);
	return res;
}

static PyObject *st_seek(PyObject *s, PyObject *arg)
{
	ext_stream *self = (ext_stream *)s;
	long long off = PyLong_AsLongLong(arg);
	if (off == -1 && PyErr_Occurred())
		return NULL;
	if (stream_check(self, 0) < 0)
		return NULL;
	if (off < 0) {
		PyErr_Format(PyExc_ValueError, "nvio: negative seek position %lld", off);
		return NULL;
	}
	int r = nvio_stream_seek(self->s, off);	/* no I/O */
	if (r < 0)
		return stream_raise(self, r, "seek", 0);
	return PyLong_FromLongLong(off);
}

static PyObject *st_tell(PyObject *s, PyObject *unused)
{
	ext_stream *self = (ext_stream *)s;
	if (stream_check(self, -1) < 0)
		return NULL;
	return PyLong_FromLongLong(nvio_stream_tell(self->s));
}

static PyObject *st_flush(PyObject *s, PyObject *unused)
{
	ext_stream *self = (ext_stream *)s;
	if (stream_check(self, -1) < 0)
		return NULL;
	if (!self->writer)
		Py_RETURN_NONE;
	ext_file *fl = self->file;
	ext_handle *hd = fl->handle;
	nvio_stream_t *sm = self->s;
	int r;
	BUSY_ENTER(hd, fl, self);
	Py_BEGIN_ALLOW_THREADS
	r = nvio_stream_flush(sm);
	Py_END_ALLOW_THREADS
	BUSY_LEAVE(hd, fl, self);
	if (r < 0)
		return stream_raise(self, r, "flush", 0);
	Py_RETURN_NONE;
}

static PyObject *st_close(PyObject *s, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "fsync", "commit", NULL };
	ext_stream *self = (ext_stream *)s;
	ext_flag_arg fsa = { "fsync", 0 }, ca = { "commit", 0 };
	int rc;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "|O&O&:close", kwlist, ext_flag_converter,
					 &fsa, ext_flag_converter, &ca))
		return NULL;
	int fs = fsa.v, commit = ca.v;
	if (self->busy) {
		PyErr_SetString(PyExc_RuntimeError,
				"nvio: cannot close a stream while another thread is using it");
		return NULL;
	}
	if (!self->s)
		Py_RETURN_NONE;
	if ((fs || commit) && !self->writer) {
		PyErr_SetString(PyExc_ValueError, "nvio: fsync/commit apply to writer streams");
		return NULL;
	}
	if (commit && !(self->file->flags & NVIO_FILE_ATOMIC)) {
		PyErr_SetString(PyExc_ValueError, "nvio: commit=True needs a FILE_ATOMIC file");
		return NULL;
	}
	unsigned flags = (fs ? NVIO_FSYNC : 0) | (commit ? NVIO_STREAM_COMMIT : 0);
	stream_close_now(self, flags, &rc);
	if (rc < 0)
		return stream_raise(self, rc, "close", 0);
	Py_RETURN_NONE;
}

static PyObject *st_enter(PyObject *s, PyObject *unused)
{
	if (stream_check((ext_stream *)s, -1) < 0)
		return NULL;
	return Py_NewRef(s);
}

static PyObject *st_exit(PyObject *s, PyObject *args)
{
	PyObject *e = PyTuple_New(0);
	if (!e)
		return NULL;
	PyObject *r = st_close(s, e, NULL);
	Py_DECREF(e);
	if (!r)
		return NULL;
	Py_DECREF(r);
	Py_RETURN_FALSE;
}

static PyObject *st_get_closed(PyObject *s, void *c)
{
	ext_stream *self = (ext_stream *)s;
	return PyBool_FromLong(!self->s || !self->file->f || !self->file->handle->h);
}

static PyObject *st_get_mode(PyObject *s, void *c)
{
	return PyUnicode_FromString(((ext_stream *)s)->writer ? "w" : "r");
}

static PyObject *st_get_file(PyObject *s, void *c)
{
	return Py_NewRef((PyObject *)((ext_stream *)s)->file);
}

static PyMethodDef stream_methods[] = {
	{ "write", st_write, METH_O,
	  "write($self, buf, /)\n--\n\nAppend buf (copied or written before return); returns "
	  "len in bytes.\nA failed background flush is raised by the next call." },
	{ "readinto", st_readinto, METH_O,
	  "readinto($self, buf, /)\n--\n\nFill buf; returns the bytes read, fewer only at the "
	  "end of the file." },
	{ "read", st_read, METH_VARARGS,
	  "read($self, n=-1, /)\n--\n\nUp to n bytes (all the rest with n < 0) as bytes." },
	{ "seek", st_seek, METH_O, "seek($self, offset, /)\n--\n\nReaders: move to an absolute "
	  "offset; returns it." },
	{ "tell", st_tell, METH_NOARGS, "tell($self)\n--\n\nThe offset of the next byte." },
	{ "flush", st_flush, METH_NOARGS,
	  "flush($self)\n--\n\nWriters: wait until all but the unaligned last block is in the "
	  "file." },
	{ "close", METH_KW(st_close),
	  "close($self, fsync=False, commit=False)\n--\n\nWrite what is left, set the file's "
	  "size to where the stream ended and free\nthe stream; fsync makes it durable, commit "
	  "commits a FILE_ATOMIC file.\nIdempotent. The File stays open." },
	{ "__enter__", st_enter, METH_NOARGS, NULL },
	{ "__exit__", st_exit, METH_VARARGS, NULL },
	{ NULL, NULL, 0, NULL }
};

static PyGetSetDef stream_getset[] = {
	{ "closed", st_get_closed, NULL, "True once closed.", NULL },
	{ "mode", st_get_mode, NULL, "'r' or 'w'.", NULL },
	{ "file", st_get_file, NULL, "The File it streams.", NULL },
	{ NULL, NULL, NULL, NULL, NULL }
};

static PyObject *stream_new_refused(PyTypeObject *t, PyObject *a, PyObject *k)
{
	PyErr_SetString(PyExc_TypeError, "nvio: make a Stream with File.stream()");
	return NULL;
}

static PyType_Slot stream_slots[] = {
	{ Py_tp_new, stream_new_refused },
	{ Py_tp_dealloc, stream_dealloc },
	{ Py_tp_methods, stream_methods },
	{ Py_tp_getset, stream_getset },
	{ Py_tp_doc, "A writer or read-ahead reader over a File (nvio_stream_open).\n"
		     "Made by File.stream(mode, offset=0, buffer_bytes=0, depth=0)." },
	{ 0, NULL }
};

static PyType_Spec stream_spec = {
	"nvio._nvio.Stream", sizeof(ext_stream), 0, Py_TPFLAGS_DEFAULT, stream_slots
};


int ext_streams_busy(ext_file *f)
{
	for (ext_stream *t = f->streams; t; t = t->next)
		if (t->busy)
			return 1;
	return 0;
}

void ext_streams_close_all(ext_file *f)
{
	while (f->streams) {
		int r;
		stream_close_now(f->streams, 0, &r);
	}
}

int ext_stream_exec(PyObject *m, ext_state *st)
{
	st->stream_type = PyType_FromModuleAndSpec(m, &stream_spec, NULL);
	if (!st->stream_type || PyModule_AddObjectRef(m, "Stream", st->stream_type) < 0)
		return -1;
	return 0;
}
