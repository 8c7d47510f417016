/*
 * workers.c - the worker threads of a handle.
 *
 * Each worker owns an engine context, a staging pool and its slots,
 * one per request prepared or in flight (nvio__worker_slots). It takes
 * tasks (runs of an op's pieces) from its queue in order and keeps its
 * slots busy with pieces from as many queued tasks as needed, so small
 * ops overlap too. Pieces of an op that has failed are not issued.
 *
 * overlap_events = 1: sliding window; refill as soon as any request
 *   completes.
 * overlap_events = 0: batch at a time; submit up to queue_depth
 *   requests, wait for all of them, then the next batch, which was
 *   prepared meanwhile.
 * single_submit = 1: one submission system call per request; 0: one per
 *   batch of ready requests.
 *
 * Staged pieces (buffers the device cannot take directly) are copied
 * while the device works. Sliding, all of the staging pool but one buffer
 * may be in flight and the worker copies into or out of that one
 * meanwhile (copies outrun devices; a deep queue is what keeps a device
 * busy). In
 * batches, half the pool is one batch and the next is copied into the
 * other half while it runs. A staged
 * write is submitted as soon as it is copied. After a reap, the requests
 * that were waiting go to the device before any copy: before finished
 * reads are copied out and before more writes are copied in. Each
 * copy-out frees a buffer that is refilled at once.
 *
 * Every completion is checked: -EINTR/-EAGAIN/-EBUSY are resubmitted as
 * retry.c allows (bounded, then they fail the op), a short
 * transfer is finished through the buffered descriptor (a short read at
 * end of file is -ENODATA), any other error fails the op. Once an op has
 * failed, its pieces not yet issued are skipped.
 */
#include <errno.h>
#include <sched.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"
#include "sys.h"

struct slot {
	struct nvio__io io;
	struct nvio__task *task;
	void *stage;		/* bounce buffer, or NULL */
	uint64_t pos;		/* where the piece lives in the op's memory */
	uint64_t k;		/* its number in the op (for crc32) */
	unsigned retries;	/* completions of EINTR/EAGAIN/EBUSY so far */
	struct iovec *iov;	/* a vectored piece's parts (grown on need) */
	unsigned iov_cap;
};

/* Parts of one vectored request at most (the kernel's UIO_MAXIOV). */
#define MAX_PARTS 1024u

struct wstate {
	struct nvio__worker *w;
	unsigned depth;		/* in flight at most */
	unsigned nslots;
	int overlap, single;
	struct slot *slots;
	struct slot **free;	/* stack of free slots */
	unsigned nfree;
	struct nvio__io **ready;	/* prepared, not yet accepted */
	unsigned nready;
	struct nvio__io **done;	/* reap output */
	unsigned inflight;
	struct slot **copyq;	/* staged reads done, not yet copied out */
	unsigned ncopy;
	unsigned staged_inflight;	/* staged requests the engine holds */
	struct nvio__task *cur;	/* task whose pieces are being issued */
	struct nvio__cuda_ctx cuda;	/* for staged device copies */
};

#define SLOT_OF(iop) ((struct slot *)((char *)(iop) - offsetof(struct slot, io)))

/* A staged copy at least this large is worth a submission of its own. */
#define OVERLAP_COPY_BYTES (64u << 10)

static struct nvio__task *next_task(struct nvio__worker *w)
{
	struct nvio__task *t;

	pthread_mutex_lock(&w->lock);
	t = w->queue;
	if (t) {
		w->queue = t->next;
		if (!w->queue)
			w->tail = NULL;
	}
	pthread_mutex_unlock(&w->lock);
	return t;
}

/* Sleeps until a task is queued; returns 0 when told to stop instead. */
static int wait_for_work(struct nvio__worker *w)
{
	int more;

	pthread_mutex_lock(&w->lock);
	while (!w->queue && !w->stop)
		pthread_cond_wait(&w->cond, &w->lock);
	more = w->queue != NULL;
	pthread_mutex_unlock(&w->lock);
	return more;
}

void nvio__worker_push(struct nvio__worker *w, struct nvio__task *t)
{
	t->next = NULL;
	pthread_mutex_lock(&w->lock);
	if (w->tail)
		w->tail->next = t;
	else
		w->queue = t;
	w->tail = t;
	pthread_cond_signal(&w->cond);
	pthread_mutex_unlock(&w->lock);
}

