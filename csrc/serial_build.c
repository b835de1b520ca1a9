/* serial_build.c: the bulk builder, which makes the nodes of a node table in one C call (pygrad.build,
   pygrad.loads, the tinygrad importer: pygrad/builder.py). Shape/device inference and validation stay in Python:
   the builder caches, per signature (op, dtype, arg, and each source's dtype and meta), the meta Python inferred for
   the first node with that signature (in a cache the store keeps between builds), and stops to ask Python for every
   signature it has not seen. */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include "store_impl.h"
#include "mem.h"

#define FLAG_CACHE 1  /* the op's result depends only on the signature */
#define FLAG_ASK 2    /* the op's result depends on more (a FUNCTION body, a CALL): Python makes every one */

/* the signature cache: open addressing over (hash, offset of the key in the pool). One per store, kept between
   builds (under the store's lock): a key names an op, a dtype, an interned arg id and the sources' dtypes and metas,
   and none of those ids names another value while the entry exists (metas and dtypes are permanent; an interned id's
   slot is reused under a new generation, and the cache is emptied whenever a slot's generation wraps, so a full id
   is never handed out again while an entry made with it lives), so an entry stays true; the signatures of a model's graph are then inferred
   by Python once per process, not once per load or per pickled piece. Bounded: cleared when full. */
#define SIG_MAX 65536            /* signatures */
#define SIG_POOL_MAX (1 << 22)   /* int32 words of keys */
typedef struct sigslot { uint64_t hash; int64_t key; } sigslot;
struct pg_sigcache {
  int32_t *pool;                 /* cached keys, each followed by its meta */
  int64_t npool, poolcap;
  sigslot *slots;
  uint64_t mask, nsig;
};

/* an empty cache, or NULL */
static pg_sigcache *sigcache_new(void) {
  pg_sigcache *c = (pg_sigcache *)calloc(1, sizeof *c);
  uint64_t k;
  if (!c) return NULL;
  c->mask = 255;
  if (!(c->slots = (sigslot *)malloc((c->mask + 1) * sizeof *c->slots))) {
    free(c);
    return NULL;
  }
  for (k = 0; k <= c->mask; k++) c->slots[k].key = -1;
  return c;
}

/* forget every signature (full, or an arg id's generation wrapped: see pg_store_arg_register) */
void pg_serial_cache_clear(pg_sigcache *c) {
  uint64_t k;
  if (!c) return;
  for (k = 0; k <= c->mask; k++) c->slots[k].key = -1;
  c->nsig = 0;
  c->npool = 0;
}

/* free a store's signature cache (store.c, when the store goes) */
void pg_serial_cache_free(pg_sigcache *c) {
  if (!c) return;
  free(c->pool);
  free(c->slots);
  free(c);
}

#define BUILD_PEND 4096  /* nodes made before their table entries are written together (build_link) */
#define BUILD_SCAN 64    /* most users of a row the builder lists and compares (a row whose sources all have more
                            is looked up in the store's table instead: no row costs more than this many compares) */
#define BUILD_AHEAD 16   /* rows ahead of the one being made whose table slot is prefetched, if they are leaves */
#define BUILD_FAR (1u << 16)  /* a table of fewer slots (512 KB) stays in cache: no prefetching then */
/* a made row: what its users' keys and signatures read, together, in 16 bytes (a table of 1.45M rows is 23 MB,
   whose pages are faulted in on every first load, and whose lines far sources miss on) */
typedef struct brow {
  int32_t id;     /* its store id (one reference held by the builder); its node is pg_node_at(st, id) */
  int32_t meta;
  uint32_t ubase; /* where its users' slots start in uslot */
  int16_t sdt;    /* its dtype (pg_serial_build_new checks ndtypes fits) */
  int8_t nuse;    /* users it has among the nodes the builder made new (-1: not made new, or more than room) */
  uint8_t room;   /* its slots: one per table edge naming it, at most BUILD_SCAN */
} brow;
typedef char brow_is_16_bytes[sizeof(brow) == 16 ? 1 : -1];
/* whether the builder holds a reference on row i's node (1 or 0), and mark that it does */
#define BUILD_HELD(b, i) ((uint32_t)((b)->owned[(i) >> 6] >> ((i) & 63)) & 1u)
#define BUILD_HOLD(b, i) ((b)->owned[(i) >> 6] |= (uint64_t)1 << ((i) & 63))
struct pg_build {
  pg_store *st;
  int64_t n, next;              /* nodes in the table; the first not made yet */
  const int32_t *op, *dtype, *arg, *tag, *pdata, *src;
  const int64_t *start;         /* node i's sources are src[start[i] .. start[i + 1]) */
  const uint8_t *flags;         /* per op: FLAG_CACHE, FLAG_ASK, or 0 (not an op) */
  const int32_t *known;         /* per row the meta Python already inferred (and validated), or -1; or NULL */
  int32_t nops, ndtypes;
  brow *row;                    /* per made row */
  pg_sigcache *sc;              /* the store's signature cache (st->sigcache) */
  int32_t *tmp;                 /* a node's source ids */
  pg_node **tmpn;               /* and their nodes */
  int32_t *sw;                  /* a node's sources' signature words: dtype, meta, dtype, meta, ... */
  int64_t tmpcap;
  int held;                     /* whether the arg/tag/pdata holds were taken */
  int32_t *holds;               /* the distinct arg/tag/pdata ids held (a copy), or NULL: each row's are held */
  int64_t nholds;
  pg_slot *uslot;               /* per row, from row[s].ubase: (hash, id) of the users the builder made new */
  int64_t nuslot;
  uint64_t *owned;              /* per made row a bit: the builder holds a reference on its node (build_hand_over) */
  int64_t npend;                /* nodes made but not entered in the store's table yet (build_link) */
  pg_slot pend[BUILD_PEND];
};

