"""Strided views: how the planner turns movement ops into no-copy access. A View maps an index of its shape to an
element offset of a buffer (offset + sum of index*stride) and, with a mask, marks a box of valid indices (zero
outside: PAD). PERMUTE, SHRINK, FLIP (negative strides), EXPAND (stride 0) and PAD always compose; RESHAPE composes
when the strides allow (else `reshape` returns None and the planner copies)."""
from __future__ import annotations
import math


def contiguous_strides(shape) -> tuple[int, ...]:
  st, acc = [], 1
  for s in reversed(shape):
    st.append(acc if s != 1 else 0)
    acc *= s
  return tuple(reversed(st))


_CONTIG: dict = {}  # shape -> View.contiguous(shape)


class View:
  """shape, strides (elements), offset (elements), mask (None or ((lo, hi), ...) per dim)."""
  __slots__ = ("shape", "strides", "offset", "mask")

  def __init__(self, shape, strides, offset=0, mask=None):
    self.shape, self.strides, self.offset = tuple(shape), tuple(strides), offset
    if mask is not None and all(lo == 0 and hi == s for (lo, hi), s in zip(mask, self.shape)): mask = None
    self.mask = mask

  @staticmethod
  def contiguous(shape) -> View:
    """The row-major view of shape: one object per shape (a View is never changed; a plan asks for one per buffer)."""
    if type(shape) is not tuple: shape = tuple(shape)
    v = _CONTIG.get(shape)
    if v is None:
      if len(_CONTIG) >= 4096: _CONTIG.clear()
      v = _CONTIG[shape] = View(shape, contiguous_strides(shape))
    return v

  def key(self): return (self.shape, self.strides, self.offset, self.mask)
  def __repr__(self): return f"View({self.shape}, {self.strides}, off={self.offset}, mask={self.mask})"

  @property
  def numel(self) -> int: return math.prod(self.shape)

  def is_scalar(self) -> bool:
    """Every index reads the same element (a broadcast scalar)."""
    return self.mask is None and all(st == 0 or s == 1 for st, s in zip(self.strides, self.shape))

  def broadcast_to(self, shape) -> View:
    """A ()-shaped view (never masked: it has no dims) broadcast to shape, the implicit broadcast of ALU operands."""
    return View(shape, (0,) * len(shape), self.offset)

  # ---- movement ----
  def permute(self, order) -> View:
    return View([self.shape[i] for i in order], [self.strides[i] for i in order], self.offset,
                None if self.mask is None else tuple(self.mask[i] for i in order))

  def expand(self, shape) -> View:
    st = tuple(0 if o != n else s for o, n, s in zip(self.shape, shape, self.strides))
    mask = None
    if self.mask is not None:
      mask = tuple(((0, n) if hi > lo else (0, 0)) if o != n else (lo, hi)
                   for o, n, (lo, hi) in zip(self.shape, shape, self.mask))
    return View(shape, st, self.offset, mask)

  def shrink(self, arg) -> View:
    off = self.offset + sum(b * s for (b, _), s in zip(arg, self.strides))
    shape = tuple(e - b for b, e in arg)
    mask = None
    if self.mask is not None:
      mask = tuple((min(max(lo - b, 0), e - b), min(max(hi - b, 0), e - b)) for (lo, hi), (b, e) in zip(self.mask, arg))
      mask = tuple((lo, max(lo, hi)) for lo, hi in mask)
    return View(shape, self.strides, off, mask)

  def flip(self, flags) -> View:
    off = self.offset + sum((n - 1) * s for f, n, s in zip(flags, self.shape, self.strides) if f and n > 0)
    st = tuple(-s if f else s for f, s in zip(flags, self.strides))
    mask = None
    if self.mask is not None:
      mask = tuple((n - hi, n - lo) if f else (lo, hi) for f, n, (lo, hi) in zip(flags, self.shape, self.mask))
    return View(self.shape, st, off, mask)

  def pad(self, arg) -> View:
    off = self.offset - sum(b * s for (b, _), s in zip(arg, self.strides))
    shape = tuple(n + b + a for n, (b, a) in zip(self.shape, arg))
    old = self.mask if self.mask is not None else tuple((0, n) for n in self.shape)
    mask = tuple((lo + b, hi + b) for (lo, hi), (b, _) in zip(old, arg))
    return View(shape, self.strides, off, mask)

  def reshape(self, new) -> View | None:
    """The view with shape `new` over the same elements in C order, or None if strides cannot express it."""
    new = tuple(new)
    if new == self.shape: return self
    if math.prod(self.shape) == 0: return View(new, (0,) * len(new), 0, tuple((0, 0) for _ in new) if new else None)
    if self.mask is not None: return self._reshape_masked(new)
    old = [(n, s) for n, s in zip(self.shape, self.strides) if n != 1]
    out, i = [], 0
    nd = [n for n in new]
    # group old dims into runs whose product equals each run of new dims (numpy's no-copy reshape)
    j = 0
    while j < len(nd):
      if nd[j] == 1:
        out.append(0)
        j += 1
        continue
      if i >= len(old): return None
      # take new dims [j, j2) and old dims [i, i2) with equal products
      pn, po = nd[j], old[i][0]
      j2, i2 = j + 1, i + 1
      while pn != po:
        if pn < po:
          if j2 >= len(nd): return None
          pn *= nd[j2]
          j2 += 1
        else:
          if i2 >= len(old): return None
          po *= old[i2][0]
          i2 += 1
      for k in range(i, i2 - 1):  # the old run must be contiguous in itself
        if old[k][1] != old[k + 1][1] * old[k + 1][0]: return None
      st = old[i2 - 1][1]
      run = []
      for k in range(j2 - 1, j - 1, -1):
        run.append(0 if nd[k] == 1 else st)
        st *= nd[k]
      out.extend(reversed(run))
      i, j = i2, j2
    if i != len(old): return None
    return View(new, out, self.offset)

  def _reshape_masked(self, new) -> View | None:
    """A masked view reshapes only by adding or removing size-1 dims."""
    if [n for n in self.shape if n != 1] != [n for n in new if n != 1]: return None
    if any(hi <= lo for lo, hi in self.mask): return None
    inner = [(n, s, m) for n, s, m in zip(self.shape, self.strides, self.mask) if n != 1]
    st, mask, k = [], [], 0
    for n in new:
      if n == 1:
        st.append(0)
        mask.append((0, 1))
      else:
        st.append(inner[k][1])
        mask.append(inner[k][2])
        k += 1
    return View(new, st, self.offset, tuple(mask))


def apply(view: View, op_name: str, arg) -> View | None:
  """The view after one movement op (by Ops name), or None when it needs a copy."""
  if op_name == "RESHAPE": return view.reshape(arg)
  if op_name == "EXPAND": return view.expand(arg)
  if op_name == "PERMUTE": return view.permute(arg)
  if op_name == "SHRINK": return view.shrink(arg)
  if op_name == "FLIP": return view.flip(arg)
  if op_name == "PAD": return view.pad(arg)
  if op_name == "BCAST": return view.broadcast_to(arg)
  raise ValueError(f"not a movement op: {op_name}")
