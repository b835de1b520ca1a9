/* The walk of tinygrad -> pygrad conversion (pygrad/interop/tinygrad_in.py, _In._walk) as one CPython builtin: a
   post-order over a foreign graph's value sources (an explicit stack, never recursion), marking which nodes lie on a
   path to a target, and making the node table's rows of the usual nodes (an elementwise op whose operands are
   converted or opaque, typed and of its shape; a reshape or permute of a converted node; a reduce; a buffer; a
   DETACH or CONTIGUOUS) as the Python walk makes them. Every
   other node is made by a Python callback, which is the Python walk's own code for a node. The foreign IR is
   described by the caller's tables (no tinygrad name is known here). Every argument is checked: a wrong one raises
   TypeError, never crashes. */
#include "pyapi.h"
#include <stdlib.h>

/* cfg: (live, memo, targets, rows, puts, mdd, tsh, shapes, plain, smove, alu, dti, cmp, weak, param, reshape,
   permute, ints, shn, node, meta, vsrc, mdata, md1, dt, where, reduce, buffer, rop, paramarg, leaf, same)
   live: dict node -> whether it is on a path to a target (every node visited); memo: dict node -> its row; targets:
   a set, or None (every node is converted); rows, puts: lists the rows and (row, node) pairs are appended to (puts
   None: no pairs are kept); mdd:
   dict row -> metadata; tsh: dict node -> its shape; shapes: dict shape or axes -> the one object of it; plain,
   smove: sets of ops whose value sources are all sources, the first source; alu: dict op -> the row's op; dti: dict
   dtype -> the row's dtype; cmp: set of ops whose result is bool; weak: set of weak dtypes; param, reshape, permute:
   those ops; ints: (RESHAPE, PERMUTE, bool dtype, EXPAND, broadcast tag, REDUCE_AXIS, BUFFER, reduce tag) of the
   rows; shn: the name of the node's
   cached shape in its __dict__; node(u, vs) -> row or None: the Python walk's making of u; meta(row, md): its
   metadata step; vsrc(u): the value sources of a node of another op; mdata: dict weakref(node) -> metadata tuple,
   or None; md1: dict (name, backward) -> the metadata of a 1-tuple; dt: dict dtype -> pygrad dtype (a weak operand
   converted in the dtype of its op, or of its typed operands for a comparison or WHERE, is memo's (operand, that
   dtype)); where: the op whose first source is its condition; reduce, buffer: those ops; rop: dict reduce op -> the
   row's (missing: the same); paramarg: the class of a buffer's arg that names it; leaf: a set of the ops with no
   value sources (vsrc is not called for them); same: dict op -> the row's op, for the ops of one source, no arg and
   its source's dtype (DETACH, CONTIGUOUS). */
enum { W_LIVE, W_MEMO, W_TARGETS, W_ROWS, W_PUTS, W_MDD, W_TSH, W_SHAPES, W_PLAIN, W_SMOVE, W_ALU, W_DTI, W_CMP,
       W_WEAK, W_PARAM, W_RESHAPE, W_PERMUTE, W_INTS, W_SHN, W_NODE, W_META, W_VSRC, W_MDATA, W_MD1, W_DT, W_WHERE,
       W_REDUCE, W_BUFFER, W_ROP, W_PARAMARG, W_LEAF, W_SAME, W_N };

/* the metadata dict's entries keyed by their nodes themselves, made once the walk has met an eighth as many nodes
   as the dict has entries (so it costs at most what it saves): a lookup by weak reference compares the references'
   nodes with their class's Python-level __eq__ (~1,200 instructions), a lookup by node finds it by identity */
typedef struct {
  PyObject *ix;  /* owned; NULL until made */
  Py_ssize_t met;  /* nodes whose metadata was looked up */
} mdix_t;

/* the pygrad metadata of the Metadata objects a walk has met, for one-element metadata tuples: a direct-mapped
   table keyed by the object's address (tinygrad makes one Metadata per Tensor method call, shared by the nodes that
   call makes, usually consecutive), so its name and backward are read and its pygrad form looked up once. Each
   entry holds strong references to its key and value until it is replaced or the walk ends: an address the walk
   has cached cannot be freed and reused meanwhile, so a hit is always the same object */
#define MDC_N 256
typedef struct {
  PyObject *key[MDC_N], *val[MDC_N];  /* owned; NULL: empty */
} mdc_t;

typedef struct {
  PyObject *f[W_N];
  mdix_t *mx;
  mdc_t *mc;
  PyObject *r_reshape, *r_permute, *r_bool, *r_expand, *r_btag, *r_reduce, *r_buffer, *r_rtag;
} walk_t;

static PyObject *s_op, *s_src, *s_dtype, *s_arg, *s_dict, *s_name, *s_backward, *s_device, *s_vmin_vmax;

static int bad(const char *what) {
  PyErr_Format(PyExc_TypeError, "pygrad C core: foreign walk: %s", what);
  return -1;
}