/* the signature hash: op, dtype, arg, then per source its word pair (dtype, meta) sw[2j], sw[2j + 1] */
static PG_INLINE uint64_t sig_start(int32_t op, int32_t dtype, int32_t arg) {
  uint64_t h = 0x9e3779b97f4a7c15ull;
  h = (h ^ (uint32_t)op) * 0xff51afd7ed558ccdull;
  h = (h ^ (uint32_t)dtype) * 0xff51afd7ed558ccdull;
  return (h ^ (uint32_t)arg) * 0xff51afd7ed558ccdull;
}
static PG_INLINE uint64_t sig_step(uint64_t h, int32_t sdt, int32_t meta) {
  h = (h ^ ((uint64_t)(uint32_t)sdt << 32 | (uint32_t)meta)) * 0xc4ceb9fe1a85ec53ull;
  return h ^ (h >> 29);
}
static PG_INLINE uint64_t sig_end(uint64_t h, int64_t ns) {
  h ^= (uint64_t)ns;
  return h ^ (h >> 32);
}

/* row i's sources' signature words into b->sw (and their ids into b->tmp); returns the signature hash */
static uint64_t sig_gather(pg_build *b, int64_t i) {
  int64_t j, s0 = b->start[i], ns = b->start[i + 1] - s0;
  uint64_t h = sig_start(b->op[i], b->dtype[i], b->arg[i]);
  for (j = 0; j < ns; j++) {
    const brow *r = &b->row[b->src[s0 + j]];
    b->tmp[j] = r->id;
    b->sw[2 * j] = r->sdt;
    b->sw[2 * j + 1] = r->meta;
    h = sig_step(h, r->sdt, r->meta);
  }
  return sig_end(h, ns);
}

/* the cached meta of the signature (op, dtype, arg, ns sources with words sw) of hash h, or -1 */
static PG_INLINE int32_t sig_find(const pg_sigcache *c, uint64_t h, int32_t op, int32_t dtype, int32_t arg,
                                  const int32_t *sw, int64_t ns) {
  uint64_t k;
  for (k = h & c->mask; c->slots[k].key >= 0; k = (k + 1) & c->mask)
    if (c->slots[k].hash == h) {
      const int32_t *key = c->pool + c->slots[k].key;
      int64_t j;
      if (key[0] != op || key[1] != dtype || key[2] != arg || key[3] != ns) continue;
      for (j = 0; j < ns && key[4 + 2 * j] == sw[2 * j] && key[5 + 2 * j] == sw[2 * j + 1]; j++) {}
      if (j == ns) return key[4 + 2 * ns];
    }
  return -1;
}

/* the cached meta of row i's signature, or -1 (b->sw and b->tmp get its sources') */
static int32_t sig_find_row(pg_build *b, int64_t i) {
  uint64_t h = sig_gather(b, i);
  return sig_find(b->sc, h, b->op[i], b->dtype[i], b->arg[i], b->sw, b->start[i + 1] - b->start[i]);
}

/* remember node i's signature with its meta (the table doubles at half load); a full cache is cleared first, or
   with soft set, the signature is not added (a leaf Python inferred up front must not evict what the builder
   learnt) */
static int sig_add(pg_build *b, int64_t i, int32_t meta, int soft) {
  int64_t ns = b->start[i + 1] - b->start[i], need = 5 + 2 * ns, at;
  uint64_t h = sig_gather(b, i), k;
  int full;
  if (sig_find(b->sc, h, b->op[i], b->dtype[i], b->arg[i], b->sw, ns) >= 0 || need > SIG_POOL_MAX) return 0;
  full = b->sc->nsig >= SIG_MAX || b->sc->npool + need > SIG_POOL_MAX;
  if (full && soft) return 0;
  if (full) pg_serial_cache_clear(b->sc);
  if ((b->sc->nsig + 1) * 2 > b->sc->mask + 1) {
    uint64_t m = (b->sc->mask + 1) * 2 - 1, q;
    sigslot *t = (sigslot *)malloc((size_t)(m + 1) * sizeof *t);
    if (!t) return PG_ERR_NOMEM;
    for (q = 0; q <= m; q++) t[q].key = -1;
    for (q = 0; q <= b->sc->mask; q++) {
      if (b->sc->slots[q].key < 0) continue;
      for (k = b->sc->slots[q].hash & m; t[k].key >= 0; k = (k + 1) & m) {}
      t[k] = b->sc->slots[q];
    }
    free(b->sc->slots);
    b->sc->slots = t;
    b->sc->mask = m;
  }
  if (b->sc->npool + need > b->sc->poolcap) {
    int64_t c = b->sc->poolcap ? b->sc->poolcap * 2 : 4096;
    int32_t *p;
    while (c < b->sc->npool + need) c *= 2;
    if (!(p = (int32_t *)realloc(b->sc->pool, (size_t)c * sizeof *p))) return PG_ERR_NOMEM;
    b->sc->pool = p;
    b->sc->poolcap = c;
  }
  at = b->sc->npool;
  b->sc->pool[at] = b->op[i];
  b->sc->pool[at + 1] = b->dtype[i];
  b->sc->pool[at + 2] = b->arg[i];
  b->sc->pool[at + 3] = (int32_t)ns;
  if (ns) memcpy(b->sc->pool + at + 4, b->sw, (size_t)(2 * ns) * sizeof *b->sw);
  b->sc->pool[at + 4 + 2 * ns] = meta;
  b->sc->npool += need;
  for (k = h & b->sc->mask; b->sc->slots[k].key >= 0; k = (k + 1) & b->sc->mask) {}
  b->sc->slots[k].hash = h;
  b->sc->slots[k].key = at;
  b->sc->nsig++;
  return 0;
}

