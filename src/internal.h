/*
 * internal.h - what the files of libnvio share. Nothing here is public.
 *
 * Objects and who owns them:
 *   nvio_handle   owns its workers (threads, engine contexts, staging
 *                 pools); track.c owns its bookkeeping of ops in flight,
 *                 completions and errors.
 *   nvio_file     an open file (file.c): descriptors, alignment, size,
 *                 the temporary of an atomic write. The caller's, or an
 *                 op's private one for the by-path and by-fd calls.
 *   nvio__op      one accepted request. Allocated at submit with one
 *                 nvio__task per worker embedded in it; freed by the thread
 *                 that ends it (async) or by the submitter (sync).
 *   nvio__task    the contiguous run of an op's pieces given to a worker.
 *
 * Dependencies run one way (no cycles; nm shows it): handle -> workers,
 * track; submit -> file, plan, op, opmem, workers, track; op -> opmem,
 * track, file; workers -> op, opmem, engines, staging, cuda; opmem ->
 * plan, staging. fork.c (the fork generation) depends on nothing.
 *
 * Lock order: a thread never holds two of these locks at once:
 *   handle->lock (op accounting, completions, errors), worker->lock
 *   (task queue) and file->lock (the lazily opened O_DIRECT descriptor).
 */
#ifndef NVIO_INTERNAL_H
#define NVIO_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "nvio.h"
#include "engine.h"
#include "staging.h"

#define NVIO__PAGE 4096u
#define NVIO__MAX_BLOCK (1ull << 30)	/* one request must fit a syscall */

/* How one contiguous file range (an extent) is cut: see plan.c. */
struct nvio__plan {
	uint64_t off, len;	/* the file range */
	uint64_t head;		/* bytes before the aligned body */
	uint64_t body;		/* aligned body length (0: none) */
	uint64_t tail;		/* bytes after the body */
	uint64_t chunk;		/* body piece size */
	uint64_t npieces;	/* head? + body chunks + tail? */
};

void nvio__plan_make(struct nvio__plan *p, uint64_t off, uint64_t len,
		     uint64_t block, uint32_t align);
/* Piece k: file offset, length and whether it belongs to the body. */
void nvio__plan_piece(const struct nvio__plan *p, uint64_t k, uint64_t *off,
		      uint64_t *len, int *body);
/* Worker w of n gets pieces [*begin, *end) of npieces. */
void nvio__plan_slice(uint64_t npieces, unsigned w, unsigned n,
		      uint64_t *begin, uint64_t *end);

/*
 * An op's memory: one or more buffers laid end to end make the op's
 * "virtual buffer"; pos is where a buffer starts in it.
 */
struct nvio__seg {
	unsigned char *base;
	uint64_t len;
	uint64_t pos;
	uint32_t iov;		/* the caller's buffer (index in its vector) */
};

/* A contiguous file range of an op and where its bytes start in the
 * virtual buffer; first is the op-wide number of its first piece. */
struct nvio__extent {
	struct nvio__plan plan;
	uint64_t pos;
	uint64_t first;
};

/* One piece of an op, as plan.c and memory lookups see it. */
struct nvio__piece {
	uint64_t off, len;	/* file range */
	uint64_t pos;		/* in the virtual buffer */
	int body;		/* aligned body piece (O_DIRECT when direct) */
};
struct nvio__op;
void nvio__op_piece(const struct nvio__op *op, uint64_t k, struct nvio__piece *pc);
/* The bytes at pos, and in *avail how many follow in the same buffer. */
unsigned char *nvio__op_at(const struct nvio__op *op, uint64_t pos, uint64_t *avail);
/* The piece's bytes if they lie in one buffer, else NULL. */
unsigned char *nvio__op_mem(const struct nvio__op *op, uint64_t pos, uint64_t len);
/* Copies between the virtual buffer at pos and flat host memory, across
 * buffer boundaries (host memory only; CUDA goes through workers.c).
 * These lookups live in opmem.c. */
