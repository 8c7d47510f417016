/*
 * test_rw.c - round trips of every size class, file offset and buffer
 * misalignment on every engine, direct on and off, parallelism 1 and 3,
 * block size 4 KiB and 1 MiB. Files are prepared and checked with libc.
 *
 * Each pwrite goes into a file that already holds other random bytes, so
 * the check also covers "bytes outside the range are untouched" and
 * "the size only grows". Each pread reads into a buffer with guard bytes
 * on both sides, which must be left as they were.
 *
 * Coverage: every (engine, direct, parallelism, block size) does every
 * size; sizes under 1 MiB go with every offset and both misalignments;
 * the large sizes rotate through the offsets (two per configuration) and
 * misalignments, so that each engine sees every combination of offset
 * and misalignment with large sizes too.
 */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "t.h"
#include "engine.h"
#include "sys.h"

#define MiB (1u << 20)
#define GUARD 4096
#define GUARD_BYTE 0x5a

static const uint64_t sizes[] = { 0, 1, 511, 512, 4095, 4096, 4097,
				  MiB - 1, MiB, MiB + 1, 5 * MiB + 777 };
static const int64_t offsets[] = { 0, 1, 511, 4096, 12345 };
#define NSIZES (sizeof(sizes) / sizeof(sizes[0]))
#define NOFFS (sizeof(offsets) / sizeof(offsets[0]))
#define MAXSZ (5 * MiB + 777)
#define FILE_MAX (MAXSZ + 12345 + 8192)

static unsigned char *area;	/* GUARD | buffer (+1) | GUARD */
static unsigned char *want;	/* expected file content */
static unsigned char *got;	/* file content read back */
static uint64_t seed = 1000;

static int check_guards(unsigned char *buf, uint64_t n)
{
	unsigned char *lo = area, *hi = buf + n;
	size_t nlo = (size_t)(buf - area);

	for (size_t i = 0; i < nlo; i++)
		if (lo[i] != GUARD_BYTE) {
			T_FAILF("byte %zu before the buffer overwritten "
				"(0x%02x)", nlo - i, lo[i]);
			return 0;
		}
	for (size_t i = 0; i < GUARD; i++)
		if (hi[i] != GUARD_BYTE) {
			T_FAILF("byte %zu after the buffer overwritten (0x%02x)",
				i, hi[i]);
			return 0;
		}
	return 1;
}

/*
 * One write and one read of n bytes at off through a buffer mis bytes
 * past a page boundary. `tail` extra bytes of old content follow the
 * range in the file (0: the range ends the file).
 */
static void round_trip(nvio_handle_t *h, const char *path, uint64_t n,
		       int64_t off, int mis, uint64_t tail, unsigned flags)
{
	unsigned char *buf = area + GUARD + mis;
	uint64_t old_size = (uint64_t)off + n + tail;
	uint64_t s_old = seed++, s_new = seed++;
	size_t fsz = 0;
	int r;

	/* The write: old random content around the range. */
	t_fill_random(want, old_size, s_old);
	if (t_write_file(path, want, old_size)) {
		T_FAILF("libc write of %s failed", path);
		return;
	}
	memset(area, GUARD_BYTE, GUARD + mis);
	t_fill_random(buf, n, s_new);
	memset(buf + n, GUARD_BYTE, GUARD);
	r = nvio_pwrite(h, buf, n, path, off, flags);
	if (flags & NVIO_ASYNC) {
		if (T_OK(r))
			T_EQ_INT(nvio_wait(h), 1);
	} else {
		T_OK(r);
	}
	T_EQ_INT(t_check_random_at(buf, n, s_new, 0), -1); /* not changed */
	check_guards(buf, n);
	memcpy(want + off, buf, n);
	memset(got, 0, old_size + 1);
	r = t_read_file(path, got, old_size + 1, &fsz);
	if (T_OK(r) && T_EQ_U64(fsz, old_size))
		T_MEM_EQ(got, want, old_size);

	/* The read: fresh content written by libc. */
	t_fill_random(want, old_size, s_old + 7777);
	if (t_write_file(path, want, old_size)) {
		T_FAILF("libc write of %s failed", path);
		return;
	}
	memset(area, GUARD_BYTE, GUARD + mis + n + GUARD);
	r = nvio_pread(h, buf, n, path, off, flags);
	if (flags & NVIO_ASYNC) {
		if (T_OK(r))
			T_EQ_INT(nvio_wait(h), 1);
	} else {
		T_OK(r);
	}
	T_MEM_EQ(buf, want + off, n);
	check_guards(buf, n);
	T_EQ_INT(t_file_size(path), old_size);
}

static int g_fail_before;

