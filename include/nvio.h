/*
 * nvio.h - move bytes between memory and files at the device's full speed.
 *
 * The one public header of libnvio. Everything a program (and nvio's own
 * command-line tool and Python binding) may call is declared here.
 *
 * Conventions (see nvio(7)):
 *   - Functions return 0 or a non-negative count on success and a negative
 *     errno value on failure. They never set errno, print, exit or abort.
 *   - A handle is opaque. Configuration goes through nvio_config_t, which
 *     carries its own size so that it can grow without breaking callers.
 *   - An op rejected at submit never completes; an accepted op completes
 *     exactly once, with all its bytes or with its first error.
 *   - The caller owns every buffer. An asynchronous op borrows its buffer
 *     until the nvio_wait() that reports it has returned.
 *
 * Thread safety: distinct handles may be used from different threads at
 * the same time without any locking by the caller. One handle may also be
 * shared between threads: submissions are serialized internally, and
 * nvio_wait() reports every op that was submitted on the handle, by any
 * thread, before it was called. nvio_mem_* functions are thread safe.
 */
#ifndef NVIO_H
#define NVIO_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define NVIO_API __attribute__((visibility("default")))
#else
#define NVIO_API
#endif

#define NVIO_VERSION_MAJOR 0
#define NVIO_VERSION_MINOR 3
#define NVIO_VERSION_PATCH 1
#define NVIO_VERSION_NUM \
	((NVIO_VERSION_MAJOR << 16) | (NVIO_VERSION_MINOR << 8) | NVIO_VERSION_PATCH)
#define NVIO_CHECK_VERSION(major, minor, patch) \
	(NVIO_VERSION_NUM >= (((major) << 16) | ((minor) << 8) | (patch)))

/* Run-time version of the library, encoded like NVIO_VERSION_NUM. */
NVIO_API unsigned nvio_version(void);
NVIO_API const char *nvio_version_string(void);

/*
 * Errors. Besides the usual errno values, these carry nvio-specific
 * meanings (nvio_strerror() describes them):
 *   -ENODATA    the file ends before offset + nbytes (a read never returns
 *               fewer bytes than asked for)
 *   -EOVERFLOW  whole-file read: the file is larger than the buffer
 *   -EBADMSG    NVIO_VALIDATE found that file and buffer differ
 */
NVIO_API const char *nvio_strerror(int err);

/* Engines: how a worker talks to the kernel. */
typedef enum nvio_engine {
	NVIO_ENGINE_AUTO = 0,	/* io_uring, else libaio, else psync */
	NVIO_ENGINE_URING = 1,	/* io_uring through liburing */
	NVIO_ENGINE_AIO = 2,	/* Linux AIO through libaio */
	NVIO_ENGINE_PSYNC = 3,	/* pread/pwrite in the worker threads */
	NVIO_ENGINE_COUNT_ = 4
} nvio_engine_t;

/* "auto", "io_uring", "libaio", "psync"; NULL for an unknown value. */
NVIO_API const char *nvio_engine_name(int engine);
/* Parses the names above (also "uring", "aio"); -EINVAL if unknown. */
NVIO_API int nvio_engine_from_name(const char *name);
/*
 * 1 if the engine can run in this process, 0 if not (why gets one line
 * saying why and how to fix it), -EINVAL for an unknown engine.
 */
NVIO_API int nvio_engine_available(int engine, char *why, size_t why_len);

/* Direct I/O policy. */
typedef enum nvio_direct {
	NVIO_DIRECT_AUTO = 0,	/* O_DIRECT where the file system takes it */
	NVIO_DIRECT_ON = 1,	/* O_DIRECT or fail with the open's error */
	NVIO_DIRECT_OFF = 2	/* always through the page cache */
} nvio_direct_t;
NVIO_API const char *nvio_direct_name(int direct);
NVIO_API int nvio_direct_from_name(const char *name); /* "auto|on|off|1|0" */

/* Handle configuration. Always start from nvio_config_init(). */
typedef struct nvio_config {
	uint32_t struct_size;	/* sizeof(nvio_config_t), set by init */
	uint32_t flags;		/* NVIO_HANDLE_* below; unknown bits: -EINVAL */
	uint64_t block_size;	/* bytes per I/O request, default 1 MiB */
	uint32_t queue_depth;	/* requests in flight per worker, default 128 */
	uint32_t intra_op_parallelism; /* worker threads, default 1 */
	uint32_t single_submit;	/* 1: one submission per request */
	uint32_t overlap_events; /* 1: sliding window; 0: batch at a time */
	int32_t engine;		/* nvio_engine_t, default AUTO */
	int32_t direct;		/* nvio_direct_t, default AUTO */
	uint64_t staging_bytes;	/* bounce memory per worker; 0 (default):
				 * block_size * queue_depth (twice that in
				 * batch mode), at most 128 MiB; granted from
				 * the process-wide budget while it lasts
				 * (nvio_staging_set_limit) */
	uint64_t reserved[6];	/* must be 0 */
} nvio_config_t;

#define NVIO_DEFAULT_BLOCK_SIZE (1u << 20)
#define NVIO_DEFAULT_QUEUE_DEPTH 128u
#define NVIO_MAX_AUTO_STAGING_BYTES (128u << 20)
#define NVIO_MAX_PARALLELISM 256u
#define NVIO_MAX_QUEUE_DEPTH 4096u

/*
 * NVIO_HANDLE_GDS: a GPUDirect Storage handle. CUDA device buffers move
 * between the file and GPU memory through cuFile when it is usable (see
 * nvio_gds_mode); otherwise, and for host buffers, the handle behaves as
 * a plain one (device buffers staged through locked host memory).
 */
#define NVIO_HANDLE_GDS (1u << 0)

NVIO_API void nvio_config_init(nvio_config_t *cfg);

typedef struct nvio_handle nvio_handle_t;

/*
 * Creates a handle. cfg may be NULL for the defaults. cfg->struct_size
 * says which fields the caller knows: a smaller (older) struct gets the
 * defaults for the fields it lacks; a larger (newer) one is accepted only
 * if every byte this library does not know is 0 (else -EINVAL).
 * The environment supplies defaults only, for what the configuration
 * leaves at AUTO: NVIO_ENGINE=auto|io_uring|libaio|psync and
 * NVIO_DIRECT=auto|on|off; an explicit engine or direct mode wins. An
 * engine that AUTO would pick but the kernel refuses (io_uring blocked by
 * seccomp, say) is skipped; an engine asked for explicitly (or through
 * NVIO_ENGINE) that cannot run fails the call with its error.
 * Returns 0, -EINVAL for a bad configuration, or the system's error.
 */
NVIO_API int nvio_handle_create(nvio_handle_t **out, const nvio_config_t *cfg);

