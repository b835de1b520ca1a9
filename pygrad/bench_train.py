"""Training-step benchmark: one SGD step of (1) the MLP 64-256-256-10, batch 128, softmax cross-entropy and (2) one
W2 transformer block (pygrad.bench's w2_model: layernorm, 2-head attention, relu MLP; loss = sum), forward +
backward + update. pygrad compiled (graph built, differentiated and compiled once) on 1 thread and on all threads,
against torch eager on 1 thread and on all threads and jax.jit. Engines alternate inside every repetition (each
times a block of steps); figures are medians of per-step times. Same initial weights everywhere; the first step's
losses are compared before timing.

  python bench/bench_train.py [--reps N] [--steps K]     (also: python -m pygrad bench --only train)
writes bench/results/train.md and train.png."""
from __future__ import annotations
import argparse, math, os, platform, statistics, sys, time
import numpy as np

MLP_SIZES, MLP_BATCH, LR = (64, 256, 256, 10), 128, 0.05


def _threads_all() -> int:
  """The cores this process may use (what pygrad and torch get as "all threads")."""
  return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


# ---------------------------------------------------------------- the MLP step in each engine
def mlp_data(seed: int = 0):
  from pygrad.train import init_params, onehot
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((MLP_BATCH, MLP_SIZES[0])).astype(np.float32)
  y = onehot(rng.integers(0, MLP_SIZES[-1], MLP_BATCH), MLP_SIZES[-1])
  return x, y, init_params(MLP_SIZES, seed)


def mlp_pygrad(x, y, params):
  from pygrad.train import mlp_step
  step = mlp_step(MLP_SIZES, MLP_BATCH, LR)
  state = {"p": list(params)}

  def run():
    out = step(x, y, *state["p"])
    state["p"] = out[1:]
    return out[0]
  return run


def mlp_torch(x, y, params):
  import torch
  tx, ty = torch.from_numpy(x), torch.from_numpy(y)
  ps = [torch.from_numpy(p.copy()).requires_grad_() for p in params]

  def run():
    h = tx
    for i in range(0, len(ps), 2):
      h = h @ ps[i] + ps[i + 1]
      if i + 2 < len(ps): h = torch.relu(h)
    loss = -(torch.log_softmax(h, -1) * ty).sum() * (1.0 / MLP_BATCH)
    grads = torch.autograd.grad(loss, ps)
    with torch.no_grad():
      for p, g in zip(ps, grads): p.sub_(g, alpha=LR)
    return loss.item()
  return run


def mlp_jax(x, y, params):
  import jax, jax.numpy as jnp

  def loss_fn(ps, xx, yy):
    h = xx
    for i in range(0, len(ps), 2):
      h = h @ ps[i] + ps[i + 1]
      if i + 2 < len(ps): h = jax.nn.relu(h)
    return -(jax.nn.log_softmax(h, -1) * yy).sum() * (1.0 / MLP_BATCH)

  @jax.jit
  def step(ps, xx, yy):
    loss, g = jax.value_and_grad(loss_fn)(ps, xx, yy)
    return loss, [p - LR * gi for p, gi in zip(ps, g)]
  state = {"p": [jnp.asarray(p) for p in params]}
  jx, jy = jnp.asarray(x), jnp.asarray(y)

  def run():
    loss, state["p"] = step(state["p"], jx, jy)
    return float(loss)
  return run


# ---------------------------------------------------------------- the W2 transformer block step
def w2_data(seed: int = 0):
  from pygrad.bench import input_shapes
  rng = np.random.default_rng(seed)
  xs, blocks = input_shapes("W2", 1)
  x = rng.standard_normal(xs).astype(np.float32)
  params = [(rng.standard_normal(s) * (0.3 if len(s) == 2 else 1.0)).astype(np.float32) for s in blocks[0]]
  for i in (6, 8): params[i] = np.ones_like(params[i])  # layernorm gains
  for i in (7, 9): params[i] = np.zeros_like(params[i])  # layernorm biases
  return x, params


def w2_pygrad(x, params):
  import pygrad
  from pygrad import UOp, dtypes
  from pygrad.bench import MethodOps, w2_model
  X = UOp.placeholder(x.shape, dtypes.float32, "x")
  P = [UOp.placeholder(p.shape, dtypes.float32, f"p{i}") for i, p in enumerate(params)]
  loss = w2_model(MethodOps, X, [P])
  grads = loss.gradient(*P)
  step = pygrad.compile([loss] + [p - g * LR for p, g in zip(P, grads)], [X, *P])
  state = {"p": list(params)}

  def run():
    out = step(x, *state["p"])
    state["p"] = out[1:]
    return out[0]
  return run


