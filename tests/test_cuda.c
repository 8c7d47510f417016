/*
 * test_cuda.c - CUDA device buffers through the simulated driver.
 *
 * tests/sim/libcuda.c is built as build/tests/sim/libcuda.so.1 and
 * loaded by path after nvio has already run ops without it, as a
 * PyTorch program loads CUDA late: nvio must then see its device memory
 * (and must not have kept the absence it saw). The simulator's device
 * memory faults on any host access and its copies are asynchronous, so
 * a missing synchronisation or a host access shows as wrong bytes or a
 * crash. On every engine, direct on and off, parallelism 1 and 2, reads
 * into and writes from device buffers at unaligned offsets and sizes
 * must move the right bytes, through the driver's copies (counted: a
 * host path would move the same bytes), from registered bounce buffers,
 * sync and async; a failing driver copy (at the call or when it
 * executes) must fail the op with -EIO naming the file, and the handle
 * must work afterwards. The simulator must see no misuse.
 *
 * tests/sim/libcufile.c simulates cuFile (through NVIO_CUFILE_LIB):
 * a GDS handle must move the same bytes through cuFile's calls, and,
 * when cuFile refuses the file, through the bounce path instead.
 */
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "t.h"
#define SIM_LOADER
#include "sim/sim.h"

static struct sim_api sim;
static char sim_dir[PATH_MAX];

#define DEV_BYTES ((3u << 20) + 8192)

/* The simulators' directory, beside the test's executable. */
static int find_sim(void)
{
	ssize_t n = readlink("/proc/self/exe", sim_dir, sizeof(sim_dir) - 8);
	char *slash;

	if (n <= 0) {
		T_FAILF("readlink /proc/self/exe failed");
		return -1;
	}
	sim_dir[n] = 0;
	slash = strrchr(sim_dir, '/');
	if (slash)
		*slash = 0;
	strcat(sim_dir, "/sim");
	return 0;
}

/* Device bytes [dev, dev+n) hold the random pattern seed at start:
 * -1, else the first differing offset (t_check_random_at's answer). */
static int64_t dev_check_random(const unsigned char *dev, size_t n, uint64_t seed,
				uint64_t start)
{
	unsigned char *host = malloc(n ? n : 1);
	int64_t r = 0;

	if (!host || sim.peek(host, dev, n) < 0)
		T_FAILF("cannot read back %zu device bytes", n);
	else
		r = t_check_random_at(host, n, seed, start);
	free(host);
	return r;
}

static void dev_fill_random(unsigned char *dev, size_t n, uint64_t seed, uint64_t start)
{
	unsigned char *host = malloc(n ? n : 1);

	if (!host) {
		T_FAILF("malloc");
		return;
	}
	t_fill_random_at(host, n, seed, start);
	T_EQ_INT(sim.poke(dev, host, n), 0);
	free(host);
}

static int dev_byte(const unsigned char *dev)
{
	unsigned char b = 0;

	return sim.peek(&b, dev, 1) < 0 ? -1 : b;
}

/* Bytes around [m, m+n) of dev must still be 0xee. */
static void check_guards(const unsigned char *dev, size_t m, size_t n)
{
	if (m > 0)
		T_EQ_INT(dev_byte(dev + m - 1), 0xee);
	if (m + n < DEV_BYTES)
		T_EQ_INT(dev_byte(dev + m + n), 0xee);
}

/* Puts the read pattern (seed 21) back over [off, off+n). */
static void restore(const char *path, size_t n, int64_t off)
{
	unsigned char *back = malloc(n);

	if (!back) {
		T_FAILF("malloc");
		return;
	}
	t_fill_random_at(back, n, 21, (uint64_t)off);
	T_OK(t_pwrite_file(path, back, n, off));
	free(back);
}

