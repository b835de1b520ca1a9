/* The arg table of pygrad's binary format (pygrad/argtable.py) decoded and interned as one CPython builtin: the
   values of a table of plain data (ints, floats, strings, bytes, tuples, ops, dtypes, Metadata, None, bools), their
   interning keys (intern.argkey's form) and their interned ids, without a Python call per value. A table holding
   what needs Python to resolve (a callable by name, an external, an integer beyond int64) is left to the Python
   decoder (the builtin returns None). Every check of argtable.py's decoder is made here, in the same order and with
   the same ValueError text, so a bad table raises what the pure core raises. Nothing recurses: a skeleton is read and
   an arg assembled with explicit stacks, nesting is bounded by MAX_NEST, and the values a table expands to are
   bounded by its size (BUDGET), so hostile bytes cannot ask for unbounded memory. */
#include "pyapi.h"
#include <string.h>

enum { T_NONE, T_FALSE, T_TRUE, T_INT, T_BIGINT, T_FLOAT, T_STR, T_TUPLE, T_OPS, T_DTYPE, T_META, T_CALLINFO, T_FUNC,
       T_EXTERN, T_BYTES, T_INTS };
#define MAX_NEST 100
#define BUDGET(bytes) (4 * (uint64_t)(bytes) + (1u << 16))

/* cfg: (ops, dtypes, meta, ints, ids, get_key, objs, plain)
   ops, dtypes: tuples, an arg's op / dtype number -> the object; meta: the Metadata class; ints: the marker of an
   int tuple's key (intern._INTS); ids: the interner's dict key -> id, or None (decode only); get_key(key, value): the
   interner's id of a value it lacks; objs: its dict id -> interned object; plain: its dict plain value -> id (a value
   of exact ints and strs in tuples is its own key: intern.plain), looked up first for such values. */
enum { A_OPS, A_DTYPES, A_META, A_INTS, A_IDS, A_GETKEY, A_OBJS, A_PLAIN, A_N };

typedef struct { uint8_t t; uint32_t k; } tok_t;

typedef struct {
  const uint8_t *b;
  uint64_t p, end;
  PyObject *ops, *dtypes, *meta, *ints, *nan;
} rd_t;

static int verr(const char *what) {
  PyErr_Format(PyExc_ValueError, "pygrad.loads: %s", what);
  return -1;
}

static int cut(const char *what) {
  PyErr_Format(PyExc_ValueError, "pygrad.loads: truncated data (%s)", what);
  return -1;
}

static uint32_t u32_at(const uint8_t *q) {
  return (uint32_t)q[0] | (uint32_t)q[1] << 8 | (uint32_t)q[2] << 16 | (uint32_t)q[3] << 24;
}

static uint64_t u64_at(const uint8_t *q) { return (uint64_t)u32_at(q) | (uint64_t)u32_at(q + 4) << 32; }

/* (a, b) as a new tuple, stealing neither; NULL with an exception set */
static PyObject *pair(PyObject *a, PyObject *b) {
  PyObject *t = PyTuple_New(2);
  if (!t) return NULL;
  Py_INCREF(a);
  Py_INCREF(b);
  PyTuple_SetItem(t, 0, a);
  PyTuple_SetItem(t, 1, b);
  return t;
}

/* The skeletons at r's position: their tokens appended to toks (room for end - p of them: a token is at least a
   byte), each skeleton's first token and count in first[], ntok[] (room for nskel, read first). argtable.py's
   _read_skeletons, check for check. Returns the number of skeletons, or -1 with an exception set. */
