"""C core vs pure-Python core, side by side in one run: the per-call cost of single-node methods and of the stages
one call goes through (CPU time), the build of `python -m pygrad bench`'s W3 DAG, build, toposort, deepwalk and free
of a 1,000,000-node DAG (a chain with fan-in, built through UOp methods), and bytes per node of a 1,000,000-node
chain held only through its last node. Each measurement runs in a fresh subprocess with PYGRAD_CORE set (the core is
chosen at import); runs alternate the cores and the tables report medians. Writes bench/results/core.md.

  python bench/bench_core.py [--nodes 1000000] [--repeat 3] [--out bench/results] [--calls]
  python bench/bench_core.py --base CHECKOUT    # before/after: calls and W3 build vs another (built) checkout
"""
from __future__ import annotations
import argparse, gc, json, os, platform, statistics, subprocess, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CORES = ("c", "python")


def rss() -> int:
  """Resident set size in bytes (/proc/self/statm; psutil where there is no /proc)."""
  try:
    with open("/proc/self/statm") as f: return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
  except OSError:
    import psutil
    return psutil.Process().memory_info().rss


def _median_time(fn, budget_s: float = 2.0, most: int = 5) -> float:
  ts: list[float] = []
  while len(ts) < most and sum(ts) < budget_s:
    gc.collect()
    t = time.perf_counter()
    fn()
    ts.append(time.perf_counter() - t)
  return statistics.median(ts)


def dag_worker(n: int) -> dict:
  """Build an n-step DAG (each step one node: sin, add, exp2, mul; the binary ops take a node from the last 16 as
  their second source), then time toposort, deepwalk and freeing it."""
  import pygrad
  from pygrad import UOp
  from pygrad.core import CORE
  base = pygrad.live_nodes()
  gc.collect()
  t = time.perf_counter()
  x = UOp.placeholder((4,), name="x")
  ring = [x] * 16
  y = x
  for i in range(n):
    k = i & 3
    if k == 0: y = y.sin()
    elif k == 1: y = y + ring[(i * 7) & 15]
    elif k == 2: y = y.exp2()
    else: y = y * ring[(i * 13) & 15]
    ring[i & 15] = y
  t_build = time.perf_counter() - t
  del ring
  nodes = len(y.toposort())
  t_topo = _median_time(lambda: len(y.toposort()))
  t_walk = _median_time(lambda: CORE.deepwalk(y._id, [x._id]))
  walk, _ = CORE.deepwalk(y._id, [x._id])
  on_path = len(walk)
  del walk, _
  held = pygrad.live_nodes() - base
  gc.collect()
  t = time.perf_counter()
  del y, x
  left = pygrad.live_nodes() - base  # counting flushes the handles' batched releases: the free happens here
  t_free = time.perf_counter() - t
  return {"nodes": nodes, "held": held, "left": left, "on_path": on_path, "build_s": t_build, "topo_s": t_topo,
          "deepwalk_s": t_walk, "free_s": t_free}


def chain_worker(n: int) -> dict:
  """Bytes per node: RSS growth while building an n-node chain (sin/exp2 alternating) held only through its last
  node; then the build time per node of that chain."""
  import pygrad
  from pygrad import UOp
  x = UOp.placeholder((4,), name="x")
  y = x.sin().exp2()  # warm every code path the loop takes
  del y
  gc.collect()
  base, r0 = pygrad.live_nodes(), rss()
  t = time.perf_counter()
  y = x
  for i in range(n): y = y.sin() if i & 1 else y.exp2()
  t_build = time.perf_counter() - t
  gc.collect()
  grown = rss() - r0
  made = pygrad.live_nodes() - base
  return {"nodes": made, "bytes_per_node": grown / made, "chain_build_s": t_build}


