"""pygrad as tinygrad's gradient engine, against tinygrad's own, side by side in one run.

    python bench/bench_tinygrad.py [--reps 3] [--w1 2000] [--w2 32] [--out bench/results/tinygrad.md]
    TRACEMETA=0 python bench/bench_tinygrad.py    # no tinygrad metadata: bench/results/tinygrad_tracemeta0.md

For each workload (pygrad.bench's W1 residual MLP chain and W2 transformer block stack, built with tinygrad's
Tensor API on unrealized Tensor.empty inputs), on the same graph, alternating: tinygrad's own compute_gradient, and
pygrad.interop.tinygrad.compute_gradient split into its phases (convert in, derive, convert out, release). Then the
conversions on their own, every node: from_tinygrad of the whole forward graph and to_tinygrad back (a fresh
conversion, rebuilding every node through tinygrad's hash-consing). Nothing is realized. Medians of --reps runs,
after a warm-up derivation of a tiny instance (both engines' per-process caches primed).

tinygrad's Tensor API records metadata (the Tensor method that made a node) unless TRACEMETA=0; both engines then
copy it onto the gradient (tinygrad by a toposort per edge, pygrad by running the rules of nodes with metadata in
Python instead of instantiating its C templates), so the two settings are measured apart.
"""
from __future__ import annotations
import argparse, gc, os, platform, statistics, sys, time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DEV", "CPU")
from tinygrad import Tensor  # noqa: E402
import tinygrad.mixin.gradient as tg_gradient  # noqa: E402
from tinygrad.uop.ops import UOp as TUOp  # noqa: E402
import pygrad  # noqa: E402
from pygrad import bench as pb  # noqa: E402
import pygrad.interop.tinygrad as pt  # noqa: E402
from pygrad.intern import ARGS  # noqa: E402

TG_OWN = tg_gradient.compute_gradient
TRACEMETA = os.environ.get("TRACEMETA", "1")


def build(wl: str, size: int):
  args = pb.map_shapes(pb.input_shapes(wl, size), lambda s: Tensor.empty(*s))
  root = pb.MODELS[wl](pb.MethodOps, *args)
  targets = [t.uop for t in pb.flat(args)]
  return root.uop, root.uop.const_like(1.0), targets


def timed(fn):
  """fn() and its time, after earlier work's garbage is freed: Python's (gc.collect) and pygrad's (the interner's
  drain forgets the args of nodes dropped since, e.g. the previous repetition's from_tinygrad result, whose
  BUFFER args hold that repetition's tinygrad graph), so that no phase pays for freeing what an earlier one made."""
  gc.collect()
  ARGS.drain()
  t = time.perf_counter()
  r = fn()
  return r, time.perf_counter() - t


def one_run(wl: str, size: int) -> dict:
  root, rg, targets = build(wl, size)
  r = {"nodes": len(root.toposort())}
  own, r["own_s"] = timed(lambda: TG_OWN(root, rg, set(targets)))
  assert all(t in own for t in targets)
  del own
  (cin, proot, pgrad, ptargets), r["in_s"] = timed(lambda: pt.convert_in(root, rg, targets))
  grads, r["derive_s"] = timed(lambda: pt.derive(cin, proot, pgrad, ptargets))
  ours, r["out_s"] = timed(lambda: pt.convert_out(cin, root, rg, ptargets, grads))
  assert all(t in ours for t in targets)
  r["in_nodes"] = len(cin.memo)
  del proot, pgrad, ptargets, grads
  _, r["release_s"] = timed(lambda: pt.release(cin))
  sink = TUOp.sink(*ours.values())  # one walk over all gradients: one toposort each is quadratic in W1's depth
  fresh = {id(u) for u in sink.toposort()} - {id(u) for u in root.toposort()} - {id(sink)}
  r["out_nodes"] = len(fresh)
  r["ours_s"] = r["in_s"] + r["derive_s"] + r["out_s"] + r["release_s"]
  del cin, ours, sink
  # the conversions alone, every node both ways
  p, r["from_s"] = timed(lambda: pt.from_tinygrad(root))
  r["from_nodes"] = len(p.toposort())
  back, r["to_s"] = timed(lambda: pt.to_tinygrad(p))
  assert back is root
  return r


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--reps", type=int, default=3)
  ap.add_argument("--w1", type=int, default=2000, help="W1 depth")
  ap.add_argument("--w2", type=int, default=32, help="W2 blocks")
  ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" /
                                      ("tinygrad.md" if TRACEMETA == "1" else f"tinygrad_tracemeta{TRACEMETA}.md")))
  a = ap.parse_args()
  if pygrad.core_name() != "c": print("note: pygrad runs its pure-Python core here", file=sys.stderr)
  for wl in ("W1", "W2"):  # warm-up: patterns compiled, gradient templates cached, in both engines
    root, rg, targets = build(wl, 2)
    TG_OWN(root, rg, set(targets))
    pt.compute_gradient(root, rg, targets)
  rows, a.load = [], [os.getloadavg()[0]]
  for wl, size in (("W1", a.w1), ("W2", a.w2)):
    runs = [one_run(wl, size) for _ in range(a.reps)]
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    rows.append((wl, size, med))
    print(wl, size, {k: round(v, 4) for k, v in med.items()}, flush=True)
  a.load.append(os.getloadavg()[0])
  write(a, rows)


