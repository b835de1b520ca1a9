"""The gradient of `x.sin()` applied N times to a `()` float32 input on the C engine: graph build, `gradient`,
`pygrad.compile` and two calls, timed, with the process's peak RSS after each phase (issue 10 item 1: a 1,000,000-
deep chain's gradient must compile and run; it is one fused group holding N live values). The value is checked
against the product of cosines computed in float64.

  python bench/bench_deep_chain.py [--depth 1000000] [--regfile-budget BYTES]

--regfile-budget sets pygrad.engine.lower.REGFILE_BUDGET, the register file past which a kernel is split into
kernels that pass values through arena buffers (at 16777216 the 1M chain's 80 MB of registers split into 9).
"""
from __future__ import annotations
import argparse, math, os, resource, sys, time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _rss_mb() -> float: return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--depth", type=int, default=1_000_000)
  ap.add_argument("--regfile-budget", type=int, default=None)
  a = ap.parse_args(argv)
  import numpy as np
  import pygrad
  from pygrad import UOp, dtypes
  from pygrad.engine import lower
  if a.regfile_budget is not None: lower.REGFILE_BUDGET = a.regfile_budget
  t0 = time.perf_counter()
  x = UOp.placeholder((), dtypes.float32, "x")
  y = x
  for _ in range(a.depth): y = y.sin()
  t1 = time.perf_counter()
  (g,) = y.gradient(x)
  t2 = time.perf_counter()
  print(f"core {pygrad.core_name()}, depth {a.depth:,}: build {t1 - t0:.1f} s, gradient {t2 - t1:.1f} s, "
        f"peak RSS {_rss_mb():,.0f} MB", flush=True)
  p = pygrad.compile(g, [x])
  t3 = time.perf_counter()
  print(f"compile {t3 - t2:.1f} s ({(t3 - t2) / len(g.toposort()) * 1e6:.1f} us/node), {p.stats}, "
        f"peak RSS {_rss_mb():,.0f} MB", flush=True)
  v = p(np.float32(0.5))
  t4 = time.perf_counter()
  p(np.float32(0.5))
  t5 = time.perf_counter()
  s, want = 0.5, 1.0
  for _ in range(a.depth): want, s = want * math.cos(s), math.sin(s)
  print(f"run {t4 - t3:.2f} s, again {t5 - t4:.2f} s; d/dx = {float(v):.6g} (float64 reference {want:.6g}); "
        f"peak RSS {_rss_mb():,.0f} MB")
  return 0


if __name__ == "__main__":
  sys.exit(main())
