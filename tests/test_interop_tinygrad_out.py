"""The way out's C loop (csrc/pyforeign.c) making helper rows when a user or the caller asks for them (lazy_row: an
explicit broadcast, a reshape left to be made on demand, a row held reduced seen at its users' shape), as
tinygrad_out._Out._lazy makes them."""
from __future__ import annotations
import numpy as np
import pytest

pytest.importorskip("tinygrad", reason="tinygrad is not installed (pip install '.[tinygrad]')")
from tinygrad import Tensor  # noqa: E402
from tinygrad.dtype import dtypes as tdtypes  # noqa: E402
from tinygrad.uop.ops import UOp as TUOp, Ops as TOps, UOpMetaClass  # noqa: E402
import pygrad.interop.tinygrad as pt  # noqa: E402
import pygrad.interop.tinygrad_tables as tt  # noqa: E402
from pygrad.core import CORE  # noqa: E402
from pygrad.handles import handle  # noqa: E402
from pygrad.interop.tinygrad_out import _Out  # noqa: E402
import pygrad.interop.tinygrad_out as tout  # noqa: E402

DEV = "PYTHON"
i32 = lambda xs: np.array(xs, np.int32).tobytes()  # noqa: E731  (the C loop's columns: bytes of int32)


def _fast():
  f = CORE.foreign_rows
  if f is None: pytest.skip("the pure-Python core has no C loop (the Python loop is what runs)")
  return f


X = TUOp.const(2.5, tdtypes.float32)
Y = TUOp.const(1.5, tdtypes.float32)
SARG = TUOp.const(3, tdtypes.int32)  # a stand-in for a shape operand


def _cfg(out, ops, tags, srcs, plans, held=None, lazy=None):
  """A table of len(out) rows, row k's sources srcs[k], ADD made by the C loop (tinygrad's ADD, float32)."""
  start = np.cumsum([0] + [len(s) for s in srcs]).astype(np.int64)
  n = len(out)
  return (out, i32(ops), i32([0] * n), i32(tags), start.tobytes(), i32([j for s in srcs for j in s]), i32([0] * n),
          (None, TOps.ADD), (tdtypes.float32,), (), UOpMetaClass.ucache, TUOp, (0, TOps.CAST, 0, TOps.BITCAST), None,
          None, {}, (lambda j: 1 / 0) if lazy is None else lazy, tt._tfields(), {} if held is None else held, plans)


def _reshape(y): return TUOp(TOps.RESHAPE, y.dtype, (y, SARG))


def test_c_loop_makes_broadcasts_and_folded_reshapes_asked_for():
  """A user's source that is an explicit broadcast (plan (4,)) is its source's node; an untagged reshape made on
  demand (plan 5) is the first row below its chain of such rows, as it is if its shape id is the row's, else
  reshaped; its held node if it is held reduced. Every row made on the way is kept (out), as _lazy keeps it."""
  f = _fast()
  other, rs = 7, tt._RESHAPE

  def fold(shid, shape=(3,)): return (5, i32(shid), rs, shape, TOps.RESHAPE, SARG)
  # rows: 0 x, 1 broadcast of 0, 2 reshape of 1, 3 reshape of 2, 4 ADD(3, 0)
  def run(shid, held=None, out0=X):
    out = [out0, None, None, None, None]
    c = _cfg(out, [other, other, rs, rs, 1], [0, 9, 0, 0, 0], [(), (0,), (1,), (2,), (3, 0)],
             [None, (4,), fold(shid), fold(shid), None], held)
    return f(c, [4], 0, 1), out, c
  r, out, _ = run((5, 5, 5, 5, 5))
  assert r == 1 and out[4] is TUOp(TOps.ADD, tdtypes.float32, (X, X)) and out[3] is X and out[1] is X
  assert out[2] is None  # skipped by the fold, as _reshaped skips it
  r, out, _ = run((5, 5, 5, 6, 5))
  assert r == 1 and out[3] is _reshape(X) and out[4].src == (_reshape(X), X)
  r, out, _ = run((5, 5, 5, 6, 5), held={1: (Y, (3,), (1, 3), (0,))})  # held with the reshape's shape: Y itself
  assert out[3] is Y
  r, out, _ = run((5, 5, 5, 6, 5), held={1: (Y, (4,), (1, 4), (0,))})
  assert out[3] is _reshape(Y)
  # a root that is a helper row, asked for by the caller: made by its plan (no metadata) if untagged (a folded
  # reshape); a tagged one (a broadcast) is left to Python, as every tagged row the loop is given
  out = [X, None, None]
  c = _cfg(out, [other, rs, other], [0, 0, 9], [(), (0,), (0,)], [None, fold((5, 6, 5)), (4,)])
  assert f(c, [1], 0, 1) == 1 and out[1] is _reshape(X)
  assert f(c, [2], 0, 1) == 0 and out[2] is None
  # bad plans and tables: exceptions, never a crash or a hang
  for bad in ((4, 1), (5, i32((5,) * 5), rs, (3,), TOps.RESHAPE), (5, i32((5, 5)), rs, (3,), TOps.RESHAPE, SARG),
              (5, [5] * 5, rs, (3,), TOps.RESHAPE, SARG), ()):
    out = [X, None, None, None, None]
    c = _cfg(out, [other, other, rs, rs, 1], [0, 9, 0, 0, 0], [(), (0,), (1,), (2,), (3, 0)],
             [None, (4,), bad, bad, None])
    with pytest.raises(TypeError): f(c, [4], 0, 1)
  with pytest.raises(TypeError): run((5,) * 5, held={1: (Y,)})
  out = [X, None, None, None, None]  # a reshape chain that loops
  c = _cfg(out, [other, other, rs, rs, 1], [0, 9, 0, 0, 0], [(), (0,), (3,), (2,), (3, 0)],
           [None, (4,), fold((5,) * 5), fold((5,) * 5), None])
  with pytest.raises(TypeError): f(c, [4], 0, 1)


