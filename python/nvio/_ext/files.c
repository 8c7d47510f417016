/*
 * files.c - open files (File), tagged ops and batches (Handle.submit,
 * Handle.reap), vectors, and streams (Stream): libnvio 0.2 in Python.
 *
 * Contracts:
 *   - The GIL is released around every libnvio call that may block. While
 *     it is, the call counts in `busy` of the objects it uses (stream,
 *     file and handle), and close() of any of them is refused meanwhile.
 *   - A File lives in its handle: it holds a reference to the Handle, and
 *     the handle keeps a list of its open files, which Handle.close()
 *     closes before the C handle is destroyed (libnvio frees a file's
 *     state with its handle). Likewise a Stream holds its File, and a
 *     file's close() first closes its open streams.
 *   - A tagged op borrows every buffer it names, and holds its File and
 *     its user_data, in a slot of the handle's table (ext_tags) whose
 *     index + 1 is the C user_data. reap() empties the slot after the op
 *     has ended; Handle.close() empties the rest after nvio_handle_destroy
 *     has waited for every op. A slot is never reused before its op ended.
 *   - Synchronous calls return the bytes moved; failures raise NvioError
 *     with the record libnvio kept (path, offset, op).
 */
#include "ext.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

typedef struct ext_stream ext_stream;

struct ext_file {
	PyObject_HEAD
	nvio_file_t *f;		/* NULL once closed */
	ext_handle *handle;	/* strong */
	PyObject *name;		/* what the user gave (path), or NULL (an fd) */
	PyObject *pathb;	/* bytes: nvio_file_path(), for error records */
	unsigned flags;
	int user_fd;		/* open_fd's descriptor, else -1 */
	int busy;		/* calls running without the GIL */
	ext_file *next, **pprev;	/* in handle->files while open */
	ext_stream *streams;	/* open streams (borrowed) */
};

struct ext_stream {
	PyObject_HEAD
	nvio_stream_t *s;	/* NULL once closed */
	ext_file *file;		/* strong */
	int writer;
	int busy;
	ext_stream *next, **pprev;	/* in file->streams while open */
};

/* What one tagged op borrows until it is reaped. */
struct ext_tag {
	PyObject *user;		/* user_data, strong */
	ext_file *file;		/* strong */
	ext_buf *bufs;
	uint32_t nbufs;
	nvio_iovec_t *iov;	/* a vector's, else NULL */
	int is_write;
};

#define BUSY_ENTER(hd, fl, sm) do { (hd)->busy++; if (fl) (fl)->busy++; \
	if (sm) (sm)->busy++; } while (0)
#define BUSY_LEAVE(hd, fl, sm) do { (hd)->busy--; if (fl) (fl)->busy--; \
	if (sm) (sm)->busy--; } while (0)

static ext_state *file_state(ext_file *f)
{
	return ext_handle_state(f->handle);
}

/* The object errors name: the path given, or NULL (then fd is set). */
static PyObject *file_target(ext_file *f)
{
	return f->name;
}

/* ------------------------------------------------------------------ */
/* Tag table                                                           */
/* ------------------------------------------------------------------ */

static void tag_free(ext_tag *t)
{
	if (!t)
		return;
	for (uint32_t i = 0; i < t->nbufs; i++)
		ext_buf_release(&t->bufs[i]);
	PyMem_Free(t->bufs);
	PyMem_Free(t->iov);
	Py_XDECREF(t->user);
	Py_XDECREF((PyObject *)t->file);
	PyMem_Free(t);
}

/* Puts t in a free slot; its C user_data (index + 1) in *ud. -1 on MemoryError. */
static int tags_add(ext_tags *ts, ext_tag *t, uint64_t *ud)
{
	size_t i;

	if (ts->nfree) {
		i = ts->free[--ts->nfree];
	} else {
		if (ts->used == ts->cap) {
			size_t cap = ts->cap ? ts->cap * 2 : 64;
			ext_tag **s = PyMem_Realloc(ts->slot, cap * sizeof(*s));
			if (!s) {
				PyErr_NoMemory();
				return -1;
			}
			ts->slot = s;
			size_t *fr = PyMem_Realloc(ts->free, cap * sizeof(*fr));
			if (!fr) {
				PyErr_NoMemory();
				return -1;
			}
			ts->free = fr;
			ts->cap = cap;
		}
		i = ts->used++;
	}
	ts->slot[i] = t;
	*ud = (uint64_t)i + 1;
	return 0;
}

/* Detaches the tag of user_data ud (NULL if none). */
static ext_tag *tags_take(ext_tags *ts, uint64_t ud)
{
	if (ud == 0 || ud > ts->used || !ts->slot[ud - 1])
		return NULL;
	ext_tag *t = ts->slot[ud - 1];
	ts->slot[ud - 1] = NULL;
	ts->free[ts->nfree++] = (size_t)(ud - 1);	/* cap >= used: room */
	return t;
}

void ext_tags_release_all(ext_handle *self)
{
	ext_tags *ts = &self->tags;

	/* Detach each before freeing: freeing may run Python code. */
	for (size_t i = 0; i < ts->used; i++)
		tag_free(tags_take(ts, (uint64_t)i + 1));
	PyMem_Free(ts->slot);
	PyMem_Free(ts->free);
	memset(ts, 0, sizeof(*ts));
	PyMem_Free(self->backlog);
	self->backlog = NULL;
	self->nbacklog = self->capbacklog = 0;
}

/* ------------------------------------------------------------------ */
/* Blocking calls as tagged ops, reaped in slices                      */
/* ------------------------------------------------------------------ */

/*
 * Why: a thread blocked inside nvio_pread() cannot run Python's signal
 * handlers, so Ctrl-C waited for the whole transfer (and for torch
 * tensors was then lost in Python code that cleared it). A blocking call
 * instead submits its transfer as tagged ops of its own, whose user_data
 * carries EXT_SYNC_TAG and its waiter's id, and reaps with a timeout.
 * Any reaper (reap(), the futures' thread, another blocking call) hands
 * completions to their waiter, and keeps the user's in the backlog that
 * reap() returns first.
 */