static void matrix(nvio_handle_t *h, const char *combo, int cfg_index)
{
	char path[T_PATH_MAX];

	t_path(path, "rw");
	for (size_t i = 0; i < NSIZES; i++) {
		uint64_t n = sizes[i];
		int large = n >= MiB - 1;

		for (size_t j = 0; j < NOFFS; j++) {
			int mis_lo = 0, mis_hi = 1;
			unsigned flags = 0;

			if (large) {
				size_t a = (size_t)cfg_index % NOFFS;
				size_t b = ((size_t)cfg_index + 2 + i) % NOFFS;

				if (j != a && j != b)
					continue;
				mis_lo = mis_hi = (int)((cfg_index + i + j) & 1);
			}
			for (int mis = mis_lo; mis <= mis_hi; mis++) {
				/* Every third case async, to cover both. */
				flags = ((i + j + (size_t)mis) % 3 == 0) ?
					NVIO_ASYNC : 0;
				t_ctx("%s size %llu offset %lld mis %d%s", combo,
				      (unsigned long long)n, (long long)offsets[j],
				      mis, flags ? " async" : "");
				round_trip(h, path, n, offsets[j], mis,
					   (i + j) % 2 ? 0 : 777, flags);
				if (t_failures() > g_fail_before + 10)
					return;	/* one broken config is enough */
			}
		}
	}
	unlink(path);
}

/* pwrite past the end leaves a hole of zeros and grows the file. */
static void test_grow(nvio_handle_t *h, const char *combo)
{
	char path[T_PATH_MAX];
	unsigned char src[5000], chk[20000];
	size_t sz = 0;

	t_ctx("%s pwrite past EOF", combo);
	t_path(path, "grow");
	t_fill_random(src, sizeof(src), seed++);
	if (t_write_file(path, src, 100))
		return;
	T_OK(nvio_pwrite(h, src + 100, 4900, path, 10000, 0));
	T_EQ_INT(t_file_size(path), 14900);
	if (T_OK(t_read_file(path, chk, sizeof(chk), &sz))) {
		unsigned char zero[9900];

		memset(zero, 0, sizeof(zero));
		T_MEM_EQ(chk, src, 100);
		T_MEM_EQ(chk + 100, zero, 9900);
		T_MEM_EQ(chk + 10000, src + 100, 4900);
	}
	/* Creating a file at an offset. */
	unlink(path);
	T_OK(nvio_pwrite(h, src, 3, path, 4096, 0));
	T_EQ_INT(t_file_size(path), 4099);
	if (T_OK(t_read_file(path, chk, sizeof(chk), &sz))) {
		unsigned char zero[4096];

		memset(zero, 0, sizeof(zero));
		T_MEM_EQ(chk, zero, 4096);
		T_MEM_EQ(chk + 4096, src, 3);
	}
	{
		struct stat st;
		mode_t m = umask(022);

		umask(m);
		if (!stat(path, &st))
			T_EQ_INT(st.st_mode & 0777, 0666 & ~m);
	}
	unlink(path);
}

/* write_file replaces a longer file with exactly nbytes; read_file reads
 * the whole file and reports its size. */
static void test_whole(nvio_handle_t *h, const char *combo)
{
	char path[T_PATH_MAX];
	unsigned char *big = t_alloc(2 * MiB + 2), *chk = t_alloc(2 * MiB + 2);
	static const uint64_t ns[] = { 0, 1, 4096, 4097, MiB + 3, 2 * MiB + 1 };
	size_t sz;

	t_path(path, "whole");
	for (size_t i = 0; i < sizeof(ns) / sizeof(ns[0]); i++) {
		uint64_t n = ns[i], size_out = 12345;

		t_ctx("%s write_file/read_file %llu", combo,
		      (unsigned long long)n);
		/* A longer file first. */
		t_fill_random(big, 2 * MiB + 1, seed++);
		if (t_write_file(path, big, 2 * MiB + 1))
			break;
		t_fill_random(big, n, seed++);
		T_OK(nvio_write_file(h, big + (i & 1), n, path, 0));
		memmove(big, big + (i & 1), n);
		sz = 0;
		if (T_OK(t_read_file(path, chk, 2 * MiB + 2, &sz)) &&
		    T_EQ_U64(sz, n))
			T_MEM_EQ(chk, big, n);
		T_EQ_INT(t_dir_count(t_tmpdir()), 1);	/* no temporary left */

		/* read_file: a new libc file, buffer larger than it. */
		t_fill_random(big, n, seed++);
		if (t_write_file(path, big, n))
			break;
		memset(chk, 0xee, 2 * MiB + 2);
		T_OK(nvio_read_file(h, chk + 1, 2 * MiB + 1, path, &size_out,
				    0));
		T_EQ_U64(size_out, n);
		T_MEM_EQ(chk + 1, big, n);
		T_EQ_INT(chk[0], 0xee);
		/* Exactly the right capacity, and async. */
		memset(chk, 0, n + 1);
		size_out = 7;
		if (T_OK(nvio_read_file(h, chk, n, path, &size_out,
					NVIO_ASYNC))) {
			T_EQ_U64(size_out, n);
			T_EQ_INT(nvio_wait(h), 1);
			T_MEM_EQ(chk, big, n);
		}
		T_OK(nvio_read_file(h, chk, n, path, NULL, 0));
	}
	/* write_file with FSYNC and async. */
	t_ctx("%s write_file async fsync", combo);
	t_fill_random(big, 100000, seed++);
	if (T_OK(nvio_write_file(h, big, 100000, path, NVIO_ASYNC | NVIO_FSYNC))) {
		T_EQ_INT(nvio_wait(h), 1);
		if (T_OK(t_read_file(path, chk, 2 * MiB, &sz)) &&
		    T_EQ_U64(sz, 100000))
			T_MEM_EQ(chk, big, 100000);
	}
	unlink(path);
	free(big);
	free(chk);
}

