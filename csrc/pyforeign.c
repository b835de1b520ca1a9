/* The inner loop of pygrad -> tinygrad conversion (pygrad/interop/tinygrad_out.py) as one CPython builtin: the rows
   of an exported node table that are plain elementwise ops are made into a foreign IR's hash-consed nodes, as the
   Python loop makes them, without its per-row bytecode. The foreign IR is described by the caller (a cache dict from
   key tuples (op, dtype, src, arg, None) to weak references, the node class, op and dtype tables), so nothing here
   names tinygrad. The loop stops at the first row it does not make (a tag, an op it has no entry for, a source not
   made yet, operands that are all weak) and returns its position: Python makes that row, then calls again. Metadata
   (a dict from weak references to tuples) is set as the Python loop sets it. A source not made yet (a helper row made
   only when asked for) is made here if its plan says how (a broadcast, a reshape left to be made on demand, a row
   held reduced: lazy_row), else asked of the caller's `lazy`, as the Python loop asks. With the node class's field
   descriptors given (its __init__ only sets them), a node is made by setting them on a bare instance, without the
   __init__ frame. Rows given a plan by the caller (a reduce made as a permute and a reduce of the node, a permute of
   a node held reduced, any other permute, an expand) are made by it, as the Python loop makes them. Every argument
   is checked: a wrong one raises TypeError/IndexError, never crashes. */
#include "pyapi.h"
#include <limits.h>
#include <string.h>

/* cfg: (out, op, dt, tag, start, src, pdata, alu, dtypes, weak, cache, cls, cast, mdata, mdrm, mds, lazy, fields,
   reduced, plans)
   out: list, the foreign node of each row (None: not made); op, dt, tag, start, src, pdata: the exported columns,
   each a bytes object of native int32 items (start: int64, one more item than rows): read in place, where lists of
   ints cost a pointer chase to a scattered int object for every read (a quarter of the loop's time at W1 depth
   2000); alu: tuple, pygrad op -> foreign op or None; dtypes: tuple,
   dtype id -> foreign dtype or None; weak: tuple of the foreign dtypes an operand may have without typing the op;
   cache: the hash-consing dict; cls: the node class; cast: (pygrad CAST, foreign CAST, pygrad BITCAST, foreign
   BITCAST); mdata: the metadata dict or None; mdrm: its weak references' callback; mds: dict pdata -> metadata;
   lazy: lazy(j) -> the node of row j, made now (None: such a row is left to Python); fields: the node class's five
   field descriptors, in key order, or None (the class is called); reduced: dict row -> (node held without the
   reduced axes, its shape, the row's shape, the axes it lacks), the rows held reduced; plans: None, or a list with
   each row's plan or None (see plan_row). */
enum { C_OUT, C_OP, C_DT, C_TAG, C_START, C_SRC, C_PDATA, C_ALU, C_DTYPES, C_WEAK, C_CACHE, C_CLS, C_CAST, C_MDATA,
       C_MDRM, C_MDS, C_LAZY, C_FIELDS, C_REDUCED, C_PLANS, C_N };

/* a column: n native ints of 4 bytes (8 if wide) at p, inside a bytes object the configuration holds */
typedef struct {
  const char *p;
  Py_ssize_t n;
  int wide;
} col_t;

typedef struct {
  PyObject *out, *alu, *dtypes, *weak, *cache, *cls, *mdata, *mdrm, *mds, *lazy;
  PyObject *reduced, *plans;
  col_t op, dt, tag, start, src, pdata;
  PyObject *fields[5];  /* with alloc: the field descriptors */
  newfunc alloc;         /* the class's tp_new, or NULL: the class is called */
  descrsetfunc set[5];   /* each field descriptor's setter, with fields */
  long cast_op, bitcast_op;
  PyObject *tcast, *tbitcast;
  Py_ssize_t n;  /* rows */
  ternaryfunc make;  /* type.__call__: the node class's own construction (its __init__), not its metaclass's */
} cfg_t;

static PyObject *dtype_name;

/* item i of list l as a long; -1 with an exception set if it is none */
static int list_long(PyObject *l, Py_ssize_t i, long *v) {
  PyObject *o = PyList_GetItem(l, i);
  if (!o) return -1;
  *v = PyLong_AsLong(o);
  return *v == -1 && PyErr_Occurred() ? -1 : 0;
}

static int bad(const char *what) {
  PyErr_Format(PyExc_TypeError, "pygrad C core: foreign rows: %s", what);
  return -1;
}

/* bad(what) for the functions that return an object: NULL with the TypeError set */
static PyObject *bad_obj(const char *what) {
  bad(what);
  return NULL;
}

