"""pygrad.distributed on a Dask LocalCluster (worker processes on loopback, one VM thread each):

* an SGD step of an MLP 64-256-256-10 (softmax cross-entropy) at batch 8,192: DataParallel on 2 workers vs 1 worker
  vs plain `pygrad.compile` in this process (VM on one thread, so cores are not counted twice);
* the per-call overhead of DataParallel on a tiny batch;
* a 1,000,000-node graph shipped to 2 workers and compiled there: the time split (dump, ship, load+compile, run).

Usage: python bench/bench_distributed.py [--steps 20] [--nodes 1000000] [--out bench/results/distributed.md]"""
from __future__ import annotations
import argparse, os, statistics, sys, time
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("PYGRAD_NUM_THREADS", "1")


def mlp_step_graph(batch: int, sizes=(64, 256, 256, 10)):
  """(outputs, inputs) of one MLP step: the summed softmax cross-entropy and its gradients for every weight."""
  from pygrad import UOp, dtypes
  x = UOp.placeholder((batch, sizes[0]), dtypes.float32, name="x")
  y = UOp.placeholder((batch, sizes[-1]), dtypes.float32, name="y_onehot")
  ws = [UOp.placeholder((a, b), dtypes.float32, name=f"w{i}") for i, (a, b) in enumerate(zip(sizes, sizes[1:]))]
  h = x
  for i, w in enumerate(ws):
    h = h @ w
    if i < len(ws) - 1: h = h.relu()
  loss = -(h.log_softmax(axis=1) * y).sum()
  return [loss, *loss.gradient(*ws)], [x, y, *ws]


def data(batch: int, sizes=(64, 256, 256, 10), seed: int = 0):
  r = np.random.default_rng(seed)
  x = r.standard_normal((batch, sizes[0])).astype(np.float32)
  y = np.eye(sizes[-1], dtype=np.float32)[r.integers(0, sizes[-1], batch)]
  ws = [(r.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32) for a, b in zip(sizes, sizes[1:])]
  return x, y, ws


def _interleaved(steps_by_name: dict, steps: int) -> dict:
  """Median seconds per step of each callable, run in turn step by step (so the machine's load hits all alike)."""
  ts: dict = {k: [] for k in steps_by_name}
  for _ in range(steps):
    for k, step in steps_by_name.items():
      t = time.perf_counter()
      step()
      ts[k].append(time.perf_counter() - t)
  return {k: statistics.median(v) for k, v in ts.items()}


def _median_step(step, steps: int) -> float:
  ts = []
  for _ in range(steps):
    t = time.perf_counter()
    step()
    ts.append(time.perf_counter() - t)
  return statistics.median(ts)


