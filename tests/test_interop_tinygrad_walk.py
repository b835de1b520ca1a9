"""The way in's per-node savings (csrc/pywalk.c against the Python walk of tinygrad_in._In): the C walk's cache of
tinygrad Metadata objects, from_tinygrad's conversion keeping no (row, node) pairs for a way back it never takes, and
broadcast shapes made canonical (one object per distinct shape for the builder to intern)."""
from __future__ import annotations
import pytest

pytest.importorskip("tinygrad", reason="tinygrad is not installed (pip install '.[tinygrad]')")
from tinygrad import Tensor  # noqa: E402
from tinygrad.helpers import Metadata as TMetadata  # noqa: E402
from tinygrad.uop.ops import all_metadata  # noqa: E402
import pygrad.interop.tinygrad as pt  # noqa: E402
import pygrad.interop.tinygrad_in as ti  # noqa: E402
from pygrad.interop.tinygrad_tables import _BCAST  # noqa: E402

DEV = "PYTHON"


def _both(f):
  """f() with the C walk, then with the Python walk (the C core only: the pure core has only the Python walk)."""
  fast = ti._FWALK[0]
  if fast is None: pytest.skip("the pure-Python core has no C walk (the Python walk is what runs)")
  try:
    c = f()
    ti._FWALK[0] = None
    return c, f()
  finally:
    ti._FWALK[0] = fast


def _chain(n: int):
  """A chain of n broadcasting adds and muls, each node with metadata set by hand: Metadata objects shared by runs of
  one to three consecutive nodes, more distinct ones than the C walk's cache has slots, names and backward flags
  that repeat in other combinations (the pygrad metadata follows (name, backward), never the object alone)."""
  x, b = Tensor.empty(4, 8, device=DEV), Tensor.empty(8, device=DEV)
  y, us = x, []
  for i in range(n):
    y = (y + b) if i % 2 else (y * b)
    us.append(y.uop)
  md, k = None, 0
  for i, u in enumerate(us):
    if md is None or i % 3 == 0 or i % 7 == 0:
      md = TMetadata(f"op{k % 5}", k % 3 == 0)
      k += 1
    all_metadata[u] = (md,)
  return y.uop, x.uop, b.uop


def _listing(p):
  return [(u.op, u.arg if u.op.name != "BUFFER" else None, u.metadata) for u in p.toposort()]


def test_c_walk_metadata_cache_gives_the_python_walks_metadata():
  root, _, _ = _chain(700)
  c, py = _both(lambda: pt.from_tinygrad(root))
  assert c is py and _listing(c) == _listing(py)
  names = {(m.name, m.backward) for u in c.toposort() for m in (u.metadata or ())}
  assert names == {(f"op{k % 5}", k % 3 == 0) for k in range(15)}


def test_c_walk_metadata_cache_holds_what_it_caches():
  """Metadata objects dropped between conversions (their nodes freed) leave nothing behind that a later walk of new
  objects, possibly at the same addresses, could take for them."""
  seen = []
  for rnd in range(3):
    x = Tensor.empty(3, device=DEV)
    y, us = x, []
    for i in range(300):
      y = y * 2.0 if i % 2 else y + x
      us.append(y.uop)
    for i, u in enumerate(us): all_metadata[u] = (TMetadata(f"r{rnd}n{i // 2}", bool(i % 3)),)
    c, py = _both(lambda: pt.from_tinygrad(y.uop))
    got = _listing(c)
    assert c is py and got == _listing(py)
    seen.append({m.name[:2] for _, _, md in got for m in (md or ()) if m.name[:1] == "r"})  # (shared constants carry
    # the metadata of the test that made them first)
    del x, y, us, c, py
  assert seen == [{"r0"}, {"r1"}, {"r2"}]


def test_from_tinygrad_keeps_no_pairs_for_the_way_back():
  root, x, _ = _chain(20)
  saved = ti._FWALK[0]
  for walk in [saved, None] if saved is not None else [None]:  # the C walk (C core) and the Python walk
    try:
      ti._FWALK[0] = walk
      cin = ti._In(rev=False)
      cin.build([cin.add(root)])
      assert cin.puts is None and cin.rows
      with pytest.raises(RuntimeError, match="rev=False"): cin.rev()
      kept = ti._In()
      kept.build([kept.add(root)])
      assert kept.rev() and x in set(kept.rev().values())
    finally:
      ti._FWALK[0] = saved


def test_broadcast_shapes_are_one_object_per_shape():
  """The rows that make tinygrad's implicit broadcasts explicit carry the conversion's one object of each shape, in
  the C walk and in the Python walk alike (the builder interns each distinct object once)."""
  root, _, _ = _chain(60)

  def rows():
    cin = ti._In(rev=False)
    cin.add(root)
    return cin

  for cin in _both(rows):
    bc = [r[3] for r in cin.rows if r[4] == _BCAST]
    assert len(bc) >= 60 and all(cin.shapes[s] is s for s in bc)
    assert len({id(s) for s in bc}) == len(set(bc)) == 2  # (1, 8) and (4, 8)


def test_repeated_metadata_entries_become_one_each():
  """tinygrad's compute_gradient appends a node's backward metadata without looking at what the node has, so a node
  shared by many graphs (a constant) gains a copy per backward pass. The conversion gives each (name, backward) once,
  in first-seen order (pygrad's metadata holds each entry once), with either walk, however long the tuple."""
  x = Tensor.empty(4, 8, device=DEV)
  y = (x * 3.0).exp2() + x
  u = y.uop
  rep = (TMetadata("softmax", True), TMetadata("reciprocal", True), TMetadata("softmax", False))
  all_metadata[u] = rep * 400 + (TMetadata("reciprocal", True),)
  c, py = _both(lambda: pt.from_tinygrad(u))
  assert c is py and _listing(c) == _listing(py)
  assert [(m.name, m.backward) for m in c.metadata] == [("softmax", True), ("reciprocal", True), ("softmax", False)]
  v = ((x * 5.0).exp2() + x).uop  # other content, another order: its own pygrad tuple (on another node: pygrad's
  all_metadata[v] = tuple(reversed(rep)) * 3  # hash-consing keeps the metadata a node was first made with)
  assert [(m.name, m.backward) for m in pt.from_tinygrad(v).metadata] == \
    [("softmax", False), ("reciprocal", True), ("softmax", True)]
