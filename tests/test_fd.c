/*
 * test_fd.c - nvio_pread_fd / nvio_pwrite_fd on the caller's descriptor:
 * O_RDWR and O_RDONLY descriptors, one opened with O_DIRECT by the caller
 * (unaligned ranges still work), and the descriptor is left as it was:
 * open, same file position, same status flags.
 */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "t.h"

#define SZ (3u << 20)

static uint64_t seed = 300;

struct fd_state {
	off_t pos;
	int fl;
	int fdfl;
};

static struct fd_state fd_state(int fd)
{
	struct fd_state s;

	s.pos = lseek(fd, 0, SEEK_CUR);
	s.fl = fcntl(fd, F_GETFL);
	s.fdfl = fcntl(fd, F_GETFD);
	return s;
}

static void check_fd(int fd, struct fd_state before)
{
	struct fd_state now = fd_state(fd);

	T_TRUE(fcntl(fd, F_GETFD) != -1);	/* still open */
	T_EQ_INT(now.pos, before.pos);
	T_EQ_INT(now.fl, before.fl);
	T_EQ_INT(now.fdfl, before.fdfl);
}

static void ranges(nvio_handle_t *h, const char *path, int wfd, int rfd,
		   const char *what)
{
	static const struct { uint64_t n; int64_t off; } rs[] = {
		{ 0, 0 }, { 1, 0 }, { 4096, 4096 }, { 4097, 1 },
		{ 100000, 12345 }, { 1u << 20, 4096 }, { (1u << 20) + 3, 511 },
		{ 2u << 20, 0 },
	};
	unsigned char *b = t_alloc(SZ + 1), *c = t_alloc(SZ + 1);
	unsigned char *file = t_alloc(SZ), *chk = t_alloc(SZ);
	size_t sz;

	for (size_t i = 0; i < sizeof(rs) / sizeof(rs[0]); i++) {
		uint64_t n = rs[i].n, s = seed++;
		int64_t off = rs[i].off;
		int mis = (int)(i & 1);
		struct fd_state st;

		t_ctx("%s n %llu off %lld", what, (unsigned long long)n,
		      (long long)off);
		t_fill_random(file, SZ, s + 1000);
		if (t_write_file(path, file, SZ))
			break;
		/* The caller's position is somewhere odd. */
		if (wfd >= 0)
			lseek(wfd, 777, SEEK_SET);
		lseek(rfd, 333, SEEK_SET);
		if (wfd >= 0) {
			st = fd_state(wfd);
			t_fill_random(b + mis, n, s);
			T_OK(nvio_pwrite_fd(h, b + mis, n, wfd, off, 0));
			check_fd(wfd, st);
			memcpy(file + off, b + mis, n);
			if (T_OK(t_read_file(path, chk, SZ, &sz)) &&
			    T_EQ_U64(sz, SZ))
				T_MEM_EQ(chk, file, SZ);
			/* async too */
			t_fill_random(b + mis, n, s + 5);
			if (T_OK(nvio_pwrite_fd(h, b + mis, n, wfd, off,
						NVIO_ASYNC)))
				T_EQ_INT(nvio_wait(h), 1);
			check_fd(wfd, st);
			memcpy(file + off, b + mis, n);
			if (T_OK(t_read_file(path, chk, SZ, &sz)))
				T_MEM_EQ(chk, file, SZ);
		}
		st = fd_state(rfd);
		memset(c, 0, n + 1);
		T_OK(nvio_pread_fd(h, c + 1 - mis, n, rfd, off, 0));
		T_MEM_EQ(c + 1 - mis, file + off, n);
		check_fd(rfd, st);
		memset(c, 0, n + 1);
		if (T_OK(nvio_pread_fd(h, c, n, rfd, off, NVIO_ASYNC)))
			T_EQ_INT(nvio_wait(h), 1);
		T_MEM_EQ(c, file + off, n);
		check_fd(rfd, st);
		/* Past the end of the file, through the fd. */
		T_ERR(nvio_pread_fd(h, c, 2, rfd, SZ - 1, 0), -ENODATA);
		check_fd(rfd, st);
	}
	free(b);
	free(c);
	free(file);
	free(chk);
}

int main(void)
{
	char path[T_PATH_MAX];

	t_init("fd");
	t_path(path, "f");
	T_FOR_EACH_COMBO(e, d) {
		nvio_handle_t *h;
		char what[96];
		int rw, ro, dio;

		t_ctx("%s create", t_combo());
		if (t_handle(&h, e, d, 2, 65536))
			continue;
		if (!T_OK(t_write_file(path, "x", 1))) {
			nvio_handle_destroy(h);
			continue;
		}
		rw = open(path, O_RDWR | O_CLOEXEC);
		ro = open(path, O_RDONLY | O_CLOEXEC);
		snprintf(what, sizeof(what), "%s O_RDWR + O_RDONLY",
			 t_combo());
		if (rw >= 0 && ro >= 0)
			ranges(h, path, rw, ro, what);
		snprintf(what, sizeof(what), "%s O_RDWR both",
			 t_combo());
		if (rw >= 0)
			ranges(h, path, rw, rw, what);
		close(rw);
		close(ro);

		/* The caller opened with O_DIRECT itself. */
		dio = open(path, O_RDWR | O_DIRECT | O_CLOEXEC);
		snprintf(what, sizeof(what), "%s caller O_DIRECT",
			 t_combo());
		if (dio >= 0)
			ranges(h, path, dio, dio, what);
		else
			t_note("caller O_DIRECT open: %s", strerror(errno));
		close(dio);

		/* Read-only O_DIRECT descriptor for reads. */
		dio = open(path, O_RDONLY | O_DIRECT | O_CLOEXEC);
		snprintf(what, sizeof(what), "%s caller O_DIRECT ro",
			 t_combo());
		if (dio >= 0)
			ranges(h, path, -1, dio, what);
		close(dio);
		nvio_handle_destroy(h);
	}
	return t_done();
}
