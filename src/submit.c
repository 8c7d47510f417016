/*
 * submit.c - from a call to an accepted op: check -> op -> plan -> dispatch.
 *
 * Everything that can be refused is checked here, in the caller's thread,
 * before any byte moves: arguments, the file's size for reads, growth
 * for writes, whether O_DIRECT applies. A refused op returns its error
 * and never completes. An accepted op is registered with track.c, cut
 * into pieces (plan.c) and each worker gets its run of pieces; a sync op
 * of one piece that needs no bounce buffer runs right here.
 *
 * Every call ends in nvio__submit: the one-buffer calls by path or fd
 * open a private file for their op (file.c) and wait for it or leave it
 * to nvio_wait; nvio_submit's ops run on the caller's open files and end
 * as completions.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "internal.h"
#include "sys.h"

#define KNOWN_FLAGS (NVIO_ASYNC | NVIO_VALIDATE | NVIO_FSYNC)

/* ---- checks ----------------------------------------------------------- */

static int check_iov(const struct nvio__opspec *sp, const char **what)
{
	uint64_t total = 0, end = 0;

	if (sp->buf || sp->nbytes) {
		*what = "iov (with buf or nbytes)";
		return -EINVAL;
	}
	if (!sp->iov || sp->iovcnt == 0 || sp->iovcnt > NVIO_MAX_IOV) {
		*what = "iov (NULL, empty or over NVIO_MAX_IOV)";
		return -EINVAL;
	}
	for (uint32_t i = 0; i < sp->iovcnt; i++) {
		const nvio_iovec_t *v = &sp->iov[i];

		if (!v->base && v->len) {
			*what = "iov (NULL base)";
			return -EINVAL;
		}
		if (v->len > (uint64_t)INT64_MAX - total) {
			*what = "iov (total past INT64_MAX)";
			return -EINVAL;
		}
		total += v->len;
		if (sp->offset != NVIO_OFFSET_PER_IOV) {
			if (v->offset != 0) {
				*what = "iov (offset set in a contiguous vector)";
				return -EINVAL;
			}
			continue;
		}
		if (v->offset < 0 || v->len > (uint64_t)(INT64_MAX - v->offset)) {
			*what = "iov (offset negative or past INT64_MAX)";
			return -EINVAL;
		}
		if (v->len && (uint64_t)v->offset < end) {
			*what = "iov (offsets decrease or overlap)";
			return -EINVAL;
		}
		if (v->len)
			end = (uint64_t)v->offset + v->len;
	}
	if (sp->offset != NVIO_OFFSET_PER_IOV &&
	    (sp->offset < 0 || total > (uint64_t)(INT64_MAX - sp->offset))) {
		*what = "range (past INT64_MAX)";
		return -EINVAL;
	}
	return 0;
}

/* The arguments of an op, before anything is made. 0, or the error with
 * *what naming the argument. */
static int check_spec(const struct nvio__opspec *sp, const char **what)
{
	struct nvio_file *f = sp->file;

	*what = "flags";
	if (sp->flags & ~KNOWN_FLAGS)
		return -EINVAL;
	*what = "file (not open for writing)";
	if (sp->is_write && !(f->flags & NVIO_FILE_WRITE))
		return -EBADF;
	*what = "file (not open for reading)";
	if (!sp->is_write && !(f->flags & NVIO_FILE_READ))
		return -EBADF;
	if (sp->vec)
		return check_iov(sp, what);
	*what = "buffer (NULL)";
	if (!sp->buf && sp->nbytes > 0)
		return -EINVAL;
	*what = "range (past INT64_MAX)";
	if (sp->offset < 0 || sp->nbytes > (uint64_t)(INT64_MAX - sp->offset))
		return -EINVAL;
	return 0;
}

/* ---- the op and its memory ---------------------------------------- */

static uint32_t count_extents(const struct nvio__opspec *sp)
{
	uint32_t n = 0;
	uint64_t end = UINT64_MAX;

	if (!sp->vec || sp->offset != NVIO_OFFSET_PER_IOV)
		return 1;
	for (uint32_t i = 0; i < sp->iovcnt; i++) {
		if (!sp->iov[i].len)
			continue;
		if ((uint64_t)sp->iov[i].offset != end)
			n++;
		end = (uint64_t)sp->iov[i].offset + sp->iov[i].len;
	}
	return n ? n : 1;
}

