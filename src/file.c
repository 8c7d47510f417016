/*
 * file.c - open files: descriptors, alignment, size, growth, and the
 * temporary of an atomic write with its commit or abandon (its name and
 * the sweep of killed writers' temporaries: temps.c).
 *
 * A file is opened once and every op on it uses what was found then: the
 * buffered descriptor (heads, tails, buffered I/O), the O_DIRECT one
 * (opened on first need, for the very file the buffered one has open),
 * the alignment O_DIRECT needs here, and the size, which grows with the
 * writes nvio accepts. The by-path and by-fd calls make a private file
 * for their one op.
 *
 * An ATOMIC file is written where nobody can see it: an unnamed
 * O_TMPFILE in the target's directory where the file system has them,
 * else a hidden temporary created exclusively (O_EXCL|O_NOFOLLOW, an
 * unpredictable name). Commit names it (linkat through /proc/self/fd for
 * the unnamed one) and renames it over the target: the target is the old
 * file or the new one, never a part of either.
 *
 * With NVIO_FILE_SPARE the temporary is the target's spare (temps.c), the
 * previous version's blocks overwritten in place, and commit swaps the
 * names of spare and target (RENAME_EXCHANGE). The target is still never
 * written: it changes only by that swap, made after the spare's data is
 * durable, so a crash at any moment leaves the old target or the new.
 * A read-only open holds a shared flock on its file, which a spare save
 * must lock exclusively to take it: a file being read is never written
 * in place after the swap made it the spare (the save takes an ordinary
 * temporary then).
 *
 * Links at an atomic target are followed by the kernel (an O_PATH open),
 * so fs.protected_symlinks applies as to any open(2). Opens by path never
 * block on a FIFO: they check the kind of file with O_NONBLOCK first.
 */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stddef.h>
#include <linux/fs.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "sys.h"

#define KNOWN_FILE_FLAGS (NVIO_FILE_READ | NVIO_FILE_WRITE | NVIO_FILE_CREATE | \
			  NVIO_FILE_EXCL | NVIO_FILE_TRUNC | NVIO_FILE_ATOMIC | \
			  NVIO_FILE_NOSYNC | NVIO_FILE_SPARE | NVIO_FILE_SHARED)

/*
 * Whether open(2) would follow the link fd (O_PATH|O_NOFOLLOW) has open,
 * which sits in the directory dir: fs.protected_symlinks' rule (a link
 * in a sticky world-writable directory is followed only by its owner,
 * or when it and the directory have one owner). 0, or -EACCES as the
 * kernel says it. The sysctl is read through nvio__sys.open, so tests
 * can set it for the library alone.
 */
static int may_follow(int fd, const char *dir)
{
	struct stat l, d;
	char v = '0';
	int sfd;

	if (nvio__sys.fstat(fd, &l) < 0 || nvio__sys.stat(dir, &d) < 0)
		return -errno;
	if (!(d.st_mode & S_ISVTX) || !(d.st_mode & S_IWOTH) ||
	    l.st_uid == geteuid() || l.st_uid == d.st_uid)
		return 0;
	sfd = nvio__open("/proc/sys/fs/protected_symlinks", O_RDONLY, 0);
	if (sfd >= 0) {
		if (read(sfd, &v, 1) != 1)
			v = '1';	/* unknown: as the kernel's default */
		nvio__sys.close(sfd);
	}
	return v == '0' ? 0 : -EACCES;
}

/*
 * One link of a dangling chain: its target, read from the link itself
 * (O_PATH|O_NOFOLLOW, then readlinkat on it: the link checked is the link
 * read, whatever is renamed over its name meanwhile), once open's rule
 * allows following it. 1 and link set, 0 cur is no link, or -errno.
 */
static int read_link(const char *cur, char *link, ssize_t *n)
{
	char *dir = strdup(cur), *slash;
	struct stat st;
	int fd, r;

	if (!dir)
		return -ENOMEM;
	slash = strrchr(dir, '/');
	if (!slash)
		snprintf(dir, 2, ".");
	else if (slash == dir)
		slash[1] = 0;
	else
		*slash = 0;
	fd = nvio__open(cur, O_PATH | O_NOFOLLOW, 0);
	r = fd < 0 ? 0 : nvio__sys.fstat(fd, &st) < 0 ? -errno :
	    !S_ISLNK(st.st_mode) ? 0 : may_follow(fd, dir);
	if (fd >= 0 && r == 0 && S_ISLNK(st.st_mode)) {
		*n = nvio__sys.readlinkat(fd, "", link, PATH_MAX);
		r = *n < 0 ? -errno : *n == PATH_MAX ? -ENAMETOOLONG : 1;
	}
	if (fd >= 0)
		nvio__sys.close(fd);
	free(dir);
	return r;
}

/*
 * The name a dangling link leads to, followed here (a link's relative
 * target is relative to the link's directory): the name open would
 * create. Called once the kernel found the chain dangling, but the links
 * may have been replaced since (another user renaming a link to root's
 * file over the name), so each link is checked again by open's rule as it
 * is followed (may_follow). Sets *out to a malloc'd name.
 */
static int follow_dangling(const char *path, char **out)
{
	char *cur = strdup(path), *link = malloc(PATH_MAX), *next;
	int err = -ENOMEM;

	for (int hops = 0; cur && link; hops++) {
		ssize_t n = 0;
		size_t dlen;

		err = read_link(cur, link, &n);
		if (err == 0) {
			free(link);
			*out = cur;	/* errors are open's to report */
			return 0;
		}
		if (err < 0)
			break;
		err = -ELOOP;	/* open's limit on links in a name */
		if (hops == 40)
			break;
		link[n] = 0;
		/* relative: beside the link, after cur's last '/' */
		dlen = link[0] == '/' || !strrchr(cur, '/') ? 0 :
		       (size_t)(strrchr(cur, '/') - cur) + 1;
		err = -ENOMEM;
		next = malloc(dlen + (size_t)n + 1);
		if (!next)
			break;
		memcpy(next, cur, dlen);
		memcpy(next + dlen, link, (size_t)n + 1);
		free(cur);
		cur = next;
	}
	free(cur);
	free(link);
	return err;
}

/*
 * The name of the file fd has open (/proc/self/fd), malloc'd in *out, if
 * that name still leads to it; -ESTALE if it does not (renamed or
 * removed meanwhile).
 */
static int name_of_fd(int fd, char **out)
{
	char proc[64], *name = malloc(PATH_MAX);
	struct stat a, b;
	ssize_t n;

	if (!name)
		return -ENOMEM;
	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
	n = nvio__sys.readlinkat(AT_FDCWD, proc, name, PATH_MAX);
	if (n <= 0 || n == PATH_MAX || name[0] != '/') {
		free(name);
		return n < 0 ? -errno : -ENAMETOOLONG;
	}
	name[n] = 0;
	if (nvio__sys.fstat(fd, &a) < 0 || nvio__sys.stat(name, &b) < 0 ||
	    a.st_ino != b.st_ino || a.st_dev != b.st_dev) {
		free(name);
		return -ESTALE;
	}
	*out = name;
	return 0;
}

