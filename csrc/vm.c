/* vm.c: the vectorized interpreter's execution. Python's planner (pygrad/engine/planner.py) lowers a graph to one
   flat program: buffers in runtime slots, and kernels -- loops over an index space in tiles of T elements, each
   tile running a list of fixed-width instructions over a register file, with strided loads (views:
   permute/shrink/flip/expand/pad need no copy) and stores or a fused reduction; and blocked contractions
   (matmul). vm_read.c's pg_vm_prepare validates everything once (every view's extent against its buffer, every
   instruction's types); pg_vm_run here executes the whole program. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <math.h>
#include "pygrad.h"
#include "vm.h"
#include "mem.h"


/* n elements of storage type st at src (stride ss elements) into compute-type elements at dst */
static void load_row(int32_t stype, const char *src, int64_t ss, int64_t n, char *dst) {
  int64_t i, es = vm_esize(stype);
  if (stype == VT_F16) {
    const uint16_t *s = (const uint16_t *)src;
    for (i = 0; i < n; i++) ((float *)dst)[i] = vm_f16_to_f32(s[i * ss]);
  } else if (stype == VT_BF16) {
    const uint16_t *s = (const uint16_t *)src;
    for (i = 0; i < n; i++) ((float *)dst)[i] = vm_bf16_to_f32(s[i * ss]);
  } else if (ss == 1) {
    memcpy(dst, src, (size_t)(n * es));
  } else if (ss == 0 && es == 4) {  /* one value along the row (a column broadcast): a fill the compiler vectorizes */
    uint32_t x;
    memcpy(&x, src, 4);
    for (i = 0; i < n; i++) ((uint32_t *)dst)[i] = x;
  } else if (ss == 0 && es == 8) {
    uint64_t x;
    memcpy(&x, src, 8);
    for (i = 0; i < n; i++) ((uint64_t *)dst)[i] = x;
  } else if (es == 1) {
    for (i = 0; i < n; i++) dst[i] = src[i * ss];
  } else if (es == 2) {
    for (i = 0; i < n; i++) ((uint16_t *)dst)[i] = ((const uint16_t *)src)[i * ss];
  } else if (es == 4) {
    for (i = 0; i < n; i++) ((uint32_t *)dst)[i] = ((const uint32_t *)src)[i * ss];
  } else {
    for (i = 0; i < n; i++) ((uint64_t *)dst)[i] = ((const uint64_t *)src)[i * ss];
  }
}

/* n compute-type elements at src (stride ss: 0 for a scalar) into storage type stype at dst (stride ds) */
static void store_row(int32_t stype, const char *src, int64_t ss, int64_t n, char *dst, int64_t ds) {
  int64_t i, es = vm_esize(stype);
  if (stype == VT_F16) {
    for (i = 0; i < n; i++) ((uint16_t *)dst)[i * ds] = vm_f32_to_f16(((const float *)src)[i * ss]);
  } else if (stype == VT_BF16) {
    for (i = 0; i < n; i++) ((uint16_t *)dst)[i * ds] = vm_f32_to_bf16(((const float *)src)[i * ss]);
  } else if (ss == 1 && ds == 1) {
    memmove(dst, src, (size_t)(n * es));
  } else if (es == 1) {
    for (i = 0; i < n; i++) dst[i * ds] = src[i * ss];
  } else if (es == 2) {
    for (i = 0; i < n; i++) ((uint16_t *)dst)[i * ds] = ((const uint16_t *)src)[i * ss];
  } else if (es == 4) {
    for (i = 0; i < n; i++) ((uint32_t *)dst)[i * ds] = ((const uint32_t *)src)[i * ss];
  } else {
    for (i = 0; i < n; i++) ((uint64_t *)dst)[i * ds] = ((const uint64_t *)src)[i * ss];
  }
}

/* advance an odometer over dims [0, nd) of shape; adds the stride steps of the given views to their offsets */
static void odo_next(int64_t *idx, const int64_t *shape, int nd) {
  int d;
  for (d = nd - 1; d >= 0; d--) {
    if (++idx[d] < shape[d]) return;
    idx[d] = 0;
  }
}

static int64_t row_off(const vm_view *v, const int64_t *idx, int nd) {
  int64_t o = v->off;
  int d;
  for (d = 0; d < nd; d++) o += idx[d] * v->st[d];
  return o;
}

/* whether the row at outer index idx is inside a masked view's valid region (outer dims) */
static int row_valid(const vm_view *v, const int64_t *idx, int nd) {
  int d;
  if (!v->masked) return 1;
  for (d = 0; d < nd; d++) if (idx[d] < v->lo[d] || idx[d] >= v->hi[d]) return 0;
  return 1;
}

