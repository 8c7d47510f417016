/*
 * test_quick_read.c - nvio_file_pread's quick path (a sync read of at
 * most a block, without flags, through the page cache, within the size
 * the file is known to have: src/submit.c quick_read) against the
 * general path, on every engine with direct I/O on and off:
 *   - odd sizes at odd offsets, bytes compared; reads the quick path
 *     leaves to the general one (over a block, with a flag) too;
 *   - every read is numbered like any op: a failing read's op_seq counts
 *     all the reads before it;
 *   - a file cut short behind the handle's back: a read inside the size
 *     the handle knew fails with -ENODATA, not a partial buffer, and
 *     nvio_last_error names the file, "pread", the offset and the size;
 *     a read across the new end likewise;
 *   - the retry policy: EINTR twice, then the read is done; EIO is the
 *     read's error with its detail; a short count is completed.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "t.h"
#include "sys.h"

#define FILE_BYTES (1u << 20)
#define BLOCK (64u << 10)

static struct nvio__sys real;
static atomic_int left;		/* injected faults still to give */
static int give;		/* errno, or 0: a short count */

static ssize_t h_pread(int fd, void *buf, size_t n, off_t off)
{
	if (!t_fd_is_ours(fd) || atomic_fetch_sub(&left, 1) <= 0)
		return real.pread(fd, buf, n, off);
	if (!give)
		return real.pread(fd, buf, n > 1 ? n / 2 : n, off);
	errno = give;
	return -1;
}

/* The detail of the handle's last failure. A read through the page
 * cache fails as one piece; a direct one names its failing piece. */
static void check_error(nvio_handle_t *h, int err, const char *path, uint64_t off,
			uint64_t n, uint64_t seq, int one_piece)
{
	nvio_error_t e = { .struct_size = sizeof(e) };

	T_ERR(nvio_last_error(h, &e), err);
	T_EQ_INT(e.err, err);
	T_EQ_INT(e.is_write, 0);
	T_EQ_U64(e.op_seq, seq);
	T_TRUE(strstr(e.path, path) != NULL);
	if (one_piece) {
		T_EQ_U64((uint64_t)e.offset, off);
		T_EQ_U64(e.nbytes, n);
		T_TRUE(strcmp(e.what, "pread") == 0);
	} else {
		T_TRUE((uint64_t)e.offset >= off && (uint64_t)e.offset < off + n);
	}
}

int main(void)
{
	unsigned char *data = malloc(FILE_BYTES), *buf = malloc(2 * BLOCK + 64);
	char path[T_PATH_MAX];
	uint64_t x = 77;

	t_init("quick_read");
	if (!data || !buf)
		t_skip("no memory");
	real = nvio__sys;
	T_FOR_EACH_COMBO(e, d) {
		nvio_handle_t *h = NULL;
		nvio_file_t *f;
		nvio_config_t c;
		uint64_t seq = 0;
		int r;

		t_fill_random(data, FILE_BYTES, 40 + (uint64_t)t_combo_i);
		t_path(path, "quick-%d", t_combo_i);
		if (!T_OK(t_write_file(path, data, FILE_BYTES)))
			continue;
		t_config(&c, e, d, BLOCK, 32);
		if (!T_OK(nvio_handle_create(&h, &c)))
			continue;
		f = nvio_file_open(h, path, NVIO_FILE_READ, &r);
		if (!T_TRUE(f != NULL)) {
			nvio_handle_destroy(h);
			continue;
		}
		/* odd sizes at odd offsets, some over a block, some flagged */
		for (int i = 0; i < 300; i++) {
			uint64_t n, off;
			unsigned flags = i % 7 == 6 ? NVIO_VALIDATE : 0;

			x = x * 6364136223846793005ull + 1442695040888963407ull;
			n = 1 + (x >> 33) % (i % 10 == 9 ? 2 * BLOCK : 9000);
			off = (x >> 11) % (FILE_BYTES - n + 1);
			memset(buf + 1, 0xA5, (size_t)n);
			T_OK(nvio_file_pread(f, buf + 1, n, (int64_t)off, flags));
			T_MEM_EQ(buf + 1, data + off, n);
			seq++;
		}
		/* the retry policy on the same calls */
		nvio__sys.pread = h_pread;
		give = EINTR;
		atomic_store(&left, 2);
		memset(buf, 0, 4096);
		T_OK(nvio_file_pread(f, buf, 4096, 8192, 0));
		T_MEM_EQ(buf, data + 8192, 4096);
		seq++;
		give = 0;	/* a short count, completed */
		atomic_store(&left, 1);
		memset(buf, 0, 4096);
		T_OK(nvio_file_pread(f, buf, 4096, 12288, 0));
		T_MEM_EQ(buf, data + 12288, 4096);
		seq++;
		if (d == NVIO_DIRECT_OFF) {
			/* direct reads are the engines' (test_faults); through
			 * the page cache the call itself fails */
			give = EIO;
			atomic_store(&left, 1);
			T_ERR(nvio_file_pread(f, buf, 3000, 5000, 0), -EIO);
			check_error(h, -EIO, path, 5000, 3000, ++seq, 1);
		}
		atomic_store(&left, 0);
		nvio__sys_reset();
		/* the file cut short behind the handle's back */
		T_OK(truncate(path, FILE_BYTES / 2));
		T_ERR(nvio_file_pread(f, buf, 4096, FILE_BYTES / 2 + 8192, 0), -ENODATA);
		check_error(h, -ENODATA, path, FILE_BYTES / 2 + 8192, 4096, ++seq,
			    d == NVIO_DIRECT_OFF);
		T_ERR(nvio_file_pread(f, buf, 4096, FILE_BYTES / 2 - 4096 + 100, 0), -ENODATA);
		check_error(h, -ENODATA, path, FILE_BYTES / 2 - 4096 + 100, 4096, ++seq,
			    d == NVIO_DIRECT_OFF);
		memset(buf, 0, 4096);
		T_OK(nvio_file_pread(f, buf, 4096, FILE_BYTES / 2 - 4096, 0));
		T_MEM_EQ(buf, data + FILE_BYTES / 2 - 4096, 4096);
		nvio_file_close(f);
		nvio_handle_destroy(h);
		unlink(path);
	}
	free(data);
	free(buf);
	return t_done();
}
