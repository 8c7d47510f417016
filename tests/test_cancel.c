/*
 * test_cancel.c - nvio_queue_cancel / nvio_cancel (0.3). A worker is held
 * inside the first piece of an op (the sys table's io_result hook, after
 * the kernel moved it) while the op is cancelled: that piece finishes,
 * the pieces not started are skipped, and the op completes once with
 * -ECANCELED; the file holds the finished piece and is unchanged past it
 * (writes), the buffer past it is untouched (reads). A cancelled write
 * keeps an ATOMIC file from committing. An op whose pieces have all run
 * (held in its fsync) is -EALREADY and completes as it would have; a
 * completed op, an unknown tag and another queue's op are -ENOENT; ops
 * with other tags run to the end. Every engine, direct on and off.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "t.h"
#include "sys.h"

#define BS (64u << 10)
#define NP 16			/* pieces of the op */
#define SEC 1000000000ll

/* The hold: the first matching call waits in the hook until released. */
static pthread_mutex_t hold_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t hold_cond = PTHREAD_COND_INITIALIZER;
#define HOLD_FSYNC 2	/* hold_arm: in fsync, not in a piece */
static int hold_armed, hold_write, hold_entered, hold_released;
static int (*real_fsync)(int fd);

static void hold_here(void)
{
	pthread_mutex_lock(&hold_lock);
	hold_entered = 1;
	pthread_cond_broadcast(&hold_cond);
	while (!hold_released)
		pthread_cond_wait(&hold_cond, &hold_lock);
	pthread_mutex_unlock(&hold_lock);
}

static ssize_t hold_io(int is_write, int fd, uint64_t off, size_t n, ssize_t res)
{
	int mine;

	pthread_mutex_lock(&hold_lock);
	mine = hold_armed && is_write == hold_write;
	if (mine)
		hold_armed = 0;
	pthread_mutex_unlock(&hold_lock);
	if (mine)
		hold_here();
	return res;
}

static int hold_fsync(int fd)
{
	int mine;

	pthread_mutex_lock(&hold_lock);
	mine = hold_armed && hold_write == HOLD_FSYNC;
	if (mine)
		hold_armed = 0;
	pthread_mutex_unlock(&hold_lock);
	if (mine)
		hold_here();
	return real_fsync(fd);
}

/* 0 a read piece, 1 a write piece, HOLD_FSYNC an fsync */
static void hold_arm(int is_write)
{
	pthread_mutex_lock(&hold_lock);
	hold_armed = 1;
	hold_write = is_write;
	hold_entered = 0;
	hold_released = 0;
	pthread_mutex_unlock(&hold_lock);
}

/* Waits (10 s at most) until a worker is held; 1 if one is. */
static int hold_wait(void)
{
	struct timespec until;
	int in;

	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += 10;
	pthread_mutex_lock(&hold_lock);
	while (!hold_entered &&
	       pthread_cond_timedwait(&hold_cond, &hold_lock, &until) == 0)
		;
	in = hold_entered;
	pthread_mutex_unlock(&hold_lock);
	if (!in)
		T_FAILF("no worker reached the hold in 10 s");
	return in;
}

static void hold_release(void)
{
	pthread_mutex_lock(&hold_lock);
	hold_armed = 0;
	hold_released = 1;
	pthread_cond_broadcast(&hold_cond);
	pthread_mutex_unlock(&hold_lock);
}

/* One worker, one request in flight: the pieces after the held one are
 * not started when the cancel comes. */
static int handle_one(nvio_handle_t **h, int e, int d)
{
	nvio_config_t c;
	int r;

	t_config(&c, e, d, BS, 1);
	c.intra_op_parallelism = 1;
	r = nvio_handle_create(h, &c);
	if (r)
		T_FAILF("nvio_handle_create: %s", t_errname(r));
	return r;
}

/* How many whole pieces from the start of got equal want's; the rest
 * must equal old's. Returns the finished prefix, -1 if any piece is
 * neither or a new piece follows an old one. */
static int finished_prefix(const unsigned char *got, const unsigned char *want,
			   const unsigned char *old)
{
	int k = 0;

	while (k < NP && !memcmp(got + (size_t)k * BS, want + (size_t)k * BS, BS))
		k++;
	for (int i = k; i < NP; i++)
		if (memcmp(got + (size_t)i * BS, old + (size_t)i * BS, BS))
			return -1;
	return k;
}

