"""The bulk builder's fast path (csrc/serial_build.c, pg_serial_build_run): rows proved new skip the table lookup and
are entered in the table in batches. Identity must not change: rows equal to live nodes, to each other, or to nodes
made earlier in the same build give those nodes, on both cores (pygrad.build) and id for id with PyCore (the raw
builder on a private C store)."""
from __future__ import annotations
import gc, random
import numpy as np
import pytest
import pygrad
from pygrad import UOp, Ops, dtypes
from pygrad.core.pycore import PyCore

try:
  from pygrad.core.ccore import CCore, ffi, lib
except ImportError:  # the C core is not built: the raw builder's tests skip
  CCore = None

F32 = dtypes.float32.id


def _table(rows):
  """(ops, dtypes, (starts, flat)) of rows given as (op, sources)."""
  ops = np.array([int(o) for o, _ in rows])
  starts = np.zeros(len(rows) + 1, np.int64)
  starts[1:] = np.cumsum([len(s) for _, s in rows])
  flat = np.array([j for _, s in rows for j in s], np.int64)
  return ops, np.full(len(rows), F32), (starts, flat)


def test_rows_equal_to_live_nodes_are_those_nodes():
  x = UOp.placeholder((4,), dtypes.float32, name="bulk_x")
  live = [x]
  for i in range(40): live.append(live[-1].sin() if i % 2 else live[-1] + x)
  rows = [(Ops.BUFFER, ())]
  for i in range(40): rows.append((Ops.SIN, (i,)) if i % 2 else (Ops.ADD, (i, 0)))
  for i in range(40, 80): rows.append((Ops.EXP2, (i,)))  # on top of the live part: new nodes
  ops, dts, srcs = _table(rows)
  before = pygrad.live_nodes()
  got = pygrad.build(ops, dts, srcs, [x.arg] + [None] * 80, roots=[20, 40, 80])
  want = live[40]
  for _ in range(40): want = want.exp2()
  assert got[0] is live[20] and got[1] is live[40] and got[2] is want
  assert pygrad.live_nodes() == before + 40
  del got, want
  assert pygrad.live_nodes() == before


def test_equal_rows_are_one_node():
  """Rows equal to an earlier row of the same build: to a user the builder lists (the first or the second), to one
  it stopped listing (a source with three users), and rows whose sources are such duplicates (their nodes then have
  more references than the builder knows users, so the table lookup finds them)."""
  x = UOp.placeholder((3,), dtypes.float32, name="bulk_y")
  rows = [(Ops.BUFFER, ()), (Ops.SIN, (0,)), (Ops.EXP2, (1,)), (Ops.EXP2, (1,)), (Ops.LOG2, (1,)),
          (Ops.LOG2, (1,)), (Ops.SQRT, (1,)), (Ops.SQRT, (1,)), (Ops.SIN, (3,)), (Ops.SIN, (2,)),
          (Ops.ADD, (8, 9)), (Ops.ADD, (8, 9)), (Ops.EXP2, (10,)), (Ops.EXP2, (10,))]
  ops, dts, srcs = _table(rows)
  args = [x.arg] + [None] * (len(rows) - 1)
  # the first build asks Python for each new signature (Python's handles then hold those rows); once the nodes are
  # freed, the second makes every row in C, where the builder's own bookkeeping must find the equal rows
  r = pygrad.build(ops, dts, srcs, args, roots=list(range(len(rows))))
  del r
  gc.collect()
  pygrad.live_nodes()  # releases the dropped handles' references now
  r = pygrad.build(ops, dts, srcs, args, roots=list(range(len(rows))))
  s = x.sin()
  assert r[0] is x and r[1] is s and r[2] is r[3] is s.exp2() and r[4] is r[5] is s.log2()
  assert r[6] is r[7] is s.sqrt() and r[8] is r[9] is s.exp2().sin() and r[10] is r[11] is r[8] + r[8]
  assert r[12] is r[13] is r[10].exp2()
  assert len(UOp.sink(*r).toposort()) == 9  # eight distinct nodes and the sink


def test_rows_no_root_reaches_are_freed_and_the_rest_live_on():
  """The builder keeps a reference only on rows no node it made uses (it hands the others' over to their first user:
  csrc/serial_build.c, build_hand_over); every row must still be freed exactly when nothing reaches it: rows under no
  root at once, sources named twice (x * x) counted twice, and the rest when the roots go. Built twice: the second build
  makes every row in C (the first asks Python for each new signature)."""
  x = UOp.placeholder((5,), dtypes.float32, name="bulk_w")
  rows = [(Ops.BUFFER, ()), (Ops.MUL, (0, 0)), (Ops.SIN, (1,)), (Ops.EXP2, (1,)), (Ops.ADD, (2, 2)), (Ops.LOG2, (3,)),
          (Ops.SQRT, (4,)), (Ops.MUL, (4, 4)), (Ops.EXP2, (7,)), (Ops.SIN, (5,))]
  ops, dts, srcs = _table(rows)
  args = [x.arg] + [None] * (len(rows) - 1)
  before = pygrad.live_nodes()
  for _ in range(2):
    r = pygrad.build(ops, dts, srcs, args, roots=[6, 8, 2])
    sq = x * x
    assert r[0] is (sq.sin() + sq.sin()).sqrt() and r[2] is sq.sin() and r[1] is ((sq.sin() + sq.sin()) *
                                                                                 (sq.sin() + sq.sin())).exp2()
    del sq
    assert pygrad.live_nodes() == before + 6  # x * x, sin, add, sqrt, mul, exp2: rows 3, 5 and 9 went at once
    keep = r[2]
    del r
    gc.collect()
    assert pygrad.live_nodes() == before + 2  # sin(x * x) keeps x * x
    del keep
    gc.collect()
    assert pygrad.live_nodes() == before


