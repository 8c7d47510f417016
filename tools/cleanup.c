/*
 * cleanup.c - removal of the tool's temporary files on every exit path,
 * Ctrl-C and SIGTERM included.
 */
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/wait.h>

/* ---- temporary files ---- */

/*
 * The handler reads these, so a path is complete before the count that
 * publishes it grows, and paths are never freed while the tool runs.
 */
#define MAX_TEMP 64
static char *temp_paths[MAX_TEMP];
static volatile sig_atomic_t temp_count;
static volatile sig_atomic_t got_signal;
static volatile sig_atomic_t child_pid;

/* Newest first, so a directory comes after the files made in it. */
static void unlink_all(void)
{
	int saved = errno;

	for (int i = temp_count - 1; i >= 0; i--)
		if (temp_paths[i] && unlink(temp_paths[i]) && errno == EISDIR)
			rmdir(temp_paths[i]);
	errno = saved;
}

static void reraise(int sig)
{
	signal(sig, SIG_DFL);
	raise(sig);
	_exit(128 + sig);
}

static void on_signal(int sig)
{
	if (child_pid > 0)
		kill((pid_t)child_pid, sig);
	if (got_signal) {
		/* Second signal: the first one is still waiting for I/O. */
		unlink_all();
		reraise(sig);
	}
	got_signal = sig;
}

/* A crash (a bug, or an abort in a library) still removes the files. */
static void on_fatal(int sig)
{
	unlink_all();
	if (child_pid > 0)
		kill((pid_t)child_pid, SIGTERM);
	reraise(sig);
}

void cleanup_install(void)
{
	static const int fatal[] = { SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT };
	struct sigaction sa;

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigemptyset(&sa.sa_mask);
	/* No SA_RESTART: waitpid() for fio returns EINTR so we notice. */
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
	sa.sa_handler = on_fatal;
	sa.sa_flags = SA_RESETHAND;
	for (size_t i = 0; i < sizeof(fatal) / sizeof(fatal[0]); i++)
		sigaction(fatal[i], &sa, NULL);
}

/* 16 hex digits nobody can guess: the suffix of every name we create. */
static void random_suffix(char *buf, size_t len)
{
	uint64_t r = 0;

	if (getrandom(&r, sizeof(r), GRND_NONBLOCK) != sizeof(r))
		r = (uint64_t)getpid() << 32 ^ (uint64_t)(now_s() * 1e9);
	snprintf(buf, len, "%016llx", (unsigned long long)r);
}

/* <dir>/.nvio-<tag>-<random>.tmp, created O_EXCL|O_NOFOLLOW and
 * registered for removal; the descriptor and *name, or -errno. */
static int temp_named(const char *dir, const char *tag, char **name)
{
	char path[4200], rnd[24];
	int fd = -1, tries;

	*name = NULL;
	for (tries = 0; tries < 16; tries++) {
		random_suffix(rnd, sizeof(rnd));
		snprintf(path, sizeof(path), "%s/.nvio-%s-%s.tmp", dir, tag, rnd);
		/* signals wait until the name is registered for removal */
		signals_block(1);
		fd = open(path, O_CREAT | O_EXCL | O_NOFOLLOW | O_RDWR |
			  O_CLOEXEC, 0600);
		if (fd >= 0 && cleanup_add(path)) {
			unlink(path);
			close(fd);
			fd = -ENOMEM;
		}
		signals_block(0);
		if (fd >= 0 || errno != EEXIST)
			break;
	}
	if (fd == -1)
		return -errno;
	if (fd < 0)
		return fd;
	*name = strdup(path);
	return fd;
}

int temp_file(const char *dir, const char *tag, char **name)
{
	/* no name at all: nothing to plant, nothing left even after SIGKILL */
	int fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);

	*name = NULL;
	return fd >= 0 ? fd : temp_named(dir, tag, name);
}

