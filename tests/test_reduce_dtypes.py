"""The dtype and accumulation of sum, prod and mean (README "Defined semantics"): bools and narrow ints widen
(tinygrad's sum_acc_dtype), float16/bfloat16 accumulate in float32 and round once, and every engine and thread
count gives the same bits. A naive float16 running sum stalls at 2048 (2048 + 1 rounds to 2048), a bfloat16 one
at 256."""
from __future__ import annotations
import numpy as np
import pytest
import pygrad
from pygrad import UOp, dtypes

RUNS = [("numpy", 1)] + ([("c", 1), ("c", 3)] if pygrad.core_name() == "c" else [])


def _eval(outs, inputs, engine, threads):
  old = pygrad.get_num_threads()
  pygrad.set_num_threads(threads)
  try: return pygrad.evaluate(outs, inputs, engine=engine)
  finally: pygrad.set_num_threads(old)


@pytest.mark.parametrize("engine,threads", RUNS)
def test_int_and_bool_sums_count_past_the_operand_range(engine, threads):
  b, u8, i16 = UOp.placeholder((5000,), dtypes.bool), UOp.placeholder((70, 50), dtypes.uint8), \
    UOp.placeholder((3, 4000), dtypes.int16)
  bv = np.arange(5000) % 3 == 0
  uv = (np.arange(3500) % 256).astype(np.uint8).reshape(70, 50)
  iv = np.full((3, 4000), 30000, np.int16)
  outs = [b.sum(), (b & b).sum(), u8.sum(), u8.sum(axis=0), (u8 + 1).sum(axis=1, keepdim=True), i16.sum(axis=1),
          b.cast(dtypes.int8).sum(), u8.max(), b.mean(), u8.mean(axis=1)]
  got = _eval(outs, {b: bv, u8: uv, i16: iv}, engine, threads)
  want = [np.int32(bv.sum()), np.int32(bv.sum()), np.uint32(uv.sum()), uv.sum(axis=0).astype(np.uint32),
          (uv + np.uint8(1)).sum(axis=1, keepdims=True).astype(np.uint32), iv.sum(axis=1).astype(np.int32),
          np.int32(bv.sum()), uv.max(), np.float32(bv.mean()), uv.mean(axis=1).astype(np.float32)]
  for i, (g, w) in enumerate(zip(got, want)):
    w = np.asarray(w)
    assert g.dtype == w.dtype and g.shape == w.shape, (i, g.dtype, w.dtype, g.shape, w.shape)
    np.testing.assert_allclose(g, w, rtol=1e-6, err_msg=f"output {i}")


@pytest.mark.parametrize("engine,threads", RUNS)
@pytest.mark.parametrize("dt", [dtypes.float16, dtypes.bfloat16], ids=lambda d: d.name)
def test_half_sums_accumulate_in_float32(dt, engine, threads):
  n = 5120  # n, 2n and 4n are exact in float16 and bfloat16
  x = UOp.placeholder((4, n), dt)
  xv = np.ones((4, n), np.float32 if dt is dtypes.bfloat16 else np.float16)
  outs = [x.sum(), x.sum(axis=1), (x * 2).sum(axis=1), x.T.sum(axis=0), x.mean(), x.mean(axis=1),
          x.expand((4, n)).reshape((2, 2 * n)).sum(axis=1)]
  got = _eval(outs, {x: xv}, engine, threads)
  store = np.float32 if dt is dtypes.bfloat16 else np.float16
  want = [4 * n, [n] * 4, [2 * n] * 4, [n] * 4, 1.0, [1.0] * 4, [2 * n] * 2]
  for i, (g, w) in enumerate(zip(got, want)):
    assert g.dtype == store, (i, g.dtype)
    assert g.tolist() == w, (i, g.tolist()[:4], w)


