/*
 * cuda.c - the CUDA driver API, loaded at run time.
 *
 * nvio is built without CUDA headers or libraries. The few driver entry
 * points it needs are declared here with their documented C signatures
 * and found with dlopen/dlsym, so one build runs with or without a GPU.
 *
 * Pointer classification only looks at a driver the process has already
 * loaded (RTLD_NOLOAD): device memory cannot exist in a process that
 * never loaded libcuda, and host-only users pay nothing.
 */
#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef unsigned long long CUdeviceptr;

#define CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL 9
#define CU_MEMORYTYPE_DEVICE 2
#define CU_STREAM_NON_BLOCKING 1
#define CU_MEMHOSTREGISTER_PORTABLE 1

static struct {
	void *lib;
	int ok;
	CUresult (*Init)(unsigned);
	CUresult (*DriverGetVersion)(int *);
	CUresult (*DeviceGetCount)(int *);
	CUresult (*DeviceGet)(CUdevice *, int);
	CUresult (*PointerGetAttribute)(void *, int, CUdeviceptr);
	CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
	CUresult (*DevicePrimaryCtxRelease)(CUdevice);
	CUresult (*CtxSetCurrent)(CUcontext);
	CUresult (*StreamCreate)(CUstream *, unsigned);
	CUresult (*StreamDestroy)(CUstream);
	CUresult (*StreamSynchronize)(CUstream);
	CUresult (*MemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream);
	CUresult (*MemcpyDtoHAsync)(void *, CUdeviceptr, size_t, CUstream);
	CUresult (*MemHostRegister)(void *, size_t, unsigned);
	CUresult (*MemHostUnregister)(void *);
	CUresult (*GetErrorName)(CUresult, const char **);
	/* optional: nvio_cuda_alloc and friends only */
	CUresult (*CtxGetCurrent)(CUcontext *);
	CUresult (*MemAlloc)(CUdeviceptr *, size_t);
	CUresult (*MemFree)(CUdeviceptr);
	CUresult (*MemcpyHtoD)(CUdeviceptr, const void *, size_t);
	CUresult (*MemcpyDtoH)(void *, CUdeviceptr, size_t);
	CUresult (*MemcpyDtoD)(CUdeviceptr, CUdeviceptr, size_t);
} cu;

static pthread_once_t cu_once = PTHREAD_ONCE_INIT;
static _Atomic int cu_noload;	/* 1: only use a driver the process already has */

static void *sym(const char *name)
{
	return dlsym(cu.lib, name);
}

static void cu_load(void)
{
	const char *env = getenv("NVIO_CUDA_LIB");

	if (!cu_noload && env && *env)
		cu.lib = dlopen(env, RTLD_NOW | RTLD_GLOBAL);
	if (!cu.lib)
		cu.lib = dlopen("libcuda.so.1", RTLD_NOW | (cu_noload ? RTLD_NOLOAD : 0));
	if (!cu.lib)
		return;
	cu.Init = sym("cuInit");
	cu.DriverGetVersion = sym("cuDriverGetVersion");
	cu.DeviceGetCount = sym("cuDeviceGetCount");
	cu.DeviceGet = sym("cuDeviceGet");
	cu.PointerGetAttribute = sym("cuPointerGetAttribute");
	cu.DevicePrimaryCtxRetain = sym("cuDevicePrimaryCtxRetain");
	cu.DevicePrimaryCtxRelease = sym("cuDevicePrimaryCtxRelease_v2");
	if (!cu.DevicePrimaryCtxRelease)	/* drivers before CUDA 11 */
		cu.DevicePrimaryCtxRelease = sym("cuDevicePrimaryCtxRelease");
	cu.CtxSetCurrent = sym("cuCtxSetCurrent");
	cu.StreamCreate = sym("cuStreamCreate");
	cu.StreamDestroy = sym("cuStreamDestroy_v2");
	cu.StreamSynchronize = sym("cuStreamSynchronize");
	cu.MemcpyHtoDAsync = sym("cuMemcpyHtoDAsync_v2");
	cu.MemcpyDtoHAsync = sym("cuMemcpyDtoHAsync_v2");
	cu.MemHostRegister = sym("cuMemHostRegister_v2");
	cu.MemHostUnregister = sym("cuMemHostUnregister");
	cu.GetErrorName = sym("cuGetErrorName");
	cu.CtxGetCurrent = sym("cuCtxGetCurrent");
	cu.MemAlloc = sym("cuMemAlloc_v2");
	cu.MemFree = sym("cuMemFree_v2");
	cu.MemcpyHtoD = sym("cuMemcpyHtoD_v2");
	cu.MemcpyDtoH = sym("cuMemcpyDtoH_v2");
	cu.MemcpyDtoD = sym("cuMemcpyDtoD_v2");
	cu.ok = cu.Init && cu.DriverGetVersion && cu.DeviceGetCount &&
		cu.DeviceGet && cu.PointerGetAttribute &&
		cu.DevicePrimaryCtxRetain && cu.DevicePrimaryCtxRelease &&
		cu.CtxSetCurrent && cu.StreamCreate &&
		cu.StreamDestroy && cu.StreamSynchronize && cu.MemcpyHtoDAsync &&
		cu.MemcpyDtoHAsync && cu.MemHostRegister && cu.MemHostUnregister &&
		cu.Init(0) == 0;
}