void nvio__op_gather(const struct nvio__op *op, void *dst, uint64_t pos, uint64_t len);
void nvio__op_scatter(const struct nvio__op *op, const void *src, uint64_t pos, uint64_t len);
/*
 * CRC-32s of an op's buffers (nvio_op_t.crc32), taken piece by piece by
 * whoever moves piece k, from bytes at [pos, pos + len) of the virtual
 * buffer: NVIO__CRC_MEM reads the op's memory; NVIO__CRC_FLAT reads
 * flat, a host copy of those bytes (a staged device piece);
 * NVIO__CRC_GATHER / NVIO__CRC_SCATTER copy between the op's host memory
 * and flat as nvio__op_gather / nvio__op_scatter do, checksumming each
 * step of the copy's source while it is in cache. A buffer whole in one
 * piece gets its CRC at once; the parts pieces share are joined, in
 * order, by nvio__op_crc_finish once every piece has moved. (opmem.c)
 */
enum { NVIO__CRC_MEM, NVIO__CRC_FLAT, NVIO__CRC_GATHER, NVIO__CRC_SCATTER };
struct nvio__crc_part {
	uint32_t first, last;	/* CRCs of piece k's first and last parts */
};
void nvio__op_crc(const struct nvio__op *op, uint64_t k, void *flat, uint64_t pos,
		  uint64_t len, int how);
void nvio__op_crc_finish(struct nvio__op *op);

struct nvio__task {
	struct nvio__op *op;
	struct nvio__task *next;	/* in the worker's queue */
	uint64_t next_piece, end_piece;	/* pieces still to issue */
	uint64_t left;			/* pieces not yet completed */
};

/* Where an op's bytes live; decides how staged pieces are copied. */
enum nvio__mem { NVIO__MEM_HOST = 0, NVIO__MEM_CUDA = 1 };

/*
 * Who learns that an op ended (track.c):
 *   SYNC   the submitter, waiting on op->done; it frees the op
 *   GROUP  a group (a generation of nvio_wait, or a stream) counts it
 *   QUEUE  a completion with the op's tag goes to its queue (nvio_queue)
 */
enum nvio__sink { NVIO__SINK_SYNC, NVIO__SINK_GROUP, NVIO__SINK_QUEUE };

/*
 * Ops that end together: the async ops of one nvio_wait generation, or
 * a stream's flushes. Guarded by the handle's lock.
 */
struct nvio__group {
	unsigned inflight;	/* accepted, not ended */
	unsigned done;		/* ended, not yet reported */
	int err;		/* the first failure among them, 0 if none */
	nvio_error_t rec;	/* its record */
};

/*
 * An open file (file.c). Its descriptors and facts are set at open and
 * read without locks; the O_DIRECT descriptor is opened on first need
 * under `lock`; size grows with writes (atomic max).
 */
struct nvio_file {
	struct nvio_handle *h;
	unsigned flags;		/* NVIO_FILE_* */
	char *path;		/* as given, or "fd N" */
	int by_path;		/* path names the file (else "fd N") */
	int fd;			/* buffered descriptor */
	int own_fd;
	int caller_fd;		/* from_fd: the caller's descriptor */
	struct stat st;		/* of fd at open */
	int plain;		/* not a regular file or block device */
	int split_small;	/* its device splits direct I/O from 4 KiB pages (pages.c) */
	uint32_t align;		/* O_DIRECT offset alignment, 0: none here */
	uint32_t mem_align;	/* O_DIRECT buffer alignment */
	pthread_mutex_t lock;	/* guards dfd_state, dfd, cufh */
	atomic_int dfd_state;	/* 0 untried, 1 open, <0 its error */
	int dfd, own_dfd;
	void *cufh;		/* cuFile registration, or NULL */
	int cufh_state;		/* 0 untried, 1 registered, <0 refused */
	_Atomic uint64_t size;	/* UINT64_MAX: has no size (pipe) */
	atomic_int failed;	/* an op on it failed: commit refuses */
	unsigned inflight;	/* ops in flight, under h->lock */
	/* ATOMIC files */
	int tmpfile;		/* an unnamed O_TMPFILE, linked at commit */
	char *tmp_path;		/* else the exclusive temporary's name */
	char *target;		/* path with its symbolic links followed */
	int keep_mode;		/* target existed: its permission bits */
	unsigned tmp_mode;
	int committed;
	int spare;		/* tmp_path is the target's spare, flock'ed on lock_fd */
	int lock_fd;		/* spare: holds its flock, never used for I/O, -1 */
	int exchange;		/* spare: the target existed, commit swaps the two */
	uint64_t spare_size;	/* spare: its size when taken (rolled back to) */
	int private;		/* made for one by-path/fd op, closed with it */
	int created;		/* its open created it */
};

