/* The columns of a node table made of Python rows (pygrad/interop/tinygrad_in.py, _In.build) as one CPython builtin:
   the op, dtype, source start and source columns as native ints, and the arg, tag and metadata columns as 1-based
   references into a list of the distinct objects (by identity: the rows hold them all alive, so an object met
   again is referred to again, and the builder interns each object once). The same columns the Python form
   (tinygrad_in._columns_py) makes, without its per-row bytecode (~0.5 us a row at W1 depth 2000: a fifth of a
   conversion). No Python code runs while it reads: the rows are tuples of exact ints, and the objects are only
   compared by address. Every argument is checked: a wrong one raises TypeError, IndexError or OverflowError, never
   crashes. */
#include "pyapi.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* an open-addressing table from an object's address to its reference (its 1-based position in objs) */
typedef struct {
  PyObject **key;
  int32_t *ref;
  size_t cap;  /* a power of 2; at most half full */
  size_t n;
} idtab_t;

static int bad(PyObject *kind, const char *what) {
  PyErr_Format(kind, "pygrad C core: rows_columns: %s", what);
  return -1;
}

/* the slot of address k in t (a hash of the address: objects are 16-byte aligned, their low bits are all alike) */
static size_t slot_of(const idtab_t *t, const PyObject *k) {
  uint64_t h = (uint64_t)(uintptr_t)k;
  h = (h >> 4) * UINT64_C(0x9E3779B97F4A7C15);
  return (size_t)(h >> 32) & (t->cap - 1);
}

/* t with room for cap slots, all empty; 0, or -1 with MemoryError set */
static int idtab_init(idtab_t *t, size_t cap) {
  t->cap = cap, t->n = 0;
  t->key = calloc(cap, sizeof *t->key);
  t->ref = malloc(cap * sizeof *t->ref);
  if (!t->key || !t->ref) {
    free(t->key), free(t->ref);
    t->key = NULL, t->ref = NULL;
    PyErr_NoMemory();
    return -1;
  }
  return 0;
}

/* t's slots doubled, every entry moved; 0, or -1 with MemoryError set */
static int idtab_grow(idtab_t *t) {
  idtab_t g;
  size_t i, s;
  if (t->cap > ((size_t)-1) / 2 / sizeof *t->key) {
    PyErr_NoMemory();
    return -1;
  }
  if (idtab_init(&g, 2 * t->cap) < 0) return -1;
  for (i = 0; i < t->cap; i++)
    if (t->key[i]) {
      for (s = slot_of(&g, t->key[i]); g.key[s]; s = (s + 1) & (g.cap - 1)) {}
      g.key[s] = t->key[i], g.ref[s] = t->ref[i];
    }
  g.n = t->n;
  free(t->key), free(t->ref);
  *t = g;
  return 0;
}

/* the reference of object o: the one it was given, or the next one, o appended to objs; 0 with an exception set */
static int32_t ref_of(idtab_t *t, PyObject *objs, PyObject *o) {
  size_t s;
  int32_t r;
  for (s = slot_of(t, o); t->key[s]; s = (s + 1) & (t->cap - 1))
    if (t->key[s] == o) return t->ref[s];
  if (PyList_Size(objs) >= INT32_MAX) {
    bad(PyExc_OverflowError, "more distinct objects than int32 references");
    return 0;
  }
  if (PyList_Append(objs, o) < 0) return 0;
  r = (int32_t)PyList_Size(objs);
  t->key[s] = o, t->ref[s] = r, t->n++;  /* objs holds o: its address names no other object while the call runs */
  if (2 * t->n > t->cap && idtab_grow(t) < 0) return 0;
  return r;
}

/* the value of o, an exact int in [lo, hi], into *v; -1 with an exception set if it is none */
static int exact_int(PyObject *o, long lo, long hi, long *v, const char *what) {
  if (!PyLong_CheckExact(o)) return bad(PyExc_TypeError, what);
  *v = PyLong_AsLong(o);
  if (*v == -1 && PyErr_Occurred()) return -1;
  if (*v < lo || *v > hi) return bad(PyExc_OverflowError, what);
  return 0;
}

/* item i of a column of int32 items at p set to v (memcpy: a bytearray's data need not be aligned for it) */
static void put32(char *p, Py_ssize_t i, long v) {
  int32_t x = (int32_t)v;
  memcpy(p + 4 * i, &x, 4);
}

/* the object column c (3: arg, 4: tag) of the rows as references, None as 0; 0 or -1 */
static int ref_column(PyObject *rows, Py_ssize_t c, PyObject *col, idtab_t *t, PyObject *objs) {
  Py_ssize_t i, n = PyList_Size(rows);
  char *p = PyByteArray_AsString(col);
  int32_t r;
  for (i = 0; i < n; i++) {
    PyObject *o = PyTuple_GetItem(PyList_GetItem(rows, i), c);
    r = 0;
    if (o != Py_None && !(r = ref_of(t, objs, o))) return -1;
    put32(p, i, r);
  }
  return 0;
}

/* rows_columns(rows, md): rows a list of tuples (op, dtype, sources, arg, tag), op and dtype exact ints in int32,
   sources a tuple of exact ints naming rows; md a dict row -> metadata object. Returns (op, dtype, start, src,
   argref, tagref, pdref, objs): bytearrays of native int32 items (start: int64, one more item than rows; pdref None
   if md is empty) and the list of the distinct arg, tag and metadata objects in the order first met (args, then
   tags, then md in its order) */
