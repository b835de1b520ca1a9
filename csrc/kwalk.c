/* kwalk.c: the walk that builds one fused kernel's expression, pygrad/engine/planner.py's _build for kernels
   without movement ops (the common large kernel: an elementwise chain and its gradient). Python passes the
   flattened graph as arrays once per plan; each call walks one kernel from its root. */
#include <stdint.h>
#include <stdlib.h>
#include "pygrad.h"

typedef struct { int32_t node, bc, phase; } kw_item;

/* Nodes 0..n-1 with nsrc[i] sources at src[off[i]..] (node numbers; src has src_len), flags[i] a PG_KW_* set. Walks
   from top depth-first, sources left to right, as _build does: a LEAF (or the top when top_leaf says so) is a load; an
   ALU node comes after its operands. A () operand of a shaped node is read broadcast (bc 1), and so is everything
   below it. Each distinct (node, bc) is one entry, in the order _build makes its KNodes: out[3e..3e+2] = node, bc, 1
   for a leaf (0 for an ALU node); out_src lists each ALU entry's operands as entry numbers, in source order. memo (2n
   entries, all -1) maps node * 2 + bc to its entry during the call and is all -1 again after it. Returns the entry
   count, PG_KW_MOVES when a node to walk through is neither a leaf nor ALU (the caller's general walk handles it),
   PG_ERR_ARG for malformed input or too small outputs, PG_ERR_NOMEM. */
int64_t pg_kernel_walk(int64_t n, const int32_t *nsrc, const int64_t *off, const int32_t *src, int64_t src_len,
                       const uint8_t *flags, int64_t top, int32_t top_leaf, int32_t *memo, int32_t *out,
                       int64_t out_cap, int32_t *out_src, int64_t src_cap) {
  int64_t nout = 0, nsrcout = 0, sp = 0, cap = 64, e, ret, pushes = 1, max_pushes;
  kw_item *stack;
  if (n <= 0 || top < 0 || top >= n || n > INT32_MAX / 2) return PG_ERR_ARG;
  if (!nsrc || !off || !src || !flags || !memo || !out || !out_src || out_cap < 0 || src_cap < 0) return PG_ERR_ARG;
  /* in a DAG each (node, bc) is expanded once, pushing itself again and its sources: more pushes mean a cycle */
  max_pushes = 8 * n + 1;  /* 2n (node, bc) pairs, each pushing itself and at most 3 sources */
  stack = (kw_item *)malloc((size_t)cap * sizeof *stack);
  if (!stack) return PG_ERR_NOMEM;
  stack[sp++] = (kw_item){(int32_t)top, 0, 0};
  while (sp > 0) {
    kw_item it = stack[--sp];
    int32_t i = it.node, ns = nsrc[i], k, *m = &memo[2 * (int64_t)i + it.bc];
    const int32_t *s = src + (ns > 0 && off[i] >= 0 && off[i] <= src_len - ns ? off[i] : 0);  /* checked below */
    int leaf;
    if (it.phase == 1) {  /* the operands are done: the node's entry */
      if (nout >= out_cap || nsrcout + ns > src_cap) { ret = PG_ERR_ARG; goto done; }
      for (k = 0; k < ns; k++) {
        int32_t bc = (flags[s[k]] & PG_KW_SCALAR) && !(flags[i] & PG_KW_SCALAR) ? 1 : it.bc;
        out_src[nsrcout++] = memo[2 * (int64_t)s[k] + bc];
      }
      *m = (int32_t)nout;
      out[3 * nout] = i, out[3 * nout + 1] = it.bc, out[3 * nout + 2] = 0;
      nout++;
      continue;
    }
    if (*m >= 0) continue;
    leaf = (i == top && it.bc == 0) ? top_leaf != 0 : (flags[i] & PG_KW_LEAF) != 0;
    if (leaf) {
      if (nout >= out_cap) { ret = PG_ERR_ARG; goto done; }
      *m = (int32_t)nout;
      out[3 * nout] = i, out[3 * nout + 1] = it.bc, out[3 * nout + 2] = 1;
      nout++;
      continue;
    }
    if (!(flags[i] & PG_KW_ALU)) { ret = PG_KW_MOVES; goto done; }
    if (ns < 1 || ns > 3 || off[i] < 0 || off[i] > src_len - ns) { ret = PG_ERR_ARG; goto done; }
    for (k = 0; k < ns; k++)
      if (s[k] < 0 || s[k] >= n) { ret = PG_ERR_ARG; goto done; }
    pushes += 1 + ns;
    if (pushes > max_pushes) { ret = PG_ERR_ARG; goto done; }  /* a node is its own source: not a graph's arrays */
    if (sp + 1 + ns > cap) {  /* room for the node again and its operands */
      kw_item *g;
      cap *= 2;
      g = (kw_item *)realloc(stack, (size_t)cap * sizeof *stack);
      if (!g) { ret = PG_ERR_NOMEM; goto done; }
      stack = g;
    }
    stack[sp++] = (kw_item){i, it.bc, 1};
    for (k = ns - 1; k >= 0; k--) {
      int32_t bc = (flags[s[k]] & PG_KW_SCALAR) && !(flags[i] & PG_KW_SCALAR) ? 1 : it.bc;
      if (memo[2 * (int64_t)s[k] + bc] < 0) stack[sp++] = (kw_item){s[k], bc, 0};
    }
  }
  ret = nout;
done:
  for (e = 0; e < nout; e++) memo[2 * (int64_t)out[3 * e] + out[3 * e + 1]] = -1;
  free(stack);
  return ret;
}
