/* UOp.placeholder in one C call on the C core. Every placeholder is a new BUFFER node whose arg (uid, shape, device,
   name) is new (its uid is), so besides the node and its handle it interns a new arg: in Python that was the
   argument checks, the arg and its interning key, the interner's locked slot allocation and its dicts, ~2 us of a
   W1 layer's ~4 us build. Here the common case -- a tuple (or list, or int) of non-negative ints, a DType of the
   table, a str or no name, a str device, a (shape, device) seen before, no metadata block open -- does the same
   steps: the (shape, device) meta id, the next uid, the arg, its key (intern.argkey's form), a new id under the
   interner's own lock (its slot registered in the store and entered in the interner's dicts), then the node and
   its handle. Anything else calls uop.py's Python placeholder (its
   fallback), which takes the general path and raises the precise errors, as before. */
#include "pyapi.h"
#include "store_impl.h"

/* cfg: (uids, meta_ids, interner, buffer_op, void_dtype, default_dtype, generic, fallback, ints_marker, cpu)
   uids: uop.py's uid counter; meta_ids: intern.META.ids, (shape, device) -> meta id; interner: intern.ARGS;
   buffer_op: Ops.BUFFER; void_dtype: dtypes.void (never on the fast path); default_dtype: dtypes.float32;
   generic(dtype, arg): UOp(Ops.BUFFER, dtype, (), arg), for a store code after the arg was interned; fallback: the
   Python placeholder; ints_marker: intern._INTS; cpu: "CPU", the default device */
enum { C_UIDS, C_META, C_ARGS, C_OP, C_VOID, C_F32, C_GENERIC, C_FALLBACK, C_INTS, C_CPU, C_N };
#define DRAIN_EVERY 1024 /* intern.Interner's since_drain period */

/* the int attribute `name` (an interned str) of o in *v; 0 if it is an int >= 0, else -1 with an exception set */
static int int_attr(PyObject *o, PyObject *name, long *v) {
  PyObject *a = PyObject_GetAttr(o, name);
  if (!a) return -1;
  *v = PyLong_AsLong(a);
  Py_DECREF(a);
  if (*v == -1 && PyErr_Occurred()) return -1;
  if (*v < 0) {
    PyErr_SetString(PyExc_SystemError, "pygrad C core: a negative interner counter");
    return -1;
  }
  return 0;
}

/* the shape as a new exact tuple of non-negative ints whose product fits int64, or NULL (no error set) */
static PyObject *checked_shape(PyObject *s) {
  PyObject *t;
  Py_ssize_t i, n;
  int64_t total = 1, zero = 0;
  if (PyLong_CheckExact(s)) t = PyTuple_Pack(1, s);
  else if (PyTuple_CheckExact(s)) {
    Py_INCREF(s);
    t = s;
  }
  else if (PyList_CheckExact(s)) t = PyList_AsTuple(s);
  else return NULL;
  if (!t) {
    PyErr_Clear();
    return NULL;
  }
  n = PyTuple_Size(t);
  for (i = 0; i < n; i++) {
    PyObject *e = PyTuple_GetItem(t, i);
    long long v = PyLong_CheckExact(e) ? PyLong_AsLongLong(e) : -1;
    if (v == -1 && PyErr_Occurred()) PyErr_Clear();
    if (v < 0) goto no;
    if (v == 0) zero = 1;
    else if (!zero && total > INT64_MAX / v) goto no;  /* (the Python path raises: too many elements) */
    else if (!zero) total *= v;
  }
  return t;
no:
  Py_DECREF(t);
  return NULL;
}

/* the interning key of arg (uid, shape, device, name): (tuple, (int, uid), (ints, shape), (str, device),
   (type(name), name)), intern.argkey's form for it */
static PyObject *arg_key(PyObject *ints, PyObject *uid, PyObject *shape, PyObject *device, PyObject *name) {
  PyObject *a = PyTuple_Pack(2, (PyObject *)&PyLong_Type, uid), *b = PyTuple_Pack(2, ints, shape),
           *c = PyTuple_Pack(2, (PyObject *)&PyUnicode_Type, device),
           *d = PyTuple_Pack(2, (PyObject *)Py_TYPE(name), name), *k = NULL;
  if (a && b && c && d) k = PyTuple_Pack(5, (PyObject *)&PyTuple_Type, a, b, c, d);
  Py_XDECREF(a);
  Py_XDECREF(b);
  Py_XDECREF(c);
  Py_XDECREF(d);
  return k;
}