/*
 * Waits for every op in flight, then frees everything the handle owns:
 * threads are joined, descriptors closed, memory released. Errors of
 * unreported ops are dropped. NULL is accepted.
 */
NVIO_API void nvio_handle_destroy(nvio_handle_t *h);

/* The configuration in force, with the engine resolved (never AUTO).
 * Fills out->struct_size bytes (set it first; below 8 is -EINVAL). */
NVIO_API int nvio_handle_config(const nvio_handle_t *h, nvio_config_t *out);

NVIO_API uint64_t nvio_get_block_size(const nvio_handle_t *h);
NVIO_API uint32_t nvio_get_queue_depth(const nvio_handle_t *h);
NVIO_API int nvio_get_single_submit(const nvio_handle_t *h);
NVIO_API int nvio_get_overlap_events(const nvio_handle_t *h);
NVIO_API uint32_t nvio_get_intra_op_parallelism(const nvio_handle_t *h);
/* The engine the workers run (URING, AIO or PSYNC). */
NVIO_API int nvio_get_engine(const nvio_handle_t *h);
/* The direct I/O policy (AUTO, ON or OFF). */
NVIO_API int nvio_get_direct(const nvio_handle_t *h);
/* 1 if CUDA buffers on this handle go through cuFile, else 0. */
NVIO_API int nvio_get_gds(const nvio_handle_t *h);
/* One line on why this engine and direct mode were chosen. */
NVIO_API const char *nvio_get_engine_note(const nvio_handle_t *h);

/* Per-op flags. Unknown bits give -EINVAL. */
#define NVIO_ASYNC	(1u << 0) /* return at submit; nvio_wait() reports */
#define NVIO_VALIDATE	(1u << 1) /* re-read and compare after the transfer */
#define NVIO_FSYNC	(1u << 2) /* writes: data is durable at completion */

/*
 * Range I/O: nbytes bytes between buf and the file at byte offset
 * `offset`. Any size (0 included), any offset, any buffer address.
 *
 * pread fails with -ENODATA, before any I/O, if the file is shorter than
 * offset + nbytes; it never returns a short read.
 *
 * pwrite creates the file if it does not exist (mode 0666 less the
 * umask) and never truncates it: bytes outside [offset, offset + nbytes)
 * are left as they were, and the file grows when the range ends past its
 * end (a hole is left if offset is past the end). Use nvio_write_file()
 * to replace a file. A file that grows is allocated up front, so a full
 * disk fails the op with -ENOSPC at submit; if a write fails later, the
 * range's bytes are unspecified and the file may already have its new
 * size. A read of 0 bytes succeeds when offset is within the file; a write of
 * 0 bytes changes nothing, as with pwrite(2).
 *
 * The _fd variants use the caller's open descriptor, which is never
 * closed or changed; O_DIRECT is used through a second descriptor opened
 * on /proc/self/fd when the policy allows it.
 *
 * Without NVIO_ASYNC: returns 0 when all bytes moved, or the first error.
 * Other ops in flight on the handle are not waited for.
 * With NVIO_ASYNC: returns 0 if the op was accepted (it then completes at
 * a later nvio_wait()), or an error if it was rejected (it never runs).
 * Errors found at submit: -EINVAL (bad argument or flags, a negative
 * offset, offset + nbytes past INT64_MAX), -ENOENT and other open/stat
 * errors, -ENODATA (read past end of file), -EBADF, -ENOSPC (growth).
 * A read that the kernel ends early (the file shrank meanwhile) fails
 * with -ENODATA; other short transfers are completed, never returned.
 */
NVIO_API int nvio_pread(nvio_handle_t *h, void *buf, uint64_t nbytes,
	       const char *path, int64_t offset, unsigned flags);
NVIO_API int nvio_pwrite(nvio_handle_t *h, const void *buf, uint64_t nbytes,
		const char *path, int64_t offset, unsigned flags);
NVIO_API int nvio_pread_fd(nvio_handle_t *h, void *buf, uint64_t nbytes, int fd,
		  int64_t offset, unsigned flags);
NVIO_API int nvio_pwrite_fd(nvio_handle_t *h, const void *buf, uint64_t nbytes,
		   int fd, int64_t offset, unsigned flags);

/*
 * Whole files. nvio_read_file reads all of `path` into buf, whose
 * capacity is `capacity` bytes; the file's size is stored in *size_out
 * (if not NULL) at submit, also when the call then fails with -EOVERFLOW
 * because the file is larger than the buffer.
 *
 * nvio_write_file creates or replaces `path` with exactly nbytes bytes.
 * The data goes to a temporary file in the same directory that is
 * renamed over `path` only once every byte is written (and, with
 * NVIO_FSYNC, made durable together with the directory entry): on any
 * error the old file is left untouched and the temporary is removed.
 */
NVIO_API int nvio_read_file(nvio_handle_t *h, void *buf, uint64_t capacity,
		   const char *path, uint64_t *size_out, unsigned flags);
NVIO_API int nvio_write_file(nvio_handle_t *h, const void *buf, uint64_t nbytes,
		    const char *path, unsigned flags);

/* Size of a file in bytes, or a negative errno. */
NVIO_API int64_t nvio_file_size(const char *path);

/*
 * Waits for every op submitted with NVIO_ASYNC before this call (ops
 * other threads submit meanwhile are left to a later wait). Returns how
 * many ops it reports (0 when none were outstanding), or, if any of them
 * failed, the first failure's error (details in nvio_last_error()).
 * Every op it reports has ended either way.
 */
NVIO_API int nvio_wait(nvio_handle_t *h);

/*
 * Waits, up to timeout_ns (0: just look; negative: no limit), until no op
 * submitted with NVIO_ASYNC is still running, without reporting any:
 * a later nvio_wait() reports them and returns at once. Returns 0, or
 * -ETIMEDOUT if some are still running. Lets a caller wait in slices and
 * react between them (a Ctrl-C) with the ops still accounted for.
 */
NVIO_API int nvio_wait_idle(nvio_handle_t *h, int64_t timeout_ns);

/* Number of asynchronous ops submitted and not yet reported by a wait. */
NVIO_API uint32_t nvio_pending(const nvio_handle_t *h);

/*
 * Where and why a failure on this handle happened: the one most recently
 * returned to the calling thread by a call on this handle (a sync op's
 * failure, or the failed op whose error nvio_wait returned). Threads that
 * share a handle each see their own. A thread that has had no failure on
 * the handle, or has had one on another handle since, gets the one most
 * recently returned to any thread.
 */
