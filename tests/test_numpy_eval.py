"""The numpy reference evaluator against direct numpy (and, for the C-semantics edge cases, against Python-int
references written independently of the evaluator)."""
import math, struct
import numpy as np
import pytest
import pygrad
from pygrad import UOp, Ops, dtypes
from pygrad.dtype import VALUE_DTYPES
from pygrad.engine.numpy_eval import round_bfloat16

SIZES = (0, 1, 1023, 1024, 1025)
FLOATS = (dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64)
INTS = (dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64, dtypes.uint8, dtypes.uint16, dtypes.uint32,
        dtypes.uint64)
HALVES = (dtypes.float16, dtypes.bfloat16)


def ev(out, inputs=None):
  return pygrad.evaluate(out, inputs or {}, engine="numpy")


def fin(r, dt):
  """A float32 computation rounded to dt (the evaluator's documented rule for float16/bfloat16)."""
  if dt is dtypes.float16:
    with np.errstate(over="ignore"):
      return np.asarray(r, np.float32).astype(np.float16)
  if dt is dtypes.bfloat16: return round_bfloat16(np.asarray(r, np.float32))
  return np.asarray(r, dt.numpy)


def mk(vals, dt):
  """Values as an input array of dt (float16/bfloat16 through float32)."""
  return fin(np.asarray(vals, np.float64).astype(np.float32), dt) if dt in HALVES else np.asarray(vals).astype(dt.numpy)


def wide(x, dt): return x.astype(np.float32) if dt in HALVES else x


def rnd(dt, n, rng, small=False):
  """n random values of dt: floats mixing signs and magnitudes, ints over the full range (or small ones)."""
  if dtypes.is_bool(dt): return rng.integers(0, 2, n).astype(bool)
  if dtypes.is_float(dt):
    x = (rng.standard_normal(n) * 4).astype(np.float32)
    return fin(x, dt) if dt in HALVES else x.astype(dt.numpy)
  info = np.iinfo(dt.numpy)
  lo, hi = (max(info.min, -20), min(info.max, 20)) if small else (info.min, info.max)
  return rng.integers(lo, hi, n, dtype=dt.numpy, endpoint=True)


def same(got, want, dt):
  got, want = np.asarray(got), np.asarray(want)
  assert got.shape == want.shape, (got.shape, want.shape)
  assert got.dtype == dt.numpy, (got.dtype, dt)
  if dtypes.is_float(dt): np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64),
                                                     rtol=2e-6 if dt.itemsize >= 4 else 0, atol=0, equal_nan=True)
  else: np.testing.assert_array_equal(got, want)


# ---- Python-int references (independent of the evaluator) ----
def wrap(v: int, dt) -> int:
  n = 8 * dt.itemsize
  v &= (1 << n) - 1
  return v - (1 << n) if dtypes.is_int(dt) and not dtypes.is_unsigned(dt) and v >> (n - 1) else v


def tdiv(a, b): return 0 if b == 0 else (abs(a) // abs(b)) * (1 if (a < 0) == (b < 0) else -1)


def ipow(a, b, dt):
  if b < 0: return 1 if a == 1 else ((-1 if b % 2 else 1) if a == -1 else 0)
  return pow(a, b, 1 << (8 * dt.itemsize))


def shr(a, b, n):
  if b < 0: return 0
  if b >= n: return -1 if a < 0 else 0
  return a >> b


INT_REF = {
  Ops.ADD: lambda a, b, dt: a + b, Ops.MUL: lambda a, b, dt: a * b, Ops.MAX: lambda a, b, dt: max(a, b),
  Ops.POW: ipow, Ops.IDIV: lambda a, b, dt: tdiv(a, b),
  Ops.MOD: lambda a, b, dt: 0 if b == 0 else a - b * tdiv(a, b),
  Ops.AND: lambda a, b, dt: a & b, Ops.OR: lambda a, b, dt: a | b, Ops.XOR: lambda a, b, dt: a ^ b,
  Ops.SHL: lambda a, b, dt: 0 if b < 0 or b >= 8 * dt.itemsize else a << b,
  Ops.SHR: lambda a, b, dt: shr(a, b, 8 * dt.itemsize),
  Ops.CMPLT: lambda a, b, dt: a < b, Ops.CMPNE: lambda a, b, dt: a != b, Ops.CMPEQ: lambda a, b, dt: a == b,
}
FLOAT_REF = {
  Ops.ADD: np.add, Ops.MUL: np.multiply, Ops.MAX: np.maximum, Ops.POW: np.power,
  Ops.CMPLT: np.less, Ops.CMPNE: np.not_equal, Ops.CMPEQ: np.equal,
}
BOOL_REF = {
  Ops.ADD: np.logical_or, Ops.MUL: np.logical_and, Ops.MAX: np.logical_or, Ops.POW: lambda a, b: a | ~b,
  Ops.AND: np.logical_and, Ops.OR: np.logical_or, Ops.XOR: np.logical_xor,
  Ops.CMPLT: lambda a, b: ~a & b, Ops.CMPNE: np.not_equal, Ops.CMPEQ: np.equal,
}


def int_ref(op, a, b, dt):
  out = [INT_REF[op](int(x), int(y), dt) for x, y in zip(a.ravel().tolist(), b.ravel().tolist())]
  if op in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ): return np.array(out, bool).reshape(a.shape)
  return np.array([wrap(v, dt) for v in out], dt.numpy).reshape(a.shape)