/* The result of a submitted op: itself if sync, its wait if async. */
static int finish(nvio_handle_t *h, int r, int async)
{
	if (async && r == 0)
		r = nvio_wait(h) == 1 ? 0 : -EIO;
	return r;
}

/* How device memory must move: the driver's copies through bounce
 * buffers, or cuFile's reads and writes. */
enum { VIA_BOUNCE, VIA_CUFILE };

static unsigned long moves(int via)
{
	return via == VIA_CUFILE ? sim.cufile_ios() : sim.copies();
}

static void rw_cases(nvio_handle_t *h, unsigned char *dev, const char *path,
		     int async, int via)
{
	static const struct { size_t n, m; int64_t off; } cs[] = {
		{ 1, 0, 0 }, { 4097, 1, 0 }, { 4096, 4096, 4096 },
		/* no whole aligned page: with 4 KiB blocks, longer than one */
		{ 8190, 5, 1 },
		{ (1u << 20) + 1, 3, 511 }, { (3u << 20) - 7, 4095, 12345 },
	};
	uint64_t file_bytes = (3u << 20) + 65536;

	for (unsigned i = 0; i < sizeof(cs) / sizeof(cs[0]); i++) {
		size_t n = cs[i].n, m = cs[i].m;
		int64_t off = cs[i].off;
		unsigned long before, pageable;
		int r;

		t_ctx("%s: read %zu bytes at file offset %lld into device +%zu",
		      async ? "async" : "sync", n, (long long)off, m);
		sim.fill(dev, 0xee, DEV_BYTES);
		before = moves(via);
		pageable = sim.pageable_copies();
		r = finish(h, nvio_pread(h, dev + m, n, path, off,
					 async ? NVIO_ASYNC : 0), async);
		if (!T_OK(r))
			continue;
		T_TRUE(moves(via) > before);	/* the device path, not host */
		T_EQ_U64(sim.pageable_copies(), pageable);	/* bounce registered */
		T_EQ_INT(dev_check_random(dev + m, n, 21, (uint64_t)off), -1);
		check_guards(dev, m, n);

		t_ctx("%s: write %zu bytes at file offset %lld from device +%zu",
		      async ? "async" : "sync", n, (long long)off, m);
		dev_fill_random(dev + m, n, 22, (uint64_t)off);
		before = moves(via);
		r = finish(h, nvio_pwrite(h, dev + m, n, path, off,
					  async ? NVIO_ASYNC : 0), async);
		if (!T_OK(r))
			continue;
		T_TRUE(moves(via) > before);
		T_EQ_U64(sim.pageable_copies(), pageable);
		T_OK(t_check_file_random(path, off, n, 22, (uint64_t)off));
		T_EQ_INT(t_file_size(path), (int64_t)file_bytes);
		restore(path, n, off);
	}
}

/* A copy the driver refuses at the call, or fails when it executes
 * (reported by the stream's synchronisation). */
static void failing_copy(nvio_handle_t *h, unsigned char *dev, const char *path)
{
	static const char *const how[] = { "cuMemcpyHtoDAsync_v2", "copy" };

	for (unsigned i = 0; i < 2; i++) {
		nvio_error_t e = { .struct_size = sizeof(e) };

		t_ctx("a driver copy fails (%s)", how[i]);
		sim.fail(how[i], 0, 1, 999);	/* CUDA_ERROR_UNKNOWN */
		T_ERR(nvio_pread(h, dev, 1u << 20, path, 4096, 0), -EIO);
		T_EQ_INT(nvio_last_error(h, &e), -EIO);
		T_TRUE(strstr(e.path, path) != NULL);
		T_EQ_INT(e.is_write, 0);
		sim.fail(how[i], 0, 0, 0);
	}
	t_ctx("the handle works after the failure");
	sim.fill(dev, 0, 8192);
	if (T_OK(nvio_pread(h, dev, 8192, path, 0, 0)))
		T_EQ_INT(dev_check_random(dev, 8192, 21, 0), -1);
	t_ctx("validate compares device memory");
	T_OK(nvio_pread(h, dev + 1, 5000, path, 3, NVIO_VALIDATE));
	T_EQ_INT(dev_check_random(dev + 1, 5000, 21, 3), -1);
	T_OK(nvio_pwrite(h, dev + 1, 5000, path, 3, NVIO_VALIDATE));
}