static int64_t read_skeletons(rd_t *r, tok_t **toks_out, uint64_t **first_out, uint64_t **ntok_out) {
  uint64_t nskel, s, n = 0, cap = r->end - r->p;
  tok_t *toks;
  uint64_t *first, *ntoks;
  uint32_t open_[MAX_NEST + 2];
  if (r->p + 4 > r->end) return cut("skeleton count");
  nskel = u32_at(r->b + r->p);
  r->p += 4;
  if (nskel > (r->end - r->p) / 5) {
    PyErr_Format(PyExc_ValueError, "pygrad.loads: %llu arg skeletons do not fit in the data",
                 (unsigned long long)nskel);
    return -1;
  }
  toks = (tok_t *)PyMem_Malloc((cap ? cap : 1) * sizeof *toks);
  first = (uint64_t *)PyMem_Malloc((nskel ? nskel : 1) * sizeof *first);
  ntoks = (uint64_t *)PyMem_Malloc((nskel ? nskel : 1) * sizeof *ntoks);
  *toks_out = toks, *first_out = first, *ntok_out = ntoks;
  if (!toks || !first || !ntoks) {
    PyErr_NoMemory();
    return -1;
  }
  for (s = 0; s < nskel; s++) {
    uint64_t ntok, i;
    int depth = 0;
    if (r->p + 4 > r->end) return cut("skeleton size");
    ntok = u32_at(r->b + r->p);
    r->p += 4;
    if (ntok == 0 || ntok > r->end - r->p) {
      PyErr_Format(PyExc_ValueError, "pygrad.loads: an arg skeleton of %llu tokens", (unsigned long long)ntok);
      return -1;
    }
    first[s] = n, ntoks[s] = ntok;
    for (i = 0; i < ntok; i++) {
      uint8_t t;
      uint32_t k = 0, want;
      if (!depth && i) return verr("an arg skeleton holds more than one value");
      if (r->p >= r->end) return cut("arg tag");
      t = r->b[r->p++];
      if (t == T_TUPLE || t == T_INTS) {
        if (r->p + 4 > r->end) return cut("size");
        k = u32_at(r->b + r->p);
        r->p += 4;
      } else if (t > T_INTS) {
        PyErr_Format(PyExc_ValueError, "pygrad.loads: unknown arg tag %d", (int)t);
        return -1;
      }
      if (n >= cap) return cut("arg tag");  /* cannot happen: a token is at least a byte */
      toks[n].t = t, toks[n].k = k, n++;
      if (depth) open_[depth - 1]--;
      want = t == T_TUPLE ? k : t == T_META ? 3 : t == T_CALLINFO ? 5 : t == T_FUNC ? 2 : 0;
      if (want) {
        if (t == T_TUPLE && want > ntok) {
          PyErr_Format(PyExc_ValueError, "pygrad.loads: a tuple of %lu items is longer than the data",
                       (unsigned long)want);
          return -1;
        }
        open_[depth++] = want;
        if (depth > MAX_NEST) {
          PyErr_Format(PyExc_ValueError, "pygrad.loads: args nested deeper than %d", MAX_NEST);
          return -1;
        }
      }
      while (depth && open_[depth - 1] == 0) depth--;
    }
    if (depth) return cut("an arg is incomplete");
  }
  return (int64_t)nskel;
}

/* The c values of data token (t, k) at r's position into vals[0..c), their keys into keys[0..c) (new references),
   and r past them: argtable.py's _column, check for check. 0, or -1 with an exception set (the items made so far are
   in vals/keys, the rest NULL). */