/* column c read from o, a bytes object of whole items; -1 with an exception set if it is none */
static int read_col(PyObject *o, int wide, col_t *c) {
  Py_ssize_t size, w = wide ? 8 : 4;
  if (!PyBytes_Check(o)) return bad("the columns must be bytes");
  size = PyBytes_Size(o);
  if (size % w) return bad("a column's size is no whole number of items");
  c->n = size / w, c->wide = wide;
  return (c->p = PyBytes_AsString(o)) ? 0 : -1;
}

/* item i of column c as a long (memcpy: bytes data need not be aligned for the item); -1 with an IndexError or
   OverflowError set if it is out of the column or of a long */
static int col_long(const col_t *c, Py_ssize_t i, long *v) {
  int32_t x;
  int64_t y;
  if (i < 0 || i >= c->n) {
    PyErr_SetString(PyExc_IndexError, "pygrad C core: foreign rows: a row out of a column");
    return -1;
  }
  if (!c->wide) {
    memcpy(&x, c->p + 4 * i, 4);
    *v = x;
    return 0;
  }
  memcpy(&y, c->p + 8 * i, 8);
  if (y > LONG_MAX || y < LONG_MIN) {
    PyErr_SetString(PyExc_OverflowError, "pygrad C core: foreign rows: a start past a long");
    return -1;
  }
  *v = (long)y;
  return 0;
}

/* the field descriptors (a tuple of 5 objects whose type has a setter), the setters and the class's allocator; or
   none (fs is None) */
static int read_fields(PyObject *fs, cfg_t *c) {
  Py_ssize_t i;
  c->alloc = NULL;
  if (fs == Py_None) return 0;
  if (!PyTuple_Check(fs) || PyTuple_Size(fs) != 5) return bad("fields must be None or a tuple of 5 descriptors");
  for (i = 0; i < 5; i++) {
    c->fields[i] = PyTuple_GetItem(fs, i);
    c->set[i] = (descrsetfunc)PyType_GetSlot(Py_TYPE(c->fields[i]), Py_tp_descr_set);
    if (!c->set[i]) return bad("a field descriptor has no setter");
  }
  c->alloc = (newfunc)PyType_GetSlot((PyTypeObject *)c->cls, Py_tp_new);
  if (!c->alloc) return bad("cls has no tp_new");
  return 0;
}

static int read_cfg(PyObject *t, cfg_t *c) {
  PyObject *cast;
  Py_ssize_t i;
  if (!PyTuple_Check(t) || PyTuple_Size(t) != C_N) return bad("the configuration is no tuple of 20");
  c->out = PyTuple_GetItem(t, C_OUT), c->alu = PyTuple_GetItem(t, C_ALU), c->dtypes = PyTuple_GetItem(t, C_DTYPES);
  c->weak = PyTuple_GetItem(t, C_WEAK), c->cache = PyTuple_GetItem(t, C_CACHE), c->cls = PyTuple_GetItem(t, C_CLS);
  c->mdata = PyTuple_GetItem(t, C_MDATA), c->mdrm = PyTuple_GetItem(t, C_MDRM), c->mds = PyTuple_GetItem(t, C_MDS);
  cast = PyTuple_GetItem(t, C_CAST);
  if (!PyList_Check(c->out)) return bad("out must be a list");
  if (read_col(PyTuple_GetItem(t, C_OP), 0, &c->op) < 0 || read_col(PyTuple_GetItem(t, C_DT), 0, &c->dt) < 0 ||
      read_col(PyTuple_GetItem(t, C_TAG), 0, &c->tag) < 0 || read_col(PyTuple_GetItem(t, C_START), 1, &c->start) < 0 ||
      read_col(PyTuple_GetItem(t, C_SRC), 0, &c->src) < 0 || read_col(PyTuple_GetItem(t, C_PDATA), 0, &c->pdata) < 0)
    return -1;
  c->n = PyList_Size(c->out);
  if (c->op.n != c->n || c->dt.n != c->n || c->tag.n != c->n || c->pdata.n != c->n || c->start.n != c->n + 1)
    return bad("the columns' lengths differ");
  if (!PyTuple_Check(c->alu) || !PyTuple_Check(c->dtypes) || !PyTuple_Check(c->weak))
    return bad("tables must be tuples");
  if (!PyDict_Check(c->cache)) return bad("the cache must be a dict");
  if (!PyType_Check(c->cls)) return bad("cls must be a class");
  if (c->mdata != Py_None && (!PyDict_Check(c->mdata) || !PyDict_Check(c->mds))) return bad("mdata and mds: dicts");
  if (!PyTuple_Check(cast) || PyTuple_Size(cast) != 4) return bad("cast must be a tuple of 4");
  c->cast_op = PyLong_AsLong(PyTuple_GetItem(cast, 0));
  if (c->cast_op == -1 && PyErr_Occurred()) return -1;
  c->bitcast_op = PyLong_AsLong(PyTuple_GetItem(cast, 2));
  if (c->bitcast_op == -1 && PyErr_Occurred()) return -1;
  c->tcast = PyTuple_GetItem(cast, 1), c->tbitcast = PyTuple_GetItem(cast, 3);
  for (i = 0; i < PyTuple_Size(c->weak); i++)
    if (!PyTuple_GetItem(c->weak, i)) return -1;
  c->make = (ternaryfunc)PyType_GetSlot(&PyType_Type, Py_tp_call);
  if (!c->make) return bad("type has no call");
  c->lazy = PyTuple_GetItem(t, C_LAZY);
  if (c->lazy != Py_None && !PyCallable_Check(c->lazy)) return bad("lazy must be callable or None");
  c->reduced = PyTuple_GetItem(t, C_REDUCED), c->plans = PyTuple_GetItem(t, C_PLANS);
  if (!PyDict_Check(c->reduced)) return bad("reduced must be a dict");
  if (c->plans != Py_None && (!PyList_Check(c->plans) || PyList_Size(c->plans) != c->n))
    return bad("plans must be None or a list with an item a row");
  return read_fields(PyTuple_GetItem(t, C_FIELDS), c);
}

