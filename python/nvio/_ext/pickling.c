/*
 * persistent_id_filter(plain, fn): a persistent_id for pickle.Pickler that
 * answers None itself for an object whose exact type is in the set plain
 * and calls fn(obj) for any other. The C pickler asks persistent_id about
 * every object it saves, ints and strings included (19 times per tensor
 * of a state dict); answered in Python that was a third of a checkpoint's
 * pickling time for thousands of small tensors.
 */
#include "ext.h"

static PyObject *filter_call(PyObject *self, PyObject *obj)
{
	/* self: (plain set, fn) */
	PyObject *plain = PyTuple_GetItem(self, 0);
	PyObject *fn = PyTuple_GetItem(self, 1);
	if (!plain || !fn)
		return NULL;
	int yes = PySet_Contains(plain, (PyObject *)Py_TYPE(obj));
	if (yes < 0)
		return NULL;
	if (yes)
		Py_RETURN_NONE;
	return PyObject_CallFunctionObjArgs(fn, obj, NULL);
}

static PyMethodDef filter_def = {
	"persistent_id", filter_call, METH_O,
	"persistent_id(obj)\n--\n\nNone for an object of a plain type, else fn(obj)."
};

static PyObject *m_persistent_id_filter(PyObject *m, PyObject *args)
{
	(void)m;
	PyObject *plain, *fn;
	if (!PyArg_ParseTuple(args, "OO:persistent_id_filter", &plain, &fn))
		return NULL;
	if (!PyAnySet_Check(plain)) {
		PyErr_SetString(PyExc_TypeError,
				"nvio.persistent_id_filter: plain must be a set or frozenset of types");
		return NULL;
	}
	if (!PyCallable_Check(fn)) {
		PyErr_SetString(PyExc_TypeError, "nvio.persistent_id_filter: fn must be callable");
		return NULL;
	}
	PyObject *self = PyTuple_Pack(2, plain, fn);
	if (!self)
		return NULL;
	PyObject *f = PyCFunction_NewEx(&filter_def, self, NULL);
	Py_DECREF(self);
	return f;
}

static PyMethodDef pickling_functions[] = {
	{ "persistent_id_filter", m_persistent_id_filter, METH_VARARGS,
	  "persistent_id_filter(plain, fn)\n--\n\nA persistent_id answering None for objects whose\n"
	  "exact type is in plain, fn(obj) for the others." },
	{ NULL, NULL, 0, NULL }
};

int ext_pickling_exec(PyObject *m, ext_state *st)
{
	(void)st;
	return PyModule_AddFunctions(m, pickling_functions);
}