@pytest.mark.parametrize("engine,threads", RUNS)
def test_half_mean_of_many_elements_does_not_overflow(engine, threads):
  # the mean of 100,000 float16 ones was NaN: the float16 sum overflowed to inf and 100000 itself is inf in float16
  x = UOp.placeholder((100_000,), dtypes.float16)
  m = x.mean()
  assert m.dtype is dtypes.float16
  assert _eval([m], {x: np.ones(100_000, np.float16)}, engine, threads)[0].tolist() == 1.0


def test_gradients_through_widened_sums():
  # a float's gradient is unchanged; the int/bool branch (its CAST to int32) passes none
  x = UOp.placeholder((6,), dtypes.float32)
  h = UOp.placeholder((6,), dtypes.float16)
  loss = x.sum() * (x > 0).sum().cast(dtypes.float32) + h.sum().cast(dtypes.float32) + h.mean().cast(dtypes.float32)
  gx, gh = loss.gradient(x, h)
  assert gx.dtype is dtypes.float32 and gh.dtype is dtypes.float16
  xv = np.array([-1, 2, 3, -4, 5, 0], np.float32)
  for engine in [e for e, _ in RUNS[:2]]:
    vx, vh = pygrad.evaluate([gx, gh], {x: xv, h: np.ones(6, np.float16)}, engine=engine)
    assert vx.tolist() == [3.0] * 6
    assert vh.tolist() == [np.float16(1 + np.float32(1 / 6)).item()] * 6
  with pytest.raises(TypeError):
    UOp.placeholder((3,), dtypes.int8).sum().cast(dtypes.float32).gradient(UOp.placeholder((3,), dtypes.int8))


@pytest.mark.parametrize("engine,threads", RUNS)
@pytest.mark.parametrize("dt", [dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64], ids=lambda d: d.name)
def test_max_and_min_of_signed_zeros_are_order_free(dt, engine, threads):
  # IEEE 754-2019 maximum/minimum (JAX's): +0 is above -0. numpy picks the first operand's zero in float16 and the
  # second's in float32/float64, torch and tinygrad the first's, and their reductions' sign depends on the length;
  # the VM's lanes and the numpy engine's np.maximum.reduce disagreed on mixed zeros (float16, 32 values)
  store = np.float32 if dt is dtypes.bfloat16 else dt.np
  a, b = np.array([0.0, -0.0, 0.0, -0.0, 1.0, np.nan], store), np.array([-0.0, 0.0, 0.0, -0.0, 1.0, 0.0], store)
  x, y = UOp.placeholder((6,), dt), UOp.placeholder((6,), dt)
  rng = np.random.default_rng(1)
  zs = [np.where(rng.random(n) < 0.5, -0.0, 0.0).astype(store) for n in (2, 31, 32, 33, 64, 1000)]
  zs += [np.full(40, -0.0, store), np.full(40, 0.0, store)]
  ps = [UOp.placeholder(z.shape, dt) for z in zs]
  outs = [x.maximum(y), x.minimum(y), y.maximum(x), y.minimum(x)] + [p.max() for p in ps] + [p.min() for p in ps] + \
    [p.reshape((1,) + p.shape).expand((3,) + p.shape).max(axis=1) for p in ps]
  got = _eval(outs, {x: a, y: b, **dict(zip(ps, zs))}, engine, threads)
  sign = lambda v: np.signbit(np.asarray(v)).tolist()  # noqa: E731
  assert sign(got[0]) == sign(got[2]) == [False, False, False, True, False, False]
  assert sign(got[1]) == sign(got[3]) == [True, True, False, True, False, False]
  assert np.isnan(got[0][5]) and np.isnan(got[1][5]) and np.isnan(got[2][5]) and np.isnan(got[3][5])
  k = len(zs)
  for i, z in enumerate(zs):
    anypos, anyneg = bool((~np.signbit(z)).any()), bool(np.signbit(z).any())
    assert sign(got[4 + i]) == (not anypos) and sign(got[4 + k + i]) == anyneg, (i, len(z))
    assert sign(got[4 + 2 * k + i]) == [not anypos] * 3, (i, len(z))
