/* vm_isa_avx2.c: the AVX2 + FMA clone of the VM's tile kernels (x86 with GNU target attributes only). */
#include "vm_simd.h"
#if VM_X86
#include <immintrin.h>

#define VM_FN(name) vm_##name##_avx2
#define VM_ISA_NAME "avx2"
#define VM_TGT __attribute__((target("avx2,fma")))
#define VM_TGT_STREAM VM_TGT
#define VM_VBYTES 32
#define VM_SQRT_PS_N 8
#define VM_SQRT_PS(d, x) _mm256_storeu_ps(d, _mm256_sqrt_ps(_mm256_loadu_ps(x)))
#define VM_SQRT_PD_N 4
#define VM_SQRT_PD(d, x) _mm256_storeu_pd(d, _mm256_sqrt_pd(_mm256_loadu_pd(x)))
#define VM_HAVE_FMA 1
#include "vm_clone.h"
#else
typedef int vm_isa_avx2_none;  /* not this target: ISO C wants a non-empty translation unit */
#endif
