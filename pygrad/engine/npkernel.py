"""The fallback for a planned Loop the VM cannot take: an index space of more than VM_MAXDIM dims even after lowering
merged what it could (a 17-d permute, a reduce over alternate axes, a pad of a 17-d tensor), or more live values
than the VM's register file holds (engine/lower.py's regfile_fits). The kernel runs between C segments, as a CALL
does, over the same buffers and views, computing with values.alu: the numpy evaluator's results. Rare by
construction, so plain numpy is fast enough; a value is dropped after its last use, so memory stays that of the
values live at once."""
from __future__ import annotations
import numpy as np
from .planner import Loop, KNode
from .views import View
from .values import alu, reduce_value, divide


class NumpyKernel:
  """A program step: `loop` run by numpy; `bufs` the buffers it reads and writes (for arena liveness)."""
  __slots__ = ("loop", "bufs")

  def __init__(self, loop: Loop):
    self.loop = loop
    self.bufs = [k.buf for k in loop.knodes if k.is_load] + [s.buf for s in loop.stores]

  def run(self, memory) -> None:
    """Run the kernel; memory(buf) is the buffer's storage as a flat, typed numpy array."""
    loop = self.loop
    vals: dict[KNode, np.ndarray] = {}
    last = {s: k for k in loop.knodes if not k.is_load for s in k.src}
    keep = {st.src for st in loop.stores}
    with np.errstate(all="ignore"):
      for k in loop.knodes:
        if k.is_load: vals[k] = _read(memory(k.buf), k.view).astype(k.dtype.numpy)
        else:
          xs = [vals[s] for s in k.src]
          vals[k] = divide(k.dtype, xs[0], xs[1]) if k.opcode == "DIV" else alu(k.op, k.dtype, xs, k.sdtype)
          for s in k.src:
            if last[s] is k and s not in keep: vals.pop(s, None)
      for st in loop.stores:
        v = vals[st.src]
        shape = list(loop.shape)
        if loop.redop is not None:
          v = reduce_value(loop.redop, loop.rdtype, v, loop.redaxes)
          for a in loop.redaxes: shape[a] = 1
        dst = memory(st.buf)
        _strided(dst, st.view.offset, shape, st.view.strides)[...] = v


def _strided(a: np.ndarray, offset: int, shape, strides) -> np.ndarray:
  """The elements of flat array a at offset + sum(index * stride) (numpy checks they lie inside a)."""
  its = a.itemsize
  return np.ndarray(tuple(shape), a.dtype, buffer=a, offset=offset * its, strides=tuple(s * its for s in strides))


def _read(a: np.ndarray, v: View) -> np.ndarray:
  """A view's values (zero outside its mask)."""
  if v.mask is None: return _strided(a, v.offset, v.shape, v.strides)
  out = np.zeros(v.shape, a.dtype)
  if any(hi <= lo for lo, hi in v.mask): return out
  off = v.offset + sum(lo * s for (lo, _), s in zip(v.mask, v.strides))
  out[tuple(slice(lo, hi) for lo, hi in v.mask)] = _strided(a, off, [hi - lo for lo, hi in v.mask], v.strides)
  return out


__all__ = ["NumpyKernel"]
