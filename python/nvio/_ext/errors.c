/*
 * errors.c - NvioError, its errno subclasses, and raising them.
 *
 * Every failure of an nvio call reaches Python as an NvioError (an
 * OSError) whose errno, strerror and filename are set as usual, plus op,
 * offset, nbytes, op_seq, is_write and fd for the failing piece. Invalid
 * arguments that are no I/O are ValueError or TypeError instead.
 */
#include "ext.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

/*
 * errno values that Python maps to a builtin OSError subclass get an
 * nvio class deriving from both NvioError and that builtin, so that
 * `except FileNotFoundError` and `except nvio.NvioError` both work.
 * The classes themselves are in the module state, at the same index.
 */
static const struct {
	int err;
	const char *name;	/* NULL: shares the class of the same base */
	PyObject **base;
} errno_table[] = {
	{ ENOENT, "nvio.NvioFileNotFoundError", &PyExc_FileNotFoundError },
	{ EEXIST, "nvio.NvioFileExistsError", &PyExc_FileExistsError },
	{ EACCES, "nvio.NvioPermissionError", &PyExc_PermissionError },
	{ EPERM, NULL, &PyExc_PermissionError },	/* shares EACCES's */
	{ EISDIR, "nvio.NvioIsADirectoryError", &PyExc_IsADirectoryError },
	{ ENOTDIR, "nvio.NvioNotADirectoryError", &PyExc_NotADirectoryError },
	{ EINTR, "nvio.NvioInterruptedError", &PyExc_InterruptedError },
	{ ETIMEDOUT, "nvio.NvioTimeoutError", &PyExc_TimeoutError },
	{ EAGAIN, "nvio.NvioBlockingIOError", &PyExc_BlockingIOError },
};
_Static_assert(sizeof(errno_table) / sizeof(errno_table[0]) == EXT_NERRNO,
	       "EXT_NERRNO in ext.h must match errno_table");

static PyObject *error_class(ext_state *st, int err)
{
	for (size_t i = 0; i < EXT_NERRNO; i++)
		if (errno_table[i].err == err && st->errno_class[i])
			return st->errno_class[i];
	return st->error;
}

static int set_attr_steal(PyObject *o, const char *name, PyObject *v)
{
	if (!v)
		return -1;
	int r = PyObject_SetAttrString(o, name, v);
	Py_DECREF(v);
	return r;
}

/* An instance of the errno's class with the attributes of a failure. */
static PyObject *make_error(ext_state *st, int rc, const char *msg, PyObject *target,
			    const char *op, int64_t offset, uint64_t nbytes,
			    uint64_t op_seq, int is_write, int fd)
{
	PyObject *cls = error_class(st, -rc);
	/* file names are bytes: any that are not UTF-8 survive as escapes */
	PyObject *text = PyUnicode_DecodeFSDefault(msg);
	if (!text)
		return NULL;
	PyObject *exc = PyObject_CallFunction(cls, "iNO", -rc, text,
					      target ? target : Py_None);
	if (!exc)
		return NULL;
	if (set_attr_steal(exc, "op", PyUnicode_DecodeFSDefault(op)) < 0 ||
	    set_attr_steal(exc, "offset", PyLong_FromLongLong(offset)) < 0 ||
	    set_attr_steal(exc, "nbytes", PyLong_FromUnsignedLongLong(nbytes)) < 0 ||
	    set_attr_steal(exc, "op_seq", PyLong_FromUnsignedLongLong(op_seq)) < 0 ||
	    set_attr_steal(exc, "is_write", PyBool_FromLong(is_write)) < 0 ||
	    set_attr_steal(exc, "fd", (target || fd < 0) ? Py_NewRef(Py_None)
						      : PyLong_FromLong(fd)) < 0) {
		Py_DECREF(exc);
		return NULL;
	}
	return exc;
}

PyObject *ext_error_from_record(ext_state *st, const nvio_error_t *e, PyObject *filename)
{
	char msg[1536];

	nvio_format_error(e, msg, sizeof(msg));
	return make_error(st, e->err, msg, filename, e->what, e->offset, e->nbytes,
			  e->op_seq, e->is_write, -1);
}

