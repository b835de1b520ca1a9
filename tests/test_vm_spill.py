"""Splitting a fused group whose register file would pass lower.REGFILE_BUDGET (issue 10 item 1): the kernel is cut
into kernels over the same index space and tile size, the values one part needs from an earlier part carried in
arena buffers. Every part fits the budget, the program stays in C, and its results are the unsplit kernel's, bit
for bit (and the numpy engine's within float tolerance). The budget is made small here so that small graphs split
(`python bench/bench_deep_chain.py --regfile-budget 16777216` splits the 1,000,000-deep chain's gradient)."""
from __future__ import annotations
import numpy as np
import pytest
from hypothesis import given
import pygrad
from pygrad import UOp, dtypes

program = pytest.importorskip("pygrad.engine.program", reason="the compiled interpreter is not built",
                              exc_type=ImportError)
from pygrad.engine import numpy_eval, lower, kcache  # noqa: E402
from pygrad.engine.flatten import flatten  # noqa: E402
from pygrad.engine.planner import Planner, Loop  # noqa: E402
from fuzzgraphs import FUZZ, recipes, build, input_values, same_values, exact_graph  # noqa: E402

F16, F32, F64 = dtypes.float16, dtypes.float32, dtypes.float64
SCALAR = 64 + 16  # register-file bytes of a scalar register


def _chain_gradient(depth: int, shape=(), dt=F32):
  x = UOp.placeholder(shape, dt, "x")
  y = x
  for _ in range(depth): y = y.sin()
  return x, (y if shape == () else y.sum()).gradient(x)[0]


def _both(outs, ins, budget, monkeypatch):
  """The program at the default budget and at `budget`."""
  whole = pygrad.compile(outs, ins)
  monkeypatch.setattr(lower, "REGFILE_BUDGET", budget)
  return whole, pygrad.compile(outs, ins)


def _same_bits(a, b):
  for x, y in zip(a, b): assert np.asarray(x).tobytes() == np.asarray(y).tobytes()


def test_deep_chain_gradient_is_split_within_the_budget(monkeypatch):
  """A 3000-deep chain's gradient keeps ~3000 values live in one kernel (240 KB of scalar registers); at a budget of
  300 registers it becomes kernels of at most that, with the same value."""
  x, g = _chain_gradient(3000)
  budget = 128 + 300 * SCALAR
  whole, split = _both([g], [x], budget, monkeypatch)
  assert whole.stats["kernels"] == 1 and whole.stats["spills"] == 0
  assert split.stats["kernels"] >= 10 and split.stats["spills"] >= 2000 and split.stats["numpy_kernels"] == 0
  nodes, shaped = flatten([g])
  (loop,) = [k for k in Planner(nodes, shaped, [x]).kernels if isinstance(k, Loop)]
  made = []
  parts = lower.lower_loop(loop, lambda st, sh, dt: made.append((st, sh, dt)) or _Buf(1000 + len(made), st, sh, dt))
  assert len(parts) == split.stats["kernels"] and len(made) == split.stats["spills"]
  assert all(lower.regfile_bytes(p.words) <= budget for p in parts)
  for v in (0.5, -1.25, 3.0, 1e5):
    _same_bits(whole(np.float32(v)), split(np.float32(v)))
    np.testing.assert_allclose(split(np.float32(v))[0], numpy_eval.evaluate([g], {x: np.float32(v)})[0],
                               rtol=1e-4)


def _Buf(bid, stype, shape, dtype):
  from pygrad.engine.planner import Buf
  return Buf(bid, "arena", stype, shape, dtype)


@pytest.mark.parametrize("dt", [F16, F32, F64])
def test_split_reduction_keeps_its_order_and_dtype(dt, monkeypatch):
  """A reduction over a long expression of many views: the last part reduces, over the same index space and tiles,
  so even a float sum has the unsplit bits; float16 values travel between parts in their compute type, exactly."""
  n = 60
  x = UOp.placeholder((n + 1000,), dt, "x")
  s = UOp.placeholder((), dt, "s")
  h = x.shrink(((0, 1000),))
  c = s
  for i in range(1, n):
    c = (c * 0.99).sin()  # a scalar chain inside the vector loop: scalar registers carried as full buffers
    h = h * 0.5 + (x.shrink(((i, i + 1000),)) * c).sin()
  rng = np.random.default_rng(1)
  xv, sv = rng.standard_normal(n + 1000).astype(dt.numpy), np.asarray(0.7, dt.numpy)
  tol = {F16: 2e-2, F32: 1e-4, F64: 1e-9}[dt]
  for out in (h.sum(), (h * h).sum(), h.max()):  # one reduction a program: h is not stored, the loop reduces it
    with monkeypatch.context() as m:
      whole, split = _both([out], [x, s], 128 + 20 * (1000 * 8 + 16), m)
    assert split.stats["kernels"] > whole.stats["kernels"] + 1 and split.stats["numpy_kernels"] == 0
    _same_bits(whole(xv, sv), split(xv, sv))
    np.testing.assert_allclose(split(xv, sv)[0], numpy_eval.evaluate([out], {x: xv, s: sv})[0], rtol=tol, atol=tol)


def test_split_keeps_a_dot_reduction_as_unsplit(monkeypatch):
  """The reduction of a product whose operands are long expressions: the sum of products stays the same reduction
  kind (dot or not) as unsplit."""
  x = UOp.placeholder((64, 340), F32, "x")
  a, b = x.shrink(((0, 64), (0, 300))), x.flip(1).shrink(((0, 64), (0, 300)))
  for i in range(1, 40):
    a = a + (x.shrink(((0, 64), (i, i + 300))) * 1.01).sin()
    b = b - (x.flip(1).shrink(((0, 64), (i, i + 300))) * 0.98).sin()
  out = (a * b).sum(axis=1)
  whole, split = _both([out], [x], 128 + 20 * (8192 * 8 + 16), monkeypatch)
  assert split.stats["spills"] > 0
  xv = np.random.default_rng(2).standard_normal((64, 340)).astype(np.float32)
  _same_bits(whole(xv), split(xv))
  np.testing.assert_allclose(split(xv)[0], numpy_eval.evaluate([out], {x: xv})[0], rtol=1e-3, atol=1e-3)


@FUZZ
@given(recipes())
def test_split_programs_equal_unsplit_ones_on_random_graphs(recipe):
  """Every kernel lowered uncached and split at a budget of a few registers: the same bits as unsplit (and as the
  numpy engine, as test_fuzz_engines checks for the unsplit program)."""
  b = build(recipe)
  vals = input_values(recipe, b.bufs)
  try:
    whole = pygrad.evaluate(b.outputs, vals, engine="c")
  except (ValueError, TypeError, ZeroDivisionError, OverflowError):
    return  # a graph the engine rejects: test_fuzz_engines checks the error
  with pytest.MonkeyPatch.context() as m:
    m.setattr(kcache, "CACHE_MAX_NODES", 0)
    for budget in (128 + 4 * SCALAR, 128 + 6 * (64 * 8 + 16)):
      m.setattr(lower, "REGFILE_BUDGET", budget)
      got = pygrad.evaluate(b.outputs, vals, engine="c")
      for o, w, g in zip(b.outputs, whole, got):
        why = same_values(g, w, o.dtype, True) if not isinstance(w, tuple) else None
        assert why is None, f"{o.op.name} {o.dtype} {o.shape}: split vs whole {why} (exact graph: {exact_graph(o)})"
