/*
 * _nvio.c - the CPython extension of nvio.
 *
 * Built against the limited API of Python 3.11 (one abi3 wheel) and the
 * public C API of libnvio only (include/nvio.h). It never includes a
 * PyTorch, NumPy, DLPack or CUDA header: tensors are reached through
 * Python attribute calls, DLPack capsules through the small stable struct
 * below.
 *
 * Rules this file keeps:
 *   - The GIL is released around every call that may block.
 *   - An asynchronous op keeps its buffer (and file name) alive in a
 *     per-handle list of holds until the wait() that covers it returns,
 *     even when that wait raises, or until the handle is destroyed.
 *   - A handle is never destroyed while a thread is inside one of its
 *     calls: the method call holds a reference, and close() refuses while
 *     a call is in progress.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "nvio.h"

/* ------------------------------------------------------------------ */
/* Exceptions                                                          */
/* ------------------------------------------------------------------ */

static PyObject *NvioError;

/*
 * errno values that Python maps to a builtin OSError subclass get an
 * nvio class deriving from both NvioError and that builtin, so that
 * `except FileNotFoundError` and `except nvio.NvioError` both work.
 */
static struct {
	int err;
	const char *name;
	PyObject **base;
	PyObject *cls;
} errmap[] = {
	{ ENOENT, "nvio.NvioFileNotFoundError", &PyExc_FileNotFoundError, NULL },
	{ EEXIST, "nvio.NvioFileExistsError", &PyExc_FileExistsError, NULL },
	{ EACCES, "nvio.NvioPermissionError", &PyExc_PermissionError, NULL },
	{ EPERM, NULL, &PyExc_PermissionError, NULL },	/* shares EACCES's */
	{ EISDIR, "nvio.NvioIsADirectoryError", &PyExc_IsADirectoryError, NULL },
	{ ENOTDIR, "nvio.NvioNotADirectoryError", &PyExc_NotADirectoryError, NULL },
	{ EINTR, "nvio.NvioInterruptedError", &PyExc_InterruptedError, NULL },
	{ ETIMEDOUT, "nvio.NvioTimeoutError", &PyExc_TimeoutError, NULL },
	{ EAGAIN, "nvio.NvioBlockingIOError", &PyExc_BlockingIOError, NULL },
};
#define NERRMAP (sizeof(errmap) / sizeof(errmap[0]))

static PyObject *error_class(int err)
{
	for (size_t i = 0; i < NERRMAP; i++)
		if (errmap[i].err == err && errmap[i].cls)
			return errmap[i].cls;
	return NvioError;
}

static int init_errors(PyObject *m)
{
	NvioError = PyErr_NewExceptionWithDoc("nvio.NvioError",
		"An nvio operation failed.\n\n"
		"A subclass of OSError: errno, strerror and filename are set as\n"
		"usual; op (\"open\", \"pread\", \"pwrite\", \"validate\", ...),\n"
		"offset, nbytes, op_seq, is_write and fd describe the failing piece.",
		PyExc_OSError, NULL);
	if (!NvioError || PyModule_AddObjectRef(m, "NvioError", NvioError) < 0)
		return -1;
	for (size_t i = 0; i < NERRMAP; i++) {
		if (!errmap[i].name) {
			for (size_t j = 0; j < i; j++)
				if (*errmap[j].base == *errmap[i].base)
					errmap[i].cls = errmap[j].cls;
			continue;
		}
		PyObject *bases = PyTuple_Pack(2, NvioError, *errmap[i].base);
		if (!bases)
			return -1;
		errmap[i].cls = PyErr_NewException(errmap[i].name, bases, NULL);
		Py_DECREF(bases);
		if (!errmap[i].cls)
			return -1;
		if (PyModule_AddObjectRef(m, strchr(errmap[i].name, '.') + 1,
					  errmap[i].cls) < 0)
			return -1;
	}
	return 0;
}

static int set_attr_steal(PyObject *o, const char *name, PyObject *v)
{
	if (!v)
		return -1;
	int r = PyObject_SetAttrString(o, name, v);
	Py_DECREF(v);
	return r;
}

/*
 * Raises the exception for a failed nvio call (rc < 0). The details come
 * from nvio_last_error() when it describes this failure, else from what
 * the caller knows. `target` is the file name object the user gave (or
 * NULL for an fd op).
 */
static PyObject *raise_nvio(nvio_handle_t *h, int rc, PyObject *target, int fd,
			    int64_t offset, uint64_t nbytes, const char *op,
			    int is_write)
{
	static nvio_error_t e;	/* large; only touched with the GIL held */
	char msg[1536];
	int have = 0;

	memset(&e, 0, sizeof(e));
	e.struct_size = sizeof(e);
	if (h && nvio_last_error(h, &e) == rc && rc != 0)
		have = 1;
	if (have) {
		nvio_format_error(&e, msg, sizeof(msg));
	} else {
		char where[1100];
		const char *path = NULL;
		PyObject *b = NULL;
		if (target && PyUnicode_FSConverter(target, &b))
			path = PyBytes_AsString(b);
		else
			PyErr_Clear();
		if (path)
			snprintf(where, sizeof(where), "%s", path);
		else
			snprintf(where, sizeof(where), "fd %d", fd);
		Py_XDECREF(b);
		snprintf(msg, sizeof(msg), "%s of %llu bytes at offset %lld in %s failed: %s",
			 op, (unsigned long long)nbytes, (long long)offset, where,
			 nvio_strerror(rc));
	}

	PyObject *cls = error_class(-rc);
	/* file names are bytes: any that are not UTF-8 survive as escapes */
	PyObject *text = PyUnicode_DecodeFSDefault(msg);
	if (!text)
		return NULL;
	PyObject *exc = PyObject_CallFunction(cls, "iNO", -rc, text,
					      target ? target : Py_None);
	if (!exc)
		return NULL;
	if (set_attr_steal(exc, "op", PyUnicode_DecodeFSDefault(have ? e.what : op)) < 0 ||
	    set_attr_steal(exc, "offset", PyLong_FromLongLong(have ? e.offset : offset)) < 0 ||
	    set_attr_steal(exc, "nbytes", PyLong_FromUnsignedLongLong(have ? e.nbytes : nbytes)) < 0 ||
	    set_attr_steal(exc, "op_seq", PyLong_FromUnsignedLongLong(have ? e.op_seq : 0)) < 0 ||
	    set_attr_steal(exc, "is_write", PyBool_FromLong(have ? e.is_write : is_write)) < 0 ||
	    set_attr_steal(exc, "fd", (target || fd < 0) ? Py_NewRef(Py_None)
						      : PyLong_FromLong(fd)) < 0) {
		Py_DECREF(exc);
		return NULL;
	}
	PyErr_SetObject(cls, exc);
	Py_DECREF(exc);
	return NULL;
}

/* An error that belongs to no handle op (config, allocation, probe). */
static PyObject *raise_plain(int rc, const char *what)
{
	if (rc == -EINVAL) {
		PyErr_Format(PyExc_ValueError, "%s: %s", what, nvio_strerror(rc));
		return NULL;
	}
	char msg[512];
	snprintf(msg, sizeof(msg), "%s: %s", what, nvio_strerror(rc));
	PyObject *exc = PyObject_CallFunction(error_class(-rc), "is", -rc, msg);
	if (exc) {
		PyErr_SetObject(error_class(-rc), exc);
		Py_DECREF(exc);
	}
	return NULL;
}

/* ------------------------------------------------------------------ */
/* Buffers: buffer protocol, torch tensors, DLPack                     */
/* ------------------------------------------------------------------ */

/* The stable DLPack ABI (v0.x "dltensor" capsules), declared here. */
typedef struct {
	int32_t device_type;
	int32_t device_id;
} nv_dldevice;

typedef struct {
	uint8_t code;
	uint8_t bits;
	uint16_t lanes;
} nv_dldtype;

typedef struct {
	void *data;
	nv_dldevice device;
	int32_t ndim;
	nv_dldtype dtype;
	int64_t *shape;
	int64_t *strides;
	uint64_t byte_offset;
} nv_dltensor;

typedef struct nv_dlmanaged {
	nv_dltensor dl_tensor;
	void *manager_ctx;
	void (*deleter)(struct nv_dlmanaged *self);
} nv_dlmanaged;

#define NV_DL_CPU 1

static const char *dl_device_name(int t)
{
	switch (t) {
	case 1: return "cpu";
	case 2: return "cuda";
	case 3: return "cuda_host";
	case 4: return "opencl";
	case 7: return "vulkan";
	case 8: return "metal";
	case 9: return "vpi";
	case 10: return "rocm";
	case 11: return "rocm_host";
	case 13: return "cuda_managed";
	case 14: return "oneapi";
	default: return "unknown";
	}
}

/*
 * A buffer borrowed for one op. `view` is valid when has_view; `keep`
 * is a strong reference to whatever keeps the memory alive (the tensor,
 * or a capsule whose destructor calls the DLPack deleter).
 */
typedef struct {
	void *ptr;
	uint64_t nbytes;
	int has_view;
	Py_buffer view;
	PyObject *keep;
	PyObject *storage;	/* a tensor's storage, for async ops */
} nv_buf;

static void nv_buf_release(nv_buf *b)
{
	if (b->has_view) {
		PyBuffer_Release(&b->view);
		b->has_view = 0;
	}
	Py_CLEAR(b->keep);
	Py_CLEAR(b->storage);
}

static char zero_byte;	/* a valid address for empty buffers */

/*
 * Names looked up on every tensor, interned once (PyInit__nvio): a name
 * made from a C string on each call, and its hash, cost more than the
 * lookup itself. Together with the caches below this took buffer_info
 * on a torch tensor from 5.1 to 1.5 us.
 */
