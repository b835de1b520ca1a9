/* walk.c: whole-graph walks, one C call each: toposort (PyCore.toposort's exact order) and deepwalk (the seeds'
   in-target-path marking). Visited sets are per-node epoch marks, so a walk costs no hashing. */
#include <stdlib.h>
#include <string.h>
#include "store_impl.h"
#include "mem.h"

#define SCRATCH_KEEP (1u << 20)  /* bytes of walk stack kept for the next walk */

/* a DFS frame: the node and the index of its next source to visit */
typedef struct frame { uint32_t id; int32_t i; } frame;

/* a growable id array */
typedef struct idbuf { int32_t *v; int64_t n, cap; } idbuf;

/* append to an idbuf, doubling it when full */
static int idbuf_push(idbuf *b, int32_t id) {
  if (b->n == b->cap) {
    int64_t cap = b->cap ? b->cap * 2 : 1024;
    int32_t *v = (int32_t *)realloc(b->v, (size_t)cap * sizeof *v);
    if (!v) return PG_ERR_NOMEM;
    b->v = v;
    b->cap = cap;
  }
  b->v[b->n++] = id;
  return 0;
}

/* hand an idbuf to Python as a pg_ids (never with a NULL array, so an empty result still has an address) */
static int idbuf_finish(idbuf *b, pg_ids **out) {
  pg_ids *r = (pg_ids *)malloc(sizeof *r);
  if (!r) return PG_ERR_NOMEM;
  if (!b->v) {
    b->v = (int32_t *)malloc(sizeof *b->v);
    if (!b->v) {
      free(r);
      return PG_ERR_NOMEM;
    }
  } else if (b->cap > b->n + b->n / 4 + 16) {  /* give back slack of the doubling */
    int32_t *v = (int32_t *)realloc(b->v, (size_t)(b->n ? b->n : 1) * sizeof *v);
    if (v) b->v = v;
  }
  r->ids = b->v;
  r->n = b->n;
  b->v = NULL;
  *out = r;
  return 0;
}

/* free an array of ids the core returned */
void pg_ids_free(pg_ids *ids) {
  if (!ids) return;
  free(ids->ids);
  free(ids);
}

/* make sure the store's scratch holds nframes frames; returns it or NULL */
static frame *scratch_frames(pg_store *st, size_t nframes) {
  size_t want = nframes * sizeof(frame);
  if (st->scratchcap < want) {
    size_t cap = st->scratchcap ? st->scratchcap : 4096;
    void *p;
    while (cap < want) cap *= 2;
    p = pg_mem_realloc(st->scratch, st->scratchcap, cap);  /* mem.h: a deep walk's stack goes back to the OS */
    if (!p) return NULL;
    st->scratch = p;
    st->scratchcap = cap;
  }
  return (frame *)st->scratch;
}

/* after a walk, drop a big scratch so a deep walk does not pin memory */
static void scratch_trim(pg_store *st) {
  if (st->scratchcap > SCRATCH_KEEP) {
    pg_mem_free(st->scratch, st->scratchcap);
    st->scratch = NULL;
    st->scratchcap = 0;
  }
}

/* the first source a walk visits: 1 skips the body of FUNCTION/CALL when not entering calls */
static PG_INLINE int32_t first_src(const pg_node *n, int32_t enter_calls) {
  return (!enter_calls && (n->op == PG_OP_FUNCTION || n->op == PG_OP_CALL)) ? 1 : 0;
}

/* post-order DFS from each root (shared done mark), sources left to right; nodes marked stopm are skipped.
   Equals PyCore's push-all-sources stack order: in a DAG a node is never re-entered while on the stack. */
static int toposort_locked(pg_store *st, const int32_t *roots, int32_t nroots, int32_t enter_calls, uint32_t done,
                           uint32_t stopm, idbuf *out) {
  size_t cap = st->scratchcap / sizeof(frame), sp = 0;
  frame *stk = scratch_frames(st, cap > 64 ? cap : 64);
  int32_t r;
  if (!stk) return PG_ERR_NOMEM;
  cap = st->scratchcap / sizeof(frame);
  for (r = 0; r < nroots; r++) {
    pg_node *n = pg_node_at(st, (uint32_t)roots[r]);
    if (n->mark == done || n->mark == stopm) continue;
    stk[0].id = (uint32_t)roots[r];
    stk[0].i = first_src(n, enter_calls);
    sp = 1;
    while (sp) {
      frame *f = &stk[sp - 1];
      n = pg_node_at(st, f->id);
      if (f->i < n->nsrc) {
        uint32_t c = (uint32_t)pg_node_src(n)[f->i++];
        pg_node *cn = pg_node_at(st, c);
        if (cn->mark == done || cn->mark == stopm) continue;  /* seen, or a stop node */
        if (sp == cap) {
          if (!(stk = scratch_frames(st, cap * 2))) return PG_ERR_NOMEM;
          cap = st->scratchcap / sizeof(frame);
        }
        stk[sp].id = c;
        stk[sp].i = first_src(cn, enter_calls);
        sp++;
      } else {  /* all sources done: emit */
        n->mark = done;
        if (idbuf_push(out, (int32_t)f->id)) return PG_ERR_NOMEM;
        sp--;
      }
    }
  }
  return 0;
}