/* pages.c: whether a direct op is better staged than sent from its pages */
int nvio__dev_splits_small_pages(dev_t dev);
int nvio__op_stage_small_pages(const struct nvio__op *op);
int64_t nvio__mem_huge_bytes(const void *p, uint64_t n);	/* -1: cannot tell */
/* Direct ops smaller than this always go from their own memory. */
#define NVIO__STAGE_PAGES_MIN (4u << 20)

/* file.c */
int nvio__file_make(struct nvio_handle *h, const char *path, int fd,
		    unsigned flags, struct nvio_file **out, const char **what);
void nvio__file_free(struct nvio_file *f);
/* The O_DIRECT descriptor, opened on first call: fd, or -errno. */
int nvio__file_dfd(struct nvio_file *f);
/* The cuFile handle, registered on first call: the handle or NULL. */
void *nvio__file_cufh(struct nvio_file *f);
/* Allocates [off, off + len) past the end of the file (see file.c). */
int nvio__file_grow(struct nvio_file *f, uint64_t off, uint64_t len);
/* A failed write that grew the file from `from` to `to` is undone. */
void nvio__file_shrink_back(struct nvio_file *f, uint64_t to, uint64_t from);
/* Records that the file now reaches at least end. */
void nvio__file_note_end(struct nvio_file *f, uint64_t end);
/* Puts an ATOMIC file in place of its path, fsyncing if durable. */
int nvio__file_commit(struct nvio_file *f, int durable, const char **what);
/* Closes the file's descriptors: the first failed close's -errno. */
int nvio__file_close_fds(struct nvio_file *f);
int nvio__file_fsync_dir(const char *path);

/*
 * temps.c: the name of a temporary of base (a file name) that carries
 * this process as its owner, "<dir>/" before it when dir is not NULL
 * (returns its length or -ENAMETOOLONG); and the sweep of dir's
 * temporaries whose owner is dead (of base's only, when not NULL), as
 * nvio_clean_temporaries(3) describes.
 */
int nvio__temp_name(char *buf, size_t len, const char *dir, const char *base);
int nvio__temps_sweep(const char *dir, const char *base, unsigned flags,
		      nvio_clean_fn *report, void *arg);
/*
 * temps.c: a target's spare (NVIO_FILE_SPARE), ".<base>.nvio-spare" in
 * dir ("<dir>/" before it when dir is not NULL; its length or
 * -ENAMETOOLONG); and the spare at path opened read-write and locked for
 * this writer (create: made anew, O_EXCL), or -errno when it cannot be
 * taken (none, a link, a hard link, another user's, in use).
 */
int nvio__spare_name(char *buf, size_t len, const char *dir, const char *base);
int nvio__spare_take(const char *path, int create);

