/*
 * Pickling helpers for checkpoints.
 *
 * persistent_id_filter(plain, fn): a persistent_id for pickle.Pickler that
 * answers None itself for an object whose exact type is in the set plain,
 * the id of a PersistentId (made ahead by TensorReducer, below), and calls
 * fn(obj) for any other. The C pickler asks persistent_id about
 * every object it saves, ints and strings included (19 times per tensor
 * of a state dict); answered in Python that was a third of a checkpoint's
 * pickling time for thousands of small tensors.
 */
#include "ext.h"

#include <string.h>

/* A persistent id made ahead (by the tensor reducer below): the filter
 * answers with it. */
typedef struct {
	PyObject_HEAD
	PyObject *pid;
} PidObject;

static PyObject *filter_call(PyObject *self, PyObject *obj)
{
	/* self: (plain set, fn, PersistentId type) */
	PyObject *plain = PyTuple_GetItem(self, 0);
	PyObject *fn = PyTuple_GetItem(self, 1);
	PyObject *pid_type = PyTuple_GetItem(self, 2);
	if (!plain || !fn || !pid_type)
		return NULL;
	if ((PyObject *)Py_TYPE(obj) == pid_type)
		return Py_NewRef(((PidObject *)obj)->pid);
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
	PyObject *pid_type = PyObject_GetAttrString(m, "PersistentId");
	if (!pid_type)
		return NULL;
	PyObject *self = PyTuple_Pack(3, plain, fn, pid_type);
	Py_DECREF(pid_type);
	if (!self)
		return NULL;
	PyObject *f = PyCFunction_NewEx(&filter_def, self, NULL);
	Py_DECREF(self);
	return f;
}

static PyObject *pid_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
	PyObject *pid;
	if (kw && PyDict_Size(kw)) {
		PyErr_SetString(PyExc_TypeError, "nvio.PersistentId takes no keywords");
		return NULL;
	}
	if (!PyArg_ParseTuple(args, "O:PersistentId", &pid))
		return NULL;
	allocfunc alloc = (allocfunc)PyType_GetSlot(type, Py_tp_alloc);
	PidObject *self = (PidObject *)alloc(type, 0);
	if (self)
		self->pid = Py_NewRef(pid);
	return (PyObject *)self;
}

static void pid_dealloc(PyObject *o)
{
	PyTypeObject *tp = Py_TYPE(o);
	Py_XDECREF(((PidObject *)o)->pid);
	freefunc f = (freefunc)PyType_GetSlot(tp, Py_tp_free);
	f(o);
	Py_DECREF(tp);
}

static PyObject *pid_get(PyObject *o, void *c)
{
	return Py_NewRef(((PidObject *)o)->pid);
}

static PyGetSetDef pid_getset[] = {
	{ "pid", pid_get, NULL, "The persistent id.", NULL },
	{ NULL, NULL, NULL, NULL, NULL }
};

static PyType_Slot pid_slots[] = {
	{ Py_tp_new, pid_new },
	{ Py_tp_dealloc, pid_dealloc },
	{ Py_tp_getset, pid_getset },
	{ Py_tp_doc, "PersistentId(pid)\n--\n\nAn object persistent_id_filter's persistent_id "
		     "answers with pid." },
	{ 0, NULL }
};

static PyType_Spec pid_spec = {
	"nvio._nvio.PersistentId", sizeof(PidObject), 0, Py_TPFLAGS_DEFAULT, pid_slots
};

/*
 * TensorReducer(...): torch.save's reduction of a plain CPU tensor, made
 * in C for a pickler's dispatch table: for a dense, strided CPU tensor of
 * exact type torch.Tensor without Python attributes, backward hooks or a
 * v3 dtype, with storage (outside torch's skip_data), the tuple torch's
 * own Tensor.__reduce_ex__ returns:
 *
 *   (rebuild, (storage, offset, size, stride, requires_grad, OrderedDict()
 *              [, conj/neg metadata]))
 *
 * with the storage given as a PersistentId whose id is torch.save's
 * ("storage", storage type, key, location, numel), keys numbered in the
 * order storages are met (nvio._base.plan._StorageIds' dicts, shared with
 * it: keys by storage._cdata, storages and dtypes by key, dtypes by data
 * pointer; two dtypes over one memory is pickle.PicklingError, as there).
 * Any other tensor goes to `slow` (Python: CUDA tensors, then torch's
 * own). Python did this in ~11 us per tensor, 0.5 s of a save of 50,000.
 *
 * grow (optional): called with no arguments each time the storages met
 * since its last call reach grow_bytes (each counted as its bytes plus
 * grow_extra), right after the new storage is entered in the dicts: the
 * caller lays out and starts writing the records met so far while the
 * pickler goes on (nvio.save). What it raises, the pickler raises.
 */
#define TR_NAMES(X) X(__dict__) X(_backward_hooks) X(layout) X(is_nested) \
	X(is_quantized) X(is_cpu) X(dtype) X(skip_data) X(untyped_storage) \
	X(storage_offset) X(size) X(stride) X(requires_grad) X(nbytes) X(data_ptr) \
	X(_cdata)

