"""The compile path's output pinned: the VM words (and stats) that `pygrad.compile` produces for a fixed set of graphs
-- chains, gradients, a layered net, peepholes, reductions, contractions and deterministic random graphs -- hashed
and compared with the digests recorded before the planner's passes were made faster. A speed-up of flatten, the
planner or lowering must give the very same program; when a change means to alter the programs, record the new
digests with `python tests/test_vm_plan_golden.py` and say why in the commit."""
from __future__ import annotations
import hashlib
import sys
import pytest
from pygrad import UOp, dtypes

program = pytest.importorskip("pygrad.engine.program", reason="the compiled interpreter is not built",
                              exc_type=ImportError)
from pygrad.bench import w1_model, MethodOps  # noqa: E402
from fuzzgraphs import seeded_graph as _recipe  # noqa: E402


def _chain(kind: str, n: int):
  x = UOp.placeholder(() if kind == "scalar" else (16,), dtypes.float32, "x")
  y = x
  if kind == "forward":
    for i in range(n): y = y * 0.99999 + 0.00001 if i % 2 else (y + 0.5) * 0.5
    return [y], [x]
  for _ in range(n): y = y.sin()
  return ([y.gradient(x)[0]] if kind == "scalar" else [y.sum().gradient(x)[0]]), [x]


def _w1(layers: int, size: int = 16):
  x = UOp.placeholder((size, size), dtypes.float32, "x")
  ws = [UOp.placeholder((size, size), dtypes.float32, f"w{i}") for i in range(layers)]
  loss = w1_model(MethodOps, x, ws)
  return [loss, *loss.gradient(x, *ws)], [x, *ws]


def _mixed():
  a, b = UOp.placeholder((6, 8), dtypes.float32, "a"), UOp.placeholder((8, 5), dtypes.float32, "b")
  h = UOp.placeholder((6, 8), dtypes.float16, "h")
  outs = [(a * a).sum(1), a @ b, a.abs() * 2.0, (a.pad(((1, 1), (0, 2))).flip(0) * 2.0).max(1), h.sin() + 1.0,
          a.permute((1, 0)).reshape((4, 12)).exp2(), (a / (a + 3.0)).softmax(1), a.cast(dtypes.int8) >> 2,
          (a.abs() + h.cast(dtypes.float32)).sum()]
  return outs, [a, b, h]




GRAPHS = {"forward-300": lambda: _chain("forward", 300), "grad-scalar-60": lambda: _chain("scalar", 60),
          "grad-vector-20": lambda: _chain("vector", 20), "w1-grad-4": lambda: _w1(4), "mixed": _mixed,
          "w1-grad-32x32": lambda: _w1(3, 32),  # (outputs of epilogue.MIN_OUT: epilogues and stored layouts)
          **{f"random-{s}": (lambda s=s: _recipe(s)) for s in range(12)}}


def digest(name: str) -> str:
  """sha256 of the program's last C segment (every word) and its stats; "error: <type>" if compile refuses it."""
  outs, ins = GRAPHS[name]()
  try:
    p = program.Program(outs, ins, keep_words=True)
  except (ValueError, TypeError) as e:
    return f"error: {type(e).__name__}"
  words = getattr(p, "_words", [])
  text = repr((words, sorted(p.stats.items()), p._slot_sizes))
  return hashlib.sha256(text.encode()).hexdigest()[:24]


GOLDEN = {
  'forward-300': 'f9eff2e07cf9a35d30673902',
  'grad-scalar-60': '872dafcf64961f666abade27',
  'grad-vector-20': 'b5f7bba9e0ba93668e3ef127',
  'mixed': 'e4276121c719e8c112eb6967',
  'random-0': '4aeeb0a01423ab7c97126880',
  'random-1': '0fcb8f6285194bdcfe462b9a',
  'random-10': '6c4fbfd1a02c15e595696777',
  'random-11': '530066dde20b4b438d5585de',
  'random-2': 'e10c0edef29723d3137f650b',
  'random-3': 'a482b2f03f0a783a30abddb9',
  'random-4': '1d6856432f57dce02efc1ad0',
  'random-5': 'd21d7734c830d2c244b7922b',
  'random-6': '016c1ea388456b6d3fc77789',
  'random-7': '897f2013e80b1f683f7b8b8b',
  'random-8': 'ec0000791d79f9de9632dce1',
  'random-9': '756b8eff538d46a220ae07fb',
  'w1-grad-4': 'c25784211100eeb160ca79eb',
  'w1-grad-32x32': 'ea44573af1f0cdc62a778737',
}


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_compiled_program_is_the_recorded_one(name):
  assert digest(name) == GOLDEN[name]


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_every_kernel_through_the_c_allocator_gives_the_same_program(name, monkeypatch):
  """lower.allocate_c (csrc/regalloc.c, for large kernels) on every kernel, however small: allocate's registers and
  emit's words exactly."""
  from pygrad.engine import lower
  monkeypatch.setattr(lower, "_C_MIN", 1)
  assert digest(name) == GOLDEN[name]