static void task_pieces_done(struct nvio__task *t, uint64_t n)
{
	t->left -= n;
	if (t->left == 0)
		nvio__op_task_done(t->op);
}

/*
 * Copies between piece k's place in the op's memory (which may span
 * several of its buffers: a vector's small pieces are gathered into one
 * request) and its bounce buffer; with crc32, its CRCs in the same pass
 * (host memory) or from the bounce buffer (device memory).
 */
static int stage_copy(struct wstate *s, struct nvio__op *op, void *stage, uint64_t k,
		      uint64_t pos, size_t n, int to_user)
{
	unsigned char *flat = stage;
	int r;

	if (op->mem == NVIO__MEM_HOST && op->crc32) {
		nvio__op_crc(op, k, stage, pos, n, to_user ? NVIO__CRC_SCATTER : NVIO__CRC_GATHER);
		return 0;
	}
	if (op->mem == NVIO__MEM_HOST) {
		if (to_user)
			nvio__op_scatter(op, stage, pos, n);
		else
			nvio__op_gather(op, stage, pos, n);
		return 0;
	}
	if (!s->cuda.stream || s->cuda.device != op->cuda_device) {
		/*
		 * The bounce pool's registration belongs to the old device's
		 * context, which the close may destroy (its last retain):
		 * unregister it there, and register again in the new one, or
		 * every copy from now on takes the driver's pageable path.
		 */
		if (s->cuda.stream && nvio__cuda_ctx_use(&s->cuda) == 0)
			nvio__stage_cuda_done(&s->w->stage);
		nvio__cuda_ctx_close(&s->cuda);
		r = nvio__cuda_ctx_open(&s->cuda, op->cuda_device);
		if (r < 0)
			return r;
		nvio__stage_want_cuda(&s->w->stage);
	}
	for (uint64_t at = pos, left = n; left > 0;) {	/* a buffer's part at a time */
		uint64_t m;
		unsigned char *mem = nvio__op_at(op, at, &m);

		if (m > left)
			m = left;
		r = to_user ? nvio__cuda_copy(mem, flat, (size_t)m, 1, &s->cuda) :
			      nvio__cuda_copy(flat, mem, (size_t)m, 0, &s->cuda);
		if (r < 0)
			return r;
		flat += m;
		at += m;
		left -= m;
	}
	if (op->crc32)	/* the bounce buffer holds the bytes, either way */
		nvio__op_crc(op, k, stage, pos, n, NVIO__CRC_FLAT);
	return 0;
}

static void piece_end(struct wstate *s, struct slot *sl, int err)
{
	struct nvio__task *t = sl->task;
	struct nvio__op *op = t->op;
	struct nvio__io *io = &sl->io;

	if (!err && sl->stage && !io->is_write)
		err = stage_copy(s, op, sl->stage, sl->k, sl->pos, io->len, 1);
	else if (!err && op->crc32 && !sl->stage)	/* moved from its memory */
		nvio__op_crc(op, sl->k, NULL, sl->pos, io->len, NVIO__CRC_MEM);
	if (err)
		nvio__op_fail(op, err, io->is_write ? "pwrite" : "pread",
			      io->off, io->len);
	if (sl->stage)
		nvio__stage_put(&s->w->stage, sl->stage);
	sl->stage = NULL;
	sl->task = NULL;
	s->free[s->nfree++] = sl;
	task_pieces_done(t, 1);
}

/*
 * Takes the task's next piece. The task stops being current as soon as
 * its last piece is taken: from then on a completion may end the op and
 * free it, so s->cur must never point at it again.
 */
static uint64_t take_piece(struct wstate *s, struct nvio__task *t)
{
	uint64_t k = t->next_piece++;

	if (t->next_piece == t->end_piece)
		s->cur = NULL;
	return k;
}

/* The task to issue pieces from, skipping the rest of failed ops. */
static struct nvio__task *current_task(struct wstate *s)
{
	for (;;) {
		struct nvio__task *t = s->cur;

		if (!t)
			t = s->cur = next_task(s->w);
		if (!t)
			return NULL;
		if (t->next_piece < t->end_piece && atomic_load(&t->op->err)) {
			uint64_t skipped = t->end_piece - t->next_piece;

			t->next_piece = t->end_piece;
			s->cur = NULL;
			task_pieces_done(t, skipped);
			continue;
		}
		if (t->next_piece == t->end_piece) {	/* a fresh empty task */
			s->cur = NULL;
			continue;
		}
		return t;
	}
}

