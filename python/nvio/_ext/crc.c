/*
 * crc32(buffer, crc=0) and crc32_combine(crc1, crc2, len2): libnvio's
 * CRC-32 (nvio_crc32, nvio_crc32_combine) for any host buffer: an object
 * with the buffer protocol, a CPU tensor, a DLPack CPU array. The GIL is
 * released while the bytes are read, so threads checksum side by side.
 */
#include "ext.h"

/* Released below this many bytes it costs more than it saves. */
#define CRC_NOGIL_MIN (64u << 10)

static PyObject *m_crc32(PyObject *m, PyObject *args, PyObject *kw)
{
	static char *names[] = { "buffer", "crc", NULL };
	PyObject *obj;
	unsigned long crc = 0;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "O|k:crc32", names, &obj, &crc))
		return NULL;
	if (crc > 0xffffffffUL) {
		PyErr_Format(PyExc_ValueError, "nvio.crc32: crc must be < 2**32, not %lu", crc);
		return NULL;
	}
	PyObject *cpu = PyObject_HasAttrString(obj, "is_cpu") ?
			PyObject_GetAttrString(obj, "is_cpu") : NULL;
	if (cpu) {
		int yes = PyObject_IsTrue(cpu);
		Py_DECREF(cpu);
		if (yes < 0)
			return NULL;
		if (!yes) {
			PyErr_SetString(PyExc_TypeError,
					"nvio.crc32: the tensor is not in host memory; "
					"checksum a CPU copy (.cpu())");
			return NULL;
		}
	} else if (PyErr_Occurred()) {
		return NULL;
	}
	ext_buf b;
	if (ext_buf_get(ext_state_of(m), obj, 0, &b) < 0)
		return NULL;
	uint32_t r;
	if (b.nbytes >= CRC_NOGIL_MIN) {
		Py_BEGIN_ALLOW_THREADS
		r = nvio_crc32((uint32_t)crc, b.ptr, (size_t)b.nbytes);
		Py_END_ALLOW_THREADS
	} else {
		r = nvio_crc32((uint32_t)crc, b.ptr, (size_t)b.nbytes);
	}
	ext_buf_release(&b);
	return PyLong_FromUnsignedLong(r);
}

static PyObject *m_crc32_combine(PyObject *m, PyObject *args)
{
	unsigned long c1, c2;
	unsigned long long len2;
	if (!PyArg_ParseTuple(args, "kkK:crc32_combine", &c1, &c2, &len2))
		return NULL;
	if (c1 > 0xffffffffUL || c2 > 0xffffffffUL) {
		PyErr_SetString(PyExc_ValueError, "nvio.crc32_combine: CRCs must be < 2**32");
		return NULL;
	}
	return PyLong_FromUnsignedLong(nvio_crc32_combine((uint32_t)c1, (uint32_t)c2, len2));
}

/*
 * crc32_many(regions): the CRC-32 of each (address, nbytes) of host memory,
 * in one call with the GIL released for all of them, so that a checkpoint
 * of thousands of tensors costs no Python work per tensor. The caller
 * vouches for the memory (nvio's checkpoint code passes storages it holds).
 */
static PyObject *m_crc32_many(PyObject *m, PyObject *arg)
{
	PyObject *seq = PySequence_List(arg);	/* the limited API has no _Fast */
	if (!seq)
		return NULL;
	Py_ssize_t n = PyList_Size(seq);
	struct region { const void *p; uint64_t n; uint32_t crc; } *r = NULL;
	PyObject *out = NULL;
	if (n && !(r = PyMem_Calloc((size_t)n, sizeof(*r)))) {
		PyErr_NoMemory();
		goto done;
	}
	for (Py_ssize_t i = 0; i < n; i++) {
		PyObject *t = PyList_GetItem(seq, i);
		unsigned long long len;
		PyObject *addr;
		if (!PyTuple_Check(t) || !PyArg_ParseTuple(t, "OK", &addr, &len)) {
			if (!PyErr_Occurred())
				PyErr_Format(PyExc_TypeError, "nvio.crc32_many: item %zd is not an "
					     "(address, nbytes) tuple", i);
			goto done;
		}
		r[i].p = PyLong_AsVoidPtr(addr);
		if (!r[i].p && PyErr_Occurred())
			goto done;
		if (!r[i].p && len) {
			PyErr_Format(PyExc_ValueError, "nvio.crc32_many: item %zd: address 0 "
				     "with %llu bytes", i, len);
			goto done;
		}
		r[i].n = len;
	}
	Py_BEGIN_ALLOW_THREADS
	for (Py_ssize_t i = 0; i < n; i++)
		r[i].crc = nvio_crc32(0, r[i].p, (size_t)r[i].n);
	Py_END_ALLOW_THREADS
	if (!(out = PyList_New(n)))
		goto done;
	for (Py_ssize_t i = 0; i < n; i++) {
		PyObject *v = PyLong_FromUnsignedLong(r[i].crc);
		if (!v) {
			Py_CLEAR(out);
			goto done;
		}
		PyList_SetItem(out, i, v);	/* steals v; cannot fail here */
	}
done:
	PyMem_Free(r);
	Py_DECREF(seq);
	return out;
}

static PyMethodDef crc_functions[] = {
	{ "crc32_many", m_crc32_many, METH_O,
	  "crc32_many(regions)\n--\n\nCRC-32 of each (address, nbytes) of host memory, the GIL\n"
	  "released for the whole batch." },
	{ "crc32", (PyCFunction)(void (*)(void))m_crc32, METH_VARARGS | METH_KEYWORDS,
	  "crc32(buffer, crc=0)\n--\n\nCRC-32 of a host buffer (zip's, zlib.crc32's), continuing crc." },
	{ "crc32_combine", m_crc32_combine, METH_VARARGS,
	  "crc32_combine(crc1, crc2, len2)\n--\n\nCRC-32 of A + B from crc(A), crc(B), len(B)." },
	{ NULL, NULL, 0, NULL }
};

int ext_crc_exec(PyObject *m, ext_state *st)
{
	return PyModule_AddFunctions(m, crc_functions);
}
