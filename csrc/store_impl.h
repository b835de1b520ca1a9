/* Internals of the node store shared by the C files (store.c, walk.c, and later passes). Not seen by cffi.
   It includes pygrad.h (which has no include guard, since cffi reads it): a .c file includes this header or
   pygrad.h, never both. */
#ifndef PG_STORE_IMPL_H
#define PG_STORE_IMPL_H

#include <stddef.h>
#include <stdint.h>
#include "pygrad.h"
#include "lock.h"
#include "tables.h"   /* PG_OP_* */

#define PG_NIL UINT32_MAX       /* "no id" in chains and intrusive stacks */
#define PG_INLINE_SRC 4         /* sources kept inside the node; more go to a side allocation */
#define PG_PAGE_BITS 12         /* nodes live in pages of 4096: ids never move them */
#define PG_PAGE_SIZE (1u << PG_PAGE_BITS)
#define PG_MAX_NODES 0x7fffffffu /* ids are int32 */

/* a hash table slot: the key's hash beside the id, so probes touch no node until the hashes agree */
typedef struct pg_slot { uint32_t hash, id; } pg_slot;

/* one node: 56 bytes (checked below), sources inline up to PG_INLINE_SRC */
typedef struct pg_node {
  uint32_t hash;  /* hash of the key (op, dtype, src, arg, tag), cached for lookup and rehash */
  uint32_t rc;    /* references: users plus Python handles; 0 marks a free slot */
  uint32_t mark;  /* walk epoch while live; the intrusive stack link while being freed */
  int32_t op, dtype, nsrc, arg, tag, meta, pdata;
  union { int32_t in[PG_INLINE_SRC]; int32_t *ext; } src;
} pg_node;
typedef char pg_node_is_56_bytes[sizeof(pg_node) == 56 ? 1 : -1];  /* the size the benchmarks report */

struct pg_store {
  pg_lock lock;
  int64_t users;         /* the owner plus every program, template cache and gradient run made on the store */
  pg_node **pages;       /* pages[id >> PG_PAGE_BITS][id & (PG_PAGE_SIZE - 1)] */
  uint32_t npages, pagecap;
  uint32_t nalloc;       /* ids handed out so far: [0, nalloc) */
  uint32_t *freeids;     /* stack of freed ids, the next to reuse last (PyCore's free list order): an array, not a
                            list through the nodes, so the nodes that makes will reuse can be fetched ahead */
  uint32_t nfree;
  uint64_t freecap;      /* >= npages * PG_PAGE_SIZE: freeing never allocates */
  int64_t live;
  pg_slot *slots;        /* open addressing, linear probing, backward-shift deletion; id PG_NIL = empty */
  uint32_t mask;         /* slots - 1 (a power of two minus one) */
  int32_t *argrc;        /* per arg slot (PG_ARG_SLOT): the count of its id; -1 = gone */
  int32_t *argid;        /* per arg slot: the id registered in it (ids of another generation read as gone) */
  uint8_t *argq;         /* 1 if the slot is in the dead queue (so the queue never exceeds argcap) */
  int32_t *dead;         /* queue of ids whose count reached 0, oldest first; capacity argcap */
  int64_t ndead;
  int32_t argn;          /* slots below argn are registered (PyCore's len(argrc)) */
  int32_t argcap;        /* allocated length of argrc, argid, argq and dead */
  uint32_t epoch;        /* next unused walk mark; 0 is never a mark */
  struct pg_sigcache *sigcache;  /* serial_build.c's signature cache (NULL until a builder needs it) */
  void *scratch;         /* walk stack, kept between walks while small */
  size_t scratchcap;     /* bytes */
};

/* prefetch the cache line at p for writing (a hint: nothing where the compiler has no such builtin) */
#if defined(__GNUC__) || defined(__clang__)
#define PG_PREFETCH(p) __builtin_prefetch((p), 1)
#elif defined(_MSC_VER) && (defined(_M_X64) || defined(_M_IX86))
#include <xmmintrin.h>
#define PG_PREFETCH(p) _mm_prefetch((const char *)(p), _MM_HINT_T0)
#else
#define PG_PREFETCH(p) ((void)(p))
#endif

/* the slot of an arg/tag/pdata id (csrc/tables.h): the index of its count */
#define PG_ARG_SLOT(aid) ((int32_t)((uint32_t)(aid) & ((1u << PG_ARG_SLOT_BITS) - 1)))

/* the node of a valid id */
static PG_INLINE pg_node *pg_node_at(const pg_store *st, uint32_t id) {
  return &st->pages[id >> PG_PAGE_BITS][id & (PG_PAGE_SIZE - 1)];
}