/* Buffers and file ranges of the op; ranges are planned later. */
static void lay_out(struct nvio__op *op, const struct nvio__opspec *sp)
{
	uint64_t pos = 0, end = UINT64_MAX;
	uint32_t e = 0;

	if (!sp->vec) {
		op->seg1 = (struct nvio__seg){ sp->buf, sp->nbytes, 0, 0 };
		op->nsegs = 1;
		op->ext1.plan.off = (uint64_t)sp->offset;
		op->ext1.plan.len = sp->nbytes;
		op->next = 1;
		op->nbytes = sp->nbytes;
		return;
	}
	op->ext[0].plan.off = sp->offset == NVIO_OFFSET_PER_IOV ? 0 : (uint64_t)sp->offset;
	for (uint32_t i = 0; i < sp->iovcnt; i++) {
		const nvio_iovec_t *v = &sp->iov[i];

		if (!v->len)
			continue;
		op->segs[op->nsegs++] = (struct nvio__seg){ v->base, v->len, pos, i };
		if (sp->offset == NVIO_OFFSET_PER_IOV && (uint64_t)v->offset != end) {
			if (end != UINT64_MAX)
				e++;
			op->ext[e].plan.off = (uint64_t)v->offset;
			op->ext[e].plan.len = 0;
			op->ext[e].pos = pos;
			end = (uint64_t)v->offset;
		}
		op->ext[e].plan.len += v->len;
		end += v->len;
		pos += v->len;
	}
	op->next = e + 1;
	op->nbytes = pos;
}

/* Bytes of an op with its tasks. */
static size_t op_size(const struct nvio_handle *h)
{
	return sizeof(struct nvio__op) + h->nworkers * sizeof(struct nvio__task);
}

/*
 * A new op in `room` (a sync op lives on its caller's stack: it never
 * outlives the call), else on the heap.
 */
/* seq: the op's number, 0 for the handle's next. */
static struct nvio__op *op_new(struct nvio_handle *h, const struct nvio__opspec *sp,
			       void *room, uint64_t seq)
{
	uint32_t nseg = sp->vec ? sp->iovcnt : 1, next = count_extents(sp);
	struct nvio__op *op = room;

	if (op)
		memset(op, 0, sizeof(*op));	/* run_op sets the tasks */
	else if (!(op = calloc(1, op_size(h))))
		return NULL;
	op->on_heap = room == NULL;
	op->segs = &op->seg1;
	op->ext = &op->ext1;
	if (sp->vec) {
		op->segs = calloc(nseg, sizeof(*op->segs));
		op->ext = next > 1 ? calloc(next, sizeof(*op->ext)) : &op->ext1;
		if (!op->segs || !op->ext) {
			free(op->segs);
			if (op->on_heap)
				free(op);
			return NULL;
		}
	}
	op->h = h;
	op->file = sp->file;
	op->own_file = sp->file->private;
	op->seq = seq ? seq : atomic_fetch_add(&h->seq, 1) + 1;
	op->user_data = sp->user_data;
	op->flags = sp->flags;
	op->is_write = sp->is_write;
	op->sink = sp->sink;
	op->group = sp->group;
	op->queue = sp->queue;
	op->dfd = -1;
	op->crc32 = sp->crc32;
	op->ncrc = sp->vec ? sp->iovcnt : 1;
	lay_out(op, sp);
	return op;
}

/*
 * Where the op's memory lives: all host, or all on one CUDA device.
 *
 * lazy: a sync op of one buffer without VALIDATE, while no CUDA driver
 * has been seen, is taken for host memory without asking the loader
 * whether one came since (op->mem_unsure). That is safe because such an
 * op touches its buffer only through the kernel, never from user space,
 * until nvio__submit has asked after all:
 *   - it runs only inline (run_inline: a pread/pwrite(2) on the buffer,
 *     a short transfer's rest through the same calls); an op that would
 *     not (bounce buffers, workers, cuFile) is asked first (ask_mem) and
 *     planned again;
 *   - device memory is not host memory the kernel can copy: the call
 *     fails with EFAULT before moving a byte (the driver's address range
 *     is not mapped for the CPU; the simulator maps it PROT_NONE), and
 *     run_inline then asks and, if it was device memory, runs the op
 *     again as such. Where device memory is coherent host memory (ATS),
 *     the call simply moves the bytes, which is what the op asked for;
 *   - VALIDATE compares the buffer in user space: never lazy.
 */
static int classify_mem(struct nvio__op *op, int lazy, const char **what)
{
	if (lazy && !nvio__cuda_known()) {
		op->mem = NVIO__MEM_HOST;
		op->mem_unsure = 1;
		return 0;
	}
	op->mem_unsure = 0;
	for (uint32_t i = 0; i < op->nsegs; i++) {
		int dev = 0, r = nvio__cuda_pointer_device(op->segs[i].base, &dev);

		*what = "CUDA pointer query";
		if (r < 0)
			return r;
		if (i == 0) {
			op->mem = r > 0 ? NVIO__MEM_CUDA : NVIO__MEM_HOST;
			op->cuda_device = dev;
		} else if ((r > 0) != (op->mem == NVIO__MEM_CUDA) ||
			   (r > 0 && dev != op->cuda_device)) {
			*what = "iov (host and device memory mixed)";
			return -EINVAL;
		}
	}
	return 0;
}

