/*
 * buffers.c - borrowing a caller's memory for one op, and holding it for
 * an async op until a wait() covers it.
 *
 * Accepted: any object with the buffer protocol (bytes for writes,
 * bytearray, memoryview, NumPy arrays, LockedBuffer), torch tensors
 * (duck typed: the methods nvio calls, no import) on the CPU or CUDA, and
 * DLPack producers on the CPU. Always C-contiguous memory: nvio never
 * copies a whole buffer, so it refuses what it would have to copy.
 *
 * Contracts:
 *   - An ext_buf owns what keeps the memory alive (a buffer view, the
 *     tensor and for async ops its storage, or the DLPack capsule) until
 *     ext_buf_release().
 *   - Memory that holds Python object pointers (buffer format 'O') is
 *     refused: a read into it would crash the interpreter.
 *   - A hold owns its ext_buf and encoded path; handle.c adds one per
 *     accepted async op and releases it after the wait() that covers it.
 */
#include "ext.h"

#include <stdint.h>
#include <string.h>

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

void ext_buf_release(ext_buf *b)
{
	if (b->has_view) {
		PyBuffer_Release(&b->view);
		b->has_view = 0;
	}
	Py_CLEAR(b->keep);
	Py_CLEAR(b->storage);
}

static char zero_byte;	/* a valid address for empty buffers */

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

/* *out = the int r (a new reference, taken; NULL: an error is set). */
static int take_u64(PyObject *r, uint64_t *out)
{
	if (!r)
		return -1;
	unsigned long long v = PyLong_AsUnsignedLongLong(r);
	Py_DECREF(r);
	if (v == (unsigned long long)-1 && PyErr_Occurred())
		return -1;
	*out = v;
	return 0;
}

