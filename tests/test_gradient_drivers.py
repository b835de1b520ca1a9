"""The gradient drivers: rule sets changed at run time take effect at once, FUNCTIONs nested 10,000 deep
differentiate without recursion, and the C core's template cache stays bounded in a long-running process."""
from __future__ import annotations
import gc
import numpy as np
import pytest
import pygrad
from pygrad import UOp, Ops, dtypes
from pygrad.upat import UPat, PatternMatcher
from pygrad.intern import ARGS
from pygrad.core import CORE
import pygrad.gradient as G

F64 = dtypes.float64


def _ev(outs, inputs):
  return pygrad.evaluate(list(outs), inputs, engine="numpy")


def test_changed_rule_set_takes_effect_at_once(monkeypatch):
  x = UOp.placeholder((3,), F64, name="x")
  v = np.array([0.1, 0.2, 0.3])
  (g,) = x.sin().sum().gradient(x)
  np.testing.assert_allclose(_ev([g], {x: v})[0], np.cos(v))
  # the same node signature again, under a rule set whose SIN rule differs: the new rule is used
  tripled = PatternMatcher([(UPat(Ops.SIN), lambda ctx: (ctx * 3.0,))]) + G.pm_gradient
  monkeypatch.setattr(G, "pm_gradient", tripled)
  y = UOp.placeholder((3,), F64, name="y")
  (g2,) = y.sin().sum().gradient(y)
  np.testing.assert_allclose(_ev([g2], {y: v})[0], np.full(3, 3.0))
  monkeypatch.undo()
  (g3,) = y.sin().sum().gradient(y)
  np.testing.assert_allclose(_ev([g3], {y: v})[0], np.cos(v))


def _nested(x: UOp, depth: int) -> UOp:
  """sin(x) inside `depth` FUNCTIONs, each body calling the one below it on its own PARAM."""
  p = x.param_like(0)
  body = UOp.maketuple(p.sin())
  for _ in range(depth - 1): body = UOp.maketuple(body.call(p, name="level").gettuple(0))
  return body.call(x, name="level").gettuple(0)


def test_nested_functions_differentiate_to_the_right_value():
  x = UOp.placeholder((3,), F64, name="x")
  v = np.array([0.1, 0.7, -1.2])
  (g,) = _nested(x, 40).sum().gradient(x)
  np.testing.assert_allclose(_ev([g], {x: v})[0], np.cos(v), rtol=1e-12)


def test_ten_thousand_nested_functions_differentiate_without_recursion():
  x = UOp.placeholder((3,), F64, name="x")
  (g,) = _nested(x, 10_000).sum().gradient(x)
  # one backward FUNCTION per level, each nested in the one above
  depth, u = 0, g
  while True:
    calls = [n for n in u.toposort(enter_calls=False) if n.op is Ops.FUNCTION]
    if not calls: break
    depth, u = depth + 1, calls[0].src[0]
  assert depth == 10_000


def test_template_cache_is_bounded_and_releases_what_it_pinned():
  """A process differentiating graphs of ever-new shapes: the cache (C core) holds at most its limit, dropped
  templates release the arg ids they held, and live nodes return to their baseline (both cores)."""
  tc = G.templated.template_cache(G.pm_gradient, limit=64) if CORE.grad_runs else None

  def one(n: int) -> None:
    x = UOp.placeholder((n, 3), F64, name="x")
    (g,) = ((x.sin() * x).reshape(3, n).sum(0) * 2).sum().gradient(x)
    assert g.shape == (n, 3)

  def settle() -> int:
    gc.collect()
    ARGS.drain()
    return len(ARGS.objs)
  for n in range(2, 40): one(n)
  live0, args0 = pygrad.live_nodes(), settle()
  for n in range(40, 400): one(n)
  live1, args1 = pygrad.live_nodes(), settle()
  assert live1 == live0
  assert args1 - args0 < 200, f"the interner grew by {args1 - args0} args over 360 new shapes"
  if tc is not None:
    assert 0 < len(tc) <= 64
    G.templated.template_cache(G.pm_gradient, limit=G.templated.LIMIT)  # back to the default cache