#define NAMES(X) X(data_ptr) X(element_size) X(is_contiguous) X(numel) \
	X(is_conj) X(is_neg) X(is_cpu) X(layout)
#define DECLARE(n) static PyObject *s_##n;
NAMES(DECLARE)
#undef DECLARE

static int names_init(void)
{
#define INTERN(n) if (!(s_##n = PyUnicode_InternFromString(#n))) return -1;
	NAMES(INTERN)
#undef INTERN
	return 0;
}

static PyObject *call0(PyObject *o, const char *name)
{
	return PyObject_CallMethod(o, name, NULL);
}

/* o.name(), true or not; dflt when o has no such method. */
static int get_bool_method(PyObject *o, PyObject *name, int dflt)
{
	PyObject *f = PyObject_GetAttr(o, name);
	if (!f) {
		if (!PyErr_ExceptionMatches(PyExc_AttributeError))
			return -1;
		PyErr_Clear();
		return dflt;
	}
	PyObject *r = PyObject_CallNoArgs(f);
	Py_DECREF(f);
	if (!r)
		return -1;
	int v = PyObject_IsTrue(r);
	Py_DECREF(r);
	return v;
}

static int get_u64_method(PyObject *o, PyObject *name, uint64_t *out)
{
	PyObject *r = PyObject_CallMethodObjArgs(o, name, NULL);
	if (!r)
		return -1;
	unsigned long long v = PyLong_AsUnsignedLongLong(r);
	Py_DECREF(r);
	if (v == (unsigned long long)-1 && PyErr_Occurred())
		return -1;
	*out = v;
	return 0;
}

/* 1 when o.name is True; 0 when it is anything else or missing; -1 on
 * any other error (it propagates). */
static int attr_is_true(PyObject *o, PyObject *name)
{
	PyObject *r = PyObject_GetAttr(o, name);
	if (!r) {
		if (!PyErr_ExceptionMatches(PyExc_AttributeError))
			return -1;
		PyErr_Clear();
		return 0;
	}
	int v = r == Py_True;
	Py_DECREF(r);
	return v;
}

static int has_tensor_methods(PyObject *o)
{
	return PyObject_HasAttr(o, s_data_ptr) &&
	       PyObject_HasAttr(o, s_element_size) &&
	       PyObject_HasAttr(o, s_is_contiguous) &&
	       PyObject_HasAttr(o, s_numel);
}

/*
 * Returns 1 if obj looks like a torch.Tensor (duck typing, no import):
 * it has the methods nvio calls. Types that have them are remembered,
 * the last few, with a reference so that an address is never reused for
 * another type while cached. Objects whose type lacks them (proxies,
 * methods set on the instance) are asked each time.
 */
static int is_torch_like(PyObject *obj)
{
	static PyObject *seen[8];
	static unsigned next;
	PyObject *type = (PyObject *)Py_TYPE(obj);

	for (unsigned i = 0; i < 8; i++)
		if (seen[i] == type)
			return 1;
	if (!has_tensor_methods(type))
		return has_tensor_methods(obj);
	unsigned i = next++ % 8;
	PyObject *old = seen[i];
	seen[i] = Py_NewRef(type);
	Py_XDECREF(old);
	return 1;
}

/*
 * torch.cuda.current_stream(device).synchronize(), after making sure this
 * process really has CUDA: otherwise the pointer would be taken for host
 * memory.
 */
static int cuda_sync_current_stream(PyObject *dev)
{
	PyObject *cuda = PyImport_ImportModule("torch.cuda");
	PyObject *stream, *avail, *r = NULL;
	int ok;

	if (!cuda)
		return -1;
	avail = call0(cuda, "is_available");
	ok = avail ? PyObject_IsTrue(avail) : -1;
	Py_XDECREF(avail);
	if (ok <= 0) {
		if (ok == 0)
			PyErr_Format(PyExc_RuntimeError,
				     "nvio: tensor on device '%S' but this process has no "
				     "usable CUDA (torch.cuda.is_available() is False)", dev);
		Py_DECREF(cuda);
		return -1;
	}
	stream = PyObject_CallMethod(cuda, "current_stream", "O", dev);
	Py_DECREF(cuda);
	if (stream) {
		r = call0(stream, "synchronize");
		Py_DECREF(stream);
	}
	Py_XDECREF(r);
	return r ? 0 : -1;
}

/*
 * The device of a tensor: 1 CPU, 2 CUDA, 0 unsupported (TypeError set),
 * -1 error. The is_cpu/is_cuda flags are cheap; the device object is
 * made only for the rare rest.
 */
static int torch_device(PyObject *obj)
{
	int cpu = attr_is_true(obj, s_is_cpu);
	if (cpu != 0)
		return cpu;
	PyObject *dev = PyObject_GetAttrString(obj, "device");
	if (!dev) {
		if (!PyErr_ExceptionMatches(PyExc_AttributeError))
			return -1;
		PyErr_Clear();
		return 1;	/* a duck type with no devices: host memory
				 * (libnvio itself finds CUDA pointers) */
	}
	PyObject *dtype_name = PyObject_GetAttrString(dev, "type");
	if (!dtype_name) {
		Py_DECREF(dev);
		return -1;
	}
	int is_cpu = PyUnicode_Check(dtype_name) &&
		     PyUnicode_CompareWithASCIIString(dtype_name, "cpu") == 0;
	int is_cuda = PyUnicode_Check(dtype_name) &&
		      PyUnicode_CompareWithASCIIString(dtype_name, "cuda") == 0;
	Py_DECREF(dtype_name);
	if (!is_cpu && !is_cuda) {
		PyErr_Format(PyExc_TypeError,
			     "nvio: tensor on device '%S' is not supported; "
			     "use a CPU or CUDA tensor", dev);
		Py_DECREF(dev);
		return 0;
	}
	/*
	 * Kernels that produce a CUDA tensor run asynchronously on torch's
	 * current stream: let them finish before nvio copies the memory. (nvio
	 * finds device memory through the CUDA driver torch has loaded.)
	 */
	if (is_cuda && cuda_sync_current_stream(dev) < 0) {
		Py_DECREF(dev);
		return -1;
	}
	Py_DECREF(dev);
	return is_cuda ? 2 : 1;
}

/* 1 when the tensor's layout is torch.strided (dense), 0 if not, -1 error. */
static int torch_strided(PyObject *obj)
{
	static PyObject *strided;	/* torch.strided, once seen */
	PyObject *layout = PyObject_GetAttr(obj, s_layout);

	if (!layout) {
		if (!PyErr_ExceptionMatches(PyExc_AttributeError))
			return -1;
		PyErr_Clear();
		return 1;	/* a duck type without layouts */
	}
	if (layout == strided) {
		Py_DECREF(layout);
		return 1;
	}
	PyObject *s = PyObject_Str(layout);
	if (!s) {
		Py_DECREF(layout);
		return -1;
	}
	int yes = PyUnicode_CompareWithASCIIString(s, "torch.strided") == 0;
	if (yes && !strided)
		strided = Py_NewRef(layout);
	else if (!yes)
		PyErr_Format(PyExc_ValueError,
			     "nvio: tensor layout %S is not supported; "
			     "only dense (strided) tensors", s);
	Py_DECREF(s);
	Py_DECREF(layout);
	return yes;
}

static int torch_get(PyObject *obj, nv_buf *b)
{
	if (torch_device(obj) <= 0 || torch_strided(obj) <= 0)
		return -1;

	int c = get_bool_method(obj, s_is_contiguous, 1);
	if (c < 0)
		return -1;
	if (!c) {
		PyErr_SetString(PyExc_ValueError,
				"nvio: tensor is not contiguous; call .contiguous() first");
		return -1;
	}
	int lazy = get_bool_method(obj, s_is_conj, 0);
	if (lazy == 0)
		lazy = get_bool_method(obj, s_is_neg, 0);
	if (lazy < 0)
		return -1;
	if (lazy) {
		PyErr_SetString(PyExc_ValueError,
				"nvio: tensor has a lazy conjugate/negative bit; "
				"call .resolve_conj().resolve_neg() first");
		return -1;
	}

	uint64_t numel, esize;
	if (get_u64_method(obj, s_numel, &numel) < 0 ||
	    get_u64_method(obj, s_element_size, &esize) < 0)
		return -1;
	PyObject *p = PyObject_CallMethodObjArgs(obj, s_data_ptr, NULL);
	if (!p)
		return -1;
	void *ptr = PyLong_AsVoidPtr(p);
	Py_DECREF(p);
	if (!ptr && PyErr_Occurred())
		return -1;
	if (esize && numel > UINT64_MAX / esize) {
		PyErr_SetString(PyExc_OverflowError, "nvio: tensor too large");
		return -1;
	}
	b->nbytes = numel * esize;
	if (!ptr && b->nbytes) {
		PyErr_SetString(PyExc_ValueError,
				"nvio: tensor has no storage (data_ptr() is 0)");
		return -1;
	}
	b->ptr = ptr ? ptr : &zero_byte;
	b->keep = Py_NewRef(obj);
	return 0;
}

static void dl_keeper_destructor(PyObject *cap)
{
	nv_dlmanaged *mt = PyCapsule_GetPointer(cap, "nvio.dltensor");
	if (mt && mt->deleter)
		mt->deleter(mt);
	else if (!mt)
		PyErr_Clear();
}

