/*
 * pages.c - whether an O_DIRECT write straight from a caller's memory
 * makes full-size requests, or is better copied through the staging
 * buffers.
 *
 * A request's segments are the physically contiguous runs of its
 * memory. A device that takes fewer segments per request than its size
 * limit holds 4 KiB pages (virtio-blk here: 254 segments, 4 MiB
 * requests) caps every request from memory in 4 KiB pages at
 * max_segments pages: it is driven with many small requests. Huge pages
 * fill its requests, and the staging buffers are in huge pages
 * (staging.c). Measured on such a disk, a 2 GiB write into a new file
 * went at 1.48 GB/s from 4 KiB pages, 2.44 GB/s copied through staging
 * and 3.02 GB/s from huge pages (bench/results/new-file-2026-11-25.md).
 *
 * So a large direct write whose memory is mostly in 4 KiB pages, on a
 * device that splits them, is staged. A large direct read is staged
 * (read into the staging buffers, then copied out) where its
 * destination is mostly present in 4 KiB pages; a destination not
 * faulted in yet goes direct, since the pages a read faults in follow
 * the mapping's own policy (nvio.load's memory asks for huge pages).
 * Measured on the virtio disk (254 segments, 4 MiB requests), a
 * vectored read of 10,000 pieces into present 4 KiB pages went at 0.68x
 * fio-best direct and 0.99x staged; on the RAM disk (a loop device:
 * 128 segments of at most 64 KiB, 1280 KiB requests) both were within
 * the noise of each other, the staged one at 0.03 CPU s/GB more
 * (bench/results/api02-vec-2026-11-26.md).
 * Where the kernel cannot say how memory is mapped (PAGEMAP_SCAN is
 * Linux 6.7+), nothing changes: the op goes direct, as before.
 * $NVIO_STAGE_SMALL_PAGES=0 turns the staging off, =1 stages every such
 * write and read whatever its pages and device. Ops whose extents
 * average under 256 KiB (scattered small pieces: no request of them is
 * split) are never staged for their pages (submit.c plan_op).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "internal.h"
#include "sys.h"

/* <linux/fs.h> of Linux 6.7; older headers lack it. */
struct pm_scan_arg_ {
	uint64_t size, flags, start, end, walk_end, vec, vec_len, max_pages;
	uint64_t category_inverted, category_mask, category_anyof_mask, return_mask;
};
struct page_region_ {
	uint64_t start, end, categories;
};
#define PAGEMAP_SCAN_ _IOWR('f', 16, struct pm_scan_arg_)
#define PAGE_IS_PRESENT_ (1u << 3)
#define PAGE_IS_HUGE_ (1u << 6)

/* Bytes of memory sampled per op: enough to tell, cheap to ask. */
#define SAMPLE_BYTES (64ull << 20)

/* -1: no override, 0 never stage, 1 always stage. */
static int override(void)
{
	const char *e = getenv("NVIO_STAGE_SMALL_PAGES");

	if (!e || !*e || !strcmp(e, "auto"))
		return -1;
	return strcmp(e, "0") != 0;
}

static long read_long(const char *path)
{
	char buf[32];
	long v = -1;
	int fd = nvio__sys.open(path, O_RDONLY | O_CLOEXEC, 0);
	ssize_t n;

	if (fd < 0)
		return -1;
	n = read(fd, buf, sizeof(buf) - 1);
	if (n > 0) {
		buf[n] = '\0';
		v = strtol(buf, NULL, 10);
	}
	nvio__sys.close(fd);
	return v;
}

/* The device's request limits; a partition's are its disk's. */
static int splits(dev_t dev)
{
	char path[96];
	long segs, kb;

	for (int up = 0; up < 2; up++) {
		snprintf(path, sizeof(path), "/sys/dev/block/%u:%u/%squeue/max_segments",
			 major(dev), minor(dev), up ? "../" : "");
		segs = read_long(path);
		if (segs <= 0)
			continue;
		snprintf(path, sizeof(path), "/sys/dev/block/%u:%u/%squeue/max_sectors_kb",
			 major(dev), minor(dev), up ? "../" : "");
		kb = read_long(path);
		return kb > 0 && (uint64_t)segs * NVIO__PAGE < (uint64_t)kb * 1024;
	}
	return 0;	/* no block device behind it, or nothing to read */
}