/* A block size that is no multiple of 512: rejected or correct. */
static void test_odd_block(int e, int d)
{
	nvio_config_t c;
	nvio_handle_t *h = NULL;
	int r;

	t_ctx("%s/%s block_size 1000", t_engine_str(e), t_direct_str(d));
	t_config(&c, e, d, 1000, 0);
	c.intra_op_parallelism = 2;
	r = nvio_handle_create(&h, &c);
	if (r == -EINVAL)
		return;
	if (!T_OK(r))
		return;
	{
		char path[T_PATH_MAX];

		t_path(path, "odd");
		round_trip(h, path, 100000, 4096, 0, 10, 0);
		round_trip(h, path, 100001, 513, 1, 0, 0);
		unlink(path);
	}
	nvio_handle_destroy(h);
}

/* Submission modes and small queues move the same bytes. */
static void test_modes(int e, int d)
{
	static const struct { uint32_t qd, single, overlap, par; } ms[] = {
		{ 1, 0, 0, 1 }, { 2, 1, 0, 2 }, { 3, 0, 1, 3 }, { 8, 1, 1, 2 },
	};
	char path[T_PATH_MAX];

	t_path(path, "modes");
	for (size_t i = 0; i < sizeof(ms) / sizeof(ms[0]); i++) {
		nvio_config_t c;
		nvio_handle_t *h = NULL;

		t_ctx("%s/%s qd %u single %u overlap %u par %u",
		      t_engine_str(e), t_direct_str(d), ms[i].qd, ms[i].single,
		      ms[i].overlap, ms[i].par);
		t_config(&c, e, d, 8192, ms[i].qd);
		c.single_submit = ms[i].single;
		c.overlap_events = ms[i].overlap;
		c.intra_op_parallelism = ms[i].par;
		if (!T_OK(nvio_handle_create(&h, &c)))
			continue;
		round_trip(h, path, 300001, 511, 1, 100, 0);
		round_trip(h, path, 262144, 8192, 0, 0, NVIO_ASYNC);
		nvio_handle_destroy(h);
	}
	unlink(path);
}

/*
 * Misaligned buffers with pieces large enough that each staged copy is
 * submitted on its own, and pools so small that only one or a few staged
 * pieces may be in flight while the next are copied: both modes, sync
 * and async, one worker and two.
 */
static void test_staged_pipeline(int e, int d)
{
	static const struct { uint32_t stage_blocks, overlap, par; } ms[] = {
		{ 1, 0, 1 }, { 1, 1, 1 }, { 2, 0, 1 }, { 2, 1, 1 }, { 3, 1, 1 },
		{ 8, 0, 1 }, { 8, 1, 2 },
	};
	char path[T_PATH_MAX];

	t_path(path, "staged");
	for (size_t i = 0; i < sizeof(ms) / sizeof(ms[0]); i++) {
		nvio_config_t c, got_cfg;
		nvio_handle_t *h = NULL;

		t_ctx("%s/%s staged pool %u blocks overlap %u par %u",
		      t_engine_str(e), t_direct_str(d), ms[i].stage_blocks,
		      ms[i].overlap, ms[i].par);
		t_config(&c, e, d, 128u << 10, 16);
		c.overlap_events = ms[i].overlap;
		c.intra_op_parallelism = ms[i].par;
		c.staging_bytes = ms[i].stage_blocks * c.block_size;
		if (!T_OK(nvio_handle_create(&h, &c)))
			continue;
		got_cfg.struct_size = sizeof(got_cfg);
		if (T_OK(nvio_handle_config(h, &got_cfg)))	/* 2 at least */
			T_EQ_U64(got_cfg.staging_bytes, ms[i].stage_blocks < 2 ?
				 2 * c.block_size : c.staging_bytes);
		round_trip(h, path, MAXSZ, 4096, 1, 100, 0);
		round_trip(h, path, 3 * MiB + 5, 8192, 3, 0, NVIO_ASYNC);
		round_trip(h, path, 2 * MiB, 0, 1, 4096, 0);
		nvio_handle_destroy(h);
	}
	unlink(path);
}

