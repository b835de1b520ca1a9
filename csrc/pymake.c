/* The math methods' whole fast path in one call: make the node (pyfast.c's store calls) and return its unique
   handle: the live one if Python has it (the new reference dropped at once, under the same store lock), else a new
   handle published in the registry (pyreg.c). Done from Python this was a store call, a registry probe, the
   handle, a weak reference and dict.setdefault: ~500 ns of a ~900 ns method. Each call returns the handle, or a
   negative store code as an int. The calls are bound to a capsule of the registry (see makers). */
#include "pyapi.h"
#include "store_impl.h"

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

/* the store and registry of the capsule the calls are bound to (NULL with an exception set if it is none) */
static pg_store *cfg_store(PyObject *cap, pg_reg **reg) {
  if (!(*reg = pg_reg_from(cap))) return NULL;
  return pg_reg_store(*reg);
}

/* the end of a make, with the store's lock held: the live handle of the new reference on nid (dropped), or NULL
   (a new handle is needed: the caller publishes one) -- the lock is released either way */
PyObject *pg_mk_existing_unlock(pg_store *st, pg_reg *reg, int32_t nid) {
  PyObject *o = nid >= 0 ? pg_reg_live(reg, nid) : NULL;
  if (o) {
    pg_store_decref_locked(st, nid);  /* cannot free it: its handle holds a reference */
    Py_INCREF(o);
  }
  pg_lock_drop(&st->lock);
  return o;
}

/* the handle of the new reference on node nid, or nid itself if it is a negative store code */
static PyObject *publish(pg_reg *reg, int32_t nid, PyObject *op, PyObject *dtype, PyObject *arg, PyObject *shape,
                         PyObject *device, PyObject *meta) {
  if (nid < 0) return PyLong_FromLong(nid);
  return pg_reg_wrap(reg, nid, op, dtype, arg, Py_None, shape, device, meta);
}

/* unary(op, dtype, dtype_id, x): op(x), x's shape, device and meta */
static PyObject *mk_unary(PyObject *cfg, PyObject *const *args, Py_ssize_t nargs) {
  pg_reg *reg = NULL;
  pg_store *st = cfg_store(cfg, &reg);
  PyObject *o;
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
  if ((o = pg_mk_existing_unlock(st, reg, nid))) return o;
  return publish(reg, nid, args[0], args[1], Py_None, x->f[PG_H_SHAPE], x->f[PG_H_DEVICE], x->f[PG_H_META]);
}

/* binary(op, dtype, dtype_id, a, b): op(a, b), a's shape, device and meta */
static PyObject *mk_binary(PyObject *cfg, PyObject *const *args, Py_ssize_t nargs) {
  pg_reg *reg = NULL;
  pg_store *st = cfg_store(cfg, &reg);
  PyObject *o;
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
  if ((o = pg_mk_existing_unlock(st, reg, nid))) return o;
  return publish(reg, nid, args[0], args[1], Py_None, a->f[PG_H_SHAPE], a->f[PG_H_DEVICE], a->f[PG_H_META]);
}

/* binaryk(op, dtype, dtype_id, a, kdtype_id, karg, kmeta, reversed): op(a, k) or op(k, a) with the CONST k made in
   the same call (pg_store_make2k), a's shape, device and meta */
static PyObject *mk_binaryk(PyObject *cfg, PyObject *const *args, Py_ssize_t nargs) {
  pg_reg *reg = NULL;
  pg_store *st = cfg_store(cfg, &reg);
  PyObject *o;
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
  if ((o = pg_mk_existing_unlock(st, reg, nid))) return o;
  return publish(reg, nid, args[0], args[1], Py_None, a->f[PG_H_SHAPE], a->f[PG_H_DEVICE], a->f[PG_H_META]);
}

/* moved(op, dtype, dtype_id, x, arg, arg_id, shape, meta): op(x) with an arg, of this shape and meta (x's device) */
static PyObject *mk_moved(PyObject *cfg, PyObject *const *args, Py_ssize_t nargs) {
  pg_reg *reg = NULL;
  pg_store *st = cfg_store(cfg, &reg);
  PyObject *o;
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
  if ((o = pg_mk_existing_unlock(st, reg, nid))) return o;
  return publish(reg, nid, args[0], args[1], args[4], args[6], x->f[PG_H_DEVICE], args[7]);
}

/* leaf(op, dtype, dtype_id, arg, arg_id, shape, device, meta): a node of no sources with this arg (a placeholder's
   BUFFER: the node and its handle in one call, as for the methods) */
