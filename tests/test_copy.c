/*
 * test_copy.c - the staged-copy routines (staging.c): memcpy, and on
 * x86-64 the 16-byte (SSE2) and 32-byte (AVX2) streaming copies, each
 * checked byte for byte against the source at every small size and at
 * sizes around the streaming threshold and the loop strides, from and to
 * every alignment in a 64-byte line, with guard bytes on both sides of
 * the destination that must stay untouched. The dispatching copy used by
 * the workers is checked the same way.
 */
#include <stdlib.h>
#include <string.h>

#include "t.h"
#include "staging.h"

#define GUARD 64
#define GUARD_BYTE 0xa5

static const char *kind_name(int kind)
{
	switch (kind) {
	case NVIO__COPY_MEMCPY: return "memcpy";
	case NVIO__COPY_SSE2: return "sse2";
	case NVIO__COPY_AVX2: return "avx2";
	default: return "dispatch";
	}
}

/* kind -1: nvio__stage_copy, which picks by size and CPU. */
static int copy(int kind, void *dst, const void *src, size_t n)
{
	if (kind < 0) {
		nvio__stage_copy(dst, src, n);
		return 0;
	}
	return nvio__stage_copy_kind(kind, dst, src, n);
}

static unsigned char *src_buf, *dst_buf;

/* One copy of n bytes from src_buf + so to dst_buf + GUARD + d_off. */
static void check_one(int kind, size_t n, unsigned so, unsigned d_off)
{
	unsigned char *d = dst_buf + GUARD + d_off;
	const unsigned char *s = src_buf + so;
	size_t i;

	memset(dst_buf, GUARD_BYTE, n + 2 * GUARD + 64);
	t_ctx("%s n=%zu src+%u dst+%u", kind_name(kind), n, so, d_off);
	if (!T_OK(copy(kind, d, s, n)))
		return;
	T_MEM_EQ(d, s, n);
	for (i = 0; i < GUARD + d_off; i++)
		if (dst_buf[i] != GUARD_BYTE) {
			T_FAILF("byte %zu before the destination changed", GUARD + d_off - i);
			return;
		}
	for (i = 0; i < GUARD; i++)
		if (d[n + i] != GUARD_BYTE) {
			T_FAILF("byte %zu after the destination changed", i);
			return;
		}
}

int main(void)
{
	/* around the threshold (64 KiB), the strides (64, 128) and big */
	static const size_t big[] = {
		(64u << 10) - 1, 64u << 10, (64u << 10) + 1, (64u << 10) + 63,
		(64u << 10) + 64, (64u << 10) + 127, (64u << 10) + 129,
		(1u << 20) + 37, (3u << 20) + 4095,
	};
	static const unsigned offs[] = { 0, 1, 7, 15, 16, 17, 31, 32, 33, 48, 63 };
	size_t max = (3u << 20) + 4095 + 64;
	int kinds[] = { -1, NVIO__COPY_MEMCPY, NVIO__COPY_SSE2, NVIO__COPY_AVX2 };
	int ran = 0;

	t_init("copy");
	src_buf = malloc(max + 64);
	dst_buf = malloc(max + 2 * GUARD + 64);
	if (!src_buf || !dst_buf) {
		T_FAILF("malloc");
		return t_done();
	}
	t_fill_random(src_buf, max + 64, 11);
	for (unsigned k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++) {
		int kind = kinds[k];
		unsigned char probe[4] = { 0 };

		if (kind >= 0 && nvio__stage_copy_kind(kind, probe, probe + 2, 2) == -ENOTSUP) {
			t_note("%s: not on this CPU or build", kind_name(kind));
			continue;
		}
		ran++;
		/* every size below 300 from every source and destination
		 * alignment in a line */
		for (size_t n = 0; n < 300; n++)
			for (unsigned so = 0; so < 64; so += 7)
				for (unsigned d = 0; d < 64; d++)
					check_one(kind, n, so, d);
		for (unsigned b = 0; b < sizeof(big) / sizeof(big[0]); b++)
			for (unsigned i = 0; i < sizeof(offs) / sizeof(offs[0]); i++)
				for (unsigned j = 0; j < sizeof(offs) / sizeof(offs[0]); j++)
					check_one(kind, big[b], offs[i], offs[j]);
	}
	t_ctx("kinds");
	T_TRUE(ran >= 2);	/* the dispatcher and memcpy at least */
	free(src_buf);
	free(dst_buf);
	return t_done();
}
