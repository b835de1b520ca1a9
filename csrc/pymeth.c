/* The single-node math methods themselves in C on the C core: `a + b`, `a * b` (and `&`, `|`, `^`) as number
   slots of the handle type (pyhandle.c), and the named ones (`a.sin()`, `a.maximum(b)`, ...) as method descriptors
   set on the UOp class. The Python method (fastmethods.py's closure) cost a Python frame and its checks, ~200-300 ns
   of a ~500 ns call; here the checks of its fast path -- node operands of one dtype the op takes, equal shapes (or a
   () second operand), one device, no metadata block open -- and the make (the store, the handle, the registry) are
   one C function with no Python frame. Anything else -- a scalar or foreign operand, another dtype or shape, an
   unpublished handle, a store code, an open metadata block -- calls that Python method (its fallback), which takes
   the general path and raises the precise errors, exactly as before.

   A method descriptor carries no data, so each op has a slot of its own: a small C function per slot (made by the
   macros below) passes its slot number to the shared code. The slots' tables are filled once, by install (uop.py,
   at import, with the GIL held), and read with the GIL held: the GIL is their lock. */
#include "pyapi.h"
#include "store_impl.h"
#include <string.h>

#define M_NDT 64   /* dtype ids below this */
#define M_NUN 24   /* unary method slots */
#define M_NBIN 16  /* binary method slots */
#define M_NNB 5    /* number slots: add, mul, and, or, xor */
#define M_NAME 32

typedef struct {
  PyObject *op;        /* the Ops member (the handle's _op) */
  int32_t opid;        /* its code */
  int8_t out[M_NDT];   /* operand dtype id -> result dtype id, or -1: not on the fast path */
  PyObject *fwd, *rev; /* the Python methods: op(self, x) and (number slots) the reflected op(x, self) */
  char name[M_NAME];
} m_op;

static pg_reg *M_reg;               /* the registry the handles are published in */
static PyTypeObject *M_cls;         /* the UOp class: the fast path takes exact instances only */
static PyObject *M_dt[M_NDT];       /* dtype id -> DType */
static long M_md;                   /* metadata blocks open (uop.py's _md_open, mirrored by md()) */
static m_op M_un[M_NUN], M_bin[M_NBIN], M_nb[M_NNB];
static PyMethodDef M_undef[M_NUN], M_bindef[M_NBIN];
static const char *const M_nbnames[M_NNB] = {"__add__", "__mul__", "__and__", "__or__", "__xor__"};

/* the id of DType object d, or -1 */
static int dt_index(PyObject *d) {
  int i;
  for (i = 0; i < M_NDT; i++)
    if (M_dt[i] == d) return i;
  return -1;
}

/* the int32 in int object v, or -1 (v no int in range: the caller takes the fallback) */
static int32_t small_int(PyObject *v) {
  long x = PyLong_AsLong(v);
  if (x == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    return -1;
  }
  return x >= 0 && x <= INT32_MAX ? (int32_t)x : -1;
}

/* h as a fast-path operand: an exact UOp published in this registry, with its fields */
static int usable(PyObject *o) {
  pg_handle *h = (pg_handle *)o;
  return Py_TYPE(o) == M_cls && h->reg == M_reg && h->f[PG_H_DTYPE] && h->f[PG_H_SHAPE] && h->f[PG_H_DEVICE] &&
         h->f[PG_H_META];
}

/* equal as Python objects (1), not (0), or -1 if comparing raised (cleared: the caller takes the fallback) */
static int same(PyObject *a, PyObject *b) {
  int r;
  if (a == b) return 1;
  if ((r = PyObject_RichCompareBool(a, b, Py_EQ)) < 0) PyErr_Clear();
  return r;
}

/* make op(src[0..nsrc)) of dtype out with x's shape, device and meta, and return its unique handle; NULL without
   an exception if the store answered a code (the caller takes the fallback) */
