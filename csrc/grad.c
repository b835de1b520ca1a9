/* Gradient derivation at C speed. A gradient rule whose result depends only on what it reads of the matched node
   (op, dtype, arg, tag, shape/device of the node, of its sources and of the incoming gradient) is run once by
   Python on placeholders; its result graph is recorded as a template program keyed by that signature, and this
   file instantiates it (hash-consing every node) for each later node with the same key. The reverse walk and the
   accumulation of gradients run here too; whenever a template is missing, or a node needs Python (which ops and
   which gradients do is data Python passes in: pygrad/gradient/rules.py states it once), pg_grad_run returns and
   says why, and Python answers and calls it again. The cache holds at most `limit` templates: past that, the half
   used least recently is dropped (with the arg ids it held), so ever-new shapes do not grow a process.
   A node with metadata (pdata) passes it on as Python's driver does (pygrad/gradient/direct.py): every node of its
   rule's result, down to the node, its sources and its gradient, gets the backward copies of the node's metadata
   merged into its own. Which pdata id a merge gives is Python's answer (NEED_META), kept per run by (the node's
   pdata, the result node's pdata): a model's few metadata pairs are asked once each. */
#include <stdlib.h>
#include <string.h>
#include "prog.h"

#define TPL_MAXSRC 3    /* fast ops have at most this many sources */
#define KEY_MAX 16      /* longest key: 7 + 2 * TPL_MAXSRC + 2 */
#define OP_NOOP PG_OP_NOOP    /* tables.h */
#define NOPS 64                /* the op masks' size: op ids are below it */

typedef struct tpl {
  struct tpl *next;
  uint32_t hash;
  uint64_t used;  /* the cache's clock at the last lookup that found it */
  int32_t nkey, nprog;
  int32_t key[KEY_MAX];
  int32_t *prog;
} tpl;

struct pg_tcache {
  pg_store *st;  /* the store whose arg ids the programs hold */
  tpl **buckets;
  uint32_t mask, n, limit;
  uint64_t clock;  /* counts lookups: the recency order of templates */
};

/* (a node's metadata, a result node's metadata) -> the merged metadata; every id held; md 0 marks an empty slot */
typedef struct mdent { int32_t md, cur, merged; } mdent;
typedef struct mdmap { mdent *e; uint32_t mask, n; } mdmap;

/* node id -> gradient id, open addressing; both sides hold one reference */
typedef struct gmap {
  int32_t *keys, *vals;
  uint32_t mask, bits, n;  /* bits: log2 of the width, mask + 1 */
} gmap;

struct pg_grad {
  pg_store *st;
  int32_t *walk;
  int64_t nwalk, pos;
  uint8_t py_node[NOPS], py_grad[NOPS];  /* ops of nodes / of gradients that Python handles */
  int32_t carry_pdata;         /* carry metadata to rule results (else nodes are taken as having none) */
  gmap map;
  int32_t stage, j, nlg;       /* stage 1: accumulating lg[j..] of walk[pos] */
  int32_t lg[TPL_MAXSRC];
  int32_t *vals;               /* instantiation scratch */
  int32_t nvals;
  int32_t *md, *mdmerged, nmd, capmd;  /* stage 1: result nodes still to get walk[pos]'s metadata (nmd > 0) */
  int32_t *offs;               /* scratch: instruction offsets of a template, then reachability marks */
  int32_t noffs;
  mdmap memo;
};

/* FNV-style mix of a key: templates are few, lookups many */
static uint32_t key_hash(const int32_t *key, int32_t n) {
  uint32_t h = 2166136261u;
  int32_t i;
  for (i = 0; i < n; i++) h = (h ^ (uint32_t)key[i]) * 16777619u;
  return h ^ (h >> 15);
}

/* the arg and tag ids a key names (a rule key's, see rule_key; 0 for none) */
static void key_args(const int32_t *key, int32_t nkey, int32_t *arg, int32_t *tag) {
  int full = nkey >= 7 && key[0] == 0;
  *arg = full ? key[3] : 0;
  *tag = full ? key[4] : 0;
}

/* free a template and release the arg ids its key and program held (store lock held) */
static void tpl_free_locked(pg_store *st, tpl *t) {
  int32_t arg, tag;
  key_args(t->key, t->nkey, &arg, &tag);
  pg_store_arg_release_locked(st, arg);
  pg_store_arg_release_locked(st, tag);
  pg_prog_hold_locked(st, t->prog, 0);
  free(t->prog);
  free(t);
}

