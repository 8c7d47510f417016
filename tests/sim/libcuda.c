/*
 * tests/sim/libcuda.c - a simulated CUDA driver (libcuda.so.1) for the
 * tests, on machines without a GPU. It replaces the old synchronous stub
 * and behaves like the driver where GPU I/O code goes wrong:
 *
 *  - Device memory is a memfd mapped twice: the addresses handed out
 *    (CUdeviceptr) lie in a PROT_NONE mapping, so any host load or store
 *    of device memory faults (SIGSEGV), as on a GPU; the simulator alone
 *    reaches the bytes through a second, private read-write mapping.
 *  - cuMemcpy*Async only queues the copy on its stream. One simulator
 *    thread executes each stream's queue in order (streams in any order,
 *    cuStreamWaitEvent honoured), each copy after a random delay
 *    ($NVIO_SIM_DELAY_US, default 50 us): a staging buffer read or
 *    reused before cuStreamSynchronize holds the wrong bytes.
 *  - Streams, events, cuCtxSynchronize wait for real.
 *  - The current context is per thread; calls that need one fail with
 *    CUDA_ERROR_INVALID_CONTEXT without it, and with
 *    CUDA_ERROR_CONTEXT_IS_DESTROYED once its last retain is released.
 *  - Registered host memory is tracked: double registration, unknown
 *    unregistration and unregistering memory that queued copies still
 *    use are errors (the last is also counted as a violation). A
 *    registration belongs to the context current when it was made and
 *    goes when that context is destroyed (its last primary retain
 *    released); copies from memory no longer registered count as
 *    pageable (sim_cuda_pageable_copies), the driver's slow path.
 *  - Every entry point can be made to fail by count with the driver's
 *    codes: sim_cuda_fail() or $NVIO_SIM_FAIL ("name:after:times:code",
 *    ";"-separated; name "*" is any call, "copy" fails a queued copy when
 *    it executes, reported by the next synchronisation of its stream).
 *
 * Misuse the real driver would not always report (host memory
 * unregistered under a copy, a stream used from another context) is
 * counted in sim_cuda_violations(), which tests check stays 0. The
 * sim_cuda_* functions are the tests' back door (tests/sim/sim.h).
 */

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "sim.h"

#define API __attribute__((visibility("default")))

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct sim_ctx *CUcontext;
typedef struct sim_stream *CUstream;
typedef struct sim_event *CUevent;

enum {
	CUDA_SUCCESS = 0,
	CUDA_ERROR_INVALID_VALUE = 1,
	CUDA_ERROR_OUT_OF_MEMORY = 2,
	CUDA_ERROR_NOT_INITIALIZED = 3,
	CUDA_ERROR_INVALID_DEVICE = 101,
	CUDA_ERROR_INVALID_CONTEXT = 201,
	CUDA_ERROR_CONTEXT_IS_DESTROYED = 709,
	CUDA_ERROR_INVALID_HANDLE = 400,
	CUDA_ERROR_ILLEGAL_STATE = 401,
	CUDA_ERROR_NOT_READY = 600,
	CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712,
	CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED = 713,
	CUDA_ERROR_LAUNCH_FAILED = 719,
	CUDA_ERROR_UNKNOWN = 999,
};

#define MAX_DEVICES 8
#define MAX_ALLOCS 4096
#define MAX_HOSTREGS 1024
#define MAX_RULES 16
#define ALLOC_ALIGN 256

struct sim_ctx {
	int dev;
	long refs;		/* primary context retains */
	struct sim_stream *null_stream;
};

struct sim_stream {
	struct sim_ctx *ctx;
	uint64_t submitted, done;	/* op sequence numbers */
	CUresult err;		/* an executed copy failed: reported at sync */
	int alive;		/* not destroyed */
	unsigned queued;	/* ops not yet executed */
	unsigned refs;		/* events recorded on it, waits for it */
	struct op *head, *tail;	/* its queue, in order */
	struct sim_stream *next_all;
	struct sim_stream *next_busy;	/* in sim.busy while queued */
};

struct sim_event {
	struct sim_ctx *ctx;
	struct sim_stream *s;	/* NULL: never recorded (complete) */
	uint64_t seq;
	struct sim_event *next_all;
};

enum { OP_HTOD, OP_DTOH, OP_DTOD, OP_SET, OP_WAIT };

struct op {
	struct op *next;
	int kind;
	struct sim_stream *s;
	uint64_t seq;
	char *dst;		/* shadow or host address */
	const char *src;
	size_t n;
	int byte;
	uintptr_t host;		/* the host side, for unregister checks */
	size_t host_n;
	CUresult fail;
	struct timespec at;
	struct sim_stream *wait_s;	/* OP_WAIT: runs once wait_s->done */
	uint64_t wait_seq;		/* reaches wait_seq */
};

struct alloc { uintptr_t off; size_t n; int dev; };
struct hostreg { uintptr_t p; size_t n; struct sim_ctx *ctx; };
struct rule { char fn[48]; unsigned long after, times; CUresult code; };

/*
 * One lock for everything but the bytes: the executor copies without it.
 * sim.cond is broadcast whenever an op finishes or is queued.
 */
static struct {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int inited;
	int ndev;
	size_t arena_n;
	char *dev_base;		/* PROT_NONE: the addresses callers see */
	char *shadow;		/* read-write: the simulator's view */
	struct alloc allocs[MAX_ALLOCS];
	unsigned nallocs;	/* sorted by off */
	struct hostreg regs[MAX_HOSTREGS];
	unsigned nregs;
	struct sim_ctx ctx[MAX_DEVICES];
	struct sim_stream *streams;
	struct sim_event *events;
	struct sim_stream *busy;	/* streams with queued ops */
	unsigned long copies, pageable, violations, queued;
	unsigned delay_min_us, delay_us;
	uint64_t rng;
	struct rule rules[MAX_RULES];
	unsigned nrules;
	pthread_t thread;
} sim = { .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER };

