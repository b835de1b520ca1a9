"""Churn (issue 10 item 11): a long-running process that builds a graph, differentiates it, evaluates it and drops it,
round after round, with a new input shape and new constants every round, keeps `live_nodes()` at its baseline and
its RSS flat (the second half of the rounds grows it by less than 10%). The issue's size -- 100 rounds of 100,000
nodes -- is the long mode, PYGRAD_CHURN=100,100000 (rounds,nodes); CI runs 40 rounds of 1,500 nodes."""
from __future__ import annotations
import gc, os
import numpy as np
import pytest
import pygrad
from pygrad import UOp, dtypes

psutil = pytest.importorskip("psutil")
ROUNDS, NODES = (int(v) for v in os.environ.get("PYGRAD_CHURN", "40,1500").split(","))


def _round(r: int) -> int:
  """Build about NODES nodes over an input of a shape no earlier round used, with constants of this round only;
  differentiate, evaluate on the default engine, drop everything. Returns the graph's node count."""
  x = UOp.placeholder((r + 2, 3), dtypes.float32)
  y, k = x, 0
  while k * 7 < NODES:
    c = 1.0 + r * 1e-3 + k * 1e-7  # a constant no other round uses
    y = (y * c + (c - 1.0)).sin()
    k += 1
    if k % 16 == 0: y = y.contiguous()
  loss = y.sum()
  g, = loss.gradient(x)
  lv, gv = pygrad.evaluate([loss, g], {x: np.linspace(-1, 1, x.numel, dtype=np.float32).reshape(x.shape)})
  assert np.isfinite(lv) and gv.shape == x.shape
  return len(UOp.sink(loss, g).toposort())


def _rss() -> int:
  gc.collect()
  return psutil.Process().memory_info().rss


def test_build_differentiate_evaluate_drop_stays_bounded():
  _round(-1)  # warm up the caches every round uses (rules, templates of the fixed ops)
  gc.collect()
  base = pygrad.live_nodes()
  rss = []
  for r in range(ROUNDS):
    assert _round(r) >= NODES
    gc.collect()
    assert pygrad.live_nodes() == base, f"round {r}: {pygrad.live_nodes() - base} nodes outlived their graph"
    rss.append(_rss())
  mid = rss[len(rss) // 2 - 1]
  assert max(rss[len(rss) // 2:]) < mid * 1.10, f"RSS grew from {mid >> 20} MiB to {max(rss) >> 20} MiB"
