/* The metadata step of the tinygrad -> pygrad walk (pywalk.c): a node's tinygrad metadata onto its row, as the
   Python walk's _meta puts it. tinygrad keeps metadata in a WeakKeyDictionary (a dict keyed by weak references to
   nodes); the walk looks a node up there with a probe, an object that hashes as the node does and equals a weak
   reference to it, rather than a new weak reference per node (whose equality calls the node class's Python-level
   __eq__ lookup, ~1,000 instructions a key). The pygrad form of the usual one-element tuple comes from two caches. */
#include "pywalk.h"
#include <stdint.h>
#include <stdlib.h>

/* the probe: its node (borrowed, set only for one lookup; compared by address, never read) and that node's hash */
typedef struct {
  PyObject_HEAD
  PyObject *target;
  Py_hash_t hash;
} probe_t;

#define MDC_N 256  /* Metadata objects by address */
#define MDN_N 64   /* (name, backward) pairs by their objects' addresses */

/* tinygrad makes one Metadata per Tensor method call, shared by the nodes that call makes (usually consecutive):
   the first cache maps the object to its pygrad metadata, the second its (name, backward) objects (shared by every
   call of one method) to the same, so a new Metadata of a known method costs two reads, not a tuple and a lookup
   by value. Each entry holds strong references to its keys and value until it is replaced or the walk ends: an
   address a cache holds cannot be freed and reused meanwhile, so a hit is always the same object */
struct pg_walk_md {
  PyObject *probe;                        /* owned */
  PyObject *key[MDC_N], *val[MDC_N];      /* owned; NULL: empty */
  PyObject *nm[MDN_N], *bw[MDN_N], *nv[MDN_N];
};

static PyTypeObject *probe_type;

/* the probe's hash: its node's */
static Py_hash_t probe_hash(PyObject *self) { return ((const probe_t *)self)->hash; }

/* probe == o: o is a weak reference (exactly tinygrad's kind: a subclass may call Python code) to the probe's node.
   A dict compares a stored weak reference with the probe as weakref == probe, which weakref leaves to the probe */
static PyObject *probe_cmp(PyObject *self, PyObject *o, int op) {
  PyObject *x;
  int same = 0;
  if (op != Py_EQ && op != Py_NE) Py_RETURN_NOTIMPLEMENTED;
  if (PyWeakref_CheckRefExact(o)) {
    if (!(x = PyObject_CallNoArgs(o))) return NULL;  /* the referent, or None if it is gone */
    same = x == ((const probe_t *)self)->target;
    Py_DECREF(x);
  }
  return PyBool_FromLong(op == Py_EQ ? same : !same);
}

static PyType_Slot probe_slots[] = {
  {Py_tp_hash, (void *)probe_hash},
  {Py_tp_richcompare, (void *)probe_cmp},
  {Py_tp_doc, (void *)"pygrad's lookup key for a node's entry in a dict keyed by weak references."},
  {0, NULL},
};
static PyType_Spec probe_spec = {"pygrad._core.WeakProbe", sizeof(probe_t), 0, Py_TPFLAGS_DEFAULT, probe_slots};

/* the walk's metadata state (w->md): the probe and empty caches. 0, or -1 with an exception set */
int pg_walk_meta_new(pg_walk *w) {
  pg_walk_md *c;
  allocfunc alloc;
  if (!probe_type && !(probe_type = (PyTypeObject *)PyType_FromSpec(&probe_spec))) return -1;
  if (!(c = calloc(1, sizeof *c))) {
    PyErr_NoMemory();
    return -1;
  }
  alloc = (allocfunc)PyType_GetSlot(probe_type, Py_tp_alloc);
  if (!alloc || !(c->probe = alloc(probe_type, 0))) {
    free(c);
    if (!PyErr_Occurred()) PyErr_NoMemory();
    return -1;
  }
  w->md = c;
  return 0;
}

