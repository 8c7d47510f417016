/*
 * test_threads.c - stress, and what must hold under TSan and ASan.
 *
 * Part 1: 8 threads, each with its own handle (engines mixed, direct on
 * and off, parallelism 1-3) and its own file, do 50 random round trips:
 * random size, offset and buffer misalignment, sync or async; each write
 * is checked with libc, each read byte by byte.
 *
 * Part 2: 4 threads share ONE handle. Each submits async writes to its
 * own ranges of one shared file, calls nvio_wait, and then checks its own
 * bytes with libc (wait returns only after every op submitted before it,
 * by any thread, has ended); then async reads of its ranges, wait, and a
 * byte check. Every wait returns >= 0; the sum of all returns, plus a
 * final wait in the main thread, equals the number of ops submitted
 * (each op reported exactly once); nothing is pending at the end.
 *
 * Part 3: 4 threads share ONE handle and fail on purpose, over and over:
 * a read of a file that only that thread names (-ENOENT), a read past the
 * end of its own file (-ENODATA). After each failure, nvio_last_error()
 * in that thread must describe that thread's failure (its path, its
 * offset), whatever the other threads' calls failed with meanwhile.
 *
 * Part 4: one thread keeps submitting async reads on a shared handle
 * while another submits one and waits: the wait returns once the ops
 * before it have ended, not when the other thread stops (it used to wait
 * for every op in flight, new ones included, forever).
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "t.h"
#include "sys.h"

#define NT 8
#define ITERS (T_SANITIZED ? 20 : 50)
#define MAXN (T_SANITIZED ? (1u << 20) : (3u << 20))

static int engines[T_N_ENGINES], nengines;

static void *own_handle(void *arg)
{
	int id = (int)(intptr_t)arg;
	uint64_t st = 0x1234u + (uint64_t)id * 7919u;
	int e = engines[id % nengines];
	int d = t_direct_list[(id / nengines) % 2];
	nvio_handle_t *h;
	char path[T_PATH_MAX];
	unsigned char *b = t_alloc(MAXN + 2), *c = t_alloc(MAXN + 2);

	if (!t_direct_ok(d))
		d = NVIO_DIRECT_OFF;
	t_ctx("thread %d %s/%s", id, t_engine_str(e), t_direct_str(d));
	if (t_handle(&h, e, d, 1 + (uint32_t)id % 3,
		     id % 2 ? 65536 : (1u << 20)))
		goto out;
	t_path(path, "own-%d", id);
	for (int it = 0; it < ITERS; it++) {
		uint64_t n = t_rand64(&st) % MAXN;
		int64_t off = (int64_t)(t_rand64(&st) % (1u << 20));
		int mis = (int)(t_rand64(&st) % 2);
		unsigned fl = t_rand64(&st) % 2 ? NVIO_ASYNC : 0;
		uint64_t s = t_rand64(&st);
		int r;

		if (it % 5 == 0)
			n %= 9000;	/* small ones too */
		t_ctx("thread %d %s/%s it %d n %llu off %lld mis %d%s", id,
		      t_engine_str(e), t_direct_str(d), it,
		      (unsigned long long)n, (long long)off, mis,
		      fl ? " async" : "");
		t_fill_random(b + mis, n, s);
		r = nvio_pwrite(h, b + mis, n, path, off, fl);
		if (fl && T_OK(r))
			r = nvio_wait(h) == 1 ? 0 : -1;
		T_OK(r);
		T_EQ_INT(t_check_file_random(path, off, n, s, 0), 0);
		memset(c, 0, n + 2);
		r = nvio_pread(h, c + 1 - mis, n, path, off, fl);
		if (fl && T_OK(r))
			r = nvio_wait(h) == 1 ? 0 : -1;
		T_OK(r);
		T_EQ_INT(t_check_random_at(c + 1 - mis, n, s, 0), -1);
		if (t_failures() > 20)
			break;
	}
	T_EQ_U64(nvio_pending(h), 0);
	nvio_handle_destroy(h);
	unlink(path);
out:
	free(b);
	free(c);
	return NULL;
}

/* ---- one shared handle ---- */

#define ST 4
#define OPS (T_SANITIZED ? 8 : 24)
#define PIECE 40000

static nvio_handle_t *shared;
static char shared_path[T_PATH_MAX];
static atomic_llong reported;
static atomic_int submitted;