/*
 * The name a write through path would reach, as open(2) follows it. The
 * kernel follows the links (an O_PATH open: nothing is opened for I/O),
 * so exactly open's rules apply: fs.protected_symlinks refuses (-EACCES)
 * a link another user owns in a sticky world-writable directory, -ELOOP
 * past its limit. Following them with readlink here would skip those
 * checks and let another user aim root's save at root's files. The file
 * reached is named through /proc/self/fd. A dangling link (ENOENT once
 * the kernel allowed every link on the way) gives the name it points to,
 * which open would create. Sets *out to a malloc'd name.
 */
static int follow_links(const char *path, char **out)
{
	struct stat st;
	int fd, r = -ESTALE;

	if (nvio__sys.lstat(path, &st) < 0 || !S_ISLNK(st.st_mode)) {
		*out = strdup(path);	/* errors are open's to report */
		return *out ? 0 : -ENOMEM;
	}
	/* the target renamed between the open and its name: again */
	for (int i = 0; i < 10 && r == -ESTALE; i++) {
		fd = nvio__open(path, O_PATH, 0);
		if (fd == -ENOENT)
			return follow_dangling(path, out);
		if (fd < 0)
			return fd;
		r = name_of_fd(fd, out);
		nvio__sys.close(fd);
	}
	return r;
}

/* The directory part of path, malloc'd ("." when it has none). */
static char *dir_of(const char *path)
{
	char *copy = strdup(path), *d;

	if (!copy)
		return NULL;
	d = strdup(dirname(copy));
	free(copy);
	return d;
}

/* The target's file name (after its last '/'). */
static const char *base_of(const char *target)
{
	const char *slash = strrchr(target, '/');

	return slash ? slash + 1 : target;
}

/*
 * A fresh hidden name beside the target that carries this process as
 * its owner (temps.c), in a malloc'd *out; tried by the caller until one
 * is free.
 */
static int temp_name(char **out, const char *dir, const char *target)
{
	size_t len = strlen(dir) + NAME_MAX + 2;

	if (!*out && !(*out = malloc(len)))
		return -ENOMEM;
	return nvio__temp_name(*out, len, dir, base_of(target)) < 0 ? -ENAMETOOLONG : 0;
}

/*
 * The process's umask, read without changing it (umask(2) sets it, which
 * would race other threads' file creation): "Umask:" in /proc/self/status
 * (Linux 4.7 and later). -1 if it cannot be told.
 */
static int read_umask(void)
{
	char buf[8192], *p;
	ssize_t n;
	int fd = nvio__open("/proc/self/status", O_RDONLY, 0);

	if (fd < 0)
		return -1;
	n = read(fd, buf, sizeof(buf) - 1);
	nvio__sys.close(fd);
	if (n <= 0)
		return -1;
	buf[n] = 0;
	p = strstr(buf, "\nUmask:");
	return p ? (int)(strtol(p + 7, NULL, 8) & 0777) : -1;
}

/*
 * A spare's old bytes are marked unwritten (FALLOC_FL_ZERO_RANGE: ext4
 * converts the extents and keeps the blocks), so that a buffered write of
 * part of a page (a record's header, an unaligned tail) does not first
 * read that page from the disk, one synchronous read each: a spare save
 * of 5,000 small tensors ran 0.6x as fast without this. Direct writes
 * then convert the extents back, as into a new, preallocated file; the
 * blocks below stay written ones. Best effort: a file system without it
 * just reads. Returns the spare's size (0 if it cannot be told).
 */
static uint64_t zero_old_bytes(int fd)
{
	struct stat st;

	if (nvio__sys.fstat(fd, &st) < 0)
		return 0;
	if (st.st_size > 0)
		(void)nvio__sys.fallocate(fd, FALLOC_FL_ZERO_RANGE, 0, st.st_size);
	return (uint64_t)st.st_size;
}

/*
 * NVIO_FILE_SPARE: the target's spare as the temporary, its blocks
 * overwritten in place. An existing target (exists): the spare the last
 * save left or, if none, a new one under the spare's name so that the
 * next save finds one; commit swaps the two. No target: a spare that is
 * there all the same (its target removed since, or a file its owner
 * renamed to the spare's name to reuse its blocks, as nvio.dcp's writer
 * does) is used and renamed into place, with the mode a new file gets
 * (0666 less the umask); none is made. -errno when there is none to take (temps.c
 * says which): the caller then makes an ordinary temporary.
 */
static int open_spare(struct nvio_file *f, const char *dir, int exists)
{
	size_t len = strlen(dir) + NAME_MAX + 2;
	char *name = malloc(len);
	int fd = -ENOMEM, mask = 0;

	if (!exists && (mask = read_umask()) < 0)
		fd = -ENOSYS;
	else if (name && (fd = nvio__spare_name(name, len, dir, base_of(f->target))) >= 0) {
		fd = nvio__spare_take(name, 0);
		if (fd == -ENOENT && exists)
			fd = nvio__spare_take(name, 1);
	}
	if (fd >= 0) {
		/*
		 * The lock stays on a descriptor of its own that no I/O goes
		 * through: the kernel can hold the file an I/O descriptor
		 * names for a while after close() (an io_uring or aio request
		 * completing, a deferred release), and with it the lock, so
		 * the next save would find its own spare "in use" and fall
		 * back to an ordinary temporary.
		 */
		f->lock_fd = fd;
		fd = nvio__reopen(f->lock_fd, NULL, O_RDWR, NULL);
		if (fd < 0) {
			nvio__sys.close(f->lock_fd);
			f->lock_fd = -1;
		}
	}
	if (fd < 0) {
		free(name);
		return fd;
	}
	if (!exists) {
		f->tmp_mode = 0666 & ~(unsigned)mask;
		f->keep_mode = 1;
	}
	f->spare_size = zero_old_bytes(fd);
	f->tmp_path = name;
	f->spare = 1;
	f->exchange = exists;
	return fd;
}

/*
 * Where an atomic write goes. The target is path with its links followed,
 * so a link stays a link and the file it names is replaced, as a plain
 * open and write would. Only a regular file (or nothing) can be replaced:
 * a device, FIFO or socket would be turned into a file that receives
 * nothing. A file being replaced keeps its permissions (applied at
 * commit; the temporary is 0600 until then so nvio can reopen it for
 * O_DIRECT and validation whatever they are); a new file gets 0666 less
 * the umask.
 */