/* what the placeholder is bound to besides cfg: the interner's lock's acquire and release, its dicts and its free
   deque (set once, in Interner.__init__), and the interned names of its counters and methods */
enum { B_CAP, B_CFG, B_ACQ, B_REL, B_IDS, B_OBJS, B_KEYS, B_IDENT, B_PLAIN, B_FREE, B_N };
static PyObject *N_since, *N_next, *N_slots, *N_drain, *N_slot;

/* Intern arg under key k as a new id, as Interner.get_fresh does, with the interner's lock held: its drain every
   DRAIN_EVERY new ids and its _slot where a freed slot is to be reused (or none is left) are the interner's own
   Python methods. 0 and the id in *aid, or -1 with an exception set */
static int intern_fresh(pg_store *st, PyObject *b, PyObject *k, PyObject *arg, int plain, int32_t *aid) {
  PyObject *in = PyTuple_GetItem(PyTuple_GetItem(b, B_CFG), C_ARGS), *r, *id = NULL, *oid = NULL, *v = NULL;
  long since, next, slots, a;
  Py_ssize_t nfree;
  int ok = -1, reg;
  if (!(r = PyObject_CallNoArgs(PyTuple_GetItem(b, B_ACQ)))) return -1;
  Py_DECREF(r);
  if (int_attr(in, N_since, &since) < 0 || !(v = PyLong_FromLong(since + 1)) || PyObject_SetAttr(in, N_since, v) < 0)
    goto out;
  Py_CLEAR(v);
  if (since + 1 >= DRAIN_EVERY) {
    if (!(r = PyObject_CallMethodObjArgs(in, N_drain, NULL))) goto out;
    Py_DECREF(r);
  }
  if (int_attr(in, N_next, &next) < 0 || int_attr(in, N_slots, &slots) < 0 ||
      (nfree = PyObject_Size(PyTuple_GetItem(b, B_FREE))) < 0)
    goto out;
  if (nfree || next >= slots) {  /* the oldest freed slot, or MemoryError */
    if (!(id = PyObject_CallMethodObjArgs(in, N_slot, NULL))) goto out;
    a = PyLong_AsLong(id);
  } else {
    a = next;
    if (!(id = PyLong_FromLong(a)) || !(v = PyLong_FromLong(a + 1)) || PyObject_SetAttr(in, N_next, v) < 0) goto out;
  }
  if (a <= 0 || a > INT32_MAX) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_SystemError, "pygrad C core: the interner made a bad id");
    goto out;
  }
  Py_BEGIN_ALLOW_THREADS  /* (Interner's cffi call releases the GIL there too; its lock still held) */
  reg = pg_store_arg_register(st, (int32_t)a);
  Py_END_ALLOW_THREADS
  if (reg) {  /* core.arg_register raises the precise error */
    PyObject *core = PyObject_GetAttrString(in, "core");
    if (core && (r = PyObject_CallMethod(core, "arg_register", "l", a))) {
      Py_DECREF(r);
      PyErr_SetString(PyExc_SystemError, "pygrad C core: arg_register failed once");
    }
    Py_XDECREF(core);
    goto out;
  }
  if (!(oid = PyLong_FromVoidPtr(arg)) || PyDict_SetItem(PyTuple_GetItem(b, B_IDS), k, id) < 0 ||
      PyDict_SetItem(PyTuple_GetItem(b, B_OBJS), id, arg) < 0 || PyDict_SetItem(PyTuple_GetItem(b, B_KEYS), id, k) < 0 ||
      PyDict_SetItem(PyTuple_GetItem(b, B_IDENT), oid, id) < 0 ||
      (plain && PyDict_SetItem(PyTuple_GetItem(b, B_PLAIN), arg, id) < 0))
    goto out;
  *aid = (int32_t)a;
  ok = 0;
out:
  Py_XDECREF(id);
  Py_XDECREF(oid);
  Py_XDECREF(v);
  if ((r = PyObject_CallNoArgs(PyTuple_GetItem(b, B_REL)))) Py_DECREF(r);
  else ok = -1;
  return ok;
}

