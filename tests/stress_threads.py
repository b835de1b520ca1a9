"""A stress run of the VM's thread pool (csrc/vm_pool.c), not a test: the MLP and W2 training steps of
bench/bench_train.py on pygrad at 1 and 2 threads, alternating with torch's (whose OpenMP threads spin after each
op and preempt the pool's workers at odd points), for a given number of seconds. Under AddressSanitizer it found
a worker running one job's loop task on the next job's contraction (a ticket swap that succeeded between jobs):

  PYGRAD_SANITIZE=1 python setup.py build_ext --inplace
  ASAN_OPTIONS=detect_leaks=0 LD_PRELOAD=$(gcc -print-file-name=libasan.so) python tests/stress_threads.py 400

(the real interpreter, not a pyenv shim, for LD_PRELOAD). It prints the iterations run; a failure is a crash or an
ASan report. torch is optional: without it the pool is stressed alone."""
from __future__ import annotations
import sys, time
import pygrad
from pygrad import bench_train as bt

try:
  import torch
except ImportError:
  torch = None


def main(seconds: float) -> int:
  x, y, params = bt.mlp_data()
  xw, pw = bt.w2_data()
  runs = [bt.mlp_pygrad(x, y, params), bt.w2_pygrad(xw, pw)]
  if torch is not None: runs += [bt.mlp_torch(x, y, params), bt.w2_torch(xw, pw)]
  t0, it = time.time(), 0
  while time.time() - t0 < seconds:
    for th in (1, 2):
      pygrad.set_num_threads(th)
      if torch is not None: torch.set_num_threads(th)
      for r in runs:
        for _ in range(10): r()
    it += 1
  print(f"{it} iterations, no crash")
  return 0


if __name__ == "__main__":
  sys.exit(main(float(sys.argv[1]) if len(sys.argv) > 1 else 60.0))