/*
 * Requests in flight per batch, seen from the engines: every completion
 * passes io_result, and in batch mode every batch is waited for by one
 * reap, which calls reap_fault first. The largest count between two
 * reaps is the deepest batch (psync completes at submit, the others
 * after the wait: either way a batch falls in one window).
 */
static unsigned win_count, win_max;

static ssize_t count_result(int is_write, int fd, uint64_t off, size_t n,
			    ssize_t res)
{
	win_count++;
	return res;
}

static int count_reap(void)
{
	if (win_count > win_max)
		win_max = win_count;
	win_count = 0;
	return 0;
}

static unsigned window_end(void)
{
	unsigned m = win_max > win_count ? win_max : win_count;

	win_max = win_count = 0;
	return m;
}

/*
 * Batch mode keeps queue_depth requests in flight for misaligned buffers
 * too, not just for aligned ones: the next batch is copied into a second
 * set of bounce buffers while one runs (a batch of half a queue cost 14%
 * of write bandwidth on a virtio disk). Never more than queue_depth, in
 * either mode (the worker's limit; psync also refuses more by itself,
 * io_uring and libaio overflow their completion arrays without it).
 */
static void test_batch_depth(int e, int d)
{
	const uint32_t qd = 8, bs = 64u << 10;
	const uint64_t n = 40 * (uint64_t)bs;	/* five batches */
	char path[T_PATH_MAX];

	t_path(path, "batchdepth");
	for (int overlap = 0; overlap < 2; overlap++)
		for (int mis = 0; mis < 2; mis++) {
			unsigned char *buf = area + GUARD + mis;
			nvio_config_t c;
			nvio_handle_t *h = NULL;
			unsigned wdepth, rdepth;
			size_t fsz = 0;

			t_ctx("%s/%s batch depth qd %u overlap %d mis %d",
			      t_engine_str(e), t_direct_str(d), qd, overlap, mis);
			t_config(&c, e, d, bs, qd);
			c.overlap_events = (uint32_t)overlap;
			if (!T_OK(nvio_handle_create(&h, &c)))
				continue;
			t_fill_random(want, n, seed++);
			memcpy(buf, want, n);
			window_end();
			nvio__sys.io_result = count_result;
			nvio__sys.reap_fault = count_reap;
			T_OK(nvio_pwrite(h, buf, n, path, 0, 0));
			wdepth = window_end();
			memset(buf, 0, n);
			T_OK(nvio_pread(h, buf, n, path, 0, 0));
			rdepth = window_end();
			nvio__sys_reset();
			T_MEM_EQ(buf, want, n);
			if (T_OK(t_read_file(path, got, n + 1, &fsz)) &&
			    T_EQ_U64(fsz, n))
				T_MEM_EQ(got, want, n);
			T_TRUE(wdepth <= qd && rdepth <= qd);
			if (!overlap) {
				T_EQ_INT(wdepth, qd);
				T_EQ_INT(rdepth, qd);
			}
			nvio_handle_destroy(h);
			unlink(path);
		}
}

/* A file system whose direct I/O wants 16 KiB file offsets. */
static int statx_16k(int dirfd, const char *path, int flags, unsigned mask,
		     struct statx *sx)
{
	int r = statx(dirfd, path, flags, mask, sx);

	if (r == 0 && (sx->stx_mask & STATX_DIOALIGN) && sx->stx_dio_offset_align)
		sx->stx_dio_offset_align = 16384;
	return r;
}

/*
 * An alignment coarser than the block: a direct body chunk is 16 KiB
 * while each bounce buffer holds one 4 KiB block. A misaligned buffer
 * moves buffered under AUTO and is refused under ON, naming why; an
 * aligned one goes direct in 16 KiB chunks. (Staged 16 KiB chunks used
 * to overrun their 4 KiB buffers.)
 */