class TorchOps:
  """pygrad.bench's framework operations for torch tensors."""
  @staticmethod
  def relu(x): return x.relu()
  @staticmethod
  def recip(x): return x.reciprocal()
  @staticmethod
  def sqrt(x): return x.sqrt()
  @staticmethod
  def total(x): return x.sum()
  @staticmethod
  def mean_last(x): return x.mean(-1, keepdim=True)
  @staticmethod
  def softmax_last(x): return x.softmax(-1)
  @staticmethod
  def swap_last(x): return x.transpose(-1, -2)
  @staticmethod
  def split_heads(x, s, h, d): return x.reshape(s, h, d).permute(1, 0, 2)
  @staticmethod
  def merge_heads(x, s, d): return x.permute(1, 0, 2).reshape(s, d)


def w2_torch(x, params):
  import torch
  from pygrad.bench import w2_model
  tx = torch.from_numpy(x)
  ps = [torch.from_numpy(p.copy()).requires_grad_() for p in params]

  def run():
    loss = w2_model(TorchOps, tx, [ps])
    grads = torch.autograd.grad(loss, ps)
    with torch.no_grad():
      for p, g in zip(ps, grads): p.sub_(g, alpha=LR)
    return loss.item()
  return run


def w2_jax(x, params):
  import jax, jax.numpy as jnp
  from pygrad.bench import jax_ops, w2_model
  F = jax_ops()

  @jax.jit
  def step(ps, xx):
    loss, g = jax.value_and_grad(lambda q: w2_model(F, xx, [q]))(ps)
    return loss, [p - LR * gi for p, gi in zip(ps, g)]
  state = {"p": [jnp.asarray(p) for p in params]}
  jx = jnp.asarray(x)

  def run():
    loss, state["p"] = step(state["p"], jx)
    return float(loss)
  return run


# ---------------------------------------------------------------- timing
def engines(work: str, nall: int) -> dict:
  """{label: (make, threads setter)}: pygrad and torch at 1 and all threads, jax.jit (its own thread pool)."""
  import pygrad
  out = {}
  mk = {"mlp": (mlp_pygrad, mlp_torch, mlp_jax), "w2": (w2_pygrad, w2_torch, w2_jax)}[work]
  out["pygrad, 1 thread"] = (mk[0], lambda: pygrad.set_num_threads(1))
  if nall > 1: out[f"pygrad, {nall} threads"] = (mk[0], lambda: pygrad.set_num_threads(nall))
  try:
    import torch
    out["torch eager, 1 thread"] = (mk[1], lambda: torch.set_num_threads(1))
    if nall > 1: out[f"torch eager, {nall} threads"] = (mk[1], lambda: torch.set_num_threads(nall))
  except ImportError:
    pass
  try:
    import jax  # noqa: F401
    out["jax.jit"] = (mk[2], lambda: None)
  except ImportError:
    pass
  return out


SETTLE_S, WARM_S = 0.15, 0.03


def measure(work: str, reps: int, steps: int, nall: int) -> tuple[dict, dict]:
  """({label: median us/step}, {label: first-step loss})"""
  data = mlp_data() if work == "mlp" else w2_data()
  runs, first = {}, {}
  for label, (make, threads) in engines(work, nall).items():
    threads()
    runs[label] = (make(*data), threads)
    first[label] = float(runs[label][0]())
    for _ in range(3): runs[label][0]()
  times = {k: [] for k in runs}
  for _ in range(reps):
    for label, (run, threads) in runs.items():  # alternate engines inside each repetition
      threads()
      # the engine that ran last may still spin its idle threads on the other core (OpenBLAS ~0.1 s, OpenMP and
      # XLA pools less): let them sleep, then wake this engine's own threads and caches with untimed steps. For
      # WARM_S, not a step count: after the pause the first few ms of steps ran up to 1.3x slow on every engine
      # (clocks and caches cold), which two or three untimed steps did not cover
      time.sleep(SETTLE_S)
      w = time.perf_counter()
      while time.perf_counter() - w < WARM_S: run()
      t = time.perf_counter()
      for _ in range(steps): run()
      times[label].append((time.perf_counter() - t) / steps)
  return {k: statistics.median(v) * 1e6 for k, v in times.items()}, first


def targets(res: dict) -> list[tuple[str, bool, str]]:
  out = []
  for work, name in (("mlp", "MLP"), ("w2", "W2 block")):
    r = res.get(work)
    if not r: continue
    pg = min(v for k, v in r.items() if k.startswith("pygrad"))
    torch_best = min((v for k, v in r.items() if k.startswith("torch")), default=None)
    jx = r.get("jax.jit")
    if work == "mlp":
      if torch_best: out.append((f"{name}: pygrad >= 1.5x torch eager (best threads)", torch_best / pg >= 1.5,
                                 f"{torch_best / pg:.2f}x"))
      if jx: out.append((f"{name}: pygrad >= 1.5x jax.jit", jx / pg >= 1.5, f"{jx / pg:.2f}x"))
      out.append((f"{name}: pygrad <= 450 us/step", pg <= 450, f"{pg:.0f} us"))
    else:
      if torch_best: out.append((f"{name}: pygrad faster than torch eager (best threads)", pg < torch_best,
                                 f"{torch_best / pg:.2f}x"))
      if jx: out.append((f"{name}: pygrad faster than jax.jit", pg < jx, f"{jx / pg:.2f}x"))
  return out


