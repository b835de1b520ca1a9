"""pygrad as tinygrad 0.14.0's gradient engine: conversions both ways, compute_gradient, install(), and tinygrad's own
gradient tests (from ../shared/peer-tests/tinygrad, run unmodified in a subprocess with pygrad installed)."""
from __future__ import annotations
import os, subprocess, sys
from pathlib import Path
import numpy as np
import pytest

tinygrad = pytest.importorskip("tinygrad", reason="tinygrad is not installed (pip install '.[tinygrad]')")
from tinygrad import Tensor, nn  # noqa: E402
from tinygrad.dtype import dtypes as tdtypes  # noqa: E402
from tinygrad.uop.ops import UOp as TUOp, Ops as TOps  # noqa: E402
import tinygrad.mixin.gradient as tg_gradient  # noqa: E402
import pygrad  # noqa: E402
from pygrad import Ops  # noqa: E402
import pygrad.interop.tinygrad as pt  # noqa: E402

DEV = "PYTHON"  # tinygrad's interpreter: no compiler needed, exact enough at these sizes
HERE = Path(__file__).resolve().parent


def _params(*shapes):
  Tensor.manual_seed(0)
  return [Tensor.randn(*s, device=DEV).realize() for s in shapes]


class _Net:
  """A small model in the style of tinygrad's examples (nn.Linear, gelu, log_softmax): it runs offline."""
  def __init__(self):
    Tensor.manual_seed(1)
    self.l1, self.l2 = nn.Linear(16, 8), nn.Linear(8, 4)
    for p in nn.state.get_parameters(self): p.replace(p.to(DEV)).realize()

  def __call__(self, x): return self.l2(self.l1(x).gelu()).log_softmax().mean()


def mlp():
  x, w1, w2 = _params((4, 8), (8, 16), (16, 3))
  return (x @ w1).relu().matmul(w2).tanh().sum(), [w1, w2, x]


def conv2d():
  x, w = _params((2, 3, 6, 6), (4, 3, 3, 3))
  return x.conv2d(w, padding=1).relu().mean(), [x, w]


def attention():
  q, k, v = _params((1, 2, 4, 8), (1, 2, 4, 8), (1, 2, 4, 8))
  return q.scaled_dot_product_attention(k, v).square().sum(), [q, k, v]


def layernorm():
  x, g, b = _params((4, 8), (8,), (8,))
  return (x.layernorm() * g + b).square().mean(), [x, g, b]


def softmax_ce():
  x, w = _params((5, 6), (6, 4))
  y = Tensor([0, 3, 1, 2, 3], device=DEV)
  return (x @ w).sparse_categorical_crossentropy(y), [x, w]


def nn_model():
  m = _Net()
  (x,) = _params((3, 16))
  return m(x), [m.l1.weight, m.l1.bias, m.l2.weight, m.l2.bias]


MODELS = [mlp, conv2d, attention, layernorm, softmax_ce, nn_model]


# ---- conversions ----

@pytest.mark.parametrize("model", MODELS, ids=lambda f: f.__name__)
def test_round_trip_is_identity(model):
  root, _ = model()
  p = pt.from_tinygrad(root.uop)
  assert isinstance(p, pygrad.UOp) and p.shape == root.shape
  assert pt.to_tinygrad(p) is root.uop


@pytest.mark.parametrize("model", MODELS, ids=lambda f: f.__name__)
def test_round_trip_of_gradient_graphs(model, own_engine):
  root, params = model()
  gs = [g.uop for g in root.gradient(*params)]
  back = pt.to_tinygrad(pt.from_tinygrad(gs))
  assert all(b is g for b, g in zip(back, gs))


def test_conversion_maps_each_difference():
  x = Tensor.randn(3, 1, device=DEV).realize()
  y = Tensor.randn(4, device=DEV).realize()
  z = (x + y).sum(axis=0)  # implicit numpy broadcast, a REDUCE dropping its axis
  p = pt.from_tinygrad(z.uop)
  ops = {u.op for u in p.toposort()}
  assert Ops.REDUCE_AXIS in ops and Ops.EXPAND in ops and p.shape == (4,)
  leaves = [u for u in p.toposort() if u.op is Ops.BUFFER]
  assert {u.arg[0] for u in leaves} == {x.uop.base, y.uop.base}  # a BUFFER's id is tinygrad's BUFFER
  assert all(u.device == x.device for u in leaves) and all(u.dtype is pygrad.dtypes.float32 for u in leaves)
  v = TUOp.variable("v", -3.0, 3.0, dtype=tdtypes.float)
  pv = pt.from_tinygrad(v * 2.0)
  assert pv.op is Ops.MUL and pv.src[0].op is Ops.DEFINE_VAR and pv.src[0].arg == ("v", -3.0, 3.0)
  assert pv.src[1].op is Ops.CONST and pv.src[1].dtype is pygrad.dtypes.float32  # weak 2.0 takes the user's dtype
  assert pt.to_tinygrad(pv) is v * 2.0


