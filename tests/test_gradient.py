"""Gradient rules against float64 finite differences and, where installed, torch.autograd."""
from __future__ import annotations
import math
import numpy as np
import pytest
from pygrad import UOp, Ops, dtypes
from pygrad.gradient import compute_gradient
from gradcheck import check_fd, evaluate

try:
  import torch
except ImportError:  # torch is an optional test dependency
  torch = None

F64 = dtypes.float64

# (name, pygrad fn, torch fn, input shapes, input range or None for standard normal)
CASES = [
  ("reciprocal", lambda x: x.reciprocal(), lambda x: x.reciprocal(), [(3, 4)], (0.5, 2.0)),
  ("sqrt", lambda x: x.sqrt(), lambda x: x.sqrt(), [(3, 4)], (0.5, 2.0)),
  ("sin", lambda x: x.sin(), lambda x: x.sin(), [(3, 4)], None),
  ("cos", lambda x: x.cos(), lambda x: x.cos(), [(3, 4)], None),
  ("log2", lambda x: x.log2(), lambda x: x.log2(), [(3, 4)], (0.5, 2.0)),
  ("exp2", lambda x: x.exp2(), lambda x: x.exp2(), [(3, 4)], None),
  ("exp", lambda x: x.exp(), lambda x: x.exp(), [(3, 4)], None),
  ("log", lambda x: x.log(), lambda x: x.log(), [(3, 4)], (0.5, 2.0)),
  ("trunc", lambda x: x.trunc() * x, lambda x: x.trunc() * x, [(3, 4)], (-3.0, 3.0)),
  ("add", lambda x, y: x + y, lambda x, y: x + y, [(3, 4), (3, 4)], None),
  ("sub", lambda x, y: x - y, lambda x, y: x - y, [(3, 4), (3, 4)], None),
  ("mul", lambda x, y: x * y, lambda x, y: x * y, [(3, 4), (3, 4)], None),
  ("div", lambda x, y: x / y, lambda x, y: x / y, [(3, 4), (3, 4)], (0.5, 2.0)),
  ("pow", lambda x, y: x ** y, lambda x, y: x ** y, [(3, 4), (3, 4)], (0.5, 2.0)),
  ("maximum", lambda x, y: x.maximum(y), lambda x, y: torch.maximum(x, y), [(3, 4), (3, 4)], None),
  ("minimum", lambda x, y: x.minimum(y), lambda x, y: torch.minimum(x, y), [(3, 4), (3, 4)], None),
  ("where", lambda x, y: (x < y).where(x * 2, y * 3), lambda x, y: torch.where(x < y, x * 2, y * 3),
   [(3, 4), (3, 4)], None),
  ("cmp", lambda x, y: (x < y).cast(F64) + x.ne(y).cast(F64) + x.eq(y).cast(F64) + x, None, [(3, 4), (3, 4)], None),
  ("sum", lambda x: x.sum(1), lambda x: x.sum(1), [(3, 4)], None),
  ("sum_all", lambda x: x.sum(), lambda x: x.sum(), [(3, 4)], None),
  ("max_reduce", lambda x: x.max(0), lambda x: x.max(0).values, [(3, 4)], None),
  ("min_reduce", lambda x: x.min(1), lambda x: x.min(1).values, [(3, 4)], None),
  ("prod", lambda x: x.prod(1), lambda x: x.prod(1), [(3, 4)], (0.5, 2.0)),
  ("mean", lambda x: x.mean(0), lambda x: x.mean(0), [(3, 4)], None),
  ("reshape", lambda x: x.reshape(4, 3) * 2, lambda x: x.reshape(4, 3) * 2, [(3, 4)], None),
  ("expand", lambda x: x.reshape(3, 1, 4).expand(3, 5, 4), lambda x: x.reshape(3, 1, 4).expand(3, 5, 4), [(3, 4)], None),
  ("pad", lambda x: x.pad(((1, 2), (0, 3))), lambda x: torch.nn.functional.pad(x, (0, 3, 1, 2)), [(3, 4)], None),
  ("shrink", lambda x: x.shrink(((1, 3), (0, 2))), lambda x: x[1:3, 0:2], [(3, 4)], None),
  ("permute", lambda x: x.permute(2, 0, 1), lambda x: x.permute(2, 0, 1), [(2, 3, 4)], None),
  ("flip", lambda x: x.flip(0, 2), lambda x: x.flip(0, 2), [(2, 3, 4)], None),
  ("transpose", lambda x: x.transpose(), lambda x: x.transpose(1, 0), [(3, 4)], None),
  ("contiguous", lambda x: x.contiguous() * x.contiguous_backward(), lambda x: x * x, [(3, 4)], None),
  ("copy", lambda x: (x.copy_to_device("CPU:1") * 2).copy_to_device("CPU"), lambda x: x * 2, [(3, 4)], None),
  ("matmul", lambda x, y: x @ y, lambda x, y: x @ y, [(3, 4), (4, 5)], None),
  ("matvec", lambda x, y: x @ y, lambda x, y: x @ y, [(3, 4), (4,)], None),
  ("relu", lambda x: x.relu(), lambda x: x.relu(), [(3, 4)], None),
  ("abs", lambda x: x.abs(), lambda x: x.abs(), [(3, 4)], None),
  ("sigmoid", lambda x: x.sigmoid(), lambda x: x.sigmoid(), [(3, 4)], None),
  ("tanh", lambda x: x.tanh(), lambda x: x.tanh(), [(3, 4)], None),
  ("softmax", lambda x: x.softmax(), lambda x: x.softmax(-1), [(3, 4)], None),
  ("log_softmax", lambda x: x.log_softmax(0), lambda x: x.log_softmax(0), [(3, 4)], None),
  ("square_broadcast", lambda x, y: x * y + x, lambda x, y: x * y + x, [(3, 4), (4,)], None),
]