static int get_u64_method(PyObject *o, PyObject *name, uint64_t *out)
{
	return take_u64(PyObject_CallMethodObjArgs(o, name, NULL), out);
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

static int has_tensor_methods(ext_state *st, PyObject *o)
{
	return PyObject_HasAttr(o, st->s_data_ptr) &&
	       PyObject_HasAttr(o, st->s_element_size) &&
	       PyObject_HasAttr(o, st->s_is_contiguous) &&
	       PyObject_HasAttr(o, st->s_numel);
}

/*
 * torch.Tensor once torch is imported (borrowed from the state), NULL
 * without an exception before: no tensor can exist then. A failed
 * lookup (torch half imported) is NULL too, and is asked again later.
 */
static PyObject *torch_tensor_type(ext_state *st)
{
	if (st->torch_tensor_type)
		return st->torch_tensor_type;
	PyObject *name = PyUnicode_FromString("torch");
	PyObject *torch = name ? PyImport_GetModule(name) : NULL;
	Py_XDECREF(name);
	if (torch) {
		PyObject *t = PyObject_GetAttrString(torch, "Tensor");
		Py_DECREF(torch);
		if (t && PyType_Check(t))
			st->torch_tensor_type = t;
		else
			Py_XDECREF(t);
	}
	PyErr_Clear();
	return st->torch_tensor_type;
}

/*
 * What obj is: 2 a torch.Tensor (its type is a subclass), 1 something
 * that looks like one (duck typing: it has the methods nvio calls), 0
 * neither. Both kinds of type are remembered, the last few, with a
 * reference so that an address is never reused for another type while
 * cached; what is remembered is only what the type says (never a
 * tensor's values: its device, layout, size and contiguity are asked
 * each time). A type's bases cannot change so that it stops or starts
 * being a torch.Tensor subclass (CPython refuses a __bases__ assignment
 * that changes the instance layout). Objects whose type lacks the methods
 * (proxies, methods set on the instance) are asked each time.
 */
static int is_torch_like(ext_state *st, PyObject *obj)
{
	PyObject **seen = st->torch_types;
	PyObject *type = (PyObject *)Py_TYPE(obj);

	for (unsigned i = 0; i < EXT_TORCH_TYPES; i++)
		if (seen[i] == type)
			return st->torch_real[i] ? 2 : 1;
	PyObject *tensor = torch_tensor_type(st);
	int real = tensor && PyType_IsSubtype(Py_TYPE(obj), (PyTypeObject *)tensor);
	if (!real && !has_tensor_methods(st, type))
		return has_tensor_methods(st, obj);
	unsigned i = st->torch_types_next++ % EXT_TORCH_TYPES;
	PyObject *old = seen[i];
	seen[i] = Py_NewRef(type);
	st->torch_real[i] = (unsigned char)real;
	Py_XDECREF(old);
	return real ? 2 : 1;
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
static int torch_device(ext_state *st, PyObject *obj)
{
	int cpu = attr_is_true(obj, st->s_is_cpu);
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
static int torch_strided(ext_state *st, PyObject *obj)
{
	PyObject *layout = PyObject_GetAttr(obj, st->s_layout);

	if (!layout) {
		if (!PyErr_ExceptionMatches(PyExc_AttributeError))
			return -1;
		PyErr_Clear();
		return 1;	/* a duck type without layouts */
	}
	if (layout == st->torch_strided) {
		Py_DECREF(layout);
		return 1;
	}
	PyObject *s = PyObject_Str(layout);
	if (!s) {
		Py_DECREF(layout);
		return -1;
	}
	int yes = PyUnicode_CompareWithASCIIString(s, "torch.strided") == 0;
	if (yes && !st->torch_strided)
		st->torch_strided = Py_NewRef(layout);
	else if (!yes)
		PyErr_Format(PyExc_ValueError,
			     "nvio: tensor layout %S is not supported; "
			     "only dense (strided) tensors", s);
	Py_DECREF(s);
	Py_DECREF(layout);
	return yes;
}

/* o.name() true or not, for a method o's type is known to have (a
 * torch.Tensor's): no bound method is made. -1 on error. */
static int call_bool(PyObject *o, PyObject *name)
{
	PyObject *r = PyObject_CallMethodObjArgs(o, name, NULL);
	if (!r)
		return -1;
	int v = PyObject_IsTrue(r);
	Py_DECREF(r);
	return v;
}

static int attr_u64(PyObject *o, PyObject *name, uint64_t *out)
{
	return take_u64(PyObject_GetAttr(o, name), out);
}

/*
 * A torch.Tensor's conjugate bit, asked only where it can mean something:
 * conjugation is the identity on real numbers, so a tensor whose dtype is
 * not complex holds its values as they are, bit or not (torch sets it
 * only on complex tensors anyway). Reading the dtype is cheaper than
 * is_conj(); the dtypes seen not to be complex are remembered (a dtype is
 * a fixed object: what it says never changes). 1, 0, or -1 on error.
 */
static int maybe_conj(ext_state *st, PyObject *obj)
{
	PyObject *dt = PyObject_GetAttr(obj, st->s_dtype);
	if (!dt)
		return -1;
	for (unsigned i = 0; i < EXT_TORCH_DTYPES; i++)
		if (st->torch_real_dtypes[i] == dt) {
			Py_DECREF(dt);
			return 0;
		}
	PyObject *c = PyObject_GetAttr(dt, st->s_is_complex);
	if (!c) {
		Py_DECREF(dt);
		return -1;
	}
	int real = c == Py_False;
	Py_DECREF(c);
	if (real) {
		unsigned i = st->torch_real_dtypes_next++ % EXT_TORCH_DTYPES;
		PyObject *old = st->torch_real_dtypes[i];
		st->torch_real_dtypes[i] = dt;	/* the reference moves in */
		Py_XDECREF(old);
		return 0;
	}
	Py_DECREF(dt);
	return call_bool(obj, st->s_is_conj);
}

/*
 * kind: 2 a torch.Tensor, 1 a duck type (is_torch_like). A real tensor
 * has every method, so they are called without asking first, and its
 * size is one read of .nbytes (torch defines it as numel() *
 * element_size()); a duck type may lack is_conj/is_neg (then it has no
 * such bits) and is sized by numel() * element_size().
 */
static int torch_get(ext_state *st, PyObject *obj, int kind, ext_buf *b)
{
	if (torch_device(st, obj) <= 0 || torch_strided(st, obj) <= 0)
		return -1;

	int c = kind == 2 ? call_bool(obj, st->s_is_contiguous)
			  : get_bool_method(obj, st->s_is_contiguous, 1);
	if (c < 0)
		return -1;
	if (!c) {
		PyErr_SetString(PyExc_ValueError,
				"nvio: tensor is not contiguous; call .contiguous() first");
		return -1;
	}
	int lazy = kind == 2 ? maybe_conj(st, obj) : get_bool_method(obj, st->s_is_conj, 0);
	if (lazy == 0)
		lazy = kind == 2 ? call_bool(obj, st->s_is_neg)
				 : get_bool_method(obj, st->s_is_neg, 0);
	if (lazy < 0)
		return -1;
	if (lazy) {
		PyErr_SetString(PyExc_ValueError,
				"nvio: tensor has a lazy conjugate/negative bit; "
				"call .resolve_conj().resolve_neg() first");
		return -1;
	}

	uint64_t numel, esize;
	if (kind == 2) {
		if (attr_u64(obj, st->s_nbytes, &b->nbytes) < 0)
			return -1;
	} else {
		if (get_u64_method(obj, st->s_numel, &numel) < 0 ||
		    get_u64_method(obj, st->s_element_size, &esize) < 0)
			return -1;
		if (esize && numel > UINT64_MAX / esize) {
			PyErr_SetString(PyExc_OverflowError, "nvio: tensor too large");
			return -1;
		}
		b->nbytes = numel * esize;
	}
	PyObject *p = PyObject_CallMethodObjArgs(obj, st->s_data_ptr, NULL);
	if (!p)
		return -1;
	void *ptr = PyLong_AsVoidPtr(p);
	Py_DECREF(p);
	if (!ptr && PyErr_Occurred())
		return -1;
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

/* A producer's __dlpack_device__, when it has one, must say CPU. 0 or -1. */
static int dlpack_check_device(PyObject *obj)
{
	if (!PyObject_HasAttrString(obj, "__dlpack_device__"))
		return 0;
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
	return 0;
}

/* The tensor of obj.__dlpack__(), consumed: a capsule whose destructor
 * calls its deleter (new reference), *mt its tensor; NULL with an
 * exception set. */
static PyObject *dlpack_take(PyObject *obj, nv_dlmanaged **mt)
{
	PyObject *cap = call0(obj, "__dlpack__");
	if (!cap)
		return NULL;
	if (!PyCapsule_IsValid(cap, "dltensor")) {
		Py_DECREF(cap);
		PyErr_SetString(PyExc_TypeError,
				"nvio: __dlpack__() did not return a 'dltensor' capsule");
		return NULL;
	}
	*mt = PyCapsule_GetPointer(cap, "dltensor");
	/* Consume it: from here on the deleter is ours to call. */
	if (!*mt || PyCapsule_SetName(cap, "used_dltensor") < 0) {
		Py_DECREF(cap);
		return NULL;
	}
	Py_DECREF(cap);
	PyObject *keeper = PyCapsule_New(*mt, "nvio.dltensor", dl_keeper_destructor);
	if (!keeper && (*mt)->deleter)
		(*mt)->deleter(*mt);
	return keeper;
}

/* The bytes of a C-contiguous DLPack tensor; 0, or -1 with an exception. */
static int dlpack_nbytes(const nv_dltensor *t, uint64_t *nbytes)
{
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
		PyErr_SetString(overflow ? PyExc_OverflowError : PyExc_ValueError,
				overflow ? "nvio: DLPack tensor too large"
					 : "nvio: DLPack tensor is not C-contiguous");
		return -1;
	}
	*nbytes = n * ebits / 8 + (n * ebits % 8 != 0);
	return 0;
}

static int dlpack_get(PyObject *obj, ext_buf *b)
{
	nv_dlmanaged *mt;
	PyObject *keeper;

	if (dlpack_check_device(obj) < 0 || !(keeper = dlpack_take(obj, &mt)))
		return -1;
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
	if (dlpack_nbytes(t, &b->nbytes) < 0) {
		Py_DECREF(keeper);
		return -1;
	}
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

static int view_get(PyObject *obj, int writable, ext_buf *b)
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

int ext_buf_get(ext_state *st, PyObject *obj, int writable, ext_buf *b)
{
	memset(b, 0, sizeof(*b));
	if (PyObject_CheckBuffer(obj))
		return view_get(obj, writable, b);
	int kind = is_torch_like(st, obj);
	if (kind < 0)
		return -1;
	if (kind)
		return torch_get(st, obj, kind, b);
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
/* Holds                                                               */
/* ------------------------------------------------------------------ */

ext_hold *ext_hold_new(void)
{
	ext_hold *x = PyMem_Calloc(1, sizeof(*x));
	if (!x)
		PyErr_NoMemory();
	return x;
}

void ext_hold_free(ext_hold *x)
{
	ext_buf_release(&x->buf);
	Py_XDECREF(x->path);
	PyMem_Free(x);
}

void ext_holds_release(ext_holds *hs, uint64_t limit)
{
	size_t k = 0;
	while (k < hs->n && hs->v[k]->seq < limit)
		k++;
	if (!k)
		return;
	/* Detach first: releasing may run arbitrary Python code. */
	ext_hold **gone = PyMem_Malloc(k * sizeof(*gone));
	if (!gone) {
		/* Cannot detach safely; release in place, one at a time. */
		while (hs->n && hs->v[0]->seq < limit) {
			ext_hold *x = hs->v[0];
			memmove(hs->v, hs->v + 1, (hs->n - 1) * sizeof(*hs->v));
			hs->n--;
			ext_hold_free(x);
		}
		return;
	}
	memcpy(gone, hs->v, k * sizeof(*gone));
	memmove(hs->v, hs->v + k, (hs->n - k) * sizeof(*hs->v));
	hs->n -= k;
	for (size_t i = 0; i < k; i++)
		ext_hold_free(gone[i]);
	PyMem_Free(gone);
}

int ext_holds_add(ext_holds *hs, ext_hold *x)
{
	if (hs->n == hs->cap) {
		size_t cap = hs->cap ? hs->cap * 2 : 16;
		ext_hold **n = PyMem_Realloc(hs->v, cap * sizeof(*n));
		if (!n) {
			PyErr_NoMemory();
			return -1;
		}
		hs->v = n;
		hs->cap = cap;
	}
	x->seq = hs->next_seq++;
	hs->v[hs->n++] = x;
	return 0;
}

void ext_holds_fini(ext_holds *hs)
{
	PyMem_Free(hs->v);
	hs->v = NULL;
	hs->n = hs->cap = 0;
}

/*
 * A read stores into a torch tensor behind autograd's back: bump its
 * version counter, as torch's own in-place ops do, so that a backward
 * pass that saved the old values fails loudly instead of computing wrong
 * gradients. Only real tensors, only once torch is imported (a tensor
 * cannot exist before); inference tensors have no counter and are left
 * alone by torch. Never fails the read: its bytes have moved.
 */
static int bump(ext_state *st, PyObject *obj)
{
	PyObject *tensor = torch_tensor_type(st);
	if (!tensor)
		return -1;
	if (!st->torch_increment_version) {
		PyObject *name = PyUnicode_FromString("torch");
		PyObject *torch = name ? PyImport_GetModule(name) : NULL;
		Py_XDECREF(name);
		if (!torch)
			return -1;
		/*
		 * torch.autograd.graph.increment_version is a Python function
		 * around torch._C._increment_version(tuple): calling the latter
		 * with a tuple saves ~0.4 us per read into a tensor. The public
		 * one stays the fallback should the private name go away.
		 */
		PyObject *c = PyObject_GetAttrString(torch, "_C");
		PyObject *f = c ? PyObject_GetAttrString(c, "_increment_version") : NULL;
		Py_XDECREF(c);
		st->torch_incver_tuple = f != NULL;
		if (!f) {
			PyErr_Clear();
			PyObject *graph = PyImport_ImportModule("torch.autograd.graph");
			f = graph ? PyObject_GetAttrString(graph, "increment_version") : NULL;
			Py_XDECREF(graph);
		}
		st->torch_increment_version = f;
		Py_DECREF(torch);
		if (!f)
			return -1;
	}
	/* Only real tensors: the type cache usually knows (ext_buf_get just
	 * filled it); a subtype check otherwise, never a Python-level
	 * isinstance (an object may claim __class__ = torch.Tensor). */
	PyTypeObject *type = Py_TYPE(obj);
	int is = -1;
	for (unsigned i = 0; i < EXT_TORCH_TYPES && is < 0; i++)
		if (st->torch_types[i] == (PyObject *)type)
			is = st->torch_real[i];
	if (is < 0)
		is = PyType_IsSubtype(type, (PyTypeObject *)tensor);
	if (!is)
		return 0;
	PyObject *arg = st->torch_incver_tuple ? PyTuple_Pack(1, obj) : Py_NewRef(obj);
	PyObject *r = arg ? PyObject_CallFunctionObjArgs(st->torch_increment_version, arg, NULL) : NULL;
	Py_XDECREF(arg);
	Py_XDECREF(r);
	return r ? 0 : -1;
}

/*
 * Only an ordinary Exception from the bump is dropped (the bytes have
 * moved; the read stands). A KeyboardInterrupt or SystemExit raised by a
 * signal handler that ran inside torch's Python code stays: clearing it
 * is how Ctrl-C during a read into a tensor used to be lost.
 */
int ext_torch_bump_version(ext_state *st, PyObject *obj)
{
	if (PyErr_CheckSignals() < 0)	/* handlers run here, not inside torch */
		return -1;
	if (bump(st, obj) == 0)
		return 0;
	if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_Exception)) {
		PyErr_Clear();
		return 0;
	}
	return -1;
}

/*
 * An async op on a tensor also holds its storage: the tensor alone does
 * not keep the memory (t.set_() or `param.data = ...` swaps it out while
 * the op still moves bytes). Duck types without storages are left as
 * they are.
 */
int ext_buf_keep_storage(ext_buf *b, PyObject *obj)
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

/* ------------------------------------------------------------------ */
/* Borrowing for one op: a buffer, a vector                            */
/* ------------------------------------------------------------------ */

/* Borrows one buffer; for ops that outlive the call, a tensor's storage too. */
int ext_borrow(ext_state *st, PyObject *obj, int writable, int keep_storage, ext_buf *b)
{
	if (ext_buf_get(st, obj, writable, b) < 0)
		return -1;
	if (keep_storage && b->keep == obj && ext_buf_keep_storage(b, obj) < 0) {
		ext_buf_release(b);
		return -1;
	}
	return 0;
}

/*
 * Piece i of a vector: its object and, with per_iov, its offset, which
 * must not go back into piece i - 1 (libnvio's rule, said with the
 * indexes). 0, or -1 with an exception set.
 */
static int vector_item(PyObject *item, Py_ssize_t i, int per_iov, const nvio_iovec_t *prev,
		       PyObject **obj, int64_t *off)
{
	*obj = item;
	*off = 0;
	if (!per_iov)
		return 0;
	if (!PyTuple_Check(item) || PyTuple_Size(item) != 2) {
		PyErr_Format(PyExc_TypeError, "nvio: with offset OFFSET_PER_IOV "
			     "each piece is a (buffer, offset) pair (item %zd)", i);
		return -1;
	}
	*obj = PyTuple_GetItem(item, 0);
	if (ext_parse_offset(PyTuple_GetItem(item, 1), off) < 0)
		return -1;
	if (*off < 0) {
		PyErr_Format(PyExc_ValueError, "nvio: piece %zd has offset %lld; must be >= 0",
			     i, (long long)*off);
		return -1;
	}
	if (prev && (uint64_t)*off < (uint64_t)prev->offset + prev->len) {
		PyErr_Format(PyExc_ValueError, "nvio: piece %zd at offset %lld overlaps or "
			     "precedes piece %zd (which ends at %llu); per-piece offsets "
			     "must increase without overlap", i, (long long)*off, i - 1,
			     (unsigned long long)(prev->offset + prev->len));
		return -1;
	}
	return 0;
}

/* The tuple of a vector's pieces, 1..NVIO_MAX_IOV of them; NULL with an
 * exception set. */
static PyObject *vector_tuple(PyObject *seq)
{
	PyObject *tup = PySequence_Tuple(seq);
	if (!tup)
		return NULL;
	Py_ssize_t n = PyTuple_Size(tup);
	if (n > (Py_ssize_t)NVIO_MAX_IOV) {
		Py_DECREF(tup);
		PyErr_Format(PyExc_ValueError, "nvio: %zd buffers in one vector; at most %u",
			     n, NVIO_MAX_IOV);
		return NULL;
	}
	if (n == 0) {
		Py_DECREF(tup);
		PyErr_SetString(PyExc_ValueError, "nvio: a vector needs at least one buffer");
		return NULL;
	}
	return tup;
}

/*
 * A vector (ext.h): bufs is a list or tuple of buffers, or with per_iov of
 * (buffer, offset) pairs. Fills *bufs_out / *iov_out (PyMem) and *n.
 * 0, or -1 with an exception set and nothing borrowed.
 */
int ext_borrow_vector(ext_state *st, PyObject *seq, int per_iov, int writable,
		      int keep_storage, ext_buf **bufs_out, nvio_iovec_t **iov_out,
		      uint32_t *n_out, uint64_t *total)
{
	PyObject *tup = vector_tuple(seq);
	if (!tup)
		return -1;
	Py_ssize_t n = PyTuple_Size(tup), i = 0;
	ext_buf *bufs = PyMem_Calloc((size_t)n, sizeof(*bufs));
	nvio_iovec_t *iov = PyMem_Calloc((size_t)n, sizeof(*iov));
	*total = 0;
	if (!bufs || !iov) {
		PyErr_NoMemory();
		goto fail;
	}
	for (; i < n; i++) {
		PyObject *obj;
		int64_t off;
		if (vector_item(PyTuple_GetItem(tup, i), i, per_iov, i ? &iov[i - 1] : NULL,
				&obj, &off) < 0 ||
		    ext_borrow(st, obj, writable, keep_storage, &bufs[i]) < 0)
			goto fail;
		iov[i].base = bufs[i].ptr;
		iov[i].len = bufs[i].nbytes;
		iov[i].offset = off;
		*total += bufs[i].nbytes;
	}
	Py_DECREF(tup);
	*bufs_out = bufs;
	*iov_out = iov;
	*n_out = (uint32_t)n;
	return 0;
fail:
	while (bufs && i-- > 0)
		ext_buf_release(&bufs[i]);
	PyMem_Free(bufs);
	PyMem_Free(iov);
	Py_DECREF(tup);
	return -1;
}

static PyObject *m_buffer_info(PyObject *m, PyObject *args)
{
	PyObject *o;
	ext_flag_arg writable = { "writable", 0 };
	if (!PyArg_ParseTuple(args, "O|O&:buffer_info", &o, ext_flag_converter, &writable))
		return NULL;
	ext_buf b;
	if (ext_buf_get(ext_state_of(m), o, writable.v, &b) < 0)
		return NULL;
	PyObject *r = Py_BuildValue("(NK)", PyLong_FromVoidPtr(b.ptr),
				    (unsigned long long)b.nbytes);
	ext_buf_release(&b);
	return r;
}

static PyMethodDef buffer_functions[] = {
	{ "buffer_info", m_buffer_info, METH_VARARGS,
	  "buffer_info(buffer, writable=False)\n--\n\n(address, nbytes) of what nvio would use." },
	{ NULL, NULL, 0, NULL }
};

int ext_buffers_exec(PyObject *m, ext_state *st)
{
#define INTERN(n) if (!(st->s_##n = PyUnicode_InternFromString(#n))) return -1;
	EXT_TORCH_NAMES(INTERN)
#undef INTERN
	return PyModule_AddFunctions(m, buffer_functions);
}