/*
 * Staged requests allowed in flight. Sliding: all bounce buffers but the
 * one being copied; batches: half, the next batch is copied into the
 * rest. The pool's size is known once it is made (the process-wide
 * budget may grant fewer buffers than asked for).
 */
static unsigned stage_cap(const struct wstate *s)
{
	unsigned n = s->w->stage.count;

	if (s->overlap)
		return n > 1 ? n - 1 : 1;
	return n / 2 ? n / 2 : 1;
}

/*
 * How many ready requests, from the front, may go now: up to depth in
 * flight, staged ones only while fewer than stage_cap of them are.
 */
static unsigned submittable(const struct wstate *s)
{
	unsigned n, staged = s->staged_inflight;

	for (n = 0; n < s->nready && s->inflight + n < s->depth; n++) {
		if (!SLOT_OF(s->ready[n])->stage)
			continue;
		if (staged == stage_cap(s))
			break;
		staged++;
	}
	return n;
}

/*
 * A fresh engine context after a reset: the same engine, else psync,
 * which needs only memory (under cuFile's on a GDS handle). 0, or
 * -ENOMEM when even that is refused (the worker then fails its requests
 * until memory is back).
 */
static int engine_ready(struct wstate *s)
{
	struct nvio__worker *w = s->w;
	void *b = NULL;
	int r;

	if (w->ectx)
		return 0;
	if (w->base->init(&b, s->depth) != 0) {
		w->base = &nvio__engine_psync;
		if ((r = w->base->init(&b, s->depth)) < 0)
			return r;
	}
	if (w->eng != &nvio__engine_cufile) {
		w->eng = w->base;
		w->ectx = b;
		return 0;
	}
	r = nvio__cufile_engine_wrap(&w->ectx, s->depth, w->base, b);
	if (r < 0)
		w->base->fini(b);
	return r;
}

/*
 * Ends the prepared requests of ops that have failed since they were
 * prepared (in batch mode up to a whole batch waits): they must not
 * reach the device, least of all writes after an error.
 */
static void drop_failed(struct wstate *s)
{
	unsigned kept = 0;

	for (unsigned i = 0; i < s->nready; i++) {
		struct slot *sl = SLOT_OF(s->ready[i]);
		int err = atomic_load(&sl->task->op->err);

		if (err)
			piece_end(s, sl, err);	/* no copy-out: err is set */
		else
			s->ready[kept++] = s->ready[i];
	}
	s->nready = kept;
}

static void submit_ready(struct wstate *s)
{
	const struct nvio__engine_ops *eng;
	unsigned spins = 0, n;
	int err;

	drop_failed(s);
	if (s->nready > 0 && (err = engine_ready(s)) < 0) {
		while (s->nready > 0)
			piece_end(s, SLOT_OF(s->ready[--s->nready]), err);
		return;
	}
	eng = s->w->eng;	/* a reset may have changed it */
	while ((n = submittable(s)) > 0) {
		/* psync runs each request inside submit(): one at a time, so
		 * that an op failed or cancelled meanwhile (nvio_queue_cancel)
		 * skips the requests it has not started, as it does on the
		 * other engines, instead of a queue_depth of them running on */
		int sync1 = eng == &nvio__engine_psync;
		int r = eng->submit(s->w->ectx, s->ready, sync1 ? 1 : n, s->single);

		if (r > 0) {
			for (int i = 0; i < r; i++)
				s->staged_inflight += SLOT_OF(s->ready[i])->stage != NULL;
			s->inflight += (unsigned)r;
			s->nready -= (unsigned)r;
			memmove(s->ready, s->ready + r, s->nready * sizeof(*s->ready));
			if (sync1)
				drop_failed(s);
			continue;
		}
		if (nvio__retryable(r) && s->inflight > 0)
			return;		/* reap, then try again */
		if (nvio__retryable(r) && ++spins < 1000) {
			sched_yield();
			continue;
		}
		while (s->nready > 0)	/* the engine refuses: fail them */
			piece_end(s, SLOT_OF(s->ready[--s->nready]), r);
	}
}

/* Submits what is ready if the mode allows it now: always when sliding,
 * only between batches otherwise. */
static void submit_allowed(struct wstate *s)
{
	if (s->overlap || s->inflight == 0)
		submit_ready(s);
}

