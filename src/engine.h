/*
 * engine.h - the interface every I/O engine implements.
 *
 * An engine context belongs to one worker thread and is used by that
 * thread alone. The worker hands it requests (nvio__io) and later takes
 * back their completions; the engine never retries, splits or checks a
 * result: it reports what the kernel said, through nvio__sys.io_result.
 */
#ifndef NVIO_ENGINE_H
#define NVIO_ENGINE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

/* One request. The worker owns it; the engine borrows it until reaped. */
struct nvio__io {
	int fd;
	int is_write;
	void *buf;
	size_t len;		/* with iov: the total of its parts */
	const struct iovec *iov;	/* NULL, or the parts of a vectored */
	int iovcnt;			/* request (then buf is unused) */
	uint64_t off;
	ssize_t res;	/* set at completion: bytes moved or -errno */
	void *fh;	/* cuFile handle: the cuFile engine moves it; buf is
			 * then device memory. NULL for every other engine. */
	_Alignas(16) unsigned char priv[64];	/* engine scratch (iocb) */
};

#define NVIO__ENGINE_OPS_VERSION 1

struct nvio__engine_ops {
	unsigned version;
	int id;			/* nvio_engine_t */
	const char *name;
	/* 1 if usable in this process, else 0 and a reason with a fix. */
	int (*available)(char *why, size_t len);
	/* Context able to hold `depth` requests in flight. 0 or -errno. */
	int (*init)(void **ctx, unsigned depth);
	void (*fini)(void *ctx);
	/*
	 * Queues n requests, in one system call or, with single != 0, one
	 * per request. Returns how many were accepted (the caller keeps the
	 * rest) or -errno if none was.
	 */
	int (*submit)(void *ctx, struct nvio__io **ios, unsigned n, int single);
	/*
	 * Waits until at least min requests have completed (min may be 0),
	 * stores up to max of them in out with res set, returns the count
	 * or -errno (-EINTR: call again).
	 */
	int (*reap)(void *ctx, struct nvio__io **out, unsigned min, unsigned max);
};

extern const struct nvio__engine_ops nvio__engine_uring;
extern const struct nvio__engine_ops nvio__engine_aio;
extern const struct nvio__engine_ops nvio__engine_psync;
/* cuFile rides on a base engine (engine_cufile.c): made with wrap, which
 * takes over bctx (fini frees both). */
extern const struct nvio__engine_ops nvio__engine_cufile;
int nvio__cufile_engine_wrap(void **ctx, unsigned depth,
			     const struct nvio__engine_ops *base, void *bctx);

/* io_uring setup flags tried before plain setup (engine_uring.c). */
extern unsigned nvio__uring_flags;

/* The table for an engine id, or NULL. */
const struct nvio__engine_ops *nvio__engine(int id);

#endif