@pytest.mark.parametrize("name", sorted(GRAPHS))
@pytest.mark.parametrize("cols", [False, True])
def test_every_kernel_walked_in_c_gives_the_same_program(name, cols, monkeypatch):
  """planner._build_c (csrc/kwalk.c, for plans of large kernels) on every plan and kernel: _build_py's KNodes; with
  cols, every kernel's registers from its walk's columns too (lower.allocate_cols)."""
  from pygrad.engine import planner, lower
  monkeypatch.setattr(planner, "_WALK_MIN_NODES", 0)
  monkeypatch.setattr(planner, "_WALK_PER_JOB", 0)
  if cols: monkeypatch.setattr(lower, "_C_MIN", 1)
  assert digest(name) == GOLDEN[name]


@pytest.mark.parametrize("name", sorted(GRAPHS))
@pytest.mark.parametrize("c_key", [False, True])
def test_every_small_kernel_keyed_in_c_gives_the_same_program(name, c_key, monkeypatch):
  """Every plan walked in C with its small kernels keyed from the walk: by kcache.walked_key (Python) or in C
  (csrc/kkey.c, kcache.walked_c: loads and classes numbered there), the same program."""
  from pygrad.engine import planner
  for k in ("_GRAPH_MIN_NODES", "_WALK_MIN_NODES", "_WALK_PER_JOB"): monkeypatch.setattr(planner, k, 0)
  monkeypatch.setattr(planner, "_C_KEY", c_key)
  assert digest(name) == GOLDEN[name]


@pytest.mark.parametrize("name", sorted(GRAPHS))
@pytest.mark.parametrize("in_c", [False, True])
def test_every_plan_placed_in_c_gives_the_same_program(name, in_c, monkeypatch):
  """program._place_c (csrc/place.c, for plans of many kernels) on every plan, or the Python _place on every plan:
  the same arena offsets (the slot table is in the words)."""
  monkeypatch.setattr(program, "_PLACE_C_MIN", 0 if in_c else 1 << 62)
  assert digest(name) == GOLDEN[name]


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_every_plan_counted_in_c_gives_the_same_program(name, monkeypatch):
  """planner._Graph.users_fused (csrc/plan_users.c, for large graphs) on every plan: the users and fused flags of
  Planner.__init__'s loop and _fused_shared."""
  from pygrad.engine import planner
  monkeypatch.setattr(planner, "_GRAPH_MIN_NODES", 0)
  assert digest(name) == GOLDEN[name]



@pytest.mark.parametrize("name", sorted(GRAPHS))
@pytest.mark.parametrize("in_c", [False, True])
def test_every_plan_over_nodes_made_when_read_gives_the_same_program(name, in_c, monkeypatch):
  """flatten.LazyNodes (for large plain graphs: a node is made when the planner first reads it) on every plan:
  alone, where the planner reads every node, and with the sweeps, walks and registers in C, where it reads few."""
  from pygrad.engine import flatten, planner, lower
  monkeypatch.setattr(flatten, "_LAZY_MIN", 0)
  if in_c:
    for k in ("_GRAPH_MIN_NODES", "_WALK_MIN_NODES", "_WALK_PER_JOB"): monkeypatch.setattr(planner, k, 0)
    monkeypatch.setattr(lower, "_C_MIN", 1)
  assert digest(name) == GOLDEN[name]


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_planned_loops_marked_reachable_have_every_node_live(name):
  """lower_loop skips dead-code elimination on a Loop the planner marks reachable: every knode is live there."""
  from pygrad.engine.flatten import flatten
  from pygrad.engine.planner import Planner, Loop
  from pygrad.engine.lower import live_nodes
  outs, ins = GRAPHS[name]()
  try:
    pl = Planner(*flatten(outs), ins)
  except (ValueError, TypeError):
    return
  loops = [k for k in pl.kernels if isinstance(k, Loop) and k.reachable]
  for k in loops: assert live_nodes(k.knodes, [s.src for s in k.stores]) == set(k.knodes)


