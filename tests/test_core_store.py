"""The node store and walks through the cores' raw id interface: PyCore is the reference, CCore must match it id for
id (same make results, id recycling, toposort and deepwalk orders, arg drain)."""
import random
from concurrency import run_on_threads
import pytest
from hypothesis import given, settings, strategies as st
from pygrad.core.pycore import PyCore, ArgGone

try:
  from pygrad.core.ccore import CCore
except ImportError:  # the C core is not built: its tests skip, PyCore's still run
  CCore = None

needs_c = pytest.mark.skipif(CCore is None, reason="pygrad._core is not built")
CORES = [PyCore, pytest.param(CCore, marks=needs_c, id="CCore")]
LEAF, ADD, MUL, DETACH, TUPLE, FUNCTION, CALL = 0, 13, 14, 37, 40, 42, 43


@pytest.fixture(params=CORES, ids=lambda c: getattr(c, "__name__", "CCore"))
def core(request): return request.param()


def chain(core, n, op=ADD):
  """A chain of n nodes (ids 0..n-1 in a fresh core), holding only the last."""
  prev = core.make(LEAF, 1, (), 0, 0, 0)
  for _ in range(n - 1):
    nxt = core.make(op, 1, (prev,), 0, 0, 0)
    core.decref(prev)
    prev = nxt
  return prev


# ---- identity and lifetime ----
def test_hash_consing(core):
  core.arg_register(1)
  a = core.make(LEAF, 1, (), 1, 0, 7)
  b = core.make(LEAF, 1, (), 0, 0, 7)
  assert core.make(LEAF, 1, (), 1, 0, 9) == a  # meta is not part of the key
  assert core.make(LEAF, 2, (), 1, 0, 7) != a
  s = core.make(ADD, 1, (a, b), 0, 0, 3)
  assert core.make(ADD, 1, (a, b), 0, 0, 3) == s and core.make(ADD, 1, (b, a), 0, 0, 3) != s
  assert core.info(s) == (ADD, 1, 2, 0, 0, 3, 0) and core.src(s) == (a, b)
  assert core.info(a)[3] == 1


def test_many_sources(core):
  leaves = [core.make(LEAF, 1, (), 0, 0, 0) for _ in range(3)] + [core.make(LEAF, 2, (), 0, 0, 0)]
  for n in range(0, 12):
    src = tuple(leaves[i % 4] for i in range(n))
    t = core.make(TUPLE, 0, src, 0, 0, 0)
    assert core.src(t) == src and core.info(t)[2] == n and core.make(TUPLE, 0, src, 0, 0, 0) == t


def test_free_to_zero_and_recycle(core):
  a = core.make(LEAF, 1, (), 0, 0, 0)
  b = core.make(MUL, 1, (a, a), 0, 0, 0)
  c = core.make(ADD, 1, (b, a), 0, 0, 0)
  core.decref(a)
  core.decref(b)
  assert core.live() == 3
  core.decref(c)  # frees c, then b, then a
  assert core.live() == 0
  assert [core.make(LEAF, 1, (), i, 0, 0) for i in (0,)] == [a]  # LIFO: the last freed id comes back first
  assert core.make(LEAF, 2, (), 0, 0, 0) == b and core.make(LEAF, 3, (), 0, 0, 0) == c


def test_incref_keeps_alive(core):
  a = core.make(LEAF, 1, (), 0, 0, 0)
  core.incref(a)
  core.decref(a)
  assert core.live() == 1
  core.decref(a)
  assert core.live() == 0


# ---- args, tags, pdata ----
def test_arg_gone_protocol(core):
  for aid in (1, 2, 3): core.arg_register(aid)
  a = core.make(LEAF, 1, (), 1, 2, 0)
  core.set_pdata(a, 3)
  assert core.info(a)[6] == 3
  core.decref(a)
  assert sorted(core.arg_drain()) == [1, 2, 3] and core.arg_drain() == []
  with pytest.raises(ArgGone): core.make(LEAF, 1, (), 1, 0, 0)
  with pytest.raises(ArgGone): core.make(LEAF, 1, (), 0, 2, 0)
  core.arg_register(1)  # the interner hands the id out again
  b = core.make(LEAF, 1, (), 1, 0, 0)
  assert core.info(b)[3] == 1