/* fn(*args[:nargs], **dict(zip(kwnames, args[nargs:]))) (no vectorcall in the stable ABI of 3.10) */
static PyObject *call_fallback(PyObject *fn, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  PyObject *pos = PyTuple_New(nargs), *kw = NULL, *o = NULL;
  Py_ssize_t i, nkw = kwnames ? PyTuple_Size(kwnames) : 0;
  if (!pos) return NULL;
  for (i = 0; i < nargs; i++) {
    Py_INCREF(args[i]);
    PyTuple_SetItem(pos, i, args[i]);  /* steals the new reference */
  }
  if (nkw && !(kw = PyDict_New())) goto out;
  for (i = 0; i < nkw; i++)
    if (PyDict_SetItem(kw, PyTuple_GetItem(kwnames, i), args[nargs + i]) < 0) goto out;
  o = PyObject_Call(fn, pos, kw);
out:
  Py_DECREF(pos);
  Py_XDECREF(kw);
  return o;
}

/* placeholder(shape, dtype=float32, name=None, device="CPU"), bound to (registry capsule, cfg) */
static PyObject *placeholder(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  static const char *const names[4] = {"shape", "dtype", "name", "device"};
  PyObject *cfg = PyTuple_GetItem(self, 1), *v[4] = {NULL, NULL, Py_None, NULL}, *shape = NULL, *uid = NULL;
  PyObject *arg = NULL, *mk = NULL, *k = NULL, *meta, *o = NULL;
  Py_ssize_t i, j, nkw = kwnames ? PyTuple_Size(kwnames) : 0;
  pg_reg *reg = pg_meth_reg();
  pg_store *st;
  int32_t did, aid = 0, m, op, nid;
  long mv;
  if (!cfg || PyTuple_Size(cfg) != C_N) return NULL;
  v[1] = PyTuple_GetItem(cfg, C_F32), v[3] = PyTuple_GetItem(cfg, C_CPU);
  if (nargs > 4 || !reg) goto fallback;
  for (i = 0; i < nargs; i++) v[i] = args[i];
  for (j = 0; j < nkw; j++) {
    PyObject *kw = PyTuple_GetItem(kwnames, j);
    for (i = 0; i < 4 && PyUnicode_CompareWithASCIIString(kw, names[i]) != 0; i++) {}
    if (i == 4 || i < nargs) goto fallback;  /* (the Python signature raises TypeError) */
    v[i] = args[nargs + j];
  }
  if (!v[0] || (did = pg_meth_dtype_id(v[1])) < 0 || v[1] == PyTuple_GetItem(cfg, C_VOID) ||
      !(v[2] == Py_None || PyUnicode_CheckExact(v[2])) || !PyUnicode_CheckExact(v[3]) || !(shape = checked_shape(v[0])))
    goto fallback;
  st = pg_reg_store(reg);
  /* the same steps as placeholder and _buffer in uop.py */
  if (!(mk = PyTuple_Pack(2, shape, v[3]))) goto fail;
  meta = PyDict_GetItemWithError(PyTuple_GetItem(cfg, C_META), mk);  /* borrowed */
  if (!meta) {
    if (PyErr_Occurred()) goto fail;
    goto fallback;  /* a new (shape, device): MetaTable.get makes its id */
  }
  mv = PyLong_Check(meta) ? PyLong_AsLong(meta) : -1;
  if (mv < 0 || mv > INT32_MAX) {
    PyErr_Clear();
    goto fallback;
  }
  m = (int32_t)mv;
  if ((mv = PyLong_AsLong(PyTuple_GetItem(cfg, C_OP))) < 0 || mv > INT32_MAX) goto fail;  /* (checked by the maker) */
  op = (int32_t)mv;
  /* the uid is taken only now that nothing falls back: both cores number placeholders alike */
  if (!(uid = PyIter_Next(PyTuple_GetItem(cfg, C_UIDS)))) goto fail;
  if (!(arg = PyTuple_Pack(4, uid, shape, v[3], v[2]))) goto fail;
  if (!(k = arg_key(PyTuple_GetItem(cfg, C_INTS), uid, shape, v[3], v[2]))) goto fail;
  if (intern_fresh(st, self, k, arg, v[2] != Py_None, &aid) < 0) goto fail;
  pg_py_lock_take(st);
  nid = pg_store_make_locked(st, op, did, NULL, 0, aid, 0, m);
  if ((o = pg_mk_existing_unlock(st, reg, nid))) goto done;  /* (a fresh arg: never) */
  if (nid < 0) o = PyObject_CallFunctionObjArgs(PyTuple_GetItem(cfg, C_GENERIC), v[1], arg, NULL);
  else o = pg_reg_wrap(reg, nid, PyTuple_GetItem(cfg, C_OP), v[1], arg, Py_None, shape, v[3], meta);
  goto done;
fallback:
  o = call_fallback(PyTuple_GetItem(cfg, C_FALLBACK), args, nargs, kwnames);
  goto done;
fail:
  o = NULL;
done:
  Py_XDECREF(shape);
  Py_XDECREF(uid);
  Py_XDECREF(arg);
  Py_XDECREF(mk);
  Py_XDECREF(k);
  return o;
}

