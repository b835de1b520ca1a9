"""Corners where a gradient was once a wrong number with no error (issue 9): each test checks the fixed behaviour
on the core under test, and on both engines where the value is evaluated."""
from __future__ import annotations
import numpy as np
import pytest
import pygrad
from pygrad import UOp, Ops, dtypes
from pygrad.gradient import compute_gradient
from gradcheck import numeric_grad

try:
  import torch
except ImportError:  # torch is an optional test dependency
  torch = None

F32, F64 = dtypes.float32, dtypes.float64
ENGINES = ["numpy", "c"]


def _ev(outs, inputs, engine):
  return pygrad.evaluate(list(outs), inputs, engine=engine)


@pytest.mark.parametrize("engine", ENGINES)
def test_replicated_multi_gradient_is_that_of_the_one_value(engine):
  x = UOp.placeholder((3,), F64, name="x")
  v = np.array([0.3, -0.5, 1.0])
  loss = x.shard(("CPU:0", "CPU:1"), None).sin().sum()
  np.testing.assert_allclose(_ev([loss], {x: v}, engine)[0], np.sin(v).sum())  # the forward is one copy of x
  (g,) = loss.gradient(x)
  np.testing.assert_allclose(_ev([g], {x: v}, engine)[0], np.cos(v), rtol=1e-12)
  np.testing.assert_allclose(numeric_grad(loss, [x], [v])[0], np.cos(v), rtol=1e-6)
  # a sharded MULTI keeps the seeds' re-shard
  xs = UOp.placeholder((4,), F64, name="xs")
  (gs,) = (xs.shard(("CPU:0", "CPU:1"), 0).sin()).sum().gradient(xs)
  w = np.array([0.1, 0.2, 0.3, 0.4])
  np.testing.assert_allclose(_ev([gs], {xs: w}, engine)[0], np.cos(w), rtol=1e-12)


def test_buffer_captured_in_function_body_is_an_error_not_zero():
  x, b = UOp.placeholder((3,), F64, name="x"), UOp.placeholder((3,), F64, name="bias")
  f = UOp.maketuple(x.param_like(0) * b).call(x, name="layer")
  loss = f.gettuple(0).sum()
  with pytest.raises(ValueError, match=r"BUFFER 'bias'.*FUNCTION 'layer'"): loss.gradient(b)
  with pytest.raises(ValueError, match="bias"): loss.gradient(x, b)
  (gx,) = loss.gradient(x)  # the captured buffer is not a target: the argument's gradient is right
  np.testing.assert_allclose(pygrad.evaluate([gx], {x: np.ones(3), b: np.array([1.0, 2.0, 3.0])}, engine="numpy")[0],
                             [1.0, 2.0, 3.0])


@pytest.mark.parametrize("engine", ENGINES)
def test_targets_without_gradient_get_zeros_never_noop(engine):
  x, y = UOp.placeholder((3,), F64, name="x"), UOp.placeholder((3,), F64, name="y")
  # a FUNCTION output that is a bare PARAM and receives no gradient
  f = UOp.maketuple(x.param_like(0) * 2, y.param_like(1)).call(x, y, name="f")
  gx, gy = f.gettuple(0).sum().gradient(x, y)
  assert gy.op is not Ops.NOOP and gy.shape == (3,) and gy.dtype is F64
  got = _ev([gx, gy], {x: np.ones(3), y: np.ones(3)}, engine)
  np.testing.assert_allclose(got[0], [2.0, 2.0, 2.0])
  np.testing.assert_allclose(got[1], np.zeros(3))
  assert not any(n.op is Ops.NOOP for n in gy.toposort())
  # an unused element of a plain TUPLE
  t = UOp.maketuple(x * 2, y)
  (gy2,) = t.gettuple(0).sum().gradient(y)
  assert gy2.op is not Ops.NOOP and gy2.shape == (3,)
  np.testing.assert_allclose(_ev([gy2], {x: np.ones(3), y: np.ones(3)}, engine)[0], np.zeros(3))


def _prod_orders(v, axis):
  """Gradients of orders 1-3 of sum(prod(x, axis)), each order the gradient of the sum of the previous."""
  x = UOp.placeholder(v.shape, F64, name="x")
  out, cur = [], x.prod(axis).sum()
  for _ in range(3):
    (cur,) = cur.gradient(x)
    out.append(cur)
    cur = cur.sum()
  return x, out


