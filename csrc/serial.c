/* serial.c: graphs as tables, one C call each way. Export turns a toposorted list of live nodes into columns
   (op, dtype, arg, tag, pdata, source count, sources as table positions); the bulk builder makes the nodes of
   such a table (pygrad.build, pygrad.loads). Shape/device inference and validation stay in Python: the builder
   caches, per signature (op, dtype, arg, and each source's dtype and meta), the meta Python inferred for the
   first node with that signature, and stops to ask Python for every signature it has not seen. */
#include <stdlib.h>
#include <string.h>
#include "store_impl.h"

#define FLAG_CACHE 1  /* the op's result depends only on the signature */
#define FLAG_ASK 2    /* the op's result depends on more (a FUNCTION body, a CALL): Python makes every one */

/* the table columns of nodes ids[0..n), which must be live and closed under sources in topological order */
int pg_serial_export(pg_store *st, const int32_t *ids, int64_t n, int32_t *op, int32_t *dtype, int32_t *arg,
                     int32_t *tag, int32_t *pdata, int32_t *nsrc, pg_ids **src, int64_t *where) {
  int32_t *pos = NULL, *flat = NULL;
  int64_t i, m = 0, cap = 0;
  int r = 0;
  *where = -1;
  if (n < 0 || (n > 0 && (!ids || !op || !dtype || !arg || !tag || !pdata || !nsrc)) || !src) return PG_ERR_ARG;
  pg_lock_take(&st->lock);
  if (n > 0 && !(pos = (int32_t *)malloc((size_t)st->nalloc * sizeof *pos))) r = PG_ERR_NOMEM;
  if (pos) memset(pos, 0xff, (size_t)st->nalloc * sizeof *pos);  /* -1: not listed (yet) */
  for (i = 0; r == 0 && i < n; i++) {
    pg_node *nd = pg_node_live(st, ids[i]);
    const int32_t *s;
    int32_t k;
    if (!nd) { r = PG_ERR_BADID; *where = i; break; }
    s = pg_node_src(nd);
    if (m + nd->nsrc > cap) {
      int64_t c = cap ? cap * 2 : 1024;
      int32_t *f;
      while (c < m + nd->nsrc) c *= 2;
      if (!(f = (int32_t *)realloc(flat, (size_t)c * sizeof *f))) { r = PG_ERR_NOMEM; break; }
      flat = f;
      cap = c;
    }
    for (k = 0; k < nd->nsrc; k++) {
      int32_t p = pos[s[k]];
      if (p < 0) { r = PG_ERR_ARG; break; }  /* a source not listed before its user */
      flat[m++] = p;
    }
    if (r) { *where = i; break; }
    if (pos[ids[i]] != -1) { r = PG_ERR_ARG; *where = i; break; }  /* listed twice */
    pos[ids[i]] = (int32_t)i;
    op[i] = nd->op;
    dtype[i] = nd->dtype;
    arg[i] = nd->arg;
    tag[i] = nd->tag;
    pdata[i] = nd->pdata;
    nsrc[i] = nd->nsrc;
  }
  pg_lock_drop(&st->lock);
  free(pos);
  if (r == 0) {
    pg_ids *o = (pg_ids *)malloc(sizeof *o);
    if (!o || (!flat && !(flat = (int32_t *)malloc(sizeof *flat)))) {
      free(o);
      r = PG_ERR_NOMEM;
    } else {
      o->ids = flat;
      o->n = m;
      *src = o;
      return 0;
    }
  }
  free(flat);
  return r;
}

/* the signature cache: open addressing over (hash, offset of the key in the pool) */
typedef struct sigslot { uint64_t hash; int64_t key; } sigslot;

struct pg_build {
  pg_store *st;
  int64_t n, next;              /* nodes in the table; the first not made yet */
  const int32_t *op, *dtype, *arg, *tag, *pdata, *src;
  const int64_t *start;         /* node i's sources are src[start[i] .. start[i + 1]) */
  const uint8_t *flags;         /* per op: FLAG_CACHE, FLAG_ASK, or 0 (not an op) */
  int32_t nops, ndtypes;
  int32_t *ids, *meta;          /* per made node: its store id (one reference held) and meta */
  int32_t *pool;                /* cached keys, each followed by its meta */
  int64_t npool, poolcap;
  sigslot *slots;
  uint64_t mask, nsig;
  int32_t *tmp;                 /* a node's source ids */
  int64_t tmpcap;
  int held;                     /* whether the arg/tag/pdata holds were taken */
};