/* Threads submitting device-memory ops on one handle at once, each on
 * its own device region and file range; each thread's bytes must land. */
struct tjob {
	nvio_handle_t *h;
	unsigned char *dev;
	const char *path;
	int idx, bad;
};

#define TBYTES (256u << 10)

static void *thread_job(void *arg)
{
	struct tjob *j = arg;
	unsigned char *host = malloc(TBYTES), *back = malloc(TBYTES);
	int64_t off = (int64_t)j->idx * TBYTES;

	if (!host || !back) {
		j->bad = 1;
		goto out;
	}
	for (int round = 0; round < 8 && !j->bad; round++) {
		t_fill_random_at(host, TBYTES, 50 + (uint64_t)round, (uint64_t)j->idx);
		if (sim.poke(j->dev, host, TBYTES) < 0 ||
		    nvio_pwrite(j->h, j->dev, TBYTES, j->path, off, 0) != 0 ||
		    sim.fill(j->dev, 0, TBYTES) < 0 ||
		    nvio_pread(j->h, j->dev, TBYTES, j->path, off, 0) != 0 ||
		    sim.peek(back, j->dev, TBYTES) < 0 || memcmp(back, host, TBYTES))
			j->bad = 1 + round;
	}
out:
	free(host);
	free(back);
	return NULL;
}

static void test_threads(unsigned char *dev, const char *path, int gds)
{
	struct tjob jobs[4];
	pthread_t t[4];
	nvio_handle_t *h;
	nvio_config_t c;

	t_ctx("4 threads on one %s handle", gds ? "GDS" : "plain");
	t_config(&c, NVIO_ENGINE_AUTO, NVIO_DIRECT_AUTO, 64u << 10, 0);
	c.intra_op_parallelism = 2;
	c.flags = gds ? NVIO_HANDLE_GDS : 0;
	if (!T_OK(nvio_handle_create(&h, &c)))
		return;
	for (int i = 0; i < 4; i++) {
		jobs[i] = (struct tjob){ h, dev + (size_t)i * TBYTES, path, i, 0 };
		T_EQ_INT(pthread_create(&t[i], NULL, thread_job, &jobs[i]), 0);
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(t[i], NULL);
		T_EQ_INT(jobs[i].bad, 0);
	}
	nvio_handle_destroy(h);
	restore(path, 4 * TBYTES, 0);
	T_EQ_INT(sim.ctx_refs(), 0);
	T_EQ_INT(sim.host_registered(), 0);
	T_EQ_U64(sim.violations() + sim.cufile_violations(), 0);
}

/*
 * Buffers on two devices through one handle: a worker moves its CUDA
 * state from one device's context to the other's and back (each retained
 * while used, released after), and each op's bytes land on its device.
 */
static void test_two_devices(unsigned char *dev0, const char *path)
{
	unsigned char *dev1 = sim.alloc(1, 1u << 20);
	nvio_handle_t *h;

	t_ctx("buffers on devices 0 and 1");
	if (!T_TRUE(dev1 != NULL))
		return;
	if (t_handle(&h, NVIO_ENGINE_AUTO, NVIO_DIRECT_AUTO, 1, 1u << 20) == 0) {
		for (int i = 0; i < 3; i++) {
			unsigned char *d = i == 1 ? dev1 : dev0;
			unsigned long pageable = sim.pageable_copies();

			sim.fill(d, 0, 1u << 20);
			if (T_OK(nvio_pread(h, d, 1u << 20, path, 4096 * i, 0)))
				T_EQ_INT(dev_check_random(d, 1u << 20, 21, 4096u * i), -1);
			T_TRUE(sim.ctx_refs() <= 1);	/* one device's at a time */
			/* the bounce buffers registered in the device's context */
			T_EQ_U64(sim.pageable_copies(), pageable);
		}
		dev_fill_random(dev1, 1u << 20, 23, 0);
		T_OK(nvio_pwrite(h, dev1, 1u << 20, path, 0, 0));
		T_OK(t_check_file_random(path, 0, 1u << 20, 23, 0));
		restore(path, 1u << 20, 0);
		nvio_handle_destroy(h);
	}
	T_EQ_INT(sim.ctx_refs(), 0);
	T_EQ_U64(sim.violations(), 0);
	sim.free(dev1);
}