static __thread struct sim_ctx *current;
static __thread struct sim_ctx *ctx_stack[8];
static __thread int ctx_depth;
static pthread_once_t sim_once = PTHREAD_ONCE_INIT;

static void violation(const char *fmt, const char *what)
{
	sim.violations++;
	fprintf(stderr, "cuda-sim: violation: ");
	fprintf(stderr, fmt, what);
	fputc('\n', stderr);
}

/* ---- failure injection (sim.lock held) ---- */

static void add_rule(const char *fn, unsigned long after, unsigned long times,
		     CUresult code)
{
	struct rule *r;

	for (unsigned i = 0; i < sim.nrules; i++)
		if (!strcmp(sim.rules[i].fn, fn)) {
			r = &sim.rules[i];
			goto set;
		}
	if (sim.nrules == MAX_RULES)
		return;
	r = &sim.rules[sim.nrules++];
	snprintf(r->fn, sizeof(r->fn), "%s", fn);
set:
	r->after = after;
	r->times = times;
	r->code = code;
}

static CUresult fail_now(const char *fn)
{
	for (unsigned i = 0; i < sim.nrules; i++) {
		struct rule *r = &sim.rules[i];

		if (!r->times || (strcmp(r->fn, fn) && strcmp(r->fn, "*")))
			continue;
		if (r->after > 0) {
			r->after--;
			continue;
		}
		if (r->times != SIM_ALWAYS)
			r->times--;
		return r->code;
	}
	return CUDA_SUCCESS;
}

/* "name:after:times:code;..." */
static void parse_rules(const char *spec)
{
	char buf[512], *save = NULL, *tok;

	snprintf(buf, sizeof(buf), "%s", spec);
	for (tok = strtok_r(buf, ";,", &save); tok; tok = strtok_r(NULL, ";,", &save)) {
		char fn[48];
		unsigned long after = 0, times = 1;
		int code = CUDA_ERROR_UNKNOWN;

		if (sscanf(tok, "%47[^:]:%lu:%lu:%d", fn, &after, &times, &code) >= 1)
			add_rule(fn, after, times, code);
	}
}

/* ---- memory ---- */

static void *executor(void *arg);