def _per_call(fn, items, reps: int = 3) -> float:
  """Median CPU seconds (this thread's: other processes' load does not count) per item of `fn(item)`, over fresh
  items each repetition, results kept alive meanwhile."""
  ts = []
  for r in range(reps):
    xs = items(r)
    gc.collect()
    gc.disable()
    t = time.thread_time()
    out = [fn(x) for x in xs]
    ts.append((time.thread_time() - t) / len(xs))
    gc.enable()
    del out, xs
  return statistics.median(ts)


def calls_worker(n: int) -> dict:
  """Per-call cost of single-node methods (each call makes a new node from fresh operands, results kept), and of
  the stages one call goes through, each timed alone the way the method runs it: the empty loop, the core's make
  (the cffi call and the store), the handle object with its fields, the handle's publication in the registry (one
  handle per live node), arg interning, shape inference (the generic validity check) and a Python scalar made a
  constant node through the generic path."""
  from pygrad import UOp, Ops, dtypes
  from pygrad import uop as U
  from pygrad.core import CORE
  from pygrad.intern import ARGS
  from pygrad.shapes import INFER
  n = min(n, 20_000)
  b = UOp.placeholder((4, 3), name="b")

  def fresh(shape):
    return lambda r: [UOp.placeholder(shape) for _ in range(n)]
  r: dict = {}
  r["loop"] = _per_call(lambda x: x, fresh((4, 3)))
  r["a + b"] = _per_call(lambda x: x + b, fresh((4, 3)))
  r["a.sin()"] = _per_call(lambda x: x.sin(), fresh((4, 3)))
  r["a * 2.0"] = _per_call(lambda x: x * 2.0, fresh((4, 3)))
  r["a.reshape(s)"] = _per_call(lambda x: x.reshape((3, 4)), fresh((4, 3)))
  r["a.permute(o)"] = _per_call(lambda x: x.permute((1, 0)), fresh((4, 3)))
  r["a.expand(s)"] = _per_call(lambda x: x.expand((4, 3)), fresh((1, 3)))
  f32, add, meta, bid = dtypes.float32, Ops.ADD, b._m, b._id
  made: list = []

  def make(x):
    nid = CORE.make2(add, f32.id, x._id, bid, 0, 0, meta)
    made.append(nid)
    return nid
  r["stage: core make (cffi call + store)"] = _per_call(make, fresh((4, 3)))
  r["stage: core call, trivial (`CORE.id_bound()`: the crossing alone)"] = _per_call(lambda x: CORE.id_bound(),
                                                                                     lambda _: range(n))

  def one(x, y): return x
  def method(x): return one(x, b)
  r["stage: a Python call level (a function calling a function)"] = _per_call(method, lambda _: range(n)) - r["loop"]
  hnew = getattr(U, "_hnew", None)  # the handle constructor (one C call on the C core), where the tree has one
  new_style = "_op" in getattr(UOp, "__slots__", ())

  def obj(nid):
    if hnew is not None: return hnew(nid, add, f32, None, None, (4, 3), "CPU", meta)
    o = object.__new__(UOp)
    if new_style:
      o._id, o._op, o._dtype, o._arg, o._tag, o._shape, o._device, o._src, o._m = \
        nid, add, f32, None, None, (4, 3), "CPU", None, meta
    else:
      o._id, o.op, o.dtype, o.arg, o.tag, o.shape, o.device, o._src, o._m = \
        nid, add, f32, None, None, (4, 3), "CPU", None, meta
    return o
  r["stage: handle object + fields"] = _per_call(obj, lambda i: made[i * n:(i + 1) * n])
  wrapped = _per_call(lambda nid: U._wrap(nid, add, f32, None, None, (4, 3), "CPU", meta),
                      lambda i: made[i * n:(i + 1) * n])
  r["stage: registry (handle published, one per node)"] = wrapped - r["stage: handle object + fields"]
  del made
  shapes = [(i % 97 + 1, 3) for i in range(n)]
  ARGS.get((3, 4))
  r["stage: arg interning (hit)"] = _per_call(lambda s: ARGS.get((3, 4)), lambda _: shapes)
  src2 = (b, b)
  r["stage: shape inference (generic, ADD)"] = _per_call(lambda s: INFER[Ops.ADD](Ops.ADD, None, src2, None),
                                                         lambda _: shapes)
  r["stage: shape inference (generic, RESHAPE)"] = _per_call(
    lambda s: INFER[Ops.RESHAPE](Ops.RESHAPE, None, (b,), (3, 4)), lambda _: shapes)
  r["stage: Python scalar -> CONST node (generic)"] = _per_call(lambda s: UOp.const(2.0), lambda _: shapes)
  return {k: v * 1e9 for k, v in r.items()}