static int intern_names(void) {
  if (s_vmin_vmax) return 0;
  if (!(s_op = PyUnicode_InternFromString("op")) || !(s_src = PyUnicode_InternFromString("src")) ||
      !(s_dtype = PyUnicode_InternFromString("dtype")) || !(s_arg = PyUnicode_InternFromString("arg")) ||
      !(s_dict = PyUnicode_InternFromString("__dict__")) || !(s_name = PyUnicode_InternFromString("name")) ||
      !(s_backward = PyUnicode_InternFromString("backward")) || !(s_device = PyUnicode_InternFromString("device")) ||
      !(s_vmin_vmax = PyUnicode_InternFromString("vmin_vmax")))
    return -1;
  return 0;
}

static int read_cfg(PyObject *t, walk_t *w) {
  int i;
  PyObject *ints;
  if (!PyTuple_Check(t) || PyTuple_Size(t) != W_N) return bad("the configuration is no tuple of 32");
  for (i = 0; i < W_N; i++) w->f[i] = PyTuple_GetItem(t, i);
  if (!PyDict_Check(w->f[W_LIVE]) || !PyDict_Check(w->f[W_MEMO]) || !PyDict_Check(w->f[W_MDD]) ||
      !PyDict_Check(w->f[W_TSH]) || !PyDict_Check(w->f[W_SHAPES]) || !PyDict_Check(w->f[W_ALU]) ||
      !PyDict_Check(w->f[W_DTI]) || !PyDict_Check(w->f[W_MD1]) || !PyDict_Check(w->f[W_DT]) ||
      !PyDict_Check(w->f[W_ROP]) || !PyDict_Check(w->f[W_SAME]))
    return bad("live, memo, mdd, tsh, shapes, alu, dti, md1, dt, rop and same must be dicts");
  if (!PyType_Check(w->f[W_PARAMARG])) return bad("paramarg must be a class");
  if (w->f[W_MDATA] != Py_None && !PyDict_Check(w->f[W_MDATA])) return bad("mdata must be a dict or None");
  if (!PyList_Check(w->f[W_ROWS]) || (w->f[W_PUTS] != Py_None && !PyList_Check(w->f[W_PUTS])))
    return bad("rows must be a list, puts a list or None");
  if (!PyAnySet_Check(w->f[W_PLAIN]) || !PyAnySet_Check(w->f[W_SMOVE]) || !PyAnySet_Check(w->f[W_CMP]) ||
      !PyAnySet_Check(w->f[W_WEAK]) || !PyAnySet_Check(w->f[W_LEAF]) ||
      (w->f[W_TARGETS] != Py_None && !PyAnySet_Check(w->f[W_TARGETS])))
    return bad("plain, smove, cmp, weak, leaf and targets must be sets");
  if (!PyCallable_Check(w->f[W_NODE]) || !PyCallable_Check(w->f[W_META]) || !PyCallable_Check(w->f[W_VSRC]))
    return bad("node, meta and vsrc must be callables");
  if (!PyUnicode_Check(w->f[W_SHN])) return bad("shn must be a str");
  ints = w->f[W_INTS];
  if (!PyTuple_Check(ints) || PyTuple_Size(ints) != 8) return bad("ints must be a tuple of 8");
  w->r_reshape = PyTuple_GetItem(ints, 0), w->r_permute = PyTuple_GetItem(ints, 1);
  w->r_bool = PyTuple_GetItem(ints, 2);
  w->r_expand = PyTuple_GetItem(ints, 3), w->r_btag = PyTuple_GetItem(ints, 4);
  w->r_reduce = PyTuple_GetItem(ints, 5), w->r_buffer = PyTuple_GetItem(ints, 6), w->r_rtag = PyTuple_GetItem(ints, 7);
  return 0;
}

/* o's cached shape (a borrowed reference from its __dict__ or tsh), NULL if it has none cached (no error set), or
   NULL with an error set */
static PyObject *cached_shape(const walk_t *w, PyObject *o, int remember) {
  PyObject *sh = PyDict_GetItemWithError(w->f[W_TSH], o), *d;
  if (sh || PyErr_Occurred()) return sh;
  if (!(d = PyObject_GetAttr(o, s_dict))) {
    PyErr_Clear();
    return NULL;
  }
  sh = PyDict_Check(d) ? PyDict_GetItemWithError(d, w->f[W_SHN]) : NULL;
  if (sh && remember && PyDict_SetItem(w->f[W_TSH], o, sh) < 0) sh = NULL;
  Py_DECREF(d);  /* sh stays alive: the node's __dict__ (and tsh) hold it */
  return sh;
}

/* the row (a new reference) appended to the table for row x as `row` (a new reference, stolen), NULL with an
   exception set */
static PyObject *append(const walk_t *w, PyObject *row) {
  int r;
  if (!row) return NULL;
  r = PyList_Append(w->f[W_ROWS], row);
  Py_DECREF(row);
  return r < 0 ? NULL : PyLong_FromSsize_t(PyList_Size(w->f[W_ROWS]) - 1);
}

static int put_meta(const walk_t *w, PyObject *u, PyObject *ri);

/* u's static shape as the one object of it in the shapes dict (borrowed), as the Python walk's _shape gives it:
   NULL with no exception set if Python works it out (none cached, or not a tuple of ints), NULL with one set */
