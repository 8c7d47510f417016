/*
 * temps.c - named temporaries that carry their owner, and the sweep that
 * removes those whose owner is dead.
 *
 * An atomic write leaves a named temporary beside its target when its
 * process is killed while it has one: always where the file system has no
 * O_TMPFILE (the data is written under the name), and for an instant
 * where it has (Linux cannot link a file over a name, so commit names the
 * file, then renames it). The name says who made it:
 *
 *     .<target>.nvio-<boot><place>-<pid>-<start>-<random>
 *
 * boot: 8 hex digits of a hash of the kernel's boot id; place: 8 of a
 * hash of the host name, /etc/machine-id and the pid namespace; pid and
 * start: the owner's process id and its start time (clock ticks after
 * boot, /proc/PID/stat), so that a pid used again by another process is
 * not mistaken for the owner; random: for two temporaries of one owner.
 * <target> is the target's name, cut to TEMP_BASE_MAX bytes so that the
 * whole name fits NAME_MAX.
 *
 * A temporary's owner is dead when it was made in this boot and this
 * place and its pid is gone or belongs to a process that started at
 * another time, or when it was made in this place in another boot. Made
 * elsewhere (another host sharing the directory, another container),
 * nothing here can tell: it is kept. Only regular files of the caller's
 * user are removed (all users' with NVIO_CLEAN_ANY_USER), by name in a
 * directory descriptor, never through a symbolic link.
 *
 * A spare (NVIO_FILE_SPARE) is another kind of hidden file beside a
 * target: ".<target>.nvio-spare", the target's previous version, kept so
 * that the next atomic write overwrites its blocks instead of allocating
 * fresh ones. Its name never parses as a temporary (no owner part), so
 * the sweep never removes it; nvio_clean_temporaries() does only with
 * NVIO_CLEAN_SPARES. The rules for taking one are here
 * (nvio__spare_take), for the writer and the cleaner alike: a regular
 * file of one link, the caller's own, exclusively flock(2)ed without
 * waiting, and still the file its name leads to once locked. A writer
 * swaps names with the target only while it holds that lock, so a lock
 * on the file the spare name leads to means nobody else is using it.
 * Readers (read-only opens, file.c) hold a shared lock on the file they
 * read, so a spare someone still reads is "in use" too.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "sys.h"

/* ".nvio-" + 16 hex + "-" + pid (10) + "-" + start (20) + "-" + 8 hex,
 * and the leading "." */
#define TEMP_SUFFIX_MAX 64
#define TEMP_BASE_MAX (NAME_MAX - TEMP_SUFFIX_MAX)
#define KNOWN_CLEAN_FLAGS (NVIO_CLEAN_DRY_RUN | NVIO_CLEAN_ANY_USER | \
			   NVIO_CLEAN_SPARES | NVIO_CLEAN_ALL_SPARES)
#define SPARE_SUFFIX ".nvio-spare"
/* the leading '.' and the suffix */
#define SPARE_BASE_MAX (NAME_MAX - 1 - (sizeof(SPARE_SUFFIX) - 1))
#define SPARE_CREATE 1u
#define SPARE_WRITE 2u
#define SPARE_ANY_USER 4u

struct owner {
	uint32_t boot;		/* 0: this boot cannot be told (no /proc) */
	uint32_t place;
	long pid;
	unsigned long long start;
};

static uint32_t fnv1a(uint32_t h, const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		h ^= (unsigned char)s[i];
		h *= 16777619u;
	}
	return h;
}

/* Reads up to len - 1 bytes of a small file, NUL-terminated; -1 if none. */
static ssize_t read_small(const char *path, char *buf, size_t len)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n;

	if (fd < 0)
		return -1;
	do
		n = read(fd, buf, len - 1);
	while (n < 0 && errno == EINTR);
	close(fd);
	if (n < 0)
		return -1;
	buf[n] = 0;
	return n;
}

