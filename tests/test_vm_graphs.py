"""Whole graphs on the C interpreter against the numpy evaluator: FUNCTION, CALL/AFTER, MULTI, COPY; random graphs
(hypothesis); a 100,000-op chain; a compiled forward+backward MLP step reused for several inputs; every instruction
set clone this CPU runs."""
from __future__ import annotations
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st, HealthCheck
from pygrad import UOp, Ops, dtypes
from concurrency import run_on_threads

program = pytest.importorskip("pygrad.engine.program", reason="the compiled interpreter is not built",
                              exc_type=ImportError)
from pygrad.engine import numpy_eval, vmlib  # noqa: E402

F32 = dtypes.float32


def both(outs, inputs, rtol=3e-6, atol=1e-6):
  want = numpy_eval.evaluate(outs, inputs)
  got = program.evaluate_c(outs, inputs)
  for g, w in zip(got, want):
    if type(w) is tuple:
      for a, b in zip(g, w): np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, equal_nan=True)
    else:
      assert g.dtype == w.dtype and g.shape == w.shape
      np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, equal_nan=True)
  return got


def rnd(*shape, seed=0):
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_function_inlined_with_params_bound():
  x, y = UOp.placeholder((4, 3), F32, "x"), UOp.placeholder((4, 3), F32, "y")
  p0, p1 = x.param_like(0), y.param_like(1)
  f = UOp.maketuple(p0 * p1 + 1.0, (p0 - p1).sum(1)).call(x, y.exp())
  g = (p0 * 2.0).call(f.gettuple(0))  # a FUNCTION of a FUNCTION's output
  both([f.gettuple(0), f.gettuple(1), g.gettuple(0)], {x: rnd(4, 3), y: rnd(4, 3, seed=1)})
  both([f], {x: rnd(4, 3), y: rnd(4, 3, seed=1)})


def test_nested_function_params_are_its_own():
  x = UOp.placeholder((5,), F32, "x")
  p = x.param_like(0)
  inner = (p * 3.0).call(p + 1.0)  # the inner PARAM 0 is the inner call's arg, not the outer's
  outer = (inner.gettuple(0) + p).call(x * 2.0)
  both([outer.gettuple(0)], {x: rnd(5)})


def test_call_runs_the_python_kernel_on_writable_copies():
  x = UOp.placeholder((6,), F32, "x")
  seen = []

  def kernel(a, b):
    seen.append(a.flags.writeable and b.flags.writeable)
    a[:] = b * 10.0
    b[0] = -1.0

  out = UOp.placeholder((6,), F32, "o")
  a1, a2 = UOp.custom_kernel(out, x * 2.0, fxn=kernel)
  xv, ov = rnd(6), np.zeros(6, np.float32)
  r = both([a1 + 1.0, a2, x], {x: xv, out: ov})
  assert all(seen) and r[2][0] == xv[0] and ov[0] == 0.0  # inputs are never written


def test_call_in_the_middle_splits_the_program():
  x = UOp.placeholder((8,), F32, "x")
  (a,) = UOp.custom_kernel(x.exp(), fxn=lambda t: np.sqrt(t, out=t))
  y = (a * x).sum()
  p = program.compile_program(y, [x])
  assert p.stats["segments"] == 2
  v = rnd(8)
  for i in range(3):
    np.testing.assert_allclose(p(v + i), (np.sqrt(np.exp(v + i)) * (v + i)).sum(), rtol=1e-5)


def test_multi_and_copy_on_host_devices():
  x = UOp.placeholder((4, 6), F32, "x")
  sh = x.shard(("CPU", "CPU:1"), axis=1)
  rep = x.shard(("CPU", "CPU:1"), axis=None)
  cp = (x * 2.0).copy_to_device("CPU:1")
  both([sh, sh * 3.0, rep + 1.0, cp, cp.sum(0)], {x: rnd(4, 6)})


def test_identities_and_after_values():
  x = UOp.placeholder((3, 3), F32, "x")
  y = (x.contiguous() + x.detach().contiguous_backward()).permute(1, 0).contiguous()
  both([y, y.max(0)], {x: rnd(3, 3)})


