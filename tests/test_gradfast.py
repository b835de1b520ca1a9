"""The template path of compute_gradient (C core) builds exactly the nodes the direct path builds, and both cores
build the same gradient graphs."""
from __future__ import annotations
import json, os, subprocess, sys
import numpy as np
import pytest
import pygrad
from pygrad import UOp, Ops, dtypes
from pygrad.gradient import compute_gradient_direct
from test_gradient import CASES

on_c = pytest.mark.skipif(pygrad.core_name() != "c", reason="the template path is the C core's")


def _same(root: UOp, targets) -> None:
  from pygrad.gradient import compute_gradient as compute_gradient_fast
  seed = root.const_like(1.0)
  direct = compute_gradient_direct(root, seed, targets)
  fast = compute_gradient_fast(root, seed, targets)
  assert type(fast).__name__ == "GradMap"  # the C driver ran
  assert len(fast) == len(direct)
  for k, v in direct.items():
    assert fast[k] is v, f"gradient of {k.op.name} differs"


@on_c
@pytest.mark.parametrize("name,fn,tfn,shapes,dom", CASES, ids=[c[0] for c in CASES])
def test_every_rule_same_nodes(name, fn, tfn, shapes, dom):
  bufs = [UOp.placeholder(s, dtypes.float64) for s in shapes]
  out = fn(*bufs)
  _same((out * out).sum(), bufs)


def _random_graph(rng, n_ops: int):
  xs = [UOp.placeholder((4, 6), dtypes.float32) for _ in range(3)]
  pool = list(xs)
  for _ in range(n_ops):
    a, b = pool[rng.integers(len(pool))], pool[rng.integers(len(pool))]
    k = rng.integers(12)
    if k == 0: y = a + b
    elif k == 1: y = a * b
    elif k == 2: y = a.maximum(b)
    elif k == 3: y = (a < b).where(a, b * 2)
    elif k == 4: y = a.sin()
    elif k == 5: y = (a * a + 1).sqrt()
    elif k == 6: y = a.exp2() * 0.1
    elif k == 7: y = a.sum(1, keepdim=True).expand(4, 6)
    elif k == 8: y = a.max(0, keepdim=True).expand(4, 6) - b
    elif k == 9: y = a.permute(1, 0).reshape(4, 6)
    elif k == 10: y = a.pad(((1, 0), (0, 2))).shrink(((0, 4), (2, 8)))
    else: y = a.flip(1).contiguous() / (b * b + 1)
    pool.append(y)
  return sum(pool[-5:], pool[0]).sum(), xs


@on_c
@pytest.mark.parametrize("seed", range(12))
def test_random_graphs_same_nodes(seed):
  root, xs = _random_graph(np.random.default_rng(seed), 40)
  _same(root, xs)


@on_c
def test_fast_path_through_functions_and_metadata():
  x, w = UOp.placeholder((3, 4)), UOp.placeholder((4, 4))
  body = UOp.maketuple((x.param_like(0) @ w.param_like(1)).relu())
  f = body.call(x, w, name="f")
  with pygrad.metadata("outer"):
    y = f.gettuple(0).sin()
  _same((y * y).sum(), [x, w])


def _metadata_model(depth: int = 3):
  """A small MLP-like graph whose nodes carry metadata: two named blocks per layer, explicit callers (so that two
  builds carry equal metadata), and shared constants; each call makes new placeholders, so new nodes."""
  x, w = UOp.placeholder((4, 6), dtypes.float32, name="x"), UOp.placeholder((6, 6), dtypes.float32, name="w")
  y = x
  for i in range(depth):
    with pygrad.metadata("matmul", caller=f"layer{i}"):
      z = y @ w
    with pygrad.metadata("act", caller=f"layer{i}"):
      y = (z.relu() * 0.5 + z.sin()).exp2() + y
  with pygrad.metadata("loss", caller="end"):
    loss = (y * y).mean()
  return loss, [x, w]


def _canon(roots):
  """Op, dtype, shape, arg (placeholders by position), sources by position and metadata of every node."""
  order = list(UOp.sink(*roots).toposort())
  idx = {u: i for i, u in enumerate(order)}
  return [(u.op, u.dtype, u.shape, None if u.op is Ops.BUFFER else repr(u.arg), tuple(idx[s] for s in u.src),
           u.metadata) for u in order]


def test_metadata_carried_to_gradient_nodes_as_the_direct_driver_does():
  from pygrad.gradient import compute_gradient
  loss_d, ts_d = _metadata_model()
  loss_f, ts_f = _metadata_model()
  direct = compute_gradient_direct(loss_d, loss_d.const_like(1.0), ts_d)
  fast = compute_gradient(loss_f, loss_f.const_like(1.0), ts_f)
  if pygrad.core_name() == "c": assert type(fast).__name__ == "GradMap"  # the C driver ran, metadata and all
  gd, gf = [direct[t] for t in ts_d], [fast[t] for t in ts_f]
  assert _canon(gd) == _canon(gf)
  # what the seeds do: a rule's new nodes get the forward node's metadata marked backward, added to their own
  # (names of this model only: a constant shared with a graph another test module keeps alive carries that
  # graph's metadata, hash-consing gives it to whoever builds the same node, and the rules pass it on as well)
  bw = {(m.name, m.caller) for u in UOp.sink(*gf).toposort() for m in u.metadata
        if m.backward and m.name in ("matmul", "act", "loss")}
  assert bw == {(n, f"layer{i}") for n in ("matmul", "act") for i in range(3)} | {("loss", "end")}
  assert not any(m.backward for t in ts_f for m in t.metadata)


