/*
 * test_mem.c - nvio_mem_alloc / nvio_mem_free / nvio_mem_query: page
 * alignment, zeroed memory, locking (checked against VmLck in
 * /proc/self/status), the unlocked fallback when mlock fails (injected),
 * NVIO_MEM_REQUIRE_LOCKED, safe double free, queries inside, outside and
 * straddling, concurrent use, and locked memory as an I/O buffer.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "t.h"
#include "sys.h"

static struct nvio__sys real;
static int mlock_errno;

static int h_mlock_fail(const void *p, size_t n)
{
	errno = mlock_errno;
	return -1;
}

/* Locked kB of this process. */
static long vm_locked_kb(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	long kb = -1;

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, "VmLck:", 6))
			kb = strtol(line + 6, NULL, 10);
	fclose(f);
	return kb;
}

static int all_zero(const unsigned char *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (p[i])
			return 0;
	return 1;
}

static void test_alloc(void)
{
	static const uint64_t sizes[] = { 1, 100, 4095, 4096, 4097, 1u << 20,
					  (4u << 20) + 1 };
	long page = sysconf(_SC_PAGESIZE);

	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		uint64_t n = sizes[i];
		unsigned char *p = NULL;
		unsigned fl = 0xdead;
		long before = vm_locked_kb(), after;

		t_ctx("alloc %llu", (unsigned long long)n);
		if (!T_OK(nvio_mem_alloc((void **)&p, n, 0, &fl)) || !p)
			continue;
		T_EQ_U64((uintptr_t)p % (uintptr_t)page, 0);
		T_TRUE(all_zero(p, n));
		T_EQ_U64(fl & ~NVIO_MEM_LOCKED, 0);
		if (geteuid() == 0)
			T_EQ_U64(fl, NVIO_MEM_LOCKED);
		after = vm_locked_kb();
		/* (ASan's mlock does nothing: VmLck is not checked there) */
		if ((fl & NVIO_MEM_LOCKED) && !T_SANITIZED)
			T_TRUE(after - before >= (long)((n + 1023) / 1024));
		memset(p, 0x77, n);	/* usable, all of it */
		T_EQ_U64(nvio_mem_query(p, n), NVIO_MEM_NVIO | fl);
		T_OK(nvio_mem_free(p));
		if ((fl & NVIO_MEM_LOCKED) && !T_SANITIZED)
			T_TRUE(vm_locked_kb() <= after - (long)(n / 1024));
		/* The second free is refused, and nothing breaks. */
		T_ERR(nvio_mem_free(p), -EINVAL);
		T_EQ_U64(nvio_mem_query(p, 1), 0);
	}

	t_ctx("alloc bad args");
	{
		void *p = (void *)1;

		/* 0 bytes is a valid, freeable allocation (an empty tensor) */
		T_OK(nvio_mem_alloc(&p, 0, 0, NULL));
		T_TRUE(p != (void *)1 && p != NULL);
		T_TRUE(((uintptr_t)p & 4095) == 0);
		T_OK(nvio_mem_free(p));
		T_ERR(nvio_mem_free(p), -EINVAL);
		p = (void *)1;
		T_ERR(nvio_mem_alloc(NULL, 10, 0, NULL), -EINVAL);
		T_ERR(nvio_mem_alloc(&p, 10, 1u << 20, NULL), -EINVAL);
		p = NULL;
		/* (ASan aborts on a huge request instead of failing it) */
		if (!T_SANITIZED) {
			int r = nvio_mem_alloc(&p, UINT64_MAX / 2, 0, NULL);

			if (r != -ENOMEM && r != -EINVAL)
				T_ERR(r, -ENOMEM);
			if (r == 0)
				nvio_mem_free(p);
		}
	}
	t_ctx("free of foreign pointers");
	{
		char *m = malloc(100);
		unsigned char *p = NULL;
		int local;

		T_ERR(nvio_mem_free(m), -EINVAL);
		free(m);	/* still ours: nvio did not free it */
		T_ERR(nvio_mem_free(&local), -EINVAL);
		if (T_OK(nvio_mem_alloc((void **)&p, 8192, 0, NULL))) {
			T_ERR(nvio_mem_free(p + 4096), -EINVAL);
			T_ERR(nvio_mem_free(p + 1), -EINVAL);
			T_EQ_U64(nvio_mem_query(p, 8192) & NVIO_MEM_NVIO,
				 NVIO_MEM_NVIO);
			T_OK(nvio_mem_free(p));
		}
	}
}

static void test_query(void)
{
	unsigned char *p = NULL, *q = NULL;
	const uint64_t n = 3 * 4096 + 5;
	unsigned fl = 0, want;
	int stack_var;

	t_ctx("query");
	if (!T_OK(nvio_mem_alloc((void **)&p, n, 0, &fl)))
		return;
	want = NVIO_MEM_NVIO | (fl & NVIO_MEM_LOCKED);
	T_EQ_U64(nvio_mem_query(p, n), want);
	T_EQ_U64(nvio_mem_query(p, 1), want);
	T_EQ_U64(nvio_mem_query(p + 10, 100), want);
	T_EQ_U64(nvio_mem_query(p + n - 1, 1), want);
	T_EQ_U64(nvio_mem_query(p + 4096, n - 4096), want);
	/* straddling an end */
	T_EQ_U64(nvio_mem_query(p + n - 1, 2), 0);
	T_EQ_U64(nvio_mem_query(p, n + 1), 0);
	T_EQ_U64(nvio_mem_query(p - 1, 2), 0);
	T_EQ_U64(nvio_mem_query(p - 1, n), 0);
	/* outside */
	T_EQ_U64(nvio_mem_query(p + n, 1), 0);
	T_EQ_U64(nvio_mem_query(p - 4096, 10), 0);
	T_EQ_U64(nvio_mem_query(&stack_var, sizeof(stack_var)), 0);
	T_EQ_U64(nvio_mem_query(NULL, 10), 0);
	T_EQ_U64(nvio_mem_query(p, UINT64_MAX), 0);
	/* spanning two allocations is not inside one */
	if (T_OK(nvio_mem_alloc((void **)&q, 4096, 0, NULL))) {
		unsigned char *lo = p < q ? p : q, *hi = p < q ? q : p;

		T_EQ_U64(nvio_mem_query(lo, (uint64_t)(hi - lo) + 1), 0);
		T_OK(nvio_mem_free(q));
	}
	T_OK(nvio_mem_free(p));
	T_EQ_U64(nvio_mem_query(p, 1), 0);
}