/* key words of node i: op, dtype, arg, nsrc, then each source's dtype and meta; returns the hash */
static uint64_t sig_hash(const pg_build *b, int64_t i) {
  uint64_t h = 0x9e3779b97f4a7c15ull;
  int64_t j;
  h = (h ^ (uint32_t)b->op[i]) * 0xff51afd7ed558ccdull;
  h = (h ^ (uint32_t)b->dtype[i]) * 0xff51afd7ed558ccdull;
  h = (h ^ (uint32_t)b->arg[i]) * 0xff51afd7ed558ccdull;
  for (j = b->start[i]; j < b->start[i + 1]; j++) {
    int32_t s = b->src[j];
    h = (h ^ ((uint64_t)(uint32_t)b->dtype[s] << 32 | (uint32_t)b->meta[s])) * 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 29;
  }
  h ^= (uint64_t)(b->start[i + 1] - b->start[i]);
  h ^= h >> 32;
  return h;
}

/* whether the pooled key at k is node i's signature */
static int sig_equal(const pg_build *b, int64_t k, int64_t i) {
  const int32_t *key = b->pool + k;
  int64_t ns = b->start[i + 1] - b->start[i], j;
  if (key[0] != b->op[i] || key[1] != b->dtype[i] || key[2] != b->arg[i] || key[3] != ns) return 0;
  for (j = 0; j < ns; j++) {
    int32_t s = b->src[b->start[i] + j];
    if (key[4 + 2 * j] != b->dtype[s] || key[5 + 2 * j] != b->meta[s]) return 0;
  }
  return 1;
}

/* the cached meta of node i's signature, or -1 */
static int32_t sig_find(const pg_build *b, int64_t i, uint64_t h) {
  uint64_t k;
  for (k = h & b->mask; b->slots[k].key >= 0; k = (k + 1) & b->mask)
    if (b->slots[k].hash == h && sig_equal(b, b->slots[k].key, i)) {
      int64_t ns = b->start[i + 1] - b->start[i];
      return b->pool[b->slots[k].key + 4 + 2 * ns];
    }
  return -1;
}

/* remember node i's signature with its meta (the table doubles at half load) */
static int sig_add(pg_build *b, int64_t i, int32_t meta) {
  int64_t ns = b->start[i + 1] - b->start[i], need = 5 + 2 * ns, j, at;
  uint64_t h = sig_hash(b, i), k;
  if (sig_find(b, i, h) >= 0) return 0;
  if ((b->nsig + 1) * 2 > b->mask + 1) {
    uint64_t m = (b->mask + 1) * 2 - 1, q;
    sigslot *t = (sigslot *)malloc((size_t)(m + 1) * sizeof *t);
    if (!t) return PG_ERR_NOMEM;
    for (q = 0; q <= m; q++) t[q].key = -1;
    for (q = 0; q <= b->mask; q++) {
      if (b->slots[q].key < 0) continue;
      for (k = b->slots[q].hash & m; t[k].key >= 0; k = (k + 1) & m) {}
      t[k] = b->slots[q];
    }
    free(b->slots);
    b->slots = t;
    b->mask = m;
  }
  if (b->npool + need > b->poolcap) {
    int64_t c = b->poolcap ? b->poolcap * 2 : 4096;
    int32_t *p;
    while (c < b->npool + need) c *= 2;
    if (!(p = (int32_t *)realloc(b->pool, (size_t)c * sizeof *p))) return PG_ERR_NOMEM;
    b->pool = p;
    b->poolcap = c;
  }
  at = b->npool;
  b->pool[at] = b->op[i];
  b->pool[at + 1] = b->dtype[i];
  b->pool[at + 2] = b->arg[i];
  b->pool[at + 3] = (int32_t)ns;
  for (j = 0; j < ns; j++) {
    int32_t s = b->src[b->start[i] + j];
    b->pool[at + 4 + 2 * j] = b->dtype[s];
    b->pool[at + 5 + 2 * j] = b->meta[s];
  }
  b->pool[at + 4 + 2 * ns] = meta;
  b->npool += need;
  for (k = h & b->mask; b->slots[k].key >= 0; k = (k + 1) & b->mask) {}
  b->slots[k].hash = h;
  b->slots[k].key = at;
  b->nsig++;
  return 0;
}

/* take (hold 1) or drop (hold 0) the arg/tag/pdata holds of nodes [0, upto), with the lock held */
static int build_hold_locked(pg_build *b, int64_t upto, int hold, int64_t *where) {
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
        build_hold_locked(b, i, 0, where);
        return r;
      }
    }
  }
  return 0;
}

/* a builder over a node table (the arrays are borrowed: the caller keeps them alive and unchanged until
   pg_serial_build_delete). Checks every op, dtype and source position (sources must come earlier: no cycles) and holds
   every arg, tag and pdata id; on error returns NULL with *err set and *where the offending node. */
