/*
 * test_staging_limit.c - staging memory is one process-wide budget.
 *
 * Four handles of two workers each move buffers O_DIRECT cannot take
 * (every piece staged), each asking for 16 MiB of bounce buffers per
 * worker: 128 MiB without a budget. Under a 16 MiB limit the pools hold
 * at most the limit plus two buffers for each worker that came after it
 * was spent, the bytes are right, and destroying the handles gives
 * everything back. Direct I/O only (buffered I/O stages nothing); every
 * engine.
 */
#include <stdlib.h>
#include <string.h>

#include "t.h"

#define NH 4
#define PAR 2
#define BLOCK (1u << 20)
#define N ((8u << 20) + 1)	/* odd: an unaligned tail too */

static void one(int engine, unsigned char *want, unsigned char *got)
{
	nvio_handle_t *h[NH] = { 0 };
	char path[T_PATH_MAX];
	uint64_t in_use = 0, limit;
	nvio_config_t c;

	t_path(path, "data");
	T_OK(t_write_file(path, want, N));
	T_OK(nvio_staging_set_limit(16u << 20));
	limit = nvio_staging_limit(&in_use);
	T_EQ_U64(limit, 16u << 20);
	T_EQ_U64(in_use, 0);
	for (int i = 0; i < NH; i++) {
		t_config(&c, engine, NVIO_DIRECT_ON, BLOCK, 32);
		c.intra_op_parallelism = PAR;
		c.staging_bytes = 16u << 20;
		if (!T_OK(nvio_handle_create(&h[i], &c)))
			continue;
		memset(got, 0, N + 1);
		/* got + 1: no buffer O_DIRECT can take, every piece staged */
		T_OK(nvio_pread(h[i], got + 1, N, path, 0, 0));
		T_MEM_EQ(got + 1, want, N);
	}
	nvio_staging_limit(&in_use);
	if (in_use > limit + (uint64_t)NH * PAR * 2 * BLOCK)
		T_FAILF("pools hold %llu bytes under a %llu-byte limit",
			(unsigned long long)in_use, (unsigned long long)limit);
	T_TRUE(in_use < (uint64_t)NH * PAR * (16u << 20));
	for (int i = 0; i < NH; i++)
		nvio_handle_destroy(h[i]);
	nvio_staging_limit(&in_use);
	T_EQ_U64(in_use, 0);
	T_OK(nvio_staging_set_limit(0));
	T_EQ_U64(nvio_staging_limit(NULL), NVIO_DEFAULT_STAGING_LIMIT);
}

int main(void)
{
	unsigned char *want, *got;

	t_init("staging_limit");
	want = t_alloc(N);
	got = t_alloc(N + 1);
	t_fill_random(want, N, 9);
	T_FOR_EACH_COMBO(e, d) {
		if (d != NVIO_DIRECT_ON)
			continue;
		one(e, want, got);
	}
	free(want);
	free(got);
	return t_done();
}