def test_long_chain_with_repeats_matches_methods():
  """A table much larger than the store's empty hash table (it grows once, before the rows are made), whose rows
  now and then repeat earlier ones."""
  x = UOp.placeholder((2,), dtypes.float32, name="bulk_z")
  rng = random.Random(5)
  rows, want = [(Ops.BUFFER, ())], [x]
  for i in range(1, 30000):
    k = rng.randrange(8)
    if k == 0:  # the same as an earlier row
      j = rng.randrange(1, i)
      rows.append(rows[j])
      want.append(want[j])
    elif k == 1:
      j = rng.randrange(i)
      rows.append((Ops.ADD, (i - 1, j)))
      want.append(want[i - 1] + want[j])
    else:
      rows.append((Ops.SIN, (i - 1,)))
      want.append(want[i - 1].sin())
  ops, dts, srcs = _table(rows)
  got = pygrad.build(ops, dts, srcs, [x.arg] + [None] * (len(rows) - 1), roots=list(range(0, len(rows), 7)))
  assert all(g is w for g, w in zip(got, want[::7]))


# ---- the raw builder on a private store, id for id against PyCore ----
LEAF, ADD, SIN = 0, 13, 20


def _raw_build(core: CCore, rows: list[tuple[int, tuple[int, ...]]]) -> list[int]:
  """The ids of rows (op, sources as rows) built by pg_serial_build_* on core's store (every meta known: 0)."""
  n = len(rows)
  op = np.array([o for o, _ in rows], np.int32)
  zero = np.zeros(n, np.int32)
  start = np.zeros(n + 1, np.int64)
  start[1:] = np.cumsum([len(s) for _, s in rows])
  src = np.array([j for _, s in rows for j in s] or [0], np.int32)
  flags = np.ones(64, np.uint8)
  err, where, pos = ffi.new("int *"), ffi.new("int64_t *"), ffi.new("int64_t *")
  i32 = lambda a: ffi.from_buffer("int32_t[]", a)  # noqa: E731
  dt = np.ones(n, np.int32)
  b = core.serial_build_new(n, i32(op), i32(dt), ffi.from_buffer("int64_t[]", start), i32(src), i32(zero),
                            i32(zero), ffi.NULL, ffi.NULL, 0, ffi.NULL, 0, i32(zero), ffi.from_buffer("uint8_t[]", flags), 64, 16,
                            err, where)
  assert b != ffi.NULL, (err[0], where[0])
  try:
    assert lib.pg_serial_build_run(b, pos) == lib.PG_BUILD_DONE
    ids = np.empty(n, np.int32)
    assert lib.pg_serial_build_ids(b, ffi.from_buffer("int32_t[]", ids), n) == 0
    for i in ids.tolist(): core.incref(i)  # the caller's references: the builder's go with it
  finally:
    lib.pg_serial_build_delete(b)
  return ids.tolist()


def _py_build(core: PyCore, rows, bulk: bool = False) -> list[int]:
  """The same rows made one by one (the reference: lookups, and the same id recycling); bulk: as a bulk builder
  of the rows does, first ordering the ids it recycles (free_order)."""
  if bulk: core.free_order(len(rows))
  ids: list[int] = []
  for o, s in rows: ids.append(core.make(o, 1, tuple(ids[j] for j in s), 0, 0, 0))
  return ids


def _random_rows(rng: random.Random, n: int):
  rows = [(LEAF, ())]
  for i in range(1, n):
    k = rng.randrange(10)
    if k == 0: rows.append(rows[rng.randrange(i)])
    elif k == 1: rows.append((LEAF, ()))
    elif k < 4: rows.append((ADD, (rng.randrange(i), rng.randrange(i))))
    else: rows.append((SIN, (i - 1,)))
  return rows