/* take (hold 1) or drop (hold 0) the holds of b->holds[0, upto), with the lock held; on error *where is -1 */
static int build_hold_list_locked(pg_build *b, int64_t upto, int hold, int64_t *where) {
  int64_t i;
  int r;
  for (i = 0; i < upto; i++) {
    if (!hold) pg_store_arg_release_locked(b->st, b->holds[i]);
    else if ((r = pg_store_arg_hold_locked(b->st, b->holds[i])) != 0) {
      *where = -1;
      build_hold_list_locked(b, i, 0, where);
      return r;
    }
  }
  return 0;
}

/* take (hold 1) or drop (hold 0) the arg/tag/pdata holds of nodes [0, upto), with the lock held */
static int build_hold_rows_locked(pg_build *b, int64_t upto, int hold, int64_t *where) {
  int64_t i;
  int r = 0;
  for (i = 0; i < upto; i++) {
    int32_t a[3];
    int k;
    a[0] = b->arg[i];
    a[1] = b->tag[i];
    a[2] = b->pdata ? b->pdata[i] : 0;
    for (k = 0; k < 3; k++) {
      if (!hold) pg_store_arg_release_locked(b->st, a[k]);
      else if ((r = pg_store_arg_hold_locked(b->st, a[k])) != 0) {
        int q;
        for (q = 0; q < k; q++) pg_store_arg_release_locked(b->st, a[q]);
        *where = i;
        build_hold_rows_locked(b, i, 0, where);
        return r;
      }
    }
  }
  return 0;
}

/* take (hold 1) or drop (hold 0) the builder's arg/tag/pdata holds, with the lock held: the distinct ids b->holds
   once each when given (three calls per row were ~10% of building a large table), else each row's */
static int build_hold_locked(pg_build *b, int hold, int64_t *where) {
  return b->holds ? build_hold_list_locked(b, b->nholds, hold, where) : build_hold_rows_locked(b, b->n, hold, where);
}

/* whether rows [ngiven, n) are all good (each one's op, dtype and source count in range, sources earlier rows,
   arg, tag and pdata ids not negative: pg_serial_build_new's checks); *maxs: the most sources of a row. In passes
   without an early exit, which the compiler can vectorize: a table is checked on every build and load, and a loop
   that stops at the first bad row cost ~40 instructions a row. The first bad row is looked for only if there is one. */
static int rows_ok(int64_t ngiven, int64_t n, const int32_t *op, const int32_t *dtype, const int64_t *start,
                   const int32_t *src, const int32_t *arg, const int32_t *tag, const int32_t *pdata,
                   const uint8_t *flags, int32_t nops, int32_t ndtypes, int64_t *maxs) {
  int64_t i, j;
  uint64_t mx = 0;
  uint32_t bad = 0;
  int32_t k;
  for (k = 0; k < nops; k++) bad |= flags[k] == 0;  /* then no row's op has flags 0 */
  for (i = ngiven; i < n; i++)
    bad |= (uint32_t)((uint32_t)op[i] >= (uint32_t)nops) | (uint32_t)((uint32_t)dtype[i] >= (uint32_t)ndtypes) |
           ((uint32_t)(arg[i] | tag[i]) >> 31);
  if (pdata)
    for (i = ngiven; i < n; i++) bad |= (uint32_t)pdata[i] >> 31;
  for (i = ngiven; i < n; i++) {  /* counts in [0, 2**31) (unsigned: a step down wraps above): start only grows */
    uint64_t d = (uint64_t)start[i + 1] - (uint64_t)start[i];
    mx = d > mx ? d : mx;
  }
  if (bad || mx > INT32_MAX) return 0;
  for (i = ngiven, j = start[ngiven]; i < n; i++) {
    int64_t e = start[i + 1];
    for (; j < e; j++) bad |= (uint32_t)((uint32_t)src[j] >= (uint64_t)i);
  }
  if (bad) return 0;
  *maxs = (int64_t)mx;
  return 1;
}

