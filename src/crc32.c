/*
 * CRC-32 of zip, gzip and zlib (polynomial 0x04C11DB7, bit-reflected
 * 0xEDB88320, initial and final value ~0): nvio_crc32() and
 * nvio_crc32_combine(), results equal to zlib's crc32()/crc32_combine().
 *
 * Three implementations, the fastest the CPU has picked once at run time:
 *
 *  - x86-64 with VPCLMULQDQ and AVX2: as the next, 256 bytes at a time
 *    into sixteen 128-bit remainders held in eight 256-bit registers (one
 *    instruction multiplies two lanes), folded into one at the end: 2.2-2.7x
 *    the PCLMULQDQ code's speed on data in cache where the wide multiply
 *    issues as often as the narrow one (AMD Zen 3 and later, Intel Ice
 *    Lake and later; 24 against 9 GB/s on the 2-core EPYC VM nvio is
 *    developed on).
 *  - x86-64 with PCLMULQDQ: the data is folded 64 bytes at a time into
 *    four 128-bit remainders with carry-less multiplications (each 128-bit
 *    value v, whose polynomial stands D bits before the data it is folded
 *    into, is replaced by v_hi64 * (x^(D+63) mod P) ^ v_lo64 * (x^(D-1)
 *    mod P), which is congruent to v * x^D and fits in 96 bits), then the
 *    four are folded into one, and the last 16-byte remainder plus the
 *    tail go through the table code. No Barrett reduction is needed: the
 *    table code reduces the 16 remainder bytes exactly as it would reduce
 *    16 message bytes.
 *  - everywhere: slice-by-8 tables (8 bytes per step).
 *
 * Every constant (tables and folding multipliers) is computed from the
 * polynomial at first use (crc_init), so none is copied from elsewhere and
 * each can be checked against the definition.
 */
#include "internal.h"

#include <pthread.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define CRC_HAVE_CLMUL 1
#include <immintrin.h>
#endif

#define CRC_POLY_REFLECTED 0xEDB88320u
#define CRC_POLY_NORMAL 0x104C11DB7ull	/* x^32 + ... + 1 */

static uint32_t crc_table[8][256];
#ifdef CRC_HAVE_CLMUL
/* Folding multipliers, as 64-bit reflected operands (see fold()). */
static uint64_t k_fold2048[2], k_fold512[2], k_fold128[2];
static int crc_use_clmul;	/* 0 tables, 1 PCLMULQDQ, 2 VPCLMULQDQ */
#endif
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

/* x^n mod P, in normal bit order (bit d is the coefficient of x^d). */
static uint32_t xpow_mod(unsigned n)
{
	uint64_t r = 1;
	while (n--) {
		r <<= 1;
		if (r >> 32)
			r ^= CRC_POLY_NORMAL;
	}
	return (uint32_t)r;
}

static uint32_t reflect32(uint32_t v)
{
	uint32_t r = 0;
	for (int i = 0; i < 32; i++)
		if (v & (1u << i))
			r |= 1u << (31 - i);
	return r;
}

static void crc_init(void)
{
	for (uint32_t n = 0; n < 256; n++) {
		uint32_t c = n;
		for (int k = 0; k < 8; k++)
			c = c & 1 ? (c >> 1) ^ CRC_POLY_REFLECTED : c >> 1;
		crc_table[0][n] = c;
	}
	for (uint32_t n = 0; n < 256; n++)
		for (int k = 1; k < 8; k++) {
			uint32_t c = crc_table[k - 1][n];
			crc_table[k][n] = (c >> 8) ^ crc_table[0][c & 0xff];
		}
#ifdef CRC_HAVE_CLMUL
	/*
	 * A 64-bit reflected operand holds the coefficient of x^d in bit
	 * 63 - d, so a polynomial of degree < 32 is reflect32(k) << 32.
	 * Index 0 multiplies the register's low half (its higher-degree
	 * coefficients), index 1 its high half.
	 */
	k_fold2048[0] = (uint64_t)reflect32(xpow_mod(2048 + 63)) << 32;
	k_fold2048[1] = (uint64_t)reflect32(xpow_mod(2048 - 1)) << 32;
	k_fold512[0] = (uint64_t)reflect32(xpow_mod(512 + 63)) << 32;
	k_fold512[1] = (uint64_t)reflect32(xpow_mod(512 - 1)) << 32;
	k_fold128[0] = (uint64_t)reflect32(xpow_mod(128 + 63)) << 32;
	k_fold128[1] = (uint64_t)reflect32(xpow_mod(128 - 1)) << 32;
	crc_use_clmul = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
	if (crc_use_clmul && __builtin_cpu_supports("vpclmulqdq") &&
	    __builtin_cpu_supports("avx2"))
		crc_use_clmul = 2;
#endif
}