def test_pygrad_graph_to_tinygrad_runs():
  a = pygrad.UOp.placeholder((3, 4), pygrad.dtypes.float32, device=DEV)
  f = (a.reshape((4, 3)).permute((1, 0)).pad(((1, 0), (0, 2))).shrink(((1, 4), (0, 4))) * 2.0).sum(axis=0)
  t = pt.to_tinygrad(f)
  assert t.shape == f.shape == (4,)
  vals = np.arange(12, dtype=np.float32).reshape(3, 4)
  buf = pt.to_tinygrad(a)
  tv = Tensor(t.substitute({buf: Tensor(vals, device=DEV).uop})).numpy()
  np.testing.assert_allclose(tv, pygrad.evaluate(f, {a: vals}, engine="numpy"))


def test_unknown_op_is_a_value_error_naming_it():
  x = Tensor.randn(4, device=DEV).realize()
  with pytest.raises(ValueError, match="NEG"):
    pt.from_tinygrad(TUOp(TOps.NEG, src=(x.uop,)))
  with pytest.raises(ValueError, match="tinygrad op (STACK|THREEFRY) has no pygrad counterpart"):
    pt.from_tinygrad(Tensor.rand(3, device=DEV).uop)
  with pytest.raises(TypeError):
    pt.from_tinygrad(np.zeros(3))
  with pytest.raises(TypeError):
    pt.to_tinygrad(x.uop)


def test_conversion_does_not_recurse_on_depth():
  x = TUOp.variable("x", -1.0, 1.0, dtype=tdtypes.float)
  y = x
  for _ in range(sys.getrecursionlimit() + 500): y = y * 0.5 + 1.0
  p = pt.from_tinygrad(y)
  assert len(p.toposort()) > 2 * sys.getrecursionlimit()
  assert pt.to_tinygrad(p) is y


def test_missing_tinygrad_is_a_clear_import_error():
  code = "import sys; sys.modules['tinygrad'] = None\ntry:\n  import pygrad.interop.tinygrad\n" \
         "except ImportError as e: print('IMPORTERROR', e)\n"
  r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), cwd=HERE.parent)
  assert "IMPORTERROR" in r.stdout and "tinygrad" in r.stdout, r.stdout + r.stderr


# ---- gradients ----

