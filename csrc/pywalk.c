/* The walk of tinygrad -> pygrad conversion (pygrad/interop/tinygrad_in.py, _In._walk) as one CPython builtin: a
   post-order over a foreign graph's value sources (an explicit stack, never recursion), marking which nodes lie on a
   path to a target, and making the node table's rows of the usual nodes (an elementwise op whose operands are
   converted or opaque, typed and of its shape; a reshape or permute of a converted node; a reduce; a buffer; a
   DETACH or CONTIGUOUS) as the Python walk makes them. Every other node is made by a Python callback, which is the
   Python walk's own code for a node. The foreign IR is
   described by the caller's tables (no tinygrad name is known here). Every argument is checked: a wrong one raises
   TypeError, never crashes. This file is the walk itself (its stack, its configuration, a node's two visits);
   pywalk_rows.c makes the rows, pywalk_meta.c puts the metadata. */
#include "pywalk.h"
#include <stdlib.h>
#include <string.h>

/* cfg: (live, memo, targets, rows, puts, mdd, tsh, shapes, plain, smove, alu, dti, cmp, weak, param, reshape,
   permute, ints, shn, node, meta, vsrc, mdata, md1, dt, where, reduce, buffer, rop, paramarg, leaf, same, dvn, cls)
   live: dict node -> whether it is on a path to a target (every node visited); memo: dict node -> its row; targets:
   a set, or None (every node is converted); rows, puts: lists the rows, and each converted node's row and node
   (alternating), are appended to (puts None: none are kept); mdd: dict row -> metadata; tsh: dict node -> its shape;
   shapes: dict shape or axes -> the one object of it; plain, smove: sets of ops whose value sources are all sources,
   the first source; alu: dict op -> the row's op; dti: dict dtype -> the row's dtype; cmp: set of ops whose result
   is bool; weak: set of weak dtypes; param, reshape, permute: those ops; ints: (RESHAPE, PERMUTE, bool dtype, EXPAND,
   broadcast tag, REDUCE_AXIS, BUFFER, reduce tag) of the rows; shn: the name of the node's cached shape in its
   __dict__; node(u, vs) -> row or None: the Python walk's making of u; meta(row, md): its metadata step; vsrc(u):
   the value sources of a node of another op; mdata: dict weakref(node) -> metadata tuple, or None; md1: dict
   (name, backward) -> the metadata of a 1-tuple; dt: dict dtype -> pygrad dtype (a weak operand
   converted in the dtype of its op, or of its typed operands for a comparison or WHERE, is memo's (operand, that
   dtype)); where: the op whose first source is its condition; reduce, buffer: those ops; rop: dict reduce op -> the
   row's (missing: the same); paramarg: the class of a buffer's arg that names it; leaf: a set of the ops with no
   value sources (vsrc is not called for them); same: dict op -> the row's op, for the ops of one source, no arg and
   its source's dtype (DETACH, CONTIGUOUS); dvn: the name of the node's cached device in its __dict__; cls: the node
   class (its instances' op, src, dtype and arg read through its slots' descriptors, see pg_walk_attr). */
pg_walk_str pg_walk_s;

/* TypeError naming what is wrong with an argument; -1 */
int pg_walk_bad(const char *what) {
  PyErr_Format(PyExc_TypeError, "pygrad C core: foreign walk: %s", what);
  return -1;
}

/* pg_walk_s made (once); 0, or -1 with an exception set */
static int intern_names(void) {
  pg_walk_str *s = &pg_walk_s;
  if (s->vmin_vmax) return 0;
  if (!(s->op = PyUnicode_InternFromString("op")) || !(s->src = PyUnicode_InternFromString("src")) ||
      !(s->dtype = PyUnicode_InternFromString("dtype")) || !(s->arg = PyUnicode_InternFromString("arg")) ||
      !(s->name = PyUnicode_InternFromString("name")) || !(s->backward = PyUnicode_InternFromString("backward")) ||
      !(s->device = PyUnicode_InternFromString("device")) ||
      !(s->vmin_vmax = PyUnicode_InternFromString("vmin_vmax")))
    return -1;
  return 0;
}