#define EXT_SYNC_TAG (1ull << 63)
#define EXT_CHUNK (64ull << 20)
#define EXT_CHUNK_MIN (8ull << 20)
#define EXT_WINDOW 4u
#define EXT_SLICE_NS 50000000ll
#define EXT_REAP_BATCH 32u

struct ext_waiter {
	uint64_t id;
	uint32_t inflight;
	int failed;
	nvio_completion_t err;	/* the first failed completion */
	ext_waiter *next;
};

/* Room for `more` completions in the backlog; -1 with MemoryError. */
static int backlog_reserve(ext_handle *hd, size_t more)
{
	if (hd->capbacklog - hd->nbacklog >= more)
		return 0;
	size_t cap = hd->capbacklog ? hd->capbacklog : 64;
	while (cap - hd->nbacklog < more)
		cap *= 2;
	nvio_completion_t *b = PyMem_Realloc(hd->backlog, cap * sizeof(*b));
	if (!b) {
		PyErr_NoMemory();
		return -1;
	}
	hd->backlog = b;
	hd->capbacklog = cap;
	return 0;
}

/* Hands reaped completions to their waiters or to the backlog (room
 * for n was reserved). Runs no Python code. */
static void dispatch(ext_handle *hd, const nvio_completion_t *cs, int n)
{
	for (int i = 0; i < n; i++) {
		const nvio_completion_t *c = &cs[i];
		if (!(c->user_data & EXT_SYNC_TAG)) {
			hd->backlog[hd->nbacklog++] = *c;
			continue;
		}
		for (ext_waiter *w = hd->waiters; w; w = w->next) {
			if (w->id != (c->user_data & ~EXT_SYNC_TAG))
				continue;
			w->inflight--;
			hd->internal_inflight--;
			if (c->res < 0 && !w->failed) {
				w->failed = 1;
				w->err = *c;
			}
			break;
		}
	}
}

/* One reap of at most `max` with the GIL released, then dispatch.
 * Returns what nvio_reap returned. */
static int reap_slice(ext_handle *hd, unsigned max, unsigned min, int64_t timeout_ns)
{
	nvio_completion_t cs[EXT_REAP_BATCH];
	nvio_handle_t *h = hd->h;
	int got;

	if (max > EXT_REAP_BATCH)
		max = EXT_REAP_BATCH;
	if (min > max)
		min = max;
	Py_BEGIN_ALLOW_THREADS
	got = nvio_reap(h, cs, max, min, timeout_ns);
	Py_END_ALLOW_THREADS
	if (got > 0)
		dispatch(hd, cs, got);
	return got;
}

static void record_of(nvio_handle_t *h, int rc, nvio_error_t *rec)
{
	memset(rec, 0, sizeof(*rec));
	rec->struct_size = sizeof(*rec);
	if (nvio_last_error(h, rec) != rc) {
		memset(rec, 0, sizeof(*rec));
		rec->struct_size = sizeof(*rec);
		rec->err = rc;
	}
}

PyObject *ext_raise_record(ext_state *st, const nvio_error_t *rec, PyObject *filename)
{
	PyObject *exc = ext_error_from_record(st, rec, filename);
	if (exc) {
		PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
		Py_DECREF(exc);
	}
	return NULL;
}

/*
 * The bytes of one blocking op: what the handle's workers have in flight
 * at once, twice over, within [EXT_CHUNK_MIN, EXT_CHUNK]. Ctrl-C lands
 * once the EXT_WINDOW ops in flight end, so they must be no more than a
 * device keeps busy with: a psync worker has one request in flight (its
 * pread), the others queue_depth each. With 64 MiB for every engine, two
 * psync workers at 50 MB/s each took 2.7 s to see Ctrl-C.
 */
static uint64_t sync_chunk(nvio_handle_t *h)
{
	uint64_t per = nvio_get_engine(h) == NVIO_ENGINE_PSYNC ? 1 : nvio_get_queue_depth(h);
	uint64_t c = 2 * nvio_get_block_size(h) * per * nvio_get_intra_op_parallelism(h);

	c = c < EXT_CHUNK_MIN ? EXT_CHUNK_MIN : c > EXT_CHUNK ? EXT_CHUNK : c;
	/* whole MiBs: an odd block_size must not put chunk edges off the
	 * alignment O_DIRECT needs (each edge would go through the page cache) */
	return c & ~(uint64_t)((1u << 20) - 1);
}

