"""graph_rewrite: apply a PatternMatcher over a whole graph to a fixed point, iteratively (never recursing on
graph depth)."""
from __future__ import annotations
from .uop import UOp, rebuild

_MAX_STEPS = 1000  # rewrites of one node in a row before we call the rule set cyclic


def _cyclic(n: UOp, why: str) -> RuntimeError:
  return RuntimeError(f"graph_rewrite: rules did not reach a fixed point on {n.op.name}: {why}")


def graph_rewrite(root: UOp, pm, ctx=None, bottom_up: bool = False) -> UOp:
  """Rewrite `root` with `pm` until no rule applies anywhere. Default: a node is rewritten after its sources
  (sources first, then the node, repeatedly; a rule's result is itself rewritten). bottom_up=True tries the
  rules on a node before its sources are visited, and again after they changed. Rules that never settle
  (`ADD(a, b) -> ADD(b, a)`, `x -> f(x)`) raise RuntimeError in both modes after 1,000 rewrites in a row."""
  done: dict[UOp, UOp] = {}
  # nodes whose result waits on what is above them on the stack (a count of such entries per node): meeting one
  # again there continues its chain of rewrites rather than starting a new one, so a rewrite whose result needs
  # the node being rewritten counts towards the bound (a rule guarded by ctx may still settle on the revisit)
  busy: dict[UOp, int] = {}

  def hold(n: UOp) -> None: busy[n] = busy.get(n, 0) + 1

  def release(n: UOp) -> None:
    if (c := busy[n] - 1): busy[n] = c
    else: del busy[n]
  # stack entries: (node, stage, pending, steps) -- stage 0: visit, 1: sources done, 2: alias of a rewrite result;
  # steps: how many rewrites in a row led to this node
  stack: list[tuple] = [(root, 0, None, 0)]

  def rewritten(n: UOp, r: UOp, steps: int) -> None:
    if steps >= _MAX_STEPS: raise _cyclic(n, f"{_MAX_STEPS} rewrites in a row")
    hold(n)
    stack.append((n, 2, r, steps))
    stack.append((r, 0, None, steps + 1))

  while stack:
    n, stage, pending, steps = stack.pop()
    if stage == 2:
      done[n] = done[pending]
      release(n)
      continue
    if n in done: continue
    if stage == 0:
      if bottom_up:
        r = _fixpoint(n, pm, ctx)
        if r is not n:
          rewritten(n, r, steps)
          continue
      hold(n)
      stack.append((n, 1, None, steps))
      for s in reversed(n.src):
        if s not in done: stack.append((s, 0, None, steps if s in busy else 0))
      continue
    release(n)
    new_src = tuple(done[s] for s in n.src)
    nn = n if all(a is b for a, b in zip(new_src, n.src)) else rebuild(n, new_src)
    r = pm.rewrite(nn, ctx)
    if r is not None and r is not nn:
      rewritten(n, r, steps)
      continue
    if nn is not n and nn not in done:
      if bottom_up and (r2 := _fixpoint(nn, pm, ctx)) is not nn:
        rewritten(n, r2, steps)
        continue
      done[nn] = nn
    done[n] = nn
  return done[root]


def _fixpoint(n: UOp, pm, ctx) -> UOp:
  for _ in range(_MAX_STEPS):
    r = pm.rewrite(n, ctx)
    if r is None or r is n: return n
    n = r
  raise _cyclic(n, f"{_MAX_STEPS} rewrites in a row")
