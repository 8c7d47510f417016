/*
 * small_ops_c.c - cost per call of small synchronous reads from C:
 * nvio_file_pread on a file opened once against pread(2) on an fd.
 *
 *   small_ops_c PATH METHOD N BS SEED
 *
 * METHOD
 *   pread        pread(2) on a buffered fd
 *   pread-direct pread(2) on an O_DIRECT fd
 *   file         nvio_file_pread on an nvio_file_t opened once, handle
 *                direct OFF (page cache)
 *   file-direct  the same, handle direct ON (O_DIRECT)
 *   fd           nvio_pread_fd on the buffered fd (0.1 API), direct OFF
 *   file-locked  "file" into a buffer from nvio_mem_alloc
 *
 * Every method reads BS bytes N times at the same pseudo-random BS-aligned
 * offsets (an LCG seeded by SEED) into one page-aligned buffer, after 1000
 * untimed warm-up calls. One JSON line: ns per call (wall), user and
 * system CPU ns per call (getrusage). bench/small_ops_c.py runs the
 * methods in interleaved rounds beside fio (io_uring, QD1).
 *
 *   cc -O2 -Iinclude bench/small_ops_c.c build/libnvio.a $(make -s print-libs)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "nvio.h"

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double cpu_s(int sys)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	struct timeval *t = sys ? &ru.ru_stime : &ru.ru_utime;
	return (double)t->tv_sec + (double)t->tv_usec * 1e-6;
}

static void die(const char *what, int err)
{
	fprintf(stderr, "small_ops_c: %s: %s\n", what, strerror(err < 0 ? -err : err));
	exit(1);
}

static long sys_pread(int fd, void *buf, uint64_t bs, uint64_t off)
{
	ssize_t r = pread(fd, buf, bs, (off_t)off);
	return r < 0 ? -errno : (long)r;
}

int main(int argc, char **argv)
{
	if (argc != 6) {
		fprintf(stderr, "usage: small_ops_c PATH METHOD N BS SEED\n");
		return 2;
	}
	const char *path = argv[1], *m = argv[2];
	long n = atol(argv[3]);
	uint64_t bs = strtoull(argv[4], NULL, 0), seed = strtoull(argv[5], NULL, 0);
	struct stat st;
	int fd = -1, r;
	nvio_handle_t *h = NULL;
	nvio_file_t *f = NULL;
	void *buf = NULL;
	unsigned mflags = 0;
	int is_pread = !strcmp(m, "pread") || !strcmp(m, "pread-direct");
	int direct = !strcmp(m, "pread-direct") || !strcmp(m, "file-direct");

	if (stat(path, &st))
		die("stat", errno);
	uint64_t slots = (uint64_t)st.st_size / bs;
	if (!slots)
		die("file too small", EINVAL);
	uint64_t *offs = malloc(sizeof(*offs) * (size_t)(n + 1000));
	uint64_t x = seed * 2654435761u + 12345;
	for (long i = 0; i < n + 1000; i++) {
		x = x * 6364136223846793005ull + 1442695040888963407ull;
		offs[i] = ((x >> 17) % slots) * bs;
	}

	if (!strcmp(m, "file-locked")) {
		r = nvio_mem_alloc(&buf, bs, 0, &mflags);
		if (r)
			die("nvio_mem_alloc", r);
	} else if (posix_memalign(&buf, 4096, bs)) {
		die("posix_memalign", ENOMEM);
	}
	memset(buf, 0, bs);

	if (is_pread || !strcmp(m, "fd")) {
		fd = open(path, O_RDONLY | (direct ? O_DIRECT : 0));
		if (fd < 0)
			die("open", errno);
	}
	if (!is_pread) {
		nvio_config_t cfg;
		nvio_config_init(&cfg);
		cfg.direct = direct ? NVIO_DIRECT_ON : NVIO_DIRECT_OFF;
		r = nvio_handle_create(&h, &cfg);
		if (r)
			die("nvio_handle_create", r);
		if (strcmp(m, "fd")) {
			f = nvio_file_open(h, path, NVIO_FILE_READ, &r);
			if (!f)
				die("nvio_file_open", r);
			nvio_file_info_t fi = { .struct_size = sizeof(fi) };
			nvio_file_info(f, &fi);
			if (fi.direct != direct)
				die("nvio_file_open: direct mode not as asked", EINVAL);
		}
	}

#define LOOP(start, end, CALL)                                                 \
	for (long i = (start); i < (end); i++) {                               \
		uint64_t off = offs[i];                                        \
		long got = (CALL);                                             \
		if (got != (is_pread ? (long)bs : 0))                          \
			die(m, got < 0 ? (int)-got : EIO);                     \
	}
#define RUN(CALL)                                                              \
	do {                                                                   \
		LOOP(n, n + 1000, CALL) /* warm-up */                          \
		u0 = cpu_s(0); s0 = cpu_s(1); t0 = now();                      \
		LOOP(0, n, CALL)                                               \
		t1 = now(); u1 = cpu_s(0); s1 = cpu_s(1);                      \
	} while (0)

	double t0, t1, u0, u1, s0, s1;
	if (is_pread)
		RUN(sys_pread(fd, buf, bs, off));
	else if (!strcmp(m, "fd"))
		RUN(nvio_pread_fd(h, buf, bs, fd, (int64_t)off, 0));
	else
		RUN(nvio_file_pread(f, buf, bs, (int64_t)off, 0));

	printf("{\"method\": \"%s\", \"n\": %ld, \"bs\": %llu, \"ns\": %.1f, "
	       "\"user_ns\": %.1f, \"sys_ns\": %.1f}\n", m, n, (unsigned long long)bs,
	       (t1 - t0) / n * 1e9, (u1 - u0) / n * 1e9, (s1 - s0) / n * 1e9);
	nvio_file_close(f);
	if (h)
		nvio_handle_destroy(h);
	if (fd >= 0)
		close(fd);
	if (!strcmp(m, "file-locked"))
		nvio_mem_free(buf);
	else
		free(buf);
	free(offs);
	return 0;
}
