"""Helpers for gradient tests: float64 finite differences through the numpy reference evaluator."""
from __future__ import annotations
import numpy as np
import pygrad
from pygrad import UOp, dtypes


def evaluate(outs, inputs):
  return pygrad.evaluate(list(outs), inputs, engine="numpy")


def numeric_grad(loss: UOp, bufs: list[UOp], vals: list[np.ndarray], eps: float = 1e-6) -> list[np.ndarray]:
  """Central differences of the scalar `loss` for each input."""
  out = []
  for i, v in enumerate(vals):
    g = np.zeros_like(v)
    it = np.nditer(v, flags=["multi_index"])
    for _ in it:
      idx = it.multi_index
      hi, lo = [x.copy() for x in vals], [x.copy() for x in vals]
      hi[i][idx] += eps
      lo[i][idx] -= eps
      fh = evaluate([loss], dict(zip(bufs, hi)))[0]
      fl = evaluate([loss], dict(zip(bufs, lo)))[0]
      g[idx] = (float(fh) - float(fl)) / (2 * eps)
    out.append(g)
  return out


def make_inputs(shapes, rng, low=None, high=None):
  bufs = [UOp.placeholder(s, dtypes.float64, name=f"in{i}") for i, s in enumerate(shapes)]
  if low is None: vals = [rng.standard_normal(s) for s in shapes]
  else: vals = [rng.uniform(low, high, s) for s in shapes]
  return bufs, vals


def check_fd(fn, shapes, rng, low=None, high=None, rtol=1e-5, atol=1e-6):
  """fn's gradients (of sum(fn(*x) * R) for a random R) against finite differences; returns the symbolic grads."""
  bufs, vals = make_inputs(shapes, rng, low, high)
  out = fn(*bufs)
  r = rng.standard_normal(out.shape)
  rb = UOp.placeholder(out.shape, dtypes.float64, name="R")
  loss = (out * rb).sum()
  grads = loss.gradient(*bufs)
  allb, allv = bufs + [rb], vals + [r]
  got = evaluate(grads, dict(zip(allb, allv)))
  want = numeric_grad(loss, allb, allv)[:len(bufs)]
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
  return got, vals, r
