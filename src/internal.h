/*
 * internal.h - what the files of libnvio share. Nothing here is public.
 *
 * Objects and who owns them:
 *   nvio_handle   owns its workers (threads, engine contexts, staging
 *                 pools) and the bookkeeping of ops in flight.
 *   nvio__op      one accepted request. Allocated at submit with one
 *                 nvio__task per worker embedded in it; freed by the thread
 *                 that finishes it (async) or by the submitter (sync).
 *   nvio__task    the contiguous run of an op's pieces given to a worker.
 *
 * Lock order: a thread never holds two of these locks at once:
 *   handle->lock (op accounting, errors) and worker->lock (task queue).
 */
#ifndef NVIO_INTERNAL_H
#define NVIO_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

#include "nvio.h"
#include "engine.h"
#include "staging.h"

#define NVIO__PAGE 4096u
#define NVIO__MAX_BLOCK (1ull << 30)	/* one request must fit a syscall */

/* How an op's byte range is cut: see plan.c. */
struct nvio__plan {
	uint64_t off, len;	/* the file range of the whole op */
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
/* Worker w of n gets pieces [*begin, *end). */
void nvio__plan_slice(const struct nvio__plan *p, unsigned w, unsigned n,
		      uint64_t *begin, uint64_t *end);

struct nvio__op;

struct nvio__task {
	struct nvio__op *op;
	struct nvio__task *next;	/* in the worker's queue */
	uint64_t next_piece, end_piece;	/* pieces still to issue */
	uint64_t left;			/* pieces not yet completed */
};

/* Where an op's bytes live; decides how staged pieces are copied. */
enum nvio__mem { NVIO__MEM_HOST = 0, NVIO__MEM_CUDA = 1 };

struct nvio__op {
	struct nvio_handle *h;
	uint64_t seq;
	unsigned flags;		/* NVIO_ASYNC | NVIO_VALIDATE | NVIO_FSYNC */
	int is_write;
	int mem;		/* enum nvio__mem */
	int cuda_device;
	unsigned char *buf;
	struct nvio__plan plan;
	int fd;			/* buffered descriptor: head, tail, !direct */
	int dfd;		/* O_DIRECT descriptor or -1 */
	int own_fd, own_dfd;	/* close them when the op ends */
	int stage;		/* body pieces go through staging buffers */
	void *cufh;		/* cuFile handle: pieces go through cuFile */
	int plain;		/* not a file or block device: pieces go
				 * through pread/pwrite (AIO refuses them) */
	char *path;		/* for errors; the target of write_file */
	int by_path;		/* path names the file (else it says "fd N") */
	char *tmp_path;		/* write_file: the temporary, else NULL */
	char *target;		/* write_file: path with its symbolic links
				 * followed, the name the temporary replaces */
	int keep_mode;		/* write_file over a file: give the */
	unsigned tmp_mode;	/* temporary these permissions */
	atomic_uint tasks_left;
	atomic_int err;		/* first error, 0 if none */
	/* Where it happened: written once, by the thread that set err, and
	 * read once the op has ended (nvio__op_record). */
	const char *fail_what;	/* a string literal: "pread", "fsync", ... */
	uint64_t fail_off, fail_len;
	int done;		/* sync ops: set under handle->lock */
	unsigned gen;		/* async ops: index in handle->gens */
	unsigned ntasks;
	struct nvio__task tasks[];
};

struct nvio__worker {
	struct nvio_handle *h;
	unsigned id;
	pthread_t thread;
	int started;
	const struct nvio__engine_ops *eng;
	void *ectx;
	struct nvio__stage_pool stage;
	pthread_mutex_t lock;	/* guards queue, tail and stop */
	pthread_cond_t cond;
	struct nvio__task *queue, *tail;
	int stop;
	void *slots;		/* worker.c private: nvio__worker_slots slots */
};

/*
 * Async ops of one generation: those submitted before a wait, which it
 * waits for and reports together, while ops other threads submit
 * meanwhile join the next generation. Waits take turns, so at most two
 * generations have ops not yet reported.
 */
struct nvio__gen {
	unsigned inflight;	/* accepted, not ended */
	unsigned done;		/* ended, not yet reported */
	int err;		/* the first failure among them, 0 if none */
	nvio_error_t rec;	/* its record */
};

struct nvio_handle {
	nvio_config_t cfg;	/* engine resolved */
	int gds;		/* CUDA buffers go through cuFile */
	char engine_note[256];
	struct nvio__worker *workers;
	unsigned nworkers;
	atomic_uint_fast64_t seq;
	uint64_t id;		/* unique in the process, never reused */

	pthread_mutex_t wait_lock;	/* waits take turns (nvio_wait) */
	pthread_mutex_t lock;	/* guards everything below */
	pthread_cond_t cond;	/* an op finished */
	uint64_t gen;		/* new async ops join gens[gen & 1] */
	struct nvio__gen gens[2];
	nvio_error_t last;	/* the last failure any call returned */
};

/*
 * handle.c: error records. nvio__error_fill describes a failure of op
 * (which may be NULL); nvio__error_publish is called by the thread whose
 * call returns that failure: it becomes that thread's nvio_last_error()
 * for the handle, and the handle's for threads that have none of their
 * own. Returns e->err.
 */
void nvio__error_fill(nvio_error_t *e, int err, const struct nvio__op *op,
		      const char *what, uint64_t off, uint64_t len);
int nvio__error_publish(struct nvio_handle *h, const nvio_error_t *e);

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

/* op.c: the end of an op (validate, fsync, rename, close, report). */
void nvio__op_task_done(struct nvio__op *op);
/* Records the op's first failure; `what` must be a string literal. */
void nvio__op_fail(struct nvio__op *op, int err, const char *what,
		   uint64_t off, uint64_t len);
/* The error record of an op that has ended with an error. */
void nvio__op_record(const struct nvio__op *op, nvio_error_t *e);
/* Closes what the op still owns and frees it. */
void nvio__op_free(struct nvio__op *op);

/* locked.c */
int nvio__mem_alloc_aligned(void **out, size_t n, size_t align);

/*
 * cuda.c: run-time loaded CUDA; calls return -ENODEV without a driver.
 * nvio__cuda_pointer_device: 1 (and *device) for device memory, else 0.
 */
int nvio__cuda_pointer_device(const void *p, int *device);
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
int nvio__cuda_copy(void *dst, const void *src, size_t n, int to_device,
		    const struct nvio__cuda_ctx *c);
int nvio__cuda_host_register(void *p, size_t n);
void nvio__cuda_host_unregister(void *p);
void nvio__cuda_probe(nvio_probe_t *out);
/*
 * cufile.c: GPUDirect Storage. nvio__cufile_usable() opens the driver
 * once per process. An op registers its descriptor once (op_open) and
 * every worker moves its pieces with nvio__cufile_rw.
 */
void nvio__cufile_probe(nvio_probe_t *out);
int nvio__cufile_usable(void);
int nvio__cufile_op_open(struct nvio__op *op, int fd);
void nvio__cufile_op_close(struct nvio__op *op);
int nvio__cufile_rw(struct nvio__op *op, uint64_t off, uint64_t len,
		    const char **what);

#endif
