/*
 * module.c - the module nvio._nvio: its definition (PEP 489 multi-phase
 * init), its state, and the functions about the machine as a whole
 * (probe, GPUDirect Storage, file_size, versions).
 *
 * The module state (ext_state, ext.h) owns every Python object the
 * extension keeps: the exception classes, the types, interned names and
 * what buffers.c learnt about torch. Each module object has its own, so
 * the extension keeps no Python object in a C global. Functions reach the
 * state through their module, methods through their handle (which keeps
 * its module alive), type slots through ext_module_of_type() (args.c).
 *
 * Execution runs each concern's ext_*_exec in order: errors first (the
 * others raise them), then buffers, locked memory, the handle, and the
 * files, streams and queues over it.
 */
#include "ext.h"

#include <stdio.h>
#include <string.h>

/* ------------------------------------------------------------------ */
/* State life cycle                                                    */
/* ------------------------------------------------------------------ */

#define ONE(name) + 1
#define EXT_STATE_REFS (1 + EXT_NERRNO + 5 + (0 EXT_TORCH_NAMES(ONE)) + \
			EXT_TORCH_TYPES + EXT_TORCH_DTYPES + 3)

/* Every reference the state owns, so that traverse and clear agree. */
static size_t state_refs(ext_state *st, PyObject **refs[EXT_STATE_REFS])
{
	size_t n = 0;

	refs[n++] = &st->error;
	for (size_t i = 0; i < EXT_NERRNO; i++)
		refs[n++] = &st->errno_class[i];
	refs[n++] = &st->handle_type;
	refs[n++] = &st->locked_buffer_type;
	refs[n++] = &st->file_type;
	refs[n++] = &st->stream_type;
	refs[n++] = &st->queue_type;
#define NAME_REF(name) refs[n++] = &st->s_##name;
	EXT_TORCH_NAMES(NAME_REF)
#undef NAME_REF
	for (size_t i = 0; i < EXT_TORCH_TYPES; i++)
		refs[n++] = &st->torch_types[i];
	for (size_t i = 0; i < EXT_TORCH_DTYPES; i++)
		refs[n++] = &st->torch_real_dtypes[i];
	refs[n++] = &st->torch_strided;
	refs[n++] = &st->torch_tensor_type;
	refs[n++] = &st->torch_increment_version;
	return n;
}

static int module_traverse(PyObject *m, visitproc visit, void *arg)
{
	ext_state *st = ext_state_of(m);
	PyObject **refs[EXT_STATE_REFS];

	if (!st)
		return 0;
	for (size_t i = 0, n = state_refs(st, refs); i < n; i++)
		Py_VISIT(*refs[i]);
	return 0;
}

static int module_clear(PyObject *m)
{
	ext_state *st = ext_state_of(m);
	PyObject **refs[EXT_STATE_REFS];

	if (!st)
		return 0;
	for (size_t i = 0, n = state_refs(st, refs); i < n; i++)
		Py_CLEAR(*refs[i]);
	return 0;
}

static void module_free(void *m)
{
	module_clear((PyObject *)m);
}

/* ------------------------------------------------------------------ */
/* Module functions                                                    */
/* ------------------------------------------------------------------ */

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
		ext_raise_io(ext_state_of(m), NULL, (int)r, arg, -1, 0, 0, "stat", 0);
		Py_DECREF(b);
		return NULL;
	}
	Py_DECREF(b);
	return PyLong_FromLongLong(r);
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
		return ext_raise_plain(ext_state_of(m), r, "nvio_probe");
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
		return ext_raise_plain(ext_state_of(m), rc,
				       "nvio: cannot register the tensor with cuFile");
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
		return ext_raise_plain(ext_state_of(m), rc,
				       "nvio: cannot deregister the tensor from cuFile");
	Py_RETURN_NONE;
}

static PyObject *m_cufile_set_library(PyObject *m, PyObject *arg)
{
	PyObject *b = NULL;
	int rc;

	if (arg != Py_None && !PyUnicode_FSConverter(arg, &b))
		return NULL;
	rc = nvio_cufile_set_library(b ? PyBytes_AsString(b) : NULL);
	Py_XDECREF(b);
	if (rc < 0)
		return ext_raise_plain(ext_state_of(m), rc,
				       "nvio: cuFile is already loaded from another path");
	Py_RETURN_NONE;
}

