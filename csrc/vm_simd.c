/* vm_simd.c: the VM's tile kernels (vm_clone.h) compiled once per instruction set -- portable (the compiler's baseline), AVX2+FMA
   and AVX-512 -- and the run-time choice among them (__builtin_cpu_supports). Wheels never assume a wider ISA than
   the baseline; the clones are selected on the machine that runs them. */
#if defined(__GNUC__) && !defined(__clang__)
/* vector sqrt and if-converted selects: errno and the FP exception flags are never read here */
#pragma GCC optimize("no-math-errno", "no-trapping-math")
#endif
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "vm.h"

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define VM_X86 1
#else
#define VM_X86 0
#endif

/* ---- the portable clone ---- */
#define VM_FN(name) vm_##name##_base
#define VM_TGT
#define VM_TGT_STREAM
#define VM_VBYTES 16
#if defined(__GNUC__) && defined(__x86_64__)
#define VM_SQRT_BYTES 16
#define VM_SQRT_PS __builtin_ia32_sqrtps
#define VM_SQRT_PD __builtin_ia32_sqrtpd
#endif
#include "vm_clone.h"

#if VM_X86
/* ---- AVX2 + FMA ---- */
#define VM_FN(name) vm_##name##_avx2
#define VM_TGT __attribute__((target("avx2,fma")))
#define VM_TGT_STREAM VM_TGT
#define VM_VBYTES 32
#undef VM_SQRT_BYTES
#undef VM_SQRT_PS
#undef VM_SQRT_PD
#define VM_SQRT_BYTES 32
#define VM_SQRT_PS __builtin_ia32_sqrtps256
#define VM_SQRT_PD __builtin_ia32_sqrtpd256
#define VM_HAVE_FMA 1
#include "vm_clone.h"

/* ---- AVX-512 (F, DQ, BW, VL) ---- */
#define VM_FN(name) vm_##name##_avx512
#define VM_TGT __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,avx2,fma,prefer-vector-width=512")))
/* streaming kernels (two operands from memory, little arithmetic) run faster on 32-byte vectors: numpy buffers are
   16-byte aligned, and 64-byte loads would split cache lines */
#define VM_TGT_STREAM __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,avx2,fma,prefer-vector-width=256")))
#define VM_VBYTES 64
#include "vm_clone.h"
#endif

static const vm_isa vm_isas[] = {
  {"portable", vm_alu_base, vm_red_row_base, vm_red_vert_base, vm_red_dot_base, vm_gemm_ws_base, vm_gemm_part_base},
#if VM_X86
  {"avx2", vm_alu_avx2, vm_red_row_avx2, vm_red_vert_avx2, vm_red_dot_avx2, vm_gemm_ws_avx2, vm_gemm_part_avx2},
  {"avx512", vm_alu_avx512, vm_red_row_avx512, vm_red_vert_avx512, vm_red_dot_avx512, vm_gemm_ws_avx512,
   vm_gemm_part_avx512},
#endif
};
#define VM_NISA ((int)(sizeof vm_isas / sizeof vm_isas[0]))

static int vm_isa_sel = -1;  /* chosen once; a benign race (every thread computes the same value) */

/* the widest instruction set this CPU runs */
static int vm_isa_best(void) {
#if VM_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw")
      && __builtin_cpu_supports("avx512vl"))
    return 2;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 1;
#endif
  return 0;
}

const vm_isa *vm_isa_current(void) {
  if (vm_isa_sel < 0) vm_isa_sel = vm_isa_best();
  return &vm_isas[vm_isa_sel];
}

/* force an instruction set by index (tests run every clone); -1 restores the best; error if this CPU lacks it */
int pg_vm_set_isa(int32_t isa) {
  int best = vm_isa_best();
  if (isa < 0) { vm_isa_sel = best; return best; }
  if (isa >= VM_NISA || isa > best) return -4;
  vm_isa_sel = isa;
  return isa;
}

const char *pg_vm_isa_name(int32_t isa) {
  if (isa < 0) return vm_isa_current()->name;
  return isa < VM_NISA ? vm_isas[isa].name : NULL;
}
