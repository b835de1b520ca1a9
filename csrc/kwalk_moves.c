/* kwalk_moves.c: the walk that builds one fused kernel's expression when the kernel reads through movement ops,
   pygrad/engine/planner.py's _build_py in C. A movement op (RESHAPE, PERMUTE, EXPAND, PAD, SHRINK, FLIP) between
   the kernel's root and a leaf is no instruction: it is a pending view applied at the leaves below it. The pending
   movements of a value are a "cell": (a movement's class, the cell above it), a chain up to the root. The walk keys
   each value by (node, cell), as _build_py does, and reports every leaf's cell; Python applies the views. The cells
   are the plan's (a pg_kwm state kept across the walks of one plan): equal chains, one cell number, in every
   kernel, so Python applies a chain to a view once. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "pygrad.h"

typedef struct { int32_t node, cell, phase; } kwm_item;

/* an open-addressing map from int64 keys (>= 0) to int32 values; capacity a power of two, kept at most half full */
typedef struct { int64_t *key; int32_t *val; int64_t cap, len; } kwm_map;

static int kwm_init(kwm_map *m, int64_t cap) {
  int64_t i;
  m->key = (int64_t *)malloc((size_t)cap * sizeof *m->key);
  m->val = (int32_t *)malloc((size_t)cap * sizeof *m->val);
  if (!m->key || !m->val) { free(m->key), free(m->val); m->key = NULL, m->val = NULL; return -1; }
  for (i = 0; i < cap; i++) m->key[i] = -1;
  m->cap = cap, m->len = 0;
  return 0;
}

static void kwm_free(kwm_map *m) { free(m->key), free(m->val); }

static int64_t kwm_slot(const kwm_map *m, int64_t key) {
  uint64_t h = (uint64_t)key * UINT64_C(0x9E3779B97F4A7C15);
  int64_t i = (int64_t)(h >> 20) & (m->cap - 1);
  while (m->key[i] >= 0 && m->key[i] != key) i = (i + 1) & (m->cap - 1);
  return i;
}

static int32_t kwm_get(const kwm_map *m, int64_t key) {
  int64_t i = kwm_slot(m, key);
  return m->key[i] == key ? m->val[i] : -1;
}

/* 0, or -1 without memory (the map is unchanged then) */
static int kwm_put(kwm_map *m, int64_t key, int32_t val) {
  int64_t i = kwm_slot(m, key);
  if (m->key[i] != key) {
    if (2 * (m->len + 1) > m->cap) {  /* grow first, then find the slot again */
      kwm_map g;
      int64_t j;
      if (m->cap > INT64_MAX / 4 || kwm_init(&g, 2 * m->cap) < 0) return -1;
      for (j = 0; j < m->cap; j++)
        if (m->key[j] >= 0) {
          int64_t s = kwm_slot(&g, m->key[j]);
          g.key[s] = m->key[j], g.val[s] = m->val[j];
        }
      g.len = m->len;
      kwm_free(m);
      *m = g;
      i = kwm_slot(m, key);
    }
    m->key[i] = key;
    m->len++;
  }
  m->val[i] = val;
  return 0;
}

struct pg_kwm {
  kwm_map memo, cm;   /* (node, cell) -> entry during one walk (emptied after it); (class, parent) -> cell */
  int32_t *cells;     /* cells[2c], cells[2c + 1]: cell c's class and parent */
  int64_t ncell, cells_cap;
  kwm_item *stack;
  int64_t stack_cap;
};

pg_kwm *pg_kwm_new(void) {
  pg_kwm *st = (pg_kwm *)calloc(1, sizeof *st);
  if (!st) return NULL;
  st->cells_cap = 64, st->stack_cap = 64;
  st->cells = (int32_t *)malloc((size_t)st->cells_cap * 2 * sizeof *st->cells);
  st->stack = (kwm_item *)malloc((size_t)st->stack_cap * sizeof *st->stack);
  if (!st->cells || !st->stack || kwm_init(&st->memo, 64) < 0) {
    free(st->cells), free(st->stack), free(st);
    return NULL;
  }
  if (kwm_init(&st->cm, 64) < 0) {
    kwm_free(&st->memo), free(st->cells), free(st->stack), free(st);
    return NULL;
  }
  return st;
}

void pg_kwm_free(pg_kwm *st) {
  if (!st) return;
  kwm_free(&st->memo), kwm_free(&st->cm), free(st->cells), free(st->stack), free(st);
}

int64_t pg_kwm_cells(const pg_kwm *st, int64_t from, int32_t *out, int64_t cap) {
  int64_t c;
  if (!st || !out || from < 0 || cap < 0) return PG_ERR_ARG;
  for (c = from; c < st->ncell && c - from < cap; c++) out[2 * (c - from)] = st->cells[2 * c],
                                                     out[2 * (c - from) + 1] = st->cells[2 * c + 1];
  return c - from;
}

