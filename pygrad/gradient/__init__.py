"""Reverse-mode gradients as graph rewrites. Three layers, imported one way: the rules (rules.py: `pm_gradient`,
`call_gradient`, `accumulate`), the drivers that apply them along a graph (direct.py runs every rule; templated.py
caches rule results as templates the core instantiates), and here the public `compute_gradient`, which picks the
driver by the core's capability (`CORE.grad_runs`) and nests FUNCTION bodies on a stack of its own: a body's
gradient is a request the rules yield, so no driver recurses on how deeply FUNCTIONs nest."""
from __future__ import annotations
from ..ops import Ops
from ..dtype import dtypes
from ..uop import UOp
from ..core import CORE
from .rules import pm_gradient, reduce_gradient, call_gradient, accumulate, PY_NODE_OPS, PY_GRAD_OPS
from . import direct
if CORE.grad_runs: from . import templated  # the C driver needs the core's gradient runs (and its templates)


def _driver():
  return templated.walk if CORE.grad_runs and templated.enabled() else direct.walk


def _drive(walk, root: UOp, root_grad: UOp, targets, pm):
  """Run `walk` for root; each body it asks for (call_gradient's request) is walked on this loop's stack."""
  stack = [walk(root, root_grad, targets, pm, True)]
  value = None
  while True:
    try:
      req = stack[-1].send(value)
    except StopIteration as e:
      stack.pop()
      if not stack: return e.value
      value = e.value
      continue
    body, body_grad, body_targets = req
    stack.append(walk(body, body_grad, body_targets, pm, False))
    value = None


def compute_gradient(root: UOp, root_grad: UOp, targets):
  """Reverse-mode gradients of `root` (seeded with `root_grad`) for every node on a path from root to a target
  (not through DETACH), and for every reached target, by the rules of this module's `pm_gradient` (replacing it
  takes effect at once). On the C core, rules run once per distinct node signature and C instantiates their cached
  results (templated.py); the graphs are node for node the same."""
  targets = _check_args(root, root_grad, targets)
  return _drive(_driver(), root, root_grad, targets, pm_gradient)


def _check_args(root, root_grad, targets) -> list:
  """targets as a list (any iterable is taken once), after TypeErrors for anything that is not a UOp."""
  for what, u in (("root", root), ("root_grad", root_grad)):
    if type(u) is not UOp: raise TypeError(f"compute_gradient: {what} must be a UOp, got {type(u).__name__}")
  if isinstance(targets, UOp) or not hasattr(targets, "__iter__"):
    raise TypeError(f"compute_gradient: targets must be an iterable of UOps, got {type(targets).__name__}")
  targets = list(targets)
  for t in targets:
    if type(t) is not UOp: raise TypeError(f"compute_gradient: targets must be UOps, got {type(t).__name__}")
  return targets


def compute_gradient_direct(root: UOp, root_grad: UOp, targets) -> dict[UOp, UOp]:
  """compute_gradient running every rule on every node (the reference path, whatever the core)."""
  return _drive(direct.walk, root, root_grad, targets, pm_gradient)


def gradient(root: UOp, targets, grad: UOp | None = None) -> list[UOp]:
  """`root.gradient(*targets, gradient=None)`: d(root)/d(target) per target; zeros for unreached targets."""
  for t in targets:
    if type(t) is not UOp: raise TypeError(f"gradient: targets must be UOps, got {type(t).__name__}")
    if not dtypes.is_float(t.dtype): raise TypeError(f"gradient: target {t.op.name}{t.shape} is {t.dtype.name}, not float")
  if grad is None:
    if root.shape != (): raise ValueError(f"gradient: root of shape {root.shape} is not scalar; pass gradient=")
    if not dtypes.is_float(root.dtype): raise TypeError(f"gradient: root is {root.dtype.name}, not float")
    grad = root.const_like(1.0)
  elif grad.shape != root.shape:
    raise ValueError(f"gradient: gradient of shape {grad.shape} for a root of shape {root.shape}")
  elif grad.dtype != root.dtype:
    raise TypeError(f"gradient: gradient of dtype {grad.dtype.name} for a root of dtype {root.dtype.name}")
  grads = compute_gradient(root, grad, targets)
  out = []
  for t in targets:
    g = grads.get(t)
    out.append(t.const_like(0) if g is None or g.op is Ops.NOOP else g)  # no gradient reached it: zeros
  return out


__all__ = ["pm_gradient", "reduce_gradient", "call_gradient", "accumulate", "compute_gradient",
           "compute_gradient_direct", "gradient", "PY_NODE_OPS", "PY_GRAD_OPS"]
