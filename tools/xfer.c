/*
 * xfer.c - the timed transfer bench and tune are built on: a buffer
 * striped over one file per directory, moved with asynchronous ops on one
 * handle and one wait; plus the checks and descriptions around it.
 */
#include "tool.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>

#define STRIPE_ALIGN 4096u	/* range boundaries stay O_DIRECT friendly */
#define PAGEABLE_SKEW 64u	/* pageable buffers start 64 bytes into a page */

static void fill_pattern(unsigned char *p, uint64_t n)
{
	uint64_t s = 0x9e3779b97f4a7c15ull ^ (uint64_t)getpid();
	uint64_t i = 0;

	/* xorshift: incompressible, and every page is touched before timing */
	for (; i + 8 <= n; i += 8) {
		s ^= s << 13;
		s ^= s >> 7;
		s ^= s << 17;
		memcpy(p + i, &s, 8);
	}
	for (; i < n; i++)
		p[i] = (unsigned char)i;
}

int tool_gpu_device;
unsigned tool_handle_flags;

void gpu_option(enum mem_kind *mem, const char *arg, int gds)
{
	if (arg)
		tool_gpu_device = (int)opt_u64("--gpu", arg, 0, 1023);
	*mem = MEM_GPU;
	if (gds)
		tool_handle_flags |= NVIO_HANDLE_GDS;
}

/* Device memory, filled from host memory a piece at a time. */
static int alloc_gpu(struct xfer *x)
{
	uint64_t piece = x->size < (64u << 20) ? x->size : 64u << 20;
	unsigned char *host = malloc(piece);
	char b[32];
	int r;

	if (!host) {
		msg("cannot allocate %s of memory", fmt_bytes(piece, b, sizeof(b)));
		return EXIT_RUNTIME;
	}
	x->device = tool_gpu_device;
	r = nvio_cuda_alloc(x->device, x->size, &x->alloc);
	if (r) {
		msg("--gpu %d: nvio_cuda_alloc(%s): %s%s", x->device,
		    fmt_bytes(x->size, b, sizeof(b)), nvio_strerror(r),
		    r == -ENODEV ? " (no CUDA driver or no such device: "
		    "see nvio report)" : "");
		free(host);
		x->alloc = NULL;
		return EXIT_RUNTIME;
	}
	x->buf = x->alloc;
	for (uint64_t off = 0; off < x->size && !r; off += piece) {
		uint64_t n = x->size - off < piece ? x->size - off : piece;

		fill_pattern(host, n);
		r = nvio_cuda_memcpy(x->buf + off, host, n);
	}
	free(host);
	if (r) {
		msg("--gpu %d: nvio_cuda_memcpy: %s", x->device, nvio_strerror(r));
		return EXIT_RUNTIME;
	}
	return 0;
}

static int alloc_buffer(struct xfer *x)
{
	char b[32];

	if (x->mem == MEM_GPU)
		return alloc_gpu(x);
	if (x->mem == MEM_PAGEABLE) {
		x->alloc = malloc(x->size + 4096 + PAGEABLE_SKEW);
		if (!x->alloc)
			goto nomem;
		/* Deliberately not page aligned, to measure the staging path. */
		x->buf = (unsigned char *)(((uintptr_t)x->alloc + 4095) &
					   ~(uintptr_t)4095) + PAGEABLE_SKEW;
	} else {
		unsigned fl = 0;
		int r = nvio_mem_alloc(&x->alloc, x->size, 0, &fl);

		if (r) {
			msg("nvio_mem_alloc(%s): %s",
			    fmt_bytes(x->size, b, sizeof(b)), nvio_strerror(r));
			return EXIT_RUNTIME;
		}
		x->buf = x->alloc;
		x->locked = !!(fl & NVIO_MEM_LOCKED);
	}
	fill_pattern(x->buf, x->size);
	return 0;
nomem:
	msg("cannot allocate %s of memory", fmt_bytes(x->size, b, sizeof(b)));
	return EXIT_RUNTIME;
}

