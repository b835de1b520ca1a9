"""pygrad's contraction against OpenBLAS (numpy's `@`) at the same thread count: numpy under
threadpoolctl.threadpool_limits(n) and pygrad.set_num_threads(n), n = 1 and all cores, alternating inside every
repetition; figures are medians. At more than one thread each engine is timed after the other's threads
have gone idle (see _timed). The shapes of the training issue (n x k x m: C[n, m] = A[n, k] B[k, m]), float32,
plus the backward's transposed operands (x.T @ g, g @ w.T, read without a copy) and float64.

  env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/bench_matmul.py [--reps N]
(where OPENBLAS_CORETYPE is set for old OpenBLAS builds it slows a current numpy: unset both in this command only).
Writes bench/results/matmul.md; the OpenBLAS kernel that ran (threadpoolctl) is in the header."""
import argparse, os, platform, statistics, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))
# this checkout's pygrad, not whichever one is installed (an editable install of another worktree would be timed)
if os.path.isdir(os.path.join(os.path.dirname(HERE), "pygrad")): sys.path.insert(0, os.path.dirname(HERE))

import numpy as np  # noqa: E402
from threadpoolctl import threadpool_info, threadpool_limits  # noqa: E402
import pygrad  # noqa: E402
from pygrad import UOp, dtypes  # noqa: E402
from pygrad.engine import vmlib  # noqa: E402

TARGET = [(128, 64, 256), (128, 256, 256), (256, 128, 256), (128, 256, 10), (128, 256, 64), (384, 384, 384),
          (1024, 1024, 1024)]


def cases():
  """(label, pygrad graph maker, numpy fn maker, flops, is a target shape)"""
  out = []
  for n, k, m in TARGET:
    out.append((f"{n}x{k}x{m} f32", (n, k, m), "nn", np.float32, True))
  out.append(("x.T @ g: 256x128x256 f32 (A transposed)", (256, 128, 256), "tn", np.float32, False))
  out.append(("g @ w.T: 128x256x256 f32 (B transposed)", (128, 256, 256), "nt", np.float32, False))
  out.append(("384x384x384 f64", (384, 384, 384), "nn", np.float64, False))
  return out


def build(shape, form, npdt, rng):
  n, k, m = shape
  dt = dtypes.float32 if npdt == np.float32 else dtypes.float64
  ash = (k, n) if form == "tn" else (n, k)
  bsh = (m, k) if form == "nt" else (k, m)
  a, b = UOp.placeholder(ash, dt, "a"), UOp.placeholder(bsh, dt, "b")
  ea = a.T if form == "tn" else a
  eb = b.T if form == "nt" else b
  prog = pygrad.compile([ea @ eb], [a, b])
  A, B = rng.standard_normal(ash).astype(npdt), rng.standard_normal(bsh).astype(npdt)
  nA = A.T if form == "tn" else A
  nB = B.T if form == "nt" else B
  return (lambda: prog(A, B)), (lambda: nA @ nB)


SETTLE_S = 0.15  # OpenBLAS's idle threads spin ~0.1 s after a call (pygrad's pool < 1 ms): wait that out
WARM_S, BLOCK_S = 0.01, 0.01


def _timed(f, nt: int) -> float:
  """Seconds per call of f, with the other engine's threads idle: at more than one thread the engine that ran last
  would otherwise spin on the second core through this one's run (an OpenBLAS call left pygrad's 2-thread 1024^3
  product as slow as its 1-thread one). After that pause the first calls run up to 2x slow (caches and clocks
  cold, on either engine), so f first runs untimed for WARM_S, then a block of at least BLOCK_S is timed."""
  if nt > 1: time.sleep(SETTLE_S)
  s = time.perf_counter()
  calls = 0
  while calls < 2 or time.perf_counter() - s < WARM_S:
    f()
    calls += 1
  k = max(1, int(BLOCK_S * calls / (time.perf_counter() - s)))
  s = time.perf_counter()
  for _ in range(k): f()
  return (time.perf_counter() - s) / k


