"""A user's program over pygrad's public API (SPEC sections 1-6), fully annotated: `mypy --strict` accepts it
against the package's inline types (py.typed). tests/test_typing.py runs the check; pytest does not collect this
file and nothing calls its functions."""
from __future__ import annotations
import numpy as np
import pygrad
import pygrad.viz
from pygrad import (UOp, Ops, GroupOp, dtypes, DType, UPat, PatternMatcher, graph_rewrite, compute_gradient, CallInfo,
                    Metadata, metadata, evaluate, compile, Walk)


def nodes() -> tuple[UOp, UOp, UOp]:
  x = UOp.placeholder((8, 4), dtypes.float32, "x")
  w = UOp.placeholder((4, 3), dtypes.float32, name="w", device="CPU")
  c: UOp = UOp.const(2.0)
  v = UOp.variable("n", 0, 10, dtypes.int32)
  y = ((x @ w).relu() * c).sum(axis=1).mean() + x.const_like(1.0).sum()
  z = y.sin().exp().log2().sqrt().maximum(y).cast(dtypes.float64)
  shape: tuple[int, ...] = x.shape
  dt: DType = x.dtype
  op: Ops = x.op
  n: int = x.ndim + x.numel
  t = UOp.maketuple(y, z).gettuple(0)
  s = UOp.sink(y, z, v)
  walk: Walk = s.toposort()
  first: UOp = walk[0]
  print(shape, dt, op, n, t, len(walk), first in walk, list(reversed(walk)), x.device, x.metadata, x.arg, x.src,
        x.tag, GroupOp.ALU, x.reshape((4, 8)).permute((1, 0)).expand((4, 8)).simplify(), y.substitute({x: x}))
  return x, w, y


def gradients(x: UOp, w: UOp, y: UOp) -> list[UOp]:
  gx, gw = y.gradient(x, w)
  body = (x.param_like(0) * 2.0).sum()
  called = body.call(x, name="double_sum")
  gs: dict[UOp, UOp] = compute_gradient(y, y.const_like(1.0), {x, w})
  with metadata("layer1"):
    m = x * 3.0
  info: CallInfo | None = None
  md: Metadata | None = None
  print(called, gs, m, info, md)
  return [gx, gw]


def rules(x: UOp) -> UOp:
  pm = PatternMatcher([(UPat(Ops.MUL, src=(UPat.var("a"), UPat.cvar("c"))), lambda a, c: a * c)])
  r: UOp | None = pm.rewrite(x)
  return graph_rewrite(x if r is None else r, pm)


def run(x: UOp, w: UOp, y: UOp, grads: list[UOp]) -> list[np.ndarray]:
  xv, wv = np.ones((8, 4), np.float32), np.ones((4, 3), np.float32)
  prog = compile([y, *grads], [x, w])
  outs = prog(xv, wv)
  val = evaluate(y, {x: xv, w: wv}, engine="numpy")
  both = evaluate([y, grads[0]], {x: xv, w: wv})
  pygrad.set_num_threads(1)
  nt: int = pygrad.get_num_threads()
  print(val, both, nt, pygrad.core_name(), pygrad.live_nodes())
  return list(outs)


def save(y: UOp, path: str) -> UOp:
  blob: bytes = pygrad.dumps([y])
  back = pygrad.loads(blob)
  pygrad.save(path, [y])
  again = pygrad.load(path)
  text: str = pygrad.listing([y]) + y.listing()
  dot: str = pygrad.viz.to_dot([y])
  print(again, text, dot)
  return back if isinstance(back, UOp) else back[0]