/* ---- planning ------------------------------------------------------ */

/*
 * The alignment a direct op's body keeps, from the file's O_DIRECT offset
 * alignment. Writes: at least the page, since a head or tail written
 * through the page cache must not share a page with direct writes (its
 * writeback could overwrite them). Reads: the file's own, at least a
 * sector: a sample of 8196 bytes at a 512-byte boundary is then one
 * direct request of 8.5 KiB, not 12 KiB of pages (or a direct body with
 * buffered head and tail); the kernel writes dirty cached pages of the
 * range back before a direct read.
 */
#define SECTOR 512u

static uint32_t plan_align(const struct nvio__op *op, uint32_t align)
{
	uint32_t floor = op->is_write ? NVIO__PAGE : SECTOR;

	return align && align < floor ? floor : align;
}

/* Cuts every extent with alignment align (0: no direct I/O). */
static void plan_extents(struct nvio__op *op, uint64_t block, uint32_t align)
{
	uint64_t first = 0;

	align = plan_align(op, align);
	for (uint32_t e = 0; e < op->next; e++) {
		struct nvio__plan *p = &op->ext[e].plan;

		nvio__plan_make(p, p->off, p->len, block, align);
		op->ext[e].first = first;
		first += p->npieces;
	}
	op->npieces = first;
}

static uint64_t body_bytes(const struct nvio__op *op)
{
	uint64_t n = 0;

	for (uint32_t e = 0; e < op->next; e++)
		n += op->ext[e].plan.body;
	return n;
}

/* Extents (on average) at least this large may be staged for their 4 KiB
 * pages (plan_op). */
#define STAGE_PIECE_MIN (256u << 10)

/* Whether some piece may need a bounce buffer (see workers.c fill). */
static int may_stage(const struct nvio__op *op, uint32_t mem_align)
{
	if (op->mem != NVIO__MEM_HOST || op->nsegs > 1)
		return 1;
	return ((uintptr_t)(op->segs[0].base + op->ext[0].plan.head) % mem_align) != 0;
}

/*
 * Plans the op and decides on O_DIRECT. GPU memory on a GDS handle goes
 * through cuFile when the file registers (cuFile takes any alignment).
 * A body chunk is the block rounded up to the alignment; the bounce
 * buffers hold the block rounded up to the page. Where the alignment is
 * coarser than both, a staged chunk would not fit: AUTO then moves the
 * op buffered, ON refuses it (*what says why). AUTO also goes buffered
 * when the O_DIRECT descriptor cannot be opened.
 */
static int plan_op(struct nvio_handle *h, struct nvio__op *op, const char **what)
{
	struct nvio_file *f = op->file;
	uint64_t block = h->cfg.block_size;
	int policy = h->cfg.direct, dfd;

	/* cuFile moves device memory the CPU cannot checksum: crc32 ops
	 * stage it */
	if (h->gds && op->mem == NVIO__MEM_CUDA && op->nsegs == 1 && !f->plain &&
	    !op->crc32 && (op->cufh = nvio__file_cufh(f)) != NULL) {
		plan_extents(op, block, 0);
		return 0;
	}
	if (!f->align || f->plain || policy == NVIO_DIRECT_OFF) {
		plan_extents(op, block, 0);
		return 0;
	}
	plan_extents(op, block, f->align);
	if (body_bytes(op) == 0) {
		/* Nothing goes direct. A head could be up to twice the
		 * alignment: GPU memory moves in blocks, which fit. */
		if (op->mem != NVIO__MEM_HOST)
			plan_extents(op, block, 0);
		return 0;
	}
	if (may_stage(op, f->mem_align) &&
	    op->ext[0].plan.chunk > h->workers[0].stage.size) {
		*what = "staging (block < alignment)";
		dfd = -EINVAL;
	} else {
		*what = "open O_DIRECT";
		dfd = nvio__file_dfd(f);
	}
	if (dfd < 0) {
		/* AUTO: whatever refuses O_DIRECT here (the file system, a
		 * socket, the file's mode, the alignment), buffered works */
		if (policy == NVIO_DIRECT_ON)
			return dfd;
		plan_extents(op, block, 0);
		return 0;
	}
	op->direct = 1;
	op->dfd = dfd;
	op->mem_align = f->mem_align;
	/* a large op on 4 KiB pages on a device that splits them: staged,
	 * unless its extents are small (a batch of scattered samples): a
	 * request of STAGE_PIECE_MIN is split by no device seen (virtio-blk
	 * 254 segments, loop 128), so a bounce buffer per piece only adds a
	 * copy and caps the pieces in flight at the pool's buffers (a batch
	 * of 512 pieces of 12 KiB: 0.65-0.8x the speed unstaged) */
	op->stage_body = op->mem == NVIO__MEM_HOST &&
			 body_bytes(op) >= NVIO__STAGE_PAGES_MIN &&
			 body_bytes(op) / op->next >= STAGE_PIECE_MIN &&
			 op->ext[0].plan.chunk <= h->workers[0].stage.size &&
			 nvio__op_stage_small_pages(op);
	return 0;
}

