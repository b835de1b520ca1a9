/* The pygrad -> tinygrad loop (csrc/pyforeign.c): the rows made by a plan the caller gives (pygrad/interop/
   tinygrad_out.py's _row_plans): a reduce made as a permute and a reduce of the node, a permute of a node held
   reduced, any other permute or flip, an expand, and the helper rows made only when a user asks for them (a
   broadcast, a reshape left to be made on demand, a row held reduced seen at its users' shape), as the Python
   loop's _reduce, _permuted, _expand and _lazy make them. */
#include "pyforeign.h"

/* x, or op applied to x if arg is not None (x's reference passed on: a new reference, or NULL with an exception
   set) */
static PyObject *maybe(const cfg_t *c, PyObject *op, PyObject *x, PyObject *arg, int *fresh) {
  PyObject *t;
  if (arg == Py_None) return x;
  t = pg_foreign_moved(c, op, x, NULL, arg, fresh);
  Py_DECREF(x);
  return t;
}

/* the first row from source row j down its chain of reshapes left to be made on demand (untagged RESHAPE rows, op
   number reshape, not made yet), as the Python loop's _reshaped skips them; -1 with an exception set. The chain
   is followed at most once a row (a table's sources come before their users: a longer one is a bad table) */
static long unfold(const cfg_t *c, long j, long reshape) {
  long o, tg, a, b;
  Py_ssize_t steps;
  PyObject *cur;
  for (steps = 0; steps <= c->n; steps++) {
    if (j < 0 || j >= c->n) {
      PyErr_SetString(PyExc_IndexError, "pygrad C core: foreign rows: a source row out of range");
      return -1;
    }
    if (pg_foreign_col(&c->op, j, &o) < 0 || pg_foreign_col(&c->tag, j, &tg) < 0) return -1;
    if (o != reshape || tg) return j;
    if (!(cur = PyList_GetItem(c->out, j))) return -1;
    if (cur != Py_None) return j;
    if (pg_foreign_col(&c->start, j, &a) < 0 || pg_foreign_col(&c->start, j + 1, &b) < 0) return -1;
    if (a < 0 || b != a + 1 || b > c->src.n) return pg_foreign_bad("a reshape row has one source in the column");
    if (pg_foreign_col(&c->src, a, &j) < 0) return -1;
  }
  return pg_foreign_bad("a reshape chain longer than the table");
}

/* the held node got[0] (got: a held row's (node, its shape, the shape wanted, axes), checked) reshaped to shape
   unless got[1] is that shape already (reshape: the foreign RESHAPE, sarg: shape's operand node), as the Python
   loop's _reshaped makes it: a new reference, or NULL with an exception set */
static PyObject *held_as(const cfg_t *c, PyObject *got, PyObject *shape, PyObject *reshape, PyObject *sarg) {
  PyObject *x = PyTuple_GetItem(got, 0);
  int eq = PyObject_RichCompareBool(PyTuple_GetItem(got, 1), shape, Py_EQ), fresh;
  if (eq < 0) return NULL;
  if (eq) {
    Py_INCREF(x);
    return x;
  }
  return pg_foreign_moved(c, reshape, x, sarg, Py_None, &fresh);
}

/* row j, an untagged RESHAPE left to be made on demand (plan (5, shid, reshape, shape, treshape, sarg): shid a
   column of int32 shape ids a row, reshape pygrad's RESHAPE op number, shape the row's shape, treshape the foreign
   RESHAPE, sarg the shape's operand node), made as the Python loop's _reshaped makes it with reshapes folded: the
   first row r below the chain of such rows (unfold), its held node (held_as) if it is held reduced, else its node
   as it is if its shape id is row j's, else reshaped. A new reference, NULL with no exception set if Python makes
   it, NULL with one set */
