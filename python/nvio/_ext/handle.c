/*
 * handle.c - the Handle type (DeepNVMe aio_handle compatible): every
 * method beside its method table (the one-buffer calls' work is in
 * calls.c, File in file.c, tagged ops and queues in tagged.c), and the
 * handle's configuration (engine, direct mode, tuned entries).
 *
 * Contracts:
 *   - The GIL is released around every libnvio call that may block; while
 *     it is, the handle counts the call in `busy`.
 *   - A handle is never destroyed while a thread is inside one of its
 *     calls: the method call holds a reference, and close() refuses while
 *     busy.
 *   - An accepted async op keeps its buffer (and file name) alive in the
 *     handle's holds until the wait() that covers it returns, even when
 *     that wait raises, or until the handle is destroyed.
 *   - Synchronous calls return 1 (pread/pwrite) or 0 (read/write);
 *     asynchronous ones 0 once queued. Failures raise, never return -1.
 */
#include "ext.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

/*
 * Closes the handle's queues and open files (their ops end first),
 * destroys the C handle (waiting for the rest of the ops in flight), then
 * drops holds and the borrows of tagged ops never reaped. While it waits,
 * without the GIL, the handle counts as busy: another thread's close() is
 * refused instead of dropping the holds of ops that are still running.
 */
static void handle_shutdown(ext_handle *self)
{
	ext_queue *queues = ext_queues_detach(self);	/* closed for all from here */
	if (self->h)
		ext_files_close_all(self);	/* files live in the handle */
	nvio_handle_t *h = self->h;
	self->h = NULL;
	if (h) {
		self->busy++;
		Py_BEGIN_ALLOW_THREADS
		nvio_handle_destroy(h);
		Py_END_ALLOW_THREADS
		self->busy--;
	}
	ext_holds_release(&self->holds, UINT64_MAX);
	ext_cq_release(&self->cq);
	ext_queues_release(queues);
}

/* The configuration of Handle(...)'s arguments into *cfg (for errors:
 * *block, *depth, *par). 0, or -1 with an exception set. */
static int handle_config(PyObject *args, PyObject *kw, nvio_config_t *cfg,
			 long long *block, long long *depth, long long *par)
{
	static char *kwlist[] = { "block_size", "queue_depth", "single_submit",
		"overlap_events", "intra_op_parallelism", "engine", "direct",
		"staging_bytes", "gds", NULL };
	long long staging = 0;
	ext_flag_arg single = { "single_submit", 0 }, overlap = { "overlap_events", 0 };
	ext_flag_arg gds = { "gds", 0 };
	PyObject *engine = NULL, *direct = NULL;

	*block = NVIO_DEFAULT_BLOCK_SIZE;
	*depth = NVIO_DEFAULT_QUEUE_DEPTH;
	*par = 1;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "|LLO&O&L$OOLO&:AioHandle", kwlist,
					 block, depth, ext_flag_converter, &single,
					 ext_flag_converter, &overlap, par,
					 &engine, &direct, &staging, ext_flag_converter, &gds))
		return -1;
	/* Each limit named with its value: a bare "invalid" says nothing. */
	if (*block <= 0) {
		PyErr_Format(PyExc_ValueError, "nvio: block_size must be > 0, not %lld", *block);
		return -1;
	}
	if (*depth <= 0 || *depth > NVIO_MAX_QUEUE_DEPTH) {
		PyErr_Format(PyExc_ValueError, "nvio: queue_depth must be 1..%u "
			     "(NVIO_MAX_QUEUE_DEPTH), not %lld", NVIO_MAX_QUEUE_DEPTH, *depth);
		return -1;
	}
	if (*par <= 0 || *par > NVIO_MAX_PARALLELISM) {
		PyErr_Format(PyExc_ValueError, "nvio: intra_op_parallelism must be 1..%u "
			     "(NVIO_MAX_PARALLELISM), not %lld", NVIO_MAX_PARALLELISM, *par);
		return -1;
	}
	if (staging < 0) {
		PyErr_Format(PyExc_ValueError, "nvio: staging_bytes must be >= 0, not %lld",
			     staging);
		return -1;
	}
	nvio_config_init(cfg);
	cfg->block_size = (uint64_t)*block;
	cfg->queue_depth = (uint32_t)*depth;
	cfg->intra_op_parallelism = (uint32_t)*par;
	cfg->single_submit = (uint32_t)single.v;
	cfg->overlap_events = (uint32_t)overlap.v;
	if (staging)
		cfg->staging_bytes = (uint64_t)staging;
	if (gds.v)
		cfg->flags |= NVIO_HANDLE_GDS;
	if (ext_parse_engine(engine, &cfg->engine) < 0 || ext_parse_direct(direct, &cfg->direct) < 0)
		return -1;
	return 0;
}