static int dlpack_get(PyObject *obj, nv_buf *b)
{
	if (PyObject_HasAttrString(obj, "__dlpack_device__")) {
		PyObject *d = call0(obj, "__dlpack_device__");
		if (!d)
			return -1;
		long dt = -1;
		if (PyTuple_Check(d) && PyTuple_Size(d) >= 1)
			dt = PyLong_AsLong(PyTuple_GetItem(d, 0));
		Py_DECREF(d);
		if (dt == -1 && PyErr_Occurred())
			return -1;
		if (dt != NV_DL_CPU) {
			PyErr_Format(PyExc_TypeError,
				     "nvio: DLPack device '%s' (%ld) is not supported yet; "
				     "only CPU (kDLCPU) buffers can be used",
				     dl_device_name((int)dt), dt);
			return -1;
		}
	}
	PyObject *cap = call0(obj, "__dlpack__");
	if (!cap)
		return -1;
	if (!PyCapsule_IsValid(cap, "dltensor")) {
		Py_DECREF(cap);
		PyErr_SetString(PyExc_TypeError,
				"nvio: __dlpack__() did not return a 'dltensor' capsule");
		return -1;
	}
	nv_dlmanaged *mt = PyCapsule_GetPointer(cap, "dltensor");
	if (!mt) {
		Py_DECREF(cap);
		return -1;
	}
	/* Consume it: from here on the deleter is ours to call. */
	if (PyCapsule_SetName(cap, "used_dltensor") < 0) {
		Py_DECREF(cap);
		return -1;
	}
	Py_DECREF(cap);
	PyObject *keeper = PyCapsule_New(mt, "nvio.dltensor", dl_keeper_destructor);
	if (!keeper) {
		if (mt->deleter)
			mt->deleter(mt);
		return -1;
	}

	nv_dltensor *t = &mt->dl_tensor;
	if (t->device.device_type != NV_DL_CPU) {
		PyErr_Format(PyExc_TypeError,
			     "nvio: DLPack device '%s' (%d) is not supported yet; "
			     "only CPU (kDLCPU) buffers can be used",
			     dl_device_name(t->device.device_type),
			     (int)t->device.device_type);
		Py_DECREF(keeper);
		return -1;
	}
	/* Bits per element: sub-byte types (int4, fp4) are packed, so the
	 * size is the total bit count rounded up, not a byte per element. */
	uint64_t ebits = (uint64_t)t->dtype.bits * (t->dtype.lanes ? t->dtype.lanes : 1);
	uint64_t n = 1;
	int64_t expect = 1;
	int contiguous = 1, overflow = 0;
	for (int i = t->ndim - 1; i >= 0; i--) {
		int64_t s = t->shape[i];
		if (s < 0) {
			contiguous = 0;
			break;
		}
		if (t->strides && s != 1 && t->strides[i] != expect)
			contiguous = 0;
		if (s && n > UINT64_MAX / (uint64_t)s)
			overflow = 1;
		expect = s && expect > INT64_MAX / s ? INT64_MAX : expect * s;
		n *= (uint64_t)s;
	}
	if (!overflow && ebits && n > UINT64_MAX / ebits)
		overflow = 1;
	if (overflow || !contiguous) {
		Py_DECREF(keeper);
		PyErr_SetString(overflow ? PyExc_OverflowError : PyExc_ValueError,
				overflow ? "nvio: DLPack tensor too large"
					 : "nvio: DLPack tensor is not C-contiguous");
		return -1;
	}
	b->nbytes = n * ebits / 8 + (n * ebits % 8 != 0);
	b->ptr = t->data ? (char *)t->data + t->byte_offset : NULL;
	if (!b->ptr && b->nbytes) {
		Py_DECREF(keeper);
		PyErr_SetString(PyExc_ValueError, "nvio: DLPack tensor has no data");
		return -1;
	}
	if (!b->ptr)
		b->ptr = &zero_byte;
	b->keep = keeper;
	return 0;
}

/*
 * 1 when obj's buffer holds Python object pointers (format 'O': NumPy
 * dtype=object, ctypes py_object): its bytes are not data, and a read
 * into them would crash the interpreter. The format comes from a second
 * request (a plain one cannot ask for it: memoryview refuses a format
 * without a shape); bytes and bytearray are known not to.
 */
static int holds_objects(PyObject *obj)
{
	Py_buffer probe;
	int yes;

	if (PyBytes_CheckExact(obj) || PyByteArray_CheckExact(obj))
		return 0;
	if (PyObject_GetBuffer(obj, &probe, PyBUF_FULL_RO) < 0) {
		PyErr_Clear();
		return 0;
	}
	yes = 0;	/* an 'O' code, not in a field's :name: */
	for (const char *f = probe.format, *in_name = NULL; f && *f; f++) {
		if (*f == ':')
			in_name = in_name ? NULL : f;
		else if (*f == 'O' && !in_name)
			yes = 1;
	}
	if (yes) {
		PyObject *tn = PyType_GetName(Py_TYPE(obj));
		PyErr_Format(PyExc_TypeError,
			     "nvio: buffer of %S holds Python objects (format '%s'), "
			     "not data", tn ? tn : Py_None, probe.format);
		Py_XDECREF(tn);
	}
	PyBuffer_Release(&probe);
	return yes;
}

static int view_get(PyObject *obj, int writable, nv_buf *b)
{
	if (holds_objects(obj))
		return -1;
	if (PyObject_GetBuffer(obj, &b->view, writable ? PyBUF_WRITABLE : PyBUF_SIMPLE) == 0) {
		b->has_view = 1;
		b->ptr = b->view.buf ? b->view.buf : &zero_byte;
		b->nbytes = (uint64_t)b->view.len;
		return 0;
	}
	/* Find out why, to say it clearly. */
	PyObject *et, *ev, *tb;
	PyErr_Fetch(&et, &ev, &tb);
	Py_buffer probe;
	if (PyObject_GetBuffer(obj, &probe, PyBUF_FULL_RO) == 0) {
		int contig = PyBuffer_IsContiguous(&probe, 'C');
		int ro = probe.readonly;
		PyBuffer_Release(&probe);
		if (!contig) {
			Py_XDECREF(et); Py_XDECREF(ev); Py_XDECREF(tb);
			PyErr_SetString(PyExc_ValueError,
					"nvio: buffer is not C-contiguous; make a contiguous copy first");
			return -1;
		}
		if (ro && writable) {
			Py_XDECREF(et); Py_XDECREF(ev); Py_XDECREF(tb);
			PyObject *tn = PyType_GetName(Py_TYPE(obj));
			PyErr_Format(PyExc_TypeError,
				     "nvio: cannot read into a read-only buffer (%S)",
				     tn ? tn : Py_None);
			Py_XDECREF(tn);
			return -1;
		}
	} else {
		PyErr_Clear();
	}
	PyErr_Restore(et, ev, tb);
	return -1;
}

/*
 * Borrows the memory of obj for one op: writable when the op stores
 * into it (a read). On success the caller must nv_buf_release(b).
 */
static int nv_buf_get(PyObject *obj, int writable, nv_buf *b)
{
	memset(b, 0, sizeof(*b));
	if (PyObject_CheckBuffer(obj))
		return view_get(obj, writable, b);
	if (is_torch_like(obj))
		return torch_get(obj, b);
	if (PyObject_HasAttrString(obj, "__dlpack__"))
		return dlpack_get(obj, b);
	PyObject *tn = PyType_GetName(Py_TYPE(obj));
	PyErr_Format(PyExc_TypeError,
		     "nvio: expected a tensor, an array or a buffer, not %S",
		     tn ? tn : Py_None);
	Py_XDECREF(tn);
	return -1;
}

/* ------------------------------------------------------------------ */
/* LockedBuffer: page-aligned (locked when allowed) nvio memory        */
/* ------------------------------------------------------------------ */

typedef struct {
	PyObject_HEAD
	void *ptr;
	Py_ssize_t size;	/* bytes exposed; the allocation is >= 1 */
	unsigned flags;
} LockedBufferObject;

static PyObject *LockedBuffer_Type;

static PyObject *lb_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "nbytes", "require_locked", NULL };
	long long n;
	int require = 0;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "L|p:LockedBuffer", kwlist, &n, &require))
		return NULL;
	if (n < 0) {
		PyErr_SetString(PyExc_ValueError, "nvio: nbytes must be >= 0");
		return NULL;
	}
	void *p = NULL;
	unsigned fl = 0;
	int rc;
	Py_BEGIN_ALLOW_THREADS
	rc = nvio_mem_alloc(&p, n ? (uint64_t)n : 1,
			    require ? NVIO_MEM_REQUIRE_LOCKED : 0, &fl);
	Py_END_ALLOW_THREADS
	if (rc < 0)
		return raise_plain(rc, "nvio_mem_alloc");
	allocfunc alloc = (allocfunc)PyType_GetSlot(type, Py_tp_alloc);
	LockedBufferObject *self = (LockedBufferObject *)alloc(type, 0);
	if (!self) {
		nvio_mem_free(p);
		return NULL;
	}
	self->ptr = p;
	self->size = (Py_ssize_t)n;
	self->flags = fl;
	return (PyObject *)self;
}

static void lb_dealloc(PyObject *o)
{
	LockedBufferObject *self = (LockedBufferObject *)o;
	PyTypeObject *tp = Py_TYPE(o);
	if (self->ptr) {
		nvio_mem_free(self->ptr);	/* the one and only free */
		self->ptr = NULL;
	}
	freefunc f = (freefunc)PyType_GetSlot(tp, Py_tp_free);
	f(o);
	Py_DECREF(tp);
}

static int lb_getbuffer(PyObject *o, Py_buffer *view, int flags)
{
	LockedBufferObject *self = (LockedBufferObject *)o;
	return PyBuffer_FillInfo(view, o, self->ptr, self->size, 0, flags);
}

static PyObject *lb_get_nbytes(PyObject *o, void *c)
{
	return PyLong_FromSsize_t(((LockedBufferObject *)o)->size);
}