int ext_run_sync(ext_handle *hd, nvio_file_t *f, const char *path, int is_write,
		 void *ptr, uint64_t n, int64_t off, unsigned flags,
		 const nvio_iovec_t *iov, uint32_t iovcnt, nvio_error_t *rec)
{
	nvio_handle_t *h = hd->h;
	ext_waiter w;
	uint64_t sent = 0, chunk = sync_chunk(h), old_size = 0;
	int first = 1, stop = 0, raised = 0, rc = 0;
	unsigned opflags = flags & ~(unsigned)NVIO_FSYNC;	/* once, at the end */
	nvio_file_info_t fi;

	/* One chunk or less runs as one plain call with the GIL released,
	 * in the caller's thread where libnvio can: handing a small op to a
	 * worker and reaping it would cost more than its I/O (a 4 KiB read),
	 * and one chunk ends soon enough for Ctrl-C to be seen after it. */
	if (!iov && n <= chunk) {
		int r;

		hd->busy++;
		Py_BEGIN_ALLOW_THREADS
		r = is_write ? nvio_file_pwrite(f, ptr, n, off, flags) :
			       nvio_file_pread(f, ptr, n, off, flags);
		Py_END_ALLOW_THREADS
		hd->busy--;
		if (r < 0)
			record_of(h, r, rec);
		return r;
	}
	memset(&fi, 0, sizeof(fi));
	fi.struct_size = sizeof(fi);
	if (!iov && nvio_file_info(f, &fi) == 0) {
		old_size = fi.size;
		/* A read past the end is refused whole, before any I/O. */
		if (!is_write && (uint64_t)off + n > fi.size)
			chunk = n ? n : 1;
	}
	if (backlog_reserve(hd, EXT_REAP_BATCH) < 0)
		return EXT_RAISED;
	memset(&w, 0, sizeof(w));
	w.id = ++hd->next_waiter & ~EXT_SYNC_TAG;
	w.next = hd->waiters;
	hd->waiters = &w;
	hd->busy++;
	for (;;) {
		while (!stop && w.inflight < EXT_WINDOW && (first || sent < n)) {
			nvio_op_t op;
			uint64_t len;
			int r;

			memset(&op, 0, sizeof(op));
			op.opcode = is_write ? NVIO_OP_WRITE : NVIO_OP_READ;
			op.flags = opflags;
			op.file = f;
			op.user_data = EXT_SYNC_TAG | w.id;
			if (iov) {
				op.iov = iov;
				op.iovcnt = iovcnt;
				op.offset = off;
				len = n;
			} else {
				len = n - sent < chunk ? n - sent : chunk;
				op.buf = (char *)ptr + sent;
				op.nbytes = len;
				op.offset = off + (int64_t)sent;
			}
			Py_BEGIN_ALLOW_THREADS
			r = nvio_submit(h, &op, 1);
			Py_END_ALLOW_THREADS
			if (r < 0) {
				record_of(h, r, rec);
				rc = r;
				stop = 1;
				break;
			}
			w.inflight++;
			hd->internal_inflight++;
			sent += len;
			first = 0;
		}
		if (w.inflight == 0)
			break;
		if (backlog_reserve(hd, EXT_REAP_BATCH) < 0) {
			/* Cannot keep others' completions: take none, wait for
			 * another reaper to hand ours over. */
			PyErr_Clear();
			Py_BEGIN_ALLOW_THREADS
			struct timespec ts = { 0, 1000000 };
			nanosleep(&ts, NULL);
			Py_END_ALLOW_THREADS
			continue;
		}
		int got = reap_slice(hd, EXT_REAP_BATCH, 1, EXT_SLICE_NS);
		if (got < 0) {	/* nothing in flight can be waited for */
			if (!rc) {
				record_of(h, got, rec);
				rc = got;
			}
			hd->internal_inflight -= w.inflight;
			w.inflight = 0;
			break;
		}
		if (w.failed)
			stop = 1;
		if (!raised && PyErr_CheckSignals() < 0) {
			raised = 1;	/* stop here; the ops in flight still end */
			stop = 1;
		}
	}
	hd->busy--;
	for (ext_waiter **p = &hd->waiters; *p; p = &(*p)->next)
		if (*p == &w) {
			*p = w.next;
			break;
		}
	if (w.failed && !rc) {
		memset(rec, 0, sizeof(*rec));
		rec->struct_size = sizeof(*rec);
		nvio_completion_error(&w.err, path, rec);
		rc = (int)w.err.res;
	}
	if (rc == 0 && !raised && (flags & NVIO_FSYNC) && is_write) {
		Py_BEGIN_ALLOW_THREADS
		rc = nvio_file_sync(f);
		Py_END_ALLOW_THREADS
		if (rc < 0)
			record_of(h, rc, rec);
	}
	/* A growing write that did not complete goes back to the old size
	 * (unless something else took the file further meanwhile). */
	if ((rc < 0 || raised) && is_write && !iov && (uint64_t)off + n > old_size &&
	    sent > 0) {
		nvio_file_info_t now;
		memset(&now, 0, sizeof(now));
		now.struct_size = sizeof(now);
		if (nvio_file_info(f, &now) == 0 && now.size <= (uint64_t)off + n) {
			Py_BEGIN_ALLOW_THREADS
			(void)nvio_file_truncate(f, old_size);
			Py_END_ALLOW_THREADS
		}
	}
	return raised ? EXT_RAISED : rc;
}

/* ------------------------------------------------------------------ */
/* Borrowing buffers and vectors                                       */
/* ------------------------------------------------------------------ */

/* Borrows one buffer; for ops that outlive the call, a tensor's storage too. */
static int borrow(ext_state *st, PyObject *obj, int writable, int keep_storage, ext_buf *b)
{
	if (ext_buf_get(st, obj, writable, b) < 0)
		return -1;
	if (keep_storage && b->keep == obj && ext_buf_keep_storage(b, obj) < 0) {
		ext_buf_release(b);
		return -1;
	}
	return 0;
}

/* An offset that fits int64_t; `what` names it. */
static int parse_offset(PyObject *o, int64_t *out, const char *what)
{
	long long v = PyLong_AsLongLong(o);
	if (v == -1 && PyErr_Occurred())
		return -1;
	*out = v;
	return 0;
}

/*
 * A vector: bufs is a list or tuple of buffers, or with per_iov of
 * (buffer, offset) pairs. Fills *bufs_out / *iov_out (PyMem) and *n.
 * 0, or -1 with an exception set and nothing borrowed.
 */