static PyObject *make(const m_op *m, int out, const int32_t *src, int nsrc, pg_handle *x) {
  pg_store *st = pg_reg_store(M_reg);
  int32_t meta = small_int(x->f[PG_H_META]), nid;
  PyObject *o;
  if (meta < 0) return NULL;
  pg_py_lock_take(st);
  nid = pg_store_make_locked(st, m->opid, out, src, nsrc, 0, 0, meta);
  if ((o = pg_mk_existing_unlock(st, M_reg, nid))) return o;
  if (nid < 0) return NULL;
  return pg_reg_wrap(M_reg, nid, m->op, M_dt[out], Py_None, Py_None, x->f[PG_H_SHAPE], x->f[PG_H_DEVICE],
                     x->f[PG_H_META]);
}

/* call fn(a) or fn(a, b) */
static PyObject *call(PyObject *fn, PyObject *a, PyObject *b) {
  if (!fn) Py_RETURN_NOTIMPLEMENTED;
  return PyObject_CallFunctionObjArgs(fn, a, b, NULL);
}

static PyObject *unary(int k, PyObject *self) {
  const m_op *m = &M_un[k];
  pg_handle *x = (pg_handle *)self;
  PyObject *o;
  int d, out;
  if (M_md || !M_reg || !usable(self) || (d = dt_index(x->f[PG_H_DTYPE])) < 0 || (out = m->out[d]) < 0 ||
      !M_dt[out])
    return call(m->fwd, self, NULL);
  if ((o = make(m, out, &x->nid, 1, x)) || PyErr_Occurred()) return o;
  return call(m->fwd, self, NULL);
}

/* op(a, b) for node operands on the fast path, else NULL without an exception */
static PyObject *binary_fast(const m_op *m, PyObject *a, PyObject *b) {
  pg_handle *ha = (pg_handle *)a, *hb = (pg_handle *)b;
  PyObject *sb;
  int32_t src[2];
  int d, out;
  if (M_md || !M_reg || !usable(a) || !usable(b) || ha->f[PG_H_DTYPE] != hb->f[PG_H_DTYPE] ||
      (d = dt_index(ha->f[PG_H_DTYPE])) < 0 || (out = m->out[d]) < 0 || !M_dt[out])
    return NULL;
  sb = hb->f[PG_H_SHAPE];
  if (!(PyTuple_Check(sb) && PyTuple_Size(sb) == 0) && same(ha->f[PG_H_SHAPE], sb) != 1) return NULL;
  if (same(ha->f[PG_H_DEVICE], hb->f[PG_H_DEVICE]) != 1) return NULL;
  src[0] = ha->nid, src[1] = hb->nid;
  return make(m, out, src, 2, ha);
}

static PyObject *binary(int k, PyObject *self, PyObject *x) {
  const m_op *m = &M_bin[k];
  PyObject *o = binary_fast(m, self, x);
  if (o || PyErr_Occurred()) return o;
  return call(m->fwd, self, x);
}

/* a number slot: op(a, b), a or b the handle (b: the reflected method of b) */
static PyObject *number(int k, PyObject *a, PyObject *b) {
  const m_op *m = &M_nb[k];
  PyObject *o = binary_fast(m, a, b);
  if (o || PyErr_Occurred()) return o;
  if (pg_py_is_handle(a)) return call(m->fwd, a, b);
  if (!m->rev) Py_RETURN_NOTIMPLEMENTED;
  return call(m->rev, b, a);
}

pg_reg *pg_meth_reg(void) { return M_md ? NULL : M_reg; }
int pg_meth_usable(PyObject *o) { return M_reg && usable(o); }
int pg_meth_dtype_id(PyObject *d) { return dt_index(d); }

PyObject *pg_meth_nb_add(PyObject *a, PyObject *b) { return number(0, a, b); }
PyObject *pg_meth_nb_mul(PyObject *a, PyObject *b) { return number(1, a, b); }
PyObject *pg_meth_nb_and(PyObject *a, PyObject *b) { return number(2, a, b); }
PyObject *pg_meth_nb_or(PyObject *a, PyObject *b) { return number(3, a, b); }
PyObject *pg_meth_nb_xor(PyObject *a, PyObject *b) { return number(4, a, b); }

