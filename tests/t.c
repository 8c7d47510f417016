/*
 * t.c - helpers for the nvio C tests (see t.h).
 */
#include "t.h"

#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <limits.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static atomic_int t_nfail;
static const char *t_name = "test";
static void t_make_tmpdir(void);
static char t_dir[T_PATH_MAX];
static _Thread_local char t_context[256];
static int t_verbose;	/* NVIO_TEST_VERBOSE=1: print each case */

const int t_engine_list[T_N_ENGINES] = {
	NVIO_ENGINE_URING, NVIO_ENGINE_AIO, NVIO_ENGINE_PSYNC
};
const int t_direct_list[T_N_DIRECTS] = { NVIO_DIRECT_ON, NVIO_DIRECT_OFF };

/* ---- reporting ---- */

static void t_fail_line(const char *file, int line, const char *msg)
{
	int n = atomic_fetch_add(&t_nfail, 1) + 1;

	if (t_context[0])
		fprintf(stderr, "FAIL %s:%d [%s]: %s\n", file, line, t_context,
			msg);
	else
		fprintf(stderr, "FAIL %s:%d: %s\n", file, line, msg);
	if (n >= T_MAX_FAILS) {
		fprintf(stderr, "%s: %d failures, giving up\n", t_name, n);
		exit(T_FAIL);
	}
}

void t_failf(const char *file, int line, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	t_fail_line(file, line, msg);
}

const char *t_errname(int64_t err)
{
	static _Thread_local char buf[48];
	static const struct { int e; const char *n; } names[] = {
		{ EPERM, "EPERM" }, { ENOENT, "ENOENT" }, { EINTR, "EINTR" },
		{ EIO, "EIO" }, { EBADF, "EBADF" }, { EAGAIN, "EAGAIN" },
		{ ENOMEM, "ENOMEM" }, { EACCES, "EACCES" }, { EFAULT, "EFAULT" },
		{ EBUSY, "EBUSY" }, { EEXIST, "EEXIST" }, { EXDEV, "EXDEV" },
		{ ENOTDIR, "ENOTDIR" }, { EISDIR, "EISDIR" },
		{ EINVAL, "EINVAL" }, { EMFILE, "EMFILE" }, { EFBIG, "EFBIG" },
		{ ENOSPC, "ENOSPC" }, { ESPIPE, "ESPIPE" }, { EROFS, "EROFS" },
		{ ERANGE, "ERANGE" }, { ENOSYS, "ENOSYS" },
		{ ENODATA, "ENODATA" }, { EOVERFLOW, "EOVERFLOW" },
		{ EBADMSG, "EBADMSG" }, { ENOTSUP, "ENOTSUP" },
		{ ECANCELED, "ECANCELED" }, { ETIMEDOUT, "ETIMEDOUT" },
		{ ENAMETOOLONG, "ENAMETOOLONG" },
	};

	if (err < 0) {
		for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
			if (-err == names[i].e) {
				snprintf(buf, sizeof(buf), "-%s", names[i].n);
				return buf;
			}
	}
	snprintf(buf, sizeof(buf), "%lld", (long long)err);
	return buf;
}

int t_eq_i64(const char *file, int line, const char *ea, const char *eb,
	     int64_t a, int64_t b)
{
	if (a == b)
		return 1;
	t_failf(file, line, "%s == %s: got %lld, expected %lld", ea, eb,
		(long long)a, (long long)b);
	return 0;
}

int t_eq_u64(const char *file, int line, const char *ea, const char *eb,
	     uint64_t a, uint64_t b)
{
	if (a == b)
		return 1;
	t_failf(file, line, "%s == %s: got %llu (0x%llx), expected %llu (0x%llx)",
		ea, eb, (unsigned long long)a, (unsigned long long)a,
		(unsigned long long)b, (unsigned long long)b);
	return 0;
}

int t_eq_err(const char *file, int line, const char *expr, int64_t got,
	     int64_t want)
{
	char g[48];

	if (got == want)
		return 1;
	snprintf(g, sizeof(g), "%s", t_errname(got));
	t_failf(file, line, "%s: got %s (%s), expected %s (%s)", expr, g,
		got < 0 && got >= INT_MIN ? nvio_strerror((int)got) : "count",
		t_errname(want), want ? nvio_strerror((int)want) : "success");
	return 0;
}

int t_true(const char *file, int line, const char *expr, int ok)
{
	if (!ok)
		t_failf(file, line, "expected %s", expr);
	return ok;
}