def test_drain_skips_reused(core):
  core.arg_register(5)
  a = core.make(LEAF, 1, (), 5, 0, 0)
  core.decref(a)  # count 0: queued
  b = core.make(LEAF, 2, (), 5, 0, 0)  # used again before the drain
  assert core.arg_drain() == []
  core.decref(b)
  assert core.arg_drain() == [5]


def test_set_pdata_replaces(core):
  core.arg_register(1)
  core.arg_register(2)
  a = core.make(LEAF, 1, (), 0, 0, 0)
  core.set_pdata(a, 1)
  core.set_pdata(a, 1)
  core.set_pdata(a, 2)
  assert core.arg_drain() == [1] and core.info(a)[6] == 2
  core.set_pdata(a, 0)
  assert core.arg_drain() == [2]


def test_arg_slot_reuse_by_generation(core):
  """A drained id's slot is registered again under the next generation (the interner reuses slots, so the count
  tables stay as large as the ids alive at once): the new id counts in the old one's slot, and the old id, held
  across its drain, reads as gone, never as the slot's new arg."""
  gen = 1 << core.arg_slot_bits
  core.arg_register(1)
  a = core.make(LEAF, 1, (), 1, 0, 0)
  core.decref(a)
  assert core.arg_drain() == [1]
  core.arg_register(gen + 1)  # slot 1, generation 1
  b = core.make(LEAF, 1, (), gen + 1, 0, 0)
  assert core.info(b)[3] == gen + 1
  with pytest.raises(ArgGone): core.make(LEAF, 2, (), 1, 0, 0)
  with pytest.raises(ArgGone): core.set_pdata(b, 1)
  with pytest.raises(ValueError): core.arg_register(2 * gen + 1)  # slot 1 holds a live id
  with pytest.raises(ValueError): core.arg_register(gen)  # slot 0 is no id's
  core.set_pdata(b, gen + 1)
  core.decref(b)
  assert core.arg_drain() == [gen + 1]
  core.arg_register(2 * gen + 1)
  with pytest.raises(ArgGone): core.make(LEAF, 1, (), gen + 1, 0, 0)


@needs_c
def test_drain_more_than_buffer():
  c = CCore()
  ids = list(range(1, 1001))
  for aid in ids: c.arg_register(aid)
  nodes = [c.make(LEAF, 1, (), aid, 0, 0) for aid in ids]
  for n in nodes: c.decref(n)
  assert c.arg_drain() == ids  # in the order their counts reached 0, over several 256-id buffers
  assert c.arg_drain() == []


# ---- walks ----
def test_toposort_order(core):
  a, b = core.make(LEAF, 1, (), 0, 0, 0), core.make(LEAF, 2, (), 0, 0, 0)
  x = core.make(ADD, 1, (b, a), 0, 0, 0)
  y = core.make(MUL, 1, (x, a), 0, 0, 0)
  z = core.make(ADD, 1, (a, y), 0, 0, 0)
  assert list(core.toposort([z])) == [a, b, x, y, z]
  assert list(core.toposort([z], stop=[x])) == [a, y, z]
  assert list(core.toposort([x, z])) == [b, a, x, y, z]
  assert list(core.toposort([z], stop=[z])) == []


def test_toposort_enter_calls(core):
  p = core.make(LEAF, 3, (), 0, 0, 0)
  body = core.make(TUPLE, 0, (p,), 0, 0, 0)
  arg = core.make(LEAF, 1, (), 0, 0, 0)
  for op in (FUNCTION, CALL):
    f = core.make(op, 0, (body, arg), 0, 0, 0)
    assert list(core.toposort([f])) == [p, body, arg, f]
    assert list(core.toposort([f], enter_calls=False)) == [arg, f]


def test_deepwalk(core):
  t, u = core.make(LEAF, 1, (), 0, 0, 0), core.make(LEAF, 2, (), 0, 0, 0)
  d = core.make(DETACH, 1, (t,), 0, 0, 0)
  x = core.make(MUL, 1, (t, u), 0, 0, 0)
  y = core.make(ADD, 1, (d, u), 0, 0, 0)
  z = core.make(ADD, 1, (x, y), 0, 0, 0)
  walk, path = core.deepwalk(z, [t])
  assert list(path) == [x, d, y, z] and list(walk) == [x, y, z]  # toposort order: t u x d y z
  walk, path = core.deepwalk(z, [])
  assert list(walk) == [] and list(path) == []


