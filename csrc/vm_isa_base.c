/* vm_isa_base.c: the portable clone of the VM's tile kernels, at the compiler's baseline ISA (always built). */
#include "vm_simd.h"

#define VM_FN(name) vm_##name##_base
#define VM_ISA_NAME "portable"
#define VM_TGT
#define VM_TGT_STREAM
#define VM_VBYTES 16
#if defined(__SSE2__) || defined(_M_X64)
#include <emmintrin.h>
#define VM_SQRT_PS_N 4
#define VM_SQRT_PS(d, x) _mm_storeu_ps(d, _mm_sqrt_ps(_mm_loadu_ps(x)))
#define VM_SQRT_PD_N 2
#define VM_SQRT_PD(d, x) _mm_storeu_pd(d, _mm_sqrt_pd(_mm_loadu_pd(x)))
#endif
#include "vm_clone.h"
