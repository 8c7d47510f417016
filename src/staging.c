/*
 * staging.c - bounded pools of aligned bounce buffers (see staging.h).
 *
 * The pool is one region, allocated on first use and cut into `count`
 * buffers: one large allocation gets huge pages (locked.c), so every
 * bounce buffer is physically contiguous in 2 MiB runs, which a device
 * with few segments per request needs (see nvio__mem_alloc_aligned).
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

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

/*
 * Copies of at least this many bytes bypass the cache. A staged piece is
 * either about to be read by the device (a write) or lands in a buffer
 * far larger than the cache (a read), so caching it only costs: every
 * destination line is first read for ownership, then evicted. Below it
 * the data may still be used from cache, and memcpy is as fast.
 */
#define STREAM_COPY_BYTES (64u << 10)

void nvio__stage_copy(void *dst, const void *src, size_t n)
{
#if defined(__SSE2__)
	char *d = dst;
	const char *s = src;
	size_t head, i;

	if (n < STREAM_COPY_BYTES) {
		memcpy(dst, src, n);
		return;
	}
	/* Non-temporal stores need a 16-byte aligned destination; the
	 * source may be anywhere (a pageable buffer at any address). */
	head = (16 - ((uintptr_t)d & 15)) & 15;
	memcpy(d, s, head);
	d += head;
	s += head;
	n -= head;
	for (i = 0; i + 64 <= n; i += 64) {
		__m128i a = _mm_loadu_si128((const __m128i *)(s + i));
		__m128i b = _mm_loadu_si128((const __m128i *)(s + i + 16));
		__m128i c = _mm_loadu_si128((const __m128i *)(s + i + 32));
		__m128i e = _mm_loadu_si128((const __m128i *)(s + i + 48));

		_mm_stream_si128((__m128i *)(d + i), a);
		_mm_stream_si128((__m128i *)(d + i + 16), b);
		_mm_stream_si128((__m128i *)(d + i + 32), c);
		_mm_stream_si128((__m128i *)(d + i + 48), e);
	}
	/* Streaming stores are weakly ordered: fence them before the
	 * buffer is handed to the kernel or another thread. */
	_mm_sfence();
	memcpy(d + i, s + i, n - i);
#else
	memcpy(dst, src, n);
#endif
}