static PyObject *canon_shape(const walk_t *w, PyObject *u) {
  PyObject *sh = cached_shape(w, u, 0), *got;
  Py_ssize_t i;
  if (!sh || sh == Py_None) return NULL;
  if ((got = PyDict_GetItemWithError(w->f[W_SHAPES], sh)) != NULL || PyErr_Occurred()) return got;
  if (!PyTuple_CheckExact(sh)) return NULL;
  for (i = 0; i < PyTuple_Size(sh); i++)
    if (!PyLong_CheckExact(PyTuple_GetItem(sh, i))) return NULL;
  return PyDict_SetItem(w->f[W_SHAPES], sh, sh) < 0 ? NULL : sh;  /* the dict holds it */
}

/* the row (a new reference to its 5-tuple) of an opaque BUFFER standing for u (typed, dtype dt), as the Python
   walk's _opaque_buffer makes it: arg (u, shape, device, name), name the arg's if u is a BUFFER whose arg is a
   paramarg. own: u is a BUFFER the walk converts itself (Python's _other: a paramarg with vmin_vmax is left to
   Python, which may make it a variable). Py_None (a new reference) if Python makes it, NULL with an exception set */
static PyObject *opaque_row(const walk_t *w, PyObject *u, PyObject *op, PyObject *dt, int own) {
  PyObject *d, *sh, *dev, *name = Py_None, *arg, *row = NULL;
  int r;
  if (!(d = PyDict_GetItemWithError(w->f[W_DTI], dt)) || !(sh = canon_shape(w, u))) {
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
  }
  Py_INCREF(name);
  if (op == w->f[W_BUFFER]) {
    PyObject *a = PyObject_GetAttr(u, s_arg);
    if (!a || (r = PyObject_IsInstance(a, w->f[W_PARAMARG])) < 0) {
      Py_XDECREF(a);
      goto out;
    }
    if (r && own) {
      PyObject *vm = PyObject_GetAttr(a, s_vmin_vmax);
      int var = vm && vm != Py_None;
      Py_XDECREF(vm);
      if (!vm || var) {
        Py_DECREF(a);
        if (vm) row = Py_None, Py_INCREF(row);
        goto out;
      }
    }
    if (r) {
      Py_DECREF(name);
      name = PyObject_GetAttr(a, s_name);
    }
    Py_DECREF(a);
    if (!name) return NULL;
  }
  if (!(dev = PyObject_GetAttr(u, s_device))) goto out;
  if (PyUnicode_CheckExact(dev)) {  /* any other device: Python raises its ValueError */
    if ((arg = PyTuple_Pack(4, u, sh, dev, name)) != NULL) {
      PyObject *src = PyTuple_New(0);
      row = src ? PyTuple_Pack(5, w->r_buffer, d, src, arg, Py_None) : NULL;
      Py_XDECREF(src);
      Py_DECREF(arg);
    }
  } else row = Py_None, Py_INCREF(row);
  Py_DECREF(dev);
out:
  Py_XDECREF(name);
  return row;
}

/* the pair (row ri, node u) appended to puts, for the way back's rev(); nothing if puts is None (a conversion
   nothing is converted back through). 0, or -1 with an exception set */
static int put_pair(const walk_t *w, PyObject *ri, PyObject *u) {
  PyObject *pair;
  int r;
  if (w->f[W_PUTS] == Py_None) return 0;
  if (!(pair = PyTuple_Pack(2, ri, u))) return -1;
  r = PyList_Append(w->f[W_PUTS], pair);
  Py_DECREF(pair);
  return r;
}

/* the row of source s (borrowed from memo). A typed source with a device that the walk did not convert (it lies
   on no target path) gets an opaque BUFFER row, its memo entry, its (row, node) pair and metadata, as the Python
   walk's _get makes them. NULL with no exception set if Python makes it, NULL with one set */
static PyObject *src_row(const walk_t *w, PyObject *s) {
  PyObject *x = PyDict_GetItemWithError(w->f[W_MEMO], s), *sd, *op = NULL, *dev, *row = NULL, *ri;
  int r;
  if (x || PyErr_Occurred()) return x;
  if (!PyDict_GetItemWithError(w->f[W_LIVE], s)) return NULL;  /* not visited: Python walks it */
  if (!(sd = PyObject_GetAttr(s, s_dtype))) return NULL;
  if ((r = PySet_Contains(w->f[W_WEAK], sd)) != 0) goto out;  /* a weak one is converted in its user's dtype */
  if (!(dev = PyObject_GetAttr(s, s_device))) goto out;
  r = dev == Py_None;
  Py_DECREF(dev);
  if (r) goto out;  /* no device: converted node by node (Python's _structural) */
  if (!(op = PyObject_GetAttr(s, s_op)) || !(row = opaque_row(w, s, op, sd, 0)) || row == Py_None) goto out;
  if (!(ri = append(w, row))) {
    row = NULL;
    goto out;
  }
  row = NULL;  /* append took it */
  if (PyDict_SetItem(w->f[W_MEMO], s, ri) == 0 && put_pair(w, ri, s) == 0 && put_meta(w, s, ri) == 0)
    x = PyDict_GetItemWithError(w->f[W_MEMO], s);
  Py_DECREF(ri);
out:
  Py_DECREF(sd);
  Py_XDECREF(op);
  Py_XDECREF(row);
  return x;
}

