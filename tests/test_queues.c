/*
 * test_queues.c - completion queues (0.3): each consumer reaps only its
 * own queue's completions, under threads, with bytes checked; the
 * default queue (nvio_submit/nvio_reap) sees none of them; a queue's
 * eventfd is readable exactly while its own completions wait; reap's
 * timeout; destroy waits for the queue's ops; the completion's 0.3
 * layout (struct_size, zeroed reserved fields); the nvio_prep_* helpers
 * zero what they do not set; reserved fields refused; the invalid
 * arguments with their exact -errno. Every engine, direct on and off.
 */
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "t.h"

#define BS (64u << 10)
#define NOPS 48			/* per consumer */
#define OPSZ (3 * BS + 512)	/* pieces of several sizes */
#define SEC 1000000000ll

static int64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * SEC + ts.tv_nsec;
}

struct consumer {
	nvio_handle_t *h;
	nvio_queue_t *q;
	nvio_file_t *f;
	unsigned id;		/* user_data = id << 32 | i */
	unsigned char *mem;	/* NOPS * OPSZ */
	int is_write;
	int64_t base;		/* file offset of this consumer's region */
	int got, foreign, bad_res;
	unsigned char seen[NOPS];
};

/* Submits its ops in small batches and reaps only its own queue. */
static void *consume(void *arg)
{
	struct consumer *c = arg;
	nvio_completion_t cs[8];
	int sent = 0;

	while (c->got < NOPS) {
		while (sent < NOPS && sent - c->got < 16) {
			nvio_op_t op;
			unsigned char *m = c->mem + (size_t)sent * OPSZ;
			int64_t off = c->base + (int64_t)sent * OPSZ;
			uint64_t ud = (uint64_t)c->id << 32 | (unsigned)sent;

			if (c->is_write)
				nvio_prep_write(&op, c->f, m, OPSZ, off, ud);
			else
				nvio_prep_read(&op, c->f, m, OPSZ, off, ud);
			if (nvio_queue_submit(c->q, &op, 1) != 1) {
				c->bad_res++;
				return NULL;
			}
			sent++;
		}
		int n = nvio_queue_reap(c->q, cs, 8, 1, 10 * SEC);

		if (n <= 0) {
			c->bad_res++;
			return NULL;
		}
		for (int i = 0; i < n; i++) {
			unsigned who = (unsigned)(cs[i].user_data >> 32);
			unsigned k = (unsigned)cs[i].user_data;

			if (who != c->id || k >= NOPS || c->seen[k]) {
				c->foreign++;
				continue;
			}
			c->seen[k] = 1;
			if (cs[i].res != OPSZ || cs[i].struct_size != sizeof(nvio_completion_t))
				c->bad_res++;
			c->got++;
		}
	}
	return NULL;
}

/* Two consumers on two queues of one handle, one writing, one reading. */
static void isolation(int e, int d)
{
	char path[T_PATH_MAX];
	size_t region = (size_t)NOPS * OPSZ;
	unsigned char *want = t_alloc(2 * region), *got = t_alloc(2 * region);
	struct consumer c[2];
	pthread_t th[2];
	nvio_handle_t *h;
	nvio_completion_t stray;
	nvio_file_t *f;

	t_path(path, "iso-%d-%d", e, d);
	t_fill_random(want, 2 * region, 77);
	/* the reader's half is there before; the writer's is written */
	T_OK(t_write_file(path, want, 2 * region));
	memset(want, 0, region);
	T_OK(t_pwrite_file(path, want, region, 0));
	t_fill_random(want, region, 78);
	if (t_handle(&h, e, d, 2, BS))
		return;
	f = t_open_file(h, path, NVIO_FILE_READ | NVIO_FILE_WRITE);
	for (int i = 0; i < 2 && f; i++) {
		c[i] = (struct consumer){ .h = h, .f = f, .id = 10 + (unsigned)i,
					  .is_write = i == 0,
					  .mem = i == 0 ? want : got,
					  .base = i == 0 ? 0 : (int64_t)region };
		T_OK(nvio_queue_create(h, &c[i].q, 0));
	}
	for (int i = 0; i < 2 && f; i++)
		pthread_create(&th[i], NULL, consume, &c[i]);
	for (int i = 0; i < 2 && f; i++) {
		pthread_join(th[i], NULL);
		T_EQ_INT(c[i].got, NOPS);
		T_EQ_INT(c[i].foreign, 0);
		T_EQ_INT(c[i].bad_res, 0);
	}
	if (f) {
		/* the default queue saw none of them */
		T_EQ_INT(nvio_reap(h, &stray, 1, 0, 0), 0);
		T_EQ_INT(nvio_inflight(h), 0);
		for (int i = 0; i < 2; i++)
			T_EQ_INT(nvio_queue_destroy(c[i].q), 0);
		T_OK(nvio_file_close(f));
		/* writer's bytes in the file; reader's bytes in memory */
		T_OK(t_check_file_random(path, 0, region, 78, 0));
		T_EQ_INT(t_check_random_at(got, region, 77, region), -1);
	}
	nvio_handle_destroy(h);
	free(want);
	free(got);
}

