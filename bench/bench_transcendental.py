"""exp and the composites over it (sigmoid, tanh, softmax, log_softmax) on the C interpreter, and the MLP training
step, for this checkout against another one (--before TREE: e.g. main before a change, built in place), side by side:
one worker process per tree, kept alive, the trees alternating inside every repetition (which goes first alternates
too); figures are medians of per-call times. Also the graph sizes (forward and gradient nodes) of each workload.

  python bench/bench_transcendental.py --before TREE [--reps 15] [--threads 1]   (writes bench/results/transcendental.md)
"""
from __future__ import annotations
import argparse, json, os, platform, statistics, subprocess, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))
N = 4_000_000  # elements of the elementwise workloads
ROWS, COLS = 4096, 1024  # softmax rows


def _workloads():
  """{name: (call, forward nodes, gradient nodes)}, each call running one compiled program once."""
  import numpy as np
  from pygrad import UOp, dtypes
  from pygrad.engine.program import compile_program
  F32 = dtypes.float32
  rng = np.random.default_rng(0)
  out = {}
  a = UOp.placeholder((N,), F32, "a")
  A = (rng.standard_normal(N) * 10).astype(np.float32)
  M = UOp.placeholder((ROWS, COLS), F32, "m")
  MV = (rng.standard_normal((ROWS, COLS)) * 3).astype(np.float32)

  def add(name, y, x, X, grad=False):
    size = len(y.toposort())
    g, = y.sum().gradient(x)
    gsize = len(g.toposort())
    p = compile_program([g if grad else y], [x])
    out[name] = (lambda: p(X), size, gsize)
  add("exp, 4M f32", a.exp(), a, A)
  add("sigmoid, 4M f32", a.sigmoid(), a, A)
  add("tanh, 4M f32", a.tanh(), a, A)
  add("d/dx sigmoid(x).sum(), 4M f32", a.sigmoid(), a, A, grad=True)
  add("softmax(-1), 4096x1024 f32", M.softmax(-1), M, MV)
  add("log_softmax(-1), 4096x1024 f32", M.log_softmax(-1), M, MV)
  b, c = UOp.placeholder((N,), F32, "b"), UOp.placeholder((N,), F32, "c")
  B, C = rng.standard_normal(N).astype(np.float32), rng.standard_normal(N).astype(np.float32)
  e = (a * b + c).sin() * a.exp2() + b.abs().sqrt() / (c * c + 1) - a.maximum(b)  # bench_interp's expression
  pe = compile_program([e], [a, b, c])
  An = rng.standard_normal(N).astype(np.float32)
  out["bench_interp expression, 4M f32"] = (lambda: pe(An, B, C), len(e.toposort()), 0)
  # bench_interp's chain of 1,000 ops on 16x16 and its gradient (shared values: the planner's fusion of them)
  z = UOp.placeholder((16, 16), F32, "z")
  Z = rng.standard_normal((16, 16)).astype(np.float32)
  h = z
  steps = [lambda q: q * 1.0001, lambda q: q + 0.01, lambda q: q.sin(), lambda q: q.maximum(0.1)]
  for i in range(1000): h = steps[i % 4](h)
  add("1,000-op chain, 16x16 f32", h, z, Z)
  add("d/dz of the 1,000-op chain", h, z, Z, grad=True)
  from pygrad.bench_train import mlp_data, mlp_pygrad
  run = mlp_pygrad(*mlp_data(0))
  run()
  out["MLP 64-256-256-10 step, batch 128"] = (run, 0, 0)
  return out


def worker() -> None:
  """Serve timings over stdin/stdout: 'sizes' -> the graph sizes; 'time NAME K' -> seconds per call over K calls."""
  import pygrad
  print(json.dumps({"file": pygrad.__file__, "threads": pygrad.get_num_threads()}), flush=True)
  w = _workloads()
  for name, (fn, _, _) in w.items(): fn()  # warm
  print(json.dumps({k: [v[1], v[2]] for k, v in w.items()}), flush=True)
  for line in sys.stdin:
    name, k = json.loads(line)
    fn = w[name][0]
    t0 = time.perf_counter()
    for _ in range(k): fn()
    print(json.dumps((time.perf_counter() - t0) / k), flush=True)


def _spawn(tree: str, threads: int):
  env = dict(os.environ, PYGRAD_CORE="c", PYTHONPATH=tree, PYGRAD_NUM_THREADS=str(threads), OMP_NUM_THREADS="1")
  p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker"], stdin=subprocess.PIPE,
                       stdout=subprocess.PIPE, text=True, env=env, cwd=tree)
  info = json.loads(p.stdout.readline())
  if not os.path.abspath(info["file"]).startswith(os.path.abspath(tree) + os.sep):
    raise RuntimeError(f"the worker for {tree} imported {info['file']}")
  sizes = json.loads(p.stdout.readline())
  return p, sizes


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--before", required=True, help="the other checkout (built in place)")
  ap.add_argument("--reps", type=int, default=15, help="alternating repetitions (default 15)")
  ap.add_argument("--threads", type=int, default=1, help="VM threads of both workers (default 1)")
  ap.add_argument("--out", default=os.path.join(HERE, "results", "transcendental.md"))
  a = ap.parse_args(argv)
  trees = {"before": os.path.abspath(a.before), "after": os.path.dirname(HERE)}
  procs = {k: _spawn(t, a.threads) for k, t in trees.items()}
  names = list(procs["after"][1])
  times: dict = {(k, n): [] for k in trees for n in names}
  for rep in range(a.reps):
    order = ["before", "after"] if rep % 2 == 0 else ["after", "before"]
    for n in names:
      k_calls = 20 if n.startswith("MLP") or "chain" in n else 3
      for k in order:
        p = procs[k][0]
        p.stdin.write(json.dumps([n, k_calls]) + "\n")
        p.stdin.flush()
        times[(k, n)].append(json.loads(p.stdout.readline()))
  for p, _ in procs.values():
    p.stdin.close()
    p.wait()
  lines = [f"# exp and its composites, before/after ({platform.machine()}, {a.threads} VM thread(s), {a.reps} "
           "alternating reps, medians)", "",
           f"before: `{trees['before']}`; after: `{trees['after']}`; command: `python bench/bench_transcendental.py "
           f"{' '.join(argv if argv is not None else sys.argv[1:])}`", "",
           "| workload | before ms | after ms | after/before | nodes fwd before/after | gradient nodes before/after |",
           "|---|---|---|---|---|---|"]
  for n in names:
    mb, ma = statistics.median(times[("before", n)]) * 1e3, statistics.median(times[("after", n)]) * 1e3
    sb, sa = procs["before"][1].get(n, [0, 0]), procs["after"][1][n]
    lines.append(f"| {n} | {mb:.3f} | {ma:.3f} | {ma / mb:.2f}x | {sb[0]}/{sa[0]} | {sb[1]}/{sa[1]} |")
  text = "\n".join(lines) + "\n"
  print(text)
  os.makedirs(os.path.dirname(a.out), exist_ok=True)
  with open(a.out, "w") as f: f.write(text)
  return 0


if __name__ == "__main__":
  if "--worker" in sys.argv: worker()
  else: sys.exit(main())
