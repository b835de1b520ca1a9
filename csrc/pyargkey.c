/* The interner's keys of many args in one CPython builtin (pygrad/intern.py, argkey and get_many): a conversion from
   tinygrad makes ~1,000 new args per graph (each opaque BUFFER's (node, shape, device, name)), all looked up and
   entered at once, and argkey's Python loop over each was ~0.5 us of every such arg. The usual forms are made here
   exactly as argkey makes them; every other value (a float, a complex, a nested tuple that is not all ints, an
   unhashable item) is handed to argkey itself, so the keys are argkey's in every case and its errors are its own. */
#include "pyapi.h"

/* cfg: (ints, nonekey, argkey)
   ints: intern._INTS, the marker of an int tuple's key; nonekey: intern._NONE_KEY, None's key; argkey: intern.argkey,
   called for what is not made here. */
enum { K_INTS, K_NONE, K_ARGKEY, K_N };

/* whether t (an exact tuple) holds exact ints only (argkey's first case: its key is (ints, t)) */
static int all_ints(PyObject *t) {
  Py_ssize_t i, n = PyTuple_Size(t);
  for (i = 0; i < n; i++)
    if (!PyLong_CheckExact(PyTuple_GetItem(t, i))) return 0;
  return 1;
}

/* argkey(x) through the Python function (a new reference), NULL with its exception set */
static PyObject *by_python(PyObject *const *cfg, PyObject *x) {
  return PyObject_CallFunctionObjArgs(cfg[K_ARGKEY], x, NULL);
}

/* (type(e), e), a new reference, NULL with an exception set */
static PyObject *typed(PyObject *e) { return PyTuple_Pack(2, (PyObject *)Py_TYPE(e), e); }

/* the key of item e of a tuple that is not all ints, as argkey's loop makes it (a new reference); NULL with no
   exception set if e cannot be hashed (the caller asks argkey for the whole arg, which raises its TypeError), NULL
   with one set */
static PyObject *item_key(PyObject *const *cfg, PyObject *e) {
  PyTypeObject *te = Py_TYPE(e);
  if (te == &PyLong_Type || te == &PyUnicode_Type || te == &PyBool_Type) return typed(e);
  if (e == Py_None) {
    Py_INCREF(cfg[K_NONE]);
    return cfg[K_NONE];
  }
  if (te == &PyTuple_Type && all_ints(e)) return PyTuple_Pack(2, cfg[K_INTS], e);
  if (te == &PyFloat_Type || te == &PyTuple_Type || te == &PyComplex_Type) return by_python(cfg, e);
  if (PyObject_Hash(e) == -1) {
    PyErr_Clear();
    return NULL;
  }
  return typed(e);
}

/* argkey(x), a new reference; NULL with an exception set */
static PyObject *key_of(PyObject *const *cfg, PyObject *x) {
  PyObject *out;
  Py_ssize_t i, n;
  if (Py_TYPE(x) != &PyTuple_Type) return by_python(cfg, x);
  if (all_ints(x)) return PyTuple_Pack(2, cfg[K_INTS], x);
  n = PyTuple_Size(x);
  if (!(out = PyTuple_New(n + 1))) return NULL;
  Py_INCREF(&PyTuple_Type);
  PyTuple_SetItem(out, 0, (PyObject *)&PyTuple_Type);
  for (i = 0; i < n; i++) {
    PyObject *k = item_key(cfg, PyTuple_GetItem(x, i));
    if (!k) {
      Py_DECREF(out);
      return PyErr_Occurred() ? NULL : by_python(cfg, x);
    }
    PyTuple_SetItem(out, i + 1, k);  /* steals k */
  }
  return out;
}

/* argkeys(xs, cfg): [argkey(x) for x in xs] for a list xs; a new list, or NULL with an exception set */
static PyObject *argkeys(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  PyObject *xs, *cfg, *out;
  PyObject *c[K_N];
  Py_ssize_t i, n;
  int j;
  (void)self;
  if (nargs != 2) return PyErr_Format(PyExc_TypeError, "pygrad C core: argkeys takes 2 arguments");
  xs = args[0], cfg = args[1];
  if (!PyList_Check(xs) || !PyTuple_Check(cfg) || PyTuple_Size(cfg) != K_N)
    return PyErr_Format(PyExc_TypeError, "pygrad C core: argkeys: xs must be a list, cfg a tuple of %d", K_N);
  for (j = 0; j < K_N; j++) c[j] = PyTuple_GetItem(cfg, j);
  if (!PyCallable_Check(c[K_ARGKEY]))
    return PyErr_Format(PyExc_TypeError, "pygrad C core: argkeys: cfg's argkey must be callable");
  n = PyList_Size(xs);
  if (!(out = PyList_New(n))) return NULL;
  for (i = 0; i < n && i < PyList_Size(xs); i++) {  /* argkey (Python) may shorten xs: read it where it stands */
    PyObject *x = PyList_GetItem(xs, i), *k;
    Py_INCREF(x);
    k = key_of(c, x);
    Py_DECREF(x);
    if (!k) {
      Py_DECREF(out);
      return NULL;
    }
    PyList_SetItem(out, i, k);  /* steals k */
  }
  if (i < n) {  /* xs shrank meanwhile: the unfilled slots are NULL, which no list may hold */
    Py_DECREF(out);
    return PyErr_Format(PyExc_RuntimeError, "pygrad C core: argkeys: the list changed size while its keys were made");
  }
  return out;
}

PyMethodDef pg_py_argkeys_def = {"argkeys", (PyCFunction)(void (*)(void))argkeys, METH_FASTCALL,
                                 "argkeys(xs, cfg): see csrc/pyargkey.c"};