/* a transposed view's tile, read along its rows' direction: nr rows of outer index idx0 on, that lie in one run of
   the last outer dim, whose stride is smaller than the inner one (a matrix read through its transpose). Read row by
   row, each element would come from another cache line, and a power-of-two stride maps them all to a few cache
   sets; column by column, each run of rows is one line. A copy of the same bits either way; 0: not such a tile */
static int gather_columns(const vm_view *v, const char *base, const int64_t *shape, int nd, const int64_t *idx0,
                          int64_t nr, int64_t c0, int64_t nc, char *dst) {
  int64_t so, si, off;
  if (nd < 1 || nr < 2 || v->masked || v->stype != vm_ct(v->stype) || idx0[nd - 1] + nr > shape[nd - 1]) return 0;
  so = v->st[nd - 1];
  si = v->st[nd];
  if (so == 0 || (so < 0 ? -so : so) >= (si < 0 ? -si : si)) return 0;
  if (v->esize != 4 && v->esize != 8) return 0;
  off = row_off(v, idx0, nd) + c0 * si;
  vm_transpose_copy(base + off * v->esize, si, so, dst, nr, nc, v->esize);
  return 1;
}

/* fill a tile register from a view: nr rows from outer index idx0, columns [c0, c0+nc) */
static void gather(const vm_view *v, const char *base, const int64_t *shape, int nd, const int64_t *idx0, int64_t nr,
                   int64_t c0, int64_t nc, char *dst) {
  int64_t idx[VM_MAXDIM], r, ces = vm_esize(vm_ct(v->stype)), si = v->st[nd],
          lo = v->masked ? v->lo[nd] : 0, hi = v->masked ? v->hi[nd] : shape[nd];
  int d;
  /* whole rows that follow each other in memory along the last outer dim (a matrix broadcast over the dims before
     it, in a contraction-shaped loop): one copy per run of rows, not one per row */
  int runs = nd >= 1 && !v->masked && v->stype == vm_ct(v->stype) && si == 1 && c0 == 0 && nc == shape[nd] &&
             v->st[nd - 1] == nc;
  if (gather_columns(v, base, shape, nd, idx0, nr, c0, nc, dst)) return;
  if (v->rowinv && nr > 1) {  /* the same row for every outer index (a bias over a batch): one row, then doubled */
    int64_t have = 1, rb = nc * ces;
    load_row(v->stype, base + (row_off(v, idx0, nd) + c0 * si) * v->esize, si, nc, dst);
    while (have < nr) {
      int64_t more = nr - have < have ? nr - have : have;
      memcpy(dst + have * rb, dst, (size_t)(more * rb));
      have += more;
    }
    return;
  }
  for (d = 0; d < nd; d++) idx[d] = idx0[d];
  for (r = 0; r < nr; r++) {
    char *o = dst + r * nc * ces;
    if (runs) {
      int64_t run = shape[nd - 1] - idx[nd - 1];
      if (run > nr - r) run = nr - r;
      memcpy(o, base + row_off(v, idx, nd) * v->esize, (size_t)(run * nc * ces));
      r += run - 1;
      idx[nd - 1] += run - 1;  /* the odometer's step below moves past the run */
      odo_next(idx, shape, nd);
      continue;
    }
    if (!row_valid(v, idx, nd)) {
      memset(o, 0, (size_t)(nc * ces));
    } else {
      int64_t a = c0 > lo ? c0 : lo, b = c0 + nc < hi ? c0 + nc : hi, off = row_off(v, idx, nd);
      if (b <= a) { memset(o, 0, (size_t)(nc * ces)); }
      else {
        if (a > c0) memset(o, 0, (size_t)((a - c0) * ces));
        load_row(v->stype, base + (off + a * si) * v->esize, si, b - a, o + (a - c0) * ces);
        if (b < c0 + nc) memset(o + (b - c0) * ces, 0, (size_t)((c0 + nc - b) * ces));
      }
    }
    odo_next(idx, shape, nd);
  }
}

/* identity of a reduction in compute type ct, as bytes */
static void red_identity(int32_t redop, int32_t ct, char *out) {
  union { uint8_t b; int8_t i8; int16_t i16; int32_t i32; int64_t i64; uint64_t u64; float f; double d; } v;
  memset(&v, 0, sizeof v);
  if (redop == VR_MUL) {
    switch (ct) {
    case VT_F32: v.f = 1.0f; break;
    case VT_F64: v.d = 1.0; break;
    case VT_I16: case VT_U16: v.i16 = 1; break;
    case VT_I32: case VT_U32: v.i32 = 1; break;
    case VT_I64: case VT_U64: v.i64 = 1; break;
    default: v.b = 1; break;
    }
  } else if (redop == VR_MAX) {
    switch (ct) {
    case VT_F32: v.f = -HUGE_VALF; break;
    case VT_F64: v.d = -HUGE_VAL; break;
    case VT_I8: v.i8 = INT8_MIN; break;
    case VT_I16: v.i16 = INT16_MIN; break;
    case VT_I32: v.i32 = INT32_MIN; break;
    case VT_I64: v.i64 = INT64_MIN; break;
    default: break;  /* unsigned and bool: 0 */
    }
  }
  memcpy(out, &v, (size_t)vm_esize(ct));
}

