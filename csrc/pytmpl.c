/* templates.py's hit path in C: a multi-node math method (`x @ w`, `x.relu()`, `a - b`, ...) whose signature has a
   cached program is that program run over its operands and the result's handle, in one C function with no Python
   frame. In Python the hit cost the templated method's frame, its key tuple, a cffi call and _wrap: ~1.3 us of a
   relu. The key is the one templates.py builds -- (kind, dtype id, meta) with no operand, (kind, dtype id, meta,
   operand's dtype id, operand's meta) with one node operand -- and the entry the one it caches: (cffi program, op,
   dtype, arg, tag, shape, device, meta, program capsule). Anything else -- other arguments, keywords, a miss, a
   metadata block, templates off -- calls the Python method (its fallback), as before.

   The methods are method descriptors set on UOp (one C function per slot, as in pymeth.c) and the handle type's
   number slots for -, / and @. The tables are filled by install (uop.py, templates.py: at import, with the GIL
   held) and read with the GIL held. */
#include "pyapi.h"
#include "store_impl.h"
#include "prog.h"
#include <string.h>

#define T_N 32      /* method slots */
#define T_NNB 3     /* number slots: __sub__, __truediv__, __matmul__ */
#define T_NAME 32
#define PROG_CAPSULE "pygrad.prog"

typedef struct {
  PyObject *kind;       /* the key's first item (the method's name in templates.py) */
  PyObject *fwd, *rev;  /* the Python methods: op(self, ...) and (number slots) the reflected op(x, self) */
  char name[T_NAME];
} t_slot;

static t_slot T_m[T_N], T_nb[T_NNB];
static PyMethodDef T_def[T_N];
static PyObject *T_entries, *T_state, *T_on;  /* templates.py's _entries and _state, and the key "on" */
static pg_store *T_st;                        /* the store the programs run on */
static const char *const T_nbnames[T_NNB] = {"__sub__", "__truediv__", "__matmul__"};

/* the cached result of kind over self (and x, or NULL), or NULL without an exception: not a hit */
static PyObject *hit(PyObject *kind, PyObject *self, PyObject *x) {
  pg_handle *h = (pg_handle *)self, *hx = (pg_handle *)x;
  pg_reg *reg = pg_meth_reg();
  PyObject *on, *key, *e, *o = NULL, *v;
  pg_prog *p;
  int32_t in[2], nid;
  int d, dx = 0, n = x ? 5 : 3, i;
  if (!reg || !T_entries || !kind || !pg_meth_usable(self) || (x && !pg_meth_usable(x))) return NULL;
  if (!(on = PyDict_GetItemWithError(T_state, T_on)) || on != Py_True) goto miss;
  if ((d = pg_meth_dtype_id(h->f[PG_H_DTYPE])) < 0 || (x && (dx = pg_meth_dtype_id(hx->f[PG_H_DTYPE])) < 0))
    return NULL;
  if (!(key = PyTuple_New(n))) goto miss;
  for (i = 0; i < n; i++) {
    v = i == 0 ? kind : i == 2 ? h->f[PG_H_META] : i == 4 ? hx->f[PG_H_META] : NULL;
    if (v) Py_INCREF(v);
    else if (!(v = PyLong_FromLong(i == 1 ? d : dx))) {
      Py_DECREF(key);
      goto miss;
    }
    PyTuple_SetItem(key, i, v);  /* steals v */
  }
  e = PyDict_GetItemWithError(T_entries, key);  /* borrowed */
  Py_DECREF(key);
  if (!e || !PyTuple_CheckExact(e) || PyTuple_Size(e) != 9) goto miss;
  if (!(p = (pg_prog *)PyCapsule_GetPointer(PyTuple_GetItem(e, 8), PROG_CAPSULE))) goto miss;
  Py_INCREF(e);  /* held across the calls below (a collection could clear the cache) */
  in[0] = h->nid, in[1] = x ? hx->nid : 0;
  pg_py_lock_take(T_st);
  nid = pg_prog_run1_locked(T_st, p, in, x ? 2 : 1);
  if (!(o = pg_mk_existing_unlock(T_st, reg, nid)) && nid >= 0)
    o = pg_reg_wrap(reg, nid, PyTuple_GetItem(e, 1), PyTuple_GetItem(e, 2), PyTuple_GetItem(e, 3),
                    PyTuple_GetItem(e, 4), PyTuple_GetItem(e, 5), PyTuple_GetItem(e, 6), PyTuple_GetItem(e, 7));
  Py_DECREF(e);
  return o;
miss:
  PyErr_Clear();
  return NULL;
}

