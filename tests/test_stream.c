/*
 * test_stream.c - writer and reader streams over an open file: every size
 * around the block, the alignment and the stream buffer (one buffer, many
 * buffers), written in chunks of varied sizes down to 1 byte, from offset
 * 0 and from an odd offset; the file's size exact after close; readers
 * with varied read sizes, seeks back and forward, a short read then 0 at
 * the end; NVIO_STREAM_COMMIT on an ATOMIC file; an injected write fault
 * that surfaces at a later write, flush or close. Every engine, direct on
 * and off; files checked with libc.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "t.h"
#include "sys.h"

#define SB (64u << 10)		/* stream buffer_bytes */
#define MAXN (5 * SB + 4097)

static const uint64_t sizes[] = { 0, 1, 4095, 4096, 4097, SB - 1, SB, SB + 1,
				  3 * SB + 4097, MAXN };
#define NSIZES (sizeof(sizes) / sizeof(sizes[0]))
/* write and read sizes, in turn */
static const uint64_t chunks[] = { 1, 7, 4096, 13, SB - 3, 100000, 1, 4097,
				   2 * SB, 511 };
#define NCHUNKS (sizeof(chunks) / sizeof(chunks[0]))

static unsigned char *want, *got, *src;
static uint64_t seed = 77000;

static nvio_stream_t *open_stream(nvio_file_t *f, unsigned flags,
				  int64_t off)
{
	int err = 0;
	nvio_stream_t *s = nvio_stream_open(f, flags, off, SB, 2, &err);

	if (!s)
		T_FAILF("nvio_stream_open(0x%x, %lld): %s", flags,
			(long long)off, t_errname(err));
	return s;
}

/* Writes n bytes of src in the chunk sizes starting at chunks[k0]. */
static int write_chunks(nvio_stream_t *s, uint64_t n, size_t k0, int64_t off)
{
	uint64_t done = 0;

	for (size_t k = k0; done < n; k++) {
		uint64_t c = chunks[k % NCHUNKS];
		int64_t r;

		if (c > n - done)
			c = n - done;
		r = nvio_stream_write(s, src + done, c);
		if (!T_EQ_INT(r, (int64_t)c))
			return 0;
		done += c;
		if (!T_EQ_INT(nvio_stream_tell(s), off + (int64_t)done))
			return 0;
	}
	return 1;
}

static void test_writer(nvio_handle_t *h, const char *path)
{
	for (size_t i = 0; i < NSIZES; i++)
		for (int at = 0; at < 2; at++) {
			const uint64_t n = sizes[i];
			const int64_t off = at ? 4096 + 7 : 0;
			nvio_file_t *f;
			nvio_stream_t *s;
			size_t sz = 0;

			t_ctx("%s writer %llu bytes at %lld", t_combo(),
			      (unsigned long long)n, (long long)off);
			/* old content, longer than the stream's end */
			t_fill_random(want, MAXN + 9000, seed++);
			if (!T_OK(t_write_file(path, want, MAXN + 9000)))
				return;
			f = t_open_file(h, path, NVIO_FILE_READ | NVIO_FILE_WRITE);
			if (!f)
				return;
			s = open_stream(f, NVIO_STREAM_WRITE, off);
			if (s) {
				t_fill_random(src, n, seed++);
				write_chunks(s, n, i, off);
				if (i % 3 == 0)
					T_OK(nvio_stream_flush(s));
				T_OK(nvio_stream_close(s, i % 2 ? NVIO_FSYNC : 0));
			}
			T_OK(nvio_file_close(f));
			memcpy(want + off, src, n);
			/* exactly offset + bytes written */
			if (T_OK(t_read_file(path, got, MAXN + 9001, &sz)) &&
			    T_EQ_U64(sz, (uint64_t)off + n))
				T_MEM_EQ(got, want, (uint64_t)off + n);
		}
}

