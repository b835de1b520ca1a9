/* place.c: arena offsets for a program's internal buffers by liveness, pygrad/engine/program.py's _place in C for
   large plans (the Python version is the reference, and runs small plans). A buffer lives from the first kernel
   that names it to the last; at each kernel the buffers it starts are placed (in order of first mention) in the
   best fitting free block (the smallest that fits, the lowest offset among blocks of that size), else at the top of
   the arena, then the buffers it ends are freed (in order of first mention), a freed block coalescing with free
   neighbours. The free blocks are kept as _Holes keeps them (maps by offset and end, the distinct sizes in order, a
   heap of offsets per size): O(log n) a block however many are free (a gradient keeps thousands free at once). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "pygrad.h"

/* an open-addressing map of int64 keys (>= 0) to int64 values, linear probing, at most half full; a removal shifts
   the entries after it back (no tombstones) */
typedef struct { int64_t *key, *val, cap, len; } pl_map;

/* a map of capacity cap (a power of two), empty; -1 without memory */
static int pl_map_init(pl_map *m, int64_t cap) {
  int64_t i;
  m->key = (int64_t *)malloc((size_t)cap * sizeof *m->key);
  m->val = (int64_t *)malloc((size_t)cap * sizeof *m->val);
  if (!m->key || !m->val) return -1;
  for (i = 0; i < cap; i++) m->key[i] = -1;
  m->cap = cap, m->len = 0;
  return 0;
}

/* the home slot of key */
static int64_t pl_home(const pl_map *m, int64_t key) {
  uint64_t h = (uint64_t)key * UINT64_C(0x9E3779B97F4A7C15);
  return (int64_t)((h ^ (h >> 31)) & (uint64_t)(m->cap - 1));
}

/* the slot holding key, or the empty slot where it would go */
static int64_t pl_slot(const pl_map *m, int64_t key) {
  int64_t i = pl_home(m, key);
  while (m->key[i] >= 0 && m->key[i] != key) i = (i + 1) & (m->cap - 1);
  return i;
}

/* key's value, or -1 */
static int64_t pl_get(const pl_map *m, int64_t key) {
  int64_t i = pl_slot(m, key);
  return m->key[i] >= 0 ? m->val[i] : -1;
}

/* sets key -> val; 0, or -1 without memory */
static int pl_put(pl_map *m, int64_t key, int64_t val) {
  int64_t i = pl_slot(m, key);
  if (m->key[i] < 0) {
    if (2 * (m->len + 1) > m->cap) {
      pl_map g = {NULL, NULL, 0, 0};
      int64_t j;
      if (m->cap > INT64_MAX / 4 || pl_map_init(&g, 2 * m->cap) < 0) { free(g.key), free(g.val); return -1; }
      for (j = 0; j < m->cap; j++)
        if (m->key[j] >= 0) {
          int64_t s = pl_slot(&g, m->key[j]);
          g.key[s] = m->key[j], g.val[s] = m->val[j];
        }
      g.len = m->len;
      free(m->key), free(m->val);
      *m = g;
      i = pl_slot(m, key);
    }
    m->key[i] = key;
    m->len++;
  }
  m->val[i] = val;
  return 0;
}

/* removes key (present) and shifts back the entries of its probe run that may move into the hole */
static void pl_del(pl_map *m, int64_t key) {
  int64_t i = pl_slot(m, key), j = i;
  m->key[i] = -1;
  m->len--;
  for (;;) {
    int64_t h;
    j = (j + 1) & (m->cap - 1);
    if (m->key[j] < 0) return;
    h = pl_home(m, m->key[j]);
    if ((j > i && (h <= i || h > j)) || (j < i && h <= i && h > j)) {  /* its home is not in (i, j]: move it */
      m->key[i] = m->key[j], m->val[i] = m->val[j], m->key[j] = -1;
      i = j;
    }
  }
}

/* a binary min-heap of offsets (the free blocks of one size; entries of blocks taken since linger) */
typedef struct { int64_t *a, len, cap; } pl_heap;

/* the free blocks below the arena's high-water mark, as program.py's _Holes keeps them: size_at (offset -> size),
   start_of (end -> offset), the distinct sizes ascending with their counts, a heap of offsets per size */
typedef struct {
  pl_map size_at, start_of, heap_of, count;
  int64_t *sizes, nsizes, sizes_cap;
  pl_heap *heaps;
  int64_t nheaps, heaps_cap;
} pl_holes;