/* t, or the one object of its value in the shapes dict (borrowed: the dict holds it), as the Python walk's _canon
   gives it: a tuple of exact ints is entered there on first sight, so the builder interns one object per distinct
   broadcast shape, not one per node (each costs a lookup by value); anything else is left as it is (its equality may
   be Python code). NULL with an exception set */
static PyObject *canon_ints(const walk_t *w, PyObject *t) {
  PyObject *got;
  Py_ssize_t i;
  if (!PyTuple_CheckExact(t)) return t;
  for (i = 0; i < PyTuple_Size(t); i++)
    if (!PyLong_CheckExact(PyTuple_GetItem(t, i))) return t;
  if ((got = PyDict_GetItemWithError(w->f[W_SHAPES], t)) != NULL || PyErr_Occurred()) return got;
  return PyDict_SetItem(w->f[W_SHAPES], t, t) < 0 ? NULL : t;
}

/* row x (its dtype that of its table row), of shape ss, made explicit at `shape` as the Python walk's _bcast does:
   a RESHAPE prepending 1s, then an EXPAND, both tagged, their shapes canonical (canon_ints). A new reference, or NULL
   with an exception set */
static PyObject *bcast(const walk_t *w, PyObject *x, PyObject *ss, PyObject *shape) {
  PyObject *xrow, *d, *src, *r, *pad, *s2, *c;
  Py_ssize_t k = PyTuple_Size(shape) - PyTuple_Size(ss), i;
  int eq;
  if (!(xrow = PyList_GetItem(w->f[W_ROWS], PyLong_AsSsize_t(x)))) return NULL;
  if (!PyTuple_Check(xrow) || PyTuple_Size(xrow) != 5) {
    bad("a row is no tuple of 5");
    return NULL;
  }
  d = PyTuple_GetItem(xrow, 1);
  Py_INCREF(x);
  r = x;
  if (k > 0) {
    if (!(pad = PyTuple_New(k))) goto fail;
    for (i = 0; i < k; i++) {
      PyObject *one = PyLong_FromLong(1);
      if (!one) {
        Py_DECREF(pad);
        goto fail;
      }
      PyTuple_SetItem(pad, i, one);
    }
    s2 = PySequence_Concat(pad, ss);
    Py_DECREF(pad);
    if (!s2) goto fail;
    if (!(c = canon_ints(w, s2)) || !(src = PyTuple_Pack(1, r))) {
      Py_DECREF(s2);
      goto fail;
    }
    Py_DECREF(r);
    r = append(w, PyTuple_Pack(5, w->r_reshape, d, src, c, w->r_btag));
    Py_DECREF(src);
    if (!r) {
      Py_DECREF(s2);
      return NULL;
    }
    eq = PyObject_RichCompareBool(s2, shape, Py_EQ);
    Py_DECREF(s2);
    if (eq < 0) goto fail;
    if (eq) return r;
  }
  if (!(c = canon_ints(w, shape)) || !(src = PyTuple_Pack(1, r))) goto fail;
  Py_DECREF(r);
  r = append(w, PyTuple_Pack(5, w->r_expand, d, src, c, w->r_btag));
  Py_DECREF(src);
  return r;
fail:
  Py_DECREF(r);
  return NULL;
}

/* the pygrad dtype (borrowed; Py_None: none) the weak operands of u (an elementwise op of typed dtype dt, value
   sources vs) are converted in, as the Python walk's _operand_want(u, None); NULL with an exception set */
static PyObject *operand_want(const walk_t *w, PyObject *op, PyObject *dt, PyObject *vs, int cmp) {
  PyObject *got;
  Py_ssize_t i, n = PyTuple_Size(vs);
  if (cmp || op == w->f[W_WHERE]) {
    for (i = op == w->f[W_WHERE] ? 1 : 0; i < n; i++) {
      PyObject *sd = PyObject_GetAttr(PyTuple_GetItem(vs, i), s_dtype);
      int r;
      if (!sd) return NULL;
      r = PySet_Contains(w->f[W_WEAK], sd);
      got = r == 0 ? PyDict_GetItemWithError(w->f[W_DT], sd) : NULL;
      Py_DECREF(sd);
      if (r < 0 || (!got && PyErr_Occurred())) return NULL;
      if (r == 0) return got ? got : Py_None;
    }
    return Py_None;
  }
  got = PyDict_GetItemWithError(w->f[W_DT], dt);
  return got ? got : PyErr_Occurred() ? NULL : Py_None;
}

/* the rows of a reduce u (value sources vs) as the Python walk's _one makes them: REDUCE_AXIS over the leading n
   axes (axes kept) and a RESHAPE dropping them, both tagged. The first row is appended here; the second is returned
   (a new reference to its 5-tuple) for the caller to append. Py_None (a new reference) if Python makes them (an arg
   that is no (op, n) pair with 0 < n <= 64, a source not converted, no static shape), NULL with an exception set */