static PyObject *lb_get_locked(PyObject *o, void *c)
{
	return PyBool_FromLong(((LockedBufferObject *)o)->flags & NVIO_MEM_LOCKED);
}

static PyObject *lb_get_address(PyObject *o, void *c)
{
	return PyLong_FromVoidPtr(((LockedBufferObject *)o)->ptr);
}

static Py_ssize_t lb_len(PyObject *o)
{
	return ((LockedBufferObject *)o)->size;
}

static PyGetSetDef lb_getset[] = {
	{ "nbytes", lb_get_nbytes, NULL, "Size in bytes.", NULL },
	{ "locked", lb_get_locked, NULL, "True if the pages are really locked (mlock).", NULL },
	{ "address", lb_get_address, NULL, "Address of the first byte.", NULL },
	{ NULL, NULL, NULL, NULL, NULL }
};

static PyType_Slot lb_slots[] = {
	{ Py_tp_new, lb_new },
	{ Py_tp_dealloc, lb_dealloc },
	{ Py_tp_getset, lb_getset },
	{ Py_bf_getbuffer, lb_getbuffer },
	{ Py_sq_length, lb_len },
	{ Py_tp_doc, "LockedBuffer(nbytes, require_locked=False)\n--\n\n"
		     "Page-aligned, zeroed host memory from nvio_mem_alloc, locked in RAM\n"
		     "when RLIMIT_MEMLOCK allows (see .locked). Exposes the buffer protocol;\n"
		     "the memory is freed exactly once, when the last reference (including\n"
		     "any tensor or memoryview made from it) goes away." },
	{ 0, NULL }
};

static PyType_Spec lb_spec = {
	"nvio._nvio.LockedBuffer", sizeof(LockedBufferObject), 0,
	Py_TPFLAGS_DEFAULT, lb_slots
};

/* ------------------------------------------------------------------ */
/* Handle                                                              */
/* ------------------------------------------------------------------ */

/* What an accepted asynchronous op borrows until a wait() covers it. */
typedef struct {
	uint64_t seq;
	nv_buf buf;
	PyObject *path;		/* the encoded file name, or NULL */
} hold;

typedef struct {
	PyObject_HEAD
	nvio_handle_t *h;
	int busy;		/* calls now running with the GIL released */
	hold **holds;		/* oldest first; seq strictly increasing */
	size_t nholds, capholds;
	uint64_t next_seq;
} HandleObject;

static PyObject *Handle_Type;

static void hold_free(hold *x)
{
	nv_buf_release(&x->buf);
	Py_XDECREF(x->path);
	PyMem_Free(x);
}

/* Releases every hold whose seq is below limit (all with UINT64_MAX). */
static void release_holds(HandleObject *self, uint64_t limit)
{
	size_t k = 0;
	while (k < self->nholds && self->holds[k]->seq < limit)
		k++;
	if (!k)
		return;
	/* Detach first: releasing may run arbitrary Python code. */
	hold **gone = PyMem_Malloc(k * sizeof(*gone));
	if (!gone) {
		/* Cannot detach safely; release in place, one at a time. */
		while (self->nholds && self->holds[0]->seq < limit) {
			hold *x = self->holds[0];
			memmove(self->holds, self->holds + 1,
				(self->nholds - 1) * sizeof(*self->holds));
			self->nholds--;
			hold_free(x);
		}
		return;
	}
	memcpy(gone, self->holds, k * sizeof(*gone));
	memmove(self->holds, self->holds + k, (self->nholds - k) * sizeof(*self->holds));
	self->nholds -= k;
	for (size_t i = 0; i < k; i++)
		hold_free(gone[i]);
	PyMem_Free(gone);
}

static int add_hold(HandleObject *self, hold *x)
{
	if (self->nholds == self->capholds) {
		size_t cap = self->capholds ? self->capholds * 2 : 16;
		hold **n = PyMem_Realloc(self->holds, cap * sizeof(*n));
		if (!n) {
			PyErr_NoMemory();
			return -1;
		}
		self->holds = n;
		self->capholds = cap;
	}
	x->seq = self->next_seq++;
	self->holds[self->nholds++] = x;
	return 0;
}

static int check_open(HandleObject *self)
{
	if (!self->h) {
		PyErr_SetString(PyExc_ValueError, "nvio: I/O operation on a closed handle");
		return -1;
	}
	return 0;
}

/*
 * Destroys the C handle (waiting for ops in flight), then drops holds.
 * While it waits, without the GIL, the handle counts as busy: another
 * thread's close() is refused instead of dropping the holds of ops that
 * are still running.
 */
static void handle_shutdown(HandleObject *self)
{
	nvio_handle_t *h = self->h;
	self->h = NULL;
	if (h) {
		self->busy++;
		Py_BEGIN_ALLOW_THREADS
		nvio_handle_destroy(h);
		Py_END_ALLOW_THREADS
		self->busy--;
	}
	release_holds(self, UINT64_MAX);
}

/* A name through one of libnvio's parsers; `what` names it in errors. */
static int parse_name(PyObject *o, int (*from_name)(const char *),
		      const char *what, int *out)
{
	Py_ssize_t len;
	const char *name = PyUnicode_AsUTF8AndSize(o, &len);
	char fmt[96];
	int v;

	if (!name)
		return -1;
	v = (size_t)len == strlen(name) ? from_name(name) : -EINVAL;	/* "psync\0x" */
	if (v < 0) {
		snprintf(fmt, sizeof(fmt), "nvio: unknown %s", what);
		PyErr_Format(PyExc_ValueError, fmt, name);
		return -1;
	}
	*out = v;
	return 0;
}

static int parse_engine(PyObject *o, int *out)
{
	if (!o || o == Py_None) {
		*out = NVIO_ENGINE_AUTO;
		return 0;
	}
	if (PyLong_Check(o) && !PyBool_Check(o)) {
		long v = PyLong_AsLong(o);
		if (v == -1 && PyErr_Occurred())
			return -1;
		if (v < 0 || v >= NVIO_ENGINE_COUNT_) {
			PyErr_Format(PyExc_ValueError, "nvio: unknown engine %ld", v);
			return -1;
		}
		*out = (int)v;
		return 0;
	}
	if (PyUnicode_Check(o))
		return parse_name(o, nvio_engine_from_name,
				  "engine '%s' (auto, io_uring, libaio, psync)", out);
	PyErr_SetString(PyExc_TypeError, "nvio: engine must be a name such as 'io_uring'");
	return -1;
}

static int parse_direct(PyObject *o, int *out)
{
	if (!o || o == Py_None) {
		*out = NVIO_DIRECT_AUTO;
		return 0;
	}
	if (PyBool_Check(o)) {
		*out = o == Py_True ? NVIO_DIRECT_ON : NVIO_DIRECT_OFF;
		return 0;
	}
	if (PyUnicode_Check(o))
		return parse_name(o, nvio_direct_from_name,
				  "direct mode '%s' (auto, on, off)", out);
	PyErr_SetString(PyExc_TypeError, "nvio: direct must be True, False, None or 'auto'/'on'/'off'");
	return -1;
}

static PyObject *handle_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "block_size", "queue_depth", "single_submit",
		"overlap_events", "intra_op_parallelism", "engine", "direct",
		"staging_bytes", "gds", NULL };
	long long block = NVIO_DEFAULT_BLOCK_SIZE, staging = 0;
	long long depth = NVIO_DEFAULT_QUEUE_DEPTH, par = 1;
	int single = 0, overlap = 0, gds = 0;
	PyObject *engine = NULL, *direct = NULL;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "|LLppL$OOLp:AioHandle", kwlist,
					 &block, &depth, &single, &overlap, &par,
					 &engine, &direct, &staging, &gds))
		return NULL;
	if (block <= 0 || depth <= 0 || par <= 0 || staging < 0 ||
	    depth > UINT32_MAX || par > UINT32_MAX) {
		PyErr_SetString(PyExc_ValueError,
				"nvio: block_size, queue_depth and intra_op_parallelism "
				"must be positive");
		return NULL;
	}
	nvio_config_t cfg;
	nvio_config_init(&cfg);
	cfg.block_size = (uint64_t)block;
	cfg.queue_depth = (uint32_t)depth;
	cfg.intra_op_parallelism = (uint32_t)par;
	cfg.single_submit = (uint32_t)single;
	cfg.overlap_events = (uint32_t)overlap;
	if (staging)
		cfg.staging_bytes = (uint64_t)staging;
	if (gds)
		cfg.flags |= NVIO_HANDLE_GDS;
	if (parse_engine(engine, &cfg.engine) < 0 || parse_direct(direct, &cfg.direct) < 0)
		return NULL;

	allocfunc alloc = (allocfunc)PyType_GetSlot(type, Py_tp_alloc);
	HandleObject *self = (HandleObject *)alloc(type, 0);
	if (!self)
		return NULL;
	self->next_seq = 1;
	nvio_handle_t *h = NULL;
	int rc;
	Py_BEGIN_ALLOW_THREADS
	rc = nvio_handle_create(&h, &cfg);
	Py_END_ALLOW_THREADS
	if (rc < 0) {
		Py_DECREF(self);
		if (rc == -EINVAL) {
			PyErr_Format(PyExc_ValueError,
				     "nvio: invalid handle configuration (block_size=%lld, "
				     "queue_depth=%lld, intra_op_parallelism=%lld, engine=%s): %s",
				     block, depth, par, nvio_engine_name(cfg.engine)
				     ? nvio_engine_name(cfg.engine) : "?", nvio_strerror(rc));
			return NULL;
		}
		char what[128];
		snprintf(what, sizeof(what), "nvio: cannot create a handle with engine %s",
			 nvio_engine_name(cfg.engine) ? nvio_engine_name(cfg.engine) : "?");
		return raise_plain(rc, what);
	}
	self->h = h;
	return (PyObject *)self;
}