#define TR_OBJECTS(X) X(slow) X(rebuild) X(strided) X(v3) X(tls) X(has_storage) \
	X(meta_of) X(odict) X(stypes) X(stype_fn) X(keys) X(storages) X(types) \
	X(dtypes) X(location) X(location_fn) X(pickling_error) X(pid_type) X(storage_s) \
	X(grow)

typedef struct {
	PyObject_HEAD
#define TR_FIELD(n) PyObject *n;
	TR_OBJECTS(TR_FIELD)
#undef TR_FIELD
	unsigned long long grow_bytes, grow_extra, pending;
#define TR_NAME_FIELD(n) PyObject *s_##n;
	TR_NAMES(TR_NAME_FIELD)
#undef TR_NAME_FIELD
} ReducerObject;

static void tr_dealloc(PyObject *o)
{
	ReducerObject *r = (ReducerObject *)o;
	PyTypeObject *tp = Py_TYPE(o);
#define TR_CLEAR(n) Py_CLEAR(r->n);
	TR_OBJECTS(TR_CLEAR)
#undef TR_CLEAR
#define TR_NAME_CLEAR(n) Py_CLEAR(r->s_##n);
	TR_NAMES(TR_NAME_CLEAR)
#undef TR_NAME_CLEAR
	freefunc f = (freefunc)PyType_GetSlot(tp, Py_tp_free);
	f(o);
	Py_DECREF(tp);
}

static PyObject *tr_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "slow", "rebuild", "strided", "v3", "tls", "has_storage",
				  "meta_of", "odict", "stypes", "stype_fn", "keys", "storages",
				  "types", "dtypes", "location", "location_fn",
				  "pickling_error", "grow", "grow_bytes", "grow_extra", NULL };
	PyObject *a[17], *grow = Py_None;
	unsigned long long grow_bytes = 0, grow_extra = 0;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOOOOOO!OO!O!O!O!OOO|OKK:TensorReducer",
					 kwlist, &a[0], &a[1], &a[2], &a[3], &a[4], &a[5],
					 &a[6], &a[7], &PyDict_Type, &a[8], &a[9],
					 &PyDict_Type, &a[10], &PyDict_Type, &a[11],
					 &PyDict_Type, &a[12], &PyDict_Type, &a[13], &a[14],
					 &a[15], &a[16], &grow, &grow_bytes, &grow_extra))
		return NULL;
	if (grow != Py_None && !PyCallable_Check(grow)) {
		PyErr_SetString(PyExc_TypeError, "nvio.TensorReducer: grow must be callable or None");
		return NULL;
	}
	if (!PyAnySet_Check(a[3])) {
		PyErr_SetString(PyExc_TypeError, "nvio.TensorReducer: v3 must be a set of dtypes");
		return NULL;
	}
	if (a[14] != Py_None && !PyUnicode_Check(a[14])) {
		PyErr_SetString(PyExc_TypeError, "nvio.TensorReducer: location must be a str "
				"or None");
		return NULL;
	}
	PyObject *m = ext_module_of_type(type);
	if (!m)
		return NULL;
	allocfunc alloc = (allocfunc)PyType_GetSlot(type, Py_tp_alloc);
	ReducerObject *r = (ReducerObject *)alloc(type, 0);
	if (!r)
		return NULL;
	PyObject **f[] = { &r->slow, &r->rebuild, &r->strided, &r->v3, &r->tls,
			   &r->has_storage, &r->meta_of, &r->odict, &r->stypes, &r->stype_fn,
			   &r->keys, &r->storages, &r->types, &r->dtypes, &r->location,
			   &r->location_fn, &r->pickling_error };
	for (int i = 0; i < 17; i++)
		*f[i] = Py_NewRef(a[i]);
	r->grow = Py_NewRef(grow);
	r->grow_bytes = grow_bytes;
	r->grow_extra = grow_extra;
	if (r->location != Py_None && !PyObject_IsTrue(r->location)) {
		Py_DECREF(r->location);		/* "" means its own, as `or` */
		r->location = Py_NewRef(Py_None);
	}
	r->pid_type = PyObject_GetAttrString(m, "PersistentId");
	r->storage_s = PyUnicode_InternFromString("storage");
	if (!r->pid_type || !r->storage_s)
		goto fail;
#define TR_INTERN(n) if (!(r->s_##n = PyUnicode_InternFromString(#n))) goto fail;
	TR_NAMES(TR_INTERN)
#undef TR_INTERN
	return (PyObject *)r;
fail:
	Py_DECREF(r);
	return NULL;
}

/* 1 when attribute `name` of o is true, 0 when false, -1 on error. */
static int attr_true(PyObject *o, PyObject *name)
{
	PyObject *v = PyObject_GetAttr(o, name);
	if (!v)
		return -1;
	int t = PyObject_IsTrue(v);
	Py_DECREF(v);
	return t;
}

static PyObject *call0(PyObject *o, PyObject *name)
{
	return PyObject_CallMethodObjArgs(o, name, NULL);
}

