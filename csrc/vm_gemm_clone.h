/* One clone of the contraction (vm_gemm.h) for float32 and float64, compiled with the instruction set the includer
   chose. Included by vm_gemm.c once per ISA with VM_FN(name), VM_TGT and VM_VBYTES defined; it undefines them
   again. No include guard: each inclusion is another clone. G_MADD is the tile's multiply-add: a fused one (one
   rounding, and the FMA ports) where the clone's ISA has it, since C11 mode compiles `acc += a * b` unfused. */
#define GT float
#define G_F32 1
#define GFN(name) VM_FN(name##_f32)
#define GV VM_FN(gv_f32)
#define G32 VM_FN(gv32_f32)
#define G16 VM_FN(gv16_f32)
#if defined(__GNUC__)
typedef float GV __attribute__((vector_size(VM_VBYTES)));
typedef float G32 __attribute__((vector_size(32)));
typedef float G16 __attribute__((vector_size(16)));
#endif
#if VM_X86 && VM_VBYTES == 64
#define G_MADD(acc, s, v) ((acc) = (GV)_mm512_fmadd_ps(_mm512_set1_ps(s), (__m512)(v), (__m512)(acc)))
#define G_VMADD(acc, x, y) ((acc) = (GV)_mm512_fmadd_ps((__m512)(x), (__m512)(y), (__m512)(acc)))
#elif VM_X86 && VM_VBYTES == 32
#define G_MADD(acc, s, v) ((acc) = (GV)_mm256_fmadd_ps(_mm256_set1_ps(s), (__m256)(v), (__m256)(acc)))
#define G_VMADD(acc, x, y) ((acc) = (GV)_mm256_fmadd_ps((__m256)(x), (__m256)(y), (__m256)(acc)))
#else
#define G_MADD(acc, s, v) ((acc) += (s) * (v))
#define G_VMADD(acc, x, y) ((acc) += (x) * (y))
#endif
#include "vm_gemm.h"
#undef G_MADD
#undef G_VMADD
#undef GT
#undef G_F32
#undef GFN
#undef GV
#undef G32
#undef G16

#define GT double
#define GFN(name) VM_FN(name##_f64)
#define GV VM_FN(gv_f64)
#define G32 VM_FN(gv32_f64)
#define G16 VM_FN(gv16_f64)
#if defined(__GNUC__)
typedef double GV __attribute__((vector_size(VM_VBYTES)));
typedef double G32 __attribute__((vector_size(32)));
typedef double G16 __attribute__((vector_size(16)));
#endif
#if VM_X86 && VM_VBYTES == 64
#define G_MADD(acc, s, v) ((acc) = (GV)_mm512_fmadd_pd(_mm512_set1_pd(s), (__m512d)(v), (__m512d)(acc)))
#define G_VMADD(acc, x, y) ((acc) = (GV)_mm512_fmadd_pd((__m512d)(x), (__m512d)(y), (__m512d)(acc)))
#elif VM_X86 && VM_VBYTES == 32
#define G_MADD(acc, s, v) ((acc) = (GV)_mm256_fmadd_pd(_mm256_set1_pd(s), (__m256d)(v), (__m256d)(acc)))
#define G_VMADD(acc, x, y) ((acc) = (GV)_mm256_fmadd_pd((__m256d)(x), (__m256d)(y), (__m256d)(acc)))
#else
#define G_MADD(acc, s, v) ((acc) += (s) * (v))
#define G_VMADD(acc, x, y) ((acc) += (x) * (y))
#endif
#include "vm_gemm.h"
#undef G_MADD
#undef G_VMADD
#undef GT
#undef GFN
#undef GV
#undef G32
#undef G16

#undef VM_FN
#undef VM_TGT
#undef VM_VBYTES