def w3_worker(n: int) -> dict:
  """The build of `python -m pygrad bench`'s W3 DAG of n ops through UOp methods: wall and CPU seconds (this
  thread's CPU time is what other processes' load does not inflate)."""
  from pygrad import bench as B
  from pygrad import UOp
  warm = B.w3_script(B.WARMUP["W3"])
  B.w3_model(B.MethodOps, [UOp.placeholder((4,)) for _ in range(warm[0])], warm)
  script = B.w3_script(n)
  leaves = [UOp.placeholder((4,)) for _ in range(script[0])]
  gc.collect()
  t, c = time.perf_counter(), time.thread_time()
  root = B.w3_model(B.MethodOps, leaves, script)
  t_build, c_build = time.perf_counter() - t, time.thread_time() - c
  return {"w3_nodes": len(root.toposort()), "w3_build_s": t_build, "w3_build_cpu_s": c_build}


def _pygrad_dir() -> str:
  """The folder holding the pygrad this interpreter would import (an installed one, PYTHONPATH's, else this tree's)."""
  import importlib.util
  spec = importlib.util.find_spec("pygrad")
  return os.path.dirname(os.path.dirname(spec.origin)) if spec and spec.origin else ROOT


CALL_TARGETS = {"a + b": 600, "a.sin()": 600, "a * 2.0": 800, "a.reshape(s)": 800, "a.permute(o)": 800,
                "a.expand(s)": 800}


def calls_table(runs, med) -> str:
  """The per-call table: C core, pure core, their ratio, and the issue's targets for the methods."""
  keys = list(runs[("c", "calls")][0])
  rows = []
  for k in keys:
    c, p = med("c", "calls", k), med("python", "calls", k)
    tgt = CALL_TARGETS.get(k)
    rows.append((k, f"{c:.0f}", f"{p:.0f}", f"{p / c:.2f}x", f"<= {tgt} (C)" if tgt else "",
                 ("PASS" if c <= tgt else "MISS") if tgt else ""))
  head = "| call | C core (ns) | pure core (ns) | pure / C | target | verdict |\n|---|---|---|---|---|---|"
  return head + "\n" + "\n".join("| " + " | ".join(r) + " |" for r in rows)


def run_worker(core: str, kind: str, n: int, tree: str | None = None) -> dict:
  """One worker in a fresh process: this file's with the pygrad this interpreter imports, or (tree) the worker of
  another checkout with that checkout's pygrad."""
  env = dict(os.environ, PYGRAD_CORE=core)
  path = tree if tree else _pygrad_dir()
  env["PYTHONPATH"] = path + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
  script = os.path.join(tree, "bench", "bench_core.py") if tree else os.path.abspath(__file__)
  p = subprocess.run([sys.executable, script, "--worker", kind, "--nodes", str(n)], env=env,
                     capture_output=True, text=True, timeout=3600, cwd=tree or None)
  for line in p.stdout.splitlines():
    if line.startswith("RESULT "): return json.loads(line[7:])
  raise RuntimeError(f"{kind} worker on the {core} core failed: {p.stderr.strip()[-2000:]}")