/* Whether t takes the fast path: 1, 0 (slow), -1 on error. *dtype gets
 * a reference to t.dtype when 1. */
static int tr_plain(ReducerObject *r, PyObject *t, PyObject **dtype)
{
	int v;
	PyObject *x;
	if ((v = attr_true(t, r->s___dict__)) != 0 ||
	    (v = attr_true(t, r->s__backward_hooks)) != 0)
		return v < 0 ? -1 : 0;
	if (!(x = PyObject_GetAttr(t, r->s_layout)))
		return -1;
	v = x == r->strided;
	Py_DECREF(x);
	if (!v)
		return 0;
	if ((v = attr_true(t, r->s_is_nested)) != 0 || (v = attr_true(t, r->s_is_quantized)) != 0)
		return v < 0 ? -1 : 0;
	if ((v = attr_true(t, r->s_is_cpu)) != 1)
		return v;
	if (!(x = PyObject_GetAttr(t, r->s_dtype)))
		return -1;
	if ((v = PySet_Contains(r->v3, x)) != 0) {
		Py_DECREF(x);
		return v < 0 ? -1 : 0;
	}
	PyObject *skip = PyObject_GetAttr(r->tls, r->s_skip_data);
	if (!skip) {
		if (!PyErr_ExceptionMatches(PyExc_AttributeError))
			goto fail;
		PyErr_Clear();
	} else {
		v = PyObject_IsTrue(skip);
		Py_DECREF(skip);
		if (v != 0) {
			Py_DECREF(x);
			return v < 0 ? -1 : 0;
		}
	}
	PyObject *has = PyObject_CallFunctionObjArgs(r->has_storage, t, NULL);
	if (!has)
		goto fail;
	v = PyObject_IsTrue(has);
	Py_DECREF(has);
	if (v != 1) {
		Py_DECREF(x);
		return v;
	}
	*dtype = x;
	return 1;
fail:
	Py_DECREF(x);
	return -1;
}

/* torch.save's persistent id of a CPU storage holding dtype elements,
 * as _StorageIds.__call__ makes it for a _Ref. New reference or NULL. */
static PyObject *tr_pid(ReducerObject *r, PyObject *storage, PyObject *dtype)
{
	PyObject *st = NULL, *nbytes = NULL, *numel = NULL, *ptr = NULL, *cdata = NULL;
	PyObject *key = NULL, *loc = NULL, *out = NULL;
	st = PyDict_GetItemWithError(r->stypes, dtype);		/* borrowed */
	if (st)
		Py_INCREF(st);
	else if (PyErr_Occurred() || !(st = PyObject_CallFunctionObjArgs(r->stype_fn, dtype, NULL)))
		return NULL;
	if (!PyTuple_Check(st) || PyTuple_Size(st) != 2) {
		PyErr_SetString(PyExc_TypeError, "nvio.TensorReducer: stype_fn must give a "
				"(storage type, element size) pair");
		goto done;
	}
	if (!(nbytes = call0(storage, r->s_nbytes)) ||
	    !(numel = PyNumber_FloorDivide(nbytes, PyTuple_GetItem(st, 1))))
		goto done;
	if (!(ptr = call0(storage, r->s_data_ptr)))
		goto done;
	int nonzero = PyObject_IsTrue(ptr);
	if (nonzero < 0)
		goto done;
	if (nonzero) {		/* a CPU storage: never on the meta device */
		PyObject *seen = PyDict_GetItemWithError(r->dtypes, ptr);	/* borrowed */
		if (!seen) {
			if (PyErr_Occurred() || PyDict_SetItem(r->dtypes, ptr, dtype) < 0)
				goto done;
			seen = dtype;
		}
		int ne = PyObject_RichCompareBool(seen, dtype, Py_NE);
		if (ne < 0)
			goto done;
		if (ne) {
			PyObject *msg = PyUnicode_FromFormat(
				"cannot save two tensors or storages that view the same memory "
				"as different dtypes (%S and %S)", seen, dtype);
			if (msg) {
				PyErr_SetObject(r->pickling_error, msg);
				Py_DECREF(msg);
			}
			goto done;
		}
	}
	if (!(cdata = PyObject_GetAttr(storage, r->s__cdata)))
		goto done;
	key = PyDict_GetItemWithError(r->keys, cdata);		/* borrowed */
	if (key) {
		Py_INCREF(key);
	} else {
		/* str(len(keys)), as torch.save: a new string each time. (A
		 * one-character string from PyUnicode_FromFormat is the
		 * interpreter's shared one, which the pickler would memoize
		 * together with a "0" elsewhere in the object: other bytes.) */
		PyObject *n = PyErr_Occurred() ? NULL : PyLong_FromSsize_t(PyDict_Size(r->keys));
		key = n ? PyObject_Str(n) : NULL;
		Py_XDECREF(n);
		if (!key)
			goto done;
		if (PyDict_SetItem(r->keys, cdata, key) < 0 ||
		    PyDict_SetItem(r->storages, key, storage) < 0 ||
		    PyDict_SetItem(r->types, key, dtype) < 0)
			goto done;
		if (r->grow != Py_None) {
			unsigned long long nb = PyLong_AsUnsignedLongLong(nbytes);
			if (nb == (unsigned long long)-1 && PyErr_Occurred())
				goto done;
			r->pending += nb + r->grow_extra;
			if (r->pending >= r->grow_bytes) {
				r->pending = 0;
				PyObject *g = PyObject_CallNoArgs(r->grow);
				if (!g)
					goto done;
				Py_DECREF(g);
			}
		}
	}
	loc = r->location != Py_None ? Py_NewRef(r->location)
		: PyObject_CallFunctionObjArgs(r->location_fn, storage, NULL);
	if (!loc)
		goto done;
	out = PyTuple_Pack(5, r->storage_s, PyTuple_GetItem(st, 0), key, loc, numel);
done:
	Py_XDECREF(st);
	Py_XDECREF(nbytes);
	Py_XDECREF(numel);
	Py_XDECREF(ptr);
	Py_XDECREF(cdata);
	Py_XDECREF(key);
	Py_XDECREF(loc);
	return out;
}

