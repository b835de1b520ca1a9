"""Method templates (pygrad/templates.py, csrc/prog.c): a templated call builds exactly the node the method body
builds, for every templated method, operand kind and signature; the cache neither leaks nodes nor loses arg ids;
the C entry points reject bad programs and bad ids."""
from __future__ import annotations
import gc
import numpy as np
import pytest
import pygrad
from pygrad import UOp, Ops, dtypes
from pygrad.core import CORE
from concurrency import run_on_threads

if pygrad.core_name() != "c": pytest.skip("method templates are the C core's", allow_module_level=True)


@pytest.fixture
def T():
  from pygrad import templates
  prev = templates.set_enabled(True)
  yield templates
  templates.set_enabled(prev)


def direct(T, fn):
  prev = T.set_enabled(False)
  try: return fn()
  finally: T.set_enabled(prev)


def same_node(T, fn, calls: int = 3):
  """fn() on the template path (first, second and later calls: direct, recording, instantiating) is the node the
  direct path builds."""
  want = direct(T, fn)
  for _ in range(calls): assert fn() is want
  return want


F32, F64, I32, B = dtypes.float32, dtypes.float64, dtypes.int32, dtypes.bool

CALLS = [
  ("matmul", lambda x, w: x @ w, [((3, 4), F32), ((4, 5), F32)]),
  ("matmul batched", lambda x, w: x.matmul(w), [((2, 3, 4), F32), ((4, 5), F32)]),
  ("matmul vector", lambda x, w: x @ w, [((4,), F64), ((4, 5), F64)]),
  ("matmul mixed dtypes", lambda x, w: x @ w, [((3, 4), I32), ((4, 2), F32)]),
  ("relu", lambda x: x.relu(), [((3, 4), F32)]),
  ("relu int", lambda x: x.relu(), [((5,), I32)]),
  ("sub", lambda x, y: x - y, [((3, 4), F32), ((4,), F32)]),
  ("rsub scalar", lambda x: 2.5 - x, [((3,), F32)]),
  ("truediv", lambda x, y: x / y, [((2, 3), F32), ((2, 3), F32)]),
  ("truediv int", lambda x, y: x / y, [((2, 3), I32), ((3,), I32)]),
  ("rtruediv", lambda x: 1.0 / x, [((2, 3), F64)]),
  ("broadcast add", lambda x, b: x + b, [((4, 3), F32), ((3,), F32)]),
  ("broadcast mul", lambda x, b: b * x, [((4, 1), F32), ((1, 5), F32)]),
  ("scalar add", lambda x: x + 3, [((4,), I32)]),
  ("scalar radd", lambda x: 3.0 + x, [((4,), I32)]),
  ("scalar cmp", lambda x: x < 0.5, [((4,), F32)]),
  ("le", lambda x, y: x <= y, [((4,), F32), ((4,), F32)]),
  ("ge scalar", lambda x: x >= 2, [((4,), I32)]),
  ("neg", lambda x: -x, [((4,), F32)]),
  ("neg bool", lambda x: -x, [((4,), B)]),
  ("minimum", lambda x, y: x.minimum(y), [((4,), F32), ((4,), F32)]),
  ("minimum bool", lambda x, y: x.minimum(y), [((4,), B), ((4,), B)]),
  ("where", lambda c, x, y: c.where(x, y), [((4, 3), B), ((4, 3), F32), ((3,), F32)]),
  ("where scalars", lambda c: c.where(1.0, 0.0), [((4,), B)]),
  ("where scalar right", lambda c, x: c.where(x, 0), [((4,), B), ((4,), I32)]),
  ("exp log cos", lambda x: x.exp() + x.log() + x.cos(), [((4,), F32)]),
  ("floor sign abs", lambda x: x.floor() * x.sign() + x.abs(), [((4,), F32)]),
  ("sigmoid tanh", lambda x: x.sigmoid() - x.tanh(), [((4,), F64)]),
  ("broadcast_to", lambda x: x.broadcast_to((2, 3, 4)), [((4,), F32)]),
  ("broadcast_to same", lambda x: x.broadcast_to((4,)), [((4,), F32)]),
  ("sum", lambda x: x.sum(1), [((3, 4), F32)]),
  ("sum all", lambda x: x.sum(), [((3, 4), F32)]),
  ("sum keepdim", lambda x: x.sum(axis=0, keepdim=True), [((3, 4), F32)]),
  ("max min", lambda x: x.max(0) + x.min(1).sum(), [((3, 3), F32)]),
  ("mean", lambda x: x.mean(-1, keepdim=True), [((3, 4), F32)]),
  ("mean int", lambda x: x.mean(), [((3, 4), I32)]),
  ("softmax", lambda x: x.softmax(), [((3, 4), F32)]),
  ("log_softmax", lambda x: x.log_softmax(0), [((3, 4), F32)]),
]