static int readable(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };

	return poll(&p, 1, 0) == 1;
}

/* Each queue's eventfd says only its own completions wait. */
static void eventfds(int e, int d)
{
	char path[T_PATH_MAX];
	unsigned char *buf = t_alloc(BS);
	nvio_queue_t *q1 = NULL, *q2 = NULL;
	nvio_completion_t c;
	nvio_handle_t *h;
	nvio_file_t *f;
	nvio_op_t op;
	int fd1, fd2, fd0;

	t_path(path, "efd-%d-%d", e, d);
	t_fill_random(buf, BS, 5);
	T_OK(t_write_file(path, buf, BS));
	if (t_handle(&h, e, d, 1, BS))
		return;
	f = t_open_file(h, path, NVIO_FILE_READ);
	T_OK(nvio_queue_create(h, &q1, 0));
	T_OK(nvio_queue_create(h, &q2, 0));
	if (f && q1 && q2) {
		fd1 = nvio_queue_fd(q1);
		fd2 = nvio_queue_fd(q2);
		fd0 = nvio_completion_fd(h);
		T_TRUE(fd1 >= 0 && fd2 >= 0 && fd0 >= 0 && fd1 != fd2 && fd1 != fd0);
		T_EQ_INT(nvio_queue_fd(q1), fd1);	/* one per queue */
		T_TRUE(nvio_handle_queue(h) != NULL);
		T_EQ_INT(nvio_queue_fd(nvio_handle_queue(h)), fd0);
		nvio_prep_read(&op, f, buf, BS, 0, 99);
		T_EQ_INT(nvio_queue_submit(q1, &op, 1), 1);
		T_EQ_INT(nvio_queue_inflight(q1), 1);
		T_EQ_INT(nvio_queue_inflight(q2), 0);
		/* wait for it without reaping: q1's fd turns readable */
		for (int i = 0; i < 1000 && !readable(fd1); i++)
			usleep(2000);
		T_TRUE(readable(fd1));
		T_TRUE(!readable(fd2));
		T_TRUE(!readable(fd0));
		T_EQ_INT(nvio_queue_reap(q2, &c, 1, 0, 0), 0);
		T_EQ_INT(nvio_queue_reap(q1, &c, 1, 1, 10 * SEC), 1);
		T_EQ_U64(c.user_data, 99);
		T_EQ_INT(c.res, BS);
		T_TRUE(!readable(fd1));
		T_EQ_INT(nvio_queue_inflight(q1), 0);
	}
	if (f)
		T_OK(nvio_file_close(f));
	T_OK(nvio_queue_destroy(q1));
	T_OK(nvio_queue_destroy(q2));
	nvio_handle_destroy(h);
	free(buf);
}

