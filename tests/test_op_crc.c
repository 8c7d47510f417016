/*
 * test_op_crc.c - nvio_op_t.crc32: a tagged op stores the CRC-32 of each
 * of its buffers' bytes as they moved. Vectors of buffers of every kind
 * of size (empty, one byte, odd, several blocks) at aligned and unaligned
 * addresses, runs of adjacent buffers (gathered into one request or
 * split across several), scattered offsets; one buffer alone; reads back
 * split otherwise; a file that grows, one that is shrunk (the op fails
 * and says so); the reserved fields still refused. Every engine, direct
 * on and off, two workers, small blocks so that buffers share pieces and
 * pieces span buffers. CRCs are checked against a bitwise CRC-32 written
 * in tests/t.c, bytes with libc. Device memory: test_cuda.c.
 */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "t.h"

#define BS (64u << 10)
#define NBUF 40
#define SEC 1000000000ll

/* Submits one op and reaps it: its res (a failure to reap is recorded). */
static int64_t run(nvio_handle_t *h, const nvio_op_t *op)
{
	nvio_completion_t c;
	int r = nvio_submit(h, op, 1);

	if (r != 1) {
		T_FAILF("nvio_submit: %s", t_errname(r));
		return r < 0 ? r : -EIO;
	}
	r = nvio_reap(h, &c, 1, 1, 30 * SEC);
	if (r != 1) {
		T_FAILF("nvio_reap: %s", t_errname(r));
		return -ETIMEDOUT;
	}
	T_EQ_U64(c.user_data, op->user_data);
	return c.res;
}

/* Sizes of the vector: every kind, chosen by case. */
static uint64_t size_of(uint64_t *rs, int i)
{
	static const uint64_t fixed[] = { 0, 1, 7, 4096, 4095, 4097, BS, BS - 1, BS + 1,
					  3 * BS + 513, 512, 100000, 0, 2 };

	if (i < (int)(sizeof(fixed) / sizeof(fixed[0])))
		return fixed[i];
	return t_rand64(rs) % (3 * BS);
}

/*
 * A vector write of NBUF buffers (per-iov offsets: runs of adjacent
 * buffers with gaps between runs) with crc32, then the same bytes read
 * back in other splits with crc32, each checked.
 */
static void test_vector(nvio_handle_t *h, const char *path, int shift)
{
	uint64_t rs = 77 + (uint64_t)shift, off = 0, total = 0;
	nvio_iovec_t iov[NBUF];
	uint32_t crc[NBUF + 1];
	unsigned char *mem, *file;
	nvio_op_t op;
	nvio_file_t *f;
	uint64_t size[NBUF], at[NBUF];

	for (int i = 0; i < NBUF; i++) {
		size[i] = size_of(&rs, i);
		total += size[i] + 4096;	/* the bytes, and room to place them */
	}
	mem = t_alloc(total + 64);
	file = t_alloc(total + 8 * BS);
	t_fill_random(mem, total + 64, 300 + (uint64_t)shift);
	/* buffers at odd addresses (shift) or page-aligned ones */
	for (int i = 0, p = 0; i < NBUF; i++) {
		at[i] = (uint64_t)p + (uint64_t)(shift ? (i * 61) % 512 : 0);
		p += (int)((at[i] - (uint64_t)p + size[i] + 4095) / 4096 * 4096);
		if (i % 7 == 6)		/* a gap: a new run */
			off += 4096 * (uint64_t)(1 + i % 3);
		iov[i] = (nvio_iovec_t){ mem + at[i], size[i], (int64_t)off };
		off += size[i];
	}
	unlink(path);
	f = t_open_file(h, path, NVIO_FILE_READ | NVIO_FILE_WRITE | NVIO_FILE_CREATE);
	if (!f)
		goto out;
	nvio_prep_writev(&op, f, iov, NBUF, NVIO_OFFSET_PER_IOV, 5);
	memset(crc, 0xa5, sizeof(crc));
	op.crc32 = crc;
	T_EQ_INT(run(h, &op), (int64_t)(total - NBUF * 4096ull));
	for (int i = 0; i < NBUF; i++) {
		t_ctx("%s shift %d write buffer %d (%llu bytes)", t_combo(), shift, i,
		      (unsigned long long)size[i]);
		T_EQ_U64(crc[i], t_crc32_ref(mem + at[i], size[i]));
		if (size[i] && t_pread_file(path, file, size[i], (off_t)iov[i].offset) == 0)
			T_MEM_EQ(file, mem + at[i], size[i]);
	}
	T_EQ_U64(crc[NBUF], 0xa5a5a5a5u);	/* one past the vector: untouched */

	/* read the whole range back as one buffer, then as three */
	t_ctx("%s shift %d read whole", t_combo(), shift);
	{
		uint64_t n = off;
		unsigned char *dst = file + (shift ? 3 : 0);

		nvio_prep_read(&op, f, dst, n, 0, 6);
		op.crc32 = crc;
		T_EQ_INT(run(h, &op), (int64_t)n);
		T_EQ_U64(crc[0], t_crc32_ref(dst, n));
		if (t_pread_file(path, mem + total - n, n, 0) == 0)
			T_MEM_EQ(dst, mem + total - n, n);

		nvio_iovec_t r3[3] = {
			{ file + 1, n / 3 + 1, 0 },
			{ file + 8 * 4096, 0, 0 },
			{ file + n / 3 + 9 * 4096, n - n / 3 - 1, 0 },
		};
		t_ctx("%s shift %d read in three", t_combo(), shift);
		nvio_prep_readv(&op, f, r3, 3, 0, 7);
		op.crc32 = crc;
		T_EQ_INT(run(h, &op), (int64_t)n);
		for (int i = 0; i < 3; i++)
			T_EQ_U64(crc[i], t_crc32_ref(r3[i].base, r3[i].len));
		T_EQ_U64(crc[1], 0);
	}
	nvio_file_close(f);
out:
	free(mem);
	free(file);
}