struct nvio__op {
	struct nvio_handle *h;
	struct nvio_file *file;
	int own_file;		/* a private file: the op frees it */
	int on_heap;		/* else on its sync submitter's stack */
	uint64_t seq;
	uint64_t user_data;
	unsigned flags;		/* NVIO_ASYNC | NVIO_VALIDATE | NVIO_FSYNC */
	int is_write;
	int mem;		/* enum nvio__mem */
	int cuda_device;
	int sink;		/* enum nvio__sink */
	struct nvio__group *group;	/* GROUP: which */
	uint64_t nbytes;	/* total bytes */
	struct nvio__seg *segs;	/* the buffers; seg1 for one */
	uint32_t nsegs;
	struct nvio__seg seg1;
	struct nvio__extent *ext;	/* the file ranges; ext1 for one */
	uint32_t next;
	struct nvio__extent ext1;
	uint64_t npieces;	/* of all extents */
	uint64_t grew_from;	/* writes that grew the file: its size before */
	uint64_t grew_to;	/* ... and after (0: did not grow it) */
	int direct;		/* body pieces go through the file's dfd */
	int dfd;		/* that descriptor, or -1 */
	uint32_t mem_align;	/* for direct pieces */
	int stage_body;		/* direct pieces go through staging too (pages.c) */
	void *cufh;		/* cuFile handle: pieces go through cuFile */
	uint32_t *crc32;	/* the caller's CRC per buffer, or NULL */
	uint32_t ncrc;		/* its entries */
	struct nvio__crc_part *crc_parts;	/* one per piece, with crc32 */
	atomic_uint tasks_left;
	atomic_int err;		/* first error, 0 if none */
	/* Where it happened: written once, by the thread that set err, and
	 * read once the op has ended (nvio__op_record). */
	const char *fail_what;	/* a string literal: "pread", "fsync", ... */
	uint64_t fail_off, fail_len;
	int mem_unsure;		/* mem is HOST without asking (submit.c) */
	int done;		/* sync ops: set under handle->lock */
	/* QUEUE ops, under handle->lock (track.c): its queue, its place in
	 * the queue's list of ops in flight, and whether its pieces have
	 * all run (it is ending: too late to cancel) */
	struct nvio_queue *queue;
	struct nvio__op *qprev, *qnext;
	int ending;
	unsigned ntasks;
	struct nvio__task tasks[];
};

struct nvio__worker {
	struct nvio_handle *h;
	unsigned id;
	pthread_t thread;
	int started;
	const struct nvio__engine_ops *eng;	/* what the worker calls */
	const struct nvio__engine_ops *base;	/* eng, or under cuFile's */
	void *ectx;
	struct nvio__stage_pool stage;
	pthread_mutex_t lock;	/* guards queue, tail and stop */
	pthread_cond_t cond;
	struct nvio__task *queue, *tail;
	int stop;
	void *slots;		/* worker.c private: nvio__worker_slots slots */
};

/*
 * A completion queue (track.c): the tagged ops submitted to it, and the
 * completions of those that ended, for one consumer. Everything in it
 * is guarded by its handle's lock.
 */
struct nvio_queue {
	struct nvio_handle *h;
	pthread_cond_t cond;	/* a completion arrived */
	nvio_completion_t *cq;	/* ring of completions not yet reaped */
	unsigned cq_head, cq_count, cq_cap;
	unsigned tagged;	/* ops accepted, not yet ended */
	struct nvio__op *ops;	/* those ops (for cancel) */
	int efd;		/* nvio_queue_fd, -1 until asked */
	struct nvio_queue *next;	/* in h->queues */
};

struct nvio_handle {
	nvio_config_t cfg;	/* engine resolved */
	unsigned fork_gen;	/* nvio__fork_gen when it was made */
	int gds;		/* CUDA buffers go through cuFile */
	char engine_note[256];
	struct nvio__worker *workers;
	unsigned nworkers;
	atomic_uint_fast64_t seq;
	uint64_t id;		/* unique in the process, never reused */

	/* track.c owns everything below */
	pthread_mutex_t wait_lock;	/* waits take turns (nvio_wait) */
	pthread_mutex_t lock;	/* guards everything below, and files' inflight */
	pthread_cond_t cond;	/* an op ended */
	uint64_t gen;		/* new async ops join gens[gen & 1] */
	struct nvio__group gens[2];
	unsigned tagged;	/* tagged ops of all queues, not yet ended */
	struct nvio_queue *queues;	/* made by nvio_queue_create */
	nvio_error_t last;	/* the last failure any call returned */
	struct nvio_queue q0;	/* the default queue: nvio_submit, nvio_reap */
};


