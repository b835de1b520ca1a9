/* vm_epilogue.c: what makes a contraction's epilogue safe to run tile by tile. An EPILOGUE kernel is a loop kernel
   over the contraction's output index space (n, m), or (m, n) when transposed, that follows a VK_GEMM (or another
   epilogue of it): each thread runs it on the output tile it has just computed, while the tile is in its cache
   (csrc/vm.c, run_gemm). Tiles run in any order and at once, so the group is checked when the program is prepared:
   every element the group writes is written by one tile only (injective views) and read, by a later tile task,
   never: a load of memory the group writes must be the very view that writes it (the same element, in the same
   tile), and the contraction's operands overlap nothing the group writes. Overlap is judged by buffer extents
   (slot and byte range), conservatively. */
#include <stdint.h>
#include "pygrad.h"
#include "vm.h"

#define EPI_MAX 16  /* epilogues per contraction: the checks compare each new view with the group's */

/* a view over the contraction's (n, m) space in bytes: buffer, byte offset in it, byte strides along n and m */
typedef struct epi_view { int32_t buf, stype, masked; int64_t off, sn, sm; } epi_view;

static int64_t iabs64(int64_t x) { return x < 0 ? -x : x; }

/* whether buffers a and b may share bytes: the same slot and overlapping ranges */
static int bufs_overlap(const pg_vm *vm, int32_t a, int32_t b) {
  const vm_buf *x = &vm->bufs[a], *y = &vm->bufs[b];
  if (x->slot != y->slot) return 0;
  return x->off < y->off + y->nbytes && y->off < x->off + x->nbytes;
}

/* whether two views read or write the same element at every index of (n, m) */
static int same_view(const pg_vm *vm, const epi_view *a, const epi_view *b) {
  return !a->masked && !b->masked && vm->bufs[a->buf].slot == vm->bufs[b->buf].slot && a->stype == b->stype &&
         vm->bufs[a->buf].off + a->off == vm->bufs[b->buf].off + b->off && a->sn == b->sn && a->sm == b->sm;
}

/* whether a view gives each index of an n x m space its own element: one dim's stride passes the other's span */
static int injective(int64_t n, int64_t m, int64_t sn, int64_t sm) {
  sn = iabs64(sn);
  sm = iabs64(sm);
  if (n <= 1 && m <= 1) return 1;
  if (n <= 1) return sm != 0;
  if (m <= 1) return sn != 0;
  if (sn == 0 || sm == 0) return 0;
  return sm <= (sn - 1) / (m - 1) || sn <= (sm - 1) / (n - 1);  /* |sm| (m-1) < |sn|, or the other way round */
}

/* view v of epilogue kernel k as an epi_view over (n, m) */
static epi_view epi_of(const vm_kernel *k, const vm_view *v) {
  epi_view e;
  int64_t s0 = v->st[0] * v->esize, s1 = v->st[1] * v->esize;
  e.buf = v->buf; e.stype = v->stype; e.masked = v->masked; e.off = v->off * v->esize;
  e.sn = k->epi_tr ? s1 : s0;
  e.sm = k->epi_tr ? s0 : s1;
  return e;
}

/* kernel ki (an EPILOGUE, already read) checked against the group it joins; sets kern[gemm].nepi. NULL when it is
   safe, else what is wrong */
const char *vm_epilogue_check(pg_vm *vm, int32_t ki) {
  vm_kernel *k = &vm->kern[ki], *gk;
  const vm_gemm *g;
  epi_view c, x, y;
  int32_t gi = ki - 1, e, i, j;
  int64_t es;
  while (gi >= 0 && vm->kern[gi].kind == VK_EPILOGUE) gi--;
  if (gi < 0 || vm->kern[gi].kind != VK_GEMM) return "an epilogue must follow a contraction";
  gk = &vm->kern[gi];
  g = gk->gemm;
  if (ki - gi > EPI_MAX) return "too many epilogues for one contraction";
  if (g->nbatch != 0) return "an epilogue of a batched contraction";
  if (k->ndim != 2 || k->redop != VR_NONE) return "an epilogue is an elementwise kernel over two dims";
  if (k->shape[0] != (k->epi_tr ? g->m : g->n) || k->shape[1] != (k->epi_tr ? g->n : g->m))
    return "an epilogue's index space is not its contraction's output";
  es = vm_esize(g->lt);
  c.buf = g->c; c.stype = g->lt; c.masked = 0; c.off = g->offc * es; c.sn = g->scn * es; c.sm = g->scm * es;
  if (!injective(g->n, g->m, g->scn, g->scm)) return "a contraction with an epilogue writes an element twice";
  for (i = 0; i < k->nstores; i++) {
    const vm_view *s = &k->stores[i];
    x = epi_of(k, s);
    if (!injective(g->n, g->m, x.sn, x.sm)) return "an epilogue writes an element twice";
    if (bufs_overlap(vm, s->buf, g->a) || bufs_overlap(vm, s->buf, g->b))
      return "an epilogue writes its contraction's operand";
    if (bufs_overlap(vm, s->buf, g->c) && !same_view(vm, &x, &c)) return "an epilogue writes elsewhere in C";
    for (e = gi + 1; e <= ki; e++) {  /* every view of the group, this kernel's too */
      const vm_kernel *p = &vm->kern[e];
      for (j = 0; j < p->nloads + p->nstores; j++) {
        const vm_view *v = j < p->nloads ? &p->loads[j] : &p->stores[j - p->nloads];
        if (v == s || !bufs_overlap(vm, s->buf, v->buf)) continue;
        y = epi_of(p, v);
        if (!same_view(vm, &x, &y)) return "an epilogue's store meets another view of its memory";
      }
    }
  }
  for (i = 0; i < k->nloads; i++) {  /* what the group wrote before: read only where it was written */
    const vm_view *l = &k->loads[i];
    x = epi_of(k, l);
    if (bufs_overlap(vm, l->buf, g->c) && !same_view(vm, &x, &c)) return "an epilogue reads C elsewhere";
    for (e = gi + 1; e < ki; e++) {
      const vm_kernel *p = &vm->kern[e];
      for (j = 0; j < p->nstores; j++) {
        if (!bufs_overlap(vm, l->buf, p->stores[j].buf)) continue;
        y = epi_of(p, &p->stores[j]);
        if (!same_view(vm, &x, &y)) return "an epilogue reads an earlier epilogue's output elsewhere";
      }
    }
  }
  if (bufs_overlap(vm, g->a, g->c) || bufs_overlap(vm, g->b, g->c))
    return "a contraction with an epilogue reads its own output";
  gk->nepi = ki - gi;
  return NULL;
}