def accepts(op, dt) -> bool:
  if op in (Ops.IDIV, Ops.MOD, Ops.SHL, Ops.SHR): return dtypes.is_int(dt)
  if op in (Ops.AND, Ops.OR, Ops.XOR): return not dtypes.is_float(dt)
  return True


def binary_ref(op, a, b, dt):
  if dtypes.is_int(dt): return int_ref(op, np.broadcast_to(a, np.broadcast(a, b).shape),
                                       np.broadcast_to(b, np.broadcast(a, b).shape), dt)
  if dtypes.is_bool(dt): return BOOL_REF[op](a, b)
  with np.errstate(all="ignore"):
    r = FLOAT_REF[op](wide(a, dt), wide(b, dt))
  return r if op in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ) else fin(r, dt)


# ---- elementwise ----
BINARY = (Ops.ADD, Ops.MUL, Ops.MAX, Ops.POW, Ops.IDIV, Ops.MOD, Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR,
          Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ)


@pytest.mark.parametrize("op,dt", [(o, d) for o in BINARY for d in VALUE_DTYPES if accepts(o, d)],
                         ids=lambda x: x.name)
def test_binary(op, dt):
  rng = np.random.default_rng(int(op) * 100 + dt.id)
  small = op in (Ops.POW, Ops.SHL, Ops.SHR)
  for n in SIZES:
    x, y = UOp.placeholder((n,), dt, "x"), UOp.placeholder((n,), dt, "y")
    a, b = rnd(dt, n, rng), rnd(dt, n, rng, small=small)
    if op is Ops.POW and dtypes.is_float(dt): a = np.abs(a)
    same(ev(UOp(op, None, (x, y)), {x: a, y: b}), binary_ref(op, a, b, dt), UOp(op, None, (x, y)).dtype)


@pytest.mark.parametrize("op", BINARY, ids=lambda o: o.name)
def test_binary_scalar_broadcast(op):
  for dt in (dtypes.int32, dtypes.float32, dtypes.uint8):
    if not accepts(op, dt): continue
    rng = np.random.default_rng(int(op))
    x, s = UOp.placeholder((1025,), dt, "x"), UOp.placeholder((), dt, "s")
    a, b = rnd(dt, 1025, rng, small=True), rnd(dt, 1, rng, small=True).reshape(())
    if dtypes.is_float(dt): a, b = np.abs(a), np.abs(b)
    for u, want in ((UOp(op, None, (x, s)), binary_ref(op, a, b, dt)),
                    (UOp(op, None, (s, x)), binary_ref(op, b, a, dt))):
      assert u.shape == (1025,)
      same(ev(u, {x: a, s: b}), want, u.dtype)


UNARY = {Ops.RECIPROCAL: np.reciprocal, Ops.SQRT: np.sqrt, Ops.SIN: np.sin, Ops.LOG2: np.log2, Ops.EXP2: np.exp2,
         Ops.TRUNC: np.trunc}


@pytest.mark.parametrize("op", list(UNARY), ids=lambda o: o.name)
@pytest.mark.parametrize("dt", FLOATS, ids=lambda d: d.name)
def test_unary_float(op, dt):
  rng = np.random.default_rng(int(op) + 7 * dt.id)
  for n in SIZES:
    x = UOp.placeholder((n,), dt, "x")
    a = rnd(dt, n, rng)
    with np.errstate(all="ignore"):
      want = fin(UNARY[op](wide(a, dt)), dt)
    same(ev(UOp(op, None, (x,)), {x: a}), want, dt)


@pytest.mark.parametrize("dt", INTS, ids=lambda d: d.name)
def test_trunc_int_is_identity(dt):
  x = UOp.placeholder((1025,), dt, "x")
  a = rnd(dt, 1025, np.random.default_rng(dt.id))
  same(ev(x.trunc(), {x: a}), a, dt)