/* (node, cell) as one key; cell -1 is "no pending movement" */
static int64_t kwm_nkey(int32_t node, int32_t cell) { return ((int64_t)cell + 1) << 31 | node; }

/* The cell (cls, parent): found, or made as cell st->ncell. -1 when the cells pass max_cells or without memory. */
static int32_t kwm_cell(pg_kwm *st, int32_t cls, int32_t parent, int64_t max_cells) {
  /* cls: a movement class (>= 0) or a broadcast's -2 - shape id, its 32 bits the key's low half */
  int64_t key = (int64_t)(((uint64_t)(uint32_t)(parent + 1) << 32) | (uint32_t)cls);
  int32_t c = kwm_get(&st->cm, key);
  if (c >= 0) return c;
  if (st->ncell >= max_cells || st->ncell >= INT32_MAX - 1) return -1;
  if (st->ncell >= st->cells_cap) {
    int32_t *g = (int32_t *)realloc(st->cells, (size_t)st->cells_cap * 4 * sizeof *g);
    if (!g) return -1;
    st->cells = g, st->cells_cap *= 2;
  }
  c = (int32_t)st->ncell;
  if (kwm_put(&st->cm, key, c) < 0) return -1;
  st->cells[2 * c] = cls, st->cells[2 * c + 1] = parent;
  st->ncell++;
  return c;
}

/* Empties the memo after a walk: the slots of the keys it was given (found before any is emptied: emptying one
   would cut another's probe run), or the whole table when they are many. */
static void kwm_clear(kwm_map *m, int64_t *keys, int64_t nkeys) {
  int64_t j;
  if (nkeys * 4 >= m->cap) {
    for (j = 0; j < m->cap; j++) m->key[j] = -1;
  } else {
    for (j = 0; j < nkeys; j++) keys[j] = kwm_slot(m, keys[j]);
    for (j = 0; j < nkeys; j++) m->key[keys[j]] = -1;
  }
  m->len = 0;
}

/* Nodes 0..n-1 in dependency order (every source of node i is below i) with nsrc[i] sources at src[off[i]..] (src
   has src_len), flags[i] a PG_KW_* set, mvclass[i] the class of a movement node (equal (op, arg), equal class;
   >= 0), shape[i] a shape id (0 .. INT32_MAX - 2, equal for equal shapes). Walks from top depth-first, sources left
   to right, as _build_py does: a LEAF (or the top, without pending movements, when top_leaf says so) is a load; a
   MOVE node passes its cell with its movement added on to its source; an ALU node comes after its operands, a ()
   operand of a shaped node read through a broadcast cell (class -2 - the node's shape id, on top of the node's
   cell). Each distinct (node, cell) of a leaf or ALU node is one entry, in the order _build_py makes its KNodes:
   out[3e..3e+2] = node, cell + 1, 1 for a leaf (0 for an ALU node); out_src lists each ALU entry's operands as
   entry numbers, in source order. Cells are st's (pg_kwm_cells reads them), at most max_cells in all. info[0]:
   how many out_src were written; info[1]: st's cell count. keys: scratch for out_cap + max_cells keys. Returns the
   entry count; PG_KW_FULL when the entries, operands or cells pass their capacity (the caller's Python walk then
   does it); PG_KW_MOVES when a node to walk through is neither a leaf, a MOVE nor ALU; PG_ERR_ARG for malformed
   input; PG_ERR_NOMEM (st stays usable after any of them). */
