/*
 * test_stale_temps.c - temporaries of killed writers, and the sweep that
 * removes them (nvio_clean_temporaries, and every ATOMIC open).
 *
 * Temporaries are named by nvio_temp_name (this process) or made from
 * its owner part with another pid, start time, boot or place. Checks:
 * a live owner's temporary is kept (this process, a running child); a
 * dead owner's is removed (a child that exited; a pid alive but started
 * at another time; an earlier boot of this place); one of another place
 * is kept; a symbolic link, a directory, a FIFO, another user's file,
 * an older nvio's name and names that only look like ours are never
 * touched (nor what a link points to); a dry run removes nothing and
 * reports the same; an ATOMIC open sweeps its target's temporaries and
 * no other's. Then a writer killed while its named temporary (no
 * O_TMPFILE) holds data: the next ATOMIC open of the target removes it.
 * On every engine, direct on and off, for the last.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "t.h"
#include "sys.h"

static char dir[T_PATH_MAX];
static char boot[9], place[9];

struct seen {
	int n, removed, kept, failed;
	char last_why[128];
};

static void count(const char *name, int result, const char *why, void *arg)
{
	struct seen *s = arg;

	if (getenv("T_VERBOSE"))
		printf("%s %d %s\n", name, result, why);
	s->n++;
	s->removed += result > 0;
	s->kept += result == 0;
	s->failed += result < 0;
	snprintf(s->last_why, sizeof(s->last_why), "%s: %s", name, why);
}

/* dir/name exists (as anything, links not followed). */
static int exists(const char *name)
{
	char p[T_PATH_MAX];
	struct stat st;

	snprintf(p, sizeof(p), "%s/%s", dir, name);
	return lstat(p, &st) == 0;
}

static void touch(const char *name)
{
	char p[T_PATH_MAX];

	snprintf(p, sizeof(p), "%s/%s", dir, name);
	T_OK(t_write_file(p, "x", 1));
}

/* A temporary name of base with this owner part and pid/start. */
static void name_of(char *out, size_t len, const char *base, const char *b,
		    const char *pl, long pid, unsigned long long start)
{
	snprintf(out, len, ".%s.nvio-%s%s-%ld-%llu-0123abcd", base, b, pl, pid, start);
}

static unsigned long long start_of(long pid)
{
	char p[64], buf[1024], *s;
	ssize_t n;
	int fd;

	snprintf(p, sizeof(p), "/proc/%ld/stat", pid);
	fd = open(p, O_RDONLY);
	n = fd < 0 ? -1 : read(fd, buf, sizeof(buf) - 1);
	if (fd >= 0)
		close(fd);
	if (n <= 0)
		return 0;
	buf[n] = 0;
	s = strrchr(buf, ')');
	for (int f = 2; s && f < 22; f++)
		s = strchr(s + 1, ' ');
	return s ? strtoull(s + 1, NULL, 10) : 0;
}

static void owner_part(void)
{
	char buf[NAME_MAX + 1];

	T_TRUE(nvio_temp_name("x", buf, sizeof(buf)) > 0);
	/* ".x.nvio-" then 8 + 8 hex */
	T_TRUE(strncmp(buf, ".x.nvio-", 8) == 0);
	memcpy(boot, buf + 8, 8);
	memcpy(place, buf + 16, 8);
}

static void names(void)
{
	char buf[NAME_MAX + 1], small[16], longname[256], p[T_PATH_MAX];
	long pid = (long)getpid();
	char want[64];

	t_ctx("nvio_temp_name");
	snprintf(p, sizeof(p), "%s/target", dir);
	T_TRUE(nvio_temp_name(p, buf, sizeof(buf)) > 0);
	snprintf(want, sizeof(want), "-%ld-%llu-", pid, start_of(pid));
	T_TRUE(strstr(buf, want) != NULL);
	T_TRUE(strncmp(buf, dir, strlen(dir)) == 0 &&
	       strncmp(buf + strlen(dir), "/.target.nvio-", 14) == 0);
	T_ERR(nvio_temp_name(p, small, sizeof(small)), -ENAMETOOLONG);
	T_ERR(nvio_temp_name(NULL, buf, sizeof(buf)), -EINVAL);
	T_ERR(nvio_temp_name("", buf, sizeof(buf)), -EINVAL);
	T_ERR(nvio_temp_name("d/", buf, sizeof(buf)), -EINVAL);
	/* a long target's temporary still fits a directory entry */
	memset(longname, 'L', 250);
	longname[250] = 0;
	T_TRUE(nvio_temp_name(longname, buf, sizeof(buf)) > 0);
	T_TRUE(strlen(buf) <= NAME_MAX);
	T_ERR(nvio_clean_temporaries(dir, NULL, 1u << 7, NULL, NULL), -EINVAL);
	T_ERR(nvio_clean_temporaries(dir, "a/b", 0, NULL, NULL), -EINVAL);
	T_ERR(nvio_clean_temporaries(NULL, NULL, 0, NULL, NULL), -EINVAL);
	snprintf(p, sizeof(p), "%s/none", dir);
	T_ERR(nvio_clean_temporaries(p, NULL, 0, NULL, NULL), -ENOENT);
}