/*
 * handle.c: a handle belongs to the process that made it. Its worker
 * threads do not exist in a forked child, and its locks and counts are
 * frozen copies: every call made there on an inherited handle fails with
 * -ECHILD (nvio_strerror says why), and closing it frees nothing of the
 * parent's (no wait, no join, no unlink), so a child's exit never hangs.
 */
extern atomic_uint nvio__fork_gen;	/* fork.c */
/* fork.c: counts forks from the first call on; the generation now */
unsigned nvio__fork_watch(void);
static inline int nvio__forked(const struct nvio_handle *h)
{
	return h->fork_gen != atomic_load_explicit(&nvio__fork_gen,
						   memory_order_relaxed);
}

/*
 * track.c: where ended ops are reported, and errors.
 * nvio__track_begin registers an accepted op with its sink before any
 * piece runs; nvio__track_end reports it exactly once and says whether
 * the caller frees it (1) or its sync submitter does (0). nvio__group_wait waits until a
 * group has nothing in flight.
 */
void nvio__track_init(struct nvio_handle *h);
void nvio__track_fini(struct nvio_handle *h);
void nvio__track_begin(struct nvio__op *op);
int nvio__track_end(struct nvio__op *op);
void nvio__track_wait_sync(struct nvio__op *op);
/* A QUEUE op's pieces have all run: from now on cancel leaves it be. */
void nvio__track_ending(struct nvio__op *op);
/* The handle's default queue (handle create) and every queue (destroy). */
int nvio__queue_init(struct nvio_handle *h, struct nvio_queue *q);
void nvio__queues_fini(struct nvio_handle *h);
/* submit.c: n ops to a queue, as nvio_submit documents. */
int nvio__queue_submit(struct nvio_queue *q, const nvio_op_t *ops, unsigned n);
void nvio__group_wait(struct nvio_handle *h, struct nvio__group *g);
/* Waits until the handle has no op in flight on file f (f NULL: none). */
void nvio__track_quiesce(struct nvio_handle *h, const struct nvio_file *f);

/*
 * Error records. nvio__error_fill describes a failure of op
 * (which may be NULL); nvio__error_publish is called by the thread whose
 * call returns that failure: it becomes that thread's nvio_last_error()
 * for the handle, and the handle's for threads that have none of their
 * own. Returns e->err.
 */
void nvio__error_fill(nvio_error_t *e, int err, const struct nvio__op *op,
		      const char *what, uint64_t off, uint64_t len);
int nvio__error_publish(struct nvio_handle *h, const nvio_error_t *e);
/* Copies a growable struct out: min(their size, ours) bytes. */
int nvio__struct_out(void *dst, const void *src, size_t ours);

/*
 * The one retry policy (retry.c) for every request's result: -EINTR,
 * -EAGAIN and -EBUSY are tried again up to NVIO__MAX_RETRIES times,
 * then fail the op with that error.
 */
#define NVIO__MAX_RETRIES 1000
int nvio__retryable(int err);
int nvio__retry(unsigned *tries, int err);

/* workers.c; nvio__finish_short: the rest of a piece the kernel cut
 * short, through the buffered fd (0 or -errno; -ENODATA at end of file). */
int nvio__finish_short(struct nvio__op *op, const struct nvio__io *io, size_t got);
/* Requests a worker prepares at once: queue_depth in flight, and in
 * batch mode as many more for the next batch, so staged pieces are
 * copied into it while the current one runs. */
unsigned nvio__worker_slots(const nvio_config_t *c);
int nvio__workers_start(struct nvio_handle *h);
void nvio__workers_stop(struct nvio_handle *h);
void nvio__worker_push(struct nvio__worker *w, struct nvio__task *t);

/* submit.c: an op built by the caller (stream.c) goes through the same
 * checks and planning as every other; 0 or -errno (refused, op freed). */
struct nvio__opspec {
	struct nvio_file *file;
	int is_write;
	unsigned flags;
	unsigned char *buf;
	uint64_t nbytes;
	int64_t offset;
	const nvio_iovec_t *iov;	/* with vec: the buffers */
	uint32_t iovcnt;
	int vec;
	uint64_t user_data;
	int sink;
	struct nvio__group *group;
	struct nvio_queue *queue;	/* QUEUE: which */
	uint32_t *crc32;		/* nvio_op_t.crc32 */
};
int nvio__submit(struct nvio_handle *h, const struct nvio__opspec *sp);