/* the odometer over a reduction's outputs (vm.h): the kept dims' extents and strides, and the span they cover */
void vm_outs_init(const vm_kernel *k, vm_outs *o) {
  const vm_view *s = &k->stores[0];
  int d;
  o->nd = k->ndim;
  o->cur = o->lo = o->hi = s->off;
  o->total = 1;
  for (d = 0; d < k->ndim; d++) {
    o->shp[d] = (k->redmask >> d & 1u) ? 1 : k->shape[d];
    o->st[d] = s->st[d];
    o->idx[d] = 0;
    o->total *= o->shp[d];
    if (o->shp[d] > 1) {
      if (s->st[d] < 0) o->lo += s->st[d] * (o->shp[d] - 1);
      else o->hi += s->st[d] * (o->shp[d] - 1);
    }
  }
}

/* every output element of a reduction (reduced dims at 0): set to the identity (post 0) or rounded (post 1, 2) */
static void red_outputs(const vm_kernel *k, char *base, int post) {
  vm_outs o;
  int64_t t, run = 1, es = vm_esize(k->stores[0].stype);
  char ident[8];
  int d, dense = 1;
  vm_outs_init(k, &o);
  for (d = o.nd - 1; d >= 0; d--) {  /* dense: the output dims are C-contiguous in the store view */
    if (o.shp[d] == 1) continue;
    if (o.st[d] != run) dense = 0;
    run *= o.shp[d];
  }
  red_identity(k->redop, k->stores[0].stype, ident);
  for (t = 0; t < o.total; t++) {
    char *p = base + (dense ? o.lo + t : o.cur) * es;  /* the outputs are one run of memory: fill it linearly */
    if (!post) {
      if (es == 4) memcpy(p, ident, 4);
      else memcpy(p, ident, (size_t)es);
    } else if (post == 1) *(float *)p = vm_round_f16(*(float *)p);
    else *(float *)p = vm_round_bf16(*(float *)p);
    if (!dense) vm_outs_next(&o);
  }
}

/* one loop kernel's run over a part of its index space: rows [r0, r1) (outer dims in odometer order) and the inner
   columns [cs, ce) (a multiple of T to the end of a tile), with the register file in ws */
typedef struct loop_job {
  const vm_kernel *k;
  char *const *bufp;
  char *ws;
  const vm_isa *isa;
  int64_t wsstride, rows, inner, block, ntg;  /* rows per independent block; tile groups a block splits into */
  int sub;  /* an epilogue's tile: a part's columns [cs, ce) narrower than a row still take several rows a tile */
  uint8_t *zf;  /* a float product's second run (vm_prodz.c): flags per output from offset zlo; else NULL */
  int64_t zlo;
  char *ztile;  /* that run's copy of a tile's values, T of them */
} loop_job;

/* the outer index of row r: an odometer position over dims [0, nd) */
static void row_index(int64_t r, const int64_t *shape, int nd, int64_t *idx) {
  int d;
  for (d = nd - 1; d >= 0; d--) {
    idx[d] = shape[d] ? r % shape[d] : 0;
    r = shape[d] ? r / shape[d] : 0;
  }
}

