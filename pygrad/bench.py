"""The gradient benchmark suite (`python -m pygrad bench`): graph construction and gradient derivation of three
workloads, for pygrad on its C core and on its pure-Python core, tinygrad 0.14.0 and JAX, side by side.

W1  residual MLP chain `y = (y @ w).relu().exp2().sin() + y`, 16x16, targets x and every w (size: depth)
W2  unrolled pre-norm transformer blocks: 2-head attention with softmax, layernorm, ReLU MLP (size: blocks)
W3  a random DAG: a chain of unary/binary ops with fan-in from the last 64 nodes and from leaves (size: ops)

Every measurement runs in a fresh subprocess (tinygrad and JAX import slowly and keep caches; the pygrad core is
chosen at import), after a warm-up derivation of a tiny instance of the same workload in that process, so every
framework is measured with its per-process caches (pattern compilation, pygrad's gradient templates) primed.
Repeats alternate the frameworks; the report takes medians. Nothing is realized or executed: graph construction
and gradient derivation only (JAX: `make_jaxpr(f)` and `make_jaxpr(grad(f))`).
"""
from __future__ import annotations
import argparse, gc, importlib.util, json, math, os, platform, random, statistics, subprocess, sys, time
from array import array

FRAMEWORKS = ("pygrad-c", "pygrad-py", "tinygrad", "jax")
ALIASES = {"c": "pygrad-c", "python": "pygrad-py", "py": "pygrad-py", "pure": "pygrad-py", "tinygrad": "tinygrad",
           "jax": "jax", **{f: f for f in FRAMEWORKS}}
LABEL = {"pygrad-c": "pygrad C core", "pygrad-py": "pygrad pure core", "tinygrad": "tinygrad 0.14.0", "jax": "JAX"}
WORKLOADS = ("W1", "W2", "W3")
SIZE_NAME = {"W1": "depth", "W2": "blocks", "W3": "ops"}
SIZES = {"full": {"W1": (400, 500, 2000, 8000), "W2": (8, 32, 128), "W3": (10_000, 100_000, 1_000_000)},
         "quick": {"W1": (20, 100), "W2": (1, 2), "W3": (2_000, 10_000)}}
WARMUP = {"W1": 3, "W2": 1, "W3": 500}
ONCE_AFTER_S = 60.0  # a measurement whose first run took longer is not repeated
TIMEOUT_S = 600.0  # per measurement; one that runs out still reports its build (see run_one)
MIN_NODES_FOR_BYTES = 5000
W2_SEQ, W2_DIM, W2_HEADS = 16, 32, 2


# ---------------------------------------------------------------- models (one code path for every framework)
class MethodOps:
  """pygrad UOps and tinygrad Tensors share these method names."""
  relu = staticmethod(lambda x: x.relu())
  exp2 = staticmethod(lambda x: x.exp2())
  sin = staticmethod(lambda x: x.sin())
  sqrt = staticmethod(lambda x: x.sqrt())
  recip = staticmethod(lambda x: x.reciprocal())
  maximum = staticmethod(lambda a, b: a.maximum(b))
  total = staticmethod(lambda x: x.sum())
  mean_last = staticmethod(lambda x: x.mean(-1, keepdim=True))
  softmax_last = staticmethod(lambda x: x.softmax(-1))
  swap_last = staticmethod(lambda x: x.transpose(-1, -2))
  split_heads = staticmethod(lambda x, s, h, d: x.reshape(s, h, d).permute(1, 0, 2))
  merge_heads = staticmethod(lambda x, s, d: x.permute(1, 0, 2).reshape(s, d))