static int column(rd_t *r, uint8_t t, uint32_t k, uint64_t c, PyObject **vals, PyObject **keys) {
  uint64_t room = r->end - r->p, j;
  const uint8_t *q = r->b + r->p;
  if (!c) return 0;
  if (t == T_INT || t == T_FLOAT || t == T_INTS) {
    uint64_t w = 8 * (uint64_t)(t == T_INTS ? k : 1);
    if (w && c > room / w) return cut(t == T_INTS ? "int tuple arg" : t == T_FLOAT ? "float arg" : "int arg");
    for (j = 0; j < c; j++, q += w) {
      if (t == T_INT) {
        vals[j] = PyLong_FromLongLong((long long)u64_at(q));
        keys[j] = vals[j] ? pair((PyObject *)&PyLong_Type, vals[j]) : NULL;
      } else if (t == T_FLOAT) {
        uint64_t u = u64_at(q);
        double x;
        memcpy(&x, &u, sizeof x);
        vals[j] = PyFloat_FromDouble(x);
        if (!vals[j]) keys[j] = NULL;
        else if (x != x) keys[j] = pair((PyObject *)&PyFloat_Type, r->nan);
        else if (x == 0.0) {  /* (float, x, whether it is -0.0) */
          keys[j] = PyTuple_New(3);
          if (keys[j]) {
            PyObject *neg = (u >> 63) ? Py_True : Py_False;
            Py_INCREF(&PyFloat_Type);
            Py_INCREF(vals[j]);
            Py_INCREF(neg);
            PyTuple_SetItem(keys[j], 0, (PyObject *)&PyFloat_Type);
            PyTuple_SetItem(keys[j], 1, vals[j]);
            PyTuple_SetItem(keys[j], 2, neg);
          }
        } else keys[j] = pair((PyObject *)&PyFloat_Type, vals[j]);
      } else {
        uint32_t i;
        if (j && w && memcmp(q, q - w, (size_t)w) == 0) {  /* the item before again (a shape): the same object */
          Py_INCREF(vals[j - 1]);
          Py_INCREF(keys[j - 1]);
          vals[j] = vals[j - 1], keys[j] = keys[j - 1];
          continue;
        }
        vals[j] = PyTuple_New(k);
        for (i = 0; vals[j] && i < k; i++) {
          PyObject *v = PyLong_FromLongLong((long long)u64_at(q + 8 * (uint64_t)i));
          if (!v) Py_CLEAR(vals[j]);
          else PyTuple_SetItem(vals[j], i, v);
        }
        keys[j] = vals[j] ? pair(r->ints, vals[j]) : NULL;
      }
      if (!keys[j]) return -1;
    }
    r->p += w * c;
    return 0;
  }
  if (t == T_OPS || t == T_DTYPE) {
    PyObject *table = t == T_OPS ? r->ops : r->dtypes;
    Py_ssize_t lim = PyTuple_Size(table);
    uint8_t mx = 0;
    if (c > room) return cut("op or dtype");
    for (j = 0; j < c; j++) mx = q[j] > mx ? q[j] : mx;
    if (mx >= lim) {
      PyErr_Format(PyExc_ValueError, "pygrad.loads: unknown %s %d in an arg", t == T_OPS ? "op" : "dtype", (int)mx);
      return -1;
    }
    for (j = 0; j < c; j++) {
      PyObject *v = PyTuple_GetItem(table, q[j]);
      if (!v) return -1;
      Py_INCREF(v);
      vals[j] = v;
      if (!(keys[j] = pair((PyObject *)Py_TYPE(v), v))) return -1;
    }
    r->p += c;
    return 0;
  }
  /* T_STR, T_BYTES: lengths, then the bytes */
  {
    uint64_t total = 0;
    const uint8_t *s;
    if (c > room / 4) return cut("sizes");
    for (j = 0; j < c; j++) {
      total += u32_at(q + 4 * j);
      if (total > room - 4 * c) return cut("string arg");
    }
    s = q + 4 * c;
    for (j = 0; j < c; j++) {
      uint32_t len = u32_at(q + 4 * j), plen = j ? u32_at(q + 4 * (j - 1)) : 0;
      if (j && len == plen && memcmp(s, s - plen, len) == 0) {  /* the item before again (a device): one object */
        Py_INCREF(vals[j - 1]);
        Py_INCREF(keys[j - 1]);
        vals[j] = vals[j - 1], keys[j] = keys[j - 1];
      } else {
        vals[j] = t == T_BYTES ? PyBytes_FromStringAndSize((const char *)s, len) :
                  PyUnicode_DecodeUTF8((const char *)s, len, "surrogatepass");
        if (!vals[j]) {
          if (t == T_STR && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
            PyErr_Clear();
            return verr("a string arg is not UTF-8");
          }
          return -1;
        }
        if (!(keys[j] = pair(t == T_BYTES ? (PyObject *)&PyBytes_Type : (PyObject *)&PyUnicode_Type, vals[j])))
          return -1;
      }
      s += len;
    }
    r->p += 4 * c + total;
    return 0;
  }
}