/* each row's ubase: room for its users' slots, one per table edge naming it (rows [ngiven, n) are the users) up
   to BUILD_SCAN, so that every user the builder makes new is listed (with room for 2 per row, a row over sources
   with more users was looked up in the store's table: ~8% of a W1 gradient's rows, each a cache miss after linking
   the nodes made before it). Returns 0 without memory. */
static int build_user_bases(pg_build *b, int64_t ngiven) {
  int64_t i, j, e, acc = 0, n = b->n;
  uint8_t *cnt = (uint8_t *)calloc((size_t)(n ? n : 1), 1);
  if (!cnt) return 0;
  for (j = b->start[ngiven], e = b->start[n]; j < e; j++) {  /* checked: src[j] in [0, n) */
    uint8_t *c = &cnt[b->src[j]];
    *c = (uint8_t)(*c + (*c < BUILD_SCAN));
  }
  for (i = 0; i < n; i++) {  /* past 2^32 slots (a table of over 4G edges) rows get none: they are looked up */
    uint8_t c = acc + cnt[i] <= (int64_t)UINT32_MAX ? cnt[i] : 0;
    b->row[i].ubase = (uint32_t)(c ? acc : 0);
    b->row[i].room = c;
    acc += c;
  }
  b->nuslot = acc;
  free(cnt);
  return 1;
}

/* a builder over a node table (the arrays are borrowed: the caller keeps them alive and unchanged until
   pg_serial_build_delete). The first ngiven rows are the live nodes given[0..ngiven) (their columns are not read but
   must name no sources and no args): a table that continues another. known (or NULL) is per row the meta Python
   inferred and validated already (the builder makes such a row without asking), or -1. Checks every op, dtype and
   source position (sources must come earlier: no cycles) and holds every given node and every arg, tag and pdata
   id: the nholds ids holds[] once each if holds is given (the distinct ids the columns name: the caller's interned
   ones; a column id not among them is still checked when a node gets it), else each row's; on error returns NULL
   with *err set and *where the offending node (-1 for a hold of holds[]). */
pg_build *pg_serial_build_new(pg_store *st, int64_t n, const int32_t *op, const int32_t *dtype, const int64_t *start,
                              const int32_t *src, const int32_t *arg, const int32_t *tag, const int32_t *pdata,
                              const int32_t *holds, int64_t nholds, const int32_t *given, int64_t ngiven, const int32_t *known, const uint8_t *flags,
                              int32_t nops, int32_t ndtypes, int *err, int64_t *where) {
  pg_build *b;
  int64_t i, j, maxs = 0;
  *where = -1;
  *err = PG_ERR_ARG;
  if (!st || n < 0 || n > PG_MAX_NODES || !start || !flags || nops <= 0 || ndtypes <= 0 ||
      ndtypes > INT16_MAX + 1) return NULL;
  if (n > 0 && (!op || !dtype || !arg || !tag)) return NULL;
  if (ngiven < 0 || ngiven > n || (ngiven > 0 && !given) || nholds < 0 || (nholds > 0 && !holds)) return NULL;
  if (start[0] != 0 || (start[n] > 0 && !src)) return NULL;
  for (i = 0; i < ngiven; i++)
    if (start[i + 1] != start[i] || arg[i] || tag[i] || (pdata && pdata[i])) break;
  if (i == ngiven && rows_ok(ngiven, n, op, dtype, start, src, arg, tag, pdata, flags, nops, ndtypes, &maxs)) i = n;
  else if (i == ngiven)  /* a bad row: find the first (checked with locals: a store to *where per row was costly) */
    for (maxs = 0; i < n; i++) {
      int64_t s0 = start[i], s1 = start[i + 1];
      uint32_t o = (uint32_t)op[i];
      if (o >= (uint32_t)nops || !flags[o] || (uint32_t)dtype[i] >= (uint32_t)ndtypes) break;
      if (s1 < s0 || s1 - s0 > INT32_MAX || s1 > start[n]) break;  /* (a later start smaller than s1: src ends first) */
      if (s1 - s0 > maxs) maxs = s1 - s0;
      for (j = s0; j < s1 && (uint32_t)src[j] < (uint64_t)i; j++) {}
      if (j < s1) break;  /* a source not made before its user */
      if ((arg[i] | tag[i] | (pdata ? pdata[i] : 0)) < 0) break;
    }
  if (i < n) {
    *where = i;
    return NULL;
  }
  *where = -1;
  *err = PG_ERR_NOMEM;
  /* zeroed but for pend (32 KB, written before it is read: npend counts what it holds), whose memset was ~10% of
     loading a small pickle piece */
  if (!(b = (pg_build *)malloc(sizeof *b))) return NULL;
  memset(b, 0, offsetof(pg_build, pend));
  b->st = st;
  b->n = n;
  b->op = op, b->dtype = dtype, b->arg = arg, b->tag = tag, b->pdata = pdata, b->src = src, b->start = start;
  b->flags = flags, b->nops = nops, b->ndtypes = ndtypes, b->known = known;
  b->row = (brow *)pg_mem_alloc((size_t)(n ? n : 1) * sizeof *b->row);  /* both read at random: huge pages */
  pg_mem_huge(b->row, (size_t)(n ? n : 1) * sizeof *b->row);
  if (b->row && build_user_bases(b, ngiven)) {
    b->uslot = (pg_slot *)pg_mem_alloc((size_t)(b->nuslot ? b->nuslot : 1) * sizeof *b->uslot);
    pg_mem_huge(b->uslot, (size_t)(b->nuslot ? b->nuslot : 1) * sizeof *b->uslot);
  }
  b->owned = (uint64_t *)calloc((size_t)(n / 64 + 1), sizeof *b->owned);
  b->tmpcap = maxs ? maxs : 1;
  b->tmp = (int32_t *)malloc((size_t)b->tmpcap * sizeof *b->tmp);
  b->sw = (int32_t *)malloc((size_t)b->tmpcap * 2 * sizeof *b->sw);
  b->tmpn = (pg_node **)malloc((size_t)b->tmpcap * sizeof *b->tmpn);
  if (holds && (b->holds = (int32_t *)malloc((size_t)(nholds ? nholds : 1) * sizeof *b->holds)) != NULL) {
    if (nholds) memcpy(b->holds, holds, (size_t)nholds * sizeof *b->holds);
    b->nholds = nholds;
  }
  if (!b->row || !b->uslot || !b->owned || !b->tmp || !b->sw || !b->tmpn ||
      (holds && !b->holds)) {
    pg_serial_build_delete(b);
    return NULL;
  }
  pg_lock_take(&st->lock);
  if (!st->sigcache) st->sigcache = sigcache_new();
  b->sc = st->sigcache;
  *err = b->sc ? build_hold_locked(b, 1, where) : PG_ERR_NOMEM;
  if (*err == 0) {
    b->held = 1;
    pg_store_retain_locked(st);
    pg_store_reserve_locked(st, n - ngiven);  /* room for every row at once (they may all be new) */
    pg_store_free_order_locked(st, n - ngiven);  /* and rows on ascending nodes, as in a fresh process */
    for (i = 0; i < ngiven; i++) {  /* the given rows count as made: the builder holds each */
      pg_node *nd = pg_node_live(st, given[i]);
      if (!nd || nd->rc == UINT32_MAX || nd->dtype > INT16_MAX) {
        *err = !nd ? PG_ERR_BADID : nd->dtype > INT16_MAX ? PG_ERR_ARG : PG_ERR_NOMEM;
        *where = i;
        break;
      }
      nd->rc++;
      b->row[i].id = given[i];
      b->row[i].nuse = -1;  /* not made by the builder: users unknown */
      b->row[i].meta = nd->meta;
      b->row[i].sdt = (int16_t)nd->dtype;
      BUILD_HOLD(b, i);
      b->next = i + 1;
    }
  }
  pg_lock_drop(&st->lock);
  if (*err) {
    pg_serial_build_delete(b);
    return NULL;
  }
  return b;
}