/* the node of id if it names a live node, else NULL: every id from Python goes through this */
static PG_INLINE pg_node *pg_node_live(const pg_store *st, int32_t id) {
  pg_node *n;
  if (id < 0 || (uint32_t)id >= st->nalloc) return NULL;
  n = pg_node_at(st, (uint32_t)id);
  return n->rc ? n : NULL;
}

/* a node's sources, wherever they are stored */
static PG_INLINE const int32_t *pg_node_src(const pg_node *n) {
  return n->nsrc <= PG_INLINE_SRC ? n->src.in : n->src.ext;
}

/* one round of the key hash: xor a word in, multiply, fold the high half down */
static PG_INLINE uint64_t pg_hash_mix(uint64_t h, uint32_t w) {
  h ^= w;
  h *= 0xff51afd7ed558ccdull;
  return h ^ (h >> 32);
}

/* the hash of a key; meta is not part of the key (it is derived from it). Finished with murmur3's fmix64 so the
   low bits, which pick the slot, depend on every word. In three steps for a caller that hashes sources as it reads
   them: pg_key_hash_start, pg_hash_mix per source id, pg_key_hash_end */
static PG_INLINE uint64_t pg_key_hash_start(int32_t op, int32_t dtype, int32_t nsrc) {
  return pg_hash_mix(0x243f6a8885a308d3ull, (uint32_t)op ^ ((uint32_t)dtype << 16) ^ ((uint32_t)nsrc << 24));
}
static PG_INLINE uint32_t pg_key_hash_end(uint64_t h, int32_t arg, int32_t tag) {
  h = pg_hash_mix(h, (uint32_t)arg);
  h = pg_hash_mix(h, (uint32_t)tag);
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 33;
  return (uint32_t)h;
}
static PG_INLINE uint32_t pg_key_hash(int32_t op, int32_t dtype, const int32_t *src, int32_t nsrc, int32_t arg,
                                      int32_t tag) {
  uint64_t h = pg_key_hash_start(op, dtype, nsrc);
  int32_t i;
  for (i = 0; i < nsrc; i++) h = pg_hash_mix(h, (uint32_t)src[i]);
  return pg_key_hash_end(h, arg, tag);
}

/* whether node n has exactly this key */
static PG_INLINE int pg_key_equal(const pg_node *n, uint32_t h, int32_t op, int32_t dtype, const int32_t *src,
                                  int32_t nsrc, int32_t arg, int32_t tag) {
  const int32_t *s;
  int32_t i;
  if (n->hash != h || n->op != op || n->dtype != dtype || n->nsrc != nsrc || n->arg != arg || n->tag != tag) return 0;
  s = pg_node_src(n);
  for (i = 0; i < nsrc; i++)
    if (s[i] != src[i]) return 0;
  return 1;
}

/* unlocked store operations for C passes that already hold st->lock (same semantics as the public ones) */
int32_t pg_store_make_locked(pg_store *st, int32_t op, int32_t dtype, const int32_t *src, int32_t nsrc, int32_t arg,
                             int32_t tag, int32_t meta);
/* Bulk insertion in two steps, for a caller that has proved that no live node has the key (e.g. the key has a
   source all of whose users the caller knows, and none has the key: every user of a node holds a reference to it):
   make_new makes the node (id, or an error) without the table lookup, h being the key's pg_key_hash, but does not
   enter it in the table; link enters such nodes, given as (hash, id) slots. Until then the table lacks them: the
   caller links every node it made this way before it looks a key up that one of them may have, frees a node, or
   drops the lock. Linking many at once lets the table's cache misses overlap. */
int32_t pg_store_make_new_locked(pg_store *st, uint32_t h, int32_t op, int32_t dtype, const int32_t *src,
                                 int32_t nsrc, int32_t arg, int32_t tag, int32_t meta);
/* make_new for a caller that holds a reference on every source (so they are live ids: not checked again) */
int32_t pg_store_make_held_locked(pg_store *st, uint32_t h, int32_t op, int32_t dtype, const int32_t *src,
                                  int32_t nsrc, int32_t arg, int32_t tag, int32_t meta);
void pg_store_link_locked(pg_store *st, const pg_slot *pend, int64_t n);
/* pg_store_make_held_locked inline for the common case (sources inline, an id at hand without a new page, the
   table under its load, every count far from overflow), with the same checks; anything else goes the long way.
   The bulk builder makes most of a loaded graph's nodes through this: the call and the checks repeated in the
   general path were a sixth of a load. */