def _random_script(seed, steps=400):
  """Run one random sequence of operations on both cores side by side, comparing every result."""
  rng = random.Random(seed)
  cores = [PyCore()] + ([CCore()] if CCore is not None else [])
  held: list[int] = []  # one entry per reference we own (the same on both cores)
  gone: set[int] = set()
  nargs = 6
  for c in cores:
    for aid in range(1, nargs + 1): c.arg_register(aid)

  def both(fn):
    res = []
    for c in cores:
      try: res.append(("ok", fn(c)))
      except ArgGone: res.append(("gone", None))
    assert all(r == res[0] for r in res[1:]), res
    return res[0]

  for _ in range(steps):
    k = rng.random()
    if k < 0.45 or not held:
      op = rng.choice([LEAF, LEAF, ADD, MUL, DETACH, TUPLE, FUNCTION, CALL])
      n = {LEAF: 0, ADD: 2, MUL: 2, DETACH: 1}.get(op) if op in (LEAF, ADD, MUL, DETACH) else rng.randint(1, 7)
      if n and not held: op, n = LEAF, 0
      src = tuple(rng.choice(held) for _ in range(n))
      arg = rng.choice([0, 0, rng.randint(1, nargs)]) if op == LEAF else 0
      tag = rng.choice([0, 0, 0, rng.randint(1, nargs)])
      dt = rng.randint(0, 2)
      kind, nid = both(lambda c: c.make(op, dt, src, arg, tag, 0))
      if kind == "ok": held.append(nid)
    elif k < 0.70:
      both(lambda c, i=held.pop(rng.randrange(len(held))): c.decref(i))
    elif k < 0.75:
      i = rng.choice(held)
      both(lambda c: c.incref(i))
      held.append(i)
    elif k < 0.80:
      pid = rng.choice([0] + [a for a in range(1, nargs + 1) if a not in gone])
      both(lambda c, i=rng.choice(held): c.set_pdata(i, pid))
    elif k < 0.85:
      _, out = both(lambda c: list(c.arg_drain()))
      gone.update(out)
      if gone and rng.random() < 0.5:
        aid = rng.choice(sorted(gone))
        gone.discard(aid)
        both(lambda c: c.arg_register(aid))
    elif k < 0.95:
      roots = [rng.choice(held) for _ in range(rng.randint(1, 3))]
      stop = [rng.choice(held) for _ in range(rng.randint(0, 2))]
      ec = rng.random() < 0.5
      both(lambda c: list(c.toposort(roots, ec, stop)))
    else:
      root, targets = rng.choice(held), [rng.choice(held) for _ in range(rng.randint(0, 3))]
      both(lambda c: tuple(list(x) for x in c.deepwalk(root, targets)))
    both(lambda c: c.live())
  for i in held: both(lambda c, i=i: c.decref(i))
  assert [c.live() for c in cores] == [0] * len(cores)
  both(lambda c: sorted(c.arg_drain()))


@pytest.mark.parametrize("seed", range(25))
def test_random_scripts_match(seed): _random_script(seed)


@settings(max_examples=30, deadline=None)
@given(st.integers(min_value=0, max_value=2**32))
def test_random_scripts_match_hypothesis(seed): _random_script(seed, steps=200)


# ---- depth ----
def _deep(core, n):
  root = chain(core, n)
  assert core.live() == n
  order = core.toposort([root])
  assert len(order) == n and order[0] == 0 and order[-1] == n - 1
  if hasattr(order, "numpy"):
    import numpy as np
    assert np.array_equal(order.numpy(), np.arange(n, dtype=np.int32))
  else:
    assert order == list(range(n))
  walk, path = core.deepwalk(root, [0])
  assert len(walk) == n - 1 and walk[0] == 1 and path[-1] == n - 1
  del order, walk, path
  core.decref(root)
  assert core.live() == 0


@needs_c
def test_deep_chain_c(): _deep(CCore(), 1_000_000)


def test_deep_chain_python(): _deep(PyCore(), 200_000)


