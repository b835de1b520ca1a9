/* store.c: hash-consed nodes and their lifetime. The semantics are pygrad/core/pycore.py's PyCore, id for id:
   same identity rule, same id recycling (LIFO), same freeing order, same arg/tag/pdata counting and drain. */
#include <stdlib.h>
#include <string.h>
#include "store_impl.h"
#include "mem.h"

#define INIT_SLOTS 1024u
/* Node pages: the first PG_SMALL_PAGES one by one from malloc (a small store stays small), later ones PG_GROUP at a
   time in one mapped block of PG_GROUP_BYTES with huge pages (mem.h): a graph of a million nodes is 56 MB of nodes,
   made and read in an order that jumps around them, and with 4 KB pages each such access was also a TLB miss
   (the bulk builder's row loop: 120 -> 103 ms at 1.45M rows). A block's size is a multiple of 2 MB so that the
   kernel can place it on huge-page boundaries. */
#define PG_SMALL_PAGES 16u
#define PG_GROUP_BYTES ((size_t)4 << 20)
#define PG_GROUP ((uint32_t)(PG_GROUP_BYTES / (PG_PAGE_SIZE * sizeof(pg_node))))
typedef char pg_group_holds_pages[PG_GROUP >= 1 ? 1 : -1];

/* whether page i is the first of a mapped group (else one malloc'd page, or inside a group) */
static int page_is_group_head(uint32_t i) { return i >= PG_SMALL_PAGES && (i - PG_SMALL_PAGES) % PG_GROUP == 0; }

/* a table of n empty slots (n a power of two), or NULL */
static pg_slot *slots_new(uint32_t n) {
  pg_slot *t = (pg_slot *)pg_mem_alloc((size_t)n * sizeof *t);  /* mem.h: outgrown tables go back to the OS */
  pg_mem_huge(t, (size_t)n * sizeof *t);  /* before the memset faults its pages in */
  if (t) memset(t, 0xff, (size_t)n * sizeof *t);  /* id PG_NIL everywhere */
  return t;
}

/* double the table and reinsert every slot (hashes are stored: no node is touched); on allocation failure keep
   the old table, which still works while it has an empty slot */
static int table_grow(pg_store *st) {
  uint32_t n = (st->mask + 1) * 2, i;
  pg_slot *t;
  if (n == 0 || n > (1u << 31)) return PG_ERR_NOMEM;
  if (!(t = slots_new(n))) return PG_ERR_NOMEM;
  for (i = 0; i <= st->mask; i++) {
    pg_slot s = st->slots[i];
    uint32_t j;
    if (s.id == PG_NIL) continue;
    for (j = s.hash & (n - 1); t[j].id != PG_NIL; j = (j + 1) & (n - 1)) {}
    t[j] = s;
  }
  pg_mem_free(st->slots, ((size_t)st->mask + 1) * sizeof *st->slots);
  st->slots = t;
  st->mask = n - 1;
  return 0;
}

/* see store_impl.h. The top k free ids become ascending from the top: a bitmap over the ids below nalloc, set for
   each, then read from the highest word down (O(k + nalloc / 64), no sort). */
void pg_store_free_order_locked(pg_store *st, int64_t k) {
  uint64_t *bits;
  uint32_t i, lo, top, w;
  if (k < PG_FREE_ORDER_MIN || st->nfree < 2) return;
  lo = k < (int64_t)st->nfree ? st->nfree - (uint32_t)k : 0;
  if (!(bits = (uint64_t *)calloc(((size_t)st->nalloc >> 6) + 1, sizeof *bits))) return;  /* order is a speed hint */
  for (i = lo; i < st->nfree; i++) bits[st->freeids[i] >> 6] |= (uint64_t)1 << (st->freeids[i] & 63);
  top = lo;
  for (w = (st->nalloc >> 6) + 1; w-- > 0;) {
    uint64_t b = bits[w];
    int j;
    for (j = 63; b && j >= 0; j--)
      if (b >> j & 1) {
        st->freeids[top++] = (w << 6) | (uint32_t)j;
        b &= ~((uint64_t)1 << j);
      }
  }
  free(bits);
}