static void split_ranges(struct xfer *x)
{
	uint64_t per = x->size / (uint64_t)x->ndirs, off = 0;

	per = (per + STRIPE_ALIGN - 1) / STRIPE_ALIGN * STRIPE_ALIGN;
	for (int i = 0; i < x->ndirs; i++) {
		uint64_t left = x->size - off;

		x->off[i] = off;
		x->len[i] = i == x->ndirs - 1 || per > left ? left : per;
		off += x->len[i];
	}
}

int xfer_setup(struct xfer *x, char *const *dirs, int ndirs, uint64_t size,
	       enum mem_kind mem, const char *tag)
{
	char path[4200];

	memset(x, 0, sizeof(*x));
	x->ndirs = ndirs;
	x->size = size;
	x->mem = mem;
	split_ranges(x);
	for (int i = 0; i < ndirs; i++)
		x->fd[i] = -1;
	for (int i = 0; i < ndirs; i++) {
		int fd = temp_file(dirs[i], tag, &x->name[i]);

		if (fd < 0) {
			msg("--dir %s: cannot create the test file: %s", dirs[i],
			    strerror(-fd));
			return EXIT_RUNTIME;
		}
		x->fd[i] = fd;
		snprintf(path, sizeof(path), "%s/(unnamed test file)", dirs[i]);
		x->path[i] = x->name[i] ? strdup(x->name[i]) : strdup(path);
		if (!x->path[i]) {
			msg("out of memory");
			return EXIT_RUNTIME;
		}
	}
	return alloc_buffer(x);
}

void xfer_teardown(struct xfer *x)
{
	if (x->mem == MEM_PAGEABLE)
		free(x->alloc);
	else if (x->mem == MEM_GPU && x->alloc)
		nvio_cuda_free(x->alloc);
	else if (x->alloc)
		nvio_mem_free(x->alloc);
	x->alloc = NULL;
	for (int i = 0; i < x->ndirs; i++) {
		if (x->name[i])
			unlink(x->name[i]);
		if (x->fd[i] >= 0)
			close(x->fd[i]);
		x->fd[i] = -1;
		free(x->name[i]);
		free(x->path[i]);
		x->name[i] = x->path[i] = NULL;
	}
}

static void print_op_error(nvio_handle_t *h, int err, int is_write,
			   const char *path)
{
	nvio_error_t e = { .struct_size = sizeof(e) };
	char line[1400];

	if (nvio_last_error(h, &e) == err && err) {
		nvio_format_error(&e, line, sizeof(line));
		msg("%s (the test file %s)", line, path);
	} else {
		msg("%s %s: %s", is_write ? "write" : "read", path,
		    nvio_strerror(err));
	}
	if (env_direct_hint(nvio_get_direct(h)))
		msg("%s", env_direct_hint(nvio_get_direct(h)));
}

static int submit_all(nvio_handle_t *h, const struct xfer *x, int is_write)
{
	for (int i = 0; i < x->ndirs; i++) {
		int r;

		if (is_write)
			r = nvio_pwrite_fd(h, x->buf + x->off[i], x->len[i],
					   x->fd[i], 0, NVIO_ASYNC | NVIO_FSYNC);
		else
			r = nvio_pread_fd(h, x->buf + x->off[i], x->len[i],
					  x->fd[i], 0, NVIO_ASYNC);
		if (r < 0) {
			nvio_wait(h);	/* the ones accepted before it */
			print_op_error(h, r, is_write, x->path[i]);
			return r;
		}
	}
	return 0;
}

int xfer_run(nvio_handle_t *h, const struct xfer *x, int is_write,
	     struct sample *s)
{
	double t0 = now_s(), c0 = cpu_self_s();
	int r = submit_all(h, x, is_write);

	if (r)
		return r;
	r = nvio_wait(h);
	s->secs = now_s() - t0;
	s->cpu = cpu_self_s() - c0;
	if (r < 0) {
		print_op_error(h, r, is_write, x->path[0]);
		return r;
	}
	return 0;
}

/* ---- cold reads ---- */

static int drop_caches_allowed(void)
{
	return access("/proc/sys/vm/drop_caches", W_OK) == 0;
}

int probe_in_memory(const nvio_probe_t *p)
{
	return !strcmp(p->fs_type, "tmpfs") || !strcmp(p->fs_type, "ramfs");
}