static PyObject *mk_leaf(PyObject *cfg, PyObject *const *args, Py_ssize_t nargs) {
  pg_reg *reg = NULL;
  pg_store *st = cfg_store(cfg, &reg);
  PyObject *o;
  int32_t op, did, aid, m, nid;
  if (!st) return NULL;
  if (nargs != 8) return PyErr_Format(PyExc_TypeError, "pygrad C core: leaf takes 8 arguments");
  if (arg_i32(args[0], &op) < 0 || arg_i32(args[2], &did) < 0 || arg_i32(args[4], &aid) < 0 ||
      arg_i32(args[7], &m) < 0)
    return NULL;
  pg_py_lock_take(st);
  nid = pg_store_make_locked(st, op, did, NULL, 0, aid, 0, m);
  if ((o = pg_mk_existing_unlock(st, reg, nid))) return o;
  return publish(reg, nid, args[0], args[1], args[3], args[5], args[6], args[7]);
}

/* cached(op, x, arg), bound to (registry capsule, uop.py's movement cache): the movement methods' whole hit path.
   arg is an exact tuple of non-negative ints (a shape or an order) other than x's shape, and the cache (see uop.py's
   _moved) holds (op, x's meta, x's dtype, arg) -> (shape, meta, arg id, dtype id): make the node and return its
   handle. None for anything else -- another arg, a miss, a store code (a drained arg id) -- and the caller takes
   the general path (uop.movement), which raises the precise errors. A void dtype is never in the cache. */
static PyObject *mk_cached(PyObject *cfg, PyObject *const *args, Py_ssize_t nargs) {
  PyObject *cap = PyTuple_GetItem(cfg, 0), *cache = PyTuple_GetItem(cfg, 1), *arg, *key, *hit, *o;
  pg_handle *x;
  pg_reg *reg = NULL;
  pg_store *st;
  Py_ssize_t i, n;
  int32_t op, xid, hv[3], nid;
  int eq;
  if (!cap || !cache || !(st = cfg_store(cap, &reg))) return NULL;
  if (nargs != 3) return PyErr_Format(PyExc_TypeError, "pygrad C core: cached takes 3 arguments");
  x = (pg_handle *)args[1], arg = args[2];
  if (!PyTuple_CheckExact(arg) || !pg_py_is_handle(args[1]) || !x->f[PG_H_DTYPE] || !x->f[PG_H_SHAPE] ||
      !x->f[PG_H_META] || !x->f[PG_H_DEVICE])
    Py_RETURN_NONE;
  n = PyTuple_Size(arg);
  for (i = 0; i < n; i++) {
    PyObject *e = PyTuple_GetItem(arg, i);
    if (!PyLong_CheckExact(e) || PyLong_AsLong(e) < 0) {
      PyErr_Clear();  /* (an int too large for a long) */
      Py_RETURN_NONE;
    }
  }
  if ((eq = PyObject_RichCompareBool(arg, x->f[PG_H_SHAPE], Py_EQ)) != 0) {
    if (eq < 0) return NULL;
    Py_RETURN_NONE;
  }
  if (!(key = PyTuple_Pack(4, args[0], x->f[PG_H_META], x->f[PG_H_DTYPE], arg))) return NULL;
  hit = PyDict_GetItemWithError(cache, key);  /* borrowed */
  Py_DECREF(key);
  if (!hit) {
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
  }
  if (!PyTuple_CheckExact(hit) || PyTuple_Size(hit) != 4) Py_RETURN_NONE;
  Py_INCREF(hit);  /* held across the calls below (a collection could clear the cache) */
  for (i = 0; i < 3; i++)
    if (arg_i32(PyTuple_GetItem(hit, i + 1), &hv[i]) < 0) goto fail_hit;  /* meta, arg id, dtype id */
  if (arg_i32(args[0], &op) < 0 || field_i32(args[1], PG_H_ID, &xid) < 0) goto fail_hit;
  pg_py_lock_take(st);
  nid = pg_store_make_locked(st, op, hv[2], &xid, 1, hv[1], 0, hv[0]);
  if ((o = pg_mk_existing_unlock(st, reg, nid))) goto done;
  if (nid < 0) {
    o = Py_None;
    Py_INCREF(o);
    goto done;
  }
  o = pg_reg_wrap(reg, nid, args[0], x->f[PG_H_DTYPE], arg, Py_None, PyTuple_GetItem(hit, 0), x->f[PG_H_DEVICE],
                  PyTuple_GetItem(hit, 1));
done:
  Py_DECREF(hit);
  return o;
fail_hit:
  Py_DECREF(hit);
  return NULL;
}

