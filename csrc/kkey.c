/* kkey.c: the kernel cache's key of a small kernel, made from the C walk's entries (pygrad/engine/kcache.py,
   KernelCache.walked_c; walked_key is the Python version). A kernel's key is everything lowering reads: a head
   (index space, reduction, the store's storage type and view: one id from Python), per walk entry an ALU node's
   signature or its load's number, the operands, per load its spec (op, dtype, constant, storage type, view: one id
   from Python) and its buffer's number (buffers numbered by first use), and the store's buffer number. Equal keys
   are one class (an int): the kernels of a class get one lowering's words with their own buffers.

   A leaf is read as a load: its node's buffer and view class (a view class: the load's op, dtype, constant,
   storage type and view, interned by Python; equal classes over one buffer are one load), with the leaf's pending
   movements (its cell) applied: Python computes a (view class, cell, index space)'s class once per plan and
   registers it here (pg_kkey_view), and a node's buffer and class once (pg_kkey_node), so a kernel whose leaves
   read known nodes through known movements is keyed without any Python object. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "kkey_impl.h"

/* a map of capacity cap (a power of two), all slots empty; -1 without memory */
static int kk_init(kk_map *m, int64_t cap) {
  int64_t i;
  m->s = (kk_slot *)malloc((size_t)cap * sizeof *m->s);
  if (!m->s) return -1;
  for (i = 0; i < cap; i++) m->s[i].k1 = -1;
  m->cap = cap, m->len = 0;
  return 0;
}

/* the mixed hash of a key pair (a multiply-xorshift: keys are small dense ints) */
static uint64_t kk_hash(int64_t k1, int64_t k2) {
  uint64_t h = (uint64_t)k1 * UINT64_C(0x9E3779B97F4A7C15) ^ (uint64_t)k2 * UINT64_C(0xC2B2AE3D27D4EB4F);
  return h ^ (h >> 29);
}

/* the slot holding (k1, k2), or the empty slot where it would go */
static int64_t kk_slot_of(const kk_map *m, int64_t k1, int64_t k2) {
  int64_t i = (int64_t)(kk_hash(k1, k2) & (uint64_t)(m->cap - 1));
  while (m->s[i].k1 >= 0 && (m->s[i].k1 != k1 || m->s[i].k2 != k2)) i = (i + 1) & (m->cap - 1);
  return i;
}

/* the value of (k1, k2), or -1 */
static int32_t kk_get(const kk_map *m, int64_t k1, int64_t k2) {
  int64_t i = kk_slot_of(m, k1, k2);
  return m->s[i].k1 >= 0 ? m->s[i].val : -1;
}

/* sets (k1 >= 0, k2) -> val, growing the map first when it would pass half full; 0, or -1 without memory (the map
   unchanged) */
static int kk_put(kk_map *m, int64_t k1, int64_t k2, int32_t val) {
  int64_t i = kk_slot_of(m, k1, k2);
  if (m->s[i].k1 < 0) {
    if (2 * (m->len + 1) > m->cap) {
      kk_map g;
      int64_t j;
      if (m->cap > INT64_MAX / 4 || kk_init(&g, 2 * m->cap) < 0) return -1;
      for (j = 0; j < m->cap; j++)
        if (m->s[j].k1 >= 0) g.s[kk_slot_of(&g, m->s[j].k1, m->s[j].k2)] = m->s[j];
      g.len = m->len;
      free(m->s);
      *m = g;
      i = kk_slot_of(m, k1, k2);
    }
    m->s[i].k1 = k1, m->s[i].k2 = k2;
    m->len++;
  }
  m->s[i].val = val;
  return 0;
}

/* p (elements of size sz, capacity *cap) grown to hold need elements: p itself when it does, else the moved
   block (*cap updated); NULL without memory (p still valid then). */
static void *kk_grow(void *p, int64_t *cap, int64_t need, size_t sz) {
  int64_t c = *cap;
  void *q;
  if (need <= c) return p;
  while (c < need) {
    if (c > INT64_MAX / 4) return NULL;
    c *= 2;
  }
  if ((uint64_t)c > SIZE_MAX / sz) return NULL;
  q = realloc(p, (size_t)c * sz);
  if (q) *cap = c;
  return q;
}