/* an empty template cache for the nodes of st, holding at most limit (>= 2) templates */
pg_tcache *pg_tcache_new(pg_store *st, int32_t limit) {
  pg_tcache *tc;
  if (!st || limit < 2) return NULL;
  tc = (pg_tcache *)calloc(1, sizeof *tc);
  if (!tc) return NULL;
  tc->st = st;
  tc->buckets = (tpl **)calloc(64, sizeof *tc->buckets);
  if (!tc->buckets) {
    free(tc);
    return NULL;
  }
  tc->mask = 63;
  tc->limit = (uint32_t)limit;
  pg_lock_take(&st->lock);
  pg_store_retain_locked(st);
  pg_lock_drop(&st->lock);
  return tc;
}

/* free every template, releasing the arg ids their programs hold, and the cache's use of the store */
void pg_tcache_delete(pg_tcache *tc) {
  pg_store *st;
  uint32_t b;
  if (!tc) return;
  st = tc->st;
  pg_lock_take(&st->lock);
  for (b = 0; b <= tc->mask; b++) {
    tpl *t = tc->buckets[b];
    while (t) {
      tpl *nx = t->next;
      tpl_free_locked(st, t);
      t = nx;
    }
  }
  pg_lock_drop(&st->lock);
  pg_store_release(st);
  free(tc->buckets);
  free(tc);
}

