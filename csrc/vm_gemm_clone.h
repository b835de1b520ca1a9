/* One clone of the contraction (vm_gemm.h) for float32 and float64, compiled with the instruction set the includer
   chose. Included by vm_gemm.c once per ISA with VM_FN(name), VM_TGT and VM_VBYTES defined; it undefines them
   again. No include guard: each inclusion is another clone. */
#define GT float
#define GFN(name) VM_FN(name##_f32)
#define GV VM_FN(gv_f32)
#if defined(__GNUC__)
typedef float GV __attribute__((vector_size(VM_VBYTES)));
#endif
#include "vm_gemm.h"
#undef GT
#undef GFN
#undef GV

#define GT double
#define GFN(name) VM_FN(name##_f64)
#define GV VM_FN(gv_f64)
#if defined(__GNUC__)
typedef double GV __attribute__((vector_size(VM_VBYTES)));
#endif
#include "vm_gemm.h"
#undef GT
#undef GFN
#undef GV

#undef VM_FN
#undef VM_TGT
#undef VM_VBYTES