static int adds_cb(struct dl_phdr_info *info, size_t size, void *data)
{
	if (size >= offsetof(struct dl_phdr_info, dlpi_adds) + sizeof(info->dlpi_adds))
		*(unsigned long long *)data = info->dlpi_adds;
	return 1;	/* the first object carries the count */
}

/* How many objects the loader has ever added; 0 if it does not say. */
static unsigned long long loader_adds(void)
{
	unsigned long long n = 0;

	dl_iterate_phdr(adds_cb, &n);
	return n;
}

/* The loader count at the last probe that found no driver. */
static _Atomic unsigned long long cu_absent_at;

/* The driver, loaded only if the process has it already. */
static int cu_present(void)
{
	if (!cu.ok) {
		/*
		 * Asked again when the process may have loaded CUDA since,
		 * that is when the loader added objects. The probe is not
		 * free: for a library not loaded, dlopen searches the path
		 * (ld.so.cache, four failed opens), which would dominate a
		 * small cached read (bench/results/measured-constants.md).
		 */
		unsigned long long adds = loader_adds();
		void *lib;

		if (adds && adds == atomic_load(&cu_absent_at))
			return 0;
		lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
		if (!lib) {
			atomic_store(&cu_absent_at, adds);
			return 0;
		}
		dlclose(lib);	/* only a probe; cu_load holds its own */
		cu_noload = 1;
		pthread_once(&cu_once, cu_load);
	}
	return cu.ok;
}

/*
 * Whether this process is known to have a usable driver, without asking
 * the loader (dl_iterate_phdr takes its lock: ~30 ns of a 4 KiB cached
 * read). 0 means "not seen yet", not "absent": see submit.c's lazy
 * classification for where that is enough.
 */
int nvio__cuda_known(void)
{
	return cu.ok;
}

/* Driver errors become errno values; the name is kept for messages. */
static int cu_err(CUresult r)
{
	if (r == 0)
		return 0;
	if (r == 2)	/* CUDA_ERROR_OUT_OF_MEMORY */
		return -ENOMEM;
	if (r == 1)	/* CUDA_ERROR_INVALID_VALUE */
		return -EINVAL;
	return -EIO;
}

int nvio__cuda_pointer_device(const void *p, int *device)
{
	unsigned memtype = 0;
	int ordinal = 0;

	if (!p || !cu_present())
		return 0;
	if (cu.PointerGetAttribute(&memtype, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
				   (CUdeviceptr)(uintptr_t)p) != 0 ||
	    memtype != CU_MEMORYTYPE_DEVICE)
		return 0;
	if (cu.PointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
				   (CUdeviceptr)(uintptr_t)p) != 0)
		return 0;
	*device = ordinal;
	return 1;
}

/*
 * Retains the device's primary context (the one PyTorch uses), makes it
 * current in this thread and makes a stream on it. The retain is the
 * worker's one reference, released by nvio__cuda_ctx_close: an
 * application that releases its own can then have the context destroyed.
 */