static int borrow_vector(ext_state *st, PyObject *seq, int per_iov, int writable,
			 int keep_storage, ext_buf **bufs_out, nvio_iovec_t **iov_out,
			 uint32_t *n_out, uint64_t *total)
{
	PyObject *tup = PySequence_Tuple(seq);
	if (!tup)
		return -1;
	Py_ssize_t n = PyTuple_Size(tup);
	if (n > (Py_ssize_t)NVIO_MAX_IOV) {
		Py_DECREF(tup);
		PyErr_Format(PyExc_ValueError, "nvio: %zd buffers in one vector; at most %u",
			     n, NVIO_MAX_IOV);
		return -1;
	}
	if (n == 0) {
		Py_DECREF(tup);
		PyErr_SetString(PyExc_ValueError, "nvio: a vector needs at least one buffer");
		return -1;
	}
	ext_buf *bufs = PyMem_Calloc(n ? (size_t)n : 1, sizeof(*bufs));
	nvio_iovec_t *iov = PyMem_Calloc(n ? (size_t)n : 1, sizeof(*iov));
	Py_ssize_t i = 0;
	*total = 0;
	if (!bufs || !iov) {
		PyErr_NoMemory();
		goto fail;
	}
	for (; i < n; i++) {
		PyObject *item = PyTuple_GetItem(tup, i), *obj = item;
		int64_t off = 0;
		if (per_iov) {
			if (!PyTuple_Check(item) || PyTuple_Size(item) != 2) {
				PyErr_Format(PyExc_TypeError, "nvio: with offset OFFSET_PER_IOV "
					     "each piece is a (buffer, offset) pair (item %zd)", i);
				goto fail;
			}
			obj = PyTuple_GetItem(item, 0);
			if (parse_offset(PyTuple_GetItem(item, 1), &off, "offset") < 0)
				goto fail;
			if (off < 0) {
				PyErr_Format(PyExc_ValueError,
					     "nvio: piece %zd has offset %lld; must be >= 0",
					     i, (long long)off);
				goto fail;
			}
		}
		if (borrow(st, obj, writable, keep_storage, &bufs[i]) < 0)
			goto fail;
		/* libnvio's rule, said with the piece's index */
		if (per_iov && i > 0 && (uint64_t)off < (uint64_t)iov[i - 1].offset + iov[i - 1].len) {
			ext_buf_release(&bufs[i]);
			PyErr_Format(PyExc_ValueError, "nvio: piece %zd at offset %lld overlaps or "
				     "precedes piece %zd (which ends at %llu); per-piece offsets "
				     "must increase without overlap", i, (long long)off, i - 1,
				     (unsigned long long)(iov[i - 1].offset + iov[i - 1].len));
			goto fail;
		}
		iov[i].base = bufs[i].ptr;
		iov[i].len = bufs[i].nbytes;
		iov[i].offset = off;
		*total += bufs[i].nbytes;
	}
	Py_DECREF(tup);
	*bufs_out = bufs;
	*iov_out = iov;
	*n_out = (uint32_t)n;
	return 0;
fail:
	while (bufs && i-- > 0)
		ext_buf_release(&bufs[i]);
	PyMem_Free(bufs);
	PyMem_Free(iov);
	Py_DECREF(tup);
	return -1;
}

static int is_vector(PyObject *o)
{
	return PyList_Check(o) || PyTuple_Check(o);
}

/* ------------------------------------------------------------------ */
/* File                                                                */
/* ------------------------------------------------------------------ */

static int file_check_open(ext_file *self)
{
	if (!self->f || !self->handle->h) {
		PyErr_SetString(PyExc_ValueError, "nvio: I/O operation on a closed file");
		return -1;
	}
	return 0;
}

static int stream_close_now(ext_stream *s, unsigned flags, int *rc_out);

/*
 * Closes the C file: its streams first (without commit), then the file,
 * which waits for its ops. Returns close(2)'s error or 0; the file is
 * closed either way. The caller checked busy.
 */
static int file_close_now(ext_file *self)
{
	int rc = 0;
	while (self->streams) {
		int r;
		stream_close_now(self->streams, 0, &r);
	}
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

static PyObject *file_open_common(ext_handle *hd, PyObject *pathobj, int fd,
				  unsigned flags)
{
	ext_state *st = ext_handle_state(hd);
	PyObject *pathb = NULL;

	if (ext_handle_check_open(hd) < 0)
		return NULL;
	if (pathobj && !PyUnicode_FSConverter(pathobj, &pathb))
		return NULL;

	/* A subclass of File (the nvio package's) when the handle names one. */
	PyObject *cls = PyObject_GetAttrString((PyObject *)hd, "_file_class");
	if (!cls) {
		if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
			Py_XDECREF(pathb);
			return NULL;
		}
		PyErr_Clear();
		cls = Py_NewRef(st->file_type);
	}
	int ok = PyType_Check(cls) ? PyObject_IsSubclass(cls, st->file_type) : 0;
	if (ok <= 0) {
		if (ok == 0)
			PyErr_SetString(PyExc_TypeError,
					"nvio: _file_class must be a subclass of nvio._nvio.File");
		Py_DECREF(cls);
		Py_XDECREF(pathb);
		return NULL;
	}
	if (ext_handle_check_open(hd) < 0) {	/* Python code ran */
		Py_DECREF(cls);
		Py_XDECREF(pathb);
		return NULL;
	}
	nvio_handle_t *h = hd->h;
	const char *path = pathb ? PyBytes_AsString(pathb) : NULL;
	nvio_file_t *f;
	int err = 0;
	hd->busy++;
	Py_BEGIN_ALLOW_THREADS
	f = path ? nvio_file_open(h, path, flags, &err) : nvio_file_from_fd(h, fd, flags, &err);
	Py_END_ALLOW_THREADS
	hd->busy--;
	if (!f) {
		Py_DECREF(cls);
		Py_XDECREF(pathb);
		/* EINVAL is about the flags only when they break the rules
		 * (nvio_file_open(3)); else it is about the file (an ATOMIC
		 * write refuses a FIFO or a device): name the path. */
		unsigned known = NVIO_FILE_READ | NVIO_FILE_WRITE | NVIO_FILE_CREATE |
				 NVIO_FILE_EXCL | NVIO_FILE_TRUNC | NVIO_FILE_ATOMIC |
				 NVIO_FILE_NOSYNC | NVIO_FILE_SPARE;
		int bad_flags = (flags & ~known) ||
			((flags & (NVIO_FILE_NOSYNC | NVIO_FILE_SPARE)) &&
			 !(flags & NVIO_FILE_ATOMIC)) ||
			!(flags & (NVIO_FILE_READ | NVIO_FILE_WRITE | NVIO_FILE_ATOMIC)) ||
			((flags & NVIO_FILE_ATOMIC) &&
			 (flags & (NVIO_FILE_TRUNC | NVIO_FILE_EXCL)));
		if (err == -EINVAL && (bad_flags || !path)) {
			PyErr_Format(PyExc_ValueError, "nvio: invalid file flags 0x%x for %s: %s",
				     flags, path ? "open" : "open_fd", nvio_strerror(err));
			return NULL;
		}
		return ext_raise_io(st, h, err ? err : -EIO, pathobj, fd, 0, 0, "open",
				    (flags & (NVIO_FILE_WRITE | NVIO_FILE_ATOMIC)) != 0);
	}
	allocfunc alloc = (allocfunc)PyType_GetSlot((PyTypeObject *)cls, Py_tp_alloc);
	ext_file *self = (ext_file *)alloc((PyTypeObject *)cls, 0);
	Py_DECREF(cls);
	if (!self) {
		Py_BEGIN_ALLOW_THREADS
		nvio_file_close(f);
		Py_END_ALLOW_THREADS
		Py_XDECREF(pathb);
		return NULL;
	}
	self->f = f;
	self->handle = (ext_handle *)Py_NewRef((PyObject *)hd);
	self->name = pathobj ? Py_NewRef(pathobj) : NULL;
	self->flags = flags;
	self->user_fd = path ? -1 : fd;
	Py_XDECREF(pathb);
	self->pathb = PyBytes_FromString(nvio_file_path(f));
	if (!self->pathb) {
		Py_DECREF(self);
		return NULL;
	}
	self->next = hd->files;
	if (hd->files)
		hd->files->pprev = &self->next;
	hd->files = self;
	self->pprev = &hd->files;
	return (PyObject *)self;
}