def _torch_prod_orders(v, axis):
  t = torch.tensor(v, requires_grad=True)
  if axis is None: cur = t.prod()
  elif isinstance(axis, int): cur = t.prod(axis)
  else: cur = t.flatten(axis[0], axis[-1]).prod(axis[0])  # torch reduces one axis at a time: adjacent axes merged
  out, cur = [], cur.sum()
  for _ in range(3):
    (cur,) = torch.autograd.grad(cur, [t], create_graph=True)
    out.append(cur.detach().numpy())
    cur = cur.sum()
  return out


PROD_CASES = [(np.array([0.0, 2.0]), None), (np.array([0.0, 0.0]), None), (np.array([0.0, 0.0, 3.0]), None),
              (np.array([1.5, -2.0, 0.5, 3.0]), None), (np.array([[0.0, 2.0, 3.0], [1.0, 0.0, 0.0]]), 1),
              (np.array([[0.0, 2.0], [4.0, -1.0], [0.5, 0.0]]), 0), (np.array([[[0.0, 2.0], [3.0, 0.5]]]), (1, 2))]


@pytest.mark.skipif(torch is None, reason="torch is not installed (optional test dependency)")
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("case", range(len(PROD_CASES)))
def test_prod_orders_1_to_3_at_zeros_match_torch(case, engine):
  v, axis = PROD_CASES[case]
  x, grads = _prod_orders(v, axis)
  got = _ev(grads, {x: v}, engine)
  for g, w in zip(got, _torch_prod_orders(v, axis)): np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)


def test_prod_second_order_at_zeros_values():
  # d(sum g)/dx for g = d prod/dx: at [0, 2] and [0, 0] both are [1, 1] (g = [x1, x0])
  for v in (np.array([0.0, 2.0]), np.array([0.0, 0.0])):
    x, grads = _prod_orders(v, None)
    np.testing.assert_allclose(_ev(grads[1:2], {x: v}, "numpy")[0], [1.0, 1.0])


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("to", [dtypes.int32, dtypes.int8, dtypes.bool])
def test_cast_to_non_float_passes_no_gradient(to, engine):
  x = UOp.placeholder((), F32, name="x")
  (g,) = (x.cast(to).cast(F32) * x).gradient(x)
  got = _ev([g], {x: np.float32(1.7)}, engine)[0]
  assert got == np.float32(1.0)  # d/dx c * x with c = x.cast(to).cast(float32) held constant: c = 1 at 1.7
  if torch is not None and to is dtypes.int32:
    t = torch.tensor(1.7, requires_grad=True)
    (tg,) = torch.autograd.grad(t.to(torch.int32).to(torch.float32) * t, [t])
    assert float(got) == float(tg)
  # float to float keeps the seeds' rule
  (g2,) = (x.cast(F64) * x.cast(F64)).gradient(x)
  np.testing.assert_allclose(_ev([g2], {x: np.float32(1.5)}, engine)[0], 3.0)


@pytest.mark.parametrize("bad", [dtypes.int32, dtypes.float16, F64])
def test_seed_gradient_of_another_dtype_is_a_type_error(bad):
  x = UOp.placeholder((3,), F32, name="x")
  root = x * 2
  g = UOp.placeholder((3,), bad, name="g")
  with pytest.raises(TypeError, match=f"{bad.name}.*float32"): root.gradient(x, gradient=g)
  (ok,) = root.gradient(x, gradient=UOp.placeholder((3,), F32))
  assert ok.dtype is F32


def test_grad_fxn_one_gradient_is_positional_as_in_the_seed():
  x = UOp.placeholder((3,), F64, name="x")
  seen = []

  def grad_fxn(grad, kernel):  # the seed's form for one incoming gradient: grad_fxn(ctx, k)
    seen.append(kernel)
    return (grad * 10,)
  f = UOp.maketuple(x.param_like(0) * 2).call(x, grad_fxn=grad_fxn)
  (gx,) = f.gettuple(0).sum().gradient(x)
  assert seen == [f]
  np.testing.assert_allclose(pygrad.evaluate([gx], {x: np.ones(3)}, engine="numpy")[0], np.full(3, 10.0))