static void loop_part(const loop_job *j, char *ws, int64_t r0, int64_t r1, int64_t cs, int64_t ce) {
  const vm_kernel *k = j->k;
  const vm_isa *isa = j->isa;
  char *const *bufp = j->bufp;
  char **ptr = (char **)ws, **scratch, *p;
  int nd = k->ndim - 1;  /* outer dims; the last is the tile's inner dim */
  int64_t inner = j->inner, rpt, r, c0, idx[VM_MAXDIM] = {0}, rowinv_rows = 0;
  int32_t i, dot = 0, rop = k->redop == VR_DOT ? VR_ADD : k->redop;
  scratch = ptr + k->nregs;
  p = (char *)(((uintptr_t)(scratch + k->nregs) + 63) & ~(uintptr_t)63);
  for (i = 0; i < k->nregs; i++) {
    scratch[i] = p;
    p += k->regs[i].scalar ? 64 : (k->T * 8 + 63) / 64 * 64;
    ptr[i] = scratch[i];
  }
  for (i = 0; i < k->nloads; i++) {  /* invariant loads: filled once per part */
    const vm_view *v = &k->loads[i];
    if (!v->invariant) continue;
    if (k->regs[v->reg].scalar) load_row(v->stype, bufp[v->buf] + v->off * v->esize, 0, 1, scratch[v->reg]);
    else load_row(v->stype, bufp[v->buf] + v->off * v->esize, 0, k->T, scratch[v->reg]);
  }
  row_index(r0, k->shape, nd, idx);
  rpt = inner >= k->T || cs > 0 || ce < inner ? 1 : k->T / inner;
  if (j->sub && ce - cs < k->T) rpt = k->T / (ce - cs);
  for (r = r0; r < r1;) {
    int64_t nr = r1 - r < rpt ? r1 - r : rpt;
    for (c0 = cs; c0 < ce; c0 += k->T) {
      int64_t nc = ce - c0 < k->T ? ce - c0 : k->T, n = nr * nc;
      for (i = 0; i < k->nloads; i++) {
        const vm_view *v = &k->loads[i];
        if (v->invariant) continue;
        if (v->rowinv && rpt > 1 && nr <= rowinv_rows) {  /* the same row again: gathered by an earlier tile */
          ptr[v->reg] = scratch[v->reg];
          continue;
        }
        if ((v->contig && (nr == 1 || nc == inner)) ||
            (nr == 1 && v->st[nd] == 1 && !v->masked && v->stype == vm_ct(v->stype)))
          ptr[v->reg] = bufp[v->buf] + (row_off(v, idx, nd) + c0 * v->st[nd]) * v->esize;
        else {
          gather(v, bufp[v->buf], k->shape, nd, idx, nr, c0, nc, scratch[v->reg]);
          ptr[v->reg] = scratch[v->reg];
        }
      }
      if (rpt > 1 && nr > 1 && nr > rowinv_rows) rowinv_rows = nr;  /* (nr > 1: every rowinv load was gathered) */
      for (i = 0; i < k->nregs; i++) if (!k->regs[i].isload) ptr[i] = scratch[i];
      if (!k->redop)
        for (i = 0; i < k->nstores; i++) {  /* a store straight from the register: the last writer is the memory */
          const vm_view *s = &k->stores[i];
          if (k->regs[s->reg].isload || k->regs[s->reg].scalar || s->stype != vm_ct(s->stype)) continue;
          if (ptr[s->reg] != scratch[s->reg]) continue;
          if ((s->contig && (nr == 1 || nc == inner)) || (nr == 1 && s->st[nd] == 1))
            ptr[s->reg] = bufp[s->buf] + (row_off(s, idx, nd) + c0 * s->st[nd]) * s->esize;
        }
      dot = k->redop == VR_DOT && k->stores[0].st[nd] == 0;
      for (i = 0; i < k->nins - dot; i++) {
        const vm_ins *in = &k->ins[i];
        isa->alu(in, ptr[in->dst], ptr[in->a], in->b >= 0 ? ptr[in->b] : NULL,
                 in->c >= 0 && in->op == VM_WHERE ? ptr[in->c] : NULL, (in->mode & 8) ? 1 : n);
      }
      if (k->redop) {
        const vm_view *s = &k->stores[0];
        int64_t ridx[VM_MAXDIM], rr, es = s->esize;
        int d;
        char *vals = ptr[s->reg], *ob = bufp[s->buf];
        for (d = 0; d < nd; d++) ridx[d] = idx[d];
        for (rr = 0; rr < nr; rr++) {
          int64_t o = row_off(s, ridx, nd);
          if (dot) {
            const vm_ins *in = &k->ins[k->nins - 1];
            isa->red_dot(s->stype, ptr[in->a] + rr * nc * es, ptr[in->b] + rr * nc * es, nc, ob + o * es);
          } else {
            const char *rv = vals + rr * nc * es;
            int64_t oo = s->st[nd] == 0 ? o : o + c0 * s->st[nd];
            if (j->zf) {
              vm_prodz_tile(s->stype, rv, nc, j->ztile, j->zf + (oo - j->zlo), s->st[nd]);
              rv = j->ztile;
            }
            if (s->st[nd] == 0) isa->red_row(rop, s->stype, rv, nc, ob + oo * es);
            else isa->red_vert(rop, s->stype, rv, nc, ob + oo * es, s->st[nd]);
          }
          odo_next(ridx, k->shape, nd);
        }
      } else {
        for (i = 0; i < k->nstores; i++) {
          const vm_view *s = &k->stores[i];
          int64_t sidx[VM_MAXDIM], rr, ces = vm_esize(vm_ct(s->stype)), sc = k->regs[s->reg].scalar;
          int d;
          char *src = ptr[s->reg], *ob = bufp[s->buf];
          if (src == ob + (row_off(s, idx, nd) + c0 * s->st[nd]) * s->esize) continue;  /* written in place */
          for (d = 0; d < nd; d++) sidx[d] = idx[d];
          for (rr = 0; rr < nr; rr++) {
            int64_t o = row_off(s, sidx, nd) + c0 * s->st[nd];
            store_row(s->stype, sc ? src : src + rr * nc * ces, sc ? 0 : 1, nc, ob + o * s->esize, s->st[nd]);
            odo_next(sidx, k->shape, nd);
          }
        }
      }
    }
    for (i = 0; i < nr; i++) odo_next(idx, k->shape, nd);
    r += nr;
  }
}

