"""Random tinygrad programs with the ops test_interop_tinygrad_fuzz.py's generator never makes (issue 14): explicit
CONTIGUOUS and CONTIGUOUS_BACKWARD mid-program, DETACH, BITCAST round trips, COPY between devices, variables (bound:
AFTER/STORE of a DEFINE_VAR; unbound: DEFINE_VAR fed by value), assigns (AFTER/STORE into a fresh buffer),
FUNCTION/TUPLE/GETTUPLE (tinygrad's @function, with and without a grad_fxn, one or two outputs, a random body) and
CALL (Tensor.custom_kernel with a grad_fxn). Each program mixes these with the base generator's steps and gets the
base module's checks (round trip `is`, values on both of pygrad's engines against tinygrad's realized step by step,
first- and second-order gradients against tinygrad's own).

Where a check cannot apply:
* a program with a custom kernel (CALL of a tinygrad kernel body): pygrad's engines cannot run tinygrad's kernel,
  so its values are not checked by pygrad and both derivations' gradients are realized by tinygrad instead;
* an unbound variable cannot be realized by tinygrad: the stepwise replay uses its value as a constant;
* tinygrad encodings pygrad has no form for raise ValueError naming them (test_unsupported_raise): sharding
  (tinygrad 0.14 shards by COPY to a device tuple + UNSHARD, not by a MULTI op), symbolic shapes, a view assign,
  a BITCAST that changes the itemsize (pygrad's BITCAST keeps it: SPEC section 2).
`python tests/test_interop_tinygrad_fuzz_ops.py N [FIRST]` runs N seeds from FIRST (the test runs SEEDS)."""
from __future__ import annotations
import random
import numpy as np
import pytest

pytest.importorskip("tinygrad", reason="tinygrad is not installed (pip install '.[tinygrad]')")
from tinygrad import Device, Tensor, Variable, dtypes as tdtypes  # noqa: E402
from tinygrad.uop.ops import UOp as TUOp, KernelInfo  # noqa: E402
from tinygrad.function import function  # noqa: E402
import pygrad.interop.tinygrad as pt  # noqa: E402
import test_interop_tinygrad_fuzz as base  # noqa: E402

DEV, DEV1 = base.DEV, base.DEV + ":1"
# tinygrad 0.14 runs a @function's body with device use disallowed, and a Python constant there (x * 2.0) looks up
# Device.DEFAULT: "no usable devices" unless it was looked up before (then cached). Looked up here, so a seed's
# outcome does not depend on the seeds run before it.
Device.DEFAULT  # noqa: B018
SEEDS = 16


def _unary(rng: random.Random):
  return rng.choice((lambda x: x.sin(), lambda x: x * 1.5 + 0.25, lambda x: (x.abs() + 1.0).sqrt(), lambda x: x.relu()))


def _affine_kernel(out: TUOp, x: TUOp) -> TUOp:
  """A tinygrad kernel body: out = 2x + 1, elementwise."""
  x, out = x.flatten(), out.flatten()
  i = TUOp.range(x.shape[0], 0)
  return out[i].store(x[i] * 2.0 + 1.0).end(i).sink(arg=KernelInfo(name=f"affine_{x.shape[0]}"))


def _affine_grad(g: TUOp, call: TUOp) -> tuple:
  return (None, g * 2.0)  # (the output buffer's slot gets none)


def _fresh_in_body(arr: np.ndarray) -> Tensor:
  """A new input made in a function body: from a list, a PYTHON buffer (or a constant), not a numpy one. A numpy
  array makes an NPY buffer and a COPY to PYTHON; in a body it is an implicit NPY argument, and tinygrad's own
  second-order derivation through that COPY gives a gradient PARAM on NPY among PYTHON operands, a graph of mixed
  devices pygrad rejects and tinygrad cannot realize either (seed 5039)."""
  return Tensor(arr.tolist(), device=DEV)


def _grad_fxn(scale: float):
  """A custom gradient for a FUNCTION (not the true one: both derivations must call it and agree): each argument
  gets `scale` times the sum of the output gradients, broadcast to its shape."""
  def grad_fxn(*gs, call=None):
    if call is None: *gs, call = gs  # (one output: tinygrad passes (gradient, call) positionally)
    tot = None
    for g in gs:
      s = g.sum() if g.shape else g
      tot = s if tot is None else tot + s
    return tuple((tot * scale).reshape((1,) * len(a.shape)).expand(a.shape) if a.shape else tot * scale
                 for a in call.src[1:])
  return grad_fxn


