"""The direct driver: the reverse walk over a target path, running the rule of every node (the reference path, and
the pure-Python core's). `step` is one node of it, shared with the C driver for the nodes that need Python."""
from __future__ import annotations
import dataclasses
from ..ops import Ops
from ..uop import UOp, handle
from ..core import CORE
from .. import uop as _uop
from .rules import accumulate, call_gradient, check_captured, check_rule_result


def _noop() -> UOp: return UOp(Ops.NOOP)


def backward_metadata(fwd: tuple) -> tuple:
  """The metadata a node's gradient nodes get: copies of the node's, marked backward (as in the seeds)."""
  return tuple(dataclasses.replace(m, backward=True) for m in fwd)


def _copy_metadata(t0: UOp, v: UOp, ctx: UOp) -> None:
  """Every node of the rule result v, down to t0, its sources and its gradient ctx, gets t0's backward metadata (the
  C driver does the same walk in csrc/grad.c)."""
  fwd = t0.metadata
  if not fwd: return
  bwd = backward_metadata(fwd)
  stop = [t0._id, ctx._id, *(s._id for s in t0.src)]
  for nid in CORE.toposort([v._id], True, stop): _uop._attach_metadata(handle(nid), bwd)


def step(t0: UOp, g0: UOp, get, put, targets: set, on_path, pm):
  """One node of the reverse walk (a generator: see call_gradient): t0's gradient g0 flows into its sources through
  `get`/`put` (the accumulated gradients), by the rules of the PatternMatcher `pm`. `on_path(node)` tells whether a
  node lies on a target path."""
  if t0.op is Ops.GETTUPLE:
    # accumulate per output into a TUPLE on the FUNCTION (or TUPLE); it is differentiated when the walk reaches it
    k = t0.src[0]
    n_out = len(k.src[0].src) if k.op is Ops.FUNCTION else len(k.src)
    cur = get(k)
    prev = cur.src if cur is not None else tuple(_noop() for _ in range(n_out))
    i = t0.arg
    put(k, UOp.maketuple(*(g0 if j == i and prev[j].op is Ops.NOOP else prev[j] + g0 if j == i else prev[j]
                           for j in range(n_out))))
    return
  if t0.op in (Ops.FUNCTION, Ops.CALL):
    if t0.op is Ops.FUNCTION and t0.arg.grad_fxn is None and on_path(t0.src[0]): check_captured(t0, targets)
    needed = {i for i, a in enumerate(t0.src[1:]) if a in targets or on_path(a)}
    lgrads = yield from call_gradient(g0, t0, needed)
  else:
    lgrads = pm.rewrite(t0, ctx=g0)
  check_rule_result(t0, lgrads)
  for k, v in zip(t0.src, lgrads):
    if v is None: continue
    put(k, accumulate(get(k), v, k))
    if _uop._md_count: _copy_metadata(t0, v, g0)


def path_test(path_ids):
  """on_path for step: membership in a deepwalk's path, the set made on first use (most walks never ask)."""
  path: set[int] | None = None

  def on_path(u: UOp) -> bool:
    nonlocal path
    if path is None: path = set(path_ids)
    return u._id in path
  return on_path


def walk(root: UOp, root_grad: UOp, targets, pm, enter_calls: bool):
  """compute_gradient running every rule on every node, as a generator (see call_gradient) returning a dict.
  enter_calls: whether the target path is traced into FUNCTION bodies (the outermost walk, for captured targets)."""
  targets = set(targets)
  walk_ids, path_ids = CORE.deepwalk(root._id, [t._id for t in targets], enter_calls)
  on_path = path_test(path_ids)
  grads: dict[UOp, UOp] = {root: root_grad}
  for nid in reversed(walk_ids):
    t0 = handle(nid)
    g0 = grads.get(t0)
    if g0 is None or g0.op is Ops.NOOP: continue
    yield from step(t0, g0, grads.get, grads.__setitem__, targets, on_path, pm)
  return grads