static PyObject *handle_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
	long long block, depth, par;
	nvio_config_t cfg;

	if (handle_config(args, kw, &cfg, &block, &depth, &par) < 0)
		return NULL;
	PyObject *module = ext_module_of_type(type);
	if (!module)
		return NULL;
	allocfunc alloc = (allocfunc)PyType_GetSlot(type, Py_tp_alloc);
	ext_handle *self = (ext_handle *)alloc(type, 0);
	if (!self)
		return NULL;
	self->module = Py_NewRef(module);
	self->holds.next_seq = 1;
	nvio_handle_t *h = NULL;
	int rc;
	Py_BEGIN_ALLOW_THREADS
	rc = nvio_handle_create(&h, &cfg);
	Py_END_ALLOW_THREADS
	if (rc < 0) {
		Py_DECREF(self);
		if (rc == -EINVAL) {
			PyErr_Format(PyExc_ValueError,
				     "nvio: invalid handle configuration (block_size=%lld, "
				     "queue_depth=%lld, intra_op_parallelism=%lld, engine=%s): %s",
				     block, depth, par, nvio_engine_name(cfg.engine)
				     ? nvio_engine_name(cfg.engine) : "?", nvio_strerror(rc));
			return NULL;
		}
		char what[128];
		snprintf(what, sizeof(what), "nvio: cannot create a handle with engine %s",
			 nvio_engine_name(cfg.engine) ? nvio_engine_name(cfg.engine) : "?");
		return ext_raise_plain(ext_state_of(module), rc, what);
	}
	self->h = h;
	self->cq.q = nvio_handle_queue(h);
	return (PyObject *)self;
}

static void handle_dealloc(PyObject *o)
{
	ext_handle *self = (ext_handle *)o;
	PyTypeObject *tp = Py_TYPE(o);
	handle_shutdown(self);	/* waits for ops in flight, then drops holds */
	ext_holds_fini(&self->holds);
	Py_CLEAR(self->module);
	freefunc f = (freefunc)PyType_GetSlot(tp, Py_tp_free);
	f(o);
	Py_DECREF(tp);
}

static int resolve_async(PyObject *a, PyObject *b, int *out)
{
	if (a && b) {
		PyErr_SetString(PyExc_TypeError, "nvio: give async_op or async, not both");
		return -1;
	}
	*out = 0;
	if (a)
		return ext_parse_flag(a, "async_op", out);
	if (b)
		return ext_parse_flag(b, "async", out);
	return 0;
}

/* NVIO_* op flags of the flag arguments; -1 (TypeError) for fsync on a read. */
static int op_flags(int is_read, int validate, int as, int fs, unsigned *out)
{
	if (fs && is_read) {
		PyErr_SetString(PyExc_TypeError, "nvio: fsync applies to writes only");
		return -1;
	}
	*out = (validate ? NVIO_VALIDATE : 0) | (as ? NVIO_ASYNC : 0) | (fs ? NVIO_FSYNC : 0);
	return 0;
}

static PyObject *rw_generic(ext_handle *self, PyObject *args, PyObject *kw, int kind)
{
	static char *kwlist[] = { "buffer", "filename", "validate", "async_op",
		"file_offset", "async", "fd", "fsync", NULL };
	PyObject *buf, *fn = Py_None, *a1 = NULL, *a2 = NULL, *fdobj = Py_None;
	ext_flag_arg validate = { "validate", 0 }, fs = { "fsync", 0 };
	int as;
	long long off = 0;
	unsigned flags;
	uint64_t moved;
	if (!PyArg_ParseTupleAndKeywords(args, kw,
		kind == EXT_IO_READ ? "O|OO&OL$OOO&:pread" : "O|OO&OL$OOO&:pwrite", kwlist,
		&buf, &fn, ext_flag_converter, &validate, &a1, &off, &a2, &fdobj,
		ext_flag_converter, &fs))
		return NULL;
	if (resolve_async(a1, a2, &as) < 0 ||
	    op_flags(kind == EXT_IO_READ, validate.v, as, fs.v, &flags) < 0)
		return NULL;
	if (ext_handle_io(self, kind, buf, fn, fdobj, off, flags, 0, &moved) < 0)
		return NULL;
	return PyLong_FromLong(as ? 0 : 1);
}

static PyObject *h_pread(PyObject *s, PyObject *a, PyObject *k)
{
	return rw_generic((ext_handle *)s, a, k, EXT_IO_READ);
}