static void sim_setup(void)
{
	const char *e;
	int fd;

	sim.ndev = 2;
	sim.arena_n = (size_t)1 << 30;
	sim.delay_us = 50;
	sim.rng = 0x9e3779b97f4a7c15ull;
	if ((e = getenv("NVIO_SIM_DEVICES")) && *e)
		sim.ndev = atoi(e) > 0 && atoi(e) <= MAX_DEVICES ? atoi(e) : sim.ndev;
	if ((e = getenv("NVIO_SIM_MEM")) && *e)
		sim.arena_n = (size_t)strtoull(e, NULL, 0);
	if ((e = getenv("NVIO_SIM_DELAY_US")) && *e)
		sim.delay_us = (unsigned)atoi(e);
	if ((e = getenv("NVIO_SIM_SEED")) && *e)
		sim.rng = strtoull(e, NULL, 0) | 1;
	if ((e = getenv("NVIO_SIM_FAIL")) && *e)
		parse_rules(e);
	{
		pthread_condattr_t ca;

		pthread_condattr_init(&ca);
		pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
		pthread_cond_init(&sim.cond, &ca);
		pthread_condattr_destroy(&ca);
	}
	fd = memfd_create("cuda-sim-device-memory", MFD_CLOEXEC);
	if (fd < 0 || ftruncate(fd, (off_t)sim.arena_n) < 0) {
		perror("cuda-sim: memfd");
		abort();
	}
	sim.dev_base = mmap(NULL, sim.arena_n, PROT_NONE, MAP_SHARED, fd, 0);
	sim.shadow = mmap(NULL, sim.arena_n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (sim.dev_base == MAP_FAILED || sim.shadow == MAP_FAILED) {
		perror("cuda-sim: mmap");
		abort();
	}
	for (int i = 0; i < sim.ndev; i++) {
		struct sim_stream *s = calloc(1, sizeof(*s));

		if (!s)
			abort();
		sim.ctx[i].dev = i;
		s->ctx = &sim.ctx[i];
		s->alive = 1;
		sim.ctx[i].null_stream = s;
	}
	if (pthread_create(&sim.thread, NULL, executor, NULL)) {
		perror("cuda-sim: thread");
		abort();
	}
}

static void setup_once(void)
{
	pthread_once(&sim_once, sim_setup);
}

/* The allocation holding [p, p+n), or NULL. Lock held. */
static struct alloc *find_alloc(uintptr_t p, size_t n)
{
	uintptr_t base = (uintptr_t)sim.dev_base;

	if (!sim.dev_base || p < base || p - base >= sim.arena_n)
		return NULL;
	p -= base;
	for (unsigned i = 0; i < sim.nallocs; i++) {
		struct alloc *a = &sim.allocs[i];

		if (p >= a->off && p - a->off < (a->n ? a->n : 1))
			return n <= a->n - (p - a->off) ? a : NULL;
	}
	return NULL;
}

static int in_arena(uintptr_t p, size_t n)
{
	uintptr_t base = (uintptr_t)sim.dev_base;

	return sim.dev_base && p + n > base && p < base + sim.arena_n;
}

static char *shadow_of(uintptr_t p)
{
	return sim.shadow + (p - (uintptr_t)sim.dev_base);
}

/* First fit. Lock held. */
static void *alloc_locked(int dev, size_t n)
{
	size_t want = (n + ALLOC_ALIGN - 1) & ~(size_t)(ALLOC_ALIGN - 1);
	uintptr_t at = 0;
	unsigned i;

	if (!want)
		want = ALLOC_ALIGN;
	if (sim.nallocs == MAX_ALLOCS)
		return NULL;
	for (i = 0; i < sim.nallocs; i++) {
		if (sim.allocs[i].off - at >= want)
			break;
		at = sim.allocs[i].off +
		     ((sim.allocs[i].n + ALLOC_ALIGN - 1) & ~(size_t)(ALLOC_ALIGN - 1));
		if (!sim.allocs[i].n)
			at += ALLOC_ALIGN;
	}
	if (at + want > sim.arena_n)
		return NULL;
	memmove(&sim.allocs[i + 1], &sim.allocs[i], (sim.nallocs - i) * sizeof(sim.allocs[0]));
	sim.allocs[i] = (struct alloc){ at, n, dev };
	sim.nallocs++;
	return sim.dev_base + at;
}

/* Whether a queued or running op uses host memory in [p, p+n). Lock held. */
static int queued_touches(uintptr_t p, size_t n)
{
	for (struct sim_stream *s = sim.busy; s; s = s->next_busy)
		for (struct op *o = s->head; o; o = o->next)
			if (o->host_n && o->host < p + n && o->host + o->host_n > p)
				return 1;
	return 0;
}

/* A destroyed stream goes once nothing is queued on or refers to it. */
static void stream_free_if_idle(struct sim_stream *s)
{
	if (!s->alive && !s->queued && !s->refs)
		free(s);
}

static void wait_idle_locked(void)
{
	while (sim.queued)
		pthread_cond_wait(&sim.cond, &sim.lock);
}

/* Gives a freed range's pages back and zeroes it, like fresh memory. */
static void fallocate_punch(char *p, size_t n)
{
	uintptr_t a = ((uintptr_t)p + 4095) & ~(uintptr_t)4095;
	uintptr_t b = ((uintptr_t)p + n) & ~(uintptr_t)4095;

	if (b > a)
		madvise((void *)a, b - a, MADV_REMOVE);
}

static CUresult free_locked(uintptr_t p)
{
	uintptr_t off = p - (uintptr_t)sim.dev_base;

	for (unsigned i = 0; i < sim.nallocs; i++)
		if (in_arena(p, 1) && sim.allocs[i].off == off) {
			/* cuMemFree synchronises the device, as the driver's */
			wait_idle_locked();
			if (sim.allocs[i].n)
				fallocate_punch(shadow_of(p), sim.allocs[i].n);
			memmove(&sim.allocs[i], &sim.allocs[i + 1],
				(sim.nallocs - i - 1) * sizeof(sim.allocs[0]));
			sim.nallocs--;
			return CUDA_SUCCESS;
		}
	return CUDA_ERROR_INVALID_VALUE;
}

/* ---- the executor ---- */

static uint64_t rnd(void)
{
	sim.rng ^= sim.rng << 13;
	sim.rng ^= sim.rng >> 7;
	sim.rng ^= sim.rng << 17;
	return sim.rng;
}

static void op_done_locked(struct op *o)
{
	struct sim_stream *s = o->s;

	s->done = o->seq;
	if (o->fail && !s->err)
		s->err = o->fail;
	s->queued--;
	sim.queued--;
	if (!s->queued) {
		struct sim_stream **pb = &sim.busy;

		while (*pb != s)
			pb = &(*pb)->next_busy;
		*pb = s->next_busy;
		stream_free_if_idle(s);
	}
	pthread_cond_broadcast(&sim.cond);
}

static int ts_before(const struct timespec *a, const struct timespec *b)
{
	return a->tv_sec < b->tv_sec || (a->tv_sec == b->tv_sec && a->tv_nsec < b->tv_nsec);
}

/*
 * Runs the queued ops: each stream's in order, streams in any order
 * (whichever head is due first), an OP_WAIT only once the stream it
 * waits for has reached its event.
 */
static void *executor(void *arg)
{
	prctl(PR_SET_TIMERSLACK, 1000ul);	/* delays of microseconds */
	pthread_mutex_lock(&sim.lock);
	for (;;) {
		struct op *o = NULL;
		struct sim_stream *s;
		struct timespec now;

		for (s = sim.busy; s; s = s->next_busy) {
			struct op *h = s->head;

			if (h->kind == OP_WAIT && h->wait_s->done < h->wait_seq)
				continue;
			if (!o || ts_before(&h->at, &o->at))
				o = h;
		}
		if (!o) {
			pthread_cond_wait(&sim.cond, &sim.lock);
			continue;
		}
		clock_gettime(CLOCK_MONOTONIC, &now);
		if (ts_before(&now, &o->at)) {	/* or until new work comes */
			pthread_cond_timedwait(&sim.cond, &sim.lock, &o->at);
			continue;
		}
		/* The bytes move without the lock, as DMA does; the op stays
		 * at its stream's head (in flight) meanwhile. */
		pthread_mutex_unlock(&sim.lock);
		if (!o->fail && o->kind == OP_SET)
			memset(o->dst, o->byte, o->n);
		else if (!o->fail && o->kind != OP_WAIT)
			memmove(o->dst, o->src, o->n);
		pthread_mutex_lock(&sim.lock);
		s = o->s;
		s->head = o->next;
		if (!s->head)
			s->tail = NULL;
		if (o->kind == OP_WAIT) {
			o->wait_s->refs--;
			stream_free_if_idle(o->wait_s);
		} else if (!o->fail && o->kind != OP_SET) {
			sim.copies++;
		}
		op_done_locked(o);
		free(o);
	}
	return NULL;
}

/* Queues an op on s (lock held); its bytes move later. */
static CUresult enqueue(struct sim_stream *s, int kind, char *dst, const char *src,
			size_t n, int byte, uintptr_t host, size_t host_n)
{
	struct op *o = calloc(1, sizeof(*o));

	if (!o)
		return CUDA_ERROR_OUT_OF_MEMORY;
	o->kind = kind;
	o->s = s;
	o->dst = dst;
	o->src = src;
	o->n = n;
	o->byte = byte;
	o->host = host;
	o->host_n = host_n;
	o->fail = kind == OP_WAIT ? 0 : fail_now("copy");
	o->seq = ++s->submitted;
	clock_gettime(CLOCK_MONOTONIC, &o->at);
	if (sim.delay_us) {
		uint64_t lo = sim.delay_min_us < sim.delay_us ? sim.delay_min_us : sim.delay_us;
		uint64_t ns = (uint64_t)o->at.tv_nsec +
			      (lo + rnd() % (sim.delay_us - lo + 1ull)) * 1000;

		o->at.tv_sec += (time_t)(ns / 1000000000);
		o->at.tv_nsec = (long)(ns % 1000000000);
	}
	if (host_n) {
		int pinned = 0;

		for (unsigned i = 0; i < sim.nregs; i++)
			if (host >= sim.regs[i].p && host - sim.regs[i].p < sim.regs[i].n)
				pinned = 1;
		sim.pageable += !pinned;
	}
	if (!s->queued++) {
		s->next_busy = sim.busy;
		sim.busy = s;
	}
	sim.queued++;
	if (s->tail)
		s->tail->next = o;
	else
		s->head = o;
	s->tail = o;
	pthread_cond_broadcast(&sim.cond);
	return CUDA_SUCCESS;
}

static CUresult sync_stream_locked(struct sim_stream *s)
{
	uint64_t want = s->submitted;
	CUresult r;

	while (s->done < want)
		pthread_cond_wait(&sim.cond, &sim.lock);
	r = s->err;
	s->err = 0;
	return r;
}

/* ---- common checks ---- */

/* Every entry point starts here: initialised, and not told to fail. */
#define ENTER(name)						\
	CUresult r_;						\
	setup_once();						\
	pthread_mutex_lock(&sim.lock);				\
	if (!sim.inited && strcmp(name, "cuInit"))		\
		r_ = CUDA_ERROR_NOT_INITIALIZED;		\
	else							\
		r_ = fail_now(name);				\
	if (r_) {						\
		pthread_mutex_unlock(&sim.lock);		\
		return r_;					\
	}

#define LEAVE(r) do { CUresult v_ = (r); pthread_mutex_unlock(&sim.lock); return v_; } while (0)

/*
 * The synchronisations, told to fail, still wait for the work first, as
 * the driver's do: an error (sticky or the copy's own) is reported once
 * the stream has drained or been aborted, never with copies in flight.
 */
#define ENTER_SYNC(name)					\
	CUresult inj_;						\
	setup_once();						\
	pthread_mutex_lock(&sim.lock);				\
	if (!sim.inited) {					\
		pthread_mutex_unlock(&sim.lock);		\
		return CUDA_ERROR_NOT_INITIALIZED;		\
	}							\
	inj_ = fail_now(name);

static CUresult need_ctx(void)
{
	if (!current)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (current->refs <= 0)
		return CUDA_ERROR_CONTEXT_IS_DESTROYED;
	return CUDA_SUCCESS;
}

/* The stream to use (NULL: the context's own), which must belong to the
 * current context. */
static CUresult get_stream(CUstream in, struct sim_stream **out)
{
	struct sim_stream *s;
	CUresult r = need_ctx();

	if (r)
		return r;
	if (!in) {
		*out = current->null_stream;
		return CUDA_SUCCESS;
	}
	for (s = sim.streams; s && s != in; s = s->next_all)
		;
	if (!s)
		return CUDA_ERROR_INVALID_HANDLE;
	if (s->ctx != current) {
		violation("a stream of another context used (%s)", "stream");
		return CUDA_ERROR_INVALID_HANDLE;
	}
	*out = s;
	return CUDA_SUCCESS;
}

/* ---- the driver API ---- */

API CUresult cuInit(unsigned flags)
{
	ENTER("cuInit");
	if (flags)
		LEAVE(CUDA_ERROR_INVALID_VALUE);
	sim.inited = 1;
	LEAVE(CUDA_SUCCESS);
}

API CUresult cuDriverGetVersion(int *v)
{
	ENTER("cuDriverGetVersion");
	if (!v)
		LEAVE(CUDA_ERROR_INVALID_VALUE);
	*v = 12040;
	LEAVE(CUDA_SUCCESS);
}

API CUresult cuDeviceGetCount(int *n)
{
	ENTER("cuDeviceGetCount");
	if (!n)
		LEAVE(CUDA_ERROR_INVALID_VALUE);
	*n = sim.ndev;
	LEAVE(CUDA_SUCCESS);
}

API CUresult cuDeviceGet(CUdevice *dev, int ordinal)
{
	ENTER("cuDeviceGet");
	if (!dev)
		LEAVE(CUDA_ERROR_INVALID_VALUE);
	if (ordinal < 0 || ordinal >= sim.ndev)
		LEAVE(CUDA_ERROR_INVALID_DEVICE);
	*dev = ordinal;
	LEAVE(CUDA_SUCCESS);
}

API CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
	ENTER("cuDeviceGetName");
	if (!name || len <= 0)
		LEAVE(CUDA_ERROR_INVALID_VALUE);
	if (dev < 0 || dev >= sim.ndev)
		LEAVE(CUDA_ERROR_INVALID_DEVICE);
	snprintf(name, (size_t)len, "nvio simulated GPU %d", dev);
	LEAVE(CUDA_SUCCESS);
}

API CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
	ENTER("cuDeviceTotalMem_v2");
	if (!bytes)
		LEAVE(CUDA_ERROR_INVALID_VALUE);
	if (dev < 0 || dev >= sim.ndev)
		LEAVE(CUDA_ERROR_INVALID_DEVICE);
	*bytes = sim.arena_n;
	LEAVE(CUDA_SUCCESS);
}

API CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev)
{
	ENTER("cuDevicePrimaryCtxRetain");
	if (!ctx)
		LEAVE(CUDA_ERROR_INVALID_VALUE);
	if (dev < 0 || dev >= sim.ndev)
		LEAVE(CUDA_ERROR_INVALID_DEVICE);
	sim.ctx[dev].refs++;
	*ctx = &sim.ctx[dev];
	LEAVE(CUDA_SUCCESS);
}

API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
	ENTER("cuDevicePrimaryCtxRelease_v2");
	if (dev < 0 || dev >= sim.ndev)
		LEAVE(CUDA_ERROR_INVALID_DEVICE);
	if (sim.ctx[dev].refs <= 0)
		LEAVE(CUDA_ERROR_INVALID_CONTEXT);
	if (--sim.ctx[dev].refs == 0) {
		/* The context goes: its streams, events and host
		 * registrations with it (as the driver destroys a primary
		 * context whose last retain is released). */
		struct sim_stream **ps = &sim.streams;

		for (unsigned i = 0; i < sim.nregs; i++) {
			if (sim.regs[i].ctx != &sim.ctx[dev])
				continue;
			if (queued_touches(sim.regs[i].p, sim.regs[i].n))
				violation("context destroyed while %s",
					  "queued copies use its host registrations");
			sim.regs[i--] = sim.regs[--sim.nregs];
		}

		while (*ps) {
			struct sim_stream *s = *ps;

			if (s->ctx != &sim.ctx[dev]) {
				ps = &s->next_all;
				continue;
			}
			*ps = s->next_all;
			s->alive = 0;
			stream_free_if_idle(s);
		}
	}
	LEAVE(CUDA_SUCCESS);
}