@pytest.mark.skipif(CCore is None, reason="pygrad._core is not built")
@pytest.mark.parametrize("seed", range(6))
def test_raw_builder_matches_pycore_id_for_id(seed):
  """A store already holding some nodes (made, and some freed so that ids are recycled), then a table that
  repeats some of them and itself: the same ids as PyCore making the rows one by one, and every node is in the
  table afterwards (made again, the same id)."""
  rng = random.Random(seed)
  pre = _random_rows(rng, 2000)
  rows = pre[:1000] + [(o, tuple(j + 1000 for j in s)) for o, s in _random_rows(rng, 20000 + seed * 7000)]
  c, p = CCore(), PyCore()
  kept = []
  for core in (c, p):
    ids = _py_build(core, pre)
    drop = random.Random(seed + 100).sample(range(len(ids)), 1500)
    for i in drop: core.decref(ids[i])
    kept.append([ids[i] for i in sorted(set(range(len(ids))) - set(drop))])
  got, want = _raw_build(c, rows), _py_build(p, rows, bulk=True)
  assert got == want and c.live() == p.live()
  again = [c.make(o, 1, tuple(got[j] for j in s), 0, 0, 0) for o, s in rows]
  assert again == got


@pytest.mark.skipif(CCore is None, reason="pygrad._core is not built")
@pytest.mark.parametrize("k", [0, 100, 16383, 16384, 20000, 10 ** 9])
def test_free_order_takes_recycled_ids_ascending_on_both_cores(k):
  """After a graph is freed its ids wait in the order it was freed; a bulk build of k >= FREE_ORDER_MIN rows takes
  the next k of them in ascending order (consecutive rows on nearby nodes: each build-and-free cycle otherwise
  scattered them further), both cores alike, and a smaller one leaves the order alone."""
  c, p = CCore(), PyCore()
  assert c.free_order_min == p.free_order_min == 16384
  n = 30000
  got = []
  for core in (c, p):
    a = [core.make(LEAF, 1, (), 0, 0, 0)]  # a chain, kept
    for _ in range(n - 1): a.append(core.make(SIN, 1, (a[-1],), 0, 0, 0))
    b = [core.make(ADD, 1, (u, u), 0, 0, 0) for u in a]  # a user of each: freed in a scrambled order
    for i in random.Random(7).sample(range(n), n): core.decref(b[i])
    core.free_order(k)
    got.append([core.make(ADD, 1, (u, a[0]), 0, 0, 0) for u in a])  # n new nodes
  assert got[0] == got[1]
  top = min(k, n) if k >= 16384 else 0
  assert got[0][:top] == sorted(got[0][:top])
  if top < n: assert got[0][top:] != sorted(got[0][top:])  # the rest as freed


@pytest.mark.skipif(CCore is None, reason="pygrad._core is not built")
@pytest.mark.parametrize("seed", range(3))
def test_raw_builder_sources_with_many_users(seed):
  """Sources with more users than the builder lists per row (csrc/serial_build.c BUILD_SCAN: 64), and rows equal to
  users listed before and after that point: the same ids as PyCore, and each repeat is the earlier node."""
  rng = random.Random(seed)
  rows = [(LEAF, ())]
  for i in range(1, 300): rows.append((SIN, (i - 1,)))  # 300 distinct nodes
  users = []
  for k in range(2000):  # row 0 and rows 1..40 get hundreds of users each, in random order, with repeats
    a, b = (0 if rng.random() < 0.5 else rng.randrange(1, 40)), rng.randrange(300)
    if users and rng.random() < 0.3: rows.append(rows[rng.choice(users)])
    else:
      users.append(len(rows))
      rows.append((ADD, (a, b)))
  got, want = _raw_build(CCore(), rows), _py_build(PyCore(), rows, bulk=True)
  assert got == want
  assert len(set(got)) == len({rows[i] for i in range(len(rows))})


@pytest.mark.skipif(pygrad.core_name() != "c", reason="the loaders' roots are wrapped in one C call on the C core")
def test_adopt_rows_takes_over_the_references_also_on_failure():
  """uop.adopt_rows (csrc/pyreg.c wrap_many): the handles of many nodes at once, each taking over a reference the
  caller holds (dropped if the handle exists); on a bad row the rest are dropped too, and on a bad argument none is
  taken over."""
  from pygrad import uop as U
  from pygrad.core import CORE
  base = pygrad.live_nodes()
  x = UOp.placeholder((3,), dtypes.float32, name="adopt_x")
  y = x.sin()
  ids = [x._id, y._id]
  info = [CORE.info(i) for i in ids]
  col = lambda *v: np.array(v, np.int32).tobytes()  # noqa: E731
  cols = lambda metas: (col(*ids), col(*metas), col(*(f[0] for f in info)), col(*(f[1] for f in info)),  # noqa: E731
                        col(*(f[3] for f in info)), col(*(f[4] for f in info)))
  metas = [f[5] for f in info]
  for i in ids: CORE.incref(i)
  got = U.adopt_rows(*cols(metas))
  assert got[0] is x and got[1] is y  # the handles exist: the references were dropped
  for i in ids: CORE.incref(i)
  with pytest.raises(ValueError, match="no meta"):
    U.adopt_rows(*cols([metas[0], 1 << 30]))  # the first is wrapped, the second is not: both references go
  with pytest.raises(ValueError, match="metas must be bytes of 2 int32s"):
    U.adopt_rows(col(*ids), col(0), *cols(metas)[2:])  # a column of the wrong size: nothing taken over
  del x, y, got
  gc.collect()
  assert pygrad.live_nodes() == base
