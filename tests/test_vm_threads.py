"""The C interpreter's thread pool: pygrad.set_num_threads / get_num_threads and PYGRAD_NUM_THREADS, and results
bit-identical for 1, 2 and 3 threads on every kind of kernel the pool splits (elementwise groups, reductions along
and across rows, leading/trailing/middle reduced dims, multiply-then-sum, contractions with transposed operands and
batches, float32 and float64) at sizes above the inline threshold, plus two Python threads sharing the pool."""
from __future__ import annotations
import os
import subprocess
import sys
import numpy as np
import pytest
import pygrad
from pygrad import UOp, dtypes
from concurrency import run_on_threads

program = pytest.importorskip("pygrad.engine.program", reason="the compiled interpreter is not built",
                              exc_type=ImportError)
from pygrad.engine import numpy_eval  # noqa: E402

F32, F64 = dtypes.float32, dtypes.float64


def test_set_and_get_num_threads(restore_threads):
  assert pygrad.set_num_threads(3) == 3 and pygrad.get_num_threads() == 3
  assert pygrad.set_num_threads(np.int64(1)) == 1 and pygrad.get_num_threads() == 1
  assert pygrad.set_num_threads(10_000) == 256
  with pytest.raises(ValueError, match="n must be >= 1, got 0"): pygrad.set_num_threads(0)
  with pytest.raises(TypeError, match="got float"): pygrad.set_num_threads(2.0)
  with pytest.raises(TypeError, match="got bool"): pygrad.set_num_threads(True)


def _threads_in_subprocess(env_value):
  env = dict(os.environ)
  env.pop("PYGRAD_NUM_THREADS", None)
  if env_value is not None: env["PYGRAD_NUM_THREADS"] = env_value
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
  return subprocess.run([sys.executable, "-c", "import pygrad; print(pygrad.get_num_threads())"], env=env,
                        capture_output=True, text=True, timeout=120)


def test_env_variable_and_default():
  assert _threads_in_subprocess("3").stdout.strip() == "3"
  default = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  assert _threads_in_subprocess(None).stdout.strip() == str(default)
  bad = _threads_in_subprocess("zero")
  assert bad.returncode != 0 and "PYGRAD_NUM_THREADS must be a positive integer, got 'zero'" in bad.stderr


def _rnd(shape, seed, dt=np.float32):
  return np.random.default_rng(seed).standard_normal(shape).astype(dt)


def _cases():
  """(outputs, inputs, values): graphs whose kernels the pool splits in each of its ways."""
  out = []
  a, b = UOp.placeholder((512, 700), F32, "a"), UOp.placeholder((512, 700), F32, "b")
  va, vb = _rnd((512, 700), 1), _rnd((512, 700), 2)
  out.append(("elementwise", [(a * b + a).sin() * (b * b + 1.0).sqrt()], [a, b], [va, vb]))
  out.append(("row reductions", [a.sum(1), a.max(1), (a * b).sum(1)], [a, b], [va, vb]))
  out.append(("column reductions", [a.sum(0), (a * b).max(0), (a * b).sum(0)], [a, b], [va, vb]))
  f = UOp.placeholder((3_000_000,), F32, "f")
  out.append(("one long row", [f.exp2() * 0.5, f.sum(), f.max()], [f], [_rnd((3_000_000,), 3)]))
  c = UOp.placeholder((24, 50, 330), F32, "c")
  vc = _rnd((24, 50, 330), 4)
  out.append(("3-d reductions", [c.sum(0), c.sum(1), c.sum(2), c.sum((0, 2)), c.max((1, 2)),
                                 c.permute((2, 0, 1)).sum(2)], [c], [vc]))
  x, w = UOp.placeholder((128, 256), F32, "x"), UOp.placeholder((256, 256), F32, "w")
  vx, vw = _rnd((128, 256), 5), _rnd((256, 256), 6)
  out.append(("matmul", [x @ w, x.T @ x, x @ w.T, (x @ w).relu().sum(0)], [x, w], [vx, vw]))
  w10, g10 = UOp.placeholder((256, 10), F32, "w10"), UOp.placeholder((128, 10), F32, "g10")
  out.append(("narrow matmul", [x @ w10, x.T @ g10, g10 @ w10.T], [x, w10, g10],
              [vx, _rnd((256, 10), 9), _rnd((128, 10), 10)]))
  bx = UOp.placeholder((6, 96, 80), F32, "bx")
  out.append(("batched matmul", [bx @ bx.permute((0, 2, 1))], [bx], [_rnd((6, 96, 80), 7)]))
  # 40 batch elements: a job of more chunks than vm_pool.c claims by bitmask (32), claimed by counter instead
  mb = UOp.placeholder((40, 24, 64), F32, "mb")
  out.append(("many batched matmuls", [mb @ mb.permute((0, 2, 1))], [mb], [_rnd((40, 24, 64), 11)]))
  # a shallow contraction split by rows between loop kernels split by rows
  h, wv = UOp.placeholder((128, 10), F32, "h"), UOp.placeholder((256, 10), F32, "wv")
  out.append(("shallow matmul between loops", [((h * 2.0) @ wv.T + 1.0).relu()], [h, wv],
              [_rnd((128, 10), 12), _rnd((256, 10), 13)]))
  d = UOp.placeholder((200, 300), F64, "d")
  vd = _rnd((200, 300), 8, np.float64)
  out.append(("float64", [d @ d.T, d.sum(0), (d * d).sum(1), d.exp2()], [d], [vd]))
  return out