@pytest.mark.parametrize("name,fn,specs", CALLS, ids=[c[0] for c in CALLS])
def test_templated_call_is_the_direct_node(T, name, fn, specs):
  xs = [UOp.placeholder(s, d) for s, d in specs]
  same_node(T, lambda: fn(*xs))
  ys = [UOp.placeholder(s, d) for s, d in specs]  # other nodes, same signature: instantiated, not recorded
  same_node(T, lambda: fn(*ys), calls=1)


def test_templated_methods_called_every_way(T):
  """Called on the class, reflected, with a scalar or with keywords the templated methods give the same node (on
  the C core their hit path is C: method descriptors and the handle type's number slots for -, / and @)."""
  x, w, a = UOp.placeholder((3, 4)), UOp.placeholder((4, 5)), UOp.placeholder((3, 4))
  for _ in range(3):
    y = x @ w
    assert UOp.__matmul__(x, w) is y and UOp.__rmatmul__(w, x) is y and x.matmul(w) is y and UOp.matmul(x, w) is y
    assert UOp.__sub__(x, a) is x - a and UOp.__rsub__(a, x) is x - a and (2.0 - x) is UOp.__rsub__(x, 2.0)
    assert x / a is UOp.__truediv__(x, a) and (1.0 / x) is UOp.__rtruediv__(x, 1.0) and x.relu() is UOp.relu(x)
    assert x.minimum(a) is UOp.minimum(x, a) and x.minimum(2.0) is direct(T, lambda: x.minimum(2.0))
  for bad in (lambda: x.relu(1), lambda: x.relu(bogus=1), lambda: x @ "w", lambda: "w" @ x, lambda: x - "a"):
    with pytest.raises(TypeError): bad()


def test_same_node_twice_as_operand(T):
  x = UOp.placeholder((4, 4))
  same_node(T, lambda: x @ x)
  y = UOp.placeholder((4, 4))
  assert (x @ y) is direct(T, lambda: x @ y)  # the recorded template is not x @ x's
  assert (y @ y) is direct(T, lambda: y @ y)


def test_scalars_are_type_strict(T):
  x = UOp.placeholder((3,), I32)
  f = UOp.placeholder((3,), F32)
  for fn in (lambda: x + 1, lambda: x + 1.0, lambda: x + True, lambda: f * 0.0, lambda: f * -0.0, lambda: f < 1,
             lambda: f < 1.0):
    same_node(T, fn)
  assert (x + 1).dtype is I32 and (x + 1.0).dtype is F32
  assert (f * 0.0).src[1].arg == 0.0 and str((f * -0.0).src[1].arg) == "-0.0"


def test_errors_name_the_real_operands(T):
  x, w = UOp.placeholder((3, 4)), UOp.placeholder((5, 6))
  for _ in range(3):
    with pytest.raises(ValueError, match=r"\(3, 4\) @ \(5, 6\)"): x @ w
  a, b = UOp.placeholder((2, 3)), UOp.placeholder((4, 3))
  for _ in range(3):
    with pytest.raises(ValueError, match="broadcast"): a - b


def test_metadata_blocks_take_the_direct_path(T):
  x, w = UOp.placeholder((3, 4)), UOp.placeholder((4, 5))
  for _ in range(3): x @ w  # a template exists
  with pygrad.metadata("layer", caller="here"):
    y = UOp.placeholder((3, 4)) @ w
  names = {m.name for u in y.toposort() if u.op not in (Ops.BUFFER,) for m in u.metadata}
  assert names == {"layer"}
  assert all(u.metadata for u in y.toposort() if u.op is not Ops.BUFFER and u is not w)


