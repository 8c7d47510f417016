/*
 * util.c - messages, the progress line, parsing, clocks, statistics and
 * JSON output for the nvio tool (temporary files: cleanup.c).
 */
#include "util.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/resource.h>
#include <sys/stat.h>

const char *tool_prog = "nvio";

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

void msg(const char *fmt, ...)
{
	va_list ap;

	progress_done();
	fprintf(stderr, "%s: ", tool_prog);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

void usage_error(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "%s: ", tool_prog);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, " (see '%s --help')\n", tool_prog);
	exit(EXIT_USAGE);
}

void bad_option(char **argv, int c)
{
	const char *arg = argv[optind - 1];

	if (c == ':')
		usage_error("option '%s' needs a value", arg);
	if (optopt && optopt < 256 && strncmp(arg, "--", 2) != 0)
		usage_error("unknown option '-%c'", optopt);
	usage_error("unknown option '%s'", arg);
}

/*
 * Registered with atexit() before any subcommand runs, so every way out
 * through exit() or a return from main (--help included) passes here: a
 * full disk or a closed descriptor behind stdout must not end in status 0.
 * Deaths by signal do not come here, and print nothing more anyway.
 */
void stdout_check_at_exit(void)
{
	int err = 0;

	if (fflush(stdout))
		err = errno;
	if (ferror(stdout) && !err)
		err = EIO;	/* an earlier write failed; its errno is gone */
	/* EBADF: stdout was closed and nothing was written to it */
	if (fclose(stdout) && !err && errno != EBADF)
		err = errno;
	if (!err)
		return;
	msg("error writing standard output: %s", strerror(err));
	_exit(EXIT_RUNTIME);
}

/* ---- numbers ---- */

static int suffix_shift(const char *s, unsigned *shift)
{
	static const char units[] = "KMGTP";
	const char *u;

	*shift = 0;
	if (!*s)
		return 0;
	if (*s == 'b' || *s == 'B')
		return s[1] ? -EINVAL : 0;
	u = strchr(units, *s >= 'a' && *s <= 'z' ? *s - 32 : *s);
	if (!u)
		return -EINVAL;
	*shift = 10u * (unsigned)(u - units + 1);
	s++;
	if (*s == 'i')
		s++;
	if (*s == 'B' || *s == 'b')
		s++;
	return *s ? -EINVAL : 0;
}

int parse_size(const char *s, uint64_t *out)
{
	char *end;
	double v;
	unsigned shift;

	if (!s || !*s || *s == '-' || *s == '+')
		return -EINVAL;
	errno = 0;
	v = strtod(s, &end);
	if (end == s || errno || !isfinite(v) || suffix_shift(end, &shift))
		return -EINVAL;
	v = ldexp(v, (int)shift);
	if (v >= 18446744073709551616.0)
		return -ERANGE;
	if (v != floor(v))
		return -EINVAL;	/* "1.3K" is not a whole number of bytes */
	*out = (uint64_t)v;
	return 0;
}

int parse_u64(const char *s, uint64_t min, uint64_t max, uint64_t *out)
{
	char *end;
	unsigned long long v;

	if (!s || *s < '0' || *s > '9')
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (*end)
		return -EINVAL;
	if (errno || v < min || v > max)
		return -ERANGE;
	*out = v;
	return 0;
}

int parse_double(const char *s, double *out)
{
	char *end;

	errno = 0;
	*out = strtod(s, &end);
	return (end == s || *end || errno || !isfinite(*out)) ? -EINVAL : 0;
}

uint64_t opt_size(const char *opt, const char *arg, uint64_t min, uint64_t max)
{
	uint64_t v;
	char a[32], b[32];
	int r = parse_size(arg, &v);

	if (r == -EINVAL)
		usage_error("%s %s: not a size (use a number with an optional "
			    "K, M, G or T suffix)", opt, arg);
	if (r || v < min || v > max)
		usage_error("%s %s: must be between %s and %s", opt, arg,
			    fmt_bytes(min, a, sizeof(a)),
			    fmt_bytes(max, b, sizeof(b)));
	return v;
}