/* the value and key of a finished container of n items vs[0..n), ks[0..n) (intl: which are ints): a tuple, or a
   Metadata (kind T_META). New references in *v, *k; -1 with an exception set. */
static int finish(const rd_t *r, uint8_t kind, uint32_t n, PyObject **vs, PyObject **ks, const uint8_t *intl,
                  const uint8_t *pl, PyObject **v, PyObject **k, uint8_t *plain) {
  uint32_t i;
  *v = *k = NULL;
  *plain = kind != T_META;
  if (kind == T_META) {
    if (!PyUnicode_CheckExact(vs[0]) || !PyUnicode_CheckExact(vs[1]) || !PyBool_Check(vs[2])) {
      PyObject *l = PyList_New(3);
      if (!l) return -1;
      for (i = 0; i < 3; i++) {
        Py_INCREF(vs[i]);
        PyList_SetItem(l, i, vs[i]);
      }
      PyErr_Format(PyExc_ValueError, "pygrad.loads: bad Metadata fields %R", l);
      Py_DECREF(l);
      return -1;
    }
    if (!(*v = PyObject_CallFunctionObjArgs(r->meta, vs[0], vs[1], vs[2], NULL))) return -1;
    if (!(*k = pair((PyObject *)Py_TYPE(*v), *v))) return -1;
    return 0;
  }
  {
    int all_int = 1;
    if (!(*v = PyTuple_New(n))) return -1;
    for (i = 0; i < n; i++) {
      Py_INCREF(vs[i]);
      PyTuple_SetItem(*v, i, vs[i]);
      all_int &= intl[i];
      *plain &= pl[i];
    }
    if (all_int) *k = pair(r->ints, *v);  /* ints only (or no items): the key of a shape */
    else if ((*k = PyTuple_New((Py_ssize_t)n + 1))) {
      Py_INCREF(&PyTuple_Type);
      PyTuple_SetItem(*k, 0, (PyObject *)&PyTuple_Type);
      for (i = 0; i < n; i++) {
        Py_INCREF(ks[i]);
        PyTuple_SetItem(*k, i + 1, ks[i]);
      }
    }
    return *k ? 0 : -1;
  }
}

static PyObject *const_of(uint8_t t) { return t == T_NONE ? Py_None : t == T_TRUE ? Py_True : Py_False; }

/* The values and keys of skeleton toks[0..ntok)'s c args (columns cv/ck: per token, c values or NULL) into
   out_v/out_k at the positions at[0..c), and whether each is plain (intern.plain) into out_p: argtable.py's
   _assemble, one arg at a time, with explicit stacks. */