static int open_temp(struct nvio_file *f, const char **what)
{
	struct stat st;
	char *dir;
	mode_t mode = 0666;
	int fd, r;

	*what = "open";
	r = follow_links(f->path, &f->target);
	if (r == -EACCES)
		*what = "follow symlink (kernel refused: protected_symlinks)";
	if (r < 0)
		return r;
	if (nvio__sys.stat(f->target, &st) == 0) {
		if (S_ISDIR(st.st_mode))
			return -EISDIR;
		if (!S_ISREG(st.st_mode)) {
			*what = "replace (not a regular file)";
			return -EINVAL;
		}
		f->tmp_mode = st.st_mode & 07777;
		f->keep_mode = 1;
		mode = 0600;
	}
	dir = dir_of(f->target);
	if (!dir)
		return -ENOMEM;
	/* what killed writers of this target left (best effort) */
	nvio__temps_sweep(dir, base_of(f->target), 0, NULL, NULL);
	*what = "open temporary";
	if ((f->flags & NVIO_FILE_SPARE) && (fd = open_spare(f, dir, f->keep_mode)) >= 0) {
		free(dir);
		return fd;
	}
	/* SHARED: other processes open it by name, so it needs one now */
	fd = f->flags & NVIO_FILE_SHARED ? -EOPNOTSUPP :
	     nvio__open(dir, O_TMPFILE | O_RDWR, mode);
	if (fd >= 0) {
		free(dir);
		f->tmpfile = 1;
		return fd;
	}
	if (fd != -EOPNOTSUPP && fd != -EISDIR && fd != -EINVAL) {
		free(dir);
		return fd;	/* ENOENT, EACCES, ENOSPC: a named one fails too */
	}
	fd = -EEXIST;
	for (int i = 0; fd == -EEXIST && i < 100; i++) {
		fd = temp_name(&f->tmp_path, dir, f->target);
		if (fd == 0)
			fd = nvio__open(f->tmp_path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW, mode);
	}
	free(dir);
	if (fd < 0) {
		free(f->tmp_path);
		f->tmp_path = NULL;
	}
	return fd;
}

static int open_flags(unsigned flags)
{
	int acc = (flags & NVIO_FILE_READ) && (flags & NVIO_FILE_WRITE) ? O_RDWR :
		  (flags & NVIO_FILE_WRITE) ? O_WRONLY : O_RDONLY;

	return acc | (flags & NVIO_FILE_CREATE ? O_CREAT : 0) |
	       (flags & NVIO_FILE_EXCL ? O_EXCL : 0) |
	       (flags & NVIO_FILE_TRUNC ? O_TRUNC : 0);
}

/*
 * Opens by path, noting whether this open created the file, so that a
 * one-buffer call that fails can remove the file it made (and nothing
 * else: an existing file is opened without O_CREAT). O_NONBLOCK: a FIFO
 * must not block the open (kind_of refuses it); cleared once it is known
 * to be something else.
 */
static int open_path(struct nvio_file *f, const char *path, unsigned flags)
{
	int fl = open_flags(flags) | O_NONBLOCK, fd = -ENOENT;

	if (!(fl & O_CREAT) || (fl & O_EXCL)) {
		fd = nvio__open(path, fl, 0666);
		f->created = fd >= 0 && (fl & O_EXCL);
		return fd;
	}
	for (int i = 0; i < 10 && fd == -ENOENT; i++) {
		fd = nvio__open(path, fl | O_EXCL, 0666);
		if (fd >= 0) {
			f->created = 1;
			break;
		}
		if (fd == -EEXIST)	/* there: open it as it is */
			fd = nvio__open(path, fl & ~O_CREAT, 0666);
	}
	return fd;
}

/*
 * Whether a file of mode m may be opened by path with flags: regular
 * files and block devices always; character devices only to be written
 * (/dev/full, /dev/null as a sink: reading one has no size or end);
 * never a FIFO or a socket, whose open or first read blocks until a peer
 * comes (forever, for a checkpoint path someone replaced with a FIFO).
 * 0, or -EINVAL with *what naming the kind.
 */
static int kind_of(mode_t m, unsigned flags, const char **what)
{
	if (S_ISREG(m) || S_ISBLK(m) || S_ISDIR(m))
		return 0;	/* a directory: -EISDIR later */
	if (S_ISCHR(m) && !(flags & NVIO_FILE_READ))
		return 0;
	*what = S_ISFIFO(m) ? "open (a FIFO, not a regular file)" :
		S_ISSOCK(m) ? "open (a socket, not a regular file)" :
		S_ISCHR(m) ? "open for reading (a char device: no size)" :
		"open (not a regular file)";
	return -EINVAL;
}

/*
 * A reader's shared flock(2) on the file it opened, taken while its name
 * still leads to it. A spare save takes a spare only if it can lock it
 * exclusively (temps.c), so the file a reader holds is never overwritten
 * in place once RENAME_EXCHANGE has made it the spare: the save takes a
 * fresh temporary instead, and the reader reads a whole version.
 * Returns 0 when locked, or when locks are not supported here (best
 * effort), or when the name leads to the file but someone holds an
 * exclusive lock on it and patient is 0: a file a spare writer holds
 * under the spare's name is never the one the target's name leads to
 * (it swaps the names, then downgrades its lock), so that holder is not
 * nvio and the file is read as it would be without locks. -EWOULDBLOCK:
 * try again; -ESTALE: the name leads elsewhere now (or is gone), open it
 * again; another -errno: the name could not be looked at.
 */
static int lock_shared(int fd, const char *path, const struct stat *st, int patient)
{
	struct statx now;
	int busy = 0;

	if (nvio__sys.flock(fd, LOCK_SH | LOCK_NB) < 0) {
		if (errno != EWOULDBLOCK)
			return 0;
		busy = 1;
	}
	/* through the table (statx), so tests can fail it */
	if (nvio__sys.statx(AT_FDCWD, path, 0, STATX_INO, &now) < 0)
		return errno == ENOENT ? -ESTALE : -errno;
	if (now.stx_ino != st->st_ino ||
	    makedev(now.stx_dev_major, now.stx_dev_minor) != st->st_dev)
		return -ESTALE;
	return busy && patient ? -EWOULDBLOCK : 0;
}

/* How often a reader opens a name again that leads elsewhere each time
 * (a spare save every millisecond), and how long it waits for a lock
 * before it takes an exclusive holder for a stranger's and reads without
 * one. nvio's own spare writer holds its lock on the new target from the
 * swap of names until it downgrades: a moment, unless the machine is so
 * loaded that the writer waits for a core; a reader that gave up too soon
 * would then read unlocked a file a later save may take as its spare and
 * overwrite (a torn read, seen under a loaded CI at 100 ms). */
#define READ_OPEN_TRIES 2000	/* of 1 ms */
#define READ_LOCK_PATIENCE 1000

/*
 * An open by path of an existing file or a new one (not ATOMIC): only a
 * kind of file nvio can use (kind_of), checked without blocking; a
 * read-only open of a regular file holds a shared lock (lock_shared).
 */