/*
 * GDS handles: device memory moves through cuFile; a file cuFile refuses
 * moves through the bounce path instead (its pieces must not go to the
 * O_DIRECT descriptor opened for cuFile: they are unaligned). No cuFile
 * handle outlives its op.
 */
/*
 * A tagged write of three device buffers with crc32, then a tagged read
 * into device memory with crc32: the CRCs are those of the bytes moved
 * (checked against host copies), taken from the bounce buffers. On a GDS
 * handle the op must not go through cuFile (the CPU cannot checksum
 * device memory: a host read of it faults here).
 */
static void crc_cases(nvio_handle_t *h, unsigned char *dev, const char *path)
{
	static const struct { size_t at, n; } b[3] = {
		{ 3, 5000 }, { 8192, (1u << 20) + 17 }, { (1u << 20) + 16384, 4096 },
	};
	unsigned char *host = malloc((2u << 20) + 65536);
	char wpath[T_PATH_MAX + 8];
	nvio_iovec_t iov[3];
	nvio_completion_t c;
	uint32_t crc[3], one;
	uint64_t total = 0;
	nvio_file_t *f;
	nvio_op_t op;
	int err = 0;

	snprintf(wpath, sizeof(wpath), "%s.crc", path);
	t_ctx("crc32 of device buffers");
	if (!host) {
		T_FAILF("malloc");
		return;
	}
	for (int i = 0; i < 3; i++) {
		dev_fill_random(dev + b[i].at, b[i].n, 30 + (uint64_t)i, 0);
		iov[i] = (nvio_iovec_t){ dev + b[i].at, b[i].n, 0 };
		total += b[i].n;
	}
	unlink(wpath);
	f = nvio_file_open(h, wpath, NVIO_FILE_READ | NVIO_FILE_WRITE | NVIO_FILE_CREATE, &err);
	if (!f) {
		T_FAILF("open %s: %s", wpath, t_errname(err));
		free(host);
		return;
	}
	nvio_prep_writev(&op, f, iov, 3, 0, 1);
	op.crc32 = crc;
	if (T_EQ_INT(nvio_submit(h, &op, 1), 1) && T_EQ_INT(nvio_reap(h, &c, 1, 1, -1), 1)) {
		T_EQ_INT(c.res, (int64_t)total);
		for (int i = 0; i < 3; i++) {
			t_fill_random_at(host, b[i].n, 30 + (uint64_t)i, 0);
			T_EQ_U64(crc[i], t_crc32_ref(host, b[i].n));
		}
	}
	t_ctx("crc32 of a read into device memory");
	nvio_prep_read(&op, f, dev + 1, total - 9, 9, 2);
	op.crc32 = &one;
	if (T_EQ_INT(nvio_submit(h, &op, 1), 1) && T_EQ_INT(nvio_reap(h, &c, 1, 1, -1), 1) &&
	    T_EQ_INT(c.res, (int64_t)(total - 9)) &&
	    T_OK(t_pread_file(wpath, host, total - 9, 9)))
		T_EQ_U64(one, t_crc32_ref(host, total - 9));
	nvio_file_close(f);
	unlink(wpath);
	free(host);
}

