/* The rows of the usual nodes of the tinygrad -> pygrad walk (pywalk.c), made as the Python walk (_In._node, _one,
   _get, _opaque_buffer) makes them: an elementwise op whose operands are converted or opaque, typed and of its
   shape, with explicit broadcasts; a reshape or permute of a converted node; a reduce; a buffer; a DETACH or
   CONTIGUOUS; and the opaque BUFFER of a source off every target path. Anything else is left to Python (Py_None).
   tinygrad caches a node's shape and device in its __dict__ (its properties for them are Python frames): they are
   read there, the property only where nothing is cached. */
#include "pywalk.h"

/* o's __dict__ entry `name` (a new reference), NULL with no exception set if it has none (or no __dict__) */
static PyObject *dict_entry(PyObject *o, PyObject *name) {
  PyObject *d = PyObject_GenericGetDict(o, NULL), *v;
  if (!d) {
    PyErr_Clear();
    return NULL;
  }
  v = PyDict_Check(d) ? PyDict_GetItemWithError(d, name) : NULL;
  Py_XINCREF(v);
  Py_DECREF(d);
  if (!v) PyErr_Clear();
  return v;
}

/* o's cached shape (a new reference): tinygrad's cache in its __dict__, else tsh's (the Python walk's); NULL with
   no exception set if it has none cached, NULL with one set */
static PyObject *cached_shape(const pg_walk *w, PyObject *o) {
  PyObject *sh = dict_entry(o, w->f[W_SHN]);
  if (sh) return sh;
  sh = PyDict_GetItemWithError(w->f[W_TSH], o);
  Py_XINCREF(sh);
  return sh;
}

/* o's device (a new reference): tinygrad's cache in its __dict__, else its property; NULL with an exception set */
static PyObject *device_of(const pg_walk *w, PyObject *o) {
  PyObject *dev = dict_entry(o, w->f[W_DVN]);
  return dev ? dev : PyObject_GetAttr(o, pg_walk_s.device);
}

/* the row (a new reference) appended to the table for row x as `row` (a new reference, stolen), NULL with an
   exception set */
static PyObject *append(const pg_walk *w, PyObject *row) {
  int r;
  if (!row) return NULL;
  r = PyList_Append(w->f[W_ROWS], row);
  Py_DECREF(row);
  return r < 0 ? NULL : PyLong_FromSsize_t(PyList_Size(w->f[W_ROWS]) - 1);
}

/* u's static shape as the one object of it in the shapes dict (borrowed), as the Python walk's _shape gives it:
   NULL with no exception set if Python works it out (none cached, or not a tuple of ints), NULL with one set */
static PyObject *canon_shape(const pg_walk *w, PyObject *u) {
  PyObject *sh = cached_shape(w, u), *got = NULL;
  Py_ssize_t i;
  if (!sh) return NULL;
  if (sh == Py_None || (got = PyDict_GetItemWithError(w->f[W_SHAPES], sh)) != NULL || PyErr_Occurred()) goto out;
  if (!PyTuple_CheckExact(sh)) goto out;
  for (i = 0; i < PyTuple_Size(sh); i++)
    if (!PyLong_CheckExact(PyTuple_GetItem(sh, i))) goto out;
  if (PyDict_SetItem(w->f[W_SHAPES], sh, sh) == 0) got = sh;  /* the dict holds it */
out:
  Py_DECREF(sh);
  return got;
}

/* the row (a new reference to its 5-tuple) of an opaque BUFFER standing for u (typed, dtype dt), as the Python
   walk's _opaque_buffer makes it: arg (u, shape, device, name), name the arg's if u is a BUFFER whose arg is a
   paramarg. own: u is a BUFFER the walk converts itself (Python's _other: a paramarg with vmin_vmax is left to
   Python, which may make it a variable). dev: u's device if the caller has read it (borrowed), else NULL. Py_None
   (a new reference) if Python makes it, NULL with an exception set */
