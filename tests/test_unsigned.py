"""Unsigned integers wrap modulo 2**bits as numpy and torch do: `x - y`, `-x`, `c - x`, and min (a reduction or
elementwise), sign and abs are defined for every unsigned dtype, on both engines and both cores, equal to numpy bit
for bit. They raised "CONST: -1 out of range" (the negation multiplied by -1) and min raised TypeError."""
from __future__ import annotations
import numpy as np
import pytest
import pygrad
from pygrad import UOp, dtypes

UINTS = (dtypes.uint8, dtypes.uint16, dtypes.uint32, dtypes.uint64)
try:
  import pygrad.engine.program  # noqa: F401
  ENGINES = ("numpy", "c")
except ImportError:  # the compiled interpreter is not built: the numpy engine alone
  ENGINES = ("numpy",)


def _vals(dt, shape, seed):
  info = np.iinfo(dt.numpy)
  rng = np.random.default_rng(seed)
  v = rng.integers(0, info.max, size=shape, dtype=dt.numpy, endpoint=True)
  v.reshape(-1)[:4] = [0, 1, info.max, info.max - 1]
  return v


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("dt", UINTS)
def test_unsigned_arithmetic_wraps_like_numpy(dt, engine):
  x, y = UOp.placeholder((5, 7), dt, "x"), UOp.placeholder((5, 7), dt, "y")
  a, b = _vals(dt, (5, 7), 0), _vals(dt, (5, 7), 1)
  outs = [x - y, -x, x.neg(), 3 - x, x - 3, (x - y).sum(axis=1), x.min(), x.min(axis=0), x.min(axis=1, keepdim=True),
          x.minimum(y), x.sign(), x.abs()]
  with np.errstate(over="ignore"):
    three = np.asarray(3, dt.numpy)
    want = [a - b, -a, -a, three - a, a - three, (a - b).sum(axis=1, dtype=np.uint32 if dt.itemsize < 4 else dt.numpy), a.min(), a.min(axis=0),
            a.min(axis=1, keepdims=True), np.minimum(a, b), np.sign(a), np.abs(a)]
  got = pygrad.evaluate(outs, {x: a, y: b}, engine=engine)
  for i, (g, w) in enumerate(zip(got, want)):
    assert g.dtype == w.dtype and g.shape == w.shape, (i, g.dtype, w.dtype, g.shape, w.shape)
    np.testing.assert_array_equal(g, w, err_msg=f"output {i}")


@pytest.mark.parametrize("engine", ENGINES)
def test_bool_min_is_all(engine):
  x = UOp.placeholder((3, 4), dtypes.bool, "x")
  a = np.array([[1, 1, 1, 1], [1, 0, 1, 1], [0, 0, 0, 0]], bool)
  got = pygrad.evaluate([x.min(axis=1), x.min(), x.min(axis=0)], {x: a}, engine=engine)
  for g, w in zip(got, [a.min(axis=1), a.min(), a.min(axis=0)]): np.testing.assert_array_equal(g, w)


def test_unsigned_engines_agree_on_large_tiles():
  """Sizes that run the C kernels' vector main loops and their tails."""
  if "c" not in ENGINES: pytest.skip("the compiled interpreter is not built")
  for dt in UINTS:
    x, y = UOp.placeholder((4099,), dt, "x"), UOp.placeholder((4099,), dt, "y")
    a, b = _vals(dt, (4099,), 2), _vals(dt, (4099,), 3)
    outs = [x - y, -x, x.min(), (x - y).min()]
    c = pygrad.evaluate(outs, {x: a, y: b}, engine="c")
    n = pygrad.evaluate(outs, {x: a, y: b}, engine="numpy")
    for g, w in zip(c, n): np.testing.assert_array_equal(g, w)
    with np.errstate(over="ignore"):
      np.testing.assert_array_equal(c[0], a - b)
      assert c[3] == (a - b).min()