typedef struct nvio_error {
	uint32_t struct_size;	/* the caller sets sizeof(nvio_error_t) */
	int32_t err;		/* negative errno, 0 if nothing failed */
	int32_t is_write;	/* 1 write, 0 read */
	uint32_t reserved0;
	uint64_t op_seq;	/* which op: 1 for the handle's first submit */
	int64_t offset;		/* file offset of the failing piece */
	uint64_t nbytes;	/* size of the failing piece */
	uint64_t user_data;	/* the op's tag (nvio_submit), else 0 */
	char what[64];		/* "open", "pread", "pwrite", "validate", ...,
				 * or the argument refused: "iov (...)" */
	char path[1024];	/* file name, or "fd N" */
} nvio_error_t;

/*
 * Copies the last error into *out, of which it fills out->struct_size
 * bytes (a smaller, older struct gets the fields it has); returns
 * out->err, or -EINVAL if struct_size is below 8.
 */
NVIO_API int nvio_last_error(const nvio_handle_t *h, nvio_error_t *out);
/*
 * Formats an error as one line, e.g.
 * "pread of 4096 bytes at offset 8192 in /x/y failed: No data ... (op 3)".
 * Returns the length the line has (snprintf style).
 */
NVIO_API int nvio_format_error(const nvio_error_t *e, char *buf, size_t len);

/*
 * Page-aligned, page-locked host memory.
 * nvio_mem_alloc stores in *out nbytes of zeroed memory aligned to the
 * page size; nbytes 0 is allowed and gives a valid, freeable allocation
 * (an empty locked tensor is a legitimate request). It tries to lock the pages; where RLIMIT_MEMLOCK or the
 * system refuses, it returns unlocked memory instead, unless
 * NVIO_MEM_REQUIRE_LOCKED is given, in which case it fails with the
 * error mlock gave (-ENOMEM or -EPERM). *flags_out (if not NULL) gets
 * NVIO_MEM_LOCKED when the pages really are locked.
 */
#define NVIO_MEM_LOCKED		(1u << 0)
#define NVIO_MEM_REQUIRE_LOCKED	(1u << 1)
#define NVIO_MEM_NVIO		(1u << 2) /* query: memory came from nvio */
NVIO_API int nvio_mem_alloc(void **out, uint64_t nbytes, unsigned flags,
		   unsigned *flags_out);
/* Frees memory from nvio_mem_alloc; -EINVAL (and nothing freed) for a
 * pointer that is not a live nvio allocation (NULL included), so a
 * double free is safe. */
NVIO_API int nvio_mem_free(void *p);
/* NVIO_MEM_NVIO|NVIO_MEM_LOCKED if [p, p+nbytes) lies inside one live
 * nvio allocation (LOCKED only if locked), else 0. */
NVIO_API unsigned nvio_mem_query(const void *p, uint64_t nbytes);

/*
 * What this machine and a directory support, for `nvio report`.
 * dir may be NULL to skip the file-system part.
 */
typedef struct nvio_probe {
	uint32_t struct_size;		/* set by the caller: sizeof */
	int32_t direct_ok;		/* 1: O_DIRECT open works in dir */
	int32_t direct_err;		/* its error when not */
	uint32_t dio_mem_align;		/* buffer alignment O_DIRECT needs */
	uint32_t dio_offset_align;	/* offset/length alignment */
	uint32_t fs_block_size;		/* st_blksize */
	char fs_type[32];		/* "ext4", "xfs", "tmpfs", ... */
	char device[64];		/* "nvme0n1", "vda", "259:1", "" */
	uint64_t fs_free_bytes;		/* space available to us in dir */
	uint64_t memlock_cur;		/* RLIMIT_MEMLOCK, UINT64_MAX = none */
	uint64_t memlock_max;
	int32_t can_lock_unlimited;	/* CAP_IPC_LOCK or unlimited limit */
	int32_t engine_ok[NVIO_ENGINE_COUNT_];	/* index: nvio_engine_t */
	char engine_why[NVIO_ENGINE_COUNT_][160];
	int32_t cuda_found;		/* CUDA driver loaded and a device seen */
	int32_t cuda_device_count;
	int32_t cuda_driver_version;	/* e.g. 12040, 0 unknown */
	char cuda_why[160];
	int32_t cufile_found;		/* libcufile loaded */
	int32_t cufile_mode;		/* NVIO_CUFILE_* below */
	char cufile_why[160];
	uint64_t reserved[8];
} nvio_probe_t;

#define NVIO_CUFILE_NONE	0	/* no libcufile */
#define NVIO_CUFILE_DIRECT	1	/* true GPUDirect (nvidia-fs) */
#define NVIO_CUFILE_COMPAT	2	/* compatibility mode (POSIX path) */
#define NVIO_CUFILE_UNKNOWN	3	/* loaded, driver not opened */

NVIO_API int nvio_probe(const char *dir, nvio_probe_t *out);

/*
 * GPU memory. Buffers may be CUDA device pointers wherever a buffer is
 * taken: nvio recognises them (through the CUDA driver the process has
 * loaded) and stages them through locked host buffers, with the device
 * copy of one piece overlapping the file I/O of others; a handle made
 * with NVIO_HANDLE_GDS moves them with cuFile instead, when usable.
 * Without a CUDA driver every buffer is host memory.
 *
 * nvio_gds_mode: opens the cuFile driver once per process if needed and
 * returns NVIO_CUFILE_DIRECT (true GPUDirect through nvidia-fs),
 * NVIO_CUFILE_COMPAT (cuFile's compatibility mode: correct, not direct)
 * or NVIO_CUFILE_NONE (no usable cuFile: GDS handles use the bounce
 * path); why gets one line on the reason and the fix.
 *
 * nvio_gds_register / nvio_gds_deregister: register a device buffer with
 * cuFile (cuFileBufRegister), which speeds up GDS transfers into it.
 * Unregistered buffers work too. Without usable cuFile they do nothing
 * and return 0. Errors: -EINVAL (NULL, not device memory, not
 * registered), -EEXIST (already registered), -EIO (cuFile refused).
 */
NVIO_API int nvio_gds_mode(char *why, size_t why_len);
NVIO_API int nvio_gds_register(void *dev_ptr, uint64_t nbytes);
NVIO_API int nvio_gds_deregister(void *dev_ptr);

/*
 * Device memory without a CUDA runtime (the nvio tool's --gpu and --gds,
 * tests, programs in C). The CUDA driver is loaded if the process has not
 * loaded it yet: $NVIO_CUDA_LIB if set, else libcuda.so.1.
 *
 * nvio_cuda_alloc: size bytes (> 0) of memory on CUDA device `device`
 * (cuMemAlloc in the device's primary context, which stays retained until
 * nvio_cuda_free). The calling thread's current context is left as it
 * was. Errors: -EINVAL (size 0, ptr NULL), -ENODEV (no CUDA driver, or no
 * such device), -ENOMEM (the device is full), -EIO (any other driver
 * error).
 *
 * nvio_cuda_free: frees memory from nvio_cuda_alloc. -EINVAL if ptr is
 * not such memory.
 *
 * nvio_cuda_memcpy: copies size bytes, synchronously, between any two of
 * host and device memory (the direction is found from the pointers; two
 * host buffers are copied with memcpy). Errors: -EINVAL (NULL pointers
 * with size > 0, or a range the driver refuses), -ENODEV, -EIO.
 */