@pytest.mark.parametrize("model", MODELS, ids=lambda f: f.__name__)
def test_gradients_agree_with_tinygrads_own(model, own_engine):
  root, params = model()
  want = [g.numpy() for g in root.gradient(*params)]
  root, params = model()
  with pt.installed():
    assert tg_gradient.compute_gradient is pt.compute_gradient
    got_t = root.gradient(*params)
  got = [g.numpy() for g in got_t]
  for w, g in zip(want, got):
    assert w.shape == g.shape
    np.testing.assert_allclose(g, w, rtol=2e-5, atol=1e-6)
  # and pygrad's engines evaluate the converted gradient graphs to the same values
  pg = pt.from_tinygrad([g.uop for g in got_t])
  inputs = {}
  for u in pg[0].sink(*pg).toposort():
    if u.op is Ops.BUFFER: inputs[u] = Tensor(u.arg[0]).numpy().reshape(u.shape)
  engines = ["numpy"] + (["c"] if pygrad.core_name() == "c" else [])
  for engine in engines:
    for w, v in zip(want, pygrad.evaluate(pg, inputs, engine=engine)):
      np.testing.assert_allclose(v, w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("model", MODELS, ids=lambda f: f.__name__)
def test_gradient_reshape_chains_are_folded_value_for_value(model, monkeypatch):
  """The way out folds a gradient's reshape chains (a reshape of a reshape made there is one reshape, none if the
  shapes agree; a permute of a reduce is a permute of the reduce without its size-1 axes): the same values, bit for
  bit, from fewer tinygrad nodes, and no reshape of a reshape among the nodes it made."""
  from pygrad.interop.tinygrad_out import _Out
  root, params = model()
  fwd = set(root.uop.toposort())

  def grads(fold):
    init = _Out.__init__
    if not fold: monkeypatch.setattr(_Out, "__init__", lambda self, known=None: (init(self, known),
                                                                                  setattr(self, "fold", False))[0])
    try:
      with pt.installed(): return root.gradient(*params)
    finally:
      monkeypatch.setattr(_Out, "__init__", init)

  folded, plain = grads(True), grads(False)
  made = lambda gs: [u for u in TUOp.sink(*[g.uop for g in gs]).toposort() if u not in fwd]  # noqa: E731
  assert len(made(folded)) <= len(made(plain))
  assert not [u for u in made(folded) if u.op is TOps.RESHAPE and u.src[0].op is TOps.RESHAPE and u.src[0] not in fwd]
  assert not [u for u in made(folded) if u.op is TOps.RESHAPE and u.src[0].shape == u.shape]
  for f, p in zip(folded, plain): assert np.array_equal(f.numpy(), p.numpy())


def test_gradient_reshape_chains_fold_on_the_bench_chain():
  """On W1 the fold drops 4 of the 51 tinygrad nodes per layer (the reshape pairs around the matmul's gradient)."""
  root, rg, targets = _bench_graph("W1", 3)
  fwd = set(root.toposort())
  g = pt.compute_gradient(root, rg, targets)
  made = [u for u in TUOp.sink(*[g[t] for t in targets]).toposort() if u not in fwd]
  assert not [u for u in made if u.op is TOps.RESHAPE]


def test_compute_gradient_signature_and_types():
  x = TUOp.variable("x", -10.0, 10.0, dtype=tdtypes.float)
  y = TUOp.variable("y", -10.0, 10.0, dtype=tdtypes.float)
  f = (x * y).sin() + x / y
  grads = pt.compute_gradient(f, TUOp.const(1.0), {x, y})
  assert isinstance(grads, dict) and all(isinstance(k, TUOp) and isinstance(v, TUOp) for k, v in grads.items())
  gx = grads[x].substitute({x: TUOp.const(2.0), y: TUOp.const(3.0)}).ssimplify()
  assert abs(gx - (3.0 * np.cos(6.0) + 1 / 3.0)) < 1e-5


def test_backward_uses_pygrad_only_while_installed(own_engine):
  own = tg_gradient.compute_gradient
  calls = []
  real = pt._pg_gradient.compute_gradient
  pt._pg_gradient.compute_gradient = lambda *a: calls.append(1) or real(*a)
  try:
    x = Tensor([1.0, 2.0, 3.0], device=DEV)
    pt.install()
    (x * x).sum().backward()
    assert calls and x.grad.tolist() == [2.0, 4.0, 6.0]
    pt.uninstall()
    assert tg_gradient.compute_gradient is own
    n = len(calls)
    (x * 3.0).sum().backward()
    assert len(calls) == n and x.grad.tolist() == [5.0, 7.0, 9.0]
    with pt.installed():
      assert tg_gradient.compute_gradient is pt.compute_gradient
    assert tg_gradient.compute_gradient is own
  finally:
    pt._pg_gradient.compute_gradient = real


# ---- tinygrad's own tests ----

def _env() -> dict:
  env = dict(os.environ)
  root = str(Path(pygrad.__file__).resolve().parents[1])  # the pygrad this process imported, checkout or install
  env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), root, env.get("PYTHONPATH")) if p)
  env["PYTHONDONTWRITEBYTECODE"] = "1"  # the shared folder is read-only
  return env


def _shared() -> Path:
  """../shared beside the checkout: $PYGRAD_SHARED (set by .ci/run, whose tests run from a copy), else the nearest
  `shared/` above the imported pygrad's checkout or above this file (a git worktree may sit a level deeper)."""
  cands = [Path(os.environ["PYGRAD_SHARED"])] if os.environ.get("PYGRAD_SHARED") else []
  for start in (Path(pygrad.__file__).resolve().parents[1], HERE.parent):
    cands += [d / "shared" for d in start.parents]
  for c in cands:
    if (c / "peer-tests" / "tinygrad").is_dir(): return c / "peer-tests" / "tinygrad"
  raise AssertionError(f"tinygrad's peer tests not found in {sorted({str(c) for c in cands})}: set PYGRAD_SHARED")