def test_the_c_users_sweep_refuses_malformed_arrays():
  """pg_plan_users counts each node's users in int32: more edges than int32 holds are refused before anything is
  read (no count can overflow), and so are sources that are not earlier nodes or lie past src."""
  import numpy as np
  from pygrad.engine.vmlib import ffi, lib
  cp = ffi.from_buffer
  n = 3
  nsrc, off = np.array([0, 0, 2], np.int32), np.array([0, 0, 0], np.int64)
  flags, shape = np.zeros(n, np.uint8), np.zeros(n, np.int32)
  users, fused = np.empty(n, np.int32), np.empty(n, np.uint8)

  def sweep(src, src_len):
    return lib.pg_plan_users(n, cp("int32_t[]", nsrc), cp("int64_t[]", off), cp("int32_t[]", src), src_len,
                             cp("uint8_t[]", flags), cp("int32_t[]", shape), cp("int32_t[]", users),
                             cp("uint8_t[]", fused))
  good = np.array([0, 1], np.int32)
  assert sweep(good, 2) == 0 and users.tolist() == [1, 1, 0]
  assert sweep(good, 2**31) == lib.PG_ERR_ARG  # (the array is not read: the count alone is refused)
  assert sweep(good, 1) == lib.PG_ERR_ARG      # node 2's two sources do not fit in one entry
  assert sweep(np.array([0, 2], np.int32), 2) == lib.PG_ERR_ARG  # node 2 reads itself

if __name__ == "__main__":
  sys.setrecursionlimit(10_000)
  for n in sorted(GRAPHS): print(f"  {n!r}: {digest(n)!r},")


def test_the_c_kernel_walk_refuses_arrays_with_a_cycle():
  """The walk's arrays come from a flattened graph, which has no cycles; arrays where a node is its own source end
  in PG_ERR_ARG, not a stack that grows until memory runs out."""
  import numpy as np
  from pygrad.engine.vmlib import ffi, lib
  nsrc = np.array([1, 1], np.int32)
  off = np.array([0, 1], np.int64)
  src = np.array([1, 0], np.int32)  # node 0 reads node 1, which reads node 0
  flags = np.array([2, 2], np.uint8)  # both ALU (PG_KW_ALU), neither a leaf
  memo, out, out_src = np.full(4, -1, np.int32), np.empty(12, np.int32), np.empty(12, np.int32)
  cp = ffi.from_buffer
  r = lib.pg_kernel_walk(2, cp("int32_t[]", nsrc), cp("int64_t[]", off), cp("int32_t[]", src), 2,
                         cp("uint8_t[]", flags), 0, 0, cp("int32_t[]", memo), cp("int32_t[]", out), 4,
                         cp("int32_t[]", out_src), 12)
  assert r == lib.PG_ERR_ARG
  assert (memo == -1).all()


def test_the_c_register_allocator_refuses_sources_past_its_array():
  """pg_regalloc reads each node's sources from src in turn: counts that add up to more than src holds are refused,
  not read past the array's end."""
  import numpy as np
  from pygrad.engine.vmlib import ffi, lib
  n = 3
  nsrc = np.array([0, 0, 2], np.int8)  # two loads, then an ALU node of both; src holds one entry only
  src = np.array([0, 1], np.int32)
  ct, sc_in, pinned = np.zeros(n, np.int32), np.zeros(n, np.uint8), np.zeros(n, np.uint8)
  reg, sc, fct, fsc = np.empty(n, np.int32), np.empty(n, np.uint8), np.empty(n, np.int32), np.empty(n, np.uint8)
  cp = ffi.from_buffer
  args = (cp("int32_t[]", ct), cp("uint8_t[]", sc_in), cp("uint8_t[]", pinned), cp("int32_t[]", reg),
          cp("uint8_t[]", sc), cp("int32_t[]", fct), cp("uint8_t[]", fsc))
  assert lib.pg_regalloc(n, cp("int8_t[]", nsrc), cp("int32_t[]", src), 1, *args) == lib.PG_ERR_ARG
  assert lib.pg_regalloc(n, cp("int8_t[]", nsrc), cp("int32_t[]", src), 2, *args) == 3  # the whole array: 3 registers