def test_chain_of_100000_ops():
  x = UOp.placeholder((16,), F32, "x")
  y = x
  for i in range(100_000):
    y = y * 0.99999 + 0.00001 if i % 2 else (y + 0.5) * 0.5
  p = program.compile_program(y, [x])
  v = rnd(16)
  np.testing.assert_allclose(p(v), numpy_eval.evaluate([y], {x: v})[0], rtol=1e-5)


def test_mlp_forward_backward_step_reused():
  rng = np.random.default_rng(0)
  X, Y = UOp.placeholder((32, 20), F32, "X"), UOp.placeholder((32, 5), F32, "Y")
  W1, W2 = UOp.placeholder((20, 64), F32, "W1"), UOp.placeholder((64, 5), F32, "W2")
  h = (X @ W1).relu()
  out = h @ W2
  loss = ((out - Y) * (out - Y)).mean()
  g1, g2 = loss.gradient(W1, W2)
  new1, new2 = W1 - g1 * 0.01, W2 - g2 * 0.01
  p = program.compile_program([loss, new1, new2], [X, Y, W1, W2])
  w1 = (rng.standard_normal((20, 64)) * 0.2).astype(np.float32)
  w2 = (rng.standard_normal((64, 5)) * 0.2).astype(np.float32)
  for step in range(4):
    xv = rng.standard_normal((32, 20)).astype(np.float32)
    yv = rng.standard_normal((32, 5)).astype(np.float32)
    got = p(xv, yv, w1, w2)
    want = numpy_eval.evaluate([loss, new1, new2], {X: xv, Y: yv, W1: w1, W2: w2})
    for a, b in zip(got, want): np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-5)
    _, w1, w2 = got
  assert p.stats["contractions"] >= 3


# ---- random graphs ----
_UN = ["exp", "sin", "relu", "sqrt_abs", "neg", "recip1", "log_abs", "tanh"]
_BIN = ["add", "mul", "sub", "max", "div1", "where"]
_MOV = ["permute", "flip", "pad_shrink", "reshape", "expand_sum"]


def _apply(kind, a, b):
  if kind == "exp": return (a * 0.1).exp()
  if kind == "sin": return a.sin()
  if kind == "relu": return a.relu()
  if kind == "sqrt_abs": return a.abs().sqrt()
  if kind == "neg": return -a
  if kind == "recip1": return (a * a + 1.0).reciprocal()
  if kind == "log_abs": return (a.abs() + 1.0).log()
  if kind == "tanh": return a.tanh()
  if kind == "add": return a + b
  if kind == "mul": return a * b
  if kind == "sub": return a - b
  if kind == "max": return a.maximum(b)
  if kind == "div1": return a / (b * b + 1.0)
  if kind == "where": return (a < b).where(a, b * 2.0)
  if kind == "permute": return a.permute(1, 0).permute(1, 0) + a.flip(0)
  if kind == "flip": return a.flip(1)
  if kind == "pad_shrink": return a.pad(((1, 1), (0, 2))).shrink(((2, a.shape[0] + 2), (1, a.shape[1] + 1)))
  if kind == "reshape": return a.reshape(-1).reshape(a.shape)
  if kind == "expand_sum": return a.sum(1, keepdim=True).expand(a.shape) * 0.1 + a.max(0, keepdim=True) * 0.5
  raise AssertionError(kind)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(_UN + _BIN + _MOV), st.integers(0, 100), st.integers(0, 100)),
                min_size=1, max_size=14),
       st.sampled_from([(1, 1), (3, 5), (17, 33), (32, 64)]), st.integers(0, 2 ** 31))