static void *sharer(void *arg)
{
	int id = (int)(intptr_t)arg;
	unsigned char *b = t_alloc((size_t)OPS * PIECE);
	unsigned char *c = t_alloc((size_t)OPS * PIECE);
	uint64_t s = 4242 + (uint64_t)id;

	for (int round = 0; round < 3; round++) {
		int r;

		t_ctx("sharer %d round %d", id, round);
		t_fill_random(b, (size_t)OPS * PIECE, s + (uint64_t)round);
		for (int i = 0; i < OPS; i++) {
			/* ranges of all threads interleave in the file */
			int64_t off = ((int64_t)i * ST + id) * PIECE;

			if (T_OK(nvio_pwrite(shared, b + (size_t)i * PIECE,
					     PIECE, shared_path, off,
					     NVIO_ASYNC)))
				atomic_fetch_add(&submitted, 1);
		}
		r = nvio_wait(shared);
		if (T_TRUE(r >= 0))
			atomic_fetch_add(&reported, r);
		for (int i = 0; i < OPS; i++) {
			int64_t off = ((int64_t)i * ST + id) * PIECE;

			T_EQ_INT(t_check_file_random(shared_path, off, PIECE,
						     s + (uint64_t)round,
						     (uint64_t)i * PIECE), 0);
		}
		memset(c, 0, (size_t)OPS * PIECE);
		for (int i = 0; i < OPS; i++) {
			int64_t off = ((int64_t)i * ST + id) * PIECE;

			if (T_OK(nvio_pread(shared, c + (size_t)i * PIECE,
					    PIECE, shared_path, off,
					    NVIO_ASYNC)))
				atomic_fetch_add(&submitted, 1);
		}
		/* a sync op in between must not disturb the others */
		{
			unsigned char one[PIECE];

			T_OK(nvio_pread(shared, one, PIECE, shared_path,
					(int64_t)id * PIECE, 0));
		}
		r = nvio_wait(shared);
		if (T_TRUE(r >= 0))
			atomic_fetch_add(&reported, r);
		T_MEM_EQ(c, b, (size_t)OPS * PIECE);
	}
	free(b);
	free(c);
	return NULL;
}

static void shared_handle(void)
{
	pthread_t th[ST];
	unsigned char *zero;
	int e = engines[0], r;

	t_ctx("shared handle %s", t_engine_str(e));
	if (t_handle(&shared, e, NVIO_DIRECT_OFF, 2, 16384))
		return;
	t_path(shared_path, "shared");
	/* The whole file exists first, so reads never race a grow. */
	zero = t_alloc((size_t)OPS * ST * PIECE);
	t_write_file(shared_path, zero, (size_t)OPS * ST * PIECE);
	free(zero);
	for (int i = 0; i < ST; i++)
		pthread_create(&th[i], NULL, sharer, (void *)(intptr_t)i);
	for (int i = 0; i < ST; i++)
		pthread_join(th[i], NULL);
	t_ctx("shared handle %s end", t_engine_str(e));
	r = nvio_wait(shared);
	if (T_TRUE(r >= 0))
		atomic_fetch_add(&reported, r);
	T_EQ_INT(atomic_load(&reported), atomic_load(&submitted));
	T_EQ_U64(nvio_pending(shared), 0);
	nvio_handle_destroy(shared);
	unlink(shared_path);
}

#define FAILS (T_SANITIZED ? 100 : 400)

static void *failer(void *arg)
{
	int id = (int)(intptr_t)arg;
	char missing[T_PATH_MAX + 32], own[T_PATH_MAX];
	unsigned char buf[64], data[100];
	nvio_error_t e = { .struct_size = sizeof(e) };

	t_path(own, "failer-%d", id);
	memset(data, id, sizeof(data));
	if (t_write_file(own, data, sizeof(data)))
		return NULL;
	for (int i = 0; i < FAILS; i++) {
		int64_t off = 100 + id * 1000 + i;

		t_ctx("failer %d try %d", id, i);
		snprintf(missing, sizeof(missing), "%s-missing-%d", own, i);
		T_ERR(nvio_pread(shared, buf, 10, missing, 0, 0), -ENOENT);
		memset(&e, 0, sizeof(e));
		e.struct_size = sizeof(e);
		T_ERR(nvio_last_error(shared, &e), -ENOENT);
		if (strcmp(e.path, missing) != 0) {
			T_FAILF("last_error() names \"%s\", not this thread's "
				"\"%s\"", e.path, missing);
			break;
		}
		T_ERR(nvio_pread(shared, buf, 1, own, off, 0), -ENODATA);
		memset(&e, 0, sizeof(e));
		e.struct_size = sizeof(e);
		T_ERR(nvio_last_error(shared, &e), -ENODATA);
		if (strcmp(e.path, own) != 0 || e.offset != off) {
			T_FAILF("last_error() names \"%s\" at %lld, not this "
				"thread's \"%s\" at %lld", e.path,
				(long long)e.offset, own, (long long)off);
			break;
		}
	}
	unlink(own);
	return NULL;
}