@on_c
def test_metadata_graph_runs_each_rule_once_per_signature(monkeypatch):
  # nodes with metadata were Python steps (every rule run on every node, ~100x slower): now the C driver
  # instantiates their templates and carries the metadata itself
  import pygrad.gradient as G

  class Counting:
    def __init__(self, pm): self.pm, self.calls = pm, 0

    def rewrite(self, u, ctx=None):
      self.calls += 1
      return self.pm.rewrite(u, ctx=ctx)

  counting = Counting(G.pm_gradient)
  monkeypatch.setattr(G, "pm_gradient", counting)
  x = UOp.placeholder((8,), dtypes.float32)
  y = x
  with pygrad.metadata("chain"):
    for _ in range(200): y = y.sin()
  loss = y.sum()
  (g,) = loss.gradient(x)
  assert counting.calls < 10, counting.calls
  assert sum(1 for u in g.toposort() if any(m.backward and m.name == "chain" for m in u.metadata)) > 400
  counting.calls = 0
  assert compute_gradient_direct(loss, loss.const_like(1.0), [x])[x] is g and counting.calls > 200


def _canonical_script() -> str:
  return r'''
import json, pygrad
from pygrad import UOp, dtypes
x = UOp.placeholder((4, 4), dtypes.float32, name="x"); w = UOp.placeholder((4, 4), dtypes.float32, name="w")
y = x
for _ in range(3): y = (y @ w).relu().exp2().sin() + y
loss = y.softmax().log().sum()
gx, gw = loss.gradient(x, w)
(h,) = gx.sum().gradient(w)
def canon(root):
  order = list(root.toposort()); idx = {u: i for i, u in enumerate(order)}
  def arg(u):
    if u.op.name == "BUFFER": return ["BUFFER", u.arg[3]]
    return repr(u.arg)
  return [[u.op.name, u.dtype.name, list(u.shape), arg(u), [idx[s] for s in u.src]] for u in order]
print(json.dumps([pygrad.core_name(), canon(gx), canon(gw), canon(h)]))
'''


def _metadata_script() -> str:
  return r'''
import json, pygrad
from pygrad import UOp, dtypes
x = UOp.placeholder((4, 4), dtypes.float32, name="x"); w = UOp.placeholder((4, 4), dtypes.float32, name="w")
y = x
for i in range(3):
  with pygrad.metadata("mm", caller=f"l{i}"): z = y @ w
  with pygrad.metadata("act", caller=f"l{i}"): y = (z.relu() + z.sin()).exp2() * 0.5 + y
with pygrad.metadata("loss", caller="end"): loss = y.softmax().log().sum()
gx, gw = loss.gradient(x, w)
order = list(UOp.sink(gx, gw).toposort()); idx = {u: i for i, u in enumerate(order)}
print(json.dumps([pygrad.core_name(), [[u.op.name, [idx[s] for s in u.src], [[m.name, m.caller, m.backward]
                  for m in u.metadata]] for u in order]]))
'''


def _on_both_cores(tmp_path, script: str) -> dict:
  try:
    import pygrad._core  # noqa: F401
  except ImportError:
    pytest.fail("the C core is not built; this test compares the two cores")
  outs = {}
  for core in ("python", "c"):
    # the subprocess imports the pygrad this process tests (python -c puts its working folder first)
    pkg_dir = os.path.dirname(os.path.dirname(os.path.abspath(pygrad.__file__)))
    path = os.pathsep.join([pkg_dir] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))
    env = {**os.environ, "PYGRAD_CORE": core, "PYTHONPATH": path}
    r = subprocess.run([sys.executable, "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    name, *graphs = json.loads(r.stdout)
    assert name == core
    outs[core] = graphs
  return outs


def test_both_cores_carry_the_same_metadata_to_gradients(tmp_path):
  outs = _on_both_cores(tmp_path, _metadata_script())
  assert outs["python"] == outs["c"]
  (nodes,) = outs["c"]
  assert sum(1 for _, _, md in nodes if any(b for _, _, b in md)) > 20  # backward metadata on many nodes


def test_both_cores_build_identical_gradient_graphs(tmp_path):
  outs = _on_both_cores(tmp_path, _canonical_script())
  assert outs["python"] == outs["c"]
  assert all(len(g) > 20 for g in outs["c"])
  assert Ops.BUFFER.name in json.dumps(outs["c"])
