/* The math methods' whole fast path in one call: make the node (pyfast.c's store calls) and, if Python has no
   handle for it yet, make its handle (pyhandle.c) and publish it in uop.py's registry (node id -> its _Ref, a weak
   reference whose callback drops the handle's core reference). Done from Python this was a store call, a dict
   probe, the handle, the weak reference and dict.setdefault: ~500 ns of a ~900 ns method. Each call returns the new
   handle, or an int for Python to finish: a node id (with the caller's new reference) when the node already has a
   registry entry, or a negative store code. The calls are bound to a configuration tuple (see pg_py_makers). */
#include "pyapi.h"
#include "store_impl.h"

/* the configuration: (store capsule, handle class, registry dict, reference type, its callback, "nid") */
enum { CFG_STORE, CFG_CLS, CFG_HANDLES, CFG_REF, CFG_CALLBACK, CFG_NIDNAME, CFG_N };

/* the int32 field i of handle o, or -1 with TypeError set if o is no complete handle */
static int field_i32(PyObject *o, int i, int32_t *out) {
  long x;
  if (!pg_py_is_handle(o) || !((pg_handle *)o)->f[i] || !((pg_handle *)o)->f[PG_H_SHAPE] ||
      !((pg_handle *)o)->f[PG_H_DEVICE] || !((pg_handle *)o)->f[PG_H_META]) {
    PyErr_SetString(PyExc_TypeError, "pygrad C core: expected a node handle");
    return -1;
  }
  x = PyLong_AsLong(((pg_handle *)o)->f[i]);
  if (x == -1 && PyErr_Occurred()) return -1;
  if (x < INT32_MIN || x > INT32_MAX) {
    PyErr_SetString(PyExc_OverflowError, "pygrad C core: a handle field out of int32 range");
    return -1;
  }
  *out = (int32_t)x;
  return 0;
}

/* v as an int32, or -1 with an exception set */
static int arg_i32(PyObject *v, int32_t *out) {
  long x = PyLong_AsLong(v);
  if (x == -1 && PyErr_Occurred()) return -1;
  if (x < INT32_MIN || x > INT32_MAX) {
    PyErr_SetString(PyExc_OverflowError, "pygrad C core: argument out of int32 range");
    return -1;
  }
  *out = (int32_t)x;
  return 0;
}

/* drop the reference a make gave (the handle that was to own it was not made) */
static void drop(pg_store *st, int32_t nid) {
  pg_py_lock_take(st);
  pg_store_decref_locked(st, nid);
  pg_lock_drop(&st->lock);
}

/* the handle of the new reference on node nid (see the file comment for what is returned instead) */
static PyObject *publish(PyObject *cfg, pg_store *st, int32_t nid, PyObject *op, PyObject *dtype, PyObject *arg,
                         PyObject *shape, PyObject *device, PyObject *meta) {
  PyObject *handles = PyTuple_GetItem(cfg, CFG_HANDLES), *id, *o, *w, *had;
  int r;
  if (nid < 0) return PyLong_FromLong(nid);
  if (!(id = PyLong_FromLong(nid))) goto fail;
  if ((r = PyDict_Contains(handles, id)) != 0) {
    if (r < 0) goto fail_id;
    return id;  /* an entry: Python's _wrap decides (a live handle, or a dead one to replace) */
  }
  if (!(o = pg_py_handle_new((PyTypeObject *)PyTuple_GetItem(cfg, CFG_CLS), id, op, dtype, arg, Py_None, shape,
                             device, meta)))
    goto fail_id;
  w = PyObject_CallFunctionObjArgs(PyTuple_GetItem(cfg, CFG_REF), o, PyTuple_GetItem(cfg, CFG_CALLBACK), NULL);
  if (!w) goto fail_o;
  if (PyObject_SetAttr(w, PyTuple_GetItem(cfg, CFG_NIDNAME), id) < 0) goto fail_w;
  /* the allocations above may have run a collection, and its callbacks other threads: look again, then claim
     with nothing run in between (under the GIL; setdefault where there is no GIL) */
#ifdef Py_LIMITED_API
  had = PyDict_GetItemWithError(handles, id);
  if (!had && PyErr_Occurred()) goto fail_w;
  if (!had && PyDict_SetItem(handles, id, w) < 0) goto fail_w;
#else
  had = PyDict_SetDefault(handles, id, w);
  if (!had) goto fail_w;
  if (had == w) had = NULL;
#endif
  if (had) {  /* another thread published meanwhile: Python's _wrap takes that one */
    Py_DECREF(w);  /* first, so no callback runs for o */
    Py_DECREF(o);
    return id;
  }
  Py_DECREF(w);  /* the registry holds it */
  Py_DECREF(id);
  return o;
fail_w:
  Py_DECREF(w);
fail_o:
  Py_DECREF(o);
fail_id:
  Py_DECREF(id);
fail:
  drop(st, nid);
  return NULL;
}

