"""Gradient derivation of a graph whose nodes carry metadata, on the C core: the W1 chain of `python -m pygrad bench`
(`y = (y @ w).relu().exp2().sin() + y`, 16x16) built with every layer's nodes in `pygrad.metadata` blocks, as a
tinygrad graph carries its Tensor methods' names (the interop keeps names, no callers: `--callers none`, the
default), or with a caller per layer (`--callers layer`: every layer's metadata distinct, the worst case, since
shared nodes such as constants collect the backward metadata of every layer, as in the seeds). Side by side in one
process, medians: the C driver (templates, metadata carried in C), the direct driver (every rule in Python: what
nodes with metadata used to take), and the C driver on the same chain built without metadata. Each measurement
derives from a freshly built graph (metadata is attached to the nodes in place, so a second derivation of one graph
would find it there already).

  python bench/bench_metadata.py [--depth 400] [--repeat 5] [--callers none|layer]
"""
from __future__ import annotations
import argparse, gc, importlib.util, os, statistics, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))
if importlib.util.find_spec("pygrad") is None: sys.path.insert(0, os.path.dirname(HERE))  # run from a checkout


def chain(depth: int, with_metadata: bool, callers: str = "none"):
  import contextlib
  import pygrad
  from pygrad import UOp
  x = UOp.placeholder((16, 16), name="x")
  ws = [UOp.placeholder((16, 16), name=f"w{i}") for i in range(depth)]
  y = x
  for i, w in enumerate(ws):
    c = f"layer {i}" if callers == "layer" else ""
    blocks = (pygrad.metadata("matmul", caller=c), pygrad.metadata("act", caller=c)) if with_metadata else \
      (contextlib.nullcontext(), contextlib.nullcontext())
    with blocks[0]: z = y @ w
    with blocks[1]: y = z.relu().exp2().sin() + y
  return y.sum(), [x, *ws]


def timed(depth: int, with_metadata: bool, direct: bool, callers: str) -> float:
  from pygrad.gradient import compute_gradient, compute_gradient_direct
  loss, targets = chain(depth, with_metadata, callers)
  fn = compute_gradient_direct if direct else compute_gradient
  gc.collect()
  t = time.perf_counter()
  fn(loss, loss.const_like(1.0), targets)
  return time.perf_counter() - t


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--depth", type=int, default=400)
  ap.add_argument("--repeat", type=int, default=5)
  ap.add_argument("--callers", choices=("none", "layer"), default="none")
  a = ap.parse_args()
  import pygrad
  if pygrad.core_name() != "c": sys.exit("bench_metadata compares the C core's drivers: build the C core")
  cases = {"C driver, metadata": (True, False), "direct driver, metadata": (True, True),
           "C driver, no metadata": (False, False)}
  for md, direct in cases.values(): timed(5, md, direct, a.callers)  # warm: method and rule templates recorded
  times: dict[str, list[float]] = {k: [] for k in cases}
  for _ in range(a.repeat):  # the cases alternate, so load on the machine spreads over all of them
    for k, (md, direct) in cases.items(): times[k].append(timed(a.depth, md, direct, a.callers))
  base = statistics.median(times["C driver, metadata"])
  print(f"W1 depth {a.depth}, callers {a.callers}, medians of {a.repeat} (python bench/bench_metadata.py "
        f"--depth {a.depth} --repeat {a.repeat} --callers {a.callers})")
  print("| case | gradient (ms) | vs C driver with metadata |\n|---|---|---|")
  for k, ts in times.items():
    m = statistics.median(ts)
    print(f"| {k} | {m * 1e3:.2f} | {m / base:.2f}x |")


if __name__ == "__main__":
  main()
