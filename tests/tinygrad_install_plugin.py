"""pytest plugin (`-p tinygrad_install_plugin`): loaded before any test module is imported, it installs pygrad as
tinygrad's gradient engine, so a test file's `from tinygrad.mixin.gradient import compute_gradient` gets pygrad's.
At exit it prints how many gradients pygrad derived, so the caller can tell that pygrad really ran them."""
import atexit
import pygrad.gradient
import pygrad.interop.tinygrad as pt
import tinygrad.mixin.gradient

pt.install()
assert tinygrad.mixin.gradient.compute_gradient is pt.compute_gradient
_calls = [0]
_derive = pygrad.gradient.compute_gradient


def _counting(*args):
  _calls[0] += 1
  return _derive(*args)


pt._pg_gradient.compute_gradient = _counting
atexit.register(lambda: print(f"pygrad derived {_calls[0]} tinygrad gradients"))
