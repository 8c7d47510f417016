/*
 * file.c - the File type: open files (nvio_file_open, and nvio_file_join
 * for shared.c's _nvio.file_join: ext_file_join), their blocking
 * calls (pread/pwrite/preadv/pwritev through the blocking runner), their
 * size, allocation, sync, commit and close, and File.stream().
 *
 * Contracts:
 *   - A File lives in its handle: it holds a reference to the Handle, and
 *     the handle keeps a list of its open files, which Handle.close()
 *     closes before the C handle is destroyed (libnvio frees a file's
 *     state with its handle). Likewise a Stream holds its File, and a
 *     file's close() first closes its open streams.
 *   - While a call runs without the GIL it counts in `busy` of the file
 *     and its handle; close() of either is refused meanwhile.
 *   - Blocking calls return the bytes moved; failures raise NvioError
 *     with the record libnvio kept (path, offset, op).
 */
#include "ext.h"

#include <errno.h>
#include <string.h>

#define BUSY_ENTER(hd, fl) do { (hd)->busy++; (fl)->busy++; } while (0)
#define BUSY_LEAVE(hd, fl) do { (hd)->busy--; (fl)->busy--; } while (0)

/* The object errors name: the path given, or NULL (then fd is set). */
static PyObject *file_target(ext_file *f)
{
	return f->name;
}

/*
 * Closes the C file: its streams first (without commit), then the file,
 * which waits for its ops. Returns close(2)'s error or 0; the file is
 * closed either way. The caller checked busy.
 */
static int file_close_now(ext_file *self)
{
	int rc = 0;
	ext_streams_close_all(self);
	nvio_file_t *f = self->f;
	if (!f)
		return 0;
	self->f = NULL;
	if (self->pprev) {
		*self->pprev = self->next;
		if (self->next)
			self->next->pprev = self->pprev;
		self->next = NULL;
		self->pprev = NULL;
	}
	ext_handle *hd = self->handle;
	hd->busy++;
	Py_BEGIN_ALLOW_THREADS
	rc = nvio_file_close(f);
	Py_END_ALLOW_THREADS
	hd->busy--;
	return rc;
}

void ext_files_close_all(ext_handle *self)
{
	while (self->files)
		(void)file_close_now(self->files);
}

/* The class of a new File: the handle's _file_class (the nvio package's
 * subclass) or File. New reference, or NULL with an exception set. */
static PyObject *file_class(ext_state *st, ext_handle *hd)
{
	PyObject *cls = PyObject_GetAttrString((PyObject *)hd, "_file_class");
	if (!cls) {
		if (!PyErr_ExceptionMatches(PyExc_AttributeError))
			return NULL;
		PyErr_Clear();
		cls = Py_NewRef(st->file_type);
	}
	int ok = PyType_Check(cls) ? PyObject_IsSubclass(cls, st->file_type) : 0;
	if (ok <= 0) {
		if (ok == 0)
			PyErr_SetString(PyExc_TypeError,
					"nvio: _file_class must be a subclass of nvio._nvio.File");
		Py_DECREF(cls);
		return NULL;
	}
	return cls;
}

/*
 * Whether flags break nvio_file_open(3)'s rules by themselves (its
 * check_flags, in the same order): then its -EINVAL is about the flags,
 * a ValueError. Any other -EINVAL is about the file at the path (an
 * ATOMIC write refuses a FIFO or a device; a SHARED open, a FIFO or a
 * name that is not an nvio temporary's).
 */
