/* vm_kern.h: the tile kernels of every VM instruction and reduction, as plain loops gcc/clang auto-vectorize.
   vm_clone.h includes this file once per instruction set, with VM_FN(name) naming the clone and VM_TGT its target
   attribute. Semantics are those of pygrad/engine/numpy_eval.py: wrapping integer arithmetic done in unsigned types,
   defined results for division by zero, shifts out of range and out-of-range casts, IEEE floats. */

#define BIN_LOOP(T, TO, EXPR) do { \
    TO *d_ = (TO *)d; const T *x_ = (const T *)a, *y_ = (const T *)b; int64_t i_; \
    if (bm == 0) { for (i_ = 0; i_ < n; i_++) { T A = x_[i_], B = y_[i_]; d_[i_] = (TO)(EXPR); } } \
    else if (bm == 1) { T A = x_[0]; for (i_ = 0; i_ < n; i_++) { T B = y_[i_]; d_[i_] = (TO)(EXPR); } } \
    else { T B = y_[0]; for (i_ = 0; i_ < n; i_++) { T A = x_[i_]; d_[i_] = (TO)(EXPR); } } \
  } while (0)

#define UN_LOOP(T, TO, EXPR) do { \
    TO *d_ = (TO *)d; const T *x_ = (const T *)a; int64_t i_; \
    for (i_ = 0; i_ < n; i_++) { T X = x_[i_]; d_[i_] = (TO)(EXPR); } \
  } while (0)

/* integer types: (id, T, unsigned T, unsigned wide-enough T, bits, min) */
#define VM_SINTS(X) X(VT_I8, int8_t, uint8_t, uint32_t, 8, INT8_MIN) X(VT_I16, int16_t, uint16_t, uint32_t, 16, \
  INT16_MIN) X(VT_I32, int32_t, uint32_t, uint32_t, 32, INT32_MIN) X(VT_I64, int64_t, uint64_t, uint64_t, 64, INT64_MIN)
#define VM_UINTS(X) X(VT_U8, uint8_t, uint8_t, uint32_t, 8, 0) X(VT_U16, uint16_t, uint16_t, uint32_t, 16, 0) \
  X(VT_U32, uint32_t, uint32_t, uint32_t, 32, 0) X(VT_U64, uint64_t, uint64_t, uint64_t, 64, 0)
#define VM_INTS(X) VM_SINTS(X) VM_UINTS(X)

#ifndef VM_KERN_ONCE
#define VM_KERN_ONCE
/* exact wrapping integer powers (exponent >= 0 here; negative exponents are handled by the caller) */
#define VM_IPOW_S(ID, T, UT, UW, BITS, MINV) \
  VM_INLINE T vm_ipow_##T(T x, T e) { \
    UW r = 1, b = (UW)(UT)x; UT k = (UT)e; \
    if (e < 0) return (T)(x == 1 ? 1 : x == -1 ? ((k & 1u) ? -1 : 1) : 0); \
    while (k) { if (k & 1u) r = (UW)(UT)(r * b); b = (UW)(UT)(b * b); k = (UT)(k >> 1); } \
    return (T)(UT)r; }
#define VM_IPOW_U(ID, T, UT, UW, BITS, MINV) \
  VM_INLINE T vm_ipow_##T(T x, T e) { \
    UW r = 1, b = (UW)x; UT k = e; \
    while (k) { if (k & 1u) r = (UW)(UT)(r * b); b = (UW)(UT)(b * b); k = (UT)(k >> 1); } \
    return (T)r; }
VM_SINTS(VM_IPOW_S)
VM_UINTS(VM_IPOW_U)
#undef VM_IPOW_S
#undef VM_IPOW_U
#endif

/* f32 sin, exp2, log2 computed in double with polynomials (error well under 1 ulp of float32); no libm calls in the
   vectorized loops. Large |x| for sin goes to libm in a second, rarely taken pass. */
#if !defined(VM_HAVE_FMA)
VM_TGT static void VM_FN(exp2_f32d)(float *d, const float *x, int64_t n) {
  int64_t i;
  for (i = 0; i < n; i++) {
    double v = (double)x[i], t, k, f, p;
    uint64_t tb;
    v = v < -160.0 ? -160.0 : v;
    v = v > 130.0 ? 130.0 : v;
    v = v == v ? v : 0.0;
    t = v + 6755399441055744.0;  /* 0x1.8p52: round to nearest integer */
    tb = vm_d2u(t);
    k = t - 6755399441055744.0;
    f = v - k;
    p = 1.3215486790144305e-06;
    p = p * f + 1.5252733804059838e-05;
    p = p * f + 1.5403530393381606e-04;
    p = p * f + 1.3333558146428441e-03;
    p = p * f + 9.6181291076284770e-03;
    p = p * f + 5.5504108664821576e-02;
    p = p * f + 2.4022650695910070e-01;
    p = p * f + 6.9314718055994530e-01;
    p = p * f + 1.0;
    p = p * vm_u2d((tb - 0x4338000000000000ull + 1023u) << 52);
    d[i] = x[i] == x[i] ? (float)p : x[i];
  }
}
#endif

