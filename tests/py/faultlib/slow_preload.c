/*
 * slow_preload.c - LD_PRELOAD shim that makes reads as slow as a disk.
 *
 * With NVIO_TEST_READ_BPS=N in the environment, every pread/preadv of
 * 64 KiB or more sleeps len / N seconds before it reads: each thread then
 * reads at most N bytes a second, as a device that serves one request at
 * a time per thread (psync's workers) does. Smaller reads (the
 * interpreter's own) are left alone. For tests of how long what a call has
 * in flight takes to end (test_offload_trust.py's Ctrl-C test).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

static void slow(size_t n)
{
	static double bps = -1;
	if (bps < 0) {
		const char *e = getenv("NVIO_TEST_READ_BPS");
		bps = e ? atof(e) : 0;
	}
	if (bps <= 0 || n < (64u << 10))
		return;
	double s = (double)n / bps;
	struct timespec ts = { (time_t)s, (long)((s - (time_t)s) * 1e9) };
	while (nanosleep(&ts, &ts) != 0)
		;
}

ssize_t pread(int fd, void *b, size_t n, off_t off)
{
	static ssize_t (*real)(int, void *, size_t, off_t);
	if (!real)
		real = (ssize_t (*)(int, void *, size_t, off_t))dlsym(RTLD_NEXT, "pread");
	slow(n);
	return real(fd, b, n, off);
}

ssize_t pread64(int fd, void *b, size_t n, off_t off) __attribute__((alias("pread")));

ssize_t preadv(int fd, const struct iovec *v, int cnt, off_t off)
{
	static ssize_t (*real)(int, const struct iovec *, int, off_t);
	size_t n = 0;
	if (!real)
		real = (ssize_t (*)(int, const struct iovec *, int, off_t))dlsym(RTLD_NEXT, "preadv");
	for (int i = 0; i < cnt; i++)
		n += v[i].iov_len;
	slow(n);
	return real(fd, v, cnt, off);
}

ssize_t preadv64(int fd, const struct iovec *v, int cnt, off_t off)
	__attribute__((alias("preadv")));