static void handle_dealloc(PyObject *o)
{
	HandleObject *self = (HandleObject *)o;
	PyTypeObject *tp = Py_TYPE(o);
	handle_shutdown(self);	/* waits for ops in flight, then drops holds */
	PyMem_Free(self->holds);
	self->holds = NULL;
	freefunc f = (freefunc)PyType_GetSlot(tp, Py_tp_free);
	f(o);
	Py_DECREF(tp);
}

/*
 * Resolves the file target: a path (str, bytes, os.PathLike) or an open
 * descriptor (int, or the fd= keyword). *pathb gets the encoded path
 * (new reference) or NULL with *fd set.
 */
static int parse_target(PyObject *filename, PyObject *fdobj, PyObject **pathb,
			int *fd, PyObject **shown)
{
	*pathb = NULL;
	*fd = -1;
	*shown = NULL;
	if (filename == Py_None)
		filename = NULL;
	if (fdobj == Py_None)
		fdobj = NULL;
	if (filename && fdobj) {
		PyErr_SetString(PyExc_TypeError, "nvio: give a filename or fd=, not both");
		return -1;
	}
	if (!filename && !fdobj) {
		PyErr_SetString(PyExc_TypeError, "nvio: a filename (or fd=) is required");
		return -1;
	}
	PyObject *t = filename ? filename : fdobj;
	if (PyLong_Check(t)) {
		if (PyBool_Check(t)) {
			PyErr_SetString(PyExc_TypeError, "nvio: a file descriptor must be an int, not bool");
			return -1;
		}
		int overflow = 0;
		long v = PyLong_AsLongAndOverflow(t, &overflow);
		if (v == -1 && PyErr_Occurred())
			return -1;
		if (overflow || v < INT32_MIN || v > INT32_MAX) {
			PyErr_SetString(PyExc_OverflowError, "nvio: file descriptor out of range");
			return -1;
		}
		*fd = (int)v;
		return 0;
	}
	if (fdobj) {
		PyErr_SetString(PyExc_TypeError, "nvio: fd must be an int");
		return -1;
	}
	if (!PyUnicode_Check(t) && !PyBytes_Check(t) &&
	    !PyObject_HasAttrString(t, "__fspath__")) {
		PyObject *tn = PyType_GetName(Py_TYPE(t));
		PyErr_Format(PyExc_TypeError,
			     "nvio: filename must be str, bytes, os.PathLike or an int fd, not %S",
			     tn ? tn : Py_None);
		Py_XDECREF(tn);
		return -1;
	}
	if (!PyUnicode_FSConverter(t, pathb))
		return -1;
	*shown = t;
	return 0;
}

/*
 * A read stores into a torch tensor behind autograd's back: bump its
 * version counter, as torch's own in-place ops do, so that a backward
 * pass that saved the old values fails loudly instead of computing wrong
 * gradients. Only real tensors, only once torch is imported (a tensor
 * cannot exist before); inference tensors have no counter and are left
 * alone by torch. Never fails the read: its bytes have moved.
 */
static void torch_bump_version(PyObject *obj)
{
	static PyObject *tensor_type, *bump;
	if (!bump) {
		PyObject *name = PyUnicode_FromString("torch");
		PyObject *torch = name ? PyImport_GetModule(name) : NULL;
		Py_XDECREF(name);
		if (!torch) {
			PyErr_Clear();
			return;
		}
		PyObject *graph = PyImport_ImportModule("torch.autograd.graph");
		tensor_type = PyObject_GetAttrString(torch, "Tensor");
		bump = graph ? PyObject_GetAttrString(graph, "increment_version") : NULL;
		Py_DECREF(torch);
		Py_XDECREF(graph);
		if (!tensor_type || !bump) {
			Py_CLEAR(tensor_type);
			Py_CLEAR(bump);
			PyErr_Clear();
			return;
		}
	}
	int is = PyObject_IsInstance(obj, tensor_type);
	PyObject *r = is > 0 ? PyObject_CallFunctionObjArgs(bump, obj, NULL) : NULL;
	Py_XDECREF(r);
	if (is < 0 || (is > 0 && !r))
		PyErr_Clear();
}

/*
 * An async op on a tensor also holds its storage: the tensor alone does
 * not keep the memory (t.set_() or `param.data = ...` swaps it out while
 * the op still moves bytes). Duck types without storages are left as
 * they are.
 */
static int keep_storage(nv_buf *b, PyObject *obj)
{
	PyObject *st = PyObject_CallMethod(obj, "untyped_storage", NULL);
	if (!st) {
		if (!PyErr_ExceptionMatches(PyExc_AttributeError))
			return -1;
		PyErr_Clear();
		return 0;
	}
	b->storage = st;
	return 0;
}

enum { OP_READ, OP_WRITE, OP_READ_FILE, OP_WRITE_FILE };

/*
 * One I/O call. Returns 0 on success (with the op accepted or done),
 * or -1 with an exception set.
 */
static int do_io(HandleObject *self, int kind, PyObject *bufobj, PyObject *filename,
		 PyObject *fdobj, long long offset, unsigned flags)
{
	static const char *names[] = { "pread", "pwrite", "read", "write" };
	int is_write = kind == OP_WRITE || kind == OP_WRITE_FILE;
	if (check_open(self) < 0)
		return -1;
	if (offset < 0) {
		PyErr_Format(PyExc_ValueError, "nvio: file_offset must be >= 0, not %lld", offset);
		return -1;
	}
	PyObject *pathb, *shown;
	int fd;
	if (parse_target(filename, fdobj, &pathb, &fd, &shown) < 0)
		return -1;
	if ((kind == OP_READ_FILE || kind == OP_WRITE_FILE) && !pathb) {
		PyErr_SetString(PyExc_TypeError, "nvio: read()/write() need a filename, not an fd");
		return -1;
	}
	hold *x = PyMem_Calloc(1, sizeof(*x));
	if (!x) {
		Py_XDECREF(pathb);
		PyErr_NoMemory();
		return -1;
	}
	x->path = pathb;
	if (nv_buf_get(bufobj, !is_write, &x->buf) < 0) {
		hold_free(x);
		return -1;
	}
	/* a torch tensor (its own keeper): for async ops, its storage too */
	int torch = x->buf.keep == bufobj;
	if (torch && (flags & NVIO_ASYNC) && keep_storage(&x->buf, bufobj) < 0) {
		hold_free(x);
		return -1;
	}
	/* converting the arguments ran Python code: another thread may
	 * have closed the handle meanwhile */
	if (check_open(self) < 0) {
		hold_free(x);
		return -1;
	}
	const char *path = pathb ? PyBytes_AsString(pathb) : NULL;
	nvio_handle_t *h = self->h;
	void *ptr = x->buf.ptr;
	uint64_t n = x->buf.nbytes;
	int rc = 0, own_err = 0;	/* own_err: rc is the binding's */

	self->busy++;
	Py_BEGIN_ALLOW_THREADS
	switch (kind) {
	case OP_READ:
		rc = path ? nvio_pread(h, ptr, n, path, offset, flags)
			  : nvio_pread_fd(h, ptr, n, fd, offset, flags);
		break;
	case OP_WRITE:
		rc = path ? nvio_pwrite(h, ptr, n, path, offset, flags)
			  : nvio_pwrite_fd(h, ptr, n, fd, offset, flags);
		break;
	case OP_READ_FILE:
		if (offset == 0) {
			rc = nvio_read_file(h, ptr, n, path, NULL, flags);
		} else {
			int64_t sz = nvio_file_size(path);
			if (sz < 0) {
				rc = (int)sz;
				own_err = 1;
			} else {
				uint64_t left = (uint64_t)sz > (uint64_t)offset
					? (uint64_t)sz - (uint64_t)offset : 0;
				own_err = left > n;
				rc = left > n ? -EOVERFLOW
					      : nvio_pread(h, ptr, left, path, offset, flags);
			}
		}
		break;
	case OP_WRITE_FILE:
		rc = offset == 0 ? nvio_write_file(h, ptr, n, path, flags)
				 : nvio_pwrite(h, ptr, n, path, offset, flags);
		break;
	}
	Py_END_ALLOW_THREADS
	self->busy--;

	if (torch && !is_write && !(own_err && rc < 0))
		torch_bump_version(bufobj);
	if (rc < 0) {
		/* the handle's record describes this failure unless the
		 * binding made it (it would still hold an older one) */
		raise_nvio(own_err ? NULL : h, rc, shown, fd, offset, n,
			   names[kind], is_write);
		hold_free(x);
		return -1;
	}
	if (flags & NVIO_ASYNC) {
		if (add_hold(self, x) < 0) {
			/* The op is running: it must not lose its buffer. */
			int w;
			self->busy++;
			Py_BEGIN_ALLOW_THREADS
			w = nvio_wait(h);
			Py_END_ALLOW_THREADS
			self->busy--;
			(void)w;
			hold_free(x);
			return -1;
		}
		return 0;
	}
	hold_free(x);
	return 0;
}

static int resolve_async(PyObject *a, PyObject *b, int *out)
{
	if (a && b) {
		PyErr_SetString(PyExc_TypeError, "nvio: give async_op or async, not both");
		return -1;
	}
	PyObject *v = a ? a : b;
	int r = v ? PyObject_IsTrue(v) : 0;
	if (r < 0)
		return -1;
	*out = r;
	return 0;
}

