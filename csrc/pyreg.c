/* The C core's handle registry: node id -> its live Python handle, so a node has at most one handle (`is` is node
   identity). It replaces uop.py's dict of weak references (one weakref object with a callback per handle, ~120 ns
   a handle made and as much again when it died): each node id has a slot holding a borrowed pointer to its handle,
   in pages of ids beside the store's own pages; the handle's dealloc (pyhandle.c) empties the slot and hands its
   core reference to a queue of releases, dropped in batches of PG_REG_BATCH under one store lock (as
   pygrad/core/release.py does for the pure core: both cores free nodes, and so recycle ids, in the same order).

   Everything here runs with the GIL held and calls nothing that could run Python code between reading a slot and
   writing it, so the GIL is the registry's lock. The exceptions are allocations of handles (a collection may run
   finalizers and switch threads: the slot is read again after them) and the store's lock (taken with a trylock;
   while another thread holds it the GIL is released, and no slot is read across that wait).

   A slot may point at a handle whose reference count is already 0: a dying handle whose dealloc was deferred (the
   interpreter's trashcan defers deep chains of deallocs) or that a collection cleared. Such a handle is never
   returned (that would resurrect it); a new handle takes the slot and the dying one, when its dealloc runs,
   leaves the slot alone and only releases its own reference. A registry lives as long as the process: handles
   point at it and may outlive every module (the store it holds a user of is then never freed, as the C core never
   frees a store at exit). */
#include "pyapi.h"
#include "store_impl.h"

#define REG_PAGE_BITS 12
#define REG_PAGE (1u << REG_PAGE_BITS)

struct pg_reg {
  pg_store *st;
  PyObject *storecap;   /* the store's capsule: holds a user of the store */
  PyTypeObject *cls;    /* the handle class (a subclass of pyhandle.c's type) */
  PyObject **(*pages);  /* pages[id >> REG_PAGE_BITS][id & (REG_PAGE - 1)]: borrowed handle pointers, or NULL */
  uint32_t npages;
  int32_t *pend;        /* node references of dead handles, in the order they died */
  Py_ssize_t npend, pendcap;
};

pg_reg *pg_reg_new(PyObject *storecap, PyTypeObject *cls) {
  pg_store *st = pg_py_store_of(storecap);
  pg_reg *r;
  if (!st) return NULL;
  if (!(r = (pg_reg *)PyMem_Calloc(1, sizeof *r))) {
    PyErr_NoMemory();
    return NULL;
  }
  r->st = st;
  Py_INCREF(storecap);
  r->storecap = storecap;
  Py_INCREF(cls);
  r->cls = cls;
  return r;
}

/* the slot of id, or NULL if its page was never made */
static PyObject **slot_of(const pg_reg *r, int32_t id) {
  uint32_t p = (uint32_t)id >> REG_PAGE_BITS;
  if (id < 0 || p >= r->npages || !r->pages[p]) return NULL;
  return &r->pages[p][(uint32_t)id & (REG_PAGE - 1)];
}

/* the slot of id, its page made if needed; NULL with MemoryError set. Allocates with PyMem only: runs no Python */
static PyObject **slot_make(pg_reg *r, int32_t id) {
  uint32_t p = (uint32_t)id >> REG_PAGE_BITS;
  if (p >= r->npages) {
    uint32_t n = r->npages ? r->npages : 16, i;
    PyObject ***pages;
    while (n <= p) n *= 2;
    if (!(pages = (PyObject ***)PyMem_Realloc(r->pages, (size_t)n * sizeof *pages))) goto nomem;
    for (i = r->npages; i < n; i++) pages[i] = NULL;
    r->pages = pages, r->npages = n;
  }
  if (!r->pages[p] && !(r->pages[p] = (PyObject **)PyMem_Calloc(REG_PAGE, sizeof(PyObject *)))) goto nomem;
  return &r->pages[p][(uint32_t)id & (REG_PAGE - 1)];
nomem:
  PyErr_NoMemory();
  return NULL;
}

PyObject *pg_reg_live(const pg_reg *r, int32_t id) {
  PyObject **s = slot_of(r, id);
  return s && *s && Py_REFCNT(*s) > 0 ? *s : NULL;
}

