/*
 * copy_many(copies): memcpy of each (dst address, src address, nbytes) of
 * host memory, in one call with the GIL released for all of them, so that
 * the snapshot of a state of thousands of small tensors (async_save) costs
 * no torch call per tensor, and several threads copy side by side. Like
 * crc32_many, the caller vouches for the memory (nvio's checkpoint code
 * passes storages it holds and a buffer it owns); the regions must not
 * overlap.
 */
#include "ext.h"

#include <string.h>

static PyObject *m_copy_many(PyObject *m, PyObject *arg)
{
	(void)m;
	PyObject *seq = PySequence_List(arg);	/* the limited API has no _Fast */
	if (!seq)
		return NULL;
	Py_ssize_t n = PyList_Size(seq);
	struct copy { void *dst; const void *src; uint64_t n; } *c = NULL;
	PyObject *out = NULL;
	if (n && !(c = PyMem_Calloc((size_t)n, sizeof(*c)))) {
		PyErr_NoMemory();
		goto done;
	}
	for (Py_ssize_t i = 0; i < n; i++) {
		PyObject *t = PyList_GetItem(seq, i);
		unsigned long long len;
		PyObject *dst, *src;
		if (!PyTuple_Check(t) || !PyArg_ParseTuple(t, "OOK", &dst, &src, &len)) {
			if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_TypeError)) {
				PyErr_Clear();
				PyErr_Format(PyExc_TypeError, "nvio.copy_many: item %zd is not a "
					     "(dst address, src address, nbytes) tuple", i);
			}
			goto done;
		}
		c[i].dst = PyLong_AsVoidPtr(dst);
		if (!c[i].dst && PyErr_Occurred())
			goto done;
		c[i].src = PyLong_AsVoidPtr(src);
		if (!c[i].src && PyErr_Occurred())
			goto done;
		if ((!c[i].dst || !c[i].src) && len) {
			PyErr_Format(PyExc_ValueError, "nvio.copy_many: item %zd: address 0 "
				     "with %llu bytes", i, len);
			goto done;
		}
		if (len > SIZE_MAX) {
			PyErr_Format(PyExc_OverflowError, "nvio.copy_many: item %zd: %llu bytes",
				     i, len);
			goto done;
		}
		c[i].n = len;
	}
	Py_BEGIN_ALLOW_THREADS
	for (Py_ssize_t i = 0; i < n; i++)
		if (c[i].n)
			memcpy(c[i].dst, c[i].src, (size_t)c[i].n);
	Py_END_ALLOW_THREADS
	out = Py_NewRef(Py_None);
done:
	PyMem_Free(c);
	Py_DECREF(seq);
	return out;
}

static PyMethodDef copy_functions[] = {
	{ "copy_many", m_copy_many, METH_O,
	  "copy_many(copies)\n--\n\nCopy each (dst address, src address, nbytes) of host memory\n"
	  "(regions must not overlap), the GIL released for the whole batch." },
	{ NULL, NULL, 0, NULL }
};

int ext_copy_exec(PyObject *m, ext_state *st)
{
	(void)st;
	return PyModule_AddFunctions(m, copy_functions);
}
