/*
 * blocking.c - the blocking runner: one transfer of a blocking call
 * (File.pread/pwrite/preadv/pwritev, Handle.pread, sync_pread, read, write...) as
 * ONE op on a queue of its own, waited for in slices with the GIL
 * released, so that Python's signal handlers run while it moves.
 *
 * Why: a thread blocked inside nvio_file_pread() cannot run them, so
 * Ctrl-C waited for the whole transfer (and for torch tensors was then
 * lost in Python code that cleared it). On a signal whose handler raises
 * (KeyboardInterrupt), the op is cancelled (nvio_queue_cancel: pieces
 * not started are skipped, pieces in flight finish), waited for until it
 * has ended, so the memory is never released under the kernel, and then
 * the exception is raised.
 *
 * The queue is private to the call (made and destroyed here, a malloc):
 * nobody else reaps its completion, and the call reaps nobody else's.
 */
#include "ext.h"

#include <errno.h>
#include <string.h>

/* At most this many bytes move as one plain call in the caller's thread:
 * handing a small op to a worker and reaping it costs more than its I/O
 * (a 4 KiB read), and it ends soon enough for Ctrl-C to be seen after it. */
#define EXT_DIRECT_MAX (8ull << 20)
/* How long one wait lasts before signal handlers run. */
#define EXT_SLICE_NS 50000000ll

/* A small transfer: the plain call, GIL released. */
static int run_direct(ext_handle *hd, nvio_file_t *f, int is_write, void *ptr,
		      uint64_t n, int64_t off, unsigned flags, const nvio_iovec_t *iov,
		      uint32_t iovcnt, nvio_error_t *rec)
{
	int r;

	hd->busy++;
	Py_BEGIN_ALLOW_THREADS
	if (iov)
		r = is_write ? nvio_file_pwritev(f, iov, iovcnt, off, flags) :
			       nvio_file_preadv(f, iov, iovcnt, off, flags);
	else
		r = is_write ? nvio_file_pwrite(f, ptr, n, off, flags) :
			       nvio_file_pread(f, ptr, n, off, flags);
	Py_END_ALLOW_THREADS
	hd->busy--;
	if (r < 0)
		ext_record_of(hd->h, r, rec);
	return r < 0 ? r : 0;
}

/*
 * Waits for the one op of q into *c. Between slices, signal handlers run;
 * when one raises, the op is cancelled, *raised is set and the wait goes
 * on without further checks (the pieces in flight are bounded). Returns
 * nvio_queue_reap's result: 1, or a negative errno.
 */
static int wait_one(nvio_queue_t *q, nvio_completion_t *c, int *raised)
{
	for (;;) {
		int got;
		int64_t slice = *raised ? -1 : EXT_SLICE_NS;

		Py_BEGIN_ALLOW_THREADS
		got = nvio_queue_reap(q, c, 1, 1, slice);
		Py_END_ALLOW_THREADS
		if (got != 0)
			return got;
		if (!*raised && PyErr_CheckSignals() < 0) {
			*raised = 1;
			(void)nvio_queue_cancel(q, 1);	/* -EALREADY: it is ending */
		}
	}
}

/* Submits the op to a private queue and waits for it; see ext_run_sync. */
static int run_queued(ext_handle *hd, nvio_op_t *op, const char *path, int *raised,
		      nvio_error_t *rec)
{
	nvio_handle_t *h = hd->h;
	nvio_queue_t *q;
	nvio_completion_t c;
	int r = nvio_queue_create(h, &q, 0);

	if (r < 0) {
		ext_record_of(h, r, rec);
		return r;
	}
	hd->busy++;
	Py_BEGIN_ALLOW_THREADS
	r = nvio_queue_submit(q, op, 1);
	Py_END_ALLOW_THREADS
	if (r == 1) {
		memset(&c, 0, sizeof(c));
		r = wait_one(q, &c, raised);
		if (r == 1 && c.res < 0) {
			memset(rec, 0, sizeof(*rec));
			rec->struct_size = sizeof(*rec);
			nvio_completion_error(&c, path, rec);
			r = (int)c.res;
		} else if (r < 0) {
			ext_record_of(h, r, rec);
		}
	} else if (r <= 0) {	/* refused at submit: it never completes */
		ext_record_of(h, r < 0 ? r : -EIO, rec);
		r = r < 0 ? r : -EIO;
	}
	Py_BEGIN_ALLOW_THREADS
	(void)nvio_queue_destroy(q);	/* its op has ended */
	Py_END_ALLOW_THREADS
	hd->busy--;
	return r < 0 ? r : 0;
}

int ext_run_sync(ext_handle *hd, nvio_file_t *f, const char *path, int is_write,
		 void *ptr, uint64_t n, int64_t off, unsigned flags,
		 const nvio_iovec_t *iov, uint32_t iovcnt, nvio_error_t *rec)
{
	nvio_op_t op;
	int raised = 0, rc;

	if (n <= EXT_DIRECT_MAX)
		return run_direct(hd, f, is_write, ptr, n, off, flags, iov, iovcnt, rec);
	if (iov)
		(is_write ? nvio_prep_writev : nvio_prep_readv)(&op, f, iov, iovcnt, off, 1);
	else
		nvio_prep_rw(&op, is_write ? NVIO_OP_WRITE : NVIO_OP_READ, f, ptr, n, off, 1);
	op.flags = flags;
	rc = run_queued(hd, &op, path, &raised, rec);
	return raised ? EXT_RAISED : rc;
}