CASES = _cases()


def _run(prog, vals):
  r = prog(*vals)
  return [r.copy()] if isinstance(r, np.ndarray) else [np.asarray(x).copy() for x in r]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bit_identical_for_one_two_and_three_threads(case, restore_threads):
  _, outs, ins, vals = case
  prog = pygrad.compile(outs, ins)
  res = {}
  for n in (1, 2, 3):
    pygrad.set_num_threads(n)
    res[n] = _run(prog, vals)
    again = _run(prog, vals)
    for r, s in zip(res[n], again): assert r.tobytes() == s.tobytes(), f"{n} threads: not repeatable"
  for n in (2, 3):
    for r1, rn in zip(res[1], res[n]): assert r1.tobytes() == rn.tobytes(), f"{n} threads differ from 1"
  want = numpy_eval.evaluate(outs, dict(zip(ins, vals)))
  for got, w in zip(res[1], want): np.testing.assert_allclose(got, w, rtol=2e-4, atol=2e-3)


def test_mlp_training_step_bit_identical(restore_threads):
  rng = np.random.default_rng(0)
  X, Y = UOp.placeholder((128, 64), F32, "X"), UOp.placeholder((128, 10), F32, "Y")
  W1, W2 = UOp.placeholder((64, 256), F32, "W1"), UOp.placeholder((256, 10), F32, "W2")
  logits = (X @ W1).relu() @ W2
  z = logits - logits.max(1, keepdim=True)
  loss = -((z - z.exp().sum(1, keepdim=True).log()) * Y).sum() / 128.0
  g1, g2 = loss.gradient(W1, W2)
  prog = pygrad.compile([loss, W1 - g1 * 0.1, W2 - g2 * 0.1], [X, Y, W1, W2])
  vals = [rng.standard_normal((128, 64)).astype(np.float32), np.eye(10, dtype=np.float32)[rng.integers(0, 10, 128)],
          (rng.standard_normal((64, 256)) * 0.1).astype(np.float32),
          (rng.standard_normal((256, 10)) * 0.1).astype(np.float32)]
  res = []
  for n in (1, 2, 3):
    pygrad.set_num_threads(n)
    res.append(b"".join(np.asarray(r).tobytes() for r in prog(*vals)))
  assert res[0] == res[1] == res[2]


def test_two_python_threads_share_the_pool(restore_threads):
  """One caller owns the pool at a time; the other runs alone: both get the one-thread bits."""
  pygrad.set_num_threads(2)
  a = UOp.placeholder((400, 500), F32, "a")
  prog = pygrad.compile([(a.exp2() * a).sum(0), a @ a.T], [a])
  vals = [_rnd((400, 500), i) for i in range(2)]
  want = [[r.copy() for r in prog(v)] for v in vals]

  def run(i):
    for _ in range(15):
      for r, w in zip(prog(vals[i]), want[i]): assert r.tobytes() == w.tobytes()
  run_on_threads(run, 2)