static PyObject *reduce_rows(const walk_t *w, PyObject *u, PyObject *vs) {
  PyObject *a, *rop, *n, *sh, *x, *xrow, *rng = NULL, *key = NULL, *arg, *src = NULL, *ri = NULL, *row = NULL;
  long k, i;
  if (!(a = PyObject_GetAttr(u, s_arg))) return NULL;
  k = PyTuple_CheckExact(a) && PyTuple_Size(a) == 2 && PyLong_CheckExact(n = PyTuple_GetItem(a, 1))
      ? PyLong_AsLong(n) : -1;
  if (k == -1 && PyErr_Occurred()) PyErr_Clear();
  if (k < 1 || k > 64 || PyTuple_Size(vs) != 1 || !(sh = canon_shape(w, u))) goto out;
  if (!(x = src_row(w, PyTuple_GetItem(vs, 0)))) goto out;
  if (!PyLong_Check(x) || !(xrow = PyList_GetItem(w->f[W_ROWS], PyLong_AsSsize_t(x))) || !PyTuple_Check(xrow) ||
      PyTuple_Size(xrow) != 5) {
    bad("a source's row is no tuple of 5");
    goto out;
  }
  rop = PyDict_GetItemWithError(w->f[W_ROP], PyTuple_GetItem(a, 0));
  if (!rop && PyErr_Occurred()) goto out;
  if (!(rng = PyTuple_New(k))) goto out;
  for (i = 0; i < k; i++) {
    PyObject *v = PyLong_FromLong(i);
    if (!v) goto out;
    PyTuple_SetItem(rng, i, v);
  }
  if (!(key = PyTuple_Pack(2, rop ? rop : PyTuple_GetItem(a, 0), rng))) goto out;
  if (!(arg = PyDict_GetItemWithError(w->f[W_SHAPES], key))) {  /* one object per distinct arg, as _canon */
    if (PyErr_Occurred() || PyDict_SetItem(w->f[W_SHAPES], key, key) < 0) goto out;
    arg = key;
  }
  if (!(src = PyTuple_Pack(1, x)) ||
      !(ri = append(w, PyTuple_Pack(5, w->r_reduce, PyTuple_GetItem(xrow, 1), src, arg, w->r_rtag))))
    goto out;
  Py_CLEAR(src);
  if ((src = PyTuple_Pack(1, ri)) != NULL)
    row = PyTuple_Pack(5, w->r_reshape, PyTuple_GetItem(xrow, 1), src, sh, w->r_rtag);
out:
  Py_DECREF(a);
  Py_XDECREF(rng);
  Py_XDECREF(key);
  Py_XDECREF(src);
  Py_XDECREF(ri);
  if (!row && !PyErr_Occurred()) Py_RETURN_NONE;
  return row;
}

/* the row of u (an int, new reference) made inline, Py_None (new reference) if u is not a usual node (the Python
   callback makes it), NULL with an exception set */
