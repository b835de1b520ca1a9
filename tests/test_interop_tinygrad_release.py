"""compute_gradient lets go of the graph it converted (pygrad/interop/tinygrad.py `release`): the opaque BUFFERs' args
hold tinygrad nodes, and the interner would keep them, and the caller's graph, alive until some later drain."""
from __future__ import annotations
import gc, weakref
import pytest

pytest.importorskip("tinygrad", reason="tinygrad is not installed (pip install '.[tinygrad]')")
from tinygrad import Tensor  # noqa: E402
import pygrad.interop.tinygrad as pt  # noqa: E402
from pygrad.intern import ARGS  # noqa: E402

DEV = "PYTHON"


def _graph():
  """A loss whose target w meets an input x through nodes off the target path (each one opaque BUFFER in pygrad)."""
  x, w = Tensor.empty(4, 8, device=DEV), Tensor.empty(8, device=DEV)
  off = (x.exp2() * 3.0).log2()  # no path to w: converted as one BUFFER whose arg holds this tinygrad node
  return (off * w).sum(), w, off


def test_compute_gradient_keeps_no_tinygrad_node_alive():
  loss, w, off = _graph()
  refs = [weakref.ref(u) for u in (off.uop, off.uop.src[0], off.uop.src[0].src[0])]  # above x: this graph's own
  g = pt.compute_gradient(loss.uop, loss.uop.const_like(1.0), {w.uop})
  assert w.uop in g and g[w.uop].shape == (8,)
  held = [x for x in ARGS.objs.values() if type(x) is tuple and x and x[0] is off.uop]
  assert not held  # the opaque BUFFER's arg is forgotten when compute_gradient returns
  del loss, w, off, g
  gc.collect()
  assert all(r() is None for r in refs)  # so the caller's graph dies with the caller's last reference


def test_release_leaves_the_interner_as_it_found_it():
  """Repeated derivations on fresh graphs: the interner's tables do not grow with the number of graphs."""
  def one():
    loss, w, _ = _graph()
    pt.compute_gradient(loss.uop, loss.uop.const_like(1.0), {w.uop})
  one()
  gc.collect()
  ARGS.drain()
  n = len(ARGS.objs)
  for _ in range(20): one()
  assert len(ARGS.objs) <= n