/* see pygrad.h */
void pg_store_free_order(pg_store *st, int64_t k) {
  pg_lock_take(&st->lock);
  pg_store_free_order_locked(st, k);
  pg_lock_drop(&st->lock);
}

/* grow the table (with the lock held) so that extra more nodes fit under its 3/4 load without growing on the way:
   a bulk builder calls it once instead of doubling the table many times while it inserts. Best effort: without
   memory the table stays as it is (and grows as needed later). */
void pg_store_reserve_locked(pg_store *st, int64_t extra) {
  if (extra <= 0 || extra > (int64_t)PG_MAX_NODES) return;
  while (((uint64_t)st->live + (uint64_t)extra) * 4 > ((uint64_t)st->mask + 1) * 3)
    if (table_grow(st) != 0) return;
}

/* remove id (with hash h) from the table, shifting later entries of its probe run back so no tombstones exist */
static void table_remove(pg_store *st, uint32_t id, uint32_t h) {
  pg_slot *t = st->slots;
  uint32_t m = st->mask, i = h & m, j;
  while (t[i].id != id) i = (i + 1) & m;  /* it is there: every live node is in the table */
  for (j = i;;) {
    uint32_t k;
    j = (j + 1) & m;
    if (t[j].id == PG_NIL) break;
    k = t[j].hash & m;  /* home slot of the entry at j: it may move to i unless its home lies in (i, j] */
    if (i <= j ? (i < k && k <= j) : (i < k || k <= j)) continue;
    t[i] = t[j];
    i = j;
  }
  t[i].id = PG_NIL;
}

/* an empty store; NULL if memory or a mutex cannot be had */
pg_store *pg_store_new(void) {
  pg_store *st = (pg_store *)calloc(1, sizeof *st);
  if (!st) return NULL;
  st->slots = slots_new(INIT_SLOTS);
  if (!st->slots || pg_lock_init(&st->lock) != 0) {
    pg_mem_free(st->slots, INIT_SLOTS * sizeof *st->slots);
    free(st);
    return NULL;
  }
  st->mask = INIT_SLOTS - 1;
  st->users = 1;  /* the owner's */
  st->epoch = 1;
  return st;
}

/* free the store and everything in it: its owner and every C structure that uses it are gone */
static void store_free(pg_store *st) {
  uint32_t i;
  for (i = 0; i < st->nalloc; i++) {
    pg_node *n = pg_node_at(st, i);
    if (n->rc && n->nsrc > PG_INLINE_SRC) free(n->src.ext);
  }
  for (i = 0; i < st->npages; i++)
    if (i < PG_SMALL_PAGES) free(st->pages[i]);
    else if (page_is_group_head(i)) pg_mem_free(st->pages[i], PG_GROUP_BYTES);
  free(st->pages);
  free(st->freeids);
  pg_mem_free(st->slots, ((size_t)st->mask + 1) * sizeof *st->slots);
  free(st->argrc);
  free(st->argid);
  free(st->argq);
  free(st->dead);
  pg_mem_free(st->scratch, st->scratchcap);
  pg_serial_cache_free(st->sigcache);
  pg_lock_destroy(&st->lock);
  free(st);
}

/* drop the owner's reference: the store is freed once no program, template cache or gradient run uses it either,
   so the order in which a caller frees them cannot leave one of them on freed memory */
void pg_store_delete(pg_store *st) {
  if (st) pg_store_release(st);
}

/* one more user (a program, template cache or gradient run), counted under the lock its maker already holds */
void pg_store_retain_locked(pg_store *st) { st->users++; }

/* one user fewer; the last one out frees the store (nobody else can reach it then, so no lock is needed) */
void pg_store_release(pg_store *st) {
  int64_t left;
  pg_lock_take(&st->lock);
  left = --st->users;
  pg_lock_drop(&st->lock);
  if (left == 0) store_free(st);
}