static void test_coarse_align(int e, int d)
{
	const uint64_t n = 200000;
	char path[T_PATH_MAX];

	t_path(path, "coarse");
	for (int mis = 0; mis < 2; mis++) {
		unsigned char *buf = area + GUARD + mis;
		nvio_handle_t *h = NULL;
		nvio_error_t err = { .struct_size = sizeof(err) };
		size_t fsz = 0;
		int r;

		t_ctx("%s/%s 16 KiB alignment, 4 KiB blocks, mis %d",
		      t_engine_str(e), t_direct_str(d), mis);
		if (t_handle(&h, e, d, 2, 4096))
			continue;
		t_fill_random(want, n, seed++);
		memcpy(buf, want, n);
		nvio__sys.statx = statx_16k;
		r = nvio_pwrite(h, buf, n, path, 4096, 0);
		if (mis && d == NVIO_DIRECT_ON) {
			T_ERR(r, -EINVAL);
			T_ERR(nvio_last_error(h, &err), -EINVAL);
			T_TRUE(strstr(err.what, "alignment") != NULL);
			t_write_file(path, want, n + 4096);
			T_ERR(nvio_pread(h, buf, n, path, 4096, 0), -EINVAL);
		} else if (T_OK(r)) {
			memset(buf, 0, n);
			T_OK(nvio_pread(h, buf, n, path, 4096, 0));
			T_MEM_EQ(buf, want, n);
		}
		nvio__sys_reset();
		if (!(mis && d == NVIO_DIRECT_ON) &&
		    T_OK(t_read_file(path, got, n + 4097, &fsz)) &&
		    T_EQ_U64(fsz, n + 4096))
			T_MEM_EQ(got + 4096, want, n);
		nvio_handle_destroy(h);
		unlink(path);
	}
}

/* The requests of one op, as the engines report them. */
static struct {
	uint64_t off[8];
	size_t n[8];
	int count;
} seen;

static ssize_t record_result(int is_write, int fd, uint64_t off, size_t n,
			     ssize_t res)
{
	if (seen.count < 8) {
		seen.off[seen.count] = off;
		seen.n[seen.count] = n;
	}
	seen.count++;
	return res;
}

/*
 * A direct read keeps the file's own O_DIRECT alignment: on a file system
 * that takes 512-byte offsets, 8704 bytes at 4608 (sectors, not pages) go
 * as ONE direct request, not a buffered head, a page and a buffered tail
 * (nvio.data reads each sample's covering sectors so). A direct write
 * still keeps its body on pages: [4608, 13312) is a head to 8192, one
 * page and a tail, so no page is shared by the cache and direct writes.
 */
static void test_sector_reads(int e, int d)
{
	const uint64_t off = 4608, n = 8704;
	unsigned char *buf = area + GUARD;
	nvio_handle_t *h = NULL;
	char path[T_PATH_MAX];
	struct statx sx;

	if (d != NVIO_DIRECT_ON)
		return;
	t_path(path, "sectors");
	t_fill_random(want, 16384, seed++);
	t_write_file(path, want, 16384);
	if (statx(AT_FDCWD, path, 0, STATX_DIOALIGN, &sx) != 0 ||
	    !(sx.stx_mask & STATX_DIOALIGN) || sx.stx_dio_offset_align != 512 ||
	    sx.stx_dio_mem_align > 512) {
		unlink(path);
		return;		/* this file system's alignment is coarser */
	}
	t_ctx("%s/%s reads at sector alignment", t_engine_str(e), t_direct_str(d));
	if (t_handle(&h, e, d, 1, MiB))
		goto out;
	memset(buf, 0, n);
	seen.count = 0;
	nvio__sys.io_result = record_result;
	if (T_OK(nvio_pread(h, buf, n, path, off, 0)) && T_EQ_INT(seen.count, 1)) {
		T_EQ_U64(seen.off[0], off);
		T_EQ_U64(seen.n[0], n);
	}
	nvio__sys_reset();
	T_MEM_EQ(buf, want + off, n);
	t_ctx("%s/%s writes keep pages", t_engine_str(e), t_direct_str(d));
	t_fill_random(want, n, seed++);
	memcpy(buf, want, n);
	seen.count = 0;
	nvio__sys.io_result = record_result;
	if (T_OK(nvio_pwrite(h, buf, n, path, off, 0)) && T_EQ_INT(seen.count, 3)) {
		for (int i = 0; i < 3; i++) {
			int body = seen.off[i] == 8192;

			T_TRUE(seen.off[i] == off || body || seen.off[i] == 12288);
			if (body)
				T_EQ_U64(seen.n[i], 4096);
		}
	}
	nvio__sys_reset();
	memset(buf, 0, n);
	T_OK(nvio_pread(h, buf, n, path, off, 0));
	T_MEM_EQ(buf, want, n);
	nvio_handle_destroy(h);
out:
	unlink(path);
}

