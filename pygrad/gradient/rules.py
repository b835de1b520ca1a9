"""The gradient rules: `pm_gradient` holds one rule per op (the rule gets the incoming gradient as ctx and returns
one gradient per source, None where none flows), `call_gradient` differentiates a FUNCTION or CALL, `accumulate`
adds a gradient into what a node has so far. Drivers (direct.py, templated.py) walk a graph and apply them; this
module imports no driver: call_gradient asks its driver for the gradient of a body by yielding the request.
Where a rule differs from the seeds on purpose, its comment says so (SPEC §4)."""
from __future__ import annotations
import math
from ..ops import Ops
from ..dtype import dtypes
from ..upat import UPat, PatternMatcher
from ..uop import UOp
from ..core import CORE

_LN2 = math.log(2)


def _argsort(x) -> tuple[int, ...]: return tuple(sorted(range(len(x)), key=x.__getitem__))


def _to_input(x: UOp, ret: UOp) -> UOp:
  """A reduced-shape gradient expanded back over the reduce's input."""
  return x.expand(ret.src[0].shape)


def reduce_gradient(ctx: UOp, ret: UOp) -> tuple[UOp]:
  op, axes = ret.arg
  x = ret.src[0]
  if op is Ops.ADD: return (_to_input(ctx, ret),)
  if op is Ops.MAX:
    # ties share the gradient evenly
    mask = x.eq(_to_input(ret, ret)).cast(ctx.dtype)
    count = mask.r(Ops.ADD, axes)
    return ((mask / _to_input(count, ret)) * _to_input(ctx, ret),)
  # MUL: the product of the other entries, as exclusive prefix times exclusive suffix products (no division): exact
  # where inputs are zero and built of MUL/PAD/SHRINK/WHERE only, so it differentiates again exactly at zeros too.
  # (The seeds divide ctx * ret by x, which is nan at zeros; a zero-count formulation is exact but piecewise
  # constant around zeros, so its second order is wrong there.)
  return (_to_input(ctx, ret) * _others_product(x, axes),)


def _shift_in_ones(y: UOp, d: int) -> UOp:
  """y moved d places up its last axis with ones shifted in: out[..., i] = y[..., i-d] for i >= d, else 1."""
  *lead, n = y.shape
  keep, nopad = tuple((0, s) for s in lead), ((0, 0),) * len(lead)
  moved = y.shrink(keep + ((0, n - d),)).pad(nopad + ((d, 0),))
  head = y.shrink(keep + ((0, d),)).const_like(1).pad(nopad + ((0, n - d),))  # 1 in the first d places, else 0
  return head.ne(0).where(y.const_like(1), moved)


def _exclusive_cumprod(y: UOp) -> UOp:
  """prod(y[..., :i]) at i along the last axis, by log2(n) doubling steps (Hillis-Steele)."""
  n, z, d = y.shape[-1], _shift_in_ones(y, 1), 1
  while d < n:
    z = z * _shift_in_ones(z, d)
    d *= 2
  return z


def _others_product(x: UOp, axes) -> UOp:
  """For every entry of x, the product of the other entries of its reduce group (the reduced `axes`)."""
  keep = [i for i in range(x.ndim) if i not in axes]
  red = sorted(axes)
  n = math.prod(x.shape[i] for i in red)
  if n <= 1: return x.const_like(1)
  perm = keep + red
  y = x.permute(perm).reshape(tuple(x.shape[i] for i in keep) + (n,))
  last = y.ndim - 1

  def excl(v): return _exclusive_cumprod(v) * _exclusive_cumprod(v.flip(last)).flip(last)
  # the zero entries' product (0 or 1, exact) times the others' (which may overflow): one chain of both overflowed to
  # inf where a zero made another product 0, and inf * 0 is NaN where the product of the others is 0 (torch's
  # gradient). Each factor is a product of the entries themselves, so the result differentiates again exactly.
  zero = y.eq(0)
  zs, ns = excl(zero.where(y, 1)), excl(zero.where(1, y))
  # 0 * inf: 0, with the operands replaced by 1 there so that the gradient (0) arriving there stays 0, not 0 * inf
  lost = zs.eq(0) & (ns.eq(math.inf) | ns.eq(-math.inf))
  others = lost.where(0, zs * lost.where(1, ns))
  return others.reshape(tuple(x.shape[i] for i in perm)).permute(_argsort(perm))