/* the entry of table t (a tuple) at i, borrowed, or NULL (no error) if i is out of it or the entry is None */
static PyObject *entry(PyObject *t, long i) {
  PyObject *o;
  if (i < 0 || i >= PyTuple_Size(t)) return NULL;
  o = PyTuple_GetItem(t, i);
  return o == Py_None ? NULL : o;
}

/* 1 if node x's dtype is one of the weak ones, 0 if not, -1 with an exception set */
static int is_weak(const cfg_t *c, PyObject *x) {
  PyObject *d = PyObject_GetAttr(x, dtype_name);
  Py_ssize_t i, n = PyTuple_Size(c->weak);
  int r = 0;
  if (!d) return -1;
  for (i = 0; i < n && !r; i++) r = PyTuple_GetItem(c->weak, i) == d;
  Py_DECREF(d);
  return r;
}

/* a new node with the fields of key (a tuple of 5): the class called, or a bare instance given them (its __init__
   would set just these); a new reference, or NULL with an exception set */
static PyObject *make(const cfg_t *c, PyObject *key) {
  PyObject *t, *none;
  int i;
  if (!c->alloc) return c->make(c->cls, key, NULL);
  if (!(none = PyTuple_New(0))) return NULL;
  t = c->alloc((PyTypeObject *)c->cls, none, NULL);
  Py_DECREF(none);
  if (!t) return NULL;
  for (i = 0; i < 5; i++)
    if (c->set[i](c->fields[i], t, PyTuple_GetItem(key, i)) < 0) {
      Py_DECREF(t);
      return NULL;
    }
  return t;
}

/* the hash-consed node of key (a new reference; *fresh set if made here), or NULL with an exception set */
static PyObject *node_of(const cfg_t *c, PyObject *key, int *fresh) {
  PyObject *w = PyDict_GetItemWithError(c->cache, key), *t;
  *fresh = 0;
  if (w) {
    Py_INCREF(w);  /* calling it may run code that drops the cache's entry */
    t = PyObject_CallNoArgs(w);
    Py_DECREF(w);
    if (!t) return NULL;
    if (t != Py_None) return t;
    Py_DECREF(t);
  } else if (PyErr_Occurred()) return NULL;
  if (!(t = make(c, key))) return NULL;
  if (!(w = PyWeakref_NewRef(t, NULL)) || PyDict_SetItem(c->cache, key, w) < 0) {
    Py_XDECREF(w);
    Py_DECREF(t);
    return NULL;
  }
  Py_DECREF(w);
  *fresh = 1;
  return t;
}

/* metadata of row i onto node t, as the Python loop sets it: unless t has some already (a node made before);
   1 if set or none is due, 0 if pdata has no entry in mds (Python sets it), -1 with an exception set */