static int assemble(const rd_t *r, const tok_t *toks, uint64_t ntok, uint64_t c, PyObject **cv, PyObject **ck,
                    const uint64_t *at, PyObject *out_v, PyObject *out_k, uint8_t *out_p) {
  PyObject **vs = (PyObject **)PyMem_Malloc(2 * ntok * sizeof *vs), **ks = vs + ntok;
  uint8_t *intl = (uint8_t *)PyMem_Malloc(2 * ntok), *pl = intl + ntok;
  struct { uint64_t base; uint32_t want; uint8_t kind; } fr[MAX_NEST + 2];
  uint64_t j, i, sp = 0;
  int depth = 0, rc = -1;
  if (!vs || !intl) {
    PyErr_NoMemory();
    goto out;
  }
  for (j = 0; j < c; j++) {
    sp = 0, depth = 0;
    for (i = 0; i < ntok; i++) {
      uint8_t t = toks[i].t;
      if ((t == T_TUPLE && toks[i].k) || t == T_META) {
        fr[depth].base = sp, fr[depth].want = t == T_META ? 3 : toks[i].k, fr[depth].kind = t;
        depth++;
        continue;
      }
      if (t == T_TUPLE) {  /* () */
        if (!(vs[sp] = PyTuple_New(0))) goto out;
        if (!(ks[sp] = pair(r->ints, vs[sp]))) {
          Py_DECREF(vs[sp]);
          goto out;
        }
      } else if (t == T_NONE || t == T_TRUE || t == T_FALSE) {
        PyObject *v = const_of(t);
        Py_INCREF(v);
        vs[sp] = v;
        if (!(ks[sp] = pair((PyObject *)Py_TYPE(v), v))) {
          Py_DECREF(v);
          goto out;
        }
      } else {
        Py_INCREF(cv[i * c + j]);
        Py_INCREF(ck[i * c + j]);
        vs[sp] = cv[i * c + j], ks[sp] = ck[i * c + j];
      }
      intl[sp] = t == T_INT;
      pl[sp++] = t == T_INT || t == T_STR || t == T_INTS || t == T_TUPLE;
      while (depth && sp - fr[depth - 1].base == fr[depth - 1].want) {
        PyObject *v, *k;
        uint64_t b = fr[depth - 1].base, m;
        uint8_t p;
        int e = finish(r, fr[depth - 1].kind, fr[depth - 1].want, vs + b, ks + b, intl + b, pl + b, &v, &k, &p);
        for (m = b; m < sp; m++) {
          Py_DECREF(vs[m]);
          Py_DECREF(ks[m]);
        }
        sp = b;
        if (e) {
          Py_XDECREF(v);
          Py_XDECREF(k);
          goto out;
        }
        vs[sp] = v, ks[sp] = k, intl[sp] = 0, pl[sp++] = p;
        depth--;
      }
    }
    /* a checked skeleton is one value: sp == 1 */
    PyList_SetItem(out_v, (Py_ssize_t)at[j], vs[0]);
    PyList_SetItem(out_k, (Py_ssize_t)at[j], ks[0]);
    out_p[at[j]] = pl[0];
    sp = 0;
  }
  rc = 0;
out:
  if (vs)
    for (i = 0; i < sp; i++) {
      Py_DECREF(vs[i]);
      Py_DECREF(ks[i]);
    }
  PyMem_Free(vs);
  PyMem_Free(intl);
  return rc;
}

/* the ids of the nargs values (keys ks) as nargs + 1 int32s (0 first: no arg), each value in vs replaced by the
   interned object: serialize.py's _intern_all and its ARGS.objs lookup, with the interner's dict looked up here and
   its get_key called only for a value it lacks. A bytes object, or NULL with an exception set. */
static PyObject *intern_all(PyObject *vs, PyObject *ks, const uint8_t *pl, Py_ssize_t nargs, PyObject *ids,
                            PyObject *get_key, PyObject *objs, PyObject *plain) {
  PyObject *out = PyBytes_FromStringAndSize(NULL, 4 * (nargs + 1));
  char *p;
  Py_ssize_t i;
  int32_t a32 = 0;
  if (!out) return NULL;
  if (!(p = PyBytes_AsString(out))) goto fail;
  memcpy(p, &a32, 4);
  for (i = 0; i < nargs; i++) {
    PyObject *k = PyList_GetItem(ks, i), *v = PyList_GetItem(vs, i), *aid, *o;
    long a;
    if (!k || !v) goto fail;
    aid = pl[i] ? PyDict_GetItemWithError(plain, v) : NULL;  /* a plain value: its own key, cheaper to hash */
    if (!aid && !PyErr_Occurred()) aid = PyDict_GetItemWithError(ids, k);
    if (aid) Py_INCREF(aid);
    else if (PyErr_Occurred() || !(aid = PyObject_CallFunctionObjArgs(get_key, k, v, NULL))) goto fail;
    a = PyLong_AsLong(aid);
    if ((a == -1 && PyErr_Occurred()) || a <= 0 || a > INT32_MAX) {
      if (!PyErr_Occurred()) PyErr_Format(PyExc_RuntimeError, "pygrad.loads: interned id %ld out of range", a);
      Py_DECREF(aid);
      goto fail;
    }
    a32 = (int32_t)a;
    memcpy(p + 4 * (i + 1), &a32, 4);  /* native int32s, read by numpy */
    o = PyDict_GetItemWithError(objs, aid);
    Py_DECREF(aid);
    if (o && o != v) {
      Py_INCREF(o);
      PyList_SetItem(vs, i, o);  /* steals o, drops the decoded value */
    } else if (!o && PyErr_Occurred()) goto fail;
  }
  return out;
fail:
  Py_DECREF(out);
  return NULL;
}

