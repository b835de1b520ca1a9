"""The tinygrad interop's node table as columns (csrc/pyrows.c against tinygrad_in._columns_py), the way out's C loop
making expands by plan (csrc/pyforeign.c), and the handling of Python's cyclic GC after a conversion
(tinygrad_tables._no_gc)."""
from __future__ import annotations
import gc
import numpy as np
import pytest

pytest.importorskip("tinygrad", reason="tinygrad is not installed (pip install '.[tinygrad]')")
from tinygrad import Tensor  # noqa: E402
import pygrad.interop.tinygrad as pt  # noqa: E402
import pygrad.interop.tinygrad_in as ti  # noqa: E402
from pygrad.core import CORE  # noqa: E402

DEV = "PYTHON"


def _table(wl: str, size: int):
  """The node table (rows, metadata) of a conversion of pygrad.bench's workload wl built with tinygrad's Tensor API."""
  from pygrad import bench as pb
  args = pb.map_shapes(pb.input_shapes(wl, size), lambda s: Tensor.empty(*s, device=DEV))
  root = pb.MODELS[wl](pb.MethodOps, *args).uop
  cin = ti._In()
  cin.add(root)
  return cin.rows, cin.md, root


def _same(a: tuple, b: tuple) -> None:
  for x, y in zip(a[:7], b[:7]):
    assert (x is None) == (y is None)
    if x is not None: assert x.dtype == y.dtype and np.array_equal(x, y)
  assert len(a[7]) == len(b[7]) and all(p is q for p, q in zip(a[7], b[7]))  # the same objects, in the same order


@pytest.mark.parametrize("wl,size", [("W1", 30), ("W2", 2)])
def test_c_columns_are_the_python_ones(wl, size):
  """rows_columns (csrc/pyrows.c) gives the columns _columns_py gives, the same objects in the same order, on the
  tables of real conversions (with metadata) and on the same tables without metadata or reordered."""
  f = CORE.rows_columns
  if f is None: pytest.skip("the pure-Python core has no rows_columns (the Python form is what runs)")
  rows, md, _ = _table(wl, size)
  assert md and any(r[3] is not None for r in rows) and any(r[4] is not None for r in rows)
  _same(ti._columns(rows, md), ti._columns_py(rows, md))
  _same(ti._columns(rows, {}), ti._columns_py(rows, {}))
  assert ti._columns(rows, {})[6] is None
  shared = rows[0][3] if rows[0][3] is not None else object()  # an object in the arg and the metadata columns
  rev = list(reversed(rows))
  n = len(rows)
  rev = [(o, d, tuple(n - 1 - s for s in src), a, t) for o, d, src, a, t in rev]
  md2 = {n - 1 - r: m for r, m in md.items()} | {0: shared}
  got = ti._columns(rev, md2)
  _same(got, ti._columns_py(rev, md2))


def test_c_columns_of_the_conversion_build_the_same_nodes(monkeypatch):
  """from_tinygrad with the C columns and with the Python ones gives the same pygrad nodes (hash-consed: `is`)."""
  if CORE.rows_columns is None: pytest.skip("the pure-Python core has no rows_columns")
  _, _, root = _table("W1", 20)
  a = pt.from_tinygrad(root)
  monkeypatch.setattr(ti, "_COLS", [None])
  assert pt.from_tinygrad(root) is a
  assert pt.to_tinygrad(a) is root


def test_c_columns_check_their_arguments():
  """Bad rows are Python exceptions naming what is wrong, never a crash."""
  f = CORE.rows_columns
  if f is None: pytest.skip("the pure-Python core has no rows_columns")
  ok = [(1, 2, (), None, None), (3, 4, (0,), "a", None)]
  op, dt, start, src, ar, tr, pd, objs = f(ok, {1: ("m",)})
  assert np.frombuffer(start, np.int64).tolist() == [0, 0, 1] and np.frombuffer(src, np.int32).tolist() == [0]
  assert objs[0] == "a" and objs[1] == ("m",) and np.frombuffer(pd, np.int32).tolist() == [0, 2]
  assert f([], {})[:7] == (bytearray(), bytearray(), bytearray(8), bytearray(), bytearray(), bytearray(), None)
  with pytest.raises(TypeError): f(ok)
  with pytest.raises(TypeError): f(tuple(ok), {})
  with pytest.raises(TypeError): f(ok, [])
  with pytest.raises(TypeError): f([(1, 2, (), None)], {})  # no 5-tuple
  with pytest.raises(TypeError): f([(1, 2, [0], None, None)], {})  # sources no tuple
  with pytest.raises(TypeError): f([(1.0, 2, (), None, None)], {})  # op no int
  with pytest.raises(TypeError): f([(True, 2, (), None, None)], {})  # a bool is no exact int
  with pytest.raises(OverflowError): f([(1, 2**31, (), None, None)], {})
  with pytest.raises(OverflowError): f([(1, 2**70, (), None, None)], {})
  with pytest.raises(IndexError): f([(1, 2, (1,), None, None)], {})  # a source past the rows
  with pytest.raises(IndexError): f([(1, 2, (-1,), None, None)], {})
  with pytest.raises(TypeError): f([(1, 2, ("0",), None, None)], {})
  with pytest.raises(OverflowError): f(ok, {2: ("m",)})  # metadata of no row
  with pytest.raises(TypeError): f(ok, {"1": ("m",)})