static PyMethodDef mk_defs[] = {
  {"unary", (PyCFunction)(void (*)(void))mk_unary, METH_FASTCALL, "unary(op, dtype, dtype_id, x)"},
  {"binary", (PyCFunction)(void (*)(void))mk_binary, METH_FASTCALL, "binary(op, dtype, dtype_id, a, b)"},
  {"binaryk", (PyCFunction)(void (*)(void))mk_binaryk, METH_FASTCALL,
   "binaryk(op, dtype, dtype_id, a, kdtype_id, karg, kmeta, reversed)"},
  {"moved", (PyCFunction)(void (*)(void))mk_moved, METH_FASTCALL,
   "moved(op, dtype, dtype_id, x, arg, arg_id, shape, meta)"},
  {"leaf", (PyCFunction)(void (*)(void))mk_leaf, METH_FASTCALL,
   "leaf(op, dtype, dtype_id, arg, arg_id, shape, device, meta)"},
};
#define NMK ((int)(sizeof mk_defs / sizeof mk_defs[0]))

static PyMethodDef cached_def = {"cached", (PyCFunction)(void (*)(void))mk_cached, METH_FASTCALL,
                                 "cached(op, x, arg): the cached movement of x, or None"};

/* cached_maker(cache), bound to the registry capsule: cached (above) bound to it and to the movement cache */
static PyObject *cached_maker(PyObject *cap, PyObject *cache) {
  PyObject *cfg, *f;
  if (!PyDict_Check(cache)) return PyErr_Format(PyExc_TypeError, "pygrad C core: cached_maker(cache): a dict");
  if (!(cfg = PyTuple_Pack(2, cap, cache))) return NULL;
  f = PyCFunction_NewEx(&cached_def, cfg, NULL);
  Py_DECREF(cfg);
  return f;
}

static PyMethodDef cached_maker_def = {"cached_maker", cached_maker, METH_O,
                                       "cached_maker(cache): the movement methods' hit path over this cache"};

/* makers(cls): (unary, binary, binaryk, moved, leaf, cached_maker, wrap, lookup, flush, wrap_many, install, md, placeholder_maker, tmpl_install, prog)
   for handles of cls (a subclass of the handle type) on this store (self, its capsule): the makers above, the
   registry's calls (pyreg.c), the methods' installer (pymeth.c) and the placeholder's maker (pyleaf.c), all bound to one new registry, and the templated
   methods' installer and program maker (pytmpl.c), bound to the store. Called once per process (uop.py): a registry is never freed (see pyreg.c) */
static PyObject *makers(PyObject *self, PyObject *cls) {
  PyObject *cap, *calls, *t;
  pg_reg *reg;
  int i;
  if (!pg_py_is_handle_type(cls))
    return PyErr_Format(PyExc_TypeError, "pygrad C core: makers: cls is no subclass of the handle type");
  if (!(reg = pg_reg_new(self, (PyTypeObject *)cls))) return NULL;
  if (!(cap = pg_reg_capsule(reg))) return NULL;  /* (reg stays: it holds only the store's capsule and cls) */
  calls = pg_reg_calls(cap);
  if (calls) {
    PyObject *meth = pg_meth_calls(cap), *tmpl = pg_tmpl_calls(self), *both = NULL, *all = NULL;
    if (meth && tmpl && (both = PySequence_Concat(calls, meth))) all = PySequence_Concat(both, tmpl);
    Py_XDECREF(meth);
    Py_XDECREF(tmpl);
    Py_XDECREF(both);
    Py_DECREF(calls);
    calls = all;
  }
  t = calls ? PyTuple_New(NMK + 1 + PyTuple_Size(calls)) : NULL;
  for (i = 0; t && i < NMK + 1 + PyTuple_Size(calls); i++) {
    PyObject *f;
    if (i < NMK) f = PyCFunction_NewEx(&mk_defs[i], cap, NULL);
    else if (i == NMK) f = PyCFunction_NewEx(&cached_maker_def, cap, NULL);
    else {
      f = PyTuple_GetItem(calls, i - NMK - 1);
      Py_XINCREF(f);
    }
    if (!f) Py_CLEAR(t);
    else PyTuple_SetItem(t, i, f);  /* steals f */
  }
  Py_XDECREF(calls);
  Py_DECREF(cap);  /* the functions hold it */
  return t;
}

PyMethodDef pg_py_makers_def = {"makers", makers, METH_O,
                                "makers(cls): (unary, binary, binaryk, moved, leaf, cached_maker, wrap, lookup, flush, wrap_many, install, md, placeholder_maker, tmpl_install, prog)"};
