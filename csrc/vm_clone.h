/* One clone of the VM's tile kernels: vm_kern.h (elementwise and reductions), compiled with the instruction set
   the includer chose (the contraction kernels are cloned by vm_gemm.c), and the clone's entry table VM_FN(kernels).
   Included once by each vm_isa_*.c, with VM_FN(name) (the clone's names), VM_ISA_NAME, VM_TGT / VM_TGT_STREAM
   (target attributes), VM_VBYTES (vector width) and optionally VM_SQRT_PS/PD (a packed sqrt step of
   VM_SQRT_PS_N/PD_N elements) defined. */
#include "vm_kern.h"

const vm_isa VM_FN(kernels) = {VM_ISA_NAME, VM_FN(alu), VM_FN(red_row), VM_FN(red_vert), VM_FN(red_dot),
                               VM_FN(gemm_ws), VM_FN(gemm_part)};

#undef VM_FN
#undef VM_TGT
#undef VM_TGT_STREAM
#undef VM_VBYTES