pg_build *pg_serial_build_new(pg_store *st, int64_t n, const int32_t *op, const int32_t *dtype, const int64_t *start,
                       const int32_t *src, const int32_t *arg, const int32_t *tag, const int32_t *pdata,
                       const uint8_t *flags, int32_t nops, int32_t ndtypes, int *err, int64_t *where) {
  pg_build *b;
  int64_t i, j, maxs = 0;
  uint64_t k;
  *where = -1;
  *err = PG_ERR_ARG;
  if (!st || n < 0 || n > PG_MAX_NODES || !start || !flags || nops <= 0 || ndtypes <= 0) return NULL;
  if (n > 0 && (!op || !dtype || !arg || !tag)) return NULL;
  if (start[0] != 0 || (start[n] > 0 && !src)) return NULL;
  for (i = 0; i < n; i++) {
    *where = i;
    if (op[i] < 0 || op[i] >= nops || !flags[op[i]]) return NULL;
    if (dtype[i] < 0 || dtype[i] >= ndtypes) return NULL;
    if (start[i + 1] < start[i] || start[i + 1] - start[i] > INT32_MAX) return NULL;
    if (start[i + 1] - start[i] > maxs) maxs = start[i + 1] - start[i];
    for (j = start[i]; j < start[i + 1]; j++)
      if (src[j] < 0 || src[j] >= i) return NULL;  /* a source not made before its user */
    if (arg[i] < 0 || tag[i] < 0 || (pdata && pdata[i] < 0)) return NULL;
  }
  *where = -1;
  *err = PG_ERR_NOMEM;
  if (!(b = (pg_build *)calloc(1, sizeof *b))) return NULL;
  b->st = st;
  b->n = n;
  b->op = op, b->dtype = dtype, b->arg = arg, b->tag = tag, b->pdata = pdata, b->src = src, b->start = start;
  b->flags = flags, b->nops = nops, b->ndtypes = ndtypes;
  b->ids = (int32_t *)malloc((size_t)(n ? n : 1) * sizeof *b->ids);
  b->meta = (int32_t *)malloc((size_t)(n ? n : 1) * sizeof *b->meta);
  b->tmpcap = maxs ? maxs : 1;
  b->tmp = (int32_t *)malloc((size_t)b->tmpcap * sizeof *b->tmp);
  b->mask = 255;
  b->slots = (sigslot *)malloc((b->mask + 1) * sizeof *b->slots);
  if (!b->ids || !b->meta || !b->tmp || !b->slots) {
    pg_serial_build_delete(b);
    return NULL;
  }
  for (k = 0; k <= b->mask; k++) b->slots[k].key = -1;
  pg_lock_take(&st->lock);
  *err = build_hold_locked(b, n, 1, where);
  if (*err == 0) {
    b->held = 1;
    pg_store_retain_locked(st);
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
  if (p && !nd->pdata && b->st->argrc[p] < INT32_MAX) {
    b->st->argrc[p]++;
    nd->pdata = p;
  }
}

/* make nodes from b->next on until one needs Python; returns PG_BUILD_DONE, or PG_BUILD_ASK with *pos the node
   Python must make (then pg_serial_build_set), or an error with *pos the node */
int pg_serial_build_run(pg_build *b, int64_t *pos) {
  pg_store *st = b->st;
  int r = PG_BUILD_DONE;
  pg_lock_take(&st->lock);
  while (b->next < b->n) {
    int64_t i = b->next, j, ns = b->start[i + 1] - b->start[i];
    int32_t meta, id;
    if (b->flags[b->op[i]] & FLAG_ASK) { r = PG_BUILD_ASK; break; }
    meta = sig_find(b, i, sig_hash(b, i));
    if (meta < 0) { r = PG_BUILD_ASK; break; }
    for (j = 0; j < ns; j++) b->tmp[j] = b->ids[b->src[b->start[i] + j]];
    id = pg_store_make_locked(st, b->op[i], b->dtype[i], b->tmp, (int32_t)ns, b->arg[i], b->tag[i], meta);
    if (id < 0) { r = id; break; }
    build_pdata_locked(b, pg_node_at(st, (uint32_t)id), i);
    b->ids[i] = id;
    b->meta[i] = meta;
    b->next = i + 1;
  }
  pg_lock_drop(&st->lock);
  *pos = b->next;
  return r;
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
    b->ids[i] = id;
    b->meta[i] = nd->meta;
    b->next = i + 1;
    if (b->flags[b->op[i]] & FLAG_CACHE) r = sig_add(b, i, nd->meta);
  }
  pg_lock_drop(&st->lock);
  return r;
}

/* the store id of made node i, or a negative error */
int32_t pg_serial_build_id(const pg_build *b, int64_t i) {
  if (i < 0 || i >= b->next) return PG_ERR_ARG;
  return b->ids[i];
}

/* drop the builder's references and holds (nodes no one else holds are freed) and free it */
void pg_serial_build_delete(pg_build *b) {
  int64_t i, where;
  if (!b) return;
  if (b->held) {
    pg_lock_take(&b->st->lock);
    for (i = 0; i < b->next; i++) pg_store_decref_locked(b->st, b->ids[i]);
    build_hold_locked(b, b->n, 0, &where);
    pg_lock_drop(&b->st->lock);
    pg_store_release(b->st);
  }
  free(b->ids);
  free(b->meta);
  free(b->pool);
  free(b->slots);
  free(b->tmp);
  free(b);
}