/* A process's start time (field 22 of /proc/PID/stat); -errno if none. */
static int proc_start(long pid, unsigned long long *start)
{
	char path[64], buf[1024], *p;

	snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
	if (read_small(path, buf, sizeof(buf)) < 0)
		return -errno;
	/* the name (field 2) may hold spaces and ')': skip to its last ')' */
	p = strrchr(buf, ')');
	if (!p)
		return -EINVAL;
	p++;
	for (int field = 2; field < 21; field++) {
		p = strchr(p + 1, ' ');
		if (!p)
			return -EINVAL;
	}
	*start = strtoull(p + 1, NULL, 10);
	return 0;
}

static uint32_t this_boot(void)
{
	char buf[64];
	ssize_t n = read_small("/proc/sys/kernel/random/boot_id", buf, sizeof(buf));
	uint32_t h;

	if (n <= 0)
		return 0;
	h = fnv1a(2166136261u, buf, (size_t)n);
	return h ? h : 1;
}

static uint32_t this_place(void)
{
	char buf[256];
	uint32_t h = 2166136261u;
	ssize_t n;

	if (gethostname(buf, sizeof(buf)) == 0)
		h = fnv1a(h, buf, strnlen(buf, sizeof(buf)));
	h = fnv1a(h, "\n", 1);
	n = read_small("/etc/machine-id", buf, sizeof(buf));
	if (n > 0)
		h = fnv1a(h, buf, (size_t)n);
	h = fnv1a(h, "\n", 1);
	n = readlink("/proc/self/ns/pid", buf, sizeof(buf));
	if (n > 0)
		h = fnv1a(h, buf, (size_t)n);
	return h;
}

static void this_owner(struct owner *o)
{
	o->boot = this_boot();
	o->place = this_place();
	o->pid = (long)getpid();
	if (proc_start(o->pid, &o->start) < 0)
		o->start = 0;
}

/*
 * The temporary's name of base (a file name, no '/') for this process,
 * in buf: "<dir>/" + name when dir is not NULL. Returns the length, or
 * -ENAMETOOLONG when it does not fit len.
 */
int nvio__temp_name(char *buf, size_t len, const char *dir, const char *base)
{
	struct owner o;
	uint32_t r;
	int n;

	if (getrandom(&r, sizeof(r), GRND_NONBLOCK) != (ssize_t)sizeof(r)) {
		struct timespec ts;

		clock_gettime(CLOCK_REALTIME, &ts);
		r = (uint32_t)ts.tv_nsec ^ (uint32_t)(uintptr_t)buf;
	}
	this_owner(&o);
	n = snprintf(buf, len, "%s%s.%.*s.nvio-%08x%08x-%ld-%llu-%08x",
		     dir ? dir : "", dir ? "/" : "", TEMP_BASE_MAX, base,
		     o.boot, o.place, o.pid, o.start, r);
	return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : n;
}

/* Hex digits [s, s + n) as a number; 0 if any is not lower-case hex. */
static int hex32(const char *s, int n, uint32_t *out)
{
	*out = 0;
	for (int i = 0; i < n; i++) {
		int c = s[i];

		if (c >= '0' && c <= '9')
			*out = *out << 4 | (uint32_t)(c - '0');
		else if (c >= 'a' && c <= 'f')
			*out = *out << 4 | (uint32_t)(c - 'a' + 10);
		else
			return 0;
	}
	return 1;
}

/* A decimal number up to the next '-' or the end; advances *s. */
static int dec(const char **s, unsigned long long *out)
{
	const char *p = *s;

	*out = 0;
	if (*p < '0' || *p > '9')
		return 0;
	for (; *p >= '0' && *p <= '9'; p++) {
		if (*out > (ULLONG_MAX - 9) / 10)
			return 0;
		*out = *out * 10 + (unsigned long long)(*p - '0');
	}
	*s = p;
	return 1;
}

/*
 * Whether name is a temporary of ours, of base when base is not NULL
 * (its target's name), and whose. The owner part is strict: a name that
 * only looks like one (an older nvio's ".NAME.nvio-<16 hex>", a user's
 * file) is not a temporary.
 */
