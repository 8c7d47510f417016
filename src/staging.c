/*
 * staging.c - bounded pools of aligned bounce buffers (see staging.h).
 *
 * The pool is one region, allocated on first use and cut into `count`
 * buffers: one large allocation gets huge pages (locked.c), so every
 * bounce buffer is physically contiguous in 2 MiB runs, which a device
 * with few segments per request needs (see nvio__mem_alloc_aligned).
 */
#include <errno.h>
#include <stdlib.h>

#include "internal.h"

int nvio__stage_init(struct nvio__stage_pool *p, unsigned count, size_t size)
{
	p->size = size;
	p->count = count;
	p->nfree = 0;
	p->region = NULL;
	p->host_registered = 0;
	p->free = calloc(count, sizeof(void *));
	return p->free ? 0 : -ENOMEM;
}

void nvio__stage_fini(struct nvio__stage_pool *p)
{
	if (p->region && p->host_registered)
		nvio__cuda_host_unregister(p->region);
	free(p->region);
	free(p->free);
	p->region = NULL;
	p->free = NULL;
	p->nfree = 0;
}

static int stage_make(struct nvio__stage_pool *p)
{
	int r = nvio__mem_alloc_aligned(&p->region, p->size * p->count, NVIO__PAGE);

	if (r < 0) {
		p->region = NULL;
		return r;
	}
	if (p->host_registered)
		nvio__cuda_host_register(p->region, p->size * p->count);
	for (unsigned i = 0; i < p->count; i++)
		p->free[p->nfree++] = (char *)p->region + (size_t)i * p->size;
	return 0;
}

void *nvio__stage_get(struct nvio__stage_pool *p, int *err)
{
	*err = 0;
	if (!p->region && (*err = stage_make(p)) < 0)
		return NULL;
	return p->nfree > 0 ? p->free[--p->nfree] : NULL;
}

void nvio__stage_put(struct nvio__stage_pool *p, void *buf)
{
	p->free[p->nfree++] = buf;
}

void nvio__stage_want_cuda(struct nvio__stage_pool *p)
{
	if (p->host_registered)
		return;
	p->host_registered = 1;
	if (p->region)
		nvio__cuda_host_register(p->region, p->size * p->count);
}