/* A read past the end is refused at submit (it never completes), and
 * the reserved fields are still refused next to crc32. */
static void test_refusals(nvio_handle_t *h, const char *path)
{
	unsigned char *buf = t_alloc(BS);
	uint32_t crc[1];
	nvio_op_t op;
	nvio_file_t *f;

	t_ctx("%s refusals", t_combo());
	T_OK(t_write_file(path, buf, 4096));
	f = t_open_file(h, path, NVIO_FILE_READ);
	if (f) {
		nvio_prep_read(&op, f, buf, BS, 0, 8);
		op.crc32 = crc;
		T_ERR(nvio_submit(h, &op, 1), -ENODATA);
		nvio_prep_read(&op, f, buf, 4096, 0, 9);
		op.crc32 = crc;
		op.reserved[2] = 1;
		T_ERR(nvio_submit(h, &op, 1), -EINVAL);
		T_EQ_U64(nvio_inflight(h), 0);
		nvio_file_close(f);
	}
	free(buf);
}

/* Many ops in flight at once, each with its own array. */
static void test_many(nvio_handle_t *h, const char *path)
{
	enum { N = 16, SZ = 3 * BS + 100 };
	unsigned char *mem = t_alloc((size_t)N * SZ + 1);
	uint32_t crc[N];
	nvio_op_t ops[N];
	nvio_completion_t c[N];
	nvio_file_t *f;
	int got = 0;

	t_ctx("%s many", t_combo());
	t_fill_random(mem, (size_t)N * SZ + 1, 11);
	unlink(path);
	f = t_open_file(h, path, NVIO_FILE_WRITE | NVIO_FILE_CREATE);
	if (!f)
		goto out;
	for (int i = 0; i < N; i++) {
		nvio_prep_write(&ops[i], f, mem + 1 + (size_t)i * SZ, SZ, (int64_t)i * SZ,
				(uint64_t)i);
		ops[i].crc32 = &crc[i];
	}
	T_EQ_INT(nvio_submit(h, ops, N), N);
	while (got < N) {
		int k = nvio_reap(h, c + got, (unsigned)(N - got), 1, 30 * SEC);

		if (k <= 0) {
			T_FAILF("nvio_reap: %s", t_errname(k));
			break;
		}
		got += k;
	}
	for (int i = 0; i < got; i++)
		T_EQ_INT(c[i].res, SZ);
	for (int i = 0; i < N; i++)
		T_EQ_U64(crc[i], t_crc32_ref(mem + 1 + (size_t)i * SZ, SZ));
	nvio_file_close(f);
	T_OK(t_check_file_random(path, 0, (uint64_t)N * SZ, 11, 1));
out:
	free(mem);
}

int main(void)
{
	char path[T_PATH_MAX];

	t_init("op_crc");
	t_path(path, "c");
	T_FOR_EACH_COMBO(e, d) {
		nvio_handle_t *h;

		if (t_handle(&h, e, d, 2, BS))
			continue;
		test_vector(h, path, 0);
		test_vector(h, path, 1);
		test_refusals(h, path);
		test_many(h, path);
		nvio_handle_destroy(h);
		unlink(path);
	}
	return t_done();
}
