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
  w = ((x * 7.0).exp2() + x).uop  # a tuple extending the last one read (tinygrad appends so): the new tail counts
  all_metadata[w] = rep * 400 + (TMetadata("reciprocal", True),) + (TMetadata("exp2", False),) * 3
  assert [(m.name, m.backward) for m in pt.from_tinygrad(w).metadata] == \
    [("softmax", True), ("reciprocal", True), ("softmax", False), ("exp2", False)]
  v = ((x * 5.0).exp2() + x).uop  # other content, another order: its own pygrad tuple (on another node: pygrad's
  all_metadata[v] = tuple(reversed(rep)) * 3  # hash-consing keeps the metadata a node was first made with)
  assert [(m.name, m.backward) for m in pt.from_tinygrad(v).metadata] == \
    [("softmax", False), ("reciprocal", True), ("softmax", True)]


def _fresh_mlp():
  """A small MLP whose weights are compute_gradient's targets (the C walk makes their opaque BUFFER rows)."""
  x = Tensor.empty(4, 8, device=DEV)
  w1, w2 = Tensor.empty(8, 16, device=DEV), Tensor.empty(16, 3, device=DEV)
  out = ((x @ w1).relu() @ w2).sum()
  return out.uop, out.uop.const_like(1.0), [w1.uop, w2.uop]


def _cin_rows(cin):
  return [(r[0], r[1], r[2], r[3][1:] if r[0] == ti._BUFFER else r[3], r[4]) for r in cin.rows]


def test_c_walk_reads_the_device_tinygrad_cached_or_asks_for_it():
  """The C walk reads a node's device where tinygrad caches it (its __dict__; the property is a Python frame) and
  asks the property where nothing is cached: an opaque source's BUFFER row carries the device either way, as the
  Python walk's does."""
  root, rg, targets = _fresh_mlp()
  c, py = _both(lambda: pt.convert_in(root, rg, targets))
  assert _cin_rows(c[0]) == _cin_rows(py[0]) and c[1] is py[1]
  bufs = [r for r in c[0].rows if r[0] == ti._BUFFER]
  assert bufs and all(r[3][2] == DEV for r in bufs)
  for t in targets: t.__dict__.pop(ti._DVN, None)  # nothing cached: the property works it out (and caches it)
  c2, py2 = _both(lambda: pt.convert_in(root, rg, targets))
  assert _cin_rows(c2[0]) == _cin_rows(c[0]) == _cin_rows(py2[0])
  assert all(t.__dict__.get(ti._DVN) == DEV for t in targets)
  def walk():  # the table only (a graph on two devices is no graph pygrad builds)
    cin = ti._In(targets=set(targets))
    cin.add(root)
    return cin

  try:
    for t in targets: t.__dict__[ti._DVN] = "PYTHON:1"  # what tinygrad cached is the node's device to both walks
    c3, py3 = _both(walk)
    assert sorted(r[3][2] for r in c3.rows if r[0] == ti._BUFFER) == [DEV, "PYTHON:1", "PYTHON:1"]  # (x, the weights)
    assert _cin_rows(c3) == _cin_rows(py3)
  finally:
    for t in targets: t.__dict__[ti._DVN] = DEV


def test_c_walk_finds_metadata_by_node_among_dead_and_live_entries():
  """The C walk looks a node up in tinygrad's metadata dict (keyed by weak references) by a probe equal to a weak
  reference to the node: it finds each node's own entry, never another's, while the dict also holds entries of
  nodes that are gone and of many other live nodes; the result is the Python walk's."""
  keep = []
  for i in range(200):  # other live nodes with metadata (more entries than the graph has nodes)
    u = (Tensor.empty(2, device=DEV) * float(i)).uop
    all_metadata[u] = (TMetadata(f"other{i}", False),)
    keep.append(u)
  gone = (Tensor.empty(2, device=DEV) + 1.0).uop
  all_metadata[gone] = (TMetadata("gone", False),)
  del gone
  root, _, _ = _chain(50)
  c, py = _both(lambda: pt.from_tinygrad(root))
  assert c is py and _listing(c) == _listing(py)
  names = {m.name for u in c.toposort() for m in (u.metadata or ())}
  assert names and not any(n.startswith(("other", "gone")) for n in names)
  assert len(keep) == 200


def test_c_walk_metadata_of_equal_names_in_distinct_objects():
  """Metadata whose names are equal strings in distinct objects, and equal objects with other backward flags, get
  the (name, backward) pair's pygrad metadata, as in the Python walk (the C walk caches by the objects' addresses)."""
  x = Tensor.empty(3, device=DEV)
  y, us = x, []
  for i in range(40):
    y = y * 2.0 if i % 2 else y + x
    us.append(y.uop)
  for i, u in enumerate(us):
    name = "".join(["lin", "ear"]) if i % 3 else "linear"  # a new string object, or the one literal
    all_metadata[u] = (TMetadata(name, bool(i % 4 == 0)),)
  c, py = _both(lambda: pt.from_tinygrad(y.uop))
  assert c is py and _listing(c) == _listing(py)
  assert {(m.name, m.backward) for u in c.toposort() for m in (u.metadata or ())} >= {("linear", True),
                                                                                      ("linear", False)}


class _NotTheNodeClass:
  """A class whose instances the walk never meets (no slots: op, src, dtype and arg are no descriptors of it)."""


class _PropertyOp:
  op = property(lambda self: None)  # a class attribute that is a descriptor, but no slot's


@pytest.mark.parametrize("cls", [_NotTheNodeClass, _PropertyOp])
def test_c_walk_reads_attributes_by_name_unless_nodes_are_the_slotted_class(cls):
  """The C walk reads op, src, dtype and arg through the node class's slot descriptors (no lookup by name); told of
  another class, it reads every attribute by name, and the table is the same as the descriptors' and the Python
  walk's."""
  root, rg, targets = _fresh_mlp()
  c, py = _both(lambda: pt.convert_in(root, rg, targets))
  saved = ti._NODE[0]
  try:
    ti._NODE[0] = cls
    named = pt.convert_in(root, rg, targets)
  finally:
    ti._NODE[0] = saved
  assert _cin_rows(named[0]) == _cin_rows(c[0]) == _cin_rows(py[0]) and named[1] is c[1] is py[1]
  with pytest.raises(TypeError):  # no class at all: the walk's argument check
    ti._NODE[0] = 1
    try: pt.from_tinygrad(root)
    finally: ti._NODE[0] = saved
