/*
 * cleanup.c - progress on stderr, and removal of the tool's temporary
 * files on every exit path, Ctrl-C and SIGTERM included.
 */
#include "util.h"

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/wait.h>

/* ---- progress ---- */

int progress_enabled;
static int progress_shown;

void progress_init(int quiet)
{
	progress_enabled = !quiet && isatty(STDERR_FILENO);
}

void progress(const char *fmt, ...)
{
	va_list ap;

	if (!progress_enabled)
		return;
	fputs("\r\033[K", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fflush(stderr);
	progress_shown = 1;
}

void progress_done(void)
{
	if (!progress_shown)
		return;
	fputs("\r\033[K", stderr);
	fflush(stderr);
	progress_shown = 0;
}

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

static void unlink_all(void)
{
	for (int i = 0; i < temp_count; i++)
		if (temp_paths[i])
			unlink(temp_paths[i]);
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

void cleanup_install(void)
{
	struct sigaction sa;

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigemptyset(&sa.sa_mask);
	/* No SA_RESTART: waitpid() for fio returns EINTR so we notice. */
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
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