/* the descriptors of the node class's slots op, src, dtype and arg, and their getters, where its instances look
   attributes up generically and each is a member descriptor (a slot: a data descriptor, ahead of any instance
   __dict__); any other attribute is read by name. 0, or -1 with an exception set */
static int read_descs(pg_walk *w) {
  PyObject *cls = w->f[W_CLS], *d;
  PyObject *names[PG_A_N];
  int a;
  names[PG_A_OP] = pg_walk_s.op, names[PG_A_SRC] = pg_walk_s.src, names[PG_A_DTYPE] = pg_walk_s.dtype;
  names[PG_A_ARG] = pg_walk_s.arg;
  if (PyType_GetSlot((PyTypeObject *)cls, Py_tp_getattro) != (void *)PyObject_GenericGetAttr) return 0;
  for (a = 0; a < PG_A_N; a++) {
    if (!(d = PyObject_GetAttr(cls, names[a]))) {
      PyErr_Clear();  /* no such class attribute: read by name */
      continue;
    }
    if (!PyObject_TypeCheck(d, &PyMemberDescr_Type)) {
      Py_DECREF(d);
      continue;
    }
    w->desc[a] = d;
    w->get[a] = (descrgetfunc)PyType_GetSlot(Py_TYPE(d), Py_tp_descr_get);
  }
  return 0;
}

/* w's configuration read from tuple t, every item checked; 0, or -1 with TypeError set */
static int read_cfg(PyObject *t, pg_walk *w) {
  int i;
  PyObject *ints;
  if (!PyTuple_Check(t) || PyTuple_Size(t) != W_N) return pg_walk_bad("the configuration is no tuple of 34");
  for (i = 0; i < W_N; i++) w->f[i] = PyTuple_GetItem(t, i);
  if (!PyDict_Check(w->f[W_LIVE]) || !PyDict_Check(w->f[W_MEMO]) || !PyDict_Check(w->f[W_MDD]) ||
      !PyDict_Check(w->f[W_TSH]) || !PyDict_Check(w->f[W_SHAPES]) || !PyDict_Check(w->f[W_ALU]) ||
      !PyDict_Check(w->f[W_DTI]) || !PyDict_Check(w->f[W_MD1]) || !PyDict_Check(w->f[W_DT]) ||
      !PyDict_Check(w->f[W_ROP]) || !PyDict_Check(w->f[W_SAME]))
    return pg_walk_bad("live, memo, mdd, tsh, shapes, alu, dti, md1, dt, rop and same must be dicts");
  if (!PyType_Check(w->f[W_PARAMARG])) return pg_walk_bad("paramarg must be a class");
  if (w->f[W_MDATA] != Py_None && !PyDict_Check(w->f[W_MDATA])) return pg_walk_bad("mdata must be a dict or None");
  if (!PyList_Check(w->f[W_ROWS]) || (w->f[W_PUTS] != Py_None && !PyList_Check(w->f[W_PUTS])))
    return pg_walk_bad("rows must be a list, puts a list or None");
  if (!PyAnySet_Check(w->f[W_PLAIN]) || !PyAnySet_Check(w->f[W_SMOVE]) || !PyAnySet_Check(w->f[W_CMP]) ||
      !PyAnySet_Check(w->f[W_WEAK]) || !PyAnySet_Check(w->f[W_LEAF]) ||
      (w->f[W_TARGETS] != Py_None && !PyAnySet_Check(w->f[W_TARGETS])))
    return pg_walk_bad("plain, smove, cmp, weak, leaf and targets must be sets");
  if (!PyCallable_Check(w->f[W_NODE]) || !PyCallable_Check(w->f[W_META]) || !PyCallable_Check(w->f[W_VSRC]))
    return pg_walk_bad("node, meta and vsrc must be callables");
  if (!PyUnicode_Check(w->f[W_SHN]) || !PyUnicode_Check(w->f[W_DVN])) return pg_walk_bad("shn and dvn must be strs");
  ints = w->f[W_INTS];
  if (!PyTuple_Check(ints) || PyTuple_Size(ints) != 8) return pg_walk_bad("ints must be a tuple of 8");
  w->r_reshape = PyTuple_GetItem(ints, 0), w->r_permute = PyTuple_GetItem(ints, 1);
  w->r_bool = PyTuple_GetItem(ints, 2);
  w->r_expand = PyTuple_GetItem(ints, 3), w->r_btag = PyTuple_GetItem(ints, 4);
  w->r_reduce = PyTuple_GetItem(ints, 5), w->r_buffer = PyTuple_GetItem(ints, 6), w->r_rtag = PyTuple_GetItem(ints, 7);
  if (!PyType_Check(w->f[W_CLS])) return pg_walk_bad("cls must be a class");
  return read_descs(w);
}

