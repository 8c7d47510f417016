/*
 * tests/stub/libcufile.c - a stand-in for NVIDIA cuFile (libcufile.so.0),
 * for test_cuda on machines without a GPU. nvio loads it through
 * NVIO_CUFILE_LIB.
 *
 * It has the entry points nvio loads (cufile.c), with cufile.h's
 * documented C ABI. "Device memory" is the stub driver's (libcuda.c),
 * which is host memory, so cuFileRead and cuFileWrite are a pread and a
 * pwrite at buffer base + buffer offset, as cuFile addresses them. They
 * count themselves, so a test sees that an op took the cuFile path, and
 * handle registration can be told to fail, as cuFile does for a file it
 * cannot take (CU_FILE_INVALID_FILE_TYPE), to test the fallback.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <unistd.h>

#define STUB_API __attribute__((visibility("default")))

typedef struct { int err; int cu_err; } CUfileError_t;
typedef struct {
	int type;
	union { int fd; void *handle; } handle;
	const void *fs_ops;
} CUfileDescr_t;

#define INVALID_FILE_TYPE (5000 + 18)

STUB_API void stub_cufile_refuse_files(int on);
STUB_API unsigned long stub_cufile_ios(void);
STUB_API long stub_cufile_handles(void);
STUB_API CUfileError_t cuFileDriverOpen(void);
STUB_API CUfileError_t cuFileHandleRegister(void **fh, CUfileDescr_t *d);
STUB_API void cuFileHandleDeregister(void *fh);
STUB_API CUfileError_t cuFileBufRegister(const void *p, size_t n, int flags);
STUB_API CUfileError_t cuFileBufDeregister(const void *p);
STUB_API ssize_t cuFileRead(void *fh, void *base, size_t n, off_t off, off_t boff);
STUB_API ssize_t cuFileWrite(void *fh, const void *base, size_t n, off_t off,
			     off_t boff);

/* Set by the test thread, read by nvio's workers: atomics. */
static int refuse;
static unsigned long ios;
static long handles;	/* registered, not yet deregistered */

void stub_cufile_refuse_files(int on) { __atomic_store_n(&refuse, on, __ATOMIC_SEQ_CST); }
unsigned long stub_cufile_ios(void) { return __atomic_load_n(&ios, __ATOMIC_SEQ_CST); }
long stub_cufile_handles(void) { return __atomic_load_n(&handles, __ATOMIC_SEQ_CST); }

static CUfileError_t result(int err)
{
	CUfileError_t e = { err, 0 };

	return e;
}

CUfileError_t cuFileDriverOpen(void) { return result(0); }

/*
 * The handle is a descriptor of its own for the same file, without
 * O_DIRECT (cuFile takes any offset and length; the stub's pread could
 * not), plus 1 so that it is never NULL.
 */
CUfileError_t cuFileHandleRegister(void **fh, CUfileDescr_t *d)
{
	char path[64];
	int fd;

	if (__atomic_load_n(&refuse, __ATOMIC_SEQ_CST))
		return result(INVALID_FILE_TYPE);
	snprintf(path, sizeof(path), "/proc/self/fd/%d", d->handle.fd);
	fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return result(INVALID_FILE_TYPE);
	*fh = (void *)(intptr_t)(fd + 1);
	__atomic_add_fetch(&handles, 1, __ATOMIC_SEQ_CST);
	return result(0);
}

void cuFileHandleDeregister(void *fh)
{
	if (!fh)
		return;
	close((int)(intptr_t)fh - 1);
	__atomic_sub_fetch(&handles, 1, __ATOMIC_SEQ_CST);
}

CUfileError_t cuFileBufRegister(const void *p, size_t n, int flags) { return result(0); }
CUfileError_t cuFileBufDeregister(const void *p) { return result(0); }

ssize_t cuFileRead(void *fh, void *base, size_t n, off_t off, off_t boff)
{
	__atomic_add_fetch(&ios, 1, __ATOMIC_SEQ_CST);
	return pread((int)(intptr_t)fh - 1, (char *)base + boff, n, off);
}

ssize_t cuFileWrite(void *fh, const void *base, size_t n, off_t off, off_t boff)
{
	__atomic_add_fetch(&ios, 1, __ATOMIC_SEQ_CST);
	return pwrite((int)(intptr_t)fh - 1, (const char *)base + boff, n, off);
}