/* make sure the slot for a new id exists (a new page when nalloc crosses a page boundary) */
static int reserve_slot(pg_store *st) {
  pg_node *page;
  if (st->nfree) return 0;                                  /* a recycled id */
  if (st->nalloc >= PG_MAX_NODES) return PG_ERR_NOMEM;      /* ids are int32 */
  if ((st->nalloc >> PG_PAGE_BITS) < st->npages) return 0;  /* room in the last page */
  if (((uint64_t)st->npages + 1) * PG_PAGE_SIZE > st->freecap) {  /* every id may be freed at once: room for all */
    uint64_t cap = st->freecap ? (uint64_t)st->freecap * 2 : 4 * PG_PAGE_SIZE;
    uint32_t *f = (uint32_t *)realloc(st->freeids, (size_t)cap * sizeof *f);
    if (!f) return PG_ERR_NOMEM;
    st->freeids = f;
    st->freecap = cap;
  }
  if (st->npages == st->pagecap) {
    uint32_t cap = st->pagecap ? st->pagecap * 2 : 16;
    pg_node **pp = (pg_node **)realloc(st->pages, (size_t)cap * sizeof *pp);
    if (!pp) return PG_ERR_NOMEM;
    st->pages = pp;
    st->pagecap = cap;
  }
  if (st->npages < PG_SMALL_PAGES) page = (pg_node *)malloc(PG_PAGE_SIZE * sizeof *page);
  else if (page_is_group_head(st->npages)) {
    page = (pg_node *)pg_mem_alloc(PG_GROUP_BYTES);
    pg_mem_huge(page, PG_GROUP_BYTES);
  } else page = st->pages[st->npages - 1] + PG_PAGE_SIZE;  /* the next page of the group */
  if (!page) return PG_ERR_NOMEM;
  st->pages[st->npages++] = page;
  return 0;
}

/* an arg/tag/pdata id lost a user: queue it for arg_drain when its count reaches 0 (at most once at a time) */
static PG_INLINE void count_release(pg_store *st, int32_t aid) {
  int32_t k = PG_ARG_SLOT(aid);
  if (--st->argrc[k] == 0 && !st->argq[k]) {
    st->argq[k] = 1;
    st->dead[st->ndead++] = aid;  /* capacity argcap: a slot is queued at most once */
  }
}

/* see store_impl.h */
int pg_store_arg_check_locked(const pg_store *st, int32_t aid) {
  int32_t k = PG_ARG_SLOT(aid);
  if (aid == 0) return 0;
  if (aid < 0 || k == 0 || k >= st->argn) return PG_ERR_ARG;
  return st->argid[k] != aid || st->argrc[k] < 0 ? PG_ERR_ARG_GONE : 0;
}

/* enter id (hash h), which is not in the table, in the first empty slot of its probe run */
static PG_INLINE void table_put(pg_store *st, uint32_t h, uint32_t id) {
  uint32_t slot;
  for (slot = h & st->mask; st->slots[slot].id != PG_NIL; slot = (slot + 1) & st->mask) {}
  st->slots[slot].hash = h;
  st->slots[slot].id = id;
}

#define PG_FREE_AHEAD 8  /* recycled ids ahead of the one being taken whose node is prefetched */

/* validate, allocate and fill a new node with key hash h (no live node has its key), not entered in the table;
   returns its id or an error (then nothing changed). held: the caller holds a reference on every source, so each
   is a live id (only its count is checked) */
