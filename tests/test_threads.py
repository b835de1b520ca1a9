"""Threads on the C core (issue 10 item 18): 4 threads building, differentiating, simplifying and evaluating random
graphs (tests/fuzzgraphs.py recipes, drawn from fixed seeds) at once give exactly the results one thread gives: the
same graphs node for node and the same bits. CI also runs this file under ASan + UBSan (.ci/run)."""
from __future__ import annotations
import random, threading
import numpy as np
import pytest
import pygrad
from pygrad import dtypes
from fuzzgraphs import KINDS, DTYPES, build, input_values, serialize

pytest.importorskip("pygrad._core")
pytestmark = pytest.mark.skipif(pygrad.core_name() != "c", reason="threads on the C core")
NTHREADS, NRECIPES = 4, 40


def _recipe(seed: int) -> dict:
  rng = random.Random(seed)
  names = sorted(DTYPES)
  inputs = [(tuple(rng.randint(1, 4) for _ in range(rng.randint(0, 3))),
             "float32" if i == 0 else rng.choice(names)) for i in range(rng.randint(1, 3))]
  steps = [(rng.choice(KINDS), [rng.randint(0, 1 << 16) for _ in range(8)]) for _ in range(rng.randint(4, 20))]
  return {"inputs": inputs, "steps": steps, "seed": seed}


def _work(recipe) -> tuple:
  """Everything a recipe yields: its graph, its gradient and simplified graphs (node for node), and their values."""
  b = build(recipe)
  outs = list(b.outputs)
  floats = [o for o in outs if dtypes.is_float(o.dtype) and isinstance(o.device, str)]
  if floats:
    loss = floats[-1].cast(dtypes.float32).sum()
    outs += loss.gradient(b.bufs[0])
  outs += [o.simplify() for o in outs]
  try:
    vals = pygrad.evaluate(outs, input_values(recipe, b.bufs), engine="c")
    got = [(np.asarray(v).dtype.str, np.asarray(v).shape, np.asarray(v).tobytes()) for v in vals]
  except (ValueError, TypeError) as e:
    got = [f"{type(e).__name__}: {e}"]
  return serialize(outs), b.errors, got


def test_four_threads_give_the_single_threaded_results():
  recipes = [_recipe(s) for s in range(NRECIPES)]
  want = [_work(r) for r in recipes]
  results: dict[int, list] = {}
  errors: list = []
  start = threading.Barrier(NTHREADS)

  def run(t: int):
    order = list(range(NRECIPES))
    random.Random(t).shuffle(order)  # each thread in its own order: different nodes are built and dropped at once
    try:
      start.wait()
      results[t] = [(i, _work(recipes[i])) for i in order]
    except BaseException as e:  # noqa: BLE001 -- reported below, with the thread
      errors.append((t, e))
  threads = [threading.Thread(target=run, args=(t,)) for t in range(NTHREADS)]
  for th in threads: th.start()
  for th in threads: th.join()
  assert not errors, errors
  for t in range(NTHREADS):
    for i, got in results[t]:
      assert got == want[i], f"thread {t}, recipe {i}: differs from the single-threaded result"