/* A child that made its temporary and waits; its pid. */
static pid_t live_child(char *name, size_t len, int *wfd)
{
	int to_child[2], from_child[2];
	char c;
	pid_t pid;

	if (pipe(to_child) || pipe(from_child))
		return -1;
	pid = fork();
	if (pid == 0) {
		char p[T_PATH_MAX], buf[NAME_MAX + 1];
		int fd;

		close(to_child[1]);
		close(from_child[0]);
		snprintf(p, sizeof(p), "%s/target", dir);
		nvio_temp_name(p, buf, sizeof(buf));
		fd = open(buf, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0600);
		if (fd < 0 || write(from_child[1], strrchr(buf, '/') + 1,
				    strlen(strrchr(buf, '/') + 1) + 1) < 0)
			_exit(1);
		(void)!read(to_child[0], &c, 1);	/* until told or orphaned */
		_exit(0);
	}
	close(to_child[0]);
	close(from_child[1]);
	*wfd = to_child[1];
	memset(name, 0, len);
	for (size_t i = 0; i + 1 < len && read(from_child[0], &c, 1) == 1 && c; i++)
		name[i] = c;
	close(from_child[0]);
	return pid;
}

static void owners(void)
{
	char self[NAME_MAX + 1], child[NAME_MAX + 1], reused[NAME_MAX + 1],
	     oldboot[NAME_MAX + 1], elsewhere[NAME_MAX + 1], exited[NAME_MAX + 1],
	     other[NAME_MAX + 1], p[T_PATH_MAX];
	char otherboot[9], otherplace[9];
	struct seen s;
	pid_t pid, gone;
	int wfd = -1, status;

	t_ctx("owners");
	snprintf(p, sizeof(p), "%s/target", dir);
	T_TRUE(nvio_temp_name(p, p, sizeof(p)) > 0);
	snprintf(self, sizeof(self), "%s", strrchr(p, '/') + 1);
	touch(self);
	pid = live_child(child, sizeof(child), &wfd);
	if (!T_TRUE(pid > 0 && child[0]))
		return;
	/* a pid that is gone: a child that exited and was waited for */
	gone = fork();
	if (gone == 0)
		_exit(0);
	waitpid(gone, &status, 0);
	name_of(exited, sizeof(exited), "target", boot, place, (long)gone, start_of(pid));
	/* a pid alive (the parent of this test) that started at another time */
	name_of(reused, sizeof(reused), "target", boot, place, (long)getppid(),
		start_of((long)getppid()) + 1);
	snprintf(otherboot, sizeof(otherboot), "%08x", (unsigned)strtoul(boot, NULL, 16) ^ 1u);
	snprintf(otherplace, sizeof(otherplace), "%08x", (unsigned)strtoul(place, NULL, 16) ^ 1u);
	name_of(oldboot, sizeof(oldboot), "target", otherboot, place, 1, 5);
	name_of(elsewhere, sizeof(elsewhere), "target", otherboot, otherplace, 1, 5);
	name_of(other, sizeof(other), "other", otherboot, place, 1, 5);
	touch(exited);
	touch(reused);
	touch(oldboot);
	touch(elsewhere);
	touch(other);

	/* dry run: reports all six of target's, removes nothing */
	memset(&s, 0, sizeof(s));
	T_EQ_INT(nvio_clean_temporaries(dir, "target", NVIO_CLEAN_DRY_RUN, count, &s), 3);
	T_EQ_INT(s.n, 6);
	T_EQ_INT(s.removed, 3);
	T_EQ_INT(s.kept, 3);
	T_TRUE(exists(exited) && exists(reused) && exists(oldboot));

	memset(&s, 0, sizeof(s));
	T_EQ_INT(nvio_clean_temporaries(dir, "target", 0, count, &s), 3);
	T_EQ_INT(s.failed, 0);
	T_TRUE(exists(self));		/* this process */
	T_TRUE(exists(child));		/* a running process */
	T_TRUE(!exists(exited));
	T_TRUE(!exists(reused));	/* the pid is another process now */
	T_TRUE(!exists(oldboot));	/* this place, an earlier boot */
	T_TRUE(exists(elsewhere));	/* another host or container */
	T_TRUE(exists(other));		/* another target's */

	/* the child dies: its temporary goes */
	close(wfd);
	waitpid(pid, &status, 0);
	T_EQ_INT(nvio_clean_temporaries(dir, "target", 0, NULL, NULL), 1);
	T_TRUE(!exists(child));
	/* every target's: other's goes too */
	T_EQ_INT(nvio_clean_temporaries(dir, NULL, 0, NULL, NULL), 1);
	T_TRUE(!exists(other) && exists(self) && exists(elsewhere));
	snprintf(p, sizeof(p), "%s/%s", dir, self);
	unlink(p);
	snprintf(p, sizeof(p), "%s/%s", dir, elsewhere);
	unlink(p);
}

