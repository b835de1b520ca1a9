"""Saving and loading graphs (pygrad.dumps/loads/save/load), pickle and copy of UOps and Walks, and the bulk builder
pygrad.build: round trips node for node, across cores, and bad input as ValueError."""
from __future__ import annotations
import copy, gc, math, os, pickle, struct, subprocess, sys, zlib
import numpy as np
import pytest
import pygrad
from pygrad import UOp, Ops, dtypes
from pygrad.serialize import _HEAD, MAGIC, VERSION
from pygrad.intern import ARGS, argkey

HERE = os.path.dirname(os.path.abspath(__file__))


def kernel_fxn(*arrays):  # a CALL kernel saved by name (module level, importable)
  arrays[0][...] = arrays[0] * 2


def kernel_grad(grad, call):
  return [grad * 2.0]


def sample():
  """A gradient graph with metadata, a FUNCTION, a CALL, special floats, ints beyond int64 and a variable."""
  x = UOp.placeholder((4, 4), dtypes.float32, name="x")
  w = UOp.placeholder((4, 4), dtypes.float32, name="w")
  with pygrad.metadata("fwd"):
    h = ((x @ w).relu() + x.const_like(-0.0)).sin()
    p = x.param_like(0)
    f = (p * p + p.const_like(math.inf)).call(h, name="sq").gettuple(0)
    loss = (f + x.const_like(float("nan"))).sum()
  gx, gw = loss.gradient(x, w)
  k = UOp.custom_kernel(UOp.placeholder((3,), dtypes.float32), fxn=kernel_fxn, grad_fxn=kernel_grad)[0]
  big = UOp(Ops.DEFINE_VAR, dtypes.int64, (), ("n", -(1 << 70), 1 << 70))
  return [loss, gx, gw, k, big]


def test_round_trip_is_identity():
  g = sample()
  data = pygrad.dumps(g)
  assert data[:8] == MAGIC
  back = pygrad.loads(data)
  assert all(a is b for a, b in zip(back, g)) and len(back) == len(g)
  assert pygrad.loads(pygrad.dumps(g[1])) is g[1]  # one UOp in, one UOp out