VM_TGT static void VM_FN(log2_f32)(float *d, const float *x, int64_t n) {
  /* the NaN of a negative input is the one this machine's invalid operation makes (0/0 at run time, as libm's
     log2f does; the NAN macro is +NaN while x86's default NaN has the sign bit set), so a BITCAST of it agrees
     with the numpy engine bit for bit */
  volatile float zero = 0.0f;
  const float invalid = zero / zero;
  int64_t i;
  for (i = 0; i < n; i++) {
    float xf = x[i], res;
    double v = (double)xf, m, e, s, z, p, r;
    uint64_t b = vm_d2u(v), eb = (b >> 52) & 0x7ffu;
    int big;
    m = vm_u2d((b & 0x000fffffffffffffull) | 0x3ff0000000000000ull);
    e = vm_u2d(0x4330000000000000ull | eb) - 4503599627370496.0 - 1023.0;
    big = m > 1.4142135623730951;
    m = big ? m * 0.5 : m;
    e = big ? e + 1.0 : e;
    s = (m - 1.0) / (m + 1.0);
    z = s * s;
    p = 0.2219530832136867;                  /* 2/(k ln 2), k = 13, 11, ..., 1 */
    p = p * z + 0.2623081892525388;
    p = p * z + 0.3205988979753252;
    p = p * z + 0.41219858311113244;
    p = p * z + 0.5770780163555853;
    p = p * z + 0.9617966939259757;
    p = p * z + 2.8853900817779268;
    r = e + s * p;
    res = (float)r;
    res = xf == 0.0f ? -HUGE_VALF : res;
    res = xf < 0.0f ? invalid : res;
    d[i] = (xf != xf || xf == HUGE_VALF) ? xf : res;
  }
}

/* sin of a float32 in double: reduction by pi/2 (two-part Cody-Waite, exact for |x| <= 2^20), then the sin or cos
   polynomial by quadrant */
VM_TGT static inline float VM_FN(sin_one)(float xf) {
  double v = (double)xf, t, k, r, z, s, c, res;
  uint64_t q;
  t = v * 0.63661977236758134 + 6755399441055744.0;
  q = vm_d2u(t);
  k = t - 6755399441055744.0;
  r = (v - k * 1.57079632673412561417e+00) - k * 6.07710050650619224932e-11;
  z = r * r;
  s = 1.6059043836821613e-10;
  s = s * z - 2.5052108385441720e-08;
  s = s * z + 2.7557319223985888e-06;
  s = s * z - 1.9841269841269841e-04;
  s = s * z + 8.3333333333333333e-03;
  s = s * z - 1.6666666666666667e-01;
  s = r + r * z * s;
  c = -1.1470745597729725e-11;
  c = c * z + 2.0876756987868099e-09;
  c = c * z - 2.7557319223985891e-07;
  c = c * z + 2.4801587301587302e-05;
  c = c * z - 1.3888888888888889e-03;
  c = c * z + 4.1666666666666667e-02;
  c = c * z - 0.5;
  c = c * z + 1.0;
  res = (q & 1u) ? c : s;
  res = (q & 2u) ? -res : res;
  return xf == 0.0f ? xf : (float)res;  /* the reduction's +0 terms turn -0.0 into +0.0: sin(+-0) is +-0 */
}

/* in-place safe: the range check reads x before anything is written */
VM_TGT static void VM_FN(sin_f32d)(float *d, const float *x, int64_t n) {
  int64_t i;
  int bad = 0;
  for (i = 0; i < n; i++) bad |= !(x[i] <= 1048576.0f && x[i] >= -1048576.0f);
  if (!bad) {
    for (i = 0; i < n; i++) d[i] = VM_FN(sin_one)(x[i]);
    return;
  }
  for (i = 0; i < n; i++) {  /* some |x| > 2^20, inf or NaN: those go to libm */
    float xf = x[i];
    d[i] = (xf <= 1048576.0f && xf >= -1048576.0f) ? VM_FN(sin_one)(xf) : (float)sin((double)xf);
  }
}

#if defined(VM_HAVE_FMA)
/* with FMA, float32 polynomials are as accurate (about 1 ulp) and twice as wide: 2^x by 2^round(x) * p(f), the
   scale split in two so that subnormal results round once */
VM_TGT static void VM_FN(exp2_f32)(float *d, const float *x, int64_t n) {
  int64_t i;
  for (i = 0; i < n; i++) {
    float v = x[i], t, k, f, p;
    int32_t e, e1;
    v = v < -151.0f ? -151.0f : v;
    v = v > 129.0f ? 129.0f : v;
    v = v == v ? v : 0.0f;
    t = v + 12582912.0f;  /* 0x1.8p23: round to nearest integer */
    e = (int32_t)(vm_f2u(t) - 0x4b400000u);
    k = t - 12582912.0f;
    f = v - k;
    p = 1.5252734e-05f;
    p = __builtin_fmaf(p, f, 1.5403530e-04f);
    p = __builtin_fmaf(p, f, 1.3333558e-03f);
    p = __builtin_fmaf(p, f, 9.6181291e-03f);
    p = __builtin_fmaf(p, f, 5.5504109e-02f);
    p = __builtin_fmaf(p, f, 2.4022651e-01f);
    p = __builtin_fmaf(p, f, 6.9314718e-01f);
    p = __builtin_fmaf(p, f, 1.0f);
    e1 = e >> 1;
    p = p * vm_u2f((uint32_t)(e1 + 127) << 23) * vm_u2f((uint32_t)(e - e1 + 127) << 23);
    d[i] = x[i] == x[i] ? p : x[i];
  }
}