static int open_flags_invalid(unsigned flags)
{
	const unsigned rw = NVIO_FILE_READ | NVIO_FILE_WRITE;
	if (flags & ~(rw | NVIO_FILE_CREATE | NVIO_FILE_EXCL | NVIO_FILE_TRUNC |
		      NVIO_FILE_ATOMIC | NVIO_FILE_NOSYNC | NVIO_FILE_SPARE | NVIO_FILE_SHARED))
		return 1;
	if (!(flags & (rw | NVIO_FILE_ATOMIC)))
		return 1;
	if ((flags & NVIO_FILE_ATOMIC) && (flags & (NVIO_FILE_EXCL | NVIO_FILE_TRUNC)))
		return 1;
	if ((flags & NVIO_FILE_SHARED) && !(flags & NVIO_FILE_ATOMIC))	/* a join */
		return (flags & ~(rw | NVIO_FILE_SHARED)) || !(flags & NVIO_FILE_WRITE);
	if ((flags & (NVIO_FILE_NOSYNC | NVIO_FILE_SPARE)) && !(flags & NVIO_FILE_ATOMIC))
		return 1;
	return (flags & NVIO_FILE_EXCL) && !(flags & NVIO_FILE_CREATE);
}

/* nvio_file_join(3)'s flags: WRITE, and READ if wanted. */
static int join_flags_invalid(unsigned flags)
{
	return !(flags & NVIO_FILE_WRITE) || (flags & ~(NVIO_FILE_READ | NVIO_FILE_WRITE));
}

/*
 * Raises a failed open or join. Flags that break the call's rules are a
 * ValueError (open_fd's -EINVAL is always about its flags and fd's access
 * mode); every other refusal is an NvioError naming the path, the errno
 * and libnvio's reason (ELOOP: a link not followed; EINVAL: a FIFO, a
 * device, a name not of an nvio temporary; EPERM: another user's file or
 * one of other names; ESTALE: not the creator's temporary).
 */
static PyObject *open_failed(ext_state *st, nvio_handle_t *h, int err, PyObject *pathobj,
			     int fd, unsigned flags, int join)
{
	const char *call = join ? "file_join" : pathobj ? "open" : "open_fd";
	if (err == -EINVAL && (join ? join_flags_invalid(flags)
			       : !pathobj || open_flags_invalid(flags))) {
		PyErr_Format(PyExc_ValueError, "nvio: invalid file flags 0x%x for %s: %s",
			     flags, call, nvio_strerror(err));
		return NULL;
	}
	return ext_raise_io(st, h, err ? err : -EIO, pathobj, fd, 0, 0, join ? "join" : "open",
			    join || (flags & (NVIO_FILE_WRITE | NVIO_FILE_ATOMIC |
					      NVIO_FILE_SHARED)) != 0);
}

/* A File object of class cls over the open C file f, linked into its
 * handle; NULL with an exception set (f is closed then). */
static PyObject *file_wrap(ext_handle *hd, PyObject *cls, nvio_file_t *f,
			   PyObject *pathobj, int fd, unsigned flags)
{
	allocfunc alloc = (allocfunc)PyType_GetSlot((PyTypeObject *)cls, Py_tp_alloc);
	ext_file *self = (ext_file *)alloc((PyTypeObject *)cls, 0);
	if (!self) {
		Py_BEGIN_ALLOW_THREADS
		nvio_file_close(f);
		Py_END_ALLOW_THREADS
		return NULL;
	}
	self->f = f;
	self->handle = (ext_handle *)Py_NewRef((PyObject *)hd);
	self->name = pathobj ? Py_NewRef(pathobj) : NULL;
	self->flags = flags;
	self->user_fd = pathobj ? -1 : fd;
	self->next = hd->files;
	if (hd->files)
		hd->files->pprev = &self->next;
	hd->files = self;
	self->pprev = &hd->files;
	self->pathb = PyBytes_FromString(nvio_file_path(f));
	if (!self->pathb) {
		Py_DECREF(self);	/* closes f */
		return NULL;
	}
	return (PyObject *)self;
}