@pytest.mark.parametrize("name,fn,tfn,shapes,dom", CASES, ids=[c[0] for c in CASES])
def test_rule_finite_differences(name, fn, tfn, shapes, dom):
  rng = np.random.default_rng(abs(hash(name)) % 2**32)
  low, high = dom if dom else (None, None)
  check_fd(fn, shapes, rng, low, high)


def test_cast_gradient_casts_back():
  x = UOp.placeholder((3,), F64)
  y = x.cast(dtypes.float32)
  (g,) = (y * y.const_like(2.0)).sum().gradient(x)
  assert g.dtype is F64
  np.testing.assert_array_equal(evaluate([g], {x: np.array([0.1, 1e10, -3.0])})[0], [2.0, 2.0, 2.0])


@pytest.mark.skipif(torch is None, reason="torch is not installed (optional test dependency)")
@pytest.mark.parametrize("name,fn,tfn,shapes,dom", [c for c in CASES if c[2] is not None],
                         ids=[c[0] for c in CASES if c[2] is not None])
def test_rule_against_torch(name, fn, tfn, shapes, dom):
  rng = np.random.default_rng(7)
  vals = [rng.uniform(*dom, s) if dom else rng.standard_normal(s) for s in shapes]
  bufs = [UOp.placeholder(s, F64) for s in shapes]
  out = fn(*bufs)
  r = rng.standard_normal(out.shape)
  loss = (out * UOp.placeholder(out.shape, F64, name="R")).sum()
  rbuf = next(u for u in loss.toposort() if u.op is Ops.BUFFER and u.arg[3] == "R")
  got = evaluate(loss.gradient(*bufs), {**dict(zip(bufs, vals)), rbuf: r})
  tv = [torch.tensor(v, requires_grad=True) for v in vals]
  want = torch.autograd.grad((tfn(*tv) * torch.tensor(r)).sum(), tv)
  for g, w in zip(got, want): np.testing.assert_allclose(g, w.numpy(), rtol=1e-7, atol=1e-9)


def _grads(fn, vals):
  bufs = [UOp.placeholder(np.shape(v), F64) for v in vals]
  out = fn(*bufs)
  return evaluate(out.gradient(*bufs), dict(zip(bufs, [np.asarray(v, np.float64) for v in vals])))