/* Reap waits as long as asked, and no longer; destroy waits for ops. */
static void timeouts(int e, int d)
{
	char path[T_PATH_MAX];
	unsigned char *buf = t_alloc(8 * BS);
	nvio_completion_t c[8];
	nvio_queue_t *q = NULL;
	nvio_handle_t *h;
	nvio_file_t *f;
	nvio_op_t ops[8];
	int64_t t0;

	t_path(path, "tmo-%d-%d", e, d);
	t_fill_random(buf, 8 * BS, 6);
	T_OK(t_write_file(path, buf, 8 * BS));
	if (t_handle(&h, e, d, 2, BS))
		return;
	f = t_open_file(h, path, NVIO_FILE_READ);
	T_OK(nvio_queue_create(h, &q, 0));
	if (f && q) {
		t0 = now_ns();
		T_EQ_INT(nvio_queue_reap(q, c, 1, 1, 0), 0);		/* never waits */
		T_EQ_INT(nvio_queue_reap(q, c, 1, 1, 50000000), 0);	/* 50 ms */
		t0 = now_ns() - t0;
		T_TRUE(t0 >= 50000000 && t0 < 5 * SEC);
		/* an op of another queue does not end this queue's wait */
		nvio_prep_read(&ops[0], f, buf, BS, 0, 1);
		T_EQ_INT(nvio_submit(h, ops, 1), 1);
		T_EQ_INT(nvio_queue_reap(q, c, 1, 1, 100000000), 0);
		T_EQ_INT(nvio_reap(h, c, 1, 1, 10 * SEC), 1);
		/* min beyond what comes: waits the timeout, returns what came */
		for (int i = 0; i < 4; i++)
			nvio_prep_read(&ops[i], f, buf + (size_t)i * BS, BS, (int64_t)i * BS, 10u + (unsigned)i);
		T_EQ_INT(nvio_queue_submit(q, ops, 4), 4);
		T_EQ_INT(nvio_queue_reap(q, c, 8, 5, 300000000), 4);
		/* destroy with ops in flight waits for them (ASan: no leak,
		 * no use after free) */
		for (int i = 0; i < 8; i++)
			nvio_prep_read(&ops[i], f, buf + (size_t)i * BS, BS, (int64_t)i * BS, 20u + (unsigned)i);
		T_EQ_INT(nvio_queue_submit(q, ops, 8), 8);
		T_OK(nvio_queue_destroy(q));
		q = NULL;
		T_EQ_INT(nvio_inflight(h), 0);
		T_EQ_INT(t_check_random_at(buf, 8 * BS, 6, 0), -1);
	}
	if (f)
		T_OK(nvio_file_close(f));
	nvio_queue_destroy(q);
	nvio_handle_destroy(h);
	free(buf);
}

/* The 0.3 layouts: prep helpers zero the rest; reserved must be 0. */
static void layouts(void)
{
	char path[T_PATH_MAX];
	unsigned char buf[4096];
	nvio_completion_t c;
	nvio_queue_t *q = NULL;
	nvio_handle_t *h;
	nvio_file_t *f;
	nvio_op_t op;
	nvio_iovec_t iov = { buf, sizeof(buf), 0 };

	t_ctx("layouts");
	memset(&op, 0xa5, sizeof(op));
	nvio_prep_write(&op, NULL, buf, 10, 20, 30);
	T_EQ_INT(op.opcode, NVIO_OP_WRITE);
	T_TRUE(op.buf == buf && op.nbytes == 10 && op.offset == 20 && op.user_data == 30);
	T_TRUE(!op.iov && !op.iovcnt && !op.flags && !op.reserved0 && !op.crc32);
	for (int i = 0; i < 3; i++)
		T_EQ_U64(op.reserved[i], 0);
	memset(&op, 0xa5, sizeof(op));
	nvio_prep_readv(&op, NULL, &iov, 1, NVIO_OFFSET_PER_IOV, 7);
	T_TRUE(op.opcode == NVIO_OP_READ && op.iov == &iov && op.iovcnt == 1 &&
	       !op.buf && !op.nbytes && op.offset == NVIO_OFFSET_PER_IOV);
	T_EQ_U64(op.reserved[2], 0);
	T_TRUE(op.crc32 == NULL);

	t_path(path, "layout");
	t_fill_random(buf, sizeof(buf), 8);
	T_OK(t_write_file(path, buf, sizeof(buf)));
	T_OK(nvio_handle_create(&h, NULL));
	f = t_open_file(h, path, NVIO_FILE_READ);
	T_OK(nvio_queue_create(h, &q, 0));
	if (f && q) {
		for (int i = 0; i < 4; i++) {
			nvio_prep_read(&op, f, buf, sizeof(buf), 0, 1);
			if (i < 3)
				op.reserved[i] = 1;
			else
				op.reserved0 = 1;
			T_ERR(nvio_queue_submit(q, &op, 1), -EINVAL);
			T_ERR(nvio_submit(h, &op, 1), -EINVAL);
		}
		nvio_prep_readv(&op, f, &iov, 1, 0, 42);
		T_EQ_INT(nvio_queue_submit(q, &op, 1), 1);
		memset(&c, 0xa5, sizeof(c));
		T_EQ_INT(nvio_queue_reap(q, &c, 1, 1, 10 * SEC), 1);
		T_EQ_U64(c.struct_size, sizeof(nvio_completion_t));
		T_EQ_U64(c.user_data, 42);
		T_EQ_INT(c.res, sizeof(buf));
		for (int i = 0; i < 4; i++)
			T_EQ_U64(c.reserved[i], 0);
		T_EQ_INT(c.err_what[0], 0);
	}
	if (f)
		T_OK(nvio_file_close(f));
	nvio_handle_destroy(h);	/* frees q with it */
}