def test_grad_fxn_several_gradients_get_call_by_keyword():
  x = UOp.placeholder((3,), F64, name="x")
  seen = []

  def grad_fxn(*grads, call):
    seen.append(len(grads))
    return (grads[0] * 2 + grads[1] * 3,)
  px = x.param_like(0)
  f = UOp.maketuple(px * 2, px * 3).call(x, grad_fxn=grad_fxn)
  (gx,) = (f.gettuple(0).sum() + f.gettuple(1).sum()).gradient(x)
  assert seen == [2]
  np.testing.assert_allclose(pygrad.evaluate([gx], {x: np.ones(3)}, engine="numpy")[0], np.full(3, 5.0))


def test_gradient_result_is_a_proper_mapping():
  x, y = UOp.placeholder((3,), F64), UOp.placeholder((3,), F64)
  root = (x.sin() * y).sum()
  a = compute_gradient(root, root.const_like(1.0), {x, y})
  b = compute_gradient(root, root.const_like(1.0), {x, y})
  assert a == b and not (a != b)
  d = dict(a)
  assert d == a and a == d and not (a != d) and not (d != a)
  assert len(a) == len(d) and set(a) == set(d) and set(a.keys()) == set(d.keys())
  assert all(a[k] is v for k, v in a.items()) and list(a.values()) == [a[k] for k in a]
  assert x in a and a.get(x) is d[x] and a.get(5) is None and 5 not in a
  with pytest.raises(KeyError): a[UOp.placeholder((3,), F64)]
  other = compute_gradient((x * 3).sum(), root.const_like(1.0), {x})
  assert a != other and not (a == other)


# ---- POW and MAX at their special points, against torch, orders 1 to 3 (SPEC 4: torch's value wherever it is
# finite). Every mixed partial is compared: the directions are all sequences of the two operands.
POW_BASES = [2.0, 0.5, 3.0, -1.0, -2.0, 0.0, -0.0, float("inf"), float("-inf"), float("nan")]
POW_EXPS = [0.0, 1.0, 2.0, 3.0, -1.0, -2.0, 0.5, 2.5]
MAX_PAIRS = [(1.0, float("nan")), (float("nan"), 1.0), (float("nan"), float("nan")), (1.0, 2.0), (2.0, 1.0),
             (1.5, 1.5), (float("inf"), 1.0), (float("-inf"), float("-inf"))]


def _orders(f, names, order: int):
  """{direction sequence: derivative graph} for every sequence of up to `order` of the two placeholders."""
  a, b = (UOp.placeholder((), F64, name=n) for n in names)
  out, level = {}, {(): f(a, b)}
  for _ in range(order):
    nxt = {}
    for seq, g in level.items():
      for i, d in enumerate(g.gradient(a, b)): nxt[seq + (i,)] = d
    out.update(nxt)
    level = nxt
  return a, b, out


def _torch_orders(f, av: float, bv: float, order: int):
  ta, tb = (torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in (av, bv))
  out, level = {}, {(): f(ta, tb)}
  for _ in range(order):
    nxt = {}
    for seq, g in level.items():
      ds = (None, None) if not g.requires_grad else \
        torch.autograd.grad(g, [ta, tb], create_graph=True, allow_unused=True)
      for i, d in enumerate(ds): nxt[seq + (i,)] = torch.zeros((), dtype=torch.float64) if d is None else d
    out.update(nxt)
    level = nxt
  return {k: v.item() for k, v in out.items()}


def _check_against_torch(f, tf, names, points, engine, order=3):
  a, b, graphs = _orders(f, names, order)
  seqs = list(graphs)
  bad = []
  for av, bv in points:
    got = _ev([graphs[s] for s in seqs], {a: np.array(av), b: np.array(bv)}, engine)
    want = _torch_orders(tf, av, bv, order)
    for s, g in zip(seqs, got):
      w = want[s]
      if np.isfinite(w) and not abs(float(g) - w) <= 1e-12 * max(1.0, abs(w)):
        bad.append(f"d/d{''.join(names[i] for i in s)} at {names[0]}={av}, {names[1]}={bv}: {float(g)} vs torch {w}")
  assert not bad, "\n".join(bad[:20])


