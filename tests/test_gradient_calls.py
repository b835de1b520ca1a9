"""Gradients through FUNCTION, CALL (custom kernels), AFTER, COPY, MULTI, and metadata on backward nodes."""
from __future__ import annotations
import numpy as np
import pytest
import pygrad
from pygrad import UOp, Ops, dtypes
from gradcheck import evaluate

F64 = dtypes.float64


def _layer(x, w, **kw):
  px, pw = x.param_like(0), w.param_like(1)
  body = UOp.maketuple((px @ pw).sin(), (px * px).sum())
  return body.call(x, w, name="layer", **kw)


def _inline(x, w):
  return (x @ w).sin(), (x * x).sum()


def _funcs(u: UOp) -> list[UOp]:
  return [n for n in u.toposort(enter_calls=False) if n.op is Ops.FUNCTION]


@pytest.fixture
def data():
  rng = np.random.default_rng(0)
  return rng.standard_normal((3, 4)), rng.standard_normal((4, 5))


@pytest.mark.parametrize("precompile", [False, True])
def test_function_gradient_equals_inlined(data, precompile):
  x, w = UOp.placeholder((3, 4), F64), UOp.placeholder((4, 5), F64)
  f = _layer(x, w, precompile=precompile)
  loss = f.gettuple(0).sum() + f.gettuple(1) * 3
  a, b = _inline(x, w)
  loss_i = a.sum() + b * 3
  inputs = {x: data[0], w: data[1]}
  got = evaluate(loss.gradient(x, w), inputs)
  want = evaluate(loss_i.gradient(x, w), inputs)
  for g, wv in zip(got, want): np.testing.assert_allclose(g, wv, rtol=1e-12)


def test_one_backward_function_with_compacted_params(data):
  x, w = UOp.placeholder((3, 4), F64), UOp.placeholder((4, 5), F64)
  f = _layer(x, w)
  gx, gw = (f.gettuple(0).sum() + f.gettuple(1)).gradient(x, w)
  bwd = {n for g in (gx, gw) for n in _funcs(g) if n.arg.name == "layer_backward"}
  assert len(bwd) == 1
  (b,) = bwd
  body, args = b.src[0], b.src[1:]
  assert len(body.src) == 2  # one output per differentiated argument
  slots = sorted(p.arg[0] for p in body.toposort(enter_calls=False) if p.op is Ops.PARAM)
  assert slots == list(range(len(args)))  # every parameter is used and they are numbered densely


def test_only_needed_arguments_are_differentiated(data):
  x, w = UOp.placeholder((3, 4), F64), UOp.placeholder((4, 5), F64)
  f = _layer(x, w)
  (gw,) = f.gettuple(0).sum().gradient(w)
  (b,) = [n for n in _funcs(gw) if n.arg.name == "layer_backward"]
  assert len(b.src[0].src) == 1
  # output 1 got no gradient: its gradient input is compacted away
  assert all(a.op is not Ops.NOOP for a in b.src[1:])
  got = evaluate([gw], {x: data[0], w: data[1]})[0]
  want = evaluate([(x @ w).sin().sum().gradient(w)[0]], {x: data[0], w: data[1]})[0]
  np.testing.assert_allclose(got, want, rtol=1e-12)


def test_precompile_reuses_forward_outputs(data):
  x, w = UOp.placeholder((3, 4), F64), UOp.placeholder((4, 5), F64)
  px, pw = x.param_like(0), w.param_like(1)
  f = UOp.maketuple((px @ pw).exp2()).call(x, w, name="e", precompile=True)
  (gx,) = f.gettuple(0).sum().gradient(x)
  (b,) = [n for n in _funcs(gx) if n.arg.name == "e_backward"]
  assert any(a.op is Ops.GETTUPLE and a.src[0] is f for a in b.src[1:])
  want = evaluate([(x @ w).exp2().sum().gradient(x)[0]], {x: data[0], w: data[1]})[0]
  np.testing.assert_allclose(evaluate([gx], {x: data[0], w: data[1]})[0], want, rtol=1e-12)


def test_grad_fxn_custom_gradient():
  x = UOp.placeholder((3,), F64)
  seen = []

  def grad_fxn(g, call):
    seen.append(call)
    return (g * 10,)
  f = UOp.maketuple(x.param_like(0) * 2).call(x, grad_fxn=grad_fxn)
  (gx,) = f.gettuple(0).sum().gradient(x)
  assert seen == [f]
  np.testing.assert_allclose(evaluate([gx], {x: np.ones(3)})[0], np.full(3, 10.0))