API CUresult cuDevicePrimaryCtxRelease(CUdevice dev)
{
	return cuDevicePrimaryCtxRelease_v2(dev);
}

static int known_ctx(CUcontext c)
{
	for (int i = 0; i < sim.ndev; i++)
		if (c == &sim.ctx[i])
			return 1;
	return 0;
}

API CUresult cuCtxSetCurrent(CUcontext ctx)
{
	ENTER("cuCtxSetCurrent");
	if (ctx && !known_ctx(ctx))
		LEAVE(CUDA_ERROR_INVALID_CONTEXT);
	if (ctx && ctx->refs <= 0)
		LEAVE(CUDA_ERROR_CONTEXT_IS_DESTROYED);
	current = ctx;
	LEAVE(CUDA_SUCCESS);
}

API CUresult cuCtxGetCurrent(CUcontext *ctx)
{
	ENTER("cuCtxGetCurrent");
	if (!ctx)
		LEAVE(CUDA_ERROR_INVALID_VALUE);
	*ctx = current;
	LEAVE(CUDA_SUCCESS);
}

API CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
	ENTER("cuCtxPushCurrent_v2");
	if (!ctx || !known_ctx(ctx) || ctx_depth == 8)
		LEAVE(CUDA_ERROR_INVALID_VALUE);
	ctx_stack[ctx_depth++] = current;
	current = ctx;
	LEAVE(CUDA_SUCCESS);
}

API CUresult cuCtxPopCurrent_v2(CUcontext *ctx)
{
	ENTER("cuCtxPopCurrent_v2");
	if (!current)
		LEAVE(CUDA_ERROR_INVALID_CONTEXT);
	if (ctx)
		*ctx = current;
	current = ctx_depth > 0 ? ctx_stack[--ctx_depth] : NULL;
	LEAVE(CUDA_SUCCESS);
}

API CUresult cuCtxGetDevice(CUdevice *dev)
{
	ENTER("cuCtxGetDevice");
	CUresult r = need_ctx();

	if (r)
		LEAVE(r);
	if (!dev)
		LEAVE(CUDA_ERROR_INVALID_VALUE);
	*dev = current->dev;
	LEAVE(CUDA_SUCCESS);
}

API CUresult cuCtxSynchronize(void)
{
	ENTER_SYNC("cuCtxSynchronize");
	CUresult r = need_ctx(), e = CUDA_SUCCESS;

	if (r)
		LEAVE(r);
	for (struct sim_stream *s = sim.streams; s; s = s->next_all)
		if (s->ctx == current && (r = sync_stream_locked(s)) && !e)
			e = r;
	r = sync_stream_locked(current->null_stream);
	LEAVE(inj_ ? inj_ : e ? e : r);
}

API CUresult cuStreamCreate(CUstream *out, unsigned flags)
{
	ENTER("cuStreamCreate");
	CUresult r = need_ctx();
	struct sim_stream *s;

	if (r)
		LEAVE(r);
	if (!out || flags > 1)
		LEAVE(CUDA_ERROR_INVALID_VALUE);
	s = calloc(1, sizeof(*s));
	if (!s)
		LEAVE(CUDA_ERROR_OUT_OF_MEMORY);
	s->ctx = current;
	s->alive = 1;
	s->next_all = sim.streams;
	sim.streams = s;
	*out = s;
	LEAVE(CUDA_SUCCESS);
}

/* The stream goes at once; queued work still runs, as the driver's. */
API CUresult cuStreamDestroy_v2(CUstream in)
{
	ENTER("cuStreamDestroy_v2");
	struct sim_stream *s, **ps;
	CUresult r = in ? get_stream(in, &s) : CUDA_ERROR_INVALID_HANDLE;

	if (r)
		LEAVE(r);
	for (ps = &sim.streams; *ps != s; ps = &(*ps)->next_all)
		;
	*ps = s->next_all;
	s->alive = 0;
	stream_free_if_idle(s);
	LEAVE(CUDA_SUCCESS);
}

API CUresult cuStreamDestroy(CUstream s)
{
	return cuStreamDestroy_v2(s);
}

API CUresult cuStreamSynchronize(CUstream in)
{
	ENTER_SYNC("cuStreamSynchronize");
	struct sim_stream *s;
	CUresult r = get_stream(in, &s);

	if (r)
		LEAVE(r);
	r = sync_stream_locked(s);
	LEAVE(inj_ ? inj_ : r);
}

API CUresult cuStreamQuery(CUstream in)
{
	ENTER("cuStreamQuery");
	struct sim_stream *s;
	CUresult r = get_stream(in, &s);

	if (r)
		LEAVE(r);
	LEAVE(s->done < s->submitted ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS);
}