static int open_plain(struct nvio_file *f, const char *path, const char **what)
{
	struct timespec ms = { 0, 1000000 };
	struct stat st;
	int fd = -EWOULDBLOCK, r;

	for (int i = 0; i < READ_OPEN_TRIES && (fd == -EWOULDBLOCK || fd == -ESTALE); i++) {
		if (i > 0)
			nanosleep(&ms, NULL);
		fd = open_path(f, path, f->flags);
		/* a FIFO opened write-only with no reader: ENXIO */
		if (fd == -ENXIO && nvio__sys.stat(path, &st) == 0 && kind_of(st.st_mode, f->flags, what))
			return -EINVAL;
		if (fd < 0)
			return fd;
		r = nvio__sys.fstat(fd, &st) < 0 ? -errno : kind_of(st.st_mode, f->flags, what);
		/* the open set no other status flag (O_APPEND, O_DIRECT...) */
		if (!r && nvio__sys.fcntl(fd, F_SETFL, 0) < 0)
			r = -errno;
		if (!r && S_ISREG(st.st_mode) && !(f->flags & NVIO_FILE_WRITE)) {
			r = lock_shared(fd, path, &st, i < READ_LOCK_PATIENCE);
			if (r && r != -EWOULDBLOCK && r != -ESTALE)
				*what = "stat (the name, to lock the file)";
			/*
			 * The version now held: between the fstat above and the
			 * lock, two spare saves may have made this file the
			 * spare, rewritten it and swapped it back (the same
			 * inode, another size: a torn read of the old size)
			 */
			if (!r && nvio__sys.fstat(fd, &st) < 0) {
				r = -errno;
				*what = "fstat";
			}
		}
		if (r) {
			nvio__sys.close(fd);
			fd = r;
		}
	}
	if (fd == -ESTALE) {
		*what = "open (the file kept being replaced)";
		return -EBUSY;
	}
	if (fd >= 0)
		f->st = st;	/* nvio__file_make need not fstat again */
	return fd;
}

/*
 * Adopts the caller's descriptor. One opened with O_APPEND would ignore
 * offsets and one with O_DIRECT forbids unaligned pieces: the buffered
 * side then gets a plain descriptor of our own for the same file.
 */
static int adopt_fd(struct nvio_file *f, int fd, const char **what)
{
	int fl = nvio__sys.fcntl(fd, F_GETFL, 0), acc;

	*what = "fd";
	if (fl < 0)
		return -EBADF;
	acc = fl & O_ACCMODE;
	if (((f->flags & NVIO_FILE_WRITE) && acc == O_RDONLY) ||
	    ((f->flags & NVIO_FILE_READ) && acc == O_WRONLY))
		return -EBADF;
	f->caller_fd = fd;
	if (!(fl & (O_DIRECT | O_APPEND))) {
		f->fd = fd;
		return 0;
	}
	f->fd = nvio__reopen(fd, NULL, acc, NULL);
	if (f->fd < 0)
		return f->fd;
	f->own_fd = 1;
	return 0;
}

/* The file's size: regular files and block devices; any other (pipes,
 * character devices) has none: UINT64_MAX. */
static int size_of(int fd, const struct stat *st, uint64_t *size)
{
	if (S_ISBLK(st->st_mode))
		return ioctl(fd, BLKGETSIZE64, size) < 0 ? -errno : 0;
	*size = S_ISREG(st->st_mode) ? (uint64_t)st->st_size : UINT64_MAX;
	return 0;
}

/*
 * The offset alignment O_DIRECT needs for this file, 0 if the file
 * system cannot do direct I/O. Sets *mem_align for buffers.
 */
static uint32_t dio_align(int fd, uint32_t *mem_align)
{
	struct statx sx;

	*mem_align = NVIO__PAGE;
	if (nvio__sys.statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) < 0 ||
	    !(sx.stx_mask & STATX_DIOALIGN))
		return NVIO__PAGE;	/* unknown: page alignment is safe */
	*mem_align = sx.stx_dio_mem_align ? sx.stx_dio_mem_align : NVIO__PAGE;
	return sx.stx_dio_offset_align;
}

static int check_flags(unsigned flags, int by_fd)
{
	if (flags & ~KNOWN_FILE_FLAGS)
		return -EINVAL;
	if (by_fd)
		return flags & ~(NVIO_FILE_READ | NVIO_FILE_WRITE) ||
		       !(flags & (NVIO_FILE_READ | NVIO_FILE_WRITE)) ? -EINVAL : 0;
	if (!(flags & (NVIO_FILE_READ | NVIO_FILE_WRITE | NVIO_FILE_ATOMIC)))
		return -EINVAL;
	if ((flags & NVIO_FILE_ATOMIC) && (flags & (NVIO_FILE_EXCL | NVIO_FILE_TRUNC)))
		return -EINVAL;	/* CREATE is what ATOMIC does anyway */
	if ((flags & NVIO_FILE_SHARED) && !(flags & NVIO_FILE_ATOMIC))	/* a join */
		return flags & ~(NVIO_FILE_READ | NVIO_FILE_WRITE | NVIO_FILE_SHARED) ||
		       !(flags & NVIO_FILE_WRITE) ? -EINVAL : 0;
	if ((flags & (NVIO_FILE_NOSYNC | NVIO_FILE_SPARE)) && !(flags & NVIO_FILE_ATOMIC))
		return -EINVAL;
	if ((flags & NVIO_FILE_EXCL) && !(flags & NVIO_FILE_CREATE))
		return -EINVAL;
	return 0;
}

/*
 * Whether the file name of path is one nvio gives a temporary or a spare
 * (".<name>.nvio-..."): nvio_file_join opens nothing else.
 */
static int temp_like(const char *path)
{
	const char *base = base_of(path), *n = strstr(base, ".nvio-");

	return base[0] == '.' && n && n != base && n[6] != 0;
}

/*
 * nvio_file_join (and an open with SHARED but not ATOMIC: sh NULL, no
 * identity to compare): the shared temporary at f->path, and only it. Opened
 * without following a link, creating or truncating, and without blocking
 * (a FIFO planted at the name); then it must be a regular file of one
 * name, the caller's, with the identity its creator published.
 */
