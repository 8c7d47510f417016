/*
 * staging.c - bounded pools of aligned bounce buffers (see staging.h).
 *
 * The pool is one region, allocated on first use and cut into `count`
 * buffers: one large allocation gets huge pages (locked.c), so every
 * bounce buffer is physically contiguous in 2 MiB runs, which a device
 * with few segments per request needs (see nvio__mem_alloc_aligned).
 *
 * All pools of the process draw from one budget (nvio_staging_set_limit,
 * $NVIO_STAGING_LIMIT, default NVIO_DEFAULT_STAGING_LIMIT), so staging
 * memory does not multiply with handles and workers: a pool made when
 * the budget is spent gets fewer buffers, two at least (one copied while
 * the other is in flight). A pool gives its bytes back when its handle
 * is destroyed.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "internal.h"

static _Atomic uint64_t stage_limit;	/* 0: not set yet */
static _Atomic uint64_t stage_used;

/* The limit in force: set through the API, else $NVIO_STAGING_LIMIT
 * (bytes, with an optional K/M/G suffix), else the default. */
static uint64_t limit_now(void)
{
	uint64_t l = atomic_load(&stage_limit);
	const char *env;
	char *end;

	if (l)
		return l;
	l = NVIO_DEFAULT_STAGING_LIMIT;
	env = getenv("NVIO_STAGING_LIMIT");
	if (env && *env) {
		unsigned long long v = strtoull(env, &end, 10);
		int shift = *end == 'K' || *end == 'k' ? 10 : *end == 'M' || *end == 'm' ? 20 :
			    *end == 'G' || *end == 'g' ? 30 : 0;

		if (v && (shift || !*end) && v <= (UINT64_MAX >> shift))
			l = (uint64_t)v << shift;
	}
	return l;
}

int nvio_staging_set_limit(uint64_t bytes)
{
	atomic_store(&stage_limit, bytes);	/* 0: back to the default */
	return 0;
}

uint64_t nvio_staging_limit(uint64_t *in_use)
{
	if (in_use)
		*in_use = atomic_load(&stage_used);
	return limit_now();
}

/*
 * Takes up to want bytes of the budget in whole buffers of size, two
 * buffers at least whatever is left. Returns the buffers granted.
 */
static unsigned budget_take(size_t size, unsigned want)
{
	uint64_t used = atomic_load(&stage_used), limit = limit_now(), n;

	do {
		uint64_t left = used < limit ? limit - used : 0;

		n = left / size < want ? left / size : want;
		if (n < 2)
			n = 2;
	} while (!atomic_compare_exchange_weak(&stage_used, &used, used + n * size));
	return (unsigned)n;
}

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
	if (p->region)
		atomic_fetch_sub(&stage_used, (uint64_t)p->count * p->size);
	free(p->region);
	free(p->free);
	p->region = NULL;
	p->free = NULL;
	p->nfree = 0;
}

static int stage_make(struct nvio__stage_pool *p)
{
	int r;

	p->count = budget_take(p->size, p->count);
	r = nvio__mem_alloc_aligned(&p->region, p->size * p->count, NVIO__PAGE);
	if (r < 0) {
		atomic_fetch_sub(&stage_used, (uint64_t)p->count * p->size);
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

void nvio__stage_cuda_done(struct nvio__stage_pool *p)
{
	if (p->region && p->host_registered)
		nvio__cuda_host_unregister(p->region);
	p->host_registered = 0;
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
 *
 * Where the CPU has AVX2 the copy moves 32 bytes per store, which
 * saves CPU time on staged transfers (bench/results/measured-constants.md).
 */
#define STREAM_COPY_BYTES (64u << 10)

#if defined(__x86_64__)
#define NT_COPY 1
/*
 * The stream loops store whole strides to an aligned destination (the
 * source may be anywhere: a pageable buffer at any address) and return
 * how many bytes they moved.
 */
static size_t nt_body_sse2(char *d, const char *s, size_t n)
{
	size_t i;

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
	return i;
}

__attribute__((target("avx2")))
static size_t nt_body_avx2(char *d, const char *s, size_t n)
{
	size_t i;

	for (i = 0; i + 128 <= n; i += 128) {
		__m256i a = _mm256_loadu_si256((const __m256i *)(s + i));
		__m256i b = _mm256_loadu_si256((const __m256i *)(s + i + 32));
		__m256i c = _mm256_loadu_si256((const __m256i *)(s + i + 64));
		__m256i e = _mm256_loadu_si256((const __m256i *)(s + i + 96));

		_mm256_stream_si256((__m256i *)(d + i), a);
		_mm256_stream_si256((__m256i *)(d + i + 32), b);
		_mm256_stream_si256((__m256i *)(d + i + 64), c);
		_mm256_stream_si256((__m256i *)(d + i + 96), e);
	}
	return i;
}

/* Head up to the body's alignment and the tail go through memcpy.
 * Streaming stores are weakly ordered: they are fenced before the
 * buffer is handed to the kernel or another thread. */
static void nt_copy(char *d, const char *s, size_t n, size_t align,
		    size_t (*body)(char *, const char *, size_t))
{
	size_t head = (align - ((uintptr_t)d & (align - 1))) & (align - 1), done;

	if (head > n)
		head = n;
	memcpy(d, s, head);
	done = head + body(d + head, s + head, n - head);
	_mm_sfence();
	memcpy(d + done, s + done, n - done);
}
#endif

int nvio__stage_copy_kind(int kind, void *dst, const void *src, size_t n)
{
	switch (kind) {
	case NVIO__COPY_MEMCPY:
		memcpy(dst, src, n);
		return 0;
#if defined(NT_COPY)
	case NVIO__COPY_SSE2:
		nt_copy(dst, src, n, 16, nt_body_sse2);
		return 0;
	case NVIO__COPY_AVX2:
		if (!__builtin_cpu_supports("avx2"))
			return -ENOTSUP;
		nt_copy(dst, src, n, 32, nt_body_avx2);
		return 0;
#endif
	default:
		return -ENOTSUP;
	}
}

void nvio__stage_copy(void *dst, const void *src, size_t n)
{
	int kind = NVIO__COPY_MEMCPY;

#if defined(NT_COPY)
	if (n >= STREAM_COPY_BYTES)
		kind = __builtin_cpu_supports("avx2") ? NVIO__COPY_AVX2 :
		       NVIO__COPY_SSE2;
#endif
	nvio__stage_copy_kind(kind, dst, src, n);
}
