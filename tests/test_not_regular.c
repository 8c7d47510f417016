/*
 * test_not_regular.c - opening by path something that is not a regular
 * file never blocks and says what it is. A FIFO (no writer, or no
 * reader) and a socket are refused with -EINVAL for every open mode and
 * by the one-buffer calls, the error naming the path and the kind; a
 * character device is refused for reading (it has no size) and still
 * opens for writing (/dev/full as a sink); the FIFO is left as it was. A
 * regular file opened by path has O_NONBLOCK cleared again (the check
 * opens with it). An alarm turns a hang into a failure. Every engine,
 * direct I/O on and off.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "t.h"

static char fifo[T_PATH_MAX], sock[T_PATH_MAX], reg[T_PATH_MAX];

static void on_alarm(int sig)
{
	static const char msg[] = "FAIL: an open of a FIFO blocked\n";

	(void)sig;
	(void)!write(2, msg, sizeof(msg) - 1);
	_exit(1);
}

/* The handle's last error is err on path, its step naming kind. */
static void check_error(nvio_handle_t *h, int err, const char *path, const char *kind)
{
	nvio_error_t e;

	memset(&e, 0, sizeof(e));
	e.struct_size = sizeof(e);
	T_ERR(nvio_last_error(h, &e), err);
	T_TRUE(strcmp(e.path, path) == 0);
	if (!T_TRUE(strstr(e.what, kind) != NULL))
		t_note("what: %s", e.what);
}

static void refused(nvio_handle_t *h, const char *path, const char *kind)
{
	static const unsigned modes[] = {
		NVIO_FILE_READ, NVIO_FILE_WRITE, NVIO_FILE_READ | NVIO_FILE_WRITE,
		NVIO_FILE_WRITE | NVIO_FILE_CREATE,
	};
	char buf[100];
	uint64_t size = 0;
	int err;

	for (size_t i = 0; i < sizeof(modes) / sizeof(modes[0]); i++) {
		t_ctx("%s %s, flags %#x", t_combo(), kind, modes[i]);
		err = 0;
		T_TRUE(nvio_file_open(h, path, modes[i], &err) == NULL);
		T_ERR(err, -EINVAL);
		check_error(h, -EINVAL, path, kind);
	}
	t_ctx("%s %s, one-buffer calls", t_combo(), kind);
	T_ERR(nvio_read_file(h, buf, sizeof(buf), path, &size, 0), -EINVAL);
	check_error(h, -EINVAL, path, kind);
	T_ERR(nvio_pread(h, buf, sizeof(buf), path, 0, 0), -EINVAL);
	check_error(h, -EINVAL, path, kind);
	T_ERR(nvio_pwrite(h, buf, sizeof(buf), path, 0, 0), -EINVAL);
	check_error(h, -EINVAL, path, kind);
}

static void one(nvio_handle_t *h)
{
	struct stat st;
	nvio_file_info_t info;
	nvio_file_t *f;
	int err = 0, fd;

	refused(h, fifo, "FIFO");
	T_TRUE(lstat(fifo, &st) == 0 && S_ISFIFO(st.st_mode));

	t_ctx("%s FIFO with a writer", t_combo());
	fd = open(fifo, O_RDWR);	/* both ends held: opens never wait */
	if (T_TRUE(fd >= 0)) {
		T_TRUE(nvio_file_open(h, fifo, NVIO_FILE_READ, &err) == NULL);
		T_ERR(err, -EINVAL);
		T_TRUE(nvio_file_open(h, fifo, NVIO_FILE_WRITE, &err) == NULL);
		T_ERR(err, -EINVAL);
		close(fd);
	}
	refused(h, sock, "socket");

	t_ctx("%s character device", t_combo());
	T_TRUE(nvio_file_open(h, "/dev/null", NVIO_FILE_READ, &err) == NULL);
	T_ERR(err, -EINVAL);
	check_error(h, -EINVAL, "/dev/null", "char device");
	f = nvio_file_open(h, "/dev/null", NVIO_FILE_WRITE, &err);
	if (T_TRUE(f != NULL))
		T_OK(nvio_file_close(f));

	t_ctx("%s regular file: blocking descriptor", t_combo());
	f = nvio_file_open(h, reg, NVIO_FILE_READ, &err);
	if (T_TRUE(f != NULL)) {
		info.struct_size = sizeof(info);
		if (T_OK(nvio_file_info(f, &info)))
			T_EQ_INT(fcntl(info.fd, F_GETFL) & O_NONBLOCK, 0);
		T_OK(nvio_file_close(f));
	}
}

int main(void)
{
	struct sockaddr_un a;
	int s;

	t_init("not_regular");
	signal(SIGALRM, on_alarm);
	alarm(T_SANITIZED ? 120 : 60);
	t_path(fifo, "fifo");
	t_path(sock, "sock");
	t_path(reg, "reg");
	T_OK(mkfifo(fifo, 0644) < 0 ? -errno : 0);
	T_OK(t_write_file(reg, "regular", 7));
	s = socket(AF_UNIX, SOCK_STREAM, 0);
	memset(&a, 0, sizeof(a));
	a.sun_family = AF_UNIX;
	if (strlen(sock) >= sizeof(a.sun_path))
		t_skip("socket path too long: %s", sock);
	memcpy(a.sun_path, sock, strlen(sock) + 1);
	T_OK(s >= 0 && bind(s, (struct sockaddr *)&a, sizeof(a)) == 0 ? 0 : -errno);
	T_FOR_EACH_COMBO(e, d) {
		nvio_handle_t *h;

		if (t_handle(&h, e, d, 2, 0))
			continue;
		one(h);
		nvio_handle_destroy(h);
	}
	close(s);
	return t_done();
}
