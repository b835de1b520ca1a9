"""Small kernels keyed straight from the planner's C walk (kcache.KernelCache.walked): a kernel whose key was seen
gets the earlier kernel's words with its own buffers, and no KNodes are made. The words must be exactly those of the
KNode path (Planner._knodes_small, a Loop, KernelCache.lower), and kernels that differ in any one thing lowering reads
must not share a key."""
from __future__ import annotations
import numpy as np
import pytest
from pygrad import UOp, dtypes

program = pytest.importorskip("pygrad.engine.program", reason="the compiled interpreter is not built",
                              exc_type=ImportError)
from pygrad.engine import planner, kcache, kbatch  # noqa: E402
from pygrad.engine.planner import Planner  # noqa: E402
from pygrad.bench import w1_model, MethodOps  # noqa: E402
from fuzzgraphs import seeded_graph  # noqa: E402

F32, F16 = dtypes.float32, dtypes.float16


def _one_thing_apart():
  """Kernels alike but for one thing each: a view's offset, strides, mask or shape, a constant, a load's dtype or
  storage type, the operands' order, an opcode (a quotient), a cast's source dtype, the reduced axes or op, and the
  movements read in C (a PERMUTE against a FLIP of the same value)."""
  a, b = UOp.placeholder((6, 8), F32, "a"), UOp.placeholder((6, 8), F32, "b")
  h = UOp.placeholder((6, 8), F16, "h")
  e = (a * 2.0).sin()  # an expression: movements of it are pending views inside the reading kernel
  outs = [a.sin(), (a + 1.0).sin(), (a + 2.0).sin(), a.shrink(((1, 5), (0, 8))).sin(),
          a.shrink(((0, 4), (0, 8))).sin(), a.permute((1, 0)).sin(), a.pad(((1, 1), (0, 0))).sin(),
          a.pad(((0, 2), (0, 0))).sin(), a - b * 4.0, a * 4.0 - b, a * b.reciprocal(), a * b, h.sin(),
          h.cast(F32).sin(),
          a.sum(0), a.sum(1), a.max(1), (a * a).sum(1), h.sum(1), a.reshape((8, 6)).sin(), (a * 3.0).sin(),
          e.flip(0) + 1.0, e.flip(1) + 1.0, e.permute((1, 0)).flip(0) + 1.0, e.shrink(((0, 3), (0, 8))) + 1.0,
          e.shrink(((3, 6), (0, 8))) + 1.0, (e.reshape((8, 6)) * b.reshape((8, 6))).exp2()]
  return outs, [a, b, h]


def _w1(layers: int):
  x = UOp.placeholder((16, 16), F32, "x")
  ws = [UOp.placeholder((16, 16), F32, f"w{i}") for i in range(layers)]
  loss = w1_model(MethodOps, x, ws)
  return [loss, *loss.gradient(x, *ws)], [x, *ws]


def _copies():
  """Leaves whose pending RESHAPE the strides cannot express (a copy kernel per read, emitted before the kernel that
  reads it), read once, twice in one kernel, in several kernels, and beside leaves that are views."""
  a, b = UOp.placeholder((6, 8), F32, "a"), UOp.placeholder((6, 8), F32, "b")
  t = (a * 3.0).permute((1, 0)).reshape((48,))  # (pending at a's leaf: a transposed, then flattened)
  u = (b * 2.0).permute((1, 0)).reshape((48,))
  outs = [t.sin(), (t * t + 1.0).exp2(), (t + u).sin(), (t + b.reshape((48,))).sin(), (u * t).sum(),
          ((a + 1.0).permute((1, 0)).reshape((48,)) + u).sin()]
  return outs, [a, b]


GRAPHS = {"one-thing-apart": _one_thing_apart, "copies": _copies, "w1-grad-4": lambda: _w1(4),
          "w1-grad-150": lambda: _w1(150),  # (flattened as LazyNodes: the keyed walk leaves most ALU nodes unmade)
          **{f"random-{s}": (lambda s=s: seeded_graph(s)) for s in range(200, 230)}}


def _compile(name: str, walked: bool, monkeypatch, c_key: bool = True):
  """(words, outputs on fixed inputs, walked kernels) of the program, the plan walked in C, with small kernels keyed
  from the walk (walked: in C (csrc/kkey.c) with c_key, else by walked_key) or made into KNodes and Loops first."""
  with monkeypatch.context() as m:
    m.setattr(planner, "_WALK_MIN_NODES", 0)
    m.setattr(planner, "_GRAPH_MIN_NODES", 0)
    m.setattr(planner, "_C_KEY", c_key)
    seen = {"n": 0}
    for f in ("walked", "walked_c"):
      def count(self, *a, orig=getattr(kcache.KernelCache, f)):
        seen["n"] += 1
        return orig(self, *a)
      m.setattr(kcache.KernelCache, f, count)
    if not walked:
      m.setattr(Planner, "_walked", lambda self, *a: False)
      m.setattr(kbatch, "_C_BATCH", False)  # (its C loop keys the kernels _walked would)
    outs, ins = GRAPHS[name]()
    try:
      p = program.Program(outs, ins, keep_words=True)
    except (ValueError, TypeError) as e:
      return f"error: {type(e).__name__}: {e}", None, seen["n"]
    rng = np.random.default_rng(0)
    vals = [rng.uniform(0.5, 2.0, i.shape).astype(i.dtype.numpy) for i in ins]
    res = p(*vals)
    return p._words, [np.asarray(o) for o in (res if isinstance(res, (list, tuple)) else [res])], seen["n"]


