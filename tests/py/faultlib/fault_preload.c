/*
 * fault_preload.c - LD_PRELOAD shim for the Python fault-injection tests.
 *
 * Wraps the libc calls libnvio makes while writing a file. A test arms it
 * through nvio_fault_arm(name, nth, err): the nth call (1-based) of that
 * function after arming fails with errno err, or, with err < 0, moves only
 * half of its bytes (a short transfer, pwrite/pwritev only). nth 0 only
 * counts; nvio_fault_count() says how many calls of the armed name ran.
 * Only calls on descriptors the test marks (nvio_fault_fd_min) or paths
 * under nvio_fault_dir count, so the interpreter's own I/O is left alone.
 * With NVIO_FAULT_NO_TMPFILE=1 in the environment, open(O_TMPFILE) fails
 * with EOPNOTSUPP, as on a file system without it (NFS): atomic writes
 * then use named temporaries.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

static char armed[32];
static atomic_long calls;
static long nth;
static int err;
static atomic_int fired;
static atomic_int fired_flags;
static char dir[4096];

void nvio_fault_arm(const char *name, long n, int e, const char *under)
{
	snprintf(armed, sizeof(armed), "%s", name ? name : "");
	snprintf(dir, sizeof(dir), "%s", under ? under : "");
	nth = n;
	err = e;
	atomic_store(&calls, 0);
	atomic_store(&fired, 0);
	atomic_store(&fired_flags, 0);
}

long nvio_fault_count(void) { return atomic_load(&calls); }
/* open(2)'s flags in the call that failed (0 for other calls). */
int nvio_fault_fired_flags(void) { return atomic_load(&fired_flags); }
int nvio_fault_fired(void) { return atomic_load(&fired); }

static int under_dir(int fd, const char *path)
{
	char link[64], target[4096];
	ssize_t n;

	if (!dir[0])
		return 1;
	if (path)
		return strncmp(path, dir, strlen(dir)) == 0;
	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	n = readlink(link, target, sizeof(target) - 1);
	if (n < 0)
		return 0;
	target[n] = 0;
	return strncmp(target, dir, strlen(dir)) == 0;
}

/* 0: go on; 1: fail now; 2: short transfer now */
static int hit(const char *name, int fd, const char *path)
{
	long c;

	if (strcmp(name, armed) || !under_dir(fd, path))
		return 0;
	c = atomic_fetch_add(&calls, 1) + 1;
	if (nth <= 0 || c != nth)
		return 0;
	atomic_store(&fired, 1);
	if (err < 0)
		return 2;
	errno = err;
	return 1;
}

#define REAL(ret, name, ...) \
	static ret (*real)(__VA_ARGS__); \
	if (!real) \
		real = (ret (*)(__VA_ARGS__))dlsym(RTLD_NEXT, name)

ssize_t pwrite(int fd, const void *b, size_t n, off_t off)
{
	REAL(ssize_t, "pwrite", int, const void *, size_t, off_t);
	switch (hit("pwrite", fd, NULL)) {
	case 1: return -1;
	case 2: n = n > 1 ? n / 2 : n; break;
	}
	return real(fd, b, n, off);
}

ssize_t pwritev(int fd, const struct iovec *v, int cnt, off_t off)
{
	REAL(ssize_t, "pwritev", int, const struct iovec *, int, off_t);
	switch (hit("pwritev", fd, NULL)) {
	case 1: return -1;
	case 2: if (cnt > 1) cnt /= 2; break;
	}
	return real(fd, v, cnt, off);
}

int fsync(int fd)
{
	REAL(int, "fsync", int);
	return hit("fsync", fd, NULL) ? -1 : real(fd);
}

int fallocate(int fd, int mode, off_t off, off_t len)
{
	REAL(int, "fallocate", int, int, off_t, off_t);
	return hit("fallocate", fd, NULL) ? -1 : real(fd, mode, off, len);
}

int ftruncate(int fd, off_t len)
{
	REAL(int, "ftruncate", int, off_t);
	return hit("ftruncate", fd, NULL) ? -1 : real(fd, len);
}

int rename(const char *a, const char *b)
{
	REAL(int, "rename", const char *, const char *);
	return hit("rename", -1, b) ? -1 : real(a, b);
}

int linkat(int fd1, const char *a, int fd2, const char *b, int flags)
{
	REAL(int, "linkat", int, const char *, int, const char *, int);
	return hit("linkat", fd2, b[0] == '/' ? b : NULL) ? -1 : real(fd1, a, fd2, b, flags);
}

int open(const char *path, int flags, ...)
{
	mode_t mode = 0;
	REAL(int, "open", const char *, int, ...);
	if (flags & (O_CREAT | O_TMPFILE)) {
		va_list ap;
		va_start(ap, flags);
		mode = va_arg(ap, mode_t);
		va_end(ap);
	}
	if ((flags & O_TMPFILE) == O_TMPFILE) {
		const char *no = getenv("NVIO_FAULT_NO_TMPFILE");

		if (no && *no == '1') {
			errno = EOPNOTSUPP;
			return -1;
		}
	}
	if (hit("open", -1, path)) {
		atomic_store(&fired_flags, flags);
		return -1;
	}
	return real(path, flags, mode);
}