static int set_md(const cfg_t *c, Py_ssize_t i, PyObject *t, int fresh) {
  long p;
  PyObject *pk, *m, *w;
  int r;
  if (c->mdata == Py_None) return 1;
  if (col_long(&c->pdata, i, &p) < 0) return -1;
  if (!p) return 1;
  if (!(pk = PyLong_FromLong(p))) return -1;
  m = PyDict_GetItemWithError(c->mds, pk);
  Py_DECREF(pk);
  if (!m) return PyErr_Occurred() ? -1 : 0;
  if (!fresh) {
    if (!(w = PyWeakref_NewRef(t, NULL))) return -1;
    r = PyDict_Contains(c->mdata, w);
    Py_DECREF(w);
    if (r) return r < 0 ? -1 : 1;
  }
  if (!(w = PyWeakref_NewRef(t, c->mdrm == Py_None ? NULL : c->mdrm))) return -1;
  r = PyDict_SetItem(c->mdata, w, m);
  Py_DECREF(w);
  return r < 0 ? -1 : 1;
}

enum { LAZY_DEPTH = 8 };  /* helper rows sit a few deep (a broadcast of a reshape of a held reduce): deeper ones
                              are asked of Python's lazy, so the C recursion stays bounded by a constant */

static PyObject *lazy_row(const cfg_t *c, long j, int depth);

/* the node of source row j (a new reference): made already, or made now (a helper row: in C by its plan, see
   lazy_row, else by the caller's lazy); NULL with no exception set if Python makes it (no lazy), NULL with one set */
static PyObject *source_at(const cfg_t *c, long j, int depth) {
  PyObject *x;
  if (j < 0 || j >= c->n) {
    PyErr_SetString(PyExc_IndexError, "pygrad C core: foreign rows: a source row out of range");
    return NULL;
  }
  if (!(x = PyList_GetItem(c->out, j))) return NULL;
  if (x != Py_None) {
    Py_INCREF(x);
    return x;
  }
  if (c->lazy == Py_None) return NULL;  /* made by Python, lazily */
  if (depth < LAZY_DEPTH && c->plans != Py_None) {
    x = lazy_row(c, j, depth + 1);
    if (x || PyErr_Occurred()) return x;
  }
  return PyObject_CallFunction(c->lazy, "l", j);  /* a helper row, made now by Python */
}

static PyObject *source(const cfg_t *c, long j) { return source_at(c, j, 0); }

/* the hash-consed node (op, x's dtype, (x,), arg, None) of a movement or reduce, or with s not NULL (op, x's dtype,
   (x, s), None, None) of a movement whose shape is a source node s (a reshape or an expand): a new reference (*fresh
   as node_of sets it), or NULL with an exception set */
static PyObject *moved(const cfg_t *c, PyObject *op, PyObject *x, PyObject *s, PyObject *arg, int *fresh) {
  PyObject *d = PyObject_GetAttr(x, dtype_name), *src, *key, *t;
  if (!d) return NULL;
  src = s ? PyTuple_Pack(2, x, s) : PyTuple_Pack(1, x);
  key = src ? PyTuple_Pack(5, op, d, src, s ? Py_None : arg, Py_None) : NULL;
  Py_DECREF(d);
  Py_XDECREF(src);
  if (!key) return NULL;
  t = node_of(c, key, fresh);
  Py_DECREF(key);
  return t;
}

/* x, or op applied to x if arg is not None (x's reference passed on: a new reference, or NULL with an exception
   set) */
static PyObject *maybe(const cfg_t *c, PyObject *op, PyObject *x, PyObject *arg, int *fresh) {
  PyObject *t;
  if (arg == Py_None) return x;
  t = moved(c, op, x, NULL, arg, fresh);
  Py_DECREF(x);
  return t;
}

/* the first row from source row j down its chain of reshapes left to be made on demand (untagged RESHAPE rows, op
   number reshape, not made yet), as the Python loop's _reshaped skips them; -1 with an exception set. The chain
   is followed at most once a row (a table's sources come before their users: a longer one is a bad table) */
static long unfold(const cfg_t *c, long j, long reshape) {
  long o, tg, a, b;
  Py_ssize_t steps;
  PyObject *cur;
  for (steps = 0; steps <= c->n; steps++) {
    if (j < 0 || j >= c->n) {
      PyErr_SetString(PyExc_IndexError, "pygrad C core: foreign rows: a source row out of range");
      return -1;
    }
    if (col_long(&c->op, j, &o) < 0 || col_long(&c->tag, j, &tg) < 0) return -1;
    if (o != reshape || tg) return j;
    if (!(cur = PyList_GetItem(c->out, j))) return -1;
    if (cur != Py_None) return j;
    if (col_long(&c->start, j, &a) < 0 || col_long(&c->start, j + 1, &b) < 0) return -1;
    if (a < 0 || b != a + 1 || b > c->src.n) return bad("a reshape row has one source in the column");
    if (col_long(&c->src, a, &j) < 0) return -1;
  }
  return bad("a reshape chain longer than the table");
}

