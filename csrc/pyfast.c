/* The node store's hot calls as CPython builtins (METH_FASTCALL functions, stable ABI 3.10), for the math methods'
   inner loop. A cffi call converts each argument through its generic machinery, saves errno and releases and takes
   back the GIL: ~250 ns for a make of 7 ints, of which the store's own work is a fifth. These functions read ints
   with PyLong_AsLong and keep the GIL; the store's lock is still taken (other threads may be inside the core in a
   cffi call without the GIL), and when another thread holds it they wait with the GIL released, so a long walk never
   stalls the interpreter. They return what the cffi functions return (an id, or a negative PG_ERR_* code); an
   argument that is no int32 raises OverflowError or TypeError, as cffi does. pg_py_bind publishes them. */
#include "pyapi.h"
#include "store_impl.h"

#define CAPSULE "pygrad.store"

pg_store *pg_py_store_of(PyObject *cap) { return (pg_store *)PyCapsule_GetPointer(cap, CAPSULE); }
#define store_of pg_py_store_of
#define lock_take pg_py_lock_take

void pg_py_lock_take(pg_store *st) {
  if (pg_lock_try(&st->lock)) return;
  Py_BEGIN_ALLOW_THREADS
  pg_lock_take(&st->lock);
  Py_END_ALLOW_THREADS
}

/* args[0..n) as int32s into out; -1 with an exception set if one is not an int or out of range */
static int read_ints(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t n, int32_t *out, const char *what) {
  Py_ssize_t i;
  if (nargs != n) {
    PyErr_Format(PyExc_TypeError, "pygrad C core: %s takes %d arguments, got %d", what, (int)n, (int)nargs);
    return -1;
  }
  for (i = 0; i < n; i++) {
    long v = PyLong_AsLong(args[i]);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (v < INT32_MIN || v > INT32_MAX) {
      PyErr_Format(PyExc_OverflowError, "pygrad C core: %s: argument %d out of int32 range", what, (int)i);
      return -1;
    }
    out[i] = (int32_t)v;
  }
  return 0;
}

/* a make of nsrc sources: (op, dtype, s0 .. s[nsrc-1], arg, tag, meta) */
static PyObject *make_n(PyObject *self, PyObject *const *args, Py_ssize_t nargs, int nsrc, const char *what) {
  pg_store *st = store_of(self);
  int32_t a[7], r;
  if (!st || read_ints(args, nargs, 5 + nsrc, a, what) < 0) return NULL;
  lock_take(st);
  r = pg_store_make_locked(st, a[0], a[1], nsrc ? &a[2] : NULL, nsrc, a[2 + nsrc], a[3 + nsrc], a[4 + nsrc]);
  pg_lock_drop(&st->lock);
  return PyLong_FromLong(r);
}

/* make0(op, dtype, arg, tag, meta), make1(op, dtype, s0, arg, tag, meta), make2(op, dtype, s0, s1, arg, tag, meta) */
static PyObject *fast_make0(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  return make_n(self, args, nargs, 0, "make0");
}
static PyObject *fast_make1(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  return make_n(self, args, nargs, 1, "make1");
}
static PyObject *fast_make2(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  return make_n(self, args, nargs, 2, "make2");
}

/* make2k(op, dtype, s, kdtype, karg, kmeta, reversed, meta): pg_store_make2k */
static PyObject *fast_make2k(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  pg_store *st = store_of(self);
  int32_t a[8], r;
  if (!st || read_ints(args, nargs, 8, a, "make2k") < 0) return NULL;
  lock_take(st);
  r = pg_store_make2k_locked(st, a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]);
  pg_lock_drop(&st->lock);
  return PyLong_FromLong(r);
}

/* incref(id): 0 or an error code */
static PyObject *fast_incref(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  pg_store *st = store_of(self);
  int32_t a[1];
  int r;
  if (!st || read_ints(args, nargs, 1, a, "incref") < 0) return NULL;
  lock_take(st);
  r = pg_store_incref_locked(st, a[0]);
  pg_lock_drop(&st->lock);
  return PyLong_FromLong(r);
}

/* decref(id): 0 or an error code */
static PyObject *fast_decref(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  pg_store *st = store_of(self);
  int32_t a[1];
  int r;
  if (!st || read_ints(args, nargs, 1, a, "decref") < 0) return NULL;
  lock_take(st);
  r = pg_store_decref_locked(st, a[0]);
  pg_lock_drop(&st->lock);
  return PyLong_FromLong(r);
}