def test_no_nodes_kept_and_arg_ids_held(T):
  from pygrad.intern import ARGS
  x, w = UOp.placeholder((7, 11)), UOp.placeholder((11, 13))
  gc.collect()
  base = pygrad.live_nodes()
  for _ in range(3): x @ w  # records: the placeholder graph dies with the call
  gc.collect()
  assert pygrad.live_nodes() == base
  ARGS.drain()  # arg ids only the program names now, such as the reshape to (7, 1, 11), are held by it
  prog = T._entries[("__matmul__", F32.id, x._m, F32.id, w._m)][0]
  nid = CORE.prog_run2(prog, x._id, w._id)
  assert nid >= 0, "the program's arg ids were drained"
  y = x @ w
  assert pygrad.uop.handle(nid) is y and y is direct(T, lambda: x @ w)
  assert any(u.op is Ops.RESHAPE and u.arg == (7, 1, 11) for u in y.toposort())
  CORE.decref(nid)
  del y
  gc.collect()
  assert pygrad.live_nodes() == base


def test_gradient_templates_keep_no_nodes():
  x = UOp.placeholder((17, 19))
  base = (gc.collect(), pygrad.live_nodes())[1]
  g = ((x * 3.5).exp2().sin() @ x.T).sum().gradient(x)  # signatures no other test derives
  del g
  gc.collect()
  assert pygrad.live_nodes() == base


def test_threads_build_the_same_nodes(T):
  x, w = UOp.placeholder((6, 8)), UOp.placeholder((8, 6))
  want = direct(T, lambda: ((x @ w).relu() - 1.0).softmax())
  out = []

  def work(_):
    for _ in range(200): out.append(((x @ w).relu() - 1.0).softmax())
  run_on_threads(work, 4)
  assert len(out) == 800 and all(o is want for o in out)


def test_cache_limit_evicts_and_stays_correct(T, monkeypatch):
  monkeypatch.setattr(T, "LIMIT", 4)
  x = UOp.placeholder((2, 9))
  for k in range(12):
    for _ in range(3): assert (x - float(k) - 0.25) is direct(T, lambda: x - float(k) - 0.25)
    assert len(T._entries) <= 4


def test_many_constants_do_not_poison_the_cache(T, monkeypatch):
  """Thousands of one-shot constants (`x * c` for many c, through a templated method) fill the cache with
  signatures met once; a later new shape must still get its program (regression: it took the direct path for the
  rest of the process)."""
  monkeypatch.setattr(T, "_entries", {})
  x = UOp.placeholder((3,), dtypes.int32)
  for c in range(T.LIMIT + 500): x - c * 0.5  # an int node and a float constant: cast, const, neg, add
  assert len(T._entries) <= T.LIMIT
  y = UOp.placeholder((7, 2))
  for _ in range(3): (y - 1.5).sin()
  entry = T._entries.get(("__sub__", y.dtype.id, y._m, (float, 1.5)))
  assert entry is not None and entry is not T._SEEN and entry is not T._DIRECT, "the new signature got no program"


def test_random_method_chains(T):
  rng = np.random.default_rng(0)
  shapes = [(3, 4), (4, 4), (4,), (1, 4)]

  def chain(xs, picks):
    pool = list(xs)
    for k, i, j in picks:
      a, b = pool[i % len(pool)], pool[j % len(pool)]
      if k == 0: y = a - b
      elif k == 1: y = (a / (b * b + 1)).relu()
      elif k == 2: y = a.softmax() if a.ndim else a.exp()
      elif k == 3: y = (a @ b.reshape(4, -1)) if a.shape[-1] == 4 and b.numel % 4 == 0 else a.sigmoid()
      elif k == 4: y = (a < b).where(a, 0.5)
      else: y = a.mean(-1, keepdim=True) + b.tanh()
      pool.append(y)
    return pool[-1]
  for _ in range(20):
    xs = [UOp.placeholder(shapes[rng.integers(len(shapes))]) for _ in range(3)]
    picks = [(int(rng.integers(6)), int(rng.integers(100)), int(rng.integers(100))) for _ in range(12)]
    try:
      want = direct(T, lambda: chain(xs, picks))
    except ValueError:
      continue  # shapes that do not broadcast: both paths raise (checked in test_errors_name_the_real_operands)
    for _ in range(3): assert chain(xs, picks) is want


