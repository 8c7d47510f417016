/*
 * Pickling helpers for checkpoints.
 *
 * persistent_id_filter(plain, fn): a persistent_id for pickle.Pickler that
 * answers None itself for an object whose exact type is in the set plain
 * and calls fn(obj) for any other. The C pickler asks persistent_id about
 * every object it saves, ints and strings included (19 times per tensor
 * of a state dict); answered in Python that was a third of a checkpoint's
 * pickling time for thousands of small tensors.
 */
#include "ext.h"

#include <string.h>

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
	return PyModule_AddFunctions(m, pickling_functions);
}
