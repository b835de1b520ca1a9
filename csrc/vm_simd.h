/* vm_simd.h: what the per-ISA clone files (vm_isa_*.c) and the dispatcher (vm_simd.c) share. Each clone is its own
   translation unit, so the build compiles them in parallel and only the ISAs this target can run are compiled. */
#ifndef PG_VM_SIMD_H
#define PG_VM_SIMD_H
#if defined(__GNUC__) && !defined(__clang__)
/* vector sqrt and if-converted selects: errno and the FP exception flags are never read in the kernels */
#pragma GCC optimize("no-math-errno", "no-trapping-math")
#endif
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "vm.h"

/* the AVX2 and AVX-512 clones need GNU target attributes (gcc, clang, zig cc); MSVC builds the portable one only */
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define VM_X86 1
#else
#define VM_X86 0
#endif

extern const vm_isa vm_kernels_base;
#if VM_X86
extern const vm_isa vm_kernels_avx2, vm_kernels_avx512;
#endif
#endif