static int parse_flags(PyObject *o, unsigned *out)
{
	unsigned long v = PyLong_AsUnsignedLong(o);
	if (v == (unsigned long)-1 && PyErr_Occurred())
		return -1;
	if (v > UINT32_MAX) {
		PyErr_SetString(PyExc_ValueError, "nvio: flags out of range");
		return -1;
	}
	*out = (unsigned)v;
	return 0;
}

PyObject *ext_h_open(PyObject *s, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "path", "flags", NULL };
	PyObject *path, *fl = NULL;
	unsigned flags = NVIO_FILE_READ;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O:open", kwlist, &path, &fl))
		return NULL;
	if (fl && parse_flags(fl, &flags) < 0)
		return NULL;
	if (PyLong_Check(path)) {
		PyErr_SetString(PyExc_TypeError, "nvio: open() takes a path; use open_fd() for a descriptor");
		return NULL;
	}
	return file_open_common((ext_handle *)s, path, -1, flags);
}

PyObject *ext_h_open_fd(PyObject *s, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "fd", "flags", NULL };
	int fd;
	PyObject *fl = NULL;
	unsigned flags = NVIO_FILE_READ;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "i|O:open_fd", kwlist, &fd, &fl))
		return NULL;
	if (fl && parse_flags(fl, &flags) < 0)
		return NULL;
	return file_open_common((ext_handle *)s, NULL, fd, flags);
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
	if (file_check_open(self) < 0)
		return NULL;
	ext_state *st = file_state(self);
	ext_buf b;
	if (borrow(st, bufobj, !is_write, 0, &b) < 0)
		return NULL;
	if (file_check_open(self) < 0) {
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
	if (ok && (!fl || parse_flags(fl, &flags) == 0))
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
	if (fl && parse_flags(fl, &flags) < 0)
		return NULL;
	if (off < 0 && off != NVIO_OFFSET_PER_IOV) {
		PyErr_Format(PyExc_ValueError,
			     "nvio: offset must be >= 0 or OFFSET_PER_IOV (-1), not %lld", off);
		return NULL;
	}
	if (file_check_open(self) < 0)
		return NULL;
	ext_state *st = file_state(self);
	ext_buf *bufs;
	nvio_iovec_t *iov;
	uint32_t n;
	uint64_t total;
	if (borrow_vector(st, seq, off == NVIO_OFFSET_PER_IOV, !is_write, 0, &bufs, &iov,
			  &n, &total) < 0)
		return NULL;
	PyObject *res = NULL;
	if (file_check_open(self) == 0) {
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
	if (file_check_open(self) < 0)
		return NULL;
	if ((what == FC_TRUNCATE || what == FC_ALLOCATE) && (a < 0 || b < 0)) {
		PyErr_SetString(PyExc_ValueError, "nvio: sizes and offsets must be >= 0");
		return NULL;
	}
	ext_handle *hd = self->handle;
	nvio_file_t *f = self->f;
	int rc = 0;
	BUSY_ENTER(hd, self, (ext_stream *)NULL);
	Py_BEGIN_ALLOW_THREADS
	switch (what) {
	case FC_TRUNCATE: rc = nvio_file_truncate(f, (uint64_t)a); break;
	case FC_ALLOCATE: rc = nvio_file_allocate(f, a, (uint64_t)b); break;
	case FC_SYNC: rc = nvio_file_sync(f); break;
	case FC_COMMIT: rc = nvio_file_commit(f); break;
	}
	Py_END_ALLOW_THREADS
	BUSY_LEAVE(hd, self, (ext_stream *)NULL);
	if (rc < 0) {
		if (rc == -EINVAL && what == FC_COMMIT) {
			PyErr_SetString(PyExc_ValueError,
					"nvio: commit() needs a FILE_ATOMIC file not yet committed");
			return NULL;
		}
		return ext_raise_io(file_state(self), hd->h, rc, file_target(self),
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
	for (ext_stream *t = self->streams; t; t = t->next)
		if (t->busy) {
			PyErr_SetString(PyExc_RuntimeError,
					"nvio: cannot close a file while one of its streams is in use");
			return NULL;
		}
	int write = (self->flags & (NVIO_FILE_WRITE | NVIO_FILE_ATOMIC)) != 0;
	int rc = file_close_now(self);
	if (rc < 0)
		return ext_raise_io(file_state(self), NULL, rc, file_target(self),
				    self->user_fd, 0, 0, "close", write);
	Py_RETURN_NONE;
}

static int get_info(ext_file *self, nvio_file_info_t *fi)
{
	if (file_check_open(self) < 0)
		return -1;
	memset(fi, 0, sizeof(*fi));
	fi->struct_size = sizeof(*fi);
	int rc = nvio_file_info(self->f, fi);
	if (rc < 0) {
		ext_raise_plain(file_state(self), rc, "nvio_file_info");
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

	if (file_check_open(self) < 0)
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
	if (file_check_open((ext_file *)s) < 0)
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
/* Tagged ops: submit, reap                                            */
/* ------------------------------------------------------------------ */

/* Parses one op tuple into *op and a new tag. 0, or -1 with an exception. */
static int parse_op(ext_state *st, ext_handle *hd, PyObject *item, Py_ssize_t idx,
		    nvio_op_t *op, ext_tag **tag_out)
{
	Py_ssize_t n = PyTuple_Check(item) ? PyTuple_Size(item) : -1;
	if (n < 4 || n > 6) {
		PyErr_Format(PyExc_TypeError, "nvio: op %zd must be a tuple (opcode, file, buf, "
			     "offset[, user_data[, flags]])", idx);
		return -1;
	}
	PyObject *opc = PyTuple_GetItem(item, 0), *fo = PyTuple_GetItem(item, 1);
	PyObject *bo = PyTuple_GetItem(item, 2), *oo = PyTuple_GetItem(item, 3);
	PyObject *uo = n > 4 ? PyTuple_GetItem(item, 4) : Py_None;
	unsigned flags = 0;
	long code = PyLong_AsLong(opc);
	if (code == -1 && PyErr_Occurred())
		return -1;
	if (code != NVIO_OP_READ && code != NVIO_OP_WRITE) {
		PyErr_Format(PyExc_ValueError, "nvio: op %zd: opcode must be OP_READ or "
			     "OP_WRITE, not %ld", idx, code);
		return -1;
	}
	int ok = PyObject_TypeCheck(fo, (PyTypeObject *)st->file_type);
	if (!ok) {
		PyErr_Format(PyExc_TypeError, "nvio: op %zd: file must be an nvio File", idx);
		return -1;
	}
	ext_file *file = (ext_file *)fo;
	if (file->handle != hd) {
		PyErr_Format(PyExc_ValueError, "nvio: op %zd: the file belongs to another handle", idx);
		return -1;
	}
	if (file_check_open(file) < 0)
		return -1;
	int64_t off;
	if (parse_offset(oo, &off, "offset") < 0)
		return -1;
	if (n > 5 && parse_flags(PyTuple_GetItem(item, 5), &flags) < 0)
		return -1;
	int is_write = code == NVIO_OP_WRITE;
	ext_tag *t = PyMem_Calloc(1, sizeof(*t));
	if (!t) {
		PyErr_NoMemory();
		return -1;
	}
	memset(op, 0, sizeof(*op));
	if (is_vector(bo)) {
		uint64_t total;
		if (off < 0 && off != NVIO_OFFSET_PER_IOV) {
			PyErr_Format(PyExc_ValueError, "nvio: op %zd: offset must be >= 0 or "
				     "OFFSET_PER_IOV (-1), not %lld", idx, (long long)off);
			PyMem_Free(t);
			return -1;
		}
		if (borrow_vector(st, bo, off == NVIO_OFFSET_PER_IOV, !is_write, 1, &t->bufs,
				  &t->iov, &t->nbufs, &total) < 0) {
			PyMem_Free(t);
			return -1;
		}
		op->iov = t->iov;
		op->iovcnt = t->nbufs;
	} else {
		t->bufs = PyMem_Calloc(1, sizeof(*t->bufs));
		if (!t->bufs) {
			PyMem_Free(t);
			PyErr_NoMemory();
			return -1;
		}
		if (borrow(st, bo, !is_write, 1, &t->bufs[0]) < 0) {
			PyMem_Free(t->bufs);
			PyMem_Free(t);
			return -1;
		}
		t->nbufs = 1;
		op->buf = t->bufs[0].ptr;
		op->nbytes = t->bufs[0].nbytes;
	}
	op->opcode = (uint32_t)code;
	op->flags = flags;
	op->file = file->f;
	op->offset = off;
	t->is_write = is_write;
	t->user = Py_NewRef(uo);
	t->file = (ext_file *)Py_NewRef(fo);
	*tag_out = t;
	return 0;
}

PyObject *ext_h_submit(PyObject *s, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "", "pending", NULL };
	ext_handle *hd = (ext_handle *)s;
	ext_state *st = ext_handle_state(hd);
	PyObject *arg, *pending = Py_None;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O:submit", kwlist, &arg, &pending))
		return NULL;
	if (pending == Py_None)
		pending = NULL;
	else if (!PySet_Check(pending)) {
		PyErr_SetString(PyExc_TypeError, "nvio: submit's pending must be a set or None");
		return NULL;
	}
	if (ext_handle_check_open(hd) < 0)
		return NULL;
	PyObject *tup = PySequence_Tuple(arg);
	if (!tup)
		return NULL;
	Py_ssize_t n = PyTuple_Size(tup), parsed = 0, added = 0;
	if (n > UINT32_MAX) {
		Py_DECREF(tup);
		PyErr_SetString(PyExc_ValueError, "nvio: too many ops in one submit");
		return NULL;
	}
	if (n == 0) {
		Py_DECREF(tup);
		return PyLong_FromLong(0);
	}
	nvio_op_t *ops = PyMem_Calloc((size_t)n, sizeof(*ops));
	ext_tag **tags = PyMem_Calloc((size_t)n, sizeof(*tags));
	PyObject *res = NULL;
	int rc = 0;
	if (!ops || !tags) {
		PyErr_NoMemory();
		goto out;
	}
	for (; parsed < n; parsed++)
		if (parse_op(st, hd, PyTuple_GetItem(tup, parsed), parsed, &ops[parsed],
			     &tags[parsed]) < 0)
			goto out;
	/* Parsing ran Python code: the handle or a file may have closed. */
	if (ext_handle_check_open(hd) < 0)
		goto out;
	for (Py_ssize_t i = 0; i < n; i++) {
		if (!tags[i]->file->f) {
			PyErr_Format(PyExc_ValueError, "nvio: op %zd: the file was closed", i);
			goto out;
		}
		ops[i].file = tags[i]->file->f;
	}
	/* Registered before submitting: another thread may reap at once. */
	for (; added < n; added++)
		if (tags_add(&hd->tags, tags[added], &ops[added].user_data) < 0)
			goto out;
	/*
	 * The caller's set of ops in flight gets them here, in C, where no
	 * signal handler runs: a KeyboardInterrupt between a Python-side
	 * registration and this call would leave a token that no op will
	 * ever complete (a reaper spinning, a drain() that never ends).
	 */
	for (Py_ssize_t i = 0; pending && i < n; i++)
		if (PySet_Add(pending, tags[i]->user) < 0) {
			for (Py_ssize_t k = 0; k < i; k++)
				(void)PySet_Discard(pending, tags[k]->user);
			goto out;
		}
	nvio_handle_t *h = hd->h;
	hd->busy++;
	Py_BEGIN_ALLOW_THREADS
	rc = nvio_submit(h, ops, (unsigned)n);
	Py_END_ALLOW_THREADS
	hd->busy--;
	Py_ssize_t accepted = rc > 0 ? rc : 0;
	for (Py_ssize_t i = accepted; pending && i < n; i++) {
		PyObject *et, *ev, *tb;

		PyErr_Fetch(&et, &ev, &tb);	/* Discard must not eat an error */
		if (PySet_Discard(pending, tags[i]->user) < 0)
			PyErr_Clear();
		PyErr_Restore(et, ev, tb);
	}
	for (Py_ssize_t i = 0; i < accepted; i++)
		tags[i] = NULL;	/* the table owns them now */
	if (rc < 0) {
		ext_tag *t0 = tags[0];
		ext_raise_io(st, h, rc, t0->file->name, t0->file->user_fd, ops[0].offset,
			     ops[0].nbytes, t0->is_write ? "pwrite" : "pread", t0->is_write);
	} else {
		res = PyLong_FromSsize_t(accepted);
	}
out:
	/* Unregister and free what was not accepted. */
	for (Py_ssize_t i = 0; i < added; i++)
		if (tags[i])
			(void)tags_take(&hd->tags, ops[i].user_data);
	for (Py_ssize_t i = 0; tags && i < n; i++)
		tag_free(tags[i]);
	PyMem_Free(tags);
	PyMem_Free(ops);
	Py_DECREF(tup);
	return res;
}

/* (user_data, bytes or exception) for one completion; takes its tag. */
static PyObject *completion_result(ext_state *st, ext_handle *hd, const nvio_completion_t *c)
{
	ext_tag *t = tags_take(&hd->tags, c->user_data);
	if (!t) {
		PyErr_Format(PyExc_RuntimeError, "nvio: a completion with unknown tag %llu",
			     (unsigned long long)c->user_data);
		return NULL;
	}
	PyObject *r;
	if (c->res >= 0) {
		r = PyLong_FromLongLong(c->res);
		for (uint32_t i = 0; !t->is_write && i < t->nbufs; i++)
			if (t->bufs[i].storage &&	/* a torch tensor */
			    ext_torch_bump_version(st, t->bufs[i].keep) < 0) {
				/* a handler raised: this op is settled, so let the
				 * exception come at the next check, not lose it */
				if (PyErr_ExceptionMatches(PyExc_KeyboardInterrupt))
					PyErr_SetInterrupt();
				PyErr_Clear();
			}
	} else {
		nvio_error_t *e = &st->scratch_error;
		memset(e, 0, sizeof(*e));
		e->struct_size = sizeof(*e);
		nvio_completion_error(c, PyBytes_AsString(t->file->pathb), e);
		r = ext_error_from_record(st, e, t->file->name);
	}
	PyObject *pair = r ? PyTuple_Pack(2, t->user, r) : NULL;
	Py_XDECREF(r);
	tag_free(t);	/* the op has ended: its buffers may go */
	return pair;
}

PyObject *ext_h_reap(PyObject *s, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "max", "min", "timeout", NULL };
	ext_handle *hd = (ext_handle *)s;
	unsigned int mx = 64, mn = 0;
	PyObject *to = Py_None;
	int64_t timeout_ns = -1;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "|IIO:reap", kwlist, &mx, &mn, &to))
		return NULL;
	if (to != Py_None) {
		double t = PyFloat_AsDouble(to);
		if (t == -1.0 && PyErr_Occurred())
			return NULL;
		if (!(t >= 0)) {
			PyErr_SetString(PyExc_ValueError, "nvio: timeout must be >= 0 or None");
			return NULL;
		}
		timeout_ns = t > 9e9 ? INT64_MAX : (int64_t)(t * 1e9);
	}
	if (mx == 0 || mn > mx) {
		PyErr_Format(PyExc_ValueError, "nvio: reap needs 0 <= min <= max and max > 0 "
			     "(max=%u, min=%u)", mx, mn);
		return NULL;
	}
	if (ext_handle_check_open(hd) < 0)
		return NULL;
	/* The user's ops not yet returned: in flight or in the backlog. */
	uint32_t mine = nvio_inflight(hd->h) - hd->internal_inflight + (uint32_t)hd->nbacklog;
	if (mn > mine)	/* never wait for ops nobody submitted */
		mn = mine;
	struct timespec t0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	/*
	 * Reap in slices: a blocking call on another thread may take the
	 * user's completions into the backlog meanwhile, and signal handlers
	 * run between slices.
	 */
	for (;;) {
		if (hd->nbacklog && hd->nbacklog >= mn)
			break;
		int64_t left = -1;
		if (timeout_ns >= 0) {
			struct timespec t1;
			clock_gettime(CLOCK_MONOTONIC, &t1);
			int64_t spent = (int64_t)(t1.tv_sec - t0.tv_sec) * 1000000000ll +
					(t1.tv_nsec - t0.tv_nsec);
			left = timeout_ns - spent;
			if (left < 0)
				left = 0;
		}
		int64_t slice = left < 0 || left > EXT_SLICE_NS ? EXT_SLICE_NS : left;
		unsigned need = mn > hd->nbacklog ? mn - (unsigned)hd->nbacklog : 0;
		if (backlog_reserve(hd, EXT_REAP_BATCH) < 0)
			return NULL;
		if (ext_handle_check_open(hd) < 0)
			return NULL;
		hd->busy++;
		int rc = reap_slice(hd, mx < EXT_REAP_BATCH ? EXT_REAP_BATCH : mx,
				    need, need ? slice : 0);
		hd->busy--;
		if (rc < 0)
			return ext_raise_plain(ext_handle_state(hd), rc, "nvio_reap");
		if (hd->nbacklog >= mn || left == 0 || (mn == 0 && rc >= 0))
			break;
		/* the user's ops left may have been taken by another thread */
		mine = nvio_inflight(hd->h) - hd->internal_inflight + (uint32_t)hd->nbacklog;
		if (mn > mine)
			mn = mine;
		if (PyErr_CheckSignals() < 0)
			return NULL;	/* what was reaped stays in the backlog */
	}
	size_t k = hd->nbacklog < mx ? hd->nbacklog : mx;
	nvio_completion_t *cs = PyMem_Malloc((k ? k : 1) * sizeof(*cs));
	if (!cs)
		return PyErr_NoMemory();
	memcpy(cs, hd->backlog, k * sizeof(*cs));
	memmove(hd->backlog, hd->backlog + k, (hd->nbacklog - k) * sizeof(*cs));
	hd->nbacklog -= k;
	ext_state *st = ext_handle_state(hd);
	PyObject *list = PyList_New((Py_ssize_t)k);
	/* Every reaped op is settled, even if building its result fails. */
	for (size_t i = 0; i < k; i++) {
		PyObject *pair = completion_result(st, hd, &cs[i]);
		if (!pair || !list) {
			Py_XDECREF(pair);
			Py_CLEAR(list);
			continue;
		}
		PyList_SetItem(list, (Py_ssize_t)i, pair);
	}
	PyMem_Free(cs);
	return list;
}

PyObject *ext_h_completion_fd(PyObject *s, PyObject *unused)
{
	ext_handle *hd = (ext_handle *)s;
	if (ext_handle_check_open(hd) < 0)
		return NULL;
	int fd = nvio_completion_fd(hd->h);
	if (fd < 0)
		return ext_raise_plain(ext_handle_state(hd), fd, "nvio_completion_fd");
	return PyLong_FromLong(fd);
}

PyObject *ext_h_get_inflight(PyObject *s, void *unused)
{
	ext_handle *hd = (ext_handle *)s;
	if (!hd->h)
		return PyLong_FromLong(0);
	return PyLong_FromUnsignedLong(nvio_inflight(hd->h) - hd->internal_inflight +
				       (uint32_t)hd->nbacklog);
}

/* ------------------------------------------------------------------ */
/* Stream                                                              */
/* ------------------------------------------------------------------ */

/*
 * A stream is used by one thread at a time (nvio_stream_open(3)); a
 * second thread arriving while one is inside a call is refused rather
 * than let into the stream's buffers at the same time.
 */
static int stream_check(ext_stream *self, int want_writer)
{
	if (!self->s || !self->file->f || !self->file->handle->h) {
		PyErr_SetString(PyExc_ValueError, "nvio: I/O operation on a closed stream");
		return -1;
	}
	if (self->busy) {
		PyErr_SetString(PyExc_RuntimeError,
				"nvio: a stream is used by one thread at a time");
		return -1;
	}
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

static PyObject *f_stream(PyObject *s, PyObject *args, PyObject *kw)
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
	if (file_check_open(self) < 0)
		return NULL;
	ext_state *st = file_state(self);
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
	return ext_raise_io(file_state(fl), fl->handle->h, (int)rc, fl->name, fl->user_fd,
			    0, n, op, self->writer);
}

/*
 * A stream copies between the caller's memory and its staging buffers
 * with memcpy, which device memory does not take: host memory only.
 */
static int stream_borrow(ext_stream *self, PyObject *obj, int writable, ext_buf *b)
{
	if (borrow(file_state(self->file), obj, writable, 0, b) < 0)
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
	ext_state *st = file_state(self->file);
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
	if (get_info(self->file, &fi) < 0)
		return NULL;
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

/* ------------------------------------------------------------------ */
/* Types                                                               */
/* ------------------------------------------------------------------ */

#define BUF_DOC "buf: an object with the buffer protocol (writable for reads), a\n" \
	"CPU or CUDA torch.Tensor, a NumPy array or a CPU DLPack producer.\n"
#define METH_KW(f) (PyCFunction)(void (*)(void))(f), METH_VARARGS | METH_KEYWORDS
#define METH_FASTKW(f) (PyCFunction)(void (*)(void))(f), METH_FASTCALL | METH_KEYWORDS

static PyMethodDef file_methods[] = {
	{ "pread", METH_FASTKW(f_pread),
	  "pread($self, buf, offset, flags=0)\n--\n\nRead len(buf) bytes at offset; returns "
	  "the bytes read.\nPast the end of the file: NvioError(ENODATA). flags: VALIDATE.\n" BUF_DOC },
	{ "pwrite", METH_FASTKW(f_pwrite),
	  "pwrite($self, buf, offset, flags=0)\n--\n\nWrite buf at offset (the file grows as "
	  "needed); returns the bytes written.\nflags: VALIDATE | FSYNC.\n" BUF_DOC },
	{ "preadv", METH_KW(f_preadv),
	  "preadv($self, bufs, offset, flags=0)\n--\n\nRead into a sequence of buffers laid end "
	  "to end from offset, or, with offset\nOFFSET_PER_IOV (-1), a sequence of (buf, offset) "
	  "pairs in increasing order.\nReturns the bytes read." },
	{ "pwritev", METH_KW(f_pwritev),
	  "pwritev($self, bufs, offset, flags=0)\n--\n\nWrite a sequence of buffers (see preadv); "
	  "returns the bytes written." },
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
	{ "stream", METH_KW(f_stream),
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

int ext_files_exec(PyObject *m, ext_state *st)
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
	st->stream_type = PyType_FromModuleAndSpec(m, &stream_spec, NULL);
	if (!st->stream_type || PyModule_AddObjectRef(m, "Stream", st->stream_type) < 0)
		return -1;
	for (size_t i = 0; i < sizeof(consts) / sizeof(consts[0]); i++)
		if (PyModule_AddObject(m, consts[i].name, PyLong_FromLongLong(consts[i].v)) < 0)
			return -1;
	return 0;
}
