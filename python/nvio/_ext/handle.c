/*
 * handle.c - the Handle type (DeepNVMe aio_handle compatible) and the
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
#include <sys/stat.h>
#include <unistd.h>

int ext_parse_flag(PyObject *o, const char *what, int *out)
{
	if (PyBool_Check(o)) {
		*out = o == Py_True;
		return 0;
	}
	if (PyLong_Check(o)) {
		int overflow = 0;
		long v = PyLong_AsLongAndOverflow(o, &overflow);
		if (v == -1 && PyErr_Occurred())
			return -1;
		if (!overflow && (v == 0 || v == 1)) {
			*out = (int)v;
			return 0;
		}
	}
	/* A truthy "False" or "no" must not silently mean True. */
	PyObject *tn = PyType_GetName(Py_TYPE(o));
	if (!tn)
		return -1;
	PyErr_Format(PyExc_TypeError, "nvio: %s must be True or False (or 0/1), not %S %R",
		     what, tn, o);
	Py_DECREF(tn);
	return -1;
}

int ext_flag_converter(PyObject *o, void *arg)
{
	ext_flag_arg *a = arg;
	return ext_parse_flag(o, a->name, &a->v) == 0;
}

int ext_handle_check_open(ext_handle *self)
{
	if (!self->h) {
		PyErr_SetString(PyExc_ValueError, "nvio: I/O operation on a closed handle");
		return -1;
	}
	return 0;
}

/*
 * Closes the handle's open files (their ops end first), destroys the C
 * handle (waiting for the rest of the ops in flight), then drops holds
 * and the borrows of tagged ops never reaped. While it waits, without
 * the GIL, the handle counts as busy: another thread's close() is
 * refused instead of dropping the holds of ops that are still running.
 */
static void handle_shutdown(ext_handle *self)
{
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
	ext_tags_release_all(self);
}

/* A name through one of libnvio's parsers; `what` names it in errors. */
static int parse_name(PyObject *o, int (*from_name)(const char *),
		      const char *what, int *out)
{
	Py_ssize_t len;
	const char *name = PyUnicode_AsUTF8AndSize(o, &len);
	char fmt[96];
	int v;

	if (!name)
		return -1;
	v = (size_t)len == strlen(name) ? from_name(name) : -EINVAL;	/* "psync\0x" */
	if (v < 0) {
		snprintf(fmt, sizeof(fmt), "nvio: unknown %s", what);
		PyErr_Format(PyExc_ValueError, fmt, name);
		return -1;
	}
	*out = v;
	return 0;
}

int ext_parse_engine(PyObject *o, int *out)
{
	if (!o || o == Py_None) {
		*out = NVIO_ENGINE_AUTO;
		return 0;
	}
	if (PyLong_Check(o) && !PyBool_Check(o)) {
		long v = PyLong_AsLong(o);
		if (v == -1 && PyErr_Occurred())
			return -1;
		if (v < 0 || v >= NVIO_ENGINE_COUNT_) {
			PyErr_Format(PyExc_ValueError, "nvio: unknown engine %ld", v);
			return -1;
		}
		*out = (int)v;
		return 0;
	}
	if (PyUnicode_Check(o))
		return parse_name(o, nvio_engine_from_name,
				  "engine '%s' (auto, io_uring, libaio, psync)", out);
	PyErr_SetString(PyExc_TypeError, "nvio: engine must be a name such as 'io_uring'");
	return -1;
}

int ext_parse_direct(PyObject *o, int *out)
{
	if (!o || o == Py_None) {
		*out = NVIO_DIRECT_AUTO;
		return 0;
	}
	if (PyBool_Check(o)) {
		*out = o == Py_True ? NVIO_DIRECT_ON : NVIO_DIRECT_OFF;
		return 0;
	}
	if (PyUnicode_Check(o))
		return parse_name(o, nvio_direct_from_name,
				  "direct mode '%s' (auto, on, off)", out);
	PyErr_SetString(PyExc_TypeError, "nvio: direct must be True, False, None or 'auto'/'on'/'off'");
	return -1;
}

