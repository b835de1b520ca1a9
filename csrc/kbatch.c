/* kbatch.c: a plan's small kernels walked and keyed in one call (pygrad/engine/kbatch.py). Each planner job that
   stores one materialized node is a walk (kwalk_moves.c) and a key (kkey.c); for the common job, a kernel of a
   class already lowered, Python needs only the class and the kernel's buffer ids. This loop runs those jobs in
   order and stops at the first one that needs Python (a walk left to the Python walk, a kernel too large to be
   cached, a leaf not registered, a class without words yet): Python runs that job its own way and calls again
   from the next. */
#include <stdint.h>
#include <string.h>
#include "kkey_impl.h"

/* Runs jobs from..nj-1 of a plan: job j walks from node jtop[j] (-1: a job only Python runs; jleaf[j]: the top is a
   leaf) and keys the kernel with index space jspace[j], head jhead[j] and store buffer jsbuf[j] (pg_kkey_make's).
   The walk's arguments are pg_kernel_walk_moves's; its output buffers must be the ones bound to kk (pg_kkey_bind),
   which the key reads. A job is done when its walk has at most max_m entries and its class c is below nok with
   ok[c] set (the classes Python has words for): then cls[j] = c and its buffer ids (in number order) are appended
   to ids (ids_cap of them; *ids_len counts them, and nids[j] is the job's count). Returns the first job not done
   (nj: all done; it stops early, at a job that can be done, when ids has no room for the largest kernel's buffers);
   PG_ERR_ARG on malformed input (a job's node past the graph, arrays not bound to kk), PG_ERR_NOMEM, or a walk's or
   key's error code. Jobs before the one returned are done even then. */
int64_t pg_kbatch_run(pg_kkey *kk, pg_kwm *kwm, int64_t n, const int32_t *nsrc, const int64_t *off,
                      const int32_t *src, int64_t src_len, const uint8_t *flags, const int32_t *mvclass,
                      const int32_t *shape, int32_t *out, int32_t *out_src, int64_t max_cells, int64_t *keys,
                      int64_t *winfo, int64_t from, int64_t nj, const int32_t *jtop, const uint8_t *jleaf,
                      const int32_t *jspace, const int64_t *jhead, const int32_t *jsbuf, int64_t max_m,
                      const uint8_t *ok, int64_t nok, int32_t *cls, int32_t *nids, int32_t *ids, int64_t ids_cap,
                      int64_t *ids_len) {
  int64_t j, len;
  if (!kk || !kwm || !jtop || !jleaf || !jspace || !jhead || !jsbuf || !cls || !nids || !ids || !ids_len ||
      (nok > 0 && !ok))
    return PG_ERR_ARG;
  if (n != kk->n || !kk->ent || out != kk->ent || out_src != kk->srcs || from < 0 || nj < from || nok < 0 ||
      ids_cap < 0 || max_m < 0 || max_m > kk->out_cap)
    return PG_ERR_ARG;
  len = *ids_len;
  if (len < 0 || len > ids_cap) return PG_ERR_ARG;
  for (j = from; j < nj; j++) {
    int64_t m, c, nb;
    if (jtop[j] < 0) break;
    if (jtop[j] >= n) return PG_ERR_ARG;
    if (ids_cap - len < kk->out_cap + 1) break;  /* (room for any kernel's buffers: at most its loads and store) */
    /* (room for max_m entries only: a larger kernel stops the walk at once, and Python walks it in full) */
    m = pg_kernel_walk_moves(kwm, n, nsrc, off, src, src_len, flags, mvclass, shape, jtop[j], jleaf[j] != 0, out,
                             max_m < kk->ent_cap ? max_m : kk->ent_cap, out_src, kk->src_cap, max_cells, keys,
                             winfo);
    if (m == PG_KW_MOVES || m == PG_KW_FULL || m > max_m) break;
    if (m < 0) return m;
    c = pg_kkey_make(kk, m, winfo[0], 0, jspace[j], jhead[j], jsbuf[j]);
    if (c == PG_KKEY_MISS) break;
    if (c < 0) return c;
    if (c >= nok || !ok[c]) break;
    nb = kk->info[2];
    if (nb < 0 || nb > kk->out_cap + 1) return PG_ERR_ARG;
    memcpy(ids + len, kk->bufs, (size_t)nb * sizeof *ids);
    len += nb;
    cls[j] = (int32_t)c, nids[j] = (int32_t)nb;
    *ids_len = len;
  }
  return j;
}