enum cold cold_choose(int direct_policy, const nvio_probe_t *probes, int n)
{
	int direct = direct_policy != NVIO_DIRECT_OFF;

	for (int i = 0; i < n; i++) {
		if (probe_in_memory(&probes[i]))
			return COLD_MEMFS;	/* nothing colder to read from */
		direct = direct && probes[i].direct_ok == 1;
	}
	if (direct)
		return COLD_DIRECT;
	return drop_caches_allowed() ? COLD_DROP : COLD_NONE;
}

const char *cold_name(enum cold c)
{
	return c == COLD_DIRECT ? "o_direct" : c == COLD_DROP ? "drop_caches"
							       : "none";
}

const char *cold_text(enum cold c)
{
	switch (c) {
	case COLD_DIRECT:
		return "O_DIRECT bypasses the page cache";
	case COLD_DROP:
		return "page cache dropped before each read "
		       "(/proc/sys/vm/drop_caches)";
	case COLD_MEMFS:
		return "none: tmpfs and ramfs keep files in the page cache, and "
		       "O_DIRECT does not bypass it there: reads measure memory "
		       "copies, not a device";
	default:
		return "WARNING: reads may come from the page cache (no O_DIRECT "
		       "here and drop_caches needs root)";
	}
}

void cold_prepare(enum cold c)
{
	int fd;

	if (c != COLD_DROP)
		return;
	sync();
	fd = open("/proc/sys/vm/drop_caches", O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return;
	if (write(fd, "1", 1) != 1) {
		/* nothing more to do: the result says reads may be warm */
	}
	close(fd);
}

/* ---- handles and their descriptions ---- */

nvio_handle_t *handle_open(const nvio_config_t *cfg, const char *what)
{
	nvio_handle_t *h = NULL;
	nvio_config_t def;
	char why[512];
	int r;

	if (!cfg) {
		nvio_config_init(&def);
		cfg = &def;
	}
	if (tool_handle_flags && !(cfg->flags & tool_handle_flags)) {
		if (cfg != &def)
			def = *cfg;
		def.flags |= tool_handle_flags;
		cfg = &def;
	}
	signals_block(1);
	r = nvio_handle_create(&h, cfg);
	signals_block(0);
	if (r) {
		msg("%s handle: %s", what,
		    handle_error_text(cfg, r, why, sizeof(why)));
		return NULL;
	}
	return h;
}

const char *config_text(const nvio_config_t *c, char *buf, size_t len)
{
	char bs[32];
	const char *e = nvio_engine_name(c->engine);

	snprintf(buf, len, "%s, block %s, queue depth %u, parallelism %u, "
		 "single submit %s, overlap events %s, direct %s",
		 e ? e : "?", fmt_bytes(c->block_size, bs, sizeof(bs)),
		 c->queue_depth, c->intra_op_parallelism,
		 c->single_submit ? "on" : "off",
		 c->overlap_events ? "on" : "off",
		 nvio_direct_name(c->direct) ? nvio_direct_name(c->direct) : "?");
	return buf;
}

void config_json(struct json *j, const char *key, const nvio_config_t *c)
{
	json_obj(j, key);
	json_uint(j, "block_size", c->block_size);
	json_uint(j, "queue_depth", c->queue_depth);
	json_uint(j, "intra_op_parallelism", c->intra_op_parallelism);
	json_bool(j, "single_submit", c->single_submit);
	json_bool(j, "overlap_events", c->overlap_events);
	json_str(j, "engine", nvio_engine_name(c->engine));
	json_str(j, "direct", nvio_direct_name(c->direct));
	json_close(j, '}');
}

void config_json_deepspeed(struct json *j, const char *key,
			   const nvio_config_t *c)
{
	json_obj(j, key);
	json_obj(j, "aio");
	json_uint(j, "block_size", c->block_size);
	json_uint(j, "queue_depth", c->queue_depth);
	json_uint(j, "intra_op_parallelism", c->intra_op_parallelism);
	json_bool(j, "single_submit", c->single_submit);
	json_bool(j, "overlap_events", c->overlap_events);
	json_close(j, '}');
	json_close(j, '}');
}

/* ---- checks ---- */

int probe_dirs(char *const *dirs, int ndirs, nvio_probe_t *probes)
{
	for (int i = 0; i < ndirs; i++) {
		int r;

		memset(&probes[i], 0, sizeof(probes[i]));
		probes[i].struct_size = sizeof(probes[i]);
		r = nvio_probe(dirs[i], &probes[i]);
		if (r < 0) {
			msg("--dir %s: %s", dirs[i], nvio_strerror(r));
			return EXIT_RUNTIME;
		}
	}
	return 0;
}

/* statfs's total size; 0 means the file system reports none (ramfs). */
static uint64_t fs_total(const char *dir)
{
	struct statfs s;

	return statfs(dir, &s) ? 1 : (uint64_t)s.f_blocks * (uint64_t)s.f_bsize;
}

const char *direct_untested_why(const char *dir, const nvio_probe_t *p,
				char *buf, size_t len)
{
	struct statvfs v;
	struct statfs s;
	int err = p->direct_err < 0 ? -p->direct_err : p->direct_err;

	if (p->direct_ok == 1)
		return NULL;
	if (!statfs(dir, &s) && (s.f_type == 0x9fa0 || s.f_type == 0x62656572)) {
		snprintf(buf, len, "not tested: %s is on %s, a virtual file "
			 "system that holds no data files; use a directory on "
			 "the NVMe device", dir, s.f_type == 0x9fa0 ? "procfs"
								    : "sysfs");
		return buf;
	}
	if (err == EROFS || (!statvfs(dir, &v) && (v.f_flag & ST_RDONLY))) {
		snprintf(buf, len, "not tested: the file system of %s is mounted "
			 "read-only, so the probe could not create its test "
			 "file; use a writable directory (or remount it rw)", dir);
		return buf;
	}
	if (err == EACCES || err == EPERM || access(dir, W_OK | X_OK)) {
		snprintf(buf, len, "not tested: %s is not writable by this user "
			 "(%s), so the probe could not create its test file; use "
			 "a directory you can write", dir, strerror(err ? err
								: EACCES));
		return buf;
	}
	return NULL;
}

static int check_space(char *const *dirs, int ndirs,
		       const nvio_probe_t *probes, const uint64_t *len)
{
	char a[32], b[32];

	for (int i = 0; i < ndirs; i++) {
		struct stat si, sj;
		uint64_t need = 0;

		if (stat(dirs[i], &si))
			continue;
		/* directories on one file system share its free space */
		for (int k = 0; k < ndirs; k++)
			if (!stat(dirs[k], &sj) && sj.st_dev == si.st_dev)
				need += len[k];
		if (!probes[i].fs_free_bytes && !fs_total(dirs[i])) {
			/* ramfs: no size, no free count, no limit but memory */
			msg("warning: --dir %s: %s reports no size or free "
			    "space (it grows until memory runs out): %s not "
			    "checked", dirs[i], probes[i].fs_type,
			    fmt_bytes(need, a, sizeof(a)));
			continue;
		}
		if (need > probes[i].fs_free_bytes) {
			msg("--dir %s: needs %s but only %s is free: %s",
			    dirs[i], fmt_bytes(need, a, sizeof(a)),
			    fmt_bytes(probes[i].fs_free_bytes, b, sizeof(b)),
			    strerror(ENOSPC));
			return EXIT_RUNTIME;
		}
	}
	return 0;
}

int check_fits(char *const *dirs, int ndirs, const nvio_probe_t *probes,
	       uint64_t size)
{
	struct xfer shape;
	uint64_t avail = mem_available();
	char a[32], b[32];

	if (avail && size > avail) {
		msg("--size %s: needs that much memory but only %s is "
		    "available: %s", fmt_bytes(size, a, sizeof(a)),
		    fmt_bytes(avail, b, sizeof(b)), strerror(ENOMEM));
		return EXIT_RUNTIME;
	}
	memset(&shape, 0, sizeof(shape));
	shape.ndirs = ndirs;
	shape.size = size;
	split_ranges(&shape);
	return check_space(dirs, ndirs, probes, shape.len);
}
