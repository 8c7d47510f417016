/*
 * ext.h - what the files of the CPython extension nvio._nvio share.
 *
 * The extension is built against the limited API of Python 3.11 (one abi3
 * wheel) and the public C API of libnvio only (include/nvio.h). It never
 * includes a PyTorch, NumPy, DLPack or CUDA header: tensors are reached
 * through Python attribute calls, DLPack capsules through a small stable
 * struct (buffers.c).
 *
 * One file per concern; each adds what it defines to the module from its
 * ext_*_exec(), called in order by module.c:
 *   module.c   module definition (PEP 489 multi-phase init), the module
 *              state, machine-wide functions (probe, gds_*, file_size)
 *   handle.c   the Handle type: its methods beside its method table
 *   calls.c    Handle's one-buffer calls by name or fd (pread, read, ...)
 *   shared.c   files several processes write; streams over a caller's
 *              staging memory
 *   file.c     the File type (open files, their blocking calls)
 *   stream.c   the Stream type (File.stream())
 *   tagged.c   tagged ops on a queue (Handle.submit/reap), the Queue type
 *   blocking.c the blocking runner: one op on a private queue, cancelled
 *              on a signal
 *   locked.c   LockedBuffer (nvio_mem_*), mem_query
 *   crc.c copy.c pickling.c   CRC-32, vectored memcpy, torch.save's ids
 *   zipimage.c the file image of a torch.save zip archive, by windows
 *   buffers.c  borrowing a buffer or a vector for one op; holds
 *   errors.c   NvioError and its errno subclasses; raising from a failure
 *   args.c     argument parsers; the module of a type
 *
 * Calls go one way, down this list (a file calls only files below it):
 * module.c -> handle.c -> calls.c, file.c, tagged.c; module.c ->
 * shared.c -> file.c (ext_file_join); file.c -> stream.c, blocking.c;
 * calls.c -> blocking.c; and any of them ->
 * buffers.c, errors.c, args.c. tests/cycles_check.sh checks that no
 * file is reached back from one it calls (from the objects' symbols);
 * what a lower file needs of a higher one's struct is an inline
 * function here (ext_handle_check_open, ext_file_check_open,
 * ext_state_of).
 *
 * Names shared between these files start with ext_ (they are hidden in
 * the shared object: only PyInit__nvio is exported).
 *
 * Rules the extension keeps:
 *   - The GIL is released around every call that may block.
 *   - An asynchronous op keeps its buffer (and file name) alive in a
 *     per-handle list of holds until the wait() that covers it returns,
 *     even when that wait raises, or until the handle is destroyed.
 *   - A handle is never destroyed while a thread is inside one of its
 *     calls: the method call holds a reference, and close() refuses while
 *     a call is in progress (ext_handle.busy).
 *   - Python objects the extension keeps (classes, types, interned names,
 *     torch objects it looked up) live in the module state, never in C
 *     globals; a handle keeps its module, hence that state, alive.
 */
#ifndef NVIO_EXT_H
#define NVIO_EXT_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>

#include "nvio.h"

/* ------------------------------------------------------------------ */
/* Module state (module.c)                                             */
/* ------------------------------------------------------------------ */

/* Errno values with their own exception class (errors.c's table). */
#define EXT_NERRNO 9

/* How many tensor types buffers.c remembers as torch-like. */
#define EXT_TORCH_TYPES 8
/* How many torch dtypes it remembers as not complex. */
#define EXT_TORCH_DTYPES 8

/*
 * Names looked up on every tensor, interned once: a name made from a C
 * string on each call, and its hash, cost more than the lookup itself.
 * Together with the caches below this took buffer_info on a torch tensor
 * from 5.1 to 1.5 us.
 */
#define EXT_TORCH_NAMES(X) X(data_ptr) X(element_size) X(is_contiguous) \
	X(numel) X(is_conj) X(is_neg) X(is_cpu) X(layout) X(nbytes) \
	X(dtype) X(is_complex)