/* ext_file_open, or with share (and a path) ext_file_join. */
static PyObject *file_make(ext_handle *hd, PyObject *pathobj, int fd, unsigned flags,
			   const nvio_share_t *share)
{
	ext_state *st = ext_handle_state(hd);
	PyObject *pathb = NULL, *cls = NULL, *res = NULL;

	if (ext_handle_check_open(hd) < 0 ||
	    (pathobj && !PyUnicode_FSConverter(pathobj, &pathb)) ||
	    !(cls = file_class(st, hd)) ||
	    ext_handle_check_open(hd) < 0)	/* Python code ran */
		goto out;
	nvio_handle_t *h = hd->h;
	const char *path = pathb ? PyBytes_AsString(pathb) : NULL;
	nvio_file_t *f;
	int err = 0;
	hd->busy++;
	Py_BEGIN_ALLOW_THREADS
	f = share ? nvio_file_join(h, path, share, flags, &err)
		: path ? nvio_file_open(h, path, flags, &err)
		: nvio_file_from_fd(h, fd, flags, &err);
	Py_END_ALLOW_THREADS
	hd->busy--;
	res = f ? file_wrap(hd, cls, f, pathobj, fd, flags)
		: open_failed(st, h, err, pathobj, fd, flags, share != NULL);
out:
	Py_XDECREF(cls);
	Py_XDECREF(pathb);
	return res;
}

PyObject *ext_file_open(ext_handle *hd, PyObject *pathobj, int fd, unsigned flags)
{
	return file_make(hd, pathobj, fd, flags, NULL);
}

PyObject *ext_file_join(ext_handle *hd, PyObject *pathobj, const nvio_share_t *share,
			unsigned flags)
{
	return file_make(hd, pathobj, -1, flags, share);
}

static void file_dealloc(PyObject *o)
{
	ext_file *self = (ext_file *)o;
	PyTypeObject *tp = Py_TYPE(o);
	if (self->f && self->handle->h)
		(void)file_close_now(self);	/* an ATOMIC file is abandoned */
	Py_CLEAR(self->name);
	Py_CLEAR(self->pathb);
	Py_CLEAR(self->handle);
	freefunc fr = (freefunc)PyType_GetSlot(tp, Py_tp_free);
	fr(o);
	Py_DECREF(tp);
}

/* One sync range op. */
static PyObject *file_rw(ext_file *self, PyObject *bufobj, long long off, unsigned flags,
			 int is_write)
{
	if (ext_file_check_open(self) < 0)
		return NULL;
	ext_state *st = ext_file_state(self);
	ext_buf b;
	if (ext_borrow(st, bufobj, !is_write, 0, &b) < 0)
		return NULL;
	if (ext_file_check_open(self) < 0) {
		ext_buf_release(&b);
		return NULL;
	}
	if (off < 0) {
		ext_buf_release(&b);
		PyErr_Format(PyExc_ValueError, "nvio: offset must be >= 0, not %lld", off);
		return NULL;
	}
	ext_handle *hd = self->handle;
	nvio_error_t *rec = PyMem_Malloc(sizeof(*rec));
	if (!rec) {
		ext_buf_release(&b);
		return PyErr_NoMemory();
	}
	int rc;
	self->busy++;	/* the handle's busy is counted by ext_run_sync */
	rc = ext_run_sync(hd, self->f, PyBytes_AsString(self->pathb), is_write, b.ptr,
			  b.nbytes, off, flags, NULL, 0, rec);
	self->busy--;
	if (!is_write && rc == 0 && b.keep == bufobj && ext_torch_bump_version(st, bufobj) < 0)
		rc = EXT_RAISED;
	uint64_t n = b.nbytes;
	ext_buf_release(&b);
	PyObject *res = NULL;
	if (rc < 0)
		ext_raise_record(st, rec, file_target(self));
	else if (rc == 0)
		res = PyLong_FromUnsignedLongLong(n);
	PyMem_Free(rec);
	return res;
}

/*
 * pread/pwrite(buf, offset, flags=0). The common call, two positional
 * arguments with an int offset, is taken from the vector as it comes
 * (METH_FASTCALL): packing and parsing a tuple cost more than a 4 KiB
 * read from the page cache. Anything else goes through the parser, with
 * its checks and messages.
 */