/* A new, empty key state for a plan of n nodes (views and classes are the plan's), or NULL (no memory, n < 1). */
pg_kkey *pg_kkey_new(int64_t n) {
  pg_kkey *st;
  int64_t i;
  if (n < 1 || n > INT32_MAX || (uint64_t)n > SIZE_MAX / sizeof(int32_t)) return NULL;
  st = (pg_kkey *)calloc(1, sizeof *st);
  if (!st) return NULL;
  st->n = n;
  st->keys_cap = st->koff_cap = st->scratch_cap = 64;
  st->nbuf = (int32_t *)malloc((size_t)n * sizeof *st->nbuf);
  st->nvid = (int32_t *)malloc((size_t)n * sizeof *st->nvid);
  st->keys = (int64_t *)malloc((size_t)st->keys_cap * sizeof *st->keys);
  st->koff = (int64_t *)malloc((size_t)st->koff_cap * sizeof *st->koff);
  st->scratch = (int64_t *)malloc((size_t)st->scratch_cap * sizeof *st->scratch);
  if (!st->nbuf || !st->nvid || !st->keys || !st->koff || !st->scratch || kk_init(&st->views, 64) < 0) {
    free(st->nbuf), free(st->nvid), free(st->keys), free(st->koff), free(st->scratch), free(st);
    return NULL;
  }
  if (kk_init(&st->classes, 64) < 0) {
    free(st->views.s), free(st->nbuf), free(st->nvid), free(st->keys), free(st->koff), free(st->scratch), free(st);
    return NULL;
  }
  for (i = 0; i < n; i++) st->nbuf[i] = st->nvid[i] = -1;
  return st;
}

/* Frees a key state (NULL: nothing). */
void pg_kkey_free(pg_kkey *st) {
  if (!st) return;
  free(st->views.s), free(st->classes.s), free(st->nbuf), free(st->nvid), free(st->keys), free(st->koff);
  free(st->scratch), free(st);
}

/* Registers node's buffer and view class (both >= 0): a leaf reading it with no pending movement is that load.
   0, or PG_ERR_ARG. */
int pg_kkey_node(pg_kkey *st, int64_t node, int32_t buf, int32_t vid) {
  if (!st || node < 0 || node >= st->n || buf < 0 || vid < 0) return PG_ERR_ARG;
  st->nbuf[node] = buf, st->nvid[node] = vid;
  return 0;
}

/* Registers k nodes' buffers and view classes at once (node[i], buf[i], vid[i]): pg_kkey_node's, for the nodes
   that have a view when the plan's kernels are walked. 0, or PG_ERR_ARG (nothing registered then). */
int pg_kkey_nodes(pg_kkey *st, int64_t k, const int32_t *node, const int32_t *buf, const int32_t *vid) {
  int64_t i;
  if (!st || k < 0 || (k && (!node || !buf || !vid))) return PG_ERR_ARG;
  for (i = 0; i < k; i++)
    if (node[i] < 0 || node[i] >= st->n || buf[i] < 0 || vid[i] < 0) return PG_ERR_ARG;
  for (i = 0; i < k; i++) st->nbuf[node[i]] = buf[i], st->nvid[node[i]] = vid[i];
  return 0;
}

/* Registers what view class vid (>= 0) is with the pending movements of cell (>= 1: the walk's cell + 1) applied
   at index space `space`: vid2 (>= 0) over the same buffer, or -1 when that needs a copy (the leaf is then missed
   every time: Python emits a copy kernel for each read, as walked_key does). 0, PG_ERR_ARG or PG_ERR_NOMEM. */
int pg_kkey_view(pg_kkey *st, int32_t vid, int32_t cell, int32_t space, int32_t vid2) {
  if (!st || vid < 0 || cell < 1 || space < 0 || vid2 < -1) return PG_ERR_ARG;
  return kk_put(&st->views, (int64_t)vid | (int64_t)cell << 31, space, vid2) < 0 ? PG_ERR_NOMEM : 0;
}