static PyObject *tr_call(PyObject *o, PyObject *args, PyObject *kw)
{
	ReducerObject *r = (ReducerObject *)o;
	PyObject *t;
	if (!PyArg_ParseTuple(args, "O:TensorReducer", &t))
		return NULL;
	PyObject *dtype = NULL;
	int plain = tr_plain(r, t, &dtype);
	if (plain < 0)
		return NULL;
	if (!plain)
		return PyObject_CallFunctionObjArgs(r->slow, t, NULL);
	PyObject *storage = NULL, *pid = NULL, *ref = NULL, *off = NULL, *size = NULL;
	PyObject *shape = NULL, *stride = NULL, *rg = NULL, *hooks = NULL, *meta = NULL;
	PyObject *rargs = NULL, *out = NULL;
	if (!(storage = call0(t, r->s_untyped_storage)) || !(pid = tr_pid(r, storage, dtype)) ||
	    !(ref = PyObject_CallFunctionObjArgs(r->pid_type, pid, NULL)) ||
	    !(off = call0(t, r->s_storage_offset)) || !(size = call0(t, r->s_size)) ||
	    !(shape = PySequence_Tuple(size)) || !(stride = call0(t, r->s_stride)) ||
	    !(rg = PyObject_GetAttr(t, r->s_requires_grad)) ||
	    !(hooks = PyObject_CallNoArgs(r->odict)) ||
	    !(meta = PyObject_CallFunctionObjArgs(r->meta_of, t, NULL)))
		goto done;
	int has_meta = PyObject_IsTrue(meta);
	if (has_meta < 0)
		goto done;
	rargs = has_meta ? PyTuple_Pack(7, ref, off, shape, stride, rg, hooks, meta)
		: PyTuple_Pack(6, ref, off, shape, stride, rg, hooks);
	if (rargs)
		out = PyTuple_Pack(2, r->rebuild, rargs);
done:
	Py_XDECREF(dtype);
	Py_XDECREF(storage);
	Py_XDECREF(pid);
	Py_XDECREF(ref);
	Py_XDECREF(off);
	Py_XDECREF(size);
	Py_XDECREF(shape);
	Py_XDECREF(stride);
	Py_XDECREF(rg);
	Py_XDECREF(hooks);
	Py_XDECREF(meta);
	Py_XDECREF(rargs);
	return out;
}

static PyType_Slot tr_slots[] = {
	{ Py_tp_new, tr_new },
	{ Py_tp_dealloc, tr_dealloc },
	{ Py_tp_call, tr_call },
	{ Py_tp_doc, "TensorReducer(slow, rebuild, strided, v3, tls, has_storage, meta_of, "
		     "odict, stypes,\nstype_fn, keys, storages, types, dtypes, location, "
		     "location_fn, pickling_error,\ngrow=None, grow_bytes=0, grow_extra=0)"
		     "\n--\n\ntorch.save's reduction of a plain "
		     "CPU tensor, in C (see nvio/_ext/pickling.c);\nany other tensor goes to "
		     "slow(t)." },
	{ 0, NULL }
};

static PyType_Spec tr_spec = {
	"nvio._nvio.TensorReducer", sizeof(ReducerObject), 0, Py_TPFLAGS_DEFAULT, tr_slots
};