/* units [lo, hi) of a loop job on worker w: a unit is one block of rows, or one tile group of a block */
static void loop_task(void *ctx, int64_t lo, int64_t hi, int32_t w) {
  const loop_job *j = (const loop_job *)ctx;
  char *ws = j->ws + (int64_t)w * j->wsstride;
  int64_t T = j->k->T;
  if (j->ntg == 1) { loop_part(j, ws, lo * j->block, hi * j->block, 0, j->inner); return; }
  while (lo < hi) {  /* consecutive tile groups of one block run as one part */
    int64_t b = lo / j->ntg, g0 = lo % j->ntg, g1 = hi - b * j->ntg < j->ntg ? hi - b * j->ntg : j->ntg;
    int64_t ce = g1 * T < j->inner ? g1 * T : j->inner;
    loop_part(j, ws, b * j->block, (b + 1) * j->block, g0 * T, ce);
    lo = b * j->ntg + g1;
  }
}

/* below this many element-operations a kernel runs on the calling thread: waking a worker costs more */
#define PAR_MIN_WORK ((int64_t)1 << 15)
/* below this many, a kernel split over threads is split in one part per thread */
#define PAR_FEW_PARTS ((int64_t)1 << 20)
/* from this many, in sixteen parts per thread */
#define PAR_MANY_PARTS ((int64_t)1 << 24)

/* whether rows that differ in outer dim d may share an output element: d is reduced, or a store does not move
   along it */
static int dim_shared(const vm_kernel *k, int d) {
  int32_t i;
  if (k->redop && (k->redmask >> d & 1u)) return 1;
  for (i = 0; i < k->nstores; i++) if (k->stores[i].st[d] == 0) return 1;
  return 0;
}

static int run_loop(const vm_kernel *k, char *const *bufp, char *ws, int64_t wsstride, int32_t nthreads,
                    const vm_isa *isa) {
  int nd = k->ndim - 1, d;
  int64_t work, units, chunk, span, per;
  loop_job j;
  j.k = k; j.bufp = bufp; j.ws = ws; j.isa = isa; j.wsstride = wsstride;
  j.inner = k->shape[nd]; j.rows = 1; j.block = 1; j.ntg = 1; j.zf = NULL; j.zlo = 0; j.ztile = NULL; j.sub = 0;
  for (d = 0; d < nd; d++) j.rows *= k->shape[d];
  if (k->redop) red_outputs(k, bufp[k->stores[0].buf], 0);
  if (j.rows == 0 || j.inner == 0) return 0;
  work = j.rows * j.inner * (k->nins + k->nloads + k->nstores + 1);
  if (nthreads < 2 || work < PAR_MIN_WORK) {
    loop_part(&j, ws, 0, j.rows, 0, j.inner);
  } else {
    /* independent parts: rows grouped in blocks from the first outer dim whose rows may share an output on, and
       the inner dim split by tiles unless rows reduce along it */
    for (d = 0; d < nd; d++) if (k->shape[d] > 1 && dim_shared(k, d)) break;
    for (; d < nd; d++) j.block *= k->shape[d];
    if (j.inner > k->T && !(j.inner > 1 && dim_shared(k, nd))) j.ntg = (j.inner + k->T - 1) / k->T;
    units = j.rows / j.block * j.ntg;
    /* one part per thread for a small kernel (each part claimed is a compare-and-swap on a cache line both cores
       write, and repeats the part's invariant and bias gathers), four per thread to even out larger ones, and
       sixteen for the largest (milliseconds a thread): the last part a thread takes from a late peer is then a
       thirty-second of the job, not an eighth */
    per = work < PAR_FEW_PARTS ? 1 : work < PAR_MANY_PARTS ? 4 : 16;
    chunk = (units + per * (int64_t)nthreads - 1) / (per * (int64_t)nthreads);
    if (chunk * (work / units) < PAR_MIN_WORK / 2) chunk = (PAR_MIN_WORK / 2 + work / units) / (work / units + 1);
    vm_pool_for(units, chunk, loop_task, &j, nthreads);
  }
  if (k->redop == VR_MUL && (k->stores[0].stype == VT_F32 || k->stores[0].stype == VT_F64) &&
      vm_prodz_nan(k, bufp[k->stores[0].buf], &j.zlo, &span)) {
    /* a NaN product: run again, single-threaded, noting zeros (vm_prodz.c); rare, so not worth a fast path */
    j.zf = (uint8_t *)calloc((size_t)span, 1);
    j.ztile = (char *)malloc((size_t)k->T * 8);
    if (!j.zf || !j.ztile) { free(j.zf); free(j.ztile); return PG_ERR_NOMEM; }
    red_outputs(k, bufp[k->stores[0].buf], 0);
    loop_part(&j, ws, 0, j.rows, 0, j.inner);
    vm_prodz_fix(k, bufp[k->stores[0].buf], j.zf, j.zlo);
    free(j.zf);
    free(j.ztile);
  }
  if (k->redop && k->post) red_outputs(k, bufp[k->stores[0].buf], k->post);
  return 0;
}

