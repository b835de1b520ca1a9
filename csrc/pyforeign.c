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
   a node held reduced, any other permute, an expand) are made by it, as the Python loop makes them
   (pyforeign_plans.c); nodes are found or made by pyforeign_nodes.c. Every argument is checked: a wrong one raises
   TypeError/IndexError, never crashes. */
#include "pyforeign.h"

/* item i of list l as a long; -1 with an exception set if it is none */
static int list_long(PyObject *l, Py_ssize_t i, long *v) {
  PyObject *o = PyList_GetItem(l, i);
  if (!o) return -1;
  *v = PyLong_AsLong(o);
  return *v == -1 && PyErr_Occurred() ? -1 : 0;
}

/* TypeError "pygrad C core: foreign rows: <what>": -1 */
int pg_foreign_bad(const char *what) {
  PyErr_Format(PyExc_TypeError, "pygrad C core: foreign rows: %s", what);
  return -1;
}

/* pg_foreign_bad(what) for the functions that return an object: NULL with the TypeError set */
PyObject *pg_foreign_bad_obj(const char *what) {
  pg_foreign_bad(what);
  return NULL;
}

/* column c read from o, a bytes object of whole items; -1 with an exception set if it is none */
int pg_foreign_read_col(PyObject *o, int wide, col_t *c) {
  Py_ssize_t size, w = wide ? 8 : 4;
  if (!PyBytes_Check(o)) return pg_foreign_bad("the columns must be bytes");
  size = PyBytes_Size(o);
  if (size % w) return pg_foreign_bad("a column's size is no whole number of items");
  c->n = size / w, c->wide = wide;
  return (c->p = PyBytes_AsString(o)) ? 0 : -1;
}

/* the field descriptors (a tuple of 5 objects whose type has a setter), the setters and the class's allocator; or
   none (fs is None) */
static int read_fields(PyObject *fs, cfg_t *c) {
  Py_ssize_t i;
  c->alloc = NULL, c->get_dtype = NULL;
  if (fs == Py_None) return 0;
  if (!PyTuple_Check(fs) || PyTuple_Size(fs) != 5)
    return pg_foreign_bad("fields must be None or a tuple of 5 descriptors");
  for (i = 0; i < 5; i++) {
    c->fields[i] = PyTuple_GetItem(fs, i);
    c->set[i] = (descrsetfunc)PyType_GetSlot(Py_TYPE(c->fields[i]), Py_tp_descr_set);
    if (!c->set[i]) return pg_foreign_bad("a field descriptor has no setter");
  }
  c->get_dtype = (descrgetfunc)PyType_GetSlot(Py_TYPE(c->fields[1]), Py_tp_descr_get);
  if (!c->get_dtype) return pg_foreign_bad("the dtype field descriptor has no getter");
  c->alloc = (newfunc)PyType_GetSlot((PyTypeObject *)c->cls, Py_tp_new);
  if (!c->alloc) return pg_foreign_bad("cls has no tp_new");
  return 0;
}

