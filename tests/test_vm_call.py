"""A compiled program's call path: from the second call on a plain program runs through a lean call made for its
signature (pygrad/engine/fastcall.py). Every input it does not take -- another dtype or shape, a strided or misaligned
array, a list, a wrong count -- must still give the general path's result or its error naming the input, and results
must not share memory between calls."""
from __future__ import annotations
import numpy as np
import pytest
import pygrad
from pygrad import UOp, dtypes
from concurrency import run_on_threads

pytest.importorskip("pygrad.engine.program", reason="the compiled interpreter is not built", exc_type=ImportError)

F32 = dtypes.float32


def _prog():
  a, b = UOp.placeholder((3, 4), F32, "a"), UOp.placeholder((4, 2), F32, "b")
  return pygrad.compile([a @ b, (a @ b).reshape(6), (a * 2.0).sum(1)], [a, b])


def _want(A, B):
  A, B = np.asarray(A, np.float32), np.asarray(B, np.float32)
  return [A @ B, (A @ B).reshape(6), (A * 2).sum(1)]


def _rnd(shape, seed):
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_repeated_calls_give_fresh_correct_results():
  p = _prog()
  A, B = _rnd((3, 4), 0), _rnd((4, 2), 1)
  got = [p(A, B) for _ in range(4)]
  assert p._fast is not None  # the lean call ran the later ones
  for r in got:
    for x, w in zip(r, _want(A, B)): np.testing.assert_allclose(x, w, rtol=1e-5, atol=1e-6)
  assert got[2][0].shape == (3, 2) and got[2][1].shape == (6,) and got[2][2].shape == (3,)
  assert not np.shares_memory(got[2][0], got[3][0])  # every call its own outputs
  got[2][0][...] = 7
  assert not (p(A, B)[0] == 7).any()


def test_inputs_the_lean_call_does_not_take_still_run_or_raise():
  p = _prog()
  A, B = _rnd((3, 4), 2), _rnd((4, 2), 3)
  for _ in range(3): p(A, B)
  want = _want(A, B)
  At = np.asfortranarray(A)  # right shape and dtype, not C-contiguous: converted
  raw = np.zeros(3 * 4 * 4 + 1, np.uint8)
  Am = np.frombuffer(raw.data, np.float32, 12, offset=1).reshape(3, 4)  # misaligned: converted
  Am[...] = A
  assert not Am.flags.aligned
  for args in [(At, B), (Am, B), (A.tolist(), B), (A, B[:, :].copy(order="F")), (A.view(np.ndarray), B)]:
    for x, w in zip(p(*args), want): np.testing.assert_allclose(x, w, rtol=1e-5, atol=1e-6)
  with pytest.raises(ValueError, match=r"input BUFFER 'a'.*expected dtype float32"): p(A.astype(np.float64), B)
  with pytest.raises(ValueError, match=r"input BUFFER 'b'.*expected shape \(4, 2\)"): p(A, B[:3])
  with pytest.raises(ValueError, match="takes 2 inputs, got 1"): p(A)
  with pytest.raises(ValueError, match="takes 2 inputs, got 3"): p(A, B, B)
  for x, w in zip(p(A, B), want): np.testing.assert_allclose(x, w, rtol=1e-5, atol=1e-6)  # and lean again


def test_single_output_and_no_inputs():
  a = UOp.placeholder((5,), F32, "a")
  p = pygrad.compile((a * 3.0).exp(), [a])
  A = _rnd((5,), 4)
  for _ in range(3): np.testing.assert_allclose(p(A), np.exp(A * 3), rtol=1e-6)
  c = pygrad.compile([UOp.const(2.0, F32).reshape((1,)).expand((4,)) * 3.0], [])
  for _ in range(3): np.testing.assert_array_equal(c()[0], np.full(4, 6, np.float32))


def test_threads_calling_one_program():
  """Two Python threads call one program: one takes its run state, the other a private one; both are right."""
  p = _prog()
  vals = [(_rnd((3, 4), 10 + i), _rnd((4, 2), 20 + i)) for i in range(2)]

  def run(i):
    for _ in range(300):
      for x, w in zip(p(*vals[i]), _want(*vals[i])): np.testing.assert_allclose(x, w, rtol=1e-5, atol=1e-6)
  run_on_threads(run, 2)
  assert len(p._free) >= 1