/* the template of a key, or NULL; a found one becomes the most recently used */
static const tpl *tcache_find(pg_tcache *tc, const int32_t *key, int32_t nkey) {
  uint32_t h = key_hash(key, nkey);
  tpl *t;
  for (t = tc->buckets[h & tc->mask]; t; t = t->next)
    if (t->hash == h && t->nkey == nkey && !memcmp(t->key, key, (size_t)nkey * sizeof *key)) {
      t->used = ++tc->clock;
      return t;
    }
  return NULL;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* over the limit: drop the templates used least recently, keeping the newer half (a sort of the use clocks once
   every limit / 2 additions: amortised O(log limit) an addition) */
static void tcache_evict_locked(pg_tcache *tc) {
  uint64_t *used = (uint64_t *)malloc((size_t)tc->n * sizeof *used), cut;
  uint32_t b, k = 0;
  if (!used) return;  /* over the limit until the next addition: still correct */
  for (b = 0; b <= tc->mask; b++) {
    const tpl *t;
    for (t = tc->buckets[b]; t; t = t->next) used[k++] = t->used;
  }
  qsort(used, k, sizeof *used, cmp_u64);
  cut = used[k - tc->limit / 2];  /* keep the limit / 2 used most recently (clocks are distinct, but for 0) */
  free(used);
  for (b = 0; b <= tc->mask; b++) {
    tpl **pp = &tc->buckets[b];
    while (*pp) {
      tpl *t = *pp;
      if (t->used < cut) {
        *pp = t->next;
        tpl_free_locked(tc->st, t);
        tc->n--;
      } else {
        pp = &t->next;
      }
    }
  }
}

/* double the bucket array when the cache is as full as it is wide */
static void tcache_grow(pg_tcache *tc) {
  uint32_t nmask = tc->mask * 2 + 1, b;
  tpl **nb = (tpl **)calloc((size_t)nmask + 1, sizeof *nb);
  if (!nb) return;  /* a slower cache, still correct */
  for (b = 0; b <= tc->mask; b++) {
    tpl *t = tc->buckets[b];
    while (t) {
      tpl *nx = t->next;
      t->next = nb[t->hash & nmask];
      nb[t->hash & nmask] = t;
      t = nx;
    }
  }
  free(tc->buckets);
  tc->buckets = nb;
  tc->mask = nmask;
}

/* add the template of a key (a later add of the same key is ignored); takes the store lock, like every reader */
int pg_tcache_add(pg_store *st, pg_tcache *tc, const int32_t *key, int32_t nkey, const int32_t *prog, int32_t nprog) {
  tpl *t;
  uint32_t h;
  int32_t arg, tag;
  int r = 0;
  if (!st || !tc || tc->st != st || !key || !prog || nkey <= 0 || nkey > KEY_MAX || !pg_prog_check(prog, nprog) ||
      prog[2] > TPL_MAXSRC)
    return PG_ERR_ARG;
  pg_lock_take(&st->lock);
  if (tcache_find(tc, key, nkey)) goto done;
  t = (tpl *)calloc(1, sizeof *t);
  if (!t || !(t->prog = (int32_t *)malloc((size_t)nprog * sizeof *prog))) {
    if (t) free(t->prog);
    free(t);
    r = PG_ERR_NOMEM;
    goto done;
  }
  memcpy(t->key, key, (size_t)nkey * sizeof *key);
  memcpy(t->prog, prog, (size_t)nprog * sizeof *prog);
  if ((r = pg_prog_hold_locked(st, t->prog, 1)) != 0) {  /* the program outlives the graph it came from */
    free(t->prog);
    free(t);
    goto done;
  }
  /* so does the key: were its arg drained, the interner would reuse the id's slot, and only the generation
     would keep a later arg from matching this key */
  key_args(key, nkey, &arg, &tag);
  if ((r = pg_store_arg_hold_locked(st, arg)) == 0 && (r = pg_store_arg_hold_locked(st, tag)) != 0)
    pg_store_arg_release_locked(st, arg);
  if (r) {
    pg_prog_hold_locked(st, t->prog, 0);
    free(t->prog);
    free(t);
    goto done;
  }
  t->nkey = nkey;
  t->nprog = nprog;
  t->hash = h = key_hash(key, nkey);
  t->used = ++tc->clock;
  t->next = tc->buckets[h & tc->mask];
  tc->buckets[h & tc->mask] = t;
  if (++tc->n > tc->limit) tcache_evict_locked(tc);
  else if (tc->n > tc->mask) tcache_grow(tc);
done:
  pg_lock_drop(&st->lock);
  return r;
}

/* how many templates the cache holds */
int64_t pg_tcache_count(pg_tcache *tc) {
  int64_t n;
  if (!tc) return PG_ERR_ARG;
  pg_lock_take(&tc->st->lock);
  n = tc->n;
  pg_lock_drop(&tc->st->lock);
  return n;
}

/* ---- the gradient map ---- */

/* the slot of key in the map (its own, or the empty one where it would go). The hash keeps an id's low bits and
   scrambles only the bits above the map's width: ids of one walk are mostly close together, so they fill the
   map without collisions and in memory order (a walk touches the map sequentially, not a cache line per id),
   while ids a multiple of the width apart still spread. */
static uint32_t gmap_slot(const gmap *m, int32_t key) {
  uint32_t k = (uint32_t)key, i = (k ^ ((k >> m->bits) * 2654435761u)) & m->mask;
  while (m->keys[i] != -1 && m->keys[i] != key) i = (i + 1) & m->mask;
  return i;
}

/* room for at least n entries at load <= 1/2 */
static int gmap_init(gmap *m, int64_t n) {
  uint32_t cap = 16, bits = 4;
  while ((int64_t)cap < 2 * n + 2 && cap < (1u << 30)) {
    cap *= 2;
    bits++;
  }
  m->keys = (int32_t *)malloc((size_t)cap * sizeof *m->keys);
  m->vals = (int32_t *)malloc((size_t)cap * sizeof *m->vals);
  if (!m->keys || !m->vals) return PG_ERR_NOMEM;
  memset(m->keys, 0xff, (size_t)cap * sizeof *m->keys);
  m->mask = cap - 1;
  m->bits = bits;
  m->n = 0;
  return 0;
}

/* double the map */
static int gmap_grow(gmap *m) {
  gmap nm;
  uint32_t i;
  if (m->mask >= (1u << 30)) return PG_ERR_NOMEM;
  if (gmap_init(&nm, (int64_t)m->mask + 1) != 0) {
    free(nm.keys);
    free(nm.vals);
    return PG_ERR_NOMEM;
  }
  for (i = 0; i <= m->mask; i++)
    if (m->keys[i] != -1) {
      uint32_t s = gmap_slot(&nm, m->keys[i]);
      nm.keys[s] = m->keys[i];
      nm.vals[s] = m->vals[i];
      nm.n++;
    }
  free(m->keys);
  free(m->vals);
  *m = nm;
  return 0;
}

/* the gradient of a node, or -1 (borrowed) */
static int32_t gmap_get(const gmap *m, int32_t key) {
  uint32_t s = gmap_slot(m, key);
  return m->keys[s] == key ? m->vals[s] : -1;
}

/* one more reference on a live node, with the lock held */
static int incref_locked(pg_store *st, int32_t id) {
  pg_node *n = pg_node_live(st, id);
  if (!n) return PG_ERR_BADID;
  if (n->rc == UINT32_MAX) return PG_ERR_NOMEM;
  n->rc++;
  return 0;
}

/* set key's gradient to val, whose reference the map takes over; the old value's reference is dropped */
static int gmap_put(pg_store *st, gmap *m, int32_t key, int32_t val) {
  uint32_t s;
  int r;
  if (2 * (m->n + 1) > m->mask + 1 && (r = gmap_grow(m)) != 0) return r;
  s = gmap_slot(m, key);
  if (m->keys[s] == key) {
    int32_t old = m->vals[s];
    m->vals[s] = val;
    return pg_store_decref_locked(st, old);
  }
  if ((r = incref_locked(st, key)) != 0) return r;
  m->keys[s] = key;
  m->vals[s] = val;
  m->n++;
  return 0;
}

/* ---- runs ---- */

/* a run over a reverse walk, starting from {root: root_grad}. py_node[op]: a node of that op is Python's step;
   py_grad[op]: a gradient of that op is Python's to step with or to accumulate (ops >= nops: Python's too);
   carry_pdata: a node's side data (metadata) is carried onto its rule's result (see the top of this file) */
pg_grad *pg_grad_new(pg_store *st, const int32_t *walk, int64_t nwalk, int32_t root, int32_t root_grad,
                     const uint8_t *py_node, const uint8_t *py_grad, int32_t nops, int32_t carry_pdata) {
  pg_grad *g;
  int64_t i;
  int ok = 1;
  if (!st || nwalk < 0 || (nwalk && !walk) || !py_node || !py_grad || nops < 0 || nops > NOPS) return NULL;
  g = (pg_grad *)calloc(1, sizeof *g);
  if (!g) return NULL;
  g->st = st;
  g->walk = (int32_t *)malloc((size_t)(nwalk ? nwalk : 1) * sizeof *walk);
  if (!g->walk || gmap_init(&g->map, nwalk < (1 << 26) ? nwalk + 64 : 64) != 0) ok = 0;
  if (ok && nwalk) memcpy(g->walk, walk, (size_t)nwalk * sizeof *walk);
  memset(g->py_node, 1, NOPS);
  memset(g->py_grad, 1, NOPS);
  memcpy(g->py_node, py_node, (size_t)nops);
  memcpy(g->py_grad, py_grad, (size_t)nops);
  g->nwalk = nwalk;
  g->pos = nwalk - 1;
  g->carry_pdata = carry_pdata;
  pg_lock_take(&st->lock);
  pg_store_retain_locked(st);  /* released by pg_grad_delete, on this function's failure too */
  for (i = 0; ok && i < nwalk; i++)
    if (!pg_node_live(st, walk[i])) ok = 0;
  if (ok && (!pg_node_live(st, root) || incref_locked(st, root_grad) != 0)) ok = 0;
  if (ok && gmap_put(st, &g->map, root, root_grad) != 0) {
    pg_store_decref_locked(st, root_grad);
    ok = 0;
  }
  pg_lock_drop(&st->lock);
  if (!ok) {
    pg_grad_delete(g);
    return NULL;
  }
  return g;
}

/* release every reference the run holds, and its use of the store */
void pg_grad_delete(pg_grad *g) {
  uint32_t i;
  int32_t j;
  if (!g) return;
  if (g->map.keys) {
    pg_lock_take(&g->st->lock);
    for (i = 0; i <= g->map.mask; i++)
      if (g->map.keys[i] != -1) {
        pg_store_decref_locked(g->st, g->map.vals[i]);
        pg_store_decref_locked(g->st, g->map.keys[i]);
      }
    for (j = 0; g->stage == 1 && j < g->nlg; j++)
      if (g->lg[j] >= 0) pg_store_decref_locked(g->st, g->lg[j]);
    for (i = 0; g->memo.e && i <= g->memo.mask; i++)
      if (g->memo.e[i].md) {
        pg_store_arg_release_locked(g->st, g->memo.e[i].md);
        pg_store_arg_release_locked(g->st, g->memo.e[i].cur);
        pg_store_arg_release_locked(g->st, g->memo.e[i].merged);
      }
    pg_lock_drop(&g->st->lock);
  }
  pg_store_release(g->st);
  free(g->map.keys);
  free(g->map.vals);
  free(g->walk);
  free(g->vals);
  free(g->md);
  free(g->mdmerged);
  free(g->offs);
  free(g->memo.e);
  free(g);
}

/* build a template's nodes over inputs; outs get one reference each (-1 where the rule gave none) */
static int instantiate(pg_grad *g, const int32_t *prog, const int32_t *inputs, int32_t *outs) {
  int32_t need = prog[0] + prog[1];
  if (need > g->nvals) {
    int32_t *v = (int32_t *)realloc(g->vals, (size_t)need * sizeof *v);
    if (!v) return PG_ERR_NOMEM;
    g->vals = v;
    g->nvals = need;
  }
  return pg_prog_inst_locked(g->st, prog, inputs, g->vals, outs);
}

/* the key of a node's rule: its op, dtype, arg, tag, meta, and dtype/meta of each source and of the gradient */
static int32_t rule_key(pg_store *st, const pg_node *n, const pg_node *ctx, int32_t *key) {
  const int32_t *s = pg_node_src(n);
  int32_t k = 0, i;
  key[k++] = 0;
  key[k++] = n->op;
  key[k++] = n->dtype;
  key[k++] = n->arg;
  key[k++] = n->tag;
  key[k++] = n->meta;
  key[k++] = n->nsrc;
  for (i = 0; i < n->nsrc; i++) {
    const pg_node *c = pg_node_at(st, (uint32_t)s[i]);
    key[k++] = c->dtype;
    key[k++] = c->meta;
  }
  key[k++] = ctx->dtype;
  key[k++] = ctx->meta;
  return k;
}

/* the key of an accumulation: whether a gradient was there, and dtype/meta of it, of the new one and of the node */
static int32_t acc_key(const pg_node *prev, const pg_node *v, const pg_node *k, int32_t *key) {
  key[0] = 1;
  key[1] = prev != NULL;
  key[2] = prev ? prev->dtype : -1;
  key[3] = prev ? prev->meta : -1;
  key[4] = v->dtype;
  key[5] = v->meta;
  key[6] = k->dtype;
  key[7] = k->meta;
  return 8;
}

/* stop the run for Python to make the template of key: it is handed over in out */
static int need_template(pg_stop *out, const int32_t *key, int32_t nkey, int why) {
  memcpy(out->key, key, (size_t)nkey * sizeof *key);
  out->nkey = nkey;
  return why;
}

/* advance past the node at pos */
static void next_node(pg_grad *g) {
  g->stage = 0;
  g->nmd = 0;
  g->pos--;
}

/* ---- metadata ---- */

/* the memo slot of (md, cur): its own, or the empty one where it would go */
static uint32_t memo_slot(const mdmap *m, int32_t md, int32_t cur) {
  uint32_t i = (((uint32_t)md * 2654435761u) ^ ((uint32_t)cur * 40503u)) & m->mask;
  while (m->e[i].md && (m->e[i].md != md || m->e[i].cur != cur)) i = (i + 1) & m->mask;
  return i;
}

/* the merged metadata of (md, cur), or -1 if Python has not said yet */
static int32_t memo_get(const mdmap *m, int32_t md, int32_t cur) {
  uint32_t s;
  if (!m->e) return -1;
  s = memo_slot(m, md, cur);
  return m->e[s].md ? m->e[s].merged : -1;
}

/* room for one more entry at load <= 1/2 */
static int memo_reserve(mdmap *m) {
  mdmap nm;
  uint32_t i;
  if (m->e && 2 * (m->n + 1) <= m->mask + 1) return 0;
  if (m->mask >= (1u << 28)) return PG_ERR_NOMEM;
  nm.mask = m->e ? m->mask * 2 + 1 : 15;
  nm.n = m->n;
  nm.e = (mdent *)calloc((size_t)nm.mask + 1, sizeof *nm.e);
  if (!nm.e) return PG_ERR_NOMEM;
  for (i = 0; m->e && i <= m->mask; i++)
    if (m->e[i].md) nm.e[memo_slot(&nm, m->e[i].md, m->e[i].cur)] = m->e[i];
  free(m->e);
  *m = nm;
  return 0;
}

/* grow an int32 scratch array to hold at least n (doubling) */
static int grow_i32(int32_t **a, int32_t *cap, int32_t n) {
  int32_t *p, c = *cap ? *cap : 16;
  if (n <= *cap) return 0;
  while (c < n) c = c > INT32_MAX / 2 ? n : 2 * c;
  p = (int32_t *)realloc(*a, (size_t)c * sizeof *p);
  if (!p) return PG_ERR_NOMEM;
  *a = p;
  *cap = c;
  return 0;
}

/* room for n nodes in g->md and their merged metadata in g->mdmerged */
static int grow_md(pg_grad *g, int32_t n) {
  int32_t cap = g->capmd, r;
  if (n <= cap) return 0;
  if ((r = grow_i32(&g->md, &cap, n)) != 0) return r;
  cap = g->capmd;
  if ((r = grow_i32(&g->mdmerged, &cap, n)) != 0) return r;  /* md is larger than capmd says: harmless */
  g->capmd = cap;
  return 0;
}

/* after instantiating prog (ids in g->vals): the nodes that take the node's metadata, into g->md. They are the
   nodes a walk from the results reaches without passing an input (the node, its sources, its gradient) -- the
   walk Python's driver makes -- found backwards over the program, whose instructions come sources first. A node
   two instructions became is listed twice (merging twice gives the same). */
static int meta_nodes(pg_grad *g, const int32_t *prog) {
  int32_t nin = prog[0], ninstr = prog[1], nout = prog[2], i, p = PG_PROG_HDR, k, r;
  int32_t *mark;
  g->nmd = 0;
  if (ninstr == 0) return 0;
  if ((r = grow_i32(&g->offs, &g->noffs, 2 * ninstr)) != 0) return r;
  mark = g->offs + ninstr;
  for (i = 0; i < ninstr; i++) {
    g->offs[i] = p;
    mark[i] = 0;
    p += PG_PROG_INSTR + prog[p + 5];
  }
  for (i = 0; i < nout; i++)
    if (prog[p + i] >= nin) mark[prog[p + i] - nin] = 1;
  for (i = ninstr - 1; i >= 0; i--) {
    int32_t id = g->vals[nin + i], q = g->offs[i], stop = 0;
    if (!mark[i]) continue;
    for (k = 0; k < nin; k++) stop |= g->vals[k] == id;
    if (stop) continue;  /* a result node that is one of the inputs: the walk ends there */
    if ((r = grow_md(g, g->nmd + 1)) != 0) return r;
    g->md[g->nmd++] = id;
    for (k = 0; k < prog[q + 5]; k++)
      if (prog[q + PG_PROG_INSTR + k] >= nin) mark[prog[q + PG_PROG_INSTR + k] - nin] = 1;
  }
  return 0;
}

/* give the nodes of g->md the node's metadata md merged into theirs: all or nothing, so that a stop for Python
   (NEED_META, the first pair without an answer) leaves every node as it was */
static int carry_meta(pg_grad *g, int32_t md, pg_stop *out) {
  int32_t i, r;
  for (i = 0; i < g->nmd; i++) {
    int32_t cur = pg_node_at(g->st, (uint32_t)g->md[i])->pdata, m = memo_get(&g->memo, md, cur);
    if (m < 0) {
      out->md = md;
      out->mdcur = cur;
      return PG_GRAD_NEED_META;
    }
    g->mdmerged[i] = m;
  }
  for (i = 0; i < g->nmd; i++)
    if ((r = pg_store_set_pdata_locked(g->st, g->md[i], g->mdmerged[i])) != 0) return r;
  g->nmd = 0;
  return 0;
}

/* a template's inputs in tables.h's order (PG_TPL_*_INPUTS), appended to inputs[ni++] */
#define RULE_INPUT(part) RULE_INPUT_##part
#define RULE_INPUT_NODE inputs[ni++] = nid;
#define RULE_INPUT_SRCS for (i = 0; i < n->nsrc; i++) inputs[ni++] = src[i];
#define RULE_INPUT_GRAD inputs[ni++] = gid;
#define ACC_INPUT(part) ACC_INPUT_##part
#define ACC_INPUT_PREV if (pv) inputs[ni++] = prev;
#define ACC_INPUT_NEW inputs[ni++] = v;
#define ACC_INPUT_NODE inputs[ni++] = k;

/* run the reverse walk until done (0) or until Python is needed (PG_GRAD_* > 0, with `out` saying for what) */
static int run_locked(pg_grad *g, pg_tcache *tc, pg_stop *out) {
  pg_store *st = g->st;
  int32_t key[KEY_MAX], nkey, r;
  while (g->pos >= 0) {
    int32_t nid = g->walk[g->pos];
    pg_node *n = pg_node_at(st, (uint32_t)nid);
    const int32_t *src;
    if (g->stage == 0) {
      int32_t gid = gmap_get(&g->map, nid), inputs[TPL_MAXSRC + 2], i, ni = 0;
      const pg_node *ctx;
      const tpl *t;
      if (gid < 0) { g->pos--; continue; }                   /* no gradient reached it */
      ctx = pg_node_at(st, (uint32_t)gid);
      if (ctx->op == OP_NOOP) { g->pos--; continue; }
      out->pos = g->pos;
      out->node = nid;
      out->ctx = gid;
      if (n->op < 0 || n->op >= NOPS || g->py_node[n->op] || n->nsrc > TPL_MAXSRC || ctx->op < 0 ||
          ctx->op >= NOPS || g->py_grad[ctx->op])
        return PG_GRAD_PY_STEP;                               /* FUNCTION, GETTUPLE, ... */
      nkey = rule_key(st, n, ctx, key);
      t = tcache_find(tc, key, nkey);
      if (!t) return need_template(out, key, nkey, PG_GRAD_NEED_RULE);
      if (t->prog[0] != n->nsrc + 2 || t->prog[2] != n->nsrc) return PG_ERR_ARG;
      src = pg_node_src(n);
      PG_TPL_RULE_INPUTS(RULE_INPUT)
      if ((r = instantiate(g, t->prog, inputs, g->lg)) != 0) return r;
      g->nlg = n->nsrc;
      g->stage = 1;
      g->j = 0;
      if (g->carry_pdata && n->pdata && (r = meta_nodes(g, t->prog)) != 0) return r;
    }
    if (g->nmd) {
      out->pos = g->pos;
      out->node = nid;
      if ((r = carry_meta(g, n->pdata, out)) != 0) return r;
    }
    src = pg_node_src(n);
    out->pos = g->pos;
    out->node = nid;
    for (; g->j < g->nlg; g->j++) {
      int32_t v = g->lg[g->j], k = src[g->j], prev, inputs[3], res, ni = 0;
      const pg_node *pv, *vv, *kn;
      const tpl *t;
      if (v < 0) continue;
      prev = gmap_get(&g->map, k);
      pv = prev >= 0 ? pg_node_at(st, (uint32_t)prev) : NULL;
      vv = pg_node_at(st, (uint32_t)v);
      kn = pg_node_at(st, (uint32_t)k);
      out->k = k;
      out->prev = prev;
      out->v = v;
      if (vv->op < 0 || vv->op >= NOPS || g->py_grad[vv->op] || (pv && (pv->op < 0 || pv->op >= NOPS ||
                                                                       g->py_grad[pv->op])))
        return PG_GRAD_PY_ACC;
      nkey = acc_key(pv, vv, kn, key);
      t = tcache_find(tc, key, nkey);
      if (!t) return need_template(out, key, nkey, PG_GRAD_NEED_ACC);
      PG_TPL_ACC_INPUTS(ACC_INPUT)
      if (t->prog[0] != ni || t->prog[2] != 1) return PG_ERR_ARG;
      if ((r = instantiate(g, t->prog, inputs, &res)) != 0) return r;
      if (res < 0) return PG_ERR_ARG;
      if ((r = gmap_put(st, &g->map, k, res)) != 0) return r;
      pg_store_decref_locked(st, v);
      g->lg[g->j] = -1;
    }
    next_node(g);
  }
  return PG_GRAD_DONE;
}

/* continue the run; see run_locked */
int pg_grad_run(pg_grad *g, pg_tcache *tc, pg_stop *out) {
  int r;
  if (!g || !tc || tc->st != g->st || !out) return PG_ERR_ARG;
  pg_lock_take(&g->st->lock);
  r = run_locked(g, tc, out);
  pg_lock_drop(&g->st->lock);
  return r;
}

/* the gradient of a node so far, or -1 (borrowed: valid while the run holds it) */
int32_t pg_grad_get(pg_grad *g, int32_t node) {
  int32_t r;
  if (!g) return PG_ERR_ARG;
  pg_lock_take(&g->st->lock);
  r = gmap_get(&g->map, node);
  pg_lock_drop(&g->st->lock);
  return r;
}

/* set a node's gradient (Python's answer to PY_STEP / PY_ACC); the run takes a reference of its own */
int pg_grad_set(pg_grad *g, int32_t node, int32_t grad) {
  int r;
  if (!g) return PG_ERR_ARG;
  pg_lock_take(&g->st->lock);
  if (!pg_node_live(g->st, node)) r = PG_ERR_BADID;
  else if ((r = incref_locked(g->st, grad)) == 0 && (r = gmap_put(g->st, &g->map, node, grad)) != 0)
    pg_store_decref_locked(g->st, grad);
  pg_lock_drop(&g->st->lock);
  return r;
}

/* Python did the whole step of the pending node: move on */
int pg_grad_skip(pg_grad *g) {
  int32_t j;
  if (!g || g->pos < 0) return PG_ERR_ARG;
  pg_lock_take(&g->st->lock);
  for (j = 0; g->stage == 1 && j < g->nlg; j++)
    if (g->lg[j] >= 0) pg_store_decref_locked(g->st, g->lg[j]);
  next_node(g);
  pg_lock_drop(&g->st->lock);
  return 0;
}

/* Python did the pending accumulation (PY_ACC): drop that source's gradient and go on with the next */
int pg_grad_consume(pg_grad *g) {
  if (!g || g->stage != 1 || g->j >= g->nlg) return PG_ERR_ARG;
  pg_lock_take(&g->st->lock);
  if (g->lg[g->j] >= 0) pg_store_decref_locked(g->st, g->lg[g->j]);
  g->lg[g->j] = -1;
  g->j++;
  pg_lock_drop(&g->st->lock);
  return 0;
}

/* Python's answer to NEED_META: `merged` is the pdata id of the metadata `mdcur` (0: none) with the backward copies
   of `md` merged in. The run holds the three ids while it keeps the answer. */
int pg_grad_meta_add(pg_grad *g, int32_t md, int32_t mdcur, int32_t merged) {
  int r = 0;
  uint32_t s;
  if (!g || md <= 0 || mdcur < 0 || merged < 0) return PG_ERR_ARG;
  pg_lock_take(&g->st->lock);
  if (memo_get(&g->memo, md, mdcur) >= 0) goto done;  /* answered already */
  if ((r = memo_reserve(&g->memo)) != 0) goto done;
  if ((r = pg_store_arg_hold_locked(g->st, md)) != 0) goto done;
  if ((r = pg_store_arg_hold_locked(g->st, mdcur)) != 0) {
    pg_store_arg_release_locked(g->st, md);
    goto done;
  }
  if ((r = pg_store_arg_hold_locked(g->st, merged)) != 0) {  /* drained since Python interned it: it interns again */
    pg_store_arg_release_locked(g->st, md);
    pg_store_arg_release_locked(g->st, mdcur);
    goto done;
  }
  s = memo_slot(&g->memo, md, mdcur);
  g->memo.e[s].md = md;
  g->memo.e[s].cur = mdcur;
  g->memo.e[s].merged = merged;
  g->memo.n++;
done:
  pg_lock_drop(&g->st->lock);
  return r;
}

/* how many nodes have a gradient */
int64_t pg_grad_count(pg_grad *g) { return g ? (int64_t)g->map.n : PG_ERR_ARG; }

/* every (node, gradient) pair, borrowed; returns how many were written (at most cap) */
int64_t pg_grad_items(pg_grad *g, int32_t *keys, int32_t *vals, int64_t cap) {
  uint32_t i;
  int64_t k = 0;
  if (!g || cap < 0 || (cap && (!keys || !vals))) return PG_ERR_ARG;
  pg_lock_take(&g->st->lock);
  for (i = 0; i <= g->map.mask && k < cap; i++)
    if (g->map.keys[i] != -1) {
      keys[k] = g->map.keys[i];
      vals[k++] = g->map.vals[i];
    }
  pg_lock_drop(&g->st->lock);
  return k;
}