/* sin by quadrant after a three-part FMA Cody-Waite reduction. k * c1 is exact and v - k * c1 too (a multiple of
   2^-23 below 2 in magnitude), the two later parts round relative to the reduced argument: within 2 ulp of the
   correctly rounded sin for every float32 with |x| <= 2^20, checked exhaustively (the same worst case as below 8192,
   the bound this path had before; up to 2^22 it would be 5 ulp). A tile holding a larger argument, inf or NaN takes
   the double path whole. */
VM_TGT static void VM_FN(sin_f32)(float *d, const float *x, int64_t n) {
  int64_t i;
  int big = 0;
  for (i = 0; i < n; i++) big |= !(x[i] <= 1048576.0f && x[i] >= -1048576.0f);
  if (big) { VM_FN(sin_f32d)(d, x, n); return; }
  for (i = 0; i < n; i++) {
    float v = x[i], t, k, r, z, s, c, res;
    uint32_t q;
    t = __builtin_fmaf(v, 0.63661977f, 12582912.0f);
    q = vm_f2u(t);
    k = t - 12582912.0f;
    r = __builtin_fmaf(-k, 1.5707963705062866e+00f, v);
    r = __builtin_fmaf(-k, -4.3711388286737929e-08f, r);
    r = __builtin_fmaf(-k, -1.7151245100059164e-15f, r);
    z = r * r;
    s = __builtin_fmaf(z, -1.9515295891e-4f, 8.3321608736e-3f);
    s = __builtin_fmaf(z, s, -1.6666654611e-1f);
    s = __builtin_fmaf(r * z, s, r);
    c = __builtin_fmaf(z, 2.443315711809948e-5f, -1.388731625493765e-3f);
    c = __builtin_fmaf(z, c, 4.166664568298827e-2f);
    c = __builtin_fmaf(z, c, -0.5f);
    c = __builtin_fmaf(z, c, 1.0f);
    res = (q & 1u) ? c : s;
    res = (q & 2u) ? -res : res;
    d[i] = v == 0.0f ? v : res;  /* sin(-0.0) is -0.0: the reduction's +0 terms lose the sign */
  }
}
#else
VM_TGT static void VM_FN(exp2_f32)(float *d, const float *x, int64_t n) { VM_FN(exp2_f32d)(d, x, n); }
VM_TGT static void VM_FN(sin_f32)(float *d, const float *x, int64_t n) { VM_FN(sin_f32d)(d, x, n); }
#endif

/* sqrt: compilers vectorize sqrtf only without errno (-fno-math-errno, which the build does not pass); on x86 the
   packed-sqrt intrinsics do it, correctly rounded like sqrtf */
VM_TGT static void VM_FN(sqrt_f32)(float *d, const float *x, int64_t n) {
  int64_t i = 0;
#if defined(VM_SQRT_PS)
  for (; i + VM_SQRT_PS_N <= n; i += VM_SQRT_PS_N) VM_SQRT_PS(d + i, x + i);
#endif
  for (; i < n; i++) d[i] = sqrtf(x[i]);
}

VM_TGT static void VM_FN(sqrt_f64)(double *d, const double *x, int64_t n) {
  int64_t i = 0;
#if defined(VM_SQRT_PD)
  for (; i + VM_SQRT_PD_N <= n; i += VM_SQRT_PD_N) VM_SQRT_PD(d + i, x + i);
#endif
  for (; i < n; i++) d[i] = sqrt(x[i]);
}

VM_TGT static void VM_FN(round_lt)(int32_t lt, float *d, int64_t n) {
  int64_t i;
  if (lt == VT_F16) for (i = 0; i < n; i++) d[i] = vm_round_f16(d[i]);
  else if (lt == VT_BF16) for (i = 0; i < n; i++) d[i] = vm_round_bf16(d[i]);
}

/* ---- binary ops: the case lists of each op per type family ---- */
#define K_ADD_I(ID, T, UT, UW, BITS, MINV) case ID: BIN_LOOP(T, T, (T)(UT)((UW)(UT)A + (UW)(UT)B)); break;
#define K_MUL_I(ID, T, UT, UW, BITS, MINV) case ID: BIN_LOOP(T, T, (T)(UT)((UW)(UT)A * (UW)(UT)B)); break;
#define K_MAX_I(ID, T, UT, UW, BITS, MINV) case ID: BIN_LOOP(T, T, A > B ? A : B); break;
#define K_POW_I(ID, T, UT, UW, BITS, MINV) case ID: BIN_LOOP(T, T, vm_ipow_##T(A, B)); break;
#define K_IDIV_S(ID, T, UT, UW, BITS, MINV) \
  case ID: BIN_LOOP(T, T, B == 0 ? 0 : B == -1 ? (T)(UT)(0u - (UW)(UT)A) : A / B); break;
