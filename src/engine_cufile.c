/*
 * engine_cufile.c - cuFile (GPUDirect Storage) behind the engine table.
 *
 * A GDS handle's workers run this engine over their ordinary one (the
 * base): requests that carry a cuFile handle (io->fh) move between the
 * file and GPU memory with cuFileRead/cuFileWrite, which block, so they
 * run to completion inside submit() as psync's do; every other request
 * (host buffers, staged pieces) goes to the base engine. reap() returns
 * the finished cuFile requests first, then the base's.
 */
#include <errno.h>
#include <stdlib.h>

#include "internal.h"
#include "sys.h"

struct cufile_ctx {
	const struct nvio__engine_ops *base;
	void *bctx;
	unsigned base_inflight;	/* accepted by the base, not yet reaped */
	unsigned depth, head, count;	/* ring of finished cuFile requests */
	struct nvio__io *done[];
};

static int cufile_available(char *why, size_t len)
{
	return nvio_gds_mode(why, len) != NVIO_CUFILE_NONE;
}

/* The engine needs its base: made by nvio__cufile_engine_wrap only. */
static int cufile_init(void **ctx, unsigned depth)
{
	return -EINVAL;
}

int nvio__cufile_engine_wrap(void **out, unsigned depth,
			     const struct nvio__engine_ops *base, void *bctx)
{
	struct cufile_ctx *c = calloc(1, sizeof(*c) + depth * sizeof(c->done[0]));

	if (!c)
		return -ENOMEM;
	c->base = base;
	c->bctx = bctx;
	c->depth = depth;
	*out = c;
	return 0;
}

static void cufile_fini(void *ctx)
{
	struct cufile_ctx *c = ctx;

	if (!c)
		return;
	c->base->fini(c->bctx);
	free(c);
}

/* Moves one request with cuFile; its result as the kernel's would be. */
static void cufile_move(struct cufile_ctx *c, struct nvio__io *io)
{
	const char *what;
	int r = nvio__cufile_rw(io->fh, io->is_write, io->buf, io->off, io->len, &what);

	io->res = nvio__sys.io_result(io->is_write, io->fd, io->off, io->len,
				      r < 0 ? r : (ssize_t)io->len);
	c->done[(c->head + c->count++) % c->depth] = io;
}

static int cufile_submit(void *ctx, struct nvio__io **ios, unsigned n, int single)
{
	struct cufile_ctx *c = ctx;
	unsigned i = 0;

	while (i < n) {
		unsigned j = i;
		int r;

		if (ios[i]->fh) {
			if (c->count == c->depth)
				break;
			cufile_move(c, ios[i++]);
			continue;
		}
		while (j < n && !ios[j]->fh)	/* a run for the base */
			j++;
		r = c->base->submit(c->bctx, ios + i, j - i, single);
		if (r < 0)
			return i > 0 ? (int)i : r;
		c->base_inflight += (unsigned)r;
		i += (unsigned)r;
		if (i < j)
			break;	/* the base took part of the run */
	}
	return i > 0 ? (int)i : -EAGAIN;
}

static int cufile_reap(void *ctx, struct nvio__io **out, unsigned min,
		       unsigned max)
{
	struct cufile_ctx *c = ctx;
	unsigned n = 0, want;
	int r;

	while (n < max && c->count > 0) {
		out[n++] = c->done[c->head];
		c->head = (c->head + 1) % c->depth;
		c->count--;
	}
	if (n == max || c->base_inflight == 0)
		return (int)n;
	/* never wait for more than the base holds */
	want = n >= min ? 0 : min - n;
	if (want > c->base_inflight)
		want = c->base_inflight;
	r = c->base->reap(c->bctx, out + n, want, max - n);
	if (r < 0)
		return n > 0 ? (int)n : r;
	c->base_inflight -= (unsigned)r;
	return (int)n + r;
}

const struct nvio__engine_ops nvio__engine_cufile = {
	.version = NVIO__ENGINE_OPS_VERSION,
	.id = NVIO_ENGINE_AUTO,	/* not selectable: rides on a base engine */
	.name = "cufile",
	.available = cufile_available,
	.init = cufile_init,
	.fini = cufile_fini,
	.submit = cufile_submit,
	.reap = cufile_reap,
};
