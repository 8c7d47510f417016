/*
 * test_async.c - many NVIO_ASYNC ops outstanding on one handle: one
 * nvio_wait reports exactly how many completed, nvio_pending counts
 * them, a failure in a batch is reported once while the other ops still
 * move their bytes, and sync ops never consume async completions.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "t.h"
#include "sys.h"

#define NFILES 10
#define NRANGES 8
#define RANGE 70000	/* not a multiple of anything */

static uint64_t seed = 500;

struct op {
	char path[T_PATH_MAX];
	uint64_t n;
	int64_t off;
	uint64_t seed;
	unsigned char *buf;
};

static struct op ops[NFILES + NRANGES];

static void plan_ops(void)
{
	for (int i = 0; i < NFILES; i++) {
		struct op *o = &ops[i];

		t_path(o->path, "distinct-%d", i);
		o->n = (uint64_t)(1 + i * 37777 + (i % 3) * 4096);
		o->off = i * 513;
		if (i == 0)
			o->n = 0;	/* a size-0 op counts too */
	}
	for (int i = 0; i < NRANGES; i++) {
		struct op *o = &ops[NFILES + i];

		t_path(o->path, "shared");
		o->n = RANGE - (uint64_t)(i % 2) * 1000;
		o->off = (int64_t)i * RANGE;
	}
	for (int i = 0; i < NFILES + NRANGES; i++) {
		free(ops[i].buf);
		ops[i].buf = t_alloc(ops[i].n + 2);
	}
}

static void test_batch(nvio_handle_t *h, const char *combo)
{
	const int n = NFILES + NRANGES;
	int r;

	t_ctx("%s batch write", combo);
	plan_ops();
	for (int i = 0; i < NFILES; i++)
		unlink(ops[i].path);
	unlink(ops[NFILES].path);
	T_EQ_U64(nvio_pending(h), 0);
	T_ERR(nvio_wait(h), 0);	/* nothing pending */
	for (int i = 0; i < n; i++) {
		struct op *o = &ops[i];

		o->seed = seed++;
		t_fill_random(o->buf + (i & 1), o->n, o->seed);
		if (!T_OK(nvio_pwrite(h, o->buf + (i & 1), o->n, o->path,
				      o->off, NVIO_ASYNC))) {
			nvio_wait(h);	/* the ones before are using ops[] */
			return;
		}
		T_EQ_U64(nvio_pending(h), (uint64_t)i + 1);
	}
	r = nvio_wait(h);
	T_EQ_INT(r, n);
	T_EQ_U64(nvio_pending(h), 0);
	T_ERR(nvio_wait(h), 0);
	for (int i = 0; i < n; i++) {
		struct op *o = &ops[i];

		t_ctx("%s batch write: file check op %d", combo, i);
		T_EQ_INT(t_check_file_random(o->path, o->off, o->n, o->seed,
					     0), 0);
	}
	T_EQ_INT(t_file_size(ops[NFILES].path),
		 (int64_t)(NRANGES - 1) * RANGE + RANGE - 1000);

	/* Read them all back at once, into other misalignments. */
	t_ctx("%s batch read", combo);
	for (int i = 0; i < n; i++) {
		struct op *o = &ops[i];

		memset(o->buf, 0, o->n + 2);
		if (!T_OK(nvio_pread(h, o->buf + 1 - (i & 1), o->n, o->path,
				     o->off, NVIO_ASYNC))) {
			nvio_wait(h);
			return;
		}
	}
	T_EQ_U64(nvio_pending(h), (uint64_t)n);
	T_EQ_INT(nvio_wait(h), n);
	T_EQ_U64(nvio_pending(h), 0);
	for (int i = 0; i < n; i++) {
		struct op *o = &ops[i];

		t_ctx("%s batch read: op %d", combo, i);
		T_EQ_INT(t_check_random_at(o->buf + 1 - (i & 1), o->n, o->seed,
					   0), -1);
	}
}

