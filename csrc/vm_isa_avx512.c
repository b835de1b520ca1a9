/* vm_isa_avx512.c: the AVX-512 (F, DQ, BW, VL) clone of the VM's tile kernels (x86 with GNU target attributes). */
#include "vm_simd.h"
#if VM_X86
#include <immintrin.h>

#define VM_FN(name) vm_##name##_avx512
#define VM_ISA_NAME "avx512"
#define VM_ISA_AVX512 "avx512f,avx512dq,avx512bw,avx512vl,avx2,fma"
/* streaming kernels (two operands from memory, little arithmetic) run faster on 32-byte vectors: numpy buffers are
   16-byte aligned, and 64-byte loads would split cache lines. gcc takes the vector width as a target option; clang
   has no such attribute (it widens to 512 bits by default), so there they are compiled for AVX2 + FMA */
#if defined(__clang__)
#define VM_TGT __attribute__((target(VM_ISA_AVX512)))
#define VM_TGT_STREAM __attribute__((target("avx2,fma")))
#else
#define VM_TGT __attribute__((target(VM_ISA_AVX512 ",prefer-vector-width=512")))
#define VM_TGT_STREAM __attribute__((target(VM_ISA_AVX512 ",prefer-vector-width=256")))
#endif
#define VM_VBYTES 64
#define VM_SQRT_PS_N 8
#define VM_SQRT_PS(d, x) _mm256_storeu_ps(d, _mm256_sqrt_ps(_mm256_loadu_ps(x)))
#define VM_SQRT_PD_N 4
#define VM_SQRT_PD(d, x) _mm256_storeu_pd(d, _mm256_sqrt_pd(_mm256_loadu_pd(x)))
#define VM_HAVE_FMA 1
#include "vm_clone.h"
#else
typedef int vm_isa_avx512_none;  /* not this target: ISO C wants a non-empty translation unit */
#endif
