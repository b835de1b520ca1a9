/* place.c: arena offsets for a program's internal buffers by liveness, pygrad/engine/program.py's _place in C for
   large plans (the Python version is the reference, and runs small plans). A buffer lives from the first kernel
   that names it to the last; at each kernel the buffers it starts are placed (in order of first mention) in the
   best fitting free block (the smallest that fits, the lowest offset among blocks of that size), else at the top of
   the arena, then the buffers it ends are freed (in order of first mention), a freed block coalescing with free
   neighbours. The free blocks are kept in two sorted arrays (by size then offset, and by offset). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "pygrad.h"

typedef struct { int64_t size, off; } pl_block;
typedef struct { pl_block *by_size, *by_off; int64_t len, cap; } pl_holes;

/* the first position in a (sorted by (size, off)) whose block is not below (size, off) */
static int64_t pl_lower_size(const pl_block *a, int64_t len, int64_t size, int64_t off) {
  int64_t lo = 0, hi = len;
  while (lo < hi) {
    int64_t mid = lo + (hi - lo) / 2;
    if (a[mid].size < size || (a[mid].size == size && a[mid].off < off)) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/* the first position in a (sorted by off) whose block starts at or after off */
static int64_t pl_lower_off(const pl_block *a, int64_t len, int64_t off) {
  int64_t lo = 0, hi = len;
  while (lo < hi) {
    int64_t mid = lo + (hi - lo) / 2;
    if (a[mid].off < off) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/* adds the free block (off, size) to both arrays (room for it is reserved by the caller) */
static void pl_add(pl_holes *h, int64_t off, int64_t size) {
  int64_t i = pl_lower_size(h->by_size, h->len, size, off), j = pl_lower_off(h->by_off, h->len, off);
  memmove(h->by_size + i + 1, h->by_size + i, (size_t)(h->len - i) * sizeof *h->by_size);
  memmove(h->by_off + j + 1, h->by_off + j, (size_t)(h->len - j) * sizeof *h->by_off);
  h->by_size[i].size = h->by_off[j].size = size;
  h->by_size[i].off = h->by_off[j].off = off;
  h->len++;
}

/* removes the free block (off, size), which is in both arrays */
static void pl_remove(pl_holes *h, int64_t off, int64_t size) {
  int64_t i = pl_lower_size(h->by_size, h->len, size, off), j = pl_lower_off(h->by_off, h->len, off);
  memmove(h->by_size + i, h->by_size + i + 1, (size_t)(h->len - i - 1) * sizeof *h->by_size);
  memmove(h->by_off + j, h->by_off + j + 1, (size_t)(h->len - j - 1) * sizeof *h->by_off);
  h->len--;
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
  pl_holes h = {NULL, NULL, 0, 0};
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
  h.cap = nbufs + 1;
  h.by_size = (pl_block *)malloc((size_t)h.cap * sizeof *h.by_size);
  h.by_off = (pl_block *)malloc((size_t)h.cap * sizeof *h.by_off);
  if (!first || !last || !order || !byk || !fbyk || !sstart || !fstart || !h.by_size || !h.by_off) goto done;
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
      int64_t b = byk[j], sz = need[b], at = pl_lower_size(h.by_size, h.len, sz, INT64_MIN);
      if (at < h.len) {
        pl_block blk = h.by_size[at];
        pl_remove(&h, blk.off, blk.size);
        if (blk.size > sz) pl_add(&h, blk.off + sz, blk.size - sz);
        offset[b] = blk.off;
      } else {
        if (top > INT64_MAX - sz) { rc = PG_ERR_ARG; goto done; }
        offset[b] = top;
        top += sz;
      }
    }
    for (j = fstart[i]; j < fstart[i + 1]; j++) {  /* free, coalescing with the blocks either side */
      int64_t b = fbyk[j], off = offset[b], sz = need[b], q = pl_lower_off(h.by_off, h.len, off);
      if (q > 0 && h.by_off[q - 1].off + h.by_off[q - 1].size == off) {
        pl_block prev = h.by_off[q - 1];
        pl_remove(&h, prev.off, prev.size);
        off = prev.off, sz += prev.size, q--;
      }
      if (q < h.len && h.by_off[q].off == off + sz) {
        pl_block next = h.by_off[q];
        pl_remove(&h, next.off, next.size);
        sz += next.size;
      }
      pl_add(&h, off, sz);
    }
  }
  rc = top;
done:
  free(first), free(last), free(order), free(byk), free(fbyk), free(sstart), free(fstart);
  free(h.by_size), free(h.by_off);
  return rc;
}