static PyObject *h_pwrite(PyObject *s, PyObject *a, PyObject *k)
{
	return rw_generic((ext_handle *)s, a, k, EXT_IO_WRITE);
}

static PyObject *rw_fixed(ext_handle *self, PyObject *args, PyObject *kw, int kind, int as)
{
	static char *kwlist[] = { "buffer", "filename", "file_offset", "fd",
		"validate", "fsync", NULL };
	PyObject *buf, *fn = Py_None, *fdobj = Py_None;
	long long off = 0;
	ext_flag_arg validate = { "validate", 0 }, fs = { "fsync", 0 };
	unsigned flags;
	uint64_t moved;
	static const char *const fmts[2][2] = {
		{ "O|OL$OO&O&:sync_pread", "O|OL$OO&O&:async_pread" },
		{ "O|OL$OO&O&:sync_pwrite", "O|OL$OO&O&:async_pwrite" },
	};
	if (!PyArg_ParseTupleAndKeywords(args, kw, fmts[kind == EXT_IO_WRITE][as != 0], kwlist,
					 &buf, &fn, &off, &fdobj, ext_flag_converter, &validate,
					 ext_flag_converter, &fs))
		return NULL;
	if (op_flags(kind == EXT_IO_READ, validate.v, as, fs.v, &flags) < 0)
		return NULL;
	if (ext_handle_io(self, kind, buf, fn, fdobj, off, flags, 0, &moved) < 0)
		return NULL;
	return PyLong_FromLong(as ? 0 : 1);
}

static PyObject *h_sync_pread(PyObject *s, PyObject *a, PyObject *k)
{
	return rw_fixed((ext_handle *)s, a, k, EXT_IO_READ, 0);
}

static PyObject *h_sync_pwrite(PyObject *s, PyObject *a, PyObject *k)
{
	return rw_fixed((ext_handle *)s, a, k, EXT_IO_WRITE, 0);
}

static PyObject *h_async_pread(PyObject *s, PyObject *a, PyObject *k)
{
	return rw_fixed((ext_handle *)s, a, k, EXT_IO_READ, 1);
}

static PyObject *h_async_pwrite(PyObject *s, PyObject *a, PyObject *k)
{
	return rw_fixed((ext_handle *)s, a, k, EXT_IO_WRITE, 1);
}

static PyObject *file_rw(ext_handle *self, PyObject *args, PyObject *kw, int kind)
{
	static char *kwlist[] = { "buffer", "filename", "validate", "file_offset",
		"fsync", "allow_short", NULL };
	PyObject *buf, *fn;
	ext_flag_arg validate = { "validate", 0 }, fs = { "fsync", 0 };
	ext_flag_arg short_ok = { "allow_short", 0 };
	long long off = 0;
	unsigned flags;
	uint64_t moved;
	if (!PyArg_ParseTupleAndKeywords(args, kw, kind == EXT_IO_READ_FILE ? "OO|O&L$O&O&:read" :
					 "OO|O&L$O&O&:write", kwlist, &buf, &fn,
					 ext_flag_converter, &validate, &off,
					 ext_flag_converter, &fs, ext_flag_converter, &short_ok))
		return NULL;
	if (short_ok.v && kind != EXT_IO_READ_FILE) {
		PyErr_SetString(PyExc_TypeError, "nvio: allow_short applies to read() only");
		return NULL;
	}
	if (op_flags(kind == EXT_IO_READ_FILE, validate.v, 0, fs.v, &flags) < 0)
		return NULL;
	if (ext_handle_io(self, kind, buf, fn, NULL, off, flags, short_ok.v, &moved) < 0)
		return NULL;
	/* DeepSpeed returns 0; the opt-in short read says how much it read */
	return PyLong_FromUnsignedLongLong(short_ok.v ? moved : 0);
}

static PyObject *h_read(PyObject *s, PyObject *a, PyObject *k)
{
	return file_rw((ext_handle *)s, a, k, EXT_IO_READ_FILE);
}

static PyObject *h_write(PyObject *s, PyObject *a, PyObject *k)
{
	return file_rw((ext_handle *)s, a, k, EXT_IO_WRITE_FILE);
}