static PyObject *folded(const cfg_t *c, long j, PyObject *plan, int depth) {
  col_t shid;
  long reshape, r, sr, sj;
  PyObject *k, *got, *x, *t;
  int fresh;
  if (PyTuple_Size(plan) != 6) return pg_foreign_bad_obj("a reshape plan must be a tuple of 6");
  if (pg_foreign_read_col(PyTuple_GetItem(plan, 1), 0, &shid) < 0) return NULL;
  if (shid.n != c->n) return pg_foreign_bad_obj("a reshape plan's shape ids must be one a row");
  reshape = PyLong_AsLong(PyTuple_GetItem(plan, 2));
  if (reshape == -1 && PyErr_Occurred()) return NULL;
  if ((r = unfold(c, j, reshape)) < 0) return NULL;
  if (!(k = PyLong_FromLong(r))) return NULL;
  got = PyDict_GetItemWithError(c->reduced, k);
  Py_DECREF(k);
  if (!got && PyErr_Occurred()) return NULL;
  if (got) {
    if (!PyTuple_Check(got) || PyTuple_Size(got) != 4) return pg_foreign_bad_obj("a held row must be a tuple of 4");
    return held_as(c, got, PyTuple_GetItem(plan, 3), PyTuple_GetItem(plan, 4), PyTuple_GetItem(plan, 5));
  }
  if (pg_foreign_col(&shid, r, &sr) < 0 || pg_foreign_col(&shid, j, &sj) < 0) return NULL;
  if (!(x = pg_foreign_source_at(c, r, depth))) return NULL;
  if (sr == sj) return x;
  t = pg_foreign_moved(c, PyTuple_GetItem(plan, 4), x, PyTuple_GetItem(plan, 5), Py_None, &fresh);
  Py_DECREF(x);
  return t;
}

/* helper row j (not made yet) made now by its plan, as the Python loop's _lazy makes it, and kept in out: a row
   held reduced, reshaped to the shape its users see (its plan of kind 1 or 2 ends with the foreign RESHAPE and that
   shape's operand node, for the held shape it names); (4,): a broadcast, its source's node; (5, ...): a reshape made
   on demand (folded). A new reference, NULL with no exception set if Python makes it (another plan, none, or a held
   shape its plan does not name), NULL with one set */
PyObject *pg_foreign_lazy(const cfg_t *c, long j, int depth) {
  PyObject *plan = PyList_GetItem(c->plans, j), *k, *got, *t;
  Py_ssize_t len;
  long kind, a, b, x;
  int eq;
  if (!plan) return NULL;
  if (!(k = PyLong_FromLong(j))) return NULL;
  got = PyDict_GetItemWithError(c->reduced, k);
  Py_DECREF(k);
  if (!got && PyErr_Occurred()) return NULL;
  if (plan == Py_None) return NULL;
  if (!PyTuple_Check(plan) || (len = PyTuple_Size(plan)) < 1)
    return pg_foreign_bad_obj("a plan must be a non-empty tuple");
  kind = PyLong_AsLong(PyTuple_GetItem(plan, 0));
  if (kind == -1 && PyErr_Occurred()) return NULL;
  if (got) {
    if (!PyTuple_Check(got) || PyTuple_Size(got) != 4) return pg_foreign_bad_obj("a held row must be a tuple of 4");
    if (!(kind == 1 && len == 10) && !(kind == 2 && len == 8)) return NULL;  /* Python's _lazy */
    eq = PyObject_RichCompareBool(PyTuple_GetItem(got, 2), PyTuple_GetItem(plan, kind == 1 ? 6 : 4), Py_EQ);
    if (eq <= 0) return NULL;  /* an error, or another shape: Python's _lazy */
    t = held_as(c, got, PyTuple_GetItem(got, 2), PyTuple_GetItem(plan, len - 2), PyTuple_GetItem(plan, len - 1));
  } else if (kind == 4) {
    if (len != 1) return pg_foreign_bad_obj("a broadcast plan must be a tuple of 1");
    if (pg_foreign_col(&c->start, j, &a) < 0 || pg_foreign_col(&c->start, j + 1, &b) < 0) return NULL;
    if (a < 0 || b <= a || b > c->src.n) return pg_foreign_bad_obj("a broadcast row has a source in the column");
    if (pg_foreign_col(&c->src, a, &x) < 0) return NULL;
    t = pg_foreign_source_at(c, x, depth);
  } else if (kind == 5) t = folded(c, j, plan, depth);
  else return NULL;
  if (!t) return NULL;
  Py_INCREF(t);
  if (PyList_SetItem(c->out, j, t) < 0) {  /* steals one reference */
    Py_DECREF(t);
    return NULL;
  }
  return t;
}