/* a contraction split by batch element and output tiles; each worker packs into its own part of ws */
typedef struct gemm_job {
  const vm_gemm *g;
  const char *a, *b;
  char *c, *ws;
  const vm_isa *isa;
  int64_t wsstride, es, rb, cb, nrb, ncb;  /* rows and columns per tile, tiles down and across */
  const vm_kernel *epi;  /* the epilogues (nepi kernels), run on each tile after it, their registers at epiws */
  int32_t nepi, swapped;  /* swapped: g is the program's contraction transposed (gemm_oriented) */
  char *const *bufp;
  int64_t epiws;
} gemm_job;

/* the epilogues of a contraction on C[i0:i1, j0:j1] (the program's orientation), just computed by this thread */
static void gemm_epilogues(const gemm_job *gj, int64_t i0, int64_t i1, int64_t j0, int64_t j1, char *ws) {
  int32_t e;
  for (e = 0; e < gj->nepi; e++) {
    const vm_kernel *k = &gj->epi[e];
    loop_job j;
    j.k = k; j.bufp = gj->bufp; j.ws = ws; j.isa = gj->isa; j.wsstride = 0;
    j.inner = k->shape[1]; j.rows = k->shape[0]; j.block = 1; j.ntg = 1; j.zf = NULL; j.zlo = 0; j.ztile = NULL;
    j.sub = 1;
    if (k->epi_tr) loop_part(&j, ws, j0, j1, i0, i1);  /* its rows are C's columns */
    else loop_part(&j, ws, i0, i1, j0, j1);
  }
}

static void gemm_task(void *ctx, int64_t lo, int64_t hi, int32_t w) {
  const gemm_job *j = (const gemm_job *)ctx;
  const vm_gemm *g = j->g;
  int64_t u, per = j->nrb * j->ncb;
  for (u = lo; u < hi; u++) {
    int64_t t = u / per, tile = u % per, i0 = tile / j->ncb * j->rb, j0 = tile % j->ncb * j->cb;
    int64_t i1 = i0 + j->rb < g->n ? i0 + j->rb : g->n, j1 = j0 + j->cb < g->m ? j0 + j->cb : g->m;
    int64_t oa = 0, ob = 0, oc = 0, rest = t;
    int d;
    for (d = g->nbatch - 1; d >= 0; d--) {  /* batch element t's offsets */
      int64_t x = rest % g->bsize[d];
      rest /= g->bsize[d];
      oa += x * g->bsa[d]; ob += x * g->bsb[d]; oc += x * g->bsc[d];
    }
    j->isa->gemm_part(g, j->a + oa * j->es, j->b + ob * j->es, j->c + oc * j->es, i0, i1, j0, j1,
                      j->ws + (int64_t)w * j->wsstride);
    if (j->nepi == 0) continue;
    if (j->swapped) gemm_epilogues(j, j0, j1, i0, i1, j->ws + (int64_t)w * j->wsstride + j->epiws);
    else gemm_epilogues(j, i0, i1, j0, j1, j->ws + (int64_t)w * j->wsstride + j->epiws);
  }
}

/* below this many multiply-adds a contraction runs on one thread */
#define PAR_MIN_GEMM ((int64_t)1 << 17)
/* up to this many elements of B (depth x columns), packing all of it again per thread costs little */
#define GEMM_SMALL_B ((int64_t)4096)
/* up to this many elements, an operand is packed whole by every tile so that each tile holds whole epilogue rows */
#define GEMM_EPI_PACK ((int64_t)32768)