static PyObject *h_wait(PyObject *s, PyObject *unused)
{
	ext_handle *self = (ext_handle *)s;
	if (ext_handle_check_open(self) < 0)
		return NULL;
	/* Every hold added before now belongs to an op this wait covers. */
	uint64_t limit = self->holds.next_seq;
	nvio_handle_t *h = self->h;
	int rc;
	self->busy++;
	/*
	 * Wait in slices of 50 ms so that Ctrl-C raises KeyboardInterrupt
	 * promptly: an interrupted wait reports nothing and releases no
	 * buffer (the ops keep theirs until a later wait reports them), so
	 * what the ops write into stays alive and the next wait sees them.
	 */
	for (;;) {
		Py_BEGIN_ALLOW_THREADS
		rc = nvio_wait_idle(h, 50000000ll);
		Py_END_ALLOW_THREADS
		if (rc != -ETIMEDOUT)
			break;
		if (PyErr_CheckSignals() < 0) {
			self->busy--;
			return NULL;
		}
	}
	Py_BEGIN_ALLOW_THREADS
	rc = nvio_wait(h);
	Py_END_ALLOW_THREADS
	self->busy--;
	if (rc < 0) {
		/* Name the file of the failed op when the error record has one. */
		PyObject *target = NULL;
		nvio_error_t *e = PyMem_Malloc(sizeof(*e));
		if (e)
			e->struct_size = sizeof(*e);
		if (e && nvio_last_error(h, e) == rc && e->path[0] &&
		    strncmp(e->path, "fd ", 3) != 0) {
			target = PyUnicode_DecodeFSDefault(e->path);
			if (!target)
				PyErr_Clear();
		}
		PyMem_Free(e);
		ext_raise_io(ext_handle_state(self), h, rc, target, -1, 0, 0, "wait", 0);
		Py_XDECREF(target);
		ext_holds_release(&self->holds, limit);
		return NULL;
	}
	ext_holds_release(&self->holds, limit);
	return PyLong_FromLong(rc);
}

static PyObject *h_pending(PyObject *s, PyObject *unused)
{
	ext_handle *self = (ext_handle *)s;
	if (ext_handle_check_open(self) < 0)
		return NULL;
	return PyLong_FromUnsignedLong(nvio_pending(self->h));
}

static PyObject *h_close(PyObject *s, PyObject *unused)
{
	ext_handle *self = (ext_handle *)s;
	if (self->busy) {
		PyErr_SetString(PyExc_RuntimeError,
				"nvio: cannot close a handle while another thread is using it");
		return NULL;
	}
	handle_shutdown(self);
	Py_RETURN_NONE;
}

static PyObject *h_enter(PyObject *s, PyObject *unused)
{
	if (ext_handle_check_open((ext_handle *)s) < 0)
		return NULL;
	return Py_NewRef(s);
}

static PyObject *h_exit(PyObject *s, PyObject *args)
{
	PyObject *r = h_close(s, NULL);
	if (!r)
		return NULL;
	Py_DECREF(r);
	Py_RETURN_FALSE;
}

static PyObject *h_open(PyObject *s, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "path", "flags", NULL };
	PyObject *path, *fl = NULL;
	unsigned flags = NVIO_FILE_READ;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O:open", kwlist, &path, &fl))
		return NULL;
	if (fl && ext_parse_flags(fl, &flags) < 0)
		return NULL;
	if (PyLong_Check(path)) {
		PyErr_SetString(PyExc_TypeError, "nvio: open() takes a path; use open_fd() for a descriptor");
		return NULL;
	}
	return ext_file_open((ext_handle *)s, path, -1, flags);
}

static PyObject *h_open_fd(PyObject *s, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "fd", "flags", NULL };
	int fd;
	PyObject *fl = NULL;
	unsigned flags = NVIO_FILE_READ;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "i|O:open_fd", kwlist, &fd, &fl))
		return NULL;
	if (fl && ext_parse_flags(fl, &flags) < 0)
		return NULL;
	return ext_file_open((ext_handle *)s, NULL, fd, flags);
}

/* Tagged ops on the handle's default queue: the user's (tagged.c). */
static PyObject *h_submit(PyObject *s, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "", "pending", NULL };
	ext_handle *self = (ext_handle *)s;
	PyObject *ops, *pending = Py_None;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O:submit", kwlist, &ops, &pending))
		return NULL;
	return ext_cq_submit(self, &self->cq, ops, pending);
}

static PyObject *h_reap(PyObject *s, PyObject *args, PyObject *kw)
{
	ext_handle *self = (ext_handle *)s;
	return ext_cq_reap(self, &self->cq, args, kw);
}

static PyObject *h_completion_fd(PyObject *s, PyObject *unused)
{
	ext_handle *self = (ext_handle *)s;
	if (ext_handle_check_open(self) < 0)
		return NULL;
	int fd = nvio_queue_fd(self->cq.q);
	if (fd < 0)
		return ext_raise_plain(ext_handle_state(self), fd, "nvio_completion_fd");
	return PyLong_FromLong(fd);
}

static PyObject *h_get_inflight(PyObject *s, void *unused)
{
	return PyLong_FromUnsignedLong(ext_cq_inflight(&((ext_handle *)s)->cq));
}