def test_c_loop_makes_held_rows_at_their_users_shape():
  """A user's source held reduced is its held node reshaped to the shape the hold names (the RESHAPE and operand its
  plan ends with), or the node itself if it has that shape; a plan naming another shape, or none, leaves the row to
  Python's lazy."""
  f = _fast()
  calls = []

  def run(plan, got, lazy=None):
    out = [None, None]
    c = _cfg(out, [7, 1], [0, 0], [(), (0, 0)], [plan, None], held={0: got},
             lazy=lazy or (lambda j: calls.append(j) or Y))
    return f(c, [1], 0, 1), out

  k1 = lambda keep: (1, TOps.PERMUTE, None, TOps.REDUCE, None, (3,), keep, (0,), TOps.RESHAPE, SARG)  # noqa: E731
  r, out = run(k1((1, 3)), (X, (3,), (1, 3), (0,)))
  assert r == 1 and out[0] is _reshape(X) and out[1].src == (_reshape(X), _reshape(X)) and not calls
  r, out = run(k1((3,)), (X, (3,), (3,), ()))
  assert out[0] is X and not calls
  r, out = run((2, TOps.PERMUTE, None, (3,), (1, 3), (0,), TOps.RESHAPE, SARG), (X, (3,), (1, 3), (0,)))
  assert out[0] is _reshape(X) and not calls
  r, out = run(k1((1, 4)), (X, (3,), (1, 3), (0,)))  # the plan names another shape: Python's
  assert r == 1 and set(calls) == {0} and out[1].src == (Y, Y)  # (this lazy keeps nothing: asked per source)
  calls.clear()
  r, out = run(None, (X, (3,), (1, 3), (0,)))
  assert set(calls) == {0}
  with pytest.raises(TypeError): run(k1((1, 3)), (X,))
  with pytest.raises(ZeroDivisionError): run(k1((1, 4)), (X, (3,), (1, 3), (0,)), lazy=lambda j: 1 / 0)


def _bench_graph(wl: str, size: int):
  from pygrad import bench as pb
  args = pb.map_shapes(pb.input_shapes(wl, size), lambda s: Tensor.empty(*s, device=DEV))
  root = pb.MODELS[wl](pb.MethodOps, *args)
  return root.uop, root.uop.const_like(1.0), [t.uop for t in pb.flat(args)]


@pytest.mark.parametrize("wl", ["W1", "W2"])
def test_c_loop_makes_the_bench_gradients_helper_rows(monkeypatch, wl):
  """On the bench's workloads the C loop makes every helper row of the gradients (W2: broadcasts, folded reshapes,
  held reduces seen at their users' shape; W1: folded reshapes, the gradients' roots among them): Python's _lazy is
  never asked, and the gradients are the Python loop's (test_c_loop_of_the_way_out_makes_what_python_makes checks
  them node for node)."""
  fast = _fast()
  monkeypatch.setattr(tout, "_C_ROWS", 0)  # (small tables are the Python loop's)
  root, rg, targets = _bench_graph(wl, 3 if wl == "W1" else 2)
  lazy, calls = _Out._lazy, []
  monkeypatch.setattr(_Out, "_lazy", lambda self, i: calls.append(i) or lazy(self, i))
  with_c = pt.compute_gradient(root, rg, targets)
  assert not calls
  monkeypatch.setattr(CORE, "foreign_rows", None)
  py = pt.compute_gradient(root, rg, targets)
  assert calls and all(with_c[t] is py[t] for t in targets)
  monkeypatch.setattr(CORE, "foreign_rows", fast)


