"""Values against an independent reference (numpy, Python ints), not one engine against the other: a derived op that
decomposes into a wrong graph gives the same wrong number on both engines, so the differential fuzzers cannot see
it. Each case here is a corner those fuzzers do not judge: integer extremes, empty reductions, the README's
"Defined semantics"."""
from __future__ import annotations
import math
import numpy as np
import pytest
import pygrad
from pygrad import UOp, Ops, dtypes
from pygrad.dtype import VALUE_DTYPES

ENGINES = ["numpy"] + (["c"] if pygrad.core_name() == "c" else [])
INTS = [d for d in VALUE_DTYPES if dtypes.is_int(d)]


def _extremes(dt):
  info = np.iinfo(dt.np)
  v = [0, 1, 2, 3, 7, -1, -2, -7, info.min, info.max, info.min + 1, info.max - 1, 100, -100]
  return [x for x in v if info.min <= x <= info.max]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("dt", INTS, ids=lambda d: d.name)
def test_int_min_and_minimum_at_the_extremes(dt, engine):
  # min was -max(-x): on signed ints -MIN wraps to MIN, so min([MIN, 5]) was 5 and minimum(MIN, 3) was 3 (both
  # engines agreed, so the engine fuzzer passed); an empty min gave MIN, not the identity MAX
  v = _extremes(dt)
  a = np.array([x for x in v for _ in v], dt.np).reshape(len(v), len(v))
  b = np.array([y for _ in v for y in v], dt.np).reshape(len(v), len(v))
  x, y = UOp.placeholder(a.shape, dt), UOp.placeholder(b.shape, dt)
  e = UOp.placeholder((0, 2), dt)
  got = pygrad.evaluate([x.minimum(y), x.min(), x.min(axis=1), y.min(axis=0, keepdim=True), e.min(axis=0)],
                        {x: a, y: b, e: np.zeros((0, 2), dt.np)}, engine=engine)
  want = [np.minimum(a, b), a.min(), a.min(axis=1), b.min(axis=0, keepdims=True),
          np.full(2, np.iinfo(dt.np).max, dt.np)]
  for g, w in zip(got, want):
    assert g.dtype == w.dtype and np.array_equal(g, w), (g, w)


def _wrap(r, dt):
  bits, info = 8 * dt.itemsize, np.iinfo(dt.np)
  r %= 1 << bits
  return r - (1 << bits) if info.min < 0 and r > info.max else r


def _tdiv(a, b):
  q = abs(a) // abs(b)
  return q if (a < 0) == (b < 0) else -q


@pytest.mark.parametrize("engine", ENGINES)
def test_a_bool_node_with_an_int_scalar_computes_in_ints(engine):
  # the int was made a bool constant: x + 2 was x | True, x < 2 was x < True, x * 2 was x (numpy and torch: ints)
  x = UOp.placeholder((2,), dtypes.bool)
  xv = np.array([True, False])
  ops = [lambda v: v + 2, lambda v: v * 2, lambda v: v < 2, lambda v: v.eq(2) if isinstance(v, UOp) else v == 2,
         lambda v: v - 1, lambda v: 2 - v, lambda v: v.maximum(2) if isinstance(v, UOp) else np.maximum(v, 2),
         lambda v: v ^ 2, lambda v: v + np.int64(300), lambda v: v + 1.5]
  got = pygrad.evaluate([f(x) for f in ops], {x: xv}, engine=engine)
  for i, (g, f) in enumerate(zip(got, ops)):
    w = np.asarray(f(xv))
    assert g.tolist() == w.tolist() and g.dtype.kind == w.dtype.kind, (i, g, w)


@pytest.mark.parametrize("engine", ENGINES)
def test_mixed_int_dtypes_meet_in_a_type_holding_both(engine):
  # promotion was a rank order: uint8 + int8 was int8, so 255 + 0 was -1 (numpy and torch: int16, 255)
  pairs = [(dtypes.uint8, dtypes.int8, dtypes.int16), (dtypes.uint16, dtypes.int16, dtypes.int32),
           (dtypes.uint32, dtypes.int32, dtypes.int64), (dtypes.uint8, dtypes.int16, dtypes.int16),
           (dtypes.int8, dtypes.uint16, dtypes.int32), (dtypes.uint16, dtypes.uint8, dtypes.uint16),
           (dtypes.bool, dtypes.uint8, dtypes.uint8), (dtypes.int8, dtypes.int64, dtypes.int64)]
  for da, db, want in pairs:
    a = np.array(_extremes(da)[:8] if da is not dtypes.bool else [True, False], da.np)
    b = np.array(_extremes(db)[:len(a)] if db is not dtypes.bool else [True, False], db.np)[:len(a)]
    a = a[:len(b)]
    x, y = UOp.placeholder(a.shape, da), UOp.placeholder(b.shape, db)
    outs = [x + y, y - x, x * y, x.maximum(y), x < y]
    assert [o.dtype for o in outs[:4]] == [want] * 4, (da, db, outs[0].dtype)
    got = pygrad.evaluate(outs, {x: a, y: b}, engine=engine)
    wa, wb = a.astype(want.np), b.astype(want.np)
    for g, w in zip(got, [wa + wb, wb - wa, wa * wb, np.maximum(wa, wb), wa < wb]):
      assert g.tolist() == w.tolist(), (da, db)
  h, bf = UOp.placeholder((), dtypes.float16), UOp.placeholder((), dtypes.bfloat16)
  r = h + bf  # torch and JAX: float32 (neither half format holds the other)
  assert r.dtype is dtypes.float32
  assert float(pygrad.evaluate(r, {h: np.float16(1000.5), bf: np.float32(0.00390625)}, engine=engine)) == 1000.50390625
  with pytest.raises(TypeError, match="uint64"):
    UOp.placeholder((), dtypes.uint64) + UOp.placeholder((), dtypes.int64)


