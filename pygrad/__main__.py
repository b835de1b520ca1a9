"""pygrad's command line: `python -m pygrad demo` (the main job: build a model graph, walk it, derive its gradients
on both cores, check them, evaluate them) and `python -m pygrad bench` (the gradient benchmark suite)."""
from __future__ import annotations
import argparse, os, subprocess, sys, time

MODEL = "y = (y @ w).relu().exp2().sin() + y"


def _mlp(depth: int, n: int, dtype=None):
  """The residual MLP chain: (loss, x, ws), loss = sum(y) after `depth` layers of MODEL over n x n inputs."""
  from pygrad import UOp, dtypes
  dt = dtype or dtypes.float32
  x = UOp.placeholder((n, n), dt, name="x")
  ws = [UOp.placeholder((n, n), dt, name=f"w{i}") for i in range(depth)]
  y = x
  for w in ws: y = (y @ w).relu().exp2().sin() + y
  return y.sum(), x, ws


def _ms(s: float) -> str:
  return f"{s * 1e6:.0f} us" if s < 1e-3 else f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.2f} s"


def _derive(depth: int, n: int) -> tuple[float, float, int]:
  """(first derivation s, second derivation s, nodes of the gradient graph) on this process's core."""
  from pygrad import UOp
  loss, x, ws = _mlp(depth, n)
  t = time.perf_counter()
  grads = loss.gradient(x, *ws)
  first = time.perf_counter() - t
  made = len(UOp.sink(*grads).toposort())
  del grads
  t = time.perf_counter()
  grads = loss.gradient(x, *ws)
  return first, time.perf_counter() - t, made


def _other_core(depth: int, n: int, other: str):
  """The derivation times on the other core, from a subprocess (the core is chosen at import)."""
  env = dict(os.environ, PYGRAD_CORE=other)
  here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env["PYTHONPATH"] = here + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
  p = subprocess.run([sys.executable, "-m", "pygrad", "demo", "--derive-only", "--depth", str(depth), "--size", str(n)],
                     env=env, capture_output=True, text=True, timeout=600)
  for line in p.stdout.splitlines():
    if line.startswith("DERIVE "):
      a, b, m = line.split()[1:]
      return float(a), float(b), int(m)
  return (p.stderr.strip().splitlines() or [f"exit code {p.returncode}"])[-1]


def _fd_check(depth: int = 3, n: int = 4, entries: int = 4, seed: int = 0) -> tuple[float, int]:
  """Max relative error of the symbolic gradients against central finite differences (float64, numpy engine)."""
  import numpy as np
  import pygrad
  from pygrad import dtypes
  loss, x, ws = _mlp(depth, n, dtypes.float64)
  targets = [x, *ws]
  grads = loss.gradient(*targets)
  rng = np.random.default_rng(seed)
  vals = {t: rng.normal(0, 0.5 if t is x else 0.3, (n, n)) for t in targets}
  gv = pygrad.evaluate(grads, vals, engine="numpy")
  worst, checked, eps = 0.0, 0, 1e-6
  for t, g in zip(targets, gv):
    for _ in range(entries):
      i, j = rng.integers(n), rng.integers(n)
      plus, minus = dict(vals), dict(vals)
      plus[t], minus[t] = vals[t].copy(), vals[t].copy()
      plus[t][i, j] += eps
      minus[t][i, j] -= eps
      fd = (float(pygrad.evaluate(loss, plus, engine="numpy")) - float(pygrad.evaluate(loss, minus, engine="numpy")))
      fd /= 2 * eps
      worst = max(worst, abs(fd - g[i, j]) / max(1.0, abs(fd)))
      checked += 1
  return worst, checked


