/*
 * tool.h - the subcommands of nvio and the transfer machinery that bench
 * and tune share.
 */
#ifndef NVIO_TOOL_H
#define NVIO_TOOL_H

#include "util.h"

int cmd_report(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_tune(int argc, char **argv);
int cmd_clean(int argc, char **argv);

#define MAX_DIRS 32

enum mem_kind { MEM_LOCKED, MEM_PAGEABLE, MEM_GPU };

/*
 * --gpu[=N] and --gds: the buffer is device memory of CUDA device N
 * (nvio_cuda_alloc); with --gds every handle the tool opens is a GDS
 * handle (cuFile, or the bounce path where cuFile is unusable).
 */
extern int tool_gpu_device;
extern unsigned tool_handle_flags;
void gpu_option(enum mem_kind *mem, const char *arg, int gds);

/*
 * One striped transfer: `size` bytes of one buffer, cut into one range
 * per directory, each range moved to or from its own file in that
 * directory (as on separate drives), all submitted asynchronously on one
 * handle and finished by one nvio_wait().
 */
struct xfer {
	int ndirs;
	int fd[MAX_DIRS];	/* the test files, open read-write */
	char *name[MAX_DIRS];	/* a file's name, NULL when unnamed */
	char *path[MAX_DIRS];	/* for messages: the name or "<dir>/(...)" */
	uint64_t off[MAX_DIRS];
	uint64_t len[MAX_DIRS];
	unsigned char *buf;	/* the transfer's first byte */
	void *alloc;		/* what to free */
	enum mem_kind mem;
	int locked;		/* the pages really are locked */
	int device;		/* MEM_GPU: the CUDA device */
	uint64_t size;
};

/*
 * Allocates and fills the buffer and creates one test file per directory
 * with temp_file() (unnamed where possible; never a file someone else
 * made). Every transfer goes through those descriptors, never by name.
 * Prints why and returns EXIT_RUNTIME on failure, 0 on success.
 */
int xfer_setup(struct xfer *x, char *const *dirs, int ndirs, uint64_t size,
	       enum mem_kind mem, const char *tag);
/* Frees the buffer and removes the files. */
void xfer_teardown(struct xfer *x);

/* Timings of one transfer: wall seconds and CPU seconds of the process. */
struct sample {
	double secs;
	double cpu;
};

/*
 * Moves the whole buffer once (writes with NVIO_FSYNC). Returns 0, or
 * prints the library's error line and returns its -errno.
 */
int xfer_run(nvio_handle_t *h, const struct xfer *x, int is_write,
	     struct sample *s);

/* How reads are kept away from the page cache. */
enum cold {
	COLD_DIRECT,	/* O_DIRECT works in every directory */
	COLD_DROP,	/* /proc/sys/vm/drop_caches before each read */
	COLD_NONE,	/* neither: reads may be warm */
	COLD_MEMFS	/* tmpfs/ramfs: the page cache is the storage */
};
/* 1 if the probed directory keeps its files in memory (tmpfs, ramfs):
 * O_DIRECT there is accepted or not, but never bypasses the page cache. */
int probe_in_memory(const nvio_probe_t *p);
enum cold cold_choose(int direct_policy, const nvio_probe_t *probes, int n);
const char *cold_name(enum cold c);
const char *cold_text(enum cold c);
/* Before a timed read: drops the page cache under COLD_DROP. */
void cold_prepare(enum cold c);

/* Creates a handle with signals blocked, so its workers never take them.
 * Prints why and returns NULL on failure. */
nvio_handle_t *handle_open(const nvio_config_t *cfg, const char *what);

/* The resolved configuration of h as text, and as a JSON object. */
const char *config_text(const nvio_config_t *c, char *buf, size_t len);
void config_json(struct json *j, const char *key, const nvio_config_t *c);
/* DeepSpeed's "aio" block (real booleans and integers). */
void config_json_deepspeed(struct json *j, const char *key,
			   const nvio_config_t *c);

/*
 * Checks that `size` bytes fit: the memory for the buffer and, for the
 * per-directory ranges of x-like striping, the free space of each file
 * system (directories on one file system share it). Prints the reason
 * and returns EXIT_RUNTIME if not, 0 if they fit.
 */
int check_fits(char *const *dirs, int ndirs, const nvio_probe_t *probes,
	       uint64_t size);
/*
 * Why the probe's O_DIRECT test failed when the cause is the directory,
 * not the file system's O_DIRECT support (read-only, not writable,
 * procfs/sysfs), as one line into buf; NULL when it is O_DIRECT itself.
 */
const char *direct_untested_why(const char *dir, const nvio_probe_t *p,
				char *buf, size_t len);
/* Runs nvio_probe on each dir; prints and returns EXIT_RUNTIME on error. */
int probe_dirs(char *const *dirs, int ndirs, nvio_probe_t *probes);

/* fio, for `bench --compare fio`. */
struct fio_job {
	uint64_t bs;
	int iodepth;
	int numjobs;
};
struct fio_ctx {
	char version[32];
	char engine[16];
	int direct;
	int engine_fallback;	/* io_uring failed once: now libaio */
	char log_prefix[512];	/* fio's per-job latency logs: PREFIX_*.N.log */
	int logs_registered;	/* jobs whose log names cleanup knows */
};
/* 0 if fio runs here (version filled), else prints why and -ENOENT. */
int fio_detect(struct fio_ctx *c, const nvio_probe_t *probe, int direct);
/*
 * Runs one fio job over the files of x. Returns 0 with its GB/s and CPU
 * seconds per GB, 1 if the job does not fit the size (skipped), or -errno
 * after printing why.
 */
int fio_run(struct fio_ctx *c, const struct xfer *x, int is_write,
	    const struct fio_job *job, double *gbps, double *cpu_per_gb);
const char *fio_job_text(const struct fio_job *job, char *buf, size_t len);

/* One explored configuration of `nvio tune`. */
struct tune_point {
	int is_write;
	int step;		/* index into tune_step_names */
	nvio_config_t cfg;
	double gbps;
	int best;		/* the winner of its direction */
};
/* tunept.c: the steps, their names and the points' labels */
enum { ST_DEFAULT, ST_BLOCK, ST_QD, ST_PAR, ST_MODES, ST_ENGINE, ST_CROSS };
extern const char *const tune_step_names[];
#define TUNE_STEPS 7
/* The value a step varies, as a short label ("1M", "64", "psync"). */
const char *tune_point_label(const nvio_config_t *c, int step, char *buf,
			     size_t len);
/* Writes an SVG chart of the points to f; 0 or -EIO. */
int svg_write(FILE *f, const char *title, const struct tune_point *pts,
	      int n);

#endif