/*
 * A staged write was just copied: let the device start on it while the
 * next one is copied. In batch mode the batch goes once it is full.
 */
static void submit_copied(struct wstate *s)
{
	unsigned staged = 0;

	if (!s->overlap) {
		for (unsigned i = 0; i < s->nready; i++)
			staged += SLOT_OF(s->ready[i])->stage != NULL;
		if (s->inflight > 0 || staged < stage_cap(s))
			return;
	}
	submit_ready(s);
}

/*
 * Pieces of files that are not regular files or block devices (AIO
 * refuses them, and a pipe has no offsets to queue against) move right
 * here, through pread/pwrite, a buffer at a time.
 */
/*
 * Moves [pos, pos + len) of the op's memory to or from file offset off
 * through the buffered descriptor, one of its buffers at a time. 0 or
 * -errno (-ENODATA where a read meets the end of the file).
 */
static int rw_parts(struct nvio__op *op, uint64_t pos, uint64_t off, uint64_t len)
{
	int err = 0;

	while (!err && len > 0) {
		uint64_t k;
		unsigned char *mem = nvio__op_at(op, pos, &k);

		if (k > len)
			k = len;
		err = op->is_write ? nvio__pwrite_full(op->file->fd, mem, (size_t)k, off) :
				     nvio__pread_full(op->file->fd, mem, (size_t)k, off);
		pos += k;
		off += k;
		len -= k;
	}
	return err;
}

static int move_here(struct nvio__op *op, const struct nvio__piece *pc)
{
	int err = rw_parts(op, pc->pos, pc->off, pc->len);

	if (err)
		nvio__op_fail(op, err, op->is_write ? "pwrite" : "pread", pc->off, pc->len);
	return err;
}

/*
 * A piece that spans several of the op's buffers (a vector's pieces laid
 * end to end) as the parts of one vectored request, straight from their
 * memory: 0 and sl->io.iov set, or -1 where it must be gathered instead
 * (more parts than a request takes, an O_DIRECT piece with a part not
 * aligned as the file needs, or no memory for the part list).
 */
static int vector_parts(struct slot *sl, const struct nvio__op *op,
			const struct nvio__piece *pc)
{
	int direct = pc->body && op->direct;
	uint64_t pos = pc->pos, left = pc->len;
	unsigned n = 0;

	while (left > 0) {
		uint64_t k;
		unsigned char *mem = nvio__op_at(op, pos, &k);

		if (k > left)
			k = left;
		if (n == MAX_PARTS || (direct && ((uintptr_t)mem | k) % op->mem_align))
			return -1;
		if (n == sl->iov_cap) {
			unsigned cap = sl->iov_cap ? 2 * sl->iov_cap : 16;
			struct iovec *v = realloc(sl->iov, cap * sizeof(*v));

			if (!v)
				return -1;
			sl->iov = v;
			sl->iov_cap = cap;
		}
		sl->iov[n].iov_base = mem;
		sl->iov[n++].iov_len = (size_t)k;
		pos += k;
		left -= k;
	}
	sl->io.iov = sl->iov;
	sl->io.iovcnt = (int)n;
	return 0;
}

/*
 * Whether a piece goes through a bounce buffer: GPU memory always (the
 * kernel cannot reach it), an O_DIRECT piece of an op staged for its
 * small pages (pages.c), an O_DIRECT piece whose memory is not aligned
 * as the file needs, and a piece spanning several of the op's buffers
 * that cannot go as one vectored request (vector_parts). *mem: the
 * piece's own bytes when they lie in one buffer.
 */
static int needs_stage(struct slot *sl, const struct nvio__op *op,
		       const struct nvio__piece *pc, unsigned char **mem)
{
	*mem = nvio__op_mem(op, pc->pos, pc->len);
	sl->io.iov = NULL;
	sl->io.iovcnt = 0;
	if (op->cufh)
		return 0;	/* cuFile reaches GPU memory itself */
	if (op->mem != NVIO__MEM_HOST || (pc->body && op->stage_body))
		return 1;
	if (!*mem)
		return vector_parts(sl, op, pc) < 0;
	return pc->body && op->direct && (uintptr_t)*mem % op->mem_align;
}

/*
 * Prepares pieces into free slots until the slots, the work or the
 * bounce buffers run out.
 */