typedef struct ext_state {
	/* errors.c: NvioError, and the class for each errno of its table
	 * (NULL where that errno has none; EPERM shares EACCES's) */
	PyObject *error;
	PyObject *errno_class[EXT_NERRNO];
	/* the types, for type checks */
	PyObject *handle_type;
	PyObject *locked_buffer_type;
	PyObject *file_type;
	PyObject *stream_type;
	PyObject *queue_type;
	/* buffers.c: interned names, and what it learnt about torch */
#define EXT_DECLARE_NAME(n) PyObject *s_##n;
	EXT_TORCH_NAMES(EXT_DECLARE_NAME)
#undef EXT_DECLARE_NAME
	PyObject *torch_types[EXT_TORCH_TYPES];	/* types seen to be tensors */
	unsigned char torch_real[EXT_TORCH_TYPES];	/* ... subclasses of torch.Tensor */
	unsigned torch_types_next;
	PyObject *torch_real_dtypes[EXT_TORCH_DTYPES];	/* dtypes seen not complex */
	unsigned torch_real_dtypes_next;
	PyObject *torch_strided;	/* torch.strided, once seen */
	PyObject *torch_tensor_type;	/* torch.Tensor, once torch is imported */
	PyObject *torch_increment_version;
	int torch_incver_tuple;		/* it is torch._C's, taking a tuple */
	/* errors.c: a failure's record (large); only touched with the GIL */
	nvio_error_t scratch_error;
} ext_state;

extern PyModuleDef ext_moduledef;
/* &ext_moduledef, set by module.c's exec before any type is made
 * (args.c's, so that lower files need not reach module.c). */
extern const PyModuleDef *ext_def;

/* The state of a module made from ext_moduledef. */
static inline ext_state *ext_state_of(PyObject *module)
{
	return (ext_state *)PyModule_GetState(module);
}

/*
 * The module that defined `type` or the nearest base of it (a stand-in
 * for PyType_GetModuleByDef, which the 3.11 limited API lacks: Python
 * subclasses of Handle have no module of their own). Borrowed; NULL with
 * TypeError set when there is none.
 */
PyObject *ext_module_of_type(PyTypeObject *type);

/* ------------------------------------------------------------------ */
/* Errors (errors.c)                                                   */
/* ------------------------------------------------------------------ */

int ext_errors_exec(PyObject *m, ext_state *st);

/*
 * Raises the exception for a failed nvio call (rc < 0) and returns NULL.
 * The details come from nvio_last_error(h) when it describes this
 * failure (h may be NULL), else from what the caller knows. `target` is
 * the file name object the user gave (or NULL for an fd op).
 */
PyObject *ext_raise_io(ext_state *st, nvio_handle_t *h, int rc, PyObject *target,
		       int fd, int64_t offset, uint64_t nbytes, const char *op,
		       int is_write);

/* Raises the NvioError of a failure record; returns NULL. */
PyObject *ext_raise_record(ext_state *st, const nvio_error_t *rec, PyObject *filename);

/* An NvioError instance (not raised) for a record; filename may be NULL.
 * New reference, or NULL with an exception set. */
PyObject *ext_error_from_record(ext_state *st, const nvio_error_t *e,
				PyObject *filename);

/* *rec := nvio_last_error(h) when it describes the failure rc, else a
 * record with only rc. */
void ext_record_of(nvio_handle_t *h, int rc, nvio_error_t *rec);

/* An error that belongs to no handle op (config, allocation, probe):
 * ValueError for -EINVAL, else the errno's NvioError class. NULL. */
PyObject *ext_raise_plain(ext_state *st, int rc, const char *what);

/* ------------------------------------------------------------------ */
/* Buffers and holds (buffers.c)                                       */
/* ------------------------------------------------------------------ */

int ext_buffers_exec(PyObject *m, ext_state *st);

/*
 * A buffer borrowed for one op. `view` is valid when has_view; `keep` is
 * a strong reference to whatever keeps the memory alive (the tensor, or a
 * capsule whose destructor calls the DLPack deleter).
 */
typedef struct {
	void *ptr;
	uint64_t nbytes;
	int has_view;
	Py_buffer view;
	PyObject *keep;
	PyObject *storage;	/* a tensor's storage, for async ops */
} ext_buf;

/*
 * Borrows the memory of obj for one op: writable when the op stores into
 * it (a read). 0, or -1 with an exception set. On success the caller must
 * ext_buf_release(b). b->keep == obj tells that obj is a torch tensor.
 */
int ext_buf_get(ext_state *st, PyObject *obj, int writable, ext_buf *b);
void ext_buf_release(ext_buf *b);

/* For an async op on a tensor: hold its storage as well (the tensor alone
 * does not keep the memory). 0, or -1 with an exception set. */
int ext_buf_keep_storage(ext_buf *b, PyObject *tensor);

