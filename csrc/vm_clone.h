/* One clone of the VM's tile kernels: vm_kern.h (elementwise and reductions), compiled with the instruction set
   the includer chose (the contraction kernels are cloned by vm_gemm.c). Included by vm_simd.c once per ISA,
   with VM_FN(name) (the clone's names), VM_TGT / VM_TGT_STREAM (target attributes) and VM_VBYTES (vector width)
   defined; it undefines them again. No include guard: each inclusion is another clone. */
#include "vm_kern.h"

#undef VM_FN
#undef VM_TGT
#undef VM_TGT_STREAM
#undef VM_VBYTES
