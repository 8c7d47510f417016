/*
 * test_validate.c - NVIO_VALIDATE: good writes and reads pass on every
 * engine, direct on and off; a corrupted re-read (nvio__sys.pread flips
 * a byte of the first read of one of our files) gives -EBADMSG, sync and
 * async, and the handle keeps working.
 *
 * The corruption hits the first pread call only: for io_uring and libaio
 * that is the validation re-read; for psync it is the read itself (a
 * pread) or the re-read (a pwrite). Either way buffer and file differ.
 * Ranges are block aligned so that no read-modify-write pread comes
 * first.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "t.h"
#include "sys.h"

#define N (1u << 20)
#define OFF 8192

static struct nvio__sys real;
static atomic_int calls, flipped;

static ssize_t h_flip(int fd, void *buf, size_t n, off_t off)
{
	ssize_t r = real.pread(fd, buf, n, off);

	if (r > 0 && t_fd_is_ours(fd) && atomic_fetch_add(&calls, 1) == 0) {
		((unsigned char *)buf)[r / 2] ^= 0x10;
		atomic_fetch_add(&flipped, 1);
	}
	return r;
}

static void corrupt(int on)
{
	nvio__sys_reset();
	atomic_store(&calls, 0);
	atomic_store(&flipped, 0);
	if (on)
		nvio__sys.pread = h_flip;
}

static int finish(nvio_handle_t *h, int r, unsigned fl)
{
	if ((fl & NVIO_ASYNC) && r == 0) {
		r = nvio_wait(h);
		if (r == 1)
			r = 0;
	}
	return r;
}

static void cases(nvio_handle_t *h, const char *combo, unsigned char *b,
		  unsigned char *c)
{
	static const struct { uint64_t n; int64_t off; int mis; } good[] = {
		{ N, OFF, 0 }, { N + 1, 1, 1 }, { 4095, 513, 1 }, { 0, 0, 0 },
		{ 3 * N + 7, 4096, 0 },
	};
	char path[T_PATH_MAX];
	uint64_t s = 77;

	t_path(path, "v");
	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
		for (int a = 0; a < 2; a++) {
			unsigned fl = NVIO_VALIDATE | (a ? NVIO_ASYNC : 0);
			uint64_t n = good[i].n;

			t_ctx("%s validate good n %llu off %lld%s", combo,
			      (unsigned long long)n, (long long)good[i].off,
			      a ? " async" : "");
			t_fill_random(b + good[i].mis, n, ++s);
			T_OK(finish(h, nvio_pwrite(h, b + good[i].mis, n, path,
						   good[i].off, fl), fl));
			T_EQ_INT(t_check_file_random(path, good[i].off, n, s,
						     0), 0);
			memset(c, 0, n + 1);
			T_OK(finish(h, nvio_pread(h, c + 1 - good[i].mis, n,
						  path, good[i].off, fl), fl));
			T_MEM_EQ(c + 1 - good[i].mis, b + good[i].mis, n);
		}

	for (int a = 0; a < 2; a++) {
		unsigned fl = NVIO_VALIDATE | (a ? NVIO_ASYNC : 0);
		nvio_error_t e = { .struct_size = sizeof(e) };

		t_ctx("%s corrupted re-read after pwrite%s", combo,
		      a ? " async" : "");
		t_fill_random(b, N, ++s);
		corrupt(1);
		T_ERR(finish(h, nvio_pwrite(h, b, N, path, OFF, fl), fl),
		      -EBADMSG);
		T_EQ_INT(atomic_load(&flipped), 1);
		corrupt(0);
		memset(&e, 0, sizeof(e));
		e.struct_size = sizeof(e);
		T_ERR(nvio_last_error(h, &e), -EBADMSG);
		T_EQ_INT(e.is_write, 1);
		T_TRUE(strstr(e.path, path) != NULL);
		/* the write itself was fine */
		T_EQ_INT(t_check_file_random(path, OFF, N, s, 0), 0);
		T_ERR(nvio_wait(h), 0);

		t_ctx("%s corrupted read with validate%s", combo,
		      a ? " async" : "");
		corrupt(1);
		T_ERR(finish(h, nvio_pread(h, c, N, path, OFF, fl), fl),
		      -EBADMSG);
		T_EQ_INT(atomic_load(&flipped), 1);
		corrupt(0);
		memset(&e, 0, sizeof(e));
		e.struct_size = sizeof(e);
		T_ERR(nvio_last_error(h, &e), -EBADMSG);
		T_EQ_INT(e.is_write, 0);
		T_ERR(nvio_wait(h), 0);

		/* Without VALIDATE the same corruption goes unnoticed on
		 * io_uring/libaio (no pread at all): proves the hook is
		 * what validation reads through. */
		t_ctx("%s still works%s", combo, a ? " async" : "");
		T_OK(finish(h, nvio_pread(h, c, N, path, OFF, fl), fl));
		T_MEM_EQ(c, b, N);
	}
	unlink(path);
}

int main(void)
{
	unsigned char *b, *c;

	t_init("validate");
	nvio__sys_reset();
	real = nvio__sys;
	b = t_alloc(3 * N + 8);
	c = t_alloc(3 * N + 8);
	T_FOR_EACH_COMBO(e, d) {
		nvio_handle_t *h;

		t_ctx("%s create", t_combo());
		if (t_handle(&h, e, d, 2, 256u << 10))
			continue;
		cases(h, t_combo(), b, c);
		nvio_handle_destroy(h);
	}
	free(b);
	free(c);
	return t_done();
}