/* drop the caller's reference on id now (the handle that was to own it exists already, or was not made) */
static void drop_now(pg_reg *r, int32_t id) {
  pg_py_lock_take(r->st);
  pg_store_decref_locked(r->st, id);
  pg_lock_drop(&r->st->lock);
}

PyObject *pg_reg_wrap(pg_reg *r, int32_t id, PyObject *op, PyObject *dtype, PyObject *arg, PyObject *tag,
                      PyObject *shape, PyObject *device, PyObject *meta) {
  PyObject *o = pg_reg_live(r, id), *pyid, **s;
  pg_handle *h;
  if (o) goto existing;
  if (!(pyid = PyLong_FromLong(id))) goto fail;
  h = (pg_handle *)pg_py_handle_new(r->cls, pyid, op, dtype, arg, tag, shape, device, meta);
  Py_DECREF(pyid);
  if (!h) goto fail;
  /* the allocations may have run a collection, and through it other threads: look again */
  if ((o = pg_reg_live(r, id))) {
    Py_DECREF(h);  /* it owns no reference yet (reg NULL): its dealloc releases nothing */
    goto existing;
  }
  if (!(s = slot_make(r, id))) {
    Py_DECREF(h);
    goto fail;
  }
  *s = (PyObject *)h;  /* over a dying handle's pointer, if any: see the file comment */
  h->reg = r, h->nid = id;
  return (PyObject *)h;
existing:
  Py_INCREF(o);
  drop_now(r, id);
  return o;
fail:
  drop_now(r, id);
  return NULL;
}

void pg_reg_unlink(pg_handle *h) {
  PyObject **s;
  if (h->reg && (s = slot_of(h->reg, h->nid)) && *s == (PyObject *)h) *s = NULL;
}

/* drop the queued references (in the order their handles died) with the store's lock held */
static void drain_locked(pg_reg *r) {
  Py_ssize_t i;
  for (i = 0; i < r->npend; i++) pg_store_decref_locked(r->st, r->pend[i]);  /* cannot fail: each was owned */
  r->npend = 0;
}

void pg_reg_release(pg_handle *h) {
  pg_reg *r = h->reg;
  if (!r) return;
  h->reg = NULL;
  if (r->npend == r->pendcap) {
    Py_ssize_t cap = r->pendcap ? 2 * r->pendcap : PG_REG_BATCH;
    int32_t *p = (int32_t *)PyMem_Realloc(r->pend, (size_t)cap * sizeof *p);
    if (!p) {  /* no room to queue it: drop the queue and this reference now, waiting for the lock if need be */
      pg_py_lock_take(r->st);
      drain_locked(r);
      pg_store_decref_locked(r->st, h->nid);
      pg_lock_drop(&r->st->lock);
      return;
    }
    r->pend = p, r->pendcap = cap;
  }
  r->pend[r->npend++] = h->nid;
  /* a full batch is dropped if the lock is free; else it waits for the next death or flush (no wait in a dealloc) */
  if (r->npend >= PG_REG_BATCH && pg_lock_try(&r->st->lock)) {
    drain_locked(r);
    pg_lock_drop(&r->st->lock);
  }
}

void pg_reg_flush(pg_reg *r) {
  int32_t *ids;
  Py_ssize_t n, i;
  if (!r->npend) return;
  /* taken out of the registry first: waiting for the lock releases the GIL, and other handles may die meanwhile */
  ids = r->pend, n = r->npend;
  r->pend = NULL, r->npend = 0, r->pendcap = 0;
  pg_py_lock_take(r->st);
  for (i = 0; i < n; i++) pg_store_decref_locked(r->st, ids[i]);
  pg_lock_drop(&r->st->lock);
  if (!r->pend) r->pend = ids, r->pendcap = n;  /* (n <= its capacity) */
  else PyMem_Free(ids);
}

/* ---- the registry's calls for uop.py, bound to a capsule of it ---- */

#define REG_CAPSULE "pygrad.handles"

static pg_reg *reg_of(PyObject *cap) { return (pg_reg *)PyCapsule_GetPointer(cap, REG_CAPSULE); }

/* v as a node id, or -1 with an exception set (a negative int is no node's: -2 without an exception) */
static int32_t read_id(PyObject *v) {
  long x = PyLong_AsLong(v);
  if (x == -1 && PyErr_Occurred()) return -1;
  if (x < 0 || x > INT32_MAX) return -2;
  return (int32_t)x;
}