def test_tinygrads_own_gradient_tests_pass_with_pygrad_installed(tmp_path):
  files = sorted(str(f) for f in _shared().glob("test_*.py"))
  assert len(files) == 2, files
  env = _env()
  env["DEV"] = DEV  # as tinygrad's CI runs them here; the 4 tests that ask for "CPU" compile with clang
  r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tinygrad_install_plugin", "-p", "no:cacheprovider",
                      "--rootdir", str(tmp_path), "-o", "faulthandler_timeout=300", *files],
                     capture_output=True, text=True, env=env, cwd=tmp_path, timeout=1200)
  out = r.stdout + r.stderr
  assert r.returncode == 0 and "37 passed" in out, out[-4000:]
  derived = [int(line.split()[2]) for line in out.splitlines() if line.startswith("pygrad derived ")]
  assert derived and derived[0] >= 30, out[-2000:]


def _bench_graph(wl: str, size: int):
  """pygrad.bench's workload wl (W1 residual MLP chain, W2 transformer blocks) built with tinygrad's Tensor API on
  unrealized inputs, as bench/bench_tinygrad.py builds it: (root, root_grad, targets) as tinygrad UOps."""
  from pygrad import bench as pb
  args = pb.map_shapes(pb.input_shapes(wl, size), lambda s: Tensor.empty(*s, device=DEV))
  root = pb.MODELS[wl](pb.MethodOps, *args)
  return root.uop, root.uop.const_like(1.0), [t.uop for t in pb.flat(args)]


@pytest.mark.parametrize("wl,size", [("W1", 120), ("W2", 8)])
def test_round_trip_is_identity_at_size(wl, size, own_engine):
  root, rg, targets = _bench_graph(wl, size)
  p = pt.from_tinygrad(root)
  assert len(p.toposort()) > 1000
  assert pt.to_tinygrad(p) is root
  grads = tg_gradient.compute_gradient(root, rg, set(targets))
  gs = [grads[t] for t in targets]
  assert all(b is g for b, g in zip(pt.to_tinygrad(pt.from_tinygrad(gs)), gs))


def test_metadata_rides_the_fast_gradient_path(own_engine):
  """tinygrad's Tensor API puts metadata on nearly every node: the derivation must still instantiate C templates
  (no node's rule stepped in Python), and the gradient's nodes carry the backward metadata names tinygrad's own
  derivation puts on them."""
  from tinygrad.uop.ops import all_metadata
  pt.compute_gradient(*_bench_graph("W1", 2))  # templates of every signature made once
  stepped: list = []
  if pygrad.core_name() == "c":  # the pure core has no templates: every rule runs in Python there
    import pygrad.gradient.templated as templated
    real = templated.step

    def step(*a, **k):
      stepped.append(a[0])
      return (yield from real(*a, **k))

  def names(grads, root, targets):
    """Metadata on the gradient's nodes that depend on this graph's inputs (a node that does not, a constant
    broadcast, is hash-consed with other graphs' nodes and carries their metadata too)."""
    fwd, dep = set(root.toposort()), set(targets)
    for u in root.toposort():
      if any(s in dep for s in u.src): dep.add(u)
    got = set()
    for t in targets:
      for u in grads[t].toposort():
        if u not in fwd and any(s in dep for s in u.src):
          dep.add(u)
          got |= {(m.name, m.backward) for m in all_metadata.get(u, ())}
    return got

  root, rg, targets = _bench_graph("W1", 40)
  want = names(tg_gradient.compute_gradient(root, rg, set(targets)), root, targets)
  root, rg, targets = _bench_graph("W1", 40)
  if pygrad.core_name() == "c": templated.step = step
  try:
    got = names(pt.compute_gradient(root, rg, targets), root, targets)
  finally:
    if pygrad.core_name() == "c": templated.step = real
  assert not stepped
  layer = {(n, True) for n in ("__matmul__", "relu", "sin", "exp2")}
  assert layer <= want and got == want


def test_conversions_leave_the_gc_as_they_found_it():
  """The conversions pause Python's cyclic GC while they run (pygrad/interop/tinygrad_tables._no_gc): on return and
  on error it is as before, enabled or not."""
  import gc
  x = Tensor.randn(3, device=DEV).realize()
  y = (x * 2.0).sum()
  was = gc.isenabled()
  try:
    for on in (True, False):
      gc.enable() if on else gc.disable()
      assert pt.to_tinygrad(pt.from_tinygrad(y.uop)) is y.uop
      assert x.uop in pt.compute_gradient(y.uop, y.uop.const_like(1.0), {x.uop})
      with pytest.raises(ValueError, match="NEG"):
        pt.from_tinygrad(TUOp(TOps.NEG, src=(x.uop,)))
      assert gc.isenabled() is on
  finally:
    gc.enable() if was else gc.disable()


