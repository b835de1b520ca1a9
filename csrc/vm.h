/* vm.h: the interpreter's internal types, shared by vm_read.c (program parsing, validation), vm.c (the tile loop) and vm_simd.c
   (the per-instruction-set tile kernels). Not seen by cffi: pygrad.h declares only the public pg_vm_* functions. */
#ifndef PG_VM_H
#define PG_VM_H
#include <stdint.h>
#include <stddef.h>
#include "opcodes.h"
#include "tables.h"
#include "vm_half.h"
#include "lock.h"

#define VM_MAXDIM PG_VM_MAXDIM
#define VM_MAXTILE 65536
/* a contraction whose C has fewer columns than this is narrow: transposed (run_gemm), or, when its A rows run
   along the depth, one vector per row (vm_gemm.h, gemm_narrow) */
#define VM_GEMM_NARROW 16
#define VM_MAGIC PG_VM_MAGIC
#define VM_VERSION PG_VM_VERSION

/* logical dtype ids (VT_*), kernel kinds of a program (VK_*) and reduce ops of a loop kernel (VR_*): tables.h */
#define VM_VT_ENTRY(name, id, vt, size) VT_##vt = id,
#define VM_VK_ENTRY(name, id) VK_##name = id,
#define VM_VR_ENTRY(name, id) VR_##name = id,
enum { PG_DTYPES(VM_VT_ENTRY) VT_N };
enum { PG_VM_KINDS(VM_VK_ENTRY) VK_END };
enum { PG_VM_REDOPS(VM_VR_ENTRY) VR_END };
#undef VM_VT_ENTRY
#undef VM_VK_ENTRY
#undef VM_VR_ENTRY

/* one instruction: dst = op(a, b, c) over a tile, in logical type lt (float16/bfloat16 computed in float32 and
   rounded). mode bits: 1 a is scalar, 2 b is scalar, 4 c is scalar, 8 dst is scalar. sct: compute type of a. */
typedef struct vm_ins { int32_t op, lt, dst, a, b, c, mode, sct; } vm_ins;

/* a register: compute type, scalar (one element for the whole kernel) and whether a load fills it */
typedef struct vm_regdef { int32_t ct, scalar, isload; } vm_regdef;

/* a strided view of a buffer over the kernel's index space: element offset and strides (in elements of stype),
   an optional mask (index range [lo, hi) per dim, zero outside). invariant: one value for the whole kernel; rowinv:
   the same row for every outer index (a bias broadcast over a batch) */
typedef struct vm_view {
  int32_t reg, buf, stype, esize, masked, contig, invariant, rowinv;
  int64_t off;
  int64_t *st;  /* ndim strides, in the program's arena (a gradient's program holds hundreds of thousands of views) */
  int64_t *lo, *hi;  /* (a masked view's, in the program's arena; NULL unmasked: [0, shape) in every dim) */
} vm_view;

/* C[batch][n][m] = sum_k A[batch][n][k] * B[batch][k][m], strides in elements */
typedef struct vm_gemm {
  int32_t lt, a, b, c, nbatch;
  int64_t offa, offb, offc, n, m, k, san, sak, sbk, sbm, scn, scm;
  int64_t bsize[VM_MAXDIM], bsa[VM_MAXDIM], bsb[VM_MAXDIM], bsc[VM_MAXDIM];
} vm_gemm;

/* epi_tr: an EPILOGUE's index space is its contraction's (m, n), not (n, m); nepi: a GEMM's epilogues, the kernels
   that follow it */
typedef struct vm_kernel {
  int32_t kind, ndim, redop, rlt, post, nregs, nloads, nins, nstores, epi_tr, nepi;
  int64_t T, shape[VM_MAXDIM], wsbytes;
  uint32_t redmask;
  vm_regdef *regs;
  vm_view *loads, *stores;
  vm_ins *ins;
  vm_gemm *gemm;  /* (a contraction's only: most kernels are loops, and vm_gemm is ~600 bytes) */
} vm_kernel;

typedef struct vm_buf { int32_t slot; int64_t off, nbytes, align; } vm_buf;

/* a block of a program's arena (vm_read.c, vm_take): its kernels' registers, views, instructions and contractions, from
   `data` on; the blocks are chained from the newest */
typedef struct vm_chunk { struct vm_chunk *next; size_t cap, used, size; } vm_chunk;

struct pg_vm {
  int32_t nslots, nbufs, nkern, hasepi;
  int64_t *slotmin, wsbytes;
  vm_buf *bufs;
  vm_kernel *kern;
  vm_chunk *chunks;  /* the arena, and the size of its next block */
  size_t chunk_next;
  /* the register files of the last run, kept for the next one (a compiled program runs many times: mapping them
     afresh each run would fault every page in again); NULL while a run has them, so a concurrent run of the same
     program makes its own. Freed with the program, so a dropped program gives them back (csrc/mem.h) */
  pg_lock wslock;
  char *ws;
  size_t wscap;
  /* the packing bytes per worker of the program's contractions on instruction set gws_isa (NULL: not known yet);
     both read and written under wslock */
  const struct vm_isa *gws_isa;
  int64_t gws;
};