/* set pdata on a node that has none, with the lock held (a live node's own metadata wins) */
static void build_pdata_locked(pg_build *b, pg_node *nd, int64_t i) {
  int32_t p = b->pdata ? b->pdata[i] : 0;
  if (p && !nd->pdata && pg_store_arg_check_locked(b->st, p) == 0 && b->st->argrc[PG_ARG_SLOT(p)] < INT32_MAX) {
    b->st->argrc[PG_ARG_SLOT(p)]++;
    nd->pdata = p;
  }
}

/* enter the nodes made by pg_store_make_new_locked in the store's table, with the lock held */
static void build_link_locked(pg_build *b) {
  pg_store_link_locked(b->st, b->pend, b->npend);
  b->npend = 0;
}

/* the node of row i (sources b->tmp, hash h) if a node the builder made new among the users of row s has that key;
   -1 if none has; -2 if row s may have users the builder does not know. Every user of a node holds a reference to
   it, so when row s's node has no references but the builder's own one (unless handed over: build_hand_over) and
   its known users', those are all of them */
static PG_INLINE int32_t build_known_user(const pg_build *b, int64_t s, int64_t i, uint32_t h) {
  const brow *r = &b->row[s];
  int32_t k = r->nuse > 0 ? r->nuse : 0, q;  /* not made new: none known, so all known only if it has none */
  const pg_slot *u;
  if (pg_node_at(b->st, (uint32_t)r->id)->rc != BUILD_HELD(b, s) + (uint32_t)k) return -2;
  u = b->uslot + r->ubase;
  for (q = 0; q < k; q++)  /* the users' hashes are here: a user's node is read only if its hash is the row's */
    if (u[q].hash == h && pg_key_equal(pg_node_at(b->st, u[q].id), h, b->op[i], b->dtype[i], b->tmp,
                                       (int32_t)(b->start[i + 1] - b->start[i]), b->arg[i], b->tag[i]))
      return (int32_t)u[q].id;
  return -1;
}

/* Row i's node was just made with a reference on each source (tmpn: the sources' nodes): the builder's own
   reference on a source row, if it still holds one, is handed over to it (dropped: the new node's reference keeps
   the source alive for the builder as long as the builder keeps the new node). So the builder holds a reference only
   on the rows no node it made uses -- a graph's roots and few others -- and pg_serial_build_delete drops those alone:
   dropping one per row touched every node of the table again (~9 ns a row, a node read at random each). */