def test_pow_base_zero_exponent_zero():
  # d/db b**e at b=0,e=0 is e*b**(e-1) -> the rule picks e (=0); d/de is -inf only for negative e
  gb, ge = _grads(lambda b, e: (b ** e).sum(), [np.array([0.0, 0.0, 2.0]), np.array([0.0, 2.0, 3.0])])
  np.testing.assert_allclose(gb, [0.0, 0.0, 12.0])
  np.testing.assert_allclose(ge, [0.0, 0.0, 8 * math.log(2)])
  _, ge = _grads(lambda b, e: (b ** e).sum(), [np.array([0.0]), np.array([-1.0])])
  assert ge[0] == -math.inf


def test_pow_negative_base_integer_exponent():
  gb, _ = _grads(lambda b, e: (b ** e).sum(), [np.array([-2.0, -3.0]), np.array([2.0, 3.0])])
  np.testing.assert_allclose(gb, [-4.0, 27.0])
  if torch is not None:
    b = torch.tensor([-2.0, -3.0], dtype=torch.float64, requires_grad=True)
    (tb,) = torch.autograd.grad((b ** torch.tensor([2.0, 3.0], dtype=torch.float64)).sum(), [b])
    np.testing.assert_allclose(gb, tb.numpy())


def test_max_ties_split_evenly():
  gx, gy = _grads(lambda x, y: x.maximum(y).sum(), [np.array([1.0, 2.0, 3.0]), np.array([1.0, 1.0, 4.0])])
  np.testing.assert_allclose(gx, [0.5, 1.0, 0.0])
  np.testing.assert_allclose(gy, [0.5, 0.0, 1.0])
  (g,) = _grads(lambda x: x.max(), [np.array([[3.0, 1.0], [3.0, 3.0]])])
  np.testing.assert_allclose(g, [[1 / 3, 0.0], [1 / 3, 1 / 3]])


def test_prod_with_zeros():
  (g,) = _grads(lambda x: x.prod(1).sum(), [np.array([[2.0, 0.0, 3.0], [0.0, 0.0, 5.0], [1.0, 2.0, 4.0]])])
  np.testing.assert_allclose(g, [[0.0, 6.0, 0.0], [0.0, 0.0, 0.0], [8.0, 4.0, 2.0]])
  assert np.isfinite(g).all()
  if torch is not None:
    t = torch.tensor([[2.0, 0.0, 3.0], [0.0, 0.0, 5.0], [1.0, 2.0, 4.0]], dtype=torch.float64, requires_grad=True)
    (tg,) = torch.autograd.grad(t.prod(1).sum(), [t])
    np.testing.assert_allclose(g, tg.numpy())


def test_where_routes_gradient():
  c = UOp.placeholder((3,), dtypes.bool)
  x, y = UOp.placeholder((3,), F64), UOp.placeholder((3,), F64)
  gx, gy = c.where(x, y).sum().gradient(x, y)
  got = evaluate([gx, gy], {c: np.array([True, False, True]), x: np.ones(3), y: np.ones(3)})
  np.testing.assert_allclose(got[0], [1, 0, 1])
  np.testing.assert_allclose(got[1], [0, 1, 0])


def test_detach_stops_gradient():
  x = UOp.placeholder((3,), F64)
  (g,) = (x * x.detach()).sum().gradient(x)
  np.testing.assert_allclose(evaluate([g], {x: np.array([1.0, 2.0, 3.0])})[0], [1.0, 2.0, 3.0])


def test_unreached_target_gets_zeros():
  x, y = UOp.placeholder((2, 2), F64), UOp.placeholder((2, 2), F64)
  gx, gy = (x * 2).sum().gradient(x, y)
  np.testing.assert_allclose(evaluate([gy], {})[0], np.zeros((2, 2)))
  assert gy.shape == (2, 2)


def test_scalar_source_is_summed():
  x = UOp.placeholder((3, 4), F64)
  s = UOp.variable("s", -10, 10, F64)
  (g,) = (x * s).sum().gradient(s)
  assert g.shape == ()
  v = np.arange(12.0).reshape(3, 4)
  np.testing.assert_allclose(evaluate([g], {x: v, s: 2.0})[0], v.sum())


