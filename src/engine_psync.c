/*
 * engine_psync.c - pread/pwrite, the reference engine.
 *
 * Each request runs to completion inside submit(), one system call, in
 * the worker's thread; parallelism comes from the handle's workers.
 * Always available; every other engine is tested against it.
 */
#include <errno.h>
#include <stdlib.h>

#include "internal.h"
#include "sys.h"

struct psync_ctx {
	unsigned depth, head, count;	/* ring of finished requests */
	struct nvio__io *done[];
};

static int psync_available(char *why, size_t len)
{
	return 1;
}

static int psync_init(void **out, unsigned depth)
{
	struct psync_ctx *c = calloc(1, sizeof(*c) + depth * sizeof(c->done[0]));

	if (!c)
		return -ENOMEM;
	c->depth = depth;
	*out = c;
	return 0;
}

static void psync_fini(void *ctx)
{
	free(ctx);
}

static int psync_submit(void *ctx, struct nvio__io **ios, unsigned n, int single)
{
	struct psync_ctx *c = ctx;
	unsigned i;

	for (i = 0; i < n && c->count < c->depth; i++) {
		struct nvio__io *io = ios[i];
		ssize_t r;

		if (io->iov)
			r = io->is_write ?
			    nvio__sys.pwritev(io->fd, io->iov, io->iovcnt, (off_t)io->off) :
			    nvio__sys.preadv(io->fd, io->iov, io->iovcnt, (off_t)io->off);
		else if (io->is_write)
			r = nvio__sys.pwrite(io->fd, io->buf, io->len, (off_t)io->off);
		else
			r = nvio__sys.pread(io->fd, io->buf, io->len, (off_t)io->off);
		io->res = nvio__sys.io_result(io->is_write, io->fd, io->off,
					      io->len, r < 0 ? -errno : r);
		c->done[(c->head + c->count++) % c->depth] = io;
	}
	return i > 0 ? (int)i : -EAGAIN;
}

static int psync_reap(void *ctx, struct nvio__io **out, unsigned min,
		      unsigned max)
{
	struct psync_ctx *c = ctx;
	unsigned n = 0;
	int f = nvio__sys.reap_fault();

	if (f)
		return f;
	while (n < max && c->count > 0) {
		out[n++] = c->done[c->head];
		c->head = (c->head + 1) % c->depth;
		c->count--;
	}
	return (int)n;
}

const struct nvio__engine_ops nvio__engine_psync = {
	.version = NVIO__ENGINE_OPS_VERSION,
	.id = NVIO_ENGINE_PSYNC,
	.name = "psync",
	.available = psync_available,
	.init = psync_init,
	.fini = psync_fini,
	.submit = psync_submit,
	.reap = psync_reap,
};
