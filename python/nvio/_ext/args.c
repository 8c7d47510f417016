/*
 * args.c - parsing the arguments every other file takes: flags (True/False
 * or 0/1), file targets (a path or a descriptor), engines, direct modes,
 * offsets and FILE_ or op flag words. The bottom of the extension: it
 * calls no other file of it.
 */
#include "ext.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

int ext_parse_flag(PyObject *o, const char *what, int *out)
{
	if (PyBool_Check(o)) {
		*out = o == Py_True;
		return 0;
	}
	if (PyLong_Check(o)) {
		int overflow = 0;
		long v = PyLong_AsLongAndOverflow(o, &overflow);
		if (v == -1 && PyErr_Occurred())
			return -1;
		if (!overflow && (v == 0 || v == 1)) {
			*out = (int)v;
			return 0;
		}
	}
	/* A truthy "False" or "no" must not silently mean True. */
	PyObject *tn = PyType_GetName(Py_TYPE(o));
	if (!tn)
		return -1;
	PyErr_Format(PyExc_TypeError, "nvio: %s must be True or False (or 0/1), not %S %R",
		     what, tn, o);
	Py_DECREF(tn);
	return -1;
}

int ext_flag_converter(PyObject *o, void *arg)
{
	ext_flag_arg *a = arg;
	return ext_parse_flag(o, a->name, &a->v) == 0;
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

int ext_parse_engine(PyObject *o, int *out)
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

int ext_parse_direct(PyObject *o, int *out)
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


/*
 * Resolves the file target: a path (str, bytes, os.PathLike) or an open
 * descriptor (int, or the fd= keyword). *pathb gets the encoded path
 * (new reference) or NULL with *fd set.
 */
int ext_parse_target(PyObject *filename, PyObject *fdobj, PyObject **pathb,
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
int ext_parse_offset(PyObject *o, int64_t *out)
{
	long long v = PyLong_AsLongLong(o);
	if (v == -1 && PyErr_Occurred())
		return -1;
	*out = v;
	return 0;
}

int ext_parse_flags(PyObject *o, unsigned *out)
{
	unsigned long v = PyLong_AsUnsignedLong(o);
	if (v == (unsigned long)-1 && PyErr_Occurred())
		return -1;
	if (v > UINT32_MAX) {
		PyErr_SetString(PyExc_ValueError, "nvio: flags out of range");
		return -1;
	}
	*out = (unsigned)v;
	return 0;
}

/* The module's definition, set by module.c before any type is made. */
const PyModuleDef *ext_def;

PyObject *ext_module_of_type(PyTypeObject *type)
{
	/* Our own types first: no lookup of __mro__ for them. */
	PyObject *m = PyType_GetModule(type);
	if (m && PyModule_GetDef(m) == ext_def)
		return m;
	PyErr_Clear();
	PyObject *mro = PyObject_GetAttrString((PyObject *)type, "__mro__");
	if (!mro)
		return NULL;
	m = NULL;
	for (Py_ssize_t i = 0; !m && PyTuple_Check(mro) && i < PyTuple_Size(mro); i++) {
		PyObject *t = PyTuple_GetItem(mro, i);
		if (!t || !PyType_Check(t) ||
		    !(PyType_GetFlags((PyTypeObject *)t) & Py_TPFLAGS_HEAPTYPE))
			continue;
		m = PyType_GetModule((PyTypeObject *)t);
		if (!m || PyModule_GetDef(m) != ext_def) {
			PyErr_Clear();
			m = NULL;
		}
	}
	Py_DECREF(mro);
	if (!m)
		PyErr_Format(PyExc_TypeError, "nvio: %S is not an nvio._nvio type",
			     (PyObject *)type);
	return m;
}