/* the held node got[0] (got: a held row's (node, its shape, the shape wanted, axes), checked) reshaped to shape
   unless got[1] is that shape already (reshape: the foreign RESHAPE, sarg: shape's operand node), as the Python
   loop's _reshaped makes it: a new reference, or NULL with an exception set */
static PyObject *held_as(const cfg_t *c, PyObject *got, PyObject *shape, PyObject *reshape, PyObject *sarg) {
  PyObject *x = PyTuple_GetItem(got, 0);
  int eq = PyObject_RichCompareBool(PyTuple_GetItem(got, 1), shape, Py_EQ), fresh;
  if (eq < 0) return NULL;
  if (eq) {
    Py_INCREF(x);
    return x;
  }
  return moved(c, reshape, x, sarg, Py_None, &fresh);
}

/* row j, an untagged RESHAPE left to be made on demand (plan (5, shid, reshape, shape, treshape, sarg): shid a
   column of int32 shape ids a row, reshape pygrad's RESHAPE op number, shape the row's shape, treshape the foreign
   RESHAPE, sarg the shape's operand node), made as the Python loop's _reshaped makes it with reshapes folded: the
   first row r below the chain of such rows (unfold), its held node (held_as) if it is held reduced, else its node
   as it is if its shape id is row j's, else reshaped. A new reference, NULL with no exception set if Python makes
   it, NULL with one set */
static PyObject *folded(const cfg_t *c, long j, PyObject *plan, int depth) {
  col_t shid;
  long reshape, r, sr, sj;
  PyObject *k, *got, *x, *t;
  int fresh;
  if (PyTuple_Size(plan) != 6) return bad_obj("a reshape plan must be a tuple of 6");
  if (read_col(PyTuple_GetItem(plan, 1), 0, &shid) < 0) return NULL;
  if (shid.n != c->n) return bad_obj("a reshape plan's shape ids must be one a row");
  reshape = PyLong_AsLong(PyTuple_GetItem(plan, 2));
  if (reshape == -1 && PyErr_Occurred()) return NULL;
  if ((r = unfold(c, j, reshape)) < 0) return NULL;
  if (!(k = PyLong_FromLong(r))) return NULL;
  got = PyDict_GetItemWithError(c->reduced, k);
  Py_DECREF(k);
  if (!got && PyErr_Occurred()) return NULL;
  if (got) {
    if (!PyTuple_Check(got) || PyTuple_Size(got) != 4) return bad_obj("a held row must be a tuple of 4");
    return held_as(c, got, PyTuple_GetItem(plan, 3), PyTuple_GetItem(plan, 4), PyTuple_GetItem(plan, 5));
  }
  if (col_long(&shid, r, &sr) < 0 || col_long(&shid, j, &sj) < 0) return NULL;
  if (!(x = source_at(c, r, depth))) return NULL;
  if (sr == sj) return x;
  t = moved(c, PyTuple_GetItem(plan, 4), x, PyTuple_GetItem(plan, 5), Py_None, &fresh);
  Py_DECREF(x);
  return t;
}

/* helper row j (not made yet) made now by its plan, as the Python loop's _lazy makes it, and kept in out: a row
   held reduced, reshaped to the shape its users see (its plan of kind 1 or 2 ends with the foreign RESHAPE and that
   shape's operand node, for the held shape it names); (4,): a broadcast, its source's node; (5, ...): a reshape made
   on demand (folded). A new reference, NULL with no exception set if Python makes it (another plan, none, or a held
   shape its plan does not name), NULL with one set */
static PyObject *lazy_row(const cfg_t *c, long j, int depth) {
  PyObject *plan = PyList_GetItem(c->plans, j), *k, *got, *t;
  Py_ssize_t len;
  long kind, a, b, x;
  int eq;
  if (!plan) return NULL;
  if (!(k = PyLong_FromLong(j))) return NULL;
  got = PyDict_GetItemWithError(c->reduced, k);
  Py_DECREF(k);
  if (!got && PyErr_Occurred()) return NULL;
  if (plan == Py_None) return NULL;
  if (!PyTuple_Check(plan) || (len = PyTuple_Size(plan)) < 1) return bad_obj("a plan must be a non-empty tuple");
  kind = PyLong_AsLong(PyTuple_GetItem(plan, 0));
  if (kind == -1 && PyErr_Occurred()) return NULL;
  if (got) {
    if (!PyTuple_Check(got) || PyTuple_Size(got) != 4) return bad_obj("a held row must be a tuple of 4");
    if (!(kind == 1 && len == 10) && !(kind == 2 && len == 8)) return NULL;  /* Python's _lazy */
    eq = PyObject_RichCompareBool(PyTuple_GetItem(got, 2), PyTuple_GetItem(plan, kind == 1 ? 6 : 4), Py_EQ);
    if (eq <= 0) return NULL;  /* an error, or another shape: Python's _lazy */
    t = held_as(c, got, PyTuple_GetItem(got, 2), PyTuple_GetItem(plan, len - 2), PyTuple_GetItem(plan, len - 1));
  } else if (kind == 4) {
    if (len != 1) return bad_obj("a broadcast plan must be a tuple of 1");
    if (col_long(&c->start, j, &a) < 0 || col_long(&c->start, j + 1, &b) < 0) return NULL;
    if (a < 0 || b <= a || b > c->src.n) return bad_obj("a broadcast row has a source in the column");
    if (col_long(&c->src, a, &x) < 0) return NULL;
    t = source_at(c, x, depth);
  } else if (kind == 5) t = folded(c, j, plan, depth);
  else return NULL;
  if (!t) return NULL;
  Py_INCREF(t);
  if (PyList_SetItem(c->out, j, t) < 0) {  /* steals one reference */
    Py_DECREF(t);
    return NULL;
  }
  return t;
}

