"""The C interpreter against numpy eager, numexpr, jax.jit and torch eager (each when installed), single thread, on
the workloads of the interpreter issue; then the interpreter on all threads against its own single thread: the
fused expression on 10M float32 for three input distributions (vs numpy eager), and (x*y).sum(1) on 4096^2 against
the machine's copy bandwidth measured in the same run. Engines alternate inside every repetition; figures are
medians. Run: python bench/bench_interp.py [--reps N] [--only threaded] [--out DIR]   (writes DIR/interp.md,
bench/results by default; --only threaded prints the all-threads section alone)"""
from __future__ import annotations
import os
for _v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS",
           "VECLIB_MAXIMUM_THREADS"):
  os.environ[_v] = "1"
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
import argparse, platform, statistics, sys, time  # noqa: E402
HERE = os.path.dirname(os.path.abspath(__file__))
# this checkout's pygrad, not whichever one is installed (an editable install of another worktree would be timed)
if os.path.isdir(os.path.join(os.path.dirname(HERE), "pygrad")): sys.path.insert(0, os.path.dirname(HERE))
import numpy as np  # noqa: E402

import pygrad  # noqa: E402
from pygrad import UOp, dtypes  # noqa: E402
from pygrad.engine.program import compile_program  # noqa: E402
from pygrad.engine import vmlib  # noqa: E402

F32 = dtypes.float32


def _peers():
  peers = {}
  try:
    import numexpr
    numexpr.set_num_threads(1)
    peers["numexpr"] = numexpr
  except ImportError:
    pass
  try:
    import jax
    import jax.numpy as jnp
    peers["jax"] = (jax, jnp)
  except ImportError:
    pass
  try:
    import torch
    torch.set_num_threads(1)
    peers["torch"] = torch
  except ImportError:
    pass
  return peers


def _jit(jax, f, *xs):
  g = jax.jit(f)
  dev = [jax.device_put(x) for x in xs]
  g(*dev).block_until_ready()
  return lambda: g(*dev).block_until_ready()


