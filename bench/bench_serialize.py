"""Saving and loading graphs (pygrad.dumps/loads, pickle) and the bulk builder pygrad.build, on the C core, against
pickling the same W1 graph in tinygrad 0.14.0, side by side in one run; writes bench/results/serialize.md.

  python bench/bench_serialize.py [--nodes 1000000] [--tg-depth 200] [--reps 5] [--before TREE]
  python bench/bench_serialize.py --cpu [--tg-depth 200] [--reps 7]

--cpu measures only the ratio to tinygrad, reproducibly on a shared machine: pygrad and tinygrad in one process, CPU
time (time.process_time, which other processes' load does not add to), interleaved, medians of --reps rounds of 20
calls each; dumps with both graphs alive, loads after both were dropped (so a load creates its nodes), each load's
setup freeing the one before; and each also with its arg-table cache cleared before every call (the first save or
load of a model in a process). It prints a markdown section and writes no file.

--before TREE also measures the pygrad of another checkout (e.g. a worktree of main before a change, built in
place), with this file's code, in alternating processes: the results then end with a before/after table.

W1 is the bench suite's chain (y = (y @ w).relu().exp2().sin() + y, 16x16): the big graph is its forward graph plus
its gradient, at the depth that makes at least --nodes nodes. tinygrad pickles recursively (RecursionError at depth
2000, and at depth 500 too with its metadata recorded, as on Dec 5), so the comparison runs on the forward graph at
--tg-depth, a depth it handles, for both frameworks."""
from __future__ import annotations
import argparse, gc, os, pickle, statistics, subprocess, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))


def _median(fn, reps: int, setup=None, clock=time.perf_counter) -> float:
  """The median of reps timings of fn (clock: wall by default, time.process_time for CPU time), setup untimed."""
  ts = []
  for _ in range(reps):
    if setup: setup()
    t = clock()
    fn()
    ts.append(clock() - t)
  return statistics.median(ts)


def _w1(depth: int, grad: bool):
  import pygrad
  from pygrad import UOp
  from pygrad.bench import w1_model, MethodOps
  x = UOp.placeholder((16, 16), name="x")
  ws = [UOp.placeholder((16, 16), name=f"w{i}") for i in range(depth)]
  loss = w1_model(MethodOps, x, ws)
  return [loss, *loss.gradient(x, *ws)] if grad else [loss]