@pytest.mark.parametrize("dt", VALUE_DTYPES, ids=lambda d: d.name)
def test_where(dt):
  rng = np.random.default_rng(dt.id)
  for n in SIZES:
    c, x, y = UOp.placeholder((n,), dtypes.bool), UOp.placeholder((n,), dt), UOp.placeholder((n,), dt)
    cv, a, b = rnd(dtypes.bool, n, rng), rnd(dt, n, rng), rnd(dt, n, rng)
    same(ev(UOp(Ops.WHERE, None, (c, x, y)), {c: cv, x: a, y: b}), np.where(cv, a, b), dt)
  s = UOp.placeholder((), dt)
  c, x = UOp.placeholder((5,), dtypes.bool), UOp.placeholder((5,), dt)
  cv, a, b = rnd(dtypes.bool, 5, rng), rnd(dt, 5, rng), rnd(dt, 1, rng).reshape(())
  same(ev(UOp(Ops.WHERE, None, (c, x, s)), {c: cv, x: a, s: b}), np.where(cv, a, b), dt)


def cast_ref(v, src, dst):
  """One element cast with the documented semantics, from a Python scalar."""
  if dtypes.is_bool(dst): return v != 0
  if dtypes.is_float(src) and dtypes.is_int(dst):
    if math.isnan(v): return 0
    info = np.iinfo(dst.numpy)
    if math.isinf(v): return info.max if v > 0 else info.min
    return min(max(math.trunc(v), info.min), info.max)
  if dtypes.is_int(dst): return wrap(int(v), dst)
  return v


@pytest.mark.parametrize("src", VALUE_DTYPES, ids=lambda d: d.name)
def test_cast_every_pair(src):
  rng = np.random.default_rng(src.id)
  for dst in VALUE_DTYPES:
    for n in (0, 1025):
      x = UOp.placeholder((n,), src, "x")
      a = rnd(src, n, rng)
      if dtypes.is_float(src) and n: a[:8] = mk(np.array([np.nan, np.inf, -np.inf, 1e30, -1e30, 0.5, -0.5, -0.0]), src)
      got = ev(x.cast(dst), {x: a})
      if dtypes.is_float(dst):
        want = a.astype(np.float32) if dst in HALVES else a.astype(dst.numpy)
        want = fin(want, dst)
      else:
        want = np.array([cast_ref(v, src, dst) for v in a.tolist()], dst.numpy)
      same(got, want, dst)


def test_cast_edge_cases():
  x = UOp.placeholder((9,), dtypes.float32)
  a = np.array([np.nan, np.inf, -np.inf, 3e9, -3e9, 2.9, -2.9, 255.5, -1.0], np.float32)
  np.testing.assert_array_equal(ev(x.cast(dtypes.int32), {x: a}),
                                [0, 2**31 - 1, -2**31, 2**31 - 1, -2**31, 2, -2, 255, -1])
  np.testing.assert_array_equal(ev(x.cast(dtypes.uint8), {x: a}), [0, 255, 0, 255, 0, 2, 0, 255, 0])
  np.testing.assert_array_equal(ev(x.cast(dtypes.int64), {x: a})[:5], [0, 2**63 - 1, -2**63, 3000000000, -3000000000])
  np.testing.assert_array_equal(ev(x.cast(dtypes.uint64), {x: a})[:3], [0, 2**64 - 1, 0])
  np.testing.assert_array_equal(ev(x.cast(dtypes.bool), {x: a}), [True] * 9)
  i = UOp.placeholder((3,), dtypes.int32)
  np.testing.assert_array_equal(ev(i.cast(dtypes.int8), {i: np.array([200, -129, 256], np.int32)}), [-56, 127, 0])


@pytest.mark.parametrize("src", VALUE_DTYPES, ids=lambda d: d.name)
def test_bitcast(src):
  rng = np.random.default_rng(src.id)
  for dst in VALUE_DTYPES:
    if dst.itemsize != src.itemsize: continue
    x = UOp.placeholder((1025,), src, "x")
    a = rnd(src, 1025, rng)
    raw = (a.view(np.uint32) >> 16).astype(np.uint16) if src is dtypes.bfloat16 else a
    if dst is dtypes.bfloat16: want = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    elif dst is dtypes.bool: want = raw.view(np.uint8) != 0
    else: want = raw.view(dst.numpy)
    got = ev(x.bitcast(dst), {x: a})
    assert got.dtype == dst.numpy
    np.testing.assert_array_equal(got.view(np.uint8), np.asarray(want).view(np.uint8))


