"""graph_rewrite: apply a PatternMatcher over a whole graph to a fixed point, iteratively (never recursing on
graph depth)."""
from __future__ import annotations
from .uop import UOp, rebuild

_MAX_STEPS = 1000  # rewrites of one node in a row before we call the rule set cyclic


def graph_rewrite(root: UOp, pm, ctx=None, bottom_up: bool = False) -> UOp:
  """Rewrite `root` with `pm` until no rule applies anywhere. Default: a node is rewritten after its sources
  (sources first, then the node, repeatedly; a rule's result is itself rewritten). bottom_up=True tries the
  rules on a node before its sources are visited, and again after they changed."""
  done: dict[UOp, UOp] = {}
  # stack entries: (node, stage, pending) -- stage 0: visit, 1: sources done, 2: alias of a rewrite result
  stack: list[tuple] = [(root, 0, None)]
  while stack:
    n, stage, pending = stack.pop()
    if stage == 2:
      done[n] = done[pending]
      continue
    if n in done: continue
    if stage == 0:
      if bottom_up:
        r = _fixpoint(n, pm, ctx)
        if r is not n:
          stack.append((n, 2, r))
          stack.append((r, 0, None))
          continue
      stack.append((n, 1, None))
      for s in reversed(n.src):
        if s not in done: stack.append((s, 0, None))
      continue
    new_src = tuple(done[s] for s in n.src)
    nn = n if all(a is b for a, b in zip(new_src, n.src)) else rebuild(n, new_src)
    r = pm.rewrite(nn, ctx)
    if r is not None and r is not nn:
      stack.append((n, 2, r))
      stack.append((r, 0, None))
      continue
    if nn is not n and nn not in done:
      if bottom_up and (r2 := _fixpoint(nn, pm, ctx)) is not nn:
        stack.append((n, 2, r2))
        stack.append((r2, 0, None))
        continue
      done[nn] = nn
    done[n] = nn
  return done[root]


def _fixpoint(n: UOp, pm, ctx) -> UOp:
  for _ in range(_MAX_STEPS):
    r = pm.rewrite(n, ctx)
    if r is None or r is n: return n
    n = r
  raise RuntimeError(f"graph_rewrite: rules did not reach a fixed point on {n.op.name} after {_MAX_STEPS} steps")