/* the hash of key[0..len) (FNV-style over mixed words) */
static uint64_t kk_key_hash(const int64_t *key, int64_t len) {
  uint64_t h = UINT64_C(1469598103934665603);
  int64_t i;
  for (i = 0; i < len; i++) h = (h ^ kk_hash(key[i], i)) * UINT64_C(1099511628211);
  return h;
}

/* The class of key[0..len): found, or made (*made = 1). -1 without memory. Classes with equal hash and length are
   told apart by comparing the keys (the class map's k2 is a probe counter then). */
static int64_t kk_class(pg_kkey *st, const int64_t *key, int64_t len, int32_t *made) {
  int64_t h = (int64_t)(kk_key_hash(key, len) >> 2), probe, c;
  int64_t *q;
  for (probe = 0;; probe++) {
    c = kk_get(&st->classes, h, probe);
    if (c < 0) break;
    if (st->koff[c + 1] - st->koff[c] == len && !memcmp(st->keys + st->koff[c], key, (size_t)len * sizeof *key))
      return c;
  }
  if (st->nclass >= INT32_MAX - 1) return -1;
  if (!(q = (int64_t *)kk_grow(st->koff, &st->koff_cap, st->nclass + 2, sizeof *st->koff))) return -1;
  st->koff = q;
  if (!(q = (int64_t *)kk_grow(st->keys, &st->keys_cap, st->keys_len + len, sizeof *st->keys))) return -1;
  st->keys = q;
  c = st->nclass;
  if (kk_put(&st->classes, h, probe, (int32_t)c) < 0) return -1;
  if (c == 0) st->koff[0] = 0;
  memcpy(st->keys + st->keys_len, key, (size_t)len * sizeof *key);
  st->keys_len += len;
  st->koff[c + 1] = st->keys_len;
  st->nclass++;
  *made = 1;
  return c;
}

/* Binds the arrays pg_kkey_make reads and writes (they must outlive the state's use): the walk's buffers ent (3 *
   ent_cap entries: node, cell + 1, leaf) and srcs (src_cap operands); per node of the graph (st's n) its operand
   count nsrcs and ALU signature sig (>= 0 for an ALU node); per entry an override obuf, ovid of what is registered
   for its leaf (a buffer and view class, or -1); and the outputs for kernels of up to out_cap entries: codes,
   lbuf, lvid, miss (out_cap each), bufs (out_cap + 1), info (4). 0, or PG_ERR_ARG. */
int pg_kkey_bind(pg_kkey *st, const int32_t *ent, int64_t ent_cap, const int32_t *srcs, int64_t src_cap,
                 const int32_t *nsrcs, const int64_t *sig, const int32_t *obuf, const int32_t *ovid, int64_t out_cap,
                 int64_t *codes, int32_t *lbuf, int32_t *lvid, int32_t *bufs, int32_t *miss, int64_t *info) {
  if (!st || !ent || !srcs || !nsrcs || !sig || !obuf || !ovid || !codes || !lbuf || !lvid || !bufs || !miss ||
      !info || ent_cap < 0 || src_cap < 0 || out_cap < 0)
    return PG_ERR_ARG;
  st->ent = ent, st->srcs = srcs, st->nsrcs = nsrcs, st->sig = sig, st->obuf = obuf, st->ovid = ovid;
  st->ent_cap = ent_cap, st->src_cap = src_cap, st->out_cap = out_cap;
  st->codes = codes, st->lbuf = lbuf, st->lvid = lvid, st->bufs = bufs, st->miss = miss, st->info = info;
  return 0;
}

/* The class of the walked kernel in the bound buffers: m entries and nsrc operands (each an earlier entry), the
   overrides read when over is 1, space the index space's id, head the head's id, sbuf the store's buffer id.
   Writes codes (per entry its signature, or -1 - its load's number), lbuf and lvid (the loads' buffers and view
   classes, in load order: first read first), bufs (the buffer ids in number order), miss (the entries of leaves not
   registered, or whose movements need a copy), info (misses, loads, buffers, made: 1 when the class is new).
   Returns the class (>= 0), PG_KKEY_MISS when leaves are missed (info[0] of them: register them, or pass them as
   overrides, and call again), PG_ERR_ARG on arrays out of range (nothing bound, more entries or operands than the
   buffers hold, a node past n, an operand not an earlier entry), PG_ERR_NOMEM. */