static PG_INLINE int32_t node_add(pg_store *st, uint32_t h, int32_t op, int32_t dtype, const int32_t *src,
                                  int32_t nsrc, int32_t arg, int32_t tag, int32_t meta, int held) {
  uint32_t id;
  int32_t i, *ext = NULL;
  pg_node *n;
  int err;
  for (i = 0; i < nsrc; i++) {
    pg_node *s = held ? pg_node_at(st, (uint32_t)src[i]) : pg_node_live(st, src[i]);
    if (!s) return PG_ERR_BADID;
    if (s->rc >= UINT32_MAX - (uint32_t)nsrc) return PG_ERR_NOMEM;
  }
  if ((err = pg_store_arg_check_locked(st, arg)) != 0 || (err = pg_store_arg_check_locked(st, tag)) != 0) return err;
  if ((arg && st->argrc[PG_ARG_SLOT(arg)] >= INT32_MAX - 1) || (tag && st->argrc[PG_ARG_SLOT(tag)] >= INT32_MAX - 1))
    return PG_ERR_NOMEM;
  if (nsrc > PG_INLINE_SRC) {
    ext = (int32_t *)malloc((size_t)nsrc * sizeof *ext);
    if (!ext) return PG_ERR_NOMEM;
  }
  if ((err = reserve_slot(st)) != 0) {
    free(ext);
    return err;
  }
  /* keep the load factor <= 3/4 (live counts nodes not entered yet, so their slots are there when they are) */
  if (((uint64_t)st->live + 1) * 4 > ((uint64_t)st->mask + 1) * 3 && table_grow(st) != 0 &&
      (uint64_t)st->live + 1 > st->mask) {  /* no memory to grow, and probes need one empty slot */
    free(ext);
    return PG_ERR_NOMEM;
  }
  /* nothing can fail from here on */
  if (st->nfree) {
    id = st->freeids[--st->nfree];
    n = pg_node_at(st, id);
    if (st->nfree >= PG_FREE_AHEAD) {  /* a recycled node is anywhere: fetch the one a later make gets */
      const char *p = (const char *)pg_node_at(st, st->freeids[st->nfree - PG_FREE_AHEAD]);
      PG_PREFETCH(p);
      PG_PREFETCH(p + sizeof *n - 1);
    }
  } else {
    id = st->nalloc++;
    n = pg_node_at(st, id);
  }
  if (arg) st->argrc[PG_ARG_SLOT(arg)]++;
  if (tag) st->argrc[PG_ARG_SLOT(tag)]++;
  for (i = 0; i < nsrc; i++) pg_node_at(st, (uint32_t)src[i])->rc++;
  pg_node_init(n, h, op, dtype, nsrc, arg, tag, meta);
  if (ext) {
    memcpy(ext, src, (size_t)nsrc * sizeof *ext);
    n->src.ext = ext;
  } else {  /* a fixed-length loop the compiler unrolls: memset and memcpy calls cost more than the copy */
    for (i = 0; i < PG_INLINE_SRC; i++) n->src.in[i] = i < nsrc ? src[i] : 0;
  }
  st->live++;
  return (int32_t)id;
}

/* make with the lock held: look the key up, else validate, allocate and link a new node */
int32_t pg_store_make_locked(pg_store *st, int32_t op, int32_t dtype, const int32_t *src, int32_t nsrc, int32_t arg,
                             int32_t tag, int32_t meta) {
  uint32_t h, slot;
  int32_t id;
  if (nsrc < 0 || (nsrc > 0 && !src)) return PG_ERR_BADID;
  h = pg_key_hash(op, dtype, src, nsrc, arg, tag);
  for (slot = h & st->mask;; slot = (slot + 1) & st->mask) {
    pg_slot e = st->slots[slot];
    pg_node *n;
    if (e.id == PG_NIL) break;  /* not there */
    if (e.hash != h) continue;
    n = pg_node_at(st, e.id);
    if (pg_key_equal(n, h, op, dtype, src, nsrc, arg, tag)) {  /* a match implies its sources and args are valid */
      if (n->rc == UINT32_MAX) return PG_ERR_NOMEM;         /* out of references */
      n->rc++;
      return (int32_t)e.id;
    }
  }
  id = node_add(st, h, op, dtype, src, nsrc, arg, tag, meta, 0);
  if (id >= 0) table_put(st, h, (uint32_t)id);  /* the probe run just read is in cache (unless the table grew) */
  return id;
}

/* see store_impl.h: node_add without the lookup, and without entering the node in the table */
int32_t pg_store_make_new_locked(pg_store *st, uint32_t h, int32_t op, int32_t dtype, const int32_t *src,
                                 int32_t nsrc, int32_t arg, int32_t tag, int32_t meta) {
  if (nsrc < 0 || (nsrc > 0 && !src)) return PG_ERR_BADID;
  return node_add(st, h, op, dtype, src, nsrc, arg, tag, meta, 0);
}