/* one C function per slot */
#define UN(k) \
  static PyObject *un##k(PyObject *s, PyObject *unused) { (void)unused; return unary(k, s); }
#define BIN(k) \
  static PyObject *bin##k(PyObject *s, PyObject *x) { return binary(k, s, x); }
UN(0) UN(1) UN(2) UN(3) UN(4) UN(5) UN(6) UN(7) UN(8) UN(9) UN(10) UN(11)
UN(12) UN(13) UN(14) UN(15) UN(16) UN(17) UN(18) UN(19) UN(20) UN(21) UN(22) UN(23)
BIN(0) BIN(1) BIN(2) BIN(3) BIN(4) BIN(5) BIN(6) BIN(7) BIN(8) BIN(9) BIN(10) BIN(11) BIN(12) BIN(13) BIN(14) BIN(15)
static const PyCFunction M_unfn[M_NUN] = {un0, un1, un2, un3, un4, un5, un6, un7, un8, un9, un10, un11,
                                          un12, un13, un14, un15, un16, un17, un18, un19, un20, un21, un22, un23};
static const PyCFunction M_binfn[M_NBIN] = {bin0, bin1, bin2, bin3, bin4, bin5, bin6, bin7,
                                            bin8, bin9, bin10, bin11, bin12, bin13, bin14, bin15};

/* fill slot m from the spec's op, opid, outs (a tuple: dtype id -> result dtype id or -1), fwd and rev */
static int fill(m_op *m, const char *name, PyObject *const *v) {
  Py_ssize_t i, n;
  long opid = PyLong_AsLong(v[1]);
  if (opid == -1 && PyErr_Occurred()) return -1;
  if (!PyTuple_Check(v[2]) || (n = PyTuple_Size(v[2])) > M_NDT || opid < 0 || opid > INT32_MAX ||
      strlen(name) >= M_NAME) {
    PyErr_SetString(PyExc_ValueError, "pygrad C core: method spec out of range");
    return -1;
  }
  memset(m->out, -1, sizeof m->out);
  for (i = 0; i < n; i++) {
    long o = PyLong_AsLong(PyTuple_GetItem(v[2], i));
    if (o == -1 && PyErr_Occurred()) return -1;
    if (o >= M_NDT) {
      PyErr_SetString(PyExc_ValueError, "pygrad C core: a result dtype id out of range");
      return -1;
    }
    m->out[i] = (int8_t)(o < 0 ? -1 : o);
  }
  Py_INCREF(v[0]);
  Py_XDECREF(m->op);
  m->op = v[0];
  m->opid = (int32_t)opid;
  Py_XINCREF(v[3] == Py_None ? NULL : v[3]);
  Py_XDECREF(m->fwd);
  m->fwd = v[3] == Py_None ? NULL : v[3];
  Py_XINCREF(v[4] == Py_None ? NULL : v[4]);
  Py_XDECREF(m->rev);
  m->rev = v[4] == Py_None ? NULL : v[4];
  memcpy(m->name, name, strlen(name) + 1);  /* (its length checked above) */
  return 0;
}

/* install(cls, dtypes, specs), bound to the registry capsule: dtypes a tuple of DTypes by id; specs a tuple of
   (kind, name, op, opid, outs, fwd, rev), kind 0 a unary method, 1 a binary method, 2 a number slot (name one of
   M_nbnames). Returns a dict name -> method descriptor of cls for kinds 0 and 1 (the caller sets them on cls). */