def pygrad_figures(nodes_wanted: int, reps: int) -> dict:
  import numpy as np
  import pygrad
  from pygrad import UOp
  from pygrad.serialize import export
  assert pygrad.core_name() == "c", "run on the C core"
  depth = max(1, nodes_wanted // 44)
  while True:
    g = _w1(depth, True)
    n = len(UOp.sink(*g).toposort()) - 1
    if n >= nodes_wanted: break
    depth = int(depth * nodes_wanted / n) + 1
  base = pygrad.live_nodes() - n
  r = {"depth": depth, "nodes": n, "roots": len(g)}
  r["dumps_s"] = _median(lambda: pygrad.dumps(g), reps)
  data = pygrad.dumps(g)
  r["bytes"] = len(data)
  r["loads_alive_s"] = _median(lambda: pygrad.loads(data), reps)
  one = UOp.sink(*g)  # one root: one piece, the same bytes as dumps plus pickle's framing
  r["pickle_dumps_s"] = _median(lambda: pickle.dumps(one), reps)
  pk = pickle.dumps(one)
  del one
  r["pickle_list_dumps_s"] = _median(lambda: pickle.dumps(g), reps)  # the list: one pickling call, one node table
  pkl = pickle.dumps(g)
  r["pickle_bytes"] = len(pkl)
  # the table pygrad.build gets: exported once, as an importer would have it
  ids, op, dt, arg, tag, pdata, nsrc, src = export(g)
  start = np.zeros(n + 1, np.int64)
  np.cumsum(nsrc, out=start[1:])
  uniq, inv = np.unique(arg, return_inverse=True)
  from pygrad.intern import ARGS
  args = [ARGS.objs[int(a)] for a in uniq]
  aidx = np.where(arg == 0, -1, inv.astype(np.int64))
  roots = [int(np.flatnonzero(ids == u._id)[0]) for u in g]
  r["build_alive_s"] = _median(lambda: pygrad.build(op, dt, (start, src), args, aidx, roots=roots), reps)
  del g
  gc.collect()
  assert pygrad.live_nodes() == base, "the graph did not free"
  held = []

  def drop():
    held.clear()
    gc.collect()
    # live_nodes releases the dropped handles' references now (they go in batches of 256): before it was called
    # here, up to 255 of the 32,260 roots kept most of the graph alive, so every "not alive" run after the first
    # found most nodes alive (and the store's id recycling differed)
    assert pygrad.live_nodes() == base, "the graph did not free"
  r["loads_fresh_s"] = _median(lambda: held.append(pygrad.loads(data)), reps, drop)
  r["pickle_loads_fresh_s"] = _median(lambda: held.append(pickle.loads(pk)), reps, drop)
  r["pickle_list_loads_fresh_s"] = _median(lambda: held.append(pickle.loads(pkl)), reps, drop)
  r["build_fresh_s"] = _median(lambda: held.append(pygrad.build(op, dt, (start, src), args, aidx, roots=roots)),
                               reps, drop)
  drop()
  return r


def pygrad_first(nodes_wanted: int) -> dict:
  """The first load in a process, of a graph not alive: the store's signature cache is empty, so Python infers
  the first node of each signature (later loads of the same model find them cached)."""
  import pygrad
  g = _big_graph(nodes_wanted)
  data = pygrad.dumps(g)
  del g
  gc.collect()
  pygrad.live_nodes()  # releases the dropped handles' references now (see drop in pygrad_figures)
  t = time.perf_counter()
  back = pygrad.loads(data)
  r = {"loads_first_s": time.perf_counter() - t}
  del back
  return r


def _big_graph(nodes_wanted: int) -> list:
  """pygrad_figures' graph: W1's forward graph and gradient at the depth that makes at least nodes_wanted nodes."""
  from pygrad import UOp
  depth = max(1, nodes_wanted // 44)
  while True:
    g = _w1(depth, True)
    n = len(UOp.sink(*g).toposort()) - 1
    if n >= nodes_wanted: return g
    depth = int(depth * nodes_wanted / n) + 1


def pygrad_small(depth: int, reps: int) -> dict:
  import pygrad
  from pygrad import UOp
  g = _w1(depth, False)
  n = len(g[0].toposort())
  data = pygrad.dumps(g)
  r = {"nodes": n, "dumps_s": _median(lambda: pygrad.dumps(g), reps), "bytes": len(data)}
  del g
  gc.collect()
  held = []
  r["loads_first_s"] = _median(lambda: held.append(pygrad.loads(data)), 1)  # the signature cache is empty
  r["loads_s"] = _median(lambda: held.append(pygrad.loads(data)), reps, lambda: (held.clear(), gc.collect()))
  return r


def tinygrad_small(depth: int, reps: int) -> dict:
  from tinygrad import Tensor
  from pygrad.bench import w1_model, MethodOps
  x = Tensor.empty(16, 16)
  ws = [Tensor.empty(16, 16) for _ in range(depth)]
  loss = w1_model(MethodOps, x, ws)
  u = loss.uop
  n = len(u.toposort())
  data = pickle.dumps(u)
  r = {"nodes": n, "dumps_s": _median(lambda: pickle.dumps(u), reps), "bytes": len(data)}
  del loss, u, x, ws
  gc.collect()
  held = []
  r["loads_s"] = _median(lambda: held.append(pickle.loads(data)), reps, lambda: (held.clear(), gc.collect()))
  return r


def cpu_ratio(depth: int, reps: int, k: int = 20) -> dict:
  """--cpu: us/node of pygrad.dumps/loads and tinygrad's pickle.dumps/loads of the W1 forward graph at depth, CPU
  time, both frameworks in this process, interleaved; medians over reps rounds of the median of k calls."""
  import pygrad
  from pygrad import argtable
  from tinygrad import Tensor
  from pygrad.bench import w1_model, MethodOps
  g = _w1(depth, False)
  pn, pdata = len(g[0].toposort()), pygrad.dumps(g)
  x = Tensor.empty(16, 16)
  ws = [Tensor.empty(16, 16) for _ in range(depth)]
  tu = w1_model(MethodOps, x, ws).uop
  tn, tdata = len(tu.toposort()), pickle.dumps(tu)
  held: list = []

  def cpu(fn, per: int, setup=None) -> float:
    return _median(fn, k, setup, time.process_time) / per * 1e6

  def drop():
    held.clear()
    gc.collect()
    pygrad.live_nodes()  # releases dropped handles' references now (they go in batches)

  def drop_cache():
    drop()
    argtable._CACHE.clear()
  res: dict = {k: [] for k in ("pd", "td", "pdu", "pl", "tl", "plu")}
  for _ in range(reps):  # dumps: both graphs alive
    res["pd"].append(cpu(lambda: pygrad.dumps(g), pn))
    res["td"].append(cpu(lambda: pickle.dumps(tu), tn))
    res["pdu"].append(cpu(lambda: pygrad.dumps(g), pn, argtable._ENC.clear))
  del g, tu, x, ws
  drop()
  for _ in range(reps):  # loads: neither graph alive
    res["pl"].append(cpu(lambda: held.append(pygrad.loads(pdata)), pn, drop))
    res["tl"].append(cpu(lambda: held.append(pickle.loads(tdata)), tn, drop))
    res["plu"].append(cpu(lambda: held.append(pygrad.loads(pdata)), pn, drop_cache))
  drop()
  out = {k: statistics.median(v) for k, v in res.items()}
  out.update(pn=pn, tn=tn, pbytes=len(pdata), tbytes=len(tdata))
  return out


def cpu_main(depth: int, reps: int) -> str:
  r = _sub("cpu_ratio", depth, reps)
  with open("/proc/loadavg") as f: load = f.read().split()[0]
  stamp = time.strftime("%b %d %H:%M UTC", time.gmtime())
  lines = [f"## {stamp}: CPU-time ratio to tinygrad 0.14.0's pickle, W1 forward at depth {depth}", "",
           f"Command: `python bench/bench_serialize.py --cpu --tg-depth {depth} --reps {reps}` (load average {load} "
           f"at the end); pygrad C core and tinygrad in one process, `time.process_time`, interleaved, medians of "
           f"{reps} rounds of the median of 20 calls. Dumps with both graphs alive; loads after both were dropped "
           f"(each load's setup frees the one before). pygrad {r['pn']:,} nodes, {r['pbytes'] / r['pn']:.1f} B/node; "
           f"tinygrad {r['tn']:,} nodes, {r['tbytes'] / r['tn']:.1f} B/node.", "",
           "| us/node (CPU) | pygrad | tinygrad | tinygrad / pygrad | target |", "|---|---|---|---|---|",
           f"| dumps | {r['pd']:.3f} | {r['td']:.3f} | {r['td'] / r['pd']:.1f}x | >= 20x: "
           f"{'PASS' if r['td'] / r['pd'] >= 20 else 'FAIL'} |",
           f"| dumps, arg-table cache cleared each time | {r['pdu']:.3f} | {r['td']:.3f} | "
           f"{r['td'] / r['pdu']:.1f}x | |",
           f"| loads, graph not alive | {r['pl']:.3f} | {r['tl']:.3f} | {r['tl'] / r['pl']:.1f}x | >= 20x: "
           f"{'PASS' if r['tl'] / r['pl'] >= 20 else 'FAIL'} |",
           f"| loads, arg-table cache cleared each time | {r['plu']:.3f} | {r['tl']:.3f} | "
           f"{r['tl'] / r['plu']:.1f}x | |", ""]
  return "\n".join(lines)


def _sub(fn: str, *args, tree: str | None = None) -> dict:
  """fn(*args) of this file in a fresh process (tinygrad and pygrad keep caches; each gets a clean process), with
  the pygrad of tree (default: this checkout's)."""
  tree = tree or os.path.dirname(HERE)
  code = (f"import sys, json, os; sys.path.insert(0, {HERE!r}); import bench_serialize as b; "
          f"sys.path.insert(0, {tree!r}); import pygrad; "
          f"assert os.path.dirname(os.path.dirname(os.path.abspath(pygrad.__file__))) == {os.path.abspath(tree)!r}; "
          f"print('RESULT', json.dumps(b.{fn}(*{args!r})))")
  env = dict(os.environ, PYGRAD_CORE="c", DEV="CPU", PYTHONPATH=tree)
  p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=3600)
  if p.returncode != 0: raise RuntimeError(f"{fn} failed:\n{p.stderr[-3000:]}")
  import json
  return json.loads(next(ln for ln in p.stdout.splitlines() if ln.startswith("RESULT"))[7:])


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--nodes", type=int, default=1_000_000)
  ap.add_argument("--tg-depth", type=int, default=200)
  ap.add_argument("--reps", type=int, default=5)
  ap.add_argument("--out", default=os.path.join(HERE, "results", "serialize.md"))
  ap.add_argument("--before", default=None, help="another checkout of pygrad to measure too (before a change)")
  ap.add_argument("--cpu", action="store_true", help="only the CPU-time ratio to tinygrad, one process (no file)")
  a = ap.parse_args(argv)
  if a.cpu:
    print(cpu_main(a.tg_depth, a.reps))
    return 0
  old = {}
  if a.before:  # alternating: before, after, before, after (the load of a shared machine drifts)
    old = _sub("pygrad_figures", a.nodes, a.reps, tree=a.before)
    old.update(_sub("pygrad_first", a.nodes, tree=a.before))
  big = _sub("pygrad_figures", a.nodes, a.reps)
  big.update(_sub("pygrad_first", a.nodes))
  if a.before: oldpg = _sub("pygrad_small", a.tg_depth, a.reps, tree=a.before)
  pg = _sub("pygrad_small", a.tg_depth, a.reps)
  tg = _sub("tinygrad_small", a.tg_depth, a.reps)
  n = big["nodes"]
  us = lambda s, k: s / k * 1e6  # noqa: E731
  rows = [
    ("dumps (save to bytes)", big["dumps_s"], "<= 0.25 s"), ("loads, graph not alive", big["loads_fresh_s"], "<= 0.25 s"),
    ("loads, graph not alive, first in a process (no signature cached)", big["loads_first_s"], "<= 0.25 s"),
    ("loads, graph alive (every node found)", big["loads_alive_s"], ""),
    ("pickle.dumps (one root)", big["pickle_dumps_s"], ""),
    ("pickle.loads (one root), graph not alive", big["pickle_loads_fresh_s"], ""),
    (f"pickle.dumps of the list of {big['roots']:,} outputs", big["pickle_list_dumps_s"], ""),
    ("pickle.loads of that list, graph not alive", big["pickle_list_loads_fresh_s"], ""),
    ("pygrad.build from arrays, graph not alive", big["build_fresh_s"], ">= 10M nodes/s"),
    ("pygrad.build from arrays, graph alive", big["build_alive_s"], ""),
  ]
  lines = [f"# Saving, loading and building graphs (C core)", "",
           f"Command: `python bench/bench_serialize.py --nodes {a.nodes} --tg-depth {a.tg_depth} --reps {a.reps}`; "
           f"medians of {a.reps}; one process per framework; this shared 2-core machine was busy with other work "
           "during the run, so absolute times are pessimistic (the ratios are side by side in one run).", "",
           f"## A {n:,}-node graph: W1 depth {big['depth']:,}, forward and gradient", "",
           "| measure | time (s) | ns/node | M nodes/s | target | verdict |", "|---|---|---|---|---|---|"]
  for name, s, target in rows:
    ok = ""
    if target.startswith("<="): ok = "PASS" if s <= 0.25 else "FAIL"
    elif target.startswith(">="): ok = "PASS" if n / s >= 10e6 else "FAIL"
    lines.append(f"| {name} | {s:.3f} | {s / n * 1e9:.0f} | {n / s / 1e6:.2f} | {target} | {ok} |")
  bpn = big["bytes"] / n
  lines += ["", f"Size: {big['bytes']:,} bytes, {bpn:.2f} bytes/node (target <= 16: {'PASS' if bpn <= 16 else 'FAIL'}); "
            f"pickle of the list of {big['roots']:,} outputs: {big['pickle_bytes']:,} bytes (one node table, shared by "
            "all the outputs; each output that adds nodes adds a piece of about 100 bytes besides).",
            "", f"## Against tinygrad 0.14.0's pickle: W1 forward graph at depth {a.tg_depth}", "",
            "tinygrad pickles UOps recursively and raises RecursionError at depth 2000, so both run at depth "
            f"{a.tg_depth}. pygrad: `pygrad.dumps`/`pygrad.loads` (and `pickle`, which goes through the same format); "
            "tinygrad: `pickle.dumps(loss.uop)`/`pickle.loads`. Loads into a process where the graph is not alive.", "",
            "| framework | nodes | dump (us/node) | load (us/node) | bytes/node | dump vs pygrad | load vs pygrad |",
            "|---|---|---|---|---|---|---|"]
  dr, lr = tg["dumps_s"] / tg["nodes"] / (pg["dumps_s"] / pg["nodes"]), \
    tg["loads_s"] / tg["nodes"] / (pg["loads_s"] / pg["nodes"])
  lr1 = tg["loads_s"] / tg["nodes"] / (pg["loads_first_s"] / pg["nodes"])
  lines.append(f"| pygrad C core | {pg['nodes']:,} | {us(pg['dumps_s'], pg['nodes']):.3f} | "
               f"{us(pg['loads_s'], pg['nodes']):.3f} | {pg['bytes'] / pg['nodes']:.1f} | 1.0x | 1.0x |")
  lines.append(f"| tinygrad 0.14.0 | {tg['nodes']:,} | {us(tg['dumps_s'], tg['nodes']):.3f} | "
               f"{us(tg['loads_s'], tg['nodes']):.3f} | {tg['bytes'] / tg['nodes']:.1f} | {dr:.1f}x | {lr:.1f}x |")
  big_dr = tg["dumps_s"] / tg["nodes"] / (big["dumps_s"] / n)
  big_lr = tg["loads_s"] / tg["nodes"] / (big["loads_fresh_s"] / n)
  lines += ["", "| target | measured | verdict |", "|---|---|---|",
            f"| save >= 20x faster per node than tinygrad's pickle (depth {a.tg_depth}; at {n:,} nodes) | "
            f"{dr:.1f}x; {big_dr:.1f}x | {'PASS' if min(dr, big_dr) >= 20 else 'FAIL'} |",
            f"| load >= 20x faster per node than tinygrad's pickle (depth {a.tg_depth}; at {n:,} nodes) | "
            f"{lr:.1f}x; {big_lr:.1f}x | {'PASS' if min(lr, big_lr) >= 20 else 'FAIL'} |",
            f"| the same, pygrad's first load in a process (no signature cached: "
            f"{us(pg['loads_first_s'], pg['nodes']):.3f} us/node at depth {a.tg_depth}; {big['loads_first_s']:.3f} s "
            f"at {n:,} nodes) | "
            f"{lr1:.1f}x; {tg['loads_s'] / tg['nodes'] / (big['loads_first_s'] / n):.1f}x | "
            f"{'PASS' if min(lr1, tg['loads_s'] / tg['nodes'] / (big['loads_first_s'] / n)) >= 20 else 'FAIL'} |", ""]
  if a.before:
    lines += [f"## Before and after: `--before {a.before}` (that checkout's pygrad, this file's code, alternating "
              "processes)", "", "| measure | before (s) | after (s) | after / before |", "|---|---|---|---|"]
    for name, s, _ in rows:
      key = next(k for k, v in big.items() if v is s)
      lines.append(f"| {name} | {old[key]:.3f} | {s:.3f} | {s / old[key]:.2f} |")
    for k, name in (("dumps_s", "dumps"), ("loads_s", "loads"), ("loads_first_s", "loads, first in a process")):
      lines.append(f"| {name}, W1 forward at depth {a.tg_depth} ({pg['nodes']:,} nodes; us/node) | "
                   f"{us(oldpg[k], oldpg['nodes']):.3f} | {us(pg[k], pg['nodes']):.3f} | {pg[k] / oldpg[k]:.2f} |")
    lines.append("")
  os.makedirs(os.path.dirname(a.out), exist_ok=True)
  with open(a.out, "w") as f: f.write("\n".join(lines))
  print("\n".join(lines))
  return 0


if __name__ == "__main__":
  sys.exit(main())