static PyObject *inline_row(const walk_t *w, PyObject *u, PyObject *op, PyObject *dt, PyObject *vs) {
  PyObject *a, *d, *srcs = NULL, *row = NULL, *shape, *ri, *want = NULL, *xs[3], *sss[3];
  Py_ssize_t i, n;
  int r, cmp;
  if ((a = PyDict_GetItemWithError(w->f[W_ALU], op)) != NULL) {
    if (!(d = PyDict_GetItemWithError(w->f[W_DTI], dt))) goto none;
    if (!(shape = cached_shape(w, u, 0))) goto none;
    if ((cmp = PySet_Contains(w->f[W_CMP], op)) < 0) return NULL;
    if (cmp) d = w->r_bool;
    n = PyTuple_Size(vs);
    if (n < 1 || n > 3) goto none;
    for (i = 0; i < n; i++) {  /* every operand's row and shape first: nothing is appended unless all are known */
      PyObject *s = PyTuple_GetItem(vs, i), *sd, *x, *ss;
      if (!s) return NULL;
      if (!(sd = PyObject_GetAttr(s, s_dtype))) return NULL;
      r = PySet_Contains(w->f[W_WEAK], sd);
      Py_DECREF(sd);
      if (r < 0) return NULL;
      if (r) {  /* a weak operand: converted already in the dtype it takes here, or Python converts it */
        PyObject *k;
        if (!want && !(want = operand_want(w, op, dt, vs, cmp))) return NULL;
        if (!(k = PyTuple_Pack(2, s, want))) return NULL;
        x = PyDict_GetItemWithError(w->f[W_MEMO], k);
        Py_DECREF(k);
      } else x = src_row(w, s);  /* converted, or an opaque BUFFER made now for a source off every target path */
      if (!x) goto none_or_fail;
      if (!(ss = cached_shape(w, s, 1))) goto none_or_fail;
      if (ss != shape && ss != Py_None) {  /* a shape of its own: the same, () or a broadcast */
        if (!PyTuple_Check(ss) || !PyTuple_Check(shape) || PyTuple_Size(ss) > PyTuple_Size(shape)) goto none;
        if (!PyTuple_Size(ss) || (r = PyObject_RichCompareBool(ss, shape, Py_EQ)) == 1) ss = NULL;
        else if (r < 0) return NULL;
      } else ss = NULL;
      xs[i] = x, sss[i] = ss;
    }
    if (!(srcs = PyTuple_New(n))) return NULL;
    for (i = 0; i < n; i++) {
      PyObject *x = sss[i] ? bcast(w, xs[i], sss[i], shape) : (Py_INCREF(xs[i]), xs[i]);
      if (!x) goto fail;
      PyTuple_SetItem(srcs, i, x);
    }
    row = PyTuple_Pack(5, a, d, srcs, Py_None, Py_None);
  } else if (PyErr_Occurred()) return NULL;
  else if (op == w->f[W_RESHAPE] || op == w->f[W_PERMUTE]) {
    PyObject *x, *xrow, *arg, *sdt;
    if (!PyDict_GetItemWithError(w->f[W_DTI], dt)) goto none_or_fail;
    if (!PyTuple_Check(vs) || PyTuple_Size(vs) < 1) goto none;
    if (!(x = src_row(w, PyTuple_GetItem(vs, 0)))) goto none_or_fail;
    if (!PyLong_Check(x) || !(xrow = PyList_GetItem(w->f[W_ROWS], PyLong_AsSsize_t(x)))) {
      PyErr_Clear();
      goto none;
    }
    if (!PyTuple_Check(xrow) || PyTuple_Size(xrow) != 5) goto none;
    sdt = PyTuple_GetItem(xrow, 1);
    if (op == w->f[W_RESHAPE]) arg = canon_shape(w, u);
    else {
      PyObject *ua = PyObject_GetAttr(u, s_arg);
      if (!ua) return NULL;
      arg = PyTuple_CheckExact(ua) ? PyDict_GetItemWithError(w->f[W_SHAPES], ua) : NULL;
      if (!arg && !PyErr_Occurred() && PyTuple_CheckExact(ua))  /* the first of its kind: it is the one (_canon) */
        arg = PyDict_SetItem(w->f[W_SHAPES], ua, ua) < 0 ? NULL : ua;
      Py_DECREF(ua);  /* arg, if any, is the shapes dict's own object */
    }
    if (!arg) goto none_or_fail;
    if (!(srcs = PyTuple_Pack(1, x))) return NULL;
    row = PyTuple_Pack(5, op == w->f[W_RESHAPE] ? w->r_reshape : w->r_permute, sdt, srcs, arg, Py_None);
  } else if ((a = PyDict_GetItemWithError(w->f[W_SAME], op)) != NULL) {
    PyObject *x, *xrow, *ua;
    if (PyTuple_Size(vs) != 1 || !(ua = PyObject_GetAttr(u, s_arg))) goto none_or_fail;
    Py_DECREF(ua);
    if (ua != Py_None) goto none;  /* an arg: Python raises its ValueError */
    if (!(x = src_row(w, PyTuple_GetItem(vs, 0)))) goto none_or_fail;
    if (!PyLong_Check(x) || !(xrow = PyList_GetItem(w->f[W_ROWS], PyLong_AsSsize_t(x))) || !PyTuple_Check(xrow) ||
        PyTuple_Size(xrow) != 5) {
      bad("a source's row is no tuple of 5");
      return NULL;
    }
    if (!(srcs = PyTuple_Pack(1, x))) return NULL;
    row = PyTuple_Pack(5, a, PyTuple_GetItem(xrow, 1), srcs, Py_None, Py_None);
  } else if (PyErr_Occurred()) return NULL;
  else if (op == w->f[W_REDUCE]) {
    if (!(row = reduce_rows(w, u, vs))) return NULL;
  } else if (op == w->f[W_BUFFER]) {
    if (!(row = opaque_row(w, u, op, dt, 1))) return NULL;
  } else goto none;
  if (row == Py_None) {
    Py_XDECREF(srcs);
    return row;  /* Python makes it */
  }
  Py_CLEAR(srcs);
  if (!row) return NULL;
  r = PyList_Append(w->f[W_ROWS], row);
  Py_DECREF(row);
  if (r < 0) return NULL;
  if (!(ri = PyLong_FromSsize_t(PyList_Size(w->f[W_ROWS]) - 1))) return NULL;
  if (PyDict_SetItem(w->f[W_MEMO], u, ri) < 0) {
    Py_DECREF(ri);
    return NULL;
  }
  return ri;
none_or_fail:
  if (PyErr_Occurred()) goto fail;
none:
  Py_XDECREF(srcs);
  Py_RETURN_NONE;
fail:
  Py_XDECREF(srcs);
  return NULL;
}

/* the metadata index of mdix_t (a snapshot: nothing the walk calls sets metadata). 0, or -1 with an exception set */
static int mdix_make(const walk_t *w) {
  PyObject *ix = PyDict_New(), *k, *v, *o;
  Py_ssize_t pos = 0;
  if (!ix) return -1;
  while (PyDict_Next(w->f[W_MDATA], &pos, &k, &v)) {
    if (!PyCallable_Check(k)) continue;  /* not a weak reference: no node's entry */
    if (!(o = PyObject_CallNoArgs(k))) {
      Py_DECREF(ix);
      return -1;
    }
    if (o != Py_None && PyDict_SetItem(ix, o, v) < 0) {
      Py_DECREF(o);
      Py_DECREF(ix);
      return -1;
    }
    Py_DECREF(o);
  }
  w->mx->ix = ix;
  return 0;
}

