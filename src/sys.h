/*
 * sys.h - every system call libnvio makes goes through nvio__sys.
 *
 * Tests replace entries to inject faults (EIO, ENOSPC, short transfers,
 * EINTR) at a chosen call; nvio__sys_reset() restores the real calls.
 * The table is read without locks: tests change it only while no handle
 * has I/O in flight. Entries named after a libc call follow libc's
 * convention (-1 and errno); io_result and reap_fault return -errno.
 */
#ifndef NVIO_SYS_H
#define NVIO_SYS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/stat.h>

struct statx;
struct iovec;

struct nvio__sys {
	int (*open)(const char *path, int flags, mode_t mode);
	int (*close)(int fd);
	ssize_t (*pread)(int fd, void *buf, size_t n, off_t off);
	ssize_t (*pwrite)(int fd, const void *buf, size_t n, off_t off);
	ssize_t (*preadv)(int fd, const struct iovec *iov, int n, off_t off);
	ssize_t (*pwritev)(int fd, const struct iovec *iov, int n, off_t off);
	int (*fstat)(int fd, struct stat *st);
	int (*fsync)(int fd);
	int (*rename)(const char *from, const char *to);
	int (*unlink)(const char *path);
	int (*mlock)(const void *p, size_t n);
	int (*fallocate)(int fd, int mode, off_t off, off_t len);
	int (*statx)(int dirfd, const char *path, int flags, unsigned mask,
		     struct statx *sx);
	int (*ftruncate)(int fd, off_t len);
	int (*linkat)(int olddirfd, const char *oldpath, int newdirfd,
		      const char *newpath, int flags);
	int (*eventfd)(unsigned initval, int flags);
	int (*renameat2)(int olddirfd, const char *oldpath, int newdirfd,
			 const char *newpath, unsigned flags);
	int (*flock)(int fd, int op);
	/* fcntl with an int argument (F_GETFL, F_SETFL) */
	int (*fcntl)(int fd, int cmd, int arg);
	int (*lstat)(const char *path, struct stat *st);
	int (*stat)(const char *path, struct stat *st);
	ssize_t (*readlinkat)(int dirfd, const char *path, char *buf, size_t n);
	int (*fchmod)(int fd, mode_t mode);
	/*
	 * Every completion of every engine passes through here before it is
	 * checked: res is the byte count or -errno the kernel reported for
	 * one request of n bytes at off. Return what the library should see.
	 * The default returns res unchanged.
	 */
	ssize_t (*io_result)(int is_write, int fd, uint64_t off, size_t n,
			     ssize_t res);
	/*
	 * Called by an engine before it waits for completions; a nonzero
	 * return is treated like that wait failing with it (tests: -EINTR).
	 */
	int (*reap_fault)(void);
};

extern struct nvio__sys nvio__sys;
void nvio__sys_reset(void);

/*
 * Helpers over the table. Both retry as retry.c says (EINTR, EAGAIN,
 * bounded) and loop over short transfers
 * until n bytes moved, the file ends (reads: -ENODATA) or an error.
 * Return 0 or -errno.
 */
int nvio__pread_full(int fd, void *buf, size_t n, uint64_t off);
int nvio__pwrite_full(int fd, const void *buf, size_t n, uint64_t off);
/* open() with EINTR retried; returns fd or -errno. */
int nvio__open(const char *path, int flags, mode_t mode);
/*
 * Another descriptor, with other flags, for the very file fd has open,
 * even if its path has been replaced meanwhile. By name when there is
 * one and it still leads to that file (st: fd's fstat, or NULL), else
 * through /proc/self/fd, which names the file fd has open but costs
 * twice an open by name. Returns fd or -errno.
 */
int nvio__reopen(int fd, const char *name, int flags, const struct stat *st);

#endif