static PyObject *handle_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "block_size", "queue_depth", "single_submit",
		"overlap_events", "intra_op_parallelism", "engine", "direct",
		"staging_bytes", "gds", NULL };
	long long block = NVIO_DEFAULT_BLOCK_SIZE, staging = 0;
	long long depth = NVIO_DEFAULT_QUEUE_DEPTH, par = 1;
	ext_flag_arg single = { "single_submit", 0 }, overlap = { "overlap_events", 0 };
	ext_flag_arg gds = { "gds", 0 };
	PyObject *engine = NULL, *direct = NULL;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "|LLO&O&L$OOLO&:AioHandle", kwlist,
					 &block, &depth, ext_flag_converter, &single,
					 ext_flag_converter, &overlap, &par,
					 &engine, &direct, &staging, ext_flag_converter, &gds))
		return NULL;
	/* Each limit named with its value: a bare "invalid" says nothing. */
	if (block <= 0) {
		PyErr_Format(PyExc_ValueError, "nvio: block_size must be > 0, not %lld", block);
		return NULL;
	}
	if (depth <= 0 || depth > NVIO_MAX_QUEUE_DEPTH) {
		PyErr_Format(PyExc_ValueError, "nvio: queue_depth must be 1..%u "
			     "(NVIO_MAX_QUEUE_DEPTH), not %lld", NVIO_MAX_QUEUE_DEPTH, depth);
		return NULL;
	}
	if (par <= 0 || par > NVIO_MAX_PARALLELISM) {
		PyErr_Format(PyExc_ValueError, "nvio: intra_op_parallelism must be 1..%u "
			     "(NVIO_MAX_PARALLELISM), not %lld", NVIO_MAX_PARALLELISM, par);
		return NULL;
	}
	if (staging < 0) {
		PyErr_Format(PyExc_ValueError, "nvio: staging_bytes must be >= 0, not %lld",
			     staging);
		return NULL;
	}
	nvio_config_t cfg;
	nvio_config_init(&cfg);
	cfg.block_size = (uint64_t)block;
	cfg.queue_depth = (uint32_t)depth;
	cfg.intra_op_parallelism = (uint32_t)par;
	cfg.single_submit = (uint32_t)single.v;
	cfg.overlap_events = (uint32_t)overlap.v;
	if (staging)
		cfg.staging_bytes = (uint64_t)staging;
	if (gds.v)
		cfg.flags |= NVIO_HANDLE_GDS;
	if (ext_parse_engine(engine, &cfg.engine) < 0 || ext_parse_direct(direct, &cfg.direct) < 0)
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

/*
 * Resolves the file target: a path (str, bytes, os.PathLike) or an open
 * descriptor (int, or the fd= keyword). *pathb gets the encoded path
 * (new reference) or NULL with *fd set.
 */
int ext_parse_target(PyObject *filename, PyObject *fdobj, PyObject **pathb,
		     int *fd, PyObject **shown)
{
	*pathb = NULL;
	*fd = -1;
	*shown = NULL;
	if (filename == Py_None)
		filename = NULL;
	if (fdobj == Py_None)
		fdobj = NULL;
	if (filename && fdobj) {
		PyErr_SetString(PyExc_TypeError, "nvio: give a filename or fd=, not both");
		return -1;
	}
	if (!filename && !fdobj) {
		PyErr_SetString(PyExc_TypeError, "nvio: a filename (or fd=) is required");
		return -1;
	}
	PyObject *t = filename ? filename : fdobj;
	if (PyLong_Check(t)) {
		if (PyBool_Check(t)) {
			PyErr_SetString(PyExc_TypeError, "nvio: a file descriptor must be an int, not bool");
			return -1;
		}
		int overflow = 0;
		long v = PyLong_AsLongAndOverflow(t, &overflow);
		if (v == -1 && PyErr_Occurred())
			return -1;
		if (overflow || v < INT32_MIN || v > INT32_MAX) {
			PyErr_SetString(PyExc_OverflowError, "nvio: file descriptor out of range");
			return -1;
		}
		*fd = (int)v;
		return 0;
	}
	if (fdobj) {
		PyErr_SetString(PyExc_TypeError, "nvio: fd must be an int");
		return -1;
	}
	if (!PyUnicode_Check(t) && !PyBytes_Check(t) &&
	    !PyObject_HasAttrString(t, "__fspath__")) {
		PyObject *tn = PyType_GetName(Py_TYPE(t));
		PyErr_Format(PyExc_TypeError,
			     "nvio: filename must be str, bytes, os.PathLike or an int fd, not %S",
			     tn ? tn : Py_None);
		Py_XDECREF(tn);
		return -1;
	}
	if (!PyUnicode_FSConverter(t, pathb))
		return -1;
	*shown = t;
	return 0;
}
enum { OP_READ, OP_WRITE, OP_READ_FILE, OP_WRITE_FILE };

/*
 * Opens the file of a blocking call: by path (a write creates it, noting
 * so in *created) or over the caller's fd. NULL with an exception set.
 */