PyObject *ext_raise_record(ext_state *st, const nvio_error_t *rec, PyObject *filename)
{
	PyObject *exc = ext_error_from_record(st, rec, filename);
	if (exc) {
		PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
		Py_DECREF(exc);
	}
	return NULL;
}

void ext_record_of(nvio_handle_t *h, int rc, nvio_error_t *rec)
{
	memset(rec, 0, sizeof(*rec));
	rec->struct_size = sizeof(*rec);
	if (nvio_last_error(h, rec) != rc) {
		memset(rec, 0, sizeof(*rec));
		rec->struct_size = sizeof(*rec);
		rec->err = rc;
	}
}

PyObject *ext_raise_io(ext_state *st, nvio_handle_t *h, int rc, PyObject *target,
		       int fd, int64_t offset, uint64_t nbytes, const char *op,
		       int is_write)
{
	nvio_error_t *e = &st->scratch_error;
	char msg[1536];
	PyObject *exc;

	memset(e, 0, sizeof(*e));
	e->struct_size = sizeof(*e);
	if (h && nvio_last_error(h, e) == rc && rc != 0) {
		nvio_format_error(e, msg, sizeof(msg));
		exc = make_error(st, rc, msg, target, e->what, e->offset, e->nbytes,
				 e->op_seq, e->is_write, fd);
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
		if (nbytes == 0 && offset == 0)	/* a step on the whole file */
			snprintf(msg, sizeof(msg), "%s of %s failed: %s", op, where,
				 nvio_strerror(rc));
		else
			snprintf(msg, sizeof(msg), "%s of %llu bytes at offset %lld in %s failed: %s",
				 op, (unsigned long long)nbytes, (long long)offset, where,
				 nvio_strerror(rc));
		exc = make_error(st, rc, msg, target, op, offset, nbytes, 0, is_write, fd);
	}
	if (exc) {
		PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
		Py_DECREF(exc);
	}
	return NULL;
}

PyObject *ext_raise_plain(ext_state *st, int rc, const char *what)
{
	if (rc == -EINVAL) {
		PyErr_Format(PyExc_ValueError, "%s: %s", what, nvio_strerror(rc));
		return NULL;
	}
	char msg[512];
	snprintf(msg, sizeof(msg), "%s: %s", what, nvio_strerror(rc));
	PyObject *cls = error_class(st, -rc);
	PyObject *exc = PyObject_CallFunction(cls, "is", -rc, msg);
	if (exc) {
		PyErr_SetObject(cls, exc);
		Py_DECREF(exc);
	}
	return NULL;
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

static PyMethodDef error_functions[] = {
	{ "strerror", m_strerror, METH_O,
	  "strerror(err)\n--\n\nnvio's description of an errno value." },
	{ NULL, NULL, 0, NULL }
};

int ext_errors_exec(PyObject *m, ext_state *st)
{
	st->error = PyErr_NewExceptionWithDoc("nvio.NvioError",
		"An nvio operation failed.\n\n"
		"A subclass of OSError: errno, strerror and filename are set as\n"
		"usual; op (\"open\", \"pread\", \"pwrite\", \"validate\", ...),\n"
		"offset, nbytes, op_seq, is_write and fd describe the failing piece.",
		PyExc_OSError, NULL);
	if (!st->error || PyModule_AddObjectRef(m, "NvioError", st->error) < 0)
		return -1;
	for (size_t i = 0; i < EXT_NERRNO; i++) {
		if (!errno_table[i].name) {
			for (size_t j = 0; j < i; j++)
				if (*errno_table[j].base == *errno_table[i].base &&
				    !st->errno_class[i])
					st->errno_class[i] = Py_XNewRef(st->errno_class[j]);
			continue;
		}
		PyObject *bases = PyTuple_Pack(2, st->error, *errno_table[i].base);
		if (!bases)
			return -1;
		st->errno_class[i] = PyErr_NewException(errno_table[i].name, bases, NULL);
		Py_DECREF(bases);
		if (!st->errno_class[i])
			return -1;
		if (PyModule_AddObjectRef(m, strchr(errno_table[i].name, '.') + 1,
					  st->errno_class[i]) < 0)
			return -1;
	}
	return PyModule_AddFunctions(m, error_functions);
}