/* the slot of Metadata object m in the walk's cache (mdc_t): its address's bits above the allocator's alignment */
static size_t mdc_slot(const PyObject *m) {
  uintptr_t a = (uintptr_t)m;
  return (size_t)((a >> 4) ^ (a >> 12)) & (MDC_N - 1);
}

/* the pygrad metadata (borrowed) of the one-element tuple (m0,): the walk's cache, else md1's entry for its (name,
   backward), cached. NULL with no exception set if md1 has none (the callback makes it), NULL with one set */
static PyObject *md1_of(const walk_t *w, PyObject *m0) {
  size_t k = mdc_slot(m0);
  PyObject *nm, *bw, *key, *m;
  if (w->mc->key[k] == m0) return w->mc->val[k];
  if (!(nm = PyObject_GetAttr(m0, s_name))) return NULL;
  if (!(bw = PyObject_GetAttr(m0, s_backward))) {
    Py_DECREF(nm);
    return NULL;
  }
  key = PyTuple_Pack(2, nm, bw);
  Py_DECREF(nm);
  Py_DECREF(bw);
  if (!key) return NULL;
  m = PyDict_GetItemWithError(w->f[W_MD1], key);
  Py_DECREF(key);
  if (!m) return NULL;
  Py_INCREF(m0);
  Py_INCREF(m);
  Py_XDECREF(w->mc->key[k]);
  Py_XDECREF(w->mc->val[k]);
  w->mc->key[k] = m0, w->mc->val[k] = m;
  return m;
}

/* u's metadata onto row ri, as the Python walk does: the usual 1-tuple whose pygrad form is known, onto a row with
   none yet, here; anything else through the callback. 0, or -1 with an exception set */
static int put_meta(const walk_t *w, PyObject *u, PyObject *ri) {
  PyObject *ref, *md, *m, *res;
  int r;
  if (w->f[W_MDATA] == Py_None) return 0;
  if (!w->mx->ix && ++w->mx->met >= 64 && w->mx->met * 8 >= PyDict_Size(w->f[W_MDATA]) && mdix_make(w) < 0)
    return -1;
  if (w->mx->ix) md = PyDict_GetItemWithError(w->mx->ix, u);
  else {
    if (!(ref = PyWeakref_NewRef(u, NULL))) {
      PyErr_Clear();  /* not weakly referable: it has no metadata */
      return 0;
    }
    md = PyDict_GetItemWithError(w->f[W_MDATA], ref);
    Py_DECREF(ref);
  }
  if (!md) return PyErr_Occurred() ? -1 : 0;
  if ((r = PyObject_IsTrue(md)) <= 0) return r;
  Py_INCREF(md);  /* the dict's entry may go while Python code runs (a Metadata's __eq__, the callback) */
  if (PyTuple_Check(md) && PyTuple_Size(md) == 1 && !PyDict_GetItemWithError(w->f[W_MDD], ri) && !PyErr_Occurred() &&
      (m = md1_of(w, PyTuple_GetItem(md, 0))) != NULL) {
    r = PyDict_SetItem(w->f[W_MDD], ri, m);
    Py_DECREF(md);
    return r;
  }
  if (PyErr_Occurred()) {
    Py_DECREF(md);
    return -1;
  }
  res = PyObject_CallFunctionObjArgs(w->f[W_META], ri, md, NULL);
  Py_DECREF(md);
  if (!res) return -1;
  Py_DECREF(res);
  return 0;
}

/* the value sources of u (a new reference to a tuple), or NULL with an exception set */
static PyObject *value_srcs(const walk_t *w, PyObject *u, PyObject *op) {
  PyObject *src, *vs;
  int r;
  if ((r = PySet_Contains(w->f[W_PLAIN], op)) != 0) vs = r < 0 ? NULL : PyObject_GetAttr(u, s_src);
  else if ((r = PySet_Contains(w->f[W_SMOVE], op)) != 0) {
    if (r < 0 || !(src = PyObject_GetAttr(u, s_src))) return NULL;
    vs = PyTuple_Check(src) ? PyTuple_GetSlice(src, 0, 1) : NULL;
    Py_DECREF(src);
    if (!vs && !PyErr_Occurred()) bad("a node's src is no tuple");
  } else if ((r = PySet_Contains(w->f[W_LEAF], op)) != 0) vs = r < 0 ? NULL : PyTuple_New(0);
  else vs = PyObject_CallFunctionObjArgs(w->f[W_VSRC], u, NULL);
  if (vs && !PyTuple_Check(vs)) {
    Py_DECREF(vs);
    bad("value sources must be a tuple");
    return NULL;
  }
  return vs;
}