def chain_graph(nodes: int):
  from pygrad import UOp, dtypes
  x = UOp.placeholder((4,), dtypes.float32, name="x")
  y = x
  for i in range(nodes // 2):
    y = (y * 1.0001).sin()
  return y.sum(), x


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--steps", type=int, default=20)
  ap.add_argument("--batch", type=int, default=8192)
  ap.add_argument("--nodes", type=int, default=1_000_000)
  ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                "distributed.md"))
  a = ap.parse_args(argv)
  import distributed
  import pygrad
  from pygrad import distributed as pd
  if hasattr(pygrad, "set_num_threads"): pygrad.set_num_threads(1)
  lr, B = 0.05, a.batch
  x, y, ws0 = data(B)
  rows = []

  def sgd(run, ws):
    res = run(ws)
    for w, g in zip(ws, res[1:]): w -= (lr / B) * g

  # plain compile in this process
  outs, ins = mlp_step_graph(B)
  prog = pygrad.compile(outs, ins)
  ws = [w.copy() for w in ws0]
  t_local = _median_step(lambda: sgd(lambda w: prog(x, y, *w), ws), a.steps)
  rows.append(("pygrad.compile, this process (1 VM thread)", B, 1, t_local))
  results, tasks = {}, {}
  for n in (1, 2):
    with distributed.LocalCluster(n_workers=n, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=None, silence_logs=50) as cl, distributed.Client(cl) as c:
      c.wait_for_workers(n)
      outs, ins = mlp_step_graph(B // n)
      dp = pd.DataParallel(outs, ins, c, batch=ins[:2], reduce={i: "sum" for i in range(len(outs))})
      # the same graph run as scheduler tasks: the path taken when the client cannot reach the workers itself
      dpt = pd.DataParallel(outs, ins, c, batch=ins[:2], reduce={i: "sum" for i in range(len(outs))})
      dpt.use_actors = False
      ws, wst = [w.copy() for w in ws0], [w.copy() for w in ws0]
      dp(x, y, *ws), dpt(x, y, *wst)  # compile on the workers
      t = _interleaved({"actors": lambda: sgd(lambda w: dp(x, y, *w), ws),
                        "tasks": lambda: sgd(lambda w: dpt(x, y, *w), wst)}, a.steps)
      results[n], tasks[n] = t["actors"], t["tasks"]
      name = f"DataParallel, {n} worker{'s' if n > 1 else ''} (chunks of {B // n})"
      rows.append((name + ", actors (workers reachable: the default here)", B, n, results[n]))
      rows.append((name + ", scheduler tasks (workers not reachable)", B, n, tasks[n]))
      if n == 2:
        touts, tins = mlp_step_graph(2)
        tiny = pd.DataParallel(touts, tins, c, batch=tins[:2], reduce={i: "sum" for i in range(len(touts))})
        tx, ty, tws = data(4)
        tiny(tx, ty, *tws)
        tinyt = pd.DataParallel(touts, tins, c, batch=tins[:2], reduce={i: "sum" for i in range(len(touts))})
        tinyt.use_actors = False
        tinyt(tx, ty, *tws)
        tt = _interleaved({"actors": lambda: tiny(tx, ty, *tws), "tasks": lambda: tinyt(tx, ty, *tws)}, a.steps)
        t_tiny, t_tiny_tasks = tt["actors"], tt["tasks"]
        tprog = pygrad.compile(touts, tins)
        t_tiny_local = _median_step(lambda: tprog(tx[:2], ty[:2], *tws), a.steps)
        ship = ship_big(c, a.nodes)
  speedup = results[1] / results[2]
  lines = [f"# pygrad.distributed (python bench/bench_distributed.py --steps {a.steps} --batch {B} --nodes {a.nodes})",
           "", f"Dask LocalCluster, worker processes on loopback, 1 thread per worker and 1 VM thread each; "
           f"{os.cpu_count()} cores; medians of {a.steps} steps; {time.strftime('%Y-%m-%d')}.", "",
           "## MLP 64-256-256-10 SGD step (softmax cross-entropy, batch %d)" % B, "",
           "| engine | batch | workers | ms/step |", "|---|---|---|---|"]
  lines += [f"| {name} | {b} | {n} | {t * 1e3:.1f} |" for name, b, n, t in rows]
  lines += ["", f"2 workers vs 1 worker: **{speedup:.2f}x** (target >= 1.6x: {'PASS' if speedup >= 1.6 else 'FAIL'}); "
            f"as scheduler tasks: {tasks[1] / tasks[2]:.2f}x",
            "", "## Per-call overhead (batch 4 in chunks of 2 on 2 workers)", "",
            f"DataParallel call: {t_tiny * 1e3:.2f} ms; the same graph compiled in this process: "
            f"{t_tiny_local * 1e6:.0f} us per chunk; overhead per call about {(t_tiny - t_tiny_local) * 1e3:.2f} ms "
            f"(as scheduler tasks: {t_tiny_tasks * 1e3:.2f} ms a call).",
            "", f"## A {ship['nodes']:,}-node graph shipped to 2 workers and compiled there", "",
            "| stage | s |", "|---|---|"]
  lines += [f"| {k} | {v:.3f} |" for k, v in ship.items() if k != "nodes"]
  text = "\n".join(lines) + "\n"
  os.makedirs(os.path.dirname(a.out), exist_ok=True)
  with open(a.out, "w") as f: f.write(text)
  print(text)
  return 0


def ship_big(client, nodes: int) -> dict:
  """Build, dump, ship (broadcast to every worker), load and compile, run: a deep chain of about `nodes` nodes."""
  import pygrad
  from pygrad import distributed as pd
  t = time.perf_counter()
  loss, x = chain_graph(nodes)
  t_build = time.perf_counter() - t
  n = len(loss.toposort())
  t = time.perf_counter()
  dp = pd.DataParallel([loss], [x], client, batch=[x], reduce={0: "sum"})
  t_ship = time.perf_counter() - t
  xs = np.ones((8,), np.float32)
  t = time.perf_counter()
  dp(xs)
  t_first = time.perf_counter() - t
  t = time.perf_counter()
  dp(xs)
  t_run = time.perf_counter() - t
  return {"nodes": n, "build on the client": t_build, "dump + broadcast to 2 workers (DataParallel())": t_ship,
          "first call: load + compile on the workers, run": t_first, "later call: run": t_run,
          "graph bytes (MB)": dp.graph_bytes / 1e6}


if __name__ == "__main__":
  sys.exit(main())