static PyMethodDef placeholder_def = {"placeholder", (PyCFunction)(void (*)(void))placeholder,
                                      METH_FASTCALL | METH_KEYWORDS,
                                      "placeholder(shape, dtype=dtypes.float32, name=None, device='CPU'): an input "
                                      "tensor (BUFFER); every call makes a distinct node"};

/* placeholder_maker(cfg), bound to the registry capsule: placeholder (above) bound to it, to cfg and to the
   interner's parts (B_*) */
static PyObject *placeholder_maker(PyObject *cap, PyObject *cfg) {
  static const char *const parts[B_N] = {NULL, NULL, "acquire", "release", "ids", "objs", "keys", "ident", "plain",
                                         "free"};
  PyObject *b = NULL, *in, *lock, *f = NULL;
  int i;
  if (!PyTuple_CheckExact(cfg) || PyTuple_Size(cfg) != C_N || !PyDict_CheckExact(PyTuple_GetItem(cfg, C_META)) ||
      !PyIter_Check(PyTuple_GetItem(cfg, C_UIDS)) || !PyCallable_Check(PyTuple_GetItem(cfg, C_FALLBACK)) ||
      !PyCallable_Check(PyTuple_GetItem(cfg, C_GENERIC)) || !PyLong_Check(PyTuple_GetItem(cfg, C_OP)) ||
      !PyUnicode_CheckExact(PyTuple_GetItem(cfg, C_CPU)))
    return PyErr_Format(PyExc_TypeError, "pygrad C core: placeholder_maker(cfg): a tuple of %d (see pyleaf.c)", C_N);
  if (!pg_reg_from(cap)) return NULL;
  if (!N_since && !((N_since = PyUnicode_InternFromString("since_drain")) &&
                    (N_next = PyUnicode_InternFromString("next")) && (N_slots = PyUnicode_InternFromString("slots")) &&
                    (N_drain = PyUnicode_InternFromString("_drain")) && (N_slot = PyUnicode_InternFromString("_slot"))))
    return NULL;
  in = PyTuple_GetItem(cfg, C_ARGS);
  if (!(lock = PyObject_GetAttrString(in, "lock")) || !(b = PyTuple_New(B_N))) goto out;
  Py_INCREF(cap);
  PyTuple_SetItem(b, B_CAP, cap);  /* (steals) */
  Py_INCREF(cfg);
  PyTuple_SetItem(b, B_CFG, cfg);
  for (i = B_ACQ; i < B_N; i++) {
    PyObject *p = PyObject_GetAttrString(i <= B_REL ? lock : in, parts[i]);
    if (!p) goto out;
    PyTuple_SetItem(b, i, p);
    if (i >= B_IDS && i <= B_PLAIN && !PyDict_CheckExact(p)) {
      PyErr_Format(PyExc_TypeError, "pygrad C core: placeholder_maker: the interner's %s is no dict", parts[i]);
      goto out;
    }
  }
  f = PyCFunction_NewEx(&placeholder_def, b, NULL);
out:
  Py_XDECREF(lock);
  Py_XDECREF(b);
  return f;
}

PyMethodDef pg_leaf_maker_def = {"placeholder_maker", placeholder_maker, METH_O,
                                 "placeholder_maker(cfg): UOp.placeholder's common case in one call"};
