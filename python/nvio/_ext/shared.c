/*
 * shared.c - files several processes write (nvio_file_share,
 * nvio_file_join) and writer streams over the caller's staging memory
 * (nvio_stream_open_config): libnvio's durability for the multi-writer
 * saves and DeepSpeed's writers, so that Python makes no temporary,
 * rename or fsync of its own.
 *
 *   file_share(file) -> (temp_path, dev, ino)
 *   file_join(handle, temp_path, dev, ino, flags=FILE_WRITE) -> File
 *   StagedStream(file, memory, offset=0, depth=2, ranges=False)
 *
 * A StagedStream holds its File and a borrow of `memory` (a LockedBuffer,
 * a pinned or CUDA tensor, any writable buffer) until close(): the
 * stream's buffers are that memory. Close it before its File (a File
 * closed first leaves the C stream to be dropped unclosed: its ops have
 * ended with the file, its bytes past the last full buffer are lost).
 */
#include "ext.h"

#include <errno.h>
#include <string.h>

typedef struct {
	PyObject_HEAD
	nvio_stream_t *s;	/* NULL once closed */
	ext_file *file;		/* strong */
	ext_buf mem;		/* the borrowed staging memory */
	int has_mem;
	int busy;
} staged;

#define METH_KW(f) (PyCFunction)(void (*)(void))(f), METH_VARARGS | METH_KEYWORDS

/* ---- files written by several processes ----------------------------- */

static int check_file(ext_state *st, PyObject *o, ext_file **out)
{
	int ok = PyObject_IsInstance(o, st->file_type);
	if (ok <= 0) {
		if (ok == 0)
			PyErr_SetString(PyExc_TypeError, "nvio: expected an nvio File");
		return -1;
	}
	*out = (ext_file *)o;
	return ext_file_check_open(*out);
}

static PyObject *file_share(PyObject *m, PyObject *arg)
{
	ext_state *st = ext_state_of(m);
	ext_file *fl;
	if (check_file(st, arg, &fl) < 0)
		return NULL;
	nvio_share_t sh;
	memset(&sh, 0, sizeof(sh));
	sh.struct_size = sizeof(sh);
	const char *tmp = nvio_file_temp_path(fl->f);
	if (!tmp || nvio_file_share(fl->f, &sh) < 0) {
		PyErr_SetString(PyExc_ValueError, "nvio: file_share needs a File opened with "
				"FILE_ATOMIC | FILE_SHARED and not committed");
		return NULL;
	}
	return Py_BuildValue("(O&KK)", PyUnicode_DecodeFSDefault, tmp,
			     (unsigned long long)sh.dev, (unsigned long long)sh.ino);
}

static PyObject *file_join(PyObject *m, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "handle", "temp_path", "dev", "ino", "flags", NULL };
	ext_state *st = ext_state_of(m);
	PyObject *hobj, *pathobj;
	unsigned long long dev, ino;
	unsigned int flags = NVIO_FILE_WRITE;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "OOKK|I:file_join", kwlist, &hobj,
					 &pathobj, &dev, &ino, &flags))
		return NULL;
	int ok = PyObject_IsInstance(hobj, st->handle_type);
	if (ok <= 0) {
		if (ok == 0)
			PyErr_SetString(PyExc_TypeError, "nvio: file_join needs an nvio Handle");
		return NULL;
	}
	nvio_share_t sh;
	memset(&sh, 0, sizeof(sh));
	sh.struct_size = sizeof(sh);
	sh.dev = dev;
	sh.ino = ino;
	return ext_file_join((ext_handle *)hobj, pathobj, &sh, flags);
}

/* ---- writer streams over the caller's memory ------------------------ */

static int staged_check(staged *self)
{
	return ext_stream_usable(self->s, self->file, self->busy);
}

static PyObject *staged_raise(staged *self, int64_t rc, const char *op, uint64_t n)
{
	ext_file *fl = self->file;
	return ext_raise_io(ext_file_state(fl), fl->handle->h, (int)rc, fl->name, fl->user_fd,
			    nvio_stream_tell(self->s), n, op, 1);
}

/* Closes the C stream (once); its file must be open. 0 or -errno. */
static int staged_close_now(staged *self, unsigned flags)
{
	nvio_stream_t *s = self->s;
	int rc = 0;
	self->s = NULL;
	if (s && self->file->f && self->file->handle->h) {
		ext_file *fl = self->file;
		ext_handle *hd = fl->handle;
		hd->busy++;
		fl->busy++;
		Py_BEGIN_ALLOW_THREADS
		rc = nvio_stream_close(s, flags);
		Py_END_ALLOW_THREADS
		hd->busy--;
		fl->busy--;
	}
	if (self->has_mem) {	/* no op of the stream is in flight now */
		self->has_mem = 0;
		ext_buf_release(&self->mem);
	}
	return rc;
}