static int read_cfg(PyObject *t, cfg_t *c) {
  PyObject *cast;
  Py_ssize_t i;
  if (!PyTuple_Check(t) || PyTuple_Size(t) != C_N) return pg_foreign_bad("the configuration is no tuple of 20");
  c->out = PyTuple_GetItem(t, C_OUT), c->alu = PyTuple_GetItem(t, C_ALU), c->dtypes = PyTuple_GetItem(t, C_DTYPES);
  c->weak = PyTuple_GetItem(t, C_WEAK), c->cache = PyTuple_GetItem(t, C_CACHE), c->cls = PyTuple_GetItem(t, C_CLS);
  c->mdata = PyTuple_GetItem(t, C_MDATA), c->mdrm = PyTuple_GetItem(t, C_MDRM), c->mds = PyTuple_GetItem(t, C_MDS);
  cast = PyTuple_GetItem(t, C_CAST);
  if (!PyList_Check(c->out)) return pg_foreign_bad("out must be a list");
  if (pg_foreign_read_col(PyTuple_GetItem(t, C_OP), 0, &c->op) < 0 ||
      pg_foreign_read_col(PyTuple_GetItem(t, C_DT), 0, &c->dt) < 0 ||
      pg_foreign_read_col(PyTuple_GetItem(t, C_TAG), 0, &c->tag) < 0 ||
      pg_foreign_read_col(PyTuple_GetItem(t, C_START), 1, &c->start) < 0 ||
      pg_foreign_read_col(PyTuple_GetItem(t, C_SRC), 0, &c->src) < 0 ||
      pg_foreign_read_col(PyTuple_GetItem(t, C_PDATA), 0, &c->pdata) < 0)
    return -1;
  c->n = PyList_Size(c->out);
  if (c->op.n != c->n || c->dt.n != c->n || c->tag.n != c->n || c->pdata.n != c->n || c->start.n != c->n + 1)
    return pg_foreign_bad("the columns' lengths differ");
  if (!PyTuple_Check(c->alu) || !PyTuple_Check(c->dtypes) || !PyTuple_Check(c->weak))
    return pg_foreign_bad("tables must be tuples");
  if (!PyDict_Check(c->cache)) return pg_foreign_bad("the cache must be a dict");
  if (!PyType_Check(c->cls)) return pg_foreign_bad("cls must be a class");
  if (c->mdata != Py_None && (!PyDict_Check(c->mdata) || !PyDict_Check(c->mds)))
    return pg_foreign_bad("mdata and mds: dicts");
  if (!PyTuple_Check(cast) || PyTuple_Size(cast) != 4) return pg_foreign_bad("cast must be a tuple of 4");
  c->cast_op = PyLong_AsLong(PyTuple_GetItem(cast, 0));
  if (c->cast_op == -1 && PyErr_Occurred()) return -1;
  c->bitcast_op = PyLong_AsLong(PyTuple_GetItem(cast, 2));
  if (c->bitcast_op == -1 && PyErr_Occurred()) return -1;
  c->tcast = PyTuple_GetItem(cast, 1), c->tbitcast = PyTuple_GetItem(cast, 3);
  c->nalu = PyTuple_Size(c->alu), c->ndtypes = PyTuple_Size(c->dtypes), c->nweak = PyTuple_Size(c->weak);
  for (i = 0; i < c->nweak; i++)
    if (!PyTuple_GetItem(c->weak, i)) return -1;
  if (c->nweak > WEAK_MAX) c->nweak = -1;
  for (i = 0; i < c->nweak; i++) c->weakv[i] = PyTuple_GetItem(c->weak, i);
  c->make = (ternaryfunc)PyType_GetSlot(&PyType_Type, Py_tp_call);
  if (!c->make) return pg_foreign_bad("type has no call");
  c->lazy = PyTuple_GetItem(t, C_LAZY);
  if (c->lazy != Py_None && !PyCallable_Check(c->lazy)) return pg_foreign_bad("lazy must be callable or None");
  c->reduced = PyTuple_GetItem(t, C_REDUCED), c->plans = PyTuple_GetItem(t, C_PLANS);
  if (!PyDict_Check(c->reduced)) return pg_foreign_bad("reduced must be a dict");
  if (c->plans != Py_None && (!PyList_Check(c->plans) || PyList_Size(c->plans) != c->n))
    return pg_foreign_bad("plans must be None or a list with an item a row");
  return read_fields(PyTuple_GetItem(t, C_FIELDS), c);
}

/* the entry of table t (a tuple of n items) at i, borrowed, or NULL (no error) if i is out of it or the entry is
   None */
static PyObject *entry(PyObject *t, Py_ssize_t n, long i) {
  PyObject *o;
  if (i < 0 || i >= n) return NULL;
  o = PyTuple_GetItem(t, i);
  return o == Py_None ? NULL : o;
}

/* 1 if node x's dtype is one of the weak ones, 0 if not, -1 with an exception set */
static int is_weak(const cfg_t *c, PyObject *x) {
  PyObject *d = pg_foreign_dtype(c, x);
  Py_ssize_t i, n = c->nweak >= 0 ? c->nweak : PyTuple_Size(c->weak);
  int r = 0;
  if (!d) return -1;
  for (i = 0; i < n && !r; i++) r = (c->nweak >= 0 ? c->weakv[i] : PyTuple_GetItem(c->weak, i)) == d;
  Py_DECREF(d);
  return r;
}