/* args_decode(cfg, table, nargs): (values, keys, ids) of the arg table (ids: bytes of nargs + 1 int32s, or None if
   cfg's ids is None), or None if the table holds what only the Python decoder decodes. Raises ValueError as
   argtable.py's decoder does for bad bytes. */
static PyObject *args_decode(PyObject *self, PyObject *const *args, Py_ssize_t nargs_) {
  PyObject *cfg, *f[A_N], *vals = NULL, *keys = NULL, *ids = NULL, *res = NULL, **cv = NULL;
  char *buf;
  Py_ssize_t len, nargs, i;
  rd_t r;
  tok_t *toks = NULL;
  uint64_t *first = NULL, *ntoks = NULL, *cnt = NULL, *at = NULL, *pos = NULL, s, total = 0;
  uint32_t *which = NULL;
  uint8_t *pl = NULL;
  int64_t nskel;
  (void)self;
  if (nargs_ != 3 || !PyTuple_Check(args[0]) || PyTuple_Size(args[0]) != A_N || !PyBytes_Check(args[1])) {
    PyErr_SetString(PyExc_TypeError, "pygrad C core: args_decode(cfg, table: bytes, nargs)");
    return NULL;
  }
  cfg = args[0];
  for (i = 0; i < A_N; i++) f[i] = PyTuple_GetItem(cfg, i);
  if (!PyTuple_Check(f[A_OPS]) || !PyTuple_Check(f[A_DTYPES]) || !PyUnicode_Check(f[A_INTS]) ||
      (f[A_IDS] != Py_None && (!PyDict_Check(f[A_IDS]) || !PyDict_Check(f[A_OBJS]) || !PyDict_Check(f[A_PLAIN]) ||
                               !PyCallable_Check(f[A_GETKEY])))) {
    PyErr_SetString(PyExc_TypeError, "pygrad C core: args_decode: bad configuration");
    return NULL;
  }
  nargs = PyLong_AsSsize_t(args[2]);
  if (nargs == -1 && PyErr_Occurred()) return NULL;
  if (nargs < 0) {
    PyErr_SetString(PyExc_ValueError, "pygrad.loads: a negative arg count");
    return NULL;
  }
  if (PyBytes_AsStringAndSize(args[1], &buf, &len) < 0) return NULL;
  r.b = (const uint8_t *)buf, r.p = 0, r.end = (uint64_t)len;
  r.ops = f[A_OPS], r.dtypes = f[A_DTYPES], r.meta = f[A_META], r.ints = f[A_INTS];
  if (!(r.nan = PyUnicode_FromString("nan"))) return NULL;
  nskel = read_skeletons(&r, &toks, &first, &ntoks);
  if (nskel < 0) goto out;
  for (s = 0; s < (nskel ? first[nskel - 1] + ntoks[nskel - 1] : 0); s++) {
    uint8_t t = toks[s].t;
    if (t == T_BIGINT || t == T_CALLINFO || t == T_FUNC || t == T_EXTERN) {  /* Python's to decode */
      Py_INCREF(Py_None);
      res = Py_None;
      goto out;
    }
  }
  if ((uint64_t)nargs > (r.end - r.p) / 4) {
    cut("arg skeleton numbers");
    goto out;
  }
  which = (uint32_t *)PyMem_Malloc((nargs ? (size_t)nargs : 1) * sizeof *which);
  cnt = (uint64_t *)PyMem_Calloc(nskel ? (size_t)nskel : 1, sizeof *cnt);
  pos = (uint64_t *)PyMem_Calloc(nskel ? (size_t)nskel : 1, sizeof *pos);
  at = (uint64_t *)PyMem_Malloc((nargs ? (size_t)nargs : 1) * sizeof *at);
  pl = (uint8_t *)PyMem_Malloc(nargs ? (size_t)nargs : 1);
  if (!which || !cnt || !pos || !at || !pl) {
    PyErr_NoMemory();
    goto out;
  }
  for (i = 0; i < nargs; i++) {
    which[i] = u32_at(r.b + r.p + 4 * (uint64_t)i);
    if (which[i] >= (uint64_t)nskel) {
      verr("an arg names a skeleton that is not there");
      goto out;
    }
    cnt[which[i]]++;
  }
  r.p += 4 * (uint64_t)nargs;
  for (s = 0; s < (uint64_t)nskel; s++) {  /* the budget: items of all args, each skeleton's tokens per arg */
    if (ntoks[s] && cnt[s] > (BUDGET(r.end) - total) / ntoks[s]) {
      verr("the arg table expands to more items than its size allows");
      goto out;
    }
    total += cnt[s] * ntoks[s];
  }
  for (s = 1, pos[0] = 0; s < (uint64_t)nskel; s++) pos[s] = pos[s - 1] + cnt[s - 1];
  for (i = 0; i < nargs; i++) at[pos[which[i]]++] = (uint64_t)i;  /* per skeleton, its args in arg order */
  if (!(vals = PyList_New(nargs)) || !(keys = PyList_New(nargs))) goto out;
  for (i = 0; i < nargs; i++) {  /* placeholders until assembled: a list's items are never NULL for Python */
    Py_INCREF(Py_None);
    Py_INCREF(Py_None);
    PyList_SetItem(vals, i, Py_None);
    PyList_SetItem(keys, i, Py_None);
  }
  {
    uint64_t done = 0;
    for (s = 0; s < (uint64_t)nskel; s++) {
      const tok_t *tk = toks + first[s];
      uint64_t nt = ntoks[s], c = cnt[s], ti, m = 2 * nt * c;
      int e = 0;
      cv = (PyObject **)PyMem_Calloc(m ? (size_t)m : 1, sizeof *cv);
      if (!cv) {
        PyErr_NoMemory();
        goto out;
      }
      for (ti = 0; ti < nt && !e; ti++) {
        uint8_t t = tk[ti].t;
        if (t == T_NONE || t == T_TRUE || t == T_FALSE || t == T_TUPLE || t == T_META) continue;
        e = column(&r, t, tk[ti].k, c, cv + ti * c, cv + (nt + ti) * c);
      }
      if (!e) e = assemble(&r, tk, nt, c, cv, cv + nt * c, at + done, vals, keys, pl);
      for (ti = 0; ti < m; ti++) Py_XDECREF(cv[ti]);
      PyMem_Free(cv);
      cv = NULL;
      if (e) goto out;
      done += c;
    }
  }
  if (r.p != r.end) {
    verr("arg table size does not match its contents");
    goto out;
  }
  if (f[A_IDS] == Py_None) {
    Py_INCREF(Py_None);
    ids = Py_None;
  } else if (!(ids = intern_all(vals, keys, pl, nargs, f[A_IDS], f[A_GETKEY], f[A_OBJS], f[A_PLAIN]))) goto out;
  res = PyTuple_New(3);
  if (res) {
    PyTuple_SetItem(res, 0, vals);
    PyTuple_SetItem(res, 1, keys);
    PyTuple_SetItem(res, 2, ids);
    vals = keys = ids = NULL;
  }
out:
  Py_XDECREF(vals);
  Py_XDECREF(keys);
  Py_XDECREF(ids);
  Py_DECREF(r.nan);
  PyMem_Free(toks);
  PyMem_Free(first);
  PyMem_Free(ntoks);
  PyMem_Free(which);
  PyMem_Free(cnt);
  PyMem_Free(pos);
  PyMem_Free(at);
  PyMem_Free(pl);
  return res;
}

PyMethodDef pg_py_args_decode_def = {"args_decode", (PyCFunction)(void (*)(void))args_decode, METH_FASTCALL,
                                     "args_decode(cfg, table, nargs): see csrc/pyargs.c"};