static PyObject *file_rw_args(PyObject *s, PyObject *const *args, Py_ssize_t nargs,
			      PyObject *kwnames, int is_write)
{
	static char *kwlist[] = { "buf", "offset", "flags", NULL };
	PyObject *bufobj;
	long long off;
	unsigned flags = 0;
	PyObject *fl = NULL;

	if (nargs == 2 && !kwnames && PyLong_Check(args[1])) {
		off = PyLong_AsLongLong(args[1]);
		if (off == -1 && PyErr_Occurred())
			return NULL;
		return file_rw((ext_file *)s, args[0], off, 0, is_write);
	}
	Py_ssize_t nkw = kwnames ? PyTuple_Size(kwnames) : 0;
	PyObject *a = PyTuple_New(nargs), *kw = nkw ? PyDict_New() : NULL;
	if (!a || (nkw && !kw))
		goto fail;
	for (Py_ssize_t i = 0; i < nargs; i++)
		PyTuple_SetItem(a, i, Py_NewRef(args[i]));
	for (Py_ssize_t i = 0; i < nkw; i++)
		if (PyDict_SetItem(kw, PyTuple_GetItem(kwnames, i), args[nargs + i]) < 0)
			goto fail;
	int ok = PyArg_ParseTupleAndKeywords(a, kw, is_write ? "OL|O:pwrite" : "OL|O:pread",
					     kwlist, &bufobj, &off, &fl);
	PyObject *res = NULL;
	if (ok && (!fl || ext_parse_flags(fl, &flags) == 0))
		res = file_rw((ext_file *)s, bufobj, off, flags, is_write);
	Py_DECREF(a);
	Py_XDECREF(kw);
	return res;
fail:
	Py_XDECREF(a);
	Py_XDECREF(kw);
	return NULL;
}

static PyObject *f_pread(PyObject *s, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
	return file_rw_args(s, args, nargs, kwnames, 0);
}

static PyObject *f_pwrite(PyObject *s, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
	return file_rw_args(s, args, nargs, kwnames, 1);
}

/* One sync vector op. */
static PyObject *file_rwv(ext_file *self, PyObject *args, PyObject *kw, int is_write)
{
	static char *kwlist[] = { "bufs", "offset", "flags", NULL };
	PyObject *seq, *fl = NULL;
	long long off;
	unsigned flags = 0;

	if (!PyArg_ParseTupleAndKeywords(args, kw, is_write ? "OL|O:pwritev" : "OL|O:preadv",
					 kwlist, &seq, &off, &fl))
		return NULL;
	if (fl && ext_parse_flags(fl, &flags) < 0)
		return NULL;
	if (off < 0 && off != NVIO_OFFSET_PER_IOV) {
		PyErr_Format(PyExc_ValueError,
			     "nvio: offset must be >= 0 or OFFSET_PER_IOV (-1), not %lld", off);
		return NULL;
	}
	if (ext_file_check_open(self) < 0)
		return NULL;
	ext_state *st = ext_file_state(self);
	ext_buf *bufs;
	nvio_iovec_t *iov;
	uint32_t n;
	uint64_t total;
	if (ext_borrow_vector(st, seq, off == NVIO_OFFSET_PER_IOV, !is_write, 0, &bufs, &iov,
			  &n, &total) < 0)
		return NULL;
	PyObject *res = NULL;
	if (ext_file_check_open(self) == 0) {
		ext_handle *hd = self->handle;
		nvio_error_t *rec = PyMem_Malloc(sizeof(*rec));
		int rc = EXT_RAISED;
		if (!rec) {
			PyErr_NoMemory();
		} else {
			/* one op: signals are seen while it runs, and it ends
			 * before this returns */
			self->busy++;
			rc = ext_run_sync(hd, self->f, PyBytes_AsString(self->pathb), is_write,
					  NULL, total, off, flags, iov, n, rec);
			self->busy--;
		}
		if (rc < 0)
			ext_raise_record(st, rec, file_target(self));
		else if (rc == 0)
			res = PyLong_FromUnsignedLongLong(total);
		PyMem_Free(rec);
		for (uint32_t i = 0; res && !is_write && i < n; i++)
			if (bufs[i].keep && !bufs[i].has_view &&
			    ext_torch_bump_version(st, bufs[i].keep) < 0)
				Py_CLEAR(res);
	}
	for (uint32_t i = 0; i < n; i++)
		ext_buf_release(&bufs[i]);
	PyMem_Free(bufs);
	PyMem_Free(iov);
	return res;
}

