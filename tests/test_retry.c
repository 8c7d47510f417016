/*
 * test_retry.c - a device that answers -EAGAIN forever. Whatever nvio
 * retries, it must give up and report -EAGAIN: a sync single-piece op, a
 * multi-piece async op, a tagged op and a stream write each end with
 * -EAGAIN after a bounded number of attempts, and none hangs (an alarm
 * fails the test if one does). Every engine, direct on and off.
 */
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "t.h"
#include "sys.h"

#define BS (64u << 10)
#define N (1u << 20)		/* the multi-piece op: 16 blocks */
#define WATCHDOG_S 120
#define MAX_ATTEMPTS 100000	/* per case: more is retrying forever */

static atomic_long attempts;
static unsigned char *buf;

static ssize_t always_eagain(int is_write, int fd, uint64_t off, size_t n,
			     ssize_t res)
{
	atomic_fetch_add(&attempts, 1);
	return -EAGAIN;
}

static void watchdog(int sig)
{
	static const char msg[] = "FAIL test_retry: an op retried -EAGAIN "
				  "for over 120 s (hang)\n";

	(void)sig;
	if (write(2, msg, sizeof(msg) - 1) < 0)
		_exit(T_FAIL);
	_exit(T_FAIL);
}

static void arm(void)
{
	atomic_store(&attempts, 0);
	nvio__sys.io_result = always_eagain;
}

static void disarm(const char *what)
{
	long n = atomic_load(&attempts);

	nvio__sys_reset();
	T_TRUE(n > 0);	/* the hook was reached: the case is real */
	if (n > MAX_ATTEMPTS)
		T_FAILF("%s: %ld attempts", what, n);
	if (t_quick() == 0)
		t_note("%s %s: %ld attempts", t_combo(), what, n);
}

static void cases(nvio_handle_t *h, const char *path)
{
	nvio_completion_t c;
	nvio_stream_t *s;
	nvio_file_t *f;
	nvio_op_t op;
	int err = 0, r;

	t_fill_random(buf, N, 3);
	if (!T_OK(t_write_file(path, buf, N)))
		return;

	t_ctx("%s sync single piece", t_combo());
	arm();
	T_ERR(nvio_pwrite(h, buf, 4096, path, 0, 0), -EAGAIN);
	T_ERR(nvio_pread(h, buf + 1, 100, path, 7, 0), -EAGAIN);
	disarm("sync single piece");

	t_ctx("%s async, many pieces", t_combo());
	arm();
	r = nvio_pwrite(h, buf, N, path, 0, NVIO_ASYNC);
	if (T_OK(r))
		T_ERR(nvio_wait(h), -EAGAIN);
	r = nvio_pread(h, buf + 1, N - 1, path, 1, NVIO_ASYNC);
	if (T_OK(r))
		T_ERR(nvio_wait(h), -EAGAIN);
	disarm("async, many pieces");

	f = t_open_file(h, path, NVIO_FILE_READ | NVIO_FILE_WRITE);
	if (!f)
		return;
	t_ctx("%s tagged op", t_combo());
	memset(&op, 0, sizeof(op));
	op.opcode = NVIO_OP_READ;
	op.file = f;
	op.buf = buf;
	op.nbytes = 3 * BS + 5;
	op.offset = 11;
	op.user_data = 42;
	arm();
	if (T_EQ_INT(nvio_submit(h, &op, 1), 1) &&
	    T_EQ_INT(nvio_reap(h, &c, 1, 1, -1), 1)) {
		T_EQ_U64(c.user_data, 42);
		T_ERR(c.res, -EAGAIN);
	}
	disarm("tagged op");

	t_ctx("%s stream write", t_combo());
	s = nvio_stream_open(f, NVIO_STREAM_WRITE, 0, BS, 2, &err);
	if (T_TRUE(s != NULL)) {
		int64_t w = 0;

		arm();
		for (int i = 0; i < 8 && w >= 0; i++)
			w = nvio_stream_write(s, buf, BS + 1);
		if (w >= 0)
			w = nvio_stream_flush(s);
		T_ERR(w, -EAGAIN);
		T_ERR(nvio_stream_close(s, 0), -EAGAIN);
		disarm("stream write");
	} else {
		T_FAILF("nvio_stream_open: %s", t_errname(err));
	}
	nvio_file_close(f);
}

int main(void)
{
	char path[T_PATH_MAX];

	t_init("retry");
	signal(SIGALRM, watchdog);
	buf = t_alloc(N + 1);
	t_path(path, "r");
	T_FOR_EACH_COMBO(e, d) {
		nvio_handle_t *h;

		if (t_handle(&h, e, d, 2, BS))
			continue;
		alarm(WATCHDOG_S);	/* destroy too must not hang */
		cases(h, path);
		nvio_handle_destroy(h);
		alarm(0);
		unlink(path);
	}
	free(buf);
	return t_done();
}