API CUresult cuEventCreate(CUevent *out, unsigned flags)
{
	ENTER("cuEventCreate");
	CUresult r = need_ctx();
	struct sim_event *e;

	if (r)
		LEAVE(r);
	if (!out)
		LEAVE(CUDA_ERROR_INVALID_VALUE);
	e = calloc(1, sizeof(*e));
	if (!e)
		LEAVE(CUDA_ERROR_OUT_OF_MEMORY);
	e->ctx = current;
	e->next_all = sim.events;
	sim.events = e;
	*out = e;
	LEAVE(CUDA_SUCCESS);
}

static struct sim_event *find_event(CUevent in)
{
	struct sim_event *e;

	for (e = sim.events; e && e != in; e = e->next_all)
		;
	return e;
}

API CUresult cuEventDestroy_v2(CUevent in)
{
	ENTER("cuEventDestroy_v2");
	struct sim_event **pe;

	for (pe = &sim.events; *pe && *pe != in; pe = &(*pe)->next_all)
		;
	if (!in || !*pe)
		LEAVE(CUDA_ERROR_INVALID_HANDLE);
	*pe = in->next_all;
	if (in->s) {
		in->s->refs--;
		stream_free_if_idle(in->s);
	}
	free(in);
	LEAVE(CUDA_SUCCESS);
}

API CUresult cuEventRecord(CUevent in, CUstream sin)
{
	ENTER("cuEventRecord");
	struct sim_event *e = find_event(in);
	struct sim_stream *s;
	CUresult r;

	if (!e)
		LEAVE(CUDA_ERROR_INVALID_HANDLE);
	if ((r = get_stream(sin, &s)))
		LEAVE(r);
	if (e->ctx != s->ctx)
		LEAVE(CUDA_ERROR_INVALID_HANDLE);
	if (e->s) {
		e->s->refs--;
		stream_free_if_idle(e->s);
	}
	s->refs++;
	e->s = s;
	e->seq = s->submitted;
	LEAVE(CUDA_SUCCESS);
}

static int event_done(const struct sim_event *e)
{
	return !e->s || e->s->done >= e->seq;
}

API CUresult cuEventQuery(CUevent in)
{
	ENTER("cuEventQuery");
	struct sim_event *e = find_event(in);

	if (!e)
		LEAVE(CUDA_ERROR_INVALID_HANDLE);
	LEAVE(event_done(e) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY);
}

API CUresult cuEventSynchronize(CUevent in)
{
	ENTER_SYNC("cuEventSynchronize");
	struct sim_event *e = find_event(in);

	if (!e)
		LEAVE(CUDA_ERROR_INVALID_HANDLE);
	while (!event_done(e))
		pthread_cond_wait(&sim.cond, &sim.lock);
	LEAVE(inj_);
}

/* Later work of the stream waits until the event's stream has done the
 * work recorded before the event. */
API CUresult cuStreamWaitEvent(CUstream sin, CUevent in, unsigned flags)
{
	ENTER("cuStreamWaitEvent");
	struct sim_stream *s;
	struct sim_event *e = find_event(in);
	CUresult r = get_stream(sin, &s);

	if (r)
		LEAVE(r);
	if (!e)
		LEAVE(CUDA_ERROR_INVALID_HANDLE);
	if (event_done(e) || e->s == s)
		LEAVE(CUDA_SUCCESS);
	r = enqueue(s, OP_WAIT, NULL, NULL, 0, 0, 0, 0);
	if (!r) {
		s->tail->wait_s = e->s;
		s->tail->wait_seq = e->seq;
		e->s->refs++;
	}
	LEAVE(r);
}

API CUresult cuPointerGetAttribute(void *data, int attr, CUdeviceptr p)
{
	ENTER("cuPointerGetAttribute");
	struct alloc *a = find_alloc((uintptr_t)p, 1);
	int host = 0;

	if (!data)
		LEAVE(CUDA_ERROR_INVALID_VALUE);
	if (!a) {
		for (unsigned i = 0; i < sim.nregs; i++)
			if (p >= sim.regs[i].p && p - sim.regs[i].p < sim.regs[i].n)
				host = 1;
		if (!host)
			LEAVE(CUDA_ERROR_INVALID_VALUE);	/* plain host memory */
	}
	switch (attr) {
	case 1:		/* CONTEXT */
		*(CUcontext *)data = a ? &sim.ctx[a->dev] : NULL;
		break;
	case 2:		/* MEMORY_TYPE: device 2, host 1 */
		*(unsigned *)data = a ? 2 : 1;
		break;
	case 3:		/* DEVICE_POINTER */
	case 4:		/* HOST_POINTER */
		if (!a && attr == 3)
			LEAVE(CUDA_ERROR_INVALID_VALUE);
		if (a && attr == 4)
			LEAVE(CUDA_ERROR_INVALID_VALUE);
		*(CUdeviceptr *)data = p;
		break;
	case 8:		/* IS_MANAGED */
		*(int *)data = 0;
		break;
	case 9:		/* DEVICE_ORDINAL */
		*(int *)data = a ? a->dev : 0;
		break;
	case 11:	/* RANGE_START_ADDR */
		if (!a)
			LEAVE(CUDA_ERROR_INVALID_VALUE);
		*(CUdeviceptr *)data = (CUdeviceptr)(uintptr_t)(sim.dev_base + a->off);
		break;
	case 12:	/* RANGE_SIZE */
		if (!a)
			LEAVE(CUDA_ERROR_INVALID_VALUE);
		*(size_t *)data = a->n;
		break;
	default:
		LEAVE(CUDA_ERROR_INVALID_VALUE);
	}
	LEAVE(CUDA_SUCCESS);
}

