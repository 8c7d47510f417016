/*
 * test_cuda_api.c - nvio_cuda_alloc, nvio_cuda_free and nvio_cuda_memcpy
 * against the simulated driver (tests/sim/), loaded by nvio itself
 * through NVIO_CUDA_LIB as the tool loads a real one: bytes moved in
 * every direction, the caller's (absent) context left alone, every retain
 * given back, and a table of bad arguments with their exact -errno.
 */
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "t.h"
#define SIM_LOADER
#include "sim/sim.h"

static struct sim_api sim;
static int (*ctx_get_current)(void **);

static void *no_ctx_thread(void *arg)
{
	void **dev = arg, *cur = (void *)1;

	/* a thread with no context: nvio's calls leave it without one */
	*dev = NULL;
	if (nvio_cuda_alloc(1, 4096, dev) == 0 && ctx_get_current(&cur) == 0 && cur)
		*dev = NULL;
	return NULL;
}

int main(void)
{
	char dir[PATH_MAX], path[PATH_MAX + 32], why[PATH_MAX + 128];
	size_t n = (1u << 20) + 3;
	unsigned char *a = malloc(n), *b = malloc(n);
	void *d1 = NULL, *d2 = NULL, *d3 = NULL;
	ssize_t len;
	pthread_t t;

	t_init("cuda_api");
	len = readlink("/proc/self/exe", dir, sizeof(dir) - 8);
	if (len <= 0 || !a || !b) {
		T_FAILF("setup");
		return t_done();
	}
	dir[len] = 0;
	*strrchr(dir, '/') = 0;
	strcat(dir, "/sim");
	snprintf(path, sizeof(path), "%s/libcuda.so.1", dir);
	setenv("NVIO_CUDA_LIB", path, 1);
	t_ctx("allocation loads the driver");
	if (!T_OK(nvio_cuda_alloc(0, n, &d1)))
		return t_done();
	if (sim_load(&sim, dir, why, sizeof(why)) < 0) {
		T_FAILF("%s", why);
		return t_done();
	}
	*(void **)&ctx_get_current = dlsym(RTLD_DEFAULT, "cuCtxGetCurrent");
	T_TRUE(ctx_get_current != NULL);
	T_EQ_INT(sim.ctx_refs(), 1);
	t_ctx("copies in every direction");
	t_fill_random(a, n, 3);
	T_OK(nvio_cuda_memcpy(d1, a, n));
	T_EQ_INT(sim.peek(b, d1, n), 0);
	T_EQ_INT(t_check_random_at(b, n, 3, 0), -1);
	T_OK(nvio_cuda_alloc(1, n, &d2));	/* the second device */
	T_OK(nvio_cuda_memcpy(d2, d1, n));
	memset(b, 0, n);
	T_OK(nvio_cuda_memcpy(b, d2, n));
	T_EQ_INT(t_check_random_at(b, n, 3, 0), -1);
	memset(b, 0, n);
	T_OK(nvio_cuda_memcpy(b, a, n));	/* host to host */
	T_EQ_INT(t_check_random_at(b, n, 3, 0), -1);
	T_OK(nvio_cuda_memcpy(d1, a, 0));
	t_ctx("the calling thread's context is left alone");
	T_EQ_INT(pthread_create(&t, NULL, no_ctx_thread, &d3), 0);
	pthread_join(t, NULL);
	T_TRUE(d3 != NULL);
	t_ctx("bad arguments");
	T_ERR(nvio_cuda_alloc(0, 0, &d3), -EINVAL);
	T_ERR(nvio_cuda_alloc(0, 16, NULL), -EINVAL);
	T_ERR(nvio_cuda_alloc(9, 16, &d3), -ENODEV);
	T_ERR(nvio_cuda_alloc(-1, 16, &d3), -ENODEV);
	T_ERR(nvio_cuda_alloc(0, 1ull << 50, &d3), -ENOMEM);
	T_ERR(nvio_cuda_free(a), -EINVAL);
	T_ERR(nvio_cuda_free(NULL), -EINVAL);
	T_ERR(nvio_cuda_memcpy(NULL, a, 1), -EINVAL);
	T_ERR(nvio_cuda_memcpy((char *)d1 + 1, a, n), -EINVAL);	/* past its end */
	sim.fail("cuMemcpyHtoD_v2", 0, 1, 999);
	T_ERR(nvio_cuda_memcpy(d1, a, 16), -EIO);
	t_ctx("everything given back");
	T_OK(nvio_cuda_free(d1));
	T_OK(nvio_cuda_free(d2));
	T_OK(nvio_cuda_free(d3));
	T_ERR(nvio_cuda_free(d1), -EINVAL);
	T_EQ_INT(sim.ctx_refs(), 0);
	T_EQ_U64(sim.violations(), 0);
	free(a);
	free(b);
	return t_done();
}