/*
 * pickle_scan(data, roles) -> (fast, keys): one pass over a checkpoint's
 * pickle before anything unpickles it.
 *
 * nvio.load unpickles a weights-only data.pkl with CPython's C unpickler
 * when this scan says it may ("fast"), else with torch's weights-only
 * unpickler. The C unpickler with a restricted find_class is not as strict
 * as torch's: it serves EXT1/2/4 from copyreg's cache, sizes its memo by
 * the largest PUT index, and lets SETITEM(S), BUILD, OBJ, ADDITEMS and more
 * reach any object. So the scan admits a pickle to the fast path only when
 * it is made of what torch.save writes for dense tensors and state dicts,
 * under rules at least as strict as torch's weights-only unpickler
 * (torch/_weights_only_unpickler.py): only the opcodes that unpickler
 * admits; a coarse type per stack item (as in that unpickler, a MARK opens
 * a fresh stack); SETITEM(S) only on a dict or OrderedDict, APPEND(S) only
 * on a list; REDUCE only of an allowed global on a tuple; BUILD only of
 * a dict on an OrderedDict (a state dict's _metadata); no NEWOBJ; memo indices dense (a PUT at most one past the last); a global
 * used only as a function of REDUCE or as the storage type of a persistent
 * id; the persistent id the 5-tuple torch.save writes. Any doubt: not fast,
 * and torch's unpickler gives its verdict.
 *
 * roles: a dict {b"module\nname": role} of the globals the fast path
 * knows (ROLE_* below); any other global means not fast.
 *
 * keys: the storage keys of the persistent ids the pickle hands to
 * persistent_load (str, in order; repeats kept), so the caller reads only
 * the records the pickle references. For a pickle that is not fast they
 * are the ones found before the scan lost track (a parse error, a sparse
 * memo index): a caller must treat any other key it is asked for as
 * possible too.
 *
 * Memory: the scan's stack and memo hold one 8-byte item per opcode at
 * most, as torch's unpickler holds one pointer per stack item (a pickle of
 * a million Nones costs no more to scan than to unpickle).
 */
enum {
	ROLE_ODICT = 1,		/* collections.OrderedDict */
	ROLE_TENSOR = 2,	/* a rebuild function returning a tensor */
	ROLE_STORAGE = 3,	/* a storage type, in a persistent id */
};

enum {
	K_OTHER, K_NONE, K_BOOL, K_INT, K_FLOAT, K_STR, K_TUPLE, K_LIST, K_DICT,
	K_ODICT, K_SET, K_GLOBAL, K_PID, K_STORAGE, K_TENSOR,
};

/* 8 bytes, like the unpicklers' stack slots: a string's length is read
 * back from the opcode's argument before its bytes (scan_len). */
typedef struct {
	uint64_t kind : 5;		/* K_* */
	uint64_t role : 2;		/* K_GLOBAL: ROLE_* */
	uint64_t shortstr : 1;		/* K_STR, K_PID: SHORT_BINSTRING (1-byte length) */
	uint64_t off : 56;		/* K_STR: its bytes' offset; K_PID: its key's */
} scan_item;

#define SCAN_MAX_LEN ((Py_ssize_t)1 << 56)

typedef struct {
	const unsigned char *p;
	Py_ssize_t n, pos;
	scan_item *stack;
	Py_ssize_t depth, cap;
	Py_ssize_t *fences;		/* stack depth at each open MARK */
	Py_ssize_t nfences, fcap;
	scan_item *memo;
	Py_ssize_t nmemo, mcap;
	PyObject *roles, *keys;
	int fast;
} scan_state;

/* Grow *buf (elements of size sz) to hold need; -1 with MemoryError. */
static int scan_grow(void **buf, Py_ssize_t *cap, Py_ssize_t need, size_t sz)
{
	if (need <= *cap)
		return 0;
	Py_ssize_t c = *cap ? *cap * 2 : 64;
	if (c < need)
		c = need;
	void *b = PyMem_Realloc(*buf, (size_t)c * sz);
	if (!b) {
		PyErr_NoMemory();
		return -1;
	}
	*buf = b;
	*cap = c;
	return 0;
}

static int scan_push(scan_state *s, unsigned char kind)
{
	if (scan_grow((void **)&s->stack, &s->cap, s->depth + 1, sizeof(scan_item)) < 0)
		return -1;
	scan_item *it = &s->stack[s->depth++];
	*it = (scan_item){ .kind = kind };
	return 0;
}

/* Items above the innermost MARK. */
static Py_ssize_t scan_avail(scan_state *s)
{
	return s->depth - (s->nfences ? s->fences[s->nfences - 1] : 0);
}

/* Whether an item may not go into a container or to a call: a global or a
 * persistent id is the fast path's own wrapper object there, not what
 * torch's unpickler would put. */
static int scan_tainted(const scan_item *it)
{
	return it->kind == K_GLOBAL || it->kind == K_PID;
}

static unsigned scan_u32(const unsigned char *q)
{
	return (unsigned)q[0] | (unsigned)q[1] << 8 | (unsigned)q[2] << 16 | (unsigned)q[3] << 24;
}

/* The length of a K_STR's (or a K_PID key's) bytes: the argument of the
 * BINUNICODE or SHORT_BINSTRING just before them. */
static Py_ssize_t scan_len(scan_state *s, const scan_item *it)
{
	if (it->shortstr)
		return s->p[it->off - 1];
	return (Py_ssize_t)scan_u32(s->p + it->off - 4);
}

static int scan_is_str(scan_state *s, const scan_item *it, const char *want)
{
	size_t n = strlen(want);
	return it->kind == K_STR && (size_t)scan_len(s, it) == n &&
	       !memcmp(s->p + it->off, want, n);
}

