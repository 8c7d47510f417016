/*
 * fio.c - runs fio over the same files as `nvio bench --compare fio`, with
 * the same size, direct mode and end-of-write fsync, and reads back its
 * bandwidth from --output-format=json. CPU time is what fio reports for
 * its jobs (usr_cpu + sys_cpu percent of job_runtime, summed over the
 * jobs by --group_reporting): like nvio's, it covers the transfer only,
 * not fio's start-up and buffer allocation.
 *
 * The time is not fio's own figure. group_reporting divides the bytes of
 * all jobs by the longest job's runtime, as if the jobs ran side by side,
 * but each job starts once its own set-up (iodepth x bs of buffers) is
 * done: a 2-job 8 MiB x 128 write ran its jobs at 0-131 ms and 407-623 ms,
 * 623 ms that fio's bandwidth counts as 216. So fio writes a latency log
 * per job, and the time is from the first I/O's submission to the last
 * one's completion over all jobs, or the longest runtime (which includes
 * end_fsync) where that is longer.
 */
#include "tool.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/wait.h>

#define FIO_MAX_ARGS (16 + 4 * MAX_DIRS)

/* Runs argv, collecting stdout and stderr into *out; the descriptors in
 * keep[nkeep] stay open in it. Returns the wait status, or -errno if it could
 * not start. */
static int run_capture(char **argv, const int *keep, int nkeep, char **out)
{
	size_t len = 0, cap = 1 << 16;
	int p[2], status = 0;
	pid_t pid;
	ssize_t n;

	*out = malloc(cap);
	if (!*out || pipe(p))
		return -ENOMEM;
	pid = fork();
	if (pid < 0)
		return -errno;
	if (pid == 0) {
		dup2(p[1], STDOUT_FILENO);
		dup2(p[1], STDERR_FILENO);
		close(p[0]);
		close(p[1]);
		for (int i = 0; i < nkeep; i++)
			fcntl(keep[i], F_SETFD, 0);
		execvp(argv[0], argv);
		_exit(127);
	}
	cleanup_child(pid);
	close(p[1]);
	while ((n = read(p[0], *out + len, cap - len - 1)) != 0) {
		if (n < 0 && errno == EINTR) {
			cleanup_check();
			continue;
		}
		if (n < 0)
			break;
		len += (size_t)n;
		if (cap - len < 4096) {
			char *m = realloc(*out, cap * 2);

			if (!m)
				break;
			*out = m;
			cap *= 2;
		}
	}
	(*out)[len] = '\0';
	close(p[0]);
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		cleanup_check();
	cleanup_child(0);
	return status;
}

/* The last non-empty line of text (fio's complaint), into buf. */
static const char *last_line(const char *text, char *buf, size_t len)
{
	const char *end = text + strlen(text), *start;

	while (end > text && (end[-1] == '\n' || end[-1] == ' '))
		end--;
	start = end;
	while (start > text && start[-1] != '\n')
		start--;
	snprintf(buf, len, "%.*s", (int)(end - start), start);
	return buf;
}

int fio_detect(struct fio_ctx *c, const nvio_probe_t *probe, int direct)
{
	char *argv[] = { "fio", "--version", NULL }, *out = NULL;
	const char *tmp;
	int st = run_capture(argv, NULL, 0, &out);
	char dir[512];

	memset(c, 0, sizeof(*c));
	if (st != 0 || !out || strncmp(out, "fio-", 4)) {
		msg("--compare fio: fio does not run here (install the fio "
		    "package)");
		free(out);
		return -ENOENT;
	}
	snprintf(c->version, sizeof(c->version), "%.*s",
		 (int)strcspn(out, "\n"), out);
	free(out);
	/* the engine nvio can use is the one fio gets first */
	strcpy(c->engine, probe->engine_ok[NVIO_ENGINE_AIO] &&
	       !probe->engine_ok[NVIO_ENGINE_URING] ? "libaio" : "io_uring");
	c->direct = direct;
	tmp = getenv("TMPDIR");
	if (!tmp || !*tmp || strlen(tmp) > 400)
		tmp = "/tmp";
	/* fio opens its logs by name, following links: only in a directory
	 * of our own, which nobody else can plant anything in */
	st = temp_dir(tmp, "fio", dir, sizeof(dir));
	if (st) {
		msg("--compare fio: cannot create a directory for fio's logs "
		    "in %s: %s", tmp, strerror(-st));
		return st;
	}
	snprintf(c->log_prefix, sizeof(c->log_prefix), "%s/job", dir);
	return 0;
}