static void test_gds(unsigned char *dev, const char *path)
{
	T_FOR_EACH_COMBO(e, d) {
		nvio_config_t c;
		nvio_handle_t *h = NULL;

		t_ctx("%s GDS handle", t_combo());
		t_config(&c, e, d, 0, 0);
		c.flags = NVIO_HANDLE_GDS;
		if (!T_OK(nvio_handle_create(&h, &c)))
			continue;
		T_EQ_INT(nvio_get_gds(h), 1);
		rw_cases(h, dev, path, 0, VIA_CUFILE);
		rw_cases(h, dev, path, 1, VIA_CUFILE);
		crc_cases(h, dev, path);
		t_ctx("%s GDS handle: validate compares device memory", t_combo());
		T_OK(nvio_pwrite(h, dev + 1, 5000, path, 3, NVIO_VALIDATE));
		T_OK(nvio_pread(h, dev + 1, 5000, path, 3, NVIO_VALIDATE));
		restore(path, 5000, 3);
		sim.cufile_fail("cuFileHandleRegister", 0, SIM_ALWAYS,
				5000 + 18);	/* CU_FILE_INVALID_FILE_TYPE */
		rw_cases(h, dev, path, 0, VIA_BOUNCE);
		rw_cases(h, dev, path, 1, VIA_BOUNCE);
		sim.cufile_fail("cuFileHandleRegister", 0, 0, 0);
		t_ctx("%s GDS handles released", t_combo());
		T_EQ_INT(sim.cufile_handles(), 0);
		nvio_handle_destroy(h);
		T_EQ_U64(sim.violations() + sim.cufile_violations(), 0);
	}
}