NVIO_API int nvio_cuda_alloc(int device, uint64_t size, void **ptr);
NVIO_API int nvio_cuda_free(void *ptr);
NVIO_API int nvio_cuda_memcpy(void *dst, const void *src, uint64_t size);

/*
 * Tuned defaults. `nvio tune` saves the best configuration it found for a
 * directory in one text file: $NVIO_TUNED_FILE if set, else
 * $XDG_CONFIG_HOME/nvio/tuned.conf (~/.config/nvio/tuned.conf).
 * nvio_config_load_tuned() overwrites the tunable fields of cfg (block
 * size, queue depth, parallelism, submit/overlap modes, engine) with the
 * entry saved for `dir` and the direction (for_write 0 or 1).
 * Returns 1 if an entry was applied, 0 if none exists or NVIO_NO_TUNED=1
 * is set (cfg untouched), or a negative errno for an unreadable file.
 */
NVIO_API int nvio_config_load_tuned(nvio_config_t *cfg, const char *dir,
				    int for_write);
/* Saves cfg as the tuned entry for dir and direction; 0 or -errno. */
NVIO_API int nvio_config_save_tuned(const nvio_config_t *cfg, const char *dir,
				    int for_write);

/* ------------------------------------------------------------------ */
/* libnvio 0.2: open files, tagged ops, batches, vectors, completions,  */
/* streams. See nvio_file_open(3), nvio_submit(3), nvio_reap(3),        */
/* nvio_stream_open(3).                                                 */
/* ------------------------------------------------------------------ */

/*
 * Open files. A file object opens its path once and keeps what every op
 * on it needs: a buffered descriptor, an O_DIRECT one (when the handle's
 * direct policy and the file system allow it), the alignment O_DIRECT
 * needs, the file's size as nvio knows it, and (GDS handles) the cuFile
 * registration. One open serves any number of ops, from any thread.
 *
 * Flags:
 *   NVIO_FILE_READ     ops may read
 *   NVIO_FILE_WRITE    ops may write
 *   NVIO_FILE_CREATE   create path if missing (0666 less the umask)
 *   NVIO_FILE_EXCL     with CREATE: fail with -EEXIST if path exists
 *   NVIO_FILE_TRUNC    truncate to 0 at open (it destroys: prefer ATOMIC)
 *   NVIO_FILE_ATOMIC   write a new file that replaces path only at
 *                      nvio_file_commit(): until then path is untouched
 *                      (the data goes to an unnamed O_TMPFILE where the
 *                      file system has it, else to an exclusive hidden
 *                      temporary beside path); closing without a commit
 *                      abandons it. Implies WRITE (and READ may be
 *                      added); starts empty. path must name a regular
 *                      file or nothing (-EINVAL for a device or FIFO).
 *   NVIO_FILE_NOSYNC   with ATOMIC: nvio_file_commit renames without
 *                      fsync of the data or the directory: the
 *                      replacement stays all or nothing for a crash of
 *                      the process, not for one of the machine.
 *   NVIO_FILE_SPARE    with ATOMIC: write into the blocks of path's
 *                      previous version instead of fresh ones (on thin
 *                      or loop-backed disks fresh blocks cost about twice
 *                      as much to write). The temporary is the spare
 *                      ".<name>.nvio-spare" beside path, overwritten in
 *                      place (it starts empty all the same: its size is
 *                      what is written; its old bytes are marked
 *                      unwritten with FALLOC_FL_ZERO_RANGE, which ext4
 *                      does keeping the blocks); commit truncates it to that
 *                      size, makes it durable and swaps it with path
 *                      (renameat2 RENAME_EXCHANGE), so the old version
 *                      becomes the next save's spare. Costs one more
 *                      copy of the file on disk for good; a process
 *                      still reading an old version through an open
 *                      descriptor or mapping sees it overwritten by the
 *                      save after next. When path does not exist, a
 *                      spare there all the same is used and renamed
 *                      into place (0666 less the umask) and none is
 *                      made. Silently an ordinary ATOMIC write when
 *                      there is no spare to take: none and no path, a
 *                      link, other names, another user's, in use by
 *                      another writer (flock); a plain rename on a
 *                      file system without RENAME_EXCHANGE.
 *                      Abandoning keeps the spare (its content is then
 *                      garbage; only its blocks matter; SHARED: see
 *                      nvio_file_join).
 * Unknown flags, no READ/WRITE/ATOMIC, TRUNC/EXCL with ATOMIC, NOSYNC,
 * SPARE without ATOMIC, or EXCL without CREATE are -EINVAL (SHARED
 * without ATOMIC: see nvio_file_join) (CREATE with ATOMIC is allowed: implied). Returns the file, or NULL with *err set (the open's errno, or
 * -EISDIR for a directory); the failure is also the calling thread's
 * nvio_last_error() for the handle.
 */
#define NVIO_FILE_READ		(1u << 0)
#define NVIO_FILE_WRITE		(1u << 1)
#define NVIO_FILE_CREATE	(1u << 2)
#define NVIO_FILE_EXCL		(1u << 3)
#define NVIO_FILE_TRUNC		(1u << 4)
#define NVIO_FILE_ATOMIC	(1u << 5)
#define NVIO_FILE_NOSYNC	(1u << 6)
#define NVIO_FILE_SPARE		(1u << 7)
#define NVIO_FILE_SHARED	(1u << 8)	/* 0.3: see nvio_file_join(3) */

typedef struct nvio_file nvio_file_t;

NVIO_API nvio_file_t *nvio_file_open(nvio_handle_t *h, const char *path,
				     unsigned flags, int *err);
/*
 * A file object over the caller's open descriptor, which nvio never
 * closes or changes (its file offset and flags stay as they were). flags:
 * NVIO_FILE_READ and/or NVIO_FILE_WRITE, allowed by fd's access mode.
 */
NVIO_API nvio_file_t *nvio_file_from_fd(nvio_handle_t *h, int fd,
					unsigned flags, int *err);

/*
 * Waits for the file's ops in flight to end (they complete as usual),
 * then closes it. An ATOMIC file not committed is abandoned: its data is
 * discarded and path was never touched. Returns 0, or the error of a
 * failed close(2) of a written file (NFS reports writeback errors
 * there). The file is freed either way. NULL is accepted.
 */
NVIO_API int nvio_file_close(nvio_file_t *f);