/*
 * Reads must lie within the file (a file someone else grew is looked at
 * again before -ENODATA); writes that grow it allocate first, so a full
 * disk fails here, before any byte moves.
 */
static int check_range(struct nvio__op *op, const char **what)
{
	struct nvio_file *f = op->file;
	struct nvio__plan *last = &op->ext[op->next - 1].plan;
	uint64_t end = last->off + last->len, size = atomic_load(&f->size);
	struct stat st;
	int r;

	if (!op->is_write) {
		*what = "read (past the end of the file)";
		if (end <= size || size == UINT64_MAX)
			return 0;
		/* a spare's bytes past what was written are the old file's */
		if (S_ISREG(f->st.st_mode) && !f->spare &&
		    nvio__sys.fstat(f->fd, &st) == 0 &&
		    (uint64_t)st.st_size >= end) {
			nvio__file_note_end(f, (uint64_t)st.st_size);
			return 0;
		}
		return -ENODATA;
	}
	*what = "fallocate";
	for (uint32_t e = 0; e < op->next; e++) {
		struct nvio__plan *p = &op->ext[e].plan;

		if ((r = nvio__file_grow(f, p->off, p->len)) < 0) {
			nvio__file_shrink_back(f, end, size);
			atomic_store(&f->failed, 1);
			return r;
		}
	}
	if (op->nbytes && end > size && size != UINT64_MAX) {
		op->grew_from = size;
		op->grew_to = end;
	}
	if (op->nbytes)
		nvio__file_note_end(f, end);
	return 0;
}

/* ---- dispatch ------------------------------------------------------ */

/*
 * The error of an op that has ended, 0 if none; a failure becomes the
 * calling thread's nvio_last_error(), as the call returns it.
 */
static int op_error(const struct nvio__op *op)
{
	nvio_error_t e;
	int err = atomic_load(&op->err);

	if (err) {
		nvio__op_record(op, &e);
		nvio__error_publish(op->h, &e);
	}
	return err;
}

/*
 * A sync op of one piece that needs no bounce buffer runs in the caller's
 * thread, through the same completion checks as in a worker: handing it
 * to a worker and back costs two thread wake-ups, and tracking it two
 * lock round trips.
 */
static unsigned char *inline_mem(const struct nvio__op *op, struct nvio__piece *pc)
{
	unsigned char *mem;

	if (op->sink != NVIO__SINK_SYNC || op->npieces != 1 || op->stage_body || op->crc32 ||
	    op->mem != NVIO__MEM_HOST || op->cufh || op->file->plain)
		return NULL;
	nvio__op_piece(op, 0, pc);
	mem = nvio__op_mem(op, pc->pos, pc->len);
	if (mem && pc->body && op->direct && (uintptr_t)mem % op->mem_align)
		return NULL;
	return mem;
}

static int plan_op(struct nvio_handle *h, struct nvio__op *op, const char **what);

/*
 * An op whose memory was taken for host memory without asking: ask now,
 * and plan it again if it is device memory. 0, or the error with *what.
 */
static int ask_mem(struct nvio_handle *h, struct nvio__op *op, const char **what)
{
	int r = classify_mem(op, 0, what);

	if (r || op->mem == NVIO__MEM_HOST)
		return r;
	op->direct = 0;
	op->dfd = -1;
	op->mem_align = 0;
	op->cufh = NULL;
	return plan_op(h, op, what);
}

static int run_op(struct nvio_handle *h, struct nvio__op *op);