# ---- the C core's own contract: validation, Ids, threads ----
@needs_c
def test_bad_ids_raise():
  c = CCore()
  c.arg_register(1)
  a = c.make(LEAF, 1, (), 0, 0, 0)
  freed = c.make(LEAF, 2, (), 0, 0, 0)
  c.decref(freed)
  for bad in (-1, freed, 10**6, 2**40):
    with pytest.raises(ValueError): c.make(ADD, 1, (a, bad), 0, 0, 0)
    with pytest.raises(ValueError): c.make(TUPLE, 1, (a, a, a, a, a, bad), 0, 0, 0)
    with pytest.raises(ValueError): c.incref(bad)
    with pytest.raises(ValueError): c.decref(bad)
    with pytest.raises(ValueError): c.info(bad)
    with pytest.raises(ValueError): c.src(bad)
    with pytest.raises(ValueError): c.set_pdata(bad, 0)
    with pytest.raises(ValueError): c.toposort([a, bad])
    with pytest.raises(ValueError): c.deepwalk(bad, [a])
  for badarg in (-1, 2, 10**6, 2**40):
    with pytest.raises(ValueError): c.make(LEAF, 1, (), badarg, 0, 0)
    with pytest.raises(ValueError): c.make(LEAF, 1, (), 0, badarg, 0)
    with pytest.raises(ValueError): c.set_pdata(a, badarg)
  with pytest.raises(ValueError): c.arg_register(-3)
  assert c.live() == 1 and c.info(a)[6] == 0  # nothing changed
  assert list(c.toposort([a], stop=[freed, -5, 10**6])) == [a]  # stop ids that name no node are ignored


@needs_c
def test_ids_sequence():
  import numpy as np
  c = CCore()
  root = chain(c, 10)
  ids = c.toposort([root])
  assert len(ids) == 10 and ids[0] == 0 and ids[-1] == 9 and ids[-10] == 0 and ids[np.int64(3)] == 3
  assert list(ids) == list(range(10)) and list(reversed(ids)) == list(range(9, -1, -1)) and ids[2:5] == [2, 3, 4]
  assert 3 in ids and 11 not in ids and ids == list(range(10))
  for i in (10, -11):
    with pytest.raises(IndexError): ids[i]
  arr = ids.numpy()
  del ids
  assert arr.dtype == np.int32 and not arr.flags.writeable and arr.tolist() == list(range(10))  # kept alive
  empty = c.toposort([root], stop=[root])
  assert len(empty) == 0 and list(empty) == [] and empty.numpy().shape == (0,)


@needs_c
def test_ids_iterates_in_chunks():
  c = CCore()
  root = chain(c, 150_000)
  ids = c.toposort([root])
  assert list(ids) == list(range(150_000)) and list(reversed(ids)) == list(range(149_999, -1, -1))


@needs_c
def test_threads_share_one_store():
  c = CCore()
  c.arg_register(1)
  leaves = [c.make(LEAF, d, (), 0, 0, 0) for d in range(4)]

  def work(seed):
    rng = random.Random(seed)
    for _ in range(60):
      held = list(leaves)
      for x in held: c.incref(x)
      for _ in range(300):
        op = rng.choice([ADD, MUL, TUPLE])
        src = tuple(rng.choice(held[:8] if rng.random() < 0.5 else held) for _ in range(2 if op != TUPLE else 5))
        n = c.make(op, 1, src, 0, rng.choice([0, 1]) if op == TUPLE else 0, 0)
        again = c.make(op, 1, src, 0, c.info(n)[4], 0)
        assert again == n and c.src(n) == src
        c.decref(again)
        held.append(n)
      order = c.toposort(held[-3:])
      assert len(set(order)) == len(order)
      for x in held: c.decref(x)

  run_on_threads(work, 4)
  assert c.live() == len(leaves)
  for x in leaves: c.decref(x)
  assert c.live() == 0


def test_rows_match_info_and_src(core):
  """rows() reads a whole walk at once (the planner's flattening): the same fields as info() and src() node by
  node, sources concatenated, also past the first guess of the source buffer's size (nodes of many sources)."""
  leaves = [core.make(LEAF, 1 + i, (), 0, 0, i) for i in range(5)]
  wide = [core.make(TUPLE, 0, tuple(leaves[j % 5] for j in range(i, i + 11)), 0, 0, 0) for i in range(5)]
  top = core.make(TUPLE, 0, tuple(wide), 0, 0, 0)
  order = core.toposort([top])
  rows, flat = core.rows(order)
  assert [tuple(r) for r in rows] == [core.info(i) for i in order]
  assert flat == [s for i in order for s in core.src(i)] and len(flat) == 5 * 11 + 5 and len(rows) == 11
  assert core.rows([]) == ([], [])
  dead = core.make(ADD, 1, (leaves[0], leaves[1]), 0, 0, 0)
  core.decref(dead)
  for bad in ([dead], [top, -1], [1 << 40]):
    with pytest.raises(ValueError, match="not a live node id"): core.rows(bad)