/* row i, an untagged EXPAND, made by its plan (3, shid, reshape, kept_sid, kept, treshape, kept_arg, texpand,
   grown_arg, tpermute, perm) as the Python loop's _expand makes it with reshapes folded: the node of the first row
   r below its source's chain of reshapes made on demand (unfold; its held node if r is held reduced) reshaped to
   the shape without the grown axes (kept; shape operand kept_arg) unless it has that shape already (the held
   shape, or r's shape id in shid, a column of int32 shape ids a row, against kept_sid), expanded by the grown axes
   put in front (grown_arg), and permuted back by perm unless it is None. Metadata as one_row sets it, on the last
   node. 1: made, 0: left to Python, -1 with an exception set */
static int expand_row(const cfg_t *c, Py_ssize_t i, PyObject *plan) {
  col_t shid;
  long a, b, j, reshape, want, sid;
  PyObject *k, *got, *x, *t, *perm;
  int fresh = 0, eq, r;
  if (PyTuple_Size(plan) != 11) return bad("an expand plan must be a tuple of 11");
  if (read_col(PyTuple_GetItem(plan, 1), 0, &shid) < 0) return -1;
  if (shid.n != c->n) return bad("an expand plan's shape ids must be one a row");
  reshape = PyLong_AsLong(PyTuple_GetItem(plan, 2));
  if (reshape == -1 && PyErr_Occurred()) return -1;
  want = PyLong_AsLong(PyTuple_GetItem(plan, 3));
  if (want == -1 && PyErr_Occurred()) return -1;
  if (col_long(&c->start, i, &a) < 0 || col_long(&c->start, i + 1, &b) < 0) return -1;
  if (a < 0 || b != a + 1 || b > c->src.n) return bad("a planned row has one source in the column");
  if (col_long(&c->src, a, &j) < 0 || (j = unfold(c, j, reshape)) < 0) return -1;
  if (!(k = PyLong_FromLong(j))) return -1;
  got = PyDict_GetItemWithError(c->reduced, k);
  Py_DECREF(k);
  if (!got && PyErr_Occurred()) return -1;
  if (got) {
    if (!PyTuple_Check(got) || PyTuple_Size(got) != 4) return bad("a held row must be a tuple of 4");
    x = PyTuple_GetItem(got, 0);
    Py_INCREF(x);
    if ((eq = PyObject_RichCompareBool(PyTuple_GetItem(got, 1), PyTuple_GetItem(plan, 4), Py_EQ)) < 0) {
      Py_DECREF(x);
      return -1;
    }
  } else {
    if (!(x = source(c, j))) return PyErr_Occurred() ? -1 : 0;
    if (col_long(&shid, j, &sid) < 0) {
      Py_DECREF(x);
      return -1;
    }
    eq = sid == want;
  }
  if (!eq) {
    t = moved(c, PyTuple_GetItem(plan, 5), x, PyTuple_GetItem(plan, 6), Py_None, &fresh);
    Py_DECREF(x);
    if (!(x = t)) return -1;
  }
  t = moved(c, PyTuple_GetItem(plan, 7), x, PyTuple_GetItem(plan, 8), Py_None, &fresh);
  Py_DECREF(x);
  if (!t) return -1;
  if ((perm = PyTuple_GetItem(plan, 10)) != Py_None) {
    x = moved(c, PyTuple_GetItem(plan, 9), t, NULL, perm, &fresh);
    Py_DECREF(t);
    if (!(t = x)) return -1;
  }
  if ((r = set_md(c, i, t, fresh)) < 0) {
    Py_DECREF(t);
    return -1;
  }
  if (PyList_SetItem(c->out, i, t) < 0) return -1;  /* steals t */
  return r ? 1 : 0;
}