def main(argv=None):
  ap = argparse.ArgumentParser(prog="bench_matmul.py")
  ap.add_argument("--reps", type=int, default=31)
  ap.add_argument("--out", default=os.path.join(HERE, "results"))
  a = ap.parse_args(argv)
  nall = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
  rng = np.random.default_rng(0)
  blas = [i for i in threadpool_info() if i.get("internal_api") in ("openblas", "mkl", "blis")]
  kern = ", ".join(f"{i['internal_api']} {i.get('version')} kernel {i.get('architecture')}" for i in blas) or "?"
  rows, verdicts = [], []
  load0 = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
  print(f"pygrad from {os.path.dirname(pygrad.__file__)}", file=sys.stderr)
  for label, shape, form, npdt, target in cases():
    pg, npf = build(shape, form, npdt, rng)
    flops = 2 * shape[0] * shape[1] * shape[2]
    reps = max(5, a.reps // 4) if flops > 1e9 else a.reps
    res = {}
    for nt in sorted({1, nall}):
      pygrad.set_num_threads(nt)
      with threadpool_limits(nt):
        for f in (pg, npf): f()
        t = {"pg": [], "np": []}
        for _ in range(reps):
          for key, f in (("pg", pg), ("np", npf)):
            t[key].append(_timed(f, nt))
      res[nt] = {k: statistics.median(v) for k, v in t.items()}
    for nt, r in res.items():
      ratio = r["np"] / r["pg"]
      # a second thread never makes a product 1.5x slower on an idle core: then that engine waited for a core that
      # another process held (OpenBLAS's stalls reach 100x), and the row says so instead of a verdict
      slow = [k for k in ("pg", "np") if nt > 1 and r[k] > 1.5 * res[1][k]]
      void = bool(slow)
      verdict = ("PASS" if ratio >= 0.9 else "MISS") if target else "-"
      if void: verdict = f"void ({' and '.join({'pg': 'pygrad', 'np': 'numpy'}[k] for k in slow)} starved)"
      rows.append(f"| {label} | {nt} | {r['pg'] * 1e6:.0f} | {r['np'] * 1e6:.0f} | {flops / r['pg'] / 1e9:.1f} | "
                  f"{flops / r['np'] / 1e9:.1f} | {ratio:.2f}x | {verdict} |")
      if target and not void: verdicts.append(ratio >= 0.9)
    print(rows[-2] if len(res) > 1 else "", rows[-1], sep="\n", flush=True)
  pygrad.set_num_threads(nall)
  load1 = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
  env = {k: os.environ[k] for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE") if k in os.environ}
  text = (f"# Matmul against OpenBLAS\n\n`env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/bench_matmul.py "
          f"--reps {a.reps}` on {platform.machine()} ({nall} usable CPUs), VM ISA `{vmlib.isa_name()}`, numpy "
          f"{np.__version__} with {kern}" + (f" (environment still sets {env})" if env else "") +
          f". Medians of alternating runs; the target is >= 0.9x OpenBLAS at the same thread count on the issue's "
          f"shapes ({sum(verdicts)} of {len(verdicts)} measured pass; rows marked void ran while an engine's threads "
          f"waited for a core). Load average {load0:.1f} at the start, {load1:.1f} at the end.\n\n"
          "| n x k x m | threads | pygrad us | numpy us | pygrad GFLOP/s | numpy GFLOP/s | pygrad vs numpy | target |\n"
          "|---|---:|---:|---:|---:|---:|---:|---|\n" + "\n".join(rows) + "\n")
  print(text)
  os.makedirs(a.out, exist_ok=True)
  with open(os.path.join(a.out, "matmul.md"), "w") as f: f.write(text)
  return 0


if __name__ == "__main__":
  sys.exit(main())