def demo(argv) -> int:
  ap = argparse.ArgumentParser(prog="python -m pygrad demo", description="Build, walk, differentiate, check and "
                               f"evaluate the residual MLP chain {MODEL}.")
  ap.add_argument("--depth", type=int, default=200)
  ap.add_argument("--size", type=int, default=16)
  ap.add_argument("--derive-only", action="store_true", help=argparse.SUPPRESS)
  a = ap.parse_args(argv)
  if a.derive_only:
    first, again, made = _derive(a.depth, a.size)
    print(f"DERIVE {first} {again} {made}")
    return 0
  import numpy as np
  import pygrad
  from pygrad.core import CORE
  t_start = time.perf_counter()
  core = pygrad.core_name()
  print(f"pygrad {pygrad.__version__} demo, {core} core")
  print(f"model: {MODEL}, {a.size}x{a.size}, depth {a.depth}, loss = y.sum()")
  t = time.perf_counter()
  loss, x, ws = _mlp(a.depth, a.size)
  t_build = time.perf_counter() - t
  t = time.perf_counter()
  nodes = len(loss.toposort())
  t_topo = time.perf_counter() - t
  t = time.perf_counter()
  walk, path = CORE.deepwalk(loss._id, [u._id for u in (x, *ws)])
  t_walk = time.perf_counter() - t
  print(f"graph: {nodes} nodes, built in {_ms(t_build)} ({t_build / nodes * 1e6:.2f} us/node)")
  print(f"toposort: {_ms(t_topo)} ({t_topo / nodes * 1e9:.0f} ns/node); deepwalk: {_ms(t_walk)} "
        f"({len(walk)} nodes on the target path)")

  first, again, made = _derive(a.depth, a.size)
  print(f"gradients of x and {a.depth} weights, {core} core: derived in {_ms(first)} (gradient graph {made} nodes); "
        f"again {_ms(again)}")
  other = "python" if core == "c" else "c"
  res = _other_core(a.depth, a.size, other)
  if isinstance(res, str):
    print(f"gradients, {other} core: not run ({res})")
  else:
    ratio = res[0] / first if core == "c" else first / res[0]
    print(f"gradients, {other} core (subprocess): derived in {_ms(res[0])} (gradient graph {res[2]} nodes); again "
          f"{_ms(res[1])}; C core {ratio:.1f}x faster")

  worst, checked = _fd_check()
  ok = worst < 1e-5
  print(f"finite differences (depth 3, 4x4, float64, numpy engine): {checked} entries, max relative error "
        f"{worst:.1e}: {'ok' if ok else 'FAILED'}")

  grads = loss.gradient(x, *ws)
  rng = np.random.default_rng(1)
  vals = {x: rng.normal(0, 0.5, (a.size, a.size)).astype(np.float32)}
  vals.update({w: rng.normal(0, 0.002, (a.size, a.size)).astype(np.float32) for w in ws})
  from pygrad.engine import default_engine
  engine = default_engine()
  t = time.perf_counter()
  try:
    out = pygrad.evaluate([loss, grads[0]], vals, engine=engine)
  except Exception as e:  # the C interpreter is young: show the failure, then the reference evaluator's answer
    print(f"evaluate ({engine} engine) failed: {type(e).__name__}: {e}")
    engine = "numpy"
    t = time.perf_counter()
    out = pygrad.evaluate([loss, grads[0]], vals, engine=engine)
  t_eval = time.perf_counter() - t
  print(f"evaluate ({engine} engine, x ~ N(0, 0.5), w ~ N(0, 0.002)): loss = {float(out[0]):.6g}, "
        f"|d loss/dx| = {float(np.linalg.norm(out[1])):.6g} in {_ms(t_eval)}")
  if engine != "numpy":
    ref = pygrad.evaluate([loss, grads[0]], vals, engine="numpy")
    diff = max(float(np.max(np.abs(np.asarray(o, np.float64) - r) / (1 + np.abs(r)))) for o, r in zip(out, ref))
    print(f"numpy reference evaluator agrees: max relative difference {diff:.1e}")
  print(f"done in {time.perf_counter() - t_start:.1f} s")
  return 0 if ok else 1


def viz(argv) -> int:
  """Draw the demo model and its gradient with Graphviz (pygrad.viz.render)."""
  ap = argparse.ArgumentParser(prog="python -m pygrad viz", description="Draw the demo model (" + MODEL + ") and "
                               "its gradient with Graphviz's dot; the picture's format follows --out's extension.")
  ap.add_argument("--depth", type=int, default=2, help="layers of the model (default 2)")
  ap.add_argument("--size", type=int, default=16, help="n of the n x n inputs (default 16)")
  ap.add_argument("--budget", type=int, default=300, help="nodes drawn before repeated kinds are counted (300)")
  ap.add_argument("--out", default="pygrad_viz.svg", help="picture file: .svg, .png or .pdf (default pygrad_viz.svg)")
  a = ap.parse_args(argv)
  if a.depth < 1 or a.size < 1 or a.budget < 1: ap.error("--depth, --size and --budget must be positive")
  from pygrad import metadata, viz as _viz
  with metadata("model"):
    loss, x, ws = _mlp(a.depth, a.size)
  grads = loss.gradient(x, *ws)
  n = len(loss.toposort()), len(__import__("pygrad").UOp.sink(*grads).toposort())
  title = f"{MODEL}, depth {a.depth}: loss ({n[0]} nodes) and its gradient ({n[1]} nodes)"
  print(_viz.render([loss, *grads], a.out, a.budget, title))
  return 0


def main(argv=None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  cmds = {"demo": "build, walk, differentiate, check and evaluate a model graph",
          "bench": "the gradient benchmark suite against the pure core, tinygrad and JAX (--quick, --only W1)",
          "train": "train an MLP on scikit-learn's digits with one compiled SGD step (--steps, --plot FILE.png)",
          "viz": "draw the demo model and its gradient with Graphviz (--depth N, --out FILE)"}
  usage = "usage: python -m pygrad {" + ",".join(cmds) + "} [options] | --version\n\n" + \
          "\n".join(f"  {k:6} {v}" for k, v in cmds.items())
  if argv[:1] == ["--version"]:
    import pygrad
    print(f"pygrad {pygrad.__version__} ({pygrad.core_name()} core)")
    return 0
  if not argv or argv[0] in ("-h", "--help"):
    print(usage)
    return 0
  if argv[0] not in cmds:  # what went wrong first, on stderr, as argparse does
    print(f"{usage}\n\npython -m pygrad: error: unknown command {argv[0]!r} (choose from {', '.join(cmds)})",
          file=sys.stderr)
    return 2
  if argv[0] == "demo": return demo(argv[1:])
  if argv[0] == "viz": return viz(argv[1:])
  if argv[0] == "train":
    from .train import main as train_main
    return train_main(argv[1:])
  from .bench import main as bench_main
  return bench_main(argv[1:])


if __name__ == "__main__":
  sys.exit(main())