#define K_IDIV_U(ID, T, UT, UW, BITS, MINV) case ID: BIN_LOOP(T, T, B == 0 ? 0 : A / B); break;
#define K_MOD_S(ID, T, UT, UW, BITS, MINV) case ID: BIN_LOOP(T, T, (B == 0 || B == -1) ? 0 : A % B); break;
#define K_MOD_U(ID, T, UT, UW, BITS, MINV) case ID: BIN_LOOP(T, T, B == 0 ? 0 : A % B); break;
#define K_AND_I(ID, T, UT, UW, BITS, MINV) case ID: BIN_LOOP(T, T, A & B); break;
#define K_OR_I(ID, T, UT, UW, BITS, MINV) case ID: BIN_LOOP(T, T, A | B); break;
#define K_XOR_I(ID, T, UT, UW, BITS, MINV) case ID: BIN_LOOP(T, T, A ^ B); break;
#define K_SHL_S(ID, T, UT, UW, BITS, MINV) \
  case ID: BIN_LOOP(T, T, (B < 0 || B >= BITS) ? 0 : (T)(UT)((UW)(UT)A << B)); break;
#define K_SHL_U(ID, T, UT, UW, BITS, MINV) case ID: BIN_LOOP(T, T, B >= BITS ? 0 : (T)(UT)((UW)A << B)); break;
#define K_SHR_S(ID, T, UT, UW, BITS, MINV) \
  case ID: BIN_LOOP(T, T, B < 0 ? 0 : B >= BITS ? (A < 0 ? -1 : 0) : A < 0 ? (T)~(~A >> B) : (T)(A >> B)); break;
#define K_SHR_U(ID, T, UT, UW, BITS, MINV) case ID: BIN_LOOP(T, T, B >= BITS ? 0 : A >> B); break;
#define K_CMP_I(ID, T, UT, UW, BITS, MINV) case ID: BIN_LOOP(T, uint8_t, A CMPOP B); break;
#define K_ABS_S(ID, T, UT, UW, BITS, MINV) case ID: UN_LOOP(T, T, X < 0 ? (T)(UT)(0u - (UW)(UT)X) : X); break;

/* IEEE 754-2019 maximum: NaN if either is NaN, and +0 above -0, so a max of mixed zeros has one sign whatever the
   order, lane split or thread count (numpy's and torch's pick one operand's zero, by dtype and array length) */
#define FMAX(A, B) ((A) > (B) || (A) != (A) || ((A) == (B) && !signbit(A)) ? (A) : (B))
#define K_FLOATS(EXPRF, EXPRD) \
  case VT_F16: case VT_BF16: case VT_F32: BIN_LOOP(float, float, EXPRF); break; \
  case VT_F64: BIN_LOOP(double, double, EXPRD); break;

VM_TGT static void VM_FN(binary)(const vm_ins *in, char *d, const char *a, const char *b, int64_t n) {
  int bm = (in->mode & 3) == 1 ? 1 : (in->mode & 3) == 2 ? 2 : 0;
  switch (in->op) {
  case VM_ADD: switch (in->lt) { VM_INTS(K_ADD_I) K_FLOATS(A + B, A + B)
    case VT_BOOL: BIN_LOOP(uint8_t, uint8_t, A | B); break; } break;
  case VM_MUL: switch (in->lt) { VM_INTS(K_MUL_I) K_FLOATS(A * B, A * B)
    case VT_BOOL: BIN_LOOP(uint8_t, uint8_t, A & B); break; } break;
  case VM_DIV: switch (in->lt) { K_FLOATS(A / B, A / B) } break;  /* float16/bfloat16: one rounding of the float32
    quotient, which is the correctly rounded half quotient (24 >= 2 * 11 + 2 bits) */
  case VM_MAX: switch (in->lt) { VM_INTS(K_MAX_I) K_FLOATS(FMAX(A, B), FMAX(A, B))
    case VT_BOOL: BIN_LOOP(uint8_t, uint8_t, A | B); break; } break;
  /* float32 (and the half formats) through double pow, rounded once: powf's result was off by up to an ulp where
     numpy's float64 pow rounded once is not (the numpy engine computes the same) */
  case VM_POW: switch (in->lt) { VM_INTS(K_POW_I) K_FLOATS((float)pow((double)A, (double)B), pow(A, B))
    case VT_BOOL: BIN_LOOP(uint8_t, uint8_t, A | (B ^ 1u)); break; } break;
  case VM_IDIV: switch (in->lt) { VM_SINTS(K_IDIV_S) VM_UINTS(K_IDIV_U) } break;
  case VM_MOD: switch (in->lt) { VM_SINTS(K_MOD_S) VM_UINTS(K_MOD_U) } break;
  case VM_AND: switch (in->lt) { VM_INTS(K_AND_I) case VT_BOOL: BIN_LOOP(uint8_t, uint8_t, A & B); break; } break;
  case VM_OR: switch (in->lt) { VM_INTS(K_OR_I) case VT_BOOL: BIN_LOOP(uint8_t, uint8_t, A | B); break; } break;
  case VM_XOR: switch (in->lt) { VM_INTS(K_XOR_I) case VT_BOOL: BIN_LOOP(uint8_t, uint8_t, A ^ B); break; } break;
  case VM_SHL: switch (in->lt) { VM_SINTS(K_SHL_S) VM_UINTS(K_SHL_U) } break;
  case VM_SHR: switch (in->lt) { VM_SINTS(K_SHR_S) VM_UINTS(K_SHR_U) } break;
#define CMPOP <
  case VM_CMPLT: switch (in->lt) { VM_INTS(K_CMP_I)
    case VT_BOOL: BIN_LOOP(uint8_t, uint8_t, A < B); break;
    case VT_F16: case VT_BF16: case VT_F32: BIN_LOOP(float, uint8_t, A < B); break;
    case VT_F64: BIN_LOOP(double, uint8_t, A < B); break; } return;
#undef CMPOP
#define CMPOP !=
  case VM_CMPNE: switch (in->lt) { VM_INTS(K_CMP_I)
    case VT_BOOL: BIN_LOOP(uint8_t, uint8_t, A != B); break;
    case VT_F16: case VT_BF16: case VT_F32: BIN_LOOP(float, uint8_t, A != B); break;
    case VT_F64: BIN_LOOP(double, uint8_t, A != B); break; } return;
#undef CMPOP
#define CMPOP ==
  case VM_CMPEQ: switch (in->lt) { VM_INTS(K_CMP_I)
    case VT_BOOL: BIN_LOOP(uint8_t, uint8_t, A == B); break;
    case VT_F16: case VT_BF16: case VT_F32: BIN_LOOP(float, uint8_t, A == B); break;
    case VT_F64: BIN_LOOP(double, uint8_t, A == B); break; } return;
#undef CMPOP
  default: return;
  }
  VM_FN(round_lt)(in->lt, (float *)d, n);
}