def test_the_c_kernel_key_refuses_arrays_out_of_range():
  """pg_kkey_make reads nodes, cells and operands from the walk's arrays: a node past the graph, an operand that is
  not an earlier entry, or a negative signature is refused (PG_ERR_ARG), as are registrations out of range; a leaf
  not registered is reported as missed, and keyed once registered."""
  import numpy as np
  from pygrad.engine.vmlib import ffi, lib
  assert lib.pg_kkey_new(0) == ffi.NULL
  st = ffi.gc(lib.pg_kkey_new(3), lib.pg_kkey_free)
  sig = np.array([-1, 7, 7], np.int64)  # node 0 a leaf, nodes 1 and 2 ALU ops of one operand
  nsrcs = np.array([0, 1, 1], np.int32)
  cp = ffi.from_buffer
  codes, lbuf, lvid = np.empty(4, np.int64), np.empty(4, np.int32), np.empty(4, np.int32)
  bufs, miss, info = np.empty(5, np.int32), np.empty(4, np.int32), np.zeros(4, np.int64)
  ent_buf, src_buf, over = np.zeros(12, np.int32), np.zeros(4, np.int32), np.full(4, -1, np.int32)
  bound = (cp("int32_t[]", ent_buf), 4, cp("int32_t[]", src_buf), 4, cp("int32_t[]", nsrcs), cp("int64_t[]", sig),
           cp("int32_t[]", over), cp("int32_t[]", over), 4, cp("int64_t[]", codes), cp("int32_t[]", lbuf),
           cp("int32_t[]", lvid), cp("int32_t[]", bufs), cp("int32_t[]", miss), cp("int64_t[]", info))
  assert lib.pg_kkey_make(st, 1, 0, 0, 0, 0, 9) == lib.PG_ERR_ARG  # (nothing bound yet)
  assert lib.pg_kkey_bind(st, ffi.NULL, *bound[1:]) == lib.PG_ERR_ARG
  assert lib.pg_kkey_bind(st, *bound) == 0

  def make(ent, srcs, n=None):
    ent_buf[:len(ent)], src_buf[:len(srcs or [])] = ent, srcs or []
    return lib.pg_kkey_make(st, n or len(ent) // 3, len(srcs or []), 0, 0, 0, 9)
  good = [0, 0, 1, 1, 0, 0]  # a leaf (node 0), then node 1 of it
  assert make(good, [0]) == lib.PG_KKEY_MISS and info[0] == 1 and miss[0] == 0
  assert lib.pg_kkey_node(st, 3, 0, 0) == lib.PG_ERR_ARG and lib.pg_kkey_node(st, 0, -1, 0) == lib.PG_ERR_ARG
  node, buf, vid = np.array([0, 5], np.int32), np.array([4, 4], np.int32), np.array([0, 0], np.int32)
  assert lib.pg_kkey_nodes(st, 2, cp("int32_t[]", node), cp("int32_t[]", buf), cp("int32_t[]", vid)) == \
      lib.PG_ERR_ARG  # (node 5 is past the graph: nothing registered)
  assert make(good, [0]) == lib.PG_KKEY_MISS
  assert lib.pg_kkey_nodes(st, 1, cp("int32_t[]", node), cp("int32_t[]", buf), cp("int32_t[]", vid)) == 0
  assert make(good, [0]) == 0 and info[3] == 1 and codes[:2].tolist() == [-1, 7] and bufs[:2].tolist() == [4, 9]
  assert make(good, [0]) == 0 and info[3] == 0  # (the same key: the same class, not a new one)
  assert make([0, 1, 1, 1, 0, 0], [0]) == lib.PG_KKEY_MISS  # (a cell not registered for the view class)
  assert lib.pg_kkey_view(st, 0, 0, 0, 1) == lib.PG_ERR_ARG and lib.pg_kkey_view(st, 0, 1, 0, 1) == 0
  assert make([0, 1, 1, 1, 0, 0], [0]) == 1
  assert make([3, 0, 1], None) == lib.PG_ERR_ARG  # a node past the graph
  assert make(good + [0, 0, 1], [0, 0]) == lib.PG_ERR_ARG  # an operand no entry reads
  assert make([1, 0, 0], [0]) == lib.PG_ERR_ARG  # an operand that is not an earlier entry (its own)
  assert make(good, [2]) == lib.PG_ERR_ARG  # an operand past the entries
  assert make([2, 0, 1, 0, 0, 0], [0]) == lib.PG_ERR_ARG  # node 0's signature is negative: not an ALU op
  assert make(good, [0], n=5) == lib.PG_ERR_ARG  # more entries than the buffers hold
  assert lib.pg_kkey_make(st, 2, 5, 0, 0, 0, 9) == lib.PG_ERR_ARG  # more operands than the buffer holds


def test_the_c_placement_refuses_arrays_out_of_range():
  """pg_place reads each kernel's buffer ids from one array: counts that do not add up, an id past the buffers or a
  size that is not positive are refused (PG_ERR_ARG), not read or written out of bounds; a valid plan reuses a
  freed block (best fit) and coalesces freed neighbours."""
  import numpy as np
  from pygrad.engine.vmlib import ffi, lib
  cp = ffi.from_buffer

  def place(counts, ids, need, arena=None):
    c, i, nd = np.array(counts, np.int32), np.array(ids, np.int32), np.array(need, np.int64)
    ar = np.array(arena if arena is not None else [1] * len(need), np.uint8)
    off = np.full(len(need), -1, np.int64)
    top = lib.pg_place(len(c), cp("int32_t[]", c), cp("int32_t[]", i), len(i), len(nd), cp("uint8_t[]", ar),
                       cp("int64_t[]", nd), cp("int64_t[]", off))
    return top, off.tolist()
  assert place([2], [0, 1, 1], [64, 64])[0] == lib.PG_ERR_ARG  # counts name two ids, three are given
  assert place([2], [0, 2], [64, 64])[0] == lib.PG_ERR_ARG  # id 2 past the two buffers
  assert place([1], [0], [0])[0] == lib.PG_ERR_ARG  # a size that is not positive
  assert place([1], [0], [0], arena=[0]) == (0, [-1])  # (not the arena's: not placed, its size not read)
  # a (128) and b (64) live in kernels 0-1 and are freed together into one block 0..192; c (64, kernels 2-3) is
  # cut from its start; d (192, kernel 3) no longer fits in what is left (64..192): it goes on top
  top, off = place([2, 2, 1, 2], [0, 1, 0, 1, 2, 2, 3], [128, 64, 64, 192])
  assert off[:3] == [0, 128, 0] and off[3] == top - 192


@pytest.mark.parametrize("seed", range(6))
def test_the_c_placement_gives_pythons_offsets_on_random_plans(seed, monkeypatch):
  """Random liveness (buffers of a few sizes, each live over a random span of kernels, many free at once): _place_c
  (csrc/place.c) gives every buffer _place's offset and the same arena size (best fit, lowest offset among equal
  sizes, coalescing both ways)."""
  import random
  from pygrad.engine.lower import Part
  from pygrad.engine.records import Buf
  rng = random.Random(seed)
  nk = 400
  bufs = [Buf(i, rng.choice(["arena"] * 6 + ["input", "const"]), dtypes.float32, (rng.choice([1, 16, 17, 64, 300]),),
              dtypes.float32) for i in range(600)]
  uses: list = [[] for _ in range(nk)]
  for b in bufs:
    a = rng.randrange(nk)
    for k in sorted({a, min(nk - 1, a + rng.choice([0, 1, 3, 40, 200]))}): uses[k].append(b)
  kernels = [Part([], False, u) for u in uses]
  got = []
  for c_min in (1 << 62, 0):
    monkeypatch.setattr(program, "_PLACE_C_MIN", c_min)
    for b in bufs: b.offset = -1
    top = program._place(kernels, bufs)
    got.append((top, [b.offset for b in bufs]))
  assert got[0] == got[1] and got[0][0] > 0