static int parse(const char *name, const char *base, struct owner *o)
{
	const char *s = strrchr(name, '.');	/* the one before "nvio-" */
	unsigned long long pid;
	uint32_t r;
	size_t blen;

	if (name[0] != '.' || !s || s == name || strncmp(s, ".nvio-", 6))
		return 0;
	blen = (size_t)(s - name) - 1;
	if (base && (strlen(base) > TEMP_BASE_MAX ? blen != TEMP_BASE_MAX :
		     blen != strlen(base)))
		return 0;
	if (base && strncmp(name + 1, base, blen))
		return 0;
	s += 6;
	if (!hex32(s, 8, &o->boot) || !hex32(s + 8, 8, &o->place) || s[16] != '-')
		return 0;
	s += 17;
	if (!dec(&s, &pid) || *s++ != '-' || !dec(&s, &o->start) || *s++ != '-' ||
	    pid == 0 || pid > INT_MAX || strlen(s) != 8 || !hex32(s, 8, &r))
		return 0;
	o->pid = (long)pid;
	return 1;
}

/*
 * Whether the owner o of a temporary is dead, seen from me. Sets *why to
 * the reason either way.
 */
static int owner_dead(const struct owner *o, const struct owner *me, const char **why)
{
	unsigned long long start;
	int r;

	if (!me->boot) {
		*why = "owner unknown: this boot cannot be told (no /proc)";
		return 0;
	}
	if (o->place != me->place) {
		*why = "owner on another host or in another container";
		return 0;
	}
	if (o->boot != me->boot) {
		*why = "owner from an earlier boot";
		return 1;
	}
	if (o->pid == me->pid) {
		*why = "owner is this process";
		return 0;
	}
	if (kill((pid_t)o->pid, 0) < 0 && errno == ESRCH) {
		*why = "owner has exited";
		return 1;
	}
	r = proc_start(o->pid, &start);
	if (r < 0) {
		*why = "owner's pid is in use (its start time cannot be read)";
		return 0;
	}
	if (start != o->start) {
		*why = "owner has exited (its pid is another process's now)";
		return 1;
	}
	*why = "owner is running";
	return 0;
}

/* What one temporary found in dfd gets; returns 1 removed (or would be),
 * 0 kept, -errno if removing failed. */
static int judge(int dfd, const char *name, const struct owner *o,
		 const struct owner *me, unsigned flags, const char **why)
{
	struct stat st, now;

	if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
		*why = "gone";
		return 0;
	}
	if (!S_ISREG(st.st_mode)) {
		*why = "not a regular file";
		return 0;
	}
	if (!(flags & NVIO_CLEAN_ANY_USER) && st.st_uid != geteuid()) {
		*why = "another user's";
		return 0;
	}
	if (!owner_dead(o, me, why))
		return 0;
	if (flags & NVIO_CLEAN_DRY_RUN)
		return 1;
	/* the very file judged: a name replaced meanwhile is not touched */
	if (fstatat(dfd, name, &now, AT_SYMLINK_NOFOLLOW) < 0 ||
	    now.st_ino != st.st_ino || now.st_dev != st.st_dev) {
		*why = "replaced while it was looked at";
		return 0;
	}
	if (unlinkat(dfd, name, 0) < 0) {
		if (errno != ENOENT)
			return -errno;
		*why = "gone";
		return 0;
	}
	return 1;
}

/*
 * One entry's outcome r (1 removed, 0 kept, -errno) counted into *count
 * or kept as the first failure, and reported with why (errno's text for
 * a failure).
 */
static void tally(const char *name, int r, const char *why, nvio_clean_fn *report,
		  void *arg, int *count, int *failed)
{
	if (r > 0)
		(*count)++;
	else if (r < 0 && !*failed)
		*failed = r;
	if (r < 0)
		why = strerror(-r);
	if (report)
		report(name, r, why, arg);
}

static int spares_sweep(int dfd, DIR *d, const char *base, unsigned flags,
			nvio_clean_fn *report, void *arg);