static nvio_file_t *open_for(ext_handle *self, int kind, const char *path, int fd,
			     PyObject *shown, int *created)
{
	ext_state *st = ext_handle_state(self);
	nvio_handle_t *h = self->h;
	int is_write = kind == OP_WRITE || kind == OP_WRITE_FILE;
	unsigned fl = kind == OP_WRITE_FILE ? NVIO_FILE_ATOMIC
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
		for (int tries = 0; !f && err == -ENOENT && kind == OP_WRITE && tries < 3; tries++) {
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

/*
 * One I/O call. Returns 0 on success (with the op accepted or done),
 * or -1 with an exception set. *moved gets the bytes moved by a
 * blocking call.
 */
static int do_io(ext_handle *self, int kind, PyObject *bufobj, PyObject *filename,
		 PyObject *fdobj, long long offset, unsigned flags, int allow_short,
		 uint64_t *moved)
{
	static const char *names[] = { "pread", "pwrite", "read", "write" };
	int is_write = kind == OP_WRITE || kind == OP_WRITE_FILE;
	ext_state *st = ext_handle_state(self);
	if (ext_handle_check_open(self) < 0)
		return -1;
	if (offset < 0) {
		PyErr_Format(PyExc_ValueError, "nvio: file_offset must be >= 0, not %lld", offset);
		return -1;
	}
	PyObject *pathb, *shown;
	int fd;
	if (ext_parse_target(filename, fdobj, &pathb, &fd, &shown) < 0)
		return -1;
	if ((kind == OP_READ_FILE || kind == OP_WRITE_FILE) && !pathb) {
		PyErr_SetString(PyExc_TypeError, "nvio: read()/write() need a filename, not an fd");
		return -1;
	}
	if (kind == OP_WRITE_FILE && offset != 0)
		kind = OP_WRITE;	/* at an offset, write() is a pwrite */
	ext_hold *x = ext_hold_new();
	if (!x) {
		Py_XDECREF(pathb);
		return -1;
	}
	x->path = pathb;
	int async = (flags & NVIO_ASYNC) != 0;
	/* a torch tensor (its own keeper): for async ops, its storage too */
	if (ext_buf_get(st, bufobj, !is_write, &x->buf) < 0 ||
	    (async && x->buf.keep == bufobj && ext_buf_keep_storage(&x->buf, bufobj) < 0)) {
		ext_hold_free(x);
		return -1;
	}
	int torch = x->buf.keep == bufobj;
	/* converting the arguments ran Python code: another thread may
	 * have closed the handle meanwhile */
	if (ext_handle_check_open(self) < 0) {
		ext_hold_free(x);
		return -1;
	}
	const char *path = pathb ? PyBytes_AsString(pathb) : NULL;
	nvio_handle_t *h = self->h;
	void *ptr = x->buf.ptr;
	uint64_t n = x->buf.nbytes;
	int rc = 0;

	if (async) {
		self->busy++;
		Py_BEGIN_ALLOW_THREADS
		if (kind == OP_READ)
			rc = path ? nvio_pread(h, ptr, n, path, offset, flags)
				  : nvio_pread_fd(h, ptr, n, fd, offset, flags);
		else
			rc = path ? nvio_pwrite(h, ptr, n, path, offset, flags)
				  : nvio_pwrite_fd(h, ptr, n, fd, offset, flags);
		Py_END_ALLOW_THREADS
		self->busy--;
		if (rc < 0) {
			ext_raise_io(st, h, rc, shown, fd, offset, n, names[kind], is_write);
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

	/* Blocking: the transfer runs as tagged ops reaped in slices, so
	 * that Ctrl-C is seen while it runs (ext_run_sync). */
	int created = 0;
	nvio_file_t *f = open_for(self, kind, path, fd, shown, &created);
	if (!f) {
		ext_hold_free(x);
		return -1;
	}
	nvio_error_t *rec = PyMem_Malloc(sizeof(*rec));
	if (!rec) {
		close_private(self, f, path, created, 1);
		ext_hold_free(x);
		PyErr_NoMemory();
		return -1;
	}
	uint64_t count = n;
	int own = 0;	/* a size mismatch found here, not by libnvio */
	if (kind == OP_READ_FILE) {
		nvio_file_info_t fi;
		memset(&fi, 0, sizeof(fi));
		fi.struct_size = sizeof(fi);
		rc = nvio_file_info(f, &fi);
		uint64_t left = rc == 0 && fi.size > (uint64_t)offset
			? fi.size - (uint64_t)offset : 0;
		PyObject *msg = NULL;
		if (rc == 0 && left > n)
			msg = PyUnicode_FromFormat(
				"nvio: read(): %s has %llu bytes from offset %lld but the "
				"buffer holds only %llu bytes", path, (unsigned long long)left,
				offset, (unsigned long long)n);
		else if (rc == 0 && left < n && !allow_short)
			/* DeepSpeed's contract: buffer and file have one size.
			 * A short file (a truncated checkpoint) must not load
			 * silently with a stale tail. */
			msg = PyUnicode_FromFormat(
				"nvio: read(): %s has %llu bytes from offset %lld but the "
				"buffer holds %llu bytes; sizes must match (allow_short=True "
				"reads the %llu bytes there are and returns that count)",
				path, (unsigned long long)left, offset, (unsigned long long)n,
				(unsigned long long)left);
		if (msg || PyErr_Occurred()) {
			own = 1;
			PyObject *e = msg ? PyObject_CallFunction(st->error, "iOO",
				left > n ? EOVERFLOW : ENODATA, msg, shown) : NULL;
			Py_XDECREF(msg);
			if (e) {
				PyErr_SetObject(st->error, e);
				Py_DECREF(e);
			}
		}
		count = left;
	}
	int r = 0;
	if (!own) {
		if (rc == 0) {
			r = ext_run_sync(self, f, path, is_write, ptr, count, offset, flags,
					 NULL, 0, rec);
		} else {
			r = rc;
			memset(rec, 0, sizeof(*rec));
			rec->struct_size = sizeof(*rec);
			rec->err = rc;
		}
	}
	if (r == 0 && !own && kind == OP_WRITE_FILE) {
		/* in place only now that every byte is written */
		self->busy++;
		Py_BEGIN_ALLOW_THREADS
		r = nvio_file_commit(f);
		Py_END_ALLOW_THREADS
		self->busy--;
		if (r < 0) {
			memset(rec, 0, sizeof(*rec));
			rec->struct_size = sizeof(*rec);
			if (nvio_last_error(h, rec) != r) {
				memset(rec, 0, sizeof(*rec));
				rec->struct_size = sizeof(*rec);
				rec->err = r;
			}
		}
	}
	close_private(self, f, path, created, own || r != 0);
	if (torch && !is_write && !own && r == 0 && ext_torch_bump_version(st, bufobj) < 0)
		r = EXT_RAISED;
	if (!own && r < 0) {
		if (rec->what[0] || rec->path[0])
			ext_raise_record(st, rec, shown);
		else
			ext_raise_io(st, NULL, r, shown, fd, offset, n, names[kind], is_write);
	}
	PyMem_Free(rec);
	ext_hold_free(x);
	if (own || r != 0)
		return -1;
	*moved = count;
	return 0;
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
		kind == OP_READ ? "O|OO&OL$OOO&:pread" : "O|OO&OL$OOO&:pwrite", kwlist,
		&buf, &fn, ext_flag_converter, &validate, &a1, &off, &a2, &fdobj,
		ext_flag_converter, &fs))
		return NULL;
	if (resolve_async(a1, a2, &as) < 0 ||
	    op_flags(kind == OP_READ, validate.v, as, fs.v, &flags) < 0)
		return NULL;
	if (do_io(self, kind, buf, fn, fdobj, off, flags, 0, &moved) < 0)
		return NULL;
	return PyLong_FromLong(as ? 0 : 1);
}

static PyObject *h_pread(PyObject *s, PyObject *a, PyObject *k)
{
	return rw_generic((ext_handle *)s, a, k, OP_READ);
}

static PyObject *h_pwrite(PyObject *s, PyObject *a, PyObject *k)
{
	return rw_generic((ext_handle *)s, a, k, OP_WRITE);
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
	if (!PyArg_ParseTupleAndKeywords(args, kw, fmts[kind == OP_WRITE][as != 0], kwlist,
					 &buf, &fn, &off, &fdobj, ext_flag_converter, &validate,
					 ext_flag_converter, &fs))
		return NULL;
	if (op_flags(kind == OP_READ, validate.v, as, fs.v, &flags) < 0)
		return NULL;
	if (do_io(self, kind, buf, fn, fdobj, off, flags, 0, &moved) < 0)
		return NULL;
	return PyLong_FromLong(as ? 0 : 1);
}

static PyObject *h_sync_pread(PyObject *s, PyObject *a, PyObject *k)
{
	return rw_fixed((ext_handle *)s, a, k, OP_READ, 0);
}

static PyObject *h_sync_pwrite(PyObject *s, PyObject *a, PyObject *k)
{
	return rw_fixed((ext_handle *)s, a, k, OP_WRITE, 0);
}

static PyObject *h_async_pread(PyObject *s, PyObject *a, PyObject *k)
{
	return rw_fixed((ext_handle *)s, a, k, OP_READ, 1);
}

static PyObject *h_async_pwrite(PyObject *s, PyObject *a, PyObject *k)
{
	return rw_fixed((ext_handle *)s, a, k, OP_WRITE, 1);
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
	if (!PyArg_ParseTupleAndKeywords(args, kw, kind == OP_READ_FILE ? "OO|O&L$O&O&:read" :
					 "OO|O&L$O&O&:write", kwlist, &buf, &fn,
					 ext_flag_converter, &validate, &off,
					 ext_flag_converter, &fs, ext_flag_converter, &short_ok))
		return NULL;
	if (short_ok.v && kind != OP_READ_FILE) {
		PyErr_SetString(PyExc_TypeError, "nvio: allow_short applies to read() only");
		return NULL;
	}
	if (op_flags(kind == OP_READ_FILE, validate.v, 0, fs.v, &flags) < 0)
		return NULL;
	if (do_io(self, kind, buf, fn, NULL, off, flags, short_ok.v, &moved) < 0)
		return NULL;
	/* DeepSpeed returns 0; the opt-in short read says how much it read */
	return PyLong_FromUnsignedLongLong(short_ok.v ? moved : 0);
}

static PyObject *h_read(PyObject *s, PyObject *a, PyObject *k)
{
	return file_rw((ext_handle *)s, a, k, OP_READ_FILE);
}

static PyObject *h_write(PyObject *s, PyObject *a, PyObject *k)
{
	return file_rw((ext_handle *)s, a, k, OP_WRITE_FILE);
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
	{ "open", (PyCFunction)(void (*)(void))ext_h_open, METH_VARARGS | METH_KEYWORDS,
	  "open($self, path, flags=FILE_READ)\n--\n\n"
	  "Open path once for any number of ops: a File. flags: FILE_READ, FILE_WRITE,\n"
	  "FILE_CREATE, FILE_EXCL, FILE_TRUNC, FILE_ATOMIC, with it FILE_NOSYNC and\n"
	  "FILE_SPARE (nvio_file_open(3))." },
	{ "open_fd", (PyCFunction)(void (*)(void))ext_h_open_fd, METH_VARARGS | METH_KEYWORDS,
	  "open_fd($self, fd, flags=FILE_READ)\n--\n\n"
	  "A File over an open descriptor, which nvio never closes or changes.\n"
	  "flags: FILE_READ and/or FILE_WRITE." },
	{ "submit", (PyCFunction)(void (*)(void))ext_h_submit, METH_VARARGS | METH_KEYWORDS,
	  "submit($self, ops, /, pending=None)\n--\n\n"
	  "Submit tagged ops; each is a tuple (opcode, file, buf, offset[, user_data[, flags]]):\n"
	  "opcode OP_READ or OP_WRITE; buf one buffer, or a list/tuple of buffers laid\n"
	  "end to end from offset, or with offset OFFSET_PER_IOV (-1) a list of\n"
	  "(buffer, offset) pairs; user_data any object (reap() gives it back);\n"
	  "flags VALIDATE | FSYNC. Every buffer and the file are kept alive until\n"
	  "reap() returns the op. Returns how many ops, from the first, were\n"
	  "accepted; a refused first op raises NvioError (resubmit the rest to see\n"
	  "a later refusal). Accepted ops complete exactly once; wait() never sees them.\n"
	  "pending: a set that gets the user_data of every accepted op (and never of a\n"
	  "refused one) before any of them can complete, with no Python code run in\n"
	  "between: an exception such as KeyboardInterrupt cannot leave it wrong." },
	{ "reap", (PyCFunction)(void (*)(void))ext_h_reap, METH_VARARGS | METH_KEYWORDS,
	  "reap($self, max=64, min=0, timeout=None)\n--\n\n"
	  "Up to max ended tagged ops as a list of (user_data, result): result is the\n"
	  "bytes moved, or the NvioError the op failed with. Waits, without the GIL,\n"
	  "until min have ended (min is capped at the ops in flight) or timeout\n"
	  "seconds passed (None: no limit; 0: poll)." },
	{ "completion_fd", ext_h_completion_fd, METH_NOARGS,
	  "completion_fd($self)\n--\n\n"
	  "An eventfd, owned by the handle, readable while completions wait to be\n"
	  "reaped (poll it, then reap(timeout=0))." },
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
	{ "inflight", ext_h_get_inflight, NULL,
	  "Tagged ops accepted by submit() and not yet returned by reap().", NULL },
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