static PyObject *f_preadv(PyObject *s, PyObject *a, PyObject *k)
{
	return file_rwv((ext_file *)s, a, k, 0);
}

static PyObject *f_pwritev(PyObject *s, PyObject *a, PyObject *k)
{
	return file_rwv((ext_file *)s, a, k, 1);
}

/* A call on the file with no buffer: truncate, allocate, sync, commit. */
enum { FC_TRUNCATE, FC_ALLOCATE, FC_SYNC, FC_COMMIT };

static PyObject *file_call(ext_file *self, int what, long long a, long long b)
{
	static const char *names[] = { "truncate", "allocate", "fsync", "commit" };
	if (ext_file_check_open(self) < 0)
		return NULL;
	if ((what == FC_TRUNCATE || what == FC_ALLOCATE) && (a < 0 || b < 0)) {
		PyErr_SetString(PyExc_ValueError, "nvio: sizes and offsets must be >= 0");
		return NULL;
	}
	ext_handle *hd = self->handle;
	nvio_file_t *f = self->f;
	int rc = 0;
	BUSY_ENTER(hd, self);
	Py_BEGIN_ALLOW_THREADS
	switch (what) {
	case FC_TRUNCATE: rc = nvio_file_truncate(f, (uint64_t)a); break;
	case FC_ALLOCATE: rc = nvio_file_allocate(f, a, (uint64_t)b); break;
	case FC_SYNC: rc = nvio_file_sync(f); break;
	case FC_COMMIT: rc = nvio_file_commit(f); break;
	}
	Py_END_ALLOW_THREADS
	BUSY_LEAVE(hd, self);
	if (rc < 0) {
		if (rc == -EINVAL && what == FC_COMMIT) {
			PyErr_SetString(PyExc_ValueError,
					"nvio: commit() needs a FILE_ATOMIC file not yet committed");
			return NULL;
		}
		return ext_raise_io(ext_file_state(self), hd->h, rc, file_target(self),
				    self->user_fd, what == FC_ALLOCATE ? a : 0,
				    what == FC_ALLOCATE ? (uint64_t)b : (uint64_t)a,
				    names[what], 1);
	}
	Py_RETURN_NONE;
}

static PyObject *f_truncate(PyObject *s, PyObject *arg)
{
	long long v = PyLong_AsLongLong(arg);
	if (v == -1 && PyErr_Occurred())
		return NULL;
	return file_call((ext_file *)s, FC_TRUNCATE, v, 0);
}

static PyObject *f_allocate(PyObject *s, PyObject *args)
{
	long long off, n;
	if (!PyArg_ParseTuple(args, "LL:allocate", &off, &n))
		return NULL;
	return file_call((ext_file *)s, FC_ALLOCATE, off, n);
}

static PyObject *f_sync(PyObject *s, PyObject *unused)
{
	return file_call((ext_file *)s, FC_SYNC, 0, 0);
}

static PyObject *f_commit(PyObject *s, PyObject *unused)
{
	return file_call((ext_file *)s, FC_COMMIT, 0, 0);
}

static PyObject *f_close(PyObject *s, PyObject *unused)
{
	ext_file *self = (ext_file *)s;
	if (self->busy) {
		PyErr_SetString(PyExc_RuntimeError,
				"nvio: cannot close a file while another thread is using it");
		return NULL;
	}
	if (ext_streams_busy(self)) {
		PyErr_SetString(PyExc_RuntimeError,
				"nvio: cannot close a file while one of its streams is in use");
		return NULL;
	}
	int write = (self->flags & (NVIO_FILE_WRITE | NVIO_FILE_ATOMIC)) != 0;
	int rc = file_close_now(self);
	if (rc < 0)
		return ext_raise_io(ext_file_state(self), NULL, rc, file_target(self),
				    self->user_fd, 0, 0, "close", write);
	Py_RETURN_NONE;
}

