/*
 * test_large.c - one round trip of 2 GiB + 4097 bytes at file offset 4095
 * (sizes and offsets past 32 bits) on the default engine, direct on and
 * off. Needs 6 GiB free in the test directory; skipped with
 * NVIO_TEST_QUICK. One buffer: the data is generated and checked in
 * pieces from its seed.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "t.h"

#define N ((2ull << 30) + 4097)
#define OFF 4095

int main(void)
{
	struct statvfs sv;
	unsigned char *buf;
	char path[T_PATH_MAX];

	t_init("large");
	if (t_quick())
		t_skip("NVIO_TEST_QUICK is set");
	if (T_TSAN)
		t_skip("a 2 GiB buffer under TSan's shadow memory is too big "
		       "for this test (the plain and ASan runs cover it)");
	if (statvfs(t_tmpdir(), &sv) ||
	    (uint64_t)sv.f_bavail * sv.f_frsize < (6ull << 30))
		t_skip("less than 6 GiB free in %s", t_tmpdir());
	buf = malloc(N);
	if (!buf)
		t_skip("cannot allocate %llu bytes", (unsigned long long)N);
	t_path(path, "large");
	for (int j = 0; j < T_N_DIRECTS; j++) {
		int d = t_direct_list[j];
		nvio_handle_t *h;
		int64_t bad;

		if (!t_direct_ok(d))
			continue;
		t_ctx("2 GiB + 4097 at 4095, default engine, %s",
		      t_direct_str(d));
		if (t_handle(&h, NVIO_ENGINE_AUTO, d, 2, 0))
			continue;
		t_fill_random(buf, N, 11 + (uint64_t)j);
		T_OK(nvio_pwrite(h, buf, N, path, OFF, 0));
		T_EQ_INT(t_file_size(path), (int64_t)(N + OFF));
		T_EQ_INT(t_check_file_random(path, OFF, N, 11 + (uint64_t)j, 0),
			 0);
		memset(buf, 0, N);
		T_OK(nvio_pread(h, buf, N, path, OFF, 0));
		bad = t_check_random_at(buf, N, 11 + (uint64_t)j, 0);
		if (bad >= 0)
			T_FAILF("read back: byte %lld differs",
				(long long)bad);
		nvio_handle_destroy(h);
		unlink(path);
	}
	/* Bounded memory: nothing but the caller's buffer scales with the
	 * op (staging is per worker, 16 MiB by default). */
	{
		struct rusage ru;

		if (!getrusage(RUSAGE_SELF, &ru) && !T_SANITIZED) {
			uint64_t peak = (uint64_t)ru.ru_maxrss << 10;

			t_ctx("peak RSS");
			if (peak > N + (512ull << 20))
				T_FAILF("peak RSS %llu MiB for a %llu MiB "
					"buffer", (unsigned long long)(peak >> 20),
					(unsigned long long)(N >> 20));
		}
	}
	free(buf);
	return t_done();
}
