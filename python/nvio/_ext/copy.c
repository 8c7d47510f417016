/*
 * copy_many(copies): memcpy of each (dst address, src address, nbytes) of
 * host memory, in one call with the GIL released for all of them, so that
 * the snapshot of a state of thousands of small tensors (async_save) costs
 * no torch call per tensor, and several threads copy side by side. Like
 * crc32_many, the caller vouches for the memory (nvio's checkpoint code
 * passes storages it holds and a buffer it owns); the regions must not
 * overlap. (A checkpoint's packed windows copy and checksum in one pass
 * through zipimage.c.)
 */
#include "ext.h"

#include <string.h>

struct copy {
	void *dst;
	const void *src;
	uint64_t n;
};

/* The (dst address, src address, nbytes) items of the sequence arg,
 * checked, into *out (NULL for none; PyMem_Free it); how many, or -1 with
 * an exception set. */
static Py_ssize_t parse_copies(PyObject *arg, const char *fn, struct copy **out)
{
	PyObject *seq = PySequence_List(arg);	/* the limited API has no _Fast */
	struct copy *c = NULL;
	Py_ssize_t n;

	*out = NULL;
	if (!seq)
		return -1;
	n = PyList_Size(seq);
	if (n && !(c = PyMem_Calloc((size_t)n, sizeof(*c)))) {
		PyErr_NoMemory();
		goto fail;
	}
	for (Py_ssize_t i = 0; i < n; i++) {
		PyObject *t = PyList_GetItem(seq, i);
		unsigned long long len;
		PyObject *dst, *src;
		if (!PyTuple_Check(t) || !PyArg_ParseTuple(t, "OOK", &dst, &src, &len)) {
			if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_TypeError)) {
				PyErr_Clear();
				PyErr_Format(PyExc_TypeError, "nvio.%s: item %zd is not a "
					     "(dst address, src address, nbytes) tuple", fn, i);
			}
			goto fail;
		}
		c[i].dst = PyLong_AsVoidPtr(dst);
		if (!c[i].dst && PyErr_Occurred())
			goto fail;
		c[i].src = PyLong_AsVoidPtr(src);
		if (!c[i].src && PyErr_Occurred())
			goto fail;
		if ((!c[i].dst || !c[i].src) && len) {
			PyErr_Format(PyExc_ValueError, "nvio.%s: item %zd: address 0 "
				     "with %llu bytes", fn, i, len);
			goto fail;
		}
		if (len > SIZE_MAX) {
			PyErr_Format(PyExc_OverflowError, "nvio.%s: item %zd: %llu bytes",
				     fn, i, len);
			goto fail;
		}
		c[i].n = len;
	}
	Py_DECREF(seq);
	*out = c;
	return n;
fail:
	Py_DECREF(seq);
	PyMem_Free(c);
	return -1;
}

static PyObject *m_copy_many(PyObject *m, PyObject *arg)
{
	(void)m;
	struct copy *c;
	Py_ssize_t n = parse_copies(arg, "copy_many", &c);
	if (n < 0)
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	for (Py_ssize_t i = 0; i < n; i++)
		if (c[i].n)
			memcpy(c[i].dst, c[i].src, (size_t)c[i].n);
	Py_END_ALLOW_THREADS
	PyMem_Free(c);
	Py_RETURN_NONE;
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