/* check that every root is a live node */
static int roots_ok(const pg_store *st, const int32_t *roots, int32_t nroots) {
  int32_t i;
  if (nroots < 0 || (nroots > 0 && !roots)) return 0;
  for (i = 0; i < nroots; i++)
    if (!pg_node_live(st, roots[i])) return 0;
  return 1;
}

/* sources before users over several roots; stop ids (ids that are not live nodes are ignored, as PyCore's set
   ignores them) are neither included nor descended into; enter_calls 0 skips src[0] of FUNCTION and CALL */
int pg_walk_toposort(pg_store *st, const int32_t *roots, int32_t nroots, int32_t enter_calls, const int32_t *stop,
                     int32_t nstop, pg_ids **out) {
  idbuf b = {NULL, 0, 0};
  uint32_t base;
  int32_t i;
  int r;
  if (!out || nstop < 0 || (nstop > 0 && !stop)) return PG_ERR_ARG;
  *out = NULL;
  pg_lock_take(&st->lock);
  if (!roots_ok(st, roots, nroots)) {
    pg_lock_drop(&st->lock);
    return PG_ERR_BADID;
  }
  base = pg_store_epoch_locked(st, 2);  /* base: done, base + 1: stop */
  for (i = 0; i < nstop; i++) {
    pg_node *n = pg_node_live(st, stop[i]);
    if (n) n->mark = base + 1;
  }
  r = toposort_locked(st, roots, nroots, enter_calls, base, base + 1, &b);
  scratch_trim(st);
  pg_lock_drop(&st->lock);
  if (r == 0) r = idbuf_finish(&b, out);
  free(b.v);
  return r;
}

/* the seeds' _deepwalk: a node is on the path if a source is a target or on the path. walk = the path in toposort
   order less DETACH nodes, path = every node on it. Targets that are not live nodes are ignored. With enter_calls
   0 the bodies of FUNCTION/CALL nodes are neither walked nor count as sources (a gradient walk inside a body: the
   bodies nested in it are differentiated by walks of their own). */
int pg_walk_deepwalk(pg_store *st, int32_t root, const int32_t *targets, int32_t ntargets, int32_t enter_calls,
                     pg_ids **walk, pg_ids **path) {
  idbuf order = {NULL, 0, 0}, w = {NULL, 0, 0}, p = {NULL, 0, 0};
  uint32_t base, on;
  int64_t k;
  int32_t i;
  int r;
  if (!walk || !path || ntargets < 0 || (ntargets > 0 && !targets)) return PG_ERR_ARG;
  *walk = *path = NULL;
  pg_lock_take(&st->lock);
  if (!pg_node_live(st, root)) {
    pg_lock_drop(&st->lock);
    return PG_ERR_BADID;
  }
  base = pg_store_epoch_locked(st, 3);  /* base: done, base + 1: (no stop), base + 2: target or on the path */
  on = base + 2;
  r = toposort_locked(st, &root, 1, enter_calls, base, base + 1, &order);
  scratch_trim(st);
  if (r == 0) {
    for (i = 0; i < ntargets; i++) {
      pg_node *n = pg_node_live(st, targets[i]);
      if (n) n->mark = on;  /* after the sort: a target keeps `on` whether or not it is on the path itself */
    }
    for (k = 0; k < order.n && r == 0; k++) {
      pg_node *n = pg_node_at(st, (uint32_t)order.v[k]);
      const int32_t *s = pg_node_src(n);
      for (i = first_src(n, enter_calls); i < n->nsrc; i++)
        if (pg_node_at(st, (uint32_t)s[i])->mark == on) break;
      if (i == n->nsrc) continue;  /* no source on a target path */
      n->mark = on;
      r = idbuf_push(&p, order.v[k]);
      if (r == 0 && n->op != PG_OP_DETACH) r = idbuf_push(&w, order.v[k]);
    }
  }
  pg_lock_drop(&st->lock);
  free(order.v);
  if (r == 0) r = idbuf_finish(&w, walk);
  if (r == 0 && (r = idbuf_finish(&p, path)) != 0) {
    pg_ids_free(*walk);
    *walk = NULL;
  }
  free(w.v);
  free(p.v);
  return r;
}
