"""Differential fuzzing (issue 10 items 5 and 17): random graphs over every dtype (tests/fuzzgraphs.py) evaluate the
same on the C engine as on the numpy reference engine -- bit for bit where every op is exactly specified, NaN-aware
within the dtype's tolerance where a transcendental, POW or float reduction is involved -- and simplify() changes no
value: before and after give the same bits on each engine (within tolerance only on the C engine, where constant
folding uses the reference's transcendentals). Budget and long mode: see fuzzgraphs.py."""
from __future__ import annotations
import pytest
from hypothesis import example, given
from fuzzgraphs import FUZZ, recipes, build, input_values, exact_graph, same_values, evaluate

pytest.importorskip("pygrad._core")
ENGINES = ("numpy", "c")


def _run(outs, vals, engine):
  try:
    return evaluate(outs, vals, engine), None
  except (ValueError, TypeError, ZeroDivisionError, OverflowError) as e:
    return None, f"{type(e).__name__}: {e}"


@FUZZ
@given(recipes())
@example(recipe={"inputs": [((3,), "bfloat16")], "seed": 0, "plain": False,  # log2 of a negative, bitcast
                 "steps": [("unary", [0, 2, 0, 0, 0, 0, 0, 0]), ("unary", [0] * 8), ("unary", [0] * 8),
                           ("cast", [1, 0, 0, 0, 0, 0, 0, 0])]})
@example(recipe={"inputs": [((2, 3), "float64")], "seed": 54, "plain": False,  # a float sum's bits, bitcast
                 "steps": [("movement", [0, 1, 1, 0, 0, 0, 0, 0]), ("reduce", [1, 0, 0, 0, 0, 0, 0, 0]),
                           ("cast", [2, 0, 0, 0, 0, 0, 0, 0])]})
def test_c_engine_equals_numpy_engine(recipe):
  b = build(recipe)
  vals = input_values(recipe, b.bufs)
  want, werr = _run(b.outputs, vals, "numpy")
  got, gerr = _run(b.outputs, vals, "c")
  assert (werr is None) == (gerr is None), f"numpy: {werr}; c: {gerr}"
  if werr is not None: return
  for o, w, g in zip(b.outputs, want, got):
    why = same_values(g, w, o.dtype, exact_graph(o))
    assert why is None, f"{o.op.name} {o.dtype} {o.shape}: c vs numpy {why}"


@FUZZ
@given(recipes())
def test_simplify_preserves_values_on_both_engines(recipe):
  b = build(recipe)
  vals = input_values(recipe, b.bufs)
  simple = [o.simplify() for o in b.outputs]
  for engine in ENGINES:
    before, berr = _run(b.outputs, vals, engine)
    after, aerr = _run(simple, vals, engine)
    assert (berr is None) == (aerr is None), f"{engine}: before {berr}; after {aerr}"
    if berr is not None: continue
    for o, x, y in zip(b.outputs, before, after):
      why = same_values(y, x, o.dtype, engine == "numpy" or exact_graph(o))
      assert why is None, f"{engine}: {o.op.name} {o.dtype} {o.shape} simplified differs: {why}"
