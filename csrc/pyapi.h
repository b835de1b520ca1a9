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

/* a handle's fields (pyhandle.c's type; uop.py's _id, _op, _dtype, _arg, _tag, _shape, _device, _src, _m) */
#define PG_HANDLE_FIELDS 9
enum { PG_H_ID, PG_H_OP, PG_H_DTYPE, PG_H_ARG, PG_H_TAG, PG_H_SHAPE, PG_H_DEVICE, PG_H_SRC, PG_H_META };
typedef struct {
  PyObject_HEAD
  PyObject *f[PG_HANDLE_FIELDS];
  PyObject *weakrefs;
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
/* pymake.c: makers(cls, handles, reftype, callback), bound to a store's capsule */
extern PyMethodDef pg_py_makers_def;

#endif
