/*
 * test_vectors.c - vectored I/O: nvio_file_pwritev/preadv and nvio_submit
 * with an iov. Thousands of pieces of 1 byte to 300 KiB (a fixed seed),
 * some page-aligned in nvio_mem_alloc memory and some not, laid end to
 * end from an odd offset (the contiguous form) or each at its own offset
 * with gaps (NVIO_OFFSET_PER_IOV). Files are prepared and checked with
 * libc; bytes between and around the pieces must be left alone, in the
 * file and in memory. Then the invalid vectors, with their exact errors.
 * Every engine, direct on and off.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "t.h"

#define KiB 1024u
#define BS (128u * KiB)
#define BASE_OFF 12345		/* the contiguous form's odd start */
#define GUARD 0xa5

static int npieces;
static nvio_iovec_t *iov;	/* the pieces, in arena */
static uint64_t *fpos;		/* each piece's file offset */
static uint64_t *mpos_of;	/* each piece's place in the arena */
static unsigned char *arena;	/* from nvio_mem_alloc: page aligned */
static uint64_t arena_len;
static unsigned char *want, *got;	/* file images */
static uint64_t file_len;
static uint64_t seed = 31000;

/*
 * Lays the pieces out: sizes mostly small, one in 32 up to 300 KiB; every
 * fourth piece starts on a page in memory, the rest at odd addresses, with
 * a gap of guard bytes after each. The file offsets of the per-iov form
 * leave gaps of 0 to 5000 bytes (0: adjacent pieces, one run).
 */
static void layout(void)
{
	uint64_t st = 42, mpos = 0, f = 7;

	for (int i = 0; i < npieces; i++) {
		uint64_t r = t_rand64(&st);
		uint64_t len = r % 32 == 0 ? 1 + (r >> 8) % (300 * KiB) :
			       1 + (r >> 8) % 3000;

		if (i % 4 == 0)
			mpos = (mpos + 4095) & ~4095ull;
		else
			mpos += 1 + (r >> 40) % 63;
		mpos_of[i] = mpos;
		iov[i].len = len;
		iov[i].offset = 0;
		mpos += len;
		fpos[i] = f;
		f += len + ((r >> 50) % 3 == 0 ? 0 : (r >> 20) % 5000);
	}
	arena_len = mpos + 4096;
	file_len = f;
}

static uint64_t total_len(void)
{
	uint64_t n = 0;

	for (int i = 0; i < npieces; i++)
		n += iov[i].len;
	return n;
}

static void fill_pieces(void)
{
	for (int i = 0; i < npieces; i++)
		t_fill_random(iov[i].base, iov[i].len, seed++);
}

/* The arena holds the guard byte everywhere outside the pieces. */
static void check_arena_guards(void)
{
	unsigned char *p = arena;

	for (int i = 0; i <= npieces; i++) {
		unsigned char *end = i < npieces ? iov[i].base : arena + arena_len;

		for (; p < end; p++)
			if (*p != GUARD) {
				T_FAILF("arena byte %zu (before piece %d) "
					"overwritten: 0x%02x",
					(size_t)(p - arena), i, *p);
				return;
			}
		if (i < npieces)
			p = (unsigned char *)iov[i].base + iov[i].len;
	}
}

static nvio_file_t *open_rw(nvio_handle_t *h, const char *path)
{
	int err = 0;
	nvio_file_t *f = nvio_file_open(h, path, NVIO_FILE_READ |
					NVIO_FILE_WRITE, &err);

	if (!f)
		T_FAILF("nvio_file_open(%s): %s", path, t_errname(err));
	return f;
}

static void check_file(const char *path, uint64_t n)
{
	size_t sz = 0;

	if (T_OK(t_read_file(path, got, file_len + 1, &sz)) &&
	    T_EQ_U64(sz, n))
		T_MEM_EQ(got, want, n);
}

/* offset >= 0: the pieces end to end from it; else each at fpos. */
static uint64_t piece_off(int i, int64_t offset, uint64_t *run)
{
	if (offset == NVIO_OFFSET_PER_IOV)
		return fpos[i];
	*run += iov[i].len;
	return (uint64_t)offset + *run - iov[i].len;
}

static void set_offsets(int64_t offset)
{
	for (int i = 0; i < npieces; i++)
		iov[i].offset = offset == NVIO_OFFSET_PER_IOV ?
				(int64_t)fpos[i] : 0;
}

/* Waits for the one tagged op in flight; returns its res. */
static int64_t reap_one(nvio_handle_t *h, uint64_t tag)
{
	nvio_completion_t c;
	int k = nvio_reap(h, &c, 1, 1, 30ll * 1000 * 1000 * 1000);

	if (!T_EQ_INT(k, 1))
		return -1;
	T_EQ_U64(c.user_data, tag);
	return c.res;
}

/*
 * One write and one read of all the pieces in one form, by call (via 0)
 * or by tagged op (via 1).
 */
