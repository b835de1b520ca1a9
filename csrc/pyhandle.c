/* The base type of the C core's UOp handles: the nine fields of a handle (uop.py's _id, _op, _dtype, _arg, _tag,
   _shape, _device, _src, _m) in a C struct, read and written from Python as member slots like the __slots__ they
   replace, and made in one call by a constructor bound to the UOp class. A Python handle made field by field cost
   ~200 ns (object.__new__ and nine slot stores); the constructor does it in one allocation. Weak references and
   the cyclic GC work as for any Python object; UOp subclasses this type in Python. A handle
   published in the registry (pyreg.c) owns one core reference on its node, released by its dealloc. */
#include "pyapi.h"
#include <stddef.h>
#include <structmember.h>

#define NFIELDS PG_HANDLE_FIELDS
#define SRC PG_H_SRC  /* _src: None when made (uop.py fills it on first use) */

/* visit every field and the type (instances of heap types hold a reference to it) */
static int handle_traverse(PyObject *self, visitproc visit, void *arg) {
  pg_handle *h = (pg_handle *)self;
  int i;
  Py_VISIT(Py_TYPE(self));
  for (i = 0; i < NFIELDS; i++) Py_VISIT(h->f[i]);
  return 0;
}

/* drop every field (cycle collection, and dealloc); a cleared handle leaves the registry (pyreg.c), so a lookup
   makes a new handle rather than find this one without its fields, but keeps its core reference until dealloc */
static int handle_clear(PyObject *self) {
  pg_handle *h = (pg_handle *)self;
  int i;
  pg_reg_unlink(h);
  for (i = 0; i < NFIELDS; i++) Py_CLEAR(h->f[i]);
  return 0;
}

/* out of the registry first (nothing run below -- weak reference callbacks, the fields' deallocs -- can find the
   dying handle), then weak references, the fields, and last its core reference (queued: pyreg.c) */
static void handle_dealloc(PyObject *self) {
  PyTypeObject *tp = Py_TYPE(self);
  freefunc tp_free = (freefunc)PyType_GetSlot(tp, Py_tp_free);
  pg_handle *h = (pg_handle *)self;
  PyObject_GC_UnTrack(self);
  pg_reg_unlink(h);
  if (h->weakrefs) PyObject_ClearWeakRefs(self);
  handle_clear(self);
  pg_reg_release(h);
  tp_free(self);
  Py_DECREF(tp);
}

static PyMemberDef handle_members[] = {
  {"_id", T_OBJECT_EX, offsetof(pg_handle, f[0]), 0, NULL},
  {"_op", T_OBJECT_EX, offsetof(pg_handle, f[1]), 0, NULL},
  {"_dtype", T_OBJECT_EX, offsetof(pg_handle, f[2]), 0, NULL},
  {"_arg", T_OBJECT_EX, offsetof(pg_handle, f[3]), 0, NULL},
  {"_tag", T_OBJECT_EX, offsetof(pg_handle, f[4]), 0, NULL},
  {"_shape", T_OBJECT_EX, offsetof(pg_handle, f[5]), 0, NULL},
  {"_device", T_OBJECT_EX, offsetof(pg_handle, f[6]), 0, NULL},
  {"_src", T_OBJECT_EX, offsetof(pg_handle, f[SRC]), 0, NULL},
  {"_m", T_OBJECT_EX, offsetof(pg_handle, f[8]), 0, NULL},
  {"__weaklistoffset__", T_PYSSIZET, offsetof(pg_handle, weakrefs), READONLY, NULL},
  {NULL, 0, 0, 0, NULL},
};

