"""Elementwise math on the C VM: x ** y (float32, float64), sin and cos (float32, float64) over 4M elements, one
thread and all threads. With --trees A B the same timings are taken in two source trees (each a worktree with its
own built module, e.g. main and a branch), alternating the trees inside every repetition in fresh interpreters, so a
change is measured side by side under the same load; figures are medians over the repetitions.
Run: python bench/bench_math.py [--reps N] [--trees OLD NEW]"""
from __future__ import annotations
import argparse, json, os, statistics, subprocess, sys, time

N = 1 << 22
CASES = ["pow_f32", "pow_f64", "sin_f32", "cos_f32", "sin_f64", "cos_f64"]


def _worker(threads: int, inner: int) -> dict:
  import numpy as np
  import pygrad
  from pygrad import UOp, dtypes
  pygrad.set_num_threads(threads)
  rng = np.random.default_rng(0)
  out = {}
  for case in CASES:
    op, dt = case.split("_")
    dt = dtypes.float32 if dt == "f32" else dtypes.float64
    x, y = UOp.placeholder((N,), dt), UOp.placeholder((N,), dt)
    if op == "pow":
      xv, yv = rng.uniform(0.01, 100, N).astype(dt.np), rng.uniform(-8, 8, N).astype(dt.np)
      prog, args = pygrad.compile([x ** y], [x, y]), (xv, yv)
    else:
      xv = rng.uniform(-100, 100, N).astype(dt.np)
      prog, args = pygrad.compile([x.sin() if op == "sin" else x.cos()], [x]), (xv,)
    prog(*args)
    ts = []
    for _ in range(inner):
      t = time.perf_counter()
      prog(*args)
      ts.append(time.perf_counter() - t)
    out[case] = min(ts)
  return out


def main() -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument("--reps", type=int, default=5)
  ap.add_argument("--trees", nargs=2, metavar=("OLD", "NEW"))
  ap.add_argument("--worker", type=int, help=argparse.SUPPRESS)
  a = ap.parse_args()
  if a.worker is not None:
    print(json.dumps(_worker(a.worker, 3)))
    return
  trees = a.trees or [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
  threads = [1, os.cpu_count() or 1]
  res: dict = {(t, n): {c: [] for c in CASES} for t in trees for n in threads}
  for _ in range(a.reps):
    for n in threads:
      for t in trees:
        env = dict(os.environ, PYTHONPATH=t, PYGRAD_CORE="c")
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", str(n)], cwd=t, env=env,
                           capture_output=True, text=True, check=True)
        for c, v in json.loads(r.stdout.strip().splitlines()[-1]).items(): res[(t, n)][c].append(v)
  print(f"median ms over {a.reps} reps (each the best of 3 runs), {N} elements")
  print("case      threads  " + "  ".join(f"{os.path.basename(t.rstrip('/')):>12}" for t in trees)
        + ("  new/old" if len(trees) == 2 else ""))
  for n in threads:
    for c in CASES:
      m = [statistics.median(res[(t, n)][c]) * 1e3 for t in trees]
      print(f"{c:9} {n:7}  " + "  ".join(f"{v:12.2f}" for v in m) + (f"  {m[1] / m[0]:7.2f}" if len(m) == 2 else ""))


if __name__ == "__main__":
  main()