static PyObject *rw_generic(HandleObject *self, PyObject *args, PyObject *kw, int kind)
{
	static char *kwlist[] = { "buffer", "filename", "validate", "async_op",
		"file_offset", "async", "fd", "fsync", NULL };
	PyObject *buf, *fn = Py_None, *a1 = NULL, *a2 = NULL, *fdobj = Py_None;
	int validate = 0, fs = 0, as;
	long long off = 0;
	if (!PyArg_ParseTupleAndKeywords(args, kw,
		kind == OP_READ ? "O|OpOL$OOp:pread" : "O|OpOL$OOp:pwrite", kwlist,
		&buf, &fn, &validate, &a1, &off, &a2, &fdobj, &fs))
		return NULL;
	if (resolve_async(a1, a2, &as) < 0)
		return NULL;
	if (fs && kind == OP_READ) {
		PyErr_SetString(PyExc_TypeError, "nvio: fsync applies to writes only");
		return NULL;
	}
	unsigned flags = (validate ? NVIO_VALIDATE : 0) | (as ? NVIO_ASYNC : 0) |
			 (fs ? NVIO_FSYNC : 0);
	if (do_io(self, kind, buf, fn, fdobj, off, flags) < 0)
		return NULL;
	return PyLong_FromLong(as ? 0 : 1);
}

static PyObject *h_pread(PyObject *s, PyObject *a, PyObject *k)
{
	return rw_generic((HandleObject *)s, a, k, OP_READ);
}

static PyObject *h_pwrite(PyObject *s, PyObject *a, PyObject *k)
{
	return rw_generic((HandleObject *)s, a, k, OP_WRITE);
}

static PyObject *rw_fixed(HandleObject *self, PyObject *args, PyObject *kw, int kind, int as)
{
	static char *kwlist[] = { "buffer", "filename", "file_offset", "fd",
		"validate", "fsync", NULL };
	PyObject *buf, *fn = Py_None, *fdobj = Py_None;
	long long off = 0;
	int validate = 0, fs = 0;
	static const char *const fmts[2][2] = {
		{ "O|OL$Opp:sync_pread", "O|OL$Opp:async_pread" },
		{ "O|OL$Opp:sync_pwrite", "O|OL$Opp:async_pwrite" },
	};
	if (!PyArg_ParseTupleAndKeywords(args, kw, fmts[kind == OP_WRITE][as != 0], kwlist,
					 &buf, &fn, &off, &fdobj, &validate, &fs))
		return NULL;
	if (fs && kind == OP_READ) {
		PyErr_SetString(PyExc_TypeError, "nvio: fsync applies to writes only");
		return NULL;
	}
	unsigned flags = (validate ? NVIO_VALIDATE : 0) | (as ? NVIO_ASYNC : 0) |
			 (fs ? NVIO_FSYNC : 0);
	if (do_io(self, kind, buf, fn, fdobj, off, flags) < 0)
		return NULL;
	return PyLong_FromLong(as ? 0 : 1);
}

static PyObject *h_sync_pread(PyObject *s, PyObject *a, PyObject *k)
{
	return rw_fixed((HandleObject *)s, a, k, OP_READ, 0);
}

static PyObject *h_sync_pwrite(PyObject *s, PyObject *a, PyObject *k)
{
	return rw_fixed((HandleObject *)s, a, k, OP_WRITE, 0);
}

static PyObject *h_async_pread(PyObject *s, PyObject *a, PyObject *k)
{
	return rw_fixed((HandleObject *)s, a, k, OP_READ, 1);
}

static PyObject *h_async_pwrite(PyObject *s, PyObject *a, PyObject *k)
{
	return rw_fixed((HandleObject *)s, a, k, OP_WRITE, 1);
}

static PyObject *file_rw(HandleObject *self, PyObject *args, PyObject *kw, int kind)
{
	static char *kwlist[] = { "buffer", "filename", "validate", "file_offset",
		"fsync", NULL };
	PyObject *buf, *fn;
	int validate = 0, fs = 0;
	long long off = 0;
	if (!PyArg_ParseTupleAndKeywords(args, kw, kind == OP_READ_FILE ? "OO|pL$p:read" :
					 "OO|pL$p:write", kwlist,
					 &buf, &fn, &validate, &off, &fs))
		return NULL;
	if (fs && kind == OP_READ_FILE) {
		PyErr_SetString(PyExc_TypeError, "nvio: fsync applies to writes only");
		return NULL;
	}
	unsigned flags = (validate ? NVIO_VALIDATE : 0) | (fs ? NVIO_FSYNC : 0);
	if (do_io(self, kind, buf, fn, NULL, off, flags) < 0)
		return NULL;
	return PyLong_FromLong(0);
}

static PyObject *h_read(PyObject *s, PyObject *a, PyObject *k)
{
	return file_rw((HandleObject *)s, a, k, OP_READ_FILE);
}

static PyObject *h_write(PyObject *s, PyObject *a, PyObject *k)
{
	return file_rw((HandleObject *)s, a, k, OP_WRITE_FILE);
}

static PyObject *h_wait(PyObject *s, PyObject *unused)
{
	HandleObject *self = (HandleObject *)s;
	if (check_open(self) < 0)
		return NULL;
	/* Every hold added before now belongs to an op this wait covers. */
	uint64_t limit = self->next_seq;
	nvio_handle_t *h = self->h;
	int rc;
	self->busy++;
	Py_BEGIN_ALLOW_THREADS
	rc = nvio_wait(h);
	Py_END_ALLOW_THREADS
	self->busy--;
	if (rc < 0) {
		/* Name the file of the failed op when the error record has one. */
		PyObject *target = NULL;
		nvio_error_t *e = PyMem_Malloc(sizeof(*e));
		if (e)
			e->struct_size = sizeof(*e);
		if (e && nvio_last_error(h, e) == rc && e->path[0] &&
		    strncmp(e->path, "fd ", 3) != 0) {
			target = PyUnicode_DecodeFSDefault(e->path);
			if (!target)
				PyErr_Clear();
		}
		PyMem_Free(e);
		raise_nvio(h, rc, target, -1, 0, 0, "wait", 0);
		Py_XDECREF(target);
		release_holds(self, limit);
		return NULL;
	}
	release_holds(self, limit);
	return PyLong_FromLong(rc);
}

static PyObject *h_pending(PyObject *s, PyObject *unused)
{
	HandleObject *self = (HandleObject *)s;
	if (check_open(self) < 0)
		return NULL;
	return PyLong_FromUnsignedLong(nvio_pending(self->h));
}

static PyObject *h_close(PyObject *s, PyObject *unused)
{
	HandleObject *self = (HandleObject *)s;
	if (self->busy) {
		PyErr_SetString(PyExc_RuntimeError,
				"nvio: cannot close a handle while another thread is using it");
		return NULL;
	}
	handle_shutdown(self);
	Py_RETURN_NONE;
}

static PyObject *h_enter(PyObject *s, PyObject *unused)
{
	if (check_open((HandleObject *)s) < 0)
		return NULL;
	return Py_NewRef(s);
}

static PyObject *h_exit(PyObject *s, PyObject *args)
{
	PyObject *r = h_close(s, NULL);
	if (!r)
		return NULL;
	Py_DECREF(r);
	Py_RETURN_FALSE;
}

#define GETTER(fname, expr)						\
	static PyObject *fname(PyObject *s, PyObject *unused)		\
	{								\
		HandleObject *self = (HandleObject *)s;			\
		if (check_open(self) < 0)				\
			return NULL;					\
		return expr;						\
	}

GETTER(h_get_block_size, PyLong_FromUnsignedLongLong(nvio_get_block_size(self->h)))
GETTER(h_get_queue_depth, PyLong_FromUnsignedLong(nvio_get_queue_depth(self->h)))
GETTER(h_get_single_submit, PyBool_FromLong(nvio_get_single_submit(self->h)))
GETTER(h_get_overlap_events, PyBool_FromLong(nvio_get_overlap_events(self->h)))
GETTER(h_get_intra_op_parallelism,
       PyLong_FromUnsignedLong(nvio_get_intra_op_parallelism(self->h)))
GETTER(h_get_alignment,
       PyLong_FromUnsignedLongLong(512ull * nvio_get_intra_op_parallelism(self->h)))

/* A C string as str; NULL (an unknown value) reads as `dflt`. */
static PyObject *str_or(const char *v, const char *dflt)
{
	return PyUnicode_FromString(v ? v : dflt);
}

GETTER(h_get_engine, str_or(nvio_engine_name(nvio_get_engine(self->h)), "unknown"))
GETTER(h_get_direct, str_or(nvio_direct_name(nvio_get_direct(self->h)), "unknown"))
GETTER(h_get_engine_note, str_or(nvio_get_engine_note(self->h), ""))
GETTER(h_uses_gds, PyBool_FromLong(nvio_get_gds(self->h) == 1))

static PyObject *config_dict(const nvio_config_t *c)
{
	const char *en = nvio_engine_name(c->engine);
	const char *dn = nvio_direct_name(c->direct);
	return Py_BuildValue("{sKsIsOsOsIsssssK}",
		"block_size", (unsigned long long)c->block_size,
		"queue_depth", (unsigned)c->queue_depth,
		"single_submit", c->single_submit ? Py_True : Py_False,
		"overlap_events", c->overlap_events ? Py_True : Py_False,
		"intra_op_parallelism", (unsigned)c->intra_op_parallelism,
		"engine", en ? en : "auto",
		"direct", dn ? dn : "auto",
		"staging_bytes", (unsigned long long)c->staging_bytes);
}

static PyObject *h_get_config(PyObject *s, PyObject *unused)
{
	HandleObject *self = (HandleObject *)s;
	if (check_open(self) < 0)
		return NULL;
	nvio_config_t c;
	memset(&c, 0, sizeof(c));
	c.struct_size = sizeof(c);
	int rc = nvio_handle_config(self->h, &c);
	if (rc < 0)
		return raise_plain(rc, "nvio_handle_config");
	return config_dict(&c);
}

