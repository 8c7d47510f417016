/*
 * test_stream_attack.c - writer streams over the caller's memory with
 * NVIO_STREAM_RANGES (libnvio 0.3), used as a careless caller would.
 *
 * overlap: a writer of ranges writes a range, seeks back and writes it
 * again (a header rewritten, a retried share). Its two buffers' ops were
 * both in flight at once over the same bytes, so whichever the engine
 * ran last won: the file could keep the OLD bytes. A seek that goes
 * back over a range still in flight must wait for it. To make the order
 * certain, the psync engine's pwrite (through the sys table) holds the
 * first write at offset 0 until a second one there ran (a watchdog of a
 * second lets it go when the library rightly never sends the
 * second meanwhile: a guard, not a timing the test asserts); the other
 * engines run the same sequence unforced. Every engine, direct on/off;
 * bytes compared with libc.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "t.h"
#include "sys.h"

#define B (64u << 10)	/* each of the stream's two buffers */

static unsigned char *mem, *one, *two, *back;
static ssize_t (*real_pwrite)(int, const void *, size_t, off_t);
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int at_zero;	/* writes at offset 0 begun */
static int second_done;

static ssize_t held_pwrite(int fd, const void *buf, size_t n, off_t off)
{
	ssize_t w;
	int me;

	if (off != 0)
		return real_pwrite(fd, buf, n, off);
	pthread_mutex_lock(&mu);
	me = at_zero++;
	if (me == 0) {
		struct timespec until;

		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_sec += 1;
		while (!second_done &&
		       pthread_cond_timedwait(&cv, &mu, &until) != ETIMEDOUT)
			;
	}
	pthread_mutex_unlock(&mu);
	w = real_pwrite(fd, buf, n, off);
	if (me == 1) {
		pthread_mutex_lock(&mu);
		second_done = 1;
		pthread_cond_broadcast(&cv);
		pthread_mutex_unlock(&mu);
	}
	return w;
}

static void overlap(int e, int d, int i, int big)
{
	char path[T_PATH_MAX];
	nvio_handle_t *h;
	nvio_file_t *f;
	nvio_stream_t *s;
	nvio_stream_config_t c = {
		.struct_size = sizeof(c), .flags = NVIO_STREAM_WRITE | NVIO_STREAM_RANGES,
		.buffer_bytes = 2 * B, .depth = 2,
	};
	int err;

	if (t_handle(&h, e, d, 4, 0))
		return;
	t_path(path, "overlap%d-%d", i, big);
	f = nvio_file_open(h, path, NVIO_FILE_WRITE | NVIO_FILE_CREATE, &err);
	T_TRUE(f != NULL);
	if (!f) {
		nvio_handle_destroy(h);
		return;
	}
	T_OK(nvio_file_truncate(f, B));
	c.memory = mem;
	at_zero = second_done = 0;
	if (e == NVIO_ENGINE_PSYNC && big)	/* the forced order */
		nvio__sys.pwrite = held_pwrite;
	s = nvio_stream_open_config(f, &c, &err);
	T_TRUE(s != NULL);
	if (s) {
		/* halves: staged in the caller's memory, not written straight */
		T_EQ_INT(nvio_stream_write(s, one, B / 2), B / 2);
		T_EQ_INT(nvio_stream_write(s, one + B / 2, B / 2), B / 2);
		T_OK(nvio_stream_seek(s, 0));
		if (big) {	/* straight from the caller's bytes (direct) */
			T_EQ_INT(nvio_stream_write(s, two, B), B);
		} else {
			T_EQ_INT(nvio_stream_write(s, two, B / 2), B / 2);
			T_EQ_INT(nvio_stream_write(s, two + B / 2, B / 2), B / 2);
		}
		T_OK(nvio_stream_close(s, 0));
	}
	nvio__sys.pwrite = real_pwrite;
	T_OK(nvio_file_close(f));
	/* the last bytes written at [0, B) are what the file holds */
	memset(back, 0, B);
	T_EQ_INT(t_file_size(path), B);
	T_OK(t_pread_file(path, back, B, 0));
	T_MEM_EQ(back, two, B);
	nvio_handle_destroy(h);
}

/*
 * model: random seeks (back, forward, unaligned, overlapping) and writes
 * (small staged ones, large ones straight from memory at aligned and
 * unaligned addresses) through a writer of ranges whose buffers are the
 * caller's memory (aligned, then at an odd address); the file must hold
 * what an in-memory model of the same writes holds.
 */
#define M (1u << 20)

static void model(int e, int d, int i, int odd)
{
	char path[T_PATH_MAX];
	unsigned char *want = t_alloc(M), *src = t_alloc(M + 4096), *got = t_alloc(M);
	unsigned char *area = t_alloc(4 * B + 4096);
	uint64_t rs = 0x9e3779b97f4a7c15ull ^ (uint64_t)(i * 2 + odd);
	nvio_handle_t *h;
	nvio_file_t *f;
	nvio_stream_t *s;
	nvio_stream_config_t c = {
		.struct_size = sizeof(c), .flags = NVIO_STREAM_WRITE | NVIO_STREAM_RANGES,
		.buffer_bytes = 4 * B, .depth = 2, .memory = area + (odd ? 1 : 0),
	};
	int err;

	t_fill_random(src, M + 4096, 7);
	if (t_handle(&h, e, d, 4, 0))
		goto out;
	t_path(path, "model%d-%d", i, odd);
	f = nvio_file_open(h, path, NVIO_FILE_WRITE | NVIO_FILE_CREATE, &err);
	T_TRUE(f != NULL);
	if (!f) {
		nvio_handle_destroy(h);
		goto out;
	}
	T_OK(nvio_file_truncate(f, M));
	s = nvio_stream_open_config(f, &c, &err);
	T_TRUE(s != NULL);
	for (int k = 0; s && k < 60 && !t_failures(); k++) {
		uint64_t r = t_rand64(&rs), off = r % M, n;
		uint64_t from = (r >> 20) % 4096;

		if (k % 5 == 0)
			off = off / 4096 * 4096;
		n = (r >> 40) % 3 == 0 ? (r >> 32) % (3 * B) : (r >> 32) % 9000;
		if (off + n > M)
			n = M - off;
		if ((r >> 50) & 1)
			from = 0;	/* page-aligned source: may go straight */
		T_OK(nvio_stream_seek(s, (int64_t)off));
		T_EQ_INT(nvio_stream_write(s, src + from, n), (int64_t)n);
		memcpy(want + off, src + from, n);
	}
	if (s)
		T_OK(nvio_stream_close(s, 0));
	T_OK(nvio_file_close(f));
	T_EQ_INT(t_file_size(path), M);
	T_OK(t_pread_file(path, got, M, 0));
	T_MEM_EQ(got, want, M);
	nvio_handle_destroy(h);
out:
	free(want);
	free(src);
	free(got);
	free(area);
}

int main(void)
{
	t_init("stream_attack");
	real_pwrite = nvio__sys.pwrite;
	mem = t_alloc(2 * B);
	one = t_alloc(B);
	two = t_alloc(B);
	back = t_alloc(B);
	t_fill_random(one, B, 1);
	t_fill_random(two, B, 2);
	T_FOR_EACH_COMBO(e, d) {
		overlap(e, d, t_combo_i, 0);
		overlap(e, d, t_combo_i, 1);
		model(e, d, t_combo_i, 0);
		model(e, d, t_combo_i, 1);
	}
	free(mem);
	free(one);
	free(two);
	free(back);
	return t_done();
}