# ---- the documented C-semantics edge cases ----
def test_int_division_edge_cases():
  for dt in (dtypes.int8, dtypes.int32, dtypes.int64):
    lo = int(np.iinfo(dt.numpy).min)
    x, y = UOp.placeholder((8,), dt), UOp.placeholder((8,), dt)
    a = np.array([7, -7, 7, -7, 5, lo, lo, 0], dt.numpy)
    b = np.array([2, 2, -2, -2, 0, -1, 1, 0], dt.numpy)
    # the IR's IDIV and MOD truncate (C); the `//` and `%` methods floor (Python, numpy, torch, tinygrad)
    np.testing.assert_array_equal(ev(UOp(Ops.IDIV, None, (x, y)), {x: a, y: b}), [3, -3, -3, 3, 0, lo, lo, 0])
    np.testing.assert_array_equal(ev(UOp(Ops.MOD, None, (x, y)), {x: a, y: b}), [1, -1, 1, -1, 0, 0, 0, 0])
    np.testing.assert_array_equal(ev(x // y, {x: a, y: b}), [3, -4, -4, 3, 0, lo, lo, 0])
    np.testing.assert_array_equal(ev(x % y, {x: a, y: b}), [1, 1, -1, -1, 0, 0, 0, 0])
  u = UOp.placeholder((3,), dtypes.uint32)
  v = np.array([7, 0, 2**32 - 1], np.uint32)
  np.testing.assert_array_equal(ev(u // u.const_like(0), {u: v}), [0, 0, 0])
  np.testing.assert_array_equal(ev(u % u.const_like(0), {u: v}), [0, 0, 0])


def test_shift_edge_cases():
  x, c = UOp.placeholder((6,), dtypes.int8), UOp.placeholder((6,), dtypes.int8)
  a = np.array([1, -1, -128, 64, -5, 5], np.int8)
  cnt = np.array([7, 8, 9, 1, 100, -1], np.int8)
  np.testing.assert_array_equal(ev(x << c, {x: a, c: cnt}), [-128, 0, 0, -128, 0, 0])
  np.testing.assert_array_equal(ev(x >> c, {x: a, c: cnt}), [0, -1, -1, 32, -1, 0])
  neg5, counts = np.array([-5] * 6, np.int8), np.array([-1, -8, 0, 1, 2, 7], np.int8)
  np.testing.assert_array_equal(ev(x >> c, {x: neg5, c: counts}),
                                [0, 0, -5, -3, -2, -1])
  u, k = UOp.placeholder((4,), dtypes.uint32), UOp.placeholder((4,), dtypes.uint32)
  ucounts = np.array([31, 32, 33, 0], np.uint32)
  np.testing.assert_array_equal(ev(u >> k, {u: np.array([2**32 - 1] * 4, np.uint32), k: ucounts}),
                                [1, 0, 0, 2**32 - 1])
  np.testing.assert_array_equal(ev(u << k, {u: np.array([1] * 4, np.uint32), k: np.array([31, 32, 33, 0], np.uint32)}),
                                [2**31, 0, 0, 1])


def test_overflow_wraps():
  x = UOp.placeholder((3,), dtypes.int32)
  big = np.array([2**31 - 1, -2**31, 65536], np.int32)
  np.testing.assert_array_equal(ev(x + x.const_like(1), {x: big}), [-2**31, -2**31 + 1, 65537])
  np.testing.assert_array_equal(ev(x * x, {x: big}), [1, 0, 0])
  np.testing.assert_array_equal(ev(x.pow(x.const_like(2)), {x: big}), [1, 0, 0])


def test_int_pow_edge_cases():
  x, y = UOp.placeholder((9,), dtypes.int32), UOp.placeholder((9,), dtypes.int32)
  a = np.array([1, -1, -1, 2, 0, 0, 3, -2, 5], np.int32)
  b = np.array([-5, -3, -4, -1, 0, -1, 0, 3, 2], np.int32)
  np.testing.assert_array_equal(ev(x.pow(y), {x: a, y: b}), [1, -1, 1, 0, 1, 0, 1, -8, 25])


def test_nan_semantics():
  x, y = UOp.placeholder((4,), dtypes.float32), UOp.placeholder((4,), dtypes.float32)
  a = np.array([np.nan, 1.0, np.nan, 2.0], np.float32)
  b = np.array([1.0, np.nan, np.nan, 1.0], np.float32)
  np.testing.assert_array_equal(np.isnan(ev(x.maximum(y), {x: a, y: b})), [True, True, True, False])
  assert ev(x < y, {x: a, y: b}).tolist() == [False, False, False, False]
  assert ev(x.eq(y), {x: a, y: b}).tolist() == [False, False, False, False]
  assert ev(x.ne(y), {x: a, y: b}).tolist() == [True, True, True, True]
  r = ev([x.reciprocal(), x.sqrt(), x.log2()], {x: np.array([0.0, -1.0, 0.0, -0.0], np.float32)})
  assert r[0][0] == np.inf and r[0][3] == -np.inf and np.isnan(r[1][1]) and r[2][0] == -np.inf


def test_float16_rounds_through_float32():
  x = UOp.placeholder((2,), dtypes.float16)
  one = np.array([1.0, 2048.0], np.float16)
  # 1 + 2**-11 is a tie in float16 and rounds to even (1.0); 2048 + 1 rounds to 2048
  np.testing.assert_array_equal(ev(x + x.const_like(2.0 ** -11), {x: one}), np.array([1.0, 2048.0], np.float16))
  np.testing.assert_array_equal(ev(x + x.const_like(1.5 * 2.0 ** -11), {x: one}),
                                np.array([1.0009766, 2048.0], np.float16))
  np.testing.assert_array_equal(ev(x * x.const_like(100.0), {x: np.array([1000.0, -1000.0], np.float16)}),
                                [np.inf, -np.inf])


def _f32(bits: int) -> float: return struct.unpack("<f", struct.pack("<I", bits))[0]


def _bf16_nearest(f: float) -> float:
  """The bfloat16 nearest to float32 f, ties to even, from the two candidates around |f| compared exactly (the
  one past the largest finite bfloat16 counts as 2**128, IEEE's overflow threshold)."""
  if f == 0 or math.isinf(f): return f
  lo = struct.unpack("<I", struct.pack("<f", abs(f)))[0] & 0xFFFF0000
  hi = lo + 0x10000
  vl, vh = _f32(lo), 2.0 ** 128 if hi == 0x7F800000 else _f32(hi)
  dl, dh = abs(f) - vl, vh - abs(f)
  r = vl if dl < dh or (dl == dh and not (lo >> 16) & 1) else (math.inf if hi == 0x7F800000 else vh)
  return math.copysign(r, f)


def test_round_bfloat16():
  rng = np.random.default_rng(0)
  vals = np.concatenate([(rng.standard_normal(3000) * 10.0 ** rng.integers(-30, 30, 3000)).astype(np.float32),
                         np.array([1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8, 3.3895314e38, -3.3895314e38, 0.0, -0.0,
                                   1e-40, np.inf, -np.inf], np.float32)])
  got = round_bfloat16(vals)
  assert got.dtype == np.float32 and not (got.view(np.uint32) & 0xFFFF).any()
  for f, g in zip(vals.tolist(), got.tolist()):
    assert g == _bf16_nearest(f) and math.copysign(1, g) == math.copysign(1, f), (f, g)
  assert np.isnan(round_bfloat16(np.float32(np.nan)))
  x = UOp.placeholder((3,), dtypes.bfloat16)
  inp = np.array([1.0, 1.0 + 2.0 ** -7, 256.0], np.float32)
  np.testing.assert_array_equal(ev(x + x.const_like(2.0 ** -8), {x: inp}), [1.0, 1.0 + 2.0 ** -6, 256.0])
  # an unrounded float32 bound to a bfloat16 input is rounded on entry
  unrounded = np.array([1.0 + 2.0 ** -9, 3.0, 1.0], np.float32)
  np.testing.assert_array_equal(ev(x.contiguous(), {x: unrounded}), [1.0, 3.0, 1.0])


# ---- reduce ----
@pytest.mark.parametrize("rop", (Ops.ADD, Ops.MAX, Ops.MUL), ids=lambda o: o.name)
@pytest.mark.parametrize("dt", VALUE_DTYPES, ids=lambda d: d.name)
def test_reduce(rop, dt):
  rng = np.random.default_rng(dt.id + int(rop))
  for shape, axes in (((0,), (0,)), ((1,), (0,)), ((1023,), (0,)), ((1024,), (0,)), ((1025,), (0,)),
                      ((3, 0, 2), (1,)), ((0, 4), (0,)), ((7, 5, 3), (0, 2)), ((4, 6), ()), ((5, 4), (0, 1))):
    x = UOp.placeholder(shape, dt, "x")
    a = rnd(dt, math.prod(shape), rng, small=rop is Ops.MUL).reshape(shape)
    if dtypes.is_float(dt) and rop is Ops.MUL: a = mk(np.sign(a) * (1 + np.abs(a.astype(np.float64)) % 0.05), dt)
    w = wide(a, dt)
    if rop is Ops.ADD: want = np.sum(w, axis=axes, keepdims=True, dtype=w.dtype)
    elif rop is Ops.MUL: want = np.prod(w, axis=axes, keepdims=True, dtype=w.dtype)
    else:
      lowest = -np.inf if dtypes.is_float(dt) else (False if dtypes.is_bool(dt) else np.iinfo(dt.numpy).min)
      want = np.max(w, axis=axes, keepdims=True, initial=lowest)
    u = x.r(rop, axes)
    assert u.shape == tuple(1 if i in axes else s for i, s in enumerate(shape))
    got = ev(u, {x: a})
    if dtypes.is_float(dt) and dt.itemsize >= 4:
      np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * (np.abs(w).sum() if w.size else 0))
      assert got.dtype == dt.numpy and got.shape == want.shape
    else: same(got, fin(want, dt), dt)


def test_reduce_max_nan_and_empty():
  x = UOp.placeholder((2, 3), dtypes.float32)
  a = np.array([[1, np.nan, 2], [1, 2, 3]], np.float32)
  np.testing.assert_array_equal(ev(x.max(1), {x: a}), [np.nan, 3])
  e = UOp.placeholder((0, 2), dtypes.int16)
  np.testing.assert_array_equal(ev(e.max(0), {e: np.zeros((0, 2), np.int16)}), [-32768, -32768])
  np.testing.assert_array_equal(ev(e.sum(0), {e: np.zeros((0, 2), np.int16)}), [0, 0])
  np.testing.assert_array_equal(ev(e.prod(0), {e: np.zeros((0, 2), np.int16)}), [1, 1])


# ---- movement and identities ----
MOVES = [
  (lambda u: u.reshape(4, 3, 2), lambda a: a.reshape(4, 3, 2)),
  (lambda u: u.reshape(24), lambda a: a.reshape(24)),
  (lambda u: u.reshape(2, 1, 3, 4).expand(2, 5, 3, 4), lambda a: np.broadcast_to(a.reshape(2, 1, 3, 4), (2, 5, 3, 4))),
  (lambda u: u.pad(((1, 2), (0, 0), (3, 1))), lambda a: np.pad(a, ((1, 2), (0, 0), (3, 1)))),
  (lambda u: u.shrink(((1, 2), (0, 2), (1, 4))), lambda a: a[1:2, 0:2, 1:4]),
  (lambda u: u.shrink(((0, 2), (1, 1), (0, 4))), lambda a: a[:, 1:1, :]),
  (lambda u: u.permute(2, 0, 1), lambda a: a.transpose(2, 0, 1)),
  (lambda u: u.flip(0, 2), lambda a: a[::-1, :, ::-1]),
  (lambda u: u.flip(1).permute(1, 2, 0).reshape(12, 2).pad(((0, 1), (2, 0))).shrink(((3, 13), (1, 4))),
   lambda a: np.pad(a[:, ::-1].transpose(1, 2, 0).reshape(12, 2), ((0, 1), (2, 0)))[3:13, 1:4]),
  (lambda u: u.contiguous().contiguous_backward().detach(), lambda a: a),
]


@pytest.mark.parametrize("i", range(len(MOVES)))
@pytest.mark.parametrize("dt", (dtypes.float32, dtypes.bool, dtypes.int64, dtypes.bfloat16, dtypes.float16,
                                dtypes.uint8),
                         ids=lambda d: d.name)
def test_movement(i, dt):
  f, ref = MOVES[i]
  x = UOp.placeholder((2, 3, 4), dt, "x")
  a = rnd(dt, 24, np.random.default_rng(i), small=True).reshape(2, 3, 4)
  got = ev(f(x), {x: a})
  same(got, ref(a), dt)
  assert got.flags.writeable


def test_movement_zero_size():
  x = UOp.placeholder((0, 3), dtypes.float32)
  a = np.zeros((0, 3), np.float32)
  assert ev(x.pad(((1, 1), (0, 0))), {x: a}).tolist() == [[0, 0, 0], [0, 0, 0]]
  assert ev(x.permute(1, 0).reshape(3, 0, 1).expand(3, 0, 4), {x: a}).shape == (3, 0, 4)


def test_noncontiguous_inputs():
  base = np.arange(60, dtype=np.float32).reshape(6, 10)
  x = UOp.placeholder((10, 6), dtypes.float32)
  y = UOp.placeholder((3, 5), dtypes.float32)
  for xv, yv in ((base.T, base[::2, 1::2]), (base[:, ::-1].T, base[1::2, ::2])):
    assert not xv.flags.c_contiguous and not yv.flags.c_contiguous
    out = ev([x * 2.0, (x.sum(1) + 1.0), y.exp2(), y.T @ y], {x: xv, y: yv})
    np.testing.assert_array_equal(out[0], xv * 2)
    np.testing.assert_array_equal(out[1], xv.sum(1) + 1)
    np.testing.assert_allclose(out[2], np.exp2(yv), rtol=1e-6)
    np.testing.assert_allclose(out[3], yv.T @ yv, rtol=1e-6)
  v = UOp.placeholder((4,), dtypes.int16)
  iv = np.arange(16, dtype=np.int16)[::4]
  np.testing.assert_array_equal(ev(v.bitcast(dtypes.float16).bitcast(dtypes.int16), {v: iv}), iv)


def test_const_and_variable():
  for dt, v in ((dtypes.float32, 0.1), (dtypes.float16, 0.1), (dtypes.bfloat16, 0.1), (dtypes.int8, -5),
                (dtypes.uint64, 2**64 - 1), (dtypes.bool, True), (dtypes.float64, 0.1)):
    got = ev(UOp.const(v, dt))
    assert got.shape == () and got.dtype == dt.numpy
    assert got == (fin(np.float32(v), dt) if dt in HALVES else np.asarray(v, dt.numpy))
  n = UOp.variable("n", 0, 10, dtypes.int32)
  x = UOp.placeholder((3,), dtypes.int32)
  np.testing.assert_array_equal(ev(x * n, {x: np.arange(3, dtype=np.int32), n: 4}), [0, 4, 8])
  f = UOp.variable("f", -1.0, 1.0)
  assert ev(f + 1.0, {f: 0.5}) == 1.5
  assert ev(x.const_like(7), {}).tolist() == [7, 7, 7]


def test_deep_chain_evaluates():
  x = UOp.placeholder((2,), dtypes.float32)
  c = UOp.const(1.0)
  y = x
  for _ in range(100_000): y = UOp(Ops.ADD, None, (y, c))
  np.testing.assert_array_equal(ev(y, {x: np.array([0.0, 1.0], np.float32)}), [100000.0, 100001.0])


# ---- structure ----
def test_function():
  a, b = UOp.placeholder((3,), dtypes.float32, "a"), UOp.placeholder((3,), dtypes.float32, "b")
  p0, p1 = a.param_like(0), a.param_like(1)
  fn = UOp.maketuple(p0 * p1, p0 + p1.sum()).call(a, b, name="f")
  av, bv = np.array([1.0, 2.0, 3.0], np.float32), np.array([4.0, 5.0, 6.0], np.float32)
  both = ev(fn, {a: av, b: bv})
  assert type(both) is tuple and len(both) == 2
  np.testing.assert_array_equal(both[0], av * bv)
  r = ev([fn.gettuple(0), fn.gettuple(1) * 2.0], {a: av, b: bv})
  np.testing.assert_array_equal(r[0], av * bv)
  np.testing.assert_array_equal(r[1], (av + bv.sum()) * 2)
  # the same body called on other args; a FUNCTION inside a FUNCTION body
  fn2 = UOp.maketuple(p0 * p1, p0 + p1.sum()).call(b, b)
  inner = (p0 * 3.0).call(p0)
  outer = UOp.maketuple(inner.gettuple(0) + p1).call(a, b)
  r = ev([fn2.gettuple(0), outer.gettuple(0)], {a: av, b: bv})
  np.testing.assert_array_equal(r[0], bv * bv)
  np.testing.assert_array_equal(r[1], av * 3 + bv)


def test_function_unused_param_and_int_dtype():
  a, b = UOp.placeholder((2,), dtypes.int32), UOp.placeholder((4,), dtypes.uint8)
  fn = (a.param_like(0) // 2).call(a, b)
  np.testing.assert_array_equal(ev(fn.gettuple(0), {a: np.array([-7, 9], np.int32), b: np.zeros(4, np.uint8)}), [-4, 4])  # // floors


def test_param_outside_function_raises():
  x = UOp.placeholder((2,), dtypes.float32)
  with pytest.raises(ValueError, match="PARAM"):
    ev(x.param_like(0) + 1.0)


def test_custom_kernel_multi_output():
  x, s, p = UOp.placeholder((4,), dtypes.float32, "x"), UOp.placeholder((4,), dtypes.float32, "s"), \
    UOp.placeholder((4,), dtypes.float32, "p")
  calls = []

  def kern(xa, sa, pa):
    calls.append(1)
    assert xa.flags.writeable and sa.flags.writeable
    sa[...] = xa + 1
    pa[...] = xa * 10
    xa[...] = -1  # writes to an input buffer stay inside the kernel's copy

  ax, as_, ap = UOp.custom_kernel(x, s, p, fxn=kern)
  assert ax.op is Ops.AFTER and ax.src[1].op is Ops.CALL
  xv = np.arange(4, dtype=np.float32)
  sv, pv = np.zeros(4, np.float32), np.zeros(4, np.float32)
  r = ev([as_, ap * 2.0, x, ax], {x: xv, s: sv, p: pv})
  np.testing.assert_array_equal(r[0], xv + 1)
  np.testing.assert_array_equal(r[1], xv * 20)
  np.testing.assert_array_equal(r[2], xv)
  np.testing.assert_array_equal(r[3], [-1] * 4)
  assert calls == [1]
  assert xv.tolist() == [0, 1, 2, 3] and not sv.any() and not pv.any()


def test_multi_and_copy():
  x = UOp.placeholder((4, 6), dtypes.float32, "x")
  xv = np.arange(24, dtype=np.float32).reshape(4, 6)
  devs = ("CPU", "CPU:1")
  sh0, sh1, rep = x.shard(devs, 0), x.shard(devs, 1), x.shard(devs, None)
  assert sh0.device == devs and sh0.shape == (4, 6)
  c = x.copy_to_device("CPU:1")
  assert c.device == "CPU:1"
  r = ev([sh0, sh1, rep, c, (sh0 * 2.0), (c + 1.0)], {x: xv})
  for v in r[:4]: np.testing.assert_array_equal(v, xv)
  np.testing.assert_array_equal(r[4], xv * 2)
  np.testing.assert_array_equal(r[5], xv + 1)
  a, b = UOp.placeholder((2, 3), dtypes.int32, device="CPU"), UOp.placeholder((1, 3), dtypes.int32, device="CPU:1")
  m = UOp(Ops.MULTI, None, (a, b), 0)
  av, bv = np.ones((2, 3), np.int32), np.full((1, 3), 2, np.int32)
  np.testing.assert_array_equal(ev(m, {a: av, b: bv}), np.concatenate([av, bv]))


def test_tuple_sink_noop_gettuple():
  x = UOp.placeholder((2,), dtypes.float32)
  xv = np.array([1.0, 2.0], np.float32)
  t = UOp.maketuple(x, x * 2.0)
  r = ev([t, t.gettuple(1), UOp.sink(x, t), UOp(Ops.NOOP)], {x: xv})
  assert type(r[0]) is tuple and len(r[0]) == 2
  np.testing.assert_array_equal(r[1], xv * 2)
  assert type(r[2]) is tuple and type(r[2][1]) is tuple
  assert r[3] is None


# ---- inputs and the engine front ----
def test_outputs_are_owned():
  x = UOp.placeholder((3,), dtypes.float32)
  xv = np.ones(3, np.float32)
  r = ev([x, x.reshape(3, 1).expand(3, 2), x, x.contiguous()], {x: xv})
  for v in r:
    assert v.flags.writeable and not np.shares_memory(v, xv)
  assert not np.shares_memory(r[0], r[2])


def test_input_errors():
  x = UOp.placeholder((2, 3), dtypes.float32, "weights")
  with pytest.raises(ValueError, match="weights.*not bound|missing.*weights"):
    ev(x + 1.0, {})
  with pytest.raises(ValueError, match="weights.*shape"):
    ev(x + 1.0, {x: np.zeros((3, 2), np.float32)})
  with pytest.raises(ValueError, match="weights.*dtype"):
    ev(x + 1.0, {x: np.zeros((2, 3), np.float64)})
  unnamed = UOp.placeholder((2,), dtypes.int8)
  with pytest.raises(ValueError, match=f"BUFFER.*{unnamed.arg[0]}"):
    ev(unnamed, {})
  with pytest.raises(ValueError, match="out of range"):
    ev(unnamed, {unnamed: [1, 300]})
  with pytest.raises(ValueError, match="int8"):
    ev(unnamed, {unnamed: [1.5, 2.0]})
  n = UOp.variable("nsteps", 1, 8, dtypes.int32)
  with pytest.raises(ValueError, match="nsteps"):
    ev(n + 1, {})
  with pytest.raises(ValueError, match="nsteps"):
    ev(n + 1, {n: 9})
  with pytest.raises(ValueError, match="nsteps"):
    ev(n + 1, {n: np.array([1, 2], np.int32)})
  with pytest.raises(ValueError, match="not an input"):
    ev(x, {x + 1.0: np.zeros((2, 3), np.float32)})
  # lists and scalars of a fitting kind are converted
  np.testing.assert_array_equal(ev(x, {x: [[1, 2, 3], [4, 5, 6]]}), np.arange(1, 7, dtype=np.float32).reshape(2, 3))
  assert ev(n + 1, {n: 3}) == 4


def test_engine_front():
  x = UOp.placeholder((2,), dtypes.float32)
  xv = np.array([1.0, 2.0], np.float32)
  one = pygrad.evaluate(x + 1.0, {x: xv}, engine="numpy")
  assert isinstance(one, np.ndarray)
  many = pygrad.evaluate((x + 1.0, x * 2.0), {x: xv}, engine="numpy")
  assert type(many) is list and len(many) == 2
  with pytest.raises(ValueError, match="engine"):
    pygrad.evaluate(x, {x: xv}, engine="gpu")
  np.testing.assert_array_equal(pygrad.evaluate(x * 3.0, {x: xv}), xv * 3)
  from pygrad.engine import default_engine
  assert default_engine() in ("numpy", "c")
  if pygrad.core_name() == "python": assert default_engine() == "numpy"