/* A sync op while async ops are pending leaves their count alone. */
static void test_sync_between(nvio_handle_t *h, const char *combo)
{
	char path[T_PATH_MAX];
	unsigned char *b = t_alloc(300000), *c = t_alloc(300000);
	uint64_t s = seed++;

	t_ctx("%s sync while async pending", combo);
	t_path(path, "sync-between");
	plan_ops();
	for (int i = 0; i < 5; i++) {
		ops[i + 1].seed = seed++;
		t_fill_random(ops[i + 1].buf, ops[i + 1].n, ops[i + 1].seed);
		T_OK(nvio_pwrite(h, ops[i + 1].buf, ops[i + 1].n,
				 ops[i + 1].path, 0, NVIO_ASYNC));
	}
	T_EQ_U64(nvio_pending(h), 5);
	t_fill_random(b, 300000, s);
	T_OK(nvio_pwrite(h, b, 300000, path, 0, 0));
	T_OK(nvio_pread(h, c, 300000, path, 0, 0));
	T_MEM_EQ(c, b, 300000);
	T_EQ_U64(nvio_pending(h), 5);
	/* A failed sync op does not touch the count either. */
	T_ERR(nvio_pread(h, c, 300001, path, 0, 0), -ENODATA);
	T_EQ_U64(nvio_pending(h), 5);
	T_EQ_INT(nvio_wait(h), 5);
	T_EQ_U64(nvio_pending(h), 0);
	for (int i = 0; i < 5; i++)
		T_EQ_INT(t_check_file_random(ops[i + 1].path, 0, ops[i + 1].n,
					     ops[i + 1].seed, 0), 0);
	T_ERR(nvio_wait(h), 0);
	unlink(path);
	free(b);
	free(c);
}

/* ---- one op of a batch fails at completion (injected) ---- */

static char bad_path[T_PATH_MAX];
static atomic_int bad_hits;

static ssize_t fail_bad_file(int is_write, int fd, uint64_t off, size_t n,
			     ssize_t res)
{
	char link[64], target[T_PATH_MAX];
	ssize_t k;

	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	k = readlink(link, target, sizeof(target) - 1);
	if (k > 0) {
		target[k] = 0;
		if (!strcmp(target, bad_path)) {
			atomic_fetch_add(&bad_hits, 1);
			return -EIO;
		}
	}
	return res;
}