int nvio__temps_sweep(const char *dir, const char *base, unsigned flags,
		      nvio_clean_fn *report, void *arg)
{
	struct owner me, o;
	struct dirent *e;
	DIR *d;
	int dfd, count = 0, failed = 0;

	dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		return -errno;
	d = fdopendir(dfd);
	if (!d) {
		int err = -errno;

		close(dfd);
		return err;
	}
	this_owner(&me);
	while ((e = readdir(d)) != NULL) {
		const char *why = "";
		int r;

		if (!parse(e->d_name, base, &o))
			continue;
		r = judge(dfd, e->d_name, &o, &me, flags, &why);
		tally(e->d_name, r, why, report, arg, &count, &failed);
	}
	if (flags & (NVIO_CLEAN_SPARES | NVIO_CLEAN_ALL_SPARES)) {
		int r = spares_sweep(dfd, d, base, flags, report, arg);

		if (r < 0 && !failed)
			failed = r;
		count += r > 0 ? r : 0;
	}
	closedir(d);
	return failed ? failed : count;
}

int nvio_clean_temporaries(const char *dir, const char *target, unsigned flags,
			   nvio_clean_fn *report, void *arg)
{
	if (!dir || (flags & ~KNOWN_CLEAN_FLAGS) || (target && (!*target || strchr(target, '/'))))
		return -EINVAL;
	return nvio__temps_sweep(dir, target, flags, report, arg);
}

int nvio_temp_name(const char *path, char *buf, size_t len)
{
	char *copy, *slash;
	int r;

	if (!path || !buf || !*path || path[strlen(path) - 1] == '/')
		return -EINVAL;
	copy = strdup(path);	/* buf may be path */
	if (!copy)
		return -ENOMEM;
	slash = strrchr(copy, '/');
	if (slash)
		*slash = 0;
	r = slash ? nvio__temp_name(buf, len, copy, slash + 1) :
		    nvio__temp_name(buf, len, NULL, copy);
	free(copy);
	return r;
}

/* ---- spares ------------------------------------------------------------ */

int nvio__spare_name(char *buf, size_t len, const char *dir, const char *base)
{
	int n;

	if (strlen(base) > SPARE_BASE_MAX)
		return -ENAMETOOLONG;
	n = snprintf(buf, len, "%s%s.%s" SPARE_SUFFIX, dir ? dir : "",
		     dir ? "/" : "", base);
	return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : n;
}

/* The target's name of a spare's name, in out (NAME_MAX + 1); 0 if name
 * is not a spare's. */
static int spare_base(const char *name, char *out)
{
	size_t n = strlen(name), s = sizeof(SPARE_SUFFIX) - 1;

	if (name[0] != '.' || n <= s + 1 || strcmp(name + n - s, SPARE_SUFFIX))
		return 0;
	memcpy(out, name + 1, n - s - 1);
	out[n - s - 1] = 0;
	return 1;
}

/* -EPERM unless st is a regular file of one link and the euid's (a spare
 * that may be overwritten: another name of it, or someone else's, not). */
static int spare_usable(const struct stat *st, unsigned how)
{
	if (!S_ISREG(st->st_mode) || st->st_nlink != 1 ||
	    (!(how & SPARE_ANY_USER) && st->st_uid != geteuid()))
		return -EPERM;
	return 0;
}

/*
 * Opens the spare at path (relative to dfd) and locks it. how:
 * SPARE_CREATE a new one (O_EXCL; path relative to the working directory
 * then, as only writers make spares); SPARE_WRITE read-write (else read
 * only: enough to lock it); SPARE_ANY_USER whoever's. An existing one is
 * looked at through an O_PATH descriptor first, so that no device or FIFO
 * is ever opened, and, to be written, made 0600 like any temporary (it has
 * its target's old mode bits, which may lack write permission or let
 * others read what is written before commit). Returns the locked fd
 * or -errno: -ENOENT none, -ELOOP or -EPERM not usable (a link, a hard
 * link, not ours), -EWOULDBLOCK in use, -ESTALE its name led elsewhere
 * once it was locked.
 */