def test_custom_kernel_multi_output():
  x = UOp.placeholder((3,), F64, name="x")
  o1, o2 = UOp.placeholder((3,), F64, name="o1"), UOp.placeholder((3,), F64, name="o2")

  def kernel(a, b, xin):
    a[...] = xin * 2
    b[...] = xin ** 2

  def grad_fxn(*grads, call):
    # gradients of the outputs that got one, in order; the kernel's buffers are (o1, o2, x)
    g1, g2 = grads
    xin = call.src[3]
    return (None, None, g1 * 2 + g2 * 2 * xin)
  a1, a2, _ = UOp.custom_kernel(o1, o2, x, fxn=kernel, grad_fxn=grad_fxn)
  loss = (a1 * 3).sum() + a2.sum()
  (gx,) = loss.gradient(x)
  v = np.array([1.0, 2.0, 3.0])
  inputs = {x: v, o1: np.zeros(3), o2: np.zeros(3)}
  np.testing.assert_allclose(evaluate([loss], inputs)[0], (6 * v + v ** 2).sum())
  np.testing.assert_allclose(evaluate([gx], inputs)[0], 6 + 2 * v)


def test_copy_and_multi_gradients():
  x = UOp.placeholder((4, 2), F64)
  y = x.copy_to_device("CPU:1")
  (g,) = (y * y).sum().gradient(x)
  assert g.device == "CPU"
  v = np.arange(8.0).reshape(4, 2)
  np.testing.assert_allclose(evaluate([g], {x: v})[0], 2 * v)
  m = x.shard(("CPU", "CPU:1"), axis=0)
  assert m.device == ("CPU", "CPU:1")
  (gm,) = (m * 3).sum().gradient(x)
  np.testing.assert_allclose(evaluate([gm], {x: v})[0], np.full((4, 2), 3.0))


@pytest.mark.parametrize("precompile", [False, True])
def test_nested_function_backward_keeps_inner_params(precompile):
  """A FUNCTION with an unused first argument calling another FUNCTION: the outer backward's PARAMs are renumbered
  (slot 1 -> 0, ...) and the inner call's backward body, inside it, has PARAMs of its own that are the same
  hash-consed nodes; renumbering entered that body too and the gradient was silently wrong (found by
  tests/test_interop_tinygrad_fuzz_ops.py, seed 57)."""
  u, q = UOp.placeholder((6,), F64), UOp.placeholder((6,), F64)
  pi = q.param_like(0)
  ic = UOp.maketuple(pi * 1.0, pi * pi).call(q.param_like(1), name="inner")
  x3 = ic.gettuple(0) + ic.gettuple(1).sum() * 0.5
  oc = UOp.maketuple(x3, x3 * x3).call(u, q, name="outer", precompile=precompile)
  t = oc.gettuple(0) + oc.gettuple(1)
  (g,) = (t * t).sum().gradient(q)
  p = np.arange(1, 7) / 7
  x3v = p + 0.5 * (p * p).sum()
  dx3 = 2 * (x3v + x3v * x3v) * (1 + 2 * x3v)
  np.testing.assert_allclose(evaluate([g], {u: np.ones(6), q: p})[0], dx3 + p * dx3.sum())


def test_deviceless_node_used_on_two_devices():
  """A node on no device (a constant, a variable) whose users are on two devices gets a gradient from each, one per
  device: they are summed on one (the ADD of the two raised 'operands on different devices', even for a constant
  off the target path: found by tests/test_interop_tinygrad_fuzz_ops.py, seed 19)."""
  x = UOp.placeholder((3, 2), F64)
  one, v = UOp.const(1.0, F64), UOp.variable("v", -4.0, 4.0, F64)
  assert one.device is None and v.device is None
  xv = np.arange(6.0).reshape(3, 2)
  (g,) = ((x.copy_to_device("CPU:1") + one).copy_to_device("CPU") * one).sum().gradient(x)
  np.testing.assert_allclose(evaluate([g], {x: xv})[0], np.ones((3, 2)))
  y = (x.copy_to_device("CPU:1") * v).copy_to_device("CPU").sum() + (x * v).sum()
  gx, gv = y.gradient(x, v)
  assert gx.device == "CPU" and gv.device in ("CPU", "CPU:1")
  got = evaluate([gx, gv], {x: xv, v: 1.5})
  np.testing.assert_allclose(got[0], np.full((3, 2), 3.0))
  np.testing.assert_allclose(got[1], 2 * xv.sum())


def test_metadata_copied_to_backward_nodes():
  x = UOp.placeholder((3,), F64)
  with pygrad.metadata("fwd"):
    y = x.sin()
  assert [m.name for m in y.metadata] == ["fwd"] and not y.metadata[0].backward
  (g,) = y.sum().gradient(x)
  bw = [n for n in g.toposort() if any(m.backward and m.name == "fwd" for m in n.metadata)]
  assert bw, "the sin rule's new nodes carry the forward metadata with backward=True"
  assert not x.metadata