int t_mem_eq(const char *file, int line, const char *what, const void *got,
	     const void *want, size_t n)
{
	const unsigned char *g = got, *w = want;
	size_t i, ndiff = 0, first = 0, last = 0;

	if (memcmp(got, want, n) == 0)
		return 1;
	for (i = 0; i < n; i++)
		if (g[i] != w[i]) {
			if (!ndiff)
				first = i;
			last = i;
			ndiff++;
		}
	t_failf(file, line, "%s: %zu of %zu bytes differ, first at %zu "
		"(got 0x%02x expected 0x%02x), last at %zu", what, ndiff, n,
		first, g[first], w[first], last);
	return 0;
}

void t_note(const char *fmt, ...)
{
	char msg[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	printf("note: %s\n", msg);
}

void t_ctx(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(t_context, sizeof(t_context), fmt, ap);
	va_end(ap);
	if (t_verbose)
		fprintf(stderr, "case: %s\n", t_context);
}

int t_failures(void)
{
	return atomic_load(&t_nfail);
}

int t_quick(void)
{
	const char *q = getenv("NVIO_TEST_QUICK");

	return q && *q && strcmp(q, "0") != 0;
}

/* ---- life cycle ---- */

static int t_rm_one(const char *path, const struct stat *st, int type,
		    struct FTW *ftw)
{
	(void)st; (void)ftw;
	if (type == FTW_DP)
		rmdir(path);
	else
		unlink(path);
	return 0;
}

static void t_cleanup(void)
{
	if (t_dir[0] && !getenv("NVIO_TEST_KEEP"))
		nftw(t_dir, t_rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

void t_init(const char *name)
{
	t_name = name;
	t_verbose = getenv("NVIO_TEST_VERBOSE") != NULL;
	setvbuf(stdout, NULL, _IOLBF, 0);
	setvbuf(stderr, NULL, _IOLBF, 0);
	if (getenv("NVIO_ENGINE") || getenv("NVIO_DIRECT"))
		t_note("NVIO_ENGINE/NVIO_DIRECT unset: the tests pick each "
		       "engine and mode themselves");
	unsetenv("NVIO_ENGINE");
	unsetenv("NVIO_DIRECT");
	setenv("NVIO_NO_TUNED", "1", 1);
	t_make_tmpdir();
	atexit(t_cleanup);
}

int t_done(void)
{
	int n = t_failures();

	if (n) {
		fprintf(stderr, "%s: %d check(s) failed\n", t_name, n);
		return T_FAIL;
	}
	return T_PASS;
}

void t_skip(const char *fmt, ...)
{
	char msg[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	printf("SKIP: %s\n", msg);
	exit(t_failures() ? T_FAIL : T_SKIP);
}

/* ---- files ---- */

static void t_make_tmpdir(void)
{
	const char *base = getenv("NVIO_TEST_DIR");

	if (!base || !*base)
		base = "/tmp";
	snprintf(t_dir, sizeof(t_dir), "%s/nvio-%s-XXXXXX", base, t_name);
	if (!mkdtemp(t_dir)) {
		fprintf(stderr, "mkdtemp %s: %s\n", t_dir, strerror(errno));
		t_dir[0] = 0;
		exit(T_FAIL);
	}
}

/* Created by t_init() so that threads only ever read it. */
const char *t_tmpdir(void)
{
	return t_dir;
}

void t_path(char out[T_PATH_MAX], const char *fmt, ...)
{
	char name[T_PATH_MAX];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(name, sizeof(name), fmt, ap);
	va_end(ap);
	snprintf(out, T_PATH_MAX, "%.300s/%.200s", t_dir, name);
}

void t_subdir(char out[T_PATH_MAX], const char *name)
{
	t_path(out, "%s", name);
	if (mkdir(out, 0755) && errno != EEXIST) {
		fprintf(stderr, "mkdir %s: %s\n", out, strerror(errno));
		exit(T_FAIL);
	}
}

int t_dir_count(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int n = 0;

	if (!d)
		return -errno;
	while ((e = readdir(d)))
		if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
			n++;
	closedir(d);
	return n;
}

int t_fd_is_ours(int fd)
{
	char link[64], target[PATH_MAX];
	size_t len = strlen(t_dir);
	ssize_t n;

	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	n = readlink(link, target, sizeof(target) - 1);
	if (n <= 0)
		return 0;
	target[n] = 0;
	return strncmp(target, t_dir, len) == 0 && target[len] == '/';
}

/* ---- random bytes ---- */

static uint64_t t_mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

static uint64_t t_word(uint64_t seed, uint64_t w)
{
	return t_mix(t_mix(seed) ^ w);
}

uint64_t t_rand64(uint64_t *state)
{
	*state += 0x9e3779b97f4a7c15ull;
	return t_mix(*state);
}

nvio_file_t *t_open_file(nvio_handle_t *h, const char *path, unsigned flags)
{
	int err = 0;
	nvio_file_t *f = nvio_file_open(h, path, flags, &err);

	if (!f)
		T_FAILF("nvio_file_open(%s): %s", path, t_errname(err));
	return f;
}

uint32_t t_crc32_ref(const void *buf, size_t n)
{
	const unsigned char *p = buf;
	uint32_t c = 0xffffffffu;

	for (size_t i = 0; i < n; i++) {
		c ^= p[i];
		for (int b = 0; b < 8; b++)
			c = c >> 1 ^ (0xedb88320u & (0u - (c & 1)));
	}
	return ~c;
}

void t_fill_random_at(void *buf, size_t n, uint64_t seed, uint64_t start)
{
	unsigned char *p = buf;
	uint64_t pos = start, end = start + n;

	while (pos < end) {
		uint64_t w = t_word(seed, pos >> 3);
		unsigned k;

		for (k = pos & 7; k < 8 && pos < end; k++, pos++)
			*p++ = (unsigned char)(w >> (k * 8));
	}
}

void t_fill_random(void *buf, size_t n, uint64_t seed)
{
	t_fill_random_at(buf, n, seed, 0);
}

int64_t t_check_random_at(const void *buf, size_t n, uint64_t seed,
			  uint64_t start)
{
	const unsigned char *p = buf;
	uint64_t pos = start, end = start + n;

	while (pos < end) {
		uint64_t w = t_word(seed, pos >> 3);
		unsigned k;

		for (k = pos & 7; k < 8 && pos < end; k++, pos++, p++)
			if (*p != (unsigned char)(w >> (k * 8)))
				return (int64_t)(pos - start);
	}
	return -1;
}

/* ---- plain libc files ---- */

static int t_write_all(int fd, const void *buf, size_t n, off_t off)
{
	const char *p = buf;

	while (n) {
		ssize_t r = pwrite(fd, p, n, off);

		if (r < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p += r;
		n -= (size_t)r;
		off += r;
	}
	return 0;
}

int t_write_file(const char *path, const void *buf, size_t n)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	int r;

	if (fd < 0)
		return -errno;
	r = t_write_all(fd, buf, n, 0);
	if (close(fd) && !r)
		r = -errno;
	return r;
}

int t_pwrite_file(const char *path, const void *buf, size_t n, off_t off)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
	int r;

	if (fd < 0)
		return -errno;
	r = t_write_all(fd, buf, n, off);
	if (close(fd) && !r)
		r = -errno;
	return r;
}

static int t_read_all(int fd, void *buf, size_t n, off_t off, size_t *got)
{
	char *p = buf;

	*got = 0;
	while (n) {
		ssize_t r = pread(fd, p, n, off);

		if (r < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (r == 0)
			break;
		p += r;
		n -= (size_t)r;
		off += r;
		*got += (size_t)r;
	}
	return 0;
}

int t_read_file(const char *path, void *buf, size_t cap, size_t *size)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	struct stat st;
	size_t got;
	int r;

	if (fd < 0)
		return -errno;
	if (fstat(fd, &st)) {
		r = -errno;
		close(fd);
		return r;
	}
	if (size)
		*size = (size_t)st.st_size;
	r = t_read_all(fd, buf, cap, 0, &got);
	close(fd);
	return r;
}

int t_pread_file(const char *path, void *buf, size_t n, off_t off)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	size_t got;
	int r;

	if (fd < 0)
		return -errno;
	r = t_read_all(fd, buf, n, off, &got);
	close(fd);
	if (!r && got != n)
		r = -ENODATA;
	return r;
}

int64_t t_file_size(const char *path)
{
	struct stat st;

	if (stat(path, &st))
		return -errno;
	return st.st_size;
}

int t_check_file_random(const char *path, off_t off, uint64_t n,
			uint64_t seed, uint64_t start)
{
	size_t chunk = 8u << 20;
	unsigned char *buf = malloc(chunk);
	uint64_t done = 0;
	int r = 0;

	if (!buf)
		return -ENOMEM;
	while (done < n && !r) {
		size_t k = n - done < chunk ? (size_t)(n - done) : chunk;
		int64_t bad;

		r = t_pread_file(path, buf, k, off + (off_t)done);
		if (r)
			break;
		bad = t_check_random_at(buf, k, seed, start + done);
		if (bad >= 0) {
			fprintf(stderr, "%s: byte %llu (file offset %llu) "
				"differs\n", path,
				(unsigned long long)(done + (uint64_t)bad),
				(unsigned long long)(off + done +
						     (uint64_t)bad));
			r = 1;
		}
		done += k;
	}
	free(buf);
	return r;
}

void *t_alloc(size_t n)
{
	void *p = NULL;

	if (posix_memalign(&p, 4096, n ? n : 1)) {
		fprintf(stderr, "out of memory (%zu bytes)\n", n);
		exit(T_FAIL);
	}
	memset(p, 0, n);
	return p;
}

/* ---- engines ---- */

const char *t_engine_str(int engine)
{
	const char *n = nvio_engine_name(engine);

	return n ? n : "?";
}

const char *t_direct_str(int direct)
{
	return direct == NVIO_DIRECT_ON ? "direct" :
	       direct == NVIO_DIRECT_OFF ? "buffered" : "direct-auto";
}

int t_engine_ok(int engine)
{
	static atomic_int said[NVIO_ENGINE_COUNT_ + 1];
	char why[256] = "";
	int r = nvio_engine_available(engine, why, sizeof(why));
	int slot = engine >= 0 && engine < NVIO_ENGINE_COUNT_ ? engine :
		   NVIO_ENGINE_COUNT_;
	const char *req = getenv("NVIO_TEST_REQUIRE_ENGINES");

	if (r == 1)
		return 1;
	if (req && !strcmp(req, "1"))
		T_FAILF("engine %s not available (%d): %s", t_engine_str(engine),
			r, why);
	else if (!atomic_exchange(&said[slot], 1))
		printf("skip engine %s: %s (nvio_engine_available %d)\n",
		       t_engine_str(engine), why[0] ? why : "no reason given",
		       r);
	return 0;
}

int t_direct_ok(int direct)
{
	static atomic_int state;	/* 0 unknown, 1 ok, 2 no */
	char path[T_PATH_MAX];
	int fd, s;

	if (direct != NVIO_DIRECT_ON)
		return 1;
	s = atomic_load(&state);
	if (s)
		return s == 1;
	t_path(path, ".direct-probe");
	fd = open(path, O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0644);
	if (fd < 0) {
		s = 2;
		if (!atomic_exchange(&state, s))
			printf("skip direct on: O_DIRECT open in %s failed: "
			       "%s\n", t_dir, strerror(errno));
	} else {
		close(fd);
		unlink(path);
		s = 1;
		atomic_store(&state, s);
	}
	return s == 1;
}

int t_combo_ok(int engine, int direct)
{
	return t_engine_ok(engine) && t_direct_ok(direct);
}

static _Thread_local char t_combo_name[64];

int t_combo_begin(int engine, int direct)
{
	if (!t_combo_ok(engine, direct))
		return 0;
	snprintf(t_combo_name, sizeof(t_combo_name), "%s/%s",
		 t_engine_str(engine), t_direct_str(direct));
	t_ctx("%s", t_combo_name);
	return 1;
}

const char *t_combo(void)
{
	return t_combo_name;
}

void t_config(nvio_config_t *c, int engine, int direct, uint64_t block_size,
	      uint32_t queue_depth)
{
	nvio_config_init(c);
	c->engine = engine;
	c->direct = direct;
	if (block_size)
		c->block_size = block_size;
	if (queue_depth)
		c->queue_depth = queue_depth;
}

int t_handle(nvio_handle_t **h, int engine, int direct, uint32_t par,
	     uint64_t block_size)
{
	nvio_config_t cfg;
	int r;

	t_config(&cfg, engine, direct, block_size, 0);
	if (par)
		cfg.intra_op_parallelism = par;
	*h = NULL;
	r = nvio_handle_create(h, &cfg);
	if (!T_OK(r))
		return r ? r : -1;
	if (!*h) {
		T_FAILF("nvio_handle_create returned 0 and no handle");
		return -EFAULT;
	}
	if (engine != NVIO_ENGINE_AUTO)
		T_EQ_INT(nvio_get_engine(*h), engine);
	T_EQ_INT(nvio_get_direct(*h), direct);
	return 0;
}

int t_count_fds(void)
{
	/* opendir takes one descriptor itself. */
	return t_dir_count("/proc/self/fd") - 1;
}

/* Threads of this process, less io_uring's kernel helpers ("iou-wrk-N",
 * "iou-sqp-N"): they are listed in /proc/self/task, but the kernel starts
 * and ends them on its own schedule (one may outlive its ring a while). */
int t_count_threads(void)
{
	DIR *d = opendir("/proc/self/task");
	struct dirent *e;
	int n = 0;

	if (!d)
		return -errno;
	while ((e = readdir(d))) {
		char path[64], comm[32] = "";
		FILE *f;

		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/self/task/%s/comm",
			 e->d_name);
		f = fopen(path, "r");
		if (!f)
			continue;	/* it ended while we looked */
		if (!fgets(comm, sizeof(comm), f))
			comm[0] = 0;
		fclose(f);
		if (strncmp(comm, "iou-", 4) != 0)
			n++;
	}
	closedir(d);
	return n;
}
