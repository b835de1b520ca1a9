"""The single-node math methods (`a + b`, `a * 2.0`, `a.sin()`), one closure per op, made for UOp by
mathops._bind. They are the inner loop of every graph build: each closure has its op's tables bound, checks its
operands and makes the node, its handle and the handle's publication in one call (handles._mk_unary, _mk_binary,
_mk_binaryk: csrc/pymake.c on the C core), since every Python step saved is a tenth of the method
(bench/bench_core.py's stage breakdown). Anything off the fast path -- another dtype or shape, a node that already
has a handle, an error code -- goes through handles._wrap, make.alu1/alu2/alu2k and the generic inference, which
raise the precise errors."""
from __future__ import annotations
from .ops import Ops
from .dtype import BY_ID
from .mathops import MathMixin
from .intern import ARGS
from . import uop as _u
from .uop import UOp, _attach_current
from .handles import _wrap, _mk_unary, _mk_binary, _mk_binaryk
from .make import alu1, alu2, alu2k, _args_get, _UNARY_OK, _BINARY_OUT, _NONE, _META0


def unary_method(op: Ops):
  """The method op(self)."""
  ok = _UNARY_OK.get(op, frozenset())

  def method(self) -> UOp:
    d = self._dtype
    if d in ok:
      r = _mk_unary(op, d, d.id, self)
      if type(r) is UOp:
        if _u._md_open: _attach_current(r)
        return r
      if r >= 0: return _wrap(r, op, d, None, None, self._shape, self._device, self._m)
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
            r = _mk_binary(op, out, oid, self, x)
            if type(r) is UOp:
              if _u._md_open: _attach_current(r)
              return r
            if r >= 0: return _wrap(r, op, out, None, None, sa, self._device, self._m)
        r = alu2(op, self, x)
      elif t is float and self._dtype.kind == "f" and self._dtype in outs and not _u._md_open:
        d = self._dtype
        out, oid = outs[d]
        aid = _kaids.get(x)
        if aid is None: aid = _scalar_aid(x)
        r = _mk_binaryk(op, out, oid, self, d.id, aid, _META0, 0)
        if type(r) is UOp: return r
        if r >= 0: return _wrap(r, op, out, None, None, self._shape, self._device, self._m)
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


def install_c(UOp, made, meth_install, tmpl_install) -> None:
  """The C core: the single-node methods' fast paths in C (csrc/pymeth.c) -- `a + b`, `a * b`, `&`, `|`, `^` as the
  handle type's number slots, the named ones as method descriptors set on UOp -- each falling back to the Python
  method made above for anything off its fast path."""
  ndt = max(d.id for d in BY_ID) + 1
  dts = tuple(next((d for d in BY_ID if d.id == i), None) for i in range(ndt))
  rev = {name: fn for name, op, r, fn in made if r}
  specs = []
  for name, op, r, fn in made:
    if r: continue
    if r is None:
      ok = _UNARY_OK.get(op, frozenset())
      outs = tuple(i if d is not None and d in ok else -1 for i, d in enumerate(dts))
      specs.append((0, name, op, op.value, outs, fn, None))
      continue
    table = _BINARY_OUT.get(op, _NONE)
    outs = tuple(table[d].id if d is not None and d in table else -1 for i, d in enumerate(dts))
    if name in ("__add__", "__mul__", "__and__", "__or__", "__xor__"):
      specs.append((2, name, op, op.value, outs, fn, rev.get("__r" + name[2:])))
    elif not name.startswith("__"): specs.append((1, name, op, op.value, outs, fn, None))
  for name, descr in meth_install(UOp, dts, tuple(specs)).items(): setattr(UOp, name, descr)
  # -, / and @ are number slots of the handle type too (csrc/pytmpl.c: templates.py's hit path); until templates
  # installs its methods there they call MathMixin's
  tmpl_install(UOp, None, None, tuple((2, n, n, getattr(MathMixin, n), getattr(MathMixin, "__r" + n[2:]))
                                       for n in ("__sub__", "__truediv__", "__matmul__")))
