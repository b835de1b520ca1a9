/* The pygrad -> tinygrad loop (csrc/pyforeign.c): a foreign node found in the hash-consing cache or made (as the
   node class's own construction would make it), a row's metadata set as tinygrad's WeakKeyDictionary would set it,
   and a source row's node (made already, or made now: a helper row). */
#include "pyforeign.h"

static PyObject *dtype_name, *empty;  /* "dtype" and (), made on first use */

/* node x's dtype: by the dtype field descriptor's getter if the configuration has the node class's fields (an
   attribute lookup by name, through the type's dict, costs several times more), else by name */
PyObject *pg_foreign_dtype(const cfg_t *c, PyObject *x) {
  if (c->get_dtype) return c->get_dtype(c->fields[1], x, (PyObject *)Py_TYPE(x));
  if (!dtype_name && !(dtype_name = PyUnicode_InternFromString("dtype"))) return NULL;
  return PyObject_GetAttr(x, dtype_name);
}

/* a new node with the fields of key (a tuple of 5): the class called, or a bare instance given them (its __init__
   would set just these); a new reference, or NULL with an exception set */
static PyObject *make(const cfg_t *c, PyObject *key) {
  PyObject *t;
  int i;
  if (!c->alloc) return c->make(c->cls, key, NULL);
  if (!empty && !(empty = PyTuple_New(0))) return NULL;
  if (!(t = c->alloc((PyTypeObject *)c->cls, empty, NULL))) return NULL;
  for (i = 0; i < 5; i++)
    if (c->set[i](c->fields[i], t, PyTuple_GetItem(key, i)) < 0) {
      Py_DECREF(t);
      return NULL;
    }
  return t;
}

/* the hash-consed node of key (a new reference; *fresh set if made here), or NULL with an exception set */
PyObject *pg_foreign_node(const cfg_t *c, PyObject *key, int *fresh) {
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
int pg_foreign_set_md(const cfg_t *c, Py_ssize_t i, PyObject *t, int fresh) {
  long p;
  PyObject *pk, *m, *w;
  int r;
  if (c->mdata == Py_None) return 1;
  if (pg_foreign_col(&c->pdata, i, &p) < 0) return -1;
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

/* the node of source row j (a new reference): made already, or made now (a helper row: in C by its plan, see
   lazy_row, else by the caller's lazy); NULL with no exception set if Python makes it (no lazy), NULL with one set */
PyObject *pg_foreign_source_at(const cfg_t *c, long j, int depth) {
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
    x = pg_foreign_lazy(c, j, depth + 1);
    if (x || PyErr_Occurred()) return x;
  }
  return PyObject_CallFunction(c->lazy, "l", j);  /* a helper row, made now by Python */
}

PyObject *pg_foreign_source(const cfg_t *c, long j) { return pg_foreign_source_at(c, j, 0); }

/* the hash-consed node (op, x's dtype, (x,), arg, None) of a movement or reduce, or with s not NULL (op, x's dtype,
   (x, s), None, None) of a movement whose shape is a source node s (a reshape or an expand): a new reference (*fresh
   as node_of sets it), or NULL with an exception set */
PyObject *pg_foreign_moved(const cfg_t *c, PyObject *op, PyObject *x, PyObject *s, PyObject *arg, int *fresh) {
  PyObject *d = pg_foreign_dtype(c, x), *src, *key, *t;
  if (!d) return NULL;
  src = s ? PyTuple_Pack(2, x, s) : PyTuple_Pack(1, x);
  key = src ? PyTuple_Pack(5, op, d, src, s ? Py_None : arg, Py_None) : NULL;
  Py_DECREF(d);
  Py_XDECREF(src);
  if (!key) return NULL;
  t = pg_foreign_node(c, key, fresh);
  Py_DECREF(key);
  return t;
}