static void cancel_write(int e, int d, int atomic)
{
	char path[T_PATH_MAX];
	size_t size = (size_t)NP * BS;
	unsigned char *old = t_alloc(size), *mem = t_alloc(size), *got = t_alloc(size);
	nvio_queue_t *q = NULL, *q2 = NULL;
	nvio_completion_t c;
	nvio_handle_t *h;
	nvio_file_t *f;
	nvio_error_t er = { .struct_size = sizeof(er) };
	nvio_op_t op;
	int k;

	t_path(path, "w-%d-%d-%d", e, d, atomic);
	t_fill_random(old, size, 1);
	t_fill_random(mem, size, 2);
	T_OK(t_write_file(path, old, size));
	if (handle_one(&h, e, d))
		return;
	f = t_open_file(h, path, atomic ? NVIO_FILE_ATOMIC : NVIO_FILE_READ | NVIO_FILE_WRITE);
	T_OK(nvio_queue_create(h, &q, 0));
	T_OK(nvio_queue_create(h, &q2, 0));
	if (f && q && q2) {
		hold_arm(1);
		nvio_prep_write(&op, f, mem, size, 0, 7);
		T_EQ_INT(nvio_queue_submit(q, &op, 1), 1);
		if (hold_wait()) {
			T_ERR(nvio_queue_cancel(q, 8), -ENOENT);	/* no such tag */
			T_ERR(nvio_queue_cancel(q2, 7), -ENOENT);	/* not its op */
			T_ERR(nvio_cancel(h, 7), -ENOENT);		/* nor the default's */
			T_EQ_INT(nvio_queue_cancel(q, 7), 1);
		}
		hold_release();
		T_EQ_INT(nvio_queue_reap(q, &c, 1, 1, 10 * SEC), 1);
		T_EQ_U64(c.user_data, 7);
		T_ERR(c.res, -ECANCELED);
		T_TRUE(c.flags & NVIO_COMPLETION_WRITE);
		T_TRUE(!strcmp(c.err_what, "cancel"));
		T_ERR(nvio_completion_error(&c, path, &er), -ECANCELED);
		T_ERR(nvio_queue_cancel(q, 7), -ENOENT);	/* completed */
		if (atomic) {
			T_TRUE(nvio_file_commit(f) < 0);	/* a failed write */
			T_OK(t_read_file(path, got, size, NULL));
			T_MEM_EQ(got, old, size);		/* the old file */
		} else {
			T_OK(t_pread_file(path, got, size, 0));
			k = finished_prefix(got, mem, old);
			/* the held piece ran; one more may have been
			 * prepared beside it; none after those */
			T_TRUE(k >= 1 && k <= 2);
		}
	}
	if (f)
		nvio_file_close(f);
	nvio_handle_destroy(h);
	free(old);
	free(mem);
	free(got);
}

static void cancel_read(int e, int d)
{
	char path[T_PATH_MAX];
	size_t size = (size_t)NP * BS;
	unsigned char *file = t_alloc(size), *mem = t_alloc(size), *zero = t_alloc(size);
	nvio_completion_t c[2];
	nvio_handle_t *h;
	nvio_file_t *f;
	nvio_op_t op[2];
	int k;

	t_path(path, "r-%d-%d", e, d);
	t_fill_random(file, size, 3);
	T_OK(t_write_file(path, file, size));
	if (handle_one(&h, e, d))
		return;
	f = t_open_file(h, path, NVIO_FILE_READ);
	if (f) {
		hold_arm(0);
		/* the default queue: nvio_submit / nvio_cancel / nvio_reap;
		 * the second op (another tag, queued behind) runs whole */
		nvio_prep_read(&op[0], f, mem, size / 2, 0, 5);
		nvio_prep_read(&op[1], f, mem + size / 2, size / 2, (int64_t)size / 2, 6);
		T_EQ_INT(nvio_submit(h, op, 2), 2);
		if (hold_wait())
			T_EQ_INT(nvio_cancel(h, 5), 1);
		hold_release();
		T_EQ_INT(nvio_reap(h, c, 2, 2, 10 * SEC), 2);
		for (int i = 0; i < 2; i++) {
			if (c[i].user_data == 5)
				T_ERR(c[i].res, -ECANCELED);
			else
				T_EQ_INT(c[i].res, size / 2);
		}
		T_MEM_EQ(mem + size / 2, file + size / 2, size / 2);
		for (k = 0; k < NP / 2 && !memcmp(mem + (size_t)k * BS, file + (size_t)k * BS, BS); k++)
			;
		T_TRUE(k >= 1 && k <= 2);
		T_MEM_EQ(mem + (size_t)k * BS, zero, (size_t)(NP / 2 - k) * BS);
		T_OK(nvio_file_close(f));
	}
	nvio_handle_destroy(h);
	free(file);
	free(mem);
	free(zero);
}

/* Held in its fsync, the op has moved every piece: too late. */
static void cancel_late(int e, int d)
{
	char path[T_PATH_MAX];
	unsigned char *mem = t_alloc(BS);
	nvio_queue_t *q = NULL;
	nvio_completion_t c;
	nvio_handle_t *h;
	nvio_file_t *f;
	nvio_op_t op;

	t_path(path, "late-%d-%d", e, d);
	t_fill_random(mem, BS, 4);
	if (handle_one(&h, e, d))
		return;
	f = t_open_file(h, path, NVIO_FILE_WRITE | NVIO_FILE_CREATE);
	T_OK(nvio_queue_create(h, &q, 0));
	if (f && q) {
		real_fsync = nvio__sys.fsync;
		nvio__sys.fsync = hold_fsync;
		hold_arm(HOLD_FSYNC);
		nvio_prep_write(&op, f, mem, BS, 0, 9);
		op.flags = NVIO_FSYNC;
		T_EQ_INT(nvio_queue_submit(q, &op, 1), 1);
		if (hold_wait())
			T_ERR(nvio_queue_cancel(q, 9), -EALREADY);
		hold_release();
		T_EQ_INT(nvio_queue_reap(q, &c, 1, 1, 10 * SEC), 1);
		T_EQ_INT(c.res, BS);
		nvio__sys.fsync = real_fsync;
		T_OK(nvio_file_close(f));
		T_OK(t_check_file_random(path, 0, BS, 4, 0));
	}
	nvio_handle_destroy(h);
	free(mem);
}

int main(void)
{
	t_init("test_cancel");
	nvio__sys.io_result = hold_io;
	T_FOR_EACH_COMBO(e, d) {
		cancel_write(e, d, 0);
		cancel_write(e, d, 1);
		cancel_read(e, d);
		cancel_late(e, d);
	}
	nvio__sys_reset();
	return t_done();
}