/* the value sources of u (a new reference to a tuple), or NULL with an exception set */
static PyObject *value_srcs(const pg_walk *w, PyObject *u, PyObject *op) {
  PyObject *src, *vs;
  int r;
  if ((r = PySet_Contains(w->f[W_PLAIN], op)) != 0) vs = r < 0 ? NULL : pg_walk_attr(w, u, PG_A_SRC);
  else if ((r = PySet_Contains(w->f[W_SMOVE], op)) != 0) {
    if (r < 0 || !(src = pg_walk_attr(w, u, PG_A_SRC))) return NULL;
    vs = PyTuple_Check(src) ? PyTuple_GetSlice(src, 0, 1) : NULL;
    Py_DECREF(src);
    if (!vs && !PyErr_Occurred()) pg_walk_bad("a node's src is no tuple");
  } else if ((r = PySet_Contains(w->f[W_LEAF], op)) != 0) vs = r < 0 ? NULL : PyTuple_New(0);
  else vs = PyObject_CallFunctionObjArgs(w->f[W_VSRC], u, NULL);
  if (vs && !PyTuple_Check(vs)) {
    Py_DECREF(vs);
    pg_walk_bad("value sources must be a tuple");
    return NULL;
  }
  return vs;
}

/* the second visit of u (op its op, its value sources vs all visited): on a target path or not, and its row. 0 or
   -1 with an exception set */
static int finish(const pg_walk *w, PyObject *u, PyObject *op, PyObject *vs) {
  PyObject *dt = NULL, *ri = NULL;
  int below, r = -1, t, fresh = 1;
  Py_ssize_t i;
  if (w->f[W_TARGETS] == Py_None) below = 1;
  else {
    below = op == w->f[W_PARAM];
    for (i = 0; !below && i < PyTuple_Size(vs); i++) {
      PyObject *l = PyDict_GetItemWithError(w->f[W_LIVE], PyTuple_GetItem(vs, i));
      if (!l) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_KeyError, "pygrad C core: foreign walk: a source not visited");
        return -1;
      }
      if ((t = PyObject_IsTrue(l)) < 0) return -1;
      below = t;
    }
  }
  t = below;
  if (!t && (t = PySet_Contains(w->f[W_TARGETS], u)) < 0) return -1;
  if (PyDict_SetItem(w->f[W_LIVE], u, t ? Py_True : Py_False) < 0) return -1;
  if (!below) return 0;
  if ((t = PyDict_Contains(w->f[W_MEMO], u)) != 0) return t < 0 ? -1 : 0;
  if (!(dt = pg_walk_attr(w, u, PG_A_DTYPE))) return -1;
  if ((t = PySet_Contains(w->f[W_WEAK], dt)) != 0) {
    r = t < 0 ? -1 : 0;
    goto out;
  }
  if (!(ri = pg_walk_row(w, u, op, dt, vs))) goto out;
  if (ri == Py_None) {  /* the Python walk's own code makes it (and its memo entry) */
    Py_DECREF(ri);
    fresh = 0;
    if (!(ri = PyObject_CallFunctionObjArgs(w->f[W_NODE], u, vs, NULL))) goto out;
    if (ri == Py_None) {
      r = 0;
      goto out;
    }
  }
  if (pg_walk_put_pair(w, ri, u) < 0) goto out;
  r = pg_walk_meta(w, u, ri, fresh);