static int run_inline(struct nvio__op *op, struct nvio__piece *pc, unsigned char *mem)
{
	struct nvio__io io = { .is_write = op->is_write, .buf = mem };
	const char *what = op->is_write ? "pwrite" : "pread";
	unsigned tries = 0;
	ssize_t r;
	int err;

	io.fd = pc->body && op->direct ? op->dfd : op->file->fd;
	io.len = (size_t)pc->len;
	io.off = pc->off;
	do {
		r = op->is_write ? nvio__sys.pwrite(io.fd, io.buf, io.len, (off_t)io.off) :
				   nvio__sys.pread(io.fd, io.buf, io.len, (off_t)io.off);
		r = nvio__sys.io_result(io.is_write, io.fd, io.off, io.len, r < 0 ? -errno : r);
	} while (r < 0 && nvio__retry(&tries, (int)r));
	if (r == -EFAULT && op->mem_unsure) {
		/* Device memory loaded late? Nothing has moved (see
		 * classify_mem): run the op again as what it is. */
		int q = ask_mem(op->h, op, &what);

		if (!q && op->mem != NVIO__MEM_HOST)
			return run_op(op->h, op);
		if (q)
			r = q;	/* the question failed: the op with it */
		else
			what = op->is_write ? "pwrite" : "pread";
	}
	if (r < 0)
		err = (int)r;
	else
		err = (size_t)r < io.len ? nvio__finish_short(op, &io, (size_t)r) : 0;
	if (err)
		nvio__op_fail(op, err, what, pc->off, pc->len);
	nvio__op_finish_inline(op);
	err = op_error(op);
	nvio__op_free(op);
	return err;
}

/*
 * Hands the pieces to the workers and, for a sync op, waits for it (an
 * op that inline_mem accepts runs in run_inline instead).
 * Once the last task is pushed an async op may end and be freed at any
 * moment, so nothing reads it after that push.
 */
static int run_op(struct nvio_handle *h, struct nvio__op *op)
{
	int sync = op->sink == NVIO__SINK_SYNC;
	unsigned busy = 0, last = 0;
	int err;

	nvio__track_begin(op);
	for (unsigned w = 0; w < h->nworkers; w++) {
		struct nvio__task *t = &op->tasks[w];

		t->op = op;
		nvio__plan_slice(op->npieces, w, h->nworkers, &t->next_piece,
				 &t->end_piece);
		t->left = t->end_piece - t->next_piece;
		if (t->left > 0) {
			busy++;
			last = w;
		}
	}
	atomic_store(&op->tasks_left, busy ? busy : 1);
	if (!busy)
		nvio__op_task_done(op);	/* nothing to move: ends here */
	for (unsigned w = 0; busy && w <= last; w++)
		if (op->tasks[w].left > 0)
			nvio__worker_push(&h->workers[w], &op->tasks[w]);
	if (!sync)
		return 0;
	nvio__track_wait_sync(op);
	err = op_error(op);
	nvio__op_free(op);
	return err;
}

/* A refused op: its error becomes the caller's nvio_last_error(). */
static int refuse(struct nvio_handle *h, const struct nvio__opspec *sp,
		  struct nvio__op *op, int err, const char *what)
{
	nvio_error_t e;

	if (op) {
		nvio__op_fail(op, err, what, op->ext[0].plan.off, op->nbytes);
		op_error(op);
		nvio__op_free(op);
		return err;
	}
	nvio__error_fill(&e, err, NULL, what, (uint64_t)sp->offset, sp->nbytes);
	e.is_write = sp->is_write;
	e.user_data = sp->user_data;
	snprintf(e.path, sizeof(e.path), "%s", sp->file->path);
	if (sp->file->private)
		nvio__file_free(sp->file);
	return nvio__error_publish(h, &e);
}

int nvio__submit(struct nvio_handle *h, const struct nvio__opspec *sp)
{
	/* room for a sync op and its tasks, aligned as malloc's would be */
	max_align_t room[sp->sink == NVIO__SINK_SYNC ?
			 (op_size(h) + sizeof(max_align_t) - 1) / sizeof(max_align_t) : 1];
	struct nvio__op *op = NULL;
	struct nvio__piece pc;
	unsigned char *mem = NULL;
	const char *what = "handle (inherited through fork)";
	int r = nvio__forked(h) ? -ECHILD : check_spec(sp, &what);

	if (!r) {
		op = op_new(h, sp, sp->sink == NVIO__SINK_SYNC ? room : NULL, 0);
		what = "memory";
		r = op ? 0 : -ENOMEM;
	}
	if (!r)
		r = classify_mem(op, sp->sink == NVIO__SINK_SYNC && !sp->vec &&
				 !(sp->flags & NVIO_VALIDATE), &what);
	if (!r)
		r = plan_op(h, op, &what);
	if (!r && !(mem = inline_mem(op, &pc)) && op->mem_unsure)
		r = ask_mem(h, op, &what);	/* not inline: see classify_mem */
	if (!r)
		r = check_range(op, &what);
	if (!r && op->crc32) {
		what = "memory";
		op->crc_parts = calloc(op->npieces ? op->npieces : 1, sizeof(*op->crc_parts));
		r = op->crc_parts ? 0 : -ENOMEM;
		if (!r)		/* empty buffers have the CRC of nothing */
			memset(op->crc32, 0, op->ncrc * sizeof(*op->crc32));
	}
	if (r)
		return refuse(h, sp, op, r, what);
	/* Run here, it ends before the call returns: nothing to track (a
	 * file closed or committed meanwhile by another thread is that
	 * caller's race, as with close(2) under a read(2)). */
	if (mem)
		return run_inline(op, &pc, mem);
	return run_op(h, op);
}