static int open_joined(struct nvio_file *f, const nvio_share_t *sh, const char **what)
{
	int fd, r = 0;

	*what = "join (not the name of an nvio temporary)";
	if (!temp_like(f->path))
		return -EINVAL;
	*what = "join (open the shared temporary)";
	fd = nvio__open(f->path, open_flags(f->flags) | O_NOFOLLOW | O_NONBLOCK, 0);
	if (fd == -ELOOP)
		*what = "join (a symbolic link at the temporary's name: not followed)";
	if (fd == -ENXIO) {		/* a FIFO without reader, a socket */
		*what = "join (not a regular file)";
		return -EINVAL;
	}
	if (fd < 0)
		return fd;
	if (nvio__sys.fstat(fd, &f->st) < 0) {
		*what = "join (stat)";
		r = -errno;
	} else if (!S_ISREG(f->st.st_mode)) {
		*what = "join (not a regular file)";
		r = -EINVAL;
	} else if (f->st.st_uid != geteuid() || f->st.st_nlink != 1) {
		*what = f->st.st_nlink != 1 ? "join (a file with other names)" :
			"join (another user's file)";
		r = -EPERM;
	} else if (sh && ((uint64_t)f->st.st_dev != sh->dev ||
			  (uint64_t)f->st.st_ino != sh->ino)) {
		*what = "join (not the creator's temporary: replaced or abandoned)";
		r = -ESTALE;
	} else if (nvio__sys.fcntl(fd, F_SETFL, 0) < 0) {
		*what = "join (fcntl)";
		r = -errno;
	}
	if (r) {
		nvio__sys.close(fd);
		return r;
	}
	f->flags |= NVIO_FILE_SHARED;	/* a share: its size is the creator's */
	return fd;
}

static int file_make(struct nvio_handle *h, const char *path, int fd, unsigned flags,
		     const nvio_share_t *share, struct nvio_file **out, const char **what);

/*
 * Opens a file object: by path (fd < 0) or over the caller's fd. On
 * failure returns -errno with *what naming the step, and frees what it
 * made (an atomic file's temporary included).
 */
int nvio__file_make(struct nvio_handle *h, const char *path, int fd,
		    unsigned flags, struct nvio_file **out, const char **what)
{
	return file_make(h, path, fd, flags, NULL, out, what);
}

/* nvio__file_make, or with share (and path) nvio_file_join's open. */
static int file_make(struct nvio_handle *h, const char *path, int fd, unsigned flags,
		     const nvio_share_t *share, struct nvio_file **out, const char **what)
{
	struct nvio_file *f;
	uint64_t size = 0;
	int r;

	*out = NULL;
	*what = "handle (inherited through fork)";
	if (nvio__forked(h))
		return -ECHILD;
	*what = "flags";
	if (check_flags(flags, !path))
		return -EINVAL;
	*what = "open";
	if (path && !*path)
		return -ENOENT;
	f = calloc(1, sizeof(*f));
	if (!f)
		return -ENOMEM;
	if (flags & NVIO_FILE_ATOMIC)
		flags |= NVIO_FILE_WRITE;
	f->h = h;
	f->flags = flags;
	f->fd = f->dfd = f->caller_fd = f->lock_fd = -1;
	pthread_mutex_init(&f->lock, NULL);
	if (path) {
		f->path = strdup(path);
		f->by_path = 1;
	} else if ((f->path = malloc(32)) != NULL) {
		snprintf(f->path, 32, "fd %d", fd);
	}
	r = f->path ? 0 : -ENOMEM;
	if (!r && !path) {
		r = adopt_fd(f, fd, what);
	} else if (!r) {
		r = share || (flags & (NVIO_FILE_SHARED | NVIO_FILE_ATOMIC)) ==
			     NVIO_FILE_SHARED ? open_joined(f, share, what) :
		    flags & NVIO_FILE_ATOMIC ? open_temp(f, what) :
		    open_plain(f, path, what);
		f->fd = r;
		f->own_fd = r >= 0;
		r = r < 0 ? r : 0;
	}
	if (!r && !f->st.st_mode && nvio__sys.fstat(f->fd, &f->st) < 0) {
		*what = "stat";
		r = -errno;
	}
	if (!r && S_ISDIR(f->st.st_mode))
		r = -EISDIR;
	if (!r) {
		*what = "size";
		r = size_of(f->fd, &f->st, &size);
	}
	if (!r) {
		f->plain = !S_ISREG(f->st.st_mode) && !S_ISBLK(f->st.st_mode);
		atomic_store(&f->size, f->spare ? 0 : size);	/* a spare starts empty */
		if (h->cfg.direct != NVIO_DIRECT_OFF)
			f->align = dio_align(f->fd, &f->mem_align);
		if (f->align && !f->plain)
			f->split_small = nvio__dev_splits_small_pages(
				S_ISBLK(f->st.st_mode) ? f->st.st_rdev : f->st.st_dev);
		if (!f->align && h->cfg.direct == NVIO_DIRECT_ON) {
			*what = "open O_DIRECT (not supported here)";
			r = -EINVAL;
		}
	}
	if (r) {
		nvio__file_free(f);
		return r;
	}
	*out = f;
	return 0;
}

/* Closes one of the file's descriptors; a failed close of a written
 * file's is reported (returns -errno). EINTR has closed it all the same. */
static int close_checked(const struct nvio_file *f, int fd)
{
	if (nvio__sys.close(fd) == 0 || !(f->flags & NVIO_FILE_WRITE) ||
	    errno == EINTR)
		return 0;
	return -errno;
}

/* Closes the descriptors; the first failed close's error. */
int nvio__file_close_fds(struct nvio_file *f)
{
	int err = 0, r;

	nvio__cufile_close(f->cufh);
	f->cufh = NULL;
	if (f->own_dfd && (r = close_checked(f, f->dfd)) && !err)
		err = r;
	if (f->own_fd && (r = close_checked(f, f->fd)) && !err)
		err = r;
	if (f->lock_fd >= 0)
		nvio__sys.close(f->lock_fd);	/* last: the spare is free again */
	f->own_fd = f->own_dfd = 0;
	f->fd = f->dfd = f->lock_fd = -1;
	return err;
}

/*
 * A one-buffer call's private file that the call created and then failed
 * to write is removed, if its name still leads to it.
 */
static void remove_created(struct nvio_file *f)
{
	struct stat st;

	if (f->private && f->created && atomic_load(&f->failed) && f->by_path &&
	    nvio__sys.stat(f->path, &st) == 0 && st.st_dev == f->st.st_dev &&
	    st.st_ino == f->st.st_ino)
		nvio__sys.unlink(f->path);
}

/*
 * An abandoned spare that writes grew (a full disk, a failed save) goes
 * back to its size: its old blocks kept for the next save, the rest
 * freed. Called before its descriptors close.
 */
static void spare_give_back(struct nvio_file *f)
{
	struct stat st;

	if (f->spare && !f->committed && f->fd >= 0 &&
	    nvio__sys.fstat(f->fd, &st) == 0 && (uint64_t)st.st_size > f->spare_size)
		(void)nvio__sys.ftruncate(f->fd, (off_t)f->spare_size);
}

/* Whether f->tmp_path still leads to f's file (not followed); one never
 * stat'ed (a failed open) is taken as ours, as it was made just now. */
static int name_is_ours(const struct nvio_file *f)
{
	struct stat st;

	return !f->st.st_mode ||
	       (nvio__sys.lstat(f->tmp_path, &st) == 0 && st.st_dev == f->st.st_dev &&
		st.st_ino == f->st.st_ino);
}