static void shared_failures(void)
{
	pthread_t th[ST];

	t_ctx("shared failures %s", t_engine_str(engines[0]));
	if (t_handle(&shared, engines[0], NVIO_DIRECT_OFF, 1, 1u << 20))
		return;
	for (int i = 0; i < ST; i++)
		pthread_create(&th[i], NULL, failer, (void *)(intptr_t)i);
	for (int i = 0; i < ST; i++)
		pthread_join(th[i], NULL);
	nvio_handle_destroy(shared);
}

static atomic_int waited, flood_timed_out, flood_stopped;

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void *flooder(void *arg)
{
	nvio_handle_t *h = arg;
	unsigned char *b = t_alloc(PIECE);
	double t0 = now();

	/* until the waiter is done, or 10 s: that is the failure */
	while (!atomic_load(&waited)) {
		if (now() - t0 > 10) {
			atomic_store(&flood_timed_out, 1);
			break;
		}
		if (!T_OK(nvio_pread(h, b, PIECE, shared_path, 0, NVIO_ASYNC)))
			break;
		usleep(1000);
	}
	atomic_store(&flood_stopped, 1);
	/* b is the target of the reads still in flight: they end first */
	T_TRUE(nvio_wait(h) >= 0);
	free(b);
	return NULL;
}

/* Requests take 2 ms: ops pile up faster than they end, so some are
 * always in flight while the flood goes on. */
static ssize_t slow_result(int is_write, int fd, uint64_t off, size_t n,
			   ssize_t res)
{
	usleep(2000);
	return res;
}

static void wait_not_starved(void)
{
	unsigned char mine[PIECE];
	pthread_t th;
	int r;

	t_ctx("a wait while another thread keeps submitting");
	if (t_handle(&shared, engines[0], NVIO_DIRECT_OFF, 1, 0))
		return;
	t_path(shared_path, "flood");
	memset(mine, 7, PIECE);
	t_write_file(shared_path, mine, PIECE);
	atomic_store(&waited, 0);
	nvio__sys.io_result = slow_result;
	pthread_create(&th, NULL, flooder, shared);
	while (nvio_pending(shared) < 50 && !atomic_load(&flood_stopped))
		sched_yield();	/* until the flood is on */
	T_EQ_INT(atomic_load(&flood_stopped), 0);
	memset(mine, 0, PIECE);
	T_OK(nvio_pread(shared, mine, PIECE, shared_path, 0, NVIO_ASYNC));
	r = nvio_wait(shared);
	atomic_store(&waited, 1);
	pthread_join(th, NULL);
	T_TRUE(r >= 1);
	T_EQ_INT(mine[PIECE - 1], 7);
	/* the flood ended because the wait returned, not at its limit */
	T_EQ_INT(atomic_load(&flood_timed_out), 0);
	r = nvio_wait(shared);
	T_TRUE(r >= 0);
	T_EQ_U64(nvio_pending(shared), 0);
	nvio__sys_reset();	/* nothing in flight now */
	nvio_handle_destroy(shared);
	unlink(shared_path);
}

int main(void)
{
	pthread_t th[NT];

	t_init("threads");
	for (int i = 0; i < T_N_ENGINES; i++)
		if (t_engine_ok(t_engine_list[i]))
			engines[nengines++] = t_engine_list[i];
	if (!nengines)
		t_skip("no engine available");
	for (int i = 0; i < NT; i++)
		pthread_create(&th[i], NULL, own_handle, (void *)(intptr_t)i);
	for (int i = 0; i < NT; i++)
		pthread_join(th[i], NULL);
	shared_handle();
	shared_failures();
	wait_not_starved();
	return t_done();
}
