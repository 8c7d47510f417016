/*
 * tagged.c - tagged ops on a completion queue: parsing op tuples,
 * submit, reap, and the Queue type (Handle.queue()).
 *
 * A queue belongs to one consumer (libnvio 0.3's nvio_queue): the
 * Handle's default queue is the user's (Handle.submit/reap), each Queue
 * object is whoever made it (the futures layer makes its own), and the
 * blocking runner (blocking.c) uses private ones. Nobody reaps, or
 * sorts, another consumer's completions.
 *
 * Contracts:
 *   - A tagged op borrows every buffer it names, and holds its File and
 *     its user_data, in a slot of its queue's table (ext_tags) whose
 *     index + 1 is the C user_data. reap() empties the slot after the op
 *     has ended; closing the queue (or the handle) empties the rest after
 *     libnvio has waited for every op. A slot is never reused before its
 *     op ended.
 *   - reap() waits in slices with the GIL released; signal handlers run
 *     between slices, and what an interrupted reap() took is kept for
 *     the next one (ext_cq.kept): no completion is lost.
 *   - Several threads may reap one queue at once (the futures' reaper
 *     waits while a thread asking a future done() takes what has ended
 *     meanwhile): ext_cq.kept is touched with the GIL held only; each
 *     completion goes to exactly one of them.
 */
#include "ext.h"

#include <errno.h>
#include <string.h>
#include <time.h>

/* What one tagged op borrows until it is reaped. */
struct ext_tag {
	PyObject *user;		/* user_data, strong */
	ext_file *file;		/* strong */
	ext_buf *bufs;
	uint32_t nbufs;
	nvio_iovec_t *iov;	/* a vector's, else NULL */
	int is_write;
	int has_crc;
	ext_buf crc;		/* the op's crc32 array, writable */
};

/* A Queue object: a queue of its own on a handle. */
struct ext_queue {
	PyObject_HEAD
	ext_handle *handle;	/* borrowed; NULL once closed (the handle detaches it) */
	PyObject *module;	/* strong: the state, for errors */
	ext_cq cq;
	int busy;		/* calls running without the GIL */
	ext_queue *next, **pprev;	/* in handle->queues while open */
};

#define EXT_SLICE_NS 50000000ll

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
	if (t->has_crc)
		ext_buf_release(&t->crc);
	Py_XDECREF(t->user);
	Py_XDECREF((PyObject *)t->file);
	PyMem_Free(t);
}

/* Room for one more slot; -1 on MemoryError. */
static int tags_grow(ext_tags *ts)
{
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
	return 0;
}