/* ---- casts: src compute type sct -> logical type lt ---- */
#define CAST_SAT_S(TS, TD, BITS, MINV, MAXV) \
  UN_LOOP(TS, TD, X != X ? 0 : X >= (TS)(BITS == 64 ? 9223372036854775808.0 : (double)MAXV + 1.0) ? MAXV : \
          X < (TS)(double)MINV ? MINV : (TD)X)
#define CAST_SAT_U(TS, TD, BITS, MAXV) \
  UN_LOOP(TS, TD, !(X >= 0) ? 0 : X >= (TS)(BITS == 64 ? 18446744073709551616.0 : (double)MAXV + 1.0) ? MAXV : (TD)X)
#define CAST_FROM_FLOAT(TS) switch (in->lt) { \
  case VT_BOOL: UN_LOOP(TS, uint8_t, X != 0); break; \
  case VT_I8: CAST_SAT_S(TS, int8_t, 8, INT8_MIN, INT8_MAX); break; \
  case VT_I16: CAST_SAT_S(TS, int16_t, 16, INT16_MIN, INT16_MAX); break; \
  case VT_I32: CAST_SAT_S(TS, int32_t, 32, INT32_MIN, INT32_MAX); break; \
  case VT_I64: CAST_SAT_S(TS, int64_t, 64, INT64_MIN, INT64_MAX); break; \
  case VT_U8: CAST_SAT_U(TS, uint8_t, 8, UINT8_MAX); break; \
  case VT_U16: CAST_SAT_U(TS, uint16_t, 16, UINT16_MAX); break; \
  case VT_U32: CAST_SAT_U(TS, uint32_t, 32, UINT32_MAX); break; \
  case VT_U64: CAST_SAT_U(TS, uint64_t, 64, UINT64_MAX); break; \
  case VT_F16: case VT_BF16: UN_LOOP(TS, float, vm_f32_odd((double)X, 0.0)); break; \
  case VT_F32: UN_LOOP(TS, float, (float)X); break; \
  case VT_F64: UN_LOOP(TS, double, (double)X); break; }
/* to float16/bfloat16: rounded to odd in float, then to the half format by round_lt: once in all (ODD: the 64-bit
   signed or unsigned conversion) */
#define CAST_FROM_INT(TS, ODD) switch (in->lt) { \
  case VT_BOOL: UN_LOOP(TS, uint8_t, X != 0); break; \
  case VT_I8: UN_LOOP(TS, int8_t, (int8_t)(uint8_t)(uint64_t)X); break; \
  case VT_I16: UN_LOOP(TS, int16_t, (int16_t)(uint16_t)(uint64_t)X); break; \
  case VT_I32: UN_LOOP(TS, int32_t, (int32_t)(uint32_t)(uint64_t)X); break; \
  case VT_I64: UN_LOOP(TS, int64_t, (int64_t)(uint64_t)X); break; \
  case VT_U8: UN_LOOP(TS, uint8_t, (uint8_t)(uint64_t)X); break; \
  case VT_U16: UN_LOOP(TS, uint16_t, (uint16_t)(uint64_t)X); break; \
  case VT_U32: UN_LOOP(TS, uint32_t, (uint32_t)(uint64_t)X); break; \
  case VT_U64: UN_LOOP(TS, uint64_t, (uint64_t)X); break; \
  case VT_F16: case VT_BF16: UN_LOOP(TS, float, ODD(X)); break; \
  case VT_F32: UN_LOOP(TS, float, (float)X); break; \
  case VT_F64: UN_LOOP(TS, double, (double)X); break; }