/* A tuple of the items [from, depth): a K_PID when it is the persistent id
 * torch.save writes ("storage", storage type, key, location, numel). */
static int scan_tuple(scan_state *s, Py_ssize_t from)
{
	/* an empty MARK ... TUPLE pushes one item more than it pops */
	if (scan_grow((void **)&s->stack, &s->cap, from + 1, sizeof(scan_item)) < 0)
		return -1;
	scan_item *a = &s->stack[from];
	Py_ssize_t n = s->depth - from;
	scan_item t = { .kind = K_TUPLE };
	if (n == 5 && scan_is_str(s, &a[0], "storage") && a[1].kind == K_GLOBAL &&
	    a[1].role == ROLE_STORAGE && a[2].kind == K_STR && a[3].kind == K_STR &&
	    a[4].kind == K_INT) {
		t.kind = K_PID;
		t.off = a[2].off;
		t.shortstr = a[2].shortstr;
	} else {
		for (Py_ssize_t i = 0; i < n; i++)
			if (scan_tainted(&a[i]))
				s->fast = 0;
	}
	s->depth = from;
	s->stack[s->depth++] = t;
	return 0;
}

/* Bytes at the cursor; NULL when fewer than n are left. */
static const unsigned char *scan_take(scan_state *s, Py_ssize_t n)
{
	if (n < 0 || s->n - s->pos < n)
		return NULL;
	const unsigned char *q = s->p + s->pos;
	s->pos += n;
	return q;
}

static const unsigned char *scan_line(scan_state *s, Py_ssize_t *len)
{
	const unsigned char *q = s->p + s->pos;
	const unsigned char *nl = memchr(q, '\n', (size_t)(s->n - s->pos));
	if (!nl)
		return NULL;
	*len = nl - q;
	s->pos += *len + 1;
	return q;
}

/* GLOBAL: its role from roles, or not fast. 0, or -1 with an exception. */
static int scan_global(scan_state *s, int *stop)
{
	Py_ssize_t ml, nl;
	const unsigned char *m = scan_line(s, &ml);
	const unsigned char *nm = m ? scan_line(s, &nl) : NULL;
	if (!nm) {
		*stop = 1;
		return 0;
	}
	PyObject *k = PyBytes_FromStringAndSize(NULL, ml + 1 + nl);
	if (!k)
		return -1;
	char *kb = PyBytes_AsString(k);
	memcpy(kb, m, (size_t)ml);
	kb[ml] = '\n';
	memcpy(kb + ml + 1, nm, (size_t)nl);
	PyObject *r = PyDict_GetItemWithError(s->roles, k);
	Py_DECREF(k);
	if (!r && PyErr_Occurred())
		return -1;
	long role = r ? PyLong_AsLong(r) : 0;
	if (role == -1 && PyErr_Occurred())
		return -1;
	if (role < ROLE_ODICT || role > ROLE_STORAGE)
		s->fast = 0;
	if (scan_push(s, K_GLOBAL) < 0)
		return -1;
	if (role >= ROLE_ODICT && role <= ROLE_STORAGE)
		s->stack[s->depth - 1].role = (unsigned)role & 3;
	return 0;
}

static int scan_key(scan_state *s, const scan_item *pid)
{
	PyObject *k = PyUnicode_DecodeUTF8((const char *)s->p + pid->off, scan_len(s, pid),
					   "surrogatepass");
	if (!k) {
		if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
			return -1;
		PyErr_Clear();		/* the unpickler reports it */
		s->fast = 0;
		return 0;
	}
	int rc = PyList_Append(s->keys, k);
	Py_DECREF(k);
	return rc;
}

/* The opcodes torch's weights-only unpickler admits, and what each does to
 * the coarse stack. Returns 0 (go on), 1 (the scan lost track: stop; not
 * fast), 2 (STOP), -1 with an exception. */
/* scan_op's parts: SCAN_OTHER for an opcode that is not theirs. */
#define SCAN_OTHER 99

