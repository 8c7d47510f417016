/*
 * copy_many(copies): memcpy of each (dst address, src address, nbytes) of
 * host memory, in one call with the GIL released for all of them, so that
 * the snapshot of a state of thousands of small tensors (async_save) costs
 * no torch call per tensor, and several threads copy side by side. Like
 * crc32_many, the caller vouches for the memory (nvio's checkpoint code
 * passes storages it holds and a buffer it owns); the regions must not
 * overlap. copy_crc_many also gives each item's CRC-32, computed as the
 * bytes are copied.
 */
#include "ext.h"

#include <string.h>

struct copy {
	void *dst;
	const void *src;
	uint64_t n;
	uint32_t crc;
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

/* Bytes copied, then checksummed while still in the core's cache. */
#define COPY_CRC_STEP (32u << 10)

/*
 * The copies of arg; with crc, each item's CRC-32 too, computed
 * COPY_CRC_STEP bytes at a time right after they are copied (from the
 * cache, not from memory again): one pass over the source for a
 * checkpoint's packed window. None, or the list of CRCs.
 */
static PyObject *copy_items(PyObject *arg, const char *fn, int crc)
{
	struct copy *c;
	Py_ssize_t n = parse_copies(arg, fn, &c);
	if (n < 0)
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	for (Py_ssize_t i = 0; i < n; i++) {
		unsigned char *d = c[i].dst;
		const unsigned char *s = c[i].src;
		uint64_t step = crc ? COPY_CRC_STEP : c[i].n;
		for (uint64_t off = 0; off < c[i].n; off += step) {
			size_t k = (size_t)(c[i].n - off < step ? c[i].n - off : step);
			memcpy(d + off, s + off, k);
			if (crc)
				c[i].crc = nvio_crc32(c[i].crc, d + off, k);
		}
	}
	Py_END_ALLOW_THREADS
	PyObject *out = crc ? PyList_New(n) : Py_NewRef(Py_None);
	for (Py_ssize_t i = 0; crc && out && i < n; i++) {
		PyObject *v = PyLong_FromUnsignedLong(c[i].crc);
		if (!v)
			Py_CLEAR(out);
		else
			PyList_SetItem(out, i, v);	/* steals v; cannot fail here */
	}
	PyMem_Free(c);
	return out;
}

static PyObject *m_copy_many(PyObject *m, PyObject *arg)
{
	(void)m;
	return copy_items(arg, "copy_many", 0);
}

static PyObject *m_copy_crc_many(PyObject *m, PyObject *arg)
{
	(void)m;
	return copy_items(arg, "copy_crc_many", 1);
}

static PyMethodDef copy_functions[] = {
	{ "copy_many", m_copy_many, METH_O,
	  "copy_many(copies)\n--\n\nCopy each (dst address, src address, nbytes) of host memory\n"
	  "(regions must not overlap), the GIL released for the whole batch." },
	{ "copy_crc_many", m_copy_crc_many, METH_O,
	  "copy_crc_many(copies)\n--\n\ncopy_many, returning the CRC-32 of each item's bytes\n"
	  "(computed as they are copied)." },
	{ NULL, NULL, 0, NULL }
};

int ext_copy_exec(PyObject *m, ext_state *st)
{
	(void)st;
	return PyModule_AddFunctions(m, copy_functions);
}