/*
 * nvio reaches a file through the descriptor it opened, never by its
 * name again: a path longer than any fixed buffer (over 1300 bytes)
 * works for every call, VALIDATE included, and so does VALIDATE on an
 * O_APPEND descriptor. A write far past the end leaves the gap a hole.
 * write_file keeps the exact permissions of the file it replaces,
 * whatever the umask, even read-only ones.
 */
/* 1 if path is a symbolic link to exactly target. */
static int is_link_to(const char *path, const char *target)
{
	char got_link[T_PATH_MAX];
	ssize_t k = readlink(path, got_link, sizeof(got_link) - 1);

	if (k < 0)
		return 0;
	got_link[k] = 0;
	return strcmp(got_link, target) == 0;
}

/*
 * write_file through symbolic links replaces the file they name, as an
 * open and write would, and leaves the links as they were: relative and
 * absolute, chained, dangling (the target is made); a loop is ELOOP.
 */
static void test_links(nvio_handle_t *h, int e, int d, unsigned char *buf,
		       uint64_t n)
{
	char sub[T_PATH_MAX], target[T_PATH_MAX], rel[T_PATH_MAX],
	     abs_link[T_PATH_MAX], loop_a[T_PATH_MAX], loop_b[T_PATH_MAX];
	size_t fsz = 0;
	struct stat st;

	t_ctx("%s/%s write_file through links", t_engine_str(e), t_direct_str(d));
	t_path(sub, "linkdir");
	mkdir(sub, 0755);
	snprintf(target, sizeof(target), "%s/target", sub);
	t_path(rel, "rel-link");
	t_path(abs_link, "abs-link");
	/* rel-link -> linkdir/target, relative to rel-link's directory;
	 * abs-link -> rel-link, by its absolute name */
	T_OK(symlink("linkdir/target", rel));
	T_OK(symlink(rel, abs_link));
	for (int i = 0; i < 2; i++) {
		const char *via = i ? abs_link : rel;

		/* i == 0: the target does not exist yet (a dangling link) */
		t_fill_random(want, n, seed++);
		memcpy(buf, want, n);
		T_OK(nvio_write_file(h, buf, n, via, NVIO_VALIDATE | NVIO_FSYNC));
		if (T_OK(t_read_file(target, got, n + 1, &fsz)) &&
		    T_EQ_U64(fsz, n))
			T_MEM_EQ(got, want, n);
		T_TRUE(is_link_to(rel, "linkdir/target"));
		T_TRUE(is_link_to(abs_link, rel));
		T_TRUE(lstat(target, &st) == 0 && S_ISREG(st.st_mode));
		T_EQ_INT(t_dir_count(sub), 1);	/* no temporary left */
	}

	t_ctx("%s/%s write_file on a link loop", t_engine_str(e), t_direct_str(d));
	t_path(loop_a, "loop-a");
	t_path(loop_b, "loop-b");
	T_OK(symlink(loop_b, loop_a));
	T_OK(symlink(loop_a, loop_b));
	T_ERR(nvio_write_file(h, buf, n, loop_a, 0), -ELOOP);
	T_TRUE(is_link_to(loop_a, loop_b));
	unlink(loop_a);
	unlink(loop_b);
	unlink(abs_link);
	unlink(rel);
	unlink(target);
	rmdir(sub);
}