/* wrap(id, op, dtype, arg, tag, shape, device, meta): the unique handle of node id, taking over a reference the
   caller holds on it (dropped if a handle exists already); ValueError if id names no live node */
static PyObject *reg_wrap(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  pg_reg *r = reg_of(self);
  int32_t id;
  int live;
  if (!r) return NULL;
  if (nargs != 8) return PyErr_Format(PyExc_TypeError, "pygrad C core: wrap takes 8 arguments");
  if ((id = read_id(args[0])) == -1) return NULL;
  pg_py_lock_take(r->st);
  live = id >= 0 && pg_node_live(r->st, id) != NULL;
  pg_lock_drop(&r->st->lock);
  if (!live) return PyErr_Format(PyExc_ValueError, "pygrad C core: wrap: no live node %R", args[0]);
  return pg_reg_wrap(r, id, args[1], args[2], args[3], args[4], args[5], args[6], args[7]);
}

/* the int32 column k of wrap_many's arguments (bytes of n int32s), or NULL with an exception set */
static const int32_t *int32_col(PyObject *b, Py_ssize_t n, const char *what) {
  char *p;
  Py_ssize_t len;
  if (!PyBytes_Check(b) || PyBytes_AsStringAndSize(b, &p, &len) < 0 || len != 4 * n) {
    if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "pygrad C core: wrap_many: %s must be bytes of %zd int32s",
                                        what, n);
    return NULL;
  }
  return (const int32_t *)(void *)p;
}

/* item i of table t (a tuple, list or dict, as what names), borrowed; NULL with an exception set if it has none */
static PyObject *table_item(PyObject *t, int32_t i, const char *what) {
  PyObject *o = NULL, *key;
  if (PyTuple_Check(t)) o = i >= 0 && i < PyTuple_Size(t) ? PyTuple_GetItem(t, i) : NULL;
  else if (PyList_Check(t)) o = i >= 0 && i < PyList_Size(t) ? PyList_GetItem(t, i) : NULL;
  else if (PyDict_Check(t) && (key = PyLong_FromLong(i)) != NULL) {
    o = PyDict_GetItemWithError(t, key);
    Py_DECREF(key);
    if (!o && PyErr_Occurred()) return NULL;
  } else if (!PyErr_Occurred()) PyErr_Format(PyExc_TypeError, "pygrad C core: wrap_many: %s is no table", what);
  if (!o && !PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "pygrad C core: wrap_many: no %s %d", what, (int)i);
  return o;
}

/* wrap_many(ids, metas, ops, dtypes, args, tags, optab, dttab, argobjs, metavals): [wrap(ids[k], optab[ops[k]],
   dttab[dtypes[k]], argobjs[args[k]], argobjs[tags[k]] or None, *metavals[metas[k]], metas[k]) for each k], the six
   columns bytes of int32s: a loader's roots in one call (through uop.py's wrap, ~0.5 us a root; a graph may have
   tens of thousands). Takes over a reference the caller holds on every id, also on failure (then each is dropped),
   unless an argument is bad (checked first: then nothing is taken over) */