/* After a read into obj: bump a torch tensor's autograd version counter.
 * Runs pending signal handlers first; -1 only with the exception one of
 * them raised (KeyboardInterrupt) set: the caller must return it. */
int ext_torch_bump_version(ext_state *st, PyObject *obj);

/* ext_buf_get, and with keep_storage (an op that outlives the call) a
 * tensor's storage too. 0, or -1 with an exception set. */
int ext_borrow(ext_state *st, PyObject *obj, int writable, int keep_storage, ext_buf *b);

/*
 * A vector: seq is a list or tuple of buffers, or with per_iov of
 * (buffer, offset) pairs in increasing order. Fills *bufs_out / *iov_out
 * (PyMem), *n_out and *total. 0, or -1 with an exception set and nothing
 * borrowed.
 */
int ext_borrow_vector(ext_state *st, PyObject *seq, int per_iov, int writable,
		      int keep_storage, ext_buf **bufs_out, nvio_iovec_t **iov_out,
		      uint32_t *n_out, uint64_t *total);

/* What an accepted asynchronous op borrows until a wait() covers it. */
typedef struct {
	uint64_t seq;
	ext_buf buf;
	PyObject *path;		/* the encoded file name, or NULL */
} ext_hold;

/* A handle's holds, oldest first; seq strictly increasing from 1. */
typedef struct {
	ext_hold **v;
	size_t n, cap;
	uint64_t next_seq;
} ext_holds;

/* A zeroed hold, or NULL with MemoryError set. */
ext_hold *ext_hold_new(void);
void ext_hold_free(ext_hold *x);
/* Appends x with the next seq; -1 with MemoryError set (x not taken). */
int ext_holds_add(ext_holds *hs, ext_hold *x);
/* Releases every hold whose seq is below limit (all with UINT64_MAX).
 * Releasing may run arbitrary Python code. */
void ext_holds_release(ext_holds *hs, uint64_t limit);
/* Frees the list itself; call after ext_holds_release(hs, UINT64_MAX). */
void ext_holds_fini(ext_holds *hs);

/* ------------------------------------------------------------------ */
/* Locked memory (locked.c)                                            */
/* ------------------------------------------------------------------ */

int ext_locked_exec(PyObject *m, ext_state *st);

/* CRC-32 (crc.c) */
int ext_crc_exec(PyObject *m, ext_state *st);

/* Vectored host memcpy (copy.c) */
int ext_copy_exec(PyObject *m, ext_state *st);

/* A persistent_id for torch.save's pickling (pickling.c) */
int ext_pickling_exec(PyObject *m, ext_state *st);

/* The file image of a torch.save zip archive (zipimage.c) */
int ext_zip_exec(PyObject *m, ext_state *st);

/* Files several processes write, streams over the caller's staging
 * memory (shared.c) */
int ext_shared_exec(PyObject *m, ext_state *st);

/* ------------------------------------------------------------------ */
/* Arguments (args.c)                                                  */
/* ------------------------------------------------------------------ */

/*
 * A flag argument: True/False or the ints 0/1; anything else (a string
 * such as "False", None, 2) is a TypeError naming `what`. 0 or -1.
 */
int ext_parse_flag(PyObject *o, const char *what, int *out);
/* The same as a PyArg "O&" converter: give an ext_flag_arg with its name
 * set (and its default in v). */
typedef struct {
	const char *name;
	int v;
} ext_flag_arg;
int ext_flag_converter(PyObject *o, void *arg);

/*
 * Resolves a file target: a path (str, bytes, os.PathLike) or an open
 * descriptor (int, or the fd= keyword). *pathb gets the encoded path
 * (new reference) and *shown the object to name in errors, or NULL with
 * *fd set. 0, or -1 with an exception set.
 */
int ext_parse_target(PyObject *filename, PyObject *fdobj, PyObject **pathb,
		     int *fd, PyObject **shown);

/* An engine (None, a name or an NVIO_ENGINE_* number) and a direct mode
 * (None, a bool or a name). 0, or -1 with an exception set. */
int ext_parse_engine(PyObject *o, int *out);
int ext_parse_direct(PyObject *o, int *out);
/* An offset that fits int64_t; a flag word that fits 32 bits. 0 or -1. */
int ext_parse_offset(PyObject *o, int64_t *out);
int ext_parse_flags(PyObject *o, unsigned *out);