/* see store_impl.h */
int32_t pg_store_make_held_locked(pg_store *st, uint32_t h, int32_t op, int32_t dtype, const int32_t *src,
                                  int32_t nsrc, int32_t arg, int32_t tag, int32_t meta) {
  if (nsrc < 0 || (nsrc > 0 && !src)) return PG_ERR_BADID;
  return node_add(st, h, op, dtype, src, nsrc, arg, tag, meta, 1);
}

/* see store_impl.h. Each entry's probe run starts at a random slot of a table much larger than the caches: the
   slots PG_LINK_AHEAD entries on are prefetched, so the misses overlap instead of coming one after another. */
#define PG_LINK_AHEAD 16
void pg_store_link_locked(pg_store *st, const pg_slot *pend, int64_t n) {
  int64_t k;
  for (k = 0; k < n && k < PG_LINK_AHEAD; k++) PG_PREFETCH(&st->slots[pend[k].hash & st->mask]);
  for (k = 0; k < n; k++) {
    if (k + PG_LINK_AHEAD < n) PG_PREFETCH(&st->slots[pend[k + PG_LINK_AHEAD].hash & st->mask]);
    table_put(st, pend[k].hash, pend[k].id);
  }
}

/* the node with these fields, with one new reference for the caller; or a negative error */
int32_t pg_store_make(pg_store *st, int32_t op, int32_t dtype, const int32_t *src, int32_t nsrc, int32_t arg,
                      int32_t tag, int32_t meta) {
  int32_t r;
  pg_lock_take(&st->lock);
  r = pg_store_make_locked(st, op, dtype, src, nsrc, arg, tag, meta);
  pg_lock_drop(&st->lock);
  return r;
}

/* make without sources: fixed arity saves Python building an array */
int32_t pg_store_make0(pg_store *st, int32_t op, int32_t dtype, int32_t arg, int32_t tag, int32_t meta) {
  return pg_store_make(st, op, dtype, NULL, 0, arg, tag, meta);
}

/* make with one source */
int32_t pg_store_make1(pg_store *st, int32_t op, int32_t dtype, int32_t s0, int32_t arg, int32_t tag, int32_t meta) {
  int32_t s[1];
  s[0] = s0;
  return pg_store_make(st, op, dtype, s, 1, arg, tag, meta);
}

/* make with two sources */
int32_t pg_store_make2(pg_store *st, int32_t op, int32_t dtype, int32_t s0, int32_t s1, int32_t arg, int32_t tag,
                       int32_t meta) {
  int32_t s[2];
  s[0] = s0;
  s[1] = s1;
  return pg_store_make(st, op, dtype, s, 2, arg, tag, meta);
}

/* make with three sources */
int32_t pg_store_make3(pg_store *st, int32_t op, int32_t dtype, int32_t s0, int32_t s1, int32_t s2, int32_t arg,
                       int32_t tag, int32_t meta) {
  int32_t s[3];
  s[0] = s0;
  s[1] = s1;
  s[2] = s2;
  return pg_store_make(st, op, dtype, s, 3, arg, tag, meta);
}

/* op over node s and a scalar CONST (kdtype, karg, kmeta) found or made in the same call: op(s, k), or op(k, s)
   when reversed. This is `x * 2.0` of the math methods in one call: the constant needs no handle, and its temporary
   reference is dropped before returning (the new node holds it), as the Python path's handle would drop it. */
int32_t pg_store_make2k_locked(pg_store *st, int32_t op, int32_t dtype, int32_t s, int32_t kdtype, int32_t karg,
                               int32_t kmeta, int32_t reversed, int32_t meta) {
  int32_t k, r, src[2];
  k = pg_store_make_locked(st, PG_OP_CONST, kdtype, NULL, 0, karg, 0, kmeta);
  if (k < 0) return k;
  src[0] = reversed ? k : s;
  src[1] = reversed ? s : k;
  r = pg_store_make_locked(st, op, dtype, src, 2, 0, 0, meta);
  pg_store_decref_locked(st, k);  /* cannot fail: k is live */
  return r;
}

/* pg_store_make2k_locked under the lock */
int32_t pg_store_make2k(pg_store *st, int32_t op, int32_t dtype, int32_t s, int32_t kdtype, int32_t karg,
                        int32_t kmeta, int32_t reversed, int32_t meta) {
  int32_t r;
  pg_lock_take(&st->lock);
  r = pg_store_make2k_locked(st, op, dtype, s, kdtype, karg, kmeta, reversed, meta);
  pg_lock_drop(&st->lock);
  return r;
}