/*
 * Whether a file is open elsewhere, seen through fd (its only other
 * open here): a write lease is granted only when no other open file
 * description of the file exists (fcntl(2) F_SETLEASE). Refused, it is
 * tried again a few times, 1 ms apart: io_uring and aio may release a
 * closed descriptor's file a little after close(). Leases unavailable
 * (EINVAL, ENOSYS, EACCES: not the owner, a file system without them)
 * count as open elsewhere. An open by another process while the lease
 * is held (a save of the target taking the spare) breaks it with a
 * signal to this process: SIGIO, whose default is to terminate, so the
 * descriptor's signal is set to SIGURG first, ignored by default.
 */
static int open_elsewhere(int fd)
{
	const struct timespec ms = { 0, 1000000 };
	int tries;

	if (nvio__sys.fcntl(fd, F_SETSIG, SIGURG) < 0)
		return 1;
	for (tries = 0; tries < 20; tries++) {
		if (nvio__sys.fcntl(fd, F_SETLEASE, F_WRLCK) == 0) {
			(void)nvio__sys.fcntl(fd, F_SETLEASE, F_UNLCK);
			return 0;
		}
		if (errno != EAGAIN)
			return 1;
		nanosleep(&ms, NULL);
	}
	return 1;
}

/*
 * Closes the descriptors (the first failed close's error), an abandoned
 * spare given back first. An abandoned SHARED spare that another open
 * still holds (a writer of the failed save, abandon being what a creator
 * does when one of them failed) is removed: kept it would be the next
 * save's temporary, same inode, so that writer's late bytes would land
 * in that save and a late join with the old identity would pass. One
 * that nobody else holds open is kept, as any spare is, for its blocks.
 * The test runs on the lock's descriptor, after the file's own closed,
 * and the removal while the lock is held (another save could take the
 * spare between the unlock and the removal), only if its name still
 * leads to it.
 */
static int spare_close(struct nvio_file *f)
{
	int lock_fd = f->lock_fd, err;

	spare_give_back(f);
	/* lock_fd < 0: closed already (nvio_file_close, then the free) */
	if (!f->spare || !(f->flags & NVIO_FILE_SHARED) || f->committed ||
	    !f->tmp_path || lock_fd < 0)
		return nvio__file_close_fds(f);
	f->lock_fd = -1;
	err = nvio__file_close_fds(f);
	if (open_elsewhere(lock_fd) && name_is_ours(f))
		nvio__sys.unlink(f->tmp_path);
	nvio__sys.close(lock_fd);	/* last: the spare is free again */
	return err;
}

/* Frees a file; an uncommitted atomic file is abandoned. */
void nvio__file_free(struct nvio_file *f)
{
	if (!f)
		return;
	spare_close(f);
	remove_created(f);
	/* a spare stays: its blocks matter; a name that leads to another
	 * file now (put there by one who knew it) is not ours to remove */
	if (f->tmp_path && !f->committed && !f->spare && name_is_ours(f))
		nvio__sys.unlink(f->tmp_path);
	pthread_mutex_destroy(&f->lock);
	free(f->path);
	free(f->tmp_path);
	free(f->target);
	free(f);
}

/*
 * The O_DIRECT descriptor: the caller's if it has O_DIRECT, else a new
 * one for the very file f->fd has open, even if its name was replaced
 * meanwhile (nvio__reopen). Opened once; its error is kept.
 */
int nvio__file_dfd(struct nvio_file *f)
{
	int state = atomic_load(&f->dfd_state), acc, fl;
	const char *name;

	if (state == 1)
		return f->dfd;
	if (state < 0)
		return state;
	pthread_mutex_lock(&f->lock);
	if (atomic_load(&f->dfd_state) == 0) {
		fl = f->caller_fd >= 0 ? nvio__sys.fcntl(f->caller_fd, F_GETFL, 0) : 0;
		if (fl > 0 && (fl & O_DIRECT) && !(fl & O_APPEND)) {
			f->dfd = f->caller_fd;
		} else {
			acc = nvio__sys.fcntl(f->fd, F_GETFL, 0) & O_ACCMODE;
			name = f->tmpfile ? NULL : f->tmp_path ? f->tmp_path :
			       f->by_path ? f->path : NULL;
			f->dfd = nvio__reopen(f->fd, name, acc | O_DIRECT, &f->st);
			f->own_dfd = f->dfd >= 0;
		}
		atomic_store(&f->dfd_state, f->dfd >= 0 ? 1 : f->dfd);
	}
	state = atomic_load(&f->dfd_state);
	pthread_mutex_unlock(&f->lock);
	return state == 1 ? f->dfd : state;
}

/* GDS: the file's cuFile registration, on the O_DIRECT descriptor where
 * there is one (compatibility mode takes a plain one); NULL if refused. */
void *nvio__file_cufh(struct nvio_file *f)
{
	void *fh = NULL;
	int dfd = f->h->cfg.direct != NVIO_DIRECT_OFF && f->align ?
		  nvio__file_dfd(f) : -1;

	pthread_mutex_lock(&f->lock);
	if (f->cufh_state == 0) {
		f->cufh_state = nvio__cufile_open(dfd >= 0 ? dfd : f->fd, &f->cufh) ? -1 : 1;
	}
	if (f->cufh_state == 1)
		fh = f->cufh;
	pthread_mutex_unlock(&f->lock);
	return fh;
}

void nvio__file_note_end(struct nvio_file *f, uint64_t end)
{
	uint64_t cur = atomic_load(&f->size);

	while (cur != UINT64_MAX && cur < end &&
	       !atomic_compare_exchange_weak(&f->size, &cur, end))
		;
}

/*
 * Direct writes that extend a file make ext4 and xfs take the slow,
 * blocking path for every request (io_uring then hands each one to a
 * kernel worker thread). Allocating the new range first turns them into
 * writes inside the file. It also reports a full disk (-ENOSPC) before
 * any byte is written. A gap before the range stays a hole.
 */
int nvio__file_grow(struct nvio_file *f, uint64_t off, uint64_t len)
{
	uint64_t end = off + len, size = atomic_load(&f->size), start = size;
	int err;

	if (!S_ISREG(f->st.st_mode) || end <= start)
		return 0;
	if (off > start)
		start = off;
	if (nvio__sys.fallocate(f->fd, 0, (off_t)start, (off_t)(end - start)) == 0)
		return 0;
	err = errno;
	/* Not supported here: the writes will extend the file themselves. */
	if (err != ENOSPC && err != EFBIG && err != EDQUOT)
		return 0;
	/* A full disk may have taken part of it: give that back. */
	nvio__file_shrink_back(f, end, size);
	return -err;
}

/*
 * A write that grew the file from `from` to `to` failed: the file goes
 * back to its old size, freeing what was allocated, unless some other
 * write has taken it further meanwhile. A spare goes back to the size it
 * had when it was taken, if larger.
 */
