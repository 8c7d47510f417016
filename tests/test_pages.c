/*
 * test_pages.c - large O_DIRECT writes from memory in 4 KiB pages, and
 * large O_DIRECT reads into memory present in 4 KiB pages, go through the
 * staging buffers where the file's device splits such memory into small
 * requests (src/pages.c); ops on huge pages, ops under 4 MiB, ops of
 * small scattered pieces (a batch of samples) and reads into memory not
 * faulted in yet go straight from (to) the caller's memory. Which way an op went shows in the staging budget: a handle
 * makes its bounce pools on first use. The bytes are compared on every
 * engine either way.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "t.h"
#include "../src/internal.h"

#define BIG (16u << 20)
#define SMALL (2u << 20)

/* A buffer in memory of the page size asked for, not touched yet. */
static unsigned char *region(size_t n, int huge)
{
	void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED)
		return NULL;
	madvise(p, n, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
	return p;
}

/* Writes n bytes of buf with a fresh handle; returns the staging bytes
 * its pools took (0: nothing was staged). */
static uint64_t write_with(int engine, const char *path, const unsigned char *buf, size_t n)
{
	nvio_handle_t *h = NULL;
	nvio_config_t c;
	uint64_t in_use = 0;
	unsigned char *got = malloc(n);
	size_t size = 0;

	T_OK(t_write_file(path, "", 0));	/* a new file each time */
	t_config(&c, engine, NVIO_DIRECT_ON, 8u << 20, 32);
	if (T_OK(nvio_handle_create(&h, &c))) {
		T_OK(nvio_pwrite(h, buf, n, path, 0, NVIO_FSYNC));
		nvio_staging_limit(&in_use);
		nvio_handle_destroy(h);
	}
	if (got && T_OK(t_read_file(path, got, n, &size))) {
		T_EQ_U64(size, n);
		T_MEM_EQ(got, buf, n);
	}
	free(got);
	return in_use;
}

/* Reads n bytes into buf (faulted in first unless fresh) with a fresh
 * handle, compares them with want; returns the staging bytes taken. */
static uint64_t read_into(int engine, const char *path, unsigned char *buf, size_t n,
			  const unsigned char *want, int fresh)
{
	nvio_handle_t *h = NULL;
	nvio_config_t c;
	uint64_t in_use = 0;

	if (!fresh)
		memset(buf, 0, n);
	t_config(&c, engine, NVIO_DIRECT_ON, 8u << 20, 32);
	if (T_OK(nvio_handle_create(&h, &c))) {
		T_OK(nvio_pread(h, buf, n, path, 0, 0));
		nvio_staging_limit(&in_use);
		nvio_handle_destroy(h);
	}
	T_MEM_EQ(buf, want, n);
	return in_use;
}

static uint64_t read_with(int engine, const char *path, unsigned char *buf, size_t n,
			  const unsigned char *want)
{
	return read_into(engine, path, buf, n, want, 0);
}

/* A read into fresh memory in 4 KiB pages, never touched before. */
static uint64_t read_fresh(int engine, const char *path, size_t n, const unsigned char *want)
{
	unsigned char *p = region(n, 0);
	uint64_t in_use = 0;

	if (T_TRUE(p != NULL)) {
		in_use = read_into(engine, path, p, n, want, 1);
		munmap(p, n);
	}
	return in_use;
}

/* One vectored read of 1,024 pieces of 12 KiB, each at its own offset
 * 16 KiB apart (a batch of samples), into buf faulted in (4 KiB pages);
 * compares them with want; returns the staging bytes taken. */