/* the second visit of u (its value sources vs all visited): on a target path or not, and its row. 0 or -1 */
static int finish(const walk_t *w, PyObject *u, PyObject *vs) {
  PyObject *op = NULL, *dt = NULL, *ri = NULL;
  int below, r = -1, t;
  Py_ssize_t i;
  if (!(op = PyObject_GetAttr(u, s_op))) return -1;
  if (w->f[W_TARGETS] == Py_None) below = 1;
  else {
    below = op == w->f[W_PARAM];
    for (i = 0; !below && i < PyTuple_Size(vs); i++) {
      PyObject *l = PyDict_GetItemWithError(w->f[W_LIVE], PyTuple_GetItem(vs, i));
      if (!l) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_KeyError, "pygrad C core: foreign walk: a source not visited");
        goto out;
      }
      if ((t = PyObject_IsTrue(l)) < 0) goto out;
      below = t;
    }
  }
  t = below;
  if (!t && (t = PySet_Contains(w->f[W_TARGETS], u)) < 0) goto out;
  if (PyDict_SetItem(w->f[W_LIVE], u, t ? Py_True : Py_False) < 0) goto out;
  r = 0;
  if (!below) goto out;
  if ((t = PyDict_Contains(w->f[W_MEMO], u)) != 0) {
    r = t < 0 ? -1 : 0;
    goto out;
  }
  r = -1;
  if (!(dt = PyObject_GetAttr(u, s_dtype))) goto out;
  if ((t = PySet_Contains(w->f[W_WEAK], dt)) != 0) {
    r = t < 0 ? -1 : 0;
    goto out;
  }
  if (!(ri = inline_row(w, u, op, dt, vs))) goto out;
  if (ri == Py_None) {  /* the Python walk's own code makes it (and its memo entry) */
    Py_DECREF(ri);
    if (!(ri = PyObject_CallFunctionObjArgs(w->f[W_NODE], u, vs, NULL))) goto out;
    if (ri == Py_None) {
      r = 0;
      goto out;
    }
  }
  if (put_pair(w, ri, u) < 0) goto out;
  r = put_meta(w, u, ri);
out:
  Py_XDECREF(op);
  Py_XDECREF(dt);
  Py_XDECREF(ri);
  return r;
}

typedef struct {
  PyObject *u, *vs;  /* owned; vs NULL on the first visit */
} frame;

/* walk(cfg, root): the walk from root; None, or an exception */
static PyObject *foreign_walk(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  walk_t w;
  mdix_t mx = {NULL, 0};
  mdc_t *mc;
  size_t j;
  frame *st = NULL, *grown;
  size_t n = 0, cap = 0;
  PyObject *ret = NULL;
  (void)self;
  if (nargs != 2) return PyErr_Format(PyExc_TypeError, "pygrad C core: foreign walk takes 2 arguments");
  if (intern_names() < 0 || read_cfg(args[0], &w) < 0) return NULL;
  w.mx = &mx;
  if (!(mc = calloc(1, sizeof *mc))) return PyErr_NoMemory();
  w.mc = mc;
  cap = 64;
  if (!(st = malloc(cap * sizeof *st))) {
    free(mc);
    return PyErr_NoMemory();
  }
  Py_INCREF(args[1]);
  st[n].u = args[1], st[n].vs = NULL, n++;
  while (n) {
    frame f = st[--n];
    int r = PyDict_Contains(w.f[W_LIVE], f.u);
    if (r != 0) {
      Py_DECREF(f.u);
      Py_XDECREF(f.vs);
      if (r < 0) goto done;
      continue;
    }
    if (f.vs) {
      r = finish(&w, f.u, f.vs);
      Py_DECREF(f.u);
      Py_DECREF(f.vs);
      if (r < 0) goto done;
      continue;
    }
    {
      PyObject *op = PyObject_GetAttr(f.u, s_op), *vs;
      Py_ssize_t i, k;
      vs = op ? value_srcs(&w, f.u, op) : NULL;
      Py_XDECREF(op);
      if (!vs) {
        Py_DECREF(f.u);
        goto done;
      }
      k = PyTuple_Size(vs);
      if (n + 1 + (size_t)k > cap) {
        size_t c2 = cap;
        while (n + 1 + (size_t)k > c2) c2 *= 2;
        if (c2 > ((size_t)-1) / sizeof *st || !(grown = realloc(st, c2 * sizeof *st))) {
          Py_DECREF(f.u);
          Py_DECREF(vs);
          PyErr_NoMemory();
          goto done;
        }
        st = grown, cap = c2;
      }
      st[n].u = f.u, st[n].vs = vs, n++;  /* the frame's references move onto the stack */
      for (i = k - 1; i >= 0; i--) {
        PyObject *s = PyTuple_GetItem(vs, i);
        if ((r = PyDict_Contains(w.f[W_LIVE], s)) < 0) goto done;
        if (r) continue;
        Py_INCREF(s);
        st[n].u = s, st[n].vs = NULL, n++;
      }
    }
  }
  Py_INCREF(Py_None);
  ret = Py_None;
done:
  while (n) {
    n--;
    Py_DECREF(st[n].u);
    Py_XDECREF(st[n].vs);
  }
  free(st);
  Py_XDECREF(mx.ix);
  for (j = 0; j < MDC_N; j++) {
    Py_XDECREF(mc->key[j]);
    Py_XDECREF(mc->val[j]);
  }
  free(mc);
  return ret;
}

PyMethodDef pg_py_foreign_walk_def = {"foreign_walk", (PyCFunction)(void (*)(void))foreign_walk, METH_FASTCALL,
                                      "foreign_walk(cfg, root): see csrc/pywalk.c"};