static PyObject *m_staging_set_limit(PyObject *m, PyObject *arg)
{
	unsigned long long n = PyLong_AsUnsignedLongLong(arg);

	if (n == (unsigned long long)-1 && PyErr_Occurred())
		return NULL;
	nvio_staging_set_limit(n);
	Py_RETURN_NONE;
}

static PyObject *m_staging_limit(PyObject *m, PyObject *unused)
{
	uint64_t in_use = 0, limit = nvio_staging_limit(&in_use);

	return Py_BuildValue("(KK)", (unsigned long long)limit,
			     (unsigned long long)in_use);
}

struct clean_list {
	PyObject *list;
	int failed;	/* a Python error while collecting */
};

static void clean_report(const char *name, int result, const char *why, void *arg)
{
	struct clean_list *c = arg;
	PyObject *t;

	if (c->failed)
		return;
	t = Py_BuildValue("(Nis)", PyUnicode_DecodeFSDefault(name), result, why);
	if (!t || PyList_Append(c->list, t) < 0)
		c->failed = 1;
	Py_XDECREF(t);
}

/* The scan runs with the GIL held: it only reads one directory, and the
 * report builds Python objects. */
static PyObject *m_clean_temporaries(PyObject *m, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "dir", "target", "dry_run", "any_user", "spares", NULL };
	PyObject *dirb = NULL, *targetb = NULL, *dry = Py_False, *any = Py_False, *res;
	PyObject *spares = Py_False;
	unsigned spare_flags = 0;
	int sp = 0;
	struct clean_list c = { NULL, 0 };
	int d = 0, a = 0, rc;
	unsigned flags;
	char what[4200];

	if (!PyArg_ParseTupleAndKeywords(args, kw, "O&|O&$OOO:clean_temporaries", kwlist,
					 PyUnicode_FSConverter, &dirb,
					 PyUnicode_FSConverter, &targetb, &dry, &any, &spares))
		return NULL;
	/* spares: False, True (those whose target is gone) or "all" */
	if (PyUnicode_Check(spares)) {
		if (PyUnicode_CompareWithASCIIString(spares, "all") == 0) {
			spare_flags = NVIO_CLEAN_ALL_SPARES;
		} else {
			PyErr_SetString(PyExc_ValueError,
					"nvio: clean_temporaries: spares must be a bool or 'all'");
			sp = -1;
		}
	} else if (ext_parse_flag(spares, "spares", &sp) < 0) {
		sp = -1;
	} else if (sp) {
		spare_flags = NVIO_CLEAN_SPARES;
	}
	if (sp < 0 || ext_parse_flag(dry, "dry_run", &d) < 0 ||
	    ext_parse_flag(any, "any_user", &a) < 0 || !(c.list = PyList_New(0))) {
		Py_DECREF(dirb);
		Py_XDECREF(targetb);
		return NULL;
	}
	flags = (d ? NVIO_CLEAN_DRY_RUN : 0) | (a ? NVIO_CLEAN_ANY_USER : 0) | spare_flags;
	rc = nvio_clean_temporaries(PyBytes_AsString(dirb),
				    targetb ? PyBytes_AsString(targetb) : NULL, flags,
				    clean_report, &c);
	snprintf(what, sizeof(what), "nvio: cleaning temporaries in %s", PyBytes_AsString(dirb));
	Py_DECREF(dirb);
	Py_XDECREF(targetb);
	if (c.failed) {
		Py_DECREF(c.list);
		return NULL;
	}
	if (rc < 0) {
		Py_DECREF(c.list);
		return ext_raise_plain(ext_state_of(m), rc, what);
	}
	res = Py_BuildValue("(iN)", rc, c.list);
	return res;
}

static PyObject *m_temp_name(PyObject *m, PyObject *arg)
{
	PyObject *b = NULL;
	char buf[4200];
	int rc;

	if (!PyUnicode_FSConverter(arg, &b))
		return NULL;
	rc = nvio_temp_name(PyBytes_AsString(b), buf, sizeof(buf));
	Py_DECREF(b);
	if (rc < 0)
		return ext_raise_plain(ext_state_of(m), rc, "nvio: temp_name");
	return PyUnicode_DecodeFSDefault(buf);
}