def workloads(peers):
  """[(name, unit, work (bytes or flops or ops), {engine: callable}, note)]"""
  rng = np.random.default_rng(0)
  out = []
  # 1. the expression over 4M float32
  n = 4_000_000
  A, B, C = (rng.standard_normal(n).astype(np.float32) for _ in range(3))
  a, b, c = (UOp.placeholder((n,), F32, k) for k in "abc")
  e = (a * b + c).sin() * a.exp2() + b.abs().sqrt() / (c * c + 1) - a.maximum(b)
  p = compile_program([e], [a, b, c])
  fs = {"pygrad": lambda: p(A, B, C),
        "numpy": lambda: np.sin(A * B + C) * np.exp2(A) + np.sqrt(np.abs(B)) / (C * C + 1) - np.maximum(A, B)}
  if "numexpr" in peers:
    ne = peers["numexpr"]
    fs["numexpr"] = lambda: ne.evaluate("sin(a*b+c)*exp(a*0.6931471805599453) + sqrt(abs(b))/(c*c+1) - where(a>b,a,b)",
                                        local_dict={"a": A, "b": B, "c": C})
  if "jax" in peers:
    jax, jnp = peers["jax"]
    fs["jax.jit"] = _jit(jax, lambda a, b, c: jnp.sin(a * b + c) * jnp.exp2(a) + jnp.sqrt(jnp.abs(b)) / (c * c + 1)
                         - jnp.maximum(a, b), A, B, C)
  if "torch" in peers:
    t = peers["torch"]
    tA, tB, tC = (t.from_numpy(x) for x in (A, B, C))
    fs["torch"] = lambda: t.sin(tA * tB + tC) * t.exp2(tA) + t.sqrt(t.abs(tB)) / (tC * tC + 1) - t.maximum(tA, tB)
  out.append(("sin(a*b+c)*exp2(a)+sqrt(abs(b))/(c*c+1)-max(a,b), 4M f32", "ms", None, fs,
              f"pygrad: {p.stats['kernels']} kernel, peak {p.stats['peak_bytes']} B of temporaries"))
  # 2. reduce over an elementwise expression, and a plain sum
  X, Y = rng.standard_normal((4096, 4096)).astype(np.float32), rng.standard_normal((4096, 4096)).astype(np.float32)
  x, y = UOp.placeholder(X.shape, F32, "x"), UOp.placeholder(Y.shape, F32, "y")
  pr = compile_program([(x * y).sum(axis=1)], [x, y])
  fs = {"pygrad": lambda: pr(X, Y), "numpy": lambda: (X * Y).sum(1),
        "numpy einsum": lambda: np.einsum("ij,ij->i", X, Y)}
  if "numexpr" in peers:
    fs["numexpr"] = lambda: peers["numexpr"].evaluate("sum(X*Y, axis=1)", local_dict={"X": X, "Y": Y})
  if "jax" in peers:
    jax, jnp = peers["jax"]
    fs["jax.jit"] = _jit(jax, lambda a, b: (a * b).sum(1), X, Y)
  if "torch" in peers:
    t = peers["torch"]
    tX, tY = t.from_numpy(X), t.from_numpy(Y)
    fs["torch"] = lambda: (tX * tY).sum(1)
  out.append(("(x*y).sum(axis=1), 4096x4096 f32", "GB/s", 2 * X.nbytes, fs,
              f"pygrad: {pr.stats['kernels']} kernel, peak {pr.stats['peak_bytes']} B of temporaries"))
  ps = compile_program([x.sum(axis=1)], [x])
  fs = {"pygrad": lambda: ps(X), "numpy": lambda: X.sum(1)}
  if "jax" in peers:
    jax, jnp = peers["jax"]
    fs["jax.jit"] = _jit(jax, lambda a: a.sum(1), X)
  if "torch" in peers:
    tX = peers["torch"].from_numpy(X)
    fs["torch"] = lambda: tX.sum(1)
  out.append(("a.sum(axis=1), 4096x4096 f32", "GB/s", X.nbytes, fs, ""))
  # 3. matmul written as x @ w (reshape/expand/mul/sum in the IR)
  M, W = rng.standard_normal((384, 384)).astype(np.float32), rng.standard_normal((384, 384)).astype(np.float32)
  m, w = UOp.placeholder(M.shape, F32, "m"), UOp.placeholder(W.shape, F32, "w")
  pm = compile_program([m @ w], [m, w])
  fs = {"pygrad": lambda: pm(M, W), "numpy": lambda: M @ W}
  if "jax" in peers:
    jax, jnp = peers["jax"]
    fs["jax.jit"] = _jit(jax, lambda a, b: a @ b, M, W)
  if "torch" in peers:
    tM, tW = peers["torch"].from_numpy(M), peers["torch"].from_numpy(W)
    fs["torch"] = lambda: tM @ tW
  out.append(("matmul 384x384x384 f32 (x @ w)", "GFLOP/s", 2 * 384 ** 3, fs,
              f"pygrad: {pm.stats['contractions']} contraction, peak {pm.stats['peak_bytes']} B of temporaries "
              f"(the expanded product would be {384 ** 3 * 4} B)"))
  # 4. a chain of 1,000 ops on 16x16
  Z = rng.standard_normal((16, 16)).astype(np.float32)
  z = UOp.placeholder(Z.shape, F32, "z")
  h = z
  steps = [lambda q: q * 1.0001, lambda q: q + 0.01, lambda q: q.sin(), lambda q: q.maximum(0.1)]
  for i in range(1000): h = steps[i % 4](h)
  t0 = time.perf_counter()
  pc = compile_program([h], [z])
  t_compile = time.perf_counter() - t0
  np_steps = [lambda q: q * np.float32(1.0001), lambda q: q + np.float32(0.01), np.sin,
              lambda q: np.maximum(q, np.float32(0.1))]

  def np_chain():
    q = Z
    for i in range(1000): q = np_steps[i % 4](q)
    return q
  fs = {"pygrad": lambda: pc(Z), "numpy": np_chain}
  if "jax" in peers:
    jax, jnp = peers["jax"]
    j_steps = [lambda q: q * 1.0001, lambda q: q + 0.01, jnp.sin, lambda q: jnp.maximum(q, 0.1)]

    def jchain(q):
      for i in range(1000): q = j_steps[i % 4](q)
      return q
    fs["jax.jit"] = _jit(jax, jchain, Z)
  if "torch" in peers:
    t = peers["torch"]
    tZ = t.from_numpy(Z)
    t_steps = [lambda q: q * 1.0001, lambda q: q + 0.01, t.sin, lambda q: t.clamp_min(q, 0.1)]

    def tchain():
      q = tZ
      for i in range(1000): q = t_steps[i % 4](q)
      return q
    fs["torch"] = tchain
  out.append(("chain of 1,000 ops on 16x16 f32", "us/op", 1000, fs,
              f"pygrad: compiled once in {t_compile * 1e3:.0f} ms into {pc.stats['kernels']} kernel"))
  # 5. the same length with a reduction and a matmul every 4 ops: no longer one fused kernel
  mixed = [lambda q: q * 1.0001, lambda q: q - q.max(1, keepdim=True), lambda q: q.sin(), lambda q: (q @ z) * 0.01]
  h = z
  for i in range(1000): h = mixed[i % 4](h)
  pk = compile_program([h], [z])
  np_mixed = [lambda q: q * np.float32(1.0001), lambda q: q - q.max(1, keepdims=True), np.sin,
              lambda q: (q @ Z) * np.float32(0.01)]

  def np_mchain():
    q = Z
    for i in range(1000): q = np_mixed[i % 4](q)
    return q
  fs = {"pygrad": lambda: pk(Z), "numpy": np_mchain}
  if "jax" in peers:
    jax, jnp = peers["jax"]
    j_mixed = [lambda q, w: q * 1.0001, lambda q, w: q - q.max(1, keepdims=True), lambda q, w: jnp.sin(q),
               lambda q, w: (q @ w) * 0.01]

    def jmchain(q):
      w = q
      for i in range(1000): q = j_mixed[i % 4](q, w)
      return q
    fs["jax.jit"] = _jit(jax, jmchain, Z)
  if "torch" in peers:
    t = peers["torch"]
    tZ = t.from_numpy(Z)
    t_mixed = [lambda q: q * 1.0001, lambda q: q - q.amax(1, keepdim=True), t.sin, lambda q: (q @ tZ) * 0.01]

    def tmchain():
      q = tZ
      for i in range(1000): q = t_mixed[i % 4](q)
      return q
    fs["torch"] = tmchain
  out.append(("chain of 1,000 ops on 16x16 f32, a max-reduce and a matmul every 4", "us/op", 1000, fs,
              f"pygrad: {pk.stats['kernels']} kernels ({pk.stats['contractions']} contractions)"))
  return out