/* row i made: 1, not made here (Python makes it): 0, -1 with an exception set */
static int one_row(const cfg_t *c, Py_ssize_t i) {
  long o, d, tag, a, b, j;
  PyObject *top, *tdt, *src = NULL, *key = NULL, *t, *x;
  Py_ssize_t k, ns;
  int typed = 0, fresh, r;
  if (pg_foreign_col(&c->tag, i, &tag) < 0 || pg_foreign_col(&c->op, i, &o) < 0 || pg_foreign_col(&c->dt, i, &d) < 0)
    return -1;
  if (tag) return 0;
  if (c->plans != Py_None) {
    if (!(x = PyList_GetItem(c->plans, i))) return -1;
    if (x != Py_None) return pg_foreign_plan_row(c, i, x);
  }
  if (!(tdt = entry(c->dtypes, c->ndtypes, d))) return 0;
  top = entry(c->alu, c->nalu, o);
  if (!top && o != c->cast_op && o != c->bitcast_op) return 0;
  if (pg_foreign_col(&c->start, i, &a) < 0 || pg_foreign_col(&c->start, i + 1, &b) < 0) return -1;
  if (a < 0 || b < a || b > c->src.n) return pg_foreign_bad("start out of the source column");
  ns = (Py_ssize_t)(b - a);
  if (ns < 1 || (!top && ns != 1)) return 0;
  if (!(src = PyTuple_New(ns))) return -1;
  for (k = 0; k < ns; k++) {
    if (pg_foreign_col(&c->src, a + k, &j) < 0) goto fail;
    if (!(x = pg_foreign_source(c, j))) {
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
  if (!key || !(t = pg_foreign_node(c, key, &fresh))) goto fail;
  Py_DECREF(key);
  if ((r = pg_foreign_set_md(c, i, t, fresh)) < 0) {
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

/* rows(cfg, todo, k, m): makes rows todo[k], todo[k+1], ... (todo a list of row indices, a bytes object of int32
   row indices, or None: row k is row k) until position m or the first row it does not make; returns that position.
   (bytes: a conversion's ~10^5 rows to make cost a list of int objects made, read and freed) */
static PyObject *foreign_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  cfg_t c;
  PyObject *todo;
  col_t tcol = {NULL, 0, 0};
  Py_ssize_t k, m, len;
  long i;
  int r;
  (void)self;
  if (nargs != 4) return PyErr_Format(PyExc_TypeError, "pygrad C core: foreign rows takes 4 arguments");
  if (read_cfg(args[0], &c) < 0) return NULL;
  todo = args[1];
  if (PyBytes_Check(todo)) {
    if (pg_foreign_read_col(todo, 0, &tcol) < 0) return NULL;
    len = tcol.n;
  } else if (PyList_Check(todo)) len = PyList_Size(todo);
  else if (todo == Py_None) len = c.n;
  else return PyErr_Format(PyExc_TypeError, "pygrad C core: todo: a list, bytes or None");
  k = PyLong_AsSsize_t(args[2]);
  if (k == -1 && PyErr_Occurred()) return NULL;
  m = PyLong_AsSsize_t(args[3]);
  if (m == -1 && PyErr_Occurred()) return NULL;
  if (k < 0 || m > len)
    return PyErr_Format(PyExc_IndexError, "pygrad C core: foreign rows: positions out of range");
  for (; k < m; k++) {
    if (todo == Py_None) i = (long)k;
    else if (tcol.p ? pg_foreign_col(&tcol, k, &i) < 0 : list_long(todo, k, &i) < 0) return NULL;
    if (i < 0 || i >= c.n) return PyErr_Format(PyExc_IndexError, "pygrad C core: foreign rows: a row out of range");
    if ((r = one_row(&c, (Py_ssize_t)i)) < 0) return NULL;
    if (!r) break;
  }
  return PyLong_FromSsize_t(k);
}

PyMethodDef pg_py_foreign_rows_def = {"foreign_rows", (PyCFunction)(void (*)(void))foreign_rows, METH_FASTCALL,
                                      "foreign_rows(cfg, todo, k, m): see csrc/pyforeign.c"};