int64_t pg_kernel_walk_moves(pg_kwm *st, int64_t n, const int32_t *nsrc, const int64_t *off, const int32_t *src,
                             int64_t src_len, const uint8_t *flags, const int32_t *mvclass, const int32_t *shape,
                             int64_t top, int32_t top_leaf, int32_t *out, int64_t out_cap, int32_t *out_src,
                             int64_t src_cap, int64_t max_cells, int64_t *keys, int64_t *info) {
  int64_t nout = 0, nsrcout = 0, sp = 0, nkeys = 0, ret, kcap;
  kwm_item *stack;
  kwm_map *memo;
  if (!st || n <= 0 || top < 0 || top >= n || n > INT32_MAX - 1) return PG_ERR_ARG;
  if (!nsrc || !off || !src || !flags || !mvclass || !shape || !out || !out_src || !keys || !info) return PG_ERR_ARG;
  if (out_cap < 0 || src_cap < 0 || max_cells < 0 || src_len < 0 || out_cap > INT64_MAX - max_cells) return PG_ERR_ARG;
  kcap = out_cap + max_cells;  /* a key per entry, and per movement pair (one cell each, at most) */
  stack = st->stack, memo = &st->memo;
  stack[sp++] = (kwm_item){(int32_t)top, -1, 0};
#define KWM_MEMO(node, cell, val)                                             \
  do {                                                                        \
    int64_t k_ = kwm_nkey(node, cell);                                        \
    if (nkeys >= kcap) { ret = PG_KW_FULL; goto done; }                       \
    if (kwm_put(memo, k_, val) < 0) { ret = PG_ERR_NOMEM; goto done; }        \
    keys[nkeys++] = k_;                                                       \
  } while (0)
  while (sp > 0) {
    kwm_item it = stack[--sp];
    int32_t i = it.node, ns = nsrc[i], k, bcell = -1, e;
    uint8_t f = flags[i];
    const int32_t *s = src + (ns > 0 && ns <= 3 && off[i] >= 0 && off[i] <= src_len - ns ? off[i] : 0);
    int leaf, scalar_srcs = 0;
    if (it.phase == 1) {  /* (a node pushed again was checked when it was expanded) */
      if (f & PG_KW_MOVE) {
        e = kwm_get(memo, kwm_nkey(s[0], kwm_cell(st, mvclass[i], it.cell, max_cells)));
        if (e < 0) { ret = PG_ERR_ARG; goto done; }
        KWM_MEMO(i, it.cell, e);
        continue;
      }
      if (nout >= out_cap || nout >= INT32_MAX || nsrcout > src_cap - ns) { ret = PG_KW_FULL; goto done; }
      for (k = 0; k < ns; k++) {
        int32_t c = it.cell;
        if ((flags[s[k]] & PG_KW_SCALAR) && !(f & PG_KW_SCALAR)) {
          if (bcell < 0) bcell = kwm_cell(st, -2 - shape[i], it.cell, max_cells);
          c = bcell;
        }
        e = kwm_get(memo, kwm_nkey(s[k], c));
        if (e < 0) { ret = PG_ERR_ARG; goto done; }
        out_src[nsrcout++] = e;
      }
      KWM_MEMO(i, it.cell, (int32_t)nout);
      out[3 * nout] = i, out[3 * nout + 1] = it.cell + 1, out[3 * nout + 2] = 0;
      nout++;
      continue;
    }
    if (kwm_get(memo, kwm_nkey(i, it.cell)) >= 0) continue;
    leaf = (i == top && it.cell < 0) ? top_leaf != 0 : (f & PG_KW_LEAF) != 0;
    if (leaf) {
      if (nout >= out_cap || nout >= INT32_MAX) { ret = PG_KW_FULL; goto done; }
      KWM_MEMO(i, it.cell, (int32_t)nout);
      out[3 * nout] = i, out[3 * nout + 1] = it.cell + 1, out[3 * nout + 2] = 1;
      nout++;
      continue;
    }
    if (!(f & (PG_KW_ALU | PG_KW_MOVE))) { ret = PG_KW_MOVES; goto done; }
    if (ns < 1 || ns > 3 || off[i] < 0 || off[i] > src_len - ns || shape[i] < 0 || shape[i] > INT32_MAX - 2 ||
        ((f & PG_KW_MOVE) && (ns != 1 || mvclass[i] < 0))) { ret = PG_ERR_ARG; goto done; }
    for (k = 0; k < ns; k++) {  /* sources come first: the walk cannot cycle */
      if (s[k] < 0 || s[k] >= i) { ret = PG_ERR_ARG; goto done; }
      if ((flags[s[k]] & PG_KW_SCALAR) && !(f & PG_KW_SCALAR)) scalar_srcs = 1;
    }
    if (sp + 1 + ns > st->stack_cap) {  /* room for the node again and its operands */
      kwm_item *g = (kwm_item *)realloc(stack, (size_t)st->stack_cap * 2 * sizeof *stack);
      if (!g) { ret = PG_ERR_NOMEM; goto done; }
      st->stack = stack = g, st->stack_cap *= 2;
    }
    stack[sp++] = (kwm_item){i, it.cell, 1};
    if (f & PG_KW_MOVE) {
      int32_t c = kwm_cell(st, mvclass[i], it.cell, max_cells);
      if (c < 0) { ret = st->ncell >= max_cells ? PG_KW_FULL : PG_ERR_NOMEM; goto done; }
      if (kwm_get(memo, kwm_nkey(s[0], c)) < 0) stack[sp++] = (kwm_item){s[0], c, 0};
      continue;
    }
    if (scalar_srcs) {
      bcell = kwm_cell(st, -2 - shape[i], it.cell, max_cells);
      if (bcell < 0) { ret = st->ncell >= max_cells ? PG_KW_FULL : PG_ERR_NOMEM; goto done; }
    }
    for (k = ns - 1; k >= 0; k--) {
      int32_t c = (flags[s[k]] & PG_KW_SCALAR) && !(f & PG_KW_SCALAR) ? bcell : it.cell;
      if (kwm_get(memo, kwm_nkey(s[k], c)) < 0) stack[sp++] = (kwm_item){s[k], c, 0};
    }
  }
#undef KWM_MEMO
  info[0] = nsrcout, info[1] = st->ncell;
  ret = nout;
done:
  kwm_clear(memo, keys, nkeys);
  return ret;
}