static PyObject *staged_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "file", "memory", "offset", "depth", "ranges", NULL };
	PyObject *fobj, *memobj, *m = ext_module_of_type(type);
	long long off = 0;
	unsigned int depth = 2;
	ext_flag_arg ranges = { "ranges", 0 };
	if (!m || !PyArg_ParseTupleAndKeywords(args, kw, "OO|LIO&:StagedStream", kwlist, &fobj,
					       &memobj, &off, &depth, ext_flag_converter,
					       &ranges))
		return NULL;
	ext_state *st = ext_state_of(m);
	ext_file *fl;
	if (check_file(st, fobj, &fl) < 0)
		return NULL;
	if (off < 0 || depth < 1 || depth > 2) {
		PyErr_Format(PyExc_ValueError, "nvio: StagedStream needs offset >= 0 and depth "
			     "1 or 2, not offset=%lld, depth=%u", off, depth);
		return NULL;
	}
	allocfunc alloc = (allocfunc)PyType_GetSlot(type, Py_tp_alloc);
	staged *self = (staged *)alloc(type, 0);
	if (!self)
		return NULL;
	self->file = (ext_file *)Py_NewRef(fobj);
	if (ext_borrow(st, memobj, 1, 1, &self->mem) < 0) {
		Py_DECREF(self);
		return NULL;
	}
	self->has_mem = 1;
	if (ext_file_check_open(fl) < 0) {	/* Python code ran */
		Py_DECREF(self);
		return NULL;
	}
	nvio_stream_config_t c;
	memset(&c, 0, sizeof(c));
	c.struct_size = sizeof(c);
	c.flags = NVIO_STREAM_WRITE | (ranges.v ? NVIO_STREAM_RANGES : 0);
	c.offset = off;
	c.buffer_bytes = self->mem.nbytes;
	c.depth = depth;
	c.memory = self->mem.ptr;
	int err = 0;
	nvio_file_t *f = fl->f;
	Py_BEGIN_ALLOW_THREADS
	self->s = nvio_stream_open_config(f, &c, &err);
	Py_END_ALLOW_THREADS
	if (!self->s) {
		if (err == -EINVAL)
			PyErr_Format(PyExc_ValueError, "nvio: staging memory of %llu bytes is too "
				     "small for %u buffers of a page at least, or the file is not "
				     "open for writing", (unsigned long long)c.buffer_bytes, depth);
		else
			ext_raise_plain(st, err ? err : -ENOMEM, "nvio: cannot open a stream");
		Py_DECREF(self);
		return NULL;
	}
	return (PyObject *)self;
}

static void staged_dealloc(PyObject *o)
{
	staged *self = (staged *)o;
	PyTypeObject *tp = Py_TYPE(o);
	if (self->file)
		(void)staged_close_now(self, 0);
	else if (self->has_mem)
		ext_buf_release(&self->mem);
	Py_CLEAR(self->file);
	freefunc fr = (freefunc)PyType_GetSlot(tp, Py_tp_free);
	fr(o);
	Py_DECREF(tp);
}

static PyObject *staged_write(PyObject *s, PyObject *arg)
{
	staged *self = (staged *)s;
	if (staged_check(self) < 0)
		return NULL;
	ext_buf b;
	if (ext_borrow(ext_file_state(self->file), arg, 0, 0, &b) < 0)
		return NULL;
	if (staged_check(self) < 0) {
		ext_buf_release(&b);
		return NULL;
	}
	ext_file *fl = self->file;
	ext_handle *hd = fl->handle;
	nvio_stream_t *sm = self->s;
	int64_t r;
	hd->busy++;
	fl->busy++;
	self->busy++;
	Py_BEGIN_ALLOW_THREADS
	r = nvio_stream_write(sm, b.ptr, b.nbytes);
	Py_END_ALLOW_THREADS
	hd->busy--;
	fl->busy--;
	self->busy--;
	uint64_t n = b.nbytes;
	ext_buf_release(&b);
	if (r < 0)
		return staged_raise(self, r, "stream write", n);
	return PyLong_FromLongLong(r);
}

/* seek (ranges only), flush: calls that may wait for the stream's ops. */
static PyObject *staged_call(staged *self, int seek, long long off)
{
	if (staged_check(self) < 0)
		return NULL;
	ext_file *fl = self->file;
	ext_handle *hd = fl->handle;
	nvio_stream_t *sm = self->s;
	int r;
	hd->busy++;
	fl->busy++;
	self->busy++;
	Py_BEGIN_ALLOW_THREADS
	r = seek ? nvio_stream_seek(sm, off) : nvio_stream_flush(sm);
	Py_END_ALLOW_THREADS
	hd->busy--;
	fl->busy--;
	self->busy--;
	if (r == -EINVAL && seek) {
		PyErr_Format(PyExc_ValueError, "nvio: seek to %lld: a StagedStream seeks only "
			     "with ranges=True, to an offset >= 0", off);
		return NULL;
	}
	if (r < 0)
		return staged_raise(self, r, seek ? "stream seek" : "stream flush", 0);
	return seek ? PyLong_FromLongLong(off) : Py_NewRef(Py_None);
}

static PyObject *staged_seek(PyObject *s, PyObject *arg)
{
	long long off = PyLong_AsLongLong(arg);
	if (off == -1 && PyErr_Occurred())
		return NULL;
	return staged_call((staged *)s, 1, off);
}