static PyObject *h_save_tuned(PyObject *s, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "dir", "for_write", NULL };
	HandleObject *self = (HandleObject *)s;
	PyObject *dirb;
	int fw = 0;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "O&|p:save_tuned", kwlist,
					 PyUnicode_FSConverter, &dirb, &fw))
		return NULL;
	if (check_open(self) < 0) {
		Py_DECREF(dirb);
		return NULL;
	}
	nvio_config_t c;
	memset(&c, 0, sizeof(c));
	c.struct_size = sizeof(c);
	int rc = nvio_handle_config(self->h, &c);
	if (rc >= 0) {
		const char *d = PyBytes_AsString(dirb);
		Py_BEGIN_ALLOW_THREADS
		rc = nvio_config_save_tuned(&c, d, fw);
		Py_END_ALLOW_THREADS
	}
	Py_DECREF(dirb);
	if (rc < 0)
		return raise_plain(rc, "nvio_config_save_tuned");
	Py_RETURN_NONE;
}

static PyObject *h_get_closed(PyObject *s, void *c)
{
	return PyBool_FromLong(((HandleObject *)s)->h == NULL);
}

#define RW_DOC_TAIL \
	"buffer: a contiguous CPU torch.Tensor (any dtype), a NumPy array, any\n" \
	"object with the buffer protocol, or a DLPack producer on the CPU.\n" \
	"filename: str, bytes or os.PathLike; or an int file descriptor (also as\n" \
	"fd=), which is used as is and never closed.\n" \
	"Failures raise nvio.NvioError (an OSError) instead of returning -1.\n"

static PyMethodDef handle_methods[] = {
	{ "pread", (PyCFunction)(void (*)(void))h_pread, METH_VARARGS | METH_KEYWORDS,
	  "pread($self, buffer, filename, validate=False, async_op=False, file_offset=0, *, fd=None)\n--\n\n"
	  "Read len(buffer) bytes of the file at file_offset into buffer.\n"
	  "async_op (also accepted as async=, as in DeepSpeed) returns at submit; wait()\n"
	  "then reports the op. Returns 1 when done (sync) or 0 when queued (async).\n"
	  "Reading past the end of the file raises NvioError(ENODATA).\n" RW_DOC_TAIL },
	{ "pwrite", (PyCFunction)(void (*)(void))h_pwrite, METH_VARARGS | METH_KEYWORDS,
	  "pwrite($self, buffer, filename, validate=False, async_op=False, file_offset=0, *, fd=None, fsync=False)\n--\n\n"
	  "Write buffer to the file at file_offset. The file is created if missing and\n"
	  "never truncated. fsync=True makes the data durable before completion.\n"
	  "Returns 1 when done (sync) or 0 when queued (async).\n" RW_DOC_TAIL },
	{ "sync_pread", (PyCFunction)(void (*)(void))h_sync_pread, METH_VARARGS | METH_KEYWORDS,
	  "sync_pread($self, buffer, filename, file_offset=0, *, fd=None, validate=False)\n--\n\n"
	  "Blocking pread; returns 1.\n" RW_DOC_TAIL },
	{ "sync_pwrite", (PyCFunction)(void (*)(void))h_sync_pwrite, METH_VARARGS | METH_KEYWORDS,
	  "sync_pwrite($self, buffer, filename, file_offset=0, *, fd=None, validate=False, fsync=False)\n--\n\n"
	  "Blocking pwrite; returns 1.\n" RW_DOC_TAIL },
	{ "async_pread", (PyCFunction)(void (*)(void))h_async_pread, METH_VARARGS | METH_KEYWORDS,
	  "async_pread($self, buffer, filename, file_offset=0, *, fd=None, validate=False)\n--\n\n"
	  "Queue a read and return 0; wait() reports it. The buffer is kept alive\n"
	  "until then; do not touch its contents before wait().\n" RW_DOC_TAIL },
	{ "async_pwrite", (PyCFunction)(void (*)(void))h_async_pwrite, METH_VARARGS | METH_KEYWORDS,
	  "async_pwrite($self, buffer, filename, file_offset=0, *, fd=None, validate=False, fsync=False)\n--\n\n"
	  "Queue a write and return 0; wait() reports it. The buffer is kept alive\n"
	  "until then; do not modify it before wait().\n" RW_DOC_TAIL },
	{ "read", (PyCFunction)(void (*)(void))h_read, METH_VARARGS | METH_KEYWORDS,
	  "read($self, buffer, filename, validate=False, file_offset=0)\n--\n\n"
	  "Blocking read of the whole file (from file_offset) into buffer, which must\n"
	  "be at least that large (else NvioError(EOVERFLOW)). Returns 0.\n" },
	{ "write", (PyCFunction)(void (*)(void))h_write, METH_VARARGS | METH_KEYWORDS,
	  "write($self, buffer, filename, validate=False, file_offset=0, *, fsync=False)\n--\n\n"
	  "Blocking write of the whole buffer. With file_offset=0 the file is replaced\n"
	  "atomically (temporary file + rename); otherwise it is a pwrite. Returns 0.\n" },
	{ "wait", h_wait, METH_NOARGS,
	  "wait($self)\n--\n\n"
	  "Block until every queued op has ended. Returns the number of ops completed\n"
	  "since the previous wait (0 if none). If any failed, raises NvioError for\n"
	  "the first failure; every op has ended either way and its buffer is released.\n" },
	{ "uses_gds", h_uses_gds, METH_NOARGS,
	  "uses_gds($self)\n--\n\nTrue if CUDA tensors on this handle go through cuFile." },
	{ "pending", h_pending, METH_NOARGS,
	  "pending($self)\n--\n\nNumber of queued ops not yet reported by wait()." },
	{ "close", h_close, METH_NOARGS,
	  "close($self)\n--\n\nWait for ops in flight, then free the handle. Idempotent." },
	{ "__enter__", h_enter, METH_NOARGS, NULL },
	{ "__exit__", h_exit, METH_VARARGS, NULL },
	{ "get_block_size", h_get_block_size, METH_NOARGS, "get_block_size($self)\n--\n\n" },
	{ "get_queue_depth", h_get_queue_depth, METH_NOARGS, "get_queue_depth($self)\n--\n\n" },
	{ "get_single_submit", h_get_single_submit, METH_NOARGS, "get_single_submit($self)\n--\n\n" },
	{ "get_overlap_events", h_get_overlap_events, METH_NOARGS, "get_overlap_events($self)\n--\n\n" },
	{ "get_intra_op_parallelism", h_get_intra_op_parallelism, METH_NOARGS,
	  "get_intra_op_parallelism($self)\n--\n\n" },
	{ "get_alignment", h_get_alignment, METH_NOARGS,
	  "get_alignment($self)\n--\n\n512 * intra_op_parallelism, as in DeepSpeed "
	  "(nvio itself needs no alignment)." },
	{ "get_engine", h_get_engine, METH_NOARGS,
	  "get_engine($self)\n--\n\nThe engine in use: 'io_uring', 'libaio' or 'psync'." },
	{ "get_direct", h_get_direct, METH_NOARGS,
	  "get_direct($self)\n--\n\nThe direct I/O policy: 'auto', 'on' or 'off'." },
	{ "get_engine_note", h_get_engine_note, METH_NOARGS,
	  "get_engine_note($self)\n--\n\nWhy this engine and direct mode were chosen." },
	{ "get_config", h_get_config, METH_NOARGS,
	  "get_config($self)\n--\n\nThe configuration in force, as a dict." },
	{ "save_tuned", (PyCFunction)(void (*)(void))h_save_tuned, METH_VARARGS | METH_KEYWORDS,
	  "save_tuned($self, dir, for_write=False)\n--\n\n"
	  "Save this handle's configuration as the tuned entry for dir." },
	{ NULL, NULL, 0, NULL }
};

static PyGetSetDef handle_getset[] = {
	{ "closed", h_get_closed, NULL, "True once close() was called.", NULL },
	{ NULL, NULL, NULL, NULL, NULL }
};

static PyType_Slot handle_slots[] = {
	{ Py_tp_new, handle_new },
	{ Py_tp_dealloc, handle_dealloc },
	{ Py_tp_methods, handle_methods },
	{ Py_tp_getset, handle_getset },
	{ Py_tp_doc, "Handle(block_size=1048576, queue_depth=128, single_submit=False, "
		     "overlap_events=False, intra_op_parallelism=1, *, engine='auto', "
		     "direct='auto', staging_bytes=0)\n--\n\n"
		     "An nvio I/O handle (DeepNVMe aio_handle compatible)." },
	{ 0, NULL }
};

static PyType_Spec handle_spec = {
	"nvio._nvio.Handle", sizeof(HandleObject), 0,
	Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE, handle_slots
};

/* ------------------------------------------------------------------ */
/* Module functions                                                    */
/* ------------------------------------------------------------------ */

static PyObject *m_engine_available(PyObject *m, PyObject *arg)
{
	int e;
	if (parse_engine(arg, &e) < 0)
		return NULL;
	char why[256] = "";
	int r = nvio_engine_available(e, why, sizeof(why));
	if (r < 0)
		return raise_plain(r, "nvio_engine_available");
	return Py_BuildValue("(Os)", r ? Py_True : Py_False, why);
}

static PyObject *m_strerror(PyObject *m, PyObject *arg)
{
	long e = PyLong_AsLong(arg);
	if (e == -1 && PyErr_Occurred())
		return NULL;
	if (e > INT_MAX || e < -INT_MAX)	/* no errno; not another's */
		return PyUnicode_FromString(nvio_strerror(INT_MIN));
	return PyUnicode_FromString(nvio_strerror(e > 0 ? (int)-e : (int)e));
}