static PyObject *install(PyObject *cap, PyObject *const *args, Py_ssize_t nargs) {
  pg_reg *reg = pg_reg_from(cap);
  PyObject *out, *cls, *dts, *specs;
  Py_ssize_t i, n;
  int nun = 0, nbin = 0;
  if (!reg) return NULL;
  if (nargs != 3 || !pg_py_is_handle_type(args[0]) || !PyTuple_Check(args[1]) || !PyTuple_Check(args[2]) ||
      PyTuple_Size(args[1]) > M_NDT)
    return PyErr_Format(PyExc_TypeError, "pygrad C core: install(cls, dtypes, specs)");
  cls = args[0], dts = args[1], specs = args[2];
  if (!(out = PyDict_New())) return NULL;
  M_reg = NULL;  /* off while the tables change */
  for (i = 0; i < M_NDT; i++) {
    PyObject *d = i < PyTuple_Size(dts) ? PyTuple_GetItem(dts, i) : NULL;
    Py_XINCREF(d);
    Py_XDECREF(M_dt[i]);
    M_dt[i] = d;
  }
  n = PyTuple_Size(specs);
  for (i = 0; i < n; i++) {
    PyObject *s = PyTuple_GetItem(specs, i), *v[5], *descr;
    const char *name;
    long kind;
    int j;
    if (!PyTuple_Check(s) || PyTuple_Size(s) != 7) goto bad;
    kind = PyLong_AsLong(PyTuple_GetItem(s, 0));
    if (!(name = PyUnicode_AsUTF8AndSize(PyTuple_GetItem(s, 1), NULL))) goto fail;
    for (j = 0; j < 5; j++) v[j] = PyTuple_GetItem(s, j + 2);
    if (kind == 2) {
      for (j = 0; j < M_NNB && strcmp(name, M_nbnames[j]); j++) {}
      if (j == M_NNB || fill(&M_nb[j], name, v) < 0) goto bad;
      continue;
    }
    if ((kind != 0 && kind != 1) || (kind == 0 ? nun >= M_NUN : nbin >= M_NBIN)) goto bad;
    if (kind == 0) {
      if (fill(&M_un[nun], name, v) < 0) goto fail;
      M_undef[nun].ml_name = M_un[nun].name, M_undef[nun].ml_meth = M_unfn[nun], M_undef[nun].ml_flags = METH_NOARGS;
      descr = PyDescr_NewMethod((PyTypeObject *)cls, &M_undef[nun++]);
    } else {
      if (fill(&M_bin[nbin], name, v) < 0) goto fail;
      M_bindef[nbin].ml_name = M_bin[nbin].name, M_bindef[nbin].ml_meth = M_binfn[nbin], M_bindef[nbin].ml_flags = METH_O;
      descr = PyDescr_NewMethod((PyTypeObject *)cls, &M_bindef[nbin++]);
    }
    if (!descr || PyDict_SetItemString(out, name, descr) < 0) {
      Py_XDECREF(descr);
      goto fail;
    }
    Py_DECREF(descr);
  }
  Py_INCREF(cls);
  Py_XDECREF((PyObject *)M_cls);
  M_cls = (PyTypeObject *)cls;
  M_reg = reg;
  return out;
bad:
  if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "pygrad C core: install: a bad method spec");
fail:
  Py_DECREF(out);
  return NULL;
}

/* md(n): how many metadata blocks are open (uop.metadata keeps it): while any is, every call takes the fallback */
static PyObject *md(PyObject *unused, PyObject *v) {
  long n = PyLong_AsLong(v);
  (void)unused;
  if (n == -1 && PyErr_Occurred()) return NULL;
  M_md = n;
  Py_RETURN_NONE;
}

static PyMethodDef install_def = {"install", (PyCFunction)(void (*)(void))install, METH_FASTCALL,
                                  "install(cls, dtypes, specs): the math methods in C (see pymeth.c)"};
static PyMethodDef md_def = {"md", md, METH_O, "md(n): the number of open metadata blocks"};

PyObject *pg_meth_calls(PyObject *cap) {
  PyObject *a = PyCFunction_NewEx(&install_def, cap, NULL), *b = PyCFunction_NewEx(&md_def, NULL, NULL), *t = NULL;
  PyObject *c = PyCFunction_NewEx(&pg_leaf_maker_def, cap, NULL);
  if (a && b && c) t = PyTuple_Pack(3, a, b, c);
  Py_XDECREF(a);
  Py_XDECREF(b);
  Py_XDECREF(c);
  return t;
}