/* one more reference on a live node, with the lock held */
int pg_store_incref_locked(pg_store *st, int32_t id) {
  pg_node *n = pg_node_live(st, id);
  if (!n) return PG_ERR_BADID;
  if (n->rc == UINT32_MAX) return PG_ERR_NOMEM;  /* out of references */
  n->rc++;
  return 0;
}

/* one more reference on a live node */
int pg_store_incref(pg_store *st, int32_t id) {
  int r;
  pg_lock_take(&st->lock);
  r = pg_store_incref_locked(st, id);
  pg_lock_drop(&st->lock);
  return r;
}

/* decref with the lock held: at 0 free the node and, iteratively, every source it was the last user of */
int pg_store_decref_locked(pg_store *st, int32_t id) {
  pg_node *n = pg_node_live(st, id);
  uint32_t head, cur;
  if (!n) return PG_ERR_BADID;
  if (--n->rc) return 0;
  n->mark = PG_NIL;  /* an intrusive stack through mark: freeing never recurses nor allocates */
  head = (uint32_t)id;
  while (head != PG_NIL) {
    const int32_t *s;
    int32_t i;
    cur = head;
    n = pg_node_at(st, cur);
    head = n->mark;
    table_remove(st, cur, n->hash);
    if (n->arg) count_release(st, n->arg);
    if (n->tag) count_release(st, n->tag);
    if (n->pdata) count_release(st, n->pdata);
    s = pg_node_src(n);
    for (i = 0; i < n->nsrc; i++) {
      pg_node *c = pg_node_at(st, (uint32_t)s[i]);
      if (--c->rc == 0) {  /* last user gone: free it next (PyCore's stack order) */
        c->mark = head;
        head = (uint32_t)s[i];
      }
    }
    if (n->nsrc > PG_INLINE_SRC) free(n->src.ext);
    n->nsrc = 0;
    st->freeids[st->nfree++] = cur;  /* room: nfree < nalloc <= freecap */
    st->live--;
  }
  return 0;
}

/* drop one reference */
int pg_store_decref(pg_store *st, int32_t id) {
  int r;
  pg_lock_take(&st->lock);
  r = pg_store_decref_locked(st, id);
  pg_lock_drop(&st->lock);
  return r;
}

/* decref ids[0..n) in order under one lock: the handles that died since the last call, released in one C call
   instead of one each; stops at the first id that names no live node and returns its error */
int pg_store_decref_many(pg_store *st, const int32_t *ids, int32_t n) {
  int32_t i;
  int r = 0;
  if (n < 0 || (n > 0 && !ids)) return PG_ERR_BADID;
  pg_lock_take(&st->lock);
  for (i = 0; i < n && r == 0; i++) r = pg_store_decref_locked(st, ids[i]);
  pg_lock_drop(&st->lock);
  return r;
}

/* the fields of a live node, with the lock held */
int pg_store_info_locked(const pg_store *st, int32_t id, pg_info *out) {
  const pg_node *n = pg_node_live(st, id);
  if (!n || !out) return PG_ERR_BADID;
  out->op = n->op;
  out->dtype = n->dtype;
  out->nsrc = n->nsrc;
  out->arg = n->arg;
  out->tag = n->tag;
  out->meta = n->meta;
  out->pdata = n->pdata;
  return 0;
}

/* the fields of a live node */
int pg_store_info(pg_store *st, int32_t id, pg_info *out) {
  int r;
  pg_lock_take(&st->lock);
  r = pg_store_info_locked(st, id, out);
  pg_lock_drop(&st->lock);
  return r;
}

/* write up to cap sources of a live node to out; returns how many it has (call again if more than cap) */
int32_t pg_store_src(pg_store *st, int32_t id, int32_t *out, int32_t cap) {
  pg_node *n;
  int32_t r;
  pg_lock_take(&st->lock);
  n = pg_node_live(st, id);
  if (!n || cap < 0 || (cap > 0 && !out)) r = PG_ERR_BADID;
  else {
    r = n->nsrc;
    if (r) memcpy(out, pg_node_src(n), (size_t)(r < cap ? r : cap) * sizeof *out);
  }
  pg_lock_drop(&st->lock);
  return r;
}

