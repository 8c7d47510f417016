/*
 * test_stream_memory.c - writer streams over the caller's memory and
 * writers of ranges (nvio_stream_open_config). Checks: the bytes staged
 * are in the caller's memory (no private copy), the file holds exactly
 * what was written through one buffer or two, with small and large
 * writes; two range writers (stripes in turn, as DeepSpeed's parallel
 * writers) make one file and leave its size alone; an EIO of the writes
 * comes back from the stream; invalid configs are -EINVAL. On every
 * engine, direct on and off.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "t.h"
#include "sys.h"

#define MEM (256u << 10)		/* the caller's staging memory */
#define N ((5u << 20) + 1234)		/* bytes each case writes */
#define STRIPE (192u << 10)

static unsigned char *data, *back;

static nvio_stream_t *open_mem(nvio_file_t *f, void *mem, uint64_t bytes, unsigned depth,
			       unsigned flags, int64_t off, int *err)
{
	nvio_stream_config_t c = {
		.struct_size = sizeof(c), .flags = NVIO_STREAM_WRITE | flags,
		.offset = off, .buffer_bytes = bytes, .depth = depth, .memory = mem,
	};

	return nvio_stream_open_config(f, &c, err);
}

/* Pieces of sizes cycling through small, odd and large (beyond a buffer). */
static uint64_t piece(unsigned i)
{
	static const uint64_t sizes[] = { 1, 100, 4095, 4096, 70000, 300000, 3, 1 << 20 };

	return sizes[i % (sizeof(sizes) / sizeof(sizes[0]))];
}

static void one(int engine, int direct, unsigned depth)
{
	char path[T_PATH_MAX];
	unsigned char *mem = t_alloc(MEM);
	nvio_handle_t *h;
	nvio_file_t *f;
	nvio_stream_t *s;
	uint64_t at = 0;
	int err;

	t_ctx("%s depth %u", t_combo(), depth);
	if (t_handle(&h, engine, direct, 2, 0)) {
		free(mem);
		return;
	}
	t_path(path, "out");
	f = nvio_file_open(h, path, NVIO_FILE_ATOMIC, &err);
	if (!T_TRUE(f != NULL))
		goto out;
	s = open_mem(f, mem, MEM, depth, 0, 0, &err);
	if (!T_TRUE(s != NULL)) {
		nvio_file_close(f);
		goto out;
	}
	/* a small first write stays in the caller's memory */
	T_EQ_INT(nvio_stream_write(s, data, 1000), 1000);
	T_MEM_EQ(mem, data, 1000);
	at = 1000;
	for (unsigned i = 0; at < N; i++) {
		uint64_t k = piece(i) < N - at ? piece(i) : N - at;

		if (!T_EQ_INT(nvio_stream_write(s, data + at, k), (int64_t)k))
			break;
		at += k;
	}
	T_OK(nvio_stream_close(s, NVIO_STREAM_COMMIT));
	T_OK(nvio_file_close(f));
	T_EQ_INT(t_file_size(path), N);
	memset(back, 0, N);
	T_OK(t_pread_file(path, back, N, 0));
	T_MEM_EQ(back, data, N);
	unlink(path);
out:
	nvio_handle_destroy(h);
	free(mem);
}

/* Two writers of stripes in turn into one file, each through its memory. */
static void ranges(int engine, int direct)
{
	char path[T_PATH_MAX];
	unsigned char *mem[2] = { t_alloc(MEM), t_alloc(MEM) };
	nvio_handle_t *h;
	nvio_file_t *f;
	nvio_stream_t *s[2];
	int err;

	t_ctx("%s ranges", t_combo());
	if (t_handle(&h, engine, direct, 2, 0))
		goto out;
	t_path(path, "striped");
	f = nvio_file_open(h, path, NVIO_FILE_WRITE | NVIO_FILE_CREATE, &err);
	if (!T_TRUE(f != NULL)) {
		nvio_handle_destroy(h);
		goto out;
	}
	for (int w = 0; w < 2; w++)
		s[w] = open_mem(f, mem[w], MEM, 2, NVIO_STREAM_RANGES, 0, &err);
	if (T_TRUE(s[0] && s[1])) {
		for (uint64_t k = 0, at = 0; at < N; k++, at += STRIPE) {
			nvio_stream_t *w = s[k % 2];
			uint64_t n = N - at < STRIPE ? N - at : STRIPE;

			T_OK(nvio_stream_seek(w, (int64_t)at));
			/* in two writes: the stream's own staging and its flushes */
			T_EQ_INT(nvio_stream_write(w, data + at, 777), 777);
			T_EQ_INT(nvio_stream_write(w, data + at + 777, n - 777), (int64_t)(n - 777));
		}
		/* writer 0 closes first: its stripes end before the file does */
		T_OK(nvio_stream_close(s[0], 0));
		T_OK(nvio_stream_close(s[1], NVIO_FSYNC));
	}
	T_OK(nvio_file_close(f));
	T_EQ_INT(t_file_size(path), N);
	memset(back, 0, N);
	T_OK(t_pread_file(path, back, N, 0));
	T_MEM_EQ(back, data, N);
	unlink(path);
	nvio_handle_destroy(h);
out:
	free(mem[0]);
	free(mem[1]);
}