def _function_step(rng: random.Random, pool: list, env: dict, stepwise: bool, kernels: bool, depth: int) -> Tensor:
  """A call of a @function whose body is 1-3 steps of this module (functions nest twice at most) over 1-2 pool
  tensors; 1 or 2 outputs, maybe a grad_fxn, maybe precompiled. The body draws from its own seed, so the stepwise
  replay (the body called directly, its steps realized one by one: a realize is not allowed inside a function)
  draws the same program."""
  # (a function called in a body takes one argument: tinygrad 0.14's own call_gradient compacts the outer backward's
  # PARAMs counting the inner body's too, and an inner PARAM slot past the outer's arguments raises IndexError in
  # tinygrad's own derivation: function(lambda x: inner(x, x + 1.0, x + 2.0)), seed 3113)
  args = rng.sample(pool, min(len(pool), 1 if depth else rng.randint(1, 2)))
  sub, nout, gf = rng.randrange(1 << 30), rng.randint(1, 2), rng.random() < 0.3
  scale, pre, preb = rng.choice((0.5, 2.0)), rng.random() < 0.2, rng.random() < 0.2

  def body(*xs):
    r, npr = random.Random(sub), np.random.default_rng(sub)
    inner = list(xs)
    for _ in range(r.randint(1, 3)):
      t = _step(r, inner, npr, env, stepwise, kernels, depth + 1)
      inner.append(t.contiguous().realize() if stepwise else t)
    outs = inner[len(xs):][-nout:]
    # (an output that is a COPY itself would make tinygrad 0.14's function an opaque CALL, and its gettuple then
    # asserts: function(lambda x: x.to(DEV1)); the copy steps end in a MUL)
    return outs[0] if len(outs) == 1 else tuple(outs)
  fn = body if stepwise else function(body, allow_implicit=True, grad_fxn=_grad_fxn(scale) if gf else None,
                                      precompile=pre, precompile_backward=preb)
  got = fn(*args)
  if not isinstance(got, tuple): return got
  a, b = got
  return a + b.mean() * 0.5  # both outputs used: gradients accumulate per output through GETTUPLE


def _step(rng: random.Random, pool: list, nprng: np.random.Generator, env: dict, stepwise: bool, kernels: bool,
          depth: int = 0):
  """One step: a base step or one of the ops above (depth: inside how many function bodies)."""
  k = rng.randrange(20 if kernels and not depth else 19)  # (kernels: the program's gradients are realized by
  # tinygrad, in function bodies too; a custom kernel is drawn outside them)
  # no assign in a function body (its fresh buffer is realized: not allowed there), functions nest twice at most
  if k < 8 or (depth and k == 15) or (depth >= 2 and 16 <= k <= 18):
    return base._step(rng, pool, nprng, _fresh_in_body if depth else base._fresh)
  a = pool[rng.randrange(len(pool))]
  # (each step grows values at most linearly: a product of two pool values compounds over nested steps, and a
  # gradient through sin of a value ~1e4 is float32 rounding amplified past the tolerance, seed 73 at first)
  if k == 8: return _unary(rng)(a).contiguous()
  if k == 9: return _unary(rng)(a).contiguous_backward()
  if k == 10: return a + _unary(rng)(a).detach().sin() * a
  if k == 11:  # a BITCAST round trip, with integer work between: abs by the sign bit, or the bits unchanged
    if rng.random() < 0.5: return (a.bitcast(tdtypes.int32) & 0x7FFFFFFF).bitcast(tdtypes.float32).sin() * a
    return a.bitcast(tdtypes.uint32).bitcast(tdtypes.float32) + a
  if k == 12 and depth and kernels: return base._step(rng, pool, nprng, _fresh_in_body)  # (tinygrad 0.14 cannot
  # realize a COPY of a PARAM in a function body, its own gradients neither: seed 3027)
  if k == 12:  # COPY to another device of the same kind and back, maybe with a partner copied too
    b = rng.choice([b for b in pool if base._broadcasts(a.shape, b.shape)])
    x = a.to(DEV1) * b.to(DEV1) if rng.random() < 0.4 else a.to(DEV1)
    return _unary(rng)(x).to(DEV) * (a.sin() if rng.random() < 0.5 else 1.0)
  if k == 13:  # a bound variable: tinygrad's AFTER(DEFINE_VAR, STORE(value)) read as a value
    return a * Variable(f"v{len(pool)}", 1, 10).bind(rng.randint(1, 10)) * 0.125 + a.sin()
  if k == 14 and not kernels:  # an unbound variable: a DEFINE_VAR pygrad evaluates from its feed (the replay uses
    # the value; not with kernels: their gradients are realized by tinygrad, which cannot run an unbound variable)
    name, val = f"w{len(pool)}", rng.choice((0.5, 1.25, 3.0))
    env[name] = np.float32(val)
    return a * (val if stepwise else TUOp.variable(name, -4.0, 4.0, dtype=tdtypes.float32)) + a.sin()
  if k in (14, 15):  # an assign into a fresh realized buffer, read after
    # (Tensor(0.0, device=DEV) would be a device-less constant, cloned to the default device by assign)
    c = Tensor.zeros(a.shape, device=DEV).contiguous().realize()
    return c.assign(_unary(rng)(a)) * a.sin()
  if k <= 18: return _function_step(rng, pool, env, stepwise, kernels, depth)
  # a tinygrad kernel (CALL) on a contiguous input, differentiated by its grad_fxn
  out = Tensor.empty(*a.shape, device=DEV) if a.shape else Tensor.empty(1, device=DEV)
  x = a.contiguous() if a.shape else a.reshape(1).contiguous()
  y = out.custom_kernel(x, fxn=_affine_kernel, grad_fxn=_affine_grad)[0]
  return y if a.shape else y.reshape(())