/* pg_store_info and pg_store_src of n nodes in one call (a planner reads a whole graph): info[i] for ids[i], and
   their sources concatenated in order into src, at most cap of them; returns the total number of sources (call
   again with a larger src if more than cap), or PG_ERR_BADID if an id is not a live node (nothing else is read) */
int64_t pg_store_rows(pg_store *st, const int32_t *ids, int64_t n, pg_info *info, int32_t *src, int64_t cap) {
  int64_t i, total = 0;
  if (n < 0 || cap < 0 || (n > 0 && (!ids || !info)) || (cap > 0 && !src)) return PG_ERR_BADID;
  pg_lock_take(&st->lock);
  for (i = 0; i < n; i++) {
    const pg_node *nd = pg_node_live(st, ids[i]);
    if (!nd) {
      total = PG_ERR_BADID;
      break;
    }
    info[i].op = nd->op;
    info[i].dtype = nd->dtype;
    info[i].nsrc = nd->nsrc;
    info[i].arg = nd->arg;
    info[i].tag = nd->tag;
    info[i].meta = nd->meta;
    info[i].pdata = nd->pdata;
    if (total + nd->nsrc <= cap && nd->nsrc) memcpy(src + total, pg_node_src(nd), (size_t)nd->nsrc * sizeof *src);
    total += nd->nsrc;
  }
  pg_lock_drop(&st->lock);
  return total;
}

/* pg_store_set_pdata with the lock held (the gradient run carries metadata onto the nodes it makes) */
int pg_store_set_pdata_locked(pg_store *st, int32_t id, int32_t pdata) {
  pg_node *n = pg_node_live(st, id);
  int32_t old;
  int err;
  if (!n) return PG_ERR_BADID;
  if ((err = pg_store_arg_check_locked(st, pdata)) != 0) return err;  /* gone: the caller interns it again */
  if (pdata && st->argrc[PG_ARG_SLOT(pdata)] == INT32_MAX) return PG_ERR_NOMEM;
  old = n->pdata;
  if (pdata) st->argrc[PG_ARG_SLOT(pdata)]++;
  n->pdata = pdata;
  if (old) count_release(st, old);
  return 0;
}

/* attach side data (a counted id, 0 for none) to a node, releasing the previous one */
int pg_store_set_pdata(pg_store *st, int32_t id, int32_t pdata) {
  int r;
  pg_lock_take(&st->lock);
  r = pg_store_set_pdata_locked(st, id, pdata);
  pg_lock_drop(&st->lock);
  return r;
}

/* how many nodes are live */
int64_t pg_store_live(pg_store *st) {
  int64_t r;
  pg_lock_take(&st->lock);
  r = st->live;
  pg_lock_drop(&st->lock);
  return r;
}

/* one past the largest id handed out so far: every live id is below it */
int64_t pg_store_id_bound(pg_store *st) {
  int64_t r;
  pg_lock_take(&st->lock);
  r = st->nalloc;
  pg_lock_drop(&st->lock);
  return r;
}

/* grow the count arrays (and the queue, so releasing never allocates) to hold slots below need */
static int args_grow(pg_store *st, int32_t need) {
  int64_t cap = st->argcap ? st->argcap : 64, k;
  int32_t *rc, *ids, *dead;
  uint8_t *q;
  while (cap < need) cap *= 2;
  if (cap > INT32_MAX) cap = INT32_MAX;
  rc = (int32_t *)realloc(st->argrc, (size_t)cap * sizeof *rc);
  if (!rc) return PG_ERR_NOMEM;
  st->argrc = rc;
  ids = (int32_t *)realloc(st->argid, (size_t)cap * sizeof *ids);
  if (!ids) return PG_ERR_NOMEM;
  st->argid = ids;
  q = (uint8_t *)realloc(st->argq, (size_t)cap);
  if (!q) return PG_ERR_NOMEM;
  st->argq = q;
  dead = (int32_t *)realloc(st->dead, (size_t)cap * sizeof *dead);
  if (!dead) return PG_ERR_NOMEM;
  st->dead = dead;
  memset(rc + st->argcap, 0, (size_t)(cap - st->argcap) * sizeof *rc);
  memset(q + st->argcap, 0, (size_t)(cap - st->argcap));
  for (k = st->argcap; k < cap; k++) ids[k] = (int32_t)k;  /* slots skipped by a registration: generation 0 */
  st->argcap = (int32_t)cap;
  return 0;
}

