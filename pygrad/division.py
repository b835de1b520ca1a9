"""Floor division and remainder as numpy, torch and Python define them, built from the IR's primitives: integer
`//` and `%` from C-truncating IDIV/MOD with a sign fix, float `//` and `%` as numpy's divmod over an exact fmod (the
IR's MOD is integer-only). Also the bit-level helpers they share with the other math methods (a value passing no
gradient, the sign bit). The functions take UOps and call only UOp methods (and the class of their operand), so this
module imports nothing of uop.py."""
from __future__ import annotations
import math
from .ops import Ops
from .dtype import dtypes

SAME_WIDTH_INT = {2: dtypes.int16, 4: dtypes.int32, 8: dtypes.int64}  # the int dtype of a float's width (bitcasts)


# Integer `//` and `%` floor as Python's, numpy's, torch's and tinygrad's Tensor do (-7 // 2 is -4, -7 % 2 is 1): the
# IR's IDIV and MOD truncate as C does (-3 and -1), so where the remainder is nonzero and its sign differs from the
# divisor's, the quotient is one less and the divisor is added to the remainder. By zero both stay 0.
def _floor_fix(a, b):
  r = type(a)(Ops.MOD, None, (a, b))
  if dtypes.is_unsigned(a.dtype): return r, None
  zero = r.const_like(0)
  return r, r.ne(zero) & (r < zero).ne(b < b.const_like(0))


def int_floordiv(a, b):
  """a // b of two int UOps of one dtype, floored (by zero: 0)."""
  q = type(a)(Ops.IDIV, None, (a, b))
  _, fix = _floor_fix(a, b)
  return q if fix is None else fix.where(q - q.const_like(1), q)


def int_mod(a, b):
  """a % b of two int UOps of one dtype, with the divisor's sign (by zero: 0)."""
  r, fix = _floor_fix(a, b)
  return r if fix is None else fix.where(r + b, r)


def no_grad(x):
  """x's value passing no gradient: a BITCAST to the same-width int and back (BITCAST has no gradient rule). Not a
  DETACH: tinygrad's simplifier folds the BITCAST pair away but keeps a DETACH, so a gradient converted to tinygrad
  and evaluated at constants would not simplify to one constant."""
  return x.bitcast(SAME_WIDTH_INT[x.dtype.itemsize]).bitcast(x.dtype)


def unit(x, zero):
  """1 where x > 0, -1 where x < 0, else zero (x's zeros and NaNs)."""
  return (x > 0).where(x.const_like(1), (x < 0).where(x.const_like(-1), zero))


def signbit(x):
  """Whether x's sign bit is set (-0.0 and NaNs with the sign set included), read from its bits."""
  return x.bitcast(SAME_WIDTH_INT[x.dtype.itemsize]) < 0


def _fmod32(a, b):
  """C's fmod(a, b) of float32 values, exact (the IR's MOD is integer-only): the remainder a - n * b, n = trunc(a /
  b), with a's sign, computed in float64 on r = |a| by steps r -= t * (|b| * 2**k), t = trunc(r / (|b| * 2**k)), k the
  exponent of r / |b| less 28 (0 at least). t < 2**29 and |b| * 2**k has 24 significant bits, so t * |b| * 2**k is
  exact in float64, and r - t * |b| * 2**k is a multiple of b's unit, below 2**53 of them: exact. A step takes 29
  bits off the quotient's exponent, at most 277 (float32's max over its smallest denormal): 10 steps; the last has
  k = 0 and leaves r in [0, |b|) (or -0 ... a multiple of b's unit below one: none). NaN for a = inf, b = 0 or a
  NaN operand; a for b = +-inf."""
  f64 = dtypes.float64
  aw, bw = a.cast(f64), b.cast(f64)
  bad = a.ne(a) | b.ne(b) | b.eq(0) | a.eq(math.inf) | a.eq(-math.inf)
  binf = b.eq(math.inf) | b.eq(-math.inf)
  ab = (bad | binf).where(1.0, (bw < 0).where(-bw, bw))
  r = bad.where(0.0, (aw < 0).where(-aw, aw) + 0.0)  # + 0.0: |-0.0| is +0.0
  for _ in range(10):
    q = r / ab
    p = (q.bitcast(dtypes.int64) & 0x7FF0000000000000).bitcast(f64)  # 2**exponent(q) (0 for q = 0)
    bk = ab * (p * 2.0 ** -28).maximum(1.0)
    r = r - (r / bk).trunc() * bk
  r = (r < 0).where(r + ab, r)
  res = signbit(a).where(-r, r).cast(dtypes.float32)
  return bad.where(math.nan, binf.where(a, res))


_FMOD64_STEPS = 4  # exact for |a / b| < 2**99