int out_open(struct out_file *o, const char *path)
{
	char dir[4096], *slash;
	struct stat st;
	mode_t mask;
	int fd;

	memset(o, 0, sizeof(*o));
	o->path = path;
	/* a device or pipe (/dev/null, /dev/stdout) is written in place */
	if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
		o->f = fopen(path, "w");
		return o->f ? 0 : -errno;
	}
	/* a link to a file: replace the file it names, not the link */
	if (!realpath(path, dir))
		snprintf(dir, sizeof(dir), "%s", path);
	slash = strrchr(dir, '/');
	if (!slash)
		snprintf(dir, sizeof(dir), ".");
	else if (slash == dir)
		dir[1] = '\0';
	else
		*slash = '\0';
	if (!realpath(path, o->final))
		snprintf(o->final, sizeof(o->final), "%s", path);
	fd = temp_named(dir, "out", &o->tmp);
	if (fd >= 0 && !o->tmp) {
		close(fd);
		return -ENOMEM;
	}
	if (fd < 0)
		return fd;
	mask = umask(0);
	umask(mask);
	fchmod(fd, 0666 & ~mask);	/* what fopen(path, "w") would give */
	o->f = fdopen(fd, "w");
	if (!o->f) {
		int e = -errno;

		close(fd);
		out_abort(o);
		return e;
	}
	return 0;
}

int out_commit(struct out_file *o)
{
	int r = 0;

	if (fflush(o->f) || ferror(o->f))
		r = -(errno ? errno : EIO);
	if (fclose(o->f) && !r)
		r = -errno;
	o->f = NULL;
	if (!r && o->tmp && rename(o->tmp, o->final))
		r = -errno;
	if (r) {
		out_abort(o);
		return r;
	}
	if (o->tmp)
		cleanup_forget(o->tmp);	/* the name is the user's file now */
	free(o->tmp);
	o->tmp = NULL;
	return r;
}

void out_abort(struct out_file *o)
{
	if (o->f)
		fclose(o->f);
	o->f = NULL;
	/* only the temporary is ours to remove: the user's file stays */
	if (o->tmp) {
		unlink(o->tmp);
		cleanup_forget(o->tmp);
	}
	free(o->tmp);
	o->tmp = NULL;
}

int temp_dir(const char *parent, const char *tag, char *out, size_t len)
{
	int r = 0;

	snprintf(out, len, "%s/nvio-%s-XXXXXX", parent, tag);
	signals_block(1);
	if (!mkdtemp(out))	/* 0700, a name nobody else can have made */
		r = -errno;
	else if (cleanup_add(out))
		r = -ENOMEM;
	signals_block(0);
	return r;
}

int cleanup_add(const char *path)
{
	char *p;

	if (temp_count >= MAX_TEMP)
		return -ENOSPC;
	p = strdup(path);
	if (!p)
		return -ENOMEM;
	temp_paths[temp_count] = p;
	temp_count = temp_count + 1;
	return 0;
}

void cleanup_forget(const char *path)
{
	signals_block(1);
	for (int i = 0; i < temp_count; i++)
		if (temp_paths[i] && !strcmp(temp_paths[i], path)) {
			free(temp_paths[i]);
			temp_paths[i] = NULL;
		}
	signals_block(0);
}

void cleanup_remove_all(void)
{
	signals_block(1);
	unlink_all();
	for (int i = 0; i < temp_count; i++) {
		free(temp_paths[i]);
		temp_paths[i] = NULL;
	}
	temp_count = 0;
	signals_block(0);
}

void cleanup_child(int pid)
{
	child_pid = pid;
}

int cleanup_interrupted(void)
{
	return got_signal != 0;
}

/*
 * fio got the signal from the handler; it stops its own job processes
 * when it exits, so give it a few seconds before SIGKILL (which would
 * leave those behind).
 */
static void reap_child(void)
{
	for (int i = 0; i < 500; i++) {
		if (waitpid((pid_t)child_pid, NULL, WNOHANG) != 0)
			return;
		usleep(10000);
	}
	kill((pid_t)child_pid, SIGKILL);
	waitpid((pid_t)child_pid, NULL, 0);
}

void cleanup_check(void)
{
	int sig = got_signal;

	if (!sig)
		return;
	progress_done();
	if (child_pid > 0)
		reap_child();
	unlink_all();
	fprintf(stderr, "%s: interrupted, temporary files removed\n", tool_prog);
	reraise(sig);
}

void signals_block(int block)
{
	sigset_t set;

	sigemptyset(&set);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGHUP);
	pthread_sigmask(block ? SIG_BLOCK : SIG_UNBLOCK, &set, NULL);
}
