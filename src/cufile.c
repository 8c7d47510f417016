/*
 * cufile.c - NVIDIA cuFile (GPUDirect Storage), loaded at run time.
 *
 * The driver is opened once per process, on first use, and never closed
 * (closing it while another library uses cuFile would break that one).
 * If libcufile is missing or its driver refuses to open, GDS handles use
 * the bounce path instead and nvio_gds_mode() says why; nothing exits.
 *
 * The library is looked for as $NVIO_CUFILE_LIB (the Python package sets
 * it to the copy the nvidia-cufile wheel ships), then libcufile.so.0.
 * Declarations follow cufile.h's documented C ABI.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

typedef struct { int err; int cu_err; } CUfileError_t;
typedef void *CUfileHandle_t;
typedef struct {
	int type;	/* CU_FILE_HANDLE_TYPE_OPAQUE_FD */
	union { int fd; void *handle; } handle;
	const void *fs_ops;
} CUfileDescr_t;

#define CU_FILE_HANDLE_TYPE_OPAQUE_FD 1
#define CUFILEOP_BASE_ERR 5000

static struct {
	int loaded, usable, mode;
	char why[160];
	CUfileError_t (*DriverOpen)(void);
	CUfileError_t (*HandleRegister)(CUfileHandle_t *, CUfileDescr_t *);
	void (*HandleDeregister)(CUfileHandle_t);
	CUfileError_t (*BufRegister)(const void *, size_t, int);
	CUfileError_t (*BufDeregister)(const void *);
	ssize_t (*Read)(CUfileHandle_t, void *, size_t, off_t, off_t);
	ssize_t (*Write)(CUfileHandle_t, const void *, size_t, off_t, off_t);
} cf;

/*
 * cf is filled under cf_lock. A search that found no library is tried
 * again at the next call (a probe before the caller set the path, or
 * before a pip install, must not hide it); once a library is loaded the
 * outcome is final.
 */
static pthread_mutex_t cf_lock = PTHREAD_MUTEX_INITIALIZER;
static char *cf_path;		/* nvio_cufile_set_library's, or NULL */
static char cf_loaded_from[1024];

/* Registered device buffers, to pass cuFile their base and offset. */
struct reg { uintptr_t base; size_t len; };
static pthread_mutex_t regs_lock = PTHREAD_MUTEX_INITIALIZER;
static struct reg *regs;
static size_t nregs, cap_regs;

static const char *cf_err_name(int e)
{
	static const char *const names[] = {
		[1] = "DRIVER_NOT_INITIALIZED", [2] = "DRIVER_INVALID_PROPS",
		[3] = "DRIVER_UNSUPPORTED_LIMIT", [4] = "DRIVER_VERSION_MISMATCH",
		[5] = "DRIVER_VERSION_READ_ERROR", [6] = "DRIVER_CLOSING",
		[7] = "PLATFORM_NOT_SUPPORTED", [8] = "IO_NOT_SUPPORTED",
		[9] = "DEVICE_NOT_SUPPORTED", [10] = "NVFS_DRIVER_ERROR",
		[11] = "CUDA_DRIVER_ERROR", [12] = "CUDA_POINTER_INVALID",
		[13] = "CUDA_MEMORY_TYPE_INVALID", [14] = "CUDA_POINTER_RANGE_ERROR",
		[15] = "CUDA_CONTEXT_MISMATCH", [16] = "INVALID_MAPPING_SIZE",
		[17] = "INVALID_MAPPING_RANGE", [18] = "INVALID_FILE_TYPE",
		[19] = "INVALID_FILE_OPEN_FLAG", [20] = "DIO_NOT_SET",
		[22] = "INVALID_VALUE", [23] = "MEMORY_ALREADY_REGISTERED",
		[24] = "MEMORY_NOT_REGISTERED", [25] = "PERMISSION_DENIED",
		[26] = "DRIVER_ALREADY_OPEN", [27] = "HANDLE_NOT_REGISTERED",
		[28] = "HANDLE_ALREADY_REGISTERED", [29] = "DEVICE_NOT_FOUND",
		[30] = "INTERNAL_ERROR", [31] = "GETNEWFD_FAILED",
		[33] = "NVFS_SETUP_ERROR", [34] = "IO_DISABLED",
	};
	int i = e - CUFILEOP_BASE_ERR;

	if (i > 0 && i < (int)(sizeof(names) / sizeof(names[0])) && names[i])
		return names[i];
	return "UNKNOWN";
}