/* The raw (unconditioned) CRC state c advanced over n bytes. */
static uint32_t crc_tables(uint32_t c, const unsigned char *p, size_t n)
{
	while (n && ((uintptr_t)p & 7)) {
		c = crc_table[0][(c ^ *p++) & 0xff] ^ (c >> 8);
		n--;
	}
	while (n >= 8) {
		uint64_t w;
		memcpy(&w, p, 8);
		w ^= c;		/* little-endian: the state meets the first 4 bytes */
		c = crc_table[7][w & 0xff] ^ crc_table[6][(w >> 8) & 0xff] ^
		    crc_table[5][(w >> 16) & 0xff] ^ crc_table[4][(w >> 24) & 0xff] ^
		    crc_table[3][(w >> 32) & 0xff] ^ crc_table[2][(w >> 40) & 0xff] ^
		    crc_table[1][(w >> 48) & 0xff] ^ crc_table[0][w >> 56];
		p += 8;
		n -= 8;
	}
	while (n--)
		c = crc_table[0][(c ^ *p++) & 0xff] ^ (c >> 8);
	return c;
}

#ifdef CRC_HAVE_CLMUL
#define CLMUL_TARGET __attribute__((target("pclmul,sse4.1")))

/* v * x^D mod P (congruent, < 2^96), for the multipliers k of distance D. */
CLMUL_TARGET static inline __m128i fold(__m128i v, __m128i k)
{
	__m128i lo = _mm_clmulepi64_si128(v, k, 0x00);	/* v.lo64 * k[0] */
	__m128i hi = _mm_clmulepi64_si128(v, k, 0x11);	/* v.hi64 * k[1] */
	return _mm_xor_si128(lo, hi);
}

/* The raw state after the 16-byte remainder x, advanced over the n bytes
 * left at p: 16 at a time by folding, the rest and x through the tables. */
CLMUL_TARGET static uint32_t crc_fold_tail(__m128i x, const unsigned char *p, size_t n)
{
	const __m128i k128 = _mm_loadu_si128((const __m128i *)k_fold128);
	while (n >= 16) {
		x = _mm_xor_si128(fold(x, k128), _mm_loadu_si128((const __m128i *)p));
		p += 16;
		n -= 16;
	}
	unsigned char rem[16];
	_mm_storeu_si128((__m128i *)rem, x);
	return crc_tables(crc_tables(0, rem, 16), p, n);
}

/* The raw state c advanced over n >= 64 bytes. */
CLMUL_TARGET static uint32_t crc_clmul(uint32_t c, const unsigned char *p, size_t n)
{
	const __m128i k512 = _mm_loadu_si128((const __m128i *)k_fold512);
	const __m128i k128 = _mm_loadu_si128((const __m128i *)k_fold128);
	__m128i x0 = _mm_loadu_si128((const __m128i *)p);
	__m128i x1 = _mm_loadu_si128((const __m128i *)(p + 16));
	__m128i x2 = _mm_loadu_si128((const __m128i *)(p + 32));
	__m128i x3 = _mm_loadu_si128((const __m128i *)(p + 48));
	x0 = _mm_xor_si128(x0, _mm_cvtsi32_si128((int)c));
	p += 64;
	n -= 64;
	while (n >= 64) {
		x0 = _mm_xor_si128(fold(x0, k512), _mm_loadu_si128((const __m128i *)p));
		x1 = _mm_xor_si128(fold(x1, k512), _mm_loadu_si128((const __m128i *)(p + 16)));
		x2 = _mm_xor_si128(fold(x2, k512), _mm_loadu_si128((const __m128i *)(p + 32)));
		x3 = _mm_xor_si128(fold(x3, k512), _mm_loadu_si128((const __m128i *)(p + 48)));
		p += 64;
		n -= 64;
	}
	x1 = _mm_xor_si128(fold(x0, k128), x1);
	x2 = _mm_xor_si128(fold(x1, k128), x2);
	x3 = _mm_xor_si128(fold(x2, k128), x3);
	return crc_fold_tail(x3, p, n);
}

#define VCLMUL_TARGET __attribute__((target("vpclmulqdq,avx2,pclmul,sse4.1")))

/* fold() on both 128-bit lanes at once. */
VCLMUL_TARGET static inline __m256i fold2(__m256i v, __m256i k)
{
	__m256i lo = _mm256_clmulepi64_epi128(v, k, 0x00);
	__m256i hi = _mm256_clmulepi64_epi128(v, k, 0x11);
	return _mm256_xor_si256(lo, hi);
}