int nvio__cuda_ctx_open(struct nvio__cuda_ctx *c, int device)
{
	CUcontext ctx;
	CUstream s;
	CUdevice dev;
	int r;

	c->stream = NULL;
	if (!cu_present())
		return -ENODEV;
	r = cu_err(cu.DeviceGet(&dev, device));
	if (r)
		return r;
	r = cu_err(cu.DevicePrimaryCtxRetain(&ctx, dev));
	if (r)
		return r;
	r = cu_err(cu.CtxSetCurrent(ctx));
	if (!r)
		r = cu_err(cu.StreamCreate(&s, CU_STREAM_NON_BLOCKING));
	if (r) {
		cu.DevicePrimaryCtxRelease(dev);
		return r;
	}
	c->device = device;
	c->ctx = ctx;
	c->stream = s;
	return 0;
}

int nvio__cuda_ctx_use(const struct nvio__cuda_ctx *c)
{
	if (!c->stream || !cu.ok)
		return -ENODEV;
	return cu_err(cu.CtxSetCurrent(c->ctx));
}

void nvio__cuda_ctx_close(struct nvio__cuda_ctx *c)
{
	CUdevice dev;

	if (!c->stream || !cu.ok)
		return;
	cu.CtxSetCurrent(c->ctx);
	cu.StreamDestroy(c->stream);
	if (cu.DeviceGet(&dev, c->device) == 0)
		cu.DevicePrimaryCtxRelease(dev);
	c->stream = NULL;
	c->ctx = NULL;
}

int nvio__cuda_break_sync;

int nvio__cuda_copy(void *dst, const void *src, size_t n, int to_device,
		    const struct nvio__cuda_ctx *c)
{
	int r;

	if (!cu_present() || !c->stream)
		return -ENODEV;
	/* cheap, and the thread may have run another device's op */
	r = cu_err(cu.CtxSetCurrent(c->ctx));
	if (r)
		return r;
	if (to_device)
		r = cu_err(cu.MemcpyHtoDAsync((CUdeviceptr)(uintptr_t)dst, src, n,
					      c->stream));
	else
		r = cu_err(cu.MemcpyDtoHAsync(dst, (CUdeviceptr)(uintptr_t)src, n,
					      c->stream));
	/* the copy only queued: the bounce buffer is the device's until then */
	if (!r && !nvio__cuda_break_sync)
		r = cu_err(cu.StreamSynchronize(c->stream));
	return r;
}

int nvio__cuda_host_register(void *p, size_t n)
{
	if (!cu_present())
		return -ENODEV;
	return cu_err(cu.MemHostRegister(p, n, CU_MEMHOSTREGISTER_PORTABLE));
}

void nvio__cuda_host_unregister(void *p)
{
	if (cu.ok)
		cu.MemHostUnregister(p);
}

void nvio__cuda_probe(nvio_probe_t *out)
{
	const char *env = getenv("NVIO_CUDA_LIB");	/* as nvio_cuda_alloc loads */
	void *lib = env && *env ? dlopen(env, RTLD_NOW | RTLD_LOCAL) : NULL;

	if (!lib)
		lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	CUresult (*init)(unsigned);
	CUresult (*count)(int *);
	CUresult (*version)(int *);
	int n = 0, v = 0, r;

	if (!lib) {
		snprintf(out->cuda_why, sizeof(out->cuda_why),
			 "libcuda.so.1 not found: no NVIDIA driver on this machine "
			 "(install the driver to use GPU buffers)");
		return;
	}
	init = (CUresult (*)(unsigned))dlsym(lib, "cuInit");
	count = (CUresult (*)(int *))dlsym(lib, "cuDeviceGetCount");
	version = (CUresult (*)(int *))dlsym(lib, "cuDriverGetVersion");
	if (!init || !count || !version) {
		snprintf(out->cuda_why, sizeof(out->cuda_why),
			 "libcuda.so.1 lacks cuInit/cuDeviceGetCount: driver too old");
	} else if ((r = init(0)) != 0) {
		snprintf(out->cuda_why, sizeof(out->cuda_why),
			 "cuInit failed (CUresult %d): no usable GPU or driver/"
			 "kernel module mismatch (check nvidia-smi)", r);
	} else {
		version(&v);
		count(&n);
		out->cuda_driver_version = v;
		out->cuda_device_count = n;
		out->cuda_found = n > 0;
		if (n == 0)
			snprintf(out->cuda_why, sizeof(out->cuda_why),
				 "CUDA driver loaded but no device visible "
				 "(check CUDA_VISIBLE_DEVICES)");
	}
	/* Keep the library loaded: unloading a CUDA driver is not safe. */
}