static void test_mlock_fails(void)
{
	static const int errs[] = { EPERM, ENOMEM, EAGAIN };

	for (size_t i = 0; i < sizeof(errs) / sizeof(errs[0]); i++) {
		unsigned char *p = NULL;
		unsigned fl = 0xdead;
		long before = vm_locked_kb();
		int r;

		t_ctx("mlock fails with %s", t_errname(-errs[i]));
		mlock_errno = errs[i];
		nvio__sys.mlock = h_mlock_fail;
		r = nvio_mem_alloc((void **)&p, 1u << 20, 0, &fl);
		nvio__sys_reset();
		if (T_OK(r) && p) {
			T_EQ_U64(fl & NVIO_MEM_LOCKED, 0);
			T_EQ_INT(vm_locked_kb(), before);
			T_TRUE(all_zero(p, 1u << 20));
			memset(p, 1, 1u << 20);
			T_EQ_U64(nvio_mem_query(p, 1u << 20), NVIO_MEM_NVIO);
			T_OK(nvio_mem_free(p));
		}

		/* With REQUIRE_LOCKED: mlock's error. */
		p = (unsigned char *)1;
		nvio__sys.mlock = h_mlock_fail;
		r = nvio_mem_alloc((void **)&p, 1u << 20,
				   NVIO_MEM_REQUIRE_LOCKED, &fl);
		nvio__sys_reset();
		if (errs[i] == EAGAIN) {
			/* mlock(2)'s EAGAIN: the header names ENOMEM/EPERM */
			T_TRUE(r < 0);
		} else {
			T_ERR(r, -errs[i]);
		}
		if (r == 0)
			nvio_mem_free(p);
		T_EQ_INT(vm_locked_kb(), before);
	}
	(void)real;
}

static void *mem_thread(void *arg)
{
	uint64_t st = (uint64_t)(uintptr_t)arg;
	void *ps[16] = { 0 };
	uint64_t ns[16] = { 0 };

	for (int it = 0; it < 400; it++) {
		int k = (int)(t_rand64(&st) % 16);

		if (ps[k]) {
			unsigned char *p = ps[k];

			if (p[0] != (unsigned char)k ||
			    p[ns[k] - 1] != (unsigned char)k)
				T_FAILF("allocation %d changed under us", k);
			if (!(nvio_mem_query(p, ns[k]) & NVIO_MEM_NVIO))
				T_FAILF("live allocation not found by query");
			T_OK(nvio_mem_free(p));
			ps[k] = NULL;
		} else {
			ns[k] = 1 + t_rand64(&st) % 200000;
			if (T_OK(nvio_mem_alloc(&ps[k], ns[k], 0, NULL))) {
				memset(ps[k], k, ns[k]);
			}
		}
	}
	for (int k = 0; k < 16; k++)
		if (ps[k])
			T_OK(nvio_mem_free(ps[k]));
	return NULL;
}

static void test_threads(void)
{
	pthread_t th[4];

	t_ctx("4 threads alloc/free/query");
	for (int i = 0; i < 4; i++)
		pthread_create(&th[i], NULL, mem_thread,
			       (void *)(uintptr_t)(i + 1));
	for (int i = 0; i < 4; i++)
		pthread_join(th[i], NULL);
}

/* nvio memory as an I/O buffer on every engine, direct on and off. */
static void test_as_buffer(void)
{
	char path[T_PATH_MAX];
	const uint64_t n = (2u << 20) + 4096;
	unsigned char *p = NULL, *q = NULL;

	t_path(path, "membuf");
	if (nvio_mem_alloc((void **)&p, n, 0, NULL) ||
	    nvio_mem_alloc((void **)&q, n, 0, NULL)) {
		T_FAILF("nvio_mem_alloc failed");
		return;
	}
	T_FOR_EACH_COMBO(e, d) {
		nvio_handle_t *h;

		t_ctx("%s nvio memory as buffer", t_combo());
		if (t_handle(&h, e, d, 2, 1u << 20))
			continue;
		t_fill_random(p, n, (uint64_t)t_combo_i);
		T_OK(nvio_pwrite(h, p, n, path, 4096, 0));
		T_EQ_INT(t_check_file_random(path, 4096, n,
					     (uint64_t)t_combo_i, 0), 0);
		memset(q, 0, n);
		T_OK(nvio_pread(h, q, n, path, 4096, 0));
		T_MEM_EQ(q, p, n);
		/* unaligned piece of it */
		memset(q, 0, n);
		T_OK(nvio_pread(h, q + 1, n - 4097, path, 4097, 0));
		T_MEM_EQ(q + 1, p + 1, n - 4097);
		nvio_handle_destroy(h);
	}
	nvio_mem_free(p);
	nvio_mem_free(q);
	unlink(path);
}

int main(void)
{
	t_init("mem");
	nvio__sys_reset();
	real = nvio__sys;
	test_alloc();
	test_query();
	test_mlock_fails();
	test_threads();
	test_as_buffer();
	return t_done();
}
