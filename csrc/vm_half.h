/* vm_half.h: float16/bfloat16 rounding and conversion, branch-free so the loops using them vectorize. float16 and
   bfloat16 values are computed in float32 and rounded after every operation (round to nearest, ties to even), as the
   numpy evaluator does; these helpers are that rounding. Header-only: static inline, usable from every ISA clone. */
#ifndef PG_VM_HALF_H
#define PG_VM_HALF_H
#include <stdint.h>
#include <string.h>

#if defined(_MSC_VER)
#define VM_INLINE static __inline
#else
#define VM_INLINE static inline
#endif

VM_INLINE uint32_t vm_f2u(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
VM_INLINE float vm_u2f(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }
VM_INLINE uint64_t vm_d2u(double x) { uint64_t u; memcpy(&u, &x, 8); return u; }
VM_INLINE double vm_u2d(uint64_t u) { double x; memcpy(&x, &u, 8); return x; }

/* x rounded to the nearest float16 value (kept as float32): overflow gives inf, NaN stays a (quiet) NaN */
VM_INLINE float vm_round_f16(float x) {
  uint32_t b = vm_f2u(x), s = b & 0x80000000u, a = b & 0x7fffffffu;
  uint32_t nrm = (a + 0xfffu + ((a >> 13) & 1u)) & ~0x1fffu;        /* 10 mantissa bits kept */
  float sub = (vm_u2f(a) + 0.5f) - 0.5f;                             /* subnormal: a multiple of 2^-24 */
  uint32_t r = a < 0x38800000u ? vm_f2u(sub) : nrm;                  /* below 2^-14 */
  r = a >= 0x477ff000u ? 0x7f800000u : r;                            /* >= 65520 rounds to inf */
  r = a > 0x7f800000u ? (a | 0x00400000u) : r;                       /* NaN */
  return vm_u2f(s | r);
}

/* the float16 bits of x (x rounded first) */
VM_INLINE uint16_t vm_f32_to_f16(float x) {
  float y = vm_round_f16(x);
  uint32_t b = vm_f2u(y), s = (b >> 16) & 0x8000u, a = b & 0x7fffffffu;
  uint32_t nrm = (a >> 13) - (112u << 10);
  uint32_t sub = (uint32_t)(vm_u2f(a < 0x38800000u ? a : 0u) * 16777216.0f);  /* exact: < 1024 */
  uint32_t h = a < 0x38800000u ? sub : nrm;
  h = a >= 0x7f800000u ? (0x7c00u | (a > 0x7f800000u ? 0x200u | ((a >> 13) & 0x3ffu) : 0u)) : h;
  return (uint16_t)(s | h);
}

/* the float32 value of float16 bits h */
VM_INLINE float vm_f16_to_f32(uint16_t h) {
  uint32_t s = ((uint32_t)h & 0x8000u) << 16, e = ((uint32_t)h >> 10) & 0x1fu, m = (uint32_t)h & 0x3ffu;
  uint32_t nrm = s | ((e + 112u) << 23) | (m << 13);
  uint32_t sub = s | vm_f2u((float)m * 5.9604644775390625e-8f);   /* m * 2^-24 */
  uint32_t inf = s | 0x7f800000u | (m << 13);
  return vm_u2f(e == 0 ? sub : e == 31 ? inf : nrm);
}

/* x rounded to bfloat16 precision (the top 16 bits of float32, nearest-even), NaN kept quiet */
VM_INLINE float vm_round_bf16(float x) {
  uint32_t u = vm_f2u(x);
  uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  uint32_t nan = (u | 0x00400000u) & 0xffff0000u;
  return vm_u2f((u & 0x7fffffffu) > 0x7f800000u ? nan : r);
}

VM_INLINE uint16_t vm_f32_to_bf16(float x) { return (uint16_t)(vm_f2u(vm_round_bf16(x)) >> 16); }
VM_INLINE float vm_bf16_to_f32(uint16_t h) { return vm_u2f((uint32_t)h << 16); }

/* the exact value d + e (d: that value rounded to double; only e's sign and being nonzero are used) as float rounded
   to odd (toward zero, then the last bit set if inexact): rounding that to float16/bfloat16 (nearest even) is the
   correctly rounded half value, where (float)d rounded twice (1 + 2^-11 + 2^-40 gave 1.0, not 1 + 2^-10; 65519.99999
   gave inf). Past FLT_MAX it is FLT_MAX (odd), which rounds to inf in both half formats; NaN stays NaN. */
VM_INLINE float vm_f32_odd(double d, double e) {
  float f = (float)d;
  double fd = (double)f;
  uint32_t above = (uint32_t)(((d > 0) & (fd > d)) | ((d < 0) & (fd < d)) |
                              ((fd == d) & (((fd > 0) & (e < 0)) | ((fd < 0) & (e > 0)))));
  uint32_t odd = (uint32_t)((fd != d) | (e != 0));
  return vm_u2f((vm_f2u(f) - above) | odd);
}

/* a 64-bit integer as float rounded to odd: two exact double parts, their rounded sum and its error (Fast2Sum) */
VM_INLINE float vm_i64_f32_odd(int64_t x) {
  int64_t lo = x & (int64_t)0xffffffff;
  double h = (double)(x - lo), l = (double)lo, d = h + l;
  return vm_f32_odd(d, l - (d - h));
}
VM_INLINE float vm_u64_f32_odd(uint64_t x) {
  uint64_t lo = x & 0xffffffffu;
  double h = (double)(x - lo), l = (double)lo, d = h + l;
  return vm_f32_odd(d, l - (d - h));
}

#endif