def plot(res: dict, path: str) -> str | None:
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    return "matplotlib missing: no plot"
  works = [w for w in ("mlp", "w2") if w in res]
  fig, axes = plt.subplots(1, len(works), figsize=(5.5 * len(works), 3.6), squeeze=False)
  for ax, w in zip(axes[0], works):
    labels = list(res[w])
    vals = [res[w][k] for k in labels]
    colors = ["tab:blue" if k.startswith("pygrad") else "tab:orange" if k.startswith("torch") else "tab:green"
              for k in labels]
    ax.barh(range(len(labels)), vals, color=colors)
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.invert_yaxis()
    for i, v in enumerate(vals): ax.text(v, i, f" {v:.0f}", va="center", fontsize=8)
    ax.set_xlabel("us per training step (median, lower is better)")
    ax.set_title({"mlp": "MLP 64-256-256-10, batch 128, SGD step", "w2": "W2 transformer block, SGD step"}[w],
                 fontsize=9)
    ax.set_xlim(0, max(vals) * 1.18)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return None


def main(argv=None, command: str | None = None) -> int:
  ap = argparse.ArgumentParser(prog="bench_train.py", description=__doc__.split("\n\n")[0])
  ap.add_argument("--reps", type=int, default=21, help="alternating repetitions (default 21)")
  ap.add_argument("--steps", type=int, default=10, help="steps timed as one block per repetition (default 10)")
  ap.add_argument("--only", default="mlp,w2", help="mlp, w2 or both (default)")
  ap.add_argument("--out", default=os.path.join("bench", "results"), help="folder for train.md and train.png")
  a = ap.parse_args(argv)
  if a.reps < 1 or a.steps < 1: ap.error("--reps and --steps must be >= 1")
  works = [w.strip().lower() for w in a.only.split(",") if w.strip()]
  if any(w not in ("mlp", "w2") for w in works): ap.error("--only takes mlp and/or w2")
  import pygrad
  from pygrad.engine import vmlib
  nall = _threads_all()
  command = command or " ".join(["python bench/bench_train.py", *(argv if argv is not None else sys.argv[1:])])
  res, firsts = {}, {}
  for w in works:
    print(f"measuring {w} ({a.reps} x {a.steps} steps per engine)...", flush=True)
    res[w], firsts[w] = measure(w, a.reps, a.steps, nall)
  pygrad.set_num_threads(nall)
  ver = {"numpy": np.__version__}
  for mod in ("torch", "jax"):
    try: ver[mod] = __import__(mod).__version__
    except ImportError: pass
  lines = [f"# Training-step benchmark\n", f"`{command}` on {platform.machine()} ({os.cpu_count()} CPUs, "
           f"{nall} usable), VM ISA `{vmlib.isa_name()}`, medians of {a.reps} alternating repetitions of "
           f"{a.steps} steps. Versions: {', '.join(f'{k} {v}' for k, v in ver.items())}. jax.jit uses XLA's own "
           "CPU thread pool.\n"]
  for w in works:
    r = res[w]
    best = min(r.values())
    lines.append({"mlp": "\n## MLP 64-256-256-10, batch 128, softmax cross-entropy, SGD step\n",
                  "w2": "\n## W2 transformer block (seq 16, dim 32, 2 heads), loss = sum, SGD step\n"}[w])
    lines.append("| engine | us/step | vs fastest | first-step loss |\n|---|---:|---:|---:|")
    for k, v in r.items(): lines.append(f"| {k} | {v:.0f} | {v / best:.2f}x | {firsts[w][k]:.6g} |")
  tg = targets(res)
  if tg:
    lines.append("\n## Targets\n\n| target | result | figure |\n|---|---|---:|")
    for t, ok, fig in tg: lines.append(f"| {t} | {'PASS' if ok else 'MISS'} | {fig} |")
  text = "\n".join(lines) + "\n"
  print(text)
  os.makedirs(a.out, exist_ok=True)
  with open(os.path.join(a.out, "train.md"), "w") as f: f.write(text)
  why = plot(res, os.path.join(a.out, "train.png"))
  print(f"wrote {os.path.join(a.out, 'train.md')}" + (f" ({why})" if why else ", train.png"))
  for w in works:  # same model, same start: the first losses agree (float32 tolerance)
    vals = list(firsts[w].values())
    if max(vals) - min(vals) > 1e-3 * max(1.0, abs(vals[0])):
      print(f"warning: first-step losses of {w} differ across engines: {firsts[w]}", file=sys.stderr)
      return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