/* the first position of the sorted a[0..len) not below v */
static int64_t pl_lower(const int64_t *a, int64_t len, int64_t v) {
  int64_t lo = 0, hi = len;
  while (lo < hi) {
    int64_t mid = lo + (hi - lo) / 2;
    if (a[mid] < v) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/* pushes off on heap h; -1 without memory */
static int pl_push(pl_heap *h, int64_t off) {
  int64_t i;
  if (h->len == h->cap) {
    int64_t c = h->cap ? 2 * h->cap : 8;
    int64_t *a = (int64_t *)realloc(h->a, (size_t)c * sizeof *a);
    if (!a) return -1;
    h->a = a, h->cap = c;
  }
  for (i = h->len++; i > 0 && h->a[(i - 1) / 2] > off; i = (i - 1) / 2) h->a[i] = h->a[(i - 1) / 2];
  h->a[i] = off;
  return 0;
}

/* pops heap h's least offset (h not empty) */
static int64_t pl_pop(pl_heap *h) {
  int64_t top = h->a[0], last = h->a[--h->len], i = 0;
  for (;;) {
    int64_t c = 2 * i + 1;
    if (c >= h->len) break;
    if (c + 1 < h->len && h->a[c + 1] < h->a[c]) c++;
    if (h->a[c] >= last) break;
    h->a[i] = h->a[c], i = c;
  }
  if (h->len) h->a[i] = last;
  return top;
}

/* adds the free block (off, sz); -1 without memory */
static int pl_add(pl_holes *h, int64_t off, int64_t sz) {
  int64_t k = pl_get(&h->heap_of, sz), c = pl_get(&h->count, sz);
  if (pl_put(&h->size_at, off, sz) < 0 || pl_put(&h->start_of, off + sz, off) < 0) return -1;
  if (k < 0) {  /* a size not seen before: its heap */
    if (h->nheaps == h->heaps_cap) {
      int64_t cap = 2 * h->heaps_cap;
      pl_heap *g = (pl_heap *)realloc(h->heaps, (size_t)cap * sizeof *g);
      if (!g) return -1;
      h->heaps = g, h->heaps_cap = cap;
    }
    k = h->nheaps;
    h->heaps[k].a = NULL, h->heaps[k].len = h->heaps[k].cap = 0;
    if (pl_put(&h->heap_of, sz, k) < 0) return -1;
    h->nheaps++;
  }
  if (pl_push(&h->heaps[k], off) < 0) return -1;
  if (c <= 0) {  /* the size enters the sorted list */
    int64_t i = pl_lower(h->sizes, h->nsizes, sz);
    if (h->nsizes == h->sizes_cap) {
      int64_t cap = 2 * h->sizes_cap, *g = (int64_t *)realloc(h->sizes, (size_t)cap * sizeof *g);
      if (!g) return -1;
      h->sizes = g, h->sizes_cap = cap;
    }
    memmove(h->sizes + i + 1, h->sizes + i, (size_t)(h->nsizes - i) * sizeof *h->sizes);
    h->sizes[i] = sz;
    h->nsizes++;
    c = 0;
  }
  return pl_put(&h->count, sz, c + 1);
}

/* removes the free block at off (present); returns its size */
static int64_t pl_remove(pl_holes *h, int64_t off) {
  int64_t sz = pl_get(&h->size_at, off), c = pl_get(&h->count, sz) - 1;
  pl_del(&h->size_at, off);
  pl_del(&h->start_of, off + sz);
  if (c == 0) {
    int64_t i = pl_lower(h->sizes, h->nsizes, sz);
    memmove(h->sizes + i, h->sizes + i + 1, (size_t)(h->nsizes - i - 1) * sizeof *h->sizes);
    h->nsizes--;
  }
  h->count.val[pl_slot(&h->count, sz)] = c;  /* (the count's key is present: set in place, no memory needed) */
  return sz;
}

/* frees the holes' memory */
static void pl_holes_free(pl_holes *h) {
  int64_t k;
  free(h->size_at.key), free(h->size_at.val), free(h->start_of.key), free(h->start_of.val);
  free(h->heap_of.key), free(h->heap_of.val), free(h->count.key), free(h->count.val), free(h->sizes);
  for (k = 0; k < h->nheaps; k++) free(h->heaps[k].a);
  free(h->heaps);
}

/* The offsets of the arena buffers of a plan of nk kernels: kernel i names counts[i] buffers, listed in turn in ids
   (nids in all, each below nbufs); arena[b] is nonzero for a buffer the arena holds (others are ignored) and
   need[b] its bytes in the arena (> 0, a multiple of the alignment). Writes offset[b] for every arena buffer that
   a kernel names; returns the arena's size, PG_ERR_ARG (counts that do not add up to nids, an id out of range, a
   need not positive or past 2**62) or PG_ERR_NOMEM. */
int64_t pg_place(int64_t nk, const int32_t *counts, const int32_t *ids, int64_t nids, int64_t nbufs,
                 const uint8_t *arena, const int64_t *need, int64_t *offset) {
  int64_t *first = NULL, *last = NULL, *order = NULL, *sstart = NULL, *fstart = NULL, *byk = NULL, *fbyk = NULL;
  int64_t i, j, k, p, nord = 0, top = 0, rc = PG_ERR_NOMEM, total = 0;
  pl_holes h;
  memset(&h, 0, sizeof h);
  if (nk < 0 || nids < 0 || nbufs < 0 || (nk && !counts) || (nids && !ids) || (nbufs && (!arena || !need || !offset)))
    return PG_ERR_ARG;
  for (i = 0; i < nk; i++) {
    if (counts[i] < 0) return PG_ERR_ARG;
    total += counts[i];
  }
  if (total != nids) return PG_ERR_ARG;
  for (j = 0; j < nids; j++) if (ids[j] < 0 || ids[j] >= nbufs) return PG_ERR_ARG;
  for (j = 0; j < nbufs; j++) if (arena[j] && (need[j] <= 0 || need[j] > INT64_C(1) << 62)) return PG_ERR_ARG;
  if ((uint64_t)nbufs + 1 > SIZE_MAX / sizeof(int64_t) || (uint64_t)nk + 1 > SIZE_MAX / sizeof(int64_t))
    return PG_ERR_NOMEM;
  first = (int64_t *)malloc((size_t)(nbufs + 1) * sizeof *first);
  last = (int64_t *)malloc((size_t)(nbufs + 1) * sizeof *last);
  order = (int64_t *)malloc((size_t)(nbufs + 1) * sizeof *order);
  byk = (int64_t *)malloc((size_t)(nbufs + 1) * sizeof *byk);
  fbyk = (int64_t *)malloc((size_t)(nbufs + 1) * sizeof *fbyk);
  sstart = (int64_t *)calloc((size_t)nk + 1, sizeof *sstart);
  fstart = (int64_t *)calloc((size_t)nk + 1, sizeof *fstart);
  h.sizes_cap = h.heaps_cap = 16;
  h.sizes = (int64_t *)malloc((size_t)h.sizes_cap * sizeof *h.sizes);
  h.heaps = (pl_heap *)malloc((size_t)h.heaps_cap * sizeof *h.heaps);
  if (!first || !last || !order || !byk || !fbyk || !sstart || !fstart || !h.sizes || !h.heaps) goto done;
  if (pl_map_init(&h.size_at, 64) < 0 || pl_map_init(&h.start_of, 64) < 0 || pl_map_init(&h.heap_of, 64) < 0 ||
      pl_map_init(&h.count, 64) < 0)
    goto done;
  for (j = 0; j < nbufs; j++) first[j] = -1;
  for (i = 0, p = 0; i < nk; i++)  /* liveness: each arena buffer's first and last kernel, in order of mention */
    for (k = 0; k < counts[i]; k++, p++) {
      int32_t b = ids[p];
      if (!arena[b]) continue;
      if (first[b] < 0) first[b] = i, order[nord++] = b;
      last[b] = i;
    }
  /* the buffers each kernel starts and ends, in order of first mention (a stable counting sort by kernel) */
  for (j = 0; j < nord; j++) sstart[first[order[j]] + 1]++, fstart[last[order[j]] + 1]++;
  for (i = 0; i < nk; i++) sstart[i + 1] += sstart[i], fstart[i + 1] += fstart[i];
  for (j = 0; j < nord; j++) byk[sstart[first[order[j]]]++] = order[j], fbyk[fstart[last[order[j]]]++] = order[j];
  for (i = nk; i > 0; i--) sstart[i] = sstart[i - 1], fstart[i] = fstart[i - 1];
  if (nk) sstart[0] = fstart[0] = 0;
  for (i = 0; i < nk; i++) {
    for (j = sstart[i]; j < sstart[i + 1]; j++) {  /* place: best fit, else the top */
      int64_t b = byk[j], sz = need[b], at = pl_lower(h.sizes, h.nsizes, sz);
      if (at < h.nsizes) {
        int64_t bs = h.sizes[at], off;
        pl_heap *hp = &h.heaps[pl_get(&h.heap_of, bs)];
        do off = pl_pop(hp);
        while (pl_get(&h.size_at, off) != bs);  /* (skips the entries of blocks taken since) */
        pl_remove(&h, off);
        if (bs > sz && pl_add(&h, off + sz, bs - sz) < 0) goto done;
        offset[b] = off;
      } else {
        if (top > INT64_MAX - sz) { rc = PG_ERR_ARG; goto done; }
        offset[b] = top;
        top += sz;
      }
    }
    for (j = fstart[i]; j < fstart[i + 1]; j++) {  /* free, coalescing with the blocks either side */
      int64_t b = fbyk[j], off = offset[b], sz = need[b], prev = pl_get(&h.start_of, off);
      if (prev >= 0) sz += pl_remove(&h, prev), off = prev;
      if (pl_get(&h.size_at, off + sz) >= 0) sz += pl_remove(&h, off + sz);
      if (pl_add(&h, off, sz) < 0) goto done;
    }
  }
  rc = top;
done:
  free(first), free(last), free(order), free(byk), free(fbyk), free(sstart), free(fstart);
  pl_holes_free(&h);
  return rc;
}
