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
#include <string.h>
#include "vm.h"

enum { PZ_ZERO = 1, PZ_NONFINITE = 2, PZ_NEG = 4 };

/* the outputs of reduction kernel k: offsets (in elements of its store) off + sum idx[d] * st[d] over the kept dims */
typedef struct outs { int64_t shp[VM_MAXDIM], st[VM_MAXDIM], off, total; int nd; } outs;

static void outs_init(const vm_kernel *k, outs *o, int64_t *lo, int64_t *hi) {
  const vm_view *s = &k->stores[0];
  int d;
  o->nd = k->ndim;
  o->off = *lo = *hi = s->off;
  o->total = 1;
  for (d = 0; d < k->ndim; d++) {
    o->shp[d] = (k->redmask >> d & 1u) ? 1 : k->shape[d];
    o->st[d] = s->st[d];
    o->total *= o->shp[d];
    if (o->shp[d] > 1) {
      if (s->st[d] < 0) *lo += s->st[d] * (o->shp[d] - 1);
      else *hi += s->st[d] * (o->shp[d] - 1);
    }
  }
}

/* the offset of output t's successor: an odometer over the kept dims */
static int64_t outs_next(const outs *o, int64_t *idx, int64_t cur) {
  int d;
  for (d = o->nd - 1; d >= 0; d--) {
    if (++idx[d] < o->shp[d]) return cur + o->st[d];
    cur -= o->st[d] * (idx[d] - 1);
    idx[d] = 0;
  }
  return cur;
}

int vm_prodz_nan(const vm_kernel *k, const char *base, int64_t *lo, int64_t *span) {
  outs o;
  int64_t t, idx[VM_MAXDIM] = {0}, cur, hi;
  int f64 = k->stores[0].stype == VT_F64, found = 0;
  outs_init(k, &o, lo, &hi);
  *span = hi - *lo + 1;
  for (t = 0, cur = o.off; t < o.total && !found; t++, cur = outs_next(&o, idx, cur))
    found = f64 ? isnan(((const double *)base)[cur]) : isnan(((const float *)base)[cur]);
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
  outs o;
  int64_t t, idx[VM_MAXDIM] = {0}, cur, l, h;
  int f64 = k->stores[0].stype == VT_F64;
  outs_init(k, &o, &l, &h);
  for (t = 0, cur = o.off; t < o.total; t++, cur = outs_next(&o, idx, cur)) {
    uint8_t g = zf[cur - lo];
    if (!(g & PZ_ZERO)) continue;
    if (f64) ((double *)base)[cur] = (g & PZ_NONFINITE) ? NAN : (g & PZ_NEG) ? -0.0 : 0.0;
    else ((float *)base)[cur] = (g & PZ_NONFINITE) ? NAN : (g & PZ_NEG) ? -0.0f : 0.0f;
  }
}