/* info(id): the tuple (op, dtype, nsrc, arg, tag, meta, pdata), or an error code (an int) */
static PyObject *fast_info(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  pg_store *st = store_of(self);
  int32_t a[1], f[7];
  pg_info o;
  PyObject *t;
  int r, i;
  if (!st || read_ints(args, nargs, 1, a, "info") < 0) return NULL;
  lock_take(st);
  r = pg_store_info_locked(st, a[0], &o);
  pg_lock_drop(&st->lock);
  if (r) return PyLong_FromLong(r);
  f[0] = o.op, f[1] = o.dtype, f[2] = o.nsrc, f[3] = o.arg, f[4] = o.tag, f[5] = o.meta, f[6] = o.pdata;
  if (!(t = PyTuple_New(7))) return NULL;
  for (i = 0; i < 7; i++) {
    PyObject *v = PyLong_FromLong(f[i]);
    if (!v) {
      Py_DECREF(t);
      return NULL;
    }
    PyTuple_SetItem(t, i, v);  /* steals v */
  }
  return t;
}

static PyMethodDef fast_defs[] = {
  {"make0", (PyCFunction)(void (*)(void))fast_make0, METH_FASTCALL, "make0(op, dtype, arg, tag, meta)"},
  {"make1", (PyCFunction)(void (*)(void))fast_make1, METH_FASTCALL, "make1(op, dtype, s0, arg, tag, meta)"},
  {"make2", (PyCFunction)(void (*)(void))fast_make2, METH_FASTCALL, "make2(op, dtype, s0, s1, arg, tag, meta)"},
  {"make2k", (PyCFunction)(void (*)(void))fast_make2k, METH_FASTCALL,
   "make2k(op, dtype, s, kdtype, karg, kmeta, reversed, meta)"},
  {"incref", (PyCFunction)(void (*)(void))fast_incref, METH_FASTCALL, "incref(id)"},
  {"decref", (PyCFunction)(void (*)(void))fast_decref, METH_FASTCALL, "decref(id)"},
  {"info", (PyCFunction)(void (*)(void))fast_info, METH_FASTCALL, "info(id)"},
};
#define NFAST ((int)(sizeof fast_defs / sizeof fast_defs[0]))

/* the capsule's destructor: its user of the store leaves (the last user frees the store) */
static void capsule_free(PyObject *cap) {
  pg_store *st = (pg_store *)PyCapsule_GetPointer(cap, CAPSULE);
  if (st) pg_store_release(st);
  else PyErr_Clear();
}

/* a tuple of the builtins bound to st (holding one user of it), or NULL with an exception set */
static PyObject *bind(pg_store *st) {
  PyObject *cap, *t;
  int i;
  pg_lock_take(&st->lock);
  pg_store_retain_locked(st);
  pg_lock_drop(&st->lock);
  if (!(cap = PyCapsule_New(st, CAPSULE, capsule_free))) {
    pg_store_release(st);
    return NULL;
  }
  t = PyTuple_New(NFAST + 8);
  for (i = 0; t && i < NFAST + 8; i++) {
    PyObject *f = i < NFAST ? PyCFunction_NewEx(&fast_defs[i], cap, NULL) : i == NFAST ? pg_py_handle_type() :
                  i == NFAST + 1 ? pg_py_handle_ctor_maker() :
                  i == NFAST + 2 ? PyCFunction_NewEx(&pg_py_makers_def, cap, NULL) :
                  PyCFunction_NewEx(i == NFAST + 3   ? &pg_py_foreign_rows_def
                                    : i == NFAST + 4 ? &pg_py_foreign_walk_def
                                    : i == NFAST + 5 ? &pg_py_args_decode_def
                                    : i == NFAST + 6 ? &pg_py_rows_columns_def
                                                     : &pg_py_argkeys_def, NULL, NULL);
    if (!f) Py_CLEAR(t);
    else PyTuple_SetItem(t, i, f);  /* steals f */
  }
  Py_DECREF(cap);  /* the functions hold it */
  return t;
}

/* Set attribute `name` of the (imported) module `module` to the tuple of the store's builtins, in fast_defs' order
   (make0, make1, make2, make2k, incref, decref, info), then the handle type, ctor and makers (pyhandle.c, pymake.c),
   foreign_rows and foreign_walk (pyforeign.c, pywalk.c), args_decode (pyargs.c), rows_columns (pyrows.c) and
   argkeys (pyargkey.c). Called through cffi, so without
   the GIL: it takes it. 0 on success, PG_ERR_ARG for a NULL argument, PG_ERR_NOMEM if Python failed (its exception
   is cleared). */
int pg_py_bind(pg_store *st, const char *module, const char *name) {
  PyGILState_STATE g;
  PyObject *mod, *t;
  int r = PG_ERR_NOMEM;
  if (!st || !module || !name) return PG_ERR_ARG;
  g = PyGILState_Ensure();
  mod = PyImport_ImportModule(module);
  if (mod) {
    t = bind(st);
    if (t && PyObject_SetAttrString(mod, name, t) == 0) r = 0;
    Py_XDECREF(t);
    Py_DECREF(mod);
  }
  if (r) PyErr_Clear();
  PyGILState_Release(g);
  return r;
}