def write(a, rows) -> None:
  us = 1e6
  lines = [
    "# pygrad as tinygrad's gradient engine", "",
    f"`{'' if TRACEMETA == '1' else f'TRACEMETA={TRACEMETA} '}python bench/bench_tinygrad.py --reps {a.reps} "
    f"--w1 {a.w1} --w2 {a.w2}` on {platform.machine()}, "
    f"Python {platform.python_version()}, tinygrad 0.14.0 (TRACEMETA={TRACEMETA}: metadata "
    f"{'recorded' if TRACEMETA != '0' else 'off'}), pygrad {pygrad.core_name()} core, "
    f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. Medians of {a.reps} runs; each run builds the graph "
    "afresh (tinygrad Tensor API, unrealized inputs) and times both engines on it, one after the other; before each "
    "timed phase, earlier work's garbage is freed (gc.collect, and pygrad's interner drained). The "
    "machine was shared with other jobs (1-minute load average at the start and the end: "
    f"{a.load[0]:.1f}, {a.load[-1]:.1f} on {os.cpu_count()} CPUs): absolute times are under load, the ratios are "
    "side by side.", "",
    "`own`: tinygrad's `compute_gradient(root, root_grad, targets)`. `pygrad`: "
    "`pygrad.interop.tinygrad.compute_gradient` on the same arguments (what `install()` makes `Tensor.backward` "
    "call), split into convert in (the graph above the targets into pygrad; everything else one opaque node "
    "each), derive (pygrad's compute_gradient, C core), convert out (the targets' gradients back, forward nodes "
    "reused) and release (the conversion's pygrad nodes freed and the interner drained, so that no tinygrad node "
    "is kept alive past the call).", "",
    "| workload | size | forward nodes | own (s) | pygrad (s) | convert in (s) | derive (s) | convert out (s) "
    "| release (s) | speedup | in: nodes, us/node | out: new nodes, us/node |",
    "|---|---|---|---|---|---|---|---|---|---|---|---|"]
  for wl, size, m in rows:
    lines.append(f"| {wl} | {pb.SIZE_NAME[wl]} {size:,} | {int(m['nodes']):,} | {m['own_s']:.3g} | {m['ours_s']:.3g} "
                 f"| {m['in_s']:.3g} | {m['derive_s']:.3g} | {m['out_s']:.3g} | {m['release_s']:.3g} "
                 f"| {m['own_s'] / m['ours_s']:.1f}x "
                 f"| {int(m['in_nodes']):,}, {m['in_s'] / m['in_nodes'] * us:.2f} "
                 f"| {int(m['out_nodes']):,}, {m['out_s'] / max(m['out_nodes'], 1) * us:.2f} |")
  lines += ["", "Whole-graph conversions (every node of the forward graph; to_tinygrad is a fresh conversion that "
            "rebuilds every node through tinygrad's constructors and gets tinygrad's own nodes back):", "",
            "| workload | size | tinygrad nodes | pygrad nodes | from_tinygrad (s) | us/tinygrad node "
            "| to_tinygrad (s) | us/pygrad node |", "|---|---|---|---|---|---|---|---|"]
  for wl, size, m in rows:
    lines.append(f"| {wl} | {pb.SIZE_NAME[wl]} {size:,} | {int(m['nodes']):,} | {int(m['from_nodes']):,} "
                 f"| {m['from_s']:.3g} | {m['from_s'] / m['nodes'] * us:.2f} | {m['to_s']:.3g} "
                 f"| {m['to_s'] / m['from_nodes'] * us:.2f} |")
  Path(a.out).parent.mkdir(parents=True, exist_ok=True)
  Path(a.out).write_text("\n".join(lines) + "\n")
  print("wrote", a.out)


if __name__ == "__main__":
  main()