static PyObject *h_queue(PyObject *s, PyObject *unused)
{
	return ext_queue_new((ext_handle *)s);
}

#define GETTER(fname, expr)						\
	static PyObject *fname(PyObject *s, PyObject *unused)		\
	{								\
		ext_handle *self = (ext_handle *)s;			\
		if (ext_handle_check_open(self) < 0)				\
			return NULL;					\
		return expr;						\
	}

GETTER(h_get_block_size, PyLong_FromUnsignedLongLong(nvio_get_block_size(self->h)))
GETTER(h_get_queue_depth, PyLong_FromUnsignedLong(nvio_get_queue_depth(self->h)))
GETTER(h_get_single_submit, PyBool_FromLong(nvio_get_single_submit(self->h)))
GETTER(h_get_overlap_events, PyBool_FromLong(nvio_get_overlap_events(self->h)))
GETTER(h_get_intra_op_parallelism,
       PyLong_FromUnsignedLong(nvio_get_intra_op_parallelism(self->h)))
GETTER(h_get_alignment,
       PyLong_FromUnsignedLongLong(512ull * nvio_get_intra_op_parallelism(self->h)))

/* A C string as str; NULL (an unknown value) reads as `dflt`. */
static PyObject *str_or(const char *v, const char *dflt)
{
	return PyUnicode_FromString(v ? v : dflt);
}

GETTER(h_get_engine, str_or(nvio_engine_name(nvio_get_engine(self->h)), "unknown"))
GETTER(h_get_direct, str_or(nvio_direct_name(nvio_get_direct(self->h)), "unknown"))
GETTER(h_get_engine_note, str_or(nvio_get_engine_note(self->h), ""))
GETTER(h_uses_gds, PyBool_FromLong(nvio_get_gds(self->h) == 1))

static PyObject *config_dict(const nvio_config_t *c)
{
	const char *en = nvio_engine_name(c->engine);
	const char *dn = nvio_direct_name(c->direct);
	return Py_BuildValue("{sKsIsOsOsIsssssK}",
		"block_size", (unsigned long long)c->block_size,
		"queue_depth", (unsigned)c->queue_depth,
		"single_submit", c->single_submit ? Py_True : Py_False,
		"overlap_events", c->overlap_events ? Py_True : Py_False,
		"intra_op_parallelism", (unsigned)c->intra_op_parallelism,
		"engine", en ? en : "auto",
		"direct", dn ? dn : "auto",
		"staging_bytes", (unsigned long long)c->staging_bytes);
}

static PyObject *h_get_config(PyObject *s, PyObject *unused)
{
	ext_handle *self = (ext_handle *)s;
	if (ext_handle_check_open(self) < 0)
		return NULL;
	nvio_config_t c;
	memset(&c, 0, sizeof(c));
	c.struct_size = sizeof(c);
	int rc = nvio_handle_config(self->h, &c);
	if (rc < 0)
		return ext_raise_plain(ext_handle_state(self), rc, "nvio_handle_config");
	return config_dict(&c);
}

static PyObject *h_save_tuned(PyObject *s, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "dir", "for_write", NULL };
	ext_handle *self = (ext_handle *)s;
	PyObject *dirb;
	int fw = 0;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "O&|p:save_tuned", kwlist,
					 PyUnicode_FSConverter, &dirb, &fw))
		return NULL;
	if (ext_handle_check_open(self) < 0) {
		Py_DECREF(dirb);
		return NULL;
	}
	nvio_config_t c;
	memset(&c, 0, sizeof(c));
	c.struct_size = sizeof(c);
	int rc = nvio_handle_config(self->h, &c);
	if (rc >= 0) {
		const char *d = PyBytes_AsString(dirb);
		Py_BEGIN_ALLOW_THREADS
		rc = nvio_config_save_tuned(&c, d, fw);
		Py_END_ALLOW_THREADS
	}
	Py_DECREF(dirb);
	if (rc < 0)
		return ext_raise_plain(ext_handle_state(self), rc, "nvio_config_save_tuned");
	Py_RETURN_NONE;
}

static PyObject *h_get_closed(PyObject *s, void *c)
{
	return PyBool_FromLong(((ext_handle *)s)->h == NULL);
}

#define RW_DOC_TAIL \
	"buffer: a contiguous CPU torch.Tensor (any dtype), a NumPy array, any\n" \
	"object with the buffer protocol, or a DLPack producer on the CPU.\n" \
	"filename: str, bytes or os.PathLike; or an int file descriptor (also as\n" \
	"fd=), which is used as is and never closed.\n" \
	"Failures raise nvio.NvioError (an OSError) instead of returning -1.\n"

