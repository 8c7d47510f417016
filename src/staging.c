/*
 * staging.c - bounded pools of aligned bounce buffers (see staging.h).
 */
#include <errno.h>
#include <stdlib.h>

#include "internal.h"

int nvio__stage_init(struct nvio__stage_pool *p, unsigned count, size_t size)
{
	p->size = size;
	p->count = count;
	p->made = 0;
	p->nfree = 0;
	p->host_registered = 0;
	p->free = calloc(count, sizeof(void *));
	p->all = calloc(count, sizeof(void *));
	if (!p->free || !p->all) {
		free(p->free);
		free(p->all);
		p->free = p->all = NULL;
		return -ENOMEM;
	}
	return 0;
}

void nvio__stage_fini(struct nvio__stage_pool *p)
{
	for (unsigned i = 0; i < p->made; i++) {
		if (p->host_registered)
			nvio__cuda_host_unregister(p->all[i]);
		free(p->all[i]);
	}
	free(p->free);
	free(p->all);
	p->free = p->all = NULL;
	p->made = p->nfree = 0;
}

void *nvio__stage_get(struct nvio__stage_pool *p, int *err)
{
	void *buf;
	int r;

	*err = 0;
	if (p->nfree > 0)
		return p->free[--p->nfree];
	if (p->made == p->count)
		return NULL;
	r = nvio__mem_alloc_aligned(&buf, p->size, NVIO__PAGE);
	if (r < 0) {
		/* With buffers in use, waiting for one is enough. */
		if (p->made == p->nfree)
			*err = r;
		return NULL;
	}
	if (p->host_registered)
		nvio__cuda_host_register(buf, p->size);
	p->all[p->made++] = buf;
	return buf;
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
	for (unsigned i = 0; i < p->made; i++)
		nvio__cuda_host_register(p->all[i], p->size);
}