static void test_names(int e, int d)
{
	const uint64_t n = 256 * 1024 + 5;
	unsigned char *buf = area + GUARD;
	char *lp = malloc(2048), dir[T_PATH_MAX], path[T_PATH_MAX];
	nvio_handle_t *h = NULL;
	struct stat st;
	size_t fsz = 0, len;
	mode_t old_mask;
	int fd;

	t_ctx("%s/%s names create", t_engine_str(e), t_direct_str(d));
	if (!lp || t_handle(&h, e, d, 2, 64u << 10)) {
		free(lp);
		return;
	}
	t_path(dir, "long");
	strcpy(lp, dir);
	mkdir(lp, 0755);
	for (int i = 0; i < 6; i++) {
		len = strlen(lp);
		lp[len] = '/';
		memset(lp + len + 1, 'a' + i, 200);
		lp[len + 201] = 0;
		mkdir(lp, 0755);
	}
	strcat(lp, "/file");
	t_ctx("%s/%s path of %zu bytes", t_engine_str(e), t_direct_str(d),
	      strlen(lp));
	t_fill_random(want, n, seed++);
	memcpy(buf, want, n);
	T_OK(nvio_pwrite(h, buf, n, lp, 0, NVIO_VALIDATE));
	if (T_OK(t_read_file(lp, got, n + 1, &fsz)) && T_EQ_U64(fsz, n))
		T_MEM_EQ(got, want, n);
	memset(buf, 0, n);
	T_OK(nvio_pread(h, buf, n, lp, 0, NVIO_VALIDATE));
	T_MEM_EQ(buf, want, n);
	t_fill_random(want, n, seed++);
	memcpy(buf, want, n);
	T_OK(nvio_write_file(h, buf, n, lp, NVIO_VALIDATE));
	if (T_OK(t_read_file(lp, got, n + 1, &fsz)) && T_EQ_U64(fsz, n))
		T_MEM_EQ(got, want, n);
	unlink(lp);
	for (int i = 0; i < 6; i++) {
		*strrchr(lp, '/') = 0;
		rmdir(lp);
	}
	rmdir(dir);

	t_ctx("%s/%s validate on an O_APPEND fd", t_engine_str(e), t_direct_str(d));
	t_path(path, "names");
	t_fill_random(want, n + 4096, seed++);
	t_write_file(path, want, n + 4096);
	t_fill_random(buf, n, seed++);
	memcpy(want + 4096, buf, n);
	fd = open(path, O_WRONLY | O_APPEND);
	if (T_TRUE(fd >= 0)) {
		T_OK(nvio_pwrite_fd(h, buf, n, fd, 4096, NVIO_VALIDATE));
		close(fd);
	}
	if (T_OK(t_read_file(path, got, n + 4097, &fsz)) && T_EQ_U64(fsz, n + 4096))
		T_MEM_EQ(got, want, n + 4096);

	t_ctx("%s/%s a write past the end leaves a hole", t_engine_str(e),
	      t_direct_str(d));
	unlink(path);
	T_OK(nvio_pwrite(h, buf, 4096, path, 256 * (int64_t)MiB, 0));
	if (T_OK(stat(path, &st))) {
		T_EQ_U64(st.st_size, 256 * (uint64_t)MiB + 4096);
		T_TRUE((uint64_t)st.st_blocks * 512 < MiB);
	}

	t_ctx("%s/%s write_file keeps the mode", t_engine_str(e), t_direct_str(d));
	old_mask = umask(022);
	for (int i = 0; i < 2; i++) {
		const mode_t mode = i ? 0444 : 0666;

		t_write_file(path, want, 100);
		chmod(path, mode);
		t_fill_random(buf, n, seed++);
		memcpy(want, buf, n);
		T_OK(nvio_write_file(h, buf, n, path, NVIO_VALIDATE));
		if (T_OK(stat(path, &st)))
			T_EQ_INT(st.st_mode & 07777, mode);
		if (T_OK(t_read_file(path, got, n + 1, &fsz)) && T_EQ_U64(fsz, n))
			T_MEM_EQ(got, want, n);
	}
	umask(old_mask);
	unlink(path);
	test_links(h, e, d, buf, n);
	nvio_handle_destroy(h);
	free(lp);
}

/*
 * Every buffer misalignment up to a cache line, with file offsets that
 * shift the aligned body against the buffer: a staged copy's destination
 * and source each take every position within 64 bytes, in pieces above
 * and below the size from which copies bypass the cache.
 */
static void test_stage_alignments(int e, int d)
{
	static const int64_t offs[] = { 0, 1, 4096 + 7, 65535 };
	char path[T_PATH_MAX];
	nvio_config_t c;
	nvio_handle_t *h = NULL;

	t_path(path, "stagealign");
	t_config(&c, e, d, 96u << 10, 4);
	t_ctx("%s/%s stage alignments create", t_engine_str(e),
	      t_direct_str(d));
	if (!T_OK(nvio_handle_create(&h, &c)))
		return;
	for (int mis = 0; mis < 64; mis++) {
		int64_t off = offs[mis % 4];

		t_ctx("%s/%s block 96K mis %d offset %lld", t_engine_str(e),
		      t_direct_str(d), mis, (long long)off);
		round_trip(h, path, MiB + 4097 + (uint64_t)mis, off, mis,
			   (uint64_t)mis * 13, mis % 5 == 0 ? NVIO_ASYNC : 0);
		if (t_failures() > 10)
			break;
	}
	nvio_handle_destroy(h);
	unlink(path);
}

/*
 * io_uring rings are set up with deferred completions where the kernel
 * has them (6.1+), else plain. Both setups, and the fallback from flags
 * the kernel refuses, must move the same bytes; and a reap that does not
 * wait (min 0) must still see deferred completions.
 */