def test_random_graphs(steps, shape, seed):
  x, y = UOp.placeholder(shape, F32, "x"), UOp.placeholder(shape, F32, "y")
  pool = [x, y]
  for kind, i, j in steps:
    pool.append(_apply(kind, pool[i % len(pool)], pool[j % len(pool)]))
  outs = [pool[-1], pool[len(pool) // 2], pool[-1].sum()]
  rng = np.random.default_rng(seed)
  vals = {x: rng.standard_normal(shape).astype(np.float32), y: rng.standard_normal(shape).astype(np.float32)}
  both(outs, vals, rtol=2e-4, atol=2e-5)


_IOPS = ["add", "mul", "idiv", "mod", "shl", "shr", "max", "where", "and", "xor", "neg", "cast8"]


def _iapply(kind, a, b):
  if kind == "add": return a + b
  if kind == "mul": return a * b
  if kind == "idiv": return a // b
  if kind == "mod": return a % b
  if kind == "shl": return a << (b & 31)
  if kind == "shr": return a >> b
  if kind == "max": return a.maximum(b)
  if kind == "where": return (a < b).where(a, b)
  if kind == "and": return a & b
  if kind == "xor": return a ^ b
  if kind == "neg": return -a
  if kind == "cast8": return a.cast(dtypes.int8).cast(dtypes.int32)
  raise AssertionError(kind)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(_IOPS + ["permute", "flip", "expand_sum"]), st.integers(0, 100),
                          st.integers(0, 100)), min_size=1, max_size=14), st.integers(0, 2 ** 31))