def test_c_programs_reject_bad_words_and_ids():
  from pygrad._core import ffi, lib
  from pygrad.core import CORE
  st = CORE._st

  def new(words): return lib.pg_prog_new(st, ffi.new("int32_t[]", words), len(words))
  ident = new([1, 0, 1, 0])  # out = input 0
  assert ident != ffi.NULL
  lib.pg_prog_delete(ident)
  # too short; no output ref; a word too many; a source ref ahead of its instruction; an output ref out of range;
  # negative counts; a negative arg id; an arg id never registered
  for bad in ([], [1, 0, 1], [1, 0, 1, 0, 9], [1, 1, 1, 11, 0, 0, 0, 0, 1, 5, 1], [1, 0, 1, 2], [-1, 0, 0],
              [1, 1, 1, 11, 0, -5, 0, 0, 1, 0, 1], [1, 1, 1, 11, 0, 999999, 0, 0, 1, 0, 1]):
    assert new(bad) == ffi.NULL, bad
  x = UOp.placeholder((2,))
  p = ffi.gc(new([1, 1, 1, int(Ops.SIN), dtypes.float32.id, 0, 0, x._m, 1, 0, 1]), lib.pg_prog_delete)
  assert p != ffi.NULL
  nid = lib.pg_prog_run1(st, p, x._id)
  assert nid >= 0
  assert pygrad.uop.handle(nid) is x.sin()
  lib.pg_store_decref(st, nid)
  assert lib.pg_prog_run1(st, p, -7) < 0 and lib.pg_prog_run1(st, p, 2 ** 31 - 1) < 0
  assert lib.pg_prog_run2(st, p, x._id, x._id) < 0  # wrong number of inputs
  out = ffi.new("int32_t[1]")
  assert lib.pg_prog_run(st, p, ffi.new("int32_t[]", [x._id]), 1, out, 0) < 0  # no room for the output
  assert lib.pg_prog_run(ffi.NULL, p, ffi.new("int32_t[]", [x._id]), 1, out, 1) < 0
  other = ffi.gc(lib.pg_store_new(), lib.pg_store_delete)
  assert lib.pg_prog_run1(other, p, 0) < 0  # a program runs on its own store only
  assert lib.pg_prog_new(ffi.NULL, ffi.new("int32_t[]", [1, 0, 1, 0]), 4) == ffi.NULL
  lib.pg_prog_delete(ffi.NULL)


def test_c_tcache_belongs_to_its_store():
  from pygrad._core import ffi, lib
  from pygrad.core import CORE
  other = ffi.gc(lib.pg_store_new(), lib.pg_store_delete)
  tc = ffi.gc(lib.pg_tcache_new(other, 16), lib.pg_tcache_delete)  # locals die in order: the store's owner first
  key = ffi.new("int32_t[]", [0, 1])
  assert lib.pg_tcache_add(CORE._st, tc, key, 2, ffi.new("int32_t[]", [1, 0, 1, 0]), 4) < 0
  assert lib.pg_tcache_add(other, tc, key, 2, ffi.new("int32_t[]", [1, 0, 1, 0]), 4) == 0
  assert lib.pg_tcache_new(ffi.NULL, 16) == ffi.NULL
  assert lib.pg_tcache_new(other, 1) == ffi.NULL  # a limit below 2 is refused


def test_c_store_lives_while_anything_made_on_it_does():
  """A store freed by its owner before its programs, template caches and gradient runs stays until the last of them
  is freed: each still takes its lock and releases its arg ids in live memory (CI runs this under ASan)."""
  from pygrad._core import ffi, lib
  st = lib.pg_store_new()
  assert lib.pg_store_arg_register(st, 1) == 0
  x = lib.pg_store_make0(st, int(Ops.CONST), dtypes.float32.id, 1, 0, 0)
  words = [1, 1, 1, int(Ops.SIN), dtypes.float32.id, 1, 0, 0, 1, 0, 1]  # sin(input 0), naming arg id 1
  prog = lib.pg_prog_new(st, ffi.new("int32_t[]", words), len(words))
  tc = lib.pg_tcache_new(st, 16)
  assert x >= 0 and prog != ffi.NULL and tc != ffi.NULL
  assert lib.pg_tcache_add(st, tc, ffi.new("int32_t[]", [0, 1]), 2, ffi.new("int32_t[]", words), len(words)) == 0
  py_ops = ffi.new("uint8_t[64]")
  run = lib.pg_grad_new(st, ffi.new("int32_t[]", [x]), 1, x, x, py_ops, py_ops, 64, 0)
  assert run != ffi.NULL
  lib.pg_store_delete(st)  # the owner lets go first
  y = lib.pg_prog_run1(st, prog, x)  # the store is still there for what uses it
  assert y >= 0 and lib.pg_grad_count(run) == 1
  lib.pg_grad_delete(run)
  lib.pg_prog_delete(prog)
  lib.pg_tcache_delete(tc)  # the last user: frees the store