/* cuFile errors as errno values (the name goes into messages). */
static int cf_errno(int e)
{
	switch (e - CUFILEOP_BASE_ERR) {
	case 12: case 13: case 14: case 22:
		return -EINVAL;
	case 23: case 28:
		return -EEXIST;
	case 25:
		return -EACCES;
	case 36:
		return -ENOMEM;
	}
	return -EIO;
}

/* The path set through the API, then $NVIO_CUFILE_LIB, then the
 * system's: the first that loads. */
static void *cf_open_lib(void)
{
	const char *env = getenv("NVIO_CUFILE_LIB");
	const char *tries[] = { cf_path, env && *env ? env : NULL,
				"libcufile.so.0", "libcufile.so" };

	for (size_t i = 0; i < sizeof(tries) / sizeof(tries[0]); i++) {
		void *lib = tries[i] ? dlopen(tries[i], RTLD_NOW | RTLD_LOCAL) : NULL;

		if (lib) {
			snprintf(cf_loaded_from, sizeof(cf_loaded_from), "%s", tries[i]);
			return lib;
		}
	}
	return NULL;
}

/* cf_lock held. */
static void cf_load(void)
{
	void *lib;
	CUfileError_t e;

	if (cf.loaded)
		return;
	lib = cf_open_lib();
	if (!lib) {
		snprintf(cf.why, sizeof(cf.why), "libcufile.so.0 not found: install "
			 "nvidia-gds (apt) or pip install nvidia-cufile-cu12, or set "
			 "NVIO_CUFILE_LIB or nvio_cufile_set_library()");
		return;
	}
	cf.loaded = 1;
	cf.DriverOpen = (CUfileError_t (*)(void))dlsym(lib, "cuFileDriverOpen");
	cf.HandleRegister = (CUfileError_t (*)(CUfileHandle_t *, CUfileDescr_t *))
		dlsym(lib, "cuFileHandleRegister");
	cf.HandleDeregister = (void (*)(CUfileHandle_t))dlsym(lib, "cuFileHandleDeregister");
	cf.BufRegister = (CUfileError_t (*)(const void *, size_t, int))
		dlsym(lib, "cuFileBufRegister");
	cf.BufDeregister = (CUfileError_t (*)(const void *))dlsym(lib, "cuFileBufDeregister");
	cf.Read = (ssize_t (*)(CUfileHandle_t, void *, size_t, off_t, off_t))
		dlsym(lib, "cuFileRead");
	cf.Write = (ssize_t (*)(CUfileHandle_t, const void *, size_t, off_t, off_t))
		dlsym(lib, "cuFileWrite");
	if (!cf.DriverOpen || !cf.HandleRegister || !cf.HandleDeregister ||
	    !cf.BufRegister || !cf.BufDeregister || !cf.Read || !cf.Write) {
		snprintf(cf.why, sizeof(cf.why), "libcufile lacks cuFile entry points: "
			 "too old; update nvidia-gds / nvidia-cufile");
		return;
	}
	e = cf.DriverOpen();
	if (e.err != 0 && e.err != CUFILEOP_BASE_ERR + 26) {
		snprintf(cf.why, sizeof(cf.why), "cuFileDriverOpen failed: CU_FILE_%s "
			 "(%d, CUDA %d): GDS handles use the bounce path",
			 cf_err_name(e.err), e.err, e.cu_err);
		return;
	}
	cf.usable = 1;
	if (access("/sys/module/nvidia_fs", F_OK) == 0) {
		cf.mode = NVIO_CUFILE_DIRECT;
		snprintf(cf.why, sizeof(cf.why), "nvidia-fs loaded: true GPUDirect");
	} else {
		cf.mode = NVIO_CUFILE_COMPAT;
		snprintf(cf.why, sizeof(cf.why), "nvidia-fs kernel module not loaded: "
			 "cuFile runs in compatibility mode (install nvidia-fs, "
			 "modprobe nvidia_fs, for true GPUDirect)");
	}
}

int nvio__cufile_usable(void)
{
	int usable;

	pthread_mutex_lock(&cf_lock);
	cf_load();
	usable = cf.usable;
	pthread_mutex_unlock(&cf_lock);
	return usable;
}

int nvio_cufile_set_library(const char *path)
{
	char *copy = path ? strdup(path) : NULL;
	int r = 0;

	if (path && !copy)
		return -ENOMEM;
	pthread_mutex_lock(&cf_lock);
	if (cf.loaded && (!path || strcmp(path, cf_loaded_from)))
		r = -EBUSY;	/* loaded from elsewhere: a second copy would not help */
	if (!r) {
		free(cf_path);
		cf_path = copy;
		copy = NULL;
	}
	pthread_mutex_unlock(&cf_lock);
	free(copy);
	return r;
}

