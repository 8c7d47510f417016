/*
 * locked.c - LockedBuffer: page-aligned host memory from nvio_mem_alloc,
 * locked in RAM when RLIMIT_MEMLOCK allows.
 *
 * Ownership: a LockedBuffer owns its allocation and frees it exactly once,
 * in its dealloc; a view, tensor or array made from it holds a reference
 * to it through the buffer protocol, so the memory outlives them all.
 */
#include "ext.h"

typedef struct {
	PyObject_HEAD
	void *ptr;
	Py_ssize_t size;	/* bytes exposed; the allocation is >= 1 */
	unsigned flags;
} LockedBufferObject;

static PyObject *lb_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "nbytes", "require_locked", NULL };
	long long n;
	ext_flag_arg req = { "require_locked", 0 };
	if (!PyArg_ParseTupleAndKeywords(args, kw, "L|O&:LockedBuffer", kwlist, &n,
					 ext_flag_converter, &req))
		return NULL;
	int require = req.v;
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
	if (rc < 0) {
		PyObject *m = ext_module_of_type(type);
		return m ? ext_raise_plain(ext_state_of(m), rc, "nvio_mem_alloc") : NULL;
	}
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

static PyMethodDef locked_functions[] = {
	{ "mem_query", m_mem_query, METH_VARARGS,
	  "mem_query(address, nbytes)\n--\n\nNVIO_MEM_* flags of a memory range." },
	{ NULL, NULL, 0, NULL }
};

int ext_locked_exec(PyObject *m, ext_state *st)
{
	st->locked_buffer_type = PyType_FromModuleAndSpec(m, &lb_spec, NULL);
	if (!st->locked_buffer_type ||
	    PyModule_AddObjectRef(m, "LockedBuffer", st->locked_buffer_type) < 0 ||
	    PyModule_AddIntConstant(m, "MEM_LOCKED", NVIO_MEM_LOCKED) < 0 ||
	    PyModule_AddIntConstant(m, "MEM_NVIO", NVIO_MEM_NVIO) < 0)
		return -1;
	return PyModule_AddFunctions(m, locked_functions);
}