VM_TGT static void VM_FN(cast)(const vm_ins *in, char *d, const char *a, int64_t n) {
  switch (in->sct) {
  case VT_BOOL: CAST_FROM_INT(uint8_t, vm_i64_f32_odd) break;
  case VT_I8: CAST_FROM_INT(int8_t, vm_i64_f32_odd) break;
  case VT_I16: CAST_FROM_INT(int16_t, vm_i64_f32_odd) break;
  case VT_I32: CAST_FROM_INT(int32_t, vm_i64_f32_odd) break;
  case VT_I64: CAST_FROM_INT(int64_t, vm_i64_f32_odd) break;
  case VT_U8: CAST_FROM_INT(uint8_t, vm_i64_f32_odd) break;
  case VT_U16: CAST_FROM_INT(uint16_t, vm_i64_f32_odd) break;
  case VT_U32: CAST_FROM_INT(uint32_t, vm_i64_f32_odd) break;
  case VT_U64: CAST_FROM_INT(uint64_t, vm_u64_f32_odd) break;
  case VT_F32: CAST_FROM_FLOAT(float) break;
  case VT_F64: CAST_FROM_FLOAT(double) break;
  default: return;
  }
  VM_FN(round_lt)(in->lt, (float *)d, n);
}

/* BITCAST from logical type in->c to in->lt (equal itemsize); float16/bfloat16 go through their 16 bits */
VM_TGT static void VM_FN(bitcast)(const vm_ins *in, char *d, const char *a, int64_t n) {
  int32_t src = in->c, dst = in->lt;
  int64_t i;
  if (src != VT_F16 && src != VT_BF16 && dst != VT_F16 && dst != VT_BF16) {
    memmove(d, a, (size_t)(n * vm_esize(dst)));
    if (dst == VT_BOOL) for (i = 0; i < n; i++) d[i] = d[i] != 0;
    return;
  }
  for (i = 0; i < n; i++) {
    uint16_t h;
    if (src == VT_F16) h = vm_f32_to_f16(((const float *)a)[i]);
    else if (src == VT_BF16) h = (uint16_t)(vm_f2u(((const float *)a)[i]) >> 16);
    else h = ((const uint16_t *)a)[i];
    if (dst == VT_F16) ((float *)d)[i] = vm_f16_to_f32(h);
    else if (dst == VT_BF16) ((float *)d)[i] = vm_bf16_to_f32(h);
    else ((uint16_t *)d)[i] = h;
  }
}

VM_TGT static void VM_FN(unary)(const vm_ins *in, char *d, const char *a, int64_t n) {
  int64_t i, es;
  switch (in->op) {
  case VM_MOV:
    es = vm_esize(vm_ct(in->lt));
    if ((in->mode & 1) && !(in->mode & 8)) {
      if (es == 1) memset(d, a[0], (size_t)n);
      else if (es == 2) { uint16_t v; memcpy(&v, a, 2); for (i = 0; i < n; i++) ((uint16_t *)d)[i] = v; }
      else if (es == 4) { uint32_t v; memcpy(&v, a, 4); for (i = 0; i < n; i++) ((uint32_t *)d)[i] = v; }
      else { uint64_t v; memcpy(&v, a, 8); for (i = 0; i < n; i++) ((uint64_t *)d)[i] = v; }
    } else if (d != a) memmove(d, a, (size_t)(n * es));
    return;
  case VM_CAST: VM_FN(cast)(in, d, a, n); return;
  case VM_ABS:  /* x * sign(x) exactly: zeros keep their sign, signed MIN wraps */
    switch (in->lt) {
    VM_SINTS(K_ABS_S)
    case VT_F64: UN_LOOP(double, double, X != 0 ? fabs(X) : X); break;
    case VT_F16: case VT_BF16: case VT_F32: UN_LOOP(float, float, X != 0 ? fabsf(X) : X); break;
    default: if (d != a) memmove(d, a, (size_t)(n * vm_esize(in->lt))); break;
    }
    return;
  case VM_BITCAST: VM_FN(bitcast)(in, d, a, n); return;
  case VM_TRUNC:
    if (in->lt == VT_F64) UN_LOOP(double, double, fabs(X) < 4503599627370496.0 ? copysign((double)(int64_t)X, X) : X);
    else if (in->lt >= VT_F16) UN_LOOP(float, float, fabsf(X) < 8388608.0f ? copysignf((float)(int32_t)X, X) : X);
    else if (d != a) memmove(d, a, (size_t)(n * vm_esize(in->lt)));
    return;
  case VM_RECIPROCAL:
    if (in->lt == VT_F64) UN_LOOP(double, double, 1.0 / X); else UN_LOOP(float, float, 1.0f / X);
    break;
  case VM_SQRT:
    if (in->lt == VT_F64) VM_FN(sqrt_f64)((double *)d, (const double *)a, n);
    else VM_FN(sqrt_f32)((float *)d, (const float *)a, n);
    break;
  case VM_SIN:
    if (in->lt == VT_F64) UN_LOOP(double, double, sin(X)); else VM_FN(sin_f32)((float *)d, (const float *)a, n);
    break;
  case VM_EXP2:
    if (in->lt == VT_F64) UN_LOOP(double, double, exp2(X)); else VM_FN(exp2_f32)((float *)d, (const float *)a, n);
    break;
  case VM_LOG2:
    if (in->lt == VT_F64) UN_LOOP(double, double, log2(X)); else VM_FN(log2_f32)((float *)d, (const float *)a, n);
    break;
  default: return;
  }
  VM_FN(round_lt)(in->lt, (float *)d, n);
}

