"""Fixtures the test modules share."""
import pytest
import pygrad


@pytest.fixture
def restore_threads():
  """The interpreter's thread count as it was before the test (tests that set it put it back)."""
  n = pygrad.get_num_threads()
  yield
  pygrad.set_num_threads(n)