static ssize_t eio_writes(int is_write, int fd, uint64_t off, size_t n, ssize_t res)
{
	return is_write ? -EIO : res;
}

static void invalid(void)
{
	char path[T_PATH_MAX];
	unsigned char *mem = t_alloc(MEM);
	nvio_stream_config_t c;
	nvio_handle_t *h;
	nvio_file_t *f;
	nvio_stream_t *s;
	int err;

	t_ctx("invalid");
	if (t_handle(&h, NVIO_ENGINE_PSYNC, NVIO_DIRECT_OFF, 1, 0)) {
		free(mem);
		return;
	}
	t_path(path, "inv");
	f = nvio_file_open(h, path, NVIO_FILE_READ | NVIO_FILE_WRITE | NVIO_FILE_CREATE, &err);
	if (!T_TRUE(f != NULL))
		goto out;
	memset(&c, 0, sizeof(c));
	c.struct_size = sizeof(c);
	c.flags = NVIO_STREAM_READ;
	c.memory = mem;
	c.buffer_bytes = MEM;
	T_TRUE(nvio_stream_open_config(f, &c, &err) == NULL);	/* memory: writers only */
	T_EQ_INT(err, -EINVAL);
	c.memory = NULL;
	c.flags = NVIO_STREAM_READ | NVIO_STREAM_RANGES;
	T_TRUE(nvio_stream_open_config(f, &c, &err) == NULL);
	T_EQ_INT(err, -EINVAL);
	T_TRUE(open_mem(f, mem, MEM, 3, 0, 0, &err) == NULL);	/* 1 or 2 buffers */
	T_EQ_INT(err, -EINVAL);
	T_TRUE(open_mem(f, mem, 4096, 2, 0, 0, &err) == NULL);	/* halves under a page */
	T_EQ_INT(err, -EINVAL);
	T_TRUE(open_mem(f, mem, 0, 2, 0, 0, &err) == NULL);
	T_EQ_INT(err, -EINVAL);
	T_TRUE(open_mem(f, mem, MEM, 2, 1u << 9, 0, &err) == NULL);	/* unknown flag */
	T_EQ_INT(err, -EINVAL);
	T_TRUE(nvio_stream_open_config(f, NULL, &err) == NULL);
	T_EQ_INT(err, -EINVAL);
	c.flags = NVIO_STREAM_WRITE;
	c.reserved[3] = 1;
	T_TRUE(nvio_stream_open_config(f, &c, &err) == NULL);
	T_EQ_INT(err, -EINVAL);
	c.reserved[3] = 0;
	c.struct_size = 16;
	T_TRUE(nvio_stream_open_config(f, &c, &err) == NULL);
	T_EQ_INT(err, -EINVAL);
	/* RANGES is 0.3's: not through nvio_stream_open */
	T_TRUE(nvio_stream_open(f, NVIO_STREAM_WRITE | NVIO_STREAM_RANGES, 0, 0, 0, &err) == NULL);
	T_EQ_INT(err, -EINVAL);
	/* a writer that is not of ranges cannot seek */
	s = open_mem(f, mem, MEM, 1, 0, 0, &err);
	if (T_TRUE(s != NULL)) {
		T_ERR(nvio_stream_seek(s, 4096), -EINVAL);
		T_OK(nvio_stream_close(s, 0));
	}
	/* an EIO of the writes comes back (at the latest from close) */
	s = open_mem(f, mem, MEM, 2, 0, 0, &err);
	if (T_TRUE(s != NULL)) {
		int64_t r = 0;

		nvio__sys.io_result = eio_writes;
		for (int i = 0; i < 8 && r >= 0; i++)
			r = nvio_stream_write(s, data, MEM / 2);
		if (r < 0)
			T_EQ_INT(r, -EIO);
		T_ERR(nvio_stream_close(s, 0), -EIO);	/* the first error sticks */
		nvio__sys_reset();
	}
	nvio_file_close(f);
	unlink(path);
out:
	nvio_handle_destroy(h);
	free(mem);
}

int main(void)
{
	t_init("stream_memory");
	data = t_alloc(N);
	back = t_alloc(N);
	t_fill_random(data, N, 7);
	T_FOR_EACH_COMBO(e, d) {
		one(e, d, 1);
		one(e, d, 2);
		ranges(e, d);
	}
	invalid();
	free(data);
	free(back);
	return t_done();
}