static void fill(struct wstate *s)
{
	while (s->nfree > 0) {
		struct nvio__task *t = current_task(s);
		struct nvio__piece pc;
		struct nvio__op *op;
		struct slot *sl;
		unsigned char *mem;
		void *stage = NULL;
		int staged, err = 0;

		if (!t)
			return;
		op = t->op;
		nvio__op_piece(op, t->next_piece, &pc);
		if (op->file->plain) {
			uint64_t k = take_piece(s, t);

			if (move_here(op, &pc) == 0 && op->crc32)
				nvio__op_crc(op, k, NULL, pc.pos, pc.len, NVIO__CRC_MEM);
			task_pieces_done(t, 1);
			continue;
		}
		sl = s->free[s->nfree - 1];
		staged = needs_stage(sl, op, &pc, &mem);
		if (staged) {
			stage = nvio__stage_get(&s->w->stage, &err);
			if (!stage && !err)
				return;	/* all bounce buffers busy: reap first */
		}
		sl->k = take_piece(s, t);
		s->nfree--;
		sl->task = t;
		sl->stage = stage;
		sl->retries = 0;
		sl->pos = pc.pos;
		sl->io.fd = pc.body && op->direct ? op->dfd : op->file->fd;
		sl->io.is_write = op->is_write;
		sl->io.buf = stage ? stage : mem;
		sl->io.len = (size_t)pc.len;
		sl->io.off = pc.off;
		sl->io.res = 0;
		sl->io.fh = op->cufh;
		if (staged && !stage) {
			piece_end(s, sl, err);	/* no staging memory at all */
			continue;
		}
		if (stage && op->is_write) {
			err = stage_copy(s, op, stage, sl->k, pc.pos, (size_t)pc.len, 0);
			if (err) {
				piece_end(s, sl, err);
				continue;
			}
		}
		s->ready[s->nready++] = &sl->io;
		if (stage && op->is_write && pc.len >= OVERLAP_COPY_BYTES)
			submit_copied(s);
	}
}

/* Finishes a short transfer synchronously through the buffered fd. */
int nvio__finish_short(struct nvio__op *op, const struct nvio__io *io, size_t got)
{
	unsigned char *p = (unsigned char *)io->buf + got;

	if (!io->is_write && got == 0)
		return -ENODATA;	/* end of file inside the range */
	if (io->is_write)
		return nvio__pwrite_full(op->file->fd, p, io->len - got, io->off + got);
	return nvio__pread_full(op->file->fd, p, io->len - got, io->off + got);
}

/* A vectored request the kernel cut short: the rest, part by part,
 * through the buffered descriptor. */
static int finish_short_parts(struct nvio__op *op, struct slot *sl, size_t got)
{
	if (!sl->io.is_write && got == 0)
		return -ENODATA;	/* end of file inside the range */
	return rw_parts(op, sl->pos + got, sl->io.off + got, sl->io.len - got);
}

static void complete(struct wstate *s, struct nvio__io *io)
{
	struct slot *sl = SLOT_OF(io);
	ssize_t res = io->res;
	int err = 0;

	if (sl->stage)
		s->staged_inflight--;
	if (res < 0 && nvio__retry(&sl->retries, (int)res)) {
		s->ready[s->nready++] = io;
		return;
	}
	if (res < 0)
		err = (int)res;
	else if ((size_t)res < io->len && io->iov)
		err = finish_short_parts(sl->task->op, sl, (size_t)res);
	else if ((size_t)res < io->len)
		err = nvio__finish_short(sl->task->op, io, (size_t)res);
	if (!err && sl->stage && !io->is_write)
		s->copyq[s->ncopy++] = sl;	/* see drain_copies */
	else
		piece_end(s, sl, err);
}

/*
 * Copies the finished staged reads out to their ops' buffers: first the
 * requests waiting for room go to the device, and each copy-out frees a
 * buffer that is refilled and submitted before the next copy.
 */
static void drain_copies(struct wstate *s)
{
	for (unsigned i = 0; i < s->ncopy; i++) {
		fill(s);
		submit_allowed(s);
		piece_end(s, s->copyq[i], 0);
	}
	s->ncopy = 0;
}

/*
 * The engine failed in a way it cannot recover from. Tearing the context
 * down waits for (or cancels) everything the kernel still holds, so no
 * buffer is touched after its op ends; then start a fresh context.
 */