/* ---- the calls ------------------------------------------------------- */

/*
 * A read that went wrong on the quick path: its error reported as the
 * general path reports it (the op built only now, nothing moved again).
 */
static int quick_fail(struct nvio_handle *h, const struct nvio__opspec *sp, uint64_t seq,
		      int err)
{
	max_align_t room[(op_size(h) + sizeof(max_align_t) - 1) / sizeof(max_align_t)];
	struct nvio__op *op = op_new(h, sp, room, seq);

	if (!op)
		return refuse(h, sp, NULL, err, "pread");
	op->mem = NVIO__MEM_HOST;
	nvio__op_fail(op, err, "pread", (uint64_t)sp->offset, sp->nbytes);
	err = op_error(op);
	nvio__op_free(op);
	return err;
}

/*
 * The common small read: a sync read, without flags, of one host buffer
 * of at most a block from an open file through the page cache, within
 * the size the file is known to have. The general path would run it
 * inline (run_inline) with these same calls: the same system call, fault
 * hook, retry policy and short-transfer rule, only without building and
 * planning an op for it (~450 instructions of ~670 per 4 KiB read).
 * Anything else takes the general path: *quick = 0. A buffer that is
 * device memory after all (EFAULT while no CUDA driver was seen) is
 * retried there, where the op asks; nothing has moved.
 */
static int quick_read(struct nvio_file *f, void *buf, uint64_t n, int64_t off, int *quick)
{
	struct nvio_handle *h = f->h;
	unsigned tries = 0;
	uint64_t seq;
	ssize_t r;
	int err;

	if (!n || !buf || off < 0 || n > (uint64_t)(INT64_MAX - off) ||
	    !(f->flags & NVIO_FILE_READ) || f->plain || f->private ||
	    (f->align && h->cfg.direct != NVIO_DIRECT_OFF) || n > h->cfg.block_size ||
	    (uint64_t)off + n > atomic_load(&f->size) || nvio__forked(h) || nvio__cuda_known())
		return *quick = 0;
	*quick = 1;
	seq = atomic_fetch_add(&h->seq, 1) + 1;	/* numbered like any op */
	do {
		r = nvio__sys.pread(f->fd, buf, (size_t)n, (off_t)off);
		r = nvio__sys.io_result(0, f->fd, (uint64_t)off, (size_t)n, r < 0 ? -errno : r);
	} while (r < 0 && nvio__retry(&tries, (int)r));
	if ((uint64_t)r == n)
		return 0;
	if (r == -EFAULT)
		return *quick = 0;	/* (its number skipped) */
	if (r < 0)
		err = (int)r;
	else if (r == 0)
		err = -ENODATA;		/* end of file inside the range */
	else
		err = nvio__pread_full(f->fd, (unsigned char *)buf + r, (size_t)(n - (uint64_t)r),
				       (uint64_t)off + (uint64_t)r);
	if (!err)
		return 0;
	struct nvio__opspec sp = { .file = f, .buf = buf, .nbytes = n, .offset = off,
				   .sink = NVIO__SINK_SYNC };
	return quick_fail(h, &sp, seq, err);
}

int nvio_file_pread(nvio_file_t *f, void *buf, uint64_t nbytes, int64_t offset,
		    unsigned flags)
{
	struct nvio__opspec sp = { .file = f, .flags = flags, .buf = buf,
				   .nbytes = nbytes, .offset = offset };
	int quick, r;

	if (!f)
		return -EINVAL;
	if (!flags) {
		r = quick_read(f, buf, nbytes, offset, &quick);
		if (quick)
			return r;
	}
	sp.sink = flags & NVIO_ASYNC ? NVIO__SINK_GROUP : NVIO__SINK_SYNC;
	return nvio__submit(f->h, &sp);
}