/* one more hold on a registered, not drained arg/tag id (0 needs none), with the lock held: for C structures
   (template programs) that keep ids beyond the nodes that use them */
int pg_store_arg_hold_locked(pg_store *st, int32_t aid) {
  int err = pg_store_arg_check_locked(st, aid);
  if (aid == 0 || err) return err;
  if (st->argrc[PG_ARG_SLOT(aid)] == INT32_MAX) return PG_ERR_NOMEM;
  st->argrc[PG_ARG_SLOT(aid)]++;
  return 0;
}

/* drop a hold taken by pg_store_arg_hold_locked */
void pg_store_arg_release_locked(pg_store *st, int32_t aid) {
  if (aid && pg_store_arg_check_locked(st, aid) == 0 && st->argrc[PG_ARG_SLOT(aid)] > 0) count_release(st, aid);
}

/* make aid a counted id with count 0 (growing the table as needed); its slot must be new, gone, or hold aid */
int pg_store_arg_register(pg_store *st, int32_t aid) {
  int32_t k = PG_ARG_SLOT(aid);
  int r = 0;
  pg_lock_take(&st->lock);
  if (aid <= 0 || k == 0) r = PG_ERR_ARG;
  else if (k < st->argn && st->argid[k] != aid && st->argrc[k] >= 0) r = PG_ERR_ARG;  /* a live id's slot */
  else if (k >= st->argcap) r = args_grow(st, k + 1);
  if (r == 0) {
    /* a slot's generation wrapped: the signature cache (serial_build.c) keeps ids without holding them, and one of
       its entries may name this very id from 2^(31 - PG_ARG_SLOT_BITS) generations ago */
    if (k < st->argn && st->argid[k] != aid && (aid >> PG_ARG_SLOT_BITS) == 0) pg_serial_cache_clear(st->sigcache);
    st->argrc[k] = 0;
    st->argid[k] = aid;
    if (k >= st->argn) st->argn = k + 1;  /* slots in between count as registered, as in PyCore's list */
  }
  pg_lock_drop(&st->lock);
  return r;
}

/* hand back queued ids whose count is still 0, marking them gone (-1); up to cap, the rest stay queued */
int64_t pg_store_arg_drain(pg_store *st, int32_t *out, int64_t cap) {
  int64_t i, n = 0;
  if (cap < 0 || (cap > 0 && !out)) return PG_ERR_ARG;
  pg_lock_take(&st->lock);
  for (i = 0; i < st->ndead; i++) {
    int32_t aid = st->dead[i], k = PG_ARG_SLOT(aid);
    if (st->argrc[k] == 0 && st->argid[k] == aid) {
      if (n == cap) break;  /* full: this one and the rest wait for the next call */
      st->argrc[k] = -1;
      out[n++] = aid;
    }
    st->argq[k] = 0;
  }
  memmove(st->dead, st->dead + i, (size_t)(st->ndead - i) * sizeof *st->dead);
  st->ndead -= i;
  pg_lock_drop(&st->lock);
  return n;
}

/* k fresh walk marks; on wrap-around every node's mark is cleared so stale marks never match */
uint32_t pg_store_epoch_locked(pg_store *st, uint32_t k) {
  uint32_t base;
  if (st->epoch > UINT32_MAX - k - 1) {
    uint32_t i;
    for (i = 0; i < st->nalloc; i++) {
      pg_node *n = pg_node_at(st, i);
      n->mark = 0;
    }
    st->epoch = 1;
  }
  base = st->epoch;
  st->epoch += k;
  return base;
}