/*
 * Durability and replacement. nvio_file_sync: fsync(2) of the data
 * written so far. nvio_file_commit, for an ATOMIC file: waits for the
 * file's ops, fsyncs the data, gives it path's permissions if path
 * existed (else 0666 less umask), puts it in place of path with one
 * rename, and fsyncs the directory: after 0 the new file is path,
 * durably; on any error before the rename path still holds its old
 * content (a failed fsync of the directory is reported after it: the new
 * content is in place, its name may not yet be durable). The file stays
 * open on the new content. -EINVAL for a file that is not ATOMIC or is
 * already committed; -EIO (and no commit) if any write on the file
 * failed, or was refused, since it was opened.
 */
NVIO_API int nvio_file_sync(nvio_file_t *f);
NVIO_API int nvio_file_commit(nvio_file_t *f);

/*
 * Sets the file's size exactly (ftruncate): it shrinks or grows (a hole).
 * nvio_file_allocate reserves [offset, offset + nbytes) (fallocate(2)
 * mode 0, so a full disk shows now, as -ENOSPC) without changing the
 * bytes there; a file shorter than offset + nbytes grows to it.
 */
NVIO_API int nvio_file_truncate(nvio_file_t *f, uint64_t size);
NVIO_API int nvio_file_allocate(nvio_file_t *f, int64_t offset, uint64_t nbytes);

typedef struct nvio_file_info {
	uint32_t struct_size;	/* the caller sets sizeof(nvio_file_info_t) */
	uint32_t flags;		/* NVIO_FILE_* it was opened with */
	int32_t fd;		/* the buffered descriptor (do not close) */
	int32_t direct;		/* 1: the body of ops goes through O_DIRECT */
	uint32_t dio_offset_align; /* O_DIRECT offset/length alignment, or 0 */
	uint32_t dio_mem_align;	/* O_DIRECT buffer alignment, or 0 */
	uint64_t size;		/* current size: at open, plus nvio's writes */
	int32_t committed;	/* ATOMIC: 1 once committed */
	int32_t reserved0;
	uint64_t reserved[4];
} nvio_file_info_t;

/* Fills out->struct_size bytes of *out; 0 or -EINVAL. */
NVIO_API int nvio_file_info(const nvio_file_t *f, nvio_file_info_t *out);
/* The path it was opened with ("fd N" for nvio_file_from_fd). */
NVIO_API const char *nvio_file_path(const nvio_file_t *f);
/*
 * An ATOMIC file not yet committed: the name of its temporary where other
 * processes can open it by that name to write parts of it (a spare, or a
 * hidden temporary where the file system has no O_TMPFILE); NULL for an
 * unnamed O_TMPFILE, after the commit, and for other files. The name is
 * valid until the file is committed or closed.
 */
NVIO_API const char *nvio_file_temp_path(const nvio_file_t *f);

/*
 * Files written by several processes (0.3): shares of ONE file that
 * appears under its name only when its creator commits. The creator
 * opens path with NVIO_FILE_ATOMIC | NVIO_FILE_SHARED: the temporary is
 * always a named one (an exclusive hidden temporary beside path, or the
 * spare with NVIO_FILE_SPARE), never an unnamed O_TMPFILE, which no other
 * process could open. It publishes nvio_file_temp_path(f) and what
 * nvio_file_share fills (the temporary's identity) to its writers, which
 * open it with nvio_file_join and write their ranges (nvio_file_pwrite,
 * ops, streams). The creator then commits as for any ATOMIC file (fsync
 * of the data, which is the whole file's whoever wrote it, rename over
 * path, fsync of the directory) or abandons it by closing it uncommitted
 * (the temporary is removed; a spare is kept for the next save, as an
 * unshared one is, when no other open of it remains (the writers closed
 * theirs; tried with a write lease, fcntl F_SETLEASE), and is removed
 * when one does or leases are unavailable, so that no later save reuses
 * an inode a late writer may still write; writers still writing then
 * write to a nameless file). Commit fails with -ESTALE, publishing nothing and
 * leaving path alone, when the temporary's name no longer leads to the
 * creator's temporary (something renamed onto it); abandon then leaves
 * that other file where it is. Commit does not wait for the writers: the
 * creator commits once
 * each writer has said it is done (closed its file) and none failed.
 * Its size is what the creator knows: set it with nvio_file_truncate or
 * nvio_file_allocate before commit (a spare is cut to it).
 *
 * nvio_file_share fills out->struct_size bytes (the caller sets it) of
 * the identity of f's temporary; -EINVAL unless f is ATOMIC | SHARED and
 * not committed, or when struct_size cannot hold dev and ino. nvio_file_join opens temp_path for writing (flags:
 * NVIO_FILE_WRITE, and NVIO_FILE_READ if wanted) and refuses anything
 * but that temporary: a name not of an nvio temporary or spare (-EINVAL),
 * a symbolic link (-ELOOP; never followed), a FIFO, socket, device or
 * directory (-EINVAL; a FIFO's open never blocks), another user's file
 * or one with other names (-EPERM), a file other than the creator's,
 * say one put at the name after the creator abandoned (-ESTALE). It
 * never creates or truncates. A joined file is a plain file that carries
 * NVIO_FILE_SHARED: close never removes it, nvio_file_commit is -EINVAL,
 * and a writer stream over it leaves the file's size alone at close. share's struct_size must
 * cover dev and ino and its reserved fields must be 0 (-EINVAL).
 * nvio_file_open(h, temp_path, NVIO_FILE_WRITE | NVIO_FILE_SHARED [|
 * NVIO_FILE_READ], err), SHARED without ATOMIC, is the same open with
 * every refusal but the identity's (for callers that compare it from
 * nvio_file_info's fd themselves); other flags with it are -EINVAL.
 */
typedef struct nvio_share {
	uint32_t struct_size;	/* sizeof(nvio_share_t) */
	uint32_t reserved0;	/* 0 */
	uint64_t dev;		/* the temporary's st_dev */
	uint64_t ino;		/* its st_ino */
	uint64_t reserved[5];	/* 0; later versions may fill them */
} nvio_share_t;

NVIO_API int nvio_file_share(const nvio_file_t *f, nvio_share_t *out);
NVIO_API nvio_file_t *nvio_file_join(nvio_handle_t *h, const char *temp_path,
				     const nvio_share_t *share, unsigned flags, int *err);

/*
 * Synchronous (or, with NVIO_ASYNC, nvio_wait-reported) range I/O on an
 * open file, with the contract of nvio_pread/nvio_pwrite. Reads past the
 * size are -ENODATA; writes past it grow the file.
 */
NVIO_API int nvio_file_pread(nvio_file_t *f, void *buf, uint64_t nbytes,
			     int64_t offset, unsigned flags);
NVIO_API int nvio_file_pwrite(nvio_file_t *f, const void *buf, uint64_t nbytes,
			      int64_t offset, unsigned flags);