/* ---- device memory for tools and programs without a runtime ---- */

/* The driver, loaded now if the process has none yet. */
static int cu_load_now(void)
{
	if (!cu.ok && !cu_present()) {
		cu_noload = 0;
		pthread_once(&cu_once, cu_load);
	}
	if (!cu.ok)
		return -ENODEV;
	return cu.CtxGetCurrent && cu.MemAlloc && cu.MemFree && cu.MemcpyHtoD &&
	       cu.MemcpyDtoH && cu.MemcpyDtoD ? 0 : -ENODEV;
}

/*
 * Makes device's primary context current in this thread, retained; *old
 * gets the context that was current, for ctx_leave. Returns 0 or -errno.
 */
static int ctx_enter(int device, CUcontext *old)
{
	CUcontext ctx;
	CUdevice dev;
	int r;

	if ((r = cu_err(cu.CtxGetCurrent(old))))
		return r;
	if (cu.DeviceGet(&dev, device) != 0)
		return -ENODEV;
	if ((r = cu_err(cu.DevicePrimaryCtxRetain(&ctx, dev))))
		return r;
	if ((r = cu_err(cu.CtxSetCurrent(ctx)))) {
		cu.DevicePrimaryCtxRelease(dev);
		return r;
	}
	return 0;
}

/* Puts the caller's context back; keep: the retain stays (an allocation). */
static void ctx_leave(int device, CUcontext old, int keep)
{
	CUdevice dev;

	cu.CtxSetCurrent(old);
	if (!keep && cu.DeviceGet(&dev, device) == 0)
		cu.DevicePrimaryCtxRelease(dev);
}

int nvio_cuda_alloc(int device, uint64_t size, void **ptr)
{
	CUdeviceptr p = 0;
	CUcontext old;
	int r;

	if (!ptr || size == 0 || size > SIZE_MAX)
		return -EINVAL;
	if (device < 0)
		return -ENODEV;
	if ((r = cu_load_now()) || (r = ctx_enter(device, &old)))
		return r;
	r = cu_err(cu.MemAlloc(&p, (size_t)size));
	ctx_leave(device, old, r == 0);
	if (!r)
		*ptr = (void *)(uintptr_t)p;
	return r;
}

int nvio_cuda_free(void *ptr)
{
	CUcontext old;
	int device, r;

	if (!ptr || cu_load_now() || !nvio__cuda_pointer_device(ptr, &device))
		return -EINVAL;
	if ((r = ctx_enter(device, &old)))
		return r;
	r = cu_err(cu.MemFree((CUdeviceptr)(uintptr_t)ptr));
	ctx_leave(device, old, 0);	/* this call's retain */
	if (!r)
		ctx_leave(device, old, 0);	/* and the allocation's */
	return r;
}

int nvio_cuda_memcpy(void *dst, const void *src, uint64_t size)
{
	int ddev = 0, sdev = 0, d, s, r;
	CUcontext old;

	if (size == 0)
		return 0;
	if (!dst || !src || size > SIZE_MAX)
		return -EINVAL;
	d = nvio__cuda_pointer_device(dst, &ddev);
	s = nvio__cuda_pointer_device(src, &sdev);
	if (!d && !s) {
		memcpy(dst, src, (size_t)size);
		return 0;
	}
	if ((r = cu_load_now()) || (r = ctx_enter(d ? ddev : sdev, &old)))
		return r;
	if (d && s)
		r = cu.MemcpyDtoD((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src,
				  (size_t)size);
	else if (d)
		r = cu.MemcpyHtoD((CUdeviceptr)(uintptr_t)dst, src, (size_t)size);
	else
		r = cu.MemcpyDtoH(dst, (CUdeviceptr)(uintptr_t)src, (size_t)size);
	ctx_leave(d ? ddev : sdev, old, 0);
	return cu_err(r);
}
