/*
 * test_crc32.c - nvio_crc32 and nvio_crc32_combine against a CRC-32
 * computed bit by bit from its definition (reflected polynomial
 * 0xEDB88320, initial and final value ~0): the standard check value,
 * every length 0..600 at every start alignment in 16 bytes, lengths
 * around the folding strides, a few large buffers, continuation from a
 * nonzero crc, each implementation the CPU has on its own (the tables,
 * what CPUs without PCLMULQDQ get; PCLMULQDQ; VPCLMULQDQ),
 * and combine over lengths 0, 1, odd ones and ones above 4 GiB (checked
 * against its definition by splitting buffers).
 */
#include <stdlib.h>
#include <string.h>

#include "t.h"
#include "internal.h"

static uint32_t crc_bitwise(uint32_t crc, const unsigned char *p, size_t n)
{
	uint32_t c = ~crc;
	for (size_t i = 0; i < n; i++) {
		c ^= p[i];
		for (int k = 0; k < 8; k++)
			c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1)));
	}
	return ~c;
}

/* crc(A) * x^(8 n) by running n zero bytes through the raw state. */
static uint32_t shift_zeros(uint32_t crc, uint64_t n)
{
	uint32_t c = crc;
	for (uint64_t i = 0; i < n * 8; i++)
		c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1)));
	return c;
}

int main(void)
{
	t_init("test_crc32");
	static const char *const levels[] = { "tables", "PCLMULQDQ folding",
					      "VPCLMULQDQ folding" };
	int top = nvio__crc32_accelerated();
	t_note("nvio_crc32 uses %s", levels[top]);

	t_ctx("check value");
	T_EQ_U64(nvio_crc32(0, "123456789", 9), 0xCBF43926u);
	T_EQ_U64(nvio__crc32_portable(0, "123456789", 9), 0xCBF43926u);
	T_EQ_U64(nvio_crc32(0, NULL, 0), 0);
	T_EQ_U64(nvio_crc32(0x12345678u, NULL, 0), 0x12345678u);
	T_EQ_U64(nvio_crc32(0x12345678u, "x", 0), 0x12345678u);

	size_t big = t_quick() ? (8u << 20) + 77 : (64u << 20) + 77;
	unsigned char *buf = malloc(big + 64);
	if (!buf)
		t_skip("no memory");
	t_fill_random(buf, big + 64, 7);

	for (unsigned a = 0; a < 16; a++)
		for (size_t n = 0; n <= 600; n++) {
			t_ctx("align %u len %zu", a, n);
			uint32_t want = crc_bitwise(0, buf + a, n);
			if (!T_EQ_U64(nvio_crc32(0, buf + a, n), want) ||
			    !T_EQ_U64(nvio__crc32_portable(0, buf + a, n), want))
				break;
			for (int l = 0; l <= top; l++) {
				t_ctx("align %u len %zu, %s", a, n, levels[l]);
				T_EQ_U64(nvio__crc32_with(l, 0x5eedu, buf + a, n),
					 crc_bitwise(0x5eedu, buf + a, n));
			}
		}
	static const size_t sizes[] = { 255, 256, 257, 319, 320, 321, 1023, 1024, 4095,
					4096, 4097, 65536 + 15, 1 << 20 };
	for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
		for (unsigned a = 0; a < 64; a += 7) {
			size_t n = sizes[i];
			t_ctx("align %u len %zu, continued from 0xdeadbeef", a, n);
			uint32_t want = crc_bitwise(0xdeadbeefu, buf + a, n);
			T_EQ_U64(nvio_crc32(0xdeadbeefu, buf + a, n), want);
			for (int l = 0; l <= top; l++)
				T_EQ_U64(nvio__crc32_with(l, 0xdeadbeefu, buf + a, n), want);
			/* the same bytes in two calls, split anywhere */
			size_t cut = (n * (a + 1)) / 65;
			T_EQ_U64(nvio_crc32(nvio_crc32(0xdeadbeefu, buf + a, cut), buf + a + cut,
					    n - cut), want);
		}

	t_ctx("large buffer, %zu bytes", big);
	uint32_t whole = crc_bitwise(0, buf + 3, big);
	T_EQ_U64(nvio_crc32(0, buf + 3, big), whole);
	T_EQ_U64(nvio__crc32_portable(0, buf + 3, big), whole);
	for (int l = 0; l <= top; l++) {
		t_ctx("large buffer, %zu bytes, %s", big, levels[l]);
		T_EQ_U64(nvio__crc32_with(l, 0, buf + 3, big), whole);
	}

	/* combine: the large buffer cut in pieces, and odd lengths */
	static const size_t cuts[] = { 0, 1, 15, 16, 17, 4096, 1u << 20, 3333333 };
	for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
		size_t c = cuts[i];
		t_ctx("combine at %zu of %zu", c, big);
		uint32_t a = nvio_crc32(0, buf + 3, c), b = nvio_crc32(0, buf + 3 + c, big - c);
		T_EQ_U64(nvio_crc32_combine(a, b, big - c), whole);
		T_EQ_U64(nvio_crc32_combine(whole, b, 0), whole ^ b);
	}
	/* lengths too big for a buffer: against the definition, crc(A B) =
	 * crc(A) * x^(8 len(B)) ^ crc(B), the shift done by zero bits. */
	static const uint64_t longs[] = { 1, 3, 255, 4097, (1u << 20) + 1 };
	for (size_t i = 0; i < sizeof longs / sizeof longs[0]; i++) {
		uint64_t n = longs[i];
		t_ctx("combine, len2 %llu", (unsigned long long)n);
		T_EQ_U64(nvio_crc32_combine(0xCBF43926u, 0x1234567u, n),
			 shift_zeros(0xCBF43926u, n) ^ 0x1234567u);
	}
	/* above 4 GiB: shifting by n1 then n2 is shifting by n1 + n2 */
	t_ctx("combine, len2 above 4 GiB");
	uint64_t n1 = (1ull << 32) + 5, n2 = (1u << 20) + 1;
	T_EQ_U64(nvio_crc32_combine(nvio_crc32_combine(0xCBF43926u, 0, n1), 0, n2),
		 nvio_crc32_combine(0xCBF43926u, 0, n1 + n2));
	T_EQ_U64(nvio_crc32_combine(nvio_crc32_combine(0xCBF43926u, 0, n2), 0, n1),
		 nvio_crc32_combine(0xCBF43926u, 0, n1 + n2));
	T_TRUE(nvio_crc32_combine(0xCBF43926u, 0, n1) != nvio_crc32_combine(0xCBF43926u, 0, n2));
	free(buf);
	return t_done();
}