static void not_ours(void)
{
	char victim[T_PATH_MAX], p[T_PATH_MAX], n[NAME_MAX + 1], buf[4];
	char otherboot[9];
	const char *looks[] = {
		".target.nvio-0000000000000000",	/* an older nvio's */
		".target.nvio-0000000000000000-1-5-0123abcd.tmp",
		".target.nvio-0000000000000000-1-5-0123ABCD",
		".target.nvio-00000000000000-1-5-0123abcd",
		".target.nvio-0000000000000000--5-0123abcd",
		".target.nvio-0000000000000000-0-5-0123abcd",
		"target.nvio-0000000000000000-1-5-0123abcd",
		".target.nvio-0000000000000000-99999999999-5-0123abcd",
		"target",
	};
	struct seen s;
	size_t got;

	t_ctx("not ours");
	snprintf(otherboot, sizeof(otherboot), "%08x", (unsigned)strtoul(boot, NULL, 16) ^ 1u);
	t_path(victim, "victim");
	T_OK(t_write_file(victim, "keep", 4));
	for (size_t i = 0; i < sizeof(looks) / sizeof(looks[0]); i++)
		touch(looks[i]);
	/* dead owners' names, but not regular files */
	name_of(n, sizeof(n), "target", otherboot, place, 1, 1);
	snprintf(p, sizeof(p), "%s/%s", dir, n);
	T_OK(symlink(victim, p) < 0 ? -errno : 0);
	name_of(n, sizeof(n), "target", otherboot, place, 1, 2);
	snprintf(p, sizeof(p), "%s/%s", dir, n);
	T_OK(mkdir(p, 0700) < 0 ? -errno : 0);
	name_of(n, sizeof(n), "target", otherboot, place, 1, 3);
	snprintf(p, sizeof(p), "%s/%s", dir, n);
	T_OK(mkfifo(p, 0600) < 0 ? -errno : 0);
	memset(&s, 0, sizeof(s));
	T_EQ_INT(nvio_clean_temporaries(dir, NULL, 0, count, &s), 0);
	T_EQ_INT(s.n, 3);	/* the link, the directory, the FIFO: kept */
	T_EQ_INT(s.kept, 3);
	T_EQ_INT(t_dir_count(dir), (int)(sizeof(looks) / sizeof(looks[0])) + 3);
	T_OK(t_read_file(victim, buf, sizeof(buf), &got));
	T_TRUE(got == 4 && memcmp(buf, "keep", 4) == 0);

	/* another user's file (root can make one) */
	if (geteuid() == 0) {
		name_of(n, sizeof(n), "target", otherboot, place, 1, 4);
		touch(n);
		snprintf(p, sizeof(p), "%s/%s", dir, n);
		T_OK(chown(p, 12345, 12345) < 0 ? -errno : 0);
		T_EQ_INT(nvio_clean_temporaries(dir, "target", 0, NULL, NULL), 0);
		T_TRUE(exists(n));
		T_EQ_INT(nvio_clean_temporaries(dir, "target", NVIO_CLEAN_ANY_USER, NULL, NULL), 1);
		T_TRUE(!exists(n));
	} else {
		t_note("not root: another user's temporary is not made");
	}
	T_EQ_INT(t_dir_count(dir), (int)(sizeof(looks) / sizeof(looks[0])) + 3);
}

static int no_tmpfile(const char *path, int flags, mode_t mode)
{
	if ((flags & O_TMPFILE) == O_TMPFILE) {
		errno = EOPNOTSUPP;
		return -1;
	}
	return open(path, flags, mode);
}