static void test_uring_setups(void)
{
	static const struct { unsigned flags; const char *name; } setups[] = {
		{ 0, "plain" },
		{ 1u << 31, "refused flags, fallback" },
		{ ~0u, "default" },
	};
	const unsigned saved = nvio__uring_flags;
	char path[T_PATH_MAX];

	if (!t_engine_ok(NVIO_ENGINE_URING))
		return;
	t_path(path, "uring");
	for (size_t i = 0; i < sizeof(setups) / sizeof(setups[0]); i++) {
		const struct nvio__engine_ops *eng = &nvio__engine_uring;
		struct nvio__io io, *ios[1] = { &io }, *out[1];
		nvio_handle_t *h;
		void *ctx = NULL;
		int fd, n = 0;

		nvio__uring_flags = setups[i].flags == ~0u ? saved : setups[i].flags;
		for (int j = 0; j < T_N_DIRECTS; j++) {
			int d = t_direct_list[j];

			if (!t_combo_ok(NVIO_ENGINE_URING, d))
				continue;
			t_ctx("io_uring %s setup, %s", setups[i].name, t_direct_str(d));
			if (t_handle(&h, NVIO_ENGINE_URING, d, 2, 128u << 10))
				continue;
			T_EQ_INT(nvio_get_engine(h), NVIO_ENGINE_URING);
			round_trip(h, path, 3 * MiB + 5, 4096, 0, 100, 0);
			round_trip(h, path, MiB + 1, 1, 1, 0, NVIO_ASYNC);
			nvio_handle_destroy(h);
		}

		t_ctx("io_uring %s setup: reap without waiting", setups[i].name);
		t_fill_random(want, 65536, seed++);
		if (t_write_file(path, want, 65536)) {
			T_FAILF("libc write of %s failed", path);
			break;
		}
		/* O_DIRECT where the filesystem has it: a buffered read of
		 * cached bytes completes inside the submit, never deferred */
		fd = open(path, O_RDONLY | O_DIRECT);
		if (fd < 0)
			fd = open(path, O_RDONLY);
		if (!T_TRUE(fd >= 0) || !T_OK(eng->init(&ctx, 4))) {
			if (fd >= 0)
				close(fd);
			break;
		}
		memset(&io, 0, sizeof(io));
		memset(got, 0, 65536);
		io.fd = fd;
		io.buf = got;
		io.len = 65536;
		if (T_EQ_INT(eng->submit(ctx, ios, 1, 0), 1)) {
			/* up to 10 s: a completion nobody asks for never comes */
			for (int tries = 0; tries < 10000 && n == 0; tries++) {
				n = eng->reap(ctx, out, 0, 1);
				if (n == 0)
					usleep(1000);
			}
			if (T_EQ_INT(n, 1) && T_TRUE(out[0] == &io) &&
			    T_EQ_INT(io.res, 65536))
				T_MEM_EQ(got, want, 65536);
		}
		eng->fini(ctx);
		close(fd);
	}
	nvio__uring_flags = saved;
	unlink(path);
}

int main(void)
{
	static const uint32_t pars[] = { 1, 3 };
	static const uint64_t blocks[] = { 4096, MiB };
	int cfg_index = 0, last_engine = -1;

	t_init("rw");
	area = t_alloc(GUARD + 4096 + MAXSZ + GUARD);
	want = t_alloc(FILE_MAX);
	got = t_alloc(FILE_MAX + 1);

	T_FOR_EACH_COMBO(e, d) {
		/* the offset rotation restarts with each engine */
		if (e != last_engine)
			cfg_index = 0;
		last_engine = e;
		for (int p = 0; p < 2; p++)
			for (int b = 0; b < 2; b++, cfg_index++) {
				nvio_handle_t *h;
				char combo[96];

				snprintf(combo, sizeof(combo), "%s par %u bs %llu",
					 t_combo(), pars[p],
					 (unsigned long long)blocks[b]);
				t_ctx("%s create", combo);
				if (t_handle(&h, e, d, pars[p], blocks[b]))
					continue;
				g_fail_before = t_failures();
				matrix(h, combo, cfg_index);
				if (p == 1 && b == 0) {
					test_grow(h, combo);
					test_whole(h, combo);
				}
				t_ctx("%s end", combo);
				T_EQ_U64(nvio_pending(h), 0);
				nvio_handle_destroy(h);
			}
		test_odd_block(e, d);
		test_modes(e, d);
		test_staged_pipeline(e, d);
		test_batch_depth(e, d);
		test_coarse_align(e, d);
		test_names(e, d);
		test_stage_alignments(e, d);
		test_sector_reads(e, d);
	}
	/* Direct AUTO: whatever it picks, the bytes are the same. */
	for (int i = 0; i < T_N_ENGINES; i++)
		if (t_engine_ok(t_engine_list[i]))
			test_modes(t_engine_list[i], NVIO_DIRECT_AUTO);
	test_uring_setups();
	free(area);
	free(want);
	free(got);
	return t_done();
}
