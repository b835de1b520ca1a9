"""`python -m pygrad train`: an MLP trained on scikit-learn's bundled handwritten digits (1,797 8x8 images, no
download). The graph of one SGD step -- forward, softmax cross-entropy, its gradient and the updated weights -- is
built and differentiated once and compiled once; the loop then only calls the compiled step. `mlp_step` builds that
step for any layer sizes (bench_train.py times the same one); `train_loop` runs a compiled step over batches."""
from __future__ import annotations
import argparse
import contextlib
import sys
import time
import numpy as np

EXTRA_HINT = "pip install 'pygrad[examples]'  (scikit-learn, tqdm, matplotlib)"


def mlp_step(sizes, batch: int, lr: float):
  """The compiled SGD step of an MLP with layer sizes `sizes` (e.g. (64, 256, 256, 10)): relu hidden layers,
  softmax cross-entropy averaged over the batch. Call it as step(x, y_onehot, *params) -> [loss, *new_params]; the
  params are (w0, b0, w1, b1, ...), w_i of shape (sizes[i], sizes[i+1])."""
  import pygrad
  return pygrad.compile(*mlp_step_graph(sizes, batch, lr))


def mlp_step_graph(sizes, batch: int, lr: float):
  """(outputs, inputs) of mlp_step's graph: outputs [loss, *new_params], inputs [x, y_onehot, *params]."""
  from pygrad import UOp, dtypes
  f32 = dtypes.float32
  x = UOp.placeholder((batch, sizes[0]), f32, "x")
  y = UOp.placeholder((batch, sizes[-1]), f32, "y")
  params = []
  for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
    params += [UOp.placeholder((a, b), f32, f"w{i}"), UOp.placeholder((b,), f32, f"b{i}")]
  h = x
  for i in range(0, len(params), 2):
    h = h @ params[i] + params[i + 1]
    if i + 2 < len(params): h = h.relu()
  loss = -(h.log_softmax(-1) * y).sum() * (1.0 / batch)
  grads = loss.gradient(*params)
  return [loss] + [p - g * lr for p, g in zip(params, grads)], [x, y, *params]