static const char *const log_kinds[] = { "lat", "clat", "slat" };

static void log_name(const struct fio_ctx *c, const char *kind, int job,
		     char *buf, size_t len)
{
	snprintf(buf, len, "%s_%s.%d.log", c->log_prefix, kind, job);
}

/* Makes sure Ctrl-C removes the logs of jobs 1..njobs too. */
static void logs_register(struct fio_ctx *c, int njobs)
{
	char path[600];

	for (; c->logs_registered < njobs; c->logs_registered++)
		for (int k = 0; k < 3; k++) {
			log_name(c, log_kinds[k], c->logs_registered + 1, path,
				 sizeof(path));
			cleanup_add(path);
		}
}

static void logs_remove(const struct fio_ctx *c, int njobs)
{
	char path[600];

	for (int j = 1; j <= njobs; j++)
		for (int k = 0; k < 3; k++) {
			log_name(c, log_kinds[k], j, path, sizeof(path));
			unlink(path);
		}
}

/*
 * Seconds from the first submission to the last completion over the jobs'
 * latency logs (lines "completion ms since the epoch, latency ns, ...").
 */
static int logs_span(const struct fio_ctx *c, int njobs, double *span)
{
	double first = 0, last = 0;
	int seen = 0;
	char path[600], line[256];

	for (int j = 1; j <= njobs; j++) {
		FILE *f;

		log_name(c, "lat", j, path, sizeof(path));
		f = fopen(path, "r");
		if (!f)
			return -errno;
		while (fgets(line, sizeof(line), f)) {
			unsigned long long ms, ns;
			double done, start;

			if (sscanf(line, "%llu, %llu", &ms, &ns) != 2)
				continue;
			done = (double)ms / 1e3;
			start = done - (double)ns / 1e9;
			if (!seen || start < first)
				first = start;
			if (!seen || done > last)
				last = done;
			seen = 1;
		}
		fclose(f);
	}
	if (!seen)
		return -ENODATA;
	*span = last - first;
	return 0;
}

const char *fio_job_text(const struct fio_job *job, char *buf, size_t len)
{
	unsigned long long bs = job->bs;

	if (bs % (1u << 20) == 0)
		snprintf(buf, len, "bs=%lluM", bs >> 20);
	else
		snprintf(buf, len, "bs=%lluK", bs >> 10);
	snprintf(buf + strlen(buf), len - strlen(buf), " iodepth=%d numjobs=%d",
		 job->iodepth, job->numjobs);
	return buf;
}

/* Argument strings live in one arena so that argv can point into it. */
struct args {
	char *argv[FIO_MAX_ARGS];
	int argc;
	char arena[8192 + MAX_DIRS * 4200];
	size_t used;
};

