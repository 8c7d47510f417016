/*
 * sys.c - the one table of system calls (see sys.h), and the helpers that
 * loop over short transfers (retrying as retry.c says).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "internal.h"
#include "sys.h"

static int sys_open(const char *path, int flags, mode_t mode)
{
	return open(path, flags, mode);
}

static int sys_fcntl(int fd, int cmd, int arg)
{
	return fcntl(fd, cmd, arg);
}

static ssize_t identity_result(int is_write, int fd, uint64_t off, size_t n,
			       ssize_t res)
{
	return res;
}

static int no_reap_fault(void)
{
	return 0;
}

#define SYS_DEFAULT { \
	.open = sys_open, .close = close, .pread = pread, .pwrite = pwrite, \
	.preadv = preadv, .pwritev = pwritev, \
	.fstat = fstat, .fsync = fsync, .rename = rename, .unlink = unlink, \
	.mlock = mlock, .fallocate = fallocate, .statx = statx, \
	.ftruncate = ftruncate, .linkat = linkat, .eventfd = eventfd, \
	.renameat2 = renameat2, .flock = flock, .fcntl = sys_fcntl, \
	.lstat = lstat, .stat = stat, .readlinkat = readlinkat, .fchmod = fchmod, \
	.io_result = identity_result, .reap_fault = no_reap_fault, \
}

static const struct nvio__sys sys_default = SYS_DEFAULT;
struct nvio__sys nvio__sys = SYS_DEFAULT;

void nvio__sys_reset(void)
{
	nvio__sys = sys_default;
}

int nvio__open(const char *path, int flags, mode_t mode)
{
	int fd;

	do
		fd = nvio__sys.open(path, flags | O_CLOEXEC, mode);
	while (fd < 0 && errno == EINTR);
	return fd < 0 ? -errno : fd;
}

int nvio__pread_full(int fd, void *buf, size_t n, uint64_t off)
{
	char *p = buf;
	unsigned tries = 0;

	while (n > 0) {
		ssize_t r = nvio__sys.pread(fd, p, n, (off_t)off);

		if (r < 0 && nvio__retry(&tries, -errno))
			continue;
		if (r < 0)
			return -errno;
		if (r == 0)
			return -ENODATA;	/* the file ended first */
		p += r;
		off += (uint64_t)r;
		n -= (size_t)r;
	}
	return 0;
}

int nvio__pwrite_full(int fd, const void *buf, size_t n, uint64_t off)
{
	const char *p = buf;
	unsigned tries = 0;

	while (n > 0) {
		ssize_t w = nvio__sys.pwrite(fd, p, n, (off_t)off);

		if (w < 0 && nvio__retry(&tries, -errno))
			continue;
		if (w < 0)
			return -errno;
		if (w == 0)
			return -EIO;	/* no progress and no reason given */
		p += w;
		off += (uint64_t)w;
		n -= (size_t)w;
	}
	return 0;
}

static int same_file(int fd, const struct stat *st, int nfd)
{
	struct stat a, b;

	if (!st) {
		if (fstat(fd, &a) < 0)
			return 0;
		st = &a;
	}
	return fstat(nfd, &b) == 0 && st->st_dev == b.st_dev &&
	       st->st_ino == b.st_ino;
}

int nvio__reopen(int fd, const char *name, int flags, const struct stat *st)
{
	char p[64];
	int nfd = -ENOENT, r;

	if (name) {
		/*
		 * O_NONBLOCK: the name may lead to something else by now (a
		 * FIFO put there would block this open forever); cleared once
		 * it is known to be our file (io_uring would take it as
		 * IOCB_NOWAIT and fail writes with EAGAIN).
		 */
		nfd = nvio__open(name, flags | O_NONBLOCK, 0);
		if (nfd >= 0 && same_file(fd, st, nfd)) {
			if ((flags & O_NONBLOCK) ||
			    nvio__sys.fcntl(nfd, F_SETFL, flags & ~O_ACCMODE) == 0)
				return nfd;
			r = -errno;
			nvio__sys.close(nfd);
			return r;
		}
		if (nfd >= 0)
			nvio__sys.close(nfd);	/* replaced: not ours */
	}
	snprintf(p, sizeof(p), "/proc/self/fd/%d", fd);
	nfd = nvio__open(p, flags, 0);
	return nfd == -ENOENT && name ? -ESTALE : nfd;
}