/* row i, an untagged EXPAND, made by its plan (3, shid, reshape, kept_sid, kept, treshape, kept_arg, texpand,
   grown_arg, tpermute, perm) as the Python loop's _expand makes it with reshapes folded: the node of the first row
   r below its source's chain of reshapes made on demand (unfold; its held node if r is held reduced) reshaped to
   the shape without the grown axes (kept; shape operand kept_arg) unless it has that shape already (the held
   shape, or r's shape id in shid, a column of int32 shape ids a row, against kept_sid), expanded by the grown axes
   put in front (grown_arg), and permuted back by perm unless it is None. Metadata as one_row sets it, on the last
   node. 1: made, 0: left to Python, -1 with an exception set */
static int expand_row(const cfg_t *c, Py_ssize_t i, PyObject *plan) {
  col_t shid;
  long a, b, j, reshape, want, sid;
  PyObject *k, *got, *x, *t, *perm;
  int fresh = 0, eq, r;
  if (PyTuple_Size(plan) != 11) return pg_foreign_bad("an expand plan must be a tuple of 11");
  if (pg_foreign_read_col(PyTuple_GetItem(plan, 1), 0, &shid) < 0) return -1;
  if (shid.n != c->n) return pg_foreign_bad("an expand plan's shape ids must be one a row");
  reshape = PyLong_AsLong(PyTuple_GetItem(plan, 2));
  if (reshape == -1 && PyErr_Occurred()) return -1;
  want = PyLong_AsLong(PyTuple_GetItem(plan, 3));
  if (want == -1 && PyErr_Occurred()) return -1;
  if (pg_foreign_col(&c->start, i, &a) < 0 || pg_foreign_col(&c->start, i + 1, &b) < 0) return -1;
  if (a < 0 || b != a + 1 || b > c->src.n) return pg_foreign_bad("a planned row has one source in the column");
  if (pg_foreign_col(&c->src, a, &j) < 0 || (j = unfold(c, j, reshape)) < 0) return -1;
  if (!(k = PyLong_FromLong(j))) return -1;
  got = PyDict_GetItemWithError(c->reduced, k);
  Py_DECREF(k);
  if (!got && PyErr_Occurred()) return -1;
  if (got) {
    if (!PyTuple_Check(got) || PyTuple_Size(got) != 4) return pg_foreign_bad("a held row must be a tuple of 4");
    x = PyTuple_GetItem(got, 0);
    Py_INCREF(x);
    if ((eq = PyObject_RichCompareBool(PyTuple_GetItem(got, 1), PyTuple_GetItem(plan, 4), Py_EQ)) < 0) {
      Py_DECREF(x);
      return -1;
    }
  } else {
    if (!(x = pg_foreign_source(c, j))) return PyErr_Occurred() ? -1 : 0;
    if (pg_foreign_col(&shid, j, &sid) < 0) {
      Py_DECREF(x);
      return -1;
    }
    eq = sid == want;
  }
  if (!eq) {
    t = pg_foreign_moved(c, PyTuple_GetItem(plan, 5), x, PyTuple_GetItem(plan, 6), Py_None, &fresh);
    Py_DECREF(x);
    if (!(x = t)) return -1;
  }
  t = pg_foreign_moved(c, PyTuple_GetItem(plan, 7), x, PyTuple_GetItem(plan, 8), Py_None, &fresh);
  Py_DECREF(x);
  if (!t) return -1;
  if ((perm = PyTuple_GetItem(plan, 10)) != Py_None) {
    x = pg_foreign_moved(c, PyTuple_GetItem(plan, 9), t, NULL, perm, &fresh);
    Py_DECREF(t);
    if (!(t = x)) return -1;
  }
  if ((r = pg_foreign_set_md(c, i, t, fresh)) < 0) {
    Py_DECREF(t);
    return -1;
  }
  if (PyList_SetItem(c->out, i, t) < 0) return -1;  /* steals t */
  return r ? 1 : 0;
}