@pytest.mark.parametrize("engine", ENGINES)
def test_sums_of_bools_and_narrow_ints_do_not_wrap(engine):
  # README "Defined semantics": sum and prod of bool and of ints narrower than 64 bits are in int32 (unsigned:
  # uint32), tinygrad's sum_acc_dtype and JAX's result dtype; they kept the dtype, so 300 Trues summed to True and
  # 300 uint8 200s to 96 (numpy and torch give 300 and 60000, in int64)
  x, b = UOp.placeholder((300,), dtypes.int8), UOp.placeholder((2, 3), dtypes.bool)
  u, t = UOp.placeholder((300,), dtypes.uint8), UOp.placeholder((300,), dtypes.bool)
  bv = np.array([[True, False, True], [False, False, False]])
  xv, uv = np.full(300, 100, np.int8), np.full(300, 200, np.uint8)
  outs = [x.sum(), x.prod(), b.sum(axis=1), b.prod(axis=1), b.sum(), t.sum(), u.sum(), u.prod(),
          x.shrink(((0, 3),)).prod(), u.sum(dtype=dtypes.uint8), x.sum(dtype=dtypes.int64)]
  got = pygrad.evaluate(outs, {x: xv, b: bv, t: np.ones(300, bool), u: uv}, engine=engine)
  want = [np.int32(30000), np.int32(0), np.array([2, 0], np.int32), np.array([0, 0], np.int32), np.int32(2),
          np.int32(300), np.uint32(60000), np.uint32(0), np.int32(1000000), np.uint8(96), np.int64(30000)]
  for i, (g, w) in enumerate(zip(got, want)):
    assert g.dtype == np.asarray(w).dtype and g.tolist() == np.asarray(w).tolist(), (i, g, w)
  wide = {dtypes.int32: dtypes.int32, dtypes.int64: dtypes.int64, dtypes.uint16: dtypes.uint32,
          dtypes.uint32: dtypes.uint32, dtypes.uint64: dtypes.uint64, dtypes.int16: dtypes.int32,
          dtypes.float16: dtypes.float16, dtypes.bfloat16: dtypes.bfloat16, dtypes.float64: dtypes.float64}
  for d, w in wide.items():
    p = UOp.placeholder((2,), d)
    assert p.sum().dtype is w and p.prod(axis=0).dtype is w and p.sum(dtype=dtypes.float32).dtype is dtypes.float32
  with pytest.raises(TypeError, match="dtype"): x.sum(dtype="int64")


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("dt", INTS, ids=lambda d: d.name)
def test_int_arithmetic_is_the_defined_semantics(dt, engine):
  # README "Defined semantics": IDIV truncates, MOD has the dividend's sign, by zero gives 0, overflow wraps; integer
  # POW with a negative exponent is 0 except for bases 1 and -1; shifts by a negative or too large count
  v = _extremes(dt)
  A, B = [a for a in v for _ in v], [b for _ in v for b in v]
  x, y = UOp.placeholder((len(A),), dt), UOp.placeholder((len(A),), dt)
  vals = {x: np.array(A, dt.np), y: np.array(B, dt.np)}

  def ipow(a, b):
    if b < 0: return 1 if a == 1 else (1 if b % 2 == 0 else -1) if a == -1 else 0
    return pow(a, b, 1 << (8 * dt.itemsize))
  want = {"idiv": [0 if b == 0 else _tdiv(a, b) for a, b in zip(A, B)],
          "mod": [0 if b == 0 else a - b * _tdiv(a, b) for a, b in zip(A, B)],
          "add": [a + b for a, b in zip(A, B)], "sub": [a - b for a, b in zip(A, B)],
          "mul": [a * b for a, b in zip(A, B)], "pow": [ipow(a, b) for a, b in zip(A, B)],
          # the methods floor as Python, numpy, torch and tinygrad do: `//` truncated (-7 // 2 was -3, all peers -4)
          "floordiv": [0 if b == 0 else a // b for a, b in zip(A, B)],
          "floormod": [0 if b == 0 else a % b for a, b in zip(A, B)]}
  got = pygrad.evaluate([UOp(Ops.IDIV, None, (x, y)), UOp(Ops.MOD, None, (x, y)), x + y, x - y, x * y, x.pow(y),
                         x // y, x % y], vals, engine=engine)
  for (k, w), g in zip(want.items(), got):
    assert g.tolist() == [_wrap(r, dt) for r in w], k
  bits = 8 * dt.itemsize
  for c in (-1, 0, 1, bits - 1, bits, bits + 1, 100):
    if not np.iinfo(dt.np).min <= c <= np.iinfo(dt.np).max: continue
    n = UOp.placeholder((len(v),), dt)
    s = UOp.placeholder((len(v),), dt)
    gl, gr = pygrad.evaluate([n << s, n >> s], {n: np.array(v, dt.np), s: np.full(len(v), c, dt.np)}, engine=engine)
    assert gl.tolist() == [0 if c < 0 or c >= bits else _wrap(a << c, dt) for a in v], ("shl", c)
    assert gr.tolist() == [0 if c < 0 else (-1 if a < 0 else 0) if c >= bits else a >> c for a in v], ("shr", c)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("src", [dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64], ids=lambda d: d.name)
def test_float_to_int_casts_truncate_saturate_and_send_nan_to_zero(src, engine):
  fv = [0.0, -0.0, 0.5, -0.5, 1.7, -1.7, 127.9, 128.0, -128.9, -129.0, 255.9, 256.0, 1e10, -1e10, 1e30, -1e30,
        math.inf, -math.inf, math.nan, 2.0 ** 63, -2.0 ** 63, 2.0 ** 64, 2.0 ** 31, -2.0 ** 31 - 1]
  with np.errstate(all="ignore"):
    arr = np.array(fv, np.float32 if src is dtypes.bfloat16 else src.np)
  if src is dtypes.bfloat16:  # values a bfloat16 holds exactly, so no rounding is under test here
    arr = (arr.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
  x = UOp.placeholder(arr.shape, src)
  ref = arr.astype(np.float64).tolist()
  for dt in INTS + [dtypes.bool]:
    got = pygrad.evaluate(x.cast(dt), {x: arr}, engine=engine).tolist()
    if dt is dtypes.bool: want = [f != 0 for f in ref]
    else:
      lo, hi = int(np.iinfo(dt.np).min), int(np.iinfo(dt.np).max)
      want = [0 if math.isnan(f) else hi if f >= hi else lo if f <= lo else math.trunc(f) for f in ref]
    assert got == want, dt.name


HALF_RUNS = [("numpy", None)] + ([("c", 1), ("c", 4)] if pygrad.core_name() == "c" else [])


@pytest.mark.parametrize("engine,threads", HALF_RUNS, ids=lambda v: str(v))
@pytest.mark.parametrize("dst", [dtypes.float16, dtypes.bfloat16], ids=lambda d: d.name)
def test_conversions_to_half_formats_round_once(dst, engine, threads):
  # a CAST, a constant or a bound value went through float32 rounded to nearest and so was rounded twice:
  # float64 1 + 2**-11 + 2**-40 gave float16 1.0 (numpy 1 + 2**-10), 65519.99999 inf (numpy 65504), 2**-25 + 2**-50
  # 0 (numpy 2**-24); int32 2**24 + 2**16 + 1 gave bfloat16 2**24 (ml_dtypes 2**24 + 2**17). numpy's float16 and
  # ml_dtypes' bfloat16 casts round once (torch's float64 -> float16 rounds twice; README "Defined semantics")
  import ml_dtypes
  hd = np.float16 if dst is dtypes.float16 else ml_dtypes.bfloat16
  h = 2.0 ** -11 if dst is dtypes.float16 else 2.0 ** -8  # half an ulp at 1
  rng = np.random.default_rng(7)
  f64 = np.concatenate([[1 + h + 2.0 ** -40, 1 + h, 1 + h - 2.0 ** -40, 1 + 3 * h + 2.0 ** -45, -(1 + h + 2.0 ** -40),
                         65519.99999, 65520.0, 65504.0, 2.0 ** -25 + 2.0 ** -50, 2.0 ** -25, 2.0 ** -134 + 2.0 ** -160,
                         3.3961e38, 3.3949e38, 1e300, -1e300, 1e-300, 0.0, -0.0, math.inf, -math.inf, math.nan],
                        # float64 values one float32 rounding makes half-way between two half values
                        (rng.integers(1 << 20, 1 << 21, 200) * 2.0 + 1) * 2.0 ** rng.integers(-40, 40, 200) *
                        (1 + rng.choice([-1, 1], 200) * 2.0 ** -30)])
  ints = {dt: np.array([v for v in (2 ** 24 + 2 ** 16 + 1, -(2 ** 24 + 2 ** 16 + 1), 2 ** 31 - 2 ** 23 + 1, 65519,
                                    2 ** 62 + 2 ** 54 + 1, -(2 ** 62 + 2 ** 54 + 1), 2 ** 63 + 2 ** 55 + 1, 0, 7)
                        if np.iinfo(dt.np).min <= v <= np.iinfo(dt.np).max], dt.np)
          for dt in (dtypes.int32, dtypes.int64, dtypes.uint64)}
  with np.errstate(all="ignore"):
    want = {dtypes.float64: f64.astype(hd)}
    want.update({dt: np.array([_exact_half(int(v), hd) for v in a]) for dt, a in ints.items()})
  ins = {dtypes.float64: f64, **ints}
  xs = {dt: UOp.placeholder(a.shape, dt) for dt, a in ins.items()}
  c = UOp.const(1 + h + 2.0 ** -40, dst)
  p = UOp.placeholder((3,), dst)
  outs = [xs[dt].cast(dst) for dt in ins] + [c, c.simplify(), p, (xs[dtypes.float64].cast(dst) * 1.0).simplify()]
  got = _run(outs, {**{xs[dt]: a for dt, a in ins.items()}, p: [1 + h + 2.0 ** -40, 65519.99999, 2.0 ** -25 + 2.0 ** -50]},
             engine, threads)
  exact = [want[dt] for dt in ins] + [hd(1 + 2 * h)] * 2 + [np.array([1 + h + 2.0 ** -40, 65519.99999,
                                                                        2.0 ** -25 + 2.0 ** -50]).astype(hd),
                                                              want[dtypes.float64]]
  for i, (g, w) in enumerate(zip(got, exact)):
    g, w = np.asarray(g, np.float64), np.asarray(w).astype(np.float64)
    assert np.array_equal(g, w, equal_nan=True) and np.array_equal(np.signbit(g), np.signbit(w)), \
      (i, [(a, b) for a, b in zip(g.ravel(), w.ravel()) if not (a == b or a != a and b != b)][:4])


def _exact_half(v: int, hd):
  """The integer v rounded to nearest-even in half format hd (11 or 8 significant bits), exactly."""
  p = 11 if hd is np.float16 else 8
  shift = max(abs(v).bit_length() - p, 0)
  q, r = divmod(abs(v), 1 << shift)
  if shift and (r > 1 << (shift - 1) or r == 1 << (shift - 1) and q & 1): q += 1
  return hd(math.copysign(float(q << shift), v))


SPECIAL = [0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 1e30, -1e30, math.inf, -math.inf, math.nan, 1e-30]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("dt", [dtypes.float16, dtypes.float32, dtypes.float64], ids=lambda d: d.name)
def test_float_comparisons_sign_and_abs_at_special_values(dt, engine):
  # a <= b was not(b < a), so NaN <= 1 and NaN >= 1 were True; sign(NaN) was 1 (numpy and JAX: NaN); abs(-0.0) was
  # -0.0 (IEEE abs clears the sign: +0.0)
  with np.errstate(all="ignore"):
    a = np.array([p for p in SPECIAL for _ in SPECIAL], dt.np)
    b = np.array([q for _ in SPECIAL for q in SPECIAL], dt.np)
  x, y = UOp.placeholder(a.shape, dt), UOp.placeholder(b.shape, dt)
  got = pygrad.evaluate([x <= y, x >= y, x < y, x > y, x <= 1.0, x >= 1.0, x.sign(), x.abs()], {x: a, y: b},
                        engine=engine)
  with np.errstate(all="ignore"):
    want = [a <= b, a >= b, a < b, a > b, a <= 1.0, a >= 1.0, np.sign(a), np.abs(a)]
  for i, (g, w) in enumerate(zip(got, want)):
    assert g.dtype == w.dtype and np.array_equal(g, w, equal_nan=True), i
    # sign(-0.0) was -0.0 (numpy's and torch's +0.0; JAX's -0.0), undocumented
    if g.dtype.kind == "f": assert np.array_equal(np.signbit(g), np.signbit(w)), i


@pytest.mark.parametrize("engine", ENGINES)
def test_sign_passes_no_gradient_even_from_an_infinite_upstream(engine):
  # sign's x * 0 branch (for NaN and -0.0) passed upstream * 0: NaN at x = 0 for an infinite upstream gradient, where
  # torch's sign passes 0; abs = x * sign(x) keeps torch's sign(x) * upstream (NaN there, as torch's)
  x, y = UOp.placeholder((4,), dtypes.float32), UOp.placeholder((4,), dtypes.float32)
  xv, yv = np.array([0.0, -0.0, 1.0, -2.0], np.float32), np.full(4, np.inf, np.float32)
  g_sign, = (x.sign() * y).sum().gradient(x)
  g_abs, = (x.abs() * y).sum().gradient(x)
  got = pygrad.evaluate([g_sign, g_abs], {x: xv, y: yv}, engine=engine)
  assert np.array_equal(got[0], np.zeros(4, np.float32))
  assert np.array_equal(got[1], np.array([np.nan, np.nan, np.inf, -np.inf], np.float32), equal_nan=True)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("dt,scale,tol", [(dtypes.float16, 1000, 2e-3), (dtypes.float32, 1e8, 4e-7),
                                          (dtypes.float64, 1e8, 1e-15)], ids=lambda v: getattr(v, "name", str(v)))
def test_cos_of_large_arguments(dt, scale, tol, engine):
  # cos was sin(pi/2 - x): pi/2 - x rounds x's low bits away, so cos(1e8) in float32 was off by up to 1.4 and
  # cos(1000) in float16 by 0.07
  v = np.random.default_rng(0).uniform(-scale, scale, 4000).astype(dt.np)
  x = UOp.placeholder(v.shape, dt)
  got = pygrad.evaluate(x.cos(), {x: v}, engine=engine).astype(np.float64)
  assert np.abs(got - np.cos(v.astype(np.float64))).max() <= tol


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("dt,ulps", [(dtypes.float32, 8), (dtypes.float64, 8)], ids=lambda v: getattr(v, "name", str(v)))
def test_tanh_keeps_its_relative_precision_near_zero(dt, ulps, engine):
  # tanh was 2 sigmoid(2x) - 1, which cancels near 0: tanh(1e-8) was 0 in float32, and across |x| in [1e-12, 20]
  # float64's median error was 4e4 ulp; -0.0 stays -0.0
  rng = np.random.default_rng(0)
  v = np.concatenate([10 ** rng.uniform(-12, 1.3, 4000) * rng.choice([-1, 1], 4000), [0.125, -0.125, 0.0]])
  v = np.concatenate([v, [-0.0, 1e-30, math.inf, -math.inf, math.nan]]).astype(dt.np)
  x = UOp.placeholder(v.shape, dt)
  got = pygrad.evaluate(x.tanh(), {x: v}, engine=engine).astype(np.float64)
  want = np.tanh(v.astype(np.float64))
  fin = np.isfinite(want) & (want != 0)
  assert (np.abs(got - want)[fin] <= ulps * np.finfo(dt.np).eps * np.abs(want[fin])).all()
  assert np.array_equal(got[~fin], want[~fin], equal_nan=True) and np.array_equal(np.signbit(got), np.signbit(want))


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.float64], ids=lambda d: d.name)
def test_float_floordiv_and_mod_equal_numpy(dt, engine):
  # a // b was floor(a * (1 / b)): 49.0 // 49.0 was 0 and 49.0 % 49.0 was 49.0 (a * (1 / a) is 1 - ulp for many a);
  # a finite a % inf was inf * 0 = NaN (numpy: a, or inf for opposite signs), and -1 // inf was -0.0 (numpy: -1)
  i = np.arange(-120, 121, dtype=np.float64)
  a = np.concatenate([np.repeat(i, len(i)), [1.0, -1.0, 0.0, 1.0, -1.0, 1e-300, -1e-300, 5.5, -5.5, 7.0, math.nan]])
  b = np.concatenate([np.tile(i, len(i)), [math.inf, math.inf, math.inf, -math.inf, -math.inf, 1e300, 1e300, 2.0,
                                           -2.0, 0.0, 1.0]])
  with np.errstate(all="ignore"):
    a, b = a.astype(dt.np), b.astype(dt.np)
    want = [np.floor_divide(a, b), np.mod(a, b)]
  x, y = UOp.placeholder(a.shape, dt), UOp.placeholder(b.shape, dt)
  for g, w in zip(pygrad.evaluate([x // y, x % y], {x: a, y: b}, engine=engine), want):
    assert np.array_equal(g, w, equal_nan=True), [(p, q, r, s) for p, q, r, s in zip(a, b, g, w) if not (r == s or r != r)]


# ---- division: a / b builds MUL(a, RECIPROCAL(b)), which every engine evaluates as the IEEE quotient ----
# (engines: numpy, and the C VM on one thread and on four, as threads split tiles differently)
DIV_RUNS = [("numpy", None)] + ([("c", 1), ("c", 4)] if pygrad.core_name() == "c" else [])


def _division_operands(npdt, n=20000):
  """Quotient operands: random signs and exponents over the whole range (denormals included), int-valued floats,
  and the cross product of special values."""
  rng = np.random.default_rng(7)
  fi = np.finfo(npdt)
  lo, hi = math.log2(float(fi.smallest_subnormal)), math.log2(float(fi.max))
  r = (rng.choice([-1.0, 1.0], (2, n)) * 2.0 ** rng.uniform(lo, hi, (2, n))).astype(npdt)
  ints = rng.integers(-300, 300, (2, n // 4)).astype(npdt)
  sp = [0.0, -0.0, 1.0, -1.0, 3.0, -7.0, 49.0, 0.1, 1.5, float(fi.smallest_subnormal), -float(fi.smallest_subnormal),
        float(fi.tiny), float(fi.max), -float(fi.max), math.inf, -math.inf, math.nan]
  spa = np.array([p for p in sp for _ in sp], npdt)
  spb = np.array([q for _ in sp for q in sp], npdt)
  return np.concatenate([r[0], ints[0], spa]), np.concatenate([r[1], ints[1], spb])


def _bits_equal(g, w) -> bool:
  """Equal bit for bit, except that any NaN equals any NaN (payloads and NaN signs are not specified)."""
  g, w = np.asarray(g), np.asarray(w)
  if g.dtype != w.dtype or g.shape != w.shape: return False
  nan = np.isnan(g.astype(np.float64))
  return bool(np.array_equal(nan, np.isnan(w.astype(np.float64))) and
              np.array_equal(g[~nan].view(f"u{g.itemsize}"), w[~nan].view(f"u{w.itemsize}")))


def _run(outs, inputs, engine, threads):
  if threads is None: return pygrad.evaluate(outs, inputs, engine=engine)
  old = pygrad.get_num_threads()
  pygrad.set_num_threads(threads)
  try: return pygrad.evaluate(outs, inputs, engine=engine)
  finally: pygrad.set_num_threads(old)


@pytest.mark.parametrize("engine,threads", DIV_RUNS, ids=lambda v: str(v))
@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.float64], ids=lambda d: d.name)
def test_float_division_equals_numpy_bit_for_bit(dt, engine, threads):
  # a / b was a * (1 / b): 74% of random float32 quotients equalled numpy's and x / x == 1 for 85% of x
  a, b = _division_operands(dt.np)
  n = len(a)
  x, y = UOp.placeholder((n,), dt), UOp.placeholder((n,), dt)
  m = UOp.placeholder((4, 5), dt)
  mv, rv = a[:20].reshape(4, 5), b[:5]
  row = UOp.placeholder((5,), dt)
  outs = [x / y, x / x, 1 / x, x / 3.0, 3.0 / x, y.reciprocal() * x, (x / 3.0).simplify(), x / 0.1, m / row,
          row / m, m / 7.0, m / m.sum(), m.sum(), x.mean(), x.sum()]
  got = _run(outs, {x: a, y: b, m: mv, row: rv}, engine, threads)
  with np.errstate(all="ignore"):
    c3, tenth = np.asarray(3.0, dt.np), np.asarray(0.1, dt.np)
    want = [a / b, a / a, 1 / a, a / c3, c3 / a, a / b, a / c3, a / tenth, mv / rv, rv / mv, mv / np.asarray(7.0, dt.np),
            mv / got[12], got[12], got[14] / np.asarray(n, dt.np)]  # over a sum: the quotient by the engine's own sum
  for i, (g, w) in enumerate(zip(got, want)):
    assert _bits_equal(g, w), (i, [(p, q) for p, q in zip(g.ravel(), w.ravel()) if not _bits_equal(p, q)][:5])


@pytest.mark.parametrize("engine,threads", DIV_RUNS, ids=lambda v: str(v))
@pytest.mark.parametrize("dt", [dtypes.float16, dtypes.bfloat16], ids=lambda d: d.name)
def test_half_division_is_correctly_rounded(dt, engine, threads):
  # the exact quotient of the half values rounded once to the half format (from float64, where rounding twice is
  # harmless: 53 >= 2 * 11 + 2 bits)
  import ml_dtypes
  rng = np.random.default_rng(3)
  n = 20000
  hd = np.float16 if dt is dtypes.float16 else ml_dtypes.bfloat16
  fi = np.finfo(np.float16) if dt is dtypes.float16 else ml_dtypes.finfo(ml_dtypes.bfloat16)
  lo, hi = math.log2(float(fi.smallest_subnormal)), math.log2(float(fi.max))
  a, b = (rng.choice([-1.0, 1.0], (2, n)) * 2.0 ** rng.uniform(lo, hi, (2, n))).astype(hd)
  sp = np.array([0.0, -0.0, 1.0, 3.0, -7.0, math.inf, -math.inf, math.nan], hd)
  a, b = np.concatenate([a, np.repeat(sp, len(sp))]), np.concatenate([b, np.tile(sp, len(sp))])
  store = np.float16 if dt is dtypes.float16 else np.float32  # bfloat16 values are stored as float32
  x, y = UOp.placeholder(a.shape, dt), UOp.placeholder(b.shape, dt)
  got = _run([x / y, x / x, x / 3.0], {x: a.astype(store), y: b.astype(store)}, engine, threads)
  with np.errstate(all="ignore"):
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    want = [(p / q).astype(hd).astype(store) for p, q in ((a64, b64), (a64, a64), (a64, np.float64(3.0)))]
  for i, (g, w) in enumerate(zip(got, want)):
    assert _bits_equal(g, w), (i, [(p, q) for p, q in zip(g, w) if not _bits_equal(p, q)][:5])


@pytest.mark.parametrize("engine,threads", DIV_RUNS, ids=lambda v: str(v))
def test_quotient_is_the_product_of_a_reciprocal_source_only(engine, threads):
  # MUL(a, RECIPROCAL(b)) is the quotient; the RECIPROCAL is still computed for its other users; a product whose
  # operand reaches a RECIPROCAL through an identity op or a FUNCTION parameter stays a product (on both engines)
  a, b = _division_operands(np.float32, 4000)
  n = len(a)
  x, y = UOp.placeholder((n,), dtypes.float32), UOp.placeholder((n,), dtypes.float32)
  r = y.reciprocal()
  p0, p1 = x.param_like(0), y.param_like(1)
  f_div = UOp.maketuple(p0 * p1.reciprocal()).call(x, y).gettuple(0)
  f_mul = UOp.maketuple(p0 * p1).call(x, r).gettuple(0)
  deep = UOp.placeholder((2,) * 17, dtypes.float32)  # 17 dims, none mergeable: the program's numpy kernel
  dv = a[:2 ** 17].reshape((2,) * 17) if n >= 2 ** 17 else np.resize(a, (2,) * 17)
  outs = [x * r, r + 0.5, x * r.detach(), r.contiguous() * x, f_div, f_mul, deep.permute(tuple(range(16, -1, -1))) / deep]
  got = _run(outs, {x: a, y: b, deep: dv}, engine, threads)
  with np.errstate(all="ignore"):
    rb = np.float32(1) / b
    want = [a / b, rb + np.float32(0.5), a * rb, a * rb, a / b, a * rb, dv.transpose() / dv]
  for i, (g, w) in enumerate(zip(got, want)):
    assert _bits_equal(g, w), i


def _np_divmod(a, b, dt):
  """numpy's floor_divide and mod of values of dt (bfloat16 through ml_dtypes), in their storage type."""
  with np.errstate(all="ignore"):
    if dt is not dtypes.bfloat16: return [np.floor_divide(a, b), np.mod(a, b)]
    import ml_dtypes
    A, B = a.astype(ml_dtypes.bfloat16), b.astype(ml_dtypes.bfloat16)
    return [np.floor_divide(A, B).astype(np.float32), np.mod(A, B).astype(np.float32)]


def _divmod_operands(dt, n):
  """The cross product of {+-0, +-denormal, +-1, +-1.5, +-big, +-inf, NaN}, then random operands of random signs and
  exponents over dt's whole range (storage type values; bfloat16 ones exact)."""
  import ml_dtypes
  fi = ml_dtypes.finfo(ml_dtypes.bfloat16) if dt is dtypes.bfloat16 else np.finfo(dt.np)
  store = np.float32 if dt is dtypes.bfloat16 else dt.np
  sp = [0.0, float(fi.smallest_subnormal), 1.0, 1.5, float(fi.max) / 4, math.inf]
  sp = [s for v in sp for s in (v, -v)] + [math.nan]
  rng = np.random.default_rng(5)
  lo, hi = math.log2(float(fi.smallest_subnormal)), math.log2(float(fi.max))
  r = rng.choice([-1.0, 1.0], (2, n)) * 2.0 ** np.concatenate([rng.uniform(lo, hi, (2, n // 2)),
                                                                rng.uniform(-8, 8, (2, n - n // 2))], axis=1)
  with np.errstate(all="ignore"):
    a = np.concatenate([np.array([p for p in sp for _ in sp]), r[0]]).astype(store)
    b = np.concatenate([np.array([q for _ in sp for q in sp]), r[1]]).astype(store)
  if dt is dtypes.bfloat16: a, b = (np.asarray(v, ml_dtypes.bfloat16).astype(np.float32) for v in (a, b))
  return a, b


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("dt", [dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64], ids=lambda d: d.name)
def test_float_floordiv_and_mod_equal_numpy_everywhere(dt, engine):
  # % was a - b * (a // b): it equalled numpy's exact np.mod for 52-75% of random operands (a rounded product), and
  # at special values inf // 2 was inf (numpy, Python: NaN), zero remainders had a's sign (numpy: b's). Now numpy's
  # own divmod over an exact fmod (float64: exact for |a / b| < 2**99, README)
  a, b = _divmod_operands(dt, 20000)
  x, y = UOp.placeholder(a.shape, dt), UOp.placeholder(b.shape, dt)
  got = pygrad.evaluate([x // y, x % y], {x: a, y: b}, engine=engine)
  want = _np_divmod(a, b, dt)
  with np.errstate(all="ignore"):
    exact = np.ones(len(a), bool) if dt is not dtypes.float64 else ~(np.abs(a / b) >= 2.0 ** 99)
  for name, g, w in zip(["//", "%"], got, want):
    gn, wn = np.isnan(g.astype(np.float64)), np.isnan(w.astype(np.float64))
    ok = (gn & wn) | (g.view(f"u{g.itemsize}") == w.view(f"u{w.itemsize}")) | ~exact
    assert ok.all(), (name, [(p, q, r, s) for p, q, r, s, o in zip(a, b, g, w, ok) if not o][:6])
  if dt is dtypes.float64:  # past the exact range: the quotient is still numpy's, the remainder NaN (never a number
    assert _bits_equal(got[0], want[0])  # that is not numpy's: a - b * (a // b) gave -inf for 1.0 % 5e-324)
    g, w = got[1][~exact], want[1][~exact]  # (a remainder the steps still reduced there is exact: numpy's)
    assert np.isnan(g).sum() > 100 and (np.isnan(g) | (g.view(np.uint64) == w.view(np.uint64))).all()
    p, q = UOp.placeholder((2,), dt), UOp.placeholder((2,), dt)
    one = pygrad.evaluate(p % q, {p: np.array([1.0, 3 * 2.0 ** 900]), q: np.array([5e-324, 2.0 ** -100])},
                          engine=engine)
    assert np.isnan(one[0]) and one[1] == 0.0  # (the second reduces in its steps: exact)


@pytest.mark.parametrize("engine", ENGINES)
def test_relu_of_nan_is_nan_and_its_gradient_is_torchs(engine):
  # relu was (x > 0).where(x, 0): relu(NaN) was 0 where torch and JAX give NaN; its gradient at NaN is torch's 1
  # (JAX's is 0); relu(-0.0) stays +0.0 (JAX's; torch gives -0.0: they disagree)
  torch = pytest.importorskip("torch")
  v = np.array([-0.0, 0.0, -1.0, 2.0, np.nan, -np.inf, np.inf], np.float32)
  x = UOp.placeholder(v.shape, dtypes.float32)
  y = x.relu()
  g, = y.sum().gradient(x)
  got, gg = pygrad.evaluate([y, g], {x: v}, engine=engine)
  tx = torch.tensor(v, requires_grad=True)
  tg, = torch.autograd.grad(torch.relu(tx).sum(), tx)
  assert _bits_equal(got, np.array([0.0, 0.0, 0.0, 2.0, np.nan, 0.0, np.inf], np.float32))
  assert _bits_equal(gg, tg.numpy())


# ---- exp and the composites over it, against numpy (float64, or mpmath-accurate float32) and torch ----
def _ulp_err(got, want, npd):
  """|got - want| in units of the spacing of `want` rounded to npd (the denormal spacing below the normals)."""
  import ml_dtypes
  with np.errstate(all="ignore"):
    if npd is ml_dtypes.bfloat16:
      sp = 2.0 ** np.maximum(np.floor(np.log2(np.abs(want))) - 7, -133)
    else:
      sp = np.spacing(np.abs(want).astype(npd)).astype(np.float64)
    return np.abs(got.astype(np.float64) - want) / sp


@pytest.mark.parametrize("engine,threads", DIV_RUNS, ids=lambda v: str(v))
@pytest.mark.parametrize("dt,ulps", [(dtypes.float16, 0.5), (dtypes.bfloat16, 0.5), (dtypes.float32, 1.5),
                                     (dtypes.float64, 1.5)], ids=lambda v: getattr(v, "name", str(v)))
def test_exp_is_within_an_ulp_or_so_everywhere(dt, ulps, engine, threads):
  # exp was exp2(x * log2(e)): the product's rounding (|x| ulp of x) became up to 64 ulp of the result (median 7 in
  # float32, 62 in float64), through sigmoid, softmax and log_softmax too. Half types are rounded once from float32.
  import ml_dtypes
  rng = np.random.default_rng(2)
  npd = ml_dtypes.bfloat16 if dt is dtypes.bfloat16 else dt.np
  fi = ml_dtypes.finfo(npd) if dt is dtypes.bfloat16 else np.finfo(npd)
  top, low = math.log(float(fi.max)), math.log(float(fi.smallest_subnormal))
  special = [0.0, -0.0, 1.0, -1.0, 1e-30, -1e-30, top, top * (1 - 2 ** -10), low, low * (1 - 2 ** -10)]
  v = np.concatenate([rng.uniform(low * 1.02, top * 1.02, 20000), rng.uniform(-2, 2, 2000), special]).astype(npd)
  store = np.float32 if dt is dtypes.bfloat16 else dt.np
  x = UOp.placeholder(v.shape, dt)
  got = _run(x.exp(), {x: v.astype(store)}, engine, threads).astype(np.float64)
  with np.errstate(all="ignore"):
    want = np.exp(v.astype(np.float64))
    wt = want.astype(npd).astype(np.float64)  # its finiteness in dt
  if dt.itemsize == 2: ulps += 2.0 ** -12  # rounded once from float32: within a float32 ulp or two of 0.5
  fin = np.isfinite(wt)
  assert np.array_equal(np.isfinite(got), fin) and np.array_equal(got[~fin], wt[~fin])
  err = _ulp_err(got[fin], want[fin], npd)
  assert (err <= ulps).all(), (err.max(), v[fin][np.argmax(err)])
  # the special values exactly: e**+-inf, NaN, -0.0, integers (as float32)
  sv = np.array([math.inf, -math.inf, math.nan, -0.0, 0.0, -1e4, 1e4], store)
  s = UOp.placeholder(sv.shape, dt)
  i = UOp.placeholder((4,), dtypes.int32)
  gs, gi = _run([s.exp(), i.exp()], {s: sv, i: np.array([0, 1, -3, 80], np.int32)}, engine, threads)
  assert _bits_equal(gs, np.array([math.inf, 0.0, math.nan, 1.0, 1.0, 0.0, math.inf], store))
  assert gi.dtype == np.float32 and _bits_equal(gi, np.exp(np.array([0, 1, -3, 80], np.float64)).astype(np.float32))


@pytest.mark.parametrize("engine,threads", DIV_RUNS, ids=lambda v: str(v))
@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.float64], ids=lambda d: d.name)
def test_exp_gradient_is_torchs(dt, engine, threads):
  # the gradient of the reduced exp is exp2's (n comes from x detached), so it carried exp's error too (up to 63 ulp
  # from torch's in float32, 439 in float64); now within 3 ulp over the whole range (exp2's rule multiplies by ln2 and
  # the chain by 1/ln2: two roundings more than torch's grad * e**x), and torch's at +-inf and NaN
  torch = pytest.importorskip("torch")
  rng = np.random.default_rng(3)
  fi = np.finfo(dt.np)
  top, low = math.log(float(fi.max)), math.log(float(fi.smallest_subnormal))
  v = np.concatenate([rng.uniform(low * 1.02, top * 1.02, 5000), [top - 0.01, top - 0.3, low + 0.5, 0.0, -0.0,
                      math.inf, -math.inf, math.nan, -100.0, 100.0, 1e-30]]).astype(dt.np)
  x = UOp.placeholder(v.shape, dt)
  up = rng.uniform(0.5, 2, v.shape).astype(dt.np)  # an upstream gradient other than 1
  u = UOp.placeholder(v.shape, dt)
  g, = (x.exp() * u).sum().gradient(x)
  got = _run(g, {x: v, u: up}, engine, threads)
  tx = torch.tensor(v, requires_grad=True)
  want, = torch.autograd.grad((torch.exp(tx) * torch.tensor(up)).sum(), tx)
  want = want.numpy().astype(np.float64)
  # where torch's e**x overflowed under a finite product (x a little past log(max), upstream < 1) torch's is inf and
  # this one may be the finite derivative (SPEC 4 asks for torch's wherever it is finite)
  over = ~np.isfinite(want) & np.isfinite(v)
  fin = np.isfinite(want)
  assert np.array_equal(np.isfinite(got[~over]), fin[~over])
  assert np.array_equal(got[~fin & ~over], want[~fin & ~over], equal_nan=True)
  assert (got[over] > float(fi.max) / 4).all()
  err = _ulp_err(got[fin], want[fin], dt.np)
  assert (err <= 3.5).all(), (err.max(), v[fin][np.argmax(err)])


def _exact_sigmoid_tanh(v):
  """sigmoid, its derivative, tanh and its derivative of v in long double (80-bit on x86: exact enough to judge
  float64 by ulps; its range holds e**-2000), sigmoid's from e**-|x| so that nothing cancels or overflows."""
  lv = v.astype(np.longdouble)
  e = np.exp(-np.abs(lv))
  return np.where(lv < 0, e / (1 + e), 1 / (1 + e)), e / (1 + e) ** 2, np.tanh(lv), 1 / np.cosh(lv) ** 2


def _ulps_vs_exact(got, want, npd):
  sp = np.spacing(np.abs(want).astype(npd)).astype(np.longdouble)
  return (np.abs(got.astype(np.longdouble) - want) / sp).astype(np.float64)


@pytest.mark.parametrize("engine,threads", DIV_RUNS, ids=lambda v: str(v))
@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.float64], ids=lambda d: d.name)
def test_sigmoid_and_tanh_are_right_over_the_whole_range(dt, engine, threads):
  # sigmoid was 1 / (1 + e**-x): e**-x overflowed below x = -88.7 (float32; -709.8 in float64), so sigmoid was 0
  # where it is the denormal e**x, and its gradient inf / inf = NaN down there (10% of this range); tanh went
  # through sigmoid(2x): NaN gradients below x = -44 (-355), and 2 s - 1 lost 3 bits near |x| = 1/8 (15 ulp)
  torch = pytest.importorskip("torch")
  rng = np.random.default_rng(1)
  big = 110 if dt is dtypes.float32 else 760
  v = np.concatenate([rng.uniform(-big, big, 20000), rng.uniform(-3, 3, 20000), rng.uniform(-0.3, 0.3, 5000),
                      [-100, 100, -1000, 1000, 0, -0.0, 1e-30, -1e-30]]).astype(dt.np)
  x = UOp.placeholder(v.shape, dt)
  ys, yt = x.sigmoid(), x.tanh()
  gs, = ys.sum().gradient(x)
  gt, = yt.sum().gradient(x)
  got = _run([ys, gs, yt, gt], {x: v}, engine, threads)
  for name, g, w, bound in zip(["sigmoid", "d sigmoid", "tanh", "d tanh"], got, _exact_sigmoid_tanh(v), [3, 5, 4, 5]):
    assert not np.isnan(g).any(), name
    err = _ulps_vs_exact(g, w, dt.np)
    assert (err <= bound).all(), (name, err.max(), v[np.argmax(err)])
  # and torch's, where torch's own are accurate: its float32 sigmoid is 0 below -88.7 (it underflows as this one did),
  # and its derivatives s (1 - s) and 1 - t**2 cancel as s and t near 1 (0 past x = 17 or 9 in float32, where the
  # true ones are e**-|x| and 4 e**-2|x|): so values where torch's is not 0, derivatives where they pass 1/8
  tv = torch.tensor(v, requires_grad=True)
  ts, tt = torch.sigmoid(tv), torch.tanh(tv)
  tgs, = torch.autograd.grad(ts.sum(), tv)
  tgt, = torch.autograd.grad(tt.sum(), tv)
  for i, (g, w) in enumerate(zip(got, [ts, tgs, tt, tgt])):
    w = w.detach().numpy()
    use = (w != 0) if i % 2 == 0 else (w > 0.125)
    ok = np.isclose(g[use], w[use], rtol=4e-6 if dt is dtypes.float32 else 1e-14, atol=0)
    assert ok.all(), (i, v[use][~ok][:4], g[use][~ok][:4], w[use][~ok][:4])
  # the special values: +-inf, NaN
  sv = np.array([math.inf, -math.inf, math.nan], dt.np)
  s = UOp.placeholder(sv.shape, dt)
  (ds,), (dtn,) = s.sigmoid().sum().gradient(s), s.tanh().sum().gradient(s)
  r = _run([s.sigmoid(), ds, s.tanh(), dtn], {s: sv}, engine, threads)
  for g, w in zip(r, [[1.0, 0.0, math.nan], [0.0, 0.0, math.nan], [1.0, -1.0, math.nan], [0.0, 0.0, math.nan]]):
    assert _bits_equal(g, np.array(w, dt.np)), (g, w)


# ---- POW: C99's pow (numpy's np.power on arrays), float32 and the half formats rounded once from float64 ----
def _c99_pow(x: float, y: float) -> float:
  """pow(x, y) of C99 Annex F from Python's math.pow (which raises where C returns inf or NaN)."""
  odd = math.isfinite(y) and y == math.floor(y) and math.fmod(y, 2.0) != 0
  try: return math.pow(x, y)
  except OverflowError: return -math.inf if x < 0 and odd else math.inf
  except ValueError:
    if x == 0: return -math.inf if odd and math.copysign(1.0, x) < 0 else math.inf
    return math.nan


POW_SPECIAL = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 3.0, -3.0, 2.5, -2.5, 1e30, -1e30, 1e-30, -1e-30, math.inf,
               -math.inf, math.nan, 1 + 2 ** -12, 1 - 2 ** -12, 1e4, -1e4, 2.0 ** 20 + 1.0, 0.75, 1.5]


def _pow_operands(dt, n=20000):
  """The cross product of POW_SPECIAL, then random operands: bases of both signs over the dtype's exponent range
  with exponents in [-40, 40] (a fifth of them integers, so negative bases give values), and bases near 1 with
  exponents up to the overflow and underflow thresholds; as values of dt (bfloat16 ones exact, stored in float32)."""
  import ml_dtypes
  hd = ml_dtypes.bfloat16 if dt is dtypes.bfloat16 else dt.np
  fi = ml_dtypes.finfo(hd) if dt is dtypes.bfloat16 else np.finfo(hd)
  rng = np.random.default_rng(11)
  lo, hi = math.log2(float(fi.smallest_subnormal)), math.log2(float(fi.max))
  m = n // 2
  x = np.concatenate([rng.choice([-1.0, 1.0], m) * 2.0 ** rng.uniform(lo, hi, m), 1 + rng.uniform(-0.01, 0.01, n - m)])
  y = np.concatenate([rng.uniform(-40, 40, m), rng.uniform(-1, 1, n - m) * 200 * hi])
  y[::5] = np.round(y[::5])
  with np.errstate(all="ignore"):
    a = np.concatenate([np.array([p for p in POW_SPECIAL for _ in POW_SPECIAL]), x]).astype(hd)
    b = np.concatenate([np.array([q for _ in POW_SPECIAL for q in POW_SPECIAL]), y]).astype(hd)
  store = np.float32 if dt is dtypes.bfloat16 else dt.np
  want = np.array([_c99_pow(p, q) for p, q in zip(a.astype(np.float64).tolist(), b.astype(np.float64).tolist())])
  with np.errstate(all="ignore"):
    return a.astype(store), b.astype(store), want.astype(hd).astype(store)


def _ulps(g, w, npdt) -> np.ndarray:
  """|g - w| in units of w's last place (inf where one is NaN, infinite or a sign differs and the other is not)."""
  g64, w64 = g.astype(np.float64), w.astype(np.float64)
  same = (g64 == w64) | (np.isnan(g64) & np.isnan(w64))
  with np.errstate(all="ignore"):
    d = np.abs(g64 - w64) / np.spacing(np.abs(w).astype(npdt)).astype(np.float64)
  return np.where(same, 0.0, np.where(np.isfinite(d), d, np.inf))


@pytest.mark.parametrize("engine,threads", DIV_RUNS, ids=lambda v: str(v))
@pytest.mark.parametrize("dt", [dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64], ids=lambda d: d.name)
def test_float_pow_is_c99_pow(dt, engine, threads):
  # the VM took powf for float32 (up to an ulp off, as numpy's SIMD float32 pow: the engines agreed on 93% of random
  # quotients), and numpy's loop for a scalar exponent takes x ** 0.5 as sqrt and x ** -1 as 1 / x, so the numpy engine
  # gave (-inf) ** 0.5 = NaN and (-0.0) ** 0.5 = -0.0 where C99 pow (and the VM) give +inf and +0. Now float32 and the
  # half formats are float64's pow rounded once (on either engine); float64 is within an ulp of C's pow (numpy's SIMD
  # float64 pow is not correctly rounded)
  a, b, want = _pow_operands(dt)
  x, y = UOp.placeholder(a.shape, dt), UOp.placeholder(b.shape, dt)
  k = len(POW_SPECIAL) ** 2
  col = UOp.placeholder((len(POW_SPECIAL),), dt)
  sp = a[:k:len(POW_SPECIAL)]
  outs = [x ** y, x ** 0.5, x ** -1.0, x ** 2.0, x ** 0.0, 2.0 ** x] + [col ** float(e) for e in POW_SPECIAL]
  got = _run(outs, {x: a, y: b, col: sp}, engine, threads)
  npdt = np.float32 if dt is dtypes.bfloat16 else dt.np
  if dt is dtypes.bfloat16:
    import ml_dtypes
    npdt = ml_dtypes.bfloat16
  def ref(p, q):
    with np.errstate(all="ignore"):
      r = np.array([_c99_pow(s, t) for s, t in zip(np.asarray(p, np.float64).tolist(), np.broadcast_to(q, np.shape(p)).tolist())])
      return r.astype(npdt).astype(a.dtype)
  with np.errstate(all="ignore"):
    wants = [want, ref(a, 0.5), ref(a, -1.0), ref(a, 2.0), ref(a, 0.0), ref(np.full(a.shape, 2.0), a)] + \
            [ref(sp, float(np.asarray(e, npdt))) for e in POW_SPECIAL]
  for i, (g, w) in enumerate(zip(got, wants)):
    # special operands and special results exactly (signed zeros, infinities, NaN); every result within an ulp, and
    # float32 and the half formats correctly rounded but for a result within float64's error of a rounding boundary
    spec = ~np.isfinite(w.astype(np.float64)) | (w == 0)
    if i == 0 and dt is not dtypes.float64: spec[:k] = True
    assert _bits_equal(g[spec], w[spec]), (i, [(p, r, s) for p, r, s in zip(a[spec], g[spec], w[spec])
                                               if not _bits_equal(r, s)][:6])
    u = _ulps(g, w, npdt)
    assert u.max() <= 1, (i, u.max())
    if dt is not dtypes.float64: assert (u == 0).mean() >= 0.9999, (i, (u == 0).mean())


@pytest.mark.skipif(pygrad.core_name() != "c", reason="the C VM needs the C core")
@pytest.mark.parametrize("dt", [dtypes.float16, dtypes.bfloat16, dtypes.float32], ids=lambda d: d.name)
def test_float32_pow_is_the_same_on_both_engines(dt):
  # both engines round float64's pow once: the same bits (they agreed on 93% of random float32 powers)
  a, b, _ = _pow_operands(dt)
  x, y = UOp.placeholder(a.shape, dt), UOp.placeholder(b.shape, dt)
  outs = [x ** y, x ** 0.5, y ** x]
  for g, w in zip(_run(outs, {x: a, y: b}, "c", 2), pygrad.evaluate(outs, {x: a, y: b}, engine="numpy")):
    assert _bits_equal(g, w)


def _cos_operands(npdt, n=4000):
  """Arguments where cos is hardest: the floats nearest the zeros (k + 1/2) pi (and their neighbours) for k up to
  2**20, random ones over the exponent range, the ends of the threshold (1, 2**emax) and special values."""
  rng = np.random.default_rng(13)
  npdt = np.dtype(npdt).type
  fi = np.finfo(npdt)
  k = np.concatenate([np.arange(0, 64), rng.integers(0, 2 ** 20, n)]).astype(np.float64)
  z = ((k + 0.5) * math.pi).astype(npdt)
  z = np.concatenate([z, np.nextafter(z, npdt(np.inf)), np.nextafter(z, npdt(-np.inf))])
  r = (2.0 ** rng.uniform(-20, math.log2(float(fi.max)), n)).astype(npdt)
  sp = np.array([0.0, -0.0, 1.0, -1.0, float(np.nextafter(npdt(1), npdt(0))), 1e-30, float(fi.max), float(fi.max) / 2,
                 float(fi.max) / 3, float(fi.tiny), math.inf, -math.inf, math.nan], npdt)
  v = np.concatenate([z, -z, r, -r, sp])
  return v.astype(npdt)


@pytest.mark.parametrize("engine,threads", DIV_RUNS, ids=lambda v: str(v))
@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.float64], ids=lambda d: d.name)
def test_cos_is_accurate_near_its_zeros(dt, engine, threads):
  # cos was 1 - 2 sin(x/2)**2, which cancels where cos(x) ~ 0: off by up to 5,459 ulp (float32) and 1e5 ulp
  # (float64) of np.cos near (k + 1/2) pi; now within 4 ulp of the correctly rounded cos for |x| < 2**emax (the top
  # binade: within 2 ulp of 1), -0.0 -> 1, +-inf and NaN -> NaN
  v = _cos_operands(dt.np)
  x = UOp.placeholder(v.shape, dt)
  got = _run([x.cos()], {x: v}, engine, threads)[0]
  want = np.array([math.cos(t) if math.isfinite(t) else math.nan for t in v.astype(np.float64).tolist()]).astype(dt.np)
  top = (np.abs(v) >= np.finfo(dt.np).max / 2) & np.isfinite(v)
  u = _ulps(got, want, dt.np)
  assert u[~top].max() <= 4, [(p, q, r) for p, q, r, e in zip(v, got, want, u) if e > 4][:5]
  assert np.abs(got[top].astype(np.float64) - want[top]).max() <= 2 * np.finfo(dt.np).eps
  sp = np.array([0.0, -0.0, math.inf, -math.inf, math.nan], dt.np)
  s = UOp.placeholder(sp.shape, dt)
  assert _bits_equal(_run([s.cos()], {s: sp}, engine, threads)[0], np.array([1, 1, math.nan, math.nan, math.nan], dt.np))


@pytest.mark.skipif(pygrad.core_name() != "c", reason="the VM's float32 sine")
@pytest.mark.parametrize("threads", [1, 3])
def test_float32_sin_and_cos_are_accurate_up_to_2_pow_20(threads):
  # the VM's float32 vector sine covered |x| <= 8192; a tile with one larger argument ran whole in double (a 1.4x
  # slower fused expression on uniform(-100, 100) inputs, where |a*b+c| passes 8192). It now covers |x| <= 2**20:
  # within 2 ulp of the correctly rounded sin there (the floats nearest multiples of pi/2 included, where the
  # reduction cancels), and cos, sin(2x) / (2 sin x), within 4 ulp; arrays holding no larger argument take that path
  rng = np.random.default_rng(17)
  k = rng.integers(0, int(2 ** 20 / (math.pi / 2)), 20000).astype(np.float64)
  z = (k * (math.pi / 2)).astype(np.float32)
  v = np.concatenate([z, np.nextafter(z, np.float32(np.inf)), np.nextafter(z, np.float32(-np.inf)),
                      rng.uniform(-2 ** 20, 2 ** 20, 20000).astype(np.float32), np.float32([2 ** 20, 8192.5, -0.0])])
  v = np.concatenate([v, -v])
  v = v[np.abs(v) <= 2 ** 20]
  x = UOp.placeholder(v.shape, dtypes.float32)
  got_sin = _run([x.sin()], {x: v}, "c", threads)[0]
  want = np.array([math.sin(t) for t in v.astype(np.float64).tolist()]).astype(np.float32)
  u = _ulps(got_sin, want, np.float32)
  assert u.max() <= 2, [(p, q, r) for p, q, r, e in zip(v, got_sin, want, u) if e > 2][:5]
  assert (got_sin[v == 0] == 0).all() and (np.signbit(got_sin[v == 0]) == np.signbit(v[v == 0])).all()  # sin(+-0)
  h = v[np.abs(v) <= 2 ** 19]
  y = UOp.placeholder(h.shape, dtypes.float32)
  got_cos = _run([y.cos()], {y: h}, "c", threads)[0]
  want = np.array([math.cos(t) for t in h.astype(np.float64).tolist()]).astype(np.float32)
  assert _ulps(got_cos, want, np.float32).max() <= 4


@pytest.mark.parametrize("engine,threads", DIV_RUNS, ids=lambda v: str(v))
@pytest.mark.parametrize("dt", [dtypes.float16, dtypes.bfloat16], ids=lambda d: d.name)
def test_half_cos_is_accurate(dt, engine, threads):
  # the half formats compute in float32 and round after every op: within 3 ulp of the correctly rounded cos
  import ml_dtypes
  hd = np.float16 if dt is dtypes.float16 else ml_dtypes.bfloat16
  fi = np.finfo(np.float16) if dt is dtypes.float16 else ml_dtypes.finfo(ml_dtypes.bfloat16)
  rng = np.random.default_rng(17)
  v = np.concatenate([((np.arange(0, 2000) + 0.5) * math.pi), 2.0 ** rng.uniform(-10, math.log2(float(fi.max)) - 1.01, 4000)])
  v = np.concatenate([v, -v]).astype(hd)
  store = np.float16 if dt is dtypes.float16 else np.float32
  x = UOp.placeholder(v.shape, dt)
  got = _run([x.cos()], {x: v.astype(store)}, engine, threads)[0]
  want = np.cos(v.astype(np.float64)).astype(hd)
  u = _ulps(got.astype(hd), want, hd)
  assert u.max() <= 3, [(p, q, r) for p, q, r, e in zip(v, got, want, u) if e > 3][:5]


@pytest.mark.parametrize("engine", ENGINES)
def test_cos_gradients_equal_torchs(engine):
  # the value is detached where it is sin(2x) / (2 sin x), whose own derivative cancels near x = k pi; the gradient
  # is -sin(x) within a few ulp there and at large |x|, and orders 2 and 3 agree with torch's
  torch = pytest.importorskip("torch")
  k = np.arange(1, 200, dtype=np.float64)
  v = np.concatenate([k * math.pi, (k + 0.5) * math.pi, [0.0, -0.0, 0.3, -1.0, 1.0, 1e5, -3e7, 1e15, 1e100]])
  x = UOp.placeholder(v.shape, dtypes.float64)
  y = x.cos()
  g1, = y.sum().gradient(x)
  g2, = g1.sum().gradient(x)
  g3, = g2.sum().gradient(x)
  got = pygrad.evaluate([g1, g2, g3], {x: v}, engine=engine)
  tx = torch.tensor(v, requires_grad=True)
  t1, = torch.autograd.grad(torch.cos(tx).sum(), tx, create_graph=True)
  t2, = torch.autograd.grad(t1.sum(), tx, create_graph=True)
  t3, = torch.autograd.grad(t2.sum(), tx)
  assert _ulps(got[0], t1.detach().numpy(), np.float64).max() <= 4  # -sin(x) near its zeros: relative accuracy
  for g, t in zip(got[1:], [t2, t3]):
    np.testing.assert_allclose(g, t.detach().numpy(), rtol=1e-12, atol=4e-16)


def _zero_product_rows(npdt, n, rows, rng):
  """Rows of n entries whose partial products overflow (up to 255, or 1e300 in float64) with zeros of either sign
  placed early, midway or last; a row with an inf beside its zero, one with a NaN, and rows of entries near 1 whose
  product is finite and has no zero."""
  big = 1e300 if npdt == np.float64 else 255.0
  a = rng.uniform(big / 2, big, (rows, n)) * rng.choice([-1.0, 1.0], (rows, n))
  for r in range(rows - 4):
    for c in rng.choice(n, 1 + r % 3, replace=False) if r % 4 else [n - 1]:
      a[r, c] = rng.choice([0.0, -0.0])
  a[rows - 4, [3, n // 2]] = [np.inf, 0.0]
  a[rows - 3, [n - 2, 5]] = [np.nan, 0.0]
  a[rows - 2:] = rng.uniform(0.999, 1.001, (2, n)) * rng.choice([-1.0, 1.0], (2, n))
  return a


def _exact_product(a64, axis):
  """The product of float64 entries as exact arithmetic rounds it at a zero: NaN with a NaN entry or an inf beside a
  zero, else +-0 (the sign parity) where a zero is; elsewhere (rows near 1 here) the float64 product."""
  zero, nonfinite = (a64 == 0).any(axis), (~np.isfinite(a64)).any(axis)
  neg = np.logical_xor.reduce(np.signbit(a64), axis=axis)
  with np.errstate(all="ignore"): p = np.prod(a64, axis=axis)
  return np.where(zero, np.where(nonfinite, np.nan, np.where(neg, -0.0, 0.0)), p), zero


@pytest.mark.parametrize("engine,threads", DIV_RUNS, ids=lambda v: str(v))
@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.float64, dtypes.float16], ids=lambda d: d.name)
def test_a_float_product_with_a_zero_entry_is_zero_where_the_others_overflow(dt, engine, threads):
  # the VM's lanes (and its running product between tiles) and numpy's loop overflowed to inf before they met the
  # zero: inf * 0 gave NaN where the product is 0 (fuzzpeers seed 20027, 1,023 float32 entries up to 255); an inf
  # or NaN entry beside the zero still gives NaN. Rows (one output per row), columns (an output per element, the
  # running product), every axis, a strided source, a fused expression, long rows over many tiles.
  rng = np.random.default_rng(20027)
  npdt = np.float32 if dt is dtypes.float16 else dt.np  # float16 entries: values up to 255 stay exact
  a = _zero_product_rows(npdt, 1023, 12, rng).astype(dt.np)
  b = _zero_product_rows(npdt, 9000, 8, rng).astype(dt.np)
  x, y = UOp.placeholder(a.shape, dt), UOp.placeholder(b.shape, dt)
  xt = UOp.placeholder(a.T.shape, dt)
  x3 = UOp.placeholder((4, 3, 1023), dt)
  outs = [x.prod(1), xt.prod(0), xt.permute((1, 0)).prod(1), y.prod(1), (x * -1.0).prod(1), x3.prod((0, 2)),
          x.prod(1, keepdim=True).reshape(12)]
  got = _run(outs, {x: a, y: b, xt: np.ascontiguousarray(a.T), x3: a.reshape(4, 3, 1023)}, engine, threads)
  a64, b64 = a.astype(np.float64), b.astype(np.float64)
  wants = [_exact_product(a64, 1), _exact_product(a64, 1), _exact_product(a64, 1), _exact_product(b64, 1),
           _exact_product(a64 * -1.0, 1), _exact_product(a64.reshape(4, 3, 1023).transpose(1, 0, 2).reshape(3, -1), 1),
           _exact_product(a64, 1)]
  for i, (g, (w, zero)) in enumerate(zip(got, wants)):
    g = np.asarray(g, np.float64).reshape(w.shape)
    assert _bits_equal(g[zero], w[zero]), (i, g[zero], w[zero])
    np.testing.assert_allclose(g[~zero], w[~zero], rtol=2e-2 if dt is dtypes.float16 else 1e-5, err_msg=str(i))