static PG_INLINE void build_hand_over(pg_build *b, int64_t i, pg_node *const *tmpn) {
  int64_t j, s0 = b->start[i], e = b->start[i + 1];
  for (j = s0; j < e; j++) {  /* without a branch: whether the builder still holds a source is a coin toss */
    int32_t s = b->src[j];
    uint64_t w = b->owned[s >> 6];
    uint32_t mine = (uint32_t)(w >> (s & 63)) & 1u;
    b->owned[s >> 6] = w & ~((uint64_t)1 << (s & 63));  /* (a source named twice is handed over once) */
    tmpn[j - s0]->rc -= mine;  /* >= 2 before if mine: the builder's and the new node's */
  }
}

/* row i was made as new node id (key hash h): it is a user its sources' rows know (while they have room), and it
   has none yet */
static PG_INLINE void build_count_users(pg_build *b, int64_t i, uint32_t h, int32_t id) {
  int64_t j, e = b->start[i + 1];
  brow *row = b->row;
  const int32_t *src = b->src;
  pg_slot *us = b->uslot;
  row[i].nuse = 0;
  for (j = b->start[i]; j < e; j++) {  /* locals: stores through row would make the compiler reload b's fields */
    int32_t s = src[j], k = row[s].nuse;
    if (k < 0) continue;
    if (k == row[s].room) {  /* more than it has room for: unknown from now on */
      row[s].nuse = -1;
      continue;
    }
    us[row[s].ubase + k].hash = h;
    us[row[s].ubase + k].id = (uint32_t)id;
    row[s].nuse = (int8_t)(k + 1);
  }
}

/* prefetch the table slot of row i if it is a leaf (its key has no ids of made nodes, so it is known early) */
static void build_prefetch_leaf(const pg_build *b, int64_t i) {
  if (i < b->n && b->start[i + 1] == b->start[i]) {
    uint32_t h = pg_key_hash(b->op[i], b->dtype[i], NULL, 0, b->arg[i], b->tag[i]);
    PG_PREFETCH(&b->st->slots[h & b->st->mask]);
  }
}

/* make nodes from b->next on until one needs Python; returns PG_BUILD_DONE, or PG_BUILD_ASK with *pos the node
   Python must make (then pg_serial_build_set), or an error with *pos the node.
   A table much larger than the caches costs a cache miss per table lookup, and in a table in topological order
   each lookup waits on the one before (the key holds the id the previous row got). So most rows skip it: a row with
   a source whose users the builder all knows (build_known_user; in a graph not alive yet, nearly every row has one)
   is either one of those users or new, and a new one is entered in the table later, with many others whose misses
   overlap (pg_store_make_new_locked). */
/* row i's node if it is live and has the id after row i - 1's, with a new reference; else -1. A live graph loaded
   again was mostly made in its table's order (69% of the rows of a W1 gradient), so the node after the row
   before's is usually the one: found there, in memory next to the last one, instead of by a hash lookup whose
   cache misses come one after another (each row's key holds the ids the rows before it got). Keys are unique among
   live nodes, so a live node with row i's key is row i's node (also one made by this builder, not yet linked). */
static int32_t build_guess(pg_build *b, int64_t i, uint32_t h, int64_t ns) {
  pg_store *st = b->st;
  pg_node *nd;
  uint32_t g;
  if (i == 0) return -1;
  g = (uint32_t)b->row[i - 1].id + 1;
  if (g >= st->nalloc) return -1;
  nd = pg_node_at(st, g);
  if (!nd->rc || nd->rc == UINT32_MAX || !pg_key_equal(nd, h, b->op[i], b->dtype[i], b->tmp, (int32_t)ns, b->arg[i],
                                                      b->tag[i]))
    return -1;
  nd->rc++;
  return (int32_t)g;
}

/* prefetch what the rows ahead of row i will read of their made sources, in two stages so that no load waits on a
   miss: the sources' rows BUILD_PF_ROW rows ahead, and BUILD_PF_NODE rows ahead (their rows in cache by then) the
   sources' nodes and their users' slots (build_known_user reads both). A source far back in
   the table (the gradient reads the forward graph's rows: ~30% of a W1 gradient's edges reach over 64K rows back)
   is otherwise a miss on its row and one on its node, one after another for every such source. */
#define BUILD_PF_ROW 24
#define BUILD_PF_NODE 12
static PG_INLINE void build_prefetch_sources(const pg_build *b, int64_t i) {
  int64_t j, e, k = i + BUILD_PF_ROW;
  if (k < b->n)
    for (j = b->start[k], e = b->start[k + 1]; j < e; j++)
      if (b->src[j] < i) PG_PREFETCH(&b->row[b->src[j]]);
  k = i + BUILD_PF_NODE;
  if (k < b->n)
    for (j = b->start[k], e = b->start[k + 1]; j < e; j++) {
      int32_t s = b->src[j];
      if (s < i) {
        const brow *r = &b->row[s];
        PG_PREFETCH(pg_node_at(b->st, (uint32_t)r->id));
        if (r->nuse > 0) PG_PREFETCH(&b->uslot[r->ubase]);
      }
    }
}

