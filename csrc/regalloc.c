/* regalloc.c: register allocation of one VM loop kernel, the sequential heart of pygrad/engine/lower.py's
   `allocate` (which stays the reference and serves small kernels): Python passes the kernel's live nodes as
   arrays, C gives each a register in one linear pass. */
#include <stdint.h>
#include <stdlib.h>
#include "pygrad.h"

#define PG_RA_KEYS (2 * PG_RA_MAXCT)  /* a free stack per (compute type, scalar) */

/* Nodes 0..n-1 in allocation order: loads first (nsrc 0: a register each, scalar as sc_in says), then ALU nodes
   (1..3 sources, each an earlier node, listed in src: src_len entries in all). An ALU node is scalar when all its
   sources are; the registers of its operands that die there (their last use, not a load, not pinned; each operand
   once, in source order) go on the free stack of their (type, scalarity) first, then its result pops the stack of
   its own (ct, scalar) or takes a new register. Writes reg[] and sc_out[] per node, file_ct[]/file_sc[] per
   register (at most n); returns the register count, PG_ERR_ARG for a malformed kernel, PG_ERR_NOMEM. */
int64_t pg_regalloc(int64_t n, const int8_t *nsrc, const int32_t *src, int64_t src_len, const int32_t *ct,
                    const uint8_t *sc_in, const uint8_t *pinned, int32_t *reg, uint8_t *sc_out, int32_t *file_ct,
                    uint8_t *file_sc) {
  int64_t i, p = 0, nregs = 0;
  int32_t head[PG_RA_KEYS];
  int32_t *last, *next;
  if (n < 0 || n > INT32_MAX || src_len < 0) return PG_ERR_ARG;
  if (n == 0) return 0;
  if (!nsrc || !src || !ct || !sc_in || !pinned || !reg || !sc_out || !file_ct || !file_sc) return PG_ERR_ARG;
  last = (int32_t *)malloc((size_t)n * sizeof *last);
  next = (int32_t *)malloc((size_t)n * sizeof *next);
  if (!last || !next) { free(last); free(next); return PG_ERR_NOMEM; }
  for (i = 0; i < PG_RA_KEYS; i++) head[i] = -1;
  for (i = 0; i < n; i++) {  /* each node's last user, and the checks: sources earlier, types in range */
    int32_t k, ns = nsrc[i];
    last[i] = -1;
    if (ns < 0 || ns > 3 || ns > src_len - p || ct[i] < 0 || ct[i] >= PG_RA_MAXCT) goto bad;
    for (k = 0; k < ns; k++) {
      int32_t s = src[p + k];
      if (s < 0 || s >= i) goto bad;
      last[s] = (int32_t)i;
    }
    p += ns;
  }
  p = 0;
  for (i = 0; i < n; i++) {
    int32_t k, ns = nsrc[i], key, r;
    uint8_t sc = 1;
    const int32_t *s = src + p;
    p += ns;
    if (ns == 0) {  /* a load: a register of its own */
      sc = sc_in[i] != 0;
      file_ct[nregs] = ct[i], file_sc[nregs] = sc;
      reg[i] = (int32_t)nregs++, sc_out[i] = sc;
      continue;
    }
    for (k = 0; k < ns; k++) sc &= sc_out[s[k]];
    for (k = 0; k < ns; k++) {  /* dying operands free their registers first: the result may reuse one */
      int32_t o = s[k], rs, j, dup = 0, fk;
      for (j = 0; j < k; j++) dup |= s[j] == o;
      if (dup || last[o] != i || nsrc[o] == 0 || pinned[o]) continue;
      rs = reg[o];
      fk = file_ct[rs] * 2 + file_sc[rs];
      next[rs] = head[fk], head[fk] = rs;
    }
    key = ct[i] * 2 + sc;
    r = head[key];
    if (r >= 0) head[key] = next[r];
    else {
      r = (int32_t)nregs++;
      file_ct[r] = ct[i], file_sc[r] = sc;
    }
    reg[i] = r, sc_out[i] = sc;
  }
  free(last);
  free(next);
  return nregs;
bad:
  free(last);
  free(next);
  return PG_ERR_ARG;
}