static int get_info(ext_file *self, nvio_file_info_t *fi)
{
	if (ext_file_check_open(self) < 0)
		return -1;
	memset(fi, 0, sizeof(*fi));
	fi->struct_size = sizeof(*fi);
	int rc = nvio_file_info(self->f, fi);
	if (rc < 0) {
		ext_raise_plain(ext_file_state(self), rc, "nvio_file_info");
		return -1;
	}
	return 0;
}

static PyObject *f_info(PyObject *s, PyObject *unused)
{
	nvio_file_info_t fi;
	ext_file *self = (ext_file *)s;
	if (get_info(self, &fi) < 0)
		return NULL;
	return Py_BuildValue("{sIsisOsIsIsKsOsN}",
		"flags", (unsigned)fi.flags,
		"fd", (int)fi.fd,
		"direct", fi.direct ? Py_True : Py_False,
		"dio_offset_align", (unsigned)fi.dio_offset_align,
		"dio_mem_align", (unsigned)fi.dio_mem_align,
		"size", (unsigned long long)fi.size,
		"committed", fi.committed ? Py_True : Py_False,
		"path", PyUnicode_DecodeFSDefault(PyBytes_AsString(self->pathb)));
}

#define INFO_GETTER(fname, expr)					\
	static PyObject *fname(PyObject *s, void *c)			\
	{								\
		nvio_file_info_t fi;					\
		if (get_info((ext_file *)s, &fi) < 0)			\
			return NULL;					\
		return expr;						\
	}

INFO_GETTER(f_get_fd, PyLong_FromLong(fi.fd))
INFO_GETTER(f_get_size, PyLong_FromUnsignedLongLong(fi.size))
INFO_GETTER(f_get_direct, PyBool_FromLong(fi.direct))
INFO_GETTER(f_get_committed, PyBool_FromLong(fi.committed))

static PyObject *f_get_temp_path(PyObject *s, void *c)
{
	ext_file *self = (ext_file *)s;
	const char *tp;

	if (ext_file_check_open(self) < 0)
		return NULL;
	tp = nvio_file_temp_path(self->f);
	if (!tp)
		Py_RETURN_NONE;
	return PyUnicode_DecodeFSDefault(tp);
}

static PyObject *f_get_path(PyObject *s, void *c)
{
	ext_file *self = (ext_file *)s;
	return PyUnicode_DecodeFSDefault(PyBytes_AsString(self->pathb));
}

static PyObject *f_get_closed(PyObject *s, void *c)
{
	ext_file *self = (ext_file *)s;
	return PyBool_FromLong(!self->f || !self->handle->h);
}

static PyObject *f_get_flags(PyObject *s, void *c)
{
	return PyLong_FromUnsignedLong(((ext_file *)s)->flags);
}

static PyObject *f_get_handle(PyObject *s, void *c)
{
	return Py_NewRef((PyObject *)((ext_file *)s)->handle);
}

static PyObject *f_enter(PyObject *s, PyObject *unused)
{
	if (ext_file_check_open((ext_file *)s) < 0)
		return NULL;
	return Py_NewRef(s);
}

/*
 * Leaving a with block: on success an ATOMIC file not yet committed is
 * committed, then the file is closed; on an exception it is closed only,
 * which abandons an ATOMIC file (path keeps its old content).
 */
static PyObject *f_exit(PyObject *s, PyObject *args)
{
	ext_file *self = (ext_file *)s;
	PyObject *et = PyTuple_Size(args) > 0 ? PyTuple_GetItem(args, 0) : Py_None;
	if (et == Py_None && self->f && (self->flags & NVIO_FILE_ATOMIC)) {
		nvio_file_info_t fi;
		if (get_info(self, &fi) < 0)
			return NULL;
		if (!fi.committed) {
			PyObject *r = f_commit(s, NULL);
			if (!r) {
				PyObject *t, *v, *tb;
				PyErr_Fetch(&t, &v, &tb);
				PyObject *c = f_close(s, NULL);
				Py_XDECREF(c);
				PyErr_Clear();
				PyErr_Restore(t, v, tb);
				return NULL;
			}
			Py_DECREF(r);
		}
	}
	PyObject *r = f_close(s, NULL);
	if (!r)
		return NULL;
	Py_DECREF(r);
	Py_RETURN_FALSE;
}