/* C^T = B^T A^T: the same contraction with the operands' roles swapped and C written transposed */
static void gemm_transpose(const vm_gemm *g, vm_gemm *t) {
  int d;
  *t = *g;
  t->a = g->b; t->b = g->a; t->offa = g->offb; t->offb = g->offa;
  t->n = g->m; t->m = g->n;
  t->san = g->sbm; t->sak = g->sbk; t->sbk = g->sak; t->sbm = g->san; t->scn = g->scm; t->scm = g->scn;
  for (d = 0; d < g->nbatch; d++) { t->bsa[d] = g->bsb[d]; t->bsb[d] = g->bsa[d]; }
}

/* the contraction run_gemm runs for g: g itself, or its transpose in *swapped */
static const vm_gemm *gemm_oriented(const vm_gemm *g, vm_gemm *swapped) {
  /* a narrow C: vectors along its long side (decided by shape and strides alone), unless A's rows run along the
     depth, when each row of C is one vector (vm_gemm.h, gemm_narrow) */
  if (g->m < VM_GEMM_NARROW && g->n >= 2 * g->m && g->sak != 1) {
    gemm_transpose(g, swapped);
    return swapped;
  }
  if (g->scn == 1 && g->scm != 1 && g->n >= VM_GEMM_NARROW) {
    /* C written transposed (a weight's gradient, x.T @ g, planned as (g.T @ x).T): every register tile would be
       stored element by element; as C^T = B^T A^T its rows are contiguous and take vector stores. Each element's
       sum keeps its order (the products commute), so the bits are the same */
    gemm_transpose(g, swapped);
    return swapped;
  }
  return g;
}

/* the packing bytes one worker needs for the program's largest contraction on isa, 64-byte rounded */
static int64_t gemm_ws_need(const pg_vm *vm, const vm_isa *isa) {
  int64_t need = 0, w;
  int32_t i;
  for (i = 0; i < vm->nkern; i++) {
    vm_gemm swapped;
    if (vm->kern[i].kind != VK_GEMM) continue;
    w = ((int64_t)isa->gemm_ws(gemm_oriented(vm->kern[i].gemm, &swapped)) + 63) / 64 * 64;
    if (w > need) need = w;
  }
  return need;
}

/* a contraction and its epilogues (the nepi kernels after it); worker w packs into ws + w * wsstride (at least
   gemm_ws_need bytes each), and its epilogues' registers are at epiws past that */
static int run_gemm(const vm_kernel *k, char *const *bufp, char *ws, int64_t wsstride, int64_t epiws,
                    int32_t nthreads, const vm_isa *isa) {
  vm_gemm swapped;
  const vm_gemm *g = gemm_oriented(k->gemm, &swapped);
  int64_t total = 1, flops, units;
  int d;
  gemm_job j;
  j.g = g; j.isa = isa; j.es = vm_esize(g->lt);
  j.epi = k + 1; j.nepi = k->nepi; j.swapped = g != k->gemm; j.bufp = bufp; j.epiws = epiws;
  j.a = bufp[g->a] + g->offa * j.es; j.b = bufp[g->b] + g->offb * j.es; j.c = bufp[g->c] + g->offc * j.es;
  for (d = 0; d < g->nbatch; d++) total *= g->bsize[d];
  if (total == 0 || g->n == 0 || g->m == 0) return 0;
  flops = total * g->n * g->m * (g->k > 0 ? g->k : 1);
  j.rb = g->n; j.cb = g->m;
  if (nthreads < 2 || flops < PAR_MIN_GEMM) nthreads = 1;
  else if (total < (int64_t)nthreads) {
    /* split the larger side of C: the other operand is packed again by every tile, so it should be the small one.
       But rows when all of B is small to pack (a shallow contraction: g @ w.T over 10 classes): then each thread
       writes whole rows of C, as the loop kernels around it split their rows (vm_pool.c gives every thread its
       own share of each job), and the next kernel reads its rows from its own core's cache. Tiles stay multiples
       of 16 (every micro-tile width divides it) */
    int64_t parts = (int64_t)nthreads / total;
    int cols = g->m >= g->n && !(g->k * g->m <= GEMM_SMALL_B && g->n >= 16 * parts);
    /* with epilogues, tiles of whole epilogue rows (its rows are C's unless either it or g is transposed): over a
       part of each row an epilogue would run row by row, or copy its operands, at several times its cost. When
       that split packs a large operand whole in every tile, the epilogues run after it as loop kernels instead */
    if (k->nepi > 0 && cols != (k[1].epi_tr != j.swapped)) {
      if ((cols ? g->k * g->m : g->k * g->n) <= GEMM_EPI_PACK) cols = !cols;
      else j.nepi = 0;
    }
    if (cols) j.cb = ((g->m + parts - 1) / parts + 15) / 16 * 16;
    else j.rb = ((g->n + parts - 1) / parts + 15) / 16 * 16;
  }
  j.nrb = (g->n + j.rb - 1) / j.rb;
  j.ncb = (g->m + j.cb - 1) / j.cb;
  units = total * j.nrb * j.ncb;
  if (nthreads > units) nthreads = (int32_t)units;
  j.wsstride = wsstride;
  j.ws = ws;
  if (nthreads < 2) gemm_task(&j, 0, units, 0);
  else vm_pool_for(units, 1, gemm_task, &j, nthreads);
  for (d = j.nepi; d < k->nepi; d++) {  /* epilogues not run on the tiles */
    int rc = run_loop(&k[1 + d], bufp, ws, wsstride, nthreads, isa);
    if (rc != 0) return rc;
  }
  return 0;
}