static PyMethodDef handle_methods[] = {
	{ "pread", (PyCFunction)(void (*)(void))h_pread, METH_VARARGS | METH_KEYWORDS,
	  "pread($self, buffer, filename, validate=False, async_op=False, file_offset=0, *, fd=None)\n--\n\n"
	  "Read len(buffer) bytes of the file at file_offset into buffer.\n"
	  "async_op (also accepted as async=, as in DeepSpeed) returns at submit; wait()\n"
	  "then reports the op. Returns 1 when done (sync) or 0 when queued (async).\n"
	  "Reading past the end of the file raises NvioError(ENODATA).\n" RW_DOC_TAIL },
	{ "pwrite", (PyCFunction)(void (*)(void))h_pwrite, METH_VARARGS | METH_KEYWORDS,
	  "pwrite($self, buffer, filename, validate=False, async_op=False, file_offset=0, *, fd=None, fsync=False)\n--\n\n"
	  "Write buffer to the file at file_offset. The file is created if missing and\n"
	  "never truncated. fsync=True makes the data durable before completion.\n"
	  "Returns 1 when done (sync) or 0 when queued (async).\n" RW_DOC_TAIL },
	{ "sync_pread", (PyCFunction)(void (*)(void))h_sync_pread, METH_VARARGS | METH_KEYWORDS,
	  "sync_pread($self, buffer, filename, file_offset=0, *, fd=None, validate=False)\n--\n\n"
	  "Blocking pread; returns 1.\n" RW_DOC_TAIL },
	{ "sync_pwrite", (PyCFunction)(void (*)(void))h_sync_pwrite, METH_VARARGS | METH_KEYWORDS,
	  "sync_pwrite($self, buffer, filename, file_offset=0, *, fd=None, validate=False, fsync=False)\n--\n\n"
	  "Blocking pwrite; returns 1.\n" RW_DOC_TAIL },
	{ "async_pread", (PyCFunction)(void (*)(void))h_async_pread, METH_VARARGS | METH_KEYWORDS,
	  "async_pread($self, buffer, filename, file_offset=0, *, fd=None, validate=False)\n--\n\n"
	  "Queue a read and return 0; wait() reports it. The buffer is kept alive\n"
	  "until then; do not touch its contents before wait().\n" RW_DOC_TAIL },
	{ "async_pwrite", (PyCFunction)(void (*)(void))h_async_pwrite, METH_VARARGS | METH_KEYWORDS,
	  "async_pwrite($self, buffer, filename, file_offset=0, *, fd=None, validate=False, fsync=False)\n--\n\n"
	  "Queue a write and return 0; wait() reports it. The buffer is kept alive\n"
	  "until then; do not modify it before wait().\n" RW_DOC_TAIL },
	{ "read", (PyCFunction)(void (*)(void))h_read, METH_VARARGS | METH_KEYWORDS,
	  "read($self, buffer, filename, validate=False, file_offset=0, *, allow_short=False)\n--\n\n"
	  "Blocking read of the whole file (from file_offset) into buffer, which must\n"
	  "have the same size (DeepSpeed's contract; else NvioError naming both sizes:\n"
	  "ENODATA for a short file, EOVERFLOW for a long one). Returns 0.\n"
	  "allow_short=True: a shorter file is read into the start of buffer and the\n"
	  "byte count is returned.\n" },
	{ "write", (PyCFunction)(void (*)(void))h_write, METH_VARARGS | METH_KEYWORDS,
	  "write($self, buffer, filename, validate=False, file_offset=0, *, fsync=False)\n--\n\n"
	  "Blocking write of the whole buffer. With file_offset=0 the file is replaced\n"
	  "atomically (temporary file + rename); otherwise it is a pwrite. Returns 0.\n" },
	{ "wait", h_wait, METH_NOARGS,
	  "wait($self)\n--\n\n"
	  "Block until every queued op has ended. Returns the number of ops completed\n"
	  "since the previous wait (0 if none). If any failed, raises NvioError for\n"
	  "the first failure; every op has ended either way and its buffer is released.\n"
	  "Tagged ops (submit(), futures, *_async) are not waited for nor reported:\n"
	  "reap() or their futures report them.\n" },
	{ "uses_gds", h_uses_gds, METH_NOARGS,
	  "uses_gds($self)\n--\n\nTrue if CUDA tensors on this handle go through cuFile." },
	{ "pending", h_pending, METH_NOARGS,
	  "pending($self)\n--\n\nNumber of queued ops not yet reported by wait()." },
	{ "close", h_close, METH_NOARGS,
	  "close($self)\n--\n\nWait for ops in flight, then free the handle. Idempotent." },
	{ "open", (PyCFunction)(void (*)(void))h_open, METH_VARARGS | METH_KEYWORDS,
	  "open($self, path, flags=FILE_READ)\n--\n\n"
	  "Open path once for any number of ops: a File. flags: FILE_READ, FILE_WRITE,\n"
	  "FILE_CREATE, FILE_EXCL, FILE_TRUNC, FILE_ATOMIC, with it FILE_NOSYNC and\n"
	  "FILE_SPARE (nvio_file_open(3))." },
	{ "open_fd", (PyCFunction)(void (*)(void))h_open_fd, METH_VARARGS | METH_KEYWORDS,
	  "open_fd($self, fd, flags=FILE_READ)\n--\n\n"
	  "A File over an open descriptor, which nvio never closes or changes.\n"
	  "flags: FILE_READ and/or FILE_WRITE." },
	{ "submit", (PyCFunction)(void (*)(void))h_submit, METH_VARARGS | METH_KEYWORDS,
	  "submit($self, ops, /, pending=None)\n--\n\n"
	  "Submit tagged ops; each is a tuple (opcode, file, buf, offset[, user_data[, flags[, crc32]]]):\n"
	  "opcode EXT_IO_READ or EXT_IO_WRITE; buf one buffer, or a list/tuple of buffers laid\n"
	  "end to end from offset, or with offset OFFSET_PER_IOV (-1) a list of\n"
	  "(buffer, offset) pairs; user_data any object (reap() gives it back);\n"
	  "flags VALIDATE | FSYNC; crc32 None or a writable buffer of one uint32 per\n"
	  "buffer (array('I')), where the op stores the CRC-32 of each buffer's bytes\n"
	  "once it has completed. Every buffer and the file are kept alive until\n"
	  "reap() returns the op. Returns how many ops, from the first, were\n"
	  "accepted; a refused first op raises NvioError (resubmit the rest to see\n"
	  "a later refusal). Accepted ops complete exactly once; wait() never sees them.\n"
	  "pending: a set that gets the user_data of every accepted op (and never of a\n"
	  "refused one) before any of them can complete, with no Python code run in\n"
	  "between: an exception such as KeyboardInterrupt cannot leave it wrong." },
	{ "reap", (PyCFunction)(void (*)(void))h_reap, METH_VARARGS | METH_KEYWORDS,
	  "reap($self, max=64, min=0, timeout=None)\n--\n\n"
	  "Up to max ended tagged ops as a list of (user_data, result): result is the\n"
	  "bytes moved, or the NvioError the op failed with. Waits, without the GIL,\n"
	  "until min have ended (min is capped at the ops in flight) or timeout\n"
	  "seconds passed (None: no limit; 0: poll)." },
	{ "completion_fd", h_completion_fd, METH_NOARGS,
	  "completion_fd($self)\n--\n\n"
	  "An eventfd, owned by the handle, readable while completions wait to be\n"
	  "reaped (poll it, then reap(timeout=0))." },
	{ "queue", h_queue, METH_NOARGS,
	  "queue($self)\n--\n\n"
	  "A Queue of its own (nvio_queue_create) with submit/reap/completion_fd as\n"
	  "here: its ops complete on it only, never in this handle's reap(), and\n"
	  "this handle's never on it. One consumer per queue (the futures layer has\n"
	  "its own). Closed with the handle." },
	{ "__enter__", h_enter, METH_NOARGS, NULL },
	{ "__exit__", h_exit, METH_VARARGS, NULL },
	{ "get_block_size", h_get_block_size, METH_NOARGS, "get_block_size($self)\n--\n\n" },
	{ "get_queue_depth", h_get_queue_depth, METH_NOARGS, "get_queue_depth($self)\n--\n\n" },
	{ "get_single_submit", h_get_single_submit, METH_NOARGS, "get_single_submit($self)\n--\n\n" },
	{ "get_overlap_events", h_get_overlap_events, METH_NOARGS, "get_overlap_events($self)\n--\n\n" },
	{ "get_intra_op_parallelism", h_get_intra_op_parallelism, METH_NOARGS,
	  "get_intra_op_parallelism($self)\n--\n\n" },
	{ "get_alignment", h_get_alignment, METH_NOARGS,
	  "get_alignment($self)\n--\n\n512 * intra_op_parallelism, as in DeepSpeed "
	  "(nvio itself needs no alignment)." },
	{ "get_engine", h_get_engine, METH_NOARGS,
	  "get_engine($self)\n--\n\nThe engine in use: 'io_uring', 'libaio' or 'psync'." },
	{ "get_direct", h_get_direct, METH_NOARGS,
	  "get_direct($self)\n--\n\nThe direct I/O policy: 'auto', 'on' or 'off'." },
	{ "get_engine_note", h_get_engine_note, METH_NOARGS,
	  "get_engine_note($self)\n--\n\nWhy this engine and direct mode were chosen." },
	{ "get_config", h_get_config, METH_NOARGS,
	  "get_config($self)\n--\n\nThe configuration in force, as a dict." },
	{ "save_tuned", (PyCFunction)(void (*)(void))h_save_tuned, METH_VARARGS | METH_KEYWORDS,
	  "save_tuned($self, dir, for_write=False)\n--\n\n"
	  "Save this handle's configuration as the tuned entry for dir." },
	{ NULL, NULL, 0, NULL }
};