/* the state's references dropped and its memory freed */
void pg_walk_meta_free(pg_walk *w) {
  pg_walk_md *c = w->md;
  size_t j;
  if (!c) return;
  for (j = 0; j < MDC_N; j++) Py_XDECREF(c->key[j]), Py_XDECREF(c->val[j]);
  for (j = 0; j < MDN_N; j++) Py_XDECREF(c->nm[j]), Py_XDECREF(c->bw[j]), Py_XDECREF(c->nv[j]);
  Py_XDECREF(c->probe);
  free(c);
  w->md = NULL;
}

/* a cache slot of address p among n (a power of 2): its bits above the allocator's alignment */
static size_t slot_of(const void *p, size_t n) {
  uintptr_t a = (uintptr_t)p;
  return (size_t)((a >> 4) ^ (a >> 12)) & (n - 1);
}

/* old replaced by v (a new reference taken) in a cache's slot */
static void put(PyObject **slot, PyObject *v) {
  Py_INCREF(v);
  Py_XDECREF(*slot);
  *slot = v;
}

/* the pygrad metadata (borrowed: a cache holds it) of the one-element tuple (m0,): the caches, else md1's entry for
   its (name, backward). NULL with no exception set if md1 has none (the callback makes it), NULL with one set */
static PyObject *md1_of(const pg_walk *w, PyObject *m0) {
  pg_walk_md *c = w->md;
  size_t k = slot_of(m0, MDC_N), j;
  PyObject *nm, *bw, *key, *m = NULL;
  if (c->key[k] == m0) return c->val[k];
  if (!(nm = PyObject_GetAttr(m0, pg_walk_s.name))) return NULL;
  if (!(bw = PyObject_GetAttr(m0, pg_walk_s.backward))) {
    Py_DECREF(nm);
    return NULL;
  }
  j = (slot_of(nm, MDN_N) + 7 * slot_of(bw, MDN_N)) & (MDN_N - 1);
  if (c->nm[j] == nm && c->bw[j] == bw) m = c->nv[j];
  else if ((key = PyTuple_Pack(2, nm, bw)) != NULL) {
    m = PyDict_GetItemWithError(w->f[W_MD1], key);
    Py_DECREF(key);
    if (m) put(&c->nm[j], nm), put(&c->bw[j], bw), put(&c->nv[j], m);
  }
  Py_DECREF(nm);
  Py_DECREF(bw);
  if (m) put(&c->key[k], m0), put(&c->val[k], m);
  return m;
}

/* u's tinygrad metadata tuple (a borrowed reference from the metadata dict), NULL with no exception set if it has
   none, NULL with one set */
static PyObject *lookup(const pg_walk *w, PyObject *u) {
  probe_t *p = (probe_t *)w->md->probe;
  PyObject *md;
  Py_hash_t h = PyObject_Hash(u);
  if (h == -1) {
    PyErr_Clear();  /* unhashable: no dict holds it */
    return NULL;
  }
  p->target = u, p->hash = h;
  md = PyDict_GetItemWithError(w->f[W_MDATA], w->md->probe);
  p->target = NULL;
  return md;
}

/* u's metadata onto row ri, as the Python walk does: the usual 1-tuple whose pygrad form is known, onto a row with
   none yet, here; anything else through the callback. 0, or -1 with an exception set */
int pg_walk_meta(const pg_walk *w, PyObject *u, PyObject *ri, int fresh) {
  PyObject *md, *m, *res;
  int r;
  if (w->f[W_MDATA] == Py_None) return 0;
  if (!(md = lookup(w, u))) return PyErr_Occurred() ? -1 : 0;
  if ((r = PyObject_IsTrue(md)) <= 0) return r;
  Py_INCREF(md);  /* the dict's entry may go while Python code runs (a Metadata's attributes, the callback) */
  if (PyTuple_Check(md) && PyTuple_Size(md) == 1 && (fresh || !PyDict_GetItemWithError(w->f[W_MDD], ri)) &&
      !PyErr_Occurred() && (m = md1_of(w, PyTuple_GetItem(md, 0))) != NULL) {
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