/* unary(op, dtype, dtype_id, x): op(x), x's shape, device and meta */
static PyObject *mk_unary(PyObject *cfg, PyObject *const *args, Py_ssize_t nargs) {
  pg_store *st = pg_py_store_of(PyTuple_GetItem(cfg, CFG_STORE));
  pg_handle *x;
  int32_t op, did, xid, m, nid;
  if (!st) return NULL;
  if (nargs != 4) return PyErr_Format(PyExc_TypeError, "pygrad C core: unary takes 4 arguments");
  if (arg_i32(args[0], &op) < 0 || arg_i32(args[2], &did) < 0 || field_i32(args[3], PG_H_ID, &xid) < 0 ||
      field_i32(args[3], PG_H_META, &m) < 0)
    return NULL;
  x = (pg_handle *)args[3];
  pg_py_lock_take(st);
  nid = pg_store_make_locked(st, op, did, &xid, 1, 0, 0, m);
  pg_lock_drop(&st->lock);
  return publish(cfg, st, nid, args[0], args[1], Py_None, x->f[PG_H_SHAPE], x->f[PG_H_DEVICE], x->f[PG_H_META]);
}

/* binary(op, dtype, dtype_id, a, b): op(a, b), a's shape, device and meta */
static PyObject *mk_binary(PyObject *cfg, PyObject *const *args, Py_ssize_t nargs) {
  pg_store *st = pg_py_store_of(PyTuple_GetItem(cfg, CFG_STORE));
  pg_handle *a;
  int32_t op, did, src[2], m, nid;
  if (!st) return NULL;
  if (nargs != 5) return PyErr_Format(PyExc_TypeError, "pygrad C core: binary takes 5 arguments");
  if (arg_i32(args[0], &op) < 0 || arg_i32(args[2], &did) < 0 || field_i32(args[3], PG_H_ID, &src[0]) < 0 ||
      field_i32(args[3], PG_H_META, &m) < 0 || field_i32(args[4], PG_H_ID, &src[1]) < 0)
    return NULL;
  a = (pg_handle *)args[3];
  pg_py_lock_take(st);
  nid = pg_store_make_locked(st, op, did, src, 2, 0, 0, m);
  pg_lock_drop(&st->lock);
  return publish(cfg, st, nid, args[0], args[1], Py_None, a->f[PG_H_SHAPE], a->f[PG_H_DEVICE], a->f[PG_H_META]);
}

/* binaryk(op, dtype, dtype_id, a, kdtype_id, karg, kmeta, reversed): op(a, k) or op(k, a) with the CONST k made in
   the same call (pg_store_make2k), a's shape, device and meta */
static PyObject *mk_binaryk(PyObject *cfg, PyObject *const *args, Py_ssize_t nargs) {
  pg_store *st = pg_py_store_of(PyTuple_GetItem(cfg, CFG_STORE));
  pg_handle *a;
  int32_t op, did, aid, m, kd, ka, km, rev, nid;
  if (!st) return NULL;
  if (nargs != 8) return PyErr_Format(PyExc_TypeError, "pygrad C core: binaryk takes 8 arguments");
  if (arg_i32(args[0], &op) < 0 || arg_i32(args[2], &did) < 0 || field_i32(args[3], PG_H_ID, &aid) < 0 ||
      field_i32(args[3], PG_H_META, &m) < 0 || arg_i32(args[4], &kd) < 0 || arg_i32(args[5], &ka) < 0 ||
      arg_i32(args[6], &km) < 0 || arg_i32(args[7], &rev) < 0)
    return NULL;
  a = (pg_handle *)args[3];
  pg_py_lock_take(st);
  nid = pg_store_make2k_locked(st, op, did, aid, kd, ka, km, rev, m);
  pg_lock_drop(&st->lock);
  return publish(cfg, st, nid, args[0], args[1], Py_None, a->f[PG_H_SHAPE], a->f[PG_H_DEVICE], a->f[PG_H_META]);
}