def _alternate(fs: dict, reps: int) -> dict:
  """{name: median seconds} of the callables in fs, alternating inside every repetition. A value may be a pair
  (setup, fn): setup runs before each timed call (the thread count of that engine)."""
  fs = {k: v if isinstance(v, tuple) else (lambda: None, v) for k, v in fs.items()}
  for setup, f in fs.values():
    setup()
    f()
  times = {k: [] for k in fs}
  for _ in range(reps):
    for k, (setup, f) in fs.items():
      setup()
      t = time.perf_counter()
      f()
      times[k].append(time.perf_counter() - t)
  return {k: statistics.median(v) for k, v in times.items()}


def threaded(reps: int) -> str:
  """The thread-pool section: markdown with its target verdicts."""
  nall = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
  one, every = (lambda: pygrad.set_num_threads(1)), (lambda: pygrad.set_num_threads(nall))
  rng = np.random.default_rng(1)
  n = 10_000_000
  a, b, c = (UOp.placeholder((n,), F32, k) for k in "abc")
  p = compile_program([(a * b + c).sin() * a.exp2() + b.abs().sqrt() / (c * c + 1) - a.maximum(b)], [a, b, c])
  lines = [f"\n## All threads ({nall}) against one\n",
           f"`pygrad.set_num_threads(1)` vs `({nall})`, the same compiled program, alternating; numpy eager is "
           "single-threaded.\n",
           "| workload | inputs | pygrad 1 thread | pygrad all threads | numpy eager | all vs 1 thread | all vs numpy |"
           " target |", "|---|---|---:|---:|---:|---:|---:|---|"]
  dists = {"standard normal": lambda: rng.standard_normal(n), "uniform(0.5, 2)": lambda: rng.uniform(0.5, 2, n),
           "uniform(-100, 100)": lambda: rng.uniform(-100, 100, n)}
  for dname, draw in dists.items():
    A, B, C = (draw().astype(np.float32) for _ in range(3))
    med = _alternate({"1": (one, lambda: p(A, B, C)), "all": (every, lambda: p(A, B, C)),
                      "numpy": lambda: np.sin(A * B + C) * np.exp2(A) + np.sqrt(np.abs(B)) / (C * C + 1)
                      - np.maximum(A, B)}, reps)
    s1, sn = med["1"] / med["all"], med["numpy"] / med["all"]
    ok = "PASS" if s1 >= 1.8 and sn >= 4 else "MISS"
    lines.append(f"| fused expression, 10M f32 | {dname} | {med['1'] * 1e3:.1f} ms | {med['all'] * 1e3:.1f} ms | "
                 f"{med['numpy'] * 1e3:.1f} ms | {s1:.2f}x | {sn:.2f}x | {ok} (>= 1.8x own, >= 4x numpy) |")
    del A, B, C
  X = rng.standard_normal((4096, 4096)).astype(np.float32)
  Y = rng.standard_normal((4096, 4096)).astype(np.float32)
  D = np.empty_like(X)
  x, y = UOp.placeholder(X.shape, F32, "x"), UOp.placeholder(Y.shape, F32, "y")
  pr = compile_program([(x * y).sum(axis=1)], [x, y])
  med = _alternate({"1": (one, lambda: pr(X, Y)), "all": (every, lambda: pr(X, Y)),
                    "copy": lambda: np.copyto(D, X)}, reps)
  bw = {k: 2 * X.nbytes / v / 1e9 for k, v in med.items()}  # bytes moved: two operands read; a copy reads+writes
  ok = "PASS" if bw["all"] >= 0.9 * bw["copy"] else "MISS"
  lines += ["", "| workload | pygrad 1 thread | pygrad all threads | copy bandwidth (np.copyto, read + write) | "
            "all threads vs copy | target |", "|---|---:|---:|---:|---:|---|",
            f"| (x*y).sum(1), 4096x4096 f32 (GB/s read) | {bw['1']:.1f} GB/s | {bw['all']:.1f} GB/s | "
            f"{bw['copy']:.1f} GB/s | {bw['all'] / bw['copy']:.2f}x | {ok} (>= 0.9x) |"]
  pygrad.set_num_threads(nall)
  return "\n".join(lines) + "\n"


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--reps", type=int, default=15)
  ap.add_argument("--only", choices=["all", "threaded"], default="all",
                  help="threaded: only the all-threads-against-one section (printed, interp.md left as it is)")
  ap.add_argument("--out", default=os.path.join(HERE, "results"), help="folder for interp.md")
  args = ap.parse_args()
  print(f"pygrad from {os.path.dirname(pygrad.__file__)}, VM ISA {vmlib.isa_name()}", file=sys.stderr)
  if args.only == "threaded":
    print(threaded(args.reps))
    return
  pygrad.set_num_threads(1)  # the comparison with single-threaded peers; threaded() below uses every core
  peers = _peers()
  rows = []
  for name, unit, work, fs, note in workloads(peers):
    for f in fs.values(): f()  # warm up
    times = {k: [] for k in fs}
    for _ in range(args.reps):
      for k, f in fs.items():  # alternate engines inside each repetition
        t = time.perf_counter()
        f()
        times[k].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, t in med.items():
      if unit == "ms": fig = t * 1e3
      elif unit == "us/op": fig = t * 1e6 / work
      elif unit == "GB/s": fig = work / t / 1e9
      else: fig = work / t / 1e9
      rel = med["numpy"] / t if "numpy" in med else float("nan")
      rows.append((name, k, fig, unit, rel))
    rows.append((name, "", None, note, None))
  ver = {"numpy": np.__version__}
  for k, mod in peers.items():
    ver[k] = (mod[0] if isinstance(mod, tuple) else mod).__version__
  head = (f"# Interpreter benchmark\n\n`python bench/bench_interp.py --reps {args.reps}` on {platform.machine()} "
          f"({os.cpu_count()} CPUs), one thread everywhere (the last section: all threads), VM ISA "
          f"`{vmlib.isa_name()}`, medians of {args.reps} "
          f"alternating runs. Versions: {', '.join(f'{k} {v}' for k, v in ver.items())}.\n\n"
          "| workload | engine | figure | unit | speed vs numpy eager |\n|---|---|---:|---|---:|\n")
  lines = []
  for name, k, fig, unit, rel in rows:
    if fig is None:
      if unit: lines.append(f"| | | | {unit} | |")
      continue
    lines.append(f"| {name} | {k} | {fig:.3f} | {unit} | {rel:.2f}x |")
  text = head + "\n".join(lines) + "\n" + threaded(args.reps)
  print(text)
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "interp.md"), "w") as f: f.write(text)


if __name__ == "__main__":
  main()