/* Opcodes that push a value (or say the protocol or the end). */
static int scan_value(scan_state *s, unsigned char op)
{
	const unsigned char *q;
	Py_ssize_t avail = scan_avail(s);
	scan_item *top = avail ? &s->stack[s->depth - 1] : NULL;
	int stop = 0;
	switch (op) {
	case 0x80:			/* PROTO */
		if (!(q = scan_take(s, 1)))
			return 1;
		if (q[0] < 2 || q[0] > 5)
			s->fast = 0;
		return 0;
	case '.':			/* STOP */
		if (!top || s->nfences || s->depth != 1 || scan_tainted(top))
			s->fast = 0;
		return 2;
	case 'c':			/* GLOBAL */
		if (scan_global(s, &stop) < 0)
			return -1;
		return stop;
	case 'N':
		return scan_push(s, K_NONE);
	case 0x88: case 0x89:		/* NEWTRUE, NEWFALSE */
		return scan_push(s, K_BOOL);
	case 'J': case 'K': case 'M': {	/* BININT, BININT1, BININT2 */
		Py_ssize_t w = op == 'J' ? 4 : op == 'K' ? 1 : 2;
		if (!scan_take(s, w))
			return 1;
		return scan_push(s, K_INT);
	}
	case 0x8a:			/* LONG1 */
		if (!(q = scan_take(s, 1)) || !scan_take(s, q[0]))
			return 1;
		return scan_push(s, K_INT);
	case 'G':			/* BINFLOAT */
		if (!scan_take(s, 8))
			return 1;
		return scan_push(s, K_FLOAT);
	case 'X': case 'U': {		/* BINUNICODE, SHORT_BINSTRING */
		Py_ssize_t len;
		if (op == 'X') {
			if (!(q = scan_take(s, 4)))
				return 1;
			len = (Py_ssize_t)scan_u32(q);
		} else {
			if (!(q = scan_take(s, 1)))
				return 1;
			len = q[0];
		}
		Py_ssize_t off = s->pos;
		if (!scan_take(s, len))
			return 1;
		if (scan_push(s, K_STR) < 0)
			return -1;
		s->stack[s->depth - 1].off = (uint64_t)off;
		s->stack[s->depth - 1].shortstr = op == 'U';
		return 0;
	}
	case ')':
		return scan_push(s, K_TUPLE);
	case ']':
		return scan_push(s, K_LIST);
	case '}':
		return scan_push(s, K_DICT);
	case 0x8f:			/* EMPTY_SET */
		return scan_push(s, K_SET);
	default:
		return SCAN_OTHER;
	}
}

/* Marks, tuples and the memo. */
static int scan_stack(scan_state *s, unsigned char op)
{
	const unsigned char *q;
	Py_ssize_t avail = scan_avail(s);
	scan_item *top = avail ? &s->stack[s->depth - 1] : NULL;
	switch (op) {
	case '(':			/* MARK */
		if (scan_grow((void **)&s->fences, &s->fcap, s->nfences + 1, sizeof(Py_ssize_t)) < 0)
			return -1;
		s->fences[s->nfences++] = s->depth;
		return 0;
	case 't':			/* TUPLE */
		if (!s->nfences)
			return 1;
		return scan_tuple(s, s->fences[--s->nfences]);
	case 0x85: case 0x86: case 0x87: {	/* TUPLE1, TUPLE2, TUPLE3 */
		Py_ssize_t k = op - 0x84;
		if (avail < k)
			return 1;
		return scan_tuple(s, s->depth - k);
	}
	case 'q': case 'r': {		/* BINPUT, LONG_BINPUT */
		Py_ssize_t w = op == 'q' ? 1 : 4;
		if (!(q = scan_take(s, w)) || !top)
			return 1;
		Py_ssize_t i = w == 1 ? q[0] : (Py_ssize_t)scan_u32(q);
		/* the C unpickler sizes its memo by the index: only dense
		 * indices (as picklers write them) keep it bounded */
		if (i > s->nmemo) {
			s->fast = 0;
			return 1;
		}
		if (i == s->nmemo) {
			if (scan_grow((void **)&s->memo, &s->mcap, s->nmemo + 1, sizeof(scan_item)) < 0)
				return -1;
			s->nmemo++;
		}
		s->memo[i] = *top;
		return 0;
	}
	case 'h': case 'j': {		/* BINGET, LONG_BINGET */
		Py_ssize_t w = op == 'h' ? 1 : 4;
		if (!(q = scan_take(s, w)))
			return 1;
		Py_ssize_t i = w == 1 ? q[0] : (Py_ssize_t)scan_u32(q);
		if (i >= s->nmemo)
			return 1;
		if (scan_push(s, K_OTHER) < 0)
			return -1;
		s->stack[s->depth - 1] = s->memo[i];
		return 0;
	}
	case 'Q': {			/* BINPERSID */
		if (!top)
			return 1;
		scan_item pid = *top;
		s->depth--;
		if (pid.kind == K_PID) {
			if (scan_key(s, &pid) < 0)
				return -1;
		} else {
			s->fast = 0;
		}
		return scan_push(s, K_STORAGE);
	}
	default:
		return SCAN_OTHER;
	}
}