out:
  Py_DECREF(dt);
  Py_XDECREF(ri);
  return r;
}

/* a node on the walk's stack: first visit (vs NULL), or second (its value sources vs pushed above it, then visited) */
typedef struct {
  PyObject *u, *op, *vs;  /* owned; op and vs NULL on the first visit */
} frame;

/* the frames' references dropped and the stack freed */
static void drop(frame *st, size_t n) {
  while (n) {
    n--;
    Py_DECREF(st[n].u);
    Py_XDECREF(st[n].op);
    Py_XDECREF(st[n].vs);
  }
  free(st);
}

/* the descriptors read_descs holds, dropped */
static void descs_free(pg_walk *w) {
  int a;
  for (a = 0; a < PG_A_N; a++) Py_CLEAR(w->desc[a]);
}

/* walk(cfg, root): the walk from root; None, or an exception */
static PyObject *foreign_walk(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  pg_walk w;
  frame *st, *grown;
  size_t n = 0, cap = 64;
  (void)self;
  if (nargs != 2) return PyErr_Format(PyExc_TypeError, "pygrad C core: foreign walk takes 2 arguments");
  memset(&w, 0, sizeof w);
  if (intern_names() < 0 || read_cfg(args[0], &w) < 0 || !(st = malloc(cap * sizeof *st))) {
    descs_free(&w);
    return PyErr_Occurred() ? NULL : PyErr_NoMemory();
  }
  if (pg_walk_meta_new(&w) < 0) {
    free(st);
    descs_free(&w);
    return NULL;
  }
  Py_INCREF(args[1]);
  st[n].u = args[1], st[n].op = st[n].vs = NULL, n++;
  while (n) {
    frame f = st[--n];
    PyObject *vs;
    Py_ssize_t i, k;
    int r;
    if (f.vs) {  /* u is not live yet: every frame above its second visit's is a node below it */
      r = finish(&w, f.u, f.op, f.vs);
      Py_DECREF(f.u);
      Py_DECREF(f.op);
      Py_DECREF(f.vs);
      if (r < 0) goto fail;
      continue;
    }
    if ((r = PyDict_Contains(w.f[W_LIVE], f.u)) != 0) {  /* pushed twice (two users) and done since */
      Py_DECREF(f.u);
      if (r < 0) goto fail;
      continue;
    }
    if (!(f.op = pg_walk_attr(&w, f.u, PG_A_OP)) || !(vs = value_srcs(&w, f.u, f.op))) {
      Py_DECREF(f.u);
      Py_XDECREF(f.op);
      goto fail;
    }
    k = PyTuple_Size(vs);
    if (n + 1 + (size_t)k > cap) {
      size_t c2 = cap;
      while (n + 1 + (size_t)k > c2) c2 *= 2;
      if (c2 > ((size_t)-1) / sizeof *st || !(grown = realloc(st, c2 * sizeof *st))) {
        Py_DECREF(f.u);
        Py_DECREF(f.op);
        Py_DECREF(vs);
        PyErr_NoMemory();
        goto fail;
      }
      st = grown, cap = c2;
    }
    st[n].u = f.u, st[n].op = f.op, st[n].vs = vs, n++;  /* the frame's references move onto the stack */
    for (i = k - 1; i >= 0; i--) {
      PyObject *s = PyTuple_GetItem(vs, i);
      if ((r = PyDict_Contains(w.f[W_LIVE], s)) < 0) goto fail;
      if (r) continue;
      Py_INCREF(s);
      st[n].u = s, st[n].op = st[n].vs = NULL, n++;
    }
  }
  drop(st, 0);
  pg_walk_meta_free(&w);
  descs_free(&w);
  Py_RETURN_NONE;
fail:
  drop(st, n);
  pg_walk_meta_free(&w);
  descs_free(&w);
  return NULL;
}

PyMethodDef pg_py_foreign_walk_def = {"foreign_walk", (PyCFunction)(void (*)(void))foreign_walk, METH_FASTCALL,
                                      "foreign_walk(cfg, root): see csrc/pywalk.c"};