int64_t pg_kkey_make(pg_kkey *st, int64_t m, int64_t nsrc, int32_t over, int32_t space, int64_t head, int32_t sbuf) {
  const int32_t *ent, *srcs, *nsrcs, *obuf = NULL, *ovid = NULL;
  const int64_t *sig;
  int64_t *codes, *info, n;
  int32_t *lbuf, *lvid, *bufs, *miss;
  int64_t e, i, j, nmiss = 0, nl = 0, nb = 0, len, p = 0;
  int64_t *key;
  int32_t made = 0;
  if (!st || !st->ent) return PG_ERR_ARG;
  if (m <= 0 || m > st->ent_cap || m > st->out_cap || m > INT32_MAX || nsrc < 0 || nsrc > st->src_cap ||
      sbuf < 0 || head < 0)
    return PG_ERR_ARG;
  ent = st->ent, srcs = st->srcs, nsrcs = st->nsrcs, sig = st->sig, n = st->n;
  codes = st->codes, info = st->info, lbuf = st->lbuf, lvid = st->lvid, bufs = st->bufs, miss = st->miss;
  if (over) obuf = st->obuf, ovid = st->ovid;
  for (e = 0; e < m; e++) {  /* leaves to loads; every node and operand checked */
    int32_t x = ent[3 * e], c = ent[3 * e + 1], b, v;
    if (x < 0 || x >= n || c < 0) return PG_ERR_ARG;
    if (!ent[3 * e + 2]) {  /* an ALU entry: its signature; its nsrcs[x] operands, each an earlier entry */
      if (sig[x] < 0 || nsrcs[x] < 0 || nsrcs[x] > nsrc - p) return PG_ERR_ARG;
      for (j = p + nsrcs[x]; p < j; p++) if (srcs[p] < 0 || srcs[p] >= e) return PG_ERR_ARG;
      codes[e] = sig[x];
      continue;
    }
    if (obuf && ovid && obuf[e] >= 0 && ovid[e] >= 0) b = obuf[e], v = ovid[e];
    else {
      b = st->nbuf[x], v = st->nvid[x];
      if (v >= 0 && c) v = kk_get(&st->views, (int64_t)v | (int64_t)c << 31, space);
    }
    if (b < 0 || v < 0) {
      miss[nmiss++] = (int32_t)e;
      continue;
    }
    for (i = 0; i < nl && (lbuf[i] != b || lvid[i] != v); i++) {}
    if (i == nl) lbuf[nl] = b, lvid[nl] = v, nl++;  /* a new load: numbered in order of first read */
    codes[e] = -1 - i;
  }
  if (p != nsrc) return PG_ERR_ARG;  /* operands the entries do not read */
  info[0] = nmiss;
  if (nmiss) return PG_KKEY_MISS;
  /* the key: head, m, codes, nsrc, operands, loads (view class, buffer number), the store's buffer number */
  len = 5 + m + nsrc + 2 * nl;
  if (!(key = (int64_t *)kk_grow(st->scratch, &st->scratch_cap, len, sizeof *st->scratch))) return PG_ERR_NOMEM;
  st->scratch = key;
  p = 0;
  key[p++] = head, key[p++] = m;
  for (e = 0; e < m; e++) key[p++] = codes[e];
  key[p++] = nsrc;
  for (j = 0; j < nsrc; j++) key[p++] = srcs[j];
  key[p++] = nl;
  for (i = 0; i <= nl; i++) {  /* buffers numbered by first use: the loads', then the store's */
    int32_t b = i < nl ? lbuf[i] : sbuf;
    for (j = 0; j < nb && bufs[j] != b; j++) {}
    if (j == nb) bufs[nb++] = b;
    if (i < nl) key[p++] = lvid[i];
    key[p++] = j;
  }
  info[1] = nl, info[2] = nb;
  e = kk_class(st, key, p, &made);
  if (e < 0) return PG_ERR_NOMEM;
  info[3] = made;
  return e;
}
