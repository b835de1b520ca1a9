"""planner's visit swept over a large plain graph's columns (engine/sweep.py) against the node by node visit
(Planner._visit): every node's view (buffer and View), every buffer and kernel in the same order, on the golden
graphs and on graphs made to reach the sweep's rarer cases (a PAD or EXPAND storing its source, a RESHAPE copying a
view, outputs that are views); bad graphs refused with the per-node visit's errors; and flatten's LazyNodes, whose
quotients are found on the columns, against the nodes made at once."""
from __future__ import annotations
import numpy as np
import pytest
import pygrad
from pygrad import UOp, dtypes

program = pytest.importorskip("pygrad.engine.program", reason="the compiled interpreter is not built",
                              exc_type=ImportError)
from test_vm_plan_golden import GRAPHS, GOLDEN, digest  # noqa: E402

F32 = dtypes.float32


def _small_thresholds(m, rounds=False):
  """Every graph a LazyNodes one, swept and walked in C, however small; rounds: its movements swept a round at a
  time as arrays, however few (else one by one, as a graph with few movements has them; "mixed": rounds of at
  least two, the rest one by one)."""
  from pygrad.engine import flatten, planner, sweep
  m.setattr(flatten, "_LAZY_MIN", 0)
  for k in ("_GRAPH_MIN_NODES", "_WALK_MIN_NODES", "_WALK_PER_JOB"): m.setattr(planner, k, 0)
  m.setattr(sweep, "_ROUND_MIN", 2 if rounds == "mixed" else 0 if rounds else 1 << 62)
  m.setattr(sweep, "_ROUND_SHARE", 1 << 62)


def _kernel(k):
  """A planned kernel as plain values: index space, reduction, stores, and every KNode (op, dtype, operands by
  position, load's buffer and view)."""
  from pygrad.engine.records import Loop
  if not isinstance(k, Loop): return repr(type(k))
  pos = {id(x): i for i, x in enumerate(k.knodes)}
  kn = [(x.op.name, x.dtype.name, tuple(pos[id(s)] for s in x.src), x.buf.id if x.buf is not None else None,
         x.view.key() if x.view is not None else None, x.opcode) for x in k.knodes]
  return (k.shape, k.redop, k.redaxes, kn, [(pos[id(s.src)], s.buf.id, s.view.key()) for s in k.stores])


def _plan(outs, ins, swept: bool, m):
  """(the sweep's result or None, buffers, kernels, per node its view and whether stored) of one plan."""
  from pygrad.engine import planner
  from pygrad.engine.flatten import flatten
  ran = []
  real = planner._sweep

  def spy(*a):
    r = real(*a)
    ran.append(r is not None)
    return r
  m.setattr(planner, "_sweep", spy)
  m.setattr(planner, "_SWEEP", swept)
  nodes, shaped, cols = flatten(outs, columns=True)
  pl = planner.Planner(nodes, shaped, ins, cols)
  bufs = [(b.id, b.kind, b.stype.name, b.shape, b.dtype.name, b.index) for b in pl.bufs]
  kernels = [_kernel(k) for k in pl.kernels]
  views = [(n.view[0].id, n.view[1].key()) if n.view is not None else None for n in map(nodes.__getitem__,
                                                                                         range(len(nodes)))]
  mat = [nodes[i].mat for i in range(len(nodes))]
  from pygrad.engine.flatten import LazyNodes
  if swept: assert ran == ([True] if type(nodes) is LazyNodes else [])  # (a plain graph: swept)
  return (ran[0] if ran else None), bufs, kernels, views, mat


def _same_plan(outs, ins, monkeypatch, rounds=False) -> bool:
  """Asserts the swept plan is the node by node one; returns whether the sweep took the graph."""
  with monkeypatch.context() as m:
    _small_thresholds(m, rounds)
    ran, *swept = _plan(outs, ins, True, m)
    assert _plan(outs, ins, False, m)[0] is None  # (the per-node visit, the reference)
  with monkeypatch.context() as m:
    _small_thresholds(m)
    ref = _plan(outs, ins, False, m)[1:]
  assert swept[0] == ref[0]  # buffers
  assert swept[1] == ref[1]  # kernels, in order
  assert swept[2] == ref[2]  # every node's view
  assert swept[3] == ref[3]
  return bool(ran)


@pytest.mark.parametrize("rounds", [False, True], ids=["one-by-one", "rounds"])
@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_swept_plan_is_the_node_by_node_one(name, rounds, monkeypatch):
  outs, ins = GRAPHS[name]()
  try:
    ran = _same_plan(outs, ins, monkeypatch, rounds)
  except (ValueError, TypeError):
    return  # (a graph compile refuses: see the errors below)
  if name.startswith(("w1", "grad", "forward")): assert ran, "the sweep left a plain graph to _visit"


@pytest.mark.parametrize("rounds", [False, True], ids=["one-by-one", "rounds"])
@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_swept_program_is_the_recorded_one(name, rounds, monkeypatch):
  _small_thresholds(monkeypatch, rounds)
  assert digest(name) == GOLDEN[name]