/* ------------------------------------------------------------------ */
/* Handle (handle.c)                                                   */
/* ------------------------------------------------------------------ */

int ext_handle_exec(PyObject *m, ext_state *st);

typedef struct ext_tag ext_tag;
typedef struct ext_file ext_file;
typedef struct ext_stream ext_stream;
typedef struct ext_queue ext_queue;

/*
 * A queue's tagged ops (tagged.c): what each accepted op borrows, in a
 * slot whose index + 1 is the op's C user_data, until reap() returns it.
 */
typedef struct {
	ext_tag **slot;		/* NULL where free */
	size_t cap;
	size_t *free;		/* free slot indices (a stack) */
	size_t nfree;
	size_t used;		/* slots [0, used) were handed out once */
} ext_tags;

/* A completion queue: the C queue, its ops' borrows, and what reap()
 * took and has not returned yet (an interrupted one's, returned by the
 * next). GIL only; reap() waits into buffers of its own (tagged.c). */
typedef struct {
	nvio_queue_t *q;	/* NULL once released */
	ext_tags tags;
	nvio_completion_t *kept;
	size_t nkept, capkept;
	size_t reserved;	/* room in kept promised to reaps waiting now */
} ext_cq;

typedef struct {
	PyObject_HEAD
	nvio_handle_t *h;	/* NULL once closed */
	PyObject *module;	/* strong: keeps the state alive */
	int busy;		/* calls now running with the GIL released */
	ext_holds holds;
	ext_cq cq;		/* the default queue: Handle.submit/reap's */
	ext_queue *queues;	/* open Queue objects (borrowed; each unlinks itself) */
	ext_file *files;	/* open files (borrowed; each unlinks itself) */
} ext_handle;

static inline ext_state *ext_handle_state(ext_handle *self)
{
	return ext_state_of(self->module);
}

/* 0 if the handle is open, else -1 with ValueError set. */
static inline int ext_handle_check_open(ext_handle *self)
{
	if (!self->h) {
		PyErr_SetString(PyExc_ValueError, "nvio: I/O operation on a closed handle");
		return -1;
	}
	return 0;
}

/* ------------------------------------------------------------------ */
/* One-buffer calls by name or fd (calls.c)                            */
/* ------------------------------------------------------------------ */

enum { EXT_IO_READ, EXT_IO_WRITE, EXT_IO_READ_FILE, EXT_IO_WRITE_FILE };

/*
 * One call of kind EXT_IO_*: pread/pwrite (async with NVIO_ASYNC in
 * flags: kept in the holds until a wait()), read()/write() of a whole
 * file. 0 (*moved: the bytes a blocking call moved), or -1 with an
 * exception set.
 */
int ext_handle_io(ext_handle *self, int kind, PyObject *bufobj, PyObject *filename,
		  PyObject *fdobj, long long offset, unsigned flags, int allow_short,
		  uint64_t *moved);

/* ------------------------------------------------------------------ */
/* Files (file.c) and streams (stream.c)                               */
/* ------------------------------------------------------------------ */

struct ext_file {
	PyObject_HEAD
	nvio_file_t *f;		/* NULL once closed */
	ext_handle *handle;	/* strong */
	PyObject *name;		/* what the user gave (path), or NULL (an fd) */
	PyObject *pathb;	/* bytes: nvio_file_path(), for error records */
	unsigned flags;
	int user_fd;		/* open_fd's descriptor, else -1 */
	int busy;		/* calls running without the GIL */
	ext_file *next, **pprev;	/* in handle->files while open */
	ext_stream *streams;	/* open streams (borrowed) */
};

static inline ext_state *ext_file_state(ext_file *f)
{
	return ext_handle_state(f->handle);
}

/*
 * 0 if a stream (nvio stream s over file, busy: calls of it running) may
 * be used now, else -1 with ValueError (it, its file or its handle is
 * closed) or RuntimeError (another thread is inside it: a stream is used
 * by one thread at a time, nvio_stream_open(3)). What Stream (stream.c)
 * and StagedStream (shared.c) both check first.
 */
static inline int ext_stream_usable(const void *s, const ext_file *file, int busy)
{
	if (!s || !file->f || !file->handle->h) {
		PyErr_SetString(PyExc_ValueError, "nvio: I/O operation on a closed stream");
		return -1;
	}
	if (busy) {
		PyErr_SetString(PyExc_RuntimeError,
				"nvio: a stream is used by one thread at a time");
		return -1;
	}
	return 0;
}

