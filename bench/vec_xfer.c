/*
 * vec_xfer.c - nvio's contenders in bench/vec_bench.py: one vectored write
 * or read of many pieces (nvio_file_pwritev / nvio_file_preadv) against
 * one buffer of the same total (nvio_file_pwrite / nvio_file_pread).
 *
 * A stdin/stdout server (like nvio_xfer.c) so that buffers live across the
 * interleaved rounds and only the transfer is timed:
 *
 *   load SIZESFILE KINDS the piece sizes, one per line (bench/vec_sizes.py);
 *                       makes the memories of KINDS (comma list; single is
 *                       always made), all holding the same byte stream
 *                       (word i of the file = i*K ^ 7)
 *   run OP KIND PATH CFG
 *                       OP write|read; KIND
 *                         vec-aligned  every piece page-aligned (one arena,
 *                                      each piece at a 4 KiB boundary,
 *                                      4 KiB pages, unlocked)
 *                         vec-aligned-thp the same arena made with
 *                                      MADV_HUGEPAGE (2 MiB pages, as
 *                                      nvio_mem_alloc's), unlocked
 *                         vec-malloc   every piece its own malloc() (16-byte
 *                                      aligned, unlocked)
 *                         single       one buffer of the total from
 *                                      nvio_mem_alloc (locked)
 *                         single-malloc one malloc'd buffer at address + 1
 *                       KIND@0 or KIND@1: the same memory, moved with
 *                       NVIO_STAGE_SMALL_PAGES=0 (or 1) set for this run
 *                       (src/pages.c), so staged and direct share rounds
 *                       CFG "default" or BLOCK:QD:PAR:ENGINE:SINGLE:OVERLAP
 *   quit
 *
 * The file is opened (nvio_file_open, READ|WRITE, untimed) and closed
 * (untimed) around the one timed call; writes pass NVIO_FSYNC, laid end to
 * end from offset 0 over the existing file (no truncation). A read first
 * zeroes its memory (untimed) and answers a checksum of it, which must
 * equal the one `load` answers.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>

#include "nvio.h"

#define PAT_K 0x9E3779B97F4A7C15ull

static uint64_t *sizes;
static uint32_t npieces;
static uint64_t total;
static unsigned char *arena, *arena_thp;	/* vec-aligned, vec-aligned-thp */
static nvio_iovec_t *iov_al, *iov_th, *iov_ma;	/* ... and vec-malloc */
static unsigned char *single;		/* locked */
static unsigned char *single_raw;	/* single-malloc: single_raw + 1 */
static uint64_t want_sum;

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double cpu(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
	       (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

/* Checksum of the byte stream the pieces hold, whatever their layout: the
 * byte at every 4 KiB of the file and the first and last byte of each
 * piece, each times (its file offset + 1). */
static uint64_t sum_iov(const nvio_iovec_t *v, uint32_t n)
{
	uint64_t s = 0, base = 0;
	for (uint32_t i = 0; i < n; i++) {
		const unsigned char *b = v[i].base;
		uint64_t len = v[i].len, p = (4096 - base % 4096) % 4096;
		for (; p < len; p += 4096)
			s += (uint64_t)b[p] * (base + p + 1);
		s += (uint64_t)b[0] * (base + 1) + (uint64_t)b[len - 1] * (base + len);
		base += len;
	}
	return s;
}

static uint64_t sum_kind(const char *kind)
{
	if (!strcmp(kind, "vec-aligned"))
		return sum_iov(iov_al, npieces);
	if (!strcmp(kind, "vec-aligned-thp"))
		return sum_iov(iov_th, npieces);
	if (!strcmp(kind, "vec-malloc"))
		return sum_iov(iov_ma, npieces);
	/* the same pieces, laid over the one buffer */
	unsigned char *one = strcmp(kind, "single") ? single_raw + 1 : single;
	nvio_iovec_t *v = malloc(npieces * sizeof(*v));
	uint64_t base = 0, s;
	for (uint32_t i = 0; i < npieces; i++) {
		v[i].base = one + base;
		v[i].len = sizes[i];
		v[i].offset = 0;
		base += sizes[i];
	}
	s = sum_iov(v, npieces);
	free(v);
	return s;
}

static void fail(const char *what, int err)
{
	printf("{\"ok\": false, \"what\": \"%s\", \"err\": %d, \"msg\": \"%s\"}\n", what, err,
	       nvio_strerror(err));
	fflush(stdout);
}

static int parse_cfg(const char *s, nvio_config_t *cfg)
{
	unsigned long long bs;
	unsigned qd, par, sgl, overlap;
	char eng[32];

	nvio_config_init(cfg);
	if (!strcmp(s, "default"))
		return 0;
	if (sscanf(s, "%llu:%u:%u:%31[^:]:%u:%u", &bs, &qd, &par, eng, &sgl, &overlap) != 6)
		return -EINVAL;
	cfg->block_size = bs;
	cfg->queue_depth = qd;
	cfg->intra_op_parallelism = par;
	cfg->single_submit = sgl;
	cfg->overlap_events = overlap;
	cfg->engine = nvio_engine_from_name(eng);
	return cfg->engine < 0 ? cfg->engine : 0;
}

static nvio_handle_t *handle_for(const char *key)
{
	static char keys[16][128];
	static nvio_handle_t *hs[16];
	static int n;
	nvio_config_t cfg;

	for (int i = 0; i < n; i++)
		if (!strcmp(keys[i], key))
			return hs[i];
	if (n == 16 || parse_cfg(key, &cfg))
		return NULL;
	if (nvio_handle_create(&hs[n], strcmp(key, "default") ? &cfg : NULL))
		return NULL;
	snprintf(keys[n], sizeof(keys[n]), "%s", key);
	return hs[n++];
}

static int has(const char *list, const char *k)
{
	size_t n = strlen(k);
	for (const char *p = list; (p = strstr(p, k)) != NULL; p += n)
		if ((p == list || p[-1] == ',') && (p[n] == ',' || p[n] == '@' || p[n] == 0))
			return 1;
	return 0;
}

static void cmd_load(const char *file, const char *kinds)
{
	FILE *f = fopen(file, "r");
	unsigned long long x;
	uint32_t cap = 1024;
	uint64_t off, arena_bytes = 0;
	unsigned mflags = 0;

	if (!f) {
		fail("open sizes", -errno);
		return;
	}
	sizes = malloc(cap * sizeof(*sizes));
	while (fscanf(f, "%llu", &x) == 1) {
		if (npieces == cap)
			sizes = realloc(sizes, (cap *= 2) * sizeof(*sizes));
		sizes[npieces++] = x;
		total += x;
		arena_bytes += (x + 4095) / 4096 * 4096;
	}
	fclose(f);
	if (nvio_mem_alloc((void **)&single, total, 0, &mflags)) {
		fail("nvio_mem_alloc", -ENOMEM);
		return;
	}
	uint64_t words = total / 8;
	for (uint64_t i = 0; i < words; i++) {
		uint64_t v = (i * PAT_K) ^ 7;
		memcpy(single + i * 8, &v, 8);
	}
	for (uint64_t i = words * 8; i < total; i++)
		single[i] = (unsigned char)i;
	if (has(kinds, "single-malloc")) {
		single_raw = malloc(total + 64);
		if (!single_raw) {
			fail("malloc", -ENOMEM);
			return;
		}
		memcpy(single_raw + 1, single, total);
	}
	int al = has(kinds, "vec-aligned"), th = has(kinds, "vec-aligned-thp"),
	    ma = has(kinds, "vec-malloc");
	if ((al && posix_memalign((void **)&arena, 4096, arena_bytes)) ||
	    (th && posix_memalign((void **)&arena_thp, 2u << 20, arena_bytes))) {
		fail("malloc", -ENOMEM);
		return;
	}
	if (th)
		madvise(arena_thp, arena_bytes, MADV_HUGEPAGE);
	iov_al = calloc(npieces, sizeof(*iov_al));
	iov_th = calloc(npieces, sizeof(*iov_th));
	iov_ma = calloc(npieces, sizeof(*iov_ma));
	unsigned long misaligned = 0;
	uint64_t aoff = 0;
	off = 0;
	for (uint32_t i = 0; i < npieces; i++) {
		if (al) {
			iov_al[i].base = arena + aoff;
			iov_al[i].len = sizes[i];
			memcpy(iov_al[i].base, single + off, sizes[i]);
		}
		if (th) {
			iov_th[i].base = arena_thp + aoff;
			iov_th[i].len = sizes[i];
			memcpy(iov_th[i].base, single + off, sizes[i]);
		}
		if (ma) {
			iov_ma[i].base = malloc(sizes[i]);
			iov_ma[i].len = sizes[i];
			if (!iov_ma[i].base) {
				fail("malloc", -ENOMEM);
				return;
			}
			misaligned += (uintptr_t)iov_ma[i].base % 4096 != 0;
			memcpy(iov_ma[i].base, single + off, sizes[i]);
		}
		off += sizes[i];
		aoff += (sizes[i] + 4095) / 4096 * 4096;
	}
	want_sum = sum_kind("single");
	uint64_t s1 = al ? sum_kind("vec-aligned") : want_sum,
		 s2 = ma ? sum_kind("vec-malloc") : want_sum,
		 s3 = single_raw ? sum_kind("single-malloc") : want_sum,
		 s4 = th ? sum_kind("vec-aligned-thp") : want_sum;
	printf("{\"ok\": %s, \"pieces\": %u, \"total\": %llu, \"sum\": %llu, "
	       "\"malloc_not_page_aligned\": %lu}\n",
	       s1 == want_sum && s2 == want_sum && s3 == want_sum && s4 == want_sum ? "true" : "false", npieces,
	       (unsigned long long)total, (unsigned long long)want_sum, misaligned);
	fflush(stdout);
}

static void cmd_run(const char *op, const char *kind_arg, const char *path, const char *cfgkey)
{
	char kind[64];
	const char *at = strchr(kind_arg, '@');

	snprintf(kind, sizeof(kind), "%.*s", at ? (int)(at - kind_arg) : 63, kind_arg);
	static const char *orig;	/* the environment's own setting */
	static int saved;

	if (!saved) {
		orig = getenv("NVIO_STAGE_SMALL_PAGES");
		orig = orig ? strdup(orig) : NULL;
		saved = 1;
	}
	if (at)
		setenv("NVIO_STAGE_SMALL_PAGES", at + 1, 1);
	else if (orig)
		setenv("NVIO_STAGE_SMALL_PAGES", orig, 1);
	else
		unsetenv("NVIO_STAGE_SMALL_PAGES");
	int wr = !strcmp(op, "write"), vec = !strncmp(kind, "vec-", 4), r;
	nvio_handle_t *h = handle_for(cfgkey);
	const nvio_iovec_t *v = !strcmp(kind, "vec-aligned") ? iov_al :
				!strcmp(kind, "vec-aligned-thp") ? iov_th : iov_ma;
	unsigned char *one = !strcmp(kind, "single") ? single : single_raw + 1;
	nvio_file_t *f;

	if (!h) {
		fail("handle", -EINVAL);
		return;
	}
	if (!wr) {
		if (vec)
			for (uint32_t i = 0; i < npieces; i++)
				memset(v[i].base, 0, v[i].len);
		else
			memset(one, 0, total);
	}
	f = nvio_file_open(h, path, NVIO_FILE_READ | NVIO_FILE_WRITE, &r);
	if (!f) {
		fail("nvio_file_open", r);
		return;
	}
	double c0 = cpu(), t0 = now();
	if (vec)
		r = wr ? nvio_file_pwritev(f, v, npieces, 0, NVIO_FSYNC) :
			 nvio_file_preadv(f, v, npieces, 0, 0);
	else
		r = wr ? nvio_file_pwrite(f, one, total, 0, NVIO_FSYNC) :
			 nvio_file_pread(f, one, total, 0, 0);
	double t1 = now(), c1 = cpu();
	nvio_file_info_t fi = { .struct_size = sizeof(fi) };
	nvio_file_info(f, &fi);
	nvio_file_close(f);
	if (r) {
		fail(wr ? "write" : "read", r);
		return;
	}
	uint64_t s = wr ? 0 : sum_kind(kind);
	printf("{\"ok\": true, \"secs\": %.6f, \"cpu\": %.6f, \"direct\": %d, "
	       "\"sum_ok\": %s}\n", t1 - t0, c1 - c0, fi.direct,
	       wr || s == want_sum ? "true" : "false");
	fflush(stdout);
}

int main(void)
{
	char line[4096], a[64], b[64], c[2048], d[128];

	while (fgets(line, sizeof(line), stdin)) {
		if (!strncmp(line, "quit", 4))
			break;
		if (sscanf(line, "load %2047s %127s", c, d) == 2)
			cmd_load(c, d);
		else if (sscanf(line, "run %63s %63s %2047s %127s", a, b, c, d) == 4)
			cmd_run(a, b, c, d);
		else
			fail("parse", -EINVAL);
	}
	return 0;
}