def test_random_integer_graphs_exact(steps, seed):
  shape = (7, 9)
  x, y = UOp.placeholder(shape, dtypes.int32, "x"), UOp.placeholder(shape, dtypes.int32, "y")
  pool = [x, y]
  for kind, i, j in steps:
    a, b = pool[i % len(pool)], pool[j % len(pool)]
    if kind == "permute": r = a.permute(1, 0).permute(1, 0) + b.flip(1)
    elif kind == "flip": r = a.flip(0)
    elif kind == "expand_sum": r = a.sum(1, keepdim=True).expand(shape) + b.max(0, keepdim=True)
    else: r = _iapply(kind, a, b)
    pool.append(r)
  rng = np.random.default_rng(seed)
  vals = {x: rng.integers(-2 ** 31, 2 ** 31, shape, dtype=np.int32), y: rng.integers(-40, 40, shape, dtype=np.int32)}
  want = numpy_eval.evaluate([pool[-1], pool[len(pool) // 2]], vals)
  got = program.evaluate_c([pool[-1], pool[len(pool) // 2]], vals)
  for g, w in zip(got, want): np.testing.assert_array_equal(g, w)


def test_one_program_from_four_threads():
  x = UOp.placeholder((300, 200), F32, "x")
  p = program.compile_program([(x.exp() * 2.0).sum(1), x.T @ x], [x])
  vals = [rnd(300, 200, seed=i) for i in range(4)]
  want = [p(v) for v in vals]

  def run(i):
    for _ in range(20):
      r = p(vals[i])
      np.testing.assert_allclose(r[0], want[i][0], rtol=1e-6)
      np.testing.assert_allclose(r[1], want[i][1], rtol=1e-6)
  run_on_threads(run, 4)


@pytest.mark.parametrize("isa", [0, 1, 2])
def test_every_instruction_set(isa):
  try:
    vmlib.set_isa(isa)
  except ValueError:
    pytest.skip("this CPU lacks it")
  try:
    x, y = UOp.placeholder((3, 1030), F32, "x"), UOp.placeholder((1030, 40), F32, "y")
    i = UOp.placeholder((1030,), dtypes.int16, "i")
    outs = [(x.sin() * x.exp2() + x.abs().sqrt() / (x * x + 1.0)).log2(), x @ y, (x * x).sum(1), x.max(0),
            (i >> 3) // (i + 1), i.cast(dtypes.float16) * 1.5]
    rng = np.random.default_rng(isa)
    both(outs, {x: rnd(3, 1030), y: rnd(1030, 40, seed=1), i: rng.integers(-3000, 3000, 1030).astype(np.int16)},
         rtol=2e-3, atol=1e-3)
  finally:
    vmlib.set_isa(-1)


_LOSSES = {
  "softmax": lambda x, w, v: (x.softmax(1) * x).sum(),
  "log_softmax": lambda x, w, v: x.log_softmax(0).sum(),
  "matmul_tanh": lambda x, w, v: (x @ w).tanh().mean(),
  "max": lambda x, w, v: x.max(1).sum() + x.max(),
  "pad_shrink_flip": lambda x, w, v: (x.pad(((1, 2), (3, 0))).flip(0).shrink(((1, 7), (2, 10))) * x).sum(),
  "pow": lambda x, w, v: (x.abs() + 1.0).pow(1.7).sum(),
  "where_relu": lambda x, w, v: ((x > 0).where(x, x * 0.1) + x.relu()).sum(),
  "broadcast": lambda x, w, v: (x * v + v.sum()).sigmoid().sum(),
  "permute_reshape": lambda x, w, v: x.permute(1, 0).reshape(4, 12).sin().sum(),
  "prod": lambda x, w, v: (x * 0.1 + 1.0).prod(1).sum(),
  "min_mean": lambda x, w, v: x.min(0).mean(),
  "exp_log": lambda x, w, v: ((x * 0.3).exp() + 1.0).log().sum(),
  "cast_f16": lambda x, w, v: (x.cast(dtypes.float16) * 2.0).cast(F32).sum(),
  "batched": lambda x, w, v: (x.reshape(2, 3, 8) @ w).sum(),
  "mm2": lambda x, w, v: ((x @ w) @ w.T).sum(),
}


@pytest.mark.parametrize("name", list(_LOSSES))
def test_gradients_first_and_second_order(name):
  """Gradient graphs (constants broadcast into outputs, reductions of expands, ...) on the VM as on numpy."""
  x, w, v = UOp.placeholder((6, 8), F32, "x"), UOp.placeholder((8, 5), F32, "w"), UOp.placeholder((8,), F32, "v")
  loss = _LOSSES[name](x, w, v)
  topo = loss.toposort()
  targets = [t for t in (x, w, v) if t in topo]
  grads = loss.gradient(*targets)
  vals = {x: rnd(6, 8), w: rnd(8, 5, seed=1), v: rnd(8, seed=2)}
  vals = {k: a for k, a in vals.items() if k in targets}
  both([loss, *grads], vals, rtol=2e-5, atol=2e-6)
  both(grads[0].sum().gradient(targets[0]), vals, rtol=2e-5, atol=2e-6)


def test_outputs_that_are_broadcast_constants():
  x = UOp.placeholder((3, 4), F32, "x")
  both([x.const_like(2.5), x.const_like(1.0) * 3.0 + 1.0, x.sum().gradient(x)[0]], {x: rnd(3, 4)})


def test_nested_tuple_outputs_and_noop():
  x = UOp.placeholder((2,), F32, "x")
  t = UOp.maketuple(x, x * 2.0)
  r = program.evaluate_c([t, t.gettuple(1), UOp.sink(x, t), UOp(Ops.NOOP)], {x: np.array([1.0, 2.0], np.float32)})
  assert type(r[0]) is tuple and len(r[0]) == 2 and type(r[2][1]) is tuple and r[3] is None
  np.testing.assert_array_equal(r[2][1][1], [2.0, 4.0])


def test_many_scalar_registers():
  """A (1, 1) graph runs every register as a scalar: the register file must hold them all (an ASan find)."""
  x, y = UOp.placeholder((1, 1), F32, "x"), UOp.placeholder((1, 1), F32, "y")
  h = x
  for i in range(40): h = (h * y + float(i)).sin() + h.sum(1, keepdim=True) * 0.5
  both([h, (h * x).sum()], {x: rnd(1, 1), y: rnd(1, 1, seed=1)}, rtol=1e-4)


def _sin_chain_gradient(depth: int):
  x = UOp.placeholder((), F32, "x")
  y = x
  for _ in range(depth): y = y.sin()
  return x, y.gradient(x)[0]


def test_compile_is_linear_in_fused_group_size():
  """A scalar sin chain's gradient is one fused group of ~5 nodes per level: planning and lowering it must take
  time linear in its size (register allocation scanned a free list growing with the group: quadratic). Growing
  the group 8x may grow the compile time ~8x, far from the 64x of a quadratic pass (a ratio, not a timing)."""
  import time

  def compile_time(depth):
    x, g = _sin_chain_gradient(depth)
    best = float("inf")
    for _ in range(2):
      t = time.perf_counter()
      p = program.compile_program(g, [x])
      best = min(best, time.perf_counter() - t)
    assert p.stats["fused_groups"] == 1
    v = np.float32(0.5)
    np.testing.assert_allclose(p(v), numpy_eval.evaluate([g], {x: v})[0], rtol=1e-4)
    return best

  small, big = compile_time(1500), compile_time(12000)
  assert big / small < 24, (small, big)
