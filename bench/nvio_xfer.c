/*
 * nvio_xfer.c - the nvio contender of bench/core_bench.py.
 *
 * A small server on the public API only (nvio.h): it reads one command
 * per line on stdin and answers one JSON line on stdout, so that buffers
 * and handles live across the interleaved rounds and only the transfer
 * itself is timed (as for fio's own runtime and DeepSpeed's call).
 *
 *   run OP MEM PATH SIZE SEED CFG   OP read|write; MEM locked|pageable|huge
 *                                   (pageable: malloc'd, address + 1, so
 *                                   neither locked nor aligned, and kept
 *                                   across rounds like the locked one;
 *                                   huge: for
 *                                   diagnosis, 2 MiB aligned, MADV_HUGEPAGE,
 *                                   mlock'd, not from nvio); SEED: the
 *                                   pattern a write puts in the file (0:
 *                                   whatever the buffer holds);
 *                                   CFG "default" (nvio_config_init) or
 *                                   BLOCK:QD:PAR:ENGINE:SINGLE:OVERLAP[:STAGING]
 *   free                            drops cached handles and buffers
 *   quit
 *
 * A write is nvio_pwrite(..., NVIO_FSYNC) over the existing file (no
 * truncation, as fio, DeepSpeed and the Python baseline do), a read is
 * nvio_pread. The answer gives wall seconds of that one call and the
 * process's user and system CPU seconds over it (getrusage RUSAGE_SELF,
 * which counts every thread, nvio's workers included), plus a checksum of
 * the buffer after a read (see pattern_sum) for validation.
 *
 * Build (bench/core_bench.py does it):
 *   cc -O2 -Iinclude bench/nvio_xfer.c build/libnvio.a $(make -s print-libs)
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

#define MAX_HANDLES 64

struct hent {
	char key[128];
	nvio_handle_t *h;
};

static struct hent handles[MAX_HANDLES];
static int nhandles;

static void *locked_buf;
static uint64_t locked_size;
/* Kept like the locked buffer: a fresh malloc every round would time this
 * VM's first passes over new memory (copies at 5-8 GB/s, later 11-13)
 * against a locked buffer that is warm. */