static PyObject *f_repr(PyObject *s)
{
	ext_file *self = (ext_file *)s;
	PyObject *p = f_get_path(s, NULL);
	if (!p)
		return NULL;
	PyObject *r = PyUnicode_FromFormat("<nvio.File %R flags=0x%x%s>", p, self->flags,
					   self->f ? "" : " closed");
	Py_DECREF(p);
	return r;
}

/* ------------------------------------------------------------------ */
/* Types                                                               */
/* ------------------------------------------------------------------ */

#define BUF_DOC "buf: an object with the buffer protocol (writable for reads), a\n" \
	"CPU or CUDA torch.Tensor, a NumPy array or a CPU DLPack producer.\n"
#define CANCEL_DOC "Ctrl-C (a signal handler that raises) cancels the write: pieces not\n" \
	"started are skipped, those in flight finish, then the exception is raised.\n" \
	"The file keeps the pieces that ran; a write that grew it goes back to the\n" \
	"old size; a FILE_ATOMIC file then refuses to commit.\n"
#define METH_KW(f) (PyCFunction)(void (*)(void))(f), METH_VARARGS | METH_KEYWORDS
#define METH_FASTKW(f) (PyCFunction)(void (*)(void))(f), METH_FASTCALL | METH_KEYWORDS

static PyMethodDef file_methods[] = {
	{ "pread", METH_FASTKW(f_pread),
	  "pread($self, buf, offset, flags=0)\n--\n\nRead len(buf) bytes at offset; returns "
	  "the bytes read.\nPast the end of the file: NvioError(ENODATA). flags: VALIDATE.\n" BUF_DOC },
	{ "pwrite", METH_FASTKW(f_pwrite),
	  "pwrite($self, buf, offset, flags=0)\n--\n\nWrite buf at offset (the file grows as "
	  "needed); returns the bytes written.\nflags: VALIDATE | FSYNC.\n" BUF_DOC CANCEL_DOC },
	{ "preadv", METH_KW(f_preadv),
	  "preadv($self, bufs, offset, flags=0)\n--\n\nRead into a sequence of buffers laid end "
	  "to end from offset, or, with offset\nOFFSET_PER_IOV (-1), a sequence of (buf, offset) "
	  "pairs in increasing order.\nReturns the bytes read." },
	{ "pwritev", METH_KW(f_pwritev),
	  "pwritev($self, bufs, offset, flags=0)\n--\n\nWrite a sequence of buffers (see preadv); "
	  "returns the bytes written.\n" CANCEL_DOC },
	{ "truncate", f_truncate, METH_O,
	  "truncate($self, size, /)\n--\n\nSet the file's size exactly (it shrinks or grows)." },
	{ "allocate", f_allocate, METH_VARARGS,
	  "allocate($self, offset, nbytes, /)\n--\n\nReserve the range on disk (ENOSPC shows now)." },
	{ "sync", f_sync, METH_NOARGS, "sync($self)\n--\n\nfsync the data written so far." },
	{ "commit", f_commit, METH_NOARGS,
	  "commit($self)\n--\n\nFILE_ATOMIC: wait for the file's ops, fsync, rename over path, "
	  "fsync the\ndirectory. Raises (and path keeps its old content) if any op failed." },
	{ "close", f_close, METH_NOARGS,
	  "close($self)\n--\n\nClose the file's streams, wait for its ops, close it. An ATOMIC "
	  "file not\ncommitted is abandoned. Idempotent. Tagged ops still to be reaped keep\n"
	  "their buffers until reap()." },
	{ "info", f_info, METH_NOARGS, "info($self)\n--\n\nWhat nvio knows of the file, as a dict." },
	{ "stream", METH_KW(ext_stream_open),
	  "stream($self, mode, offset=0, buffer_bytes=0, depth=0)\n--\n\n"
	  "A Stream over the file: mode 'w' appends from offset through double-buffered\n"
	  "locked staging (buffer_bytes each, 0: 8 MiB); mode 'r' reads ahead depth buffers\n"
	  "(0: 2) from offset. Close streams before their file." },
	{ "__enter__", f_enter, METH_NOARGS, NULL },
	{ "__exit__", f_exit, METH_VARARGS,
	  "On success commit an ATOMIC file, then close; on an exception close only\n"
	  "(abandoning an ATOMIC file)." },
	{ NULL, NULL, 0, NULL }
};