uint64_t opt_u64(const char *opt, const char *arg, uint64_t min, uint64_t max)
{
	uint64_t v;
	int r = parse_u64(arg, min, max, &v);

	if (r == -EINVAL)
		usage_error("%s %s: not a whole number", opt, arg);
	if (r)
		usage_error("%s %s: must be between %llu and %llu", opt, arg,
			    (unsigned long long)min, (unsigned long long)max);
	return v;
}

const char *fmt_bytes(uint64_t n, char *buf, size_t len)
{
	static const char *units[] = { "B", "KiB", "MiB", "GiB", "TiB", "PiB" };
	int u = 0;
	double v = (double)n;

	while (v >= 1024 && u < 5) {
		v /= 1024;
		u++;
	}
	if (u == 0)
		snprintf(buf, len, "%llu B", (unsigned long long)n);
	else if (v == floor(v))
		snprintf(buf, len, "%.0f %s", v, units[u]);
	else
		snprintf(buf, len, "%.2f %s", v, units[u]);
	return buf;
}

/* ---- clocks and statistics ---- */

double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double rusage_s(int who)
{
	struct rusage ru;

	if (getrusage(who, &ru))
		return 0;
	return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
	       (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

double cpu_self_s(void)
{
	return rusage_s(RUSAGE_SELF);
}

double cpu_children_s(void)
{
	return rusage_s(RUSAGE_CHILDREN);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

double stat_median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double stat_min(const double *v, int n)
{
	double m = v[0];

	for (int i = 1; i < n; i++)
		m = v[i] < m ? v[i] : m;
	return m;
}

double stat_max(const double *v, int n)
{
	double m = v[0];

	for (int i = 1; i < n; i++)
		m = v[i] > m ? v[i] : m;
	return m;
}

/* ---- JSON ---- */

static void json_quote(struct json *j, const char *s)
{
	fputc('"', j->f);
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		if (*p == '"' || *p == '\\')
			fprintf(j->f, "\\%c", *p);
		else if (*p < 0x20)
			fprintf(j->f, "\\u%04x", *p);
		else
			fputc(*p, j->f);
	}
	fputc('"', j->f);
}

/* Comma and indentation before a value, then its key inside an object. */
static void json_sep(struct json *j, const char *key)
{
	if (j->count[j->depth]++)
		fputc(',', j->f);
	fprintf(j->f, "\n%*s", 2 * j->depth, "");
	if (key) {
		json_quote(j, key);
		fputs(": ", j->f);
	}
}

void json_begin(struct json *j, FILE *f)
{
	memset(j, 0, sizeof(*j));
	j->f = f;
	fputc('{', f);
	j->depth = 1;
}

void json_end(struct json *j)
{
	json_close(j, '}');
	fputc('\n', j->f);
}

void json_obj(struct json *j, const char *key)
{
	json_sep(j, key);
	fputc('{', j->f);
	j->count[++j->depth] = 0;
}

void json_arr(struct json *j, const char *key)
{
	json_sep(j, key);
	fputc('[', j->f);
	j->count[++j->depth] = 0;
}

void json_close(struct json *j, char bracket)
{
	int had = j->count[j->depth];

	j->depth--;
	if (had)
		fprintf(j->f, "\n%*s", 2 * j->depth, "");
	fputc(bracket, j->f);
}

void json_str(struct json *j, const char *key, const char *v)
{
	json_sep(j, key);
	if (v)
		json_quote(j, v);
	else
		fputs("null", j->f);
}

void json_num(struct json *j, const char *key, double v)
{
	json_sep(j, key);
	if (isfinite(v))
		fprintf(j->f, "%.6g", v);
	else
		fputs("null", j->f);
}

void json_int(struct json *j, const char *key, int64_t v)
{
	json_sep(j, key);
	fprintf(j->f, "%lld", (long long)v);
}

void json_uint(struct json *j, const char *key, uint64_t v)
{
	json_sep(j, key);
	fprintf(j->f, "%llu", (unsigned long long)v);
}

void json_bool(struct json *j, const char *key, int v)
{
	json_sep(j, key);
	fputs(v ? "true" : "false", j->f);
}

void json_null(struct json *j, const char *key)
{
	json_sep(j, key);
	fputs("null", j->f);
}