static void test_reader(nvio_handle_t *h, const char *path)
{
	for (size_t i = 0; i < NSIZES; i++) {
		const uint64_t n = sizes[i];
		nvio_file_t *f;
		nvio_stream_t *s;
		uint64_t done = 0;
		int64_t r;

		t_ctx("%s reader %llu bytes", t_combo(), (unsigned long long)n);
		t_fill_random(want, n, seed++);
		if (!T_OK(t_write_file(path, want, n)))
			return;
		f = t_open_file(h, path, NVIO_FILE_READ);
		if (!f)
			return;
		s = open_stream(f, NVIO_STREAM_READ, 0);
		if (!s) {
			nvio_file_close(f);
			continue;
		}
		memset(got, 0, n + 1);
		for (size_t k = i; done < n; k++) {
			uint64_t c = chunks[k % NCHUNKS];

			r = nvio_stream_read(s, got + done, c);
			if (!T_TRUE(r > 0 && (uint64_t)r <= c))
				break;
			/* short only at the end */
			if ((uint64_t)r < c)
				T_EQ_U64(done + (uint64_t)r, n);
			done += (uint64_t)r;
		}
		T_EQ_U64(done, n);
		T_MEM_EQ(got, want, n);
		T_EQ_INT(nvio_stream_read(s, got, 100), 0);
		T_EQ_INT(nvio_stream_read(s, got, 1), 0);
		T_EQ_INT(nvio_stream_tell(s), (int64_t)n);

		/* back and forward: each read from the new place */
		if (n > 10) {
			static const double at[] = { 0.5, 0.1, 0.9, 0.0, 0.3 };

			for (size_t k = 0; k < 5; k++) {
				uint64_t o = (uint64_t)(at[k] * (double)n) | 1;
				uint64_t c = n - o < 5000 ? n - o : 5000;

				t_ctx("%s reader %llu bytes, seek to %llu",
				      t_combo(), (unsigned long long)n,
				      (unsigned long long)o);
				if (!T_OK(nvio_stream_seek(s, (int64_t)o)))
					continue;
				T_EQ_INT(nvio_stream_tell(s), (int64_t)o);
				memset(got, 0, c);
				T_EQ_INT(nvio_stream_read(s, got, c), (int64_t)c);
				T_MEM_EQ(got, want + o, c);
			}
			/* past the end: reads nothing */
			T_OK(nvio_stream_seek(s, (int64_t)n + 100));
			T_EQ_INT(nvio_stream_read(s, got, 10), 0);
			T_ERR(nvio_stream_seek(s, -1), -EINVAL);
		}
		/* a reader from an odd offset, one read over the end */
		T_OK(nvio_stream_close(s, 0));
		if (n > 3) {
			s = open_stream(f, NVIO_STREAM_READ, 3);
			if (s) {
				memset(got, 0, n);
				T_EQ_INT(nvio_stream_read(s, got, n), (int64_t)n - 3);
				T_MEM_EQ(got, want + 3, n - 3);
				T_OK(nvio_stream_close(s, 0));
			}
		}
		T_OK(nvio_file_close(f));
	}
}

/* A writer on an ATOMIC file, committed by the close. */
static void test_commit(nvio_handle_t *h, const char *path)
{
	const uint64_t n = 3 * SB + 5;
	nvio_file_info_t info;
	nvio_file_t *f;
	nvio_stream_t *s;
	size_t sz = 0;

	t_ctx("%s writer on ATOMIC, close with COMMIT", t_combo());
	t_fill_random(want, 5000, seed++);
	if (!T_OK(t_write_file(path, want, 5000)))
		return;
	f = t_open_file(h, path, NVIO_FILE_ATOMIC);
	if (!f)
		return;
	s = open_stream(f, NVIO_STREAM_WRITE, 0);
	if (s) {
		t_fill_random(src, n, seed++);
		write_chunks(s, n, 3, 0);
		T_OK(nvio_stream_flush(s));
		/* path untouched until the commit */
		if (T_OK(t_read_file(path, got, MAXN, &sz)) &&
		    T_EQ_U64(sz, 5000))
			T_MEM_EQ(got, want, 5000);
		T_OK(nvio_stream_close(s, NVIO_STREAM_COMMIT));
		if (T_OK(t_read_file(path, got, MAXN, &sz)) && T_EQ_U64(sz, n))
			T_MEM_EQ(got, src, n);
		memset(&info, 0, sizeof(info));
		info.struct_size = sizeof(info);
		if (T_OK(nvio_file_info(f, &info)))
			T_EQ_INT(info.committed, 1);
	}
	T_OK(nvio_file_close(f));
}

static atomic_int fail_writes;

