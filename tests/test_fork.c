/*
 * test_fork.c - a handle belongs to the process that made it.
 *
 * A forked child inherits a copy of the handle with no worker threads
 * behind it and frozen locks: every call there fails with -ECHILD, and
 * closing the file, the stream and the handle returns at once (no hang,
 * nothing of the parent's removed), also with the parent's ops in flight
 * at the fork. The parent's handle goes on working. On every engine,
 * direct on and off. The child reports through its exit status; alarm()
 * in the child and a bounded wait in the parent turn a hang into a
 * failure.
 */
#include <dirent.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "t.h"

#define N (1u << 20)

/* Exit codes of the child: 0 all as expected, else the failed step. */
static int child(nvio_handle_t *h, nvio_file_t *f, nvio_file_t *tmp,
		 nvio_stream_t *s, unsigned char *buf, const char *path)
{
	nvio_completion_t c;

	alarm(20);
	if (nvio_pread(h, buf, 4096, path, 0, 0) != -ECHILD)
		return 2;
	if (nvio_file_pread(f, buf, 4096, 0, 0) != -ECHILD)
		return 3;
	if (nvio_wait(h) != -ECHILD)
		return 4;
	if (nvio_reap(h, &c, 1, 0, 0) != -ECHILD)
		return 5;
	if (nvio_file_open(h, path, NVIO_FILE_READ, NULL) != NULL)
		return 6;
	if (nvio_stream_write(s, buf, 10) != -ECHILD)
		return 7;
	nvio_stream_close(s, NVIO_STREAM_COMMIT);
	nvio_file_close(tmp);	/* must not remove the parent's temporary */
	nvio_file_close(f);
	nvio_handle_destroy(h);
	return 0;
}

/* Names in dir starting with prefix. */
static int count_names(const char *dir, const char *prefix)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int n = 0;

	while (d && (e = readdir(d)))
		n += !strncmp(e->d_name, prefix, strlen(prefix));
	if (d)
		closedir(d);
	return n;
}

static void one(int engine, int direct, unsigned char *buf, unsigned char *back)
{
	char path[T_PATH_MAX], apath[T_PATH_MAX], dir[T_PATH_MAX], *slash;
	nvio_handle_t *h;
	nvio_file_t *f, *tmp;
	nvio_stream_t *s;
	nvio_op_t op;
	nvio_completion_t c;
	int status = -1, err, names;
	pid_t pid;

	if (t_handle(&h, engine, direct, 2, 0))
		return;
	t_path(path, "data");
	t_path(apath, "atomic");
	snprintf(dir, sizeof(dir), "%s", path);
	slash = strrchr(dir, '/');
	*slash = 0;
	t_fill_random(buf, N, 7);
	T_OK(t_write_file(path, buf, N));
	f = nvio_file_open(h, path, NVIO_FILE_READ | NVIO_FILE_WRITE, &err);
	tmp = nvio_file_open(h, apath, NVIO_FILE_ATOMIC, &err);
	s = tmp ? nvio_stream_open(tmp, NVIO_STREAM_WRITE, 0, 0, 0, &err) : NULL;
	if (!T_TRUE(f && tmp && s))
		goto out;
	/* an op in flight at the fork */
	memset(&op, 0, sizeof(op));
	op.opcode = NVIO_OP_READ;
	op.file = f;
	op.buf = back;
	op.nbytes = N;
	op.user_data = 42;
	T_EQ_INT(nvio_submit(h, &op, 1), 1);
	names = count_names(dir, ".atomic");
	pid = fork();
	if (pid == 0)
		_exit(child(h, f, tmp, s, buf, path));
	if (!T_TRUE(pid > 0))
		goto out;
	for (int i = 0; i < 3000; i++) {	/* up to 30 s */
		if (waitpid(pid, &status, WNOHANG) == pid)
			break;
		struct timespec ts = { 0, 10 * 1000 * 1000 };

		nanosleep(&ts, NULL);
	}
	if (!T_TRUE(WIFEXITED(status))) {
		kill(pid, SIGKILL);
		waitpid(pid, &status, 0);
	} else {
		T_EQ_INT(WEXITSTATUS(status), 0);
	}
	/* the parent's op, handle, file, stream and temporary are intact */
	if (T_EQ_INT(nvio_reap(h, &c, 1, 1, -1), 1)) {
		T_EQ_U64(c.user_data, 42);
		T_EQ_INT(c.res, N);
		T_MEM_EQ(back, buf, N);
	}
	T_EQ_INT(count_names(dir, ".atomic"), names);
	T_EQ_INT(nvio_stream_write(s, buf, N), N);
	T_OK(nvio_stream_close(s, NVIO_STREAM_COMMIT));
	s = NULL;
	memset(back, 0, N);
	if (T_OK(t_pread_file(apath, back, N, 0)))
		T_MEM_EQ(back, buf, N);
	T_OK(nvio_pread(h, back, 4096, path, 4096, 0));
out:
	nvio_stream_close(s, 0);
	nvio_file_close(tmp);
	nvio_file_close(f);
	nvio_handle_destroy(h);
}

int main(void)
{
	unsigned char *buf, *back;

	t_init("fork");
	buf = t_alloc(N);
	back = t_alloc(N);
	T_FOR_EACH_COMBO(e, d) {
		one(e, d, buf, back);
	}
	free(buf);
	free(back);
	return t_done();
}