def data_parallel_step(sizes, batch: int, lr: float, client):
  """mlp_step on a Dask cluster: each worker runs the step on its share of the batch (batch / workers rows) and the
  outputs are averaged in worker order. The loss is a mean over rows and each new param is p - lr * grad, so the
  average of the workers' outputs is the whole batch's step (up to float rounding)."""
  from .distributed import DataParallel
  n = len(client.scheduler_info()["workers"])
  if batch % n: raise ValueError(f"--batch {batch} does not split over {n} workers")
  outs, ins = mlp_step_graph(sizes, batch // n, lr)
  return DataParallel(outs, ins, client, batch=ins[:2], reduce={i: "mean" for i in range(len(outs))})


def init_params(sizes, seed: int = 0) -> list[np.ndarray]:
  """He-initialized weights and zero biases, float32, in mlp_step's order."""
  rng = np.random.default_rng(seed)
  out = []
  for a, b in zip(sizes[:-1], sizes[1:]):
    out += [(rng.standard_normal((a, b)) * np.sqrt(2.0 / a)).astype(np.float32), np.zeros(b, np.float32)]
  return out


def onehot(labels: np.ndarray, k: int) -> np.ndarray:
  return np.eye(k, dtype=np.float32)[labels]


def train_loop(step, params: list, x: np.ndarray, y: np.ndarray, batch: int, steps: int, seed: int = 0,
               progress=None) -> tuple[list, list[float]]:
  """Run a compiled step `steps` times on shuffled batches of (x, y) (y one-hot); returns the final params and the
  loss of every step. progress(i, loss) is called after each step (None: no reporting)."""
  rng = np.random.default_rng(seed)
  n = len(x)
  order = rng.permutation(n)
  at, losses = 0, []
  for i in range(steps):
    if at + batch > n: order, at = rng.permutation(n), 0
    idx = order[at:at + batch]
    at += batch
    out = step(np.ascontiguousarray(x[idx]), np.ascontiguousarray(y[idx]), *params)
    params = out[1:]
    losses.append(float(out[0]))
    if progress is not None: progress(i, losses[-1])
  return params, losses


def predict(params: list, x: np.ndarray) -> np.ndarray:
  """Class predictions of the MLP in numpy (evaluation is not the part being trained)."""
  h = x
  for i in range(0, len(params), 2):
    h = h @ params[i] + params[i + 1]
    if i + 2 < len(params): h = np.maximum(h, 0)
  return h.argmax(1)


def load_digits_split(seed: int = 0, test_frac: float = 0.25):
  """(x_train, x_test, y_train, y_test): the digits scaled to [0, 1], a stratified split."""
  from sklearn.datasets import load_digits
  from sklearn.model_selection import train_test_split
  d = load_digits()
  x = (d.data / 16.0).astype(np.float32)
  return train_test_split(x, d.target, test_size=test_frac, random_state=seed, stratify=d.target)


def _missing_extras(workers: int = 0) -> str | None:
  missing = []
  for mod in ("sklearn", "tqdm") + (("distributed",) if workers else ()):
    try: __import__(mod)
    except ImportError: missing.append({"sklearn": "scikit-learn", "distributed": "dask[distributed]"}.get(mod, mod))
  return ", ".join(missing) if missing else None


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(prog="python -m pygrad train",
                               description="Train an MLP on scikit-learn's digits with one compiled SGD step.")
  ap.add_argument("--steps", type=int, default=1500, help="SGD steps (default 1500)")
  ap.add_argument("--batch", type=int, default=128, help="batch size (default 128)")
  ap.add_argument("--lr", type=float, default=0.1, help="learning rate (default 0.1)")
  ap.add_argument("--hidden", default="256,256", help="hidden layer sizes, comma separated (default 256,256)")
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--plot", metavar="FILE.png", help="write the loss curve to this PNG")
  ap.add_argument("--no-progress", action="store_true", help="no progress bar (for logs)")
  ap.add_argument("--workers", type=int, default=0,
                  help="train data-parallel on a Dask LocalCluster of this many worker processes (needs dask)")
  a = ap.parse_args(argv)
  if a.steps < 1 or a.batch < 1: ap.error("--steps and --batch must be >= 1")
  if a.workers < 0: ap.error("--workers must be >= 0")
  if a.workers and a.batch % a.workers: ap.error(f"--batch {a.batch} does not split over {a.workers} workers")
  if not a.lr > 0: ap.error("--lr must be > 0")
  try: hidden = tuple(int(h) for h in a.hidden.split(",") if h.strip())
  except ValueError: ap.error(f"--hidden must be comma-separated integers, got {a.hidden!r}")
  if any(h < 1 for h in hidden): ap.error("--hidden sizes must be >= 1")
  missing = _missing_extras(a.workers)
  if missing:
    print(f"python -m pygrad train needs {missing}: {EXTRA_HINT}", file=sys.stderr)
    return 2
  if a.plot:
    try: import matplotlib  # noqa: F401
    except ImportError:
      print(f"--plot needs matplotlib: {EXTRA_HINT}", file=sys.stderr)
      return 2
  import pygrad
  xtr, xte, ytr, yte = load_digits_split(a.seed)
  sizes = (xtr.shape[1], *hidden, 10)
  batch = min(a.batch, len(xtr))
  if a.workers and batch % a.workers: ap.error(f"batch {batch} does not split over {a.workers} workers")
  with contextlib.ExitStack() as stack:
    if a.workers:
      import distributed
      cluster = stack.enter_context(distributed.LocalCluster(
        n_workers=a.workers, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None,
        silence_logs=40, env={"PYGRAD_NUM_THREADS": "1"}))  # one VM thread per worker: cores are not shared twice
      client = stack.enter_context(distributed.Client(cluster))
    t0 = time.perf_counter()
    step = data_parallel_step(sizes, batch, a.lr, client) if a.workers else mlp_step(sizes, batch, a.lr)
    t_build = time.perf_counter() - t0
    where = f"{a.workers} Dask workers" if a.workers else f"{pygrad.get_num_threads()} thread(s)"
    print(f"MLP {'-'.join(map(str, sizes))}, batch {batch}, lr {a.lr}: step built, differentiated and compiled once "
          f"in {t_build:.2f} s; {len(xtr)} training and {len(xte)} test images; {where}")
    return _run(a, step, sizes, batch, xtr, xte, ytr, yte)


def _run(a, step, sizes, batch, xtr, xte, ytr, yte) -> int:
  """The training loop with its progress bar, the test accuracy and the optional plot."""
  from tqdm import tqdm
  bar = tqdm(total=a.steps, unit="step", disable=a.no_progress, file=sys.stdout)
  t_run = time.perf_counter()

  def progress(i, loss):
    bar.update(1)
    if i % 20 == 0 or i == a.steps - 1:
      bar.set_postfix(loss=f"{loss:.4f}", steps_s=f"{(i + 1) / max(time.perf_counter() - t_run, 1e-9):.0f}")
  params, losses = train_loop(step, init_params(sizes, a.seed), xtr, onehot(ytr, 10), batch, a.steps, a.seed,
                              progress)
  bar.close()
  elapsed = time.perf_counter() - t_run
  acc = float((predict(params, xte) == yte).mean())
  print(f"{a.steps} steps in {elapsed:.2f} s ({a.steps / elapsed:.0f} steps/s, {elapsed / a.steps * 1e6:.0f} us/step);"
        f" final loss {losses[-1]:.4f}; test accuracy {acc * 100:.2f}%")
  if a.plot:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(np.arange(1, len(losses) + 1), losses, lw=0.8, label="loss per step")
    k = max(1, len(losses) // 50)
    if len(losses) >= 2 * k:
      smooth = np.convolve(losses, np.ones(k) / k, mode="valid")
      ax.plot(np.arange(k, len(losses) + 1), smooth, lw=1.6, label=f"mean of {k}")
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("softmax cross-entropy")
    ax.set_title(f"pygrad: MLP {'-'.join(map(str, sizes))} on digits, test accuracy {acc * 100:.1f}%", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(a.plot, dpi=110)
    plt.close(fig)
    print(f"wrote {a.plot}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