static ssize_t eio_writes(int is_write, int fd, uint64_t off, size_t n,
			  ssize_t res)
{
	return is_write && atomic_load(&fail_writes) ? -EIO : res;
}

/*
 * A flush that fails while the caller goes on is reported by a later
 * write, flush or close; from then on every call fails with it.
 */
static void test_fault(nvio_handle_t *h, const char *path)
{
	nvio_file_t *f;
	nvio_stream_t *s;
	int64_t r = 0;
	int calls = 0, first = -1;

	t_ctx("%s writer, write fault", t_combo());
	unlink(path);
	f = t_open_file(h, path, NVIO_FILE_WRITE | NVIO_FILE_CREATE);
	if (!f)
		return;
	s = open_stream(f, NVIO_STREAM_WRITE, 0);
	if (!s) {
		nvio_file_close(f);
		return;
	}
	t_fill_random(src, MAXN, seed++);
	T_EQ_INT(nvio_stream_write(s, src, 1000), 1000);	/* buffered */
	atomic_store(&fail_writes, 1);
	nvio__sys.io_result = eio_writes;
	for (int i = 0; i < 8; i++, calls++) {
		r = nvio_stream_write(s, src, SB);
		if (r < 0 && first < 0)
			first = calls;
		if (first >= 0)
			T_ERR(r, -EIO);
		else
			T_EQ_INT(r, SB);
	}
	r = nvio_stream_flush(s);
	if (first < 0)
		first = calls;
	T_ERR(r, -EIO);
	T_ERR(nvio_stream_write(s, src, 1), -EIO);
	T_ERR(nvio_stream_flush(s), -EIO);
	T_ERR(nvio_stream_close(s, 0), -EIO);
	nvio__sys_reset();
	atomic_store(&fail_writes, 0);
	t_note("%s: the write fault surfaced at call %d", t_combo(), first);
	nvio_file_close(f);
}

static void test_args(nvio_handle_t *h, const char *path)
{
	nvio_file_t *f;
	nvio_stream_t *s;
	int err;

	t_ctx("%s stream arguments", t_combo());
	if (!T_OK(t_write_file(path, "abc", 3)))
		return;
	f = t_open_file(h, path, NVIO_FILE_READ);
	if (!f)
		return;
	err = 0;
	T_TRUE(nvio_stream_open(f, 0, 0, SB, 2, &err) == NULL);
	T_ERR(err, -EINVAL);
	err = 0;
	T_TRUE(nvio_stream_open(f, NVIO_STREAM_READ | (1u << 5), 0, SB, 2,
				&err) == NULL);
	T_ERR(err, -EINVAL);
	err = 0;
	T_TRUE(nvio_stream_open(f, NVIO_STREAM_READ, -1, SB, 2, &err) == NULL);
	T_ERR(err, -EINVAL);
	err = 0;
	T_TRUE(nvio_stream_open(NULL, NVIO_STREAM_READ, 0, SB, 2, &err) == NULL);
	T_ERR(err, -EINVAL);
	/* a writer on a read-only file */
	err = 0;
	s = nvio_stream_open(f, NVIO_STREAM_WRITE, 0, SB, 2, &err);
	if (!T_TRUE(s == NULL))
		nvio_stream_close(s, 0);
	T_ERR(err, -EBADF);
	/* defaults: buffer 0 and depth 0 */
	s = nvio_stream_open(f, NVIO_STREAM_READ, 0, 0, 0, &err);
	if (T_TRUE(s != NULL)) {
		T_EQ_INT(nvio_stream_read(s, got, 10), 3);
		T_OK(nvio_stream_close(s, 0));
	}
	T_OK(nvio_file_close(f));
}

int main(void)
{
	char path[T_PATH_MAX];

	t_init("stream");
	want = t_alloc(MAXN + 9001);
	got = t_alloc(MAXN + 9001);
	src = t_alloc(MAXN + 1);
	t_path(path, "s");
	T_FOR_EACH_COMBO(e, d) {
		nvio_handle_t *h;

		if (t_handle(&h, e, d, 2, 16384))
			continue;
		test_writer(h, path);
		test_reader(h, path);
		test_commit(h, path);
		test_fault(h, path);
		test_args(h, path);
		nvio_handle_destroy(h);
		unlink(path);
	}
	free(want);
	free(got);
	free(src);
	return t_done();
}