static void round_trip(nvio_handle_t *h, const char *path, int64_t offset,
		       int via)
{
	const char *form = offset == NVIO_OFFSET_PER_IOV ? "per-iov" :
			   "contiguous";
	const uint64_t total = total_len();
	uint64_t run = 0, size;
	nvio_file_t *f;
	nvio_op_t op;

	t_ctx("%s %d pieces %s %s write", t_combo(), npieces, form,
	      via ? "nvio_submit" : "pwritev");
	/* old content around and between the pieces */
	t_fill_random(want, file_len, seed++);
	if (!T_OK(t_write_file(path, want, file_len)))
		return;
	size = file_len;
	f = open_rw(h, path);
	if (!f)
		return;
	memset(arena, GUARD, arena_len);
	fill_pieces();
	set_offsets(offset);
	for (int i = 0; i < npieces; i++)
		memcpy(want + piece_off(i, offset, &run), iov[i].base,
		       iov[i].len);
	memset(&op, 0, sizeof(op));
	op.opcode = NVIO_OP_WRITE;
	op.file = f;
	op.iov = iov;
	op.iovcnt = (uint32_t)npieces;
	op.offset = offset;
	op.user_data = 0xfeed;
	if (!via) {
		T_OK(nvio_file_pwritev(f, iov, (uint32_t)npieces, offset, 0));
	} else if (T_EQ_INT(nvio_submit(h, &op, 1), 1)) {
		T_EQ_INT(reap_one(h, 0xfeed), (int64_t)total);
	}
	check_file(path, size);
	check_arena_guards();

	t_ctx("%s %d pieces %s %s read", t_combo(), npieces, form,
	      via ? "nvio_submit" : "preadv");
	t_fill_random(want, file_len, seed++);
	if (!T_OK(t_write_file(path, want, file_len)))
		goto out;
	memset(arena, GUARD, arena_len);
	for (int i = 0; i < npieces; i++)
		memset(iov[i].base, 0, iov[i].len);
	op.opcode = NVIO_OP_READ;
	if (!via) {
		T_OK(nvio_file_preadv(f, iov, (uint32_t)npieces, offset, 0));
	} else if (T_EQ_INT(nvio_submit(h, &op, 1), 1)) {
		T_EQ_INT(reap_one(h, 0xfeed), (int64_t)total);
	}
	run = 0;
	for (int i = 0; i < npieces; i++) {
		uint64_t o = piece_off(i, offset, &run);

		if (memcmp(iov[i].base, want + o, iov[i].len)) {
			t_ctx("%s %s read: piece %d of %llu bytes at file "
			      "offset %llu", t_combo(), form, i,
			      (unsigned long long)iov[i].len,
			      (unsigned long long)o);
			T_MEM_EQ((unsigned char *)iov[i].base, want + o,
				 iov[i].len);
			break;
		}
	}
	check_arena_guards();
	T_EQ_INT(t_file_size(path), (int64_t)file_len);
out:
	nvio_file_close(f);
}

/* A contiguous write past the end grows the file to exactly its end. */
static void grow(nvio_handle_t *h, const char *path)
{
	const int n = npieces < 50 ? npieces : 50;
	uint64_t run = 0, end;
	nvio_file_t *f;

	t_ctx("%s pwritev grows the file", t_combo());
	unlink(path);
	if (!T_OK(t_write_file(path, "abc", 3)))
		return;
	f = open_rw(h, path);
	if (!f)
		return;
	memset(want, 0, file_len);
	memcpy(want, "abc", 3);
	fill_pieces();
	set_offsets(0);
	for (int i = 0; i < n; i++) {
		memcpy(want + 4099 + run, iov[i].base, iov[i].len);
		run += iov[i].len;
	}
	end = 4099 + run;
	T_OK(nvio_file_pwritev(f, iov, (uint32_t)n, 4099, 0));
	check_file(path, end);
	/* reading one byte past the end: -ENODATA before any I/O */
	T_ERR(nvio_file_preadv(f, iov, (uint32_t)n, 4100, 0), -ENODATA);
	nvio_file_close(f);
}

/* ---- invalid vectors ---- */