/* fn(self, *args, **{kwnames: the values after args}) */
static PyObject *call_back(PyObject *fn, PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                           PyObject *kwnames) {
  PyObject *t, *kw = NULL, *r;
  Py_ssize_t i, nk = kwnames ? PyTuple_Size(kwnames) : 0;
  if (!fn) Py_RETURN_NOTIMPLEMENTED;
  if (!(t = PyTuple_New(nargs + 1))) return NULL;
  Py_INCREF(self);
  PyTuple_SetItem(t, 0, self);
  for (i = 0; i < nargs; i++) {
    Py_INCREF(args[i]);
    PyTuple_SetItem(t, i + 1, args[i]);
  }
  if (nk && !(kw = PyDict_New())) goto fail;
  for (i = 0; i < nk; i++)
    if (PyDict_SetItem(kw, PyTuple_GetItem(kwnames, i), args[nargs + i]) < 0) goto fail;
  r = PyObject_Call(fn, t, kw);
  Py_DECREF(t);
  Py_XDECREF(kw);
  return r;
fail:
  Py_DECREF(t);
  Py_XDECREF(kw);
  return NULL;
}

static PyObject *method(int k, PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  const t_slot *m = &T_m[k];
  PyObject *o = NULL;
  if (!kwnames && (nargs == 0 || nargs == 1)) o = hit(m->kind, self, nargs ? args[0] : NULL);
  if (o || PyErr_Occurred()) return o;
  return call_back(m->fwd, self, args, nargs, kwnames);
}

/* a number slot: a op b, a or b the handle (b: the reflected method of b) */
static PyObject *number(int k, PyObject *a, PyObject *b) {
  const t_slot *m = &T_nb[k];
  PyObject *o = pg_py_is_handle(a) ? hit(m->kind, a, b) : NULL;
  if (o || PyErr_Occurred()) return o;
  if (pg_py_is_handle(a)) return call_back(m->fwd, a, &b, 1, NULL);
  return call_back(m->rev, b, &a, 1, NULL);
}

PyObject *pg_tmpl_nb_sub(PyObject *a, PyObject *b) { return number(0, a, b); }
PyObject *pg_tmpl_nb_div(PyObject *a, PyObject *b) { return number(1, a, b); }
PyObject *pg_tmpl_nb_matmul(PyObject *a, PyObject *b) { return number(2, a, b); }

#define TM(k) \
  static PyObject *tm##k(PyObject *s, PyObject *const *a, Py_ssize_t n, PyObject *kw) { return method(k, s, a, n, kw); }
TM(0) TM(1) TM(2) TM(3) TM(4) TM(5) TM(6) TM(7) TM(8) TM(9) TM(10) TM(11) TM(12) TM(13) TM(14) TM(15)
TM(16) TM(17) TM(18) TM(19) TM(20) TM(21) TM(22) TM(23) TM(24) TM(25) TM(26) TM(27) TM(28) TM(29) TM(30) TM(31)
typedef PyObject *(*t_fastkw)(PyObject *, PyObject *const *, Py_ssize_t, PyObject *);
static const t_fastkw T_fn[T_N] = {tm0, tm1, tm2, tm3, tm4, tm5, tm6, tm7, tm8, tm9, tm10, tm11, tm12, tm13, tm14,
                                   tm15, tm16, tm17, tm18, tm19, tm20, tm21, tm22, tm23, tm24, tm25, tm26, tm27,
                                   tm28, tm29, tm30, tm31};

/* o, or NULL for None, with a new reference in *slot (the old one dropped) */
static void put(PyObject **slot, PyObject *o) {
  PyObject *old = *slot;
  if (o == Py_None) o = NULL;
  Py_XINCREF(o);
  *slot = o;
  Py_XDECREF(old);
}

/* install(cls, entries, state, specs), bound to the store's capsule: entries and state templates.py's dicts (None:
   no fast path, only the fallbacks); specs a tuple of (kind, name, key kind, fwd, rev), kind 0 a method (returned
   in a dict name -> method descriptor of cls, for the caller to set), 2 a number slot (name one of T_nbnames) */