def test_gradient_errors():
  x = UOp.placeholder((3,), F64)
  with pytest.raises(ValueError, match="scalar"): (x * 2).gradient(x)
  with pytest.raises(TypeError, match="int32"): (x * 2).sum().gradient(UOp.placeholder((3,), dtypes.int32))
  y = (x.bitcast(dtypes.int64).cast(F64) + x).sum()
  (g,) = y.gradient(x)  # no gradient through BITCAST: only the direct path counts
  np.testing.assert_allclose(evaluate([g], {x: np.ones(3)})[0], np.ones(3))
  k = UOp.custom_kernel(UOp.placeholder((3,), F64), x, fxn=lambda a, b: None)
  with pytest.raises(RuntimeError, match="failed to compute gradient for CALL"): k[0].sum().gradient(x)
  with pytest.raises(ValueError): (x * 2).sum().gradient(x, gradient=UOp.placeholder((2,), F64))


def test_missing_rule_raises():
  x = UOp.placeholder((3,), F64)
  y = UOp(Ops.SINK, None, (x,))
  with pytest.raises(RuntimeError, match="failed to compute gradient for SINK"):
    compute_gradient(y, x.const_like(1.0), {x})


def test_second_order_matches_torch():
  rng = np.random.default_rng(3)
  v = rng.uniform(0.5, 1.5, (3,))
  x = UOp.placeholder((3,), F64)
  f = (x.sin() * x.exp() + x ** 3).sum()
  (g,) = f.gradient(x)
  (h,) = g.sum().gradient(x)
  got = evaluate([g, h], {x: v})
  want_g = np.cos(v) * np.exp(v) + np.sin(v) * np.exp(v) + 3 * v ** 2
  want_h = 2 * np.cos(v) * np.exp(v) + 6 * v
  np.testing.assert_allclose(got[0], want_g, rtol=1e-10)
  np.testing.assert_allclose(got[1], want_h, rtol=1e-10)
  if torch is not None:
    t = torch.tensor(v, requires_grad=True)
    (tg,) = torch.autograd.grad((t.sin() * t.exp() + t ** 3).sum(), [t], create_graph=True)
    (th,) = torch.autograd.grad(tg.sum(), [t])
    np.testing.assert_allclose(got[1], th.detach().numpy(), rtol=1e-10)


def test_symbolic_gradient_simplifies_to_const():
  # tinygrad's symbolic style: variables in, constants substituted, simplify() down to one CONST
  a, b = UOp.variable("a", -10, 10, F64), UOp.variable("b", -10, 10, F64)
  f = (a * b + a.sin()) * (b * 0.5).exp2() + a.maximum(b)
  ga, gb = f.gradient(a, b)
  sub = {a: UOp.const(1.5, F64), b: UOp.const(-0.5, F64)}
  ra, rb = ga.substitute(sub).simplify(), gb.substitute(sub).simplify()
  assert ra.op is Ops.CONST and rb.op is Ops.CONST
  av, bv = 1.5, -0.5
  np.testing.assert_allclose(ra.arg, (bv + math.cos(av)) * 2 ** (bv * 0.5) + 1.0, rtol=1e-12)
  np.testing.assert_allclose(rb.arg, av * 2 ** (bv * 0.5) + (av * bv + math.sin(av)) * 2 ** (bv * 0.5) * 0.5 *
                             math.log(2), rtol=1e-12)
  if torch is not None:
    ta, tb = torch.tensor(av, dtype=torch.float64, requires_grad=True), torch.tensor(bv, dtype=torch.float64,
                                                                                      requires_grad=True)
    tf = (ta * tb + ta.sin()) * torch.exp2(tb * 0.5) + torch.maximum(ta, tb)
    tga, tgb = torch.autograd.grad(tf, [ta, tb])
    np.testing.assert_allclose([ra.arg, rb.arg], [tga.item(), tgb.item()], rtol=1e-12)
