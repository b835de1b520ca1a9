"""Memory of a long-running process (issue 10 item 11) and what returning big blocks to the OS costs.

* `churn`: the churn loop of tests/test_churn.py (build ~N nodes over a new shape with new constants, differentiate,
  evaluate, drop), R rounds; every `--every` rounds the RSS, glibc's heap (mallinfo2 `arena`: bytes the heap holds,
  in use or free) and the bytes malloc has in use (`uordblks + hblkhd`: heap plus mmapped blocks). RSS that grows
  while in-use stays flat is the allocator keeping freed memory (fragmentation), not a leak.
* `runs`: a compiled program whose VM register files take about W MiB (the gradient of a d-deep sin chain over
  64x64 floats), run `--repeat` times: the median run time. Since csrc/mem.c such a workspace is mapped and unmapped
  on every run (its pages fault in again), where glibc, after the first run, served it from its heap.

Each (tree, workload) runs in a fresh subprocess. `--baseline DIR` runs the same on the pygrad package under DIR (an
older checkout, built) right after, so the two are compared under the same load.

  python bench/bench_memory.py churn [--rounds 100] [--nodes 20000] [--every 10] [--baseline DIR]
  python bench/bench_memory.py runs [--depths 10,25,50,100] [--repeat 30] [--threads 1,2] [--baseline DIR]
"""
from __future__ import annotations
import argparse, ctypes, gc, json, os, statistics, subprocess, sys, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _mallinfo():
  """(heap bytes, bytes in use) from glibc's mallinfo2, or None off glibc."""
  class Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks "
                                              "fordblks keepcost".split()]
  try:
    f = ctypes.CDLL(None).mallinfo2
  except (OSError, AttributeError):
    return None
  f.restype = Mallinfo2
  m = f()
  return m.arena, m.uordblks + m.hblkhd


def churn(rounds: int, nodes: int, every: int) -> list:
  import numpy as np, psutil, pygrad
  from pygrad import UOp, dtypes

  def one(r):
    x = UOp.placeholder((r + 2, 3), dtypes.float32)
    y, k = x, 0
    while k * 7 < nodes:
      c = 1.0 + r * 1e-3 + k * 1e-7
      y = (y * c + (c - 1.0)).sin()
      k += 1
      if k % 16 == 0: y = y.contiguous()
    loss = y.sum()
    g, = loss.gradient(x)
    pygrad.evaluate([loss, g], {x: np.linspace(-1, 1, x.numel, dtype=np.float32).reshape(x.shape)})
  one(-1)
  out, t0 = [], time.perf_counter()
  for r in range(rounds):
    one(r)
    gc.collect()
    if r % every == 0 or r == rounds - 1:
      mi = _mallinfo() or (0, 0)
      out.append({"round": r, "rss": psutil.Process().memory_info().rss, "heap": mi[0], "inuse": mi[1],
                  "live": pygrad.live_nodes(), "s": time.perf_counter() - t0})
  return out


def runs(depth: int, repeat: int, threads: int) -> dict:
  import numpy as np, pygrad
  from pygrad import UOp, dtypes
  pygrad.set_num_threads(threads)
  x = UOp.placeholder((64, 64), dtypes.float32)
  y = x
  for _ in range(depth): y = (y * 0.999).sin()
  g, = y.sum().gradient(x)
  prog = pygrad.compile(g, [x])
  a = np.ones((64, 64), np.float32)
  prog(a)
  ts = []
  for _ in range(repeat):
    t = time.perf_counter()
    prog(a)
    ts.append(time.perf_counter() - t)
  return {"median_ms": statistics.median(ts) * 1e3}


def _sub(tree: str, args: list) -> object:
  env = dict(os.environ, PYTHONPATH=tree)
  out = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", *args], cwd=tree, env=env,
                       capture_output=True, text=True, check=True)
  return json.loads(out.stdout.strip().splitlines()[-1])


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("mode", choices=("churn", "runs"))
  ap.add_argument("--rounds", type=int, default=100)
  ap.add_argument("--nodes", type=int, default=20000)
  ap.add_argument("--every", type=int, default=10)
  ap.add_argument("--depths", default="10,25,50,100")
  ap.add_argument("--repeat", type=int, default=30)
  ap.add_argument("--threads", default="1,2")
  ap.add_argument("--baseline", default=None, help="a folder holding another (built) pygrad package to compare")
  ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
  a, rest = ap.parse_known_args()
  if a.worker:
    res = churn(a.rounds, a.nodes, a.every) if a.mode == "churn" else \
        runs(int(a.depths), a.repeat, int(a.threads))
    print(json.dumps(res))
    return
  trees = [("this", ROOT)] + ([("baseline", os.path.abspath(a.baseline))] if a.baseline else [])
  print(f"# bench_memory {a.mode}: {' '.join(sys.argv[1:])}")
  if a.mode == "churn":
    res = {name: _sub(tree, ["churn", "--rounds", str(a.rounds), "--nodes", str(a.nodes), "--every", str(a.every)])
           for name, tree in trees}
    print("| round | " + " | ".join(f"{n} RSS / heap / in use (MiB)" for n, _ in trees) + " |")
    print("|---|" + "---|" * len(trees))
    for i, row in enumerate(res["this"]):
      cells = [f"{res[n][i]['rss'] / 2**20:.1f} / {res[n][i]['heap'] / 2**20:.1f} / {res[n][i]['inuse'] / 2**20:.1f}"
               for n, _ in trees]
      print(f"| {row['round']} | " + " | ".join(cells) + " |")
    for n, _ in trees:
      rss = [row["rss"] for row in res[n]]
      mid = rss[len(rss) // 2 - 1]
      print(f"{n}: second half grows RSS by {100 * (max(rss[len(rss) // 2:]) / mid - 1):.1f}%, "
            f"{res[n][-1]['s']:.0f} s, live nodes at the end {res[n][-1]['live']}")
    return
  print("| threads | depth | " + " | ".join(f"{n} median run (ms)" for n, _ in trees) +
        (" | this / baseline |" if a.baseline else " |"))
  print("|---|---|" + "---|" * len(trees) + ("---|" if a.baseline else ""))
  for th in a.threads.split(","):
    for d in a.depths.split(","):
      r = {n: _sub(tree, ["runs", "--depths", d, "--repeat", str(a.repeat), "--threads", th])["median_ms"]
           for n, tree in trees}
      ratio = f" | {r['this'] / r['baseline']:.2f} |" if a.baseline else " |"
      print(f"| {th} | {d} | " + " | ".join(f"{r[n]:.2f}" for n, _ in trees) + ratio)


if __name__ == "__main__":
  main()
