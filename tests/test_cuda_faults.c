/*
 * test_cuda_faults.c - every CUDA and cuFile call nvio makes, failed in
 * turn (the simulator's failure by count, with the driver's codes), on
 * every engine: each op either moves the right bytes or fails with a
 * -errno naming the file; nothing crashes or hangs, the handle works
 * after, no context retain or host registration is left behind, and the
 * simulator sees no misuse.
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "t.h"
#define SIM_LOADER
#include "sim/sim.h"

static struct sim_api sim;

#define N ((1u << 20) + 4097)

/* CUDA calls on nvio's paths, with a code the driver returns for each. */
static const struct { const char *fn; int code; } cuda_calls[] = {
	{ "cuDeviceGet", 101 },			/* INVALID_DEVICE */
	{ "cuDevicePrimaryCtxRetain", 2 },	/* OUT_OF_MEMORY */
	{ "cuCtxSetCurrent", 201 },		/* INVALID_CONTEXT */
	{ "cuStreamCreate", 2 },
	{ "cuMemHostRegister_v2", 2 },		/* best effort: still right */
	{ "cuMemcpyHtoDAsync_v2", 999 },
	{ "cuMemcpyDtoHAsync_v2", 1 },
	{ "copy", 719 },			/* fails as it runs */
	{ "cuStreamSynchronize", 719 },
	{ "cuPointerGetAttribute", 1 },		/* then it is host memory... */
};

static const struct { const char *fn; int code; } cufile_calls[] = {
	{ "cuFileHandleRegister", 5000 + 18 },	/* falls back to bouncing */
	{ "cuFileRead", 5 },			/* EIO */
	{ "cuFileWrite", 28 },			/* ENOSPC */
	{ "cuFileRead", 5000 + 30 },		/* INTERNAL_ERROR */
};

static int dev_matches(const unsigned char *dev, size_t n, uint64_t seed)
{
	unsigned char *h = malloc(n);
	int ok = h && sim.peek(h, dev, n) == 0 && t_check_random_at(h, n, seed, 0) == -1;

	free(h);
	return ok;
}

/* A failed op's error names the file. */
static void failed_cleanly(nvio_handle_t *h, int r, const char *path)
{
	nvio_error_t e = { .struct_size = sizeof(e) };

	T_TRUE(r < 0);
	T_EQ_INT(nvio_last_error(h, &e), r);
	T_TRUE(strstr(e.path, path) != NULL);
}

/* One write and one read of device memory; each right or a clean error. */
static void round_trip(nvio_handle_t *h, unsigned char *dev, const char *path,
		       const char *what, unsigned long after)
{
	unsigned char *host = malloc(N);
	int r;

	if (!host) {
		T_FAILF("malloc");
		return;
	}
	t_ctx("%s fails after %lu calls: write", what, after);
	t_fill_random(host, N, 40 + after);
	T_EQ_INT(sim.poke(dev, host, N), 0);
	r = nvio_pwrite(h, dev, N, path, 0, 0);
	if (r == 0)
		T_OK(t_check_file_random(path, 0, N, 40 + after, 0));
	else
		failed_cleanly(h, r, path);
	t_ctx("%s fails after %lu calls: read", what, after);
	T_OK(t_write_file(path, host, N));
	sim.fill(dev, 0, N);
	r = nvio_pread(h, dev, N, path, 0, 0);
	if (r == 0)
		T_TRUE(dev_matches(dev, N, 40 + after));
	else
		failed_cleanly(h, r, path);
	free(host);
}

static void sweep(unsigned char *dev, const char *path, const char *fn, int code,
		  int cufile)
{
	int done = 0;

	/* NVIO_TEST_QUICK (sanitizer builds): the first engine only */
	T_FOR_EACH_COMBO(e, d) {
		if (done)
			continue;
		for (unsigned long after = 0; after < 3; after += 2) {
			nvio_handle_t *h;
			nvio_config_t c;

			t_config(&c, e, d, 256u << 10, 2);
			if (cufile)
				c.flags = NVIO_HANDLE_GDS;
			t_ctx("%s %s", t_combo(), fn);
			if (!T_OK(nvio_handle_create(&h, &c)))
				continue;
			(cufile ? sim.cufile_fail : sim.fail)(fn, after, 1, code);
			round_trip(h, dev, path, fn, after);
			(cufile ? sim.cufile_fail : sim.fail)(fn, 0, 0, 0);
			t_ctx("%s %s: the handle works after", t_combo(), fn);
			round_trip(h, dev, path, "nothing", after);
			nvio_handle_destroy(h);
			T_EQ_INT(sim.ctx_refs(), 0);
			T_EQ_INT(sim.host_registered(), 0);
			T_EQ_INT(sim.cufile_handles(), 0);
			T_EQ_U64(sim.violations() + sim.cufile_violations(), 0);
		}
		done = t_quick();
	}
}

int main(void)
{
	char dir[PATH_MAX], path[T_PATH_MAX], cf[PATH_MAX + 32], why[PATH_MAX + 128];
	ssize_t n;
	unsigned char *dev;

	t_init("cuda_faults");
	n = readlink("/proc/self/exe", dir, sizeof(dir) - 8);
	if (n <= 0)
		return t_done();
	dir[n] = 0;
	*strrchr(dir, '/') = 0;
	strcat(dir, "/sim");
	if (sim_load(&sim, dir, why, sizeof(why)) < 0) {
		T_FAILF("%s", why);
		return t_done();
	}
	snprintf(cf, sizeof(cf), "%s/libcufile.so.0", dir);
	setenv("NVIO_CUFILE_LIB", cf, 1);
	dev = sim.alloc(0, N);
	if (!T_TRUE(dev != NULL))
		return t_done();
	t_path(path, "data");
	for (unsigned i = 0; i < sizeof(cuda_calls) / sizeof(cuda_calls[0]); i++)
		sweep(dev, path, cuda_calls[i].fn, cuda_calls[i].code, 0);
	if (T_TRUE(nvio_gds_mode(NULL, 0) != NVIO_CUFILE_NONE))
		for (unsigned i = 0; i < sizeof(cufile_calls) / sizeof(cufile_calls[0]); i++)
			sweep(dev, path, cufile_calls[i].fn, cufile_calls[i].code, 1);
	sim.free(dev);
	return t_done();
}