/*
 * Vectors. An nvio_iovec_t is one buffer. In an op with offset >= 0 the
 * buffers are laid end to end in the file from offset (readv/writev
 * style: base and len used, offset must be 0); with offset
 * NVIO_OFFSET_PER_IOV each buffer has its own file offset, in increasing
 * order without overlap. Adjacent buffers form one contiguous run, moved
 * in block_size requests whatever the buffers' sizes: pieces smaller than
 * a request, or not aligned for O_DIRECT, are gathered into (or
 * scattered from) the staging buffers; aligned spans of a whole request
 * move straight from their memory. The buffers of one vector are all host
 * memory or all on one CUDA device (-EINVAL otherwise).
 */
typedef struct nvio_iovec {
	void *base;
	uint64_t len;
	int64_t offset;
} nvio_iovec_t;

#define NVIO_OFFSET_PER_IOV ((int64_t)-1)
#define NVIO_MAX_IOV (1u << 24)

NVIO_API int nvio_file_preadv(nvio_file_t *f, const nvio_iovec_t *iov,
			      uint32_t iovcnt, int64_t offset, unsigned flags);
NVIO_API int nvio_file_pwritev(nvio_file_t *f, const nvio_iovec_t *iov,
			       uint32_t iovcnt, int64_t offset, unsigned flags);

/*
 * Tagged ops and batches. nvio_submit() accepts up to n ops; each
 * accepted op completes exactly once, as its own completion carrying its
 * user_data, which nvio_reap() returns. Fields:
 *   opcode     NVIO_OP_READ or NVIO_OP_WRITE
 *   flags      NVIO_VALIDATE | NVIO_FSYNC (async is implied)
 *   file       an open file
 *   buf        one buffer of nbytes bytes at file offset `offset`, or NULL
 *   iov        with iovcnt: a vector, as for nvio_file_preadv (then buf
 *              must be NULL and nbytes 0)
 *   user_data  anything; comes back in the completion
 *   crc32      NULL, or an array of one uint32_t per buffer (iovcnt of
 *              them for a vector, else one; a vector's empty buffers
 *              too) where the op stores the CRC-32 (nvio_crc32's, as
 *              zlib's crc32()) of each buffer's bytes as they moved,
 *              once it has completed without error (its content is
 *              undefined until then, and after a failure). Host memory
 *              is checksummed in the same pass as a bounce-buffer copy
 *              (gathered writes, unaligned O_DIRECT, scattered reads),
 *              else read once more by the worker that moved the piece;
 *              device memory always goes through the bounce buffers
 *              then (never cuFile), which are checksummed. Saves the
 *              writer of a format with checksums (zip) a pass of its
 *              own over memory (0.3.1).
 * reserved fields must be 0.
 * Returns how many ops, from the first, were accepted. When op r is
 * refused the call stops there and returns r, or the refusal's -errno if
 * r is 0 (resubmit from ops + r to see its error; nvio_last_error() has
 * its record). A refused op never completes.
 */
#define NVIO_OP_READ	1
#define NVIO_OP_WRITE	2

typedef struct nvio_op {
	uint32_t opcode;
	uint32_t flags;
	nvio_file_t *file;
	void *buf;
	uint64_t nbytes;
	int64_t offset;
	const nvio_iovec_t *iov;
	uint32_t iovcnt;
	uint32_t reserved0;
	uint64_t user_data;
	uint32_t *crc32;	/* 0.3.1: NULL, or one CRC-32 per buffer (above) */
	uint64_t reserved[3];	/* 0.3: room to grow; must be 0 */
} nvio_op_t;

NVIO_API int nvio_submit(nvio_handle_t *h, const nvio_op_t *ops, unsigned n);

/*
 * Fill an op, every other field (reserved ones included) zeroed, so that
 * code built with them keeps meaning the same when fields are added.
 */
static inline void nvio_prep_rw(nvio_op_t *op, uint32_t opcode, nvio_file_t *f,
				void *buf, uint64_t nbytes, int64_t offset,
				uint64_t user_data)
{
	*op = (nvio_op_t){ 0 };
	op->opcode = opcode;
	op->file = f;
	op->buf = buf;
	op->nbytes = nbytes;
	op->offset = offset;
	op->user_data = user_data;
}

static inline void nvio_prep_read(nvio_op_t *op, nvio_file_t *f, void *buf,
				  uint64_t nbytes, int64_t offset, uint64_t user_data)
{
	nvio_prep_rw(op, NVIO_OP_READ, f, buf, nbytes, offset, user_data);
}

static inline void nvio_prep_write(nvio_op_t *op, nvio_file_t *f, const void *buf,
				   uint64_t nbytes, int64_t offset, uint64_t user_data)
{
	nvio_prep_rw(op, NVIO_OP_WRITE, f, (void *)buf, nbytes, offset, user_data);
}

/* Vectors: offset as for nvio_file_preadv (NVIO_OFFSET_PER_IOV or a start). */
static inline void nvio_prep_readv(nvio_op_t *op, nvio_file_t *f, const nvio_iovec_t *iov,
				   uint32_t iovcnt, int64_t offset, uint64_t user_data)
{
	nvio_prep_rw(op, NVIO_OP_READ, f, NULL, 0, offset, user_data);
	op->iov = iov;
	op->iovcnt = iovcnt;
}

static inline void nvio_prep_writev(nvio_op_t *op, nvio_file_t *f, const nvio_iovec_t *iov,
				    uint32_t iovcnt, int64_t offset, uint64_t user_data)
{
	nvio_prep_rw(op, NVIO_OP_WRITE, f, NULL, 0, offset, user_data);
	op->iov = iov;
	op->iovcnt = iovcnt;
}

/*
 * One ended op (0.3 layout: it starts with its size and has room to grow;
 * programs built against 0.2 get 0.2's layout from their NVIO_0.2
 * versions of nvio_reap and nvio_completion_error).
 * res: bytes moved (>= 0) or a negative errno; on failure
 * err_offset, err_nbytes and err_what say which piece failed and how
 * (the first failure of the op; nvio_completion_error() makes a full
 * record of it).
 */
typedef struct nvio_completion {
	uint32_t struct_size;	/* set by the library: sizeof as it knows it */
	uint32_t flags;		/* NVIO_COMPLETION_WRITE */
	uint64_t user_data;
	int64_t res;
	uint64_t op_seq;
	int64_t err_offset;
	uint64_t err_nbytes;
	char err_what[24];
	uint64_t reserved[4];	/* 0; later versions may fill them */
} nvio_completion_t;

#define NVIO_COMPLETION_WRITE	(1u << 0)

/*
 * Stores up to max completions in out, oldest first, and returns how
 * many. Waits until at least min are there, or until timeout_ns has
 * passed (< 0: no limit; 0: never waits), then returns what there is,
 * which may be fewer than min (0 included). min > max is -EINVAL. With no
 * timeout it waits for ops other threads may still submit: min beyond
 * what is in flight (nvio_inflight) then waits until they do.
 * Completions of ops submitted by any thread come back to whichever
 * thread reaps first. nvio_wait() does not report them.
 */