/* row i (one source) made by its plan, a tuple as the caller's _row_plans makes it:
   (0, op, arg): the node op(x) of the source's node x (arg not None); the source must not be held reduced.
   (1, permute, perm, reduce, rarg, kept, keep, axes, reshape, keep_arg): x permuted by perm (if not None) and
   reduced by rarg (if not None; perm is None when rarg is) is held for row i as (node, kept, keep, axes) in reduced,
   out[i] left empty (a user's reshape of it to keep, the foreign reshape to keep's operand node keep_arg, is made
   only when asked for: lazy_row).
   (2, permute, perm, kept, shape, gone, reshape, shape_arg): the source's held node permuted by perm (if not None)
   is held for row i as (node, kept, shape, gone); the source must be held.
   (3, ...): an expand (expand_row). (4,), (5, ...): a helper row (lazy_row), no metadata set (as the Python loop
   makes a root that is a helper row).
   Metadata as one_row sets it, on the row's last node. 1: made, 0: left to Python, -1 with an exception set */
static int plan_row(const cfg_t *c, Py_ssize_t i, PyObject *plan) {
  long kind, a, b, j;
  Py_ssize_t len;
  PyObject *k, *got, *x, *t, *ent;
  int fresh = 0, r;
  if (!PyTuple_Check(plan) || (len = PyTuple_Size(plan)) < 3) return bad("a plan must be a tuple of 3 or more");
  kind = PyLong_AsLong(PyTuple_GetItem(plan, 0));
  if (kind == -1 && PyErr_Occurred()) return -1;
  if (kind == 3) return expand_row(c, i, plan);
  if (kind == 4 || kind == 5) {  /* a helper row asked for on its own (a root): made as a user's source is */
    if (!(t = lazy_row(c, (long)i, 0))) return PyErr_Occurred() ? -1 : 0;
    Py_DECREF(t);
    return 1;
  }
  if (!(kind == 0 && len == 3 && PyTuple_GetItem(plan, 2) != Py_None) && !(kind == 1 && len == 10) &&
      !(kind == 2 && len == 8))
    return bad("a plan's kind and length do not match");
  if (col_long(&c->start, i, &a) < 0 || col_long(&c->start, i + 1, &b) < 0) return -1;
  if (a < 0 || b != a + 1 || b > c->src.n) return bad("a planned row has one source in the column");
  if (col_long(&c->src, a, &j) < 0) return -1;
  if (!(k = PyLong_FromLong(j))) return -1;
  got = PyDict_GetItemWithError(c->reduced, k);
  Py_DECREF(k);
  if (!got && PyErr_Occurred()) return -1;
  if (kind == 2) {
    if (!got) return 0;  /* not held: Python makes it */
    if (!PyTuple_Check(got) || PyTuple_Size(got) != 4) return bad("a held row must be a tuple of 4");
    x = PyTuple_GetItem(got, 0);
    Py_INCREF(x);
  } else {
    if (kind == 0 && got) return 0;  /* a permute of a held row (Python's _permuted) */
    if (!(x = source(c, j))) return PyErr_Occurred() ? -1 : 0;
  }
  t = maybe(c, PyTuple_GetItem(plan, 1), x, PyTuple_GetItem(plan, 2), &fresh);  /* kind 0: arg is never None */
  if (kind == 1 && t) t = maybe(c, PyTuple_GetItem(plan, 3), t, PyTuple_GetItem(plan, 4), &fresh);
  if (!t) return -1;
  if (kind != 0) {
    ent = kind == 1 ? PyTuple_Pack(4, t, PyTuple_GetItem(plan, 5), PyTuple_GetItem(plan, 6), PyTuple_GetItem(plan, 7))
                    : PyTuple_Pack(4, t, PyTuple_GetItem(plan, 3), PyTuple_GetItem(plan, 4), PyTuple_GetItem(plan, 5));
    k = ent ? PyLong_FromSsize_t(i) : NULL;
    r = k ? PyDict_SetItem(c->reduced, k, ent) : -1;
    Py_XDECREF(k);
    Py_XDECREF(ent);
    if (r < 0) {
      Py_DECREF(t);
      return -1;
    }
  }
  if ((r = set_md(c, i, t, fresh)) < 0 || kind != 0) {
    Py_DECREF(t);
    return r < 0 ? -1 : r ? 1 : 0;
  }
  if (PyList_SetItem(c->out, i, t) < 0) return -1;  /* steals t */
  return r ? 1 : 0;
}