def _program(seed: int, stepwise: bool = False, kernels: bool = False):
  """(loss, inputs, outputs, env) as base._program, with this module's steps (env: unbound variables' values).
  kernels: custom kernels may be drawn (seeds 3 mod 4 in the test)."""
  rng, nprng = random.Random(seed), np.random.default_rng(seed)
  inputs = [Tensor(nprng.standard_normal(base._shape(rng, rng.randint(1, 3))).astype(np.float32), device=DEV).realize()
            for _ in range(rng.randint(2, 3))]
  pool, env = list(inputs), {}
  for _ in range(rng.randint(3, 9)):
    t = _step(rng, pool, nprng, env, stepwise, kernels)
    pool.append(t.contiguous().realize() if stepwise else t)
  outs = pool[len(inputs):][-3:]
  loss = outs[0].square().sum()
  for o in outs[1:]: loss = loss + (o * 0.5).sum()
  return loss, inputs, outs, env


def check(seed: int) -> None:
  kernels = seed % 4 == 3
  if not kernels: return base.check(seed, _program)
  drawn = _program(seed, kernels=True)
  opaque = any(u.op.name == "CALL" for u in drawn[0].uop.toposort())
  base.check(seed, lambda s, stepwise=False: _program(s, stepwise, kernels=True), opaque=opaque)


@pytest.mark.parametrize("seed", range(SEEDS))
def test_random_program(seed, own_engine):
  check(seed)


def test_custom_kernel_round_trip(own_engine):
  """A tinygrad custom kernel's CALL comes back as itself (to_tinygrad raised 'CALL None has a pygrad kernel':
  the kernel, converted in as a tagged SINK, was taken for a pygrad one), and its gradient, from its grad_fxn,
  realizes to tinygrad's own."""
  a = Tensor(np.arange(1, 7, dtype=np.float32).reshape(2, 3) / 7, device=DEV).realize()
  y = Tensor.empty(2, 3, device=DEV).custom_kernel(a.sin(), fxn=_affine_kernel, grad_fxn=_affine_grad)[0]
  loss = (y * a).square().sum()
  assert pt.to_tinygrad(pt.from_tinygrad([loss.uop]))[0] is loss.uop
  own = loss.gradient(a)[0].uop
  with pt.installed(): ours = loss.gradient(a)[0].uop
  x = a.numpy()
  want = 2 * (np.sin(x) * 2 + 1) * x * ((np.sin(x) * 2 + 1) + x * 2 * np.cos(x))
  for g in base._realize([ours, own]): np.testing.assert_allclose(g, want, rtol=1e-5)


def test_function_grad_fxn_one_output(own_engine):
  """A @function of one output with a grad_fxn: pygrad's rules call it (grad, call) positionally, as tinygrad does,
  and the interop's wrapper took `call` by keyword only (TypeError: found by the fuzzer, seed 12)."""
  a = Tensor(np.arange(1, 7, dtype=np.float32).reshape(2, 3) / 7, device=DEV).realize()
  f = function(lambda x: (x * 3.0).sin(), grad_fxn=lambda g, call: (g * 5.0,))
  loss = (f(a) * a).sum()
  own = loss.gradient(a)[0].uop
  with pt.installed(): ours = loss.gradient(a)[0].uop
  x = a.numpy()
  for g in base._evaluate([ours, own]): np.testing.assert_allclose(g, np.sin(3 * x) + 5 * x, rtol=1e-5)