NVIO_API int nvio_reap(nvio_handle_t *h, nvio_completion_t *out, unsigned max,
		       unsigned min, int64_t timeout_ns);

/*
 * An eventfd, owned by the handle, that is readable while completions
 * wait to be reaped (an event loop polls it, then calls nvio_reap with
 * timeout 0). Made on first call; -errno if it cannot be.
 */
NVIO_API int nvio_completion_fd(nvio_handle_t *h);

/* Tagged ops accepted and not yet reaped. */
NVIO_API uint32_t nvio_inflight(const nvio_handle_t *h);

/* A full error record for a failed completion; path is the file's name
 * (nvio_file_path), or NULL. Returns the completion's negative errno, or
 * 0 for a completion that succeeded. */
NVIO_API int nvio_completion_error(const nvio_completion_t *c, const char *path,
				   nvio_error_t *out);

/*
 * Completion queues (0.3). A queue belongs to one consumer: the ops
 * submitted to it complete on it and nowhere else, and its eventfd is
 * readable exactly while completions wait on it, so consumers of one
 * handle never see (or sort) each other's completions. Ops of any queue
 * share the handle's workers. nvio_submit/nvio_reap/nvio_completion_fd/
 * nvio_inflight/nvio_cancel are these calls on the handle's default
 * queue (nvio_handle_queue).
 *
 * nvio_queue_create: flags must be 0. nvio_queue_destroy waits for the
 * queue's ops in flight, drops its unreaped completions and frees it
 * (the default queue: -EINVAL). A handle frees the queues left with it.
 * nvio_queue_submit/reap/fd/inflight: as nvio_submit, nvio_reap,
 * nvio_completion_fd, nvio_inflight, on this queue only.
 *
 * nvio_queue_cancel: every op of the queue with this user_data that is
 * still running stops issuing pieces: pieces not started are skipped,
 * pieces in flight finish, and the op completes once, with -ECANCELED
 * (or the error it had already met). A cancelled write leaves the bytes
 * of the pieces that ran; it marks the file failed, like any failed
 * write (an ATOMIC file then refuses to commit). Returns how many ops it
 * cancelled; -EALREADY when the matching ops have moved all their pieces
 * and are ending (they complete as they would have); -ENOENT when no op
 * of the queue has this user_data in flight (never submitted, or
 * completed already: a completion waiting to be reaped is not undone).
 */
typedef struct nvio_queue nvio_queue_t;

NVIO_API int nvio_queue_create(nvio_handle_t *h, nvio_queue_t **out, unsigned flags);
NVIO_API int nvio_queue_destroy(nvio_queue_t *q);
NVIO_API nvio_queue_t *nvio_handle_queue(nvio_handle_t *h);
NVIO_API int nvio_queue_submit(nvio_queue_t *q, const nvio_op_t *ops, unsigned n);
NVIO_API int nvio_queue_reap(nvio_queue_t *q, nvio_completion_t *out, unsigned max,
			     unsigned min, int64_t timeout_ns);
NVIO_API int nvio_queue_fd(nvio_queue_t *q);
NVIO_API uint32_t nvio_queue_inflight(const nvio_queue_t *q);
NVIO_API int nvio_queue_cancel(nvio_queue_t *q, uint64_t user_data);
NVIO_API int nvio_cancel(nvio_handle_t *h, uint64_t user_data);

/*
 * Streams over an open file. A writer appends from `offset`: write()
 * copies into double-buffered locked staging buffers of buffer_bytes
 * each (0: 8 MiB, rounded up to the block alignment) that are flushed
 * with O_DIRECT while the caller goes on, or submits a large aligned span
 * straight from the caller's memory; close writes the unaligned tail and
 * sets the file's size to exactly offset + bytes written. A reader reads
 * ahead up to `depth` buffers (0: 2) from offset.
 *
 * nvio_stream_write returns nbytes, or the first error of the stream (a
 * failed flush is reported by the next call, and by close); after an
 * error every call fails with it. nvio_stream_read returns the bytes
 * read, fewer than nbytes only at the end of the file, 0 at the end.
 * nvio_stream_seek (readers) moves to an absolute offset.
 * nvio_stream_flush (writers) waits until every byte written so far but
 * the unaligned last block is in the file. nvio_stream_close frees the
 * stream and returns its first error; with NVIO_FSYNC the file is made
 * durable, with NVIO_STREAM_COMMIT (an ATOMIC file) it is committed
 * (which fsyncs). The file stays open; it must outlive its streams.
 * Unknown close flags are -EINVAL and leave the stream open, its data
 * unwritten, so that no byte is lost to a typo.
 * Stream calls take host memory (-EINVAL for GPU memory: move that with
 * nvio_file_pread/pwrite). A stream is used by one thread at a time.
 */
#define NVIO_STREAM_READ	(1u << 0)
#define NVIO_STREAM_WRITE	(1u << 1)
#define NVIO_STREAM_COMMIT	(1u << 8)	/* close flag */

typedef struct nvio_stream nvio_stream_t;

NVIO_API nvio_stream_t *nvio_stream_open(nvio_file_t *f, unsigned flags,
					 int64_t offset, uint64_t buffer_bytes,
					 unsigned depth, int *err);
NVIO_API int64_t nvio_stream_write(nvio_stream_t *s, const void *buf,
				   uint64_t nbytes);
NVIO_API int64_t nvio_stream_read(nvio_stream_t *s, void *buf, uint64_t nbytes);
NVIO_API int nvio_stream_seek(nvio_stream_t *s, int64_t offset);
NVIO_API int64_t nvio_stream_tell(const nvio_stream_t *s);
NVIO_API int nvio_stream_flush(nvio_stream_t *s);
NVIO_API int nvio_stream_close(nvio_stream_t *s, unsigned flags);

/*
 * Streams with options (0.3). nvio_stream_open_config opens a stream as
 * nvio_stream_open does from c's fields, plus:
 *   memory     writers: the caller's memory (host, locked or not, or
 *              CUDA memory) used as the stream's buffers instead of
 *              private locked ones (DeepSpeed's pinned staging tensor):
 *              buffer_bytes is its size, cut into depth buffers (1 or 2;
 *              0: 2) of a multiple of the O_DIRECT unit each (-EINVAL if
 *              that leaves none). Writes are copied into it (by the CUDA
 *              driver for CUDA memory); nvio never frees it, and it must
 *              stay valid and unused by the caller until
 *              nvio_stream_close returns. NULL: private buffers.
 *   NVIO_STREAM_RANGES (in flags, writers): a writer of ranges of a file
 *              that others write too (a share of a multi-writer file):
 *              nvio_stream_seek moves it (what its buffer holds is
 *              written first, asynchronously; a seek back over bytes
 *              still being written waits for that write, so the later
 *              write of a range always lands last), and close leaves the
 *              file's size alone instead of setting it to where the
 *              stream ended.
 * c->struct_size must cover memory; reserved fields must be 0; unknown
 * flags, memory or RANGES for a reader are -EINVAL (in *err).
 */