def test_decref_many_is_decref_in_order(core):
  """decref_many (the batch of dead handles' references) frees exactly what the same decrefs one by one free, in
  the same order (so ids recycle identically); release defers, and live/arg_drain flush first."""
  one, many = type(core)(), core
  ids = []
  for c in (one, many):
    c.arg_register(1)
    a = c.make(LEAF, 1, (), 1, 0, 0)
    b = c.make(ADD, 1, (a, a), 0, 0, 0)
    d = c.make(MUL, 1, (b, a), 0, 0, 0)
    ids.append((a, b, d))
  a, b, d = ids[1]
  for i in (d, b, a): one.decref(i)
  many.decref_many([d, b, a])
  assert one.live() == many.live() == 0
  assert one.arg_drain() == many.arg_drain() == [1]
  assert [c.make(LEAF, 1, (), 0, 0, 0) for c in (one, many)] == [a, a]  # the same recycled id (LIFO)
  many.release(a)  # deferred: still counted until someone looks
  assert many.live() == 0  # live flushes


@needs_c
def test_decref_many_checks_ids():
  """The C core checks every id at the boundary (PyCore, the reference, trusts its caller)."""
  core = CCore()
  a = core.make(LEAF, 1, (), 0, 0, 0)
  with pytest.raises(ValueError, match="not a live node id"):
    core.decref_many([a, a])  # the second names the node the first freed
  with pytest.raises(ValueError, match="not a live node id"):
    core.decref_many([2 ** 40])
  assert core.live() == 0


@needs_c
def test_fixed_arity_calls_match_make():
  """make1/make2/make2k (the math methods' calls: CPython builtins that keep the GIL) give make's ids and codes,
  and refuse arguments that are no int32 as the cffi calls do."""
  c = CCore()
  c.arg_register(1)
  a, b = c.make(LEAF, 1, (), 0, 0, 0), c.make(LEAF, 2, (), 0, 0, 0)
  u = c.make1(ADD, 1, a, 0, 0, 5)
  assert u == c.make(ADD, 1, (a,), 0, 0, 5) and c.info(u) == (ADD, 1, 1, 0, 0, 5, 0)
  v = c.make2(MUL, 1, a, b, 0, 0, 3)
  assert v == c.make(MUL, 1, (a, b), 0, 0, 3) and c.src(v) == (a, b)
  k = c.make2k(MUL, 1, a, 1, 1, 0, 1, 3)  # MUL(CONST(arg 1), a): the constant is made and held by the node only
  const = c.src(k)[0]
  assert c.src(k) == (const, a) and c.info(const)[:4] == (LEAF, 1, 0, 1) and c.make(LEAF, 1, (), 1, 0, 0) == const
  assert c.make1(ADD, 1, 10**6, 0, 0, 0) == -2 and c.make2(ADD, 1, a, -1, 0, 0, 0) == -2  # codes, as cffi's
  assert c.make1(ADD, 1, a, 7, 0, 0) == -4  # an unregistered arg id
  for bad in (2**31, -2**31 - 1, 2**70):
    with pytest.raises(OverflowError): c.make1(ADD, 1, bad, 0, 0, 0)
    with pytest.raises(OverflowError): c.make2k(MUL, 1, a, 1, 1, 0, 0, bad)
  with pytest.raises(TypeError): c.make2(ADD, 1, a, 1.0, 0, 0, 0)
  with pytest.raises(TypeError): c.make1(ADD, 1, a, 0, 0)  # one argument short
  with pytest.raises(TypeError): c.make1(ADD, 1, "a", 0, 0, 0)
  for n in (u, u, v, v, k, const): c.decref(n)
  assert c.live() == 2


@needs_c
def test_fixed_arity_calls_wait_for_a_walk():
  """A make issued while another thread holds the store (a long walk) waits for it and is then correct."""
  c = CCore()
  root = chain(c, 300_000)
  leaf = c.toposort([root])[0]

  def body(i):
    if i == 0:
      for _ in range(5): assert len(c.toposort([root])) == 300_000
    else:
      for _ in range(20000):
        n = c.make1(MUL, 1, leaf, 0, 0, 0)
        assert n >= 0 and c.info(n)[0] == MUL
        c.decref(n)
  run_on_threads(body, 3)
  assert c.live() == 300_000