/* op.c: the end of an op (validate, fsync, commit, report). */
void nvio__op_task_done(struct nvio__op *op);
/* The end of a sync op run in its caller's thread, which nobody else
 * waits for or counts: the epilogue only, no report. */
void nvio__op_finish_inline(struct nvio__op *op);
/* Records the op's first failure; `what` must be a string literal. The
 * first error is the op's; later ones are its consequences. Inline: every
 * layer that can fail an op (submit, workers, op, a cancel in track.c)
 * records it without calling into op.c. */
static inline void nvio__op_fail(struct nvio__op *op, int err, const char *what,
				 uint64_t off, uint64_t len)
{
	int expected = 0;

	if (atomic_compare_exchange_strong(&op->err, &expected, err)) {
		op->fail_what = what;
		op->fail_off = off;
		op->fail_len = len;
	}
}
/* The error record of an op that has ended with an error. */
void nvio__op_record(const struct nvio__op *op, nvio_error_t *e);
/* Frees the op (and its private file). */
void nvio__op_free(struct nvio__op *op);

/* locked.c */
int nvio__mem_alloc_aligned(void **out, size_t n, size_t align);

/*
 * cuda.c: run-time loaded CUDA; calls return -ENODEV without a driver.
 * nvio__cuda_pointer_device: 1 (and *device) for device memory, else 0.
 */
int nvio__cuda_pointer_device(const void *p, int *device);
/* 1 once a usable driver is loaded and initialised; 0 before (it may
 * have been loaded since the last look: nvio__cuda_pointer_device asks). */
int nvio__cuda_known(void);
/*
 * A worker's CUDA state: the device's primary context, retained once
 * while the worker uses the device (and released after), and a stream
 * on it for staged copies; stream NULL when closed.
 */
struct nvio__cuda_ctx {
	int device;
	void *ctx;
	void *stream;
};
int nvio__cuda_ctx_open(struct nvio__cuda_ctx *c, int device);
void nvio__cuda_ctx_close(struct nvio__cuda_ctx *c);
/* Makes c's context current in this thread: 0 or -errno. */
int nvio__cuda_ctx_use(const struct nvio__cuda_ctx *c);
int nvio__cuda_copy(void *dst, const void *src, size_t n, int to_device,
		    const struct nvio__cuda_ctx *c);
int nvio__cuda_host_register(void *p, size_t n);
void nvio__cuda_host_unregister(void *p);
/* Test hook, never set by the library: 1 leaves out the stream
 * synchronisation after a staged copy, the bug tests/test_gpusim.c shows
 * the simulated driver catches (wrong bytes). */
extern int nvio__cuda_break_sync;
void nvio__cuda_probe(nvio_probe_t *out);
/*
 * cufile.c: GPUDirect Storage. nvio__cufile_usable() opens the driver
 * once per process. An op registers its descriptor once (op_open) and
 * every worker moves its pieces with nvio__cufile_rw.
 */
void nvio__cufile_probe(nvio_probe_t *out);
int nvio__cufile_usable(void);
int nvio__cufile_open(int fd, void **fh);
void nvio__cufile_close(void *fh);
int nvio__cufile_rw(void *fh, int is_write, void *dev, uint64_t off,
		    uint64_t len, const char **what);

/*
 * crc32.c, for tests that compare the implementations: the table-driven
 * CRC-32 alone (what nvio_crc32 gives on CPUs without PCLMULQDQ); the
 * fastest implementation up to level (0 tables, 1 PCLMULQDQ folding, 2
 * VPCLMULQDQ folding) that the CPU has; and the level nvio_crc32 uses.
 */
uint32_t nvio__crc32_portable(uint32_t crc, const void *buf, size_t len);
uint32_t nvio__crc32_with(int level, uint32_t crc, const void *buf, size_t len);
int nvio__crc32_accelerated(void);

#endif