def test_metadata_and_args_survive_a_fresh_process(tmp_path):
  g = sample()
  path = tmp_path / "g.pgr"
  pygrad.save(path, g)
  script = ("import sys, pygrad, test_serialize as t\n"
            f"g = pygrad.load({str(path)!r})\n"
            "assert pygrad.dumps(g) == open(sys.argv[1], 'rb').read()\n"
            "assert any(m.name == 'fwd' and not m.backward for u in g[0].toposort() for m in u.metadata)\n"
            "assert any(m.name == 'fwd' and m.backward for u in g[1].toposort() for m in u.metadata)\n"
            "k = g[3].src[1]\n"
            "assert k.arg.fxn is t.kernel_fxn and k.arg.grad_fxn is t.kernel_grad\n"
            "print(pygrad.core_name(), len(g[1].toposort()))\n")
  for core in ("c", "python"):
    if core == "c" and pygrad.core_name() != "c": continue
    env = {**os.environ, "PYGRAD_CORE": core, "PYTHONPATH": os.pathsep.join([os.path.dirname(HERE), HERE])}
    r = subprocess.run([sys.executable, "-c", script, str(path)], env=env, cwd=tmp_path, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[0] == core


def test_metadata_of_a_loaded_graph_reaches_its_gradient(tmp_path):
  # a fresh process that made no metadata itself: the gradient must still see (and copy) the loaded graph's
  path = tmp_path / "loss.pgr"
  pygrad.save(path, sample()[0])
  script = ("import sys, pygrad\nfrom pygrad import Ops\n"
            f"loss = pygrad.load({str(path)!r})\n"
            "xs = [u for u in loss.toposort() if u.op is Ops.BUFFER]\n"
            "gs = loss.gradient(*xs)\n"
            "assert any(m.name == 'fwd' and m.backward for g in gs for u in g.toposort() for m in u.metadata)\n")
  for core in ("c", "python"):
    if core == "c" and pygrad.core_name() != "c": continue
    env = {**os.environ, "PYGRAD_CORE": core, "PYTHONPATH": os.path.dirname(HERE)}
    r = subprocess.run([sys.executable, "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr


def test_both_cores_write_the_same_bytes(tmp_path):
  """Saved on this core, loaded on the pure core and saved again: the same bytes (so the same nodes), and back."""
  g = sample()
  data = pygrad.dumps(g)
  (tmp_path / "a").write_bytes(data)
  script = ("import sys, pygrad, test_serialize\n"
            "d = open(sys.argv[1], 'rb').read()\n"
            "g = pygrad.loads(d)\n"
            "open(sys.argv[2], 'wb').write(pygrad.dumps(g))\n")
  env = {**os.environ, "PYGRAD_CORE": "python", "PYTHONPATH": os.pathsep.join([os.path.dirname(HERE), HERE])}
  r = subprocess.run([sys.executable, "-c", script, str(tmp_path / "a"), str(tmp_path / "b")], env=env, cwd=tmp_path,
                     capture_output=True, text=True, timeout=120)
  assert r.returncode == 0, r.stderr
  again = (tmp_path / "b").read_bytes()
  assert again == data
  assert all(a is b for a, b in zip(pygrad.loads(again), g))


def test_pickle_and_copy():
  g = sample()
  for u in g:
    assert pickle.loads(pickle.dumps(u)) is u
    assert copy.copy(u) is u and copy.deepcopy(u) is u
  holder = {"graph": g, "pair": (g[0], [g[1]])}
  back = pickle.loads(pickle.dumps(holder))
  assert back["graph"][2] is g[2] and back["pair"][1][0] is g[1]
  assert copy.deepcopy(holder)["pair"][0] is g[0]


def test_walk_pickles():
  g = sample()
  for w in (g[1].toposort(), g[1].toposort(enter_calls=False), g[1].toposort(gate=lambda u: u.op is not Ops.SIN)):
    back = pickle.loads(pickle.dumps(w))
    assert len(back) == len(w) and all(a is b for a, b in zip(back, w))


def test_lambda_kernel_is_refused_by_dumps_but_pickles():
  b = UOp.placeholder((2,), dtypes.float32)
  k = UOp.custom_kernel(b, fxn=lambda a: None)[0]
  with pytest.raises(ValueError, match="by name"):
    pygrad.dumps(k)
  with pytest.raises(Exception):  # pickle cannot carry a lambda either: it says so itself
    pickle.dumps(k)
  k2 = UOp.custom_kernel(b, fxn=print)[0]  # a builtin is reachable by name
  assert pickle.loads(pickle.dumps(k2)) is k2 and pygrad.loads(pygrad.dumps(k2)) is k2


def test_callables_resolve_only_from_imported_modules(tmp_path, monkeypatch):
  mod = tmp_path / "pg_kernels_mod.py"
  mod.write_text("RAN = []\nRAN.append(1)\ndef fxn(a):\n  a[...] = 1\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  import pg_kernels_mod
  k = UOp.custom_kernel(UOp.placeholder((2,), dtypes.float32), fxn=pg_kernels_mod.fxn)[0]
  data = pygrad.dumps(k)
  del k
  monkeypatch.delitem(sys.modules, "pg_kernels_mod")
  with pytest.raises(ValueError, match="pg_kernels_mod.*not imported"):
    pygrad.loads(data)
  k = pygrad.loads(data, allow_import=True)
  assert k.src[1].arg.fxn is sys.modules["pg_kernels_mod"].fxn


def test_deep_chain_and_nested_args_do_not_recurse():
  x = UOp.placeholder((2,), dtypes.float32)
  y = x
  for _ in range(20000): y = y.sin()
  assert pygrad.loads(pygrad.dumps(y)) is y
  arg = 0
  for _ in range(60): arg = (arg,)
  z = UOp(Ops.DEFINE_VAR, dtypes.int32, (), ("deep", 0, arg))
  assert pygrad.loads(pygrad.dumps(z)) is z
  args = _skeleton((bytes([7]) + struct.pack("<I", 1)) * 100000 + bytes([0]), 100001)  # 100,000 tuples deep
  hostile = _HEAD.pack(MAGIC, VERSION, 0, 1, len(args), 0, 0, 0, 1, 1, 0) + args + struct.pack("<I", 0)
  with pytest.raises(ValueError, match="nested deeper"):
    pygrad.loads(_reseal(hostile))


def _skeleton(tokens: bytes, ntok: int) -> bytes:
  """An arg table (pygrad/argtable.py) of one arg whose skeleton is these tokens, with no data columns."""
  return struct.pack("<II", 1, ntok) + tokens + struct.pack("<I", 0)


def _vars(tag: str) -> list:
  """DEFINE_VARs whose args take both of the arg table's paths: groups of one shape (stored as columns) and args
  that fit no column (ints beyond int64, bools, None, nested tuples, int tuples of mixed lengths)."""
  bounds = [0, 1, -1, 1 << 62, -(1 << 63), (1 << 63) - 1, 1 << 70, -(1 << 80), 2.5, -0.0, float("nan"), float("inf"),
            "é\udc80", "", b"\x00\xff", (), (1, 2), (1, 2, 3), (1, 1 << 70), (True, 1), ((), (1,)), (None, False),
            (Ops.ADD, (0, 1)), (1.5, "x", (2.5, -0.0)), dtypes.float16, (1 << 64,)]
  return [UOp(Ops.DEFINE_VAR, dtypes.int64, (), (f"{tag}{i}", lo, hi)) for i, lo in enumerate(bounds)
          for hi in (7, (3, 4), "s", bounds[i - 1])]


def test_arg_table_round_trips_every_kind_of_arg():
  """The arg table stores args of one shape as columns and the rest one by one; both must give back args equal to
  the saved ones type for type (so interning finds the live args, and the nodes are the live ones)."""
  every = _vars("v")
  small = [v for v in _vars("w") if not any(type(b) is int and abs(b) > 1 << 63 for b in v.arg[1:])]
  small += [UOp(Ops.DEFINE_VAR, dtypes.int64, (), (f"u{i}", -i, (i, 2 * i))) for i in range(200)]
  for vs in (every, small):  # in every, a huge int sends whole groups down the one-by-one path
    assert all(a is b for a, b in zip(pygrad.loads(pygrad.dumps(vs)), vs))
    want = [argkey(v.arg) for v in vs]
    data = pygrad.dumps(vs)
    nskel = struct.unpack_from("<I", data, _HEAD.size)[0]
    del vs
    gc.collect()
    back = pygrad.loads(data)  # not alive: every arg decoded afresh
    assert [argkey(v.arg) for v in back] == want
  assert nskel < len(small) // 2  # the columns were used
  del every, small


def test_string_columns_of_equal_and_unequal_lengths_round_trip():
  """A string column is one blob with lengths; one string repeated is decoded once. Strings whose lengths add up to
  a multiple of the first one's, and whose blob repeats it ("ab" + "a" + "bab"), must not be taken for a repeat."""
  for names in (["ab", "a", "bab"], ["CPU"] * 5, ["x", "x", "xx"], ["", "", ""], ["ab", "ab", "ab", "abab"]):
    vs = [UOp(Ops.DEFINE_VAR, dtypes.int32, (), (nm, 0, i)) for i, nm in enumerate(names)]
    want = [v.arg for v in vs]
    data = pygrad.dumps(vs)
    del vs
    gc.collect()
    assert [v.arg for v in pygrad.loads(data)] == want


def test_loading_the_same_bytes_again_decodes_no_arg_table(monkeypatch):
  """Regression (load speed): decoding the arg table is a fixed cost of numpy calls per skeleton, ~60% of loading a
  2,800-node model. A table of plain data decoded lately is handed out again: the graph comes back the same, alive
  or not; a table naming callables is decoded on every load (they resolve by name each time)."""
  import pygrad.argtable as at
  vs = _vars("c")
  data, want = pygrad.dumps(vs), [argkey(v.arg) for v in vs]
  calls: list = []
  real = at._decode_args
  monkeypatch.setattr(at, "_decode_args", lambda *a: calls.append(1) or real(*a))
  monkeypatch.setattr(at, "_CACHE", {})
  assert all(a is b for a, b in zip(pygrad.loads(data), vs)) and len(calls) == 1
  del vs
  gc.collect()
  back = pygrad.loads(data)
  assert [argkey(v.arg) for v in back] == want and len(calls) == 1
  del back
  gc.collect()
  ARGS.forgets += 1  # as if an id was forgotten: the kept ids are checked one by one (the count never goes back)
  back = pygrad.loads(data)
  assert [argkey(v.arg) for v in back] == want and len(calls) == 1
  k = UOp.custom_kernel(UOp.placeholder((3,), dtypes.float32), fxn=kernel_fxn)[0]
  kd = pygrad.dumps(k)
  assert pygrad.loads(kd) is k and pygrad.loads(kd) is k and len(calls) == 3


def test_saving_the_same_args_again_encodes_no_arg_table(monkeypatch):
  """Regression (save speed): encoding the arg table was ~60% of saving a 3,200-node model. The table of plain data
  written lately for the same interned ids is written again, while each id still names the object it named then (a
  stale entry is never used); a table naming callables is encoded on every save (they are written by name)."""
  import pygrad.argtable as at
  vs = _vars("e")
  calls: list = []
  real = at._encode_args
  monkeypatch.setattr(at, "_encode_args", lambda *a: calls.append(1) or real(*a))
  monkeypatch.setattr(at, "_ENC", {})
  data = pygrad.dumps(vs)
  assert pygrad.dumps(vs) == data and len(calls) == 1 and len(at._ENC) == 1
  key = next(iter(at._ENC))
  objs, table, forgets = at._ENC[key]
  assert forgets == ARGS.forgets
  ARGS.forgets += 1  # as if an id was forgotten since: each id's object is compared (the count never goes back)
  assert pygrad.dumps(vs) == data and len(calls) == 1
  at._ENC[key] = (objs[:-1] + (("not", "the", "interned", "object"),), table, forgets)  # the last id names another
  assert pygrad.dumps(vs) == data and len(calls) == 2
  assert all(a is b for a, b in zip(pygrad.loads(data), vs))
  k = UOp.custom_kernel(UOp.placeholder((3,), dtypes.float32), fxn=kernel_fxn)[0]
  kd = pygrad.dumps(k)
  assert pygrad.dumps(k) == kd and len(calls) == 4 and pygrad.loads(kd) is k


def test_interning_by_identity_is_exact():
  """Interner.get_many (build's and loads' interning) finds an object that is itself the interned one by id(): it
  gives the ids get gives, keeps 1, True and 1.0 (and 0.0, -0.0) apart, and never keeps an entry for a forgotten id."""
  from pygrad.intern import ARGS
  a, b = ("ident", (2, 3), "x"), ("ident", (2, 3), "x")
  xs = [None, a, b, 1, True, 1.0, -0.0, 0.0, float("nan"), a]
  got = ARGS.get_many(xs)
  assert got == [ARGS.get(x) for x in xs] == ARGS.get_many(xs, [None] + [argkey(x) for x in xs[1:]])
  assert got[0] == 0 and got[1] == got[2] == got[9] and len(set(got[3:9])) == 6
  ARGS.drain()
  assert all(id(ARGS.objs[aid]) == i for i, aid in ARGS.ident.items())


def test_arg_table_that_expands_too_much_is_refused():
  """An arg costs 4 bytes (its skeleton number) however many None items its skeleton has: bytes that ask for more
  items than their size allows raise instead of allocating them."""
  toks = bytes([7]) + struct.pack("<I", 4000) + bytes([0]) * 4000  # a tuple of 4,000 Nones
  k = 100_000
  args = struct.pack("<II", 1, 4001) + toks + bytes(4 * k)
  blob = _HEAD.pack(MAGIC, VERSION, 0, k, len(args), 0, 0, 0, 1, 1, 0) + args + struct.pack("<I", 0)
  with pytest.raises(ValueError, match="expands"):
    pygrad.loads(_reseal(blob))


def test_bytes_per_node():
  x = UOp.placeholder((8, 8), dtypes.float32)
  y = x
  for i in range(3000): y = (y * x).sin() if i % 2 else y + x
  n = len(y.toposort())
  assert len(pygrad.dumps(y)) / n <= 16


# ---- build ----
def test_build_from_a_table_is_the_graph():
  x = UOp.placeholder((3, 4), dtypes.float32, name="x")
  want = ((x * x).sin() + x).sum(axis=1).reshape((3,))
  ops = [Ops.BUFFER, Ops.MUL, Ops.SIN, Ops.ADD, Ops.REDUCE_AXIS, Ops.RESHAPE]
  dts = [dtypes.float32.id] * 6
  srcs = np.array([[-1, -1], [0, 0], [1, -1], [2, 0], [3, -1], [4, -1]])
  args = [x.arg, None, None, None, (Ops.ADD, (1,)), (3,)]
  (got,) = pygrad.build(np.array(ops), np.array(dts), srcs, args)
  assert got is want
  starts, flat = np.array([0, 0, 2, 3, 5, 6, 7]), np.array([0, 0, 1, 2, 0, 3, 4])
  idx = np.array([0, -1, -1, -1, 1, 2])
  r = pygrad.build(np.array(ops), np.array(dts), (starts, flat), [x.arg, (Ops.ADD, (1,)), (3,)], idx, roots=[5, 2])
  assert r[0] is want and r[1] is (x * x).sin()


def test_build_many_nodes_shares_signatures():
  n = 5000
  ops = np.full(n, int(Ops.SIN)); ops[0] = int(Ops.BUFFER); ops[1::2] = int(Ops.ADD)  # noqa: E702
  srcs = np.full((n, 2), -1); srcs[1:, 0] = np.arange(n - 1); srcs[1::2, 1] = 0  # noqa: E702
  x = UOp.placeholder((5,), dtypes.float16)
  (r,) = pygrad.build(ops, np.full(n, dtypes.float16.id), srcs, [x.arg], np.array([0] + [-1] * (n - 1)))
  y = x
  for i in range(1, n): y = y + x if i % 2 else y.sin()
  assert r is y and r.shape == (5,) and r.dtype is dtypes.float16


@pytest.mark.parametrize("ops,dts,srcs,args,match", [
  ([Ops.BUFFER, Ops.SIN], [11, 11], [[-1], [1]], [(0, (2,), "CPU", None), None], "not an earlier row"),
  ([Ops.BUFFER, Ops.SIN], [11, 11], [[-1], [-2]], [(0, (2,), "CPU", None), None], "not an earlier row"),
  ([Ops.BUFFER, 99], [11, 11], [[-1], [0]], [(0, (2,), "CPU", None), None], "ops out of range"),
  ([Ops.BUFFER, Ops.SIN], [11, 14], [[-1], [0]], [(0, (2,), "CPU", None), None], "dtypes out of range"),
  ([Ops.BUFFER, Ops.RESHAPE], [11, 11], [[-1], [0]], [(0, (2,), "CPU", None), "ab"], "node 1: RESHAPE"),
  ([Ops.BUFFER, Ops.SIN], [11, 3], [[-1], [0]], [(0, (2,), "CPU", None), None], "node 1: SIN"),
  ([Ops.CONST], [11], [[-1]], [1], "node 0: CONST"),
  ([Ops.BUFFER, Ops.SINK], [11, 11], [[-1], [0]], [(0, (2,), "CPU", None), None], "node 1: SINK has dtype void"),
  ([Ops.BUFFER, Ops.BUFFER], [11, 11], [[-1], [-1]], [(0, (2,), "CPU", None), (1, (2,), 5, None)],
   "node 1: BUFFER: device must be a str"),
  ([Ops.BUFFER, Ops.BUFFER], [11, 11], [[-1], [-1]], [(0, (1, 2), "CPU", None), (1, (True, 2), "CPU", None)],
   "node 1: BUFFER: arg must be a tuple of ints"),  # equal to (1, 2) but not of ints: no shortcut
])
def test_build_rejects_bad_tables(ops, dts, srcs, args, match):
  with pytest.raises(ValueError, match=match):
    pygrad.build(np.array([int(o) for o in ops]), np.array(dts), np.array(srcs), args)


@pytest.mark.parametrize("dtype", [np.uint8, np.int16, np.int32, np.int64, np.uint64])
def test_build_names_bad_columns_of_every_int_type(dtype):
  """Columns that fit int32 are range-checked by the C builder alone, and build names what it refused; wider ones
  are checked before the cast (2**32 + 1 would wrap to row 1)."""
  buf = (0, (2,), "CPU", None)
  ok_ops, ok_dts = np.array([int(Ops.BUFFER), int(Ops.SIN)]), np.array([11, 11])
  flat = lambda *v: np.array(v).astype(dtype)  # noqa: E731
  cases = [((np.array([int(Ops.BUFFER), 99]), ok_dts, (np.array([0, 0, 1]), flat(0))), "ops out of range"),
           ((ok_ops, np.array([11, 200]), (np.array([0, 0, 1]), flat(0))), "dtypes out of range"),
           ((ok_ops, ok_dts, (np.array([0, 1, 1]), flat(0))), "not an earlier row"),
           ((ok_ops, ok_dts, (np.array([0, 0, 1]), flat(1))), "not an earlier row"),
           ((np.array([int(Ops.BUFFER), int(Ops.SIN), int(Ops.SIN)]), np.array([11, 11, 11]),
             (np.array([0, 0, 2, 1]), flat(0))), "increasing starts")]  # (row 1 would read past flat)
  if np.dtype(dtype).itemsize == 8: cases.append(((ok_ops, ok_dts, (np.array([0, 0, 1]), flat(2 ** 32 + 1))),
                                                   "not an earlier row"))
  for (ops, dts, srcs), match in cases:
    args = [buf] + [None] * (len(ops) - 1)
    with pytest.raises(ValueError, match=match):
      pygrad.build(ops.astype(dtype), dts.astype(dtype), srcs, args)
  (r,) = pygrad.build(ok_ops.astype(dtype), ok_dts.astype(dtype), (np.array([0, 0, 1]), flat(0)), [buf, None])
  assert r.op is Ops.SIN and r.src[0].arg == buf


def test_build_names_ragged_source_rows():
  """Sources as a list of rows of different lengths (not the padded array or the (starts, flat) pair build takes)."""
  with pytest.raises(ValueError, match="srcs must be an int array.*rows of different lengths"):
    pygrad.build(np.array([int(Ops.BUFFER), int(Ops.ADD)]), np.array([11, 11]), [[], [0, 0]],
                 [(0, (2,), "CPU", None), None])


@pytest.mark.skipif(pygrad.core_name() != "c", reason="the bulk builder and its signature cache are the C core's")
def test_second_load_asks_python_for_no_signature(monkeypatch):
  """The store keeps the builder's signatures between loads: loading a graph of a model seen before (a checkpoint,
  the pieces of a pickle) infers no node in Python, and still gives the same nodes."""
  import pygrad.builder as S
  asked = []
  real = S._ask
  monkeypatch.setattr(S, "_ask", lambda i, *a: asked.append(i) or real(i, *a))
  def graph(name):
    x = UOp(Ops.BUFFER, dtypes.float32, (), (424242, (3, 5), "CPU", name))
    y = x
    for _ in range(60): y = (y * x).exp2().sum(axis=1).reshape((3, 1)).expand((3, 5)) + y
    return y
  data, want = pygrad.dumps(graph("a")), len(graph("a").toposort())
  gc.collect()
  first = pygrad.loads(data)
  assert len(first.toposort()) == want
  del first
  gc.collect()
  n_first, asked[:] = len(asked), []
  again = pygrad.loads(data)
  assert asked == [] and n_first > 0
  assert again is graph("a")
  other = pygrad.loads(pygrad.dumps(graph("b")))  # another BUFFER of the same shape: the same signatures
  assert asked == [] and other is graph("b")


def test_second_load_infers_no_leaf_again(monkeypatch):
  """Regression (C core): every load of a graph with many distinct leaves (a BUFFER per weight) inferred each leaf's
  shape in Python up front (_leaf_metas, ~40% of loading a 2,800-node W1 graph), also when the same model was
  loaded before. The builder now remembers those leaves' signatures and names only the ones it lacks: the second
  load infers none, the first each distinct leaf once, and the nodes are the same."""
  import pygrad.builder as S
  if pygrad.core_name() != "c": pytest.skip("the pure core builds node by node: no leaf inference up front")
  seen = []
  real = S._leaf_metas
  monkeypatch.setattr(S, "_leaf_metas", lambda op, dt, a, o, rows, k: seen.append(len(rows)) or real(op, dt, a, o,
                                                                                                      rows, k))
  x = UOp.placeholder((4, 4), name="x")
  tok = os.urandom(8).hex()  # names no earlier load in this process has seen
  ws = [UOp.placeholder((4, 4), name=f"w{i}_{tok}") for i in range(50)]
  y = x
  for w in ws: y = (y @ w).relu() + y
  data = pygrad.dumps(y)
  del x, ws, y, w
  gc.collect()
  before = pygrad.live_nodes()
  first = pygrad.loads(data)
  assert len(seen) == 1 and seen[0] >= 51 and pygrad.live_nodes() > before  # 51 new BUFFERs (and relu's 0)
  assert pygrad.dumps(first) == data
  seen.clear()
  del first
  gc.collect()
  again = pygrad.loads(data)
  assert seen == [] and pygrad.dumps(again) == data


def test_build_leaves_no_nodes_behind():
  before = pygrad.live_nodes()
  r = pygrad.build(np.array([int(Ops.CONST), int(Ops.SIN), int(Ops.SIN)]), np.full(3, dtypes.float32.id),
                   np.array([[-1], [0], [1]]), [2.5, None, None], roots=[1])
  assert r[0] is UOp.const(2.5).sin()
  assert pygrad.live_nodes() == before + 2
  del r
  assert pygrad.live_nodes() == before


# ---- bad bytes ----
def _reseal(body: bytes) -> bytes:
  return body + struct.pack("<I", zlib.crc32(body))


def _header(data: bytes, **kw) -> bytes:
  names = ["magic", "version", "flags", "nargs", "argbytes", "n", "nsrc", "nroots", "srcw", "argw", "ngiven"]
  vals = dict(zip(names, _HEAD.unpack_from(data, 0)))
  vals.update(kw)
  return _reseal(_HEAD.pack(*[vals[k] for k in names]) + data[_HEAD.size:-4])


def _small():
  x = UOp.placeholder((2,), dtypes.float32, name="x")
  return ((x * x).sin() + x.const_like(1.5)).sum()


def test_bad_bytes_raise_value_error():
  data = pygrad.dumps(_small())
  cases = {
    "too short": data[:10], "bad magic": b"X" + data[1:], "version": _header(data, version=7),
    "checksum": data[:-1] + bytes([data[-1] ^ 1]), "counts larger": _header(data, n=1 << 40),
    "source counts add up": _header(data, nsrc=3), "bad header": _header(data, srcw=3),
  }
  for what, bad in cases.items():
    with pytest.raises(ValueError, match=what):
      pygrad.loads(bad)
  for k in range(len(data)):  # every truncation
    with pytest.raises(ValueError):
      pygrad.loads(data[:k])


def _tamper(data: bytes, pos: int, value: int) -> bytes:
  body = bytearray(data[:-4])
  body[pos] = value
  return _reseal(bytes(body))


def test_arg_reference_beyond_int32_raises_value_error():
  """Regression (found by the fuzzer at a larger budget): the pure reader cast 4-byte arg numbers to int32 before
  checking them, so one above 2**31 wrapped negative, passed the check and named an arg counted from the end."""
  data = pygrad.dumps(UOp.placeholder((2,), dtypes.float32, name="big_ref").sin())
  magic, ver, flags, nargs, argbytes, n, m, nroots, srcw, argw, ng = _HEAD.unpack_from(data, 0)
  body = data[_HEAD.size + argbytes:-4]
  assert argw == 1 and 255 not in body[2 * n:3 * n]
  wide = body[:3 * n] + struct.pack("<I", 0x80000001) * n + body[4 * n:]
  head = _HEAD.pack(magic, ver, flags, nargs, argbytes, n, m, nroots, srcw, 4, ng)
  with pytest.raises(ValueError, match="arg reference is outside the arg table"):
    pygrad.loads(_reseal(head + data[_HEAD.size:_HEAD.size + argbytes] + wide))


def test_lying_tables_raise_value_error():
  u = _small()
  data = pygrad.dumps(u)
  vals = _HEAD.unpack_from(data, 0)
  argbytes, n = vals[4], vals[5]
  ops_at = _HEAD.size + argbytes
  with pytest.raises(ValueError, match="unknown op"):
    pygrad.loads(_tamper(data, ops_at, 200))
  with pytest.raises(ValueError, match="unknown dtype"):
    pygrad.loads(_tamper(data, ops_at + n, 77))
  src_at = ops_at + 3 * n + n * vals[9]
  with pytest.raises(ValueError, match="points before|cycle"):
    pygrad.loads(_tamper(data, src_at, 250))
  with pytest.raises(ValueError, match="cycle"):
    pygrad.loads(_tamper(data, src_at, 0))
  with pytest.raises(ValueError, match="node"):  # a node's op swapped for another: its validation names it
    pygrad.loads(_tamper(data, ops_at + n - 1, int(Ops.CONST)))
  with pytest.raises(ValueError, match="unknown arg tag"):
    pygrad.loads(_tamper(data, _HEAD.size + 8, 99))  # the first skeleton's first token
  args = _skeleton(bytes([7]) + struct.pack("<I", 0xFFFFFFFF), 1)
  huge = _HEAD.pack(MAGIC, VERSION, 0, 1, len(args), 0, 0, 0, 1, 1, 0) + args + struct.pack("<I", 0)
  with pytest.raises(ValueError, match="longer than the data"):
    pygrad.loads(_reseal(huge))


# ---- one pickling call, one node table ----
def _trunk(k: int):
  """A 2k-node chain over a fixed BUFFER (rebuilt node for node by calling this again) and 300 heads over it."""
  x = UOp(Ops.BUFFER, dtypes.float32, (), (987654321, (4,), "CPU", "trunk"))
  y = x
  for i in range(k): y = (y + x).sin() if i % 2 else y * x
  return x, y, [(y + float(i)).sum() for i in range(300)]


def test_pickle_of_many_uops_writes_their_graph_once():
  """Regression: each UOp of a container wrote its whole graph again (300 heads over one graph: 300 graphs)."""
  _, y, heads = _trunk(1000)
  one = len(pygrad.dumps(heads))
  data = pickle.dumps(heads)
  assert len(data) <= one + 160 * len(heads), (len(data), one)
  assert len(pickle.dumps([y] + heads + [y])) <= len(data) + 400
  back = pickle.loads(data)
  assert len(back) == len(heads) and all(a is b for a, b in zip(back, heads))
  chain = [y]  # every item adds one node: still one table, linear in the items
  for _ in range(2000): chain.append(chain[-1].exp2())
  data = pickle.dumps(chain)
  assert len(data) <= len(pygrad.dumps(chain)) + 160 * len(chain), len(data)
  assert all(a is b for a, b in zip(pickle.loads(data), chain))
  assert all(a is b for a, b in zip(pickle.loads(pickle.dumps(chain[::-1])), chain[::-1]))


def test_pickle_of_many_uops_loads_the_same_nodes():
  """Loaded where the graph is not alive, then rebuilt: the same nodes (hash-consing), every one reachable."""
  _, y, heads = _trunk(400)
  w = y.toposort()
  holder = {"heads": heads, "walk": w, "again": (heads[7], [heads[3], y]), "y": y}
  data = pickle.dumps(holder)
  del holder, w, heads, y
  gc.collect()
  before = pygrad.live_nodes()
  back = pickle.loads(data)
  assert pygrad.live_nodes() > before
  _, y2, heads2 = _trunk(400)
  assert all(a is b for a, b in zip(back["heads"], heads2)) and back["y"] is y2
  assert back["again"][0] is heads2[7] and back["again"][1][0] is heads2[3] and back["again"][1][1] is y2
  assert len(back["walk"]) == len(y2.toposort()) and all(a is b for a, b in zip(back["walk"], y2.toposort()))


def test_pickle_calls_do_not_share_tables():
  """Each pickling call is complete on its own (a later call does not refer to an earlier call's table), also
  with one Pickler dumping twice (its memo spans both: then one Unpickler loads both) and nested calls."""
  import io
  _, y, heads = _trunk(200)
  a, b = pickle.dumps(heads[:5]), pickle.dumps(heads[5:10])
  assert [u is v for u, v in zip(pickle.loads(b), heads[5:10])] == [True] * 5
  assert len(b) <= len(a) + 200 and pickle.loads(a)[0] is heads[0]
  f = io.BytesIO()
  p = pickle.Pickler(f)
  p.dump(heads[:3])
  p.dump(heads[3:6])
  f.seek(0)
  up = pickle.Unpickler(f)
  assert up.load()[2] is heads[2] and up.load()[2] is heads[5]

  class Nested:  # pickles a UOp inside another pickling call
    def __reduce__(self): return pickle.loads, (pickle.dumps(heads[9]),)
  back = pickle.loads(pickle.dumps([heads[1], Nested(), heads[2], heads[9]]))
  assert back[1] is heads[9] and back[3] is heads[9] and back[2] is heads[2]


def test_bad_pickled_pieces_raise_value_error(monkeypatch):
  import pygrad.pickling as ser
  from pygrad.pickling import _load_piece, _load_part, _load_row
  _, y, heads = _trunk(50)
  gc.collect()
  ser._local.session = None  # a new pickling session (one an earlier test left open would list the heads)
  with monkeypatch.context() as mp:
    mp.setattr(ser, "_PART", 0)  # every piece in pygrad's format, with its arg table
    r0, r1 = heads[0].__reduce__(), heads[1].__reduce__()  # one session: the second piece continues the first
    blob = r1[1][0].blob
    del r0, r1
  with pytest.raises(ValueError, match="continues another"):  # a piece's bytes alone are not a graph
    pygrad.loads(blob)
  with pytest.raises(ValueError, match="outside its table"):
    _load_row(None, 0)
  with pytest.raises(ValueError, match="not loaded before"):
    _load_piece(None, struct.pack("<I", 3), pygrad.dumps(y), ())
  # a small piece: its node sections, their counts and its args as objects
  ser._local.session = None
  r0, r1 = heads[0].__reduce__(), heads[1].__reduce__()
  f0, a0 = r0[1][0].__reduce__()
  f1, (_, imports, counts, nodes, args) = r1[1][0].__reduce__()
  assert f0 is _load_part and f1 is _load_part
  first = _load_part(*a0)
  assert _load_row(first, r0[1][1]) is heads[0]
  assert _load_row(_load_part(first, imports, counts, nodes, args), r1[1][1]) is heads[1]
  n, m, nroots, srcw, argw = counts
  bad = [((n, m, nroots, srcw, 3), nodes, args, "bad pickle"), ((n + 1000, m, 1, srcw, argw), nodes, args, "bad pickle"),
         ((n, m, 1, srcw, argw), nodes[:-1], args, "truncated"), ((n, m, 1, srcw, argw), nodes + b"\0", args, "after"),
         ((n, m, 1, srcw, argw), nodes, (), "outside the arg table"), ((True, m, 1, srcw, argw), nodes, args, "counts"),
         ((n, m, 1, srcw, argw), bytearray(nodes), args, "nodes"), ([n, m, 1, srcw, argw], nodes, args, "counts"),
         ((n, m, 1, srcw, argw), nodes, tuple([[]] * len(args)), "bad pickle|metadata must be")]
  for c, nd, ar, what in bad:
    with pytest.raises(ValueError, match=what):
      _load_part(first, imports, c, nd, ar)
  with pytest.raises(ValueError, match="not loaded before"):
    _load_part(None, imports, counts, nodes, args)


def test_pickle_of_many_uops_decodes_no_arg_table_per_uop(monkeypatch):
  """Regression: each UOp of a container that added nodes was a piece with its own arg table, decoded on load with
  numpy and interned arg by arg (~150 us each: the 32,260 outputs of a W1 gradient loaded 17x slower than one
  pygrad.loads of their table). Now such a piece carries its args as the interned objects (pickle's memo writes
  each once per stream): the stream's arg tables are decoded once, for its first, large piece."""
  import pygrad.argtable as at
  import pygrad.pickling as pk
  import pygrad.serialize as ser
  _, y, heads = _trunk(3000)  # the first piece (y's graph and heads[0]) has more than _PART rows
  assert len(y.toposort()) > pk._PART
  calls = []
  real = at.decode_args
  monkeypatch.setattr(ser, "decode_args", lambda *a: calls.append(1) or real(*a))
  data = pickle.dumps(heads)
  assert len(data) <= len(pygrad.dumps(heads)) + 160 * len(heads)
  back = pickle.loads(data)
  assert all(a is b for a, b in zip(back, heads)) and len(back) == len(heads)
  assert len(calls) == 1
  _, _, few = _trunk(100)
  small = pickle.dumps(few)  # every piece small: no arg table at all
  calls.clear()
  assert all(a is b for a, b in zip(pickle.loads(small), few)) and calls == []
  calls.clear()
  del back, heads, y
  gc.collect()
  before = pygrad.live_nodes()
  back = pickle.loads(data)  # loaded where the graph is not alive: the same nodes as rebuilding it
  assert pygrad.live_nodes() > before and len(calls) == 1
  _, y2, heads2 = _trunk(3000)
  assert all(a is b for a, b in zip(back, heads2))


def test_program_pickles_and_copies():
  """A compiled program pickles as its graph and inputs and is compiled again on load; copy compiles a twin."""
  x, w = UOp.placeholder((3, 4), name="x"), UOp.placeholder((4, 2), name="w")
  outs = [(x @ w).relu().sum(), [x.sin()]]
  prog = pygrad.compile([outs[0], outs[1][0]], [x, w])
  single = pygrad.compile(outs[0], [x, w])
  xv, wv = np.random.default_rng(0).standard_normal((3, 4), np.float32), np.ones((4, 2), np.float32)
  want = prog(xv, wv)
  for p in (pickle.loads(pickle.dumps(prog)), copy.copy(prog), copy.deepcopy(prog)):
    assert p is not prog and p.inputs[0] is x and p.inputs[1] is w and p.stats == prog.stats
    got = p(xv, wv)
    assert len(got) == 2 and all(np.array_equal(a, b) for a, b in zip(got, want))
  back = pickle.loads(pickle.dumps(single))
  assert np.array_equal(back(xv, wv), single(xv, wv)) and np.asarray(back(xv, wv)).shape == ()