static PyType_Slot handle_slots[] = {
  {Py_tp_dealloc, (void *)handle_dealloc},
  {Py_tp_traverse, (void *)handle_traverse},
  {Py_tp_clear, (void *)handle_clear},
  {Py_tp_members, (void *)handle_members},
  {Py_nb_add, (void *)pg_meth_nb_add},  /* a + b, a * b, ... in C (pymeth.c) */
  {Py_nb_multiply, (void *)pg_meth_nb_mul},
  {Py_nb_and, (void *)pg_meth_nb_and},
  {Py_nb_or, (void *)pg_meth_nb_or},
  {Py_nb_xor, (void *)pg_meth_nb_xor},
  {Py_nb_subtract, (void *)pg_tmpl_nb_sub},  /* a - b, a / b, a @ b: templates' hit path in C (pytmpl.c) */
  {Py_nb_true_divide, (void *)pg_tmpl_nb_div},
  {Py_nb_matrix_multiply, (void *)pg_tmpl_nb_matmul},
  {Py_tp_doc, (void *)"The fields of a node's handle (the base of pygrad.UOp on the C core)."},
  {0, NULL},
};

static PyType_Spec handle_spec = {
  "pygrad._core.Handle", sizeof(pg_handle), 0, Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
  handle_slots,
};

static PyObject *handle_type;  /* made once, on the first call of pg_py_handle_type (with the GIL held) */

PyObject *pg_py_handle_type(void) {
  if (!handle_type) handle_type = PyType_FromSpec(&handle_spec);
  Py_XINCREF(handle_type);
  return handle_type;
}

PyObject *pg_py_handle_new(PyTypeObject *cls, PyObject *id, PyObject *op, PyObject *dtype, PyObject *arg,
                           PyObject *tag, PyObject *shape, PyObject *device, PyObject *meta) {
  allocfunc alloc = (allocfunc)PyType_GetSlot(cls, Py_tp_alloc);
  PyObject *v[NFIELDS];
  pg_handle *h;
  int i;
  if (!alloc || !(h = (pg_handle *)alloc(cls, 0))) return NULL;
  v[PG_H_ID] = id, v[PG_H_OP] = op, v[PG_H_DTYPE] = dtype, v[PG_H_ARG] = arg, v[PG_H_TAG] = tag;
  v[PG_H_SHAPE] = shape, v[PG_H_DEVICE] = device, v[PG_H_SRC] = Py_None, v[PG_H_META] = meta;
  for (i = 0; i < NFIELDS; i++) {
    Py_INCREF(v[i]);
    h->f[i] = v[i];
  }
  h->reg = NULL, h->nid = -1;  /* unpublished: pyreg.c publishes it */
  return (PyObject *)h;
}

int pg_py_is_handle(PyObject *o) {
  return handle_type && PyObject_TypeCheck(o, (PyTypeObject *)handle_type);
}

int pg_py_is_handle_type(PyObject *cls) {
  return handle_type && PyType_Check(cls) && PyType_IsSubtype((PyTypeObject *)cls, (PyTypeObject *)handle_type);
}

/* new(id, op, dtype, arg, tag, shape, device, m), bound to a subclass of Handle (its self): a handle with these
   fields and _src None, made without running the class's __new__ */
static PyObject *handle_new(PyObject *cls, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != NFIELDS - 1) {
    PyErr_Format(PyExc_TypeError, "pygrad C core: a handle takes %d fields, got %d", NFIELDS - 1, (int)nargs);
    return NULL;
  }
  return pg_py_handle_new((PyTypeObject *)cls, args[0], args[1], args[2], args[3], args[4], args[5], args[6],
                          args[7]);
}

static PyMethodDef handle_new_def = {"new", (PyCFunction)(void (*)(void))handle_new, METH_FASTCALL,
                                     "new(id, op, dtype, arg, tag, shape, device, m): a handle with _src None"};

/* ctor(cls): the constructor bound to cls, a subclass of Handle that adds no fields */
static PyObject *handle_ctor(PyObject *self, PyObject *cls) {
  (void)self;
  if (!pg_py_is_handle_type(cls)) {
    PyErr_SetString(PyExc_TypeError, "pygrad C core: ctor needs a subclass of the handle type");
    return NULL;
  }
  return PyCFunction_NewEx(&handle_new_def, cls, NULL);
}

static PyMethodDef handle_ctor_def = {"ctor", handle_ctor, METH_O, "ctor(cls): the handle constructor of cls"};

PyObject *pg_py_handle_ctor_maker(void) { return PyCFunction_NewEx(&handle_ctor_def, NULL, NULL); }