def _after_gradient(ctx: UOp, ret: UOp) -> tuple[UOp, UOp]:
  buf, k = ret.src
  i = k.src[1:].index(buf)
  noop = UOp(Ops.NOOP)
  return (ctx, UOp.maketuple(*(ctx if j == i else noop for j in range(len(k.src) - 1))))


# ctx is the gradient flowing into the matched node
pm_gradient = PatternMatcher([
  # float to float as in the seeds; a CAST to or from an integer or bool dtype passes no gradient (as PyTorch and
  # JAX: the seeds would pass a quantised one, d/dx x.cast(int).cast(float) * x = 2 at 1.7)
  (UPat(Ops.CAST, name="ret"), lambda ctx, ret:
    (ctx.cast(ret.src[0].dtype) if dtypes.is_float(ret.dtype) and dtypes.is_float(ret.src[0].dtype) else None,)),
  (UPat(Ops.RECIPROCAL, name="ret"), lambda ctx, ret: (-ctx * ret * ret,)),
  # cos(x), not the seeds' sin(pi/2 - x): pi/2 - x rounds x's low bits away, so at |x| ~ 1e129 (or 1e8 in float32)
  # the seeds' derivative was any number in [-1, 1] (cos is 1 - 2 sin(x/2)**2: see mathops)
  (UPat(Ops.SIN, name="ret"), lambda ctx, ret: (ret.src[0].cos() * ctx,)),
  (UPat(Ops.LOG2, name="ret"), lambda ctx, ret: (ctx / (ret.src[0] * _LN2),)),
  (UPat(Ops.EXP2, name="ret"), lambda ctx, ret: (ret * ctx * _LN2,)),
  (UPat(Ops.SQRT, name="ret"), lambda ctx, ret: (ctx / (ret * 2),)),
  (UPat(Ops.TRUNC), lambda ctx: (ctx.const_like(0),)),
  (UPat((Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ)), lambda: (None, None)),
  (UPat(Ops.ADD), lambda ctx: (ctx, ctx)),
  # d/db is 0 where e == 0 by selection, not by multiplying with e (as PyTorch): the seeds' first-order values, and
  # differentiated again it is torch's: d2/(db de) = 0 at e == 0 (the seeds' rule, like JAX, gives 1/b there), and a
  # non-finite gradient arriving there on a second-order path (log2(b) at b < 0 or b = +-inf) no longer turns the 0
  # into NaN (SPEC 4: torch's value wherever it is finite)
  (UPat(Ops.POW, name="ret", src=(UPat.var("b"), UPat.var("e"))), lambda ctx, ret, b, e:
    (e.eq(0).where(0, ctx * (e * b.pow(e - 1))),
     ctx * b.eq(0).where((e < 0).where(ret.const_like(-math.inf), 0), ret * b.log2() * _LN2))),
  # ties split evenly as in the seeds; written as "all of it unless the other is larger", so against a NaN (no
  # comparison holds) both operands get the gradient, as in PyTorch (the seeds' rule, like JAX, passes none; SPEC 4)
  (UPat(Ops.MAX, src=(UPat.var("x"), UPat.var("y"))), lambda ctx, x, y:
    ((x < y).where(0, x.eq(y).where(ctx * 0.5, ctx)), (x > y).where(0, x.eq(y).where(ctx * 0.5, ctx)))),
  (UPat(Ops.MUL, name="ret"), lambda ctx, ret: (ret.src[1] * ctx, ret.src[0] * ctx)),
  (UPat(Ops.WHERE, name="ret"), lambda ctx, ret:
    (None, ret.src[0].where(ctx, ctx.const_like(0)), ret.src[0].where(ctx.const_like(0), ctx))),
  (UPat(Ops.REDUCE_AXIS, name="ret"), reduce_gradient),
  (UPat(Ops.CONTIGUOUS), lambda ctx: (ctx,)),
  (UPat(Ops.CONTIGUOUS_BACKWARD), lambda ctx: (ctx.contiguous(),)),
  (UPat(Ops.RESHAPE, name="ret"), lambda ctx, ret: (ctx.reshape(ret.src[0].shape),)),
  (UPat(Ops.EXPAND, name="ret"), lambda ctx, ret:
    (ctx.r(Ops.ADD, tuple(i for i, (s, n) in enumerate(zip(ret.src[0].shape, ret.shape)) if s != n)),)),
  (UPat(Ops.PAD, name="ret"), lambda ctx, ret:
    (ctx.shrink(tuple((p[0], s + p[0]) for s, p in zip(ret.src[0].shape, ret.marg))),)),
  (UPat(Ops.SHRINK, name="ret"), lambda ctx, ret:
    (ctx.pad(tuple((p[0], s - p[1]) for s, p in zip(ret.src[0].shape, ret.marg))),)),
  (UPat(Ops.PERMUTE, name="ret"), lambda ctx, ret: (ctx.permute(_argsort(ret.marg)),)),
  (UPat(Ops.FLIP, name="ret"), lambda ctx, ret: (ctx.flip(tuple(i for i, f in enumerate(ret.marg) if f)),)),
  (UPat(Ops.COPY, name="ret"), lambda ctx, ret: (ctx.copy_to_device(ret.src[0].device),)),
  # a sharded MULTI re-shards as in the seeds; a replicated one (axis None) evaluates to its one value, so only one
  # copy passes the gradient back (the seeds' rule would count it once per device)
  (UPat(Ops.MULTI, name="ret"), lambda ctx, ret: ctx.shard(ret.device, ret.axis).src if ret.axis is not None else
    (ctx.copy_to_device(ret.src[0].device), *(None for _ in ret.src[1:]))),
  # an element that got no gradient (NOOP) passes none: it never reaches a target as a NOOP
  (UPat(Ops.TUPLE), lambda ctx: tuple(None if g.op is Ops.NOOP else g for g in ctx.src)),
  (UPat(Ops.AFTER, name="ret"), _after_gradient),
  # there's no gradient through a bitcast
  (UPat(Ops.BITCAST), lambda: (None,)),
])