static PyObject *reg_wrap_many(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  pg_reg *r = reg_of(self);
  const int32_t *col[6];
  const char *names[6] = {"ids", "metas", "ops", "dtypes", "args", "tags"};
  PyObject *out = NULL;
  Py_ssize_t n, k, done = 0;
  int i, live = 1;
  if (!r) return NULL;
  if (nargs != 10) return PyErr_Format(PyExc_TypeError, "pygrad C core: wrap_many takes 10 arguments");
  if (!PyBytes_Check(args[0])) return PyErr_Format(PyExc_TypeError, "pygrad C core: wrap_many: ids must be bytes");
  n = PyBytes_Size(args[0]) / 4;
  for (i = 0; i < 6; i++)
    if (!(col[i] = int32_col(args[i], n, names[i]))) return NULL;  /* (no reference taken over yet: ids unread) */
  pg_py_lock_take(r->st);
  for (k = 0; k < n && live; k++) live = pg_node_live(r->st, col[0][k]) != NULL;
  pg_lock_drop(&r->st->lock);
  if (!live) return PyErr_Format(PyExc_ValueError, "pygrad C core: wrap_many: no live node %d", (int)col[0][k - 1]);
  if (!(out = PyList_New(n))) goto fail;
  for (; done < n; done++) {
    PyObject *op, *dt, *arg, *tag = Py_None, *mv, *meta, *h;
    if (!(op = table_item(args[6], col[2][done], "op")) || !(dt = table_item(args[7], col[3][done], "dtype")) ||
        !(arg = table_item(args[8], col[4][done], "arg")) ||
        (col[5][done] && !(tag = table_item(args[8], col[5][done], "tag"))) ||
        !(mv = table_item(args[9], col[1][done], "meta")))
      goto fail;
    if (!PyTuple_Check(mv) || PyTuple_Size(mv) != 2) {
      PyErr_Format(PyExc_TypeError, "pygrad C core: wrap_many: meta %d is no (shape, device) pair", (int)col[1][done]);
      goto fail;
    }
    Py_INCREF(op), Py_INCREF(dt), Py_INCREF(arg), Py_INCREF(tag), Py_INCREF(mv);  /* wrap may run a collection */
    h = (meta = PyLong_FromLong(col[1][done])) != NULL ?
      pg_reg_wrap(r, col[0][done], op, dt, arg, tag, PyTuple_GetItem(mv, 0), PyTuple_GetItem(mv, 1), meta) : NULL;
    Py_XDECREF(meta);
    Py_DECREF(op), Py_DECREF(dt), Py_DECREF(arg), Py_DECREF(tag), Py_DECREF(mv);
    if (!meta) goto fail;
    if (!h) {  /* pg_reg_wrap dropped this one's reference */
      done++;
      goto fail;
    }
    PyList_SetItem(out, done, h);  /* steals h */
  }
  return out;
fail:
  Py_XDECREF(out);  /* the handles made so far own their references */
  if (done < n) {
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    pg_py_lock_take(r->st);
    for (k = done; k < n; k++) pg_store_decref_locked(r->st, col[0][k]);
    pg_lock_drop(&r->st->lock);
    PyErr_Restore(et, ev, tb);
  }
  return NULL;
}

/* lookup(id): the live handle of node id, or None */
static PyObject *reg_lookup(PyObject *self, PyObject *v) {
  pg_reg *r = reg_of(self);
  PyObject *o;
  int32_t id;
  if (!r) return NULL;
  if ((id = read_id(v)) == -1) return NULL;
  o = id >= 0 ? pg_reg_live(r, id) : NULL;
  if (!o) o = Py_None;
  Py_INCREF(o);
  return o;
}

/* flush(): drop the references of every dead handle now */
static PyObject *reg_flush(PyObject *self, PyObject *unused) {
  pg_reg *r = reg_of(self);
  (void)unused;
  if (!r) return NULL;
  pg_reg_flush(r);
  Py_RETURN_NONE;
}

static PyMethodDef reg_defs[] = {
  {"wrap", (PyCFunction)(void (*)(void))reg_wrap, METH_FASTCALL,
   "wrap(id, op, dtype, arg, tag, shape, device, meta): the handle of node id, taking over a reference on it"},
  {"lookup", reg_lookup, METH_O, "lookup(id): the live handle of node id, or None"},
  {"flush", reg_flush, METH_NOARGS, "flush(): drop the core references of the handles that died"},
  {"wrap_many", (PyCFunction)(void (*)(void))reg_wrap_many, METH_FASTCALL,
   "wrap_many(ids, metas, ops, dtypes, args, tags, optab, dttab, argobjs, metavals): the handles of many nodes"},
};
#define NREG ((int)(sizeof reg_defs / sizeof reg_defs[0]))

PyObject *pg_reg_capsule(pg_reg *r) { return PyCapsule_New(r, REG_CAPSULE, NULL); }  /* never freed: see above */

pg_reg *pg_reg_from(PyObject *cap) { return reg_of(cap); }

pg_store *pg_reg_store(const pg_reg *r) { return r->st; }

PyObject *pg_reg_calls(PyObject *cap) {
  PyObject *t = PyTuple_New(NREG);
  int i;
  for (i = 0; t && i < NREG; i++) {
    PyObject *f = PyCFunction_NewEx(&reg_defs[i], cap, NULL);
    if (!f) Py_CLEAR(t);
    else PyTuple_SetItem(t, i, f);  /* steals f */
  }
  return t;
}
