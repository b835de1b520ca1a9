/* The pygrad -> tinygrad loop's own declarations (csrc/pyforeign*.c), shared by its three files and seen by no one
   else (not cffi): pyforeign.c the configuration and the loop over rows, pyforeign_nodes.c a foreign node made or
   found (hash-consing, metadata, a source row's node), pyforeign_plans.c the rows made by a plan (reduces, permutes,
   expands, helper rows made when asked for). */
#ifndef PG_PYFOREIGN_H
#define PG_PYFOREIGN_H

#include "pyapi.h"
#include <limits.h>
#include <string.h>

/* cfg: (out, op, dt, tag, start, src, pdata, alu, dtypes, weak, cache, cls, cast, mdata, mdrm, mds, lazy, fields,
   reduced, plans)
   out: list, the foreign node of each row (None: not made); op, dt, tag, start, src, pdata: the exported columns,
   each a bytes object of native int32 items (start: int64, one more item than rows): read in place, where lists of
   ints cost a pointer chase to a scattered int object for every read (a quarter of the loop's time at W1 depth
   2000); alu: tuple, pygrad op -> foreign op or None; dtypes: tuple,
   dtype id -> foreign dtype or None; weak: tuple of the foreign dtypes an operand may have without typing the op;
   cache: the hash-consing dict; cls: the node class; cast: (pygrad CAST, foreign CAST, pygrad BITCAST, foreign
   BITCAST); mdata: the metadata dict or None; mdrm: its weak references' callback; mds: dict pdata -> metadata;
   lazy: lazy(j) -> the node of row j, made now (None: such a row is left to Python); fields: the node class's five
   field descriptors, in key order, or None (the class is called); reduced: dict row -> (node held without the
   reduced axes, its shape, the row's shape, the axes it lacks), the rows held reduced; plans: None, or a list with
   each row's plan or None (see plan_row). */
enum { C_OUT, C_OP, C_DT, C_TAG, C_START, C_SRC, C_PDATA, C_ALU, C_DTYPES, C_WEAK, C_CACHE, C_CLS, C_CAST, C_MDATA,
       C_MDRM, C_MDS, C_LAZY, C_FIELDS, C_REDUCED, C_PLANS, C_N };

/* a column: n native ints of 4 bytes (8 if wide) at p, inside a bytes object the configuration holds */
typedef struct {
  const char *p;
  Py_ssize_t n;
  int wide;
} col_t;

enum { WEAK_MAX = 8 };  /* the weak dtypes kept inline (tinygrad has two) */

/* one call's configuration, read from the tuple (borrowed references) */
typedef struct {
  PyObject *out, *alu, *dtypes, *weak, *cache, *cls, *mdata, *mdrm, *mds, *lazy;
  PyObject *reduced, *plans;
  col_t op, dt, tag, start, src, pdata;
  PyObject *fields[5];  /* with alloc: the field descriptors */
  newfunc alloc;         /* the class's tp_new, or NULL: the class is called */
  descrsetfunc set[5];   /* each field descriptor's setter, with fields */
  descrgetfunc get_dtype;  /* with fields: the dtype descriptor's getter (no attribute lookup by name) */
  long cast_op, bitcast_op;
  PyObject *tcast, *tbitcast;
  Py_ssize_t n;  /* rows */
  Py_ssize_t nalu, ndtypes, nweak;  /* the tables' lengths */
  PyObject *weakv[WEAK_MAX];  /* weak's items, if it has at most WEAK_MAX (else nweak is -1: read from weak) */
  ternaryfunc make;  /* type.__call__: the node class's own construction (its __init__), not its metaclass's */
} cfg_t;

enum { LAZY_DEPTH = 8 };  /* helper rows sit a few deep (a broadcast of a reshape of a held reduce): deeper ones
                              are asked of Python's lazy, so the C recursion stays bounded by a constant */

/* item i of column c as a long (memcpy: bytes data need not be aligned for the item); -1 with an IndexError or
   OverflowError set if it is out of the column or of a long */
static inline int pg_foreign_col(const col_t *c, Py_ssize_t i, long *v) {
  int32_t x;
  int64_t y;
  if (i < 0 || i >= c->n) {
    PyErr_SetString(PyExc_IndexError, "pygrad C core: foreign rows: a row out of a column");
    return -1;
  }
  if (!c->wide) {
    memcpy(&x, c->p + 4 * i, 4);
    *v = x;
    return 0;
  }
  memcpy(&y, c->p + 8 * i, 8);
  if (y > LONG_MAX || y < LONG_MIN) {
    PyErr_SetString(PyExc_OverflowError, "pygrad C core: foreign rows: a start past a long");
    return -1;
  }
  *v = (long)y;
  return 0;
}

/* pyforeign.c: TypeError "foreign rows: <what>"; -1 (pg_foreign_bad) or NULL (pg_foreign_bad_obj) */
int pg_foreign_bad(const char *what);
PyObject *pg_foreign_bad_obj(const char *what);
/* pyforeign.c: column c read from o, a bytes object of whole int32 (int64 if wide) items; -1 with an exception */
int pg_foreign_read_col(PyObject *o, int wide, col_t *c);
/* pyforeign_nodes.c: node x's dtype (a new reference), or NULL with an exception set */
PyObject *pg_foreign_dtype(const cfg_t *c, PyObject *x);
/* pyforeign_nodes.c: the hash-consed node of key (a new reference; *fresh set if made here), or NULL with an
   exception set */
PyObject *pg_foreign_node(const cfg_t *c, PyObject *key, int *fresh);
/* pyforeign_nodes.c: the movement or reduce node of x (see there); a new reference, or NULL with an exception set */
PyObject *pg_foreign_moved(const cfg_t *c, PyObject *op, PyObject *x, PyObject *s, PyObject *arg, int *fresh);
/* pyforeign_nodes.c: row i's metadata onto node t: 1 if set or none is due, 0 if Python sets it, -1 */
int pg_foreign_set_md(const cfg_t *c, Py_ssize_t i, PyObject *t, int fresh);
/* pyforeign_nodes.c: the node of source row j (a new reference), made now if it is a helper row; NULL with no
   exception set if Python makes it, NULL with one set */
PyObject *pg_foreign_source_at(const cfg_t *c, long j, int depth);
PyObject *pg_foreign_source(const cfg_t *c, long j);
/* pyforeign_plans.c: helper row j made now by its plan (a new reference; NULL with no exception set if Python
   makes it, NULL with one set), and row i made by its plan (1: made, 0: left to Python, -1 with an exception) */
PyObject *pg_foreign_lazy(const cfg_t *c, long j, int depth);
int pg_foreign_plan_row(const cfg_t *c, Py_ssize_t i, PyObject *plan);

#endif
