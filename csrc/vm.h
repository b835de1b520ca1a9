/* vm.h: the interpreter's internal types, shared by vm.c (program parsing, validation, the tile loop) and vm_simd.c
   (the per-instruction-set tile kernels). Not seen by cffi: pygrad.h declares only the public pg_vm_* functions. */
#ifndef PG_VM_H
#define PG_VM_H
#include <stdint.h>
#include <stddef.h>
#include "opcodes.h"
#include "vm_half.h"

#define VM_MAXDIM 16
#define VM_MAXTILE 65536
#define VM_MAGIC 0x50475650  /* "PGVP" */
#define VM_VERSION 1

/* logical dtype ids: pygrad/dtype.py's DType.id */
enum { VT_BOOL, VT_I8, VT_I16, VT_I32, VT_I64, VT_U8, VT_U16, VT_U32, VT_U64, VT_F16, VT_BF16, VT_F32, VT_F64, VT_N };

/* kernel kinds of a program */
enum { VK_LOOP = 1, VK_GEMM = 2 };
/* reduce ops of a loop kernel */
enum { VR_NONE, VR_ADD, VR_MAX, VR_MUL, VR_DOT };  /* VR_DOT: a sum of the last instruction's product */

/* one instruction: dst = op(a, b, c) over a tile, in logical type lt (float16/bfloat16 computed in float32 and
   rounded). mode bits: 1 a is scalar, 2 b is scalar, 4 c is scalar, 8 dst is scalar. sct: compute type of a. */
typedef struct vm_ins { int32_t op, lt, dst, a, b, c, mode, sct; } vm_ins;

/* a register: compute type, scalar (one element for the whole kernel) and whether a load fills it */
typedef struct vm_regdef { int32_t ct, scalar, isload; } vm_regdef;

/* a strided view of a buffer over the kernel's index space: element offset and strides (in elements of stype),
   an optional mask (index range [lo, hi) per dim, zero outside) */
typedef struct vm_view {
  int32_t reg, buf, stype, esize, masked, contig, invariant;
  int64_t off, st[VM_MAXDIM], lo[VM_MAXDIM], hi[VM_MAXDIM];
} vm_view;

/* C[batch][n][m] = sum_k A[batch][n][k] * B[batch][k][m], strides in elements */
typedef struct vm_gemm {
  int32_t lt, a, b, c, nbatch;
  int64_t offa, offb, offc, n, m, k, san, sak, sbk, sbm, scn, scm;
  int64_t bsize[VM_MAXDIM], bsa[VM_MAXDIM], bsb[VM_MAXDIM], bsc[VM_MAXDIM];
} vm_gemm;

typedef struct vm_kernel {
  int32_t kind, ndim, redop, rlt, post, nregs, nloads, nins, nstores;
  int64_t T, shape[VM_MAXDIM], wsbytes;
  uint32_t redmask;
  vm_regdef *regs;
  vm_view *loads, *stores;
  vm_ins *ins;
  vm_gemm gemm;
} vm_kernel;

typedef struct vm_buf { int32_t slot; int64_t off, nbytes, align; } vm_buf;

struct pg_vm {
  int32_t nslots, nbufs, nkern;
  int64_t *slotmin, wsbytes;
  vm_buf *bufs;
  vm_kernel *kern;
};

/* the kernels of one instruction set (vm_simd.c) */
typedef struct vm_isa {
  const char *name;
  void (*alu)(const vm_ins *in, char *d, const char *a, const char *b, const char *c, int64_t n);
  void (*red_row)(int32_t redop, int32_t ct, const char *v, int64_t n, char *out);
  void (*red_vert)(int32_t redop, int32_t ct, const char *v, int64_t n, char *out, int64_t ostride);
  void (*red_dot)(int32_t ct, const char *a, const char *b, int64_t n, char *out);
  int (*gemm)(const vm_gemm *g, const char *a, const char *b, char *c);
} vm_isa;

const vm_isa *vm_isa_current(void);
int vm_ct(int32_t lt);
int64_t vm_esize(int32_t t);

#endif