/* WHERE(cond a, b, c): a select by element size; the all-vector case is the vectorizable one */
#define SEL_LOOP(T) do { \
    T *d_ = (T *)d; const T *x_ = (const T *)b, *y_ = (const T *)c; const uint8_t *k_ = (const uint8_t *)a; \
    switch (in->mode & 7) { \
    case 0: for (i = 0; i < n; i++) d_[i] = k_[i] ? x_[i] : y_[i]; break; \
    case 2: { T xs = x_[0]; for (i = 0; i < n; i++) d_[i] = k_[i] ? xs : y_[i]; } break; \
    case 4: { T ys = y_[0]; for (i = 0; i < n; i++) d_[i] = k_[i] ? x_[i] : ys; } break; \
    case 6: { T xs = x_[0], ys = y_[0]; for (i = 0; i < n; i++) d_[i] = k_[i] ? xs : ys; } break; \
    default: for (i = 0; i < n; i++) d_[i] = k_[i * sa] ? x_[i * sb] : y_[i * sc]; break; \
    } \
  } while (0)

VM_TGT static void VM_FN(where)(const vm_ins *in, char *d, const char *a, const char *b, const char *c, int64_t n) {
  int64_t i, sa = (in->mode & 1) ? 0 : 1, sb = (in->mode & 2) ? 0 : 1, sc = (in->mode & 4) ? 0 : 1;
  switch (vm_esize(vm_ct(in->lt))) {
  case 1: SEL_LOOP(uint8_t); break;
  case 2: SEL_LOOP(uint16_t); break;
  case 4: SEL_LOOP(uint32_t); break;
  default: SEL_LOOP(uint64_t); break;
  }
}

VM_TGT static void VM_FN(alu)(const vm_ins *in, char *d, const char *a, const char *b, const char *c, int64_t n) {
  if (in->op == VM_WHERE) VM_FN(where)(in, d, a, b, c, n);
  else if (in->op >= VM_ADD) VM_FN(binary)(in, d, a, b, n);
  else VM_FN(unary)(in, d, a, n);
}

/* ---- reductions: a row of n values into *out (red_row) or element-wise into out[j*os] (red_vert) ---- */
#define RED_LANES 16
#define ROW_F(T, INIT, STEP) do { \
    const T *v_ = (const T *)v; T acc[RED_LANES], r_ = *(T *)out; int64_t i_ = 0, j_; \
    if (n < 2 * RED_LANES) {  /* short rows: lanes cost more than they save */ \
      for (; i_ < n; i_++) { T A = r_, B = v_[i_]; r_ = STEP; } \
      *(T *)out = r_; \
      break; \
    } \
    for (j_ = 0; j_ < RED_LANES; j_++) acc[j_] = INIT; \
    for (; i_ + RED_LANES <= n; i_ += RED_LANES) \
      for (j_ = 0; j_ < RED_LANES; j_++) { T A = acc[j_], B = v_[i_ + j_]; acc[j_] = STEP; } \
    for (j_ = RED_LANES / 2; j_ >= 1; j_ /= 2) \
      for (i = 0; i < j_; i++) { T A = acc[i], B = acc[i + j_]; acc[i] = STEP; } \
    for (; i_ < n; i_++) { T A = acc[0], B = v_[i_]; acc[0] = STEP; } \
    { T A = r_, B = acc[0]; *(T *)out = STEP; } \
  } while (0)
#define ROW_I(T, STEP) do { \
    const T *v_ = (const T *)v; T r_ = *(T *)out; int64_t i_; \
    for (i_ = 0; i_ < n; i_++) { T A = r_, B = v_[i_]; r_ = STEP; } \
    *(T *)out = r_; \
  } while (0)
#define R_ADD_I(ID, T, UT, UW, BITS, MINV) case ID: ROW_I(UT, (UT)(A + B)); break;
#define R_MUL_I(ID, T, UT, UW, BITS, MINV) case ID: ROW_I(UT, (UT)((UW)A * (UW)B)); break;
#define R_MAX_I(ID, T, UT, UW, BITS, MINV) case ID: ROW_I(T, A > B ? A : B); break;

/* a row's max runs the plain select, which vectorizes but returns whichever zero comes last in its lane order; a
   zero result is then fixed to +0 if the partial or any value is +0 (one scan, only for a zero result) */
#define FMAX_ANYZ(A, B) ((A) > (B) || (A) != (A) ? (A) : (B))
#define ZERO_MAX(T, R0) do { \
    const T *z_ = (const T *)v; int64_t k_; int pos_ = (R0) == 0 && !signbit(R0); \
    if (*(T *)out != 0 || !signbit(*(T *)out)) break; \
    for (k_ = 0; k_ < n && !pos_; k_++) pos_ = z_[k_] == 0 && !signbit(z_[k_]); \
    *(T *)out = pos_ ? (T)0 : -(T)0; \
  } while (0)