static PyMethodDef module_functions[] = {
	{ "cufile_set_library", m_cufile_set_library, METH_O,
	  "cufile_set_library(path)\n--\n\nThe libcufile to load (None: the default search);\n"
	  "NvioError if cuFile is already loaded from another path." },
	{ "staging_set_limit", m_staging_set_limit, METH_O,
	  "staging_set_limit(nbytes)\n--\n\nThe process-wide budget of bounce buffers\n"
	  "(0: the default, $NVIO_STAGING_LIMIT or 512 MiB); pools made later obey it." },
	{ "staging_limit", m_staging_limit, METH_NOARGS,
	  "staging_limit()\n--\n\n(limit, in_use): the staging budget in force and the\n"
	  "bytes bounce pools hold now." },
	{ "gds_mode", m_gds_mode, METH_NOARGS,
	  "gds_mode()\n--\n\n(mode, why): 'direct' (GPUDirect), 'compat' (cuFile compatibility\n"
	  "mode) or 'none' (GDS handles use bounce buffers), and the reason." },
	{ "gds_register", m_gds_register, METH_VARARGS,
	  "gds_register(address, nbytes)\n--\n\nRegister device memory with cuFile." },
	{ "gds_deregister", m_gds_deregister, METH_O,
	  "gds_deregister(address)\n--\n\nUndo gds_register." },
	{ "file_size", m_file_size, METH_O,
	  "file_size(path)\n--\n\nSize of a file in bytes." },
	{ "clean_temporaries", (PyCFunction)(void (*)(void))m_clean_temporaries,
	  METH_VARARGS | METH_KEYWORDS,
	  "clean_temporaries(dir, target=None, *, dry_run=False, any_user=False, spares=False)\n--\n\n"
	  "Remove from dir the temporaries of atomic writes whose writer is dead (of\n"
	  "target's name only, when given); spares=True also the spares (FILE_SPARE)\n"
	  "whose target is gone, spares='all' every spare not in use; see\n"
	  "nvio_clean_temporaries(3). Returns\n"
	  "(count, [(name, result, why), ...]): result 1 removed (or would be), 0 kept,\n"
	  "-errno if removing failed." },
	{ "temp_name", m_temp_name, METH_O,
	  "temp_name(path)\n--\n\nA fresh name for a temporary of path, beside it, that\n"
	  "carries this process as its owner (create it with O_EXCL|O_NOFOLLOW)." },
	{ "probe", m_probe, METH_VARARGS,
	  "probe(dir=None)\n--\n\nWhat this machine (and dir) support, as a dict." },
	{ NULL, NULL, 0, NULL }
};

static int module_exec(PyObject *m)
{
	ext_state *st = ext_state_of(m);

	ext_def = PyModule_GetDef(m);
	if (ext_errors_exec(m, st) < 0 || ext_buffers_exec(m, st) < 0 ||
	    ext_locked_exec(m, st) < 0 || ext_handle_exec(m, st) < 0 ||
	    ext_file_exec(m, st) < 0 || ext_stream_exec(m, st) < 0 ||
	    ext_tagged_exec(m, st) < 0 || ext_crc_exec(m, st) < 0 ||
	    ext_copy_exec(m, st) < 0 || ext_pickling_exec(m, st) < 0 ||
	    ext_zip_exec(m, st) < 0 ||
	    ext_shared_exec(m, st) < 0)
		return -1;
	if (PyModule_AddIntConstant(m, "VERSION_NUM", (long)nvio_version()) < 0 ||
	    PyModule_AddStringConstant(m, "version_string", nvio_version_string()) < 0 ||
	    PyModule_AddIntConstant(m, "HEADER_VERSION_NUM", NVIO_VERSION_NUM) < 0)
		return -1;
	return PyModule_AddFunctions(m, module_functions);
}

static PyModuleDef_Slot module_slots[] = {
	{ Py_mod_exec, module_exec },
	{ 0, NULL }
};

PyModuleDef ext_moduledef = {
	PyModuleDef_HEAD_INIT,
	.m_name = "nvio._nvio",
	.m_doc = "The C extension of nvio; use the nvio package instead.",
	.m_size = sizeof(ext_state),
	.m_slots = module_slots,
	.m_traverse = module_traverse,
	.m_clear = module_clear,
	.m_free = module_free,
};

PyMODINIT_FUNC PyInit__nvio(void)
{
	return PyModuleDef_Init(&ext_moduledef);
}