int nvio_gds_mode(char *why, size_t why_len)
{
	int mode;

	pthread_mutex_lock(&cf_lock);
	cf_load();
	if (why && why_len)
		snprintf(why, why_len, "%s", cf.why);
	mode = cf.usable ? cf.mode : NVIO_CUFILE_NONE;
	pthread_mutex_unlock(&cf_lock);
	return mode;
}

void nvio__cufile_probe(nvio_probe_t *out)
{
	out->cufile_mode = nvio_gds_mode(out->cufile_why, sizeof(out->cufile_why));
	out->cufile_found = cf.DriverOpen != NULL;
}

static int reg_find(uintptr_t p, size_t *idx)
{
	for (size_t i = 0; i < nregs; i++)
		if (p >= regs[i].base && p - regs[i].base < regs[i].len) {
			*idx = i;
			return 1;
		}
	return 0;
}

int nvio_gds_register(void *dev_ptr, uint64_t nbytes)
{
	CUfileError_t e;
	size_t i;
	int dev;

	if (!dev_ptr || nbytes == 0)
		return -EINVAL;
	if (!nvio__cufile_usable())
		return 0;	/* nothing to register with: the bounce path */
	if (!nvio__cuda_pointer_device(dev_ptr, &dev))
		return -EINVAL;
	pthread_mutex_lock(&regs_lock);
	if (reg_find((uintptr_t)dev_ptr, &i)) {
		pthread_mutex_unlock(&regs_lock);
		return -EEXIST;
	}
	if (nregs == cap_regs) {
		size_t cap = cap_regs ? 2 * cap_regs : 16;
		struct reg *nr = realloc(regs, cap * sizeof(*nr));

		if (!nr) {
			pthread_mutex_unlock(&regs_lock);
			return -ENOMEM;
		}
		regs = nr;
		cap_regs = cap;
	}
	e = cf.BufRegister(dev_ptr, (size_t)nbytes, 0);
	if (e.err == 0)
		regs[nregs++] = (struct reg){ (uintptr_t)dev_ptr, (size_t)nbytes };
	pthread_mutex_unlock(&regs_lock);
	return e.err ? cf_errno(e.err) : 0;
}

int nvio_gds_deregister(void *dev_ptr)
{
	size_t i;

	if (!dev_ptr)
		return -EINVAL;
	if (!nvio__cufile_usable())
		return 0;
	pthread_mutex_lock(&regs_lock);
	if (!reg_find((uintptr_t)dev_ptr, &i) || regs[i].base != (uintptr_t)dev_ptr) {
		pthread_mutex_unlock(&regs_lock);
		return -EINVAL;
	}
	cf.BufDeregister(dev_ptr);
	regs[i] = regs[--nregs];
	pthread_mutex_unlock(&regs_lock);
	return 0;
}

int nvio__cufile_open(int fd, void **out)
{
	CUfileDescr_t d;
	CUfileHandle_t fh;
	CUfileError_t e;

	memset(&d, 0, sizeof(d));
	d.type = CU_FILE_HANDLE_TYPE_OPAQUE_FD;
	d.handle.fd = fd;
	e = cf.HandleRegister(&fh, &d);
	if (e.err)
		return cf_errno(e.err);
	*out = fh;
	return 0;
}

void nvio__cufile_close(void *fh)
{
	if (fh)
		cf.HandleDeregister(fh);
}

/*
 * Moves one piece. A registered buffer is addressed as its base plus an
 * offset, as cuFile asks; an unregistered one as itself. cuFile may
 * return short counts: loop. Returns 0 or -errno; *what names the call.
 */
int nvio__cufile_rw(void *fh, int is_write, void *dev, uint64_t off,
		    uint64_t len, const char **what)
{
	uintptr_t p = (uintptr_t)dev;
	uintptr_t base = p;
	uint64_t done = 0;
	size_t i;

	pthread_mutex_lock(&regs_lock);
	if (reg_find(p, &i))
		base = regs[i].base;
	pthread_mutex_unlock(&regs_lock);
	*what = is_write ? "cuFileWrite" : "cuFileRead";
	while (done < len) {
		off_t boff = (off_t)(p - base + done);
		ssize_t r = is_write ?
			cf.Write(fh, (const void *)base, len - done,
				 (off_t)(off + done), boff) :
			cf.Read(fh, (void *)base, len - done,
				(off_t)(off + done), boff);

		if (r == -1)
			return errno ? -errno : -EIO;
		if (r < 0)
			return cf_errno((int)-r);
		if (r == 0)
			return is_write ? -EIO : -ENODATA;
		done += (uint64_t)r;
	}
	return 0;
}