static PyGetSetDef file_getset[] = {
	{ "path", f_get_path, NULL, "The path it was opened with ('fd N' for open_fd).", NULL },
	{ "fd", f_get_fd, NULL, "The buffered descriptor (do not close it).", NULL },
	{ "size", f_get_size, NULL, "Size as nvio knows it: at open, plus nvio's writes.", NULL },
	{ "direct", f_get_direct, NULL, "True when the body of ops goes through O_DIRECT.", NULL },
	{ "committed", f_get_committed, NULL, "ATOMIC: True once committed.", NULL },
	{ "temp_path", f_get_temp_path, NULL,
	  "ATOMIC, not yet committed: the name of its temporary where other processes\n"
	  "can open it to write parts of it (a spare; a hidden temporary where the\n"
	  "file system has no O_TMPFILE), else None.", NULL },
	{ "closed", f_get_closed, NULL, "True once closed (or its handle closed).", NULL },
	{ "flags", f_get_flags, NULL, "The FILE_* flags it was opened with.", NULL },
	{ "handle", f_get_handle, NULL, "The Handle it belongs to.", NULL },
	{ NULL, NULL, NULL, NULL, NULL }
};

static PyObject *file_new_refused(PyTypeObject *t, PyObject *a, PyObject *k)
{
	PyErr_SetString(PyExc_TypeError, "nvio: make a File with Handle.open() or open_fd()");
	return NULL;
}

static PyType_Slot file_slots[] = {
	{ Py_tp_new, file_new_refused },
	{ Py_tp_dealloc, file_dealloc },
	{ Py_tp_methods, file_methods },
	{ Py_tp_getset, file_getset },
	{ Py_tp_repr, f_repr },
	{ Py_tp_doc, "An open file of a Handle (nvio_file_open): one open for any number of "
		     "ops.\nMade by Handle.open(path, flags) or Handle.open_fd(fd, flags)." },
	{ 0, NULL }
};

static PyType_Spec file_spec = {
	"nvio._nvio.File", sizeof(ext_file), 0,
	Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE, file_slots
};

int ext_file_exec(PyObject *m, ext_state *st)
{
	static const struct { const char *name; long long v; } consts[] = {
		{ "FILE_READ", NVIO_FILE_READ }, { "FILE_WRITE", NVIO_FILE_WRITE },
		{ "FILE_CREATE", NVIO_FILE_CREATE }, { "FILE_EXCL", NVIO_FILE_EXCL },
		{ "FILE_TRUNC", NVIO_FILE_TRUNC }, { "FILE_ATOMIC", NVIO_FILE_ATOMIC },
		{ "FILE_NOSYNC", NVIO_FILE_NOSYNC }, { "FILE_SPARE", NVIO_FILE_SPARE },
		{ "OP_READ", NVIO_OP_READ }, { "OP_WRITE", NVIO_OP_WRITE },
		{ "VALIDATE", NVIO_VALIDATE }, { "FSYNC", NVIO_FSYNC },
		{ "OFFSET_PER_IOV", NVIO_OFFSET_PER_IOV }, { "MAX_IOV", NVIO_MAX_IOV },
	};
	st->file_type = PyType_FromModuleAndSpec(m, &file_spec, NULL);
	if (!st->file_type || PyModule_AddObjectRef(m, "File", st->file_type) < 0)
		return -1;
	for (size_t i = 0; i < sizeof(consts) / sizeof(consts[0]); i++)
		if (PyModule_AddObject(m, consts[i].name, PyLong_FromLongLong(consts[i].v)) < 0)
			return -1;
	return 0;
}
