/* plan_users.c: the planner's two reverse sweeps over a flattened graph (pygrad/engine/planner.py: the users
   count of Planner.__init__ and _fused_shared), for large graphs; Python keeps both as the reference for small
   ones. Each sweep reads what the nodes after it decided, so they run in one linear pass each, not in numpy. */
#include <stdint.h>
#include <stdlib.h>
#include "pygrad.h"

/* Nodes 0..n-1 in topological order, nsrc[i] sources at src[off[i]..] (earlier node numbers; src has src_len),
   flags[i] a PG_PU_* set, shape[i] an id equal for equal shapes. users[i]: how many computed nodes read node i (a
   node is computed when it is read itself, an output, or not an elementwise/movement op); fused[i]: 1 for an
   elementwise value read several times whose readers are all elementwise nodes of its shape in one group (see
   _fused_shared). Returns 0, PG_ERR_ARG for malformed input (src_len beyond INT32_MAX too: a count of users is at
   most src_len, and int32 then cannot overflow), PG_ERR_NOMEM. */
int pg_plan_users(int64_t n, const int32_t *nsrc, const int64_t *off, const int32_t *src, int64_t src_len,
                  const uint8_t *flags, const int32_t *shape, int32_t *users, uint8_t *fused) {
  int64_t i, total = 0;
  int64_t *start;
  int32_t *readers, *group;
  if (n < 0 || n > INT32_MAX || src_len < 0 || src_len > INT32_MAX) return PG_ERR_ARG;
  if (n == 0) return 0;
  if (!nsrc || !off || !src || !flags || !shape || !users || !fused) return PG_ERR_ARG;
  for (i = 0; i < n; i++) {  /* the checks: sources earlier, inside src */
    int32_t k, ns = nsrc[i];
    if (ns < 0 || off[i] < 0 || off[i] > src_len - ns) return PG_ERR_ARG;
    for (k = 0; k < ns; k++)
      if (src[off[i] + k] < 0 || src[off[i] + k] >= i) return PG_ERR_ARG;
    users[i] = 0, fused[i] = 0;
  }
  for (i = n - 1; i >= 0; i--) {  /* users: a node's own count is final when its turn comes */
    int32_t k;
    if (users[i] == 0 && !(flags[i] & PG_PU_OUTPUT) && (flags[i] & PG_PU_ALU_MOVE)) continue;
    for (k = 0; k < nsrc[i]; k++) users[src[off[i] + k]]++;
  }
  start = (int64_t *)malloc((size_t)(n + 1) * sizeof *start);
  group = (int32_t *)malloc((size_t)n * sizeof *group);
  for (i = 0; i < n; i++) total += users[i];
  readers = (int32_t *)malloc((size_t)(total > 0 ? total : 1) * sizeof *readers);
  if (!start || !group || !readers) { free(start); free(group); free(readers); return PG_ERR_NOMEM; }
  start[0] = 0;
  for (i = 0; i < n; i++) start[i + 1] = start[i] + users[i], group[i] = (int32_t)i;
  for (i = 0; i < n; i++) {  /* each node's readers in order (start[] advances; moved back below) */
    int32_t k;
    if (users[i] == 0 && !(flags[i] & PG_PU_OUTPUT) && (flags[i] & PG_PU_ALU_MOVE)) continue;
    for (k = 0; k < nsrc[i]; k++) readers[start[src[off[i] + k]]++] = (int32_t)i;
  }
  for (i = n; i > 0; i--) start[i] = start[i - 1];
  start[0] = 0;
  for (i = n - 1; i >= 0; i--) {  /* groups, from the outputs down */
    int64_t j;
    int32_t g = -1, ok = 1;
    if (!(flags[i] & PG_PU_ALU) || (flags[i] & PG_PU_OUTPUT) || users[i] == 0) continue;
    for (j = start[i]; j < start[i + 1]; j++) {
      int32_t u = readers[j];
      if (!(flags[u] & PG_PU_ALU) || shape[u] != shape[i] || (g >= 0 && group[u] != g)) { ok = 0; break; }
      g = group[u];
    }
    if (ok) group[i] = g, fused[i] = users[i] >= 2;
  }
  free(start);
  free(group);
  free(readers);
  return 0;
}
