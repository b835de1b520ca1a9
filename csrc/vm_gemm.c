/* vm_gemm.c: the contraction kernels (vm_gemm.h) compiled once per instruction set -- portable, AVX2+FMA and
   AVX-512 -- for float32 and float64, with the entries vm_simd.c's instruction-set table points at. A file of its
   own so that the tile kernels (vm_simd.c) and the contraction compile, and change, apart. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "vm.h"

#include "vm_simd.h"
#if VM_X86
#include <immintrin.h>
#endif

#define VM_GEMM_CLONE(SFX) \
  size_t vm_gemm_ws_##SFX(const vm_gemm *g) { \
    return g->lt == VT_F64 ? gemm_ws_f64_##SFX(g) : gemm_ws_f32_##SFX(g); } \
  void vm_gemm_part_##SFX(const vm_gemm *g, const char *a, const char *b, char *c, int64_t i0, int64_t i1, \
                          int64_t j0, int64_t j1, char *ws) { \
    if (g->lt == VT_F64) gemm_part_f64_##SFX(g, a, b, c, i0, i1, j0, j1, ws); \
    else gemm_part_f32_##SFX(g, a, b, c, i0, i1, j0, j1, ws); }

/* ---- portable ---- */
#define VM_FN(name) name##_base
#define VM_TGT
#define VM_VBYTES 16
#include "vm_gemm_clone.h"
VM_GEMM_CLONE(base)

#if VM_X86
/* ---- AVX2 + FMA ---- */
#define VM_FN(name) name##_avx2
#define VM_TGT __attribute__((target("avx2,fma")))
#define VM_VBYTES 32
#include "vm_gemm_clone.h"
VM_GEMM_CLONE(avx2)

/* ---- AVX-512 (F, DQ, BW, VL) ---- */
#define VM_FN(name) name##_avx512
#if defined(__clang__)  /* clang has no vector-width target option; it uses 512-bit vectors by default */
#define VM_TGT __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,avx2,fma")))
#else
#define VM_TGT __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,avx2,fma,prefer-vector-width=512")))
#endif
#define VM_VBYTES 64
#include "vm_gemm_clone.h"
VM_GEMM_CLONE(avx512)
#endif