static unsigned char *pageable_raw;
static uint64_t pageable_size;

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void cpu(double *user, double *sys)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	*user = (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6;
	*sys = (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

/* Word i (8 bytes, little endian) of a pattern is i * K ^ seed. */
#define PAT_K 0x9E3779B97F4A7C15ull

static void pattern_fill(unsigned char *b, uint64_t n, uint64_t seed)
{
	uint64_t words = n / 8, i;
	for (i = 0; i < words; i++) {
		uint64_t v = (i * PAT_K) ^ seed;
		memcpy(b + i * 8, &v, 8);
	}
	for (i = words * 8; i < n; i++)
		b[i] = (unsigned char)i;
}

/* Sum of the words at every 4 KiB and of the last word. */
static uint64_t pattern_sum(const unsigned char *b, uint64_t n)
{
	uint64_t s = 0, v, off;
	for (off = 0; off + 8 <= n; off += 4096) {
		memcpy(&v, b + off, 8);
		s += v;
	}
	if (n >= 8) {
		memcpy(&v, b + (n / 8 - 1) * 8, 8);
		s += v;
	}
	return s;
}

static int parse_cfg(const char *s, nvio_config_t *cfg)
{
	unsigned long long bs, staging = 0;
	unsigned qd, par, single, overlap;
	char eng[32];
	int n;

	nvio_config_init(cfg);
	if (strcmp(s, "default") == 0)
		return 0;
	n = sscanf(s, "%llu:%u:%u:%31[^:]:%u:%u:%llu", &bs, &qd, &par, eng,
		   &single, &overlap, &staging);
	if (n != 6 && n != 7)
		return -EINVAL;
	if (n == 7)
		cfg->staging_bytes = staging;
	cfg->block_size = bs;
	cfg->queue_depth = qd;
	cfg->intra_op_parallelism = par;
	cfg->single_submit = single;
	cfg->overlap_events = overlap;
	cfg->engine = nvio_engine_from_name(eng);
	if (cfg->engine < 0)
		return cfg->engine;
	return 0;
}

static int get_handle(const char *key, nvio_handle_t **out)
{
	nvio_config_t cfg;
	int i, r;

	for (i = 0; i < nhandles; i++)
		if (strcmp(handles[i].key, key) == 0) {
			*out = handles[i].h;
			return 0;
		}
	r = parse_cfg(key, &cfg);
	if (r)
		return r;
	if (nhandles == MAX_HANDLES) {
		for (i = 0; i < nhandles; i++)
			nvio_handle_destroy(handles[i].h);
		nhandles = 0;
	}
	r = nvio_handle_create(out, strcmp(key, "default") == 0 ? NULL : &cfg);
	if (r)
		return r;
	snprintf(handles[nhandles].key, sizeof(handles[nhandles].key), "%s", key);
	handles[nhandles++].h = *out;
	return 0;
}

static void drop_all(void)
{
	int i;
	for (i = 0; i < nhandles; i++)
		nvio_handle_destroy(handles[i].h);
	nhandles = 0;
	if (locked_buf)
		nvio_mem_free(locked_buf);
	locked_buf = NULL;
	locked_size = 0;
	free(pageable_raw);
	pageable_raw = NULL;
	pageable_size = 0;
}

static void fail(const char *what, int err, nvio_handle_t *h)
{
	char line[1400] = "";
	nvio_error_t e = { .struct_size = sizeof(e) };
	char *p;

	if (h && nvio_last_error(h, &e))
		nvio_format_error(&e, line, sizeof(line));
	for (p = line; *p; p++)
		if (*p == '"' || *p == '\\')
			*p = '\'';
	printf("{\"ok\": false, \"what\": \"%s\", \"err\": %d, \"msg\": \"%s\", "
	       "\"detail\": \"%s\"}\n", what, err, nvio_strerror(err), line);
	fflush(stdout);
}

static void cmd_run(char *op, char *mem, char *path, uint64_t size,
		    uint64_t seed, char *cfgkey)
{
	int is_write = strcmp(op, "write") == 0, pageable = strcmp(mem, "pageable") == 0;
	int huge = strcmp(mem, "huge") == 0;
	unsigned char *buf, *raw = NULL;
	unsigned mflags = 0;
	nvio_handle_t *h;
	nvio_config_t got;
	double t0, t1, u0, s0, u1, s1;
	int r;

	r = get_handle(cfgkey, &h);
	if (r) {
		fail("handle_create", r, NULL);
		return;
	}
	if (huge) {
		/* diagnosis: aligned, madvise(MADV_HUGEPAGE), locked, not nvio's */
		if (posix_memalign((void **)&raw, 2u << 20, size))
			raw = NULL;
		if (raw) {
			madvise(raw, size, MADV_HUGEPAGE);
			mlock(raw, size);
		}
	} else if (pageable) {
		if (pageable_size != size) {
			free(pageable_raw);
			pageable_size = 0;
			pageable_raw = malloc(size + 64);
			if (pageable_raw)
				pageable_size = size;
		}
		raw = pageable_raw;
	}
	if (huge || pageable) {
		if (!raw) {
			fail("malloc", -ENOMEM, NULL);
			return;
		}
		buf = huge ? raw : raw + 1;
		/* fault the pages in, untimed */
		if (is_write && seed)
			pattern_fill(buf, size, seed);
		else
			memset(buf, is_write ? 0x5a : 0, size);
	} else {
		if (locked_size != size) {
			if (locked_buf)
				nvio_mem_free(locked_buf);
			locked_buf = NULL;
			locked_size = 0;
			r = nvio_mem_alloc(&locked_buf, size, 0, &mflags);
			if (r) {
				fail("nvio_mem_alloc", r, NULL);
				return;
			}
			locked_size = size;
			memset(locked_buf, 0x5a, size);
		}
		buf = locked_buf;
		if (is_write && seed)
			pattern_fill(buf, size, seed);
	}
	cpu(&u0, &s0);
	t0 = now();
	if (is_write)
		r = nvio_pwrite(h, buf, size, path, 0, NVIO_FSYNC);
	else
		r = nvio_pread(h, buf, size, path, 0, 0);
	t1 = now();
	cpu(&u1, &s1);
	if (r) {
		fail(is_write ? "nvio_pwrite" : "nvio_pread", r, h);
		if (huge)
			free(raw);
		return;
	}
	got.struct_size = sizeof(got);
	nvio_handle_config(h, &got);
	printf("{\"ok\": true, \"secs\": %.6f, \"user\": %.6f, \"sys\": %.6f, "
	       "\"sum\": %llu, \"engine\": \"%s\", \"direct\": \"%s\", "
	       "\"block\": %llu, \"qd\": %u, \"par\": %u, \"single\": %u, "
	       "\"overlap\": %u, \"mem_flags\": %u}\n",
	       t1 - t0, u1 - u0, s1 - s0,
	       (unsigned long long)(is_write ? 0 : pattern_sum(buf, size)),
	       nvio_engine_name(got.engine), nvio_direct_name(got.direct),
	       (unsigned long long)got.block_size, got.queue_depth,
	       got.intra_op_parallelism, got.single_submit, got.overlap_events,
	       nvio_mem_query(buf, size));
	fflush(stdout);
	if (huge)
		free(raw);
}

int main(void)
{
	char line[4096], op[16], mem[16], path[2048], cfg[128];
	unsigned long long size, seed;

	while (fgets(line, sizeof(line), stdin)) {
		if (strncmp(line, "quit", 4) == 0)
			break;
		if (strncmp(line, "free", 4) == 0) {
			drop_all();
			printf("{\"ok\": true}\n");
			fflush(stdout);
			continue;
		}
		if (sscanf(line, "run %15s %15s %2047s %llu %llu %127s", op, mem,
			   path, &size, &seed, cfg) == 6) {
			cmd_run(op, mem, path, size, seed, cfg);
			continue;
		}
		printf("{\"ok\": false, \"what\": \"parse\", \"err\": -22, "
		       "\"msg\": \"bad command\", \"detail\": \"\"}\n");
		fflush(stdout);
	}
	drop_all();
	return 0;
}