def call_gradient(ctx: UOp, k: UOp, needed: set[int]):
  """Gradients of a FUNCTION or CALL for its sources (None for the body), as a generator: it yields
  (body, root_grad, targets) when it needs the gradients of a body, is sent that mapping back, and returns the
  tuple. ctx is a TUPLE with one gradient per output (NOOP where an output got none). A grad_fxn gets the
  gradients, NOOPs dropped, and the call node; else the body is differentiated for the `needed` argument indices
  into one backward FUNCTION. (A generator, so a driver nests bodies on a stack of its own, never recursing.)"""
  args = k.src[1:]
  grads_in = list(ctx.src) if ctx.op is Ops.TUPLE else [ctx]
  if k.arg.grad_fxn is not None:
    # as in the seeds: a call with several outputs gets its gradients as a tuple, one with a single output as one
    gs = [g for g in grads_in if g.op is not Ops.NOOP]
    ret = k.arg.grad_fxn(*gs, call=k) if len(grads_in) > 1 else k.arg.grad_fxn(gs[0], k)
    ret = tuple(ret) if isinstance(ret, (tuple, list)) else (ret,)
    if len(ret) != len(args):
      raise RuntimeError(f"grad_fxn of {k.op.name} {k.arg.name!r} returned {len(ret)} gradients for {len(args)} args")
    return (None, *ret)
  if k.op is Ops.CALL:
    raise RuntimeError(f"failed to compute gradient for CALL {k.arg.name!r}: a CALL needs a grad_fxn")
  body = k.src[0]
  params = {p.arg[0]: p for p in body.toposort(enter_calls=False) if p.op is Ops.PARAM}
  n = len(args)
  gin: list[UOp] = []
  root = []
  for g in grads_in:
    # a gradient on no device (a broadcast constant) is part of the backward body, not an argument of it, as in
    # tinygrad 0.14's call_gradient: tinygrad's precompiled FUNCTION cannot realize a device-less argument (its
    # contiguous() fails verification), so a backward converted out with one failed there (ops fuzzer, seed 1143)
    if g.op is Ops.NOOP or g.device is None: root.append(g)
    else:
      root.append(g.param_like(n + len(gin)))
      gin.append(g)
  targets = {params[i] for i in needed if i in params}
  grads = yield (body, UOp.maketuple(*root), targets)
  outs = [(i, grads[params[i]]) for i in sorted(needed)
          if i in params and params[i] in grads and grads[params[i]].op is not Ops.NOOP]
  ret: list[UOp | None] = [None] * (n + 1)
  if not outs: return tuple(ret)
  bwd_body = UOp.maketuple(*(g for _, g in outs))
  bwd_args = list(args) + gin
  if k.arg.precompile:
    # reuse the forward's outputs: each one the backward needs becomes a parameter bound to it
    inside = bwd_body.toposort(enter_calls=False)
    reuse = {}
    for j, o in enumerate(body.src):
      if o.op not in (Ops.PARAM, Ops.CONST, Ops.NOOP) and o in inside and o not in reuse:
        reuse[o] = o.param_like(len(bwd_args))
        bwd_args.append(k.gettuple(j))
    bwd_body = bwd_body.substitute(reuse, enter_calls=False)
  # compact the parameters: keep those the backward uses, renumbered in order
  bparams = {p.arg[0]: p for p in bwd_body.toposort(enter_calls=False) if p.op is Ops.PARAM}
  used = sorted(bparams)
  renum = {bparams[old]: UOp(Ops.PARAM, bparams[old].dtype, (), (new, *bparams[old].arg[1:]))
           for new, old in enumerate(used) if new != old}
  # (in its own scope: a nested call's body has PARAMs of its own, hash-consed with these where slot, dtype and
  # shape agree; renumbering them too gave a silently wrong gradient: test_nested_function_backward_keeps_inner_params)
  bwd_body = bwd_body.substitute(renum, enter_calls=False)
  bwd = bwd_body.call(*(bwd_args[i] for i in used), name=(k.arg.name or "") + "_backward",
                      precompile=k.arg.precompile_backward)
  for idx, (i, _) in enumerate(outs): ret[1 + i] = bwd.gettuple(idx)
  return tuple(ret)