def compare(base: str, repeat: int, n: int) -> str:
  """Before / after on the C core: the calls worker (20,000 calls) and the W3 build of n ops, from the checkout
  `base` (built in place) and from this tree, alternating, in fresh processes; a markdown table of medians."""
  trees = {"before": os.path.abspath(base), "after": ROOT}
  runs: dict = {(t, k): [] for t in trees for k in ("calls", "w3")}
  for rep in range(repeat):
    for kind in ("calls", "w3"):
      for t in (list(trees) if rep % 2 == 0 else list(trees)[::-1]):
        print(f"run {rep + 1}/{repeat}: {kind}, {t} ({trees[t]}) ...", flush=True)
        runs[(t, kind)].append(run_worker("c", kind, n, trees[t]))
  out = []
  for kind in ("calls", "w3"):
    keys = list(dict.fromkeys(k for t in trees for r in runs[(t, kind)] for k in r))
    out.append(f"| {kind} (C core) | before | after | before / after |\n|---|---|---|---|")
    for k in keys:
      b, a = (statistics.median(r[k] for r in runs[(t, kind)]) if k in runs[(t, kind)][0] else None
              for t in trees)
      if isinstance(a, int) or isinstance(b, int): continue  # counts, not times
      out.append(f"| {k} | {'-' if b is None else f'{b:.4g}'} | {'-' if a is None else f'{a:.4g}'} | "
                 f"{f'{b / a:.2f}x' if a and b else ''} |")
    out.append("")
  return "\n".join(out)


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--nodes", type=int, default=1_000_000)
  ap.add_argument("--repeat", type=int, default=3)
  ap.add_argument("--out", default=os.path.join(HERE, "results"))
  ap.add_argument("--calls", action="store_true", help="only the per-call breakdown of single-node methods")
  ap.add_argument("--base", metavar="CHECKOUT", help="only before/after: this tree against another checkout")
  ap.add_argument("--worker", choices=("dag", "chain", "calls", "w3"), help=argparse.SUPPRESS)
  a = ap.parse_args(argv)
  if a.worker:
    import pygrad
    want = os.environ.get("PYGRAD_CORE")
    if want and pygrad.core_name() != want: raise SystemExit(f"asked for the {want} core, got {pygrad.core_name()}")
    r = {"dag": dag_worker, "chain": chain_worker, "calls": calls_worker, "w3": w3_worker}[a.worker](a.nodes)
    print("RESULT " + json.dumps(r), flush=True)
    return 0

  if a.base:
    print()
    print(compare(a.base, a.repeat, a.nodes))
    return 0
  kinds = ("calls",) if a.calls else ("calls", "w3", "dag", "chain")
  runs: dict[tuple[str, str], list[dict]] = {(c, k): [] for c in CORES for k in kinds}
  t0 = time.perf_counter()
  for rep in range(a.repeat):
    for kind in kinds:
      for core in (CORES if rep % 2 == 0 else CORES[::-1]):
        print(f"[{time.perf_counter() - t0:5.0f}s] run {rep + 1}/{a.repeat}: {kind} of {a.nodes:,} nodes, "
              f"{core} core ...", end=" ", flush=True)
        r = run_worker(core, kind, a.nodes)
        runs[(core, kind)].append(r)
        print(", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in r.items()), flush=True)

  def med(core, kind, key): return statistics.median(r[key] for r in runs[(core, kind)])
  calls = calls_table(runs, med)
  if a.calls:
    print()
    print(calls)
    return 0
  m = {c: {"nodes": med(c, "dag", "nodes"), "build": med(c, "dag", "build_s") / med(c, "dag", "nodes"),
           "chain_build": med(c, "chain", "chain_build_s") / med(c, "chain", "nodes"),
           "topo": med(c, "dag", "topo_s"), "walk": med(c, "dag", "deepwalk_s"), "free": med(c, "dag", "free_s"),
           "bytes": med(c, "chain", "bytes_per_node")} for c in CORES}
  for c in CORES:
    leaks = [r["left"] for r in runs[(c, "dag")] if r["left"]]
    if leaks: print(f"warning: {c} core kept {leaks} nodes after freeing the DAG")
  c, p = m["c"], m["python"]
  n = c["nodes"]

  def verdict(ok): return "PASS" if ok else "MISS"
  w3 = {k: (med(k, "w3", "w3_build_s"), med(k, "w3", "w3_build_cpu_s")) for k in CORES}
  rows = [
    (f"W3 build, {med('c', 'w3', 'w3_nodes'):,} nodes (s, wall / CPU)", f"{w3['c'][0]:.2f} / {w3['c'][1]:.2f}",
     f"{w3['python'][0]:.2f} / {w3['python'][1]:.2f}", f"{w3['python'][1] / w3['c'][1]:.2f}x (CPU)",
     "<= 0.6 s (C), >= 5x", verdict(w3["c"][1] <= 0.6 and w3["python"][1] / w3["c"][1] >= 5)),
    ("DAG nodes (`len(root.toposort())`)", f"{c['nodes']:,}", f"{p['nodes']:,}", "", "", ""),
    ("build via UOp methods, DAG (ns/node)", f"{c['build'] * 1e9:.0f}", f"{p['build'] * 1e9:.0f}",
     f"{p['build'] / c['build']:.2f}x", ">= 1.5x", verdict(p["build"] / c["build"] >= 1.5)),
    ("build via UOp methods, chain (ns/node)", f"{c['chain_build'] * 1e9:.0f}", f"{p['chain_build'] * 1e9:.0f}",
     f"{p['chain_build'] / c['chain_build']:.2f}x", "", ""),
    ("`len(root.toposort())` (ms)", f"{c['topo'] * 1e3:.1f}", f"{p['topo'] * 1e3:.1f}",
     f"{p['topo'] / c['topo']:.1f}x", ">= 20x", verdict(p["topo"] / c["topo"] >= 20)),
    ("toposort (ns/node)", f"{c['topo'] / n * 1e9:.1f}", f"{p['topo'] / n * 1e9:.1f}", "", "<= 50 (C)",
     verdict(c["topo"] / n * 1e9 <= 50)),
    ("deepwalk, `CORE.deepwalk` (ms)", f"{c['walk'] * 1e3:.1f}", f"{p['walk'] * 1e3:.1f}",
     f"{p['walk'] / c['walk']:.1f}x", "", ""),
    ("free (drop the last handle, ms)", f"{c['free'] * 1e3:.1f}", f"{p['free'] * 1e3:.1f}",
     f"{p['free'] / c['free']:.1f}x", "", ""),
    ("bytes per node (RSS growth, chain held by its last node)", f"{c['bytes']:.0f}", f"{p['bytes']:.0f}",
     f"{p['bytes'] / c['bytes']:.1f}x", "<= 150 (C)", verdict(c["bytes"] <= 150)),
  ]
  head = "| measure | C core | pure core | pure / C | target | verdict |\n|---|---|---|---|---|---|"
  tab = head + "\n" + "\n".join("| " + " | ".join(r) + " |" for r in rows)
  cmd = "python bench/bench_core.py" + ("" if argv is None and len(sys.argv) == 1 else
                                        " " + " ".join(argv if argv is not None else sys.argv[1:]))
  md = (f"# pygrad core benchmark\n\nCommand: `{cmd}`  \nMachine: Python {platform.python_version()}, "
        f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}  \n"
        f"Date: {time.strftime('%Y-%m-%d %H:%M')}; medians of {a.repeat} runs per core, alternating, each in a "
        f"fresh process.\n\nDAG: {a.nodes:,} steps of sin / add / exp2 / mul on a (4,) input, each binary op taking "
        f"one of the last 16 nodes as its second source. Chain: {a.nodes:,} alternating exp2/sin nodes, only the "
        f"last one referenced from Python.\n\n{tab}\n\n"
        f"Single-node methods, ns per call (each call makes a new node from fresh operands; medians of "
        f"{a.repeat} runs; `loop` is the empty loop, included in every figure), and the stages one call goes "
        f"through, each timed alone:\n\n{calls}\n")
  os.makedirs(a.out, exist_ok=True)
  with open(os.path.join(a.out, "core.md"), "w") as f: f.write(md)
  print()
  print(tab)
  print(f"\nwrote {os.path.join(a.out, 'core.md')}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
