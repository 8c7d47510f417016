/*
 * staging.h - a bounded pool of aligned bounce buffers, one per worker.
 *
 * The buffers are allocated together on first use and kept until the
 * pool is freed, so a handle never holds more than count * size bytes of
 * staging memory, however large the transfers. Used by one thread only.
 */
#ifndef NVIO_STAGING_H
#define NVIO_STAGING_H

#include <stddef.h>

struct nvio__stage_pool {
	size_t size;		/* bytes per buffer */
	unsigned count;		/* buffers: wanted, then what the process-wide
				 * budget granted at first use (2 at least) */
	unsigned nfree;
	void **free;		/* stack of free buffers */
	void *region;		/* all of them, made on first use */
	int host_registered;	/* the region is registered with CUDA */
};

int nvio__stage_init(struct nvio__stage_pool *p, unsigned count, size_t size);
void nvio__stage_fini(struct nvio__stage_pool *p);
/* A free buffer, or NULL when all are in use (or, with *err set, when
 * the pool's memory cannot be allocated). */
void *nvio__stage_get(struct nvio__stage_pool *p, int *err);
void nvio__stage_put(struct nvio__stage_pool *p, void *buf);
/* Register every current and future buffer with CUDA (cudaHostRegister)
 * so device copies run at full speed; best effort. */
void nvio__stage_want_cuda(struct nvio__stage_pool *p);
/* Unregisters them: from the worker's thread, whose CUDA context is
 * current (the driver refuses without one). */
void nvio__stage_cuda_done(struct nvio__stage_pool *p);
/* memcpy for a piece between host memory and a staging buffer; large
 * copies use non-temporal stores where the CPU has them (x86-64). */
void nvio__stage_copy(void *dst, const void *src, size_t n);
/* One copy routine by name, whatever the size (for tests); -ENOTSUP
 * where this CPU or build has no such routine. */
enum { NVIO__COPY_MEMCPY, NVIO__COPY_SSE2, NVIO__COPY_AVX2 };
int nvio__stage_copy_kind(int kind, void *dst, const void *src, size_t n);

#endif