static void arg(struct args *a, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static void arg(struct args *a, const char *fmt, ...)
{
	va_list ap;
	char *p = a->arena + a->used;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(p, sizeof(a->arena) - a->used, fmt, ap);
	va_end(ap);
	if (n < 0 || (size_t)n >= sizeof(a->arena) - a->used ||
	    a->argc >= FIO_MAX_ARGS - 1)
		return;	/* cannot happen with MAX_DIRS paths of PATH_MAX */
	a->argv[a->argc++] = p;
	a->argv[a->argc] = NULL;
	a->used += (size_t)n + 1;
}

/* The fio command line; 1 if some directory's range is too small. */
static int fio_args(struct args *a, const struct fio_ctx *c,
		    const struct xfer *x, int is_write, const struct fio_job *j)
{
	uint64_t depth = (uint64_t)j->iodepth;

	/* fio allocates iodepth * bs per job: no deeper than there are blocks */
	for (int i = 0; i < x->ndirs; i++) {
		uint64_t blocks = x->len[i] / (uint64_t)j->numjobs / j->bs;

		if (blocks < depth)
			depth = blocks ? blocks : 1;
	}
	memset(a, 0, sizeof(*a) - sizeof(a->arena));
	a->used = 0;
	arg(a, "fio");
	arg(a, "--output-format=json");
	arg(a, "--group_reporting");
	arg(a, "--ioengine=%s", c->engine);
	arg(a, "--direct=%d", c->direct);
	arg(a, "--rw=%s", is_write ? "write" : "read");
	arg(a, "--bs=%llu", (unsigned long long)j->bs);
	arg(a, "--iodepth=%llu", (unsigned long long)depth);
	arg(a, "--numjobs=%d", j->numjobs);
	arg(a, "--write_lat_log=%s", c->log_prefix);
	arg(a, "--log_unix_epoch=1");
	if (is_write)
		arg(a, "--end_fsync=1");
	for (int i = 0; i < x->ndirs; i++) {
		/* each of numjobs covers its own slice of the file */
		uint64_t per = x->len[i] / (uint64_t)j->numjobs / j->bs * j->bs;

		if (!per)
			return 1;
		arg(a, "--name=nvio%d", i);
		/* our descriptor, inherited: the file we created, whatever
		 * its name (if any) points at by now */
		arg(a, "--filename=/proc/self/fd/%d", x->fd[i]);
		arg(a, "--size=%llu", (unsigned long long)per);
		arg(a, "--offset_increment=%llu", (unsigned long long)per);
	}
	return 0;
}

/* Finds "key" : NUMBER after p; -1 if missing. */
static double json_field(const char *p, const char *key)
{
	char pat[64];
	const char *k;

	snprintf(pat, sizeof(pat), "\"%s\" : ", key);
	k = p ? strstr(p, pat) : NULL;
	return k ? strtod(k + strlen(pat), NULL) : -1;
}

static int fio_parse(const char *out, int is_write, double *bytes,
		     double *runtime, double *cpu)
{
	const char *jobs = strstr(out, "\"jobs\"");
	const char *dir = jobs ? strstr(jobs, is_write ? "\"write\" : {"
						       : "\"read\" : {") : NULL;

	if (!dir || json_field(jobs, "error") != 0)
		return -EIO;
	*bytes = json_field(dir, "io_bytes");
	*runtime = json_field(dir, "runtime") / 1000;	/* ms: the longest */
	*cpu = (json_field(jobs, "usr_cpu") + json_field(jobs, "sys_cpu")) /
	       100 * json_field(jobs, "job_runtime") / 1000;
	return *bytes > 0 && *runtime > 0 ? 0 : -EIO;
}

static int fio_once(struct fio_ctx *c, const struct xfer *x, int is_write,
		    const struct fio_job *job, double *gbps, double *cpu_per_gb)
{
	static struct args a;
	char *out = NULL, line[512];
	double bytes = 0, runtime = 0, span = 0, cpu = 0;
	int njobs = x->ndirs * job->numjobs, st, r;

	if (fio_args(&a, c, x, is_write, job))
		return 1;
	logs_register(c, njobs);
	st = run_capture(a.argv, x->fd, x->ndirs, &out);
	r = st == 0 && out ? fio_parse(out, is_write, &bytes, &runtime, &cpu) : -EIO;
	if (r) {
		msg("fio (ioengine=%s) failed: %s", c->engine,
		    out ? last_line(out, line, sizeof(line)) : "no output");
		free(out);
		logs_remove(c, njobs);
		return r;
	}
	free(out);
	r = logs_span(c, njobs, &span);
	logs_remove(c, njobs);
	if (r) {
		msg("fio's latency logs (%s_lat.N.log) could not be read: %s",
		    c->log_prefix, strerror(-r));
		return r;
	}
	*gbps = bytes / (span > runtime ? span : runtime) / GB;
	*cpu_per_gb = cpu / (bytes / GB);
	return 0;
}

int fio_run(struct fio_ctx *c, const struct xfer *x, int is_write,
	    const struct fio_job *job, double *gbps, double *cpu_per_gb)
{
	int r = fio_once(c, x, is_write, job, gbps, cpu_per_gb);

	/* io_uring is often blocked in containers: libaio then, once */
	if (r < 0 && !c->engine_fallback && !strcmp(c->engine, "io_uring")) {
		msg("fio: trying ioengine=libaio instead");
		strcpy(c->engine, "libaio");
		c->engine_fallback = 1;
		r = fio_once(c, x, is_write, job, gbps, cpu_per_gb);
	}
	return r;
}