/* register files of at least need bytes for a run of vm (their size in *cap): the ones the program keeps if it has
   them and they are big enough, else new ones (mem.h: a big block is mapped, so freeing it gives it back) */
static char *ws_take(pg_vm *vm, size_t need, size_t *cap) {
  char *ws;
  pg_lock_take(&vm->wslock);
  ws = vm->ws;
  *cap = vm->wscap;
  vm->ws = NULL;
  vm->wscap = 0;
  pg_lock_drop(&vm->wslock);
  if (ws && *cap >= need) return ws;
  pg_mem_free(ws, *cap);  /* too small (more threads than before): replaced */
  *cap = need;
  return (char *)pg_mem_alloc(need);
}

/* a run is done with its register files: the program keeps them for its next run unless it already has some (a
   concurrent run's), then they are freed */
static void ws_give(pg_vm *vm, char *ws, size_t cap) {
  pg_lock_take(&vm->wslock);
  if (!vm->ws) {
    vm->ws = ws;
    vm->wscap = cap;
    ws = NULL;
  }
  pg_lock_drop(&vm->wslock);
  pg_mem_free(ws, cap);
}

/* bufp tables up to this many buffers live on the stack: no allocation per run of a small program */
#define VM_STACK_BUFS 64

/* run a prepared program: slots[i] points at sizes[i] bytes (>= what the program needs of slot i) */
int pg_vm_run(pg_vm *vm, void *const *slots, const int64_t *sizes, int32_t nslots) {
  char **bufp, *ws = NULL, *stackp[VM_STACK_BUFS];
  const vm_isa *isa = vm_isa_current();
  int32_t i, nthreads = pg_vm_get_threads();
  int64_t wsstride, gws;
  size_t wscap = 0;
  int rc = 0;
  if (!vm || (nslots > 0 && (!slots || !sizes))) return PG_ERR_ARG;
  if (nslots != vm->nslots) return PG_VM_ERR_SLOTS;
  for (i = 0; i < nslots; i++)
    if (sizes[i] < vm->slotmin[i] || (vm->slotmin[i] > 0 && !slots[i])) return PG_VM_ERR_SLOTS;
  bufp = vm->nbufs < VM_STACK_BUFS ? stackp : (char **)malloc(((size_t)vm->nbufs + 1) * sizeof *bufp);
  if (!bufp) return PG_ERR_NOMEM;
  for (i = 0; i < vm->nbufs; i++) {
    bufp[i] = (char *)slots[vm->bufs[i].slot] + vm->bufs[i].off;
    if ((uintptr_t)bufp[i] % (uintptr_t)vm->bufs[i].align) { rc = PG_VM_ERR_SLOTS; goto done; }  /* misaligned */
  }
  /* one workspace per thread serves the loops' register files and the contractions' packing (kernels run one after
     another), kept by the program between runs: no allocation per contraction */
  pg_lock_take(&vm->wslock);
  if (vm->gws_isa != isa) {  /* the contractions' need, for the instruction set in force */
    vm->gws = gemm_ws_need(vm, isa);
    vm->gws_isa = isa;
  }
  gws = vm->gws;
  pg_lock_drop(&vm->wslock);
  wsstride = (vm->wsbytes + 63) / 64 * 64;
  if (vm->hasepi) wsstride += gws;  /* an epilogue's registers beside its contraction's packing */
  else if (gws > wsstride) wsstride = gws;
  if (wsstride > 0 && !(ws = ws_take(vm, (size_t)(wsstride * nthreads), &wscap))) { rc = PG_ERR_NOMEM; goto done; }
  for (i = 0; i < vm->nkern && rc == 0; i++) {
    const vm_kernel *k = &vm->kern[i];
    if (k->kind == VK_LOOP) rc = run_loop(k, bufp, ws, wsstride, nthreads, isa);
    else {
      rc = run_gemm(k, bufp, ws, wsstride, vm->hasepi ? gws : 0, nthreads, isa);
      i += k->nepi;  /* its epilogues ran with it */
    }
  }
  if (ws) ws_give(vm, ws, wscap);
done:
  if (bufp != stackp) free(bufp);
  return rc;
}
