"""What both engines promise alike (SPEC §5): the result mirrors the outputs passed, the same inputs are accepted and
rejected, and nothing recurses on the depth of nested outputs or of FUNCTIONs nested in FUNCTION bodies."""
from __future__ import annotations
import numpy as np
import pytest
import pygrad
from pygrad import UOp, dtypes

pytest.importorskip("pygrad.engine.program", reason="the compiled interpreter is not built", exc_type=ImportError)

F32 = dtypes.float32
ENGINES = ("numpy", "c")


def _x():
  return UOp.placeholder((3,), F32, "x"), np.arange(3, dtype=np.float32)


# ---- output structure (issue 10 item 14) ----
@pytest.mark.parametrize("engine", ENGINES)
def test_evaluate_mirrors_the_outputs_passed(engine):
  x, v = _x()
  y = x * 2.0
  assert isinstance(pygrad.evaluate(y, {x: v}, engine=engine), np.ndarray)
  for outs in ([y], (y,)):
    r = pygrad.evaluate(outs, {x: v}, engine=engine)
    assert type(r) is list and len(r) == 1
    np.testing.assert_array_equal(r[0], v * 2)
  r = pygrad.evaluate([UOp.maketuple(y, UOp.maketuple(x))], {x: v}, engine=engine)
  assert type(r) is list and type(r[0]) is tuple and type(r[0][1]) is tuple
  np.testing.assert_array_equal(r[0][1][0], v)


def test_compiled_program_mirrors_the_outputs_passed():
  x, v = _x()
  y = x + 1.0
  assert isinstance(pygrad.compile(y, [x])(v), np.ndarray)
  for outs in ([y], (y,)):
    r = pygrad.compile(outs, [x])(v)
    assert type(r) is list and len(r) == 1
    np.testing.assert_array_equal(r[0], v + 1)
  (loss,) = pygrad.compile([(x * x).sum()], [x])(v)  # unpacks the list, not the array's first axis
  assert loss.shape == () and loss == 5.0
  r = pygrad.compile([y, UOp.maketuple(y, x)], [x])(v)
  assert type(r) is list and len(r) == 2 and type(r[1]) is tuple and len(r[1]) == 2


# ---- nesting depth (issue 10 item 3, issue 9 item 9) ----
@pytest.mark.parametrize("engine", ENGINES)
def test_tuple_outputs_nested_deep(engine):
  x, v = _x()
  o = x
  for _ in range(3000): o = UOp.maketuple(x * 3.0, o)
  r = pygrad.evaluate(o, {x: v}, engine=engine)
  depth = 0
  while type(r) is tuple:
    np.testing.assert_array_equal(r[0], v * 3)
    r, depth = r[1], depth + 1
  assert depth == 3000
  np.testing.assert_array_equal(r, v)
  if engine == "c":
    r = pygrad.compile([o], [x])(v)[0]
    for _ in range(3000): r = r[1]
    np.testing.assert_array_equal(r, v)


def _nested_functions(x: UOp, n: int) -> UOp:
  """f_n(x) where f_1(p) = p + 1 and f_k(p) = f_{k-1}(p) * 1 + 1: FUNCTIONs nested n deep in FUNCTION bodies."""
  p = x.param_like(0)
  inner = p + 1.0
  for _ in range(n - 1): inner = inner.call(p).gettuple(0) * 1.0 + 1.0
  return inner.call(x).gettuple(0)


@pytest.mark.parametrize("engine", ENGINES)
def test_functions_nested_10000_deep_evaluate(engine):
  x, v = _x()
  y = _nested_functions(x, 10_000)
  np.testing.assert_array_equal(pygrad.evaluate(y, {x: v}, engine=engine), v + 10_000)


# ---- bindings (issue 10 item 6) ----
@pytest.mark.parametrize("engine", ENGINES)
def test_unused_bindings_are_validated_then_ignored(engine):
  x, v = _x()
  other = UOp.placeholder((2, 2), F32, "other")
  var = UOp.variable("unused_var", 0, 10, dtypes.int32)
  r = pygrad.evaluate(x + 1.0, {x: v, other: np.ones((2, 2), np.float32), var: 3}, engine=engine)
  np.testing.assert_array_equal(r, v + 1)
  with pytest.raises(ValueError, match="other"):
    pygrad.evaluate(x + 1.0, {x: v, other: np.ones((3, 2), np.float32)}, engine=engine)
  with pytest.raises(ValueError, match="other"):
    pygrad.evaluate(x + 1.0, {x: v, other: np.ones((2, 2), np.float64)}, engine=engine)
  with pytest.raises(ValueError, match="unused_var"):
    pygrad.evaluate(x + 1.0, {x: v, var: 11}, engine=engine)


@pytest.mark.parametrize("engine", ENGINES)
def test_binding_keys_that_are_not_inputs(engine):
  x, v = _x()
  with pytest.raises(TypeError, match="str"): pygrad.evaluate(x + 1.0, {x: v, "x": v}, engine=engine)
  with pytest.raises(ValueError, match="MUL"): pygrad.evaluate(x + 1.0, {x: v, x * 2.0: v}, engine=engine)
  with pytest.raises(ValueError, match="CONST"): pygrad.evaluate(x + 1.0, {x: v, UOp.const(1.0, F32): 1.0},
                                                                 engine=engine)
  with pytest.raises(ValueError, match="missing input.*'x'"): pygrad.evaluate(x + 1.0, {}, engine=engine)


# ---- more dims than the VM takes (issue 10 item 2) ----
def _d17():
  sh = (2,) * 17
  x = UOp.placeholder(sh, F32, "x")
  return x, np.random.default_rng(0).standard_normal(sh).astype(np.float32)


@pytest.mark.parametrize("case", ["permute", "reduce_alternate_axes", "pad", "pad_where_reduce"])
def test_more_than_16_dims_after_simplification_run_on_the_c_engine(case):
  x, v = _d17()
  y = {"permute": lambda: x.permute(tuple(reversed(range(17)))) * 2.0,
       "reduce_alternate_axes": lambda: x.sum(axis=tuple(range(0, 17, 2))),
       "pad": lambda: x.pad(tuple((1, 0) for _ in range(17))),
       "pad_where_reduce": lambda: (x.pad(tuple((1, 0) if i % 2 else (0, 0) for i in range(17))) + 1.0)
       .max(axis=tuple(range(0, 17, 3)))}[case]()
  want = pygrad.evaluate(y, {x: v}, engine="numpy")
  got = pygrad.evaluate(y, {x: v}, engine="c")
  assert got.shape == want.shape and got.dtype == want.dtype
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  p = pygrad.compile([y, x * 3.0], [x])
  assert p.stats["numpy_kernels"] >= 1 and p.stats["kernels"] >= 1
  got, x3 = p(v)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(x3, v * 3)


def test_16_dims_stay_on_the_vm():
  sh = (2,) * 16
  x = UOp.placeholder(sh, F32, "x")
  v = np.random.default_rng(1).standard_normal(sh).astype(np.float32)
  p = pygrad.compile(x.permute(tuple(reversed(range(16)))) * 2.0, [x])
  assert p.stats["numpy_kernels"] == 0
  np.testing.assert_array_equal(p(v), v.transpose(tuple(reversed(range(16)))) * 2)
