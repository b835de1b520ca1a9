"""Compile time per node: `pygrad.compile` (flatten, plan, lower, place, validate in C) of graphs of 10k, 100k and
1M nodes, to show it linear in the graph's size. Graph construction and differentiation are not timed. Workloads:

* `grad-scalar`: the gradient of `x.sin()` repeated d times on a () input: ~5 nodes per level, all in ONE fused
  group (the case that was quadratic: register allocation scanned a free list growing with the group);
* `grad-vector`: the same on a (16,) input: every forward value has two users, so each level is its own kernel
  (per-kernel costs dominate);
* `forward`: an elementwise chain `(y + 0.5) * 0.5`, `y * 0.99999 + 0.00001` alternating, on (16,): one group;
* `w1-grad`: the bench suite's W1 chain `y = (y @ w).relu().exp2().sin() + y` on 16x16, its loss and the gradients
  of x and every w (~31 nodes and 9 kernels per level, a third of them contractions): many buffers whose lifetimes
  the arena placement interleaves.

`nodes` is the size of the output's graph (its toposort). Each size runs in a fresh subprocess (so the figures do
not share a heap); the table reports the median of `--repeat` compiles in that process (wall clock, and the process's
CPU time: a shared machine inflates the second far less), and the run time of the compiled program once. A
reference column, `py ref (ns)`, times a fixed pure-Python loop (1M dict stores) in the
same process, so figures taken while the machine is shared can be judged against its speed at that moment.
`--baseline DIR` also runs every size on the pygrad package under DIR (e.g. an older checkout, built), interleaved
with this one, and reports its CPU time side by side with the CPU-time speedup.

  python bench/bench_compile.py [--sizes 10000,100000,1000000] [--only ...] [--repeat 3] [--baseline DIR]
                                [--out bench/results]
"""
from __future__ import annotations
import argparse, gc, json, os, platform, statistics, subprocess, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WORKLOADS = ("grad-scalar", "grad-vector", "forward", "w1-grad")
# the default sizes (w1-grad's graph has ~2 nodes per unit of size: its points run from 20k to ~1M nodes)
_SIZES = {None: "10000,100000,1000000", "w1-grad": "10000,100000,300000,485000"}


def _py_ref() -> float:
  """ns per store of a fixed pure-Python loop: the interpreter's speed on this machine now."""
  t = time.perf_counter()
  d = {}
  for i in range(1_000_000): d[i] = i
  return (time.perf_counter() - t) * 1e3


