"""numpy's huge-page advice paused while a compile builds its tables (pygrad/pages.py): off inside, restored after,
for nested and concurrent callers, and never left changed by a compile, even one that fails."""
import threading
import numpy as np
import pytest
import pygrad
from pygrad import UOp, dtypes
from pygrad.pages import small_pages, _SET

pytestmark = pytest.mark.skipif(_SET is None, reason="this numpy has no huge-page switch to pause")


def _advice() -> bool:
  """numpy's current setting, read by setting it back to itself."""
  now = _SET(True)
  _SET(now)
  return now


@pytest.fixture(params=[True, False])
def advice(request):
  was = _SET(request.param)
  yield request.param
  _SET(was)


def test_off_inside_and_restored_after(advice):
  with small_pages():
    assert _advice() is False
    with small_pages(): assert _advice() is False
    assert _advice() is False  # the inner exit does not restore it while the outer is still inside
  assert _advice() is advice


def test_restored_after_an_exception(advice):
  with pytest.raises(KeyError):
    with small_pages(): raise KeyError("x")
  assert _advice() is advice


def test_overlapping_threads_restore_once(advice):
  inside, leave = threading.Barrier(3), threading.Event()

  def work():
    with small_pages():
      inside.wait()
      leave.wait()

  ts = [threading.Thread(target=work) for _ in range(2)]
  for t in ts: t.start()
  inside.wait()
  assert _advice() is False
  leave.set()
  for t in ts: t.join()
  assert _advice() is advice


def test_compile_leaves_the_setting_as_it_was(advice):
  x = UOp.placeholder((4, 4), dtypes.float32, "x")
  prog = pygrad.compile((x * 2 + 1).sum(), [x])
  assert _advice() is advice
  np.testing.assert_allclose(prog(np.ones((4, 4), np.float32)), 48.0)
  with pytest.raises(ValueError): pygrad.compile(x * 2, [x * 3])
  assert _advice() is advice