void nvio__file_shrink_back(struct nvio_file *f, uint64_t to, uint64_t from)
{
	struct stat st;
	/* a spare keeps the blocks it had: they are the next save's */
	uint64_t keep = f->spare && f->spare_size > from ? f->spare_size : from;

	if (!S_ISREG(f->st.st_mode) || nvio__sys.fstat(f->fd, &st) < 0 ||
	    (uint64_t)st.st_size > to || (uint64_t)st.st_size <= keep)
		return;
	if (nvio__sys.ftruncate(f->fd, (off_t)keep) == 0) {
		uint64_t cur = to;

		atomic_compare_exchange_strong(&f->size, &cur, from);
	}
}

int nvio__file_fsync_dir(const char *path)
{
	char *dir = dir_of(path);
	int fd, r;

	if (!dir)
		return -ENOMEM;
	fd = nvio__open(dir, O_RDONLY | O_DIRECTORY, 0);
	free(dir);
	if (fd < 0)
		return fd;
	r = nvio__sys.fsync(fd) < 0 ? -errno : 0;
	nvio__sys.close(fd);
	return r;
}

/* An unnamed temporary gets a hidden name beside the target. */
static int name_tmpfile(struct nvio_file *f)
{
	char proc[64], *dir = dir_of(f->target);
	int r = -EEXIST;

	if (!dir)
		return -ENOMEM;
	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", f->fd);
	for (int i = 0; r == -EEXIST && i < 100; i++) {
		r = temp_name(&f->tmp_path, dir, f->target);
		if (r == 0)
			r = nvio__sys.linkat(AT_FDCWD, proc, AT_FDCWD, f->tmp_path,
					     AT_SYMLINK_FOLLOW) < 0 ? -errno : 0;
	}
	free(dir);
	if (r < 0) {
		free(f->tmp_path);
		f->tmp_path = NULL;
	}
	return r;
}

/*
 * Puts a spare in place of its target by swapping their names, so that
 * the old target is the next save's spare; done while this writer holds
 * the spare's lock, so no other writer has either file. The spare's name
 * must still lead to this file: if something other than nvio moved it
 * meanwhile, the file gets an ordinary hidden name and a plain rename
 * (*plain set); if it removed it, the file cannot be named again and the
 * commit fails (ENOENT, *what saying so). A target that did not exist at open, one removed since
 * (ENOENT), or a file system without RENAME_EXCHANGE: a plain rename, no
 * spare left.
 */
static int swap_spare(struct nvio_file *f, int *plain, const char **what)
{
	struct stat st;
	int r;

	if (nvio__sys.lstat(f->tmp_path, &st) < 0 || st.st_ino != f->st.st_ino ||
	    st.st_dev != f->st.st_dev) {
		free(f->tmp_path);
		f->tmp_path = NULL;
		f->spare = 0;
		*plain = 1;
		r = name_tmpfile(f);
		/* a file with no name left cannot be linked again (ENOENT) */
		*what = r == -ENOENT ? "link (the spare was removed by another program)" : "link";
		return r;
	}
	if (f->exchange && nvio__sys.renameat2(AT_FDCWD, f->tmp_path, AT_FDCWD, f->target,
					       RENAME_EXCHANGE) == 0)
		return 0;
	r = f->exchange ? errno : ENOENT;
	if (r != EINVAL && r != ENOSYS && r != EOPNOTSUPP && r != ENOENT) {
		*what = "rename (exchange with the spare)";
		return -r;
	}
	if (nvio__sys.rename(f->tmp_path, f->target) < 0) {
		*what = "rename";
		return -errno;
	}
	return 0;
}

/*
 * Puts an atomic file in place of its target: a spare cut to the size
 * written, data durable first when asked (f->flags), the target's
 * permissions, a name, then one rename (or exchange), then the directory.
 * A private file (write_file) closes its descriptors before the rename,
 * so that an error writeback reports at close (NFS) still keeps the old
 * file. On error the target is untouched and the temporary's name is gone
 * (a spare's stays: it is the spare still); *what names the failed step.
 */
static int commit(struct nvio_file *f, int durable, const char **what)
{
	int r = 0, plain = !f->spare;

	if (f->spare && nvio__sys.ftruncate(f->fd, (off_t)atomic_load(&f->size)) < 0) {
		*what = "truncate (the spare, to the size written)";
		return -errno;
	}
	if (durable && nvio__sys.fsync(f->fd) < 0) {
		*what = "fsync";
		return -errno;
	}
	if (f->keep_mode && nvio__sys.fchmod(f->fd, f->tmp_mode) < 0) {
		*what = "chmod";
		return -errno;
	}
	if (f->spare) {
		r = swap_spare(f, &plain, what);
		/* the file is the target now, whole: readers may lock it
		 * (shared) while this writer still has it open */
		if (r == 0 && !plain)
			(void)nvio__sys.flock(f->lock_fd, LOCK_SH | LOCK_NB);
		if (r < 0 || !plain)
			goto renamed;
	}
	if (f->tmpfile && !f->tmp_path && (r = name_tmpfile(f)) < 0) {
		*what = "link";
		return r;
	}
	if (f->private && (r = nvio__file_close_fds(f)) < 0) {
		*what = "close";
	} else if (!name_is_ours(f)) {
		/* a named temporary's name is known to others (SHARED: its
		 * writers): what was put there is not what this file wrote */
		*what = "rename (the temporary's name leads to another file now)";
		r = -ESTALE;
	} else if (nvio__sys.rename(f->tmp_path, f->target) < 0) {
		*what = "rename";
		r = -errno;
	}
renamed:
	if (r < 0 && !f->spare) {
		if (f->tmp_path && name_is_ours(f))
			nvio__sys.unlink(f->tmp_path);
		free(f->tmp_path);
		f->tmp_path = NULL;
	}
	if (r < 0)
		return r;
	f->committed = 1;
	if (durable && (r = nvio__file_fsync_dir(f->target)) < 0)
		*what = "fsync directory";
	return r;
}

/* For write_file's private file: durable only with NVIO_FSYNC. */
int nvio__file_commit(struct nvio_file *f, int durable, const char **what)
{
	return commit(f, durable, what);
}

/* ---- the public calls ---------------------------------------------- */

/* A failure of a file call becomes the caller's nvio_last_error(). */
static int file_error_at(struct nvio_file *f, struct nvio_handle *h, int err,
			 const char *what, const char *path, uint64_t off, uint64_t len)
{
	nvio_error_t e;

	if (!h)
		return err;
	nvio__error_fill(&e, err, NULL, what, off, len);
	snprintf(e.path, sizeof(e.path), "%s", f ? f->path : path ? path : "");
	return nvio__error_publish(h, &e);
}

static int file_error(struct nvio_file *f, struct nvio_handle *h, int err,
		      const char *what, const char *path)
{
	return file_error_at(f, h, err, what, path, 0, 0);
}