int main(void)
{
	uint64_t file_bytes = (3u << 20) + 65536;
	unsigned char *pattern, *dev, host[4096];
	char path[T_PATH_MAX], cf[PATH_MAX + 32], why[PATH_MAX + 128];
	nvio_handle_t *h;

	t_init("cuda");
	/* The broken variant: the simulator must make this test fail. */
	if (getenv("NVIO_TEST_BREAK_SYNC") && *getenv("NVIO_TEST_BREAK_SYNC") == '1') {
		t_note("NVIO_TEST_BREAK_SYNC=1: stream synchronisation left out");
		nvio__cuda_break_sync = 1;
	}
	if (find_sim() < 0)
		return t_done();
	t_path(path, "data");
	pattern = malloc(file_bytes);
	if (!pattern) {
		T_FAILF("malloc");
		return t_done();
	}
	t_fill_random(pattern, file_bytes, 21);
	T_OK(t_write_file(path, pattern, file_bytes));
	free(pattern);

	/* Before any driver: host memory, and nvio has looked for CUDA. */
	t_ctx("before the driver is loaded");
	if (t_handle(&h, NVIO_ENGINE_AUTO, NVIO_DIRECT_AUTO, 1, 0) == 0) {
		if (T_OK(nvio_pread(h, host, sizeof(host), path, 0, 0)))
			T_EQ_INT(t_check_random_at(host, sizeof(host), 21, 0), -1);
		nvio_handle_destroy(h);
	}
	/* A look before the path is known must not hide cuFile for the rest
	 * of the process (where the system has none). The simulated cuFile
	 * loads the simulated driver, as the real one loads libcuda. */
	snprintf(cf, sizeof(cf), "%s/libcufile.so.0", sim_dir);
	t_ctx("cuFile path set after a probe");
	unsetenv("NVIO_CUFILE_LIB");
	if (nvio_gds_mode(NULL, 0) == NVIO_CUFILE_NONE) {
		T_OK(nvio_cufile_set_library(cf));
		T_TRUE(nvio_gds_mode(NULL, 0) != NVIO_CUFILE_NONE);
		T_ERR(nvio_cufile_set_library("/nonexistent/libcufile.so.0"), -EBUSY);
		T_OK(nvio_cufile_set_library(cf));	/* the same: fine */
	} else {
		t_note("a system cuFile is loaded: set_library not checked");
	}
	if (sim_load(&sim, sim_dir, why, sizeof(why)) < 0) {
		T_FAILF("%s", why);
		return t_done();
	}
	setenv("NVIO_CUFILE_LIB", cf, 1);
	dev = sim.alloc(0, DEV_BYTES);
	if (!dev) {
		T_FAILF("sim_cuda_alloc");
		return t_done();
	}
	T_FOR_EACH_COMBO(e, d) {
		for (uint32_t par = 1; par <= 2; par++) {
			/* bounce buffers of a page: pieces must fit */
			uint64_t bs = par == 1 ? 1u << 20 : 4096;

			t_ctx("%s par %u block %llu", t_combo(), par,
			      (unsigned long long)bs);
			if (t_handle(&h, e, d, par, bs) != 0)
				continue;
			rw_cases(h, dev, path, 0, VIA_BOUNCE);
			rw_cases(h, dev, path, 1, VIA_BOUNCE);
			crc_cases(h, dev, path);
			failing_copy(h, dev, path);
			/* one context reference per worker, not per copy;
			 * all let go, the bounce pool unpinned */
			t_ctx("%s par %u contexts", t_combo(), par);
			T_TRUE(sim.ctx_refs() <= (long)par);
			nvio_handle_destroy(h);
			T_EQ_INT(sim.ctx_refs(), 0);
			T_EQ_INT(sim.host_registered(), 0);
			T_EQ_U64(sim.violations(), 0);
		}
	}
	test_two_devices(dev, path);
	test_threads(dev, path, 0);
	test_threads(dev, path, 1);
	test_gds(dev, path);
	/* Host memory is still host memory with the driver loaded. */
	t_ctx("host buffer with the driver loaded");
	if (t_handle(&h, NVIO_ENGINE_AUTO, NVIO_DIRECT_AUTO, 1, 0) == 0) {
		unsigned long before = sim.copies();

		if (T_OK(nvio_pread(h, host, sizeof(host), path, 0, 0)))
			T_EQ_INT(t_check_random_at(host, sizeof(host), 21, 0), -1);
		T_EQ_U64(sim.copies(), before);
		nvio_handle_destroy(h);
	}
	/* Streams copy with memcpy: GPU memory is refused, never touched
	 * (a touch would fault). */
	t_ctx("stream with a device buffer");
	if (t_handle(&h, NVIO_ENGINE_AUTO, NVIO_DIRECT_AUTO, 1, 0) == 0) {
		char spath[T_PATH_MAX];
		nvio_file_t *f;
		nvio_stream_t *s = NULL;
		int err;

		t_path(spath, "stream");
		f = nvio_file_open(h, spath, NVIO_FILE_READ | NVIO_FILE_WRITE |
				   NVIO_FILE_CREATE, &err);
		if (T_TRUE(f != NULL))
			s = nvio_stream_open(f, NVIO_STREAM_WRITE, 0, 0, 0, &err);
		if (T_TRUE(s != NULL)) {
			T_ERR(nvio_stream_write(s, dev, 4096), -EINVAL);
			T_EQ_INT(nvio_stream_write(s, host, 4096), 4096);
			T_OK(nvio_stream_close(s, 0));
		}
		s = f ? nvio_stream_open(f, NVIO_STREAM_READ, 0, 0, 0, &err) : NULL;
		if (T_TRUE(s != NULL)) {
			T_ERR(nvio_stream_read(s, dev, 4096), -EINVAL);
			T_OK(nvio_stream_close(s, 0));
		}
		nvio_file_close(f);
		nvio_handle_destroy(h);
	}
	T_EQ_U64(sim.violations() + sim.cufile_violations(), 0);
	sim.free(dev);
	return t_done();
}