static void engine_reset(struct wstate *s, int err)
{
	struct nvio__worker *w = s->w;

	w->eng->fini(w->ectx);
	w->ectx = NULL;
	for (unsigned i = 0; i < s->nslots; i++)
		if (s->slots[i].task)
			piece_end(s, &s->slots[i], err);
	s->nready = 0;
	s->inflight = 0;
	s->staged_inflight = 0;
	engine_ready(s);	/* or at the next submission */
}

static void reap(struct wstate *s)
{
	unsigned min = s->overlap ? 1 : s->inflight;
	int r = s->w->eng->reap(s->w->ectx, s->done, min, s->inflight);

	if (r < 0) {
		if (!nvio__retryable(r))
			engine_reset(s, r);
		return;
	}
	s->inflight -= (unsigned)r;
	for (int i = 0; i < r; i++)
		complete(s, s->done[i]);
	/* what is ready goes first: the device must not wait on a copy */
	submit_allowed(s);
	drain_copies(s);
}

static void *worker_main(void *arg)
{
	struct wstate *s = arg;

	for (;;) {
		fill(s);	/* batch mode: prepares the next batch */
		submit_allowed(s);
		if (s->inflight > 0) {
			reap(s);
			continue;
		}
		if (s->nready == 0 && !s->cur && !wait_for_work(s->w))
			break;
	}
	if (s->cuda.stream) {
		/* the driver unpins in the context that pinned: the worker's
		 * (a validation may have left another current) */
		if (nvio__cuda_ctx_use(&s->cuda) == 0)
			nvio__stage_cuda_done(&s->w->stage);
		nvio__cuda_ctx_close(&s->cuda);
	}
	/* Each worker tears its own context down, so a handle's workers do
	 * it at once (io_destroy alone takes tens of ms per AIO context). */
	s->w->eng->fini(s->w->ectx);
	s->w->ectx = NULL;
	return NULL;
}

static void wstate_free(struct wstate *s)
{
	if (!s)
		return;
	for (unsigned i = 0; s->slots && i < s->nslots; i++)
		free(s->slots[i].iov);
	free(s->slots);
	free(s->free);
	free(s->ready);
	free(s->done);
	free(s->copyq);
	free(s);
}

unsigned nvio__worker_slots(const nvio_config_t *c)
{
	return c->overlap_events ? c->queue_depth : 2 * c->queue_depth;
}

static struct wstate *wstate_new(struct nvio__worker *w, const nvio_config_t *c)
{
	struct wstate *s = calloc(1, sizeof(*s));
	unsigned d = c->queue_depth, n = nvio__worker_slots(c);

	if (!s)
		return NULL;
	s->w = w;
	s->depth = d;
	s->nslots = n;
	s->overlap = c->overlap_events != 0;
	s->single = c->single_submit != 0;
	s->slots = calloc(n, sizeof(*s->slots));
	s->free = calloc(n, sizeof(*s->free));
	s->ready = calloc(n, sizeof(*s->ready));	/* each slot at most once */
	s->done = calloc(d, sizeof(*s->done));
	s->copyq = calloc(d, sizeof(*s->copyq));
	if (!s->slots || !s->free || !s->ready || !s->done || !s->copyq) {
		wstate_free(s);
		return NULL;
	}
	for (unsigned i = 0; i < n; i++)
		s->free[s->nfree++] = &s->slots[i];
	return s;
}

int nvio__workers_start(struct nvio_handle *h)
{
	for (unsigned i = 0; i < h->nworkers; i++) {
		struct nvio__worker *w = &h->workers[i];
		struct wstate *s = wstate_new(w, &h->cfg);
		int r;

		if (!s)
			return -ENOMEM;
		w->slots = s;
		r = pthread_create(&w->thread, NULL, worker_main, s);
		if (r)
			return -r;
		w->started = 1;
	}
	return 0;
}

void nvio__workers_stop(struct nvio_handle *h)
{
	for (unsigned i = 0; i < h->nworkers; i++) {
		struct nvio__worker *w = &h->workers[i];

		pthread_mutex_lock(&w->lock);
		w->stop = 1;
		pthread_cond_signal(&w->cond);
		pthread_mutex_unlock(&w->lock);
	}
	for (unsigned i = 0; i < h->nworkers; i++) {
		struct nvio__worker *w = &h->workers[i];

		if (w->started)
			pthread_join(w->thread, NULL);
		w->started = 0;
		wstate_free(w->slots);
		w->slots = NULL;
	}
}