/* An ATOMIC open sweeps its target's dead temporaries, no other's. */
static void atomic_open_sweeps(void)
{
	char sub[T_PATH_MAX], target[T_PATH_MAX], n1[NAME_MAX + 1], n2[NAME_MAX + 1],
	     p[T_PATH_MAX], otherboot[9];
	nvio_handle_t *h;
	nvio_file_t *f;
	int err;

	t_ctx("atomic open");
	t_subdir(sub, "sweep");
	snprintf(otherboot, sizeof(otherboot), "%08x", (unsigned)strtoul(boot, NULL, 16) ^ 1u);
	name_of(n1, sizeof(n1), "t.bin", otherboot, place, 1, 1);
	name_of(n2, sizeof(n2), "u.bin", otherboot, place, 1, 1);
	snprintf(p, sizeof(p), "%s/%s", sub, n1);
	T_OK(t_write_file(p, "x", 1));
	snprintf(p, sizeof(p), "%s/%s", sub, n2);
	T_OK(t_write_file(p, "x", 1));
	snprintf(target, sizeof(target), "%s/t.bin", sub);
	if (t_handle(&h, NVIO_ENGINE_PSYNC, NVIO_DIRECT_OFF, 1, 0))
		return;
	f = nvio_file_open(h, target, NVIO_FILE_ATOMIC, &err);
	T_TRUE(f != NULL);
	nvio_file_close(f);
	snprintf(p, sizeof(p), "%s/%s", sub, n1);
	T_TRUE(access(p, F_OK) < 0);
	snprintf(p, sizeof(p), "%s/%s", sub, n2);
	T_TRUE(access(p, F_OK) == 0);
	unlink(p);
	T_EQ_INT(t_dir_count(sub), 0);
	nvio_handle_destroy(h);
	rmdir(sub);
}

/*
 * A writer killed with data in its named temporary (no O_TMPFILE): the
 * temporary stays, carrying the writer as owner; the next ATOMIC open
 * of the target removes it, and the target keeps its old bytes.
 */
static void killed_writer(int engine, int direct)
{
	enum { N = (1 << 20) + 77 };
	char sub[T_PATH_MAX], target[T_PATH_MAX];
	static unsigned char old[N], nu[N], back[N];
	int fds[2], status, err;
	nvio_handle_t *h;
	nvio_file_t *f;
	pid_t pid;
	char c;

	t_subdir(sub, "killed");
	snprintf(target, sizeof(target), "%s/ck.bin", sub);
	t_fill_random(old, N, 3);
	t_fill_random(nu, N, 4);
	T_OK(t_write_file(target, old, N));
	if (pipe(fds))
		return;
	pid = fork();
	if (pid == 0) {
		nvio__sys.open = no_tmpfile;
		if (t_handle(&h, engine, direct, 2, 0))
			_exit(1);
		f = nvio_file_open(h, target, NVIO_FILE_ATOMIC, &err);
		if (!f || nvio_file_pwrite(f, nu, N, 0, 0) != 0)
			_exit(1);
		(void)!write(fds[1], "w", 1);
		pause();
		_exit(0);
	}
	close(fds[1]);
	T_EQ_INT(read(fds[0], &c, 1), 1);
	close(fds[0]);
	kill(pid, SIGKILL);
	waitpid(pid, &status, 0);
	T_TRUE(WIFSIGNALED(status));
	T_EQ_INT(t_dir_count(sub), 2);		/* the target and the temporary */
	if (t_handle(&h, engine, direct, 2, 0) == 0) {
		nvio__sys.open = no_tmpfile;
		f = nvio_file_open(h, target, NVIO_FILE_ATOMIC, &err);
		nvio__sys_reset();
		T_TRUE(f != NULL);
		/* the killed writer's is gone; this open's own is there */
		T_EQ_INT(t_dir_count(sub), 2);
		nvio_file_close(f);
		T_EQ_INT(t_dir_count(sub), 1);
		nvio_handle_destroy(h);
	}
	T_OK(t_pread_file(target, back, N, 0));
	T_MEM_EQ(back, old, N);
	unlink(target);
	rmdir(sub);
}

int main(void)
{
	t_init("stale_temps");
	if (access("/proc/sys/kernel/random/boot_id", R_OK) < 0)
		t_skip("no /proc/sys/kernel/random/boot_id: owners cannot be told");
	t_subdir(dir, "d");
	owner_part();
	names();
	owners();
	not_ours();
	atomic_open_sweeps();
	T_FOR_EACH_COMBO(e, d) {
		killed_writer(e, d);
	}
	return t_done();
}