def jax_ops():
  import jax, jax.numpy as jnp

  class JaxOps:
    relu = staticmethod(jax.nn.relu)
    exp2 = staticmethod(jnp.exp2)
    sin = staticmethod(jnp.sin)
    sqrt = staticmethod(jnp.sqrt)
    recip = staticmethod(jnp.reciprocal)
    maximum = staticmethod(jnp.maximum)
    total = staticmethod(jnp.sum)
    mean_last = staticmethod(lambda x: jnp.mean(x, axis=-1, keepdims=True))
    softmax_last = staticmethod(lambda x: jax.nn.softmax(x, axis=-1))
    swap_last = staticmethod(lambda x: jnp.swapaxes(x, -1, -2))
    split_heads = staticmethod(lambda x, s, h, d: jnp.transpose(x.reshape(s, h, d), (1, 0, 2)))
    merge_heads = staticmethod(lambda x, s, d: jnp.transpose(x, (1, 0, 2)).reshape(s, d))
  return JaxOps


def w1_model(F, x, ws):
  y = x
  for w in ws: y = F.sin(F.exp2(F.relu(y @ w))) + y
  return F.total(y)


def _layernorm(F, x, g, b):
  xc = x - F.mean_last(x)
  return xc * F.recip(F.sqrt(F.mean_last(xc * xc) + 1e-5)) * g + b


def w2_model(F, x, blocks):
  s, d, h = W2_SEQ, W2_DIM, W2_HEADS
  dh = d // h
  for wq, wk, wv, wo, w1, w2, g1, b1, g2, b2 in blocks:
    a = _layernorm(F, x, g1, b1)
    q, k, v = (F.split_heads(a @ w, s, h, dh) for w in (wq, wk, wv))
    att = F.softmax_last((q @ F.swap_last(k)) * (1.0 / math.sqrt(dh)))
    x = x + F.merge_heads(att @ v, s, d) @ wo
    x = x + F.relu(_layernorm(F, x, g2, b2) @ w1) @ w2
  return F.total(x)