@pytest.mark.parametrize("name", sorted(GRAPHS))
@pytest.mark.parametrize("c_key", [False, True])
def test_kernels_keyed_from_the_walk_get_the_knode_paths_words(name, c_key, monkeypatch):
  want, wout, n0 = _compile(name, False, monkeypatch)
  got, gout, n1 = _compile(name, True, monkeypatch, c_key)
  assert n0 == 0
  assert got == want  # a key shared by two different kernels would give the second the first's words
  if wout is not None:
    assert all(np.array_equal(x, y, equal_nan=True) for x, y in zip(gout, wout))
  if name in ("one-thing-apart", "w1-grad-4"): assert n1 > 0


@pytest.mark.parametrize("c_key", [False, True])
def test_the_walked_key_tells_apart_kernels_one_thing_apart(c_key, monkeypatch):
  """Every kernel of _one_thing_apart is keyed from the walk, and they are all different kernels: one key each (in
  C: one class each)."""
  from pygrad.engine import kkey
  keys = []
  orig = kkey.KKey.make if c_key else kcache.walked_key

  def record(*a):
    r = orig(*a)
    keys.append(r if c_key else r[0])
    return r
  with monkeypatch.context() as m:
    m.setattr(planner, "_WALK_MIN_NODES", 0)
    m.setattr(planner, "_GRAPH_MIN_NODES", 0)
    m.setattr(planner, "_C_KEY", c_key)
    if c_key: m.setattr(kkey.KKey, "make", record)
    else: m.setattr(kcache, "walked_key", record)
    outs, ins = _one_thing_apart()
    program.Program(outs, ins)
  assert len(keys) >= len(outs)
  assert len(set(keys)) == len(keys)  # (a copy kernel is not keyed: no two kernels here are alike)
  # (a - b and b - a would share one: the same kernel over buffers numbered by first use)


@pytest.mark.parametrize("c_key", [False, True])
def test_a_layered_gradient_reuses_walked_kernels(c_key, monkeypatch):
  """The W1 chain's gradient repeats its kernels per layer: most of them are given an earlier kernel's words."""
  with monkeypatch.context() as m:
    m.setattr(planner, "_WALK_MIN_NODES", 0)
    m.setattr(planner, "_GRAPH_MIN_NODES", 0)
    m.setattr(planner, "_C_KEY", c_key)
    caches = []
    orig = kcache.KernelCache.__init__

    def keep(self):
      orig(self)
      caches.append(self)
    m.setattr(kcache.KernelCache, "__init__", keep)
    outs, ins = _w1(8)
    p = program.Program(outs, ins)
  (c,), = [caches]
  lowered = c.kkey.tmpl if c_key else c.wmemo  # (the first kernel of each key or class: lowered)
  assert 0 < len(lowered) <= 20 and c.hits >= p.stats["kernels"] * 3 // 4


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_the_c_job_loop_gives_the_planners_own_words(name, monkeypatch):
  """engine/kbatch.py: the jobs whose kernels C walks, keys and finds lowered (csrc/kbatch.c) get the words the
  planner's own path (_emit_root, _walked, walked_c one job at a time) gives them, in the same order; and on a
  layered gradient most kernels are done in C."""
  done = {"n": 0}
  orig = kbatch._parts

  def count(pl, kk, cls, *a):
    done["n"] += len(cls)
    return orig(pl, kk, cls, *a)
  with monkeypatch.context() as m:
    m.setattr(kbatch, "_C_BATCH", False)
    want, wout, _ = _compile(name, True, monkeypatch)
  with monkeypatch.context() as m:
    m.setattr(kbatch, "_parts", count)
    m.setattr(kbatch, "_MIN_JOBS", 0)  # (every plan with a storing job)
    got, gout, _ = _compile(name, True, monkeypatch)
  assert got == want
  if wout is not None:
    assert all(np.array_equal(x, y, equal_nan=True) for x, y in zip(gout, wout))
  if name.startswith("w1-grad"): assert done["n"] >= 20
  if name == "w1-grad-150": assert done["n"] >= 1000


