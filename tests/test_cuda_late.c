/*
 * test_cuda_late.c - the first op on device memory of a CUDA driver
 * loaded after nvio ran without one.
 *
 * Before a driver is seen, a sync op of one buffer (no VALIDATE) is taken
 * for host memory without asking the loader (submit.c classify_mem,
 * lazy): it runs inline, its kernel call into a device address fails with
 * EFAULT before a byte moves, and nvio asks then and runs it again as a
 * device op. Each case needs a process where no driver was seen yet, so
 * each runs in a child: the first op after the simulated driver (its
 * device memory faults on any host access) loads is a read, or a write,
 * on an open file or by path, direct I/O off or automatic; the bytes must
 * be right and must have gone through the driver's copies. A buffer the
 * kernel cannot reach that is not device memory still fails with EFAULT,
 * before and after the driver came.
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "internal.h"
#include "t.h"
#define SIM_LOADER
#include "sim/sim.h"

#define N 8192
#define OFF 4096
#define FILE_BYTES (64u << 10)

static struct sim_api sim;
static char sim_dir[PATH_MAX];

static int find_sim(void)
{
	ssize_t n = readlink("/proc/self/exe", sim_dir, sizeof(sim_dir) - 8);
	char *slash;

	if (n <= 0)
		return -1;
	sim_dir[n] = 0;
	slash = strrchr(sim_dir, '/');
	if (slash)
		*slash = 0;
	strcat(sim_dir, "/sim");
	return 0;
}

/* Memory the kernel cannot copy to or from, that is no device memory. */
static void *no_access(void)
{
	void *p = mmap(NULL, N, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	return p == MAP_FAILED ? NULL : p;
}

static void bad_host_buffer(nvio_handle_t *h, const char *path)
{
	void *p = no_access();
	nvio_file_t *f;
	int err = 0;

	if (!T_TRUE(p != NULL))
		return;
	f = nvio_file_open(h, path, NVIO_FILE_READ | NVIO_FILE_WRITE, &err);
	if (T_OK(err) && T_TRUE(f != NULL)) {
		T_ERR(nvio_file_pread(f, p, N, OFF, 0), -EFAULT);
		T_ERR(nvio_file_pwrite(f, p, N, OFF, 0), -EFAULT);
		nvio_file_close(f);
	}
	munmap(p, N);
}

/* One child: write_first, by_path, direct as named. */
static void late(const char *path, int write_first, int by_path, int direct)
{
	unsigned char host[N], *dev, *back = malloc(FILE_BYTES);
	char why[PATH_MAX + 128];
	nvio_handle_t *h;
	nvio_file_t *f = NULL;
	size_t got = 0;
	unsigned long copies;
	int err = 0;

	t_ctx("%s first, %s, direct %d", write_first ? "write" : "read",
	      by_path ? "by path" : "open file", direct);
	if (!back || t_handle(&h, NVIO_ENGINE_AUTO, direct, 1, 0) != 0)
		return;
	/* nvio has run without a driver, and has not looked for one */
	T_OK(nvio_pread(h, host, sizeof(host), path, 0, 0));
	bad_host_buffer(h, path);
	T_EQ_INT(nvio__cuda_known(), 0);
	if (sim_load(&sim, sim_dir, why, sizeof(why)) < 0) {
		T_FAILF("%s", why);
		return;
	}
	dev = sim.alloc(0, N);
	if (!T_TRUE(dev != NULL))
		return;
	if (!by_path) {
		f = nvio_file_open(h, path, NVIO_FILE_READ | NVIO_FILE_WRITE, &err);
		if (!T_OK(err) || !T_TRUE(f != NULL))
			return;
	}
	T_EQ_INT(nvio__cuda_known(), 0);	/* the lazy path, below */
	copies = sim.copies();
	if (write_first) {
		t_fill_random_at(host, N, 33, 0);
		T_EQ_INT(sim.poke(dev, host, N), 0);
		copies = sim.copies();
		T_OK(f ? nvio_file_pwrite(f, dev, N, OFF, 0) : nvio_pwrite(h, dev, N, path, OFF, 0));
		if (f)
			T_OK(nvio_file_close(f));
		T_OK(t_read_file(path, back, FILE_BYTES, &got));
		T_EQ_U64(got, FILE_BYTES);
		T_EQ_INT(memcmp(back + OFF, host, N), 0);
		T_EQ_INT(t_check_random_at(back, OFF, 21, 0), -1);	/* the rest stays */
	} else {
		T_EQ_INT(sim.fill(dev, 0xee, N), 0);
		T_OK(f ? nvio_file_pread(f, dev, N, OFF, 0) : nvio_pread(h, dev, N, path, OFF, 0));
		if (f)
			T_OK(nvio_file_close(f));
		T_EQ_INT(sim.peek(host, dev, N), 0);
		T_EQ_INT(t_check_random_at(host, N, 21, OFF), -1);
	}
	T_TRUE(sim.copies() > copies);		/* through the driver */
	T_EQ_INT(nvio__cuda_known(), 1);
	/* a bad host buffer is still refused by the kernel, not taken for
	 * device memory, now that a driver is there */
	bad_host_buffer(h, path);
	T_EQ_U64(sim.violations(), 0);
	nvio_handle_destroy(h);
	free(back);
}

int main(void)
{
	static unsigned char data[FILE_BYTES];
	char path[T_PATH_MAX];

	t_init("cuda_late");
	if (find_sim() < 0) {
		T_FAILF("readlink /proc/self/exe");
		return t_done();
	}
	t_path(path, "data");
	for (int c = 0; c < 8; c++) {
		int write_first = c & 1, by_path = (c >> 1) & 1;
		int direct = c & 4 ? NVIO_DIRECT_AUTO : NVIO_DIRECT_OFF;
		pid_t pid;
		int status = 0;

		t_fill_random(data, sizeof(data), 21);
		T_OK(t_write_file(path, data, sizeof(data)));
		pid = fork();
		if (pid == 0) {
			late(path, write_first, by_path, direct);
			_exit(t_done());
		}
		t_ctx("case %d", c);
		if (!T_TRUE(pid > 0))
			break;
		T_TRUE(waitpid(pid, &status, 0) == pid);
		T_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	}
	return t_done();
}