static PyObject *install(PyObject *cap, PyObject *const *args, Py_ssize_t nargs) {
  pg_store *st = pg_py_store_of(cap);
  PyObject *out, *specs;
  Py_ssize_t i, n;
  int nm = 0;
  if (!st) return NULL;
  if (nargs != 4 || !pg_py_is_handle_type(args[0]) || (args[1] != Py_None && !PyDict_Check(args[1])) ||
      (args[2] != Py_None && !PyDict_Check(args[2])) || (args[1] == Py_None) != (args[2] == Py_None) ||
      !PyTuple_Check(args[3]))
    return PyErr_Format(PyExc_TypeError, "pygrad C core: install(cls, entries, state, specs)");
  if (!T_on && !(T_on = PyUnicode_InternFromString("on"))) return NULL;
  if (!(out = PyDict_New())) return NULL;
  put(&T_entries, NULL), put(&T_state, NULL);  /* off while the tables change */
  T_st = st;
  specs = args[3], n = PyTuple_Size(specs);
  for (i = 0; i < n; i++) {
    PyObject *s = PyTuple_GetItem(specs, i), *descr;
    const char *name;
    long kind;
    t_slot *m;
    int j;
    if (!PyTuple_Check(s) || PyTuple_Size(s) != 5) goto bad;
    kind = PyLong_AsLong(PyTuple_GetItem(s, 0));
    if (!(name = PyUnicode_AsUTF8AndSize(PyTuple_GetItem(s, 1), NULL))) goto fail;
    if (strlen(name) >= T_NAME) goto bad;
    if (kind == 2) {
      for (j = 0; j < T_NNB && strcmp(name, T_nbnames[j]); j++) {}
      if (j == T_NNB) goto bad;
      m = &T_nb[j];
    } else if (kind == 0 && nm < T_N) {
      m = &T_m[nm];
    } else {
      goto bad;
    }
    put(&m->kind, PyTuple_GetItem(s, 2)), put(&m->fwd, PyTuple_GetItem(s, 3)), put(&m->rev, PyTuple_GetItem(s, 4));
    memcpy(m->name, name, strlen(name) + 1);  /* (its length checked above) */
    if (kind == 2) continue;
    T_def[nm].ml_name = m->name, T_def[nm].ml_meth = (PyCFunction)(void (*)(void))T_fn[nm];
    T_def[nm].ml_flags = METH_FASTCALL | METH_KEYWORDS;
    if (!(descr = PyDescr_NewMethod((PyTypeObject *)args[0], &T_def[nm++]))) goto fail;
    if (PyDict_SetItemString(out, name, descr) < 0) {
      Py_DECREF(descr);
      goto fail;
    }
    Py_DECREF(descr);
  }
  put(&T_entries, args[1]), put(&T_state, args[2]);
  return out;
bad:
  if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "pygrad C core: install: a bad method spec");
fail:
  Py_DECREF(out);
  return NULL;
}

/* a program capsule's destructor: the program freed (its store's lock is taken without the GIL held) */
static void prog_free(PyObject *cap) {
  pg_prog *p = (pg_prog *)PyCapsule_GetPointer(cap, PROG_CAPSULE);
  if (!p) {
    PyErr_Clear();
    return;
  }
  Py_BEGIN_ALLOW_THREADS
  pg_prog_delete(p);
  Py_END_ALLOW_THREADS
}

/* prog(words), bound to the store's capsule: the checked program of these words (a list of ints) in a capsule for
   the entries above; ValueError if they are not one */
static PyObject *prog(PyObject *cap, PyObject *words) {
  pg_store *st = pg_py_store_of(cap);
  Py_ssize_t i, n;
  int32_t *w;
  pg_prog *p;
  PyObject *r;
  if (!st) return NULL;
  if (!PyList_Check(words) || (n = PyList_Size(words)) > INT32_MAX)
    return PyErr_Format(PyExc_TypeError, "pygrad C core: prog(words): a list of ints");
  if (!(w = (int32_t *)PyMem_Malloc((size_t)(n ? n : 1) * sizeof *w))) return PyErr_NoMemory();
  for (i = 0; i < n; i++) {
    long v = PyLong_AsLong(PyList_GetItem(words, i));
    if (v == -1 && PyErr_Occurred()) goto fail;
    if (v < INT32_MIN || v > INT32_MAX) {
      PyErr_SetString(PyExc_ValueError, "pygrad C core: program words must be int32");
      goto fail;
    }
    w[i] = (int32_t)v;
  }
  Py_BEGIN_ALLOW_THREADS
  p = pg_prog_new(st, w, (int32_t)n);
  Py_END_ALLOW_THREADS
  PyMem_Free(w);
  if (!p) return PyErr_Format(PyExc_ValueError, "pygrad C core: template program rejected");
  if (!(r = PyCapsule_New(p, PROG_CAPSULE, prog_free))) {
    Py_BEGIN_ALLOW_THREADS
    pg_prog_delete(p);
    Py_END_ALLOW_THREADS
  }
  return r;
fail:
  PyMem_Free(w);
  return NULL;
}

static PyMethodDef install_def = {"install", (PyCFunction)(void (*)(void))install, METH_FASTCALL,
                                  "install(cls, entries, state, specs): templated methods in C (see pytmpl.c)"};
static PyMethodDef prog_def = {"prog", prog, METH_O, "prog(words): a program capsule"};

PyObject *pg_tmpl_calls(PyObject *storecap) {
  PyObject *a = PyCFunction_NewEx(&install_def, storecap, NULL), *b = PyCFunction_NewEx(&prog_def, storecap, NULL);
  PyObject *t = a && b ? PyTuple_Pack(2, a, b) : NULL;
  Py_XDECREF(a);
  Py_XDECREF(b);
  return t;
}
