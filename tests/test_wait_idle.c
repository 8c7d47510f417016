/*
 * test_wait_idle.c - nvio_wait_idle() waits for running async ops without
 * reporting them. An op held inside the engine (the io_result hook blocks
 * until released) keeps it answering -ETIMEDOUT, immediately and after a
 * timeout, while nvio_pending() still counts the op; once released it
 * returns 0, and the nvio_wait() after it reports the op, whose bytes are
 * in the file. Every engine, direct on and off.
 */
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "t.h"
#include "sys.h"

#define BS (64u << 10)
#define N (1u << 20)

static atomic_int open_gate;
static atomic_long held;

static ssize_t hold(int is_write, int fd, uint64_t off, size_t n, ssize_t res)
{
	atomic_fetch_add(&held, 1);
	while (!atomic_load(&open_gate))
		usleep(1000);
	return res;
}

static void watchdog(int sig)
{
	static const char msg[] = "FAIL test_wait_idle: hang\n";

	(void)sig;
	if (write(2, msg, sizeof(msg) - 1) < 0)
		_exit(T_FAIL);
	_exit(T_FAIL);
}

static void cases(nvio_handle_t *h, const char *path, unsigned char *buf)
{
	t_ctx("%s idle handle", t_combo());
	T_EQ_INT(nvio_wait_idle(h, 0), 0);
	T_EQ_INT(nvio_wait_idle(h, 1000000), 0);

	t_ctx("%s op held in the engine", t_combo());
	t_fill_random(buf, N, 9);
	atomic_store(&open_gate, 0);
	atomic_store(&held, 0);
	nvio__sys.io_result = hold;
	if (!T_OK(nvio_pwrite(h, buf, N, path, 0, NVIO_ASYNC))) {
		atomic_store(&open_gate, 1);
		nvio__sys_reset();
		return;
	}
	T_ERR(nvio_wait_idle(h, 0), -ETIMEDOUT);
	T_ERR(nvio_wait_idle(h, 20 * 1000000), -ETIMEDOUT);
	T_EQ_INT(nvio_pending(h), 1);
	atomic_store(&open_gate, 1);
	T_EQ_INT(nvio_wait_idle(h, -1), 0);
	nvio__sys_reset();
	T_TRUE(atomic_load(&held) > 0);	/* the hook held the op: the case is real */
	T_EQ_INT(nvio_pending(h), 1);	/* nothing reported yet */
	T_EQ_INT(nvio_wait(h), 1);
	T_EQ_INT(nvio_pending(h), 0);
	T_OK(t_check_file_random(path, 0, N, 9, 0));
}

int main(void)
{
	char path[T_PATH_MAX];
	unsigned char *buf;

	t_init("wait_idle");
	signal(SIGALRM, watchdog);
	buf = t_alloc(N);
	t_path(path, "w");
	T_ERR(nvio_wait_idle(NULL, 0), -EINVAL);
	T_FOR_EACH_COMBO(e, d) {
		nvio_handle_t *h;

		if (t_handle(&h, e, d, 2, BS))
			continue;
		alarm(120);
		cases(h, path, buf);
		nvio_handle_destroy(h);
		alarm(0);
		unlink(path);
	}
	free(buf);
	return t_done();
}