/* The raw state c advanced over n >= 256 bytes, 256 at a time. */
VCLMUL_TARGET static uint32_t crc_vclmul(uint32_t c, const unsigned char *p, size_t n)
{
	const __m256i k2048 = _mm256_broadcastsi128_si256(
		_mm_loadu_si128((const __m128i *)k_fold2048));
	const __m128i k128 = _mm_loadu_si128((const __m128i *)k_fold128);
	__m256i y[8];
	for (int i = 0; i < 8; i++)
		y[i] = _mm256_loadu_si256((const __m256i *)(p + 32 * i));
	y[0] = _mm256_xor_si256(y[0], _mm256_zextsi128_si256(_mm_cvtsi32_si128((int)c)));
	p += 256;
	n -= 256;
	while (n >= 256) {
		for (int i = 0; i < 8; i++)
			y[i] = _mm256_xor_si256(fold2(y[i], k2048),
						_mm256_loadu_si256((const __m256i *)(p + 32 * i)));
		p += 256;
		n -= 256;
	}
	/* the sixteen 16-byte remainders in stream order, folded into the last */
	__m128i x = _mm256_castsi256_si128(y[0]);
	x = _mm_xor_si128(fold(x, k128), _mm256_extracti128_si256(y[0], 1));
	for (int i = 1; i < 8; i++) {
		x = _mm_xor_si128(fold(x, k128), _mm256_castsi256_si128(y[i]));
		x = _mm_xor_si128(fold(x, k128), _mm256_extracti128_si256(y[i], 1));
	}
	return crc_fold_tail(x, p, n);
}
#endif

uint32_t nvio_crc32(uint32_t crc, const void *buf, size_t len)
{
	if (!buf || !len)
		return crc;
	pthread_once(&crc_once, crc_init);
	const unsigned char *p = buf;
	uint32_t c = ~crc;
#ifdef CRC_HAVE_CLMUL
	if (crc_use_clmul == 2 && len >= 256)
		return ~crc_vclmul(c, p, len);
	if (crc_use_clmul && len >= 256)
		return ~crc_clmul(c, p, len);
#endif
	return ~crc_tables(c, p, len);
}

uint32_t nvio__crc32_with(int level, uint32_t crc, const void *buf, size_t len)
{
	if (!buf || !len)
		return crc;
	pthread_once(&crc_once, crc_init);
	uint32_t c = ~crc;
#ifdef CRC_HAVE_CLMUL
	if (level >= 2 && crc_use_clmul >= 2 && len >= 256)
		return ~crc_vclmul(c, buf, len);
	if (level >= 1 && crc_use_clmul >= 1 && len >= 64)
		return ~crc_clmul(c, buf, len);
#endif
	return ~crc_tables(c, buf, len);
}

uint32_t nvio__crc32_portable(uint32_t crc, const void *buf, size_t len)
{
	if (!buf || !len)
		return crc;
	pthread_once(&crc_once, crc_init);
	return ~crc_tables(~crc, buf, len);
}

int nvio__crc32_accelerated(void)
{
	pthread_once(&crc_once, crc_init);
#ifdef CRC_HAVE_CLMUL
	return crc_use_clmul;
#else
	return 0;
#endif
}

/* a * b mod P, both reflected (the coefficient of x^0 in bit 31). */
static uint32_t mulmod(uint32_t a, uint32_t b)
{
	uint32_t p = 0;
	for (uint32_t m = 1u << 31; a; m >>= 1) {
		if (a & m) {
			p ^= b;
			a ^= m;
		}
		b = b & 1 ? (b >> 1) ^ CRC_POLY_REFLECTED : b >> 1;
	}
	return p;
}

uint32_t nvio_crc32_combine(uint32_t crc1, uint32_t crc2, uint64_t len2)
{
	/*
	 * crc(A B) = crc(A) * x^(8 len(B)) ^ crc(B): the conditioning of A's
	 * end and B's start cancel. x^(8 len2) by squaring: sq is x^(2^k).
	 */
	uint32_t xn = 1u << 31, sq = 1u << 30;	/* x^0, x^1 */
	for (int i = 0; i < 3; i++)
		sq = mulmod(sq, sq);			/* x^8: one byte */
	for (uint64_t n = len2; n; n >>= 1) {
		if (n & 1)
			xn = mulmod(sq, xn);
		sq = mulmod(sq, sq);
	}
	return mulmod(xn, crc1) ^ crc2;
}
