/* The tinygrad -> pygrad walk's own declarations, shared by its three files and seen by no one else (not cffi):
   pywalk.c the walk (its stack, its configuration, a node's two visits), pywalk_rows.c the rows of the usual nodes,
   pywalk_meta.c the metadata step. */
#ifndef PG_PYWALK_H
#define PG_PYWALK_H

#include "pyapi.h"

/* the configuration tuple's items (pywalk.c's comment above read_cfg says what each is) */
enum { W_LIVE, W_MEMO, W_TARGETS, W_ROWS, W_PUTS, W_MDD, W_TSH, W_SHAPES, W_PLAIN, W_SMOVE, W_ALU, W_DTI, W_CMP,
       W_WEAK, W_PARAM, W_RESHAPE, W_PERMUTE, W_INTS, W_SHN, W_NODE, W_META, W_VSRC, W_MDATA, W_MD1, W_DT, W_WHERE,
       W_REDUCE, W_BUFFER, W_ROP, W_PARAMARG, W_LEAF, W_SAME, W_DVN, W_CLS, W_N };

typedef struct pg_walk_md pg_walk_md;  /* the metadata step's state (pywalk_meta.c) */

/* the node attributes the walk reads, in pg_walk_str's order */
enum { PG_A_OP, PG_A_SRC, PG_A_DTYPE, PG_A_ARG, PG_A_N };

/* one walk: its configuration (borrowed from the tuple), the rows' op and tag ints, the metadata state, and the
   node class's descriptors of the attributes it reads with their getters (get NULL: read as any attribute) */
typedef struct {
  PyObject *f[W_N];
  PyObject *r_reshape, *r_permute, *r_bool, *r_expand, *r_btag, *r_reduce, *r_buffer, *r_rtag;
  pg_walk_md *md;
  PyObject *desc[PG_A_N];  /* owned */
  descrgetfunc get[PG_A_N];
} pg_walk;

/* the attribute names the walk reads, interned once (pg_walk_names) */
typedef struct {
  PyObject *op, *src, *dtype, *arg, *name, *backward, *device, *vmin_vmax;
} pg_walk_str;
extern pg_walk_str pg_walk_s;

/* attribute a (PG_A_*) of node u, a new reference (NULL with an exception set): for an instance of exactly the node
   class, whose attribute lookup is the generic one and the attribute a data descriptor of it (a slot), that
   descriptor's getter, as the generic lookup would call it (~50 instructions, not ~160: no lookup by name) */
static inline PyObject *pg_walk_attr(const pg_walk *w, PyObject *u, int a) {
  if (w->get[a] && (PyObject *)Py_TYPE(u) == w->f[W_CLS]) return w->get[a](w->desc[a], u, w->f[W_CLS]);
  return PyObject_GetAttr(u, a == PG_A_OP ? pg_walk_s.op : a == PG_A_SRC ? pg_walk_s.src :
                             a == PG_A_DTYPE ? pg_walk_s.dtype : pg_walk_s.arg);
}

/* pywalk.c: TypeError "foreign walk: <what>"; -1 */
int pg_walk_bad(const char *what);
/* pywalk_rows.c: the row of u (an int, new reference) made inline, Py_None (new reference) if it is not a usual
   node, NULL with an exception set; row and node appended to puts for the way back */
PyObject *pg_walk_row(const pg_walk *w, PyObject *u, PyObject *op, PyObject *dt, PyObject *vs);
int pg_walk_put_pair(const pg_walk *w, PyObject *ri, PyObject *u);
/* pywalk_meta.c: the state made and freed; u's metadata onto row ri (fresh: ri was made just now, so it has none
   yet) */
int pg_walk_meta_new(pg_walk *w);
void pg_walk_meta_free(pg_walk *w);
int pg_walk_meta(const pg_walk *w, PyObject *u, PyObject *ri, int fresh);

#endif