static uint64_t read_scattered(int engine, const char *path, unsigned char *buf,
			       const unsigned char *want)
{
	enum { N = 1024, LEN = 12u << 10, STRIDE = 16u << 10 };
	static nvio_iovec_t v[N];
	nvio_handle_t *h = NULL;
	nvio_file_t *f;
	nvio_config_t c;
	uint64_t in_use = 0;
	int err = 0;

	memset(buf, 0, (size_t)N * LEN);
	for (int i = 0; i < N; i++)
		v[i] = (nvio_iovec_t){ buf + (size_t)i * LEN, LEN, (int64_t)i * STRIDE };
	t_config(&c, engine, NVIO_DIRECT_ON, 128u << 10, 128);
	if (T_OK(nvio_handle_create(&h, &c))) {
		f = nvio_file_open(h, path, NVIO_FILE_READ, &err);
		if (T_OK(err)) {
			T_OK(nvio_file_preadv(f, v, N, NVIO_OFFSET_PER_IOV, 0));
			nvio_staging_limit(&in_use);
			nvio_file_close(f);
		}
		nvio_handle_destroy(h);
	}
	for (int i = 0; i < N; i++)
		if (!T_MEM_EQ(buf + (size_t)i * LEN, want + (size_t)i * STRIDE, LEN))
			break;
	return in_use;
}

int main(void)
{
	unsigned char *small = region(BIG, 0), *huge = region(BIG, 1), *dst = region(BIG, 0);
	char path[T_PATH_MAX];
	struct stat st;
	int64_t hb;
	int splits;

	t_init("pages");
	if (!small || !huge || !dst)
		t_skip("no memory for the buffers");
	t_fill_random(small, BIG, 5);
	t_fill_random(huge, BIG, 6);
	t_path(path, "pages");
	T_OK(t_write_file(path, "", 0));
	T_OK(stat(path, &st));
	splits = nvio__dev_splits_small_pages(st.st_dev);
	T_TRUE(splits == 0 || splits == 1);
	T_EQ_INT(nvio__dev_splits_small_pages(st.st_dev), splits);	/* remembered */
	hb = nvio__mem_huge_bytes(small, BIG);
	T_TRUE(hb <= 0);		/* asked for 4 KiB pages: none huge (or cannot tell) */
	hb = nvio__mem_huge_bytes(huge, BIG);
	T_TRUE(hb <= (int64_t)BIG);
	T_FOR_EACH_COMBO(e, d) {
		if (d != NVIO_DIRECT_ON)
			continue;
		setenv("NVIO_STAGE_SMALL_PAGES", "1", 1);
		T_TRUE(write_with(e, path, small, BIG) > 0);		/* staged */
		T_TRUE(read_with(e, path, huge, BIG, small) > 0);	/* staged */
		T_EQ_U64(write_with(e, path, small, SMALL), 0);	/* too small to stage */
		T_EQ_U64(read_with(e, path, huge, SMALL, small), 0);	/* too small to stage */
		t_fill_random(huge, BIG, 6);
		setenv("NVIO_STAGE_SMALL_PAGES", "0", 1);
		T_EQ_U64(write_with(e, path, small, BIG), 0);		/* never staged */
		T_EQ_U64(read_with(e, path, dst, BIG, small), 0);
		unsetenv("NVIO_STAGE_SMALL_PAGES");
		/* auto: 4 KiB pages are staged where the device splits them and
		 * the kernel can tell (PAGEMAP_SCAN); huge pages never */
		T_EQ_U64(write_with(e, path, small, BIG) > 0,
			 splits && nvio__mem_huge_bytes(small, BIG) == 0);
		T_EQ_U64(read_with(e, path, dst, BIG, small) > 0,
			 splits && nvio__mem_huge_bytes(dst, BIG) == 0);
		/* 12 MiB in scattered 12 KiB pieces: no request is split,
		 * never staged, even where asked to stage every large op */
		T_EQ_U64(read_scattered(e, path, dst, small), 0);
		setenv("NVIO_STAGE_SMALL_PAGES", "1", 1);
		T_EQ_U64(read_scattered(e, path, dst, small), 0);
		unsetenv("NVIO_STAGE_SMALL_PAGES");
		/* a destination not faulted in yet takes the pages the read
		 * faults in: direct */
		T_EQ_U64(read_fresh(e, path, BIG, small), 0);
		if (nvio__mem_huge_bytes(huge, BIG) == (int64_t)BIG) {
			T_EQ_U64(read_with(e, path, huge, BIG, small), 0);
			t_fill_random(huge, BIG, 6);
			T_EQ_U64(write_with(e, path, huge, BIG), 0);
		}
	}
	munmap(small, BIG);
	munmap(huge, BIG);
	munmap(dst, BIG);
	return t_done();
}
