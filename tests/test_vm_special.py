"""Signed zeros, NaN and infinities through every float kernel of the C interpreter against the numpy evaluator, bit
for bit (any NaN matches any NaN; a zero's sign must match), at sizes that run only the tail (5), the SIMD main loop
and its tail (67) and several tiles (2053). Every pair of special values meets in the binary ops; reductions see
rows of only -0.0, rows with NaN and rows with both infinities. sin(-0.0) is -0.0 on every float type."""
from __future__ import annotations
import numpy as np
import pytest
from pygrad import UOp, Ops, dtypes

program = pytest.importorskip("pygrad.engine.program", reason="the compiled interpreter is not built",
                              exc_type=ImportError)
from pygrad.engine import numpy_eval, vmlib  # noqa: E402
from pygrad.engine.numpy_eval import round_bfloat16  # noqa: E402

FLOATS = (dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64)
SIZES = (5, 67, 2053)
SPECIAL = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 0.5, -0.5, 2.5, -2.5, 3.0, -100.0, 1e-41, -1e-41, 6e4]
APPROX = {Ops.SIN, Ops.EXP2, Ops.LOG2, Ops.POW}


def _arr(vals, dt) -> np.ndarray:
  v = np.asarray(vals, dtype=np.float64)
  if dt is dtypes.float64: return v
  with np.errstate(over="ignore"):
    v = v.astype(np.float32)
    if dt is dtypes.float16: return v.astype(np.float16)
  return round_bfloat16(v) if dt is dtypes.bfloat16 else v