/* 0 if the file (and its handle) is open, else -1 with ValueError set. */
static inline int ext_file_check_open(ext_file *self)
{
	if (!self->f || !self->handle->h) {
		PyErr_SetString(PyExc_ValueError, "nvio: I/O operation on a closed file");
		return -1;
	}
	return 0;
}

int ext_file_exec(PyObject *m, ext_state *st);

/* Handle.open/open_fd: a File (of the handle's _file_class) over path
 * (pathobj) or fd; NULL with an exception set. */
PyObject *ext_file_open(ext_handle *hd, PyObject *pathobj, int fd, unsigned flags);
/* _nvio.file_join (shared.c): a File as ext_file_open makes over
 * nvio_file_join of pathobj with share's identity; its refusals raise as
 * open's do (an NvioError naming the path and libnvio's reason; flags
 * other than WRITE [| READ] a ValueError). */
PyObject *ext_file_join(ext_handle *hd, PyObject *pathobj, const nvio_share_t *share,
			unsigned flags);

/*
 * Before the C handle is destroyed: closes every open file of the handle
 * (and their streams; an ATOMIC file not committed is abandoned), waiting
 * for their ops without the GIL. The handle must not be busy.
 */
void ext_files_close_all(ext_handle *self);

int ext_stream_exec(PyObject *m, ext_state *st);
/* File.stream(mode, offset=0, buffer_bytes=0, depth=0). */
PyObject *ext_stream_open(PyObject *file, PyObject *args, PyObject *kw);
/* Whether a stream of f is inside a call; closes f's streams (no commit). */
int ext_streams_busy(ext_file *f);
void ext_streams_close_all(ext_file *f);

/* ------------------------------------------------------------------ */
/* Tagged ops and queues (tagged.c)                                    */
/* ------------------------------------------------------------------ */

int ext_tagged_exec(PyObject *m, ext_state *st);

/* submit(ops, pending) and reap(max, min, timeout) on cq (see Handle's
 * docstrings). New reference, or NULL with an exception set. */
PyObject *ext_cq_submit(ext_handle *hd, ext_cq *cq, PyObject *ops, PyObject *pending);
PyObject *ext_cq_reap(ext_handle *hd, ext_cq *cq, PyObject *args, PyObject *kw);
/* Ops of cq accepted and not yet returned by reap(). */
uint32_t ext_cq_inflight(const ext_cq *cq);
/* After cq's ops have ended (its C queue destroyed, or the handle):
 * releases what they borrowed. Idempotent. */
void ext_cq_release(ext_cq *cq);

/* Handle.queue(): a Queue of its own. */
PyObject *ext_queue_new(ext_handle *hd);
/*
 * A closing handle, before anything else: detaches its Queue objects
 * (closed for every caller from then on; each held) and returns them;
 * after the C handle is destroyed, ext_queues_release drops their
 * borrows and the holds.
 */
ext_queue *ext_queues_detach(ext_handle *hd);
void ext_queues_release(ext_queue *list);

/* ------------------------------------------------------------------ */
/* The blocking runner (blocking.c)                                    */
/* ------------------------------------------------------------------ */

/*
 * Runs one blocking transfer on an open file: at most 8 MiB as one plain
 * call with the GIL released; more as ONE op on a private queue, waited
 * for in slices with the GIL released; between slices signal handlers
 * run (PyErr_CheckSignals), so Ctrl-C is seen promptly. When a handler
 * raises, the op is cancelled (pieces not started are skipped; pieces in
 * flight finish) and waited for until it has ended, so the memory is
 * never released under the kernel. A cancelled write leaves the bytes of
 * the pieces that ran, and a growing one the file at its old size
 * (libnvio shrinks back what a failed write grew); the file is marked
 * failed (an ATOMIC file then refuses to commit). iov (with iovcnt)
 * moves a vector (n: its total). Returns 0; a negative errno with *rec
 * describing the failure; or EXT_RAISED with a Python exception set.
 * Call with the GIL held.
 */
#define EXT_RAISED 1
int ext_run_sync(ext_handle *hd, nvio_file_t *f, const char *path, int is_write,
		 void *ptr, uint64_t n, int64_t off, unsigned flags,
		 const nvio_iovec_t *iov, uint32_t iovcnt, nvio_error_t *rec);

#endif