def _fmod64(a, b):
  """C's fmod(a, b) of float64 values, exact for |a / b| < 2**99, and where it is exact: past 2**99 the steps leave a
  remainder not reduced (no wider type to work in, and the quotient's exponent reaches 2098). As _fmod32, on r = |a| by
  steps r -= t * (|b| * 2**k), now with |b| split into a high part of 26 significant bits and a low part (exact
  sum): t < 2**25, so t * high and t * low are exact, r - t * high is below high * 2**k in b's units (t is taken
  from it), and the result is a multiple of b's unit below 2**53 of them: each subtraction exact. A step takes 25
  bits off the quotient's exponent."""
  f64, i64 = dtypes.float64, dtypes.int64
  bad = a.ne(a) | b.ne(b) | b.eq(0) | a.eq(math.inf) | a.eq(-math.inf)
  binf = b.eq(math.inf) | b.eq(-math.inf)
  ab = (bad | binf).where(1.0, (b < 0).where(-b, b))
  r = bad.where(0.0, (a < 0).where(-a, a) + 0.0)
  # the split: clear the low 27 bits of |b|'s significand (a denormal |b| by Veltkamp's split, which cannot overflow
  # there; the bit mask would clear a small denormal entirely)
  g = ab * 134217729.0
  hi = (ab < 2.0 ** -1022).where(g - (g - ab), (ab.bitcast(i64) & ~((1 << 27) - 1)).bitcast(f64))
  lo = ab - hi
  for _ in range(_FMOD64_STEPS):
    q = r / ab
    s = ((q.bitcast(i64) & 0x7FF0000000000000).bitcast(f64) * 2.0 ** -24).maximum(1.0)  # 2**k
    hk = hi * s
    t = (r / hk).trunc()
    r = (r - t * hk) - t * (lo * s)
  r = (r < 0).where(r + ab, r)
  mod = bad.where(math.nan, binf.where(a, signbit(a).where(-r, r)))
  return mod, bad | binf | ((r >= 0) & (r < ab))  # and where it is exact (reduced into [0, |b|))


def _approx_floordiv(a, b):
  """floor(a / b) from the rounded quotient, moved by one where the remainder a - b * q lies outside [0, b): numpy's
  float64 quotient past _fmod64's exact range (where no remainder computed from it is numpy's: the caller gives NaN)."""
  q = (a / b).floor()
  r = a - b * q
  pos, neg = b > 0, b < 0
  low = (pos & (r < 0)) | (neg & (r > 0))
  high = (pos & (r >= b)) | (neg & (r <= b))
  return low.where(q - 1, high.where(q + 1, q))


def _float_divmod(a, b, div_too: bool = True):
  """(a // b, a % b) as numpy computes them (npy_divmod): mod = fmod(a, b) exact; div = (a - mod) / b; where mod is
  nonzero with a sign other than b's, mod += b and div -= 1; a zero mod takes b's sign; the floor of div rounded to
  nearest (div - floor(div) > 0.5 adds 1), a zero quotient taking the sign of a / b; for b = 0, a / b and NaN.
  float16/bfloat16 compute in float32 and round once, as numpy's half and ml_dtypes' bfloat16 do. Without div_too,
  (None, a % b): the quotient's nodes, which a % b does not read, are not built. A float64 remainder past the exact
  fmod's range (|a / b| >= 2**99) is NaN: no remainder computed there is numpy's, not even near it (a - b * (a // b)
  with a // b rounded to 53 bits is off by up to 2**46 times b; it gave -inf for 1.0 % 5e-324), and a NaN says so
  where a finite wrong number would not."""
  dt = a.dtype
  if dt.itemsize == 2: a, b = a.cast(dtypes.float32), b.cast(dtypes.float32)
  mod, exact = _fmod64(a, b) if a.dtype is dtypes.float64 else (_fmod32(a, b), None)
  div = (a - mod) / b if div_too else None
  fix = mod.ne(0) & (b < 0).ne(mod < 0)
  mod = fix.where(mod + b, mod)
  mod = mod.eq(0).where(signbit(b).where(-0.0, 0.0), mod)
  if not div_too:
    if exact is not None: mod = exact.where(mod, math.nan)
    return None, mod.cast(dt)
  div = fix.where(div - 1, div)
  fl = div.floor()
  fl = (div - fl > 0.5).where(fl + 1, fl)
  q = a / b
  div = b.eq(0).where(q, div.ne(0).where(fl, signbit(q).where(-0.0, 0.0)))
  if exact is not None:
    qa = _approx_floordiv(a, b)
    div, mod = exact.where(div, qa), exact.where(mod, math.nan)
  # a // b passes no gradient, as floor's is 0 (torch's floor_divide has none): its graph holds a / b (the b == 0
  # branch) and the approximate quotient, whose own gradients are 0 only by selection, so a NaN gradient arriving
  # (d/de of b ** e at b < 0) became NaN at order 2 (0 * NaN) where torch's is 0
  return no_grad(div.cast(dt)), mod.cast(dt)


def float_floordiv(a, b):
  """a // b of two float UOps of one dtype, numpy's."""
  return _float_divmod(a, b)[0]


def float_mod(a, b):
  """a % b of two float UOps of one dtype, numpy's (float64: for |a / b| < 2**99, else NaN; README)."""
  return _float_divmod(a, b, False)[1]


__all__ = ["SAME_WIDTH_INT", "int_floordiv", "int_mod", "float_floordiv", "float_mod", "no_grad", "unit", "signbit"]