static PyObject *m_file_size(PyObject *m, PyObject *arg)
{
	PyObject *b;
	if (!PyUnicode_FSConverter(arg, &b))
		return NULL;
	int64_t r;
	const char *p = PyBytes_AsString(b);
	Py_BEGIN_ALLOW_THREADS
	r = nvio_file_size(p);
	Py_END_ALLOW_THREADS
	if (r < 0) {
		raise_nvio(NULL, (int)r, arg, -1, 0, 0, "stat", 0);
		Py_DECREF(b);
		return NULL;
	}
	Py_DECREF(b);
	return PyLong_FromLongLong(r);
}

static PyObject *m_mem_query(PyObject *m, PyObject *args)
{
	PyObject *po;
	unsigned long long n;
	if (!PyArg_ParseTuple(args, "OK:mem_query", &po, &n))
		return NULL;
	void *p = PyLong_AsVoidPtr(po);
	if (!p && PyErr_Occurred())
		return NULL;
	return PyLong_FromUnsignedLong(nvio_mem_query(p, n));
}

static PyObject *m_buffer_info(PyObject *m, PyObject *args)
{
	PyObject *o;
	int writable = 0;
	if (!PyArg_ParseTuple(args, "O|p:buffer_info", &o, &writable))
		return NULL;
	nv_buf b;
	if (nv_buf_get(o, writable, &b) < 0)
		return NULL;
	PyObject *r = Py_BuildValue("(NK)", PyLong_FromVoidPtr(b.ptr),
				    (unsigned long long)b.nbytes);
	nv_buf_release(&b);
	return r;
}

static PyObject *m_load_tuned(PyObject *m, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "dir", "for_write", NULL };
	PyObject *dirb;
	int fw = 0;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "O&|p:load_tuned", kwlist,
					 PyUnicode_FSConverter, &dirb, &fw))
		return NULL;
	nvio_config_t c;
	nvio_config_init(&c);
	int r;
	const char *d = PyBytes_AsString(dirb);
	Py_BEGIN_ALLOW_THREADS
	r = nvio_config_load_tuned(&c, d, fw);
	Py_END_ALLOW_THREADS
	Py_DECREF(dirb);
	if (r < 0)
		return raise_plain(r, "nvio_config_load_tuned");
	if (r == 0)
		Py_RETURN_NONE;
	return config_dict(&c);
}

static PyObject *m_probe(PyObject *m, PyObject *args)
{
	PyObject *dir = Py_None, *dirb = NULL;
	if (!PyArg_ParseTuple(args, "|O:probe", &dir))
		return NULL;
	if (dir != Py_None && !PyUnicode_FSConverter(dir, &dirb))
		return NULL;
	nvio_probe_t *p = PyMem_Calloc(1, sizeof(*p));
	if (!p) {
		Py_XDECREF(dirb);
		return PyErr_NoMemory();
	}
	p->struct_size = sizeof(*p);
	const char *d = dirb ? PyBytes_AsString(dirb) : NULL;
	int r;
	Py_BEGIN_ALLOW_THREADS
	r = nvio_probe(d, p);
	Py_END_ALLOW_THREADS
	Py_XDECREF(dirb);
	if (r < 0) {
		PyMem_Free(p);
		return raise_plain(r, "nvio_probe");
	}
	PyObject *engines = PyDict_New();
	for (int i = 1; engines && i < NVIO_ENGINE_COUNT_; i++) {
		PyObject *v = Py_BuildValue("(Os)", p->engine_ok[i] ? Py_True : Py_False,
					    p->engine_why[i]);
		if (!v || PyDict_SetItemString(engines, nvio_engine_name(i), v) < 0) {
			Py_XDECREF(v);
			Py_CLEAR(engines);
			break;
		}
		Py_DECREF(v);
	}
	PyObject *res = NULL;
	if (engines)
		res = Py_BuildValue("{sOsisIsIsIsssssKsKsKsOsNsOsisisssOsiss}",
			"direct_ok", p->direct_ok ? Py_True : Py_False,
			"direct_err", p->direct_err,
			"dio_mem_align", p->dio_mem_align,
			"dio_offset_align", p->dio_offset_align,
			"fs_block_size", p->fs_block_size,
			"fs_type", p->fs_type,
			"device", p->device,
			"fs_free_bytes", (unsigned long long)p->fs_free_bytes,
			"memlock_cur", (unsigned long long)p->memlock_cur,
			"memlock_max", (unsigned long long)p->memlock_max,
			"can_lock_unlimited", p->can_lock_unlimited ? Py_True : Py_False,
			"engines", engines,
			"cuda_found", p->cuda_found ? Py_True : Py_False,
			"cuda_device_count", p->cuda_device_count,
			"cuda_driver_version", p->cuda_driver_version,
			"cuda_why", p->cuda_why,
			"cufile_found", p->cufile_found ? Py_True : Py_False,
			"cufile_mode", p->cufile_mode,
			"cufile_why", p->cufile_why);
	PyMem_Free(p);
	return res;
}

static PyObject *m_gds_mode(PyObject *m, PyObject *unused)
{
	char why[256];
	int mode;

	Py_BEGIN_ALLOW_THREADS
	mode = nvio_gds_mode(why, sizeof(why));
	Py_END_ALLOW_THREADS
	return Py_BuildValue("(ss)", mode == NVIO_CUFILE_DIRECT ? "direct" :
			     mode == NVIO_CUFILE_COMPAT ? "compat" : "none", why);
}

static PyObject *m_gds_register(PyObject *m, PyObject *args)
{
	unsigned long long addr, n;
	int rc;

	if (!PyArg_ParseTuple(args, "KK:gds_register", &addr, &n))
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	rc = nvio_gds_register((void *)(uintptr_t)addr, n);
	Py_END_ALLOW_THREADS
	if (rc < 0)
		return raise_plain(rc, "nvio: cannot register the tensor with cuFile");
	Py_RETURN_NONE;
}

static PyObject *m_gds_deregister(PyObject *m, PyObject *arg)
{
	unsigned long long addr = PyLong_AsUnsignedLongLong(arg);
	int rc;

	if (addr == (unsigned long long)-1 && PyErr_Occurred())
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	rc = nvio_gds_deregister((void *)(uintptr_t)addr);
	Py_END_ALLOW_THREADS
	if (rc < 0)
		return raise_plain(rc, "nvio: cannot deregister the tensor from cuFile");
	Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
	{ "gds_mode", m_gds_mode, METH_NOARGS,
	  "gds_mode()\n--\n\n(mode, why): 'direct' (GPUDirect), 'compat' (cuFile compatibility\n"
	  "mode) or 'none' (GDS handles use bounce buffers), and the reason." },
	{ "gds_register", m_gds_register, METH_VARARGS,
	  "gds_register(address, nbytes)\n--\n\nRegister device memory with cuFile." },
	{ "gds_deregister", m_gds_deregister, METH_O,
	  "gds_deregister(address)\n--\n\nUndo gds_register." },
	{ "engine_available", m_engine_available, METH_O,
	  "engine_available(engine)\n--\n\n(available, why) for 'io_uring', 'libaio' or 'psync'." },
	{ "strerror", m_strerror, METH_O,
	  "strerror(err)\n--\n\nnvio's description of an errno value." },
	{ "file_size", m_file_size, METH_O,
	  "file_size(path)\n--\n\nSize of a file in bytes." },
	{ "mem_query", m_mem_query, METH_VARARGS,
	  "mem_query(address, nbytes)\n--\n\nNVIO_MEM_* flags of a memory range." },
	{ "buffer_info", m_buffer_info, METH_VARARGS,
	  "buffer_info(buffer, writable=False)\n--\n\n(address, nbytes) of what nvio would use." },
	{ "load_tuned", (PyCFunction)(void (*)(void))m_load_tuned, METH_VARARGS | METH_KEYWORDS,
	  "load_tuned(dir, for_write=False)\n--\n\nThe tuned configuration saved for dir, or None." },
	{ "probe", m_probe, METH_VARARGS,
	  "probe(dir=None)\n--\n\nWhat this machine (and dir) support, as a dict." },
	{ NULL, NULL, 0, NULL }
};

static struct PyModuleDef moduledef = {
	PyModuleDef_HEAD_INIT, "nvio._nvio",
	"The C extension of nvio; use the nvio package instead.",
	-1, module_methods, NULL, NULL, NULL, NULL
};

PyMODINIT_FUNC PyInit__nvio(void)
{
	PyObject *m = PyModule_Create(&moduledef);
	if (!m)
		return NULL;
	if (names_init() < 0 || init_errors(m) < 0)
		goto fail;
	LockedBuffer_Type = PyType_FromSpec(&lb_spec);
	if (!LockedBuffer_Type || PyModule_AddObjectRef(m, "LockedBuffer", LockedBuffer_Type) < 0)
		goto fail;
	Handle_Type = PyType_FromSpec(&handle_spec);
	if (!Handle_Type || PyModule_AddObjectRef(m, "Handle", Handle_Type) < 0)
		goto fail;
	if (PyModule_AddIntConstant(m, "MEM_LOCKED", NVIO_MEM_LOCKED) < 0 ||
	    PyModule_AddIntConstant(m, "MEM_NVIO", NVIO_MEM_NVIO) < 0 ||
	    PyModule_AddIntConstant(m, "VERSION_NUM", (long)nvio_version()) < 0 ||
	    PyModule_AddStringConstant(m, "version_string", nvio_version_string()) < 0 ||
	    PyModule_AddIntConstant(m, "HEADER_VERSION_NUM", NVIO_VERSION_NUM) < 0)
		goto fail;
	return m;
fail:
	Py_DECREF(m);
	return NULL;
}