/* Puts t in a free slot; its C user_data (index + 1) in *ud. -1 on MemoryError. */
static int tags_add(ext_tags *ts, ext_tag *t, uint64_t *ud)
{
	size_t i;

	if (ts->nfree) {
		i = ts->free[--ts->nfree];
	} else {
		if (ts->used == ts->cap && tags_grow(ts) < 0)
			return -1;
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

void ext_cq_release(ext_cq *cq)
{
	ext_tags *ts = &cq->tags;

	/* Detach each before freeing: freeing may run Python code. */
	for (size_t i = 0; i < ts->used; i++)
		tag_free(tags_take(ts, (uint64_t)i + 1));
	PyMem_Free(ts->slot);
	PyMem_Free(ts->free);
	memset(ts, 0, sizeof(*ts));
	PyMem_Free(cq->kept);
	cq->kept = NULL;
	cq->nkept = cq->capkept = 0;
	cq->q = NULL;
}

uint32_t ext_cq_inflight(const ext_cq *cq)
{
	return cq->q ? nvio_queue_inflight(cq->q) + (uint32_t)cq->nkept : 0;
}

/* ------------------------------------------------------------------ */
/* Parsing an op tuple                                                 */
/* ------------------------------------------------------------------ */

/* The buffer (or vector) of an op into t and op. 0, or -1 with an exception. */
static int parse_op_buf(ext_state *st, PyObject *bo, int64_t off, Py_ssize_t idx,
			ext_tag *t, nvio_op_t *op)
{
	if (PyList_Check(bo) || PyTuple_Check(bo)) {
		uint64_t total;
		if (off < 0 && off != NVIO_OFFSET_PER_IOV) {
			PyErr_Format(PyExc_ValueError, "nvio: op %zd: offset must be >= 0 or "
				     "OFFSET_PER_IOV (-1), not %lld", idx, (long long)off);
			return -1;
		}
		if (ext_borrow_vector(st, bo, off == NVIO_OFFSET_PER_IOV, !t->is_write, 1,
				      &t->bufs, &t->iov, &t->nbufs, &total) < 0)
			return -1;
		op->iov = t->iov;
		op->iovcnt = t->nbufs;
		return 0;
	}
	t->bufs = PyMem_Calloc(1, sizeof(*t->bufs));
	if (!t->bufs) {
		PyErr_NoMemory();
		return -1;
	}
	if (ext_borrow(st, bo, !t->is_write, 1, &t->bufs[0]) < 0) {
		PyMem_Free(t->bufs);
		t->bufs = NULL;
		return -1;
	}
	t->nbufs = 1;
	op->buf = t->bufs[0].ptr;
	op->nbytes = t->bufs[0].nbytes;
	return 0;
}

/* The opcode and the file of op tuple idx. 0, or -1 with an exception. */
static int parse_op_file(ext_state *st, ext_handle *hd, PyObject *opc, PyObject *fo,
			 Py_ssize_t idx, long *code)
{
	*code = PyLong_AsLong(opc);
	if (*code == -1 && PyErr_Occurred())
		return -1;
	if (*code != NVIO_OP_READ && *code != NVIO_OP_WRITE) {
		PyErr_Format(PyExc_ValueError, "nvio: op %zd: opcode must be OP_READ or "
			     "OP_WRITE, not %ld", idx, *code);
		return -1;
	}
	if (!PyObject_TypeCheck(fo, (PyTypeObject *)st->file_type)) {
		PyErr_Format(PyExc_TypeError, "nvio: op %zd: file must be an nvio File", idx);
		return -1;
	}
	if (((ext_file *)fo)->handle != hd) {
		PyErr_Format(PyExc_ValueError, "nvio: op %zd: the file belongs to another handle", idx);
		return -1;
	}
	return ext_file_check_open((ext_file *)fo);
}

/*
 * An op's crc32 array (None: none): a writable buffer of at least one
 * uint32 per buffer of the op, 4-byte aligned, into t and op. 0, or -1
 * with an exception.
 */
static int parse_op_crc(ext_state *st, PyObject *co, Py_ssize_t idx, ext_tag *t,
			nvio_op_t *op)
{
	uint64_t want = 4ull * (op->iov ? op->iovcnt : 1);
	if (co == Py_None)
		return 0;
	if (!PyObject_CheckBuffer(co)) {
		PyErr_Format(PyExc_TypeError, "nvio: op %zd: crc32 must be a writable buffer "
			     "(array('I'), bytearray) or None", idx);
		return -1;
	}
	if (ext_buf_get(st, co, 1, &t->crc) < 0)
		return -1;
	t->has_crc = 1;
	if (t->crc.nbytes < want || (uintptr_t)t->crc.ptr % 4) {
		PyErr_Format(PyExc_ValueError, "nvio: op %zd: crc32 must hold %llu bytes (one "
			     "uint32 per buffer), 4-byte aligned; it has %llu at %p", idx,
			     (unsigned long long)want, (unsigned long long)t->crc.nbytes,
			     t->crc.ptr);
		return -1;
	}
	op->crc32 = t->crc.ptr;
	return 0;
}

/* Parses one op tuple into *op and a new tag. 0, or -1 with an exception. */
static int parse_op(ext_state *st, ext_handle *hd, PyObject *item, Py_ssize_t idx,
		    nvio_op_t *op, ext_tag **tag_out)
{
	Py_ssize_t n = PyTuple_Check(item) ? PyTuple_Size(item) : -1;
	if (n < 4 || n > 7) {
		PyErr_Format(PyExc_TypeError, "nvio: op %zd must be a tuple (opcode, file, buf, "
			     "offset[, user_data[, flags[, crc32]]])", idx);
		return -1;
	}
	PyObject *fo = PyTuple_GetItem(item, 1);
	PyObject *uo = n > 4 ? PyTuple_GetItem(item, 4) : Py_None;
	unsigned flags = 0;
	long code;
	int64_t off;
	if (parse_op_file(st, hd, PyTuple_GetItem(item, 0), fo, idx, &code) < 0 ||
	    ext_parse_offset(PyTuple_GetItem(item, 3), &off) < 0 ||
	    (n > 5 && ext_parse_flags(PyTuple_GetItem(item, 5), &flags) < 0))
		return -1;
	ext_tag *t = PyMem_Calloc(1, sizeof(*t));
	if (!t) {
		PyErr_NoMemory();
		return -1;
	}
	memset(op, 0, sizeof(*op));
	t->is_write = code == NVIO_OP_WRITE;
	if (parse_op_buf(st, PyTuple_GetItem(item, 2), off, idx, t, op) < 0) {
		PyMem_Free(t);
		return -1;
	}
	if (n > 6 && parse_op_crc(st, PyTuple_GetItem(item, 6), idx, t, op) < 0) {
		tag_free(t);
		return -1;
	}
	op->opcode = (uint32_t)code;
	op->flags = flags;
	op->file = ((ext_file *)fo)->f;
	op->offset = off;
	t->user = Py_NewRef(uo);
	t->file = (ext_file *)Py_NewRef(fo);
	*tag_out = t;
	return 0;
}

/* ------------------------------------------------------------------ */
/* Submit                                                              */
/* ------------------------------------------------------------------ */

/*
 * Parses the n ops of tup into ops and tags, then checks that the handle
 * and every file are still open (parsing ran Python code). 0, or -1 with
 * an exception set (the tags parsed stay in tags, for the caller to free).
 */
static int submit_parse(ext_state *st, ext_handle *hd, PyObject *tup, Py_ssize_t n,
			nvio_op_t *ops, ext_tag **tags)
{
	for (Py_ssize_t i = 0; i < n; i++)
		if (parse_op(st, hd, PyTuple_GetItem(tup, i), i, &ops[i], &tags[i]) < 0)
			return -1;
	if (ext_handle_check_open(hd) < 0)
		return -1;
	for (Py_ssize_t i = 0; i < n; i++) {
		if (!tags[i]->file->f) {
			PyErr_Format(PyExc_ValueError, "nvio: op %zd: the file was closed", i);
			return -1;
		}
		ops[i].file = tags[i]->file->f;
	}
	return 0;
}

/*
 * The caller's set of ops in flight gets them here, in C, where no signal
 * handler runs: a KeyboardInterrupt between a Python-side registration
 * and the submit would leave a token that no op will ever complete (a
 * reaper spinning, a drain() that never ends). 0, or -1 (none added).
 */
static int pending_add(PyObject *pending, ext_tag **tags, Py_ssize_t n)
{
	for (Py_ssize_t i = 0; pending && i < n; i++)
		if (PySet_Add(pending, tags[i]->user) < 0) {
			for (Py_ssize_t k = 0; k < i; k++)
				(void)PySet_Discard(pending, tags[k]->user);
			return -1;
		}
	return 0;
}

/* Takes the refused ops [from, n) out of pending, keeping any error set. */
static void pending_drop(PyObject *pending, ext_tag **tags, Py_ssize_t from, Py_ssize_t n)
{
	for (Py_ssize_t i = from; pending && i < n; i++) {
		PyObject *et, *ev, *tb;

		PyErr_Fetch(&et, &ev, &tb);	/* Discard must not eat an error */
		if (PySet_Discard(pending, tags[i]->user) < 0)
			PyErr_Clear();
		PyErr_Restore(et, ev, tb);
	}
}

/*
 * Registers the parsed ops, submits them to cq's queue, and hands the
 * accepted ones' tags to the table (tags[i] = NULL). The count accepted,
 * or NULL with an exception set.
 */
static PyObject *submit_run(ext_state *st, ext_handle *hd, ext_cq *cq, PyObject *pending,
			    nvio_op_t *ops, ext_tag **tags, Py_ssize_t n)
{
	Py_ssize_t added = 0, accepted = 0;
	PyObject *res = NULL;
	int rc;

	/* Registered before submitting: another thread may reap at once. */
	for (; added < n; added++)
		if (tags_add(&cq->tags, tags[added], &ops[added].user_data) < 0)
			goto out;
	if (pending_add(pending, tags, n) < 0)
		goto out;
	nvio_queue_t *q = cq->q;
	hd->busy++;
	Py_BEGIN_ALLOW_THREADS
	rc = nvio_queue_submit(q, ops, (unsigned)n);
	Py_END_ALLOW_THREADS
	hd->busy--;
	accepted = rc > 0 ? rc : 0;
	pending_drop(pending, tags, accepted, n);
	if (rc < 0) {
		ext_tag *t0 = tags[0];
		ext_raise_io(st, hd->h, rc, t0->file->name, t0->file->user_fd, ops[0].offset,
			     ops[0].nbytes, t0->is_write ? "pwrite" : "pread", t0->is_write);
	} else {
		res = PyLong_FromSsize_t(accepted);
	}
out:
	/* Unregister what was not accepted (the caller frees it). */
	for (Py_ssize_t i = 0; i < added; i++)
		if (i < accepted)
			tags[i] = NULL;	/* the table owns it now */
		else
			(void)tags_take(&cq->tags, ops[i].user_data);
	return res;
}

PyObject *ext_cq_submit(ext_handle *hd, ext_cq *cq, PyObject *arg, PyObject *pending)
{
	ext_state *st = ext_handle_state(hd);

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
	Py_ssize_t n = PyTuple_Size(tup);
	if (n > UINT32_MAX || n == 0) {
		Py_DECREF(tup);
		if (n == 0)
			return PyLong_FromLong(0);
		PyErr_SetString(PyExc_ValueError, "nvio: too many ops in one submit");
		return NULL;
	}
	nvio_op_t *ops = PyMem_Calloc((size_t)n, sizeof(*ops));
	ext_tag **tags = PyMem_Calloc((size_t)n, sizeof(*tags));
	PyObject *res = NULL;
	if (!ops || !tags)
		PyErr_NoMemory();
	else if (submit_parse(st, hd, tup, n, ops, tags) == 0)
		res = submit_run(st, hd, cq, pending, ops, tags, n);
	for (Py_ssize_t i = 0; tags && i < n; i++)
		tag_free(tags[i]);	/* those not accepted */
	PyMem_Free(tags);
	PyMem_Free(ops);
	Py_DECREF(tup);
	return res;
}

/* ------------------------------------------------------------------ */
/* Reap                                                                */
/* ------------------------------------------------------------------ */

/* (user_data, bytes or exception) for one completion; takes its tag. */
static PyObject *completion_result(ext_state *st, ext_cq *cq, const nvio_completion_t *c)
{
	ext_tag *t = tags_take(&cq->tags, c->user_data);
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

/* Room for `more` completions in cq->kept; -1 with MemoryError. */
static int kept_reserve(ext_cq *cq, size_t more)
{
	if (cq->capkept - cq->nkept >= more)
		return 0;
	size_t cap = cq->capkept ? cq->capkept : 64;
	while (cap - cq->nkept < more)
		cap *= 2;
	nvio_completion_t *b = PyMem_Realloc(cq->kept, cap * sizeof(*b));
	if (!b) {
		PyErr_NoMemory();
		return -1;
	}
	cq->kept = b;
	cq->capkept = cap;
	return 0;
}

/* Nanoseconds left of timeout_ns since t0 (-1: no limit). */
static int64_t time_left(const struct timespec *t0, int64_t timeout_ns)
{
	struct timespec t1;

	if (timeout_ns < 0)
		return -1;
	clock_gettime(CLOCK_MONOTONIC, &t1);
	int64_t left = timeout_ns - ((int64_t)(t1.tv_sec - t0->tv_sec) * 1000000000ll +
				     (t1.tv_nsec - t0->tv_nsec));
	return left < 0 ? 0 : left;
}

/*
 * Reaps into cq->kept until it holds min (capped at the ops in flight:
 * never wait for ops nobody submitted) or the timeout passed, in slices
 * with the GIL released. 0, or -1 with an exception set (what was reaped
 * stays kept).
 *
 * cq->kept is touched with the GIL held only, so that another thread may
 * reap the same queue meanwhile. A slice that waits reaps into a buffer
 * of its own with the GIL released, and appends it to kept when it has
 * the GIL back: into room reserved in kept beforehand (cq->reserved
 * counts every waiting slice's), so that appending needs no allocation
 * that could fail with completions in hand. A call that need not wait
 * (min 0, timeout 0, or nothing in flight) reaps straight into kept and
 * keeps the GIL: it only takes the queue's lock.
 */
static int reap_collect(ext_handle *hd, ext_cq *cq, unsigned mx, unsigned mn,
			int64_t timeout_ns)
{
	struct timespec t0;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		uint32_t mine = ext_cq_inflight(cq);
		unsigned need = mn < mine ? mn : mine;
		need = need > cq->nkept ? need - (unsigned)cq->nkept : 0;
		if (cq->nkept && !need)
			return 0;
		int64_t left = time_left(&t0, timeout_ns);
		int64_t slice = left < 0 || left > EXT_SLICE_NS ? EXT_SLICE_NS : left;
		unsigned room = mx > cq->nkept ? mx - (unsigned)cq->nkept : 1;
		if (!slice)
			need = 0;
		if (kept_reserve(cq, cq->reserved + room) < 0 || ext_handle_check_open(hd) < 0)
			return -1;
		nvio_queue_t *q = cq->q;
		int got;
		if (!need) {
			got = nvio_queue_reap(q, cq->kept + cq->nkept, room, 0, 0);
		} else {
			nvio_completion_t *own = PyMem_Malloc(room * sizeof(*own));
			if (!own) {
				PyErr_NoMemory();
				return -1;
			}
			cq->reserved += room;
			hd->busy++;
			Py_BEGIN_ALLOW_THREADS
			got = nvio_queue_reap(q, own, room, need, slice);
			Py_END_ALLOW_THREADS
			hd->busy--;
			cq->reserved -= room;
			if (got > 0)	/* fits: the room was reserved */
				memcpy(cq->kept + cq->nkept, own, (size_t)got * sizeof(*own));
			PyMem_Free(own);
		}
		if (got < 0) {
			ext_raise_plain(ext_handle_state(hd), got, "nvio_reap");
			return -1;
		}
		cq->nkept += (size_t)got;
		if (!need || (size_t)got >= need || left == 0)
			return 0;
		if (PyErr_CheckSignals() < 0)
			return -1;
	}
}

/* Up to mx kept completions as a list of results, oldest first. */
static PyObject *reap_results(ext_state *st, ext_cq *cq, unsigned mx)
{
	size_t k = cq->nkept < mx ? cq->nkept : mx;
	nvio_completion_t *cs = PyMem_Malloc((k ? k : 1) * sizeof(*cs));
	if (!cs)
		return PyErr_NoMemory();
	memcpy(cs, cq->kept, k * sizeof(*cs));
	memmove(cq->kept, cq->kept + k, (cq->nkept - k) * sizeof(*cs));
	cq->nkept -= k;
	PyObject *list = PyList_New((Py_ssize_t)k);
	/* Every reaped op is settled, even if building its result fails. */
	for (size_t i = 0; i < k; i++) {
		PyObject *pair = completion_result(st, cq, &cs[i]);
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

/* reap()'s arguments; 0, or -1 with an exception set. */
static int reap_args(PyObject *args, PyObject *kw, unsigned *mx, unsigned *mn,
		     int64_t *timeout_ns)
{
	static char *kwlist[] = { "max", "min", "timeout", NULL };
	PyObject *to = Py_None;

	*mx = 64;
	*mn = 0;
	*timeout_ns = -1;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "|IIO:reap", kwlist, mx, mn, &to))
		return -1;
	if (to != Py_None) {
		double t = PyFloat_AsDouble(to);
		if (t == -1.0 && PyErr_Occurred())
			return -1;
		if (!(t >= 0)) {
			PyErr_SetString(PyExc_ValueError, "nvio: timeout must be >= 0 or None");
			return -1;
		}
		*timeout_ns = t > 9e9 ? INT64_MAX : (int64_t)(t * 1e9);
	}
	if (*mx == 0 || *mn > *mx) {
		PyErr_Format(PyExc_ValueError, "nvio: reap needs 0 <= min <= max and max > 0 "
			     "(max=%u, min=%u)", *mx, *mn);
		return -1;
	}
	return 0;
}

PyObject *ext_cq_reap(ext_handle *hd, ext_cq *cq, PyObject *args, PyObject *kw)
{
	unsigned mx, mn;
	int64_t timeout_ns;

	if (reap_args(args, kw, &mx, &mn, &timeout_ns) < 0 ||
	    ext_handle_check_open(hd) < 0 ||
	    reap_collect(hd, cq, mx, mn, timeout_ns) < 0)
		return NULL;
	return reap_results(ext_handle_state(hd), cq, mx);
}

/* ------------------------------------------------------------------ */
/* Queue                                                               */
/* ------------------------------------------------------------------ */

static void queue_unlink(ext_queue *self)
{
	if (!self->pprev)
		return;
	*self->pprev = self->next;
	if (self->next)
		self->next->pprev = self->pprev;
	self->next = NULL;
	self->pprev = NULL;
}

/*
 * Destroys the C queue (waiting for its ops), then drops their borrows.
 * With the GIL held a queue still linked has a live handle (a closing
 * handle detaches its queues first, ext_queues_detach): it is held for
 * the wait, and counts it as busy.
 */
static void queue_close_now(ext_queue *self)
{
	ext_handle *hd = self->handle;
	nvio_queue_t *q = self->cq.q;

	if (!hd)
		return;	/* closed, or its handle's close releases it */
	/*
	 * A handle whose count is 0 is being deallocated: a subclass's
	 * instance dict (AioHandle's) is dropped before Handle's dealloc
	 * runs, and it may hold this queue. Its C state is whole until then,
	 * but a reference taken now would be the second dealloc's, so none
	 * is taken.
	 */
	int dying = Py_REFCNT((PyObject *)hd) == 0;

	queue_unlink(self);
	self->handle = NULL;
	if (!dying)
		Py_INCREF((PyObject *)hd);
	hd->busy++;
	Py_BEGIN_ALLOW_THREADS
	(void)nvio_queue_destroy(q);	/* -ECHILD after fork: the parent's */
	Py_END_ALLOW_THREADS
	hd->busy--;
	ext_cq_release(&self->cq);
	if (!dying)
		Py_DECREF((PyObject *)hd);
}

ext_queue *ext_queues_detach(ext_handle *hd)
{
	ext_queue *list = hd->queues;

	hd->queues = NULL;
	for (ext_queue *x = list; x; x = x->next) {
		x->handle = NULL;	/* closed for everyone from now on */
		x->pprev = NULL;
		Py_INCREF((PyObject *)x);
	}
	return list;
}

void ext_queues_release(ext_queue *list)
{
	while (list) {
		ext_queue *x = list;

		list = x->next;
		x->next = NULL;
		ext_cq_release(&x->cq);	/* libnvio freed the C queue with the handle */
		Py_DECREF((PyObject *)x);
	}
}

PyObject *ext_queue_new(ext_handle *hd)
{
	ext_state *st = ext_handle_state(hd);
	nvio_queue_t *q;

	if (ext_handle_check_open(hd) < 0)
		return NULL;
	int rc = nvio_queue_create(hd->h, &q, 0);
	if (rc < 0)
		return ext_raise_plain(st, rc, "nvio_queue_create");
	allocfunc alloc = (allocfunc)PyType_GetSlot((PyTypeObject *)st->queue_type, Py_tp_alloc);
	ext_queue *self = (ext_queue *)alloc((PyTypeObject *)st->queue_type, 0);
	if (!self) {
		(void)nvio_queue_destroy(q);	/* nothing submitted to it */
		return NULL;
	}
	self->module = Py_NewRef(hd->module);
	self->handle = hd;
	self->cq.q = q;
	self->next = hd->queues;
	if (hd->queues)
		hd->queues->pprev = &self->next;
	hd->queues = self;
	self->pprev = &hd->queues;
	return (PyObject *)self;
}

/* The queue's handle, with a reference for the call (a reap must not
 * see it freed under it); NULL with ValueError once closed. */
static ext_handle *queue_enter(ext_queue *self)
{
	/* count 0: its dealloc runs (see queue_close_now); closed for us */
	if (!self->handle || !self->handle->h || Py_REFCNT((PyObject *)self->handle) == 0) {
		PyErr_SetString(PyExc_ValueError, "nvio: I/O operation on a closed queue");
		return NULL;
	}
	Py_INCREF((PyObject *)self->handle);
	self->busy++;
	return self->handle;
}

static void queue_leave(ext_queue *self, ext_handle *hd)
{
	self->busy--;
	Py_DECREF((PyObject *)hd);
}

static PyObject *q_submit(PyObject *s, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "", "pending", NULL };
	ext_queue *self = (ext_queue *)s;
	PyObject *ops, *pending = Py_None;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O:submit", kwlist, &ops, &pending))
		return NULL;
	ext_handle *hd = queue_enter(self);
	if (!hd)
		return NULL;
	PyObject *r = ext_cq_submit(hd, &self->cq, ops, pending);
	queue_leave(self, hd);
	return r;
}

static PyObject *q_reap(PyObject *s, PyObject *args, PyObject *kw)
{
	ext_queue *self = (ext_queue *)s;
	ext_handle *hd = queue_enter(self);
	if (!hd)
		return NULL;
	PyObject *r = ext_cq_reap(hd, &self->cq, args, kw);
	queue_leave(self, hd);
	return r;
}

static PyObject *q_completion_fd(PyObject *s, PyObject *unused)
{
	ext_queue *self = (ext_queue *)s;
	ext_handle *hd = queue_enter(self);
	if (!hd)
		return NULL;
	int fd = nvio_queue_fd(self->cq.q);
	queue_leave(self, hd);
	if (fd < 0)
		return ext_raise_plain(ext_state_of(self->module), fd, "nvio_queue_fd");
	return PyLong_FromLong(fd);
}

static PyObject *q_close(PyObject *s, PyObject *unused)
{
	ext_queue *self = (ext_queue *)s;
	if (self->busy) {
		PyErr_SetString(PyExc_RuntimeError,
				"nvio: cannot close a queue while another thread is using it");
		return NULL;
	}
	queue_close_now(self);
	Py_RETURN_NONE;
}

static PyObject *q_get_inflight(PyObject *s, void *unused)
{
	ext_queue *self = (ext_queue *)s;
	return PyLong_FromUnsignedLong(self->handle ? ext_cq_inflight(&self->cq) : 0);
}

static PyObject *q_get_closed(PyObject *s, void *unused)
{
	ext_queue *self = (ext_queue *)s;
	return PyBool_FromLong(!self->handle || !self->handle->h);
}

static void queue_dealloc(PyObject *o)
{
	ext_queue *self = (ext_queue *)o;
	PyTypeObject *tp = Py_TYPE(o);
	queue_close_now(self);	/* waits for its ops: their buffers are borrowed */
	Py_CLEAR(self->module);
	freefunc fr = (freefunc)PyType_GetSlot(tp, Py_tp_free);
	fr(o);
	Py_DECREF(tp);
}

static PyObject *queue_new_refused(PyTypeObject *t, PyObject *a, PyObject *k)
{
	PyErr_SetString(PyExc_TypeError, "nvio: make a Queue with Handle.queue()");
	return NULL;
}

#define METH_KW(f) (PyCFunction)(void (*)(void))(f), METH_VARARGS | METH_KEYWORDS

static PyMethodDef queue_methods[] = {
	{ "submit", METH_KW(q_submit),
	  "submit($self, ops, /, pending=None)\n--\n\nHandle.submit on this queue: its ops "
	  "complete here and nowhere else." },
	{ "reap", METH_KW(q_reap),
	  "reap($self, max=64, min=0, timeout=None)\n--\n\nHandle.reap on this queue." },
	{ "completion_fd", q_completion_fd, METH_NOARGS,
	  "completion_fd($self)\n--\n\nAn eventfd readable while this queue's completions "
	  "wait to be reaped." },
	{ "close", q_close, METH_NOARGS,
	  "close($self)\n--\n\nWait for the queue's ops, drop the completions not reaped "
	  "(and what\ntheir ops borrowed), free the queue. Idempotent." },
	{ NULL, NULL, 0, NULL }
};

static PyGetSetDef queue_getset[] = {
	{ "inflight", q_get_inflight, NULL,
	  "Ops accepted by submit() and not yet returned by reap().", NULL },
	{ "closed", q_get_closed, NULL, "True once it (or its handle) is closed.", NULL },
	{ NULL, NULL, NULL, NULL, NULL }
};

static PyType_Slot queue_slots[] = {
	{ Py_tp_new, queue_new_refused },
	{ Py_tp_dealloc, queue_dealloc },
	{ Py_tp_methods, queue_methods },
	{ Py_tp_getset, queue_getset },
	{ Py_tp_doc, "A completion queue of a Handle (nvio_queue_create) with one consumer:\n"
		     "ops submitted to it complete on it only. Made by Handle.queue()." },
	{ 0, NULL }
};

static PyType_Spec queue_spec = {
	"nvio._nvio.Queue", sizeof(ext_queue), 0, Py_TPFLAGS_DEFAULT, queue_slots
};

int ext_tagged_exec(PyObject *m, ext_state *st)
{
	st->queue_type = PyType_FromModuleAndSpec(m, &queue_spec, NULL);
	if (!st->queue_type || PyModule_AddObjectRef(m, "Queue", st->queue_type) < 0)
		return -1;
	return 0;
}