VM_TGT static void VM_FN(red_row)(int32_t redop, int32_t ct, const char *v, int64_t n, char *out) {
  int64_t i;
  (void)i;
  if (redop == VR_ADD) switch (ct) {
    VM_INTS(R_ADD_I)
    case VT_BOOL: ROW_I(uint8_t, A | B); break;
    case VT_F32: ROW_F(float, 0.0f, A + B); break;
    case VT_F64: ROW_F(double, 0.0, A + B); break;
  } else if (redop == VR_MUL) switch (ct) {
    VM_INTS(R_MUL_I)
    case VT_BOOL: ROW_I(uint8_t, A & B); break;
    case VT_F32: ROW_F(float, 1.0f, A * B); break;
    case VT_F64: ROW_F(double, 1.0, A * B); break;
  } else switch (ct) {
    VM_INTS(R_MAX_I)
    case VT_BOOL: ROW_I(uint8_t, A | B); break;
    case VT_F32: { float r0 = *(float *)out; ROW_F(float, -HUGE_VALF, FMAX_ANYZ(A, B)); ZERO_MAX(float, r0); } break;
    case VT_F64: { double r0 = *(double *)out; ROW_F(double, -HUGE_VAL, FMAX_ANYZ(A, B)); ZERO_MAX(double, r0); } break;
  }
}

/* *out += sum of a[i]*b[i]: a multiply-then-sum without the product tile; more lanes than a plain sum, so that
   enough loads of both streams are in flight */
#define DOT_LANES 16
#define DOT_F(T) do { \
    const T *x_ = (const T *)a, *y_ = (const T *)b; T acc[DOT_LANES], r_ = *(T *)out; int64_t i_ = 0, j_; \
    for (j_ = 0; j_ < DOT_LANES; j_++) acc[j_] = 0; \
    for (; i_ + DOT_LANES <= n; i_ += DOT_LANES) \
      for (j_ = 0; j_ < DOT_LANES; j_++) acc[j_] += x_[i_ + j_] * y_[i_ + j_]; \
    for (j_ = DOT_LANES / 2; j_ >= 1; j_ /= 2) \
      for (i_ = 0; i_ < j_; i_++) acc[i_] += acc[i_ + j_]; \
    for (i_ = n / DOT_LANES * DOT_LANES; i_ < n; i_++) acc[0] += x_[i_] * y_[i_]; \
    *(T *)out = r_ + acc[0]; \
  } while (0)

VM_TGT_STREAM static void VM_FN(red_dot)(int32_t ct, const char *a, const char *b, int64_t n, char *out) {
  if (ct == VT_F64) DOT_F(double);
  else DOT_F(float);
}
#undef DOT_F
#undef DOT_LANES

#define VERT(T, STEP) do { \
    const T *v_ = (const T *)v; T *o_ = (T *)out; int64_t i_; \
    if (os == 1) for (i_ = 0; i_ < n; i_++) { T A = o_[i_], B = v_[i_]; o_[i_] = STEP; } \
    else for (i_ = 0; i_ < n; i_++) { T A = o_[i_ * os], B = v_[i_]; o_[i_ * os] = STEP; } \
  } while (0)
#define V_ADD_I(ID, T, UT, UW, BITS, MINV) case ID: VERT(UT, (UT)(A + B)); break;
#define V_MUL_I(ID, T, UT, UW, BITS, MINV) case ID: VERT(UT, (UT)((UW)A * (UW)B)); break;
#define V_MAX_I(ID, T, UT, UW, BITS, MINV) case ID: VERT(T, A > B ? A : B); break;

VM_TGT static void VM_FN(red_vert)(int32_t redop, int32_t ct, const char *v, int64_t n, char *out, int64_t os) {
  if (redop == VR_ADD) switch (ct) {
    VM_INTS(V_ADD_I)
    case VT_BOOL: VERT(uint8_t, A | B); break;
    case VT_F32: VERT(float, A + B); break;
    case VT_F64: VERT(double, A + B); break;
  } else if (redop == VR_MUL) switch (ct) {
    VM_INTS(V_MUL_I)
    case VT_BOOL: VERT(uint8_t, A & B); break;
    case VT_F32: VERT(float, A * B); break;
    case VT_F64: VERT(double, A * B); break;
  } else switch (ct) {
    VM_INTS(V_MAX_I)
    case VT_BOOL: VERT(uint8_t, A | B); break;
    case VT_F32: VERT(float, FMAX(A, B)); break;
    case VT_F64: VERT(double, FMAX(A, B)); break;
  }
}

#undef BIN_LOOP
#undef UN_LOOP
#undef SEL_LOOP
#undef ROW_F
#undef ROW_I
#undef VERT
#undef FMAX
#undef FMAX_ANYZ
#undef ZERO_MAX
#undef K_FLOATS
#undef CAST_SAT_S
#undef CAST_SAT_U
#undef CAST_FROM_FLOAT
#undef CAST_FROM_INT