static PyObject *opaque_row(const pg_walk *w, PyObject *u, PyObject *op, PyObject *dt, int own, PyObject *dev) {
  PyObject *d, *sh, *name = Py_None, *arg, *row = NULL;
  int r;
  if (!(d = PyDict_GetItemWithError(w->f[W_DTI], dt)) || !(sh = canon_shape(w, u))) {
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
  }
  Py_INCREF(name);
  if (op == w->f[W_BUFFER]) {
    PyObject *a = pg_walk_attr(w, u, PG_A_ARG);
    if (!a || (r = PyObject_IsInstance(a, w->f[W_PARAMARG])) < 0) {
      Py_XDECREF(a);
      goto out;
    }
    if (r && own) {
      PyObject *vm = PyObject_GetAttr(a, pg_walk_s.vmin_vmax);
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
      name = PyObject_GetAttr(a, pg_walk_s.name);
    }
    Py_DECREF(a);
    if (!name) return NULL;
  }
  if (dev) Py_INCREF(dev);
  else if (!(dev = device_of(w, u))) goto out;
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

/* row ri and node u appended to puts (a flat list, row and node alternating: no pair tuple is made per node), for
   the way back's rev(); nothing if puts is None (a conversion nothing is converted back through). 0, or -1 with an
   exception set (puts as it was) */
int pg_walk_put_pair(const pg_walk *w, PyObject *ri, PyObject *u) {
  PyObject *puts = w->f[W_PUTS];
  Py_ssize_t n;
  if (puts == Py_None) return 0;
  n = PyList_Size(puts);
  if (PyList_Append(puts, ri) < 0) return -1;
  if (PyList_Append(puts, u) == 0) return 0;
  PyList_SetSlice(puts, n, n + 1, NULL);  /* the row alone dropped again (it only shrinks the list: cannot fail) */
  return -1;
}

/* the row of source s (borrowed from memo). A typed source with a device that the walk did not convert (it lies
   on no target path) gets an opaque BUFFER row, its memo entry, its row and node in puts and metadata, as the Python
   walk's _get makes them. NULL with no exception set if Python makes it, NULL with one set */
static PyObject *src_row(const pg_walk *w, PyObject *s) {
  PyObject *x = PyDict_GetItemWithError(w->f[W_MEMO], s), *sd, *op = NULL, *dev = NULL, *row = NULL, *ri;
  int r;
  if (x || PyErr_Occurred()) return x;
  if (!PyDict_GetItemWithError(w->f[W_LIVE], s)) return NULL;  /* not visited: Python walks it */
  if (!(sd = pg_walk_attr(w, s, PG_A_DTYPE))) return NULL;
  if ((r = PySet_Contains(w->f[W_WEAK], sd)) != 0) goto out;  /* a weak one is converted in its user's dtype */
  if (!(dev = device_of(w, s)) || dev == Py_None) goto out;  /* no device: converted node by node (_structural) */
  if (!(op = pg_walk_attr(w, s, PG_A_OP)) || !(row = opaque_row(w, s, op, sd, 0, dev)) || row == Py_None)
    goto out;
  if (!(ri = append(w, row))) {
    row = NULL;
    goto out;
  }
  row = NULL;  /* append took it */
  if (PyDict_SetItem(w->f[W_MEMO], s, ri) == 0 && pg_walk_put_pair(w, ri, s) == 0 && pg_walk_meta(w, s, ri, 1) == 0)
    x = PyDict_GetItemWithError(w->f[W_MEMO], s);
  Py_DECREF(ri);
out:
  Py_DECREF(sd);
  Py_XDECREF(dev);
  Py_XDECREF(op);
  Py_XDECREF(row);
  return x;
}

/* t, or the one object of its value in the shapes dict (borrowed: the dict holds it), as the Python walk's _canon
   gives it: a tuple of exact ints is entered there on first sight, so the builder interns one object per distinct
   broadcast shape, not one per node (each costs a lookup by value); anything else is left as it is (its equality may
   be Python code). NULL with an exception set */
static PyObject *canon_ints(const pg_walk *w, PyObject *t) {
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
static PyObject *bcast(const pg_walk *w, PyObject *x, PyObject *ss, PyObject *shape) {
  PyObject *xrow, *d, *src, *r, *pad, *s2, *c;
  Py_ssize_t k = PyTuple_Size(shape) - PyTuple_Size(ss), i;
  int eq;
  if (!(xrow = PyList_GetItem(w->f[W_ROWS], PyLong_AsSsize_t(x)))) return NULL;
  if (!PyTuple_Check(xrow) || PyTuple_Size(xrow) != 5) {
    pg_walk_bad("a row is no tuple of 5");
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
static PyObject *operand_want(const pg_walk *w, PyObject *op, PyObject *dt, PyObject *vs, int cmp) {
  PyObject *got;
  Py_ssize_t i, n = PyTuple_Size(vs);
  if (cmp || op == w->f[W_WHERE]) {
    for (i = op == w->f[W_WHERE] ? 1 : 0; i < n; i++) {
      PyObject *sd = pg_walk_attr(w, PyTuple_GetItem(vs, i), PG_A_DTYPE);
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
static PyObject *reduce_rows(const pg_walk *w, PyObject *u, PyObject *vs) {
  PyObject *a, *rop, *n, *sh, *x, *xrow, *rng = NULL, *key = NULL, *arg, *src = NULL, *ri = NULL, *row = NULL;
  long k, i;
  if (!(a = pg_walk_attr(w, u, PG_A_ARG))) return NULL;
  k = PyTuple_CheckExact(a) && PyTuple_Size(a) == 2 && PyLong_CheckExact(n = PyTuple_GetItem(a, 1))
      ? PyLong_AsLong(n) : -1;
  if (k == -1 && PyErr_Occurred()) PyErr_Clear();
  if (k < 1 || k > 64 || PyTuple_Size(vs) != 1 || !(sh = canon_shape(w, u))) goto out;
  if (!(x = src_row(w, PyTuple_GetItem(vs, 0)))) goto out;
  if (!PyLong_Check(x) || !(xrow = PyList_GetItem(w->f[W_ROWS], PyLong_AsSsize_t(x))) || !PyTuple_Check(xrow) ||
      PyTuple_Size(xrow) != 5) {
    pg_walk_bad("a source's row is no tuple of 5");
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

/* the row (a new reference to its 5-tuple) of u, an elementwise op (the row's op a) of typed dtype dt whose value
   sources vs are all converted or opaque, typed or weak, and of its shape or broadcast to it (the broadcasts' rows
   appended here). Py_None (a new reference) if Python makes it, NULL with an exception set */
static PyObject *alu_row(const pg_walk *w, PyObject *u, PyObject *op, PyObject *dt, PyObject *vs, PyObject *a) {
  PyObject *d, *srcs = NULL, *row = NULL, *shape = NULL, *want = NULL, *xs[3] = {NULL, NULL, NULL};
  PyObject *sss[3] = {NULL, NULL, NULL};
  Py_ssize_t i, n = PyTuple_Size(vs);
  int r, cmp;
  if (!(d = PyDict_GetItemWithError(w->f[W_DTI], dt)) || n < 1 || n > 3) goto none_or_fail;
  if ((cmp = PySet_Contains(w->f[W_CMP], op)) < 0) return NULL;
  if (cmp) d = w->r_bool;
  if (!(shape = cached_shape(w, u))) goto none_or_fail;
  for (i = 0; i < n; i++) {  /* every operand's row and shape first: nothing is appended unless all are known */
    PyObject *s = PyTuple_GetItem(vs, i), *sd, *x, *ss;
    if (!(sd = pg_walk_attr(w, s, PG_A_DTYPE))) goto out;
    r = PySet_Contains(w->f[W_WEAK], sd);
    Py_DECREF(sd);
    if (r < 0) goto out;
    if (r) {  /* a weak operand: converted already in the dtype it takes here, or Python converts it */
      PyObject *k;
      if (!want && !(want = operand_want(w, op, dt, vs, cmp))) goto out;
      if (!(k = PyTuple_Pack(2, s, want))) goto out;
      x = PyDict_GetItemWithError(w->f[W_MEMO], k);
      Py_DECREF(k);
    } else x = src_row(w, s);  /* converted, or an opaque BUFFER made now for a source off every target path */
    if (!x) goto out;
    Py_INCREF(x);
    xs[i] = x;
    if (!(ss = cached_shape(w, s))) goto out;
    if (ss != shape && ss != Py_None) {  /* a shape of its own: the same, () or a broadcast */
      if (!PyTuple_Check(ss) || !PyTuple_Check(shape) || PyTuple_Size(ss) > PyTuple_Size(shape)) {
        Py_DECREF(ss);
        goto out;
      }
      if (PyTuple_Size(ss) && (r = PyObject_RichCompareBool(ss, shape, Py_EQ)) != 1) {
        if (r < 0) {
          Py_DECREF(ss);
          goto out;
        }
        sss[i] = ss, ss = NULL;  /* a broadcast: kept */
      }
    }
    Py_XDECREF(ss);
  }
  if (!(srcs = PyTuple_New(n))) goto out;
  for (i = 0; i < n; i++) {
    PyObject *x = sss[i] ? bcast(w, xs[i], sss[i], shape) : (Py_INCREF(xs[i]), xs[i]);
    if (!x) goto out;
    PyTuple_SetItem(srcs, i, x);
  }
  row = PyTuple_Pack(5, a, d, srcs, Py_None, Py_None);
out:
  for (i = 0; i < n; i++) Py_XDECREF(xs[i]), Py_XDECREF(sss[i]);
  Py_XDECREF(shape);
  Py_XDECREF(srcs);
none_or_fail:
  if (row || PyErr_Occurred()) return row;
  Py_RETURN_NONE;
}

/* the row of u (an int, new reference) made inline, Py_None (new reference) if u is not a usual node (the Python
   callback makes it), NULL with an exception set */
PyObject *pg_walk_row(const pg_walk *w, PyObject *u, PyObject *op, PyObject *dt, PyObject *vs) {
  PyObject *a, *srcs = NULL, *row = NULL, *ri;
  int r;
  if ((a = PyDict_GetItemWithError(w->f[W_ALU], op)) != NULL) {
    if (!(row = alu_row(w, u, op, dt, vs, a))) return NULL;
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
      PyObject *ua = pg_walk_attr(w, u, PG_A_ARG);
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
    if (PyTuple_Size(vs) != 1 || !(ua = pg_walk_attr(w, u, PG_A_ARG))) goto none_or_fail;
    Py_DECREF(ua);
    if (ua != Py_None) goto none;  /* an arg: Python raises its ValueError */
    if (!(x = src_row(w, PyTuple_GetItem(vs, 0)))) goto none_or_fail;
    if (!PyLong_Check(x) || !(xrow = PyList_GetItem(w->f[W_ROWS], PyLong_AsSsize_t(x))) || !PyTuple_Check(xrow) ||
        PyTuple_Size(xrow) != 5) {
      pg_walk_bad("a source's row is no tuple of 5");
      return NULL;
    }
    if (!(srcs = PyTuple_Pack(1, x))) return NULL;
    row = PyTuple_Pack(5, a, PyTuple_GetItem(xrow, 1), srcs, Py_None, Py_None);
  } else if (PyErr_Occurred()) return NULL;
  else if (op == w->f[W_REDUCE]) {
    if (!(row = reduce_rows(w, u, vs))) return NULL;
  } else if (op == w->f[W_BUFFER]) {
    if (!(row = opaque_row(w, u, op, dt, 1, NULL))) return NULL;
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