def test_way_out_table_stops_at_known_nodes(monkeypatch):
  """A gradient's conversion back exports only what lies above the nodes converted in (known): its table is the
  known rows, each mapped to its tinygrad node, then the nodes under the gradients reached without passing through a
  known one (a toposort stopped at them); the forward graph below them is left out. Both cores."""
  seen = []
  conv = _Out.convert_ids
  monkeypatch.setattr(_Out, "convert_ids", lambda self, ids, skip=-1: seen.append((self, [handle(i) for i in ids]))
                      or conv(self, ids, skip))  # (handles: the gradients die with compute_gradient's result)
  root, rg, targets = _bench_graph("W2", 2)
  got = pt.compute_gradient(root, rg, targets)
  (o, roots), = seen
  k, ids = len(o.known), list(o.ids)
  need = [int(i) for i in CORE.toposort([r._id for r in roots], True, list(o.known))]
  assert ids[:k] == list(o.known) and sorted(ids[k:]) == sorted(need) and not set(ids[k:]) & set(o.known)
  assert all(o.out[i] is t for i, t in enumerate(o.known.values()))
  assert all(got[t] is not None for t in targets)


def test_c_loop_reads_rows_to_make_from_bytes_and_dtypes_by_descriptor():
  """The rows to make may be given as int32 bytes (the way out passes them so: no list of int objects), checked as
  a list is; a source's dtype is read through the node class's dtype descriptor when its fields are given (a
  non-node source is then the descriptor's TypeError, never a crash)."""
  f = _fast()
  rows = lambda: [X, None, None]  # noqa: E731  rows 1 and 2: ADD(row 0, row 0)
  def cfg(out, fields=tt._tfields(), lazy=None):
    c = _cfg(out, [0, 1, 1], [0, 0, 0], [(), (0, 0), (0, 0)], None, lazy=lazy)
    return c[:17] + (fields,) + c[18:]
  for fields in (tt._tfields(), None):
    out = rows()
    assert f(cfg(out, fields), i32([2, 1]), 0, 2) == 2
    assert out[1] is out[2] is TUOp(TOps.ADD, tdtypes.float32, (X, X))
    out = rows()
    assert f(cfg(out, fields), i32([2, 1]), 1, 2) == 2 and out[2] is None and out[1] is not None
  with pytest.raises(TypeError): f(cfg(rows()), b"\0\0\0", 0, 0)  # no whole int32
  with pytest.raises(IndexError): f(cfg(rows()), i32([1]), 0, 2)  # past the rows given
  with pytest.raises(IndexError): f(cfg(rows()), i32([3]), 0, 1)  # a row out of the table
  with pytest.raises(IndexError): f(cfg(rows()), i32([-1]), 0, 1)
  with pytest.raises(TypeError): f(cfg(rows()), bytearray(i32([1])), 0, 1)
  # a source that is no node: the dtype descriptor's TypeError (by name, without fields: an AttributeError)
  with pytest.raises(TypeError): f(cfg([None, None, None], lazy=lambda j: 7), i32([1]), 0, 1)
  with pytest.raises(AttributeError): f(cfg([None, None, None], None, lazy=lambda j: 7), i32([1]), 0, 1)


def test_small_tables_are_made_by_the_python_loop(monkeypatch):
  """A gradient table below _C_ROWS rows to make is made by the Python loop (the C loop's setup costs more there);
  forced through the C loop it gives the same nodes."""
  f = _fast()
  calls = []
  monkeypatch.setattr(CORE, "foreign_rows", lambda *a: calls.append(1) or f(*a))
  x, w = Tensor.empty(4, 8, device=DEV), Tensor.empty(8, 3, device=DEV)
  loss = (x @ w).relu().sum()
  root, rg = loss.uop, loss.uop.const_like(1.0)
  small = pt.compute_gradient(root, rg, [w.uop])
  assert not calls
  monkeypatch.setattr(tout, "_C_ROWS", 0)
  forced = pt.compute_gradient(root, rg, [w.uop])
  assert calls and forced[w.uop] is small[w.uop]