def worker(kind: str, nodes: int, repeat: int) -> dict:
  sys.setrecursionlimit(10_000)
  import numpy as np
  import pygrad
  from pygrad import UOp, Ops, dtypes
  if kind == "w1-grad":
    from pygrad.bench import w1_model, MethodOps
    x = UOp.placeholder((16, 16), dtypes.float32, "x")
    ws = [UOp.placeholder((16, 16), dtypes.float32, f"w{i}") for i in range(max(1, nodes // 31))]
    loss = w1_model(MethodOps, x, ws)
    out, ins = UOp.sink(loss, *loss.gradient(x, *ws)), [x, *ws]
  else:
    x = UOp.placeholder(() if kind == "grad-scalar" else (16,), dtypes.float32, "x")
    y = x
    if kind == "forward":
      for i in range(nodes): y = y * 0.99999 + 0.00001 if i % 2 else (y + 0.5) * 0.5
      out = y
    else:
      for _ in range(max(1, nodes // 5)): y = y.sin()
      out = y.sum().gradient(x)[0] if kind == "grad-vector" else y.gradient(x)[0]
    ins = [x]
  n = len(out.toposort()) - (out.op is Ops.SINK)
  ts, cs = [], []
  for _ in range(repeat):
    gc.collect()
    t, c = time.perf_counter(), time.process_time()
    p = pygrad.compile(out, ins)
    ts.append(time.perf_counter() - t)
    cs.append(time.process_time() - c)
  vs = [np.full(i.shape, 0.01, np.float32) for i in ins]
  t = time.perf_counter()
  p(*vs)
  run = time.perf_counter() - t
  return {"kind": kind, "nodes": n, "compile_s": statistics.median(ts), "cpu_s": statistics.median(cs), "run_s": run,
          "kernels": p.stats["kernels"],
          "py_ref_ns": _py_ref()}


def _run(root: str, kind: str, n: int, repeat: int) -> dict:
  """One workload and size in a fresh process on the pygrad package under root."""
  env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
  out = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", kind, str(n), str(repeat)],
                       capture_output=True, text=True, env=env, cwd=ROOT)
  line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
  if out.returncode or not line: raise SystemExit(f"{kind} {n} ({root}): worker failed\n{out.stderr[-2000:]}")
  return json.loads(line[0][7:])


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--sizes", default=None, help="per workload: 10000,100000,1000000; w1-grad: 10000,100000,300000,"
                  "485000 (its size is ~half its node count: 20k to 1M nodes)")
  ap.add_argument("--only", default=",".join(WORKLOADS))
  ap.add_argument("--repeat", type=int, default=3)
  ap.add_argument("--baseline", default=None, help="a folder holding another (built) pygrad package to compare")
  ap.add_argument("--out", default=os.path.join(HERE, "results"))
  ap.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
  a = ap.parse_args(argv)
  if a.worker:
    print("RESULT " + json.dumps(worker(a.worker[0], int(a.worker[1]), int(a.worker[2]))))
    return 0
  base = os.path.abspath(a.baseline) if a.baseline else None
  rows = []
  for kind in [k.strip() for k in a.only.split(",") if k.strip()]:
    if kind not in WORKLOADS: raise SystemExit(f"unknown workload {kind!r}; expected one of {WORKLOADS}")
    for n in [int(s) for s in (a.sizes or _SIZES.get(kind, _SIZES[None])).split(",")]:
      r = _run(ROOT, kind, n, a.repeat)
      if base is not None: r["base"] = _run(base, kind, n, a.repeat)  # interleaved: both under the same load
      rows.append(r)
      b = r.get("base")
      vs = f"  baseline {b['compile_s'] / b['nodes'] * 1e6:.2f} us/node (CPU {b['cpu_s'] / b['nodes'] * 1e6:.2f})" \
          if b else ""
      print(f"{kind:12s} {r['nodes']:>9,} nodes  compile {r['compile_s']:.3f} s  "
            f"{r['compile_s'] / r['nodes'] * 1e6:.2f} us/node (CPU {r['cpu_s'] / r['nodes'] * 1e6:.2f}){vs}  "
            f"run {r['run_s']:.4f} s  ref {r['py_ref_ns']:.0f} ns",
            flush=True)
  cmd = "python bench/bench_compile.py" + (f" --sizes {a.sizes}" if a.sizes else "") + \
      f" --only {a.only} --repeat {a.repeat}" + \
      (" --baseline BASELINE" if base else "")
  lines = ["# Compile time per node", "",
           f"`{cmd}` on {platform.machine()}, "
           f"Python {platform.python_version()}, {os.cpu_count()} cores; median of {a.repeat} compiles per size, each "
           "size in a fresh process. `py ref` is the same process's time per store of a fixed pure-Python loop: "
           "compare figures only with their reference (a busy machine inflates both alike). `CPU`: the compile's "
           "process CPU time (time.process_time; compiling runs on one thread), which other processes on a shared "
           "machine inflate far less than the wall clock."
           + (" `baseline`: the same workload on the package under BASELINE, run right after it." if base else ""),
           "", "| workload | nodes | kernels | compile (s) | compile (us/node) | CPU (us/node) | " +
           ("baseline CPU (us/node) | CPU speedup | " if base else "") + "run once (s) | py ref (ns) |",
           "|---|---:|---:|---:|---:|---:|" + ("---:|---:|" if base else "") + "---:|---:|"]
  for r in rows:
    us = r['compile_s'] / r['nodes'] * 1e6
    b = r.get("base")
    cmp = f"{b['cpu_s'] / b['nodes'] * 1e6:.2f} | {b['cpu_s'] / r['cpu_s']:.2f}x | " if b else ""
    lines.append(f"| {r['kind']} | {r['nodes']:,} | {r['kernels']:,} | {r['compile_s']:.3f} | {us:.2f} | "
                 f"{r['cpu_s'] / r['nodes'] * 1e6:.2f} | {cmp}"
                 f"{r['run_s']:.4f} | {r['py_ref_ns']:.0f} |")
  os.makedirs(a.out, exist_ok=True)
  with open(os.path.join(a.out, "compile.md"), "w") as f: f.write("\n".join(lines) + "\n")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
