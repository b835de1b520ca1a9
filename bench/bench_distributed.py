"""pygrad.distributed on a Dask LocalCluster (worker processes on loopback, one VM thread each):

* an SGD step of an MLP 64-256-256-10 (softmax cross-entropy) at batch 8,192: DataParallel on 2 workers vs 1 worker
  vs plain `pygrad.compile` in this process (VM on one thread, so cores are not counted twice);
* the per-call overhead of DataParallel on a tiny batch;
* a 1,000,000-node graph shipped to 2 workers and compiled there: the time split (dump, ship, load+compile, run).

Usage: python bench/bench_distributed.py [--steps 20] [--nodes 1000000] [--out bench/results/distributed.md]"""
from __future__ import annotations
import argparse, contextlib, os, statistics, sys, time
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


def cpu_split(client, step, steps: int) -> dict:
  """Per step: wall seconds, the workers' runs (wall and CPU of the program, per worker), each worker process's CPU,
  this process's CPU (client, scheduler and nannies of a LocalCluster), their total, and the load average."""
  from pygrad import distributed as pd
  st0, wc0, c0 = client.run(pd.worker_stats), client.run(time.process_time), time.process_time()
  t = time.perf_counter()
  for _ in range(steps): step()
  wall = (time.perf_counter() - t) / steps
  c1, st1, wc1 = time.process_time(), client.run(pd.worker_stats), client.run(time.process_time)
  ws = sorted(st0)
  worker_cpu = [(wc1[w] - wc0[w]) / steps for w in ws]
  return {"wall": wall, "run": statistics.mean((st1[w]["run_seconds"] - st0[w]["run_seconds"]) / steps for w in ws),
          "run_cpu": statistics.mean((st1[w]["run_cpu"] - st0[w]["run_cpu"]) / steps for w in ws),
          "worker_cpu": worker_cpu, "client_cpu": (c1 - c0) / steps,
          "total_cpu": sum(worker_cpu) + (c1 - c0) / steps, "load": os.getloadavg()[0]}


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
  load0 = os.getloadavg()[0]
  x, y, ws0 = data(B)
  rows: list = []

  def sgd(run, ws):
    res = run(ws)
    for w, g in zip(ws, res[1:]): w -= (lr / B) * g

  # plain compile in this process, and DataParallel on a 1-worker and a 2-worker cluster, both up at once: the steps
  # of all of them run in turn (interleaved), so a change in the shared machine's load hits every figure alike
  outs, ins = mlp_step_graph(B)
  prog = pygrad.compile(outs, ins)
  steps = {"local": (lambda ws: sgd(lambda w: prog(x, y, *w), ws), [w.copy() for w in ws0])}
  clusters, clients, results, sockets, tasks, split = {}, {}, {}, {}, {}, {}
  with contextlib.ExitStack() as stack:
    for n in (1, 2):
      cl = clusters[n] = stack.enter_context(distributed.LocalCluster(
        n_workers=n, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None, silence_logs=50))
      c = clients[n] = stack.enter_context(distributed.Client(cl))
      c.wait_for_workers(n)
      outs, ins = mlp_step_graph(B // n)
      dp = pd.DataParallel(outs, ins, c, batch=ins[:2], reduce={i: "sum" for i in range(len(outs))})
      # the same graph with its arrays sent over the sockets (as to workers on other machines), and run as scheduler
      # tasks: the path taken when the client cannot reach the workers itself
      dps = pd.DataParallel(outs, ins, c, batch=ins[:2], reduce={i: "sum" for i in range(len(outs))})
      dps.shared_memory = False
      dpt = pd.DataParallel(outs, ins, c, batch=ins[:2], reduce={i: "sum" for i in range(len(outs))})
      dpt.use_actors = False
      for k, d in ((("actors", n), dp), (("socket", n), dps), (("tasks", n), dpt)):
        steps[k] = ((lambda d: lambda ws: sgd(lambda w: d(x, y, *w), ws))(d), [w.copy() for w in ws0])
        steps[k][0](steps[k][1])  # compile on the workers
    load_t = os.getloadavg()[0]
    t = _interleaved({k: (lambda f, ws: lambda: f(ws))(*v) for k, v in steps.items()}, a.steps)
    load_t = (load_t, os.getloadavg()[0])
    rows.append(("pygrad.compile, this process (1 VM thread)", B, 1, t["local"]))
    for n in (1, 2):
      results[n], sockets[n], tasks[n] = t[("actors", n)], t[("socket", n)], t[("tasks", n)]
      name = f"DataParallel, {n} worker{'s' if n > 1 else ''} (chunks of {B // n})"
      rows.append((name + ", actors, arrays in shared memory (workers on this machine: the default here)", B, n,
                   results[n]))
      rows.append((name + ", actors, arrays by socket (shared_memory=False, as to other machines)", B, n, sockets[n]))
      rows.append((name + ", scheduler tasks (workers not reachable)", B, n, tasks[n]))
    for n in (1, 2):
      for k in ("actors", "socket"):
        f, ws = steps[(k, n)]
        split[(n, k)] = cpu_split(clients[n], lambda: f(ws), a.steps)
    c = clients[2]
    touts, tins = mlp_step_graph(2)
    tiny = pd.DataParallel(touts, tins, c, batch=tins[:2], reduce={i: "sum" for i in range(len(touts))})
    tx, ty, tws = data(4)
    tiny(tx, ty, *tws)
    tinyt = pd.DataParallel(touts, tins, c, batch=tins[:2], reduce={i: "sum" for i in range(len(touts))})
    tinyt.use_actors = False
    tinyt(tx, ty, *tws)
    tprog = pygrad.compile(touts, tins)
    tt = _interleaved({"actors": lambda: tiny(tx, ty, *tws), "tasks": lambda: tinyt(tx, ty, *tws),
                       "local": lambda: tprog(tx[:2], ty[:2], *tws)}, a.steps)
    t_tiny, t_tiny_tasks, t_tiny_local = tt["actors"], tt["tasks"], tt["local"]
    clients[1].close()  # the 1-worker cluster goes before the big graph is shipped to the 2-worker one
    clusters[1].close()
    ship = ship_big(c, a.nodes)
  speedup = results[1] / results[2]
  lines = [f"# pygrad.distributed (python bench/bench_distributed.py --steps {a.steps} --batch {B} --nodes {a.nodes})",
           "", f"Dask LocalCluster, worker processes on loopback, 1 thread per worker and 1 VM thread each; "
           f"{os.cpu_count()} cores; medians of {a.steps} steps; {time.strftime('%Y-%m-%d')}.", "",
           "## MLP 64-256-256-10 SGD step (softmax cross-entropy, batch %d)" % B, "",
           "| engine | batch | workers | ms/step |", "|---|---|---|---|"]
  lines += [f"| {name} | {b} | {n} | {t * 1e3:.1f} |" for name, b, n, t in rows]
  lines += ["", f"2 workers vs 1 worker: **{speedup:.2f}x** (target >= 1.6x: {'PASS' if speedup >= 1.6 else 'FAIL'}); "
            f"arrays by socket: {sockets[1] / sockets[2]:.2f}x; as scheduler tasks: {tasks[1] / tasks[2]:.2f}x. All "
            f"seven interleaved step by step, both clusters up at once; load average (1 min) {load_t[0]:.2f} before, "
            f"{load_t[1]:.2f} after.",
            "", "## Where a step's time and CPU go (actors; the same steps run alone, after the interleaved ones)", "",
            "CPU seconds per step of each process: this process holds the client, the scheduler and the nannies (a "
            "LocalCluster runs them in its caller); a worker's run is the program itself, timed on the worker; the "
            "rest of a worker's CPU is its event loop, (de)serialization and transfers. With 2 cores, a step can "
            "take no less than the total CPU / 2.", "",
            "| workers | arrays | ms/step (wall) | run on a worker: wall / CPU (each) | worker process CPU (each) | "
            "client + scheduler + nannies CPU | total CPU | total CPU / 2 cores | load avg (1 min) |",
            "|---|---|---|---|---|---|---|---|---|"]
  lines += [f"| {n} | {'shared memory' if k == 'actors' else 'socket'} | {d['wall'] * 1e3:.1f} | "
            f"{d['run'] * 1e3:.1f} / {d['run_cpu'] * 1e3:.1f} | "
            f"{' + '.join(f'{v * 1e3:.1f}' for v in d['worker_cpu'])} | {d['client_cpu'] * 1e3:.1f} | "
            f"{d['total_cpu'] * 1e3:.1f} | {d['total_cpu'] * 1e3 / 2:.1f} | {d['load']:.2f} |"
            for (n, k), d in split.items()]
  one, two = split[(1, "actors")], split[(2, "actors")]
  floor2 = max(two["run_cpu"], two["total_cpu"] / 2)
  lines += ["", f"Floors on 2 cores from these CPU figures: a 1-worker step is at least its worker's CPU "
            f"({one['worker_cpu'][0] * 1e3:.1f} ms: the call is serial), a 2-worker step at least max(a worker's run "
            f"CPU, total CPU / 2) = {floor2 * 1e3:.1f} ms; the ratio of the floors is "
            f"{one['worker_cpu'][0] / floor2:.2f}x, what an idle machine could give if nothing else delayed a run.",
            "", f"Load average (1 min) at the start: {load0:.2f}, at the end: {os.getloadavg()[0]:.2f} (the machine is "
            "shared: other processes' CPU is not in these columns but takes the same cores).",
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