def test_the_c_job_loop_refuses_arrays_it_is_not_bound_to():
  """pg_kbatch_run checks its inputs at the boundary: no key state, walk buffers other than the ones the key state
  reads, a job's node past the graph, a start past the end: an error code, no crash."""
  from pygrad.engine.vmlib import ffi, lib
  i32 = ffi.new("int32_t[]", 8)
  i64 = ffi.new("int64_t[]", 8)
  u8 = ffi.new("uint8_t[]", 8)
  kwm = ffi.gc(lib.pg_kwm_new(), lib.pg_kwm_free)
  kk = ffi.gc(lib.pg_kkey_new(3), lib.pg_kkey_free)
  ids_len = ffi.new("int64_t *")

  def run(st, out, n=3, start=0, nj=1, top=None):
    jt = ffi.new("int32_t[]", [5 if top is None else top])
    return lib.pg_kbatch_run(st, kwm, n, i32, i64, i32, 0, u8, i32, i32, out, i32, 8, i64, i64, start, nj, jt, u8,
                             i32, i64, i32, 4, u8, 0, i32, i32, i32, 8, ids_len)
  assert run(ffi.NULL, i32) == lib.PG_ERR_ARG
  assert run(kk, i32) == lib.PG_ERR_ARG  # (nothing bound)
  ent, src = ffi.new("int32_t[]", 24), ffi.new("int32_t[]", 8)
  out = [ffi.new("int64_t[]", 64), ffi.new("int32_t[]", 64), ffi.new("int32_t[]", 64), ffi.new("int32_t[]", 65),
         ffi.new("int32_t[]", 64), ffi.new("int64_t[]", 4)]
  assert lib.pg_kkey_bind(kk, ent, 8, src, 8, i32, i64, i32, i32, 64, *out) == 0
  assert run(kk, i32) == lib.PG_ERR_ARG  # (walk buffers not the bound ones)
  assert lib.pg_kbatch_run(kk, kwm, 3, i32, i64, i32, 0, u8, i32, i32, ent, src, 8, i64, i64, 0, 1,
                           ffi.new("int32_t[]", [5]), u8, i32, i64, i32, 4, u8, 0, i32, i32, i32, 128,
                           ids_len) == lib.PG_ERR_ARG  # (a node past the graph)
  assert lib.pg_kbatch_run(kk, kwm, 4, i32, i64, i32, 0, u8, i32, i32, ent, src, 8, i64, i64, 0, 1,
                           ffi.new("int32_t[]", [0]), u8, i32, i64, i32, 4, u8, 0, i32, i32, i32, 128,
                           ids_len) == lib.PG_ERR_ARG  # (a graph of another size than the key state's)
  assert lib.pg_kbatch_run(kk, kwm, 3, i32, i64, i32, 0, u8, i32, i32, ent, src, 8, i64, i64, 2, 1,
                           ffi.new("int32_t[]", [0]), u8, i32, i64, i32, 4, u8, 0, i32, i32, i32, 128,
                           ids_len) == lib.PG_ERR_ARG  # (a start past the end)
  assert lib.pg_kbatch_run(kk, kwm, 3, i32, i64, i32, 0, u8, i32, i32, ent, src, 8, i64, i64, 0, 1,
                           ffi.new("int32_t[]", [-1]), u8, i32, i64, i32, 4, u8, 0, i32, i32, i32, 128,
                           ids_len) == 0  # (a job for Python: none done)


@pytest.mark.parametrize("name", ["w1-grad-4", "w1-grad-150"])
def test_a_contractions_dims_are_read_from_its_template(name, monkeypatch):
  """kwords.gemm_dims (the step passes' first test, before a step's words are made): a contraction's batch dims and
  output sizes, from its words or from its cached template's, the same as gemm_words reads from its words; and
  kwords.gemm_steps finds the contractions kind_of finds."""
  from pygrad.engine import kwords
  from pygrad.engine.lower import VK_GEMM
  seen = []
  orig = program.relayout

  def grab(steps):
    seen.extend(steps)
    return orig(steps)
  with monkeypatch.context() as m:
    m.setattr(program, "relayout", grab)
    _compile(name, True, monkeypatch)
  gemms = [s for s in seen if kwords.kind_of(s) == VK_GEMM]
  assert kwords.gemm_steps(seen) == [i for i, s in enumerate(seen) if kwords.kind_of(s) == VK_GEMM]
  assert any(type(s.words) is kcache.Words for s in gemms) and any(type(s.words) is list for s in gemms)
  for s in gemms:
    g = kwords.gemm_words(kwords.words_of(s))
    assert kwords.gemm_dims(s) == (g.nbatch, g.n, g.m)


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_copies_keyed_by_their_view_get_the_loops_words(name, monkeypatch):
  """KernelCache.copied (the planner's copy kernels lowered at once, keyed by view, dtype, storage types and
  constant) gives the words the copy's Loop lowered through loop_key gives, in the same order; a layered gradient's
  output copies (its weights' gradients, stored transposed) are mostly given an earlier copy's template."""
  given = {"n": 0}
  orig = kcache.KernelCache.copied

  def count(self, *a):
    r = orig(self, *a)
    given["n"] += r is not None and type(r[0].words) is kcache.Words
    return r
  with monkeypatch.context() as m:
    m.setattr(kcache.KernelCache, "copied", lambda self, *a: None)
    want, wout, _ = _compile(name, True, monkeypatch)
  with monkeypatch.context() as m:
    m.setattr(kcache.KernelCache, "copied", count)
    got, gout, _ = _compile(name, True, monkeypatch)
  assert got == want
  if wout is not None:
    assert all(np.array_equal(x, y, equal_nan=True) for x, y in zip(gout, wout))
  if name == "w1-grad-150": assert given["n"] >= 100
  if name == "copies": assert given["n"] >= 1