@pytest.mark.skipif(torch is None, reason="torch is not installed (optional test dependency)")
@pytest.mark.parametrize("engine", ENGINES)
def test_pow_orders_1_to_3_at_special_points_match_torch(engine):
  pts = [(b, e) for b in POW_BASES for e in POW_EXPS]
  _check_against_torch(lambda b, e: b.pow(e), torch.pow, ("b", "e"), pts, engine)


@pytest.mark.skipif(torch is None, reason="torch is not installed (optional test dependency)")
@pytest.mark.parametrize("engine", ENGINES)
def test_maximum_orders_1_to_3_against_nan_and_ties_match_torch(engine):
  _check_against_torch(lambda x, y: x.maximum(y), torch.maximum, ("x", "y"), MAX_PAIRS, engine)


def test_pow_mixed_second_order_at_exponent_zero_values():
  # torch's values: d2(b**e)/(db de) at e = 0 is 0 in the d/db-then-d/de order (the rule selects 0 at e == 0; the
  # seeds' rule gave 1/b) and 1/b in the other; at b = -1 and b = inf the NaN of log2(b) no longer reaches the
  # second (it was NaN); the first is NaN there in torch too
  b, e = UOp.placeholder((), F64, name="b"), UOp.placeholder((), F64, name="e")
  db, de = b.pow(e).gradient(b, e)
  dbe, deb = db.gradient(e)[0], de.gradient(b)[0]
  for engine in ENGINES:
    for bv, want in ((2.0, [0.0, 0.5]), (-1.0, [np.nan, -1.0]), (float("inf"), [np.nan, 0.0])):
      got = _ev([dbe, deb], {b: np.array(bv), e: np.array(0.0)}, engine)
      np.testing.assert_array_equal(np.array([float(g) for g in got]), want, err_msg=f"b={bv} on {engine}")


@pytest.mark.parametrize("engine", ENGINES)
def test_maximum_against_nan_passes_the_gradient_to_both(engine):
  x, y = UOp.placeholder((), F64, name="x"), UOp.placeholder((), F64, name="y")
  gx, gy = x.maximum(y).gradient(x, y)
  for xv, yv, want in ((1.0, np.nan, [1.0, 1.0]), (1.0, 2.0, [0.0, 1.0]), (3.0, 3.0, [0.5, 0.5])):
    got = _ev([gx, gy], {x: np.array(xv), y: np.array(yv)}, engine)
    assert [float(g) for g in got] == want


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("v", [[0.0, 0.0, 1e200, 1e200, 3.0], [1e200, 1e200, 0.0, 5.0],
                               [1e200, 1e200, 0.0, 5.0, 0.0]])
def test_prod_gradient_is_the_others_product_where_partial_products_overflow(v, engine):
  # the prefix and suffix products overflowed to inf where a zero made another 0: inf * 0 gave NaN where the product
  # of the others is exactly 0 (and inf where it overflows: the entry whose others hold no zero)
  x = UOp.placeholder((len(v),), F64, name="x")
  (g,) = x.prod().gradient(x)
  with np.errstate(all="ignore"):  # (the products overflow: inf is the value)
    want = [float(np.prod(np.array(v[:i] + v[i + 1:]), dtype=np.float64)) if 0.0 not in v[:i] + v[i + 1:] else 0.0
            for i in range(len(v))]
    got = _ev([g], {x: np.array(v)}, engine)[0]
  np.testing.assert_array_equal(got, np.array(want))


@pytest.mark.parametrize("engine", ENGINES)
def test_floor_division_passes_no_gradient_even_where_a_user_gradient_is_nan(engine):
  # b ** e's d/de is ret * log(b), NaN at b < 0; with e = x // x it reached the a / b branch of `//` (selected out at
  # b != 0, so 0 at order 1) and at order 2 gave 0 * NaN: torch's (and the true) second derivative of x ** 1 is 0
  x = UOp.placeholder((), F64, name="x")
  (g1,) = (x ** (x // x)).gradient(x)
  (g2,) = g1.gradient(x)
  with np.errstate(all="ignore"): got = _ev([g1, g2], {x: np.float64(-1.89)}, engine)
  assert float(got[0]) == 1.0 and float(got[1]) == 0.0
  (gd,) = ((x * 3.0) // 2.0).sum().gradient(x)
  assert float(_ev([gd], {x: np.float64(1.7)}, engine)[0]) == 0.0
