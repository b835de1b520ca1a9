"""Fixtures the test modules share."""
import pytest
import pygrad


@pytest.fixture
def restore_threads():
  """The interpreter's thread count as it was before the test (tests that set it put it back)."""
  n = pygrad.get_num_threads()
  yield
  pygrad.set_num_threads(n)


@pytest.fixture
def own_engine():
  """tinygrad's own compute_gradient in place (pygrad's uninstalled), and whatever was installed put back after the
  test (the tinygrad interop's tests; tinygrad is an optional dependency, imported only here)."""
  tg_gradient = pytest.importorskip("tinygrad.mixin.gradient", reason="tinygrad is not installed")
  import pygrad.interop.tinygrad as pt
  saved = tg_gradient.compute_gradient
  pt.uninstall()
  yield
  tg_gradient.compute_gradient = saved