int pg_serial_build_run(pg_build *b, int64_t *pos) {
  pg_store *st = b->st;
  const int32_t *op = b->op, *dtype = b->dtype, *arg = b->arg, *tag = b->tag, *src = b->src, *known = b->known;
  const int64_t *start = b->start;
  const uint8_t *flags = b->flags;
  brow *row = b->row;
  int32_t *tmp = b->tmp, *sw = b->sw;
  pg_node **tmpn = b->tmpn;
  int64_t i, n = b->n;
  int r = PG_BUILD_DONE, far;
  pg_lock_take(&st->lock);
  far = st->mask >= BUILD_FAR;
  for (i = b->next; i < n; i++) {
    int64_t j, s0 = start[i], ns = start[i + 1] - s0;
    int32_t o = op[i], d = dtype[i], a = arg[i], t = tag[i], meta, id = -2;
    pg_node *nd = NULL;
    uint64_t sh = sig_start(o, d, a), kh = pg_key_hash_start(o, d, (int32_t)ns);
    uint32_t h;
    if (far) build_prefetch_sources(b, i);
    for (j = 0; j < ns; j++) {  /* one pass over the sources: their ids, signature words and both hashes */
      const brow *sr = &row[src[s0 + j]];
      tmp[j] = sr->id;
      tmpn[j] = pg_node_at(st, (uint32_t)sr->id);
      sw[2 * j] = sr->sdt;
      sw[2 * j + 1] = sr->meta;
      sh = sig_step(sh, sr->sdt, sr->meta);
      kh = pg_hash_mix(kh, (uint32_t)sr->id);
    }
    if (known && known[i] >= 0) {
      meta = known[i];
      /* a leaf Python inferred up front (pg_serial_build_misses): the next load finds it cached */
      if (!ns && (flags[o] & (FLAG_CACHE | FLAG_ASK)) == FLAG_CACHE && (r = sig_add(b, i, meta, 1)) != 0) break;
    } else {
      if (flags[o] & FLAG_ASK) { r = PG_BUILD_ASK; break; }
      meta = sig_find(b->sc, sig_end(sh, ns), o, d, a, sw, ns);
      if (meta < 0) { r = PG_BUILD_ASK; break; }
    }
    if (far) build_prefetch_leaf(b, i + BUILD_AHEAD);
    h = pg_key_hash_end(kh, a, t);
    for (j = 0; j < ns && id == -2; j++) id = build_known_user(b, src[s0 + j], i, h);
    if (id >= 0) {  /* an earlier row's node */
      nd = pg_node_at(st, (uint32_t)id);
      if (nd->rc == UINT32_MAX) id = PG_ERR_NOMEM;
      else nd->rc++;
      if (id >= 0) row[i].nuse = -1;
    } else if (id == -1) {  /* new; its sources are rows the builder holds */
      if (b->npend == BUILD_PEND) build_link_locked(b);
      id = pg_store_make_held_fast(st, h, o, d, tmp, tmpn, (int32_t)ns, a, t, meta);
      if (id >= 0) {
        b->pend[b->npend].hash = h;
        b->pend[b->npend++].id = (uint32_t)id;
        build_count_users(b, i, h, id);
        build_hand_over(b, i, tmpn);
      }
    } else if ((id = build_guess(b, i, h, ns)) >= 0) {
      row[i].nuse = -1;  /* found: users unknown */
    } else {
      if (b->npend && ns) build_link_locked(b);  /* the lookup must see every node made (a leaf is none of them) */
      id = pg_store_make_locked(st, o, d, tmp, (int32_t)ns, a, t, meta);
      if (id >= 0 && pg_node_at(st, (uint32_t)id)->rc == 1) {  /* made, not found */
        build_count_users(b, i, h, id);
        build_hand_over(b, i, tmpn);
      } else row[i].nuse = -1;
    }
    if (id < 0) { r = id; break; }
    if (!nd) nd = pg_node_at(st, (uint32_t)id);
    if (b->pdata) build_pdata_locked(b, nd, i);
    row[i].id = id;
    row[i].meta = meta;
    row[i].sdt = (int16_t)d;
    BUILD_HOLD(b, i);
  }
  b->next = i;
  build_link_locked(b);
  pg_lock_drop(&st->lock);
  *pos = b->next;
  return r;
}

/* the rows not made yet that have no sources, an op the signature decides (FLAG_CACHE alone), no known meta, and a
   signature the store's cache lacks -- the leaves Python must infer (BUFFERs, CONSTs: a graph's distinct
   signatures), which it can do up front and pass as known metas -- in order, at most cap of them in rows; returns
   how many, or PG_ERR_ARG */
int64_t pg_serial_build_misses(pg_build *b, int64_t *rows, int64_t cap) {
  int64_t i, k = 0;
  if (!b || cap < 0 || (cap > 0 && !rows)) return PG_ERR_ARG;
  pg_lock_take(&b->st->lock);
  for (i = b->next; i < b->n && k < cap; i++) {
    if (b->start[i + 1] != b->start[i] || (b->flags[b->op[i]] & (FLAG_CACHE | FLAG_ASK)) != FLAG_CACHE) continue;
    if (b->known && b->known[i] >= 0) continue;
    if (sig_find_row(b, i) < 0) rows[k++] = i;
  }
  pg_lock_drop(&b->st->lock);
  return k;
}

