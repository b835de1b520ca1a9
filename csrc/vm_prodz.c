/* vm_prodz.c: the exact zero of a float product. A product of entries one of which is 0 is 0 (its sign the product
   of the signs) unless an entry is inf or NaN; but a reduction's lanes, or its running product between tiles, may
   overflow to inf before they meet the zero, and inf * 0 is NaN. So after a float product kernel ran, its outputs
   are searched for NaN (vm_prodz_nan); only if one is there does the kernel run again (vm.c's run_loop), each tile's
   values first copied by vm_prodz_tile with every zero replaced by +-1 and a flag byte per output noting the zeros,
   the inf/NaN entries and the parity of the signs. The usual reduction kernels multiply the copy, so a row without
   a zero gives the same bits as in the first run; vm_prodz_fix then makes each output that met a zero +-0, or NaN
   where an inf or NaN entry was among its entries. */
#include <math.h>
#include <stdint.h>
#include "vm.h"

enum { PZ_ZERO = 1, PZ_NONFINITE = 2, PZ_NEG = 4 };

int vm_prodz_nan(const vm_kernel *k, const char *base, int64_t *lo, int64_t *span) {
  vm_outs o;
  int64_t t;
  int f64 = k->stores[0].stype == VT_F64, found = 0;
  vm_outs_init(k, &o);
  *lo = o.lo;
  *span = o.hi - o.lo + 1;
  for (t = 0; t < o.total && !found; t++, vm_outs_next(&o))
    found = f64 ? isnan(((const double *)base)[o.cur]) : isnan(((const float *)base)[o.cur]);
  return found;
}

#define PZ_COPY(T) do { \
    const T *v_ = (const T *)v; T *d_ = (T *)dst; \
    for (i = 0; i < n; i++) { \
      T x = v_[i]; uint8_t *g = f + i * fs; \
      if (signbit(x)) *g ^= PZ_NEG; \
      if (x == 0) { *g |= PZ_ZERO; x = signbit(x) ? (T)-1 : (T)1; } \
      else if (!isfinite(x)) *g |= PZ_NONFINITE; \
      d_[i] = x; \
    } \
  } while (0)

void vm_prodz_tile(int32_t ct, const char *v, int64_t n, char *dst, uint8_t *f, int64_t fs) {
  int64_t i;
  if (ct == VT_F64) PZ_COPY(double);
  else PZ_COPY(float);
}
#undef PZ_COPY

void vm_prodz_fix(const vm_kernel *k, char *base, const uint8_t *zf, int64_t lo) {
  vm_outs o;
  int64_t t;
  int f64 = k->stores[0].stype == VT_F64;
  vm_outs_init(k, &o);
  for (t = 0; t < o.total; t++, vm_outs_next(&o)) {
    int64_t cur = o.cur;
    uint8_t g = zf[cur - lo];
    if (!(g & PZ_ZERO)) continue;
    if (f64) ((double *)base)[cur] = (g & PZ_NONFINITE) ? NAN : (g & PZ_NEG) ? -0.0 : 0.0;
    else ((float *)base)[cur] = (g & PZ_NONFINITE) ? NAN : (g & PZ_NEG) ? -0.0f : 0.0f;
  }
}