static PG_INLINE int pg_arg_ok(const pg_store *st, int32_t aid) {  /* 0, or a live id with room for a count */
  int32_t k = PG_ARG_SLOT(aid);
  return aid == 0 || (aid > 0 && k != 0 && k < st->argn && st->argid[k] == aid && st->argrc[k] >= 0 &&
                      st->argrc[k] < INT32_MAX - 1);
}
/* a new node's fields (its sources are set by the caller); rc 1: the maker's reference */
static PG_INLINE void pg_node_init(pg_node *n, uint32_t h, int32_t op, int32_t dtype, int32_t nsrc, int32_t arg,
                                   int32_t tag, int32_t meta) {
  n->hash = h;
  n->rc = 1;
  n->mark = 0;
  n->op = op;
  n->dtype = dtype;
  n->nsrc = nsrc;
  n->arg = arg;
  n->tag = tag;
  n->meta = meta;
  n->pdata = 0;
}
static PG_INLINE int32_t pg_store_make_held_fast(pg_store *st, uint32_t h, int32_t op, int32_t dtype,
                                                 const int32_t *src, pg_node *const *s, int32_t nsrc, int32_t arg,
                                                 int32_t tag, int32_t meta) {  /* s: the sources' nodes */
  pg_node *n;
  uint32_t id;
  int32_t i;
  if (nsrc < 0 || nsrc > PG_INLINE_SRC || (nsrc > 0 && !src) || !pg_arg_ok(st, arg) || !pg_arg_ok(st, tag) ||
      ((uint64_t)st->live + 1) * 4 > ((uint64_t)st->mask + 1) * 3 ||
      (!st->nfree && (st->nalloc >= PG_MAX_NODES || (st->nalloc >> PG_PAGE_BITS) >= st->npages)))
    return pg_store_make_held_locked(st, h, op, dtype, src, nsrc, arg, tag, meta);
  for (i = 0; i < nsrc; i++) {
    if (s[i]->rc >= UINT32_MAX - (uint32_t)nsrc) return pg_store_make_held_locked(st, h, op, dtype, src, nsrc, arg,
                                                                                  tag, meta);
  }
  id = st->nfree ? st->freeids[--st->nfree] : st->nalloc++;
  n = pg_node_at(st, id);
  if (st->nfree >= 8) PG_PREFETCH(pg_node_at(st, st->freeids[st->nfree - 8]));  /* a later make's node */
  if (arg) st->argrc[PG_ARG_SLOT(arg)]++;
  if (tag) st->argrc[PG_ARG_SLOT(tag)]++;
  for (i = 0; i < nsrc; i++) s[i]->rc++;
  pg_node_init(n, h, op, dtype, nsrc, arg, tag, meta);
  for (i = 0; i < PG_INLINE_SRC; i++) n->src.in[i] = i < nsrc ? src[i] : 0;
  st->live++;
  return (int32_t)id;
}
int pg_store_decref_locked(pg_store *st, int32_t id);
int pg_store_incref_locked(pg_store *st, int32_t id);
int pg_store_info_locked(const pg_store *st, int32_t id, pg_info *out);
int32_t pg_store_make2k_locked(pg_store *st, int32_t op, int32_t dtype, int32_t s, int32_t kdtype, int32_t karg,
                               int32_t kmeta, int32_t reversed, int32_t meta);
int pg_store_set_pdata_locked(pg_store *st, int32_t id, int32_t pdata);
void pg_store_reserve_locked(pg_store *st, int64_t extra);
/* with the lock held: order the next k ids that makes will recycle (the top k of the free stack) so they are taken
   in ascending order, when k >= PG_FREE_ORDER_MIN. The free stack is in the order the last graphs were freed, so
   after a few build-and-free cycles a bulk build put consecutive rows on scattered nodes (each load and build of
   1.45M rows slower than the last, up to 1.35x); ascending ids are ascending addresses. PyCore's free_order does
   the same, so both cores still hand out the same ids. */
void pg_store_free_order_locked(pg_store *st, int64_t k);
/* serial_build.c: a store's signature cache, freed with the store; emptied (lock held) when an arg id's generation
   wraps */
typedef struct pg_sigcache pg_sigcache;
void pg_serial_cache_free(pg_sigcache *c);
void pg_serial_cache_clear(pg_sigcache *c);
/* whether aid may be given to a node: 0 (none or a live id), PG_ERR_ARG (never registered) or PG_ERR_ARG_GONE
   (drained, or its slot now holds a later id) */
int pg_store_arg_check_locked(const pg_store *st, int32_t aid);
/* hold an arg/tag id for a C structure (0 or an error code), and release it */
int pg_store_arg_hold_locked(pg_store *st, int32_t aid);
void pg_store_arg_release_locked(pg_store *st, int32_t aid);
/* one more user of the store (with the lock held), and one less (without it): the last one frees the store */
void pg_store_retain_locked(pg_store *st);
void pg_store_release(pg_store *st);
/* reserve k consecutive walk marks and return the first; resets every mark when the counter would wrap */
uint32_t pg_store_epoch_locked(pg_store *st, uint32_t k);

#endif