def _movements():
  """A PAD and an EXPAND of expressions (their source stored when they are met, after a RESHAPE of the same source
  read it as an expression), an EXPAND of a one-element expression (not stored), a RESHAPE a permuted view cannot
  express (a copy), chains of movements over inputs and constants, and outputs that are views."""
  a, b = UOp.placeholder((4, 6), F32, "a"), UOp.placeholder((6,), F32, "b")
  e = (a * 2.0).sin()
  r = e.reshape((6, 4))  # (read before the PAD stores e: an expression)
  p = e.pad(((1, 1), (0, 2)))
  one = (b.sum() + 1.0).reshape((1, 1))
  x = one.expand((4, 6)) * a
  ex = (b + 1.0).reshape((1, 6)).expand((4, 6)) * e
  cp = a.permute((1, 0)).reshape((4, 6)).exp2()
  ch = b.reshape((1, 6)).expand((3, 6)).permute((1, 0)).flip((0,)).shrink(((1, 5), (0, 3)))
  f = (b.sum().reshape((1,)) * 2.0).exp2()  # (one element: read twice, by a RESHAPE first, and stored by the PAD)
  fr = f.reshape((1, 1)) + 1.0
  # (the PAD's output first: the RESHAPE of f then comes before the PAD in node order)
  outs = [f.pad(((1, 1),)) * 2.0, fr, r.sum(1), p * 3.0, x, ex, cp, ch, ch + 1.0, a.reshape((24,)),
          e.reshape((2, 12)), (r + 1.0).reshape((24,))]
  return outs, [a, b]


@pytest.mark.parametrize("rounds", [False, True, "mixed"], ids=["one-by-one", "rounds", "mixed"])
def test_swept_movements_are_the_node_by_node_ones(rounds, monkeypatch):
  outs, ins = _movements()
  assert _same_plan(outs, ins, monkeypatch, rounds)
  with monkeypatch.context() as m:
    _small_thresholds(m, rounds)
    vals = pygrad.evaluate(outs, {ins[0]: np.arange(24, dtype=np.float32).reshape(4, 6) / 7,
                                  ins[1]: np.arange(6, dtype=np.float32) / 5}, engine="c")
  ref = pygrad.evaluate(outs, {ins[0]: np.arange(24, dtype=np.float32).reshape(4, 6) / 7,
                               ins[1]: np.arange(6, dtype=np.float32) / 5}, engine="numpy")
  for v, r in zip(vals, ref): np.testing.assert_allclose(v, r, rtol=1e-5, atol=1e-6)


def test_swept_graph_with_a_missing_input_is_refused_naming_it(monkeypatch):
  _small_thresholds(monkeypatch)
  x, y = UOp.placeholder((4,), F32, "x"), UOp.placeholder((4,), F32, "y")
  with pytest.raises(ValueError, match="missing input.*'y'"): pygrad.compile((x * 2.0 + y).sin(), [x])


def test_swept_graph_past_the_vm_bound_is_refused_naming_the_value(monkeypatch):
  _small_thresholds(monkeypatch)
  x = UOp.placeholder((4,), F32, "x")
  big = (x * 2.0).reshape(4, 1, 1).expand(4, 2 ** 24, 2 ** 24)
  with pytest.raises(ValueError, match=r"EXPAND float32\[4, 16777216, 16777216\]"): pygrad.compile(big.sum(), [x])


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_lazy_nodes_are_the_flattened_nodes(name, monkeypatch):
  """flatten's LazyNodes (quotients found on the columns) against the nodes a small plain graph gets made at once:
  every node's fields, operands and opcode, and the columns the planner's sweeps read."""
  from pygrad.engine import flatten
  from pygrad.engine.flatten import LazyNodes
  outs, _ = GRAPHS[name]()
  whole, _, wcols = flatten.flatten(outs, columns=True)
  monkeypatch.setattr(flatten, "_LAZY_MIN", 0)
  lazy, _, lcols = flatten.flatten(outs, columns=True)
  if type(lazy) is not LazyNodes: return  # (not a plain graph: both are the general flattening's)
  assert type(whole) is list and len(lazy) == len(whole)

  def row(n): return (n.op, n.dtype, n.shape, n.arg, n.nid, n.idx, tuple(s.idx for s in n.src), n.opcode, n.users,
                      n.is_output, n.callbufs, n.out_slot)
  assert [row(lazy[i]) for i in range(len(lazy))] == [row(n) for n in whole]
  bare = flatten.flatten(outs, columns=True)[0]  # (nodes made bare, their fields filled when first read)
  bare.users = np.arange(len(bare)) % 3  # (as kwalk's users_fused sets them: on the nodes made so far too)
  for i in bare.made_idx: bare[i].users = i % 3
  at = list(range(0, len(bare), 2))
  bare.make_bare([i for i in at if bare._made[i] is None])
  assert all(bare[i].arg is whole[i].arg for i in at)
  for n in whole: n.users = n.idx % 3
  assert [row(bare[i]) for i in range(len(bare))] == [row(n) for n in whole]
  assert lcols["special"] == wcols["special"]
  for k in ("nsrc", "src", "op", "meta", "dtype"): np.testing.assert_array_equal(lcols[k], wcols[k])
  if name.startswith("grad"): assert lcols["special"]  # (the gradients' quotients were found)


@pytest.mark.parametrize("big", [False, True], ids=["one-int-key", "rows-key"])
def test_per_key_calls_once_per_distinct_row(big):
  """sweep._per_key: fn once per distinct row (memo kept), each row given its row's result; columns whose ranges do
  not fit one int64 key are grouped as rows."""
  from pygrad.engine.sweep import _per_key
  rng = np.random.default_rng(7)
  cols = [rng.integers(0, 4, 300) for _ in range(3)]
  if big: cols[1] = cols[1] * (1 << 40)
  calls, memo = [], {(0, 0, 0): -5}
  out = _per_key(tuple(cols), memo, lambda *k: calls.append(k) or hash(k) % 1000)
  rows = list(zip(*(c.tolist() for c in cols)))
  assert sorted(calls) == sorted(set(rows) - {(0, 0, 0)})
  assert out.tolist() == [-5 if r == (0, 0, 0) else hash(r) % 1000 for r in rows]