def w3_script(n: int, seed: int = 0):
  """The random DAG as data: op codes (0 add, 1 mul, 2 max, 3 sin, 4 exp2, 5 reciprocal, 6 sqrt) and, for binary
  ops, the second operand: a leaf index (>= 0) or -k, the node k steps back (2 <= k <= 64)."""
  rng = random.Random(seed)
  n_leaves = max(8, min(1000, n // 100))
  ops, sel, nb = array("b"), array("i"), 0
  for _ in range(n):
    r = rng.random()
    o = 0 if r < .3 else 1 if r < .5 else 2 if r < .6 else 3 if r < .75 else 4 if r < .85 else 5 if r < .95 else 6
    ops.append(o)
    if o < 3:
      sel.append((nb // 10) % n_leaves if nb % 10 == 0 else -rng.randint(2, 64))
      nb += 1
    else:
      sel.append(0)
  return n_leaves, ops, sel


def w3_model(F, leaves, script):
  _, ops, sel = script
  ring = [leaves[i % len(leaves)] for i in range(64)]
  cur = leaves[0]
  for i in range(len(ops)):
    o = ops[i]
    if o < 3:
      s = sel[i]
      b = leaves[s] if s >= 0 else ring[(i + s) % 64]
      cur = cur + b if o == 0 else cur * b if o == 1 else F.maximum(cur, b)
    else:
      cur = F.sin(cur) if o == 3 else F.exp2(cur) if o == 4 else F.recip(cur) if o == 5 else F.sqrt(cur)
    ring[i % 64] = cur
  return F.total(cur)


def input_shapes(wl: str, size: int, script=None) -> list:
  """The model's inputs as a (nested) list of shapes: the arguments of its model function."""
  if wl == "W1": return [(16, 16), [(16, 16)] * size]
  if wl == "W2":
    s, d = W2_SEQ, W2_DIM
    return [(s, d), [((d, d),) * 4 + ((d, 4 * d), (4 * d, d)) + ((d,),) * 4 for _ in range(size)]]
  return [[(8,)] * script[0]]


def flat(tree) -> list:
  """The inputs (framework objects) in nested lists/tuples, flattened in order."""
  out, stack = [], [tree]
  while stack:
    t = stack.pop()
    if isinstance(t, (list, tuple)): stack.extend(reversed(t))
    else:
      out.append(t)
  return out


def map_shapes(tree, mk):
  if isinstance(tree, tuple) and all(isinstance(s, int) for s in tree): return mk(tree)
  return type(tree)(map_shapes(t, mk) for t in tree)


MODELS = {"W1": w1_model, "W2": w2_model, "W3": w3_model}


# ---------------------------------------------------------------- the worker (one measurement per process)
def _rss() -> int:
  try:
    with open("/proc/self/statm") as f: return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
  except (OSError, ValueError, AttributeError):
    import resource  # peak, not current: only an upper bound on growth where /proc is missing
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _timed(fn):
  gc.collect()
  t = time.perf_counter()
  r = fn()
  return r, time.perf_counter() - t


def _median_time(fn, budget_s: float = 1.0, most: int = 5) -> float:
  ts = []
  while len(ts) < most and sum(ts) < budget_s:
    ts.append(_timed(fn)[1])
  return statistics.median(ts)


def measure(fw: str, wl: str, size: int, warmup: bool = True, built=lambda r: None) -> dict:
  """Build the workload in framework `fw`, then time its toposort and gradient derivation; `built` gets the
  figures known before the gradient (a gradient that never ends still leaves them)."""
  script = w3_script(size) if wl == "W3" else None
  model = MODELS[wl]
  if fw == "jax": return _measure_jax(wl, size, script, model, warmup, built)
  if fw == "tinygrad":
    from tinygrad import Tensor

    def leaf(shape): return Tensor.empty(*shape)
    def topo(root): return len(root.uop.toposort())
  else:
    import pygrad
    want = "c" if fw == "pygrad-c" else "python"
    if pygrad.core_name() != want: raise RuntimeError(f"{fw}: this process runs the {pygrad.core_name()} core")
    from pygrad import UOp

    def leaf(shape): return UOp.placeholder(shape)
    def topo(root): return len(root.toposort())

  def build(sz, scr):
    args = map_shapes(input_shapes(wl, sz, scr), leaf)
    return model(MethodOps, *args, *([scr] if scr is not None else [])), flat(args)

  if warmup:
    ws = w3_script(WARMUP[wl]) if wl == "W3" else None
    root, targets = build(WARMUP[wl], ws)
    root.gradient(*targets)
    del root, targets
  r0 = (gc.collect(), _rss())[1]
  (root, targets), t_build = _timed(lambda: build(size, script))
  gc.collect()
  grown = _rss() - r0
  nodes = topo(root)
  t_topo = _median_time(lambda: topo(root))
  r = {"nodes": nodes, "build_s": t_build, "topo_s": t_topo, "bytes_per_node": grown / nodes}
  built(r)
  grads, t_grad = _timed(lambda: root.gradient(*targets))
  assert len(grads) == len(targets)
  return {**r, "grad_s": t_grad}


def _measure_jax(wl, size, script, model, warmup, built):
  import jax
  import jax.numpy as jnp
  F = jax_ops()

  def spec(sz, scr):
    args = map_shapes(input_shapes(wl, sz, scr), lambda s: jax.ShapeDtypeStruct(s, jnp.float32))
    f = (lambda *a: model(F, *a, scr)) if scr is not None else (lambda *a: model(F, *a))
    return f, args

  if warmup:
    f, args = spec(WARMUP[wl], w3_script(WARMUP[wl]) if wl == "W3" else None)
    jax.make_jaxpr(jax.grad(f, argnums=tuple(range(len(args)))))(*args)
  f, args = spec(size, script)
  r0 = (gc.collect(), _rss())[1]
  jp, t_build = _timed(lambda: jax.make_jaxpr(f)(*args))
  gc.collect()
  grown = _rss() - r0
  r = {"nodes": len(jp.eqns), "build_s": t_build, "topo_s": None, "bytes_per_node": grown / len(jp.eqns)}
  built(r)
  jg, t_grad = _timed(lambda: jax.make_jaxpr(jax.grad(f, argnums=tuple(range(len(args)))))(*args))
  return {**r, "grad_s": t_grad, "grad_nodes": len(jg.eqns)}


def worker_main(spec: str) -> None:
  s = json.loads(spec)
  r = measure(s["fw"], s["wl"], s["size"], s.get("warmup", True),
              built=lambda b: print("BUILT " + json.dumps(b), flush=True))
  print("RESULT " + json.dumps(r), flush=True)


# ---------------------------------------------------------------- the driver
def available(wanted) -> tuple[list[str], list[str]]:
  """(frameworks that can run here, notes on those that cannot)."""
  ok, notes = [], []
  for fw in wanted:
    if fw == "pygrad-c":
      try:
        found = importlib.util.find_spec("pygrad._core") is not None
      except (ImportError, ValueError):
        found = False
      if not found:
        notes.append("pygrad C core: not built (pip install . or setup.py build_ext --inplace), skipped")
        continue
    if fw in ("tinygrad", "jax"):
      if importlib.util.find_spec(fw) is None:
        notes.append(f"{fw}: not installed, skipped (peers are the optional extra: pip install 'pygrad[bench]')")
        continue
      if fw == "tinygrad":
        from importlib.metadata import version
        v = version("tinygrad")
        if v != "0.14.0": notes.append(f"tinygrad: version {v} is installed, the targets name 0.14.0")
    ok.append(fw)
  return ok, notes


def _env(fw: str) -> dict:
  env = dict(os.environ)
  here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env["PYTHONPATH"] = here + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
  env["PYGRAD_CORE"] = "python" if fw == "pygrad-py" else "c" if fw == "pygrad-c" else \
    env.get("PYGRAD_CORE", "python")
  if fw == "tinygrad": env["DEV"] = "CPU"
  if fw == "jax": env["JAX_PLATFORMS"] = "cpu"
  # nothing measured here calls BLAS, but numpy's OpenBLAS threads spin for a while after import: on a 2-core
  # machine they take a core from the measurement
  env.setdefault("OPENBLAS_NUM_THREADS", "1")
  return env


def _last(out, tag: str) -> dict | None:
  """The JSON of the worker's last `tag` line in its output, if any."""
  if isinstance(out, bytes): out = out.decode(errors="replace")  # what a timeout leaves is not decoded
  for line in reversed((out or "").splitlines()):
    if line.startswith(tag + " "): return json.loads(line[len(tag) + 1:])
  return None


def run_one(fw: str, wl: str, size: int, warmup: bool = True, timeout_s: float = TIMEOUT_S) -> dict:
  """One measurement in a fresh subprocess: the worker's result; where the gradient did not end within
  timeout_s, its build figures with grad_s None and grad_timeout_s; else {"error": ...}."""
  spec = json.dumps({"fw": fw, "wl": wl, "size": size, "warmup": warmup})
  t = time.perf_counter()
  try:
    p = subprocess.run([sys.executable, "-m", "pygrad.bench", "--worker", spec], env=_env(fw), capture_output=True,
                       text=True, timeout=timeout_s)
  except subprocess.TimeoutExpired as e:
    b = _last(e.stdout, "BUILT")
    if b is None: return {"error": f"timed out after {timeout_s:.0f} s", "wall_s": time.perf_counter() - t}
    return {**b, "grad_s": None, "grad_timeout_s": timeout_s, "wall_s": time.perf_counter() - t}
  wall = time.perf_counter() - t
  r = _last(p.stdout, "RESULT")
  if r is not None: return {**r, "wall_s": wall}
  tail = (p.stderr.strip().splitlines() or [f"exit code {p.returncode}"])[-1]
  return {"error": tail[:300], "wall_s": wall}


def _fmt_s(x):
  return "–" if x is None else f"{x:.3g}"


def _late(r) -> bool:
  """Whether the row's gradient ran out of time (its build figures are still there)."""
  return r.get("grad_s") is None and bool(r.get("grad_timeout_s"))


def _grad_cell(r) -> str:
  """A row's gradient time, or `> limit` where the gradient did not end in time."""
  return f"> {r['grad_timeout_s']:.0f}" if _late(r) else _fmt_s(r.get("grad_s"))


def run_suite(workloads, sizes, fws, repeat: int, log=print, warmup: bool = True,
              timeout_s: float = TIMEOUT_S) -> list[dict]:
  """Every measurement of the plan, `repeat` times alternating frameworks; one row of medians per entry."""
  steps = [(wl, size) for wl in workloads for size in sizes[wl]]
  fws = list(fws)
  total = len(steps) * len(fws) * repeat
  done, rows, t0 = 0, [], time.perf_counter()
  for wl, size in steps:
    runs: dict[str, list[dict]] = {fw: [] for fw in fws}
    for rep in range(repeat):
      order = fws[rep % len(fws):] + fws[:rep % len(fws)] if fws else []
      for fw in order:
        done += 1
        first = runs[fw][0] if runs[fw] else None
        if first is not None and ("error" in first or first["wall_s"] > ONCE_AFTER_S): continue
        log(f"[{done}/{total} {time.perf_counter() - t0:6.0f}s] {wl} {SIZE_NAME[wl]}={size} {LABEL[fw]} "
            f"(run {rep + 1}/{repeat}) ...", end=" ", flush=True)
        r = run_one(fw, wl, size, warmup, timeout_s)
        runs[fw].append(r)
        log(f"ERROR {r['error']}" if "error" in r else
            f"build {_fmt_s(r['build_s'])} s, gradient {_grad_cell(r)} s, {r['nodes']} nodes "
            f"({r['wall_s']:.1f} s wall)", flush=True)
    for fw in fws:
      good = [r for r in runs[fw] if "error" not in r]
      row = {"workload": wl, "size": size, "fw": fw, "runs": len(good)}
      if not good:
        row["error"] = runs[fw][0]["error"] if runs[fw] else "not run"
      else:
        for k in ("nodes", "build_s", "topo_s", "grad_s", "grad_timeout_s", "bytes_per_node", "grad_nodes"):
          vals = [r[k] for r in good if r.get(k) is not None]
          row[k] = statistics.median(vals) if vals else None
      rows.append(row)
  return rows


# ---------------------------------------------------------------- report
def _get(rows, wl, size, fw):
  for r in rows:
    if r["workload"] == wl and r["size"] == size and r["fw"] == fw and "error" not in r: return r
  return None


def targets(rows) -> list[tuple[str, str, str]]:
  """(target, measured, PASS/MISS/n/a) for issue 5's and issue 3's targets."""
  out = []

  def ratio(a, b, key):
    return None if a is None or b is None or not a.get(key) or b.get(key) is None else b[key] / a[key]

  def verdict(ok):
    return "n/a" if ok is None else "PASS" if ok else "MISS"
  c, py, tg = (_get(rows, "W1", 2000, fw) for fw in ("pygrad-c", "pygrad-py", "tinygrad"))
  g = c["grad_s"] if c else None
  out.append(("W1 depth 2000: pygrad C gradient <= 0.10 s", "–" if g is None else f"{g:.4f} s",
              verdict(None if g is None else g <= 0.10)))
  r = ratio(c, tg, "grad_s")
  out.append(("W1 depth 2000: pygrad C gradient >= 35x faster than tinygrad", "–" if r is None else f"{r:.1f}x",
              verdict(None if r is None else r >= 35)))
  r = ratio(c, py, "grad_s")
  out.append(("W1 depth 2000: pygrad C gradient >= 3x faster than pure core", "–" if r is None else f"{r:.1f}x",
              verdict(None if r is None else r >= 3)))
  sizes = sorted({r["size"] for r in rows if r["workload"] == "W1"})
  br = [(d, ratio(_get(rows, "W1", d, "pygrad-c"), _get(rows, "W1", d, "tinygrad"), "build_s")) for d in sizes]
  br = [(d, x) for d, x in br if x is not None]
  out.append(("W1 build >= 10x faster than tinygrad (every depth)",
              ", ".join(f"d{d}: {x:.1f}x" for d, x in br) or "–",
              verdict(None if not br else all(x >= 10 for _, x in br))))
  lo, hi = _get(rows, "W1", 500, "pygrad-c"), _get(rows, "W1", 8000, "pygrad-c")
  if lo and hi:
    per = [(x["grad_s"] / x["nodes"]) for x in (lo, hi)]
    s = per[1] / per[0]
    out.append(("W1 linear scaling: gradient time per forward node, depth 8000 <= 1.3x depth 500 (C core)",
                f"{per[0] * 1e9:.0f} -> {per[1] * 1e9:.0f} ns/node ({s:.2f}x)", verdict(s <= 1.3)))
  else:
    out.append(("W1 linear scaling (depth 8000 vs 500, C core)", "–", "n/a"))
  for d in (400, 2000):
    r = ratio(_get(rows, "W1", d, "pygrad-c"), _get(rows, "W1", d, "tinygrad"), "grad_s")
    out.append((f"issue 3: W1 depth {d}: pygrad C gradient >= 5x faster than tinygrad",
                "–" if r is None else f"{r:.1f}x", verdict(None if r is None else r >= 5)))
  return out


def _bytes(r) -> str:
  # RSS moves in pages and allocator arenas: below a few thousand nodes the growth says nothing
  return f"{r['bytes_per_node']:.0f}" if r["nodes"] >= MIN_NODES_FOR_BYTES else "–"


def table(rows) -> str:
  head = ["workload", "size", "framework", "nodes", "build (s)", "toposort (ms)", "gradient (s)", "bytes/node",
          "gradient vs C", "build vs C", "runs"]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for r in rows:
    size = f"{SIZE_NAME[r['workload']]} {r['size']:,}"
    if "error" in r:
      lines.append(f"| {r['workload']} | {size} | {LABEL[r['fw']]} | " + " | ".join(["–"] * 7) +
                   f" | {r['error']} |")
      continue
    c = _get(rows, r["workload"], r["size"], "pygrad-c")

    def rel(key):
      if c is None or not c.get(key): return "–"
      if key == "grad_s" and _late(r):
        return f"> {r['grad_timeout_s'] / c[key]:.0f}x"
      return "–" if r.get(key) is None else f"{r[key] / c[key]:.1f}x"
    topo = "–" if r["topo_s"] is None else f"{r['topo_s'] * 1e3:.3g}"
    lines.append(f"| {r['workload']} | {size} | {LABEL[r['fw']]} | {r['nodes']:,} | {r['build_s']:.3g} | {topo} | "
                 f"{_grad_cell(r)} | {_bytes(r)} | {rel('grad_s')} | {rel('build_s')} | {r['runs']} |")
  return "\n".join(lines)


def environment() -> str:
  from importlib.metadata import version, PackageNotFoundError
  vs = []
  for p in ("tinygrad", "jax", "numpy"):
    try: vs.append(f"{p} {version(p)}")
    except PackageNotFoundError: pass
  return (f"Python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} CPUs, "
          f"{platform.system()} {platform.release()}; " + ", ".join(vs))


def markdown(rows, tgts, command: str, notes: list[str], repeat: int, timeout_s: float = TIMEOUT_S) -> str:
  out = ["# pygrad gradient benchmark", "", f"Command: `{command}`  ", f"Machine: {environment()}  ",
         f"Date: {time.strftime('%Y-%m-%d %H:%M')}; medians of {repeat} runs per cell, each in a fresh process "
         f"(a measurement whose first run took over 60 s runs once: see `runs`; one may take {timeout_s:.0f} s, "
         "and a gradient not done by then shows as `> limit`, with the build figures it had).", "",
         "Graph construction and gradient derivation only, nothing executed. `nodes`: the forward graph "
         "(pygrad/tinygrad: `len(root.toposort())`; JAX: equations of `make_jaxpr(f)`). `build`: making the "
         "inputs and the model graph (JAX: `make_jaxpr(f)`). `gradient`: `root.gradient(*targets)` (pygrad; "
         "tinygrad: `Tensor.gradient`, no realize; JAX: `make_jaxpr(jax.grad(f))`, which traces the forward "
         "again). Each process first derives the gradient of a tiny instance of the same workload (warm caches "
         "in every framework; pygrad records its method and rule templates there, `--cold` skips it). Workers "
         "run with OPENBLAS_NUM_THREADS=1 (no BLAS is called; idle BLAS threads would take a core). "
         "`bytes/node`: RSS growth over the build / nodes (shown from 5,000 nodes). "
         "`vs C`: time / pygrad C core's. The models are one code path for every framework (pygrad/bench.py): "
         "each framework's own relu, softmax and matmul (JAX: `jax.nn.relu`, `jax.nn.softmax`, `@`).", ""]
  out += [f"Note: {n}" for n in notes] + ([""] if notes else [])
  out += [table(rows), "", "## Targets", "", "| target | measured | verdict |", "|---|---|---|"]
  out += [f"| {t} | {m} | {v} |" for t, m, v in tgts]
  return "\n".join(out) + "\n"


def plot(rows, path: str) -> str | None:
  """grad.png: gradient and build time against forward graph size, log-log, one panel per workload."""
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    return "matplotlib is not installed: no plot"
  wls = [w for w in WORKLOADS if any(r["workload"] == w for r in rows)]
  fig, axes = plt.subplots(1, len(wls), figsize=(5.2 * len(wls), 4.4), squeeze=False)
  colors = {"pygrad-c": "tab:blue", "pygrad-py": "tab:orange", "tinygrad": "tab:green", "jax": "tab:red"}
  for ax, wl in zip(axes[0], wls):
    lates = []  # markers of gradients that ran out of time, at the limit: their own legend on that panel
    for fw in FRAMEWORKS:
      pts = []
      for r in rows:
        if r["workload"] != wl or r["fw"] != fw or "error" in r: continue
        c = _get(rows, wl, r["size"], "pygrad-c") or _get(rows, wl, r["size"], "pygrad-py")
        pts.append(((c or r)["nodes"], r["grad_s"], r["build_s"], r.get("grad_timeout_s")))
      if not pts: continue
      pts.sort(key=lambda p: p[0])
      done = [p for p in pts if p[1] is not None]
      ax.plot([p[0] for p in done], [p[1] for p in done], "o-", color=colors[fw], label=f"{LABEL[fw]} gradient")
      late = [(p[0], p[3]) for p in pts if p[1] is None and p[3]]
      if late:
        lates += ax.plot(*zip(*late), "^", color=colors[fw], ms=9, label=f"{LABEL[fw]} gradient not done by then")
      ax.plot([p[0] for p in pts], [p[2] for p in pts], "s--", color=colors[fw], alpha=0.55,
              label=f"{LABEL[fw]} build")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_title({"W1": "W1 residual MLP chain", "W2": "W2 transformer blocks", "W3": "W3 random DAG"}[wl])
    ax.set_xlabel("forward graph nodes (pygrad)")
    ax.set_ylabel("seconds")
    ax.grid(True, which="both", alpha=0.3)
    if lates and ax is not axes[0][0]: ax.legend(handles=lates, fontsize=7, loc="lower right")
  axes[0][0].legend(fontsize=7, loc="upper left")
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return None


def main(argv=None, command: str | None = None) -> int:
  """The suite's command line; `command` is how the report names the command that ran it."""
  ap = argparse.ArgumentParser(prog="python -m pygrad bench", description=__doc__.split("\n\n")[0],
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--quick", action="store_true", help="small sizes, one run each (a smoke test)")
  ap.add_argument("--only", default=",".join(WORKLOADS),
                  help="workloads, comma separated (W1,W2,W3), or train (the training-step benchmark)")
  ap.add_argument("--repeat", type=int, default=None, help="runs per measurement (default 3, --quick 1)")
  ap.add_argument("--frameworks", default=",".join(FRAMEWORKS), help="comma separated: c, python, tinygrad, jax")
  ap.add_argument("--out", default=os.path.join("bench", "results"), help="folder for grad.md/.png/.json")
  ap.add_argument("--cold", action="store_true", help="no warm-up derivation: time each process's first one")
  ap.add_argument("--timeout", type=float, default=TIMEOUT_S,
                  help="seconds one measurement may take; a gradient not done by then is reported as '> limit'")
  ap.add_argument("--worker", help=argparse.SUPPRESS)
  a = ap.parse_args(argv)
  if a.worker:
    worker_main(a.worker)
    return 0
  wls = [w.strip().upper() for w in a.only.split(",") if w.strip()]
  if wls == ["TRAIN"]:  # the training-step benchmark (pygrad/bench_train.py) has options of its own
    from .bench_train import main as train_main
    cmd = command or " ".join(["python -m pygrad bench", *(argv if argv is not None else sys.argv[1:])])
    return train_main([*(["--reps", str(a.repeat)] if a.repeat else []), "--out", a.out], cmd)
  bad = [w for w in wls if w not in WORKLOADS]
  if bad: ap.error(f"unknown workload(s) {bad}: choose from {WORKLOADS}")
  try:
    fws = list(dict.fromkeys(ALIASES[f.strip().lower()] for f in a.frameworks.split(",") if f.strip()))
  except KeyError as e:
    ap.error(f"unknown framework {e}: choose from c, python, tinygrad, jax")
  repeat = a.repeat if a.repeat is not None else (1 if a.quick else 3)
  if repeat < 1: ap.error("--repeat must be >= 1")
  if a.timeout <= 0: ap.error("--timeout must be > 0")
  sizes = SIZES["quick" if a.quick else "full"]
  fws, notes = available(fws)
  for n in notes: print(f"note: {n}", flush=True)
  if not fws:
    print("nothing to measure", file=sys.stderr)
    return 1
  print(f"measuring {', '.join(LABEL[f] for f in fws)} on {', '.join(wls)} "
        f"({'; '.join(f'{w} {SIZE_NAME[w]} ' + '/'.join(map(str, sizes[w])) for w in wls)}), {repeat} run(s) each",
        flush=True)
  rows = run_suite(wls, sizes, fws, repeat, warmup=not a.cold, timeout_s=a.timeout)
  tgts = targets(rows)
  if command is None:
    command = " ".join(["python -m pygrad bench", *(argv if argv is not None else sys.argv[1:])])
  os.makedirs(a.out, exist_ok=True)
  if a.cold: notes.append("--cold: no warm-up; each gradient time is the first derivation in its process")
  md = markdown(rows, tgts, command, notes, repeat, a.timeout)
  with open(os.path.join(a.out, "grad.md"), "w") as f: f.write(md)
  with open(os.path.join(a.out, "grad.json"), "w") as f:
    json.dump({"command": command, "environment": environment(), "rows": rows, "targets": tgts}, f, indent=1)
  why = plot(rows, os.path.join(a.out, "grad.png"))
  print()
  print(table(rows))
  print()
  for t, m, v in tgts: print(f"{v:4}  {t}: {m}")
  print(f"\nwrote {os.path.join(a.out, 'grad.md')}, grad.json" + (f" ({why})" if why else ", grad.png"))
  return 0


if __name__ == "__main__":
  sys.exit(main())
