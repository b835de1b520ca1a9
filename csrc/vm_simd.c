/* vm_simd.c: the run-time choice among the VM's tile-kernel clones (vm_isa_*.c): portable (the compiler's baseline),
   AVX2+FMA and AVX-512. Wheels never assume a wider ISA than the baseline; the clones are selected on the machine
   that runs them, by CPUID and the OS-enabled register state (XCR0), the same under gcc, clang and zig cc. */
#include "vm_simd.h"
#include "pygrad.h"
#if VM_X86
#include <cpuid.h>
#endif

static const vm_isa *const vm_isas[] = {
  &vm_kernels_base,
#if VM_X86
  &vm_kernels_avx2,
  &vm_kernels_avx512,
#endif
};
#define VM_NISA ((int)(sizeof vm_isas / sizeof vm_isas[0]))

static int vm_isa_sel = -1;  /* chosen once; a benign race (every thread computes the same value) */

#if VM_X86
/* the register state the OS saves on context switches (XGETBV 0); only called when CPUID reports OSXSAVE */
static uint64_t vm_xcr0(void) {
  uint32_t lo, hi;
  __asm__ __volatile__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return ((uint64_t)hi << 32) | lo;
}
#endif

/* the widest instruction set this CPU and OS run: 2 AVX-512 (F, DQ, BW, VL), 1 AVX2 + FMA, 0 portable */
static int vm_isa_best(void) {
#if VM_X86
  unsigned a, b, c, d, b7;
  uint64_t xcr0;
  if (__get_cpuid_max(0, NULL) < 7) return 0;
  __cpuid(1, a, b, c, d);
  if (!(c & (1u << 27)) || !(c & (1u << 28)) || !(c & (1u << 12))) return 0;  /* OSXSAVE, AVX, FMA */
  __cpuid_count(7, 0, a, b7, c, d);
  xcr0 = vm_xcr0();
  if ((xcr0 & 0x6) != 0x6 || !(b7 & (1u << 5))) return 0;  /* XMM+YMM state, AVX2 */
  /* opmask + ZMM state; AVX512F (16), DQ (17), BW (30), VL (31) */
  if ((xcr0 & 0xe0) == 0xe0 && (b7 & 0xc0030000u) == 0xc0030000u) return 2;
  return 1;
#else
  return 0;
#endif
}

const vm_isa *vm_isa_current(void) {
  if (vm_isa_sel < 0) vm_isa_sel = vm_isa_best();
  return vm_isas[vm_isa_sel];
}

/* force an instruction set by index (tests run every clone); -1 restores the best; error if this CPU lacks it */
int pg_vm_set_isa(int32_t isa) {
  int best = vm_isa_best();
  if (isa < 0) { vm_isa_sel = best; return best; }
  if (isa >= VM_NISA || isa > best) return PG_ERR_ARG;
  vm_isa_sel = isa;
  return isa;
}

const char *pg_vm_isa_name(int32_t isa) {
  if (isa < 0) return vm_isa_current()->name;
  return isa < VM_NISA ? vm_isas[isa]->name : NULL;
}