static PyObject *staged_flush(PyObject *s, PyObject *unused)
{
	return staged_call((staged *)s, 0, 0);
}

static PyObject *staged_tell(PyObject *s, PyObject *unused)
{
	staged *self = (staged *)s;
	if (staged_check(self) < 0)
		return NULL;
	return PyLong_FromLongLong(nvio_stream_tell(self->s));
}

static PyObject *staged_close(PyObject *s, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "fsync", "commit", NULL };
	staged *self = (staged *)s;
	ext_flag_arg fsync = { "fsync", 0 }, commit = { "commit", 0 };
	if (!PyArg_ParseTupleAndKeywords(args, kw, "|O&O&:close", kwlist, ext_flag_converter,
					 &fsync, ext_flag_converter, &commit))
		return NULL;
	if (!self->s)
		return Py_NewRef(Py_None);
	if (self->busy) {
		PyErr_SetString(PyExc_RuntimeError,
				"nvio: a stream is used by one thread at a time");
		return NULL;
	}
	if (!self->file->f || !self->file->handle->h) {
		PyErr_SetString(PyExc_ValueError, "nvio: the stream's file was closed first");
		self->s = NULL;		/* dropped: its file took its ops */
		return NULL;
	}
	int64_t pos = nvio_stream_tell(self->s);
	int rc = staged_close_now(self, (fsync.v ? NVIO_FSYNC : 0) |
				  (commit.v ? NVIO_STREAM_COMMIT : 0));
	if (rc < 0) {
		ext_file *fl = self->file;
		return ext_raise_io(ext_file_state(fl), fl->handle->h, rc, fl->name, fl->user_fd,
				    pos, 0, "stream close", 1);
	}
	return Py_NewRef(Py_None);
}

static PyObject *staged_closed(PyObject *s, void *unused)
{
	return PyBool_FromLong(((staged *)s)->s == NULL);
}

static PyMethodDef staged_methods[] = {
	{ "write", staged_write, METH_O,
	  "write(buf) -> int: copies buf into the staging memory (large aligned spans go "
	  "straight from buf); full buffers are written while the caller goes on." },
	{ "seek", staged_seek, METH_O,
	  "seek(offset) -> offset: ranges=True only; what the buffer holds is written first." },
	{ "tell", staged_tell, METH_NOARGS, "tell() -> int: the next byte's file offset." },
	{ "flush", staged_flush, METH_NOARGS,
	  "flush(): everything written but the unaligned last block is in the file." },
	{ "close", METH_KW(staged_close),
	  "close(fsync=False, commit=False): writes the rest and waits; with ranges=False "
	  "sets the file's size to where the stream ended; commit=True commits an ATOMIC "
	  "file. The staging memory is the caller's again after it." },
	{ NULL }
};

static PyGetSetDef staged_getset[] = {
	{ "closed", staged_closed, NULL, "True once closed.", NULL },
	{ NULL }
};

static PyType_Slot staged_slots[] = {
	{ Py_tp_new, staged_new },
	{ Py_tp_dealloc, staged_dealloc },
	{ Py_tp_methods, staged_methods },
	{ Py_tp_getset, staged_getset },
	{ Py_tp_doc, "StagedStream(file, memory, offset=0, depth=2, ranges=False): a writer "
		     "stream whose buffers are the caller's memory (nvio_stream_open_config): "
		     "memory (a LockedBuffer, a pinned or CUDA tensor) is cut into depth "
		     "buffers, one filling while the other is written. ranges=True: a writer of "
		     "ranges of a file others write too (seekable; the file's size is left "
		     "alone). The memory must not be used until close()." },
	{ 0, NULL }
};

static PyType_Spec staged_spec = {
	.name = "nvio._nvio.StagedStream",
	.basicsize = sizeof(staged),
	.flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
	.slots = staged_slots,
};

static PyMethodDef shared_functions[] = {
	{ "file_share", file_share, METH_O,
	  "file_share(file) -> (temp_path, dev, ino): what writers in other processes need "
	  "to join a File opened with FILE_ATOMIC | FILE_SHARED (nvio_file_share)." },
	{ "file_join", METH_KW(file_join),
	  "file_join(handle, temp_path, dev, ino, flags=FILE_WRITE) -> File: opens the "
	  "creator's shared temporary and nothing else (nvio_file_join: no link followed, "
	  "nothing created or truncated, the creator's file only)." },
	{ NULL }
};

int ext_shared_exec(PyObject *m, ext_state *st)
{
	PyObject *t = PyType_FromModuleAndSpec(m, &staged_spec, NULL);
	int r = !t || PyModule_AddObjectRef(m, "StagedStream", t) < 0 ||
		PyModule_AddFunctions(m, shared_functions) < 0 ||
		PyModule_AddIntConstant(m, "FILE_SHARED", NVIO_FILE_SHARED) < 0 ||
		PyModule_AddIntConstant(m, "STREAM_RANGES", NVIO_STREAM_RANGES) < 0;
	Py_XDECREF(t);
	return r ? -1 : 0;
}
