"""The single-node math methods (`a + b`, `a * 2.0`, `a.sin()`), one closure per op, made for UOp by
mathops._bind. They are the inner loop of every graph build: each closure has its op's tables bound and does the
core call and the new handle's publication (uop._wrap's fresh-node branch) inline, since every Python call level
saved is ~50-90 ns, a tenth of the method (bench/bench_core.py's stage breakdown). Anything off the fast path --
another dtype or shape, a node that already has a handle, an error code -- goes through uop._wrap, alu1/alu2/alu2k
and the generic inference, which raise the precise errors."""
from __future__ import annotations
from .ops import Ops
from .intern import ARGS
from . import uop as _u
from .uop import UOp, alu1, alu2, alu2k, _attach_current, _claim, _handles, _new_handle, _on_dead, _Ref, _register, \
  _wrap, _make1, _make2, _make2k, _args_get, _UNARY_OK, _BINARY_OUT, _NONE, _META0


def unary_method(op: Ops):
  """The method op(self)."""
  ok = _UNARY_OK.get(op, frozenset())

  def method(self) -> UOp:
    d = self._dtype
    if d in ok:
      m = self._m
      nid = _make1(op, d.id, self._id, 0, 0, m)
      if nid >= 0:
        if nid in _handles: return _wrap(nid, op, d, None, None, self._shape, self._device, m)
        o = _new_handle(UOp)
        o._id, o._op, o._dtype, o._arg, o._tag, o._shape, o._device, o._src, o._m = \
          nid, op, d, None, None, self._shape, self._device, None, m
        w = _Ref(o, _on_dead)
        w.nid = nid
        if _claim(nid, w) is not w: o = _register(o, w, nid)
        if _u._md_open: _attach_current(o)
        return o
    return alu1(op, self)
  method.__name__ = method.__qualname__ = op.name.lower()
  return method


def binary_method(op: Ops, reverse: bool):
  """The method op(self, x), or op(x, self) if reverse: x a node or a Python scalar. The fast paths are the forward
  method's with a node operand of self's dtype, shape (or ()) and device, and with a float for a float self (its
  constant made in the same core call, see alu2k); the rest is alu2/alu2k, then _bin's promotion and broadcast."""
  outs = {d: (out, out.id) for d, out in _BINARY_OUT.get(op, _NONE).items()}
  if reverse:
    def method(self, x):
      r = alu2(op, x, self) if type(x) is UOp else alu2k(op, self, x, 1)
      return self._bin(op, x, True) if r is None else r
  else:
    def method(self, x):
      t = type(x)
      if t is UOp:
        d = self._dtype
        hit = outs.get(d) if x._dtype is d else None
        if hit is not None:
          sa, sb = self._shape, x._shape
          if (sa == sb or not sb) and self._device == x._device:
            out, oid = hit
            m = self._m
            nid = _make2(op, oid, self._id, x._id, 0, 0, m)
            if nid >= 0:
              if nid in _handles: return _wrap(nid, op, out, None, None, sa, self._device, m)
              o = _new_handle(UOp)
              o._id, o._op, o._dtype, o._arg, o._tag, o._shape, o._device, o._src, o._m = \
                nid, op, out, None, None, sa, self._device, None, m
              w = _Ref(o, _on_dead)
              w.nid = nid
              if _claim(nid, w) is not w: o = _register(o, w, nid)
              if _u._md_open: _attach_current(o)
              return o
        r = alu2(op, self, x)
      elif t is float and self._dtype.kind == "f" and self._dtype in outs and not _u._md_open:
        d = self._dtype
        out, oid = outs[d]
        m = self._m
        aid = _kaids.get(x)
        if aid is None: aid = _scalar_aid(x)
        nid = _make2k(op, oid, self._id, d.id, aid, _META0, 0, m)
        if nid >= 0:
          if nid in _handles: return _wrap(nid, op, out, None, None, self._shape, self._device, m)
          o = _new_handle(UOp)
          o._id, o._op, o._dtype, o._arg, o._tag, o._shape, o._device, o._src, o._m = \
            nid, op, out, None, None, self._shape, self._device, None, m
          w = _Ref(o, _on_dead)
          w.nid = nid
          if _claim(nid, w) is not w: o = _register(o, w, nid)
          return o
        _kaids.pop(x, None)  # (the id may be drained: alu2k interns again)
        r = alu2k(op, self, x, 0)
      else: r = alu2k(op, self, x, 0)
      return self._bin(op, x) if r is None else r
  method.__name__ = method.__qualname__ = f"{op.name.lower()}{' (reflected)' if reverse else ''}"
  return method


# float constant value -> its interned arg id, for the binary methods' scalar path: ARGS.get's key tuple and call
# cost ~150 ns a call, and a graph uses few distinct constants. Floats only (so 1.0 never finds True's or 1's id;
# 0.0 and -0.0, equal as keys, and NaN are not kept); ids are held by no count: a drained one makes the core answer
# "gone" and is dropped here, and a generation wrap clears the whole map, as for _moved.
_kaids: dict = {}
_KAIDS_LIMIT = 4096


def _scalar_aid(x: float) -> int:
  aid = _args_get(x)
  if x != 0.0 and x == x:
    if len(_kaids) >= _KAIDS_LIMIT: _kaids.clear()
    _kaids[x] = aid
  return aid


ARGS.on_wrap.append(_kaids.clear)