int nvio_file_pwrite(nvio_file_t *f, const void *buf, uint64_t nbytes,
		     int64_t offset, unsigned flags)
{
	struct nvio__opspec sp = { .file = f, .flags = flags, .is_write = 1,
				   .buf = (unsigned char *)buf, .nbytes = nbytes,
				   .offset = offset };

	if (!f)
		return -EINVAL;
	sp.sink = flags & NVIO_ASYNC ? NVIO__SINK_GROUP : NVIO__SINK_SYNC;
	return nvio__submit(f->h, &sp);
}

static int file_v(nvio_file_t *f, const nvio_iovec_t *iov, uint32_t iovcnt,
		  int64_t offset, unsigned flags, int is_write)
{
	struct nvio__opspec sp = { .file = f, .flags = flags, .is_write = is_write,
				   .iov = iov, .iovcnt = iovcnt, .vec = 1,
				   .offset = offset };

	if (!f)
		return -EINVAL;
	sp.sink = flags & NVIO_ASYNC ? NVIO__SINK_GROUP : NVIO__SINK_SYNC;
	return nvio__submit(f->h, &sp);
}

int nvio_file_preadv(nvio_file_t *f, const nvio_iovec_t *iov, uint32_t iovcnt,
		     int64_t offset, unsigned flags)
{
	return file_v(f, iov, iovcnt, offset, flags, 0);
}

int nvio_file_pwritev(nvio_file_t *f, const nvio_iovec_t *iov, uint32_t iovcnt,
		      int64_t offset, unsigned flags)
{
	return file_v(f, iov, iovcnt, offset, flags, 1);
}

/* One tagged op to queue q: 0 or -errno (refused, the caller's record). */
static int submit_one(struct nvio_queue *q, const nvio_op_t *o)
{
	struct nvio_handle *h = q->h;
	struct nvio__opspec sp = {
		.file = o->file, .is_write = o->opcode == NVIO_OP_WRITE,
		.flags = o->flags & ~NVIO_ASYNC, .buf = o->buf, .nbytes = o->nbytes,
		.offset = o->offset, .iov = o->iov, .iovcnt = o->iovcnt,
		.vec = o->iov || o->iovcnt,
		.user_data = o->user_data, .sink = NVIO__SINK_QUEUE, .queue = q,
		.crc32 = o->crc32,
	};
	const char *what = NULL;
	nvio_error_t e;

	if (o->opcode != NVIO_OP_READ && o->opcode != NVIO_OP_WRITE)
		what = "opcode";
	else if (o->reserved0 || o->reserved[0] || o->reserved[1] || o->reserved[2])
		what = "reserved field";
	else if (!o->file || o->file->h != h)
		what = "file (NULL or of another handle)";
	if (!what)
		return nvio__submit(h, &sp);
	nvio__error_fill(&e, -EINVAL, NULL, what, (uint64_t)o->offset, o->nbytes);
	e.user_data = o->user_data;
	return nvio__error_publish(h, &e);
}

int nvio__queue_submit(struct nvio_queue *q, const nvio_op_t *ops, unsigned n)
{
	unsigned i;

	for (i = 0; i < n; i++) {
		int r = submit_one(q, &ops[i]);

		if (r < 0)
			return i > 0 ? (int)i : r;
	}
	return (int)i;
}

int nvio_queue_submit(nvio_queue_t *q, const nvio_op_t *ops, unsigned n)
{
	if (!q || (n && !ops))
		return -EINVAL;
	return nvio__queue_submit(q, ops, n);
}

/* 0.3 layout of nvio_op_t (reserved[]); 0.2's is in abi_old.c. */
#ifdef NVIO_SYMVER
__asm__(".symver nvio_submit, nvio_submit@@@NVIO_0.3");
#endif

int nvio_submit(nvio_handle_t *h, const nvio_op_t *ops, unsigned n)
{
	if (!h || (n && !ops))
		return -EINVAL;
	return nvio__queue_submit(&h->q0, ops, n);
}

/* ---- the one-buffer calls by path or descriptor ------------------------ */

/* A failure to open the private file of a one-buffer call. */
static int refuse_open(struct nvio_handle *h, int err, const char *what,
		       const char *path, int fd, int is_write, int64_t off,
		       uint64_t n)
{
	nvio_error_t e;

	if (!h)
		return err;
	nvio__error_fill(&e, err, NULL, what, (uint64_t)off, n);
	e.is_write = is_write;
	if (path)
		snprintf(e.path, sizeof(e.path), "%s", path);
	else
		snprintf(e.path, sizeof(e.path), "fd %d", fd);
	return nvio__error_publish(h, &e);
}

/*
 * The one-buffer calls: a private file for the op, which closes it when
 * it ends (op.c). A whole-file read takes its size from the file; a
 * whole-file write goes to an atomic file committed by the op.
 */