def test_metadata_crosses_both_ways():
  from tinygrad.uop.ops import all_metadata
  x = Tensor.randn(3, device=DEV).realize()
  y = (x * 2.0).sum()
  assert pt.from_tinygrad(y.uop).metadata[0].name == "sum"  # tinygrad's Tensor methods record their names
  with pt.installed():
    g = y.gradient(x)[0]
  names = {m.name for u in g.uop.toposort() for m in (all_metadata.get(u) or ()) if m.backward}
  assert "__mul__" in names


@pytest.mark.parametrize("wl", ["W1", "W2"])
def test_c_loop_of_the_way_out_makes_what_python_makes(monkeypatch, wl):
  """csrc/pyforeign.c makes the plain rows of the way out (typed ALU, CAST, BITCAST) and the planned ones (reduces,
  permutes) in C: the gradient it gives back is the Python loop's, node for node (tinygrad's own hash-consed nodes)
  and metadata for metadata."""
  from tinygrad.uop.ops import all_metadata
  from pygrad.core import CORE
  if CORE.foreign_rows is None: pytest.skip("the pure-Python core has no C loop (the Python loop is what runs)")

  import pygrad.interop.tinygrad_out as tout
  monkeypatch.setattr(tout, "_C_ROWS", 0)  # (small tables are the Python loop's)

  def grads(fast, graph):
    monkeypatch.setattr(CORE, "foreign_rows", fast)
    root, rg, targets = graph
    g = pt.compute_gradient(root, rg, targets)
    return [g[t] for t in targets]

  def listing(gs):  # every node of the gradients, in order, with its metadata (the inputs' nodes told apart)
    ts = TUOp.sink(*gs).toposort()
    ix = {u: i for i, u in enumerate(ts)}
    return [(u.op, u.dtype, u.arg if u.op is not TOps.BUFFER else None, tuple(ix[s] for s in u.src),
             tuple((m.name, m.backward) for m in all_metadata.get(u) or ())) for u in ts]

  fast = CORE.foreign_rows
  calls = []
  graph = _bench_graph(wl, 6 if wl == "W1" else 2)
  with_c = grads(lambda *a: calls.append(1) or fast(*a), graph)
  assert calls
  assert all(a is b for a, b in zip(with_c, grads(None, graph)))  # the same graph again: the same nodes
  # a graph like it with other inputs: the Python loop makes nodes of its own, with the same metadata
  got = listing(with_c)
  assert sum(1 for x in got if x[4]) > len(got) // 2
  assert got == listing(grads(None, _bench_graph(wl, 6 if wl == "W1" else 2)))