/* Python made node b->next as id (same op and dtype as the table says): take a reference on it, and unless the
   op asks Python every time, cache its meta for its signature */
int pg_serial_build_set(pg_build *b, int32_t id) {
  pg_store *st = b->st;
  int64_t i = b->next;
  pg_node *nd;
  int r = 0;
  if (i >= b->n) return PG_ERR_ARG;
  pg_lock_take(&st->lock);
  nd = pg_node_live(st, id);
  if (!nd) r = PG_ERR_BADID;
  else if (nd->op != b->op[i] || nd->dtype != b->dtype[i] || nd->rc == UINT32_MAX) r = PG_ERR_ARG;
  else {
    nd->rc++;
    build_pdata_locked(b, nd, i);
    b->row[i].id = id;
    b->row[i].meta = nd->meta;
    b->row[i].sdt = (int16_t)nd->dtype;
    b->row[i].nuse = -1;  /* made or found by Python: users unknown */
    BUILD_HOLD(b, i);
    b->next = i + 1;
    if (b->flags[b->op[i]] & FLAG_CACHE) r = sig_add(b, i, nd->meta, 0);
  }
  pg_lock_drop(&st->lock);
  return r;
}

/* the store id of made node i, or a negative error */
int32_t pg_serial_build_id(const pg_build *b, int64_t i) {
  if (i < 0 || i >= b->next) return PG_ERR_ARG;
  return b->row[i].id;
}

/* copy the store ids of made nodes [0, n) to out (n at most the number made); returns 0 or PG_ERR_ARG */
int pg_serial_build_ids(const pg_build *b, int32_t *out, int64_t n) {
  int64_t i;
  if (n < 0 || n > b->next || (n > 0 && !out)) return PG_ERR_ARG;
  for (i = 0; i < n; i++) out[i] = b->row[i].id;
  return 0;
}

/* the store ids and metas of made rows rows[0..nrows), each id with one new reference for the caller (a handle's:
   the caller makes a handle of it or drops it), so that Python needs no lookup per root; returns 0, PG_ERR_ARG (a
   row not made; then no reference was taken) or PG_ERR_NOMEM (a node out of references; likewise) */
int pg_serial_build_rows(pg_build *b, const int64_t *rows, int64_t nrows, int32_t *ids, int32_t *metas) {
  int64_t i;
  int r = 0;
  if (nrows < 0 || (nrows > 0 && (!rows || !ids || !metas))) return PG_ERR_ARG;
  for (i = 0; i < nrows; i++)
    if (rows[i] < 0 || rows[i] >= b->next) return PG_ERR_ARG;
  pg_lock_take(&b->st->lock);
  for (i = 0; i < nrows && !r; i++) {
    pg_node *nd = pg_node_at(b->st, (uint32_t)b->row[rows[i]].id);  /* live: held by the builder or by a node it
                                                                         holds (build_hand_over) */
    if (nd->rc == UINT32_MAX) r = PG_ERR_NOMEM;
    else {
      nd->rc++;
      ids[i] = b->row[rows[i]].id;
      metas[i] = b->row[rows[i]].meta;
    }
  }
  if (r)
    while (--i > 0) pg_store_decref_locked(b->st, ids[i - 1]);
  pg_lock_drop(&b->st->lock);
  return r;
}

/* the index of the lowest set bit of x (nonzero) */
static int lowest_bit(uint64_t x) {
#if defined(__GNUC__) || defined(__clang__)
  return __builtin_ctzll(x);
#else
  int k = 0;
  while (!(x & 1)) x >>= 1, k++;
  return k;
#endif
}

/* drop the builder's references and holds (nodes no one else holds are freed) and free it */
void pg_serial_build_delete(pg_build *b) {
  int64_t i, w, where;
  uint64_t bits;
  if (!b) return;
  if (b->held) {
    pg_lock_take(&b->st->lock);
    for (w = 0; w * 64 < b->next; w++)  /* the rows it still holds (build_hand_over): a word of bits at a time */
      for (bits = b->owned[w]; bits; bits &= bits - 1) {
        pg_node *nd;
        i = w * 64 + lowest_bit(bits);  /* (no bit is set past the rows made) */
        nd = pg_node_at(b->st, (uint32_t)b->row[i].id);
        if (nd->rc > 1) nd->rc--;  /* most have handles or users besides the builder: just drop its count */
        else pg_store_decref_locked(b->st, b->row[i].id);
      }
    build_hold_locked(b, 0, &where);
    pg_lock_drop(&b->st->lock);
    pg_store_release(b->st);
  }
  pg_mem_free(b->row, (size_t)(b->n ? b->n : 1) * sizeof *b->row);
  pg_mem_free(b->uslot, (size_t)(b->nuslot ? b->nuslot : 1) * sizeof *b->uslot);
  free(b->tmp);
  free(b->sw);
  free(b->tmpn);
  free(b->holds);
  free(b->owned);
  free(b);
}