static PyGetSetDef handle_getset[] = {
	{ "closed", h_get_closed, NULL, "True once close() was called.", NULL },
	{ "inflight", h_get_inflight, NULL,
	  "Tagged ops accepted by submit() and not yet returned by reap() (the default\n"
	  "queue's: not a Queue's, not the blocking calls').", NULL },
	{ NULL, NULL, NULL, NULL, NULL }
};

static PyType_Slot handle_slots[] = {
	{ Py_tp_new, handle_new },
	{ Py_tp_dealloc, handle_dealloc },
	{ Py_tp_methods, handle_methods },
	{ Py_tp_getset, handle_getset },
	{ Py_tp_doc, "Handle(block_size=1048576, queue_depth=128, single_submit=False, "
		     "overlap_events=False, intra_op_parallelism=1, *, engine='auto', "
		     "direct='auto', staging_bytes=0)\n--\n\n"
		     "An nvio I/O handle (DeepNVMe aio_handle compatible)." },
	{ 0, NULL }
};

static PyType_Spec handle_spec = {
	"nvio._nvio.Handle", sizeof(ext_handle), 0,
	Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE, handle_slots
};

static PyObject *m_engine_available(PyObject *m, PyObject *arg)
{
	int e;
	if (ext_parse_engine(arg, &e) < 0)
		return NULL;
	char why[256] = "";
	int r = nvio_engine_available(e, why, sizeof(why));
	if (r < 0)
		return ext_raise_plain(ext_state_of(m), r, "nvio_engine_available");
	return Py_BuildValue("(Os)", r ? Py_True : Py_False, why);
}