/* the kernels of one instruction set (vm_simd.c) */
typedef struct vm_isa {
  const char *name;
  void (*alu)(const vm_ins *in, char *d, const char *a, const char *b, const char *c, int64_t n);
  void (*red_row)(int32_t redop, int32_t ct, const char *v, int64_t n, char *out);
  void (*red_vert)(int32_t redop, int32_t ct, const char *v, int64_t n, char *out, int64_t ostride);
  void (*red_dot)(int32_t ct, const char *a, const char *b, int64_t n, char *out);
  /* packing bytes one worker needs for g; C[i0:i1, j0:j1] of one batch element into c, packing into ws */
  size_t (*gemm_ws)(const vm_gemm *g);
  void (*gemm_part)(const vm_gemm *g, const char *a, const char *b, char *c, int64_t i0, int64_t i1, int64_t j0,
                    int64_t j1, char *ws);
} vm_isa;

/* vm_pool.c: run fn(ctx, lo, hi, worker) over [0, n) in chunks of `chunk`, on at most maxw threads (worker is the
   thread's index, < maxw, for its private workspace); returns when all chunks are done */
typedef void (*vm_task)(void *ctx, int64_t lo, int64_t hi, int32_t worker);
void vm_pool_for(int64_t n, int64_t chunk, vm_task fn, void *ctx, int32_t maxw);

/* the outputs of reduction kernel k (its store at the kept dims), visited in odometer order: vm_outs_init puts cur
   on the first and lo/hi around all of them, vm_outs_next moves cur to the next; vm.c's identity fill and rounding
   and vm_prodz.c's scans walk them the same way */
typedef struct vm_outs { int64_t shp[VM_MAXDIM], st[VM_MAXDIM], idx[VM_MAXDIM], cur, total, lo, hi; int nd; } vm_outs;
void vm_outs_init(const vm_kernel *k, vm_outs *o);
static inline void vm_outs_next(vm_outs *o) {
  int d;
  for (d = o->nd - 1; d >= 0; d--) {
    if (++o->idx[d] < o->shp[d]) { o->cur += o->st[d]; return; }
    o->cur -= o->st[d] * (o->idx[d] - 1);
    o->idx[d] = 0;
  }
}

/* vm_prodz.c: a float product's exact zero (0 * an overflowed partial product is NaN): whether reduction kernel k
   left a NaN output in base (and the span [lo, lo + span) of its output offsets); a tile row's n values copied to dst
   with zeros replaced by +-1, noting in flags f (stride fs elements: 0 when they all reduce into one output) zeros,
   inf/NaN entries and the sign parity; the outputs that met a zero then set to +-0, or NaN beside an inf/NaN entry */
int vm_prodz_nan(const vm_kernel *k, const char *base, int64_t *lo, int64_t *span);
void vm_prodz_tile(int32_t ct, const char *v, int64_t n, char *dst, uint8_t *f, int64_t fs);
void vm_prodz_fix(const vm_kernel *k, char *base, const uint8_t *zf, int64_t lo);
/* vm_transpose.c: d[r][c] (rows nc apart) = s[c * si + r * so], r < nr, c < nc, elements of esize (4 or 8) bytes */
void vm_transpose_copy(const char *src, int64_t si, int64_t so, char *dst, int64_t nr, int64_t nc, int64_t esize);
const vm_isa *vm_isa_current(void);
/* vm_epilogue.c: EPILOGUE kernel ki (read) checked against its contraction's group, whose nepi it sets: NULL when
   safe to run tile by tile, else what is wrong */
const char *vm_epilogue_check(struct pg_vm *vm, int32_t ki);
/* vm_gemm.c: the contraction entries of each instruction set */
size_t vm_gemm_ws_base(const vm_gemm *g);
void vm_gemm_part_base(const vm_gemm *g, const char *a, const char *b, char *c, int64_t i0, int64_t i1, int64_t j0,
                       int64_t j1, char *ws);
size_t vm_gemm_ws_avx2(const vm_gemm *g);
void vm_gemm_part_avx2(const vm_gemm *g, const char *a, const char *b, char *c, int64_t i0, int64_t i1, int64_t j0,
                       int64_t j1, char *ws);
size_t vm_gemm_ws_avx512(const vm_gemm *g);
void vm_gemm_part_avx512(const vm_gemm *g, const char *a, const char *b, char *c, int64_t i0, int64_t i1,
                         int64_t j0, int64_t j1, char *ws);
int vm_ct(int32_t lt);
int64_t vm_esize(int32_t t);

#endif