struct call {
	const char *path;	/* or NULL: fd */
	int fd;
	int is_write;
	int whole;
	void *buf;
	uint64_t nbytes;	/* capacity for a whole-file read */
	int64_t offset;
	unsigned flags;
	uint64_t *size_out;
};

static int one_call(struct nvio_handle *h, const struct call *c, int by_path)
{
	unsigned ff = !c->is_write ? NVIO_FILE_READ : c->whole ? NVIO_FILE_ATOMIC :
		      c->path ? NVIO_FILE_WRITE | NVIO_FILE_CREATE : NVIO_FILE_WRITE;
	struct nvio__opspec sp = { .is_write = c->is_write, .flags = c->flags,
				   .buf = c->buf, .nbytes = c->nbytes,
				   .offset = c->offset };
	struct nvio_file *f = NULL;
	const char *what = "flags";
	int r = 0;

	if (!h || (c->flags & ~KNOWN_FLAGS))
		r = -EINVAL;
	else if (nvio__forked(h))
		r = -ECHILD, what = "handle (inherited through fork)";
	else if (by_path && !c->path)
		r = -EINVAL, what = "path (NULL)";
	else if (!c->buf && c->nbytes > 0)
		r = -EINVAL, what = "buffer (NULL)";
	else if (!c->path && c->fd < 0)
		r = -EBADF, what = "fd (negative)";
	else if (c->offset < 0 || c->nbytes > (uint64_t)(INT64_MAX - c->offset))
		r = -EINVAL, what = "range (past INT64_MAX)";
	if (!r) {
		what = "open";
		r = nvio__file_make(h, c->path, c->path ? -1 : c->fd, ff, &f, &what);
	}
	if (!r && c->whole && !c->is_write) {
		uint64_t size = atomic_load(&f->size);

		what = "size (not a file or device)";
		r = size == UINT64_MAX ? -EINVAL : 0;
		if (!r && c->size_out)
			*c->size_out = size;
		if (!r && size > c->nbytes)
			r = -EOVERFLOW, what = "open";
		sp.nbytes = size;
	}
	if (r) {
		nvio__file_free(f);
		return refuse_open(h, r, what, c->path, c->fd, c->is_write,
				   c->offset, c->nbytes);
	}
	f->private = 1;
	sp.file = f;
	sp.sink = c->flags & NVIO_ASYNC ? NVIO__SINK_GROUP : NVIO__SINK_SYNC;
	r = nvio__submit(h, &sp);
	return r;
}

int nvio_pread(nvio_handle_t *h, void *buf, uint64_t nbytes, const char *path,
	       int64_t offset, unsigned flags)
{
	struct call c = { .path = path, .buf = buf, .nbytes = nbytes,
			  .offset = offset, .flags = flags };

	return one_call(h, &c, 1);
}

int nvio_pwrite(nvio_handle_t *h, const void *buf, uint64_t nbytes,
		const char *path, int64_t offset, unsigned flags)
{
	struct call c = { .path = path, .is_write = 1, .buf = (void *)buf,
			  .nbytes = nbytes, .offset = offset, .flags = flags };

	return one_call(h, &c, 1);
}

int nvio_pread_fd(nvio_handle_t *h, void *buf, uint64_t nbytes, int fd,
		  int64_t offset, unsigned flags)
{
	struct call c = { .fd = fd, .buf = buf, .nbytes = nbytes,
			  .offset = offset, .flags = flags };

	return one_call(h, &c, 0);
}

int nvio_pwrite_fd(nvio_handle_t *h, const void *buf, uint64_t nbytes, int fd,
		   int64_t offset, unsigned flags)
{
	struct call c = { .fd = fd, .is_write = 1, .buf = (void *)buf,
			  .nbytes = nbytes, .offset = offset, .flags = flags };

	return one_call(h, &c, 0);
}

int nvio_read_file(nvio_handle_t *h, void *buf, uint64_t capacity,
		   const char *path, uint64_t *size_out, unsigned flags)
{
	struct call c = { .path = path, .whole = 1, .buf = buf,
			  .nbytes = capacity, .flags = flags, .size_out = size_out };

	return one_call(h, &c, 1);
}

int nvio_write_file(nvio_handle_t *h, const void *buf, uint64_t nbytes,
		    const char *path, unsigned flags)
{
	struct call c = { .path = path, .is_write = 1, .whole = 1,
			  .buf = (void *)buf, .nbytes = nbytes, .flags = flags };

	return one_call(h, &c, 1);
}

int64_t nvio_file_size(const char *path)
{
	struct stat st;

	if (!path)
		return -EINVAL;
	if (stat(path, &st) < 0)
		return -errno;
	return st.st_size;
}