/* Every invalid argument, with its exact error. */
static void invalid(void)
{
	nvio_handle_t *h, *h2;
	nvio_queue_t *q = NULL, *q2 = NULL, *bad = (nvio_queue_t *)&q;
	nvio_completion_t c;
	nvio_file_t *f2;
	nvio_op_t op;
	char path[T_PATH_MAX];

	t_ctx("invalid arguments");
	T_OK(nvio_handle_create(&h, NULL));
	T_OK(nvio_handle_create(&h2, NULL));
	t_path(path, "inv");
	T_OK(t_write_file(path, "x", 1));
	f2 = t_open_file(h2, path, NVIO_FILE_READ);
	T_ERR(nvio_queue_create(NULL, &q, 0), -EINVAL);
	T_TRUE(q == NULL);
	T_ERR(nvio_queue_create(h, NULL, 0), -EINVAL);
	T_ERR(nvio_queue_create(h, &q, 1), -EINVAL);
	T_TRUE(q == NULL);
	T_OK(nvio_queue_create(h, &q, 0));
	T_OK(nvio_queue_create(h2, &q2, 0));
	T_ERR(nvio_queue_destroy(NULL), -EINVAL);
	T_ERR(nvio_queue_destroy(nvio_handle_queue(h)), -EINVAL);
	T_TRUE(nvio_handle_queue(NULL) == NULL);
	T_ERR(nvio_queue_submit(NULL, &op, 1), -EINVAL);
	T_ERR(nvio_queue_submit(q, NULL, 1), -EINVAL);
	T_EQ_INT(nvio_queue_submit(q, NULL, 0), 0);
	nvio_prep_read(&op, f2, &c, 1, 0, 1);	/* a file of another handle */
	T_ERR(nvio_queue_submit(q, &op, 1), -EINVAL);
	nvio_prep_read(&op, NULL, &c, 1, 0, 1);
	T_ERR(nvio_queue_submit(q, &op, 1), -EINVAL);
	nvio_prep_rw(&op, 3, f2, &c, 1, 0, 1);
	T_ERR(nvio_queue_submit(q2, &op, 1), -EINVAL);
	T_ERR(nvio_queue_reap(NULL, &c, 1, 0, 0), -EINVAL);
	T_ERR(nvio_queue_reap(q, NULL, 1, 0, 0), -EINVAL);
	T_ERR(nvio_queue_reap(q, &c, 1, 2, 0), -EINVAL);
	T_EQ_INT(nvio_queue_reap(q, NULL, 0, 0, 0), 0);
	T_ERR(nvio_queue_fd(NULL), -EINVAL);
	T_EQ_INT(nvio_queue_inflight(NULL), 0);
	T_ERR(nvio_queue_cancel(NULL, 1), -EINVAL);
	T_ERR(nvio_cancel(NULL, 1), -EINVAL);
	T_ERR(nvio_queue_cancel(q, 1), -ENOENT);
	T_ERR(nvio_cancel(h, 1), -ENOENT);
	(void)bad;
	T_OK(nvio_queue_destroy(q));
	if (f2)
		T_OK(nvio_file_close(f2));
	nvio_handle_destroy(h2);	/* q2 left for the handle to free */
	nvio_handle_destroy(h);
}

int main(void)
{
	t_init("test_queues");
	layouts();
	invalid();
	T_FOR_EACH_COMBO(e, d) {
		isolation(e, d);
		eventfds(e, d);
		timeouts(e, d);
	}
	return t_done();
}
