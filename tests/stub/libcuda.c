/*
 * tests/stub/libcuda.c - a stand-in for the CUDA driver (libcuda.so.1),
 * for test_cuda on machines without a GPU.
 *
 * It has the entry points nvio loads (cuda.c), with the documented
 * signatures. "Device memory" is host memory handed out by
 * stub_cuda_alloc and remembered as such: cuPointerGetAttribute calls it
 * device memory of device 0 and refuses any other pointer, as the driver
 * does for plain host memory. Copies check both sides, count themselves
 * and can be told to fail, so a test sees that nvio took the device path
 * (a host path would move the same bytes) and how it reports a driver
 * error.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define STUB_API __attribute__((visibility("default")))

typedef int CUresult;
typedef unsigned long long CUdeviceptr;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_INVALID_CONTEXT 201
#define CUDA_ERROR_UNKNOWN 999
#define MEMORY_TYPE 2
#define DEVICE_ORDINAL 9
#define MEMORYTYPE_DEVICE 2

STUB_API void *stub_cuda_alloc(size_t n);
STUB_API void stub_cuda_free(void *p);
STUB_API unsigned long stub_cuda_copies(void);
STUB_API void stub_cuda_fail_copies(unsigned long n);
STUB_API CUresult cuInit(unsigned flags);
STUB_API CUresult cuDriverGetVersion(int *v);
STUB_API CUresult cuDeviceGetCount(int *n);
STUB_API CUresult cuDeviceGet(int *dev, int ordinal);
STUB_API CUresult cuPointerGetAttribute(void *data, int attr, CUdeviceptr p);
STUB_API long stub_cuda_ctx_refs(void);
STUB_API long stub_cuda_host_registered(void);
STUB_API CUresult cuDevicePrimaryCtxRetain(void **ctx, int dev);
STUB_API CUresult cuDevicePrimaryCtxRelease_v2(int dev);
STUB_API CUresult cuCtxSetCurrent(void *ctx);
STUB_API CUresult cuStreamCreate(void **stream, unsigned flags);
STUB_API CUresult cuStreamDestroy_v2(void *stream);
STUB_API CUresult cuStreamSynchronize(void *stream);
STUB_API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n,
				       void *stream);
STUB_API CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n,
				       void *stream);
STUB_API CUresult cuMemHostRegister_v2(void *p, size_t n, unsigned flags);
STUB_API CUresult cuMemHostUnregister(void *p);
STUB_API CUresult cuGetErrorName(CUresult r, const char **name);

#define MAX_ALLOCS 16

static struct { char *p; size_t n; } allocs[MAX_ALLOCS];
static unsigned long copies, fail_next;
static int ctx_token, stream_token;
/* Like the driver: a context is current per thread, the primary one is
 * counted, and pinning host memory needs a current context. */
static __thread void *current;
static long ctx_refs, host_registered;

void *stub_cuda_alloc(size_t n)
{
	for (int i = 0; i < MAX_ALLOCS; i++)
		if (!allocs[i].p) {
			allocs[i].p = malloc(n ? n : 1);
			allocs[i].n = n;
			return allocs[i].p;
		}
	return NULL;
}

void stub_cuda_free(void *p)
{
	for (int i = 0; i < MAX_ALLOCS; i++)
		if (allocs[i].p == p) {
			free(p);
			allocs[i].p = NULL;
		}
}

/* Copies are made by nvio's workers, the counters read by the test
 * thread after the op: atomics keep TSan (and the truth) happy. */
unsigned long stub_cuda_copies(void)
{
	return __atomic_load_n(&copies, __ATOMIC_SEQ_CST);
}

void stub_cuda_fail_copies(unsigned long n)
{
	__atomic_store_n(&fail_next, n, __ATOMIC_SEQ_CST);
}

/* Retains of the primary context not yet released. */
long stub_cuda_ctx_refs(void)
{
	return __atomic_load_n(&ctx_refs, __ATOMIC_SEQ_CST);
}

/* Host ranges pinned and not yet unpinned. */
long stub_cuda_host_registered(void)
{
	return __atomic_load_n(&host_registered, __ATOMIC_SEQ_CST);
}