def _pairs(n: int, dt):
  """a and b of length n in which every ordered pair of special values occurs (n >= 16**2: all of them)."""
  k = len(SPECIAL)
  i = np.arange(n)
  return _arr(np.array(SPECIAL)[i % k], dt), _arr(np.array(SPECIAL)[(i // k + i) % k], dt)


def same_bits(got: np.ndarray, want: np.ndarray, approx_mask=None, tol: float = 0.0) -> None:
  """Equal values, NaN where the reference has NaN, and the same sign on zeros (and everywhere exact unless the
  element is in approx_mask, where a relative tol applies to finite non-zero results)."""
  g, w = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
  assert got.dtype == want.dtype and g.shape == w.shape
  assert np.array_equal(np.isnan(g), np.isnan(w)), (g[np.isnan(g) != np.isnan(w)], w[np.isnan(g) != np.isnan(w)])
  ok = ~np.isnan(w)
  exact = ok if approx_mask is None else ok & (~approx_mask | ~np.isfinite(w) | (w == 0))
  bad = exact & ((g != w) | (np.signbit(g) != np.signbit(w)))
  assert not bad.any(), f"differ at {np.flatnonzero(bad)[:8]}: got {g[bad][:8]}, want {w[bad][:8]}"
  if approx_mask is not None:
    rest = ok & ~exact
    np.testing.assert_allclose(g[rest], w[rest], rtol=tol)


def _check(out, inputs, approx=False, special_in=None, dt=None):
  want = numpy_eval.evaluate([out], inputs)[0]
  got = program.evaluate_c([out], inputs)[0]
  mask = None
  if approx:  # polynomial kernels: exact on special inputs and special results, within a few ulp elsewhere
    mask = ~special_in
  tol = {dtypes.float16: 2e-3, dtypes.bfloat16: 1.6e-2, dtypes.float64: 1e-12}.get(dt, 3e-6)
  same_bits(got, want, mask, tol)


def _special_mask(v) -> np.ndarray:
  v = np.asarray(v, dtype=np.float64)
  return np.isnan(v) | np.isinf(v) | (v == 0)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("op", [Ops.RECIPROCAL, Ops.SQRT, Ops.SIN, Ops.LOG2, Ops.EXP2, Ops.TRUNC],
                         ids=lambda o: o.name)
@pytest.mark.parametrize("dt", FLOATS, ids=lambda d: d.name)
def test_unary_special_values(dt, op, n):
  a, _ = _pairs(n, dt)
  x = UOp.placeholder((n,), dt, "x")
  _check(UOp(op, None, (x,)), {x: a}, approx=op in APPROX, special_in=_special_mask(a), dt=dt)


@pytest.mark.parametrize("n", (67, 2053))
@pytest.mark.parametrize("op", [Ops.ADD, Ops.MUL, Ops.MAX, Ops.POW, Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ],
                         ids=lambda o: o.name)
@pytest.mark.parametrize("dt", FLOATS, ids=lambda d: d.name)
def test_binary_special_pairs(dt, op, n):
  a, b = _pairs(n, dt)
  x, y = UOp.placeholder((n,), dt, "x"), UOp.placeholder((n,), dt, "y")
  out = UOp(op, None, (x, y))
  if out.dtype is dtypes.bool:
    assert np.array_equal(program.evaluate_c([out], {x: a, y: b})[0], numpy_eval.evaluate([out], {x: a, y: b})[0])
    return
  _check(out, {x: a, y: b}, approx=op in APPROX, special_in=_special_mask(a) | _special_mask(b), dt=dt)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dt", FLOATS, ids=lambda d: d.name)
def test_composites_keep_signs(dt, n):
  """neg (MUL by -1), subtraction, abs, relu, where and casts between float types."""
  a, b = _pairs(n, dt)
  x, y = UOp.placeholder((n,), dt, "x"), UOp.placeholder((n,), dt, "y")
  outs = [-x, x - y, x.abs(), x.relu(), (x < y).where(x, y), x * 0.0, x + (-0.0)]
  outs += [x.cast(t) for t in FLOATS if t is not dt]
  for o in outs: _check(o, {x: a, y: b})


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dt", FLOATS, ids=lambda d: d.name)
def test_reductions_of_special_rows(dt, n):
  rows = [[-0.0] * n, [0.0] * n, [np.nan] + [1.0] * (n - 1), [np.inf] * (n - 1) + [-np.inf], [-np.inf] * n,
          [1.0] * (n - 1) + [np.nan], [-0.0] * (n - 1) + [0.0]]
  v = _arr(rows, dt)
  x = UOp.placeholder(v.shape, dt, "x")
  for o in (x.sum(1), x.max(1), x.sum(0), x.max(0), (x * x).sum(1), (-x).max(1)): _check(o, {x: v})


@pytest.mark.parametrize("isa", [0, 1, 2])
@pytest.mark.parametrize("dt", FLOATS, ids=lambda d: d.name)
def test_sin_of_negative_zero_is_negative_zero(dt, isa):
  if vmlib.isa_name(isa) is None: pytest.skip("no such clone in this build")
  try: vmlib.set_isa(isa)
  except ValueError: pytest.skip(f"this CPU does not run {vmlib.isa_name(isa)}")
  try:
    for n in SIZES:
      x = UOp.placeholder((n,), dt, "x")
      got = program.evaluate_c([x.sin()], {x: _arr([-0.0] * n, dt)})[0]
      assert (got == 0).all() and np.signbit(got).all(), (n, got[:4])
      inv = program.evaluate_c([x.sin().reciprocal()], {x: _arr([-0.0] * n, dt)})[0]
      assert (inv == -np.inf).all()
  finally:
    vmlib.set_isa(-1)


@pytest.mark.parametrize("isa", [0, 1, 2])
@pytest.mark.parametrize("dt,it", [(dtypes.float16, dtypes.int16), (dtypes.bfloat16, dtypes.int16),
                                   (dtypes.float32, dtypes.int32)], ids=lambda d: d.name)
def test_log2_of_a_negative_is_the_machines_invalid_nan(dt, it, isa):
  """log2 of a negative number is the NaN this machine's invalid operations make (x86: sign bit set), as libm's and
  so the numpy engine's is: a BITCAST of it gives the same integers on both engines (it was +NaN on the C engine,
  found by the differential fuzzer as int16 32704 against -64 on bfloat16)."""
  if vmlib.isa_name(isa) is None: pytest.skip("no such clone in this build")
  try: vmlib.set_isa(isa)
  except ValueError: pytest.skip(f"this CPU does not run {vmlib.isa_name(isa)}")
  zero = np.zeros(1, np.float32)
  with np.errstate(invalid="ignore"): machine = (zero / zero).view(np.int32)[0]  # the CPU's invalid-op NaN
  try:
    for n in SIZES:
      x = UOp.placeholder((n,), dt, "x")
      out = x.log2().bitcast(it)
      inputs = {x: _arr([-1.0, -0.5, -np.inf, -1e-41] * n, dt)[:n]}
      want = numpy_eval.evaluate([out], inputs)[0]
      got = program.evaluate_c([out], inputs)[0]
      assert np.array_equal(got, want), (n, got[:4], want[:4])
      assert (np.signbit(got) == (machine < 0)).all()
  finally:
    vmlib.set_isa(-1)