/* row i made: 1, not made here (Python makes it): 0, -1 with an exception set */
static int one_row(const cfg_t *c, Py_ssize_t i) {
  long o, d, tag, a, b, j;
  PyObject *top, *tdt, *src = NULL, *key = NULL, *t, *x;
  Py_ssize_t k, ns;
  int typed = 0, fresh, r;
  if (col_long(&c->tag, i, &tag) < 0 || col_long(&c->op, i, &o) < 0 || col_long(&c->dt, i, &d) < 0) return -1;
  if (tag) return 0;
  if (c->plans != Py_None) {
    if (!(x = PyList_GetItem(c->plans, i))) return -1;
    if (x != Py_None) return plan_row(c, i, x);
  }
  if (!(tdt = entry(c->dtypes, d))) return 0;
  top = entry(c->alu, o);
  if (!top && o != c->cast_op && o != c->bitcast_op) return 0;
  if (col_long(&c->start, i, &a) < 0 || col_long(&c->start, i + 1, &b) < 0) return -1;
  if (a < 0 || b < a || b > c->src.n) return bad("start out of the source column");
  ns = (Py_ssize_t)(b - a);
  if (ns < 1 || (!top && ns != 1)) return 0;
  if (!(src = PyTuple_New(ns))) return -1;
  for (k = 0; k < ns; k++) {
    if (col_long(&c->src, a + k, &j) < 0) goto fail;
    if (!(x = source(c, j))) {
      if (PyErr_Occurred()) goto fail;
      goto later;
    }
    if (top && !typed) {
      if ((r = is_weak(c, x)) < 0) {
        Py_DECREF(x);
        goto fail;
      }
      typed = !r;
    }
    PyTuple_SetItem(src, k, x);  /* steals x */
  }
  if (top && !typed) goto later;  /* every operand weak: the foreign IR's promotion decides (Python) */
  key = top ? PyTuple_Pack(5, top, tdt, src, Py_None, Py_None)
            : PyTuple_Pack(5, o == c->cast_op ? c->tcast : c->tbitcast, tdt, src, tdt, Py_None);
  Py_CLEAR(src);
  if (!key || !(t = node_of(c, key, &fresh))) goto fail;
  Py_DECREF(key);
  if ((r = set_md(c, i, t, fresh)) < 0) {
    Py_DECREF(t);
    return -1;
  }
  if (PyList_SetItem(c->out, i, t) < 0) return -1;  /* steals t */
  return r ? 1 : 0;  /* metadata left to Python: it sees the node made (out[i]) and sets it */
later:
  Py_DECREF(src);
  return 0;
fail:
  Py_XDECREF(src);
  Py_XDECREF(key);
  return -1;
}

/* rows(cfg, todo, k, m): makes rows todo[k], todo[k+1], ... (todo a list of row indices, or None: row k is row k)
   until position m or the first row it does not make; returns that position */
static PyObject *foreign_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  cfg_t c;
  PyObject *todo;
  Py_ssize_t k, m;
  long i;
  int r;
  (void)self;
  if (nargs != 4) return PyErr_Format(PyExc_TypeError, "pygrad C core: foreign rows takes 4 arguments");
  if (!dtype_name && !(dtype_name = PyUnicode_InternFromString("dtype"))) return NULL;
  if (read_cfg(args[0], &c) < 0) return NULL;
  todo = args[1];
  if (todo != Py_None && !PyList_Check(todo)) return PyErr_Format(PyExc_TypeError, "pygrad C core: todo: a list");
  k = PyLong_AsSsize_t(args[2]);
  if (k == -1 && PyErr_Occurred()) return NULL;
  m = PyLong_AsSsize_t(args[3]);
  if (m == -1 && PyErr_Occurred()) return NULL;
  if (k < 0 || m > (todo == Py_None ? c.n : PyList_Size(todo)))
    return PyErr_Format(PyExc_IndexError, "pygrad C core: foreign rows: positions out of range");
  for (; k < m; k++) {
    if (todo == Py_None) i = (long)k;
    else if (list_long(todo, k, &i) < 0) return NULL;
    if (i < 0 || i >= c.n) return PyErr_Format(PyExc_IndexError, "pygrad C core: foreign rows: a row out of range");
    if ((r = one_row(&c, (Py_ssize_t)i)) < 0) return NULL;
    if (!r) break;
  }
  return PyLong_FromSsize_t(k);
}

PyMethodDef pg_py_foreign_rows_def = {"foreign_rows", (PyCFunction)(void (*)(void))foreign_rows, METH_FASTCALL,
                                      "foreign_rows(cfg, todo, k, m): see csrc/pyforeign.c"};