static void invalid(nvio_handle_t *h, const char *path)
{
	nvio_iovec_t v[3];
	unsigned char b[300];
	nvio_file_t *f;
	nvio_op_t op;
	int r;

	t_ctx("%s invalid vectors", t_combo());
	if (!T_OK(t_write_file(path, b, sizeof(b))))
		return;
	f = open_rw(h, path);
	if (!f)
		return;
#define V3(o0, o1, o2) \
	(v[0] = (nvio_iovec_t){ b, 10, o0 }, \
	 v[1] = (nvio_iovec_t){ b + 10, 10, o1 }, \
	 v[2] = (nvio_iovec_t){ b + 20, 10, o2 })
	/* per-iov offsets: unsorted, overlapping, negative */
	V3(0, 100, 50);
	T_ERR(nvio_file_pwritev(f, v, 3, NVIO_OFFSET_PER_IOV, 0), -EINVAL);
	T_ERR(nvio_file_preadv(f, v, 3, NVIO_OFFSET_PER_IOV, 0), -EINVAL);
	V3(0, 5, 100);
	T_ERR(nvio_file_pwritev(f, v, 3, NVIO_OFFSET_PER_IOV, 0), -EINVAL);
	V3(0, 100, 109);
	T_ERR(nvio_file_pwritev(f, v, 3, NVIO_OFFSET_PER_IOV, 0), -EINVAL);
	V3(-10, 100, 200);
	T_ERR(nvio_file_pwritev(f, v, 3, NVIO_OFFSET_PER_IOV, 0), -EINVAL);
	/* adjacent and sorted is fine */
	V3(0, 10, 20);
	T_OK(nvio_file_pwritev(f, v, 3, NVIO_OFFSET_PER_IOV, 0));
	/* contiguous form: an iov offset must be 0 */
	V3(0, 10, 0);
	T_ERR(nvio_file_pwritev(f, v, 3, 0, 0), -EINVAL);
	T_ERR(nvio_file_preadv(f, v, 3, 0, 0), -EINVAL);
	/* an offset below -1 */
	V3(0, 0, 0);
	T_ERR(nvio_file_pwritev(f, v, 3, -2, 0), -EINVAL);
	/* NULL base with bytes */
	V3(0, 0, 0);
	v[1].base = NULL;
	T_ERR(nvio_file_pwritev(f, v, 3, 0, 0), -EINVAL);
	T_ERR(nvio_file_preadv(f, v, 3, 0, 0), -EINVAL);
	/* NULL vector with a count; too many */
	T_ERR(nvio_file_pwritev(f, NULL, 3, 0, 0), -EINVAL);
	V3(0, 0, 0);
	T_ERR(nvio_file_pwritev(f, v, NVIO_MAX_IOV + 1, 0, 0), -EINVAL);
	/* unknown flag */
	T_ERR(nvio_file_pwritev(f, v, 3, 0, 1u << 12), -EINVAL);
	/* no pieces: nothing to do (0) or refused; either way no I/O */
	r = nvio_file_pwritev(f, NULL, 0, 0, 0);
	T_TRUE(r == 0 || r == -EINVAL);
	t_note("%s: pwritev of 0 pieces returns %s", t_combo(), t_errname(r));

	/* the same through nvio_submit: refused, so never completes */
	memset(&op, 0, sizeof(op));
	op.opcode = NVIO_OP_WRITE;
	op.file = f;
	op.iov = v;
	op.iovcnt = 3;
	op.offset = NVIO_OFFSET_PER_IOV;
	V3(0, 100, 50);
	T_ERR(nvio_submit(h, &op, 1), -EINVAL);
	V3(0, 10, 20);
	op.nbytes = 30;		/* nbytes with an iov */
	T_ERR(nvio_submit(h, &op, 1), -EINVAL);
	op.nbytes = 0;
	op.iov = NULL;		/* iovcnt without an iov */
	T_ERR(nvio_submit(h, &op, 1), -EINVAL);
	T_EQ_U64(nvio_inflight(h), 0);
	T_OK(nvio_file_close(f));
	T_EQ_INT(t_file_size(path), sizeof(b));
}

int main(void)
{
	char path[T_PATH_MAX];
	int r;

	t_init("vectors");
	npieces = T_SANITIZED || t_quick() ? 300 : 3000;
	iov = calloc((size_t)npieces, sizeof(*iov));
	fpos = calloc((size_t)npieces, sizeof(*fpos));
	mpos_of = calloc((size_t)npieces, sizeof(*mpos_of));
	if (!iov || !fpos || !mpos_of)
		t_skip("out of memory");
	layout();
	if (file_len < BASE_OFF + total_len())
		file_len = BASE_OFF + total_len();
	file_len += 4096;
	r = nvio_mem_alloc((void **)&arena, arena_len, 0, NULL);
	if (r) {
		T_FAILF("nvio_mem_alloc(%llu): %s",
			(unsigned long long)arena_len, t_errname(r));
		return t_done();
	}
	for (int i = 0; i < npieces; i++)
		iov[i].base = arena + mpos_of[i];
	want = t_alloc(file_len + 1);
	got = t_alloc(file_len + 1);
	t_note("%d pieces, %llu bytes, file %llu bytes", npieces,
	       (unsigned long long)total_len(),
	       (unsigned long long)file_len);
	t_path(path, "v");
	T_FOR_EACH_COMBO(e, d) {
		nvio_handle_t *h;

		if (t_handle(&h, e, d, 2, BS))
			continue;
		round_trip(h, path, BASE_OFF, 0);
		round_trip(h, path, NVIO_OFFSET_PER_IOV, 0);
		round_trip(h, path, BASE_OFF, 1);
		round_trip(h, path, NVIO_OFFSET_PER_IOV, 1);
		grow(h, path);
		invalid(h, path);
		nvio_handle_destroy(h);
		unlink(path);
	}
	nvio_mem_free(arena);
	free(iov);
	free(fpos);
	free(mpos_of);
	free(want);
	free(got);
	return t_done();
}
