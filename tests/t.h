/*
 * t.h - the few helpers every nvio C test uses (liburing's test/helpers.h
 * is the model).
 *
 * Each test is one executable: exit 0 pass, 1 fail, 77 skip. A failed
 * check prints both values with file:line and the current context (which
 * engine, direct mode, size ...) and makes the test fail at exit; the
 * test goes on so that one run shows every failure (up to T_MAX_FAILS).
 *
 * Files are prepared and checked with plain libc (t_write_file,
 * t_read_file, t_pread_file) so that nvio is never checked against itself.
 */
#ifndef NVIO_T_H
#define NVIO_T_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "nvio.h"

#define T_PASS 0
#define T_FAIL 1
#define T_SKIP 77
#define T_MAX_FAILS 50
#define T_PATH_MAX 512

/* Sanitizer builds are slower: tests scale their loops with this. */
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define T_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
#define T_SANITIZED 1
#endif
#endif
#ifndef T_SANITIZED
#define T_SANITIZED 0
#endif
#if defined(__SANITIZE_THREAD__)
#define T_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define T_TSAN 1
#endif
#endif
#ifndef T_TSAN
#define T_TSAN 0
#endif

/* Checks. Each returns 1 when it held, 0 (and records a failure) if not. */
#define T_EQ_INT(a, b) \
	t_eq_i64(__FILE__, __LINE__, #a, #b, (int64_t)(a), (int64_t)(b))
#define T_EQ_U64(a, b) \
	t_eq_u64(__FILE__, __LINE__, #a, #b, (uint64_t)(a), (uint64_t)(b))
/* expr is an nvio call expected to return 0. */
#define T_OK(expr) t_eq_err(__FILE__, __LINE__, #expr, (int64_t)(expr), 0)
/* expr is an nvio call expected to fail with exactly err (a -errno). */
#define T_ERR(expr, err) \
	t_eq_err(__FILE__, __LINE__, #expr, (int64_t)(expr), (err))
/* Any boolean condition. */
#define T_TRUE(cond) t_true(__FILE__, __LINE__, #cond, (cond) != 0)
/* n bytes at got equal n bytes at want; prints the first difference. */
#define T_MEM_EQ(got, want, n) \
	t_mem_eq(__FILE__, __LINE__, #got, (got), (want), (n))
/* Unconditional failure with a message. */
#define T_FAILF(...) t_failf(__FILE__, __LINE__, __VA_ARGS__)

int t_eq_i64(const char *file, int line, const char *ea, const char *eb,
	     int64_t a, int64_t b);
int t_eq_u64(const char *file, int line, const char *ea, const char *eb,
	     uint64_t a, uint64_t b);
int t_eq_err(const char *file, int line, const char *expr, int64_t got,
	     int64_t want);
int t_true(const char *file, int line, const char *expr, int ok);
int t_mem_eq(const char *file, int line, const char *what, const void *got,
	     const void *want, size_t n);
void t_failf(const char *file, int line, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* "-EIO" style name of a negative errno (or a number). */
const char *t_errname(int64_t err);

/*
 * Call first: line-buffered output, a clean environment (NVIO_ENGINE and
 * NVIO_DIRECT unset so that every engine really runs), the exit hook that
 * removes the temporary directory.
 */
void t_init(const char *name);
/* 0 if every check held, else 1. Use as `return t_done();`. */
int t_done(void);
/* Prints "SKIP: why" and exits 77 (cleaning up). */
void t_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2),
						  noreturn));
/* Prints a line a reader of the log should see ("note: ..."). */
void t_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Sets what failure messages name as the current case (per thread). */
void t_ctx(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int t_failures(void);
/* Unless NVIO_TEST_QUICK is set: 1. */
int t_quick(void);

/*
 * The test's private directory (mkdtemp under $NVIO_TEST_DIR or /tmp),
 * removed with everything in it when the process exits.
 */
const char *t_tmpdir(void);
/* out = tmpdir "/" formatted name. */
void t_path(char out[T_PATH_MAX], const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
/* mkdir of tmpdir/name; out gets the path. */
void t_subdir(char out[T_PATH_MAX], const char *name);
/* Number of entries (not . and ..) in a directory, -errno on error. */
int t_dir_count(const char *dir);
/* 1 if fd (per /proc/self/fd) names a file inside t_tmpdir(). */
int t_fd_is_ours(int fd);

/*
 * Pseudo-random bytes, addressable: byte i of the stream for `seed`
 * depends only on (seed, start + i), so big files can be generated and
 * checked in pieces.
 */
void t_fill_random(void *buf, size_t n, uint64_t seed);
void t_fill_random_at(void *buf, size_t n, uint64_t seed, uint64_t start);
/* Index of the first byte that differs from the stream, or -1. */
int64_t t_check_random_at(const void *buf, size_t n, uint64_t seed,
			  uint64_t start);
uint64_t t_rand64(uint64_t *state);
/* The CRC-32 of zip and zlib, one bit at a time: a reference that shares
 * nothing with nvio_crc32. */
uint32_t t_crc32_ref(const void *buf, size_t n);

/* Plain libc file helpers: 0 or -errno. */
int t_write_file(const char *path, const void *buf, size_t n);
int t_pwrite_file(const char *path, const void *buf, size_t n, off_t off);
/* Reads the whole file (at most cap bytes); *size gets the file size. */
int t_read_file(const char *path, void *buf, size_t cap, size_t *size);
/* Reads exactly n bytes at off; -ENODATA if the file is shorter. */
int t_pread_file(const char *path, void *buf, size_t n, off_t off);
int64_t t_file_size(const char *path);
/* Checks that [off, off+n) of path holds the random stream (seed, start). */
int t_check_file_random(const char *path, off_t off, uint64_t n,
			uint64_t seed, uint64_t start);

/* nvio_file_open, a failure recorded with the path and the error; NULL then. */
nvio_file_t *t_open_file(nvio_handle_t *h, const char *path, unsigned flags);

/* Page-aligned zeroed memory, aborts the test if none. */
void *t_alloc(size_t n);

/* Engines and direct modes every I/O test iterates over. */
#define T_N_ENGINES 3
#define T_N_DIRECTS 2
extern const int t_engine_list[T_N_ENGINES];	/* URING, AIO, PSYNC */
extern const int t_direct_list[T_N_DIRECTS];	/* ON, OFF */
const char *t_engine_str(int engine);
const char *t_direct_str(int direct);
/*
 * 1 if the engine can run (nvio_engine_available), else prints once
 * "skip engine X: why" and returns 0. With NVIO_TEST_REQUIRE_ENGINES=1 a
 * missing engine is a failure instead.
 */
int t_engine_ok(int engine);
/* 1 if O_DIRECT works in t_tmpdir() (probed with libc), else says why. */
int t_direct_ok(int direct);
/* Both of the above. */
int t_combo_ok(int engine, int direct);

/*
 * The engine x direct-I/O matrix every I/O test runs (STYLE rule 13):
 *
 *	T_FOR_EACH_COMBO(e, d) {
 *		... int e and int d are set; t_combo() is "io_uring/direct"
 *	}
 *
 * The body runs once per engine (io_uring, libaio, psync, in that order)
 * and, within each, per direct mode (on, off), for the combinations that
 * can run here: the others are skipped with one "skip ..." line each
 * (t_combo_ok; a failure under NVIO_TEST_REQUIRE_ENGINES=1). Before the
 * body the context is set to t_combo(). t_combo_i is the combination's
 * index, 0 .. T_N_ENGINES * T_N_DIRECTS - 1 (engine * T_N_DIRECTS +
 * direct), counting skipped ones. `continue` and `break` in the body both
 * go on with the next combination. Not nestable.
 */
#define T_FOR_EACH_COMBO(e, d)						\
	for (int t_combo_i = 0; t_combo_i < T_N_ENGINES * T_N_DIRECTS;	\
	     t_combo_i++)						\
		for (int e = t_engine_list[t_combo_i / T_N_DIRECTS],	\
			 d = t_direct_list[t_combo_i % T_N_DIRECTS],	\
			 t_combo_once_ = t_combo_begin(e, d);		\
		     t_combo_once_; t_combo_once_ = 0)
/* t_combo_ok(); if it holds, sets t_combo() and the context to it. */
int t_combo_begin(int engine, int direct);
/* "engine/direct" of the current combination (per thread). */
const char *t_combo(void);
/*
 * Creates a handle with this engine, direct mode, parallelism and block
 * size (0: defaults), checks that the engine in force is the one asked
 * for. Returns 0 or the error (a failure is recorded).
 */
/* nvio_config_init, then engine, direct, and block_size and queue_depth
 * where not 0 (0 keeps the default). */
void t_config(nvio_config_t *c, int engine, int direct, uint64_t block_size,
	      uint32_t queue_depth);
int t_handle(nvio_handle_t **h, int engine, int direct, uint32_t par,
	     uint64_t block_size);

/* Open descriptors; threads other than io_uring's kernel helpers. */
int t_count_fds(void);
int t_count_threads(void);

#endif
