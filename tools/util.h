/*
 * util.h - small helpers shared by the nvio subcommands: messages and exit
 * codes, number parsing and printing, clocks, statistics, a JSON writer,
 * progress on stderr, temporary-file cleanup on signals, and the options
 * that describe an nvio handle.
 */
#ifndef NVIO_TOOL_UTIL_H
#define NVIO_TOOL_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <getopt.h>

#include "nvio.h"

/* Exit codes of every subcommand. */
#define EXIT_RUNTIME 1	/* the I/O or the system failed */
#define EXIT_USAGE 2	/* the command line is wrong */

#define GB 1e9		/* all bandwidth is printed in GB/s, GB = 10^9 bytes */

/* "nvio bench", set by the dispatcher; prefixes every message. */
extern const char *tool_prog;

/* Flushes and closes stdout; on any write error says so on stderr and
 * ends the process with EXIT_RUNTIME. Give it to atexit() first thing. */
void stdout_check_at_exit(void);

/* One line "<prog>: <message>" on stderr. */
void msg(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* msg(), then exit(EXIT_USAGE). Only before any temporary file exists. */
_Noreturn void usage_error(const char *fmt, ...)
	__attribute__((format(printf, 1, 2)));
/* The usage error for an option getopt_long rejected. */
_Noreturn void bad_option(char **argv, int c);

/* Sizes with binary K/M/G/T suffixes ("4K", "1.5G", "256MiB"). 0 or -EINVAL. */
int parse_size(const char *s, uint64_t *out);
/* A decimal integer in [min, max]. 0 or -EINVAL / -ERANGE. */
int parse_u64(const char *s, uint64_t min, uint64_t max, uint64_t *out);
int parse_double(const char *s, double *out);
/* Parses option `opt` with parse_size/parse_u64, or exits with a usage error. */
uint64_t opt_size(const char *opt, const char *arg, uint64_t min, uint64_t max);
uint64_t opt_u64(const char *opt, const char *arg, uint64_t min, uint64_t max);
/* "1 MiB", "512 KiB", "1.50 GiB", "4096 B" into buf. */
const char *fmt_bytes(uint64_t n, char *buf, size_t len);

double now_s(void);		/* CLOCK_MONOTONIC seconds */
double cpu_self_s(void);	/* user+sys of every thread of this process */
double cpu_children_s(void);	/* user+sys of waited-for children */

/* Statistics over n > 0 values (v is sorted in place by the first two). */
double stat_median(double *v, int n);
double stat_min(const double *v, int n);
double stat_max(const double *v, int n);

/*
 * A streaming JSON writer with two-space indentation. Keys are given
 * to every value inside an object and NULL inside an array.
 */
struct json {
	FILE *f;
	int depth;
	int count[16];		/* values written at each depth */
};
void json_begin(struct json *j, FILE *f);
void json_end(struct json *j);	/* closes the outermost object, newline */
void json_obj(struct json *j, const char *key);
void json_arr(struct json *j, const char *key);
void json_close(struct json *j, char bracket);	/* '}' or ']' */
void json_str(struct json *j, const char *key, const char *v);
void json_num(struct json *j, const char *key, double v);
void json_int(struct json *j, const char *key, int64_t v);
void json_uint(struct json *j, const char *key, uint64_t v);
void json_bool(struct json *j, const char *key, int v);
void json_null(struct json *j, const char *key);

/*
 * Progress: one line on stderr, rewritten in place, only when stderr is a
 * terminal (a log file gets no carriage-return noise) and not --quiet.
 */
extern int progress_enabled;
void progress_init(int quiet);
void progress(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void progress_done(void);

/*
 * Temporary files. Every file the tool creates is registered first; the
 * SIGINT/SIGTERM handler sets a flag that the tool checks after each
 * transfer (cleanup_check): it then removes the files and re-raises the
 * signal, so the shell sees the usual "killed by SIGINT" status. A second
 * signal removes the files and re-raises from inside the handler at once.
 * A child process registered with cleanup_child() gets the signal too.
 */
void cleanup_install(void);
/*
 * A new test file in dir, open read-write (0600, close-on-exec): unnamed
 * (O_TMPFILE) where the file system allows, else
 * <dir>/.nvio-<tag>-<16 random hex digits>.tmp created with
 * O_EXCL|O_NOFOLLOW, registered for cleanup, its name in *name (malloc'd;
 * NULL for an unnamed file). Never opens a file someone else created.
 * Returns the descriptor or -errno.
 */
int temp_file(const char *dir, const char *tag, char **name);
/*
 * An output file the user named (--plot): written to a temporary in its
 * directory and renamed over it by out_commit, so a failure leaves the
 * user's file as it was; a device or pipe is written in place and never
 * removed. out_open and out_commit return 0 or -errno; out_abort drops
 * the temporary. Write to o->f.
 */
struct out_file {
	const char *path;	/* as given */
	char final[4096];	/* what the rename replaces */
	char *tmp;		/* our temporary, NULL when written in place */
	FILE *f;
};
int out_open(struct out_file *o, const char *path);
int out_commit(struct out_file *o);
void out_abort(struct out_file *o);

/* A new private (0700) directory <parent>/nvio-<tag>-XXXXXX, registered
 * for cleanup (its files are removed before it); 0 or -errno. */
int temp_dir(const char *parent, const char *tag, char *out, size_t len);
int cleanup_add(const char *path);	/* 0 or -ENOMEM */
void cleanup_remove_all(void);
void cleanup_forget(const char *path);	/* no longer ours to remove */
void cleanup_child(int pid);		/* 0 when none */
int cleanup_interrupted(void);
void cleanup_check(void);
/* Block/unblock SIGINT and SIGTERM in this thread: threads created while
 * blocked (the handle's workers) never take the signal themselves. */
void signals_block(int block);

/* Handle options shared by bench and tune (getopt_long values >= 1000). */
enum {
	OPT_BLOCK_SIZE = 1000, OPT_QUEUE_DEPTH, OPT_PARALLELISM,
	OPT_SINGLE_SUBMIT, OPT_NO_SINGLE_SUBMIT, OPT_OVERLAP, OPT_NO_OVERLAP,
	OPT_ENGINE, OPT_DIRECT, OPT_STAGING, OPT_HANDLE_LAST_
};
#define HANDLE_LONGOPTS \
	{ "block-size", required_argument, 0, OPT_BLOCK_SIZE }, \
	{ "queue-depth", required_argument, 0, OPT_QUEUE_DEPTH }, \
	{ "parallelism", required_argument, 0, OPT_PARALLELISM }, \
	{ "intra-op-parallelism", required_argument, 0, OPT_PARALLELISM }, \
	{ "single-submit", no_argument, 0, OPT_SINGLE_SUBMIT }, \
	{ "no-single-submit", no_argument, 0, OPT_NO_SINGLE_SUBMIT }, \
	{ "overlap-events", no_argument, 0, OPT_OVERLAP }, \
	{ "no-overlap-events", no_argument, 0, OPT_NO_OVERLAP }, \
	{ "sequential-requests", no_argument, 0, OPT_NO_OVERLAP }, \
	{ "engine", required_argument, 0, OPT_ENGINE }, \
	{ "direct", required_argument, 0, OPT_DIRECT }, \
	{ "staging-bytes", required_argument, 0, OPT_STAGING }

/* Which tunable fields the command line set (the rest may come from a
 * tuned entry). `direct` and staging are never tuned. */
struct handle_opts {
	nvio_config_t cfg;
	int tunables_set;	/* any of block/queue/parallel/modes/engine */
};
void handle_opts_init(struct handle_opts *o);
/* 1 if c was a handle option (parsed into o), 0 if not. */
int handle_opt(struct handle_opts *o, int c, const char *arg);
/* Help text lines for the handle options. */
extern const char handle_opts_help[];

/*
 * Why nvio_handle_create(cfg) failed with err, as one line that names the
 * engine and, when NVIO_ENGINE or NVIO_DIRECT supplied the setting that
 * failed, the variable and how to drop it.
 */
const char *handle_error_text(const nvio_config_t *cfg, int err, char *buf,
			      size_t len);
/* "NVIO_DIRECT=on in the environment chose ..." when the variable is the
 * likely source of a handle's direct mode `direct_in_force`, else NULL. */
const char *env_direct_hint(int direct_in_force);

/* Directory argument checks shared by the subcommands. */
/* 0, or prints "<prog>: --dir D: <why>" and returns the usage/runtime code. */
int check_dir(const char *dir, int need_write);
const char *default_dir(void);	/* $TMPDIR or /tmp */

/* Where nvio_config_save_tuned() keeps its entries (see src/tuned.c). */
void tuned_file_path(char *buf, size_t len);

/* Bytes of memory the system could give us now (MemAvailable), 0 unknown. */
uint64_t mem_available(void);

#endif