def check_captured(k: UOp, targets: set) -> None:
  """A FUNCTION body on a target path: a target read in the body directly (a captured BUFFER, not a PARAM) would get
  a silently zero gradient, since only arguments are differentiated, so it is an error (SPEC §4; the seeds assert
  no BUFFER is in a backward slice). PARAMs are the body's own inputs."""
  inside = [t for t in targets if t.op is not Ops.PARAM]
  if not inside: return
  body_ids = set(CORE.toposort([k.src[0]._id]))
  for t in inside:
    if t._id in body_ids:
      what = f"BUFFER {t.arg[3]!r}" if t.op is Ops.BUFFER and t.arg[3] else f"{t.op.name}{t.shape}"
      raise ValueError(f"gradient: {what} is captured in the body of FUNCTION {k.arg.name!r} instead of being passed "
                       "as an argument (read through a PARAM); its gradient is not computed: pass it to .call()")


def accumulate(prev: UOp | None, v: UOp, k: UOp) -> UOp:
  """k's gradient so far (prev, None for none) plus a new one (v)."""
  if k.shape == () and v.shape != () and v.op is not Ops.TUPLE: v = v.sum()
  if prev is None or prev.op is Ops.NOOP: return v
  if v.op is Ops.NOOP: return prev
  if v.op is Ops.TUPLE and prev.op is Ops.TUPLE:
    return UOp.maketuple(*(n if p.op is Ops.NOOP else p if n.op is Ops.NOOP else p + n for p, n in zip(prev.src, v.src)))
  if k.device is None and prev.device != v.device and prev.device is not None and v.device is not None:
    # a node on no device (a constant, a variable) used on two devices gets a gradient on each: summed on the
    # first's device (the ADD of the two raised "operands on different devices", even for an off-path constant)
    v = v.copy_to_device(prev.device)
  return prev + v


def check_rule_result(t0: UOp, lgrads) -> None:
  if lgrads is None: raise RuntimeError(f"failed to compute gradient for {t0.op.name}\n\nin {str(t0)[0:1000]}...")
  if len(lgrads) != len(t0.src):
    raise RuntimeError(f"gradient rule for {t0.op.name} gave {len(lgrads)} gradients for {len(t0.src)} sources")


# What needs Python, stated once (the C driver gets it as data, csrc/grad.c). A rule's result may be cached per node
# signature (op, dtype, arg, tag, shapes/dtypes of the node, its sources and its gradient) unless the rule reads
# more than that: calls and GETTUPLE (bodies, grad_fxn, per-output TUPLEs), TUPLE/AFTER/MULTI (their gradient is a
# TUPLE or names other nodes), SINK (no rule). Gradients that are TUPLE or NOOP are the ones `accumulate` treats
# apart, and a node whose gradient is a TUPLE steps in Python too.
PY_NODE_OPS = frozenset({Ops.GETTUPLE, Ops.FUNCTION, Ops.CALL, Ops.TUPLE, Ops.AFTER, Ops.MULTI, Ops.SINK})
PY_GRAD_OPS = frozenset({Ops.TUPLE, Ops.NOOP})