def test_c_loop_of_the_way_out_checks_its_arguments():
  """Bad arguments to the C loop are Python exceptions, never a crash."""
  from pygrad.core import CORE
  from tinygrad.uop.ops import UOpMetaClass
  import pygrad.interop.tinygrad_tables as pt_tables
  f = CORE.foreign_rows
  if f is None: pytest.skip("the pure-Python core has no C loop")
  cast = (0, TOps.CAST, 0, TOps.BITCAST)

  i32 = lambda xs: np.array(xs, np.int32).tobytes()  # noqa: E731  (the columns: bytes of int32, start int64)

  def cfg(out=None, op=(1,), start=(0, 0), src=(), cache=None, cls=TUOp, cst=cast, md=None, lazy=None, fields=None,
          reduced=None, plans=None):
    out = [None] if out is None else out
    return (out, i32(op), i32([0]), i32([0]), np.array(start, np.int64).tobytes(), i32(src), i32([0]), (), (), (),
            UOpMetaClass.ucache if cache is None else cache, cls, cst, md, None, {}, lazy, fields,
            {} if reduced is None else reduced, plans)
  with pytest.raises(TypeError): f(cfg(), None, 0)
  with pytest.raises(TypeError): f((1, 2), None, 0, 1)
  with pytest.raises(TypeError): f(cfg(out=(None,)), None, 0, 1)
  with pytest.raises(TypeError): f(cfg(op=(1, 2)), None, 0, 1)  # columns of different lengths
  with pytest.raises(TypeError): f(cfg()[:1] + ([1],) + cfg()[2:], None, 0, 1)  # a column that is no bytes
  with pytest.raises(TypeError): f(cfg()[:1] + (b"\0\0\0",) + cfg()[2:], None, 0, 1)  # no whole int32
  with pytest.raises(TypeError): f(cfg(cache=[]), None, 0, 1)
  with pytest.raises(TypeError): f(cfg(cls=1), None, 0, 1)
  with pytest.raises(TypeError): f(cfg(cst=(1,)), None, 0, 1)
  with pytest.raises(TypeError): f(cfg(md=[]), None, 0, 1)
  with pytest.raises(IndexError): f(cfg(), None, 0, 2)
  with pytest.raises(IndexError): f(cfg(), [5], 0, 1)
  with pytest.raises(TypeError): f(cfg(), (0,), 0, 1)
  assert f(cfg(), None, 0, 1) == 0  # a row it has no table entry for: left to Python
  # a row whose source row is out of range, and one whose start points past the source column
  tables = lambda c: c[:7] + ((None, TOps.ADD), (tdtypes.float32,)) + c[9:]  # noqa: E731
  with pytest.raises(IndexError): f(tables(cfg(start=(0, 1), src=(7,))), None, 0, 1)
  with pytest.raises(TypeError): f(tables(cfg(start=(0, 3), src=(0,))), None, 0, 1)
  with pytest.raises(IndexError): f(tables(cfg(start=(0, 1), src=(-1,))), None, 0, 1)
  with pytest.raises(TypeError): f(cfg(lazy=1), None, 0, 1)
  with pytest.raises(TypeError): f(cfg(reduced=[]), None, 0, 1)
  with pytest.raises(TypeError): f(cfg(plans=[None, None]), None, 0, 1)  # not one a row
  with pytest.raises(TypeError): f(cfg(plans=(None,)), None, 0, 1)
  with pytest.raises(TypeError): f(cfg(fields=(1, 2)), None, 0, 1)
  with pytest.raises(TypeError): f(cfg(fields=(1, 2, 3, 4, 5)), None, 0, 1)  # no descriptors
  # a row whose source is made by `lazy`: its error is raised, a non-node source is a TypeError from the dtype read
  def row(lazy, fields=None):  # row 1, an ADD of row 0, which is not made yet
    c = cfg(out=[None, None], op=(0, 1), start=(0, 0, 1), src=(0,), lazy=lazy, fields=fields)
    return tables(c[:2] + (i32([0, 0]), i32([0, 0])) + c[4:6] + (i32([0, 0]),) + c[7:])
  with pytest.raises(ZeroDivisionError): f(row(lazy=lambda j: 1 / 0), [1], 0, 1)
  with pytest.raises(AttributeError): f(row(lazy=lambda j: 7), [1], 0, 1)
  # descriptors of another class: the setter's own type check (a TypeError), never a crash
  class Other:
    __slots__ = ("op", "dtype", "src", "arg", "tag")
  other = tuple(Other.__dict__[k] for k in Other.__slots__)
  x = TUOp.const(2.5, tdtypes.float32)
  with pytest.raises(TypeError): f(row(lazy=lambda j: x, fields=other), [1], 0, 1)
  c = row(lambda j: x, pt_tables._tfields())
  assert f(c, [1], 0, 1) == 1 and c[0][1] is TUOp(TOps.ADD, tdtypes.float32, (x,))
  # planned rows (a permute, a reduce held, a permute of a held row): bad plans are TypeErrors, good ones make
  # tinygrad's own nodes
  def planned(*plans, held=None):
    c = row(lambda j: x, pt_tables._tfields())
    return c[:18] + ({} if held is None else held, [None, *plans])
  for bad in (1, (0,), (0, TOps.PERMUTE, None), (1, None, None), (2, TOps.PERMUTE, None), (3, 0, 0), ("a", 0, 0)):
    with pytest.raises(TypeError): f(planned(bad), [1], 0, 1)
  with pytest.raises(TypeError): f(planned((2, TOps.PERMUTE, None, (), (), ()), held={0: (x,)}), [1], 0, 1)
  c = planned((0, TOps.PERMUTE, (0,)))
  assert f(c, [1], 0, 1) == 1 and c[0][1] is TUOp(TOps.PERMUTE, tdtypes.float32, (x,), (0,))
  c = planned((0, TOps.PERMUTE, (0,)), held={0: (x, (), (), ())})  # a permute of a held row: left to Python
  assert f(c, [1], 0, 1) == 0 and c[0][1] is None
  sarg = (TOps.RESHAPE, TUOp.const(1, tdtypes.int32))  # a held row's reshape to its users' shape (a stand-in operand)
  c = planned((2, TOps.PERMUTE, None, (), (), ()) + sarg)  # a permute of a row not held: left to Python
  assert f(c, [1], 0, 1) == 0 and c[0][1] is None
  c = planned((1, TOps.PERMUTE, (0,), TOps.REDUCE, (TOps.ADD, 1), (), (1,), (0,)) + sarg)
  assert f(c, [1], 0, 1) == 1 and c[0][1] is None
  px = TUOp(TOps.PERMUTE, tdtypes.float32, (x,), (0,))
  assert c[18][1] == (TUOp(TOps.REDUCE, tdtypes.float32, (px,), (TOps.ADD, 1)), (), (1,), (0,))
  with pytest.raises(TypeError): f(planned((1, TOps.PERMUTE, (0,), TOps.REDUCE, (TOps.ADD, 1), (), (1,), (0,))), [1], 0,
                                   1)  # without the reshape to its users' shape
  c = planned((2, TOps.PERMUTE, (0,), (), (1,), (0,)) + sarg, held={0: (x, (), (), ())})
  assert f(c, [1], 0, 1) == 1 and c[0][1] is None and c[18][1] == (px, (), (1,), (0,))


