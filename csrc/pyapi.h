/* The CPython API for the C files that make Python objects (pyfast.c, pyhandle.c): Python.h under the stable ABI
   of CPython 3.10 (METH_FASTCALL is in it), as cffi builds the rest of the module, except on builds that have no
   stable ABI. Included first, before any system header. Not seen by cffi. */
#ifndef PG_PYAPI_H
#define PG_PYAPI_H

#include <pyconfig.h>
#if !defined(Py_LIMITED_API) && !defined(Py_DEBUG) && !defined(Py_TRACE_REFS) && !defined(Py_REF_DEBUG) && \
    !defined(Py_GIL_DISABLED)
#define Py_LIMITED_API 0x030A0000
#endif
#include <Python.h>
#include <stdint.h>

/* a handle's fields (pyhandle.c's type; uop.py's _id, _op, _dtype, _arg, _tag, _shape, _device, _src, _m) */
#define PG_HANDLE_FIELDS 9
enum { PG_H_ID, PG_H_OP, PG_H_DTYPE, PG_H_ARG, PG_H_TAG, PG_H_SHAPE, PG_H_DEVICE, PG_H_SRC, PG_H_META };
typedef struct pg_reg pg_reg;
typedef struct {
  PyObject_HEAD
  PyObject *f[PG_HANDLE_FIELDS];
  PyObject *weakrefs;
  pg_reg *reg;   /* the registry it is published in, while it owns a core reference on node nid; else NULL */
  int32_t nid;
} pg_handle;

/* pyhandle.c: the handle base type (a new reference; made on the first call), and the builtin ctor(cls) that
   returns the constructor bound to a subclass of it */
PyObject *pg_py_handle_type(void);
PyObject *pg_py_handle_ctor_maker(void);
/* a new handle of type cls (a subclass of the handle type) with these fields (borrowed) and _src None */
PyObject *pg_py_handle_new(PyTypeObject *cls, PyObject *id, PyObject *op, PyObject *dtype, PyObject *arg,
                           PyObject *tag, PyObject *shape, PyObject *device, PyObject *meta);
/* whether o is an instance of the handle type, and whether cls is a subclass of it */
int pg_py_is_handle(PyObject *o);
int pg_py_is_handle_type(PyObject *cls);

/* pyfast.c: the store of a capsule its builtins are bound to (NULL with an exception set if it is none), and the
   store's lock taken with the GIL held (released only while another thread holds the lock) */
struct pg_store;
struct pg_store *pg_py_store_of(PyObject *cap);
void pg_py_lock_take(struct pg_store *st);
/* pyreg.c: the handle registry (node id -> its live handle, a borrowed pointer), with the GIL held.
   pg_reg_new: a registry for the store of capsule storecap and handles of class cls (lives as long as the process).
   pg_reg_live: the live handle of node id (borrowed), or NULL. pg_reg_wrap: the unique handle of node id, taking
   over the caller's reference on it (dropped if a handle exists, or on failure: NULL with an exception set).
   pg_reg_unlink: empty h's slot if it holds h (a cleared or dying handle). pg_reg_release: h's core reference
   queued for release (dropped in batches of PG_REG_BATCH); pg_reg_flush: every queued reference dropped now.
   pg_reg_capsule / pg_reg_from: the registry in a capsule and back (pg_reg_store: its store); pg_reg_calls(capsule): the tuple of its
   builtins for uop.py (wrap, lookup, flush, wrap_many) */
#define PG_REG_BATCH 256
pg_reg *pg_reg_new(PyObject *storecap, PyTypeObject *cls);
PyObject *pg_reg_live(const pg_reg *r, int32_t id);
PyObject *pg_reg_wrap(pg_reg *r, int32_t id, PyObject *op, PyObject *dtype, PyObject *arg, PyObject *tag,
                      PyObject *shape, PyObject *device, PyObject *meta);
void pg_reg_unlink(pg_handle *h);
void pg_reg_release(pg_handle *h);
void pg_reg_flush(pg_reg *r);
PyObject *pg_reg_capsule(pg_reg *r);
pg_reg *pg_reg_from(PyObject *cap);
struct pg_store *pg_reg_store(const pg_reg *r);
PyObject *pg_reg_calls(PyObject *cap);
/* pymake.c: makers(cls), bound to a store's capsule; the end of a make with the store's lock held: the live handle
   of the new reference on nid (the reference dropped), or NULL (the caller publishes a handle) -- the lock released */
extern PyMethodDef pg_py_makers_def;
PyObject *pg_mk_existing_unlock(struct pg_store *st, pg_reg *reg, int32_t nid);
/* pymeth.c: the math methods in C: the handle type's number slots, and (install, md, placeholder_maker) bound to a
   registry capsule */
PyObject *pg_meth_nb_add(PyObject *a, PyObject *b);
PyObject *pg_meth_nb_mul(PyObject *a, PyObject *b);
PyObject *pg_meth_nb_and(PyObject *a, PyObject *b);
PyObject *pg_meth_nb_or(PyObject *a, PyObject *b);
PyObject *pg_meth_nb_xor(PyObject *a, PyObject *b);
PyObject *pg_meth_calls(PyObject *cap);
/* pymeth.c, for pytmpl.c: the registry while no metadata block is open (else NULL), whether o is a fast-path
   operand (an exact UOp published in it), and the id of a DType object (-1 if none) */
pg_reg *pg_meth_reg(void);
int pg_meth_usable(PyObject *o);
int pg_meth_dtype_id(PyObject *d);
/* pyleaf.c: placeholder_maker(cfg), bound to a registry capsule: UOp.placeholder's common case in one call */
extern PyMethodDef pg_leaf_maker_def;
/* pytmpl.c: templates.py's hit path in C: the handle type's number slots for -, / and @, and (prog, install) */
PyObject *pg_tmpl_nb_sub(PyObject *a, PyObject *b);
PyObject *pg_tmpl_nb_div(PyObject *a, PyObject *b);
PyObject *pg_tmpl_nb_matmul(PyObject *a, PyObject *b);
PyObject *pg_tmpl_calls(PyObject *storecap);
/* pyforeign.c: foreign_rows(cfg, todo, k, m), the pygrad -> tinygrad conversion's loop over plain rows */
extern PyMethodDef pg_py_foreign_rows_def;
/* pywalk.c: foreign_walk(cfg, root), the tinygrad -> pygrad conversion's walk */
extern PyMethodDef pg_py_foreign_walk_def;
/* pyrows.c: rows_columns(rows, md), a node table of Python rows as columns */
extern PyMethodDef pg_py_rows_columns_def;
/* pyargs.c: args_decode(cfg, table, nargs), the arg table of pygrad's format decoded and interned */
extern PyMethodDef pg_py_args_decode_def;
/* pyargkey.c: argkeys(xs, cfg), the interner's keys of a list of args */
extern PyMethodDef pg_py_argkeys_def;

#endif