/* Opcodes that build on what is on the stack. */
static int scan_build(scan_state *s, unsigned char op)
{
	Py_ssize_t avail = scan_avail(s);
	scan_item *top = avail ? &s->stack[s->depth - 1] : NULL;
	switch (op) {
	case 'R': {			/* REDUCE */
		if (avail < 2)
			return 1;
		scan_item args = s->stack[s->depth - 1], fn = s->stack[s->depth - 2];
		s->depth -= 1;
		unsigned char kind = K_OTHER;
		if (fn.kind == K_GLOBAL && args.kind == K_TUPLE && fn.role == ROLE_ODICT)
			kind = K_ODICT;
		else if (fn.kind == K_GLOBAL && args.kind == K_TUPLE && fn.role == ROLE_TENSOR)
			kind = K_TENSOR;
		else
			s->fast = 0;
		s->stack[s->depth - 1] = (scan_item){ .kind = kind };
		return 0;
	}
	case 0x81:			/* NEWOBJ: torch's rules, not the fast path's */
		if (avail < 2)
			return 1;
		s->fast = 0;
		s->depth -= 1;
		s->stack[s->depth - 1] = (scan_item){ .kind = K_OTHER };
		return 0;
	case 'b':			/* BUILD */
		if (avail < 2)
			return 1;
		/* torch.save's only BUILD: a state dict's attributes (its
		 * _metadata), a dict of them, on an OrderedDict; both
		 * unpicklers update its __dict__ then */
		if (top->kind != K_DICT || s->stack[s->depth - 2].kind != K_ODICT)
			s->fast = 0;
		s->depth -= 1;
		return 0;
	case 'a':			/* APPEND */
		if (avail < 2)
			return 1;
		if (s->stack[s->depth - 2].kind != K_LIST || scan_tainted(top))
			s->fast = 0;
		s->depth -= 1;
		return 0;
	case 's':			/* SETITEM */
		if (avail < 3)
			return 1;
		if ((s->stack[s->depth - 3].kind != K_DICT && s->stack[s->depth - 3].kind != K_ODICT) ||
		    scan_tainted(top) || scan_tainted(top - 1))
			s->fast = 0;
		s->depth -= 2;
		return 0;
	case 'e': case 'u': {		/* APPENDS, SETITEMS */
		if (!s->nfences)
			return 1;
		Py_ssize_t from = s->fences[--s->nfences];
		/* the target: the item below the MARK, in the enclosing stack */
		if (from <= (s->nfences ? s->fences[s->nfences - 1] : 0))
			return 1;
		unsigned char k = s->stack[from - 1].kind;
		if (op == 'e' ? k != K_LIST :
		    (k != K_DICT && k != K_ODICT) || (s->depth - from) % 2)
			s->fast = 0;
		for (Py_ssize_t i = from; i < s->depth; i++)
			if (scan_tainted(&s->stack[i]))
				s->fast = 0;
		s->depth = from;
		return 0;
	}
	default:
		return SCAN_OTHER;
	}
}

static int scan_op(scan_state *s)
{
	const unsigned char *q = scan_take(s, 1);
	if (!q)
		return 1;
	int rc = scan_value(s, q[0]);
	if (rc == SCAN_OTHER)
		rc = scan_stack(s, q[0]);
	if (rc == SCAN_OTHER)
		rc = scan_build(s, q[0]);
	if (rc == SCAN_OTHER) {	/* torch's weights-only unpickler refuses it */
		s->fast = 0;
		return 1;
	}
	return rc;
}

static PyObject *m_pickle_scan(PyObject *m, PyObject *args)
{
	(void)m;
	Py_buffer b;
	PyObject *roles;
	if (!PyArg_ParseTuple(args, "y*O!:pickle_scan", &b, &PyDict_Type, &roles))
		return NULL;
	scan_state s;
	memset(&s, 0, sizeof(s));
	s.p = b.buf;
	s.n = b.len;
	s.roles = roles;
	s.fast = 1;
	s.keys = PyList_New(0);
	if (s.n >= SCAN_MAX_LEN) {	/* offsets past what an item holds: not fast */
		s.fast = 0;
		s.n = 0;
	}
	int rc = s.keys ? 0 : -1;
	while (rc == 0)
		rc = scan_op(&s);
	if (rc == 1)		/* lost track before STOP */
		s.fast = 0;
	PyMem_Free(s.stack);
	PyMem_Free(s.fences);
	PyMem_Free(s.memo);
	PyBuffer_Release(&b);
	if (rc < 0) {
		Py_XDECREF(s.keys);
		return NULL;
	}
	return Py_BuildValue("(ON)", s.fast ? Py_True : Py_False, s.keys);
}

static PyMethodDef pickling_functions[] = {
	{ "persistent_id_filter", m_persistent_id_filter, METH_VARARGS,
	  "persistent_id_filter(plain, fn)\n--\n\nA persistent_id answering None for objects whose\n"
	  "exact type is in plain, fn(obj) for the others." },
	{ "pickle_scan", m_pickle_scan, METH_VARARGS,
	  "pickle_scan(data, roles)\n--\n\n(fast, keys): whether nvio.load may unpickle data with\n"
	  "the C unpickler, and the storage keys its persistent ids name." },
	{ NULL, NULL, 0, NULL }
};

int ext_pickling_exec(PyObject *m, ext_state *st)
{
	(void)st;
	PyType_Spec *specs[] = { &pid_spec, &tr_spec };
	const char *names[] = { "PersistentId", "TensorReducer" };
	for (int i = 0; i < 2; i++) {
		PyObject *t = PyType_FromModuleAndSpec(m, specs[i], NULL);
		if (!t)
			return -1;
		int rc = PyModule_AddObjectRef(m, names[i], t);
		Py_DECREF(t);
		if (rc < 0)
			return -1;
	}
	return PyModule_AddFunctions(m, pickling_functions);
}
