/*
 * test_vector_short.c - vectored requests.
 *
 * A vector of page-aligned buffers laid end to end moves as vectored
 * requests (preadv/pwritev, IORING_OP_READV/WRITEV, io_prep_preadv),
 * straight from its memory, without bounce copies; one with a part
 * O_DIRECT cannot take is gathered instead. The kernel may cut a
 * vectored request short: here every request's first completion is cut
 * to half (at a 4 KiB boundary) through the syscall table, and the rest
 * must be finished part by part. Bytes are checked with libc; on every
 * engine, direct on and off.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "t.h"
#include "sys.h"

#define NPARTS 96
#define PART (12u << 10)	/* 12 KiB: a 1 MiB request spans ~86 parts */
#define TOTAL ((uint64_t)NPARTS * PART)

static atomic_int cut;		/* cut the next completions short */
static atomic_int vectored;	/* preadv/pwritev calls seen (psync) */

static ssize_t half(int is_write, int fd, uint64_t off, size_t n, ssize_t res)
{
	if (atomic_load(&cut) && res == (ssize_t)n && n >= 8192)
		return (ssize_t)(n / 2 / 4096 * 4096);
	return res;
}

static ssize_t count_preadv(int fd, const struct iovec *v, int n, off_t off)
{
	atomic_fetch_add(&vectored, 1);
	return preadv(fd, v, n, off);
}

static ssize_t count_pwritev(int fd, const struct iovec *v, int n, off_t off)
{
	atomic_fetch_add(&vectored, 1);
	return pwritev(fd, v, n, off);
}

static void one(int engine, int direct, unsigned char *arena, unsigned char *want,
		unsigned char *back)
{
	nvio_iovec_t iov[NPARTS];
	char path[T_PATH_MAX];
	nvio_handle_t *h;
	nvio_file_t *f;
	int err;

	if (t_handle(&h, engine, direct, 2, 0))
		return;
	t_path(path, "vec");
	for (int i = 0; i < NPARTS; i++)
		iov[i] = (nvio_iovec_t){ arena + (size_t)i * PART, PART, 0 };
	for (int c = 0; c < 2; c++) {
		t_ctx("%s %s", t_combo(), c ? "cut short" : "whole");
		f = nvio_file_open(h, path, NVIO_FILE_READ | NVIO_FILE_WRITE |
				   NVIO_FILE_CREATE | NVIO_FILE_TRUNC, &err);
		if (!T_TRUE(f != NULL))
			continue;
		t_fill_random(want, TOTAL, 40 + c);
		memcpy(arena, want, TOTAL);
		atomic_store(&vectored, 0);
		atomic_store(&cut, c);
		T_OK(nvio_file_pwritev(f, iov, NPARTS, 0, 0));
		atomic_store(&cut, 0);
		memset(back, 0, TOTAL);
		T_OK(t_pread_file(path, back, TOTAL, 0));
		T_MEM_EQ(back, want, TOTAL);
		memset(arena, 0, TOTAL);
		atomic_store(&cut, c);
		T_OK(nvio_file_preadv(f, iov, NPARTS, 0, 0));
		atomic_store(&cut, 0);
		T_MEM_EQ(arena, want, TOTAL);
		if (engine == NVIO_ENGINE_PSYNC)	/* straight, not gathered */
			T_TRUE(atomic_load(&vectored) > 0);
		T_OK(nvio_file_close(f));
	}
	nvio_handle_destroy(h);
}

int main(void)
{
	unsigned char *arena, *want, *back;

	t_init("vector_short");
	if (nvio_mem_alloc((void **)&arena, TOTAL, 0, NULL)) {
		T_FAILF("nvio_mem_alloc");
		return t_done();
	}
	want = t_alloc(TOTAL);
	back = t_alloc(TOTAL);
	nvio__sys.io_result = half;
	nvio__sys.preadv = count_preadv;
	nvio__sys.pwritev = count_pwritev;
	T_FOR_EACH_COMBO(e, d) {
		one(e, d, arena, want, back);
	}
	nvio__sys_reset();
	nvio_mem_free(arena);
	free(want);
	free(back);
	return t_done();
}