def test_grad_fxn_inside_function_backward(own_engine):
  """A @function with a grad_fxn called in another @function's body whose first argument is unused: the outer
  backward's gradient PARAM (slot 3) goes out to the grad_fxn as a tinygrad PARAM that hash-conses with a forward
  body's of equal slot, and came back in as that one (another scope): a silently wrong gradient, or a FUNCTION with
  a PARAM slot past its arguments (found by the fuzzer, seed 1038)."""
  a = Tensor(np.arange(1, 4, dtype=np.float32) / 4, device=DEV).realize()
  u = Tensor(np.ones(3, np.float32), device=DEV).realize()
  inner = function(lambda x: x.sin() * x, grad_fxn=lambda g, call: (g * 2.0,))

  def outer(w, x):
    y = inner(x)
    return (y < 0.5).where(y, x), y.contiguous_backward()
  o0, o1 = function(outer)(u, a)
  loss = (o0 + o1 * 0.5).square().sum()
  own = loss.gradient(a)[0].uop
  with pt.installed(): ours = loss.gradient(a)[0].uop
  g, w = base._evaluate([ours, own])
  np.testing.assert_allclose(g, w, rtol=1e-5)


def test_function_assign_backward_realizes(own_engine):
  """An assign inside a @function (into a buffer the body makes: an implicit argument, a PARAM of the body): the
  backward FUNCTION pygrad makes takes that buffer as an argument too, so tinygrad realizes the gradient to its own
  (the view, a PARAM hidden in a tag, kept its slot: the backward stored into the gradient's argument, or failed)."""
  a = Tensor(np.arange(1, 4, dtype=np.float32) / 4, device=DEV).realize()

  def body(x):
    c = Tensor.zeros(x.shape, device=DEV).contiguous().realize()
    return c.assign(x.sin()) * x
  loss = function(body, allow_implicit=True)(a).square().sum()
  assert pt.to_tinygrad(pt.from_tinygrad([loss.uop]))[0] is loss.uop
  own = loss.gradient(a)[0].uop
  with pt.installed(): ours = loss.gradient(a)[0].uop
  x = a.numpy()
  want = 2 * np.sin(x) * x * (np.cos(x) * x + np.sin(x))
  for g in base._realize([ours, own]) + base._evaluate([ours]): np.testing.assert_allclose(g, want, rtol=1e-5)


@pytest.mark.parametrize("pre", [False, True])
def test_function_backward_deviceless_gradient_realizes(own_engine, pre):
  """A @function whose output gets a gradient on no device (the broadcast 1 of a sum): pygrad made it an argument
  of the backward FUNCTION, which tinygrad's precompiled FUNCTION cannot realize (verification of its EXPAND
  failed: seed 1143); it is part of the backward body, as tinygrad makes it."""
  a = Tensor(np.arange(1, 4, dtype=np.float32) / 4, device=DEV).realize()
  loss = function(lambda x: x.sin() * x, precompile_backward=pre)(a).sum()
  own = loss.gradient(a)[0].uop
  with pt.installed(): ours = loss.gradient(a)[0].uop
  x = a.numpy()
  for g in base._realize([ours, own]): np.testing.assert_allclose(g, np.cos(x) * x + np.sin(x), rtol=1e-5)


def test_function_backward_weak_argument_realizes(own_engine):
  """A bound variable read in a @function body (an implicit argument of weak dtype) whose backward pygrad
  renumbers (the first argument unused): the backward's PARAM for it goes out weak, as tinygrad's param_like makes
  it (it came out int32, and tinygrad refused the FUNCTION: 'arg 1 dtype mismatch', seed 6047)."""
  a = Tensor(np.arange(1, 4, dtype=np.float32) / 4, device=DEV).realize()
  u = Tensor(np.ones(3, np.float32), device=DEV).realize()
  v = Variable("v", 1, 10).bind(3)
  loss = function(lambda w, x: x.sin() * v, allow_implicit=True)(u, a).square().sum()
  own = loss.gradient(a)[0].uop
  with pt.installed(): ours = loss.gradient(a)[0].uop
  x = a.numpy()
  for g in base._realize([ours, own]): np.testing.assert_allclose(g, 18 * np.sin(x) * np.cos(x), rtol=1e-5)


def test_unsupported_raise():
  """tinygrad encodings pygrad has no form for raise ValueError naming them, never a silently different graph."""
  a = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3), device=DEV).realize()
  sharded = a.shard((DEV, DEV1), axis=0) * 2.0  # COPY to a device tuple, UNSHARD over a DEVICE range
  with pytest.raises(ValueError, match="COPY to"): pt.from_tinygrad([sharded.uop])
  v = Variable("n", 1, 6).bind(2)
  with pytest.raises(ValueError, match="symbolic shape"):
    pt.from_tinygrad([Tensor.ones(6, device=DEV).contiguous()[:v].sum().uop])
  c = Tensor.zeros(2, 3, device=DEV).contiguous().realize()
  c[0:1] = a[0:1] * 2.0  # a view assign (a STORE into a SHRINK of the buffer)
  with pytest.raises(ValueError): pt.from_tinygrad([c.uop])
  with pytest.raises(ValueError, match="BITCAST"): pt.from_tinygrad([a.bitcast(tdtypes.int16).uop])


if __name__ == "__main__":
  base.main(check)