@pytest.mark.parametrize("model", MODELS + ["W1", "W2"], ids=lambda f: getattr(f, "__name__", f))
def test_c_walk_of_the_way_in_converts_what_python_converts(model):
  """csrc/pywalk.c walks the tinygrad graph and makes the usual nodes' rows in C: the pygrad graph is the Python
  walk's, node for node (pygrad's hash-consing gives the same nodes), metadata included, whole graphs and the part
  above compute_gradient's targets."""
  import pygrad.interop.tinygrad_in as pin
  fast = pin._FWALK[0]
  if fast is None: pytest.skip("the pure-Python core has no C walk (the Python walk is what runs)")
  if isinstance(model, str): root, rg, targets = _bench_graph(model, 3)
  else:
    r, params = model()
    root, targets = r.uop, [p.uop for p in params]
    rg = root.const_like(1.0)
  calls = []

  def both(f):
    try:
      pin._FWALK[0] = lambda *a: calls.append(1) or fast(*a)
      c = f()
      pin._FWALK[0] = None
      return c, f()
    finally:
      pin._FWALK[0] = fast

  def nodes(cin):  # the table's rows as pygrad nodes, with their metadata
    return [(u, u.metadata) for u in (pygrad.UOp.sink(*cin.keep) if cin.keep else pygrad.UOp.sink()).toposort()]

  c, py = both(lambda: pt.from_tinygrad(root))
  assert c is py and [u.metadata for u in c.toposort()] == [u.metadata for u in py.toposort()]
  c, py = both(lambda: pt.convert_in(root, rg, targets))
  assert c[1:3] == py[1:3] and c[3] == py[3]
  assert nodes(c[0]) == nodes(py[0])
  assert calls


def test_c_walk_makes_reduces_buffers_and_opaque_sources_itself():
  """The C walk makes the rows of REDUCE and BUFFER nodes, and the opaque BUFFER of a source off every target path
  (a target itself), without the Python walk's per-node code; the result is the Python walk's (variables, whose
  BUFFER is a DEFINE_VAR, and weak constants go to Python)."""
  import pygrad.interop.tinygrad_in as pin
  fast = pin._FWALK[0]
  if fast is None: pytest.skip("the pure-Python core has no C walk")
  root, rg, targets = _bench_graph("W1", 4)
  ops = []
  node = pin._In._node
  try:
    pin._In._node = lambda self, u, vs: ops.append(u.op) or node(self, u, vs)
    pt.from_tinygrad(root)
    pt.convert_in(root, rg, targets)
  finally:
    pin._In._node = node
  assert not {TOps.REDUCE, TOps.BUFFER, TOps.RESHAPE} & set(ops), ops
  v = TUOp.variable("v", -3.0, 3.0, dtype=tdtypes.float)
  x = Tensor.empty(2, 3, device=DEV)
  y = ((x * Tensor(v)).sum(axis=1) + x.max(axis=1)).uop
  try:
    c = pt.from_tinygrad(y)
    pin._FWALK[0] = None
    py = pt.from_tinygrad(y)
  finally:
    pin._FWALK[0] = fast
  assert c is py and any(u.op is Ops.DEFINE_VAR for u in c.toposort())
  assert sum(u.op is Ops.REDUCE_AXIS for u in c.toposort()) == 2