#define NVIO_STREAM_RANGES	(1u << 2)

typedef struct nvio_stream_config {
	uint32_t struct_size;	/* sizeof(nvio_stream_config_t) */
	uint32_t flags;		/* NVIO_STREAM_READ or _WRITE, | NVIO_STREAM_RANGES */
	int64_t offset;		/* where the stream starts */
	uint64_t buffer_bytes;	/* each buffer (0: 8 MiB); with memory: its size */
	uint32_t depth;		/* buffers: readers 0: 2; writers with memory 1 or 2 */
	uint32_t reserved0;	/* 0 */
	void *memory;		/* writers: the caller's buffer memory, or NULL */
	uint64_t reserved[4];	/* 0; later versions may fill them */
} nvio_stream_config_t;

NVIO_API nvio_stream_t *nvio_stream_open_config(nvio_file_t *f,
						const nvio_stream_config_t *c, int *err);

/*
 * Staging memory. Bounce buffers (for buffers O_DIRECT cannot take, GPU
 * memory, gathered vector pieces) come from one process-wide budget, so
 * memory does not multiply with handles: a worker's pool, made on its
 * first staged piece, gets what it asks for (staging_bytes) while the
 * budget lasts and two buffers at least after; it is given back when its
 * handle is destroyed. The limit is set here (0: back to the default),
 * else by $NVIO_STAGING_LIMIT (bytes, K/M/G suffix allowed), else
 * NVIO_DEFAULT_STAGING_LIMIT; it applies to pools made after the call.
 * nvio_staging_limit returns the limit in force and stores in *in_use
 * (if not NULL) the bytes pools hold now.
 */
#define NVIO_DEFAULT_STAGING_LIMIT (512ull << 20)
NVIO_API int nvio_staging_set_limit(uint64_t bytes);
NVIO_API uint64_t nvio_staging_limit(uint64_t *in_use);

/*
 * cuFile's library. Where the process has not loaded cuFile yet, sets the
 * path tried first (before $NVIO_CUFILE_LIB and libcufile.so.0); a probe
 * that found none does not stop a later call from finding it. -EBUSY once
 * cuFile is loaded (from another path, or for NULL); NULL resets to the
 * default search ($NVIO_CUFILE_LIB, libcufile.so.0, libcufile.so).
 */
NVIO_API int nvio_cufile_set_library(const char *path);

/*
 * CRC-32 as zip, gzip and zlib define it (reflected polynomial 0xEDB88320):
 * nvio_crc32(crc, buf, len) continues crc (0 to start) over len bytes and
 * equals zlib's crc32(); buf may be NULL only with len 0 (crc returned).
 * It uses carry-less multiplication where the CPU has it (x86-64
 * PCLMULQDQ, detected at run time), tables elsewhere. Pure and
 * thread-safe. nvio_crc32_combine gives the CRC of A followed by B from
 * crc(A), crc(B) and B's length, as zlib's crc32_combine(), in O(log len2).
 */
NVIO_API uint32_t nvio_crc32(uint32_t crc, const void *buf, size_t len);
NVIO_API uint32_t nvio_crc32_combine(uint32_t crc1, uint32_t crc2, uint64_t len2);

/*
 * Temporaries left by killed writers. An ATOMIC file that needs a name
 * before its commit (always where the file system has no O_TMPFILE, for
 * an instant before the rename where it has) is named
 * ".<name>.nvio-<owner>-<pid>-<start>-<random>" beside its target, the
 * owner part telling which boot, host and pid namespace made it, and pid
 * and start which process. Every ATOMIC open removes the temporaries of
 * its target whose owner is dead (the same as
 * nvio_clean_temporaries(dir, name, 0, NULL, NULL)).
 *
 * nvio_clean_temporaries removes from dir the temporaries (of target, a
 * file name without '/', or of every name when NULL) whose owner is dead:
 * exited (its pid gone, or another process's now), or made in an earlier
 * boot of this host. One made on another host or in another container
 * is kept (nothing here can tell whether its owner lives), and so are a
 * symbolic link, a directory or another kind of file at such a name,
 * another user's file (unless NVIO_CLEAN_ANY_USER), and every name that
 * is not of this form. NVIO_CLEAN_DRY_RUN removes nothing. report, when
 * not NULL, is called for every temporary found with its name, 1 if it
 * was removed (or would be, dry run), 0 if kept, -errno if removing it
 * failed, and why in words. Returns the number removed (or that would
 * be), -errno for dir (ENOENT, ENOTDIR, EACCES), -EINVAL for unknown
 * flags or a target with a '/', or the first failed removal's -errno
 * after trying every one.
 *
 * Spares (NVIO_FILE_SPARE) are named ".<name>.nvio-spare" and are never
 * taken for temporaries: nvio_clean_temporaries removes them only when
 * asked. NVIO_CLEAN_SPARES removes the spares (of target, or all) whose
 * target is gone (deleting a file saved with NVIO_FILE_SPARE leaves its
 * spare: this frees that space); NVIO_CLEAN_ALL_SPARES removes them
 * whether or not their target is there. Either way a spare is removed
 * only if it is a regular file of one link, the caller's (any user's with
 * NVIO_CLEAN_ANY_USER), and not in use by a writer (it is locked as a
 * writer locks it); report gets each spare found too.
 *
 * nvio_temp_name stores in buf the name a temporary of path gets when
 * this process makes it (in path's directory), for callers that create
 * their own (exclusively: O_CREAT|O_EXCL|O_NOFOLLOW), so that the sweep
 * knows their owner too. Returns its length, -ENAMETOOLONG when it does
 * not fit len, -EINVAL for a NULL or empty path or one ending in '/'.
 */
#define NVIO_CLEAN_DRY_RUN	(1u << 0)
#define NVIO_CLEAN_ANY_USER	(1u << 1)
#define NVIO_CLEAN_SPARES	(1u << 2)
#define NVIO_CLEAN_ALL_SPARES	(1u << 3)
typedef void nvio_clean_fn(const char *name, int result, const char *why, void *arg);
NVIO_API int nvio_clean_temporaries(const char *dir, const char *target, unsigned flags,
				    nvio_clean_fn *report, void *arg);
NVIO_API int nvio_temp_name(const char *path, char *buf, size_t len);

#ifdef __cplusplus
}
#endif
#endif /* NVIO_H */