static int spare_lock(int dfd, const char *path, unsigned how)
{
	struct stat st, now;
	char proc[64];
	int fd, pfd, r;

	if (how & SPARE_CREATE) {
		fd = nvio__open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW, 0600);
		if (fd < 0)
			return fd;
	} else {
		pfd = openat(dfd, path, O_PATH | O_NOFOLLOW | O_CLOEXEC);
		if (pfd < 0)
			return -errno;
		r = fstat(pfd, &st) < 0 ? -errno : S_ISLNK(st.st_mode) ? -ELOOP :
		    spare_usable(&st, how);
		snprintf(proc, sizeof(proc), "/proc/self/fd/%d", pfd);
		if (!r && (how & SPARE_WRITE) && (st.st_mode & 07777) != 0600 &&
		    chmod(proc, 0600) < 0)
			r = -errno;
		fd = r ? r : nvio__open(proc, how & SPARE_WRITE ? O_RDWR : O_RDONLY, 0);
		close(pfd);
		if (fd < 0)
			return fd;
	}
	r = nvio__sys.flock(fd, LOCK_EX | LOCK_NB) < 0 ? -errno : 0;
	if (!r && nvio__sys.fstat(fd, &st) < 0)
		r = -errno;
	if (!r)
		r = spare_usable(&st, how);
	if (!r && (fstatat(dfd, path, &now, AT_SYMLINK_NOFOLLOW) < 0 ||
		   now.st_ino != st.st_ino || now.st_dev != st.st_dev))
		r = -ESTALE;
	if (r) {
		/* one this call made and could not lock (a file system
		 * without flock): not left beside the target, if its name
		 * still leads to it. Locked by another (EWOULDBLOCK): a
		 * writer that opened the new name and locked it first; the
		 * spare is that writer's now and stays */
		if ((how & SPARE_CREATE) && r != -ESTALE && r != -EWOULDBLOCK &&
		    nvio__sys.fstat(fd, &st) == 0 &&
		    fstatat(dfd, path, &now, AT_SYMLINK_NOFOLLOW) == 0 &&
		    now.st_ino == st.st_ino && now.st_dev == st.st_dev)
			(void)unlinkat(dfd, path, 0);
		nvio__sys.close(fd);
		return r;
	}
	return fd;
}

int nvio__spare_take(const char *path, int create)
{
	return spare_lock(AT_FDCWD, path, SPARE_WRITE | (create ? SPARE_CREATE : 0));
}

/*
 * NVIO_CLEAN_SPARES: removes dir's spares (of base only, when not NULL)
 * whose target is gone, or every one with NVIO_CLEAN_ALL_SPARES, each
 * locked as a writer locks it (one in use by a writer is kept). Returns
 * how many were removed (or would be), or the first error.
 */
static int spares_sweep(int dfd, DIR *d, const char *base, unsigned flags,
			nvio_clean_fn *report, void *arg)
{
	unsigned how = flags & NVIO_CLEAN_ANY_USER ? SPARE_ANY_USER : 0;
	char target[NAME_MAX + 1];
	struct dirent *e;
	struct stat st;
	int count = 0, failed = 0;

	rewinddir(d);
	while ((e = readdir(d)) != NULL) {
		const char *why;
		int fd, r = 0;

		if (!spare_base(e->d_name, target) || (base && strcmp(base, target)))
			continue;
		if (!(flags & NVIO_CLEAN_ALL_SPARES) &&
		    fstatat(dfd, target, &st, AT_SYMLINK_NOFOLLOW) == 0) {
			why = "spare of an existing target";
		} else if ((fd = spare_lock(dfd, e->d_name, how)) < 0) {
			why = fd == -EWOULDBLOCK ? "spare in use by a writer" :
			      fd == -EPERM || fd == -ELOOP ?
			      "not removable (a link, a hard link, or another user's)" :
			      fd == -EACCES ? "cannot be opened to lock it (permission)" :
			      fd == -ENOENT ? "gone" : "changed while it was looked at";
		} else {
			why = flags & NVIO_CLEAN_ALL_SPARES ? "spare" :
			      "spare of a target that is gone";
			r = 1;
			if (!(flags & NVIO_CLEAN_DRY_RUN) &&
			    unlinkat(dfd, e->d_name, 0) < 0 && errno != ENOENT)
				r = -errno;
			nvio__sys.close(fd);
		}
		tally(e->d_name, r, why, report, arg, &count, &failed);
	}
	return failed ? failed : count;
}