/* moved(op, dtype, dtype_id, x, arg, arg_id, shape, meta): op(x) with an arg, of this shape and meta (x's device) */
static PyObject *mk_moved(PyObject *cfg, PyObject *const *args, Py_ssize_t nargs) {
  pg_store *st = pg_py_store_of(PyTuple_GetItem(cfg, CFG_STORE));
  pg_handle *x;
  int32_t op, did, xid, aid, m, nid;
  if (!st) return NULL;
  if (nargs != 8) return PyErr_Format(PyExc_TypeError, "pygrad C core: moved takes 8 arguments");
  if (arg_i32(args[0], &op) < 0 || arg_i32(args[2], &did) < 0 || field_i32(args[3], PG_H_ID, &xid) < 0 ||
      arg_i32(args[5], &aid) < 0 || arg_i32(args[7], &m) < 0)
    return NULL;
  x = (pg_handle *)args[3];
  pg_py_lock_take(st);
  nid = pg_store_make_locked(st, op, did, &xid, 1, aid, 0, m);
  pg_lock_drop(&st->lock);
  return publish(cfg, st, nid, args[0], args[1], args[4], args[6], x->f[PG_H_DEVICE], args[7]);
}

static PyMethodDef mk_defs[] = {
  {"unary", (PyCFunction)(void (*)(void))mk_unary, METH_FASTCALL, "unary(op, dtype, dtype_id, x)"},
  {"binary", (PyCFunction)(void (*)(void))mk_binary, METH_FASTCALL, "binary(op, dtype, dtype_id, a, b)"},
  {"binaryk", (PyCFunction)(void (*)(void))mk_binaryk, METH_FASTCALL,
   "binaryk(op, dtype, dtype_id, a, kdtype_id, karg, kmeta, reversed)"},
  {"moved", (PyCFunction)(void (*)(void))mk_moved, METH_FASTCALL,
   "moved(op, dtype, dtype_id, x, arg, arg_id, shape, meta)"},
};
#define NMK ((int)(sizeof mk_defs / sizeof mk_defs[0]))

/* makers(cls, handles, reftype, callback): (unary, binary, binaryk, moved) bound to this store (self, a capsule),
   the handle class (a subclass of the handle type), the registry dict and how its entries are made */
static PyObject *makers(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  PyObject *cfg, *t;
  int i;
  if (nargs != 4 || !PyType_Check(args[0]) || !PyDict_Check(args[1]) || !PyType_Check(args[2]) ||
      !PyCallable_Check(args[3]))
    return PyErr_Format(PyExc_TypeError, "pygrad C core: makers(cls, handles, reftype, callback)");
  if (!pg_py_is_handle_type(args[0]))
    return PyErr_Format(PyExc_TypeError, "pygrad C core: makers: cls is no subclass of the handle type");
  if (!(cfg = PyTuple_New(CFG_N))) return NULL;
  Py_INCREF(self);
  PyTuple_SetItem(cfg, CFG_STORE, self);
  for (i = 0; i < 4; i++) {
    Py_INCREF(args[i]);
    PyTuple_SetItem(cfg, CFG_CLS + i, args[i]);
  }
  {
    PyObject *name = PyUnicode_InternFromString("nid");
    if (!name) {
      Py_DECREF(cfg);
      return NULL;
    }
    PyTuple_SetItem(cfg, CFG_NIDNAME, name);
  }
  t = PyTuple_New(NMK);
  for (i = 0; t && i < NMK; i++) {
    PyObject *f = PyCFunction_NewEx(&mk_defs[i], cfg, NULL);
    if (!f) Py_CLEAR(t);
    else PyTuple_SetItem(t, i, f);
  }
  Py_DECREF(cfg);
  return t;
}

PyMethodDef pg_py_makers_def = {"makers", (PyCFunction)(void (*)(void))makers, METH_FASTCALL,
                                "makers(cls, handles, reftype, callback): (unary, binary, binaryk, moved)"};