API CUresult cuMemAlloc_v2(CUdeviceptr *out, size_t n)
{
	ENTER("cuMemAlloc_v2");
	CUresult r = need_ctx();
	void *p;

	if (r)
		LEAVE(r);
	if (!out || !n)
		LEAVE(CUDA_ERROR_INVALID_VALUE);
	p = alloc_locked(current->dev, n);
	if (!p)
		LEAVE(CUDA_ERROR_OUT_OF_MEMORY);
	*out = (CUdeviceptr)(uintptr_t)p;
	LEAVE(CUDA_SUCCESS);
}

API CUresult cuMemFree_v2(CUdeviceptr p)
{
	ENTER("cuMemFree_v2");
	CUresult r = need_ctx();

	if (r)
		LEAVE(r);
	LEAVE(free_locked((uintptr_t)p));
}

API CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total)
{
	ENTER("cuMemGetInfo_v2");
	CUresult r = need_ctx();
	size_t used = 0;

	if (r)
		LEAVE(r);
	for (unsigned i = 0; i < sim.nallocs; i++)
		used += sim.allocs[i].n;
	if (free_b)
		*free_b = sim.arena_n - used;
	if (total)
		*total = sim.arena_n;
	LEAVE(CUDA_SUCCESS);
}

/* Checks a copy's sides and queues it. dir: OP_HTOD, OP_DTOH, OP_DTOD. */
static CUresult copy_locked(int kind, uintptr_t dst, uintptr_t src, size_t n,
			    CUstream sin, int wait)
{
	struct sim_stream *s;
	CUresult r = get_stream(sin, &s);
	uintptr_t host = kind == OP_HTOD ? src : kind == OP_DTOH ? dst : 0;
	char *d, *sp;

	if (r)
		return r;
	if (n == 0)
		return CUDA_SUCCESS;
	if ((kind != OP_HTOD && !find_alloc(src, n)) ||
	    (kind != OP_DTOH && !find_alloc(dst, n)))
		return CUDA_ERROR_INVALID_VALUE;
	if (kind != OP_DTOD && (!host || in_arena(host, n)))
		return CUDA_ERROR_INVALID_VALUE;	/* "host" memory that is not */
	d = kind == OP_DTOH ? (char *)dst : shadow_of(dst);
	sp = kind == OP_HTOD ? (char *)src : shadow_of(src);
	r = enqueue(s, kind, d, sp, n, 0, host, host ? n : 0);
	if (!r && wait)
		r = sync_stream_locked(s);
	return r;
}

API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s)
{
	ENTER("cuMemcpyHtoDAsync_v2");
	LEAVE(copy_locked(OP_HTOD, (uintptr_t)dst, (uintptr_t)src, n, s, 0));
}

API CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s)
{
	ENTER("cuMemcpyDtoHAsync_v2");
	LEAVE(copy_locked(OP_DTOH, (uintptr_t)dst, (uintptr_t)src, n, s, 0));
}

API CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s)
{
	ENTER("cuMemcpyDtoDAsync_v2");
	LEAVE(copy_locked(OP_DTOD, (uintptr_t)dst, (uintptr_t)src, n, s, 0));
}

/* The synchronous copies run on the context's own stream and wait. */
API CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n)
{
	ENTER("cuMemcpyHtoD_v2");
	LEAVE(copy_locked(OP_HTOD, (uintptr_t)dst, (uintptr_t)src, n, NULL, 1));
}

API CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n)
{
	ENTER("cuMemcpyDtoH_v2");
	LEAVE(copy_locked(OP_DTOH, (uintptr_t)dst, (uintptr_t)src, n, NULL, 1));
}

API CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
	ENTER("cuMemcpyDtoD_v2");
	LEAVE(copy_locked(OP_DTOD, (uintptr_t)dst, (uintptr_t)src, n, NULL, 1));
}

static CUresult memset_locked(uintptr_t dst, int byte, size_t n, CUstream sin, int wait)
{
	struct sim_stream *s;
	CUresult r = get_stream(sin, &s);

	if (r)
		return r;
	if (n == 0)
		return CUDA_SUCCESS;
	if (!find_alloc(dst, n))
		return CUDA_ERROR_INVALID_VALUE;
	r = enqueue(s, OP_SET, shadow_of(dst), NULL, n, byte, 0, 0);
	if (r)
		return r;
	return wait ? sync_stream_locked(s) : CUDA_SUCCESS;
}

API CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char byte, size_t n)
{
	ENTER("cuMemsetD8_v2");
	LEAVE(memset_locked((uintptr_t)dst, byte, n, NULL, 1));
}

API CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char byte, size_t n, CUstream s)
{
	ENTER("cuMemsetD8Async");
	LEAVE(memset_locked((uintptr_t)dst, byte, n, s, 0));
}

