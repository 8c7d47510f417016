/*
 * engine_aio.c - Linux AIO through libaio.
 *
 * One AIO context per worker, sized to its queue depth. Each request's
 * iocb lives in its nvio__io scratch space and points back at it.
 * io_getevents (not io_pgetevents) keeps us working with every libaio
 * release. Built only when libaio is found.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "sys.h"

#ifdef NVIO_HAVE_AIO
#include <libaio.h>

_Static_assert(sizeof(struct iocb) <= sizeof(((struct nvio__io *)0)->priv),
	       "struct iocb must fit the request's scratch space");

struct aio_ctx {
	io_context_t ctx;
	unsigned depth;
	struct io_event events[];
};

static int aio_init(void **out, unsigned depth)
{
	struct aio_ctx *c = calloc(1, sizeof(*c) + depth * sizeof(c->events[0]));
	int r;

	if (!c)
		return -ENOMEM;
	c->depth = depth;
	r = io_setup((int)depth, &c->ctx);
	if (r < 0) {
		free(c);
		return r;
	}
	*out = c;
	return 0;
}

static void aio_fini(void *ctx)
{
	struct aio_ctx *c = ctx;

	io_destroy(c->ctx);
	free(c);
}

static int aio_available(char *why, size_t len)
{
	void *ctx;
	int r = aio_init(&ctx, 2);

	if (r == 0) {
		aio_fini(ctx);
		return 1;
	}
	if (r == -EAGAIN)
		snprintf(why, len, "io_setup: %s: fs.aio-max-nr is exhausted; raise "
			 "it (sysctl -w fs.aio-max-nr=1048576)", strerror(-r));
	else
		snprintf(why, len, "io_setup: %s: the kernel refuses Linux AIO "
			 "(CONFIG_AIO off or seccomp); use NVIO_ENGINE=psync",
			 strerror(-r));
	return 0;
}

static int aio_submit(void *ctx, struct nvio__io **ios, unsigned n, int single)
{
	struct aio_ctx *c = ctx;
	struct iocb *cbs[64];
	unsigned done = 0;

	while (done < n) {
		unsigned batch = single ? 1 : (n - done < 64 ? n - done : 64);
		int r;

		for (unsigned i = 0; i < batch; i++) {
			struct nvio__io *io = ios[done + i];
			struct iocb *cb = (struct iocb *)io->priv;

			if (io->iov && io->is_write)
				io_prep_pwritev(cb, io->fd, io->iov, io->iovcnt,
						(long long)io->off);
			else if (io->iov)
				io_prep_preadv(cb, io->fd, io->iov, io->iovcnt,
					       (long long)io->off);
			else if (io->is_write)
				io_prep_pwrite(cb, io->fd, io->buf, io->len,
					       (long long)io->off);
			else
				io_prep_pread(cb, io->fd, io->buf, io->len,
					      (long long)io->off);
			cb->data = io;
			cbs[i] = cb;
		}
		r = io_submit(c->ctx, (long)batch, cbs);
		if (r < 0)
			return done ? (int)done : r;
		done += (unsigned)r;
		if ((unsigned)r < batch)
			break;
	}
	return (int)done;
}

static int aio_reap(void *ctx, struct nvio__io **out, unsigned min,
		    unsigned max)
{
	struct aio_ctx *c = ctx;
	int r;

	if (max > c->depth)
		max = c->depth;
	if (min > 0) {
		r = nvio__sys.reap_fault();
		if (r)
			return r;
	}
	r = io_getevents(c->ctx, (long)min, (long)max, c->events, NULL);
	if (r < 0)
		return r;
	for (int i = 0; i < r; i++) {
		struct nvio__io *io = c->events[i].data;
		long res = (long)c->events[i].res;

		io->res = nvio__sys.io_result(io->is_write, io->fd, io->off,
					      io->len, res);
		out[i] = io;
	}
	return r;
}

#else /* !NVIO_HAVE_AIO */

static int aio_available(char *why, size_t len)
{
	snprintf(why, len, "nvio was built without libaio: install libaio-dev "
		 "(Debian/Ubuntu) or libaio-devel (Fedora) and rebuild");
	return 0;
}

static int aio_init(void **out, unsigned depth)
{
	return -ENOSYS;
}

static void aio_fini(void *ctx)
{
}

static int aio_submit(void *ctx, struct nvio__io **ios, unsigned n, int single)
{
	return -ENOSYS;
}

static int aio_reap(void *ctx, struct nvio__io **out, unsigned min,
		    unsigned max)
{
	return -ENOSYS;
}
#endif

const struct nvio__engine_ops nvio__engine_aio = {
	.version = NVIO__ENGINE_OPS_VERSION,
	.id = NVIO_ENGINE_AIO,
	.name = "libaio",
	.available = aio_available,
	.init = aio_init,
	.fini = aio_fini,
	.submit = aio_submit,
	.reap = aio_reap,
};