def test_c_walk_makes_alu_ops_of_opaque_operands_and_detach_itself():
  """The C walk makes an elementwise op one of whose operands lies off every target path (that operand's opaque
  BUFFER made on the way, broadcast if need be) and a DETACH: W2's convert in leaves only the device-less constants
  to the Python walk; the graph is the Python walk's, whole graphs and compute_gradient's part."""
  import pygrad.interop.tinygrad_in as pin
  fast = pin._FWALK[0]
  if fast is None: pytest.skip("the pure-Python core has no C walk")
  root, rg, targets = _bench_graph("W2", 2)
  ops, node = [], pin._In._node
  try:
    pin._In._node = lambda self, u, vs: ops.append((u.op, [s.device for s in vs])) or node(self, u, vs)
    c_in = pt.convert_in(root, rg, targets)
  finally:
    pin._In._node = node
  assert ops and all(None in d for _, d in ops), ops  # a device-less (constant) operand: Python's
  x, g = Tensor.empty(2, 3, device=DEV), Tensor.empty(3, device=DEV)
  y = (x * g + g).detach().exp2() * (x + 1.0).contiguous()
  try:
    c = pt.from_tinygrad(y.uop), pt.convert_in(y.uop, y.uop.const_like(1.0), [x.uop])
    pin._FWALK[0] = None
    py = pt.from_tinygrad(y.uop), pt.convert_in(y.uop, y.uop.const_like(1.0), [x.uop])
    py_in = pt.convert_in(root, rg, targets)
  finally:
    pin._FWALK[0] = fast
  assert c[0] is py[0] and c[1][1] is py[1][1]
  assert {Ops.DETACH, Ops.CONTIGUOUS} <= {u.op for u in c[0].toposort()}
  assert c_in[1] is py_in[1] and list(c_in[3].values()) == list(py_in[3].values())


def test_c_walk_of_the_way_in_checks_its_arguments():
  """Bad arguments to the C walk are Python exceptions, never a crash."""
  import pygrad.interop.tinygrad_in as pin
  f = pin._FWALK[0]
  if f is None: pytest.skip("the pure-Python core has no C walk")
  cin = pin._In()
  x = Tensor.empty(2, device=DEV).uop
  cin._walk(x)  # the configuration made
  good = cin._wcfg
  with pytest.raises(TypeError): f(good)
  with pytest.raises(TypeError): f(good[:-1], x)
  ops = {good.index(o) for o in (TOps.PARAM, TOps.RESHAPE, TOps.PERMUTE, TOps.WHERE, TOps.REDUCE, TOps.BUFFER)}
  for i in range(len(good)):  # each other entry of the wrong kind
    if good[i] is None or i in ops: continue
    with pytest.raises(TypeError): f(good[:i] + (1,) + good[i + 1:], x * 2.0)
  f(good, x)  # converted already: nothing to do
  with pytest.raises(TypeError, match="tuple"):  # value sources must be a tuple
    f(good[:21] + (lambda u: [],) + good[22:], TUOp(TOps.SINK, src=(x * 3.0,)))


def test_nodes_are_made_without_init_only_where_init_just_sets_the_fields():
  """The C loop of the way out skips tinygrad's __init__ frame only for a class whose __init__ is the one dataclass
  generates for the five slots (tinygrad 0.14.0's UOp): any other __init__, a __post_init__ or __setattr__ of its
  own, and the class is called as before."""
  import dataclasses
  from pygrad.interop.tinygrad_tables import _tfields
  assert _tfields() is not None

  @dataclasses.dataclass(eq=False, slots=True)
  class A:
    op: int
    dtype: int = 0
    src: tuple = ()
    arg: object = None
    tag: object = None

  class B(A):
    __slots__ = ()
    def __init__(self, *a): super().__init__(*a)

  @dataclasses.dataclass(eq=False, slots=True)
  class C(A):
    def __post_init__(self): pass

  class D(A):
    __slots__ = ()
    def __setattr__(self, k, v): object.__setattr__(self, k, v)

  assert _tfields(A) == tuple(A.__dict__[k] for k in ("op", "dtype", "src", "arg", "tag"))
  assert _tfields(B) is None and _tfields(C) is None and _tfields(D) is None