API CUresult cuMemHostRegister_v2(void *p, size_t n, unsigned flags)
{
	ENTER("cuMemHostRegister_v2");
	CUresult r = need_ctx();
	uintptr_t a = (uintptr_t)p;

	if (r)
		LEAVE(r);
	if (!p || !n || in_arena(a, n) || flags > 0xf)
		LEAVE(CUDA_ERROR_INVALID_VALUE);
	for (unsigned i = 0; i < sim.nregs; i++)
		if (a < sim.regs[i].p + sim.regs[i].n && a + n > sim.regs[i].p)
			LEAVE(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
	if (sim.nregs == MAX_HOSTREGS)
		LEAVE(CUDA_ERROR_OUT_OF_MEMORY);
	sim.regs[sim.nregs++] = (struct hostreg){ a, n, current };
	LEAVE(CUDA_SUCCESS);
}

API CUresult cuMemHostUnregister(void *p)
{
	ENTER("cuMemHostUnregister");
	CUresult r = need_ctx();

	if (r)
		LEAVE(r);
	for (unsigned i = 0; i < sim.nregs; i++) {
		if (sim.regs[i].p != (uintptr_t)p)
			continue;
		if (queued_touches(sim.regs[i].p, sim.regs[i].n)) {
			violation("host memory unregistered while %s",
				  "queued copies still use it");
			LEAVE(CUDA_ERROR_ILLEGAL_STATE);
		}
		sim.regs[i] = sim.regs[--sim.nregs];
		LEAVE(CUDA_SUCCESS);
	}
	LEAVE(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
}

static const char *err_name(CUresult r)
{
	switch (r) {
	case 0: return "CUDA_SUCCESS";
	case 1: return "CUDA_ERROR_INVALID_VALUE";
	case 2: return "CUDA_ERROR_OUT_OF_MEMORY";
	case 3: return "CUDA_ERROR_NOT_INITIALIZED";
	case 101: return "CUDA_ERROR_INVALID_DEVICE";
	case 201: return "CUDA_ERROR_INVALID_CONTEXT";
	case 400: return "CUDA_ERROR_INVALID_HANDLE";
	case 401: return "CUDA_ERROR_ILLEGAL_STATE";
	case 600: return "CUDA_ERROR_NOT_READY";
	case 709: return "CUDA_ERROR_CONTEXT_IS_DESTROYED";
	case 712: return "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED";
	case 713: return "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED";
	case 719: return "CUDA_ERROR_LAUNCH_FAILED";
	case 999: return "CUDA_ERROR_UNKNOWN";
	default: return NULL;
	}
}

API CUresult cuGetErrorName(CUresult r, const char **name)
{
	if (!name || !err_name(r))
		return CUDA_ERROR_INVALID_VALUE;
	*name = err_name(r);
	return CUDA_SUCCESS;
}

API CUresult cuGetErrorString(CUresult r, const char **s)
{
	return cuGetErrorName(r, s);
}

/* ---- the tests' back door (sim.h) ---- */

API void *sim_cuda_alloc(int dev, size_t n)
{
	void *p;

	setup_once();
	pthread_mutex_lock(&sim.lock);
	p = dev >= 0 && dev < sim.ndev ? alloc_locked(dev, n) : NULL;
	pthread_mutex_unlock(&sim.lock);
	return p;
}

API int sim_cuda_free(void *p)
{
	CUresult r;

	setup_once();
	pthread_mutex_lock(&sim.lock);
	r = free_locked((uintptr_t)p);
	pthread_mutex_unlock(&sim.lock);
	return r ? -1 : 0;
}

/* Synchronous, beside the queues: for tests to set and check bytes. */
static int backdoor(void *dst, const void *src, size_t n, int to_dev, int byte)
{
	uintptr_t d = (uintptr_t)(to_dev ? dst : src);
	int ok;

	setup_once();
	pthread_mutex_lock(&sim.lock);
	ok = n == 0 || find_alloc(d, n) != NULL;
	pthread_mutex_unlock(&sim.lock);
	if (!ok)
		return -1;
	if (byte >= 0)
		memset(shadow_of(d), byte, n);
	else if (to_dev)
		memcpy(shadow_of(d), src, n);
	else
		memcpy(dst, shadow_of(d), n);
	return 0;
}

API int sim_cuda_peek(void *host, const void *dev, size_t n)
{
	return backdoor(host, dev, n, 0, -1);
}

API int sim_cuda_poke(void *dev, const void *host, size_t n)
{
	return backdoor(dev, host, n, 1, -1);
}

API int sim_cuda_fill(void *dev, int byte, size_t n)
{
	return backdoor(dev, NULL, n, 1, byte & 0xff);
}

API void *sim_cuda_shadow(const void *dev, size_t n, int *device)
{
	struct alloc *a;

	setup_once();
	pthread_mutex_lock(&sim.lock);
	a = find_alloc((uintptr_t)dev, n);
	if (a && device)
		*device = a->dev;
	pthread_mutex_unlock(&sim.lock);
	return a ? shadow_of((uintptr_t)dev) : NULL;
}

API int sim_cuda_range(const void *dev, void **base, size_t *n)
{
	struct alloc *a;

	setup_once();
	pthread_mutex_lock(&sim.lock);
	a = find_alloc((uintptr_t)dev, 1);
	if (a) {
		*base = sim.dev_base + a->off;
		*n = a->n;
	}
	pthread_mutex_unlock(&sim.lock);
	return a ? 0 : -1;
}

#define COUNTER(name, expr)			\
	API unsigned long name(void)		\
	{					\
		unsigned long v;		\
		setup_once();			\
		pthread_mutex_lock(&sim.lock);	\
		v = (expr);			\
		pthread_mutex_unlock(&sim.lock);\
		return v;			\
	}

COUNTER(sim_cuda_copies, sim.copies)
COUNTER(sim_cuda_pageable_copies, sim.pageable)
COUNTER(sim_cuda_violations, sim.violations)
COUNTER(sim_cuda_queued, sim.queued)
COUNTER(sim_cuda_host_registered, sim.nregs)
COUNTER(sim_cuda_allocations, sim.nallocs)

API long sim_cuda_ctx_refs(void)
{
	long n = 0;

	setup_once();
	pthread_mutex_lock(&sim.lock);
	for (int i = 0; i < sim.ndev; i++)
		n += sim.ctx[i].refs;
	pthread_mutex_unlock(&sim.lock);
	return n;
}

API void sim_cuda_fail(const char *fn, unsigned long after, unsigned long times, int code)
{
	setup_once();
	pthread_mutex_lock(&sim.lock);
	add_rule(fn, after, times, code);
	pthread_mutex_unlock(&sim.lock);
}

API void sim_cuda_set_delay(unsigned min_us, unsigned max_us)
{
	setup_once();
	pthread_mutex_lock(&sim.lock);
	sim.delay_min_us = min_us;
	sim.delay_us = max_us;
	pthread_mutex_unlock(&sim.lock);
}

API void sim_cuda_wait_idle(void)
{
	setup_once();
	pthread_mutex_lock(&sim.lock);
	wait_idle_locked();
	pthread_mutex_unlock(&sim.lock);
}