nvio_file_t *nvio_file_open(nvio_handle_t *h, const char *path, unsigned flags,
			    int *err)
{
	struct nvio_file *f = NULL;
	const char *what = "open";
	int r = !h || !path ? -EINVAL : nvio__file_make(h, path, -1, flags, &f, &what);

	if (r)
		file_error(NULL, h, r, !path ? "path (NULL)" : what, path);
	if (err)
		*err = r;
	return f;
}

nvio_file_t *nvio_file_from_fd(nvio_handle_t *h, int fd, unsigned flags, int *err)
{
	struct nvio_file *f = NULL;
	const char *what = "fd";
	int r = !h ? -EINVAL : fd < 0 ? -EBADF :
		nvio__file_make(h, NULL, fd, flags, &f, &what);

	if (r) {
		char name[32];

		snprintf(name, sizeof(name), "fd %d", fd);
		file_error(NULL, h, r, what, name);
	}
	if (err)
		*err = r;
	return f;
}

int nvio_file_close(nvio_file_t *f)
{
	int r;

	if (!f)
		return 0;
	if (nvio__forked(f->h)) {
		/* the parent's ops and temporary are not ours to wait for or
		 * remove: close this process's copies of the descriptors */
		f->committed = 1;
		nvio__file_close_fds(f);
		nvio__file_free(f);
		return -ECHILD;
	}
	nvio__track_quiesce(f->h, f);
	r = spare_close(f);
	nvio__file_free(f);
	return r;
}

int nvio_file_sync(nvio_file_t *f)
{
	if (!f)
		return -EINVAL;
	if (nvio__sys.fsync(f->fd) < 0)
		return file_error(f, f->h, -errno, "fsync", NULL);
	return 0;
}

int nvio_file_commit(nvio_file_t *f)
{
	const char *what = "commit (not an ATOMIC file, or committed)";
	int r = -EINVAL;

	if (!f)
		return -EINVAL;
	if (nvio__forked(f->h))
		return -ECHILD;
	if ((f->flags & NVIO_FILE_ATOMIC) && !f->committed) {
		nvio__track_quiesce(f->h, f);
		what = "commit (an op on the file failed)";
		r = atomic_load(&f->failed) ? -EIO :
		    commit(f, !(f->flags & NVIO_FILE_NOSYNC), &what);
	}
	return r ? file_error(f, f->h, r, what, NULL) : 0;
}

int nvio_file_truncate(nvio_file_t *f, uint64_t size)
{
	if (!f || size > INT64_MAX)
		return -EINVAL;
	if (!(f->flags & NVIO_FILE_WRITE))
		return file_error(f, f->h, -EBADF, "truncate (not open for writing)", NULL);
	if (nvio__sys.ftruncate(f->fd, (off_t)size) < 0)
		return file_error(f, f->h, -errno, "truncate", NULL);
	if (atomic_load(&f->size) != UINT64_MAX)
		atomic_store(&f->size, size);
	return 0;
}

int nvio_file_allocate(nvio_file_t *f, int64_t offset, uint64_t nbytes)
{
	if (!f || offset < 0 || nbytes > (uint64_t)(INT64_MAX - offset))
		return -EINVAL;
	if (!(f->flags & NVIO_FILE_WRITE))
		return file_error(f, f->h, -EBADF, "allocate (not open for writing)", NULL);
	if (nbytes == 0)
		return 0;
	if (nvio__sys.fallocate(f->fd, 0, (off_t)offset, (off_t)nbytes) < 0) {
		int err = -errno;

		/* a full disk may have taken part of it: give that back */
		if (err == -ENOSPC || err == -EDQUOT || err == -EFBIG)
			nvio__file_shrink_back(f, (uint64_t)offset + nbytes,
					       atomic_load(&f->size));
		return file_error_at(f, f->h, err, "fallocate", NULL, (uint64_t)offset, nbytes);
	}
	nvio__file_note_end(f, (uint64_t)offset + nbytes);
	return 0;
}

int nvio_file_info(const nvio_file_t *f, nvio_file_info_t *out)
{
	nvio_file_info_t i;

	if (!f || !out)
		return -EINVAL;
	memset(&i, 0, sizeof(i));
	i.struct_size = sizeof(i);
	i.flags = f->flags;
	i.fd = f->fd;
	i.direct = f->align && atomic_load(&((struct nvio_file *)f)->dfd_state) >= 0;
	i.dio_offset_align = f->align;
	i.dio_mem_align = f->align ? f->mem_align : 0;
	i.size = atomic_load(&((struct nvio_file *)f)->size);
	i.committed = f->committed;
	return nvio__struct_out(out, &i, sizeof(i));
}

const char *nvio_file_path(const nvio_file_t *f)
{
	return f ? f->path : "";
}

const char *nvio_file_temp_path(const nvio_file_t *f)
{
	return f && f->tmp_path && !f->committed ? f->tmp_path : NULL;
}

int nvio_file_share(const nvio_file_t *f, nvio_share_t *out)
{
	nvio_share_t s;

	if (!f || !out || !(f->flags & NVIO_FILE_SHARED) || f->committed || !f->tmp_path)
		return -EINVAL;
	/* one that cannot hold the identity would pass for one that did */
	if (out->struct_size < offsetof(nvio_share_t, ino) + sizeof(out->ino))
		return -EINVAL;
	memset(&s, 0, sizeof(s));
	s.struct_size = sizeof(s);
	s.dev = (uint64_t)f->st.st_dev;
	s.ino = (uint64_t)f->st.st_ino;
	return nvio__struct_out(out, &s, sizeof(s));
}

/* A share from a caller built against this or a later header: it covers
 * dev and ino, and what this library does not know of is 0. */
static int share_valid(const nvio_share_t *sh)
{
	const unsigned char *p = (const unsigned char *)sh;
	size_t need = offsetof(nvio_share_t, ino) + sizeof(sh->ino);

	if (!sh || sh->struct_size < need || sh->reserved0)
		return 0;
	for (size_t i = offsetof(nvio_share_t, reserved); i < sh->struct_size; i++)
		if (p[i])
			return 0;
	return 1;
}

nvio_file_t *nvio_file_join(nvio_handle_t *h, const char *temp_path,
			    const nvio_share_t *share, unsigned flags, int *err)
{
	struct nvio_file *f = NULL;
	const char *what = "join (flags: WRITE, and READ if wanted)";
	int r = -EINVAL;

	if (!h || !temp_path)
		what = !h ? "join (handle NULL)" : "path (NULL)";
	else if (!share_valid(share))
		what = "join (share: struct_size, reserved fields)";
	else if ((flags & NVIO_FILE_WRITE) && !(flags & ~(NVIO_FILE_WRITE | NVIO_FILE_READ)))
		r = file_make(h, temp_path, -1, flags, share, &f, &what);
	if (r)
		file_error(NULL, h, r, what, temp_path);
	if (err)
		*err = r;
	return f;
}
