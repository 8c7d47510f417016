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
 *   errors.c   NvioError and its errno subclasses; raising from a failure
 *   buffers.c  borrowing a buffer for one op; holds for async ops
 *   locked.c   LockedBuffer (nvio_mem_*), mem_query
 *   handle.c   the Handle type; handle configuration
 *   files.c    File (open files), tagged ops (Handle.submit/reap), Stream
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

/* The state of a module made from ext_moduledef. */
ext_state *ext_state_of(PyObject *module);

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

/* ------------------------------------------------------------------ */
/* Handle (handle.c)                                                   */
/* ------------------------------------------------------------------ */

int ext_handle_exec(PyObject *m, ext_state *st);

typedef struct ext_tag ext_tag;
typedef struct ext_file ext_file;

/*
 * A handle's tagged ops (files.c): what each accepted op borrows, in a
 * slot whose index + 1 is the op's C user_data, until reap() returns it.
 */
typedef struct {
	ext_tag **slot;		/* NULL where free */
	size_t cap;
	size_t *free;		/* free slot indices (a stack) */
	size_t nfree;
	size_t used;		/* slots [0, used) were handed out once */
} ext_tags;

typedef struct ext_waiter ext_waiter;

typedef struct {
	PyObject_HEAD
	nvio_handle_t *h;	/* NULL once closed */
	PyObject *module;	/* strong: keeps the state alive */
	int busy;		/* calls now running with the GIL released */
	ext_holds holds;
	ext_tags tags;
	ext_file *files;	/* open files (borrowed; each unlinks itself) */
	/* Blocking calls run as tagged ops of their own (ext_run_sync);
	 * whoever reaps hands their completions to them, and keeps the
	 * user's for reap() in the backlog. Touched only with the GIL. */
	ext_waiter *waiters;
	uint64_t next_waiter;
	uint32_t internal_inflight;	/* ops of waiters not yet reaped */
	nvio_completion_t *backlog;
	size_t nbacklog, capbacklog;
} ext_handle;

static inline ext_state *ext_handle_state(ext_handle *self)
{
	return ext_state_of(self->module);
}

/* 0 if the handle is open, else -1 with ValueError set. */
int ext_handle_check_open(ext_handle *self);

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

/* ------------------------------------------------------------------ */
/* Files, tagged ops and streams (files.c)                             */
/* ------------------------------------------------------------------ */

int ext_files_exec(PyObject *m, ext_state *st);

/*
 * Before the C handle is destroyed: closes every open file of the handle
 * (and their streams; an ATOMIC file not committed is abandoned), waiting
 * for their ops without the GIL. The handle must not be busy.
 */
void ext_files_close_all(ext_handle *self);
/* After the C handle is destroyed: releases what tagged ops borrowed. */
void ext_tags_release_all(ext_handle *self);

/*
 * Runs one blocking transfer on an open file as tagged ops of its own,
 * at most sync_chunk() bytes each (files.c: 64 MiB, less for psync) and
 * a few in flight, reaping them in short slices with the GIL released;
 * between slices signal handlers run (PyErr_CheckSignals), so Ctrl-C is
 * seen promptly. On a failure or an
 * exception from a handler no more is submitted, and the ops in flight
 * are waited for (without further signal checks: they are bounded)
 * before it returns, so the memory is never released under the kernel.
 * iov (with iovcnt) moves a vector as one op instead of ptr/n. A growing
 * write that fails or is interrupted is cut back to the old size.
 * Returns 0; a negative errno with *rec describing the failure; or
 * EXT_RAISED with a Python exception set. Call with the GIL held.
 */
#define EXT_RAISED 1
int ext_run_sync(ext_handle *hd, nvio_file_t *f, const char *path, int is_write,
		 void *ptr, uint64_t n, int64_t off, unsigned flags,
		 const nvio_iovec_t *iov, uint32_t iovcnt, nvio_error_t *rec);

/* Raises the NvioError of a failure record; returns NULL. */
PyObject *ext_raise_record(ext_state *st, const nvio_error_t *rec, PyObject *filename);

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

/* Handle methods defined in files.c. */
PyObject *ext_h_open(PyObject *self, PyObject *args, PyObject *kw);
PyObject *ext_h_open_fd(PyObject *self, PyObject *args, PyObject *kw);
PyObject *ext_h_submit(PyObject *self, PyObject *args, PyObject *kw);
PyObject *ext_h_reap(PyObject *self, PyObject *args, PyObject *kw);
PyObject *ext_h_completion_fd(PyObject *self, PyObject *unused);
PyObject *ext_h_get_inflight(PyObject *self, void *unused);

/* An NvioError instance (not raised) for a record; filename may be NULL.
 * New reference, or NULL with an exception set. */
PyObject *ext_error_from_record(ext_state *st, const nvio_error_t *e,
				PyObject *filename);

#endif