/* A few devices remembered: files are opened far more often than disks. */
static struct {
	dev_t dev;
	int splits;
} seen[8];
static unsigned nseen;
static pthread_mutex_t seen_lock = PTHREAD_MUTEX_INITIALIZER;

int nvio__dev_splits_small_pages(dev_t dev)
{
	int r = -1;

	pthread_mutex_lock(&seen_lock);
	for (unsigned i = 0; i < nseen && i < 8; i++)
		if (seen[i].dev == dev)
			r = seen[i].splits;
	pthread_mutex_unlock(&seen_lock);
	if (r >= 0)
		return r;
	r = splits(dev);
	pthread_mutex_lock(&seen_lock);
	seen[nseen % 8].dev = dev;
	seen[nseen % 8].splits = r;
	nseen++;
	pthread_mutex_unlock(&seen_lock);
	return r;
}

/*
 * Bytes of [p, p + n) in pages of every category of cats (PAGE_IS_HUGE_:
 * mapped by huge pages; PAGE_IS_PRESENT_: faulted in), through
 * PAGEMAP_SCAN on this process's pagemap (opened per call: a descriptor
 * kept open would read the parent's memory in a forked child). -1: the
 * kernel cannot say.
 */
static int64_t bytes_in(int fd, const void *p, uint64_t n, uint64_t cats)
{
	struct page_region_ r[16];
	uint64_t start = (uintptr_t)p & ~(uint64_t)(NVIO__PAGE - 1);
	uint64_t end = ((uintptr_t)p + n + NVIO__PAGE - 1) & ~(uint64_t)(NVIO__PAGE - 1);
	int64_t got = 0;

	while (start < end) {
		struct pm_scan_arg_ a = {
			.size = sizeof(a), .start = start, .end = end,
			.vec = (uintptr_t)r, .vec_len = 16,
			.category_mask = cats, .return_mask = cats,
		};
		long k = ioctl(fd, PAGEMAP_SCAN_, &a);

		if (k < 0)
			return -1;
		for (long i = 0; i < k; i++)
			got += (int64_t)(r[i].end - r[i].start);
		if (a.walk_end <= start)
			break;
		start = a.walk_end;
	}
	return got;
}

static int64_t huge_bytes(int fd, const void *p, uint64_t n)
{
	return bytes_in(fd, p, n, PAGE_IS_HUGE_);
}

int64_t nvio__mem_huge_bytes(const void *p, uint64_t n)
{
	int fd = nvio__sys.open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC, 0);
	int64_t h;

	if (fd < 0)
		return -1;
	h = huge_bytes(fd, p, n);
	nvio__sys.close(fd);
	return h;
}

/*
 * A write: whether its memory is mostly not in huge pages. A read:
 * whether its destination is mostly faulted in, in 4 KiB pages.
 */
int nvio__op_stage_small_pages(const struct nvio__op *op)
{
	uint64_t sampled = 0;
	int64_t huge = 0, present = 0;
	int o = override(), fd;

	if (o >= 0)
		return o;
	if (!op->file->split_small)
		return 0;
	fd = nvio__sys.open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC, 0);
	if (fd < 0)
		return 0;
	for (uint32_t i = 0; i < op->nsegs && sampled < SAMPLE_BYTES; i++) {
		uint64_t n = op->segs[i].len;
		int64_t h, pr = 0;

		if (n > SAMPLE_BYTES - sampled)
			n = SAMPLE_BYTES - sampled;
		h = huge_bytes(fd, op->segs[i].base, n);
		if (h >= 0 && !op->is_write)
			pr = bytes_in(fd, op->segs[i].base, n, PAGE_IS_PRESENT_);
		if (h < 0 || pr < 0) {
			nvio__sys.close(fd);
			return 0;	/* cannot tell: direct, as always */
		}
		huge += h;
		present += pr;
		sampled += n;
	}
	nvio__sys.close(fd);
	if (op->is_write)
		return (uint64_t)huge * 2 < sampled;	/* mostly small pages */
	return (uint64_t)(present - huge) * 2 > sampled;	/* mostly present, small */
}