def test_gc_after_a_conversion():
  """After a conversion the young objects are in the oldest generation (no collection walked them) and nothing is
  left frozen; cyclic garbage made before it is still collected; objects the program froze stay frozen."""
  import weakref
  x = Tensor.empty(4, 4, device=DEV)
  y = (x @ x).relu().sum()
  was = gc.isenabled()
  gc.enable()
  try:
    gc.collect()

    class Cycle:
      pass
    c = Cycle()
    c.me = c
    dead = weakref.ref(c)
    del c
    p = pt.from_tinygrad(y.uop)
    assert gc.get_count()[0] < 100 and gc.get_freeze_count() == 0
    assert dead() is not None  # promoted, not collected (nor leaked:)
    gc.collect()
    assert dead() is None
    gc.freeze()
    frozen = gc.get_freeze_count()
    assert pt.to_tinygrad(pt.from_tinygrad(y.uop)) is y.uop
    # the program's frozen objects were neither unfrozen (the count would be 0) nor joined by the conversion's (it
    # would grow); it may shrink: frozen objects die as usual (a batch of handles released meanwhile)
    assert 0 < gc.get_freeze_count() <= frozen
    del p
  finally:
    gc.unfreeze()
    gc.enable() if was else gc.disable()


def test_c_loop_of_the_way_out_makes_expands_by_plan():
  """An untagged EXPAND row planned for the way out's C loop (csrc/pyforeign.c, kind 3: tinygrad_out._expand_plans)
  is made as _expand makes it: from the first row below its chain of reshapes not made yet (its held node if held
  reduced), reshaped unless its shape id says it has the shape already, expanded and permuted; bad plans and tables
  are exceptions, never a crash or a hang."""
  from tinygrad.dtype import dtypes as tdtypes
  from tinygrad.uop.ops import UOp as TUOp, Ops as TOps, UOpMetaClass
  import pygrad.interop.tinygrad_tables as tt
  f = CORE.foreign_rows
  if f is None: pytest.skip("the pure-Python core has no C loop (the Python loop is what runs)")
  i32 = lambda xs: np.array(xs, np.int32).tobytes()  # noqa: E731
  x = TUOp.const(2.5, tdtypes.float32)
  karg, garg = TUOp.const(3, tdtypes.int32), TUOp.const(4, tdtypes.int32)  # stand-ins for shape operands
  other = 7  # an op number that is no RESHAPE

  def run(plan, out1=None, held=None, src=(0, 1), shid=(5, 5, 5), lazy=None):
    out = [x, out1, None]
    c = (out, i32([other, tt._RESHAPE, tt._EXPANDOP]), i32([0, 0, 0]), i32([0, 0, 0]),
         np.array([0, 0, 1, 2], np.int64).tobytes(), i32(src), i32([0, 0, 0]), (), (), (), UOpMetaClass.ucache, TUOp,
         (0, TOps.CAST, 0, TOps.BITCAST), None, None, {}, lazy, tt._tfields(), {} if held is None else held,
         [None, None, plan(i32(shid))])
    return f(c, [2], 0, 1), out[2]

  def plan(want=5, perm=None, n=11):
    return lambda shid: (3, shid, tt._RESHAPE, want, (3,), TOps.RESHAPE, karg, TOps.EXPAND, garg, TOps.PERMUTE,
                         perm)[:n]
  exp = lambda y: TUOp(TOps.EXPAND, y.dtype, (y, garg))  # noqa: E731
  assert run(plan()) == (1, exp(x))  # row 0 has the kept shape already
  assert run(plan(want=6)) == (1, exp(TUOp(TOps.RESHAPE, x.dtype, (x, karg))))
  assert run(plan(perm=(1, 0))) == (1, TUOp(TOps.PERMUTE, x.dtype, (exp(x),), (1, 0)))
  y = TUOp.const(1.5, tdtypes.float32)
  assert run(plan(), out1=y, shid=(5, 6, 5)) == (1, exp(TUOp(TOps.RESHAPE, y.dtype, (y, karg))))  # row 1 made: used
  assert run(plan(want=6), held={0: (y, (3,), (1, 3), (0,))}) == (1, exp(y))  # held with the kept shape
  assert run(plan(), held={0: (y, (4,), (1, 4), (0,))}) == (1, exp(TUOp(TOps.RESHAPE, y.dtype, (y, karg))))
  with pytest.raises(TypeError): run(plan(n=10))
  with pytest.raises(TypeError): run(lambda s: plan()(s) + (None,))
  with pytest.raises(TypeError): run(plan(), shid=(5, 5))  # not one shape id a row
  with pytest.raises(TypeError): run(lambda s: (3, [5, 5, 5]) + plan()(s)[2:])  # shape ids no bytes
  with pytest.raises(TypeError): run(lambda s: plan()(s)[:2] + ("r",) + plan()(s)[3:])
  with pytest.raises(TypeError): run(plan(), held={0: (y,)})
  with pytest.raises(TypeError): run(plan(), src=(0, 1, 1)[1:])  # a reshape chain that loops: no hang
  with pytest.raises(IndexError): run(plan(), src=(9, 1))