/* 1 if [p, p+n) lies inside one stub allocation. */
static int is_device(uintptr_t p, size_t n)
{
	for (int i = 0; i < MAX_ALLOCS; i++) {
		uintptr_t a = (uintptr_t)allocs[i].p;

		if (allocs[i].p && p >= a && p - a <= allocs[i].n &&
		    n <= allocs[i].n - (p - a))
			return 1;
	}
	return 0;
}

CUresult cuInit(unsigned flags) { return flags ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS; }
CUresult cuDriverGetVersion(int *v) { *v = 12040; return CUDA_SUCCESS; }
CUresult cuDeviceGetCount(int *n) { *n = 1; return CUDA_SUCCESS; }

CUresult cuDeviceGet(int *dev, int ordinal)
{
	if (ordinal != 0)
		return CUDA_ERROR_INVALID_VALUE;
	*dev = 0;
	return CUDA_SUCCESS;
}

CUresult cuPointerGetAttribute(void *data, int attr, CUdeviceptr p)
{
	if (!is_device((uintptr_t)p, 1))
		return CUDA_ERROR_INVALID_VALUE;	/* plain host memory */
	if (attr == MEMORY_TYPE)
		*(unsigned *)data = MEMORYTYPE_DEVICE;
	else if (attr == DEVICE_ORDINAL)
		*(int *)data = 0;
	else
		return CUDA_ERROR_INVALID_VALUE;
	return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(void **ctx, int dev)
{
	if (dev != 0)
		return CUDA_ERROR_INVALID_VALUE;
	*ctx = &ctx_token;
	__atomic_add_fetch(&ctx_refs, 1, __ATOMIC_SEQ_CST);
	return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(int dev)
{
	if (dev != 0 || __atomic_load_n(&ctx_refs, __ATOMIC_SEQ_CST) == 0)
		return CUDA_ERROR_INVALID_VALUE;
	__atomic_sub_fetch(&ctx_refs, 1, __ATOMIC_SEQ_CST);
	return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(void *ctx)
{
	if (ctx && ctx != &ctx_token)
		return CUDA_ERROR_INVALID_VALUE;
	current = ctx;
	return CUDA_SUCCESS;
}

CUresult cuStreamCreate(void **stream, unsigned flags)
{
	if (!current)
		return CUDA_ERROR_INVALID_CONTEXT;
	*stream = &stream_token;
	return CUDA_SUCCESS;
}
CUresult cuStreamDestroy_v2(void *stream) { return stream == &stream_token ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; }
CUresult cuStreamSynchronize(void *stream) { return CUDA_SUCCESS; }

static CUresult copy(void *dst, const void *src, size_t n, int dst_dev)
{
	unsigned long f = __atomic_load_n(&fail_next, __ATOMIC_SEQ_CST);

	if (!current)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (!is_device(dst_dev ? (uintptr_t)dst : (uintptr_t)src, n))
		return CUDA_ERROR_INVALID_VALUE;
	if (f > 0) {
		__atomic_store_n(&fail_next, f - 1, __ATOMIC_SEQ_CST);
		return CUDA_ERROR_UNKNOWN;
	}
	memcpy(dst, src, n);
	__atomic_add_fetch(&copies, 1, __ATOMIC_SEQ_CST);
	return CUDA_SUCCESS;
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, void *stream)
{
	return copy((void *)(uintptr_t)dst, src, n, 1);
}

CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, void *stream)
{
	return copy(dst, (const void *)(uintptr_t)src, n, 0);
}

CUresult cuMemHostRegister_v2(void *p, size_t n, unsigned flags)
{
	if (!current)
		return CUDA_ERROR_INVALID_CONTEXT;
	__atomic_add_fetch(&host_registered, 1, __ATOMIC_SEQ_CST);
	return CUDA_SUCCESS;
}

CUresult cuMemHostUnregister(void *p)
{
	if (!current)
		return CUDA_ERROR_INVALID_CONTEXT;
	__atomic_sub_fetch(&host_registered, 1, __ATOMIC_SEQ_CST);
	return CUDA_SUCCESS;
}

CUresult cuGetErrorName(CUresult r, const char **name)
{
	*name = r == CUDA_SUCCESS ? "CUDA_SUCCESS" : "CUDA_ERROR_STUB";
	return CUDA_SUCCESS;
}