static void test_one_fails(nvio_handle_t *h, const char *combo)
{
	const int n = NFILES;
	nvio_error_t e = { .struct_size = sizeof(e) };

	t_ctx("%s one op of a batch fails", combo);
	plan_ops();
	for (int i = 0; i < n; i++) {
		ops[i].seed = seed++;
		t_fill_random(ops[i].buf, ops[i].n, ops[i].seed);
		/* The file holds the stream at [off, off+n). */
		if (t_write_file(ops[i].path, "", 0) ||
		    t_pwrite_file(ops[i].path, ops[i].buf, ops[i].n,
				  ops[i].off)) {
			T_FAILF("libc write failed");
			return;
		}
		memset(ops[i].buf, 0, ops[i].n + 2);
	}
	snprintf(bad_path, sizeof(bad_path), "%s", ops[4].path);
	atomic_store(&bad_hits, 0);
	nvio__sys.io_result = fail_bad_file;
	for (int i = 0; i < n; i++)
		T_OK(nvio_pread(h, ops[i].buf, ops[i].n, ops[i].path,
				ops[i].off, NVIO_ASYNC));
	T_EQ_U64(nvio_pending(h), (uint64_t)n);
	T_ERR(nvio_wait(h), -EIO);
	nvio__sys_reset();
	T_TRUE(atomic_load(&bad_hits) > 0);
	T_EQ_U64(nvio_pending(h), 0);
	memset(&e, 0, sizeof(e));
	e.struct_size = sizeof(e);
	T_ERR(nvio_last_error(h, &e), -EIO);
	T_EQ_INT(e.is_write, 0);
	if (!strstr(e.path, bad_path))
		T_FAILF("last_error().path \"%s\" does not name %s", e.path,
			bad_path);
	for (int i = 0; i < n; i++) {
		if (i == 4)
			continue;
		t_ctx("%s one op of a batch fails: op %d bytes", combo, i);
		T_EQ_INT(t_check_random_at(ops[i].buf, ops[i].n, ops[i].seed,
					   0), -1);
	}
	t_ctx("%s one op of a batch fails: after", combo);
	T_ERR(nvio_wait(h), 0);
	/* The handle still works. */
	T_OK(nvio_pread(h, ops[4].buf, ops[4].n, ops[4].path, ops[4].off,
			NVIO_ASYNC));
	T_EQ_INT(nvio_wait(h), 1);
	T_EQ_INT(t_check_random_at(ops[4].buf, ops[4].n, ops[4].seed, 0), -1);

	/* Two ops fail: wait reports an error once, then 0. */
	t_ctx("%s two failing writes", combo);
	atomic_store(&bad_hits, 0);
	nvio__sys.io_result = fail_bad_file;
	T_OK(nvio_pwrite(h, ops[4].buf, ops[4].n, ops[4].path, 0, NVIO_ASYNC));
	T_OK(nvio_pwrite(h, ops[5].buf, ops[5].n, ops[5].path, 0, NVIO_ASYNC));
	T_OK(nvio_pwrite(h, ops[4].buf, ops[4].n, ops[4].path, 0, NVIO_ASYNC));
	T_ERR(nvio_wait(h), -EIO);
	nvio__sys_reset();
	T_ERR(nvio_wait(h), 0);
	T_EQ_U64(nvio_pending(h), 0);
	T_EQ_INT(t_check_file_random(ops[5].path, 0, ops[5].n, ops[5].seed, 0),
		 0);
}

/* Many more ops than the queue depth, some in the same file. */
static void test_many(nvio_handle_t *h, const char *combo)
{
	enum { N = 200, SZ = 5000 };
	char path[T_PATH_MAX];
	unsigned char *b = t_alloc((size_t)N * SZ), *c = t_alloc((size_t)N * SZ);
	uint64_t s = seed++;

	t_ctx("%s %d small async ops", combo, N);
	t_path(path, "many");
	unlink(path);
	t_fill_random(b, (size_t)N * SZ, s);
	for (int i = 0; i < N; i++)
		T_OK(nvio_pwrite(h, b + (size_t)i * SZ, SZ, path,
				 (int64_t)i * SZ, NVIO_ASYNC));
	T_EQ_INT(nvio_wait(h), N);
	T_EQ_INT(t_check_file_random(path, 0, (uint64_t)N * SZ, s, 0), 0);
	for (int i = N - 1; i >= 0; i--)
		T_OK(nvio_pread(h, c + (size_t)i * SZ, SZ, path,
				(int64_t)i * SZ, NVIO_ASYNC));
	T_EQ_INT(nvio_wait(h), N);
	T_MEM_EQ(c, b, (size_t)N * SZ);
	unlink(path);
	free(b);
	free(c);
}

int main(void)
{
	t_init("async");
	T_FOR_EACH_COMBO(e, d) {
		for (int par = 1; par <= 4; par += 3) {
			nvio_handle_t *h;
			char combo[64];

			snprintf(combo, sizeof(combo), "%s par %d", t_combo(),
				 par);
			t_ctx("%s create", combo);
			if (t_handle(&h, e, d, (uint32_t)par, 16384))
				continue;
			test_batch(h, combo);
			test_sync_between(h, combo);
			test_one_fails(h, combo);
			test_many(h, combo);
			nvio_handle_destroy(h);
		}
	}
	for (int i = 0; i < NFILES + NRANGES; i++)
		free(ops[i].buf);
	return t_done();
}