/* row i (one source) made by its plan, a tuple as the caller's _row_plans makes it:
   (0, op, arg): the node op(x) of the source's node x (arg not None); the source must not be held reduced.
   (1, permute, perm, reduce, rarg, kept, keep, axes, reshape, keep_arg): x permuted by perm (if not None) and
   reduced by rarg (if not None; perm is None when rarg is) is held for row i as (node, kept, keep, axes) in reduced,
   out[i] left empty (a user's reshape of it to keep, the foreign reshape to keep's operand node keep_arg, is made
   only when asked for: lazy_row).
   (2, permute, perm, kept, shape, gone, reshape, shape_arg): the source's held node permuted by perm (if not None)
   is held for row i as (node, kept, shape, gone); the source must be held.
   (3, ...): an expand (expand_row). (4,), (5, ...): a helper row (lazy_row), no metadata set (as the Python loop
   makes a root that is a helper row).
   Metadata as one_row sets it, on the row's last node. 1: made, 0: left to Python, -1 with an exception set */
int pg_foreign_plan_row(const cfg_t *c, Py_ssize_t i, PyObject *plan) {
  long kind, a, b, j;
  Py_ssize_t len;
  PyObject *k, *got, *x, *t, *ent;
  int fresh = 0, r;
  if (!PyTuple_Check(plan) || (len = PyTuple_Size(plan)) < 3)
    return pg_foreign_bad("a plan must be a tuple of 3 or more");
  kind = PyLong_AsLong(PyTuple_GetItem(plan, 0));
  if (kind == -1 && PyErr_Occurred()) return -1;
  if (kind == 3) return expand_row(c, i, plan);
  if (kind == 4 || kind == 5) {  /* a helper row asked for on its own (a root): made as a user's source is */
    if (!(t = pg_foreign_lazy(c, (long)i, 0))) return PyErr_Occurred() ? -1 : 0;
    Py_DECREF(t);
    return 1;
  }
  if (!(kind == 0 && len == 3 && PyTuple_GetItem(plan, 2) != Py_None) && !(kind == 1 && len == 10) &&
      !(kind == 2 && len == 8))
    return pg_foreign_bad("a plan's kind and length do not match");
  if (pg_foreign_col(&c->start, i, &a) < 0 || pg_foreign_col(&c->start, i + 1, &b) < 0) return -1;
  if (a < 0 || b != a + 1 || b > c->src.n) return pg_foreign_bad("a planned row has one source in the column");
  if (pg_foreign_col(&c->src, a, &j) < 0) return -1;
  if (!(k = PyLong_FromLong(j))) return -1;
  got = PyDict_GetItemWithError(c->reduced, k);
  Py_DECREF(k);
  if (!got && PyErr_Occurred()) return -1;
  if (kind == 2) {
    if (!got) return 0;  /* not held: Python makes it */
    if (!PyTuple_Check(got) || PyTuple_Size(got) != 4) return pg_foreign_bad("a held row must be a tuple of 4");
    x = PyTuple_GetItem(got, 0);
    Py_INCREF(x);
  } else {
    if (kind == 0 && got) return 0;  /* a permute of a held row (Python's _permuted) */
    if (!(x = pg_foreign_source(c, j))) return PyErr_Occurred() ? -1 : 0;
  }
  t = maybe(c, PyTuple_GetItem(plan, 1), x, PyTuple_GetItem(plan, 2), &fresh);  /* kind 0: arg is never None */
  if (kind == 1 && t) t = maybe(c, PyTuple_GetItem(plan, 3), t, PyTuple_GetItem(plan, 4), &fresh);
  if (!t) return -1;
  if (kind != 0) {
    ent = kind == 1 ? PyTuple_Pack(4, t, PyTuple_GetItem(plan, 5), PyTuple_GetItem(plan, 6), PyTuple_GetItem(plan, 7))
                    : PyTuple_Pack(4, t, PyTuple_GetItem(plan, 3), PyTuple_GetItem(plan, 4), PyTuple_GetItem(plan, 5));
    k = ent ? PyLong_FromSsize_t(i) : NULL;
    r = k ? PyDict_SetItem(c->reduced, k, ent) : -1;
    Py_XDECREF(k);
    Py_XDECREF(ent);
    if (r < 0) {
      Py_DECREF(t);
      return -1;
    }
  }
  if ((r = pg_foreign_set_md(c, i, t, fresh)) < 0 || kind != 0) {
    Py_DECREF(t);
    return r < 0 ? -1 : r ? 1 : 0;
  }
  if (PyList_SetItem(c->out, i, t) < 0) return -1;  /* steals t */
  return r ? 1 : 0;
}