static PyObject *rows_columns(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  PyObject *rows, *md, *opc = NULL, *dtc = NULL, *stc = NULL, *srcc = NULL, *argc = NULL, *tagc = NULL, *pdc = NULL;
  PyObject *objs = NULL, *ret = NULL, *k, *v;
  char *po, *pd, *ps, *pst;
  Py_ssize_t n, i, j, pos = 0;
  int64_t total = 0;
  long x;
  idtab_t t = {NULL, NULL, 0, 0};
  (void)self;
  if (nargs != 2) return PyErr_Format(PyExc_TypeError, "pygrad C core: rows_columns takes 2 arguments");
  rows = args[0], md = args[1];
  if (!PyList_Check(rows) || !PyDict_Check(md))
    return PyErr_Format(PyExc_TypeError, "pygrad C core: rows_columns: rows must be a list, md a dict");
  n = PyList_Size(rows);
  if (n >= INT32_MAX) return PyErr_Format(PyExc_OverflowError, "pygrad C core: rows_columns: too many rows");
  for (i = 0; i < n; i++) {  /* checked whole first: nothing below can fail on a row's form */
    PyObject *r = PyList_GetItem(rows, i), *s;
    if (!PyTuple_Check(r) || PyTuple_Size(r) != 5 || !PyTuple_Check(s = PyTuple_GetItem(r, 2)))
      return PyErr_Format(PyExc_TypeError, "pygrad C core: rows_columns: row %zd is no (op, dtype, sources, arg, "
                          "tag) with a tuple of sources", i);
    if (exact_int(PyTuple_GetItem(r, 0), INT32_MIN, INT32_MAX, &x, "an op is no exact int32") < 0 ||
        exact_int(PyTuple_GetItem(r, 1), INT32_MIN, INT32_MAX, &x, "a dtype is no exact int32") < 0)
      return NULL;
    for (j = 0; j < PyTuple_Size(s); j++)
      if (exact_int(PyTuple_GetItem(s, j), 0, (long)n - 1, &x, "a source is no row") < 0) {
        if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
          PyErr_Clear();
          bad(PyExc_IndexError, "a source is no row");
        }
        return NULL;
      }
    total += PyTuple_Size(s);
  }
  if (total >= INT32_MAX) return PyErr_Format(PyExc_OverflowError, "pygrad C core: rows_columns: too many sources");
  if (!(opc = PyByteArray_FromStringAndSize(NULL, 4 * n)) || !(dtc = PyByteArray_FromStringAndSize(NULL, 4 * n)) ||
      !(stc = PyByteArray_FromStringAndSize(NULL, 8 * (n + 1))) ||
      !(srcc = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)(4 * total))) ||
      !(argc = PyByteArray_FromStringAndSize(NULL, 4 * n)) || !(tagc = PyByteArray_FromStringAndSize(NULL, 4 * n)) ||
      !(objs = PyList_New(0)) || idtab_init(&t, 64) < 0)
    goto done;
  total = 0;
  po = PyByteArray_AsString(opc), pd = PyByteArray_AsString(dtc), ps = PyByteArray_AsString(srcc);
  pst = PyByteArray_AsString(stc);
  memcpy(pst, &total, 8);
  for (i = 0; i < n; i++) {
    PyObject *r = PyList_GetItem(rows, i), *s = PyTuple_GetItem(r, 2);
    put32(po, i, PyLong_AsLong(PyTuple_GetItem(r, 0)));  /* checked above */
    put32(pd, i, PyLong_AsLong(PyTuple_GetItem(r, 1)));
    for (j = 0; j < PyTuple_Size(s); j++) put32(ps, (Py_ssize_t)total++, PyLong_AsLong(PyTuple_GetItem(s, j)));
    memcpy(pst + 8 * (i + 1), &total, 8);
  }
  if (ref_column(rows, 3, argc, &t, objs) < 0 || ref_column(rows, 4, tagc, &t, objs) < 0) goto done;
  if (PyDict_Size(md)) {
    if (!(pdc = PyByteArray_FromStringAndSize(NULL, 4 * n))) goto done;
    memset(PyByteArray_AsString(pdc), 0, (size_t)(4 * n));
    while (PyDict_Next(md, &pos, &k, &v)) {
      int32_t r;
      if (exact_int(k, 0, (long)n - 1, &x, "md's key is no row") < 0 || !(r = ref_of(&t, objs, v))) goto done;
      put32(PyByteArray_AsString(pdc), (Py_ssize_t)x, r);
    }
  } else {
    pdc = Py_None;
    Py_INCREF(pdc);
  }
  ret = PyTuple_Pack(8, opc, dtc, stc, srcc, argc, tagc, pdc, objs);
done:
  free(t.key), free(t.ref);
  Py_XDECREF(opc), Py_XDECREF(dtc), Py_XDECREF(stc), Py_XDECREF(srcc), Py_XDECREF(argc), Py_XDECREF(tagc);
  Py_XDECREF(pdc), Py_XDECREF(objs);
  return ret;
}

PyMethodDef pg_py_rows_columns_def = {"rows_columns", (PyCFunction)(void (*)(void))rows_columns, METH_FASTCALL,
                                      "rows_columns(rows, md): see csrc/pyrows.c"};