static PyObject *m_load_tuned(PyObject *m, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "dir", "for_write", NULL };
	PyObject *dirb;
	int fw = 0;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "O&|p:load_tuned", kwlist,
					 PyUnicode_FSConverter, &dirb, &fw))
		return NULL;
	nvio_config_t c;
	nvio_config_init(&c);
	int r;
	const char *d = PyBytes_AsString(dirb);
	Py_BEGIN_ALLOW_THREADS
	r = nvio_config_load_tuned(&c, d, fw);
	Py_END_ALLOW_THREADS
	Py_DECREF(dirb);
	if (r < 0)
		return ext_raise_plain(ext_state_of(m), r, "nvio_config_load_tuned");
	if (r == 0)
		Py_RETURN_NONE;
	return config_dict(&c);
}

static PyObject *m_check_flag(PyObject *m, PyObject *args)
{
	PyObject *o;
	const char *what;
	int v;
	if (!PyArg_ParseTuple(args, "Os:check_flag", &o, &what) ||
	    ext_parse_flag(o, what, &v) < 0)
		return NULL;
	return PyBool_FromLong(v);
}

static PyMethodDef config_functions[] = {
	{ "check_flag", m_check_flag, METH_VARARGS,
	  "check_flag(value, name)\n--\n\nThe bool of a flag argument: True/False or 0/1;\n"
	  "TypeError naming `name` for anything else (\"False\" is not False)." },
	{ "engine_available", m_engine_available, METH_O,
	  "engine_available(engine)\n--\n\n(available, why) for 'io_uring', 'libaio' or 'psync'." },
	{ "load_tuned", (PyCFunction)(void (*)(void))m_load_tuned, METH_VARARGS | METH_KEYWORDS,
	  "load_tuned(dir, for_write=False)\n--\n\nThe tuned configuration saved for dir, or None." },
	{ NULL, NULL, 0, NULL }
};

int ext_handle_exec(PyObject *m, ext_state *st)
{
	st->handle_type = PyType_FromModuleAndSpec(m, &handle_spec, NULL);
	if (!st->handle_type || PyModule_AddObjectRef(m, "Handle", st->handle_type) < 0)
		return -1;
	return PyModule_AddFunctions(m, config_functions);
}
