"""pygrad as tinygrad 0.14.0's gradient engine.

`from_tinygrad` / `to_tinygrad` convert graphs both ways in one iterative pass each; `compute_gradient` has the
signature and result type of `tinygrad.mixin.gradient.compute_gradient` and derives through pygrad's core;
`install()` / `uninstall()` / `installed()` make tinygrad's `Tensor.backward` and `Tensor.gradient` use it.

The two IRs differ in encoding more than in meaning, and each difference has one place here:
* tinygrad's movement ops carry their shapes as source UOps (STACKs of weakint CONSTs); pygrad's carry static ints.
  PAD and SHRINK take (offset, size) pairs in tinygrad, (before, after) and (start, end) in pygrad.
* tinygrad's EXPAND prepends axes and its REDUCE reduces (and drops) leading axes; pygrad's EXPAND grows size-1 axes
  and REDUCE_AXIS keeps them. One tinygrad node becomes two pygrad nodes, both tagged, so the way back rebuilds the
  one tinygrad node.
* tinygrad ALU ops broadcast like numpy; pygrad broadcasts only `()`. Explicit RESHAPE/EXPAND nodes tagged
  `_BCAST` are inserted, and dropped again on the way back.
* weak dtypes (weakfloat, weakint: Python constants) take the dtype of the op that uses them; in pygrad they are
  converted in that dtype and tagged with the tinygrad node they stand for.
* Leaves keep their tinygrad node: a BUFFER's unique id is the tinygrad BUFFER itself (it also keeps its realized
  storage alive), variables and function PARAMs carry theirs in the tag.
* tinygrad's assign, AFTER(view, STORE(view, value)), is pygrad's CONTIGUOUS(value) tagged with the view.
* a custom kernel's body (a SINK of RANGE/INDEX/STORE ops pygrad has no use for: a CALL is differentiated only
  through its grad_fxn) is an opaque SINK tagged with the tinygrad kernel.

For compute_gradient only the part of the graph above a target is converted node by node: any other node that has
a device is one opaque pygrad BUFFER standing for it (pygrad never looks inside a value it does not differentiate),
so ops pygrad lacks (THREEFRY, STORE into views, ...) may sit anywhere off the target path.
"""
from __future__ import annotations
import contextlib, math, threading
from pygrad import UOp, Ops, dtypes, CallInfo, Metadata
from pygrad.uop import _attach_metadata
import pygrad.uop as _pg_uop
from pygrad.uop import handle
from pygrad.core import CORE
import pygrad.gradient as _pg_gradient

try:
  from tinygrad.uop.ops import UOp as TUOp, Ops as TOps, CallInfo as TCallInfo, all_metadata as _tg_metadata
  from tinygrad.uop.ops import ParamArg, shape_to_shape_arg
  from tinygrad.dtype import dtypes as tdtypes, AddrSpace
  from tinygrad.helpers import Metadata as TMetadata
  import tinygrad.mixin.gradient as _tg_gradient
except ImportError as e:  # pragma: no cover - exercised only where tinygrad is missing
  raise ImportError("pygrad.interop.tinygrad needs tinygrad 0.14.0 (pip install 'pygrad[tinygrad]')") from e

__all__ = ["from_tinygrad", "to_tinygrad", "compute_gradient", "install", "uninstall", "installed"]

# ---- tables ----

_DT = {tdtypes.bool: dtypes.bool, tdtypes.int8: dtypes.int8, tdtypes.int16: dtypes.int16, tdtypes.int32: dtypes.int32,
       tdtypes.int64: dtypes.int64, tdtypes.uint8: dtypes.uint8, tdtypes.uint16: dtypes.uint16,
       tdtypes.uint32: dtypes.uint32, tdtypes.uint64: dtypes.uint64, tdtypes.float16: dtypes.float16,
       tdtypes.bfloat16: dtypes.bfloat16, tdtypes.float32: dtypes.float32, tdtypes.float64: dtypes.float64,
       tdtypes.void: dtypes.void}
_TDT = {v: k for k, v in _DT.items()}
_WEAK = {tdtypes.weakfloat: dtypes.float32, tdtypes.weakint: dtypes.int32}  # a weak node with no typed user

# ops both IRs share, with the same sources and meaning (C-style integer division is IDIV/MOD in pygrad)
_ALU = {getattr(TOps, o.name): o for o in (
  Ops.RECIPROCAL, Ops.SQRT, Ops.SIN, Ops.LOG2, Ops.EXP2, Ops.TRUNC, Ops.ADD, Ops.MUL, Ops.MAX, Ops.POW, Ops.AND,
  Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR, Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ, Ops.WHERE)}
_ALU[TOps.CDIV], _ALU[TOps.CMOD] = Ops.IDIV, Ops.MOD
_TALU = {v: k for k, v in _ALU.items()}
_CMP = frozenset({TOps.CMPLT, TOps.CMPNE, TOps.CMPEQ})
_SAME = {TOps.CONTIGUOUS: Ops.CONTIGUOUS, TOps.CONTIGUOUS_BACKWARD: Ops.CONTIGUOUS_BACKWARD, TOps.DETACH: Ops.DETACH}
_SHAPED_MOVE = frozenset({TOps.RESHAPE, TOps.EXPAND, TOps.PAD, TOps.SHRINK})  # shapes are sources
_CALLS = frozenset({TOps.FUNCTION, TOps.CALL})

# tags of pygrad nodes that encode a tinygrad node differently
_TG = "tinygrad"            # ("tinygrad", node): this pygrad node stands for that tinygrad node (a leaf or constant)
_EXPAND = "tinygrad.expand"  # RESHAPE+EXPAND pair of one tinygrad EXPAND
_REDUCE = "tinygrad.reduce"  # REDUCE_AXIS+RESHAPE pair of one tinygrad REDUCE
_BCAST = "tinygrad.bcast"    # explicit broadcast for tinygrad's implicit one
_ASSIGN = "tinygrad.assign"  # ("tinygrad.assign", view): CONTIGUOUS standing for AFTER(view, STORE(view, value))
_INFO = "tinygrad.info"      # ("tinygrad.info", CallInfo): tinygrad's CallInfo of a FUNCTION/CALL


def _pdtype(u: TUOp, want=None):
  d = _DT.get(u.dtype)
  if d is not None: return d
  if u.dtype in _WEAK: return want if want is not None else _WEAK[u.dtype]
  raise ValueError(f"from_tinygrad: dtype {u.dtype!r} of {u.op.name} has no pygrad dtype")


def _ints(shape, u) -> tuple:
  if not all(type(s) is int for s in shape):
    raise ValueError(f"from_tinygrad: {u.op.name} has a symbolic shape {shape!r}; pygrad needs static shapes")
  return tuple(shape)


def _value_srcs(u: TUOp) -> tuple:
  """The sources of u that are values (a movement op's shape operands and a kernel body are not)."""
  op = u.op
  if op in _SHAPED_MOVE: return u.src[:1]
  if op is TOps.BUFFER or op is TOps.PARAM or op is TOps.CONST: return ()
  if op is TOps.CALL: return u.src[1:]
  if op is TOps.AFTER and _is_assign(u): return (u.src[1].src[1],)
  return u.src


def _is_assign(u: TUOp) -> bool:
  if len(u.src) != 2 or u.src[1].op is not TOps.STORE: return False
  st = u.src[1]
  return len(st.src) == 2 and st.src[0] is u.src[0] and st.src[1]._shape == u.src[0]._shape


def _operand_want(u: TUOp, want):
  """The pygrad dtype u's weak sources take: that of u's typed operands (for a comparison, not its bool result)."""
  if u.op in _CMP or u.op is TOps.WHERE:
    for s in (u.src[1:] if u.op is TOps.WHERE else u.src):
      if s.dtype not in _WEAK: return _DT.get(s.dtype)
    if u.op is TOps.WHERE: return want
    return None
  if u.op is TOps.AFTER: return _DT.get(u.src[0].dtype)
  if u.op in (TOps.CAST, TOps.BITCAST): return None
  return _pdtype(u, want) if u.dtype is not tdtypes.void else None


class _GradFxn:
  """A tinygrad grad_fxn as pygrad calls it: pygrad gradients in, tinygrad's function on tinygrad UOps, pygrad out.
  Equal for equal tinygrad CallInfos, so the pygrad CALL/FUNCTION hash-conses like the tinygrad one."""
  __slots__ = ("info",)

  def __init__(self, info): self.info = info
  def __eq__(self, o): return type(o) is _GradFxn and o.info == self.info
  def __hash__(self): return hash(("tinygrad grad_fxn", self.info))

  def __call__(self, *grads, call):
    ctx = _ctx()
    out = _Out(ctx.rev if ctx is not None else None)
    tcall, *tg = out.convert([call, *grads])
    args = tcall.src[1:]
    # a gradient with no device (a broadcast constant) is placed on the call's device, as tinygrad does for calls
    tg = [g.clone(device=(args[i].device if tcall.op is TOps.CALL else tcall.device)) if g.device is None else g
          for i, g in enumerate(tg)]
    ret = self.info.grad_fxn(*tg, call=tcall) if len(tg) > 1 else self.info.grad_fxn(tg[0], tcall)
    cin = _In(known=ctx.fwd if ctx is not None else None)
    return tuple(None if g is None else cin.convert(g) for g in ret)


def _pcallinfo(info) -> CallInfo:
  if not isinstance(info, TCallInfo): raise ValueError(f"from_tinygrad: a call's arg is {info!r}, not a CallInfo")
  gf = _GradFxn(info) if info.grad_fxn is not None else None
  return CallInfo(gf, info.name, info.precompile, info.precompile_backward)


# ---- tinygrad -> pygrad ----

class _In:
  """One conversion tinygrad -> pygrad. With `targets`, only nodes on a path to a target (or under a PARAM, or
  without a device) are converted node by node; any other node is an opaque BUFFER standing for it."""

  def __init__(self, targets=None, known=None):
    self.targets = targets
    self.memo: dict = dict(known) if known else {}   # tinygrad node (or (node, dtype) if weak) -> pygrad node
    self.live: dict = {}                              # tinygrad node -> converted node by node
    self.rev: dict = {}                               # pygrad id -> tinygrad node, for the way back
    self.keep: list = []                              # pygrad handles rev refers to
    self.md = len(_tg_metadata) > 0

  def convert(self, root: TUOp, want=None) -> UOp:
    if not isinstance(root, TUOp): raise TypeError(f"from_tinygrad: expected a tinygrad UOp, got {type(root).__name__}")
    if root.dtype not in _WEAK and root not in self.live: self._walk(root)
    return self._get(root, want)

  def _walk(self, root: TUOp) -> None:
    """Post-order over value sources; each node on a target path (every node, without targets) is converted when
    its sources are done. Weak, device-less and opaque nodes are made when a converted user asks for them."""
    live, memo, targets = self.live, self.memo, self.targets
    stack = [(root, False)]
    while stack:
      u, done = stack.pop()
      if u in live: continue
      if not done:
        stack.append((u, True))
        for s in reversed(_value_srcs(u)):
          if s not in live: stack.append((s, False))
        continue
      if targets is None: below = True
      else: below = u.op is TOps.PARAM or any(live[s] for s in _value_srcs(u))
      live[u] = below or u in targets
      if below and u not in memo and u.dtype not in _WEAK: self._put(u, self._one(u, None))

  def _put(self, u: TUOp, p: UOp, want=None) -> None:
    self.memo[(u, want) if u.dtype in _WEAK else u] = p
    if p._id not in self.rev:
      self.rev[p._id] = u
      self.keep.append(p)
    if self.md and (md := _tg_metadata.get(u)):
      _attach_metadata(p, tuple(Metadata(m.name, "", m.backward) for m in md))

  def _get(self, s: TUOp, want=None) -> UOp:
    """The pygrad node for a source: converted already, or converted now (weak: in `want`; no device: node by
    node, as constants are), or an opaque BUFFER standing for it."""
    got = self.memo.get((s, want) if s.dtype in _WEAK else s)
    if got is not None: return got
    if s.dtype in _WEAK or s.device is None: return self._structural(s, want)
    if s not in self.live:
      self._walk(s)
      got = self.memo.get(s)
      if got is not None: return got
    p = self._opaque_buffer(s)
    self._put(s, p)
    return p

  def _structural(self, root: TUOp, want) -> UOp:
    """root converted node by node, off the main walk (a weak constant expression in `want`, or a device-less one)."""
    memo = self.memo
    stack = [(root, want)]
    while stack:
      u, w = stack[-1]
      if ((u, w) if u.dtype in _WEAK else u) in memo:
        stack.pop()
        continue
      ow = _operand_want(u, w) if u.dtype is not tdtypes.void else None
      todo = [(s, ow if s.dtype in _WEAK else None) for s in _value_srcs(u)
              if ((s, ow) if s.dtype in _WEAK else s) not in memo and (s.dtype in _WEAK or s.device is None)]
      if todo:
        stack.extend(todo)
        continue
      stack.pop()
      self._put(u, self._one(u, w), w)
    return memo[(root, want) if root.dtype in _WEAK else root]

  def _one(self, u: TUOp, want) -> UOp:
    """The pygrad node(s) for one tinygrad node whose value sources are converted."""
    op = u.op
    weak = u.dtype in _WEAK
    tag = (_TG, u) if weak else None
    if op in _ALU:
      w = _operand_want(u, want)
      srcs = [self._get(s, w) if s.dtype in _WEAK else self._get(s) for s in u.src]
      shape = _ints(u.shape, u)
      srcs = [_broadcast(s, shape) for s in srcs]
      return UOp(_ALU[op], _pdtype(u, want) if not (op in _CMP) else dtypes.bool, tuple(srcs), None, tag)
    if op is TOps.CONST:
      d = _pdtype(u, want)
      v = u.arg
      if not isinstance(v, (bool, int, float)): raise ValueError(f"from_tinygrad: CONST {v!r} has no pygrad value")
      v = float(v) if d.kind == "f" else bool(v) if d.kind == "b" else _wrap(int(v), d)
      return UOp(Ops.CONST, d, (), v, tag)
    if op in _SHAPED_MOVE or op in (TOps.PERMUTE, TOps.FLIP):
      x = self._get(u.src[0], want) if u.src[0].dtype in _WEAK else self._get(u.src[0])
      return _movement(u, x, tag)
    if op is TOps.REDUCE:
      if type(u.arg) is not tuple or len(u.arg) != 2 or len(u.src) != 1:
        raise ValueError(f"from_tinygrad: REDUCE with arg {u.arg!r} and {len(u.src)} sources has no pygrad form")
      rop, n = u.arg
      x = self._get(u.src[0], want) if u.src[0].dtype in _WEAK else self._get(u.src[0])
      if n == 0: raise ValueError("from_tinygrad: REDUCE over no axes has no pygrad form")
      r = UOp(Ops.REDUCE_AXIS, None, (x,), (getattr(Ops, rop.name), tuple(range(n))), _REDUCE)
      return UOp(Ops.RESHAPE, None, (r,), x.shape[n:], _REDUCE)
    if op in (TOps.CAST, TOps.BITCAST):
      x = self._get(u.src[0])
      return UOp(Ops.CAST if op is TOps.CAST else Ops.BITCAST, _pdtype(u, want), (x,), None, tag)
    if op is TOps.BUFFER:
      a = u.arg
      if isinstance(a, ParamArg) and a.addrspace is AddrSpace.ALU and a.vmin_vmax is not None:
        return UOp(Ops.DEFINE_VAR, _pdtype(u), (), (a.name or "", a.vmin_vmax[0], a.vmin_vmax[1]), (_TG, u))
      return self._opaque_buffer(u)
    if op is TOps.PARAM:
      a = u.arg
      shape = _ints(u.shape, u) if u._shape is not None else ()
      return UOp(Ops.PARAM, _pdtype(u), (), (a.slot, shape, a.device), (_TG, u))
    if op in _SAME:
      if len(u.src) != 1 or u.arg is not None:
        raise ValueError(f"from_tinygrad: {op.name} with arg {u.arg!r} and {len(u.src)} sources has no pygrad form")
      x = self._get(u.src[0], want) if u.src[0].dtype in _WEAK else self._get(u.src[0])
      return UOp(_SAME[op], None, (x,), None, tag)
    if op is TOps.COPY:
      if len(u.src) != 1 or type(u.arg) is not str:
        raise ValueError(f"from_tinygrad: COPY to {u.arg!r}: pygrad copies one value to one named device")
      return UOp(Ops.COPY, None, (self._get(u.src[0]),), u.arg)
    if op is TOps.AFTER:
      if _is_assign(u):
        view = u.src[0]
        val = u.src[1].src[1]
        x = self._get(val, _DT.get(view.dtype)) if val.dtype in _WEAK else self._get(val)
        return UOp(Ops.CONTIGUOUS, None, (x,), None, (_ASSIGN, view))
      if len(u.src) == 2 and u.src[1].op is TOps.CALL:
        return UOp(Ops.AFTER, None, (self._get(u.src[0]), self._get(u.src[1])))
      raise ValueError(f"from_tinygrad: AFTER over {[s.op.name for s in u.src[1:]]}: pygrad has AFTER of a CALL and "
                       "whole-buffer assigns only (op STORE into a view)")
    if op is TOps.CALL:
      if u.dtype is not tdtypes.void: raise ValueError("from_tinygrad: a value-returning CALL has no pygrad form")
      kernel = UOp(Ops.SINK, None, (), None, (_TG, u.src[0]))
      return UOp(Ops.CALL, None, (kernel, *(self._get(s) for s in u.src[1:])), _pcallinfo(u.arg), (_INFO, u.arg))
    if op is TOps.FUNCTION:
      return UOp(Ops.FUNCTION, None, tuple(self._get(s) for s in u.src), _pcallinfo(u.arg), (_INFO, u.arg))
    if op is TOps.TUPLE: return UOp(Ops.TUPLE, None, tuple(self._get(s) for s in u.src))
    if op is TOps.GETTUPLE: return UOp(Ops.GETTUPLE, None, (self._get(u.src[0]),), u.arg)
    if op is TOps.NOOP and not u.src: return UOp(Ops.NOOP)
    if op is TOps.SINK and u.arg is None: return UOp(Ops.SINK, None, tuple(self._get(s) for s in u.src))
    raise ValueError(f"from_tinygrad: tinygrad op {op.name} has no pygrad counterpart")

  def _opaque_buffer(self, u: TUOp) -> UOp:
    """A pygrad BUFFER whose unique id is the tinygrad node: a tinygrad BUFFER, or a value pygrad need not see into."""
    dev = u.device
    if type(dev) is not str:
      raise ValueError(f"from_tinygrad: {u.op.name} on device {dev!r}: pygrad places a value on one named device")
    name = u.arg.name if u.op is TOps.BUFFER and isinstance(u.arg, ParamArg) else None
    return UOp(Ops.BUFFER, _pdtype(u), (), (u, _ints(u.shape, u), dev, name))


def _wrap(v: int, d) -> int:
  """An integer constant in d's range, wrapping as the machine does (a weak -1 added to a uint32 is 2**32-1)."""
  bits = 8 * d.itemsize
  v &= (1 << bits) - 1
  return v - (1 << bits) if d.kind == "i" and v >= 1 << (bits - 1) else v


def _broadcast(p: UOp, shape: tuple) -> UOp:
  """p made explicit at `shape` (tinygrad broadcasts ALU operands like numpy, pygrad only `()`)."""
  s = p.shape
  if s == shape or s == (): return p
  if len(s) < len(shape): p = UOp(Ops.RESHAPE, None, (p,), (1,) * (len(shape) - len(s)) + s, _BCAST)
  return UOp(Ops.EXPAND, None, (p,), shape, _BCAST) if p.shape != shape else p


def _movement(u: TUOp, x: UOp, tag) -> UOp:
  op = u.op
  if op is TOps.PERMUTE: return UOp(Ops.PERMUTE, None, (x,), tuple(u.arg), tag)
  if op is TOps.FLIP: return UOp(Ops.FLIP, None, (x,), tuple(bool(f) for f in u.arg), tag)
  marg = u.marg
  if op is TOps.RESHAPE: return UOp(Ops.RESHAPE, None, (x,), _ints(marg, u), tag)
  if op is TOps.EXPAND:
    lead = _ints(marg, u)
    r = UOp(Ops.RESHAPE, None, (x,), (1,) * len(lead) + x.shape, tag if tag is not None else _EXPAND)
    return UOp(Ops.EXPAND, None, (r,), lead + x.shape, tag if tag is not None else _EXPAND)
  pairs = tuple((o, sz) for o, sz in marg)
  _ints(sum(pairs, ()), u)
  if op is TOps.PAD: return UOp(Ops.PAD, None, (x,), tuple((o, sz - o - s) for (o, sz), s in zip(pairs, x.shape)), tag)
  return UOp(Ops.SHRINK, None, (x,), tuple((o, o + sz) for o, sz in pairs), tag)


# ---- pygrad -> tinygrad ----

class _Out:
  """One conversion pygrad -> tinygrad, seeded with the nodes a conversion the other way made (pygrad id ->
  tinygrad node), which map back without being rebuilt."""

  def __init__(self, known=None):
    self.memo: dict = dict(known) if known else {}
    self.shapes: dict = {}  # static shape -> tinygrad's shape operand

  def convert(self, roots: list) -> list:
    """The tinygrad nodes of `roots`, in one walk over all of them (stopping at nodes known already)."""
    for r in roots:
      if not isinstance(r, UOp): raise TypeError(f"to_tinygrad: expected a pygrad UOp, got {type(r).__name__}")
    memo = self.memo
    ids = [r._id for r in roots if r._id not in memo]
    if ids:
      for nid in CORE.toposort(ids, True, list(memo)):
        p = handle(nid)
        t = p.tag
        if t is _BCAST or t is _EXPAND and p.op is Ops.RESHAPE or t is _REDUCE and p.op is Ops.REDUCE_AXIS: continue
        t = memo[nid] = self._one(p)
        if _pg_uop._md_count and (md := p.metadata) and t not in _tg_metadata:
          _tg_metadata[t] = tuple(TMetadata(m.name, m.backward) for m in md)
    return [self._get(r) for r in roots]

  def _shape(self, shape: tuple) -> TUOp:
    got = self.shapes.get(shape)
    if got is None: got = self.shapes[shape] = shape_to_shape_arg(shape)
    return got

  def _mop(self, x: TUOp, op, arg) -> TUOp:
    """tinygrad's x._mop(op, arg) for static arguments, made directly: its symbolic simplify of the shape operands
    changes nothing on ints, and costs more than the node (the round-trip tests check the nodes are tinygrad's)."""
    if op is TOps.PERMUTE or op is TOps.FLIP: return TUOp(op, x.dtype, (x,), arg)
    if op is TOps.RESHAPE: return TUOp(op, x.dtype, (x, self._shape(arg)))
    if not arg: return x
    if op is TOps.EXPAND: return TUOp(op, x.dtype, (x, self._shape(arg)))
    return TUOp(op, x.dtype, (x, self._shape(tuple(a for a, _ in arg)), self._shape(tuple(b for _, b in arg))))

  def _expand(self, x: TUOp, src: tuple, shape: tuple) -> TUOp:
    """pygrad's EXPAND (size-1 axes grow in place) as tinygrad's: drop those axes, prepend them grown, permute back."""
    grow = [i for i, (a, b) in enumerate(zip(src, shape)) if a != b]
    rest = [i for i in range(len(shape)) if i not in grow]
    y = self._mop(self._mop(x, TOps.RESHAPE, tuple(src[i] for i in rest)), TOps.EXPAND, tuple(shape[i] for i in grow))
    order = grow + rest
    perm = tuple(order.index(j) for j in range(len(shape)))
    return y if perm == tuple(range(len(shape))) else self._mop(y, TOps.PERMUTE, perm)

  def _reduce(self, x: TUOp, src: tuple, arg, shape: tuple) -> TUOp:
    """pygrad's REDUCE_AXIS (axes kept) as tinygrad's: reduced axes permuted to the front, reduced, reshaped."""
    rop, axes = arg
    red = [a for a in sorted(axes) if src[a] != 1]
    if red:
      perm = tuple(red + [i for i in range(len(src)) if i not in red])
      if perm != tuple(range(len(src))): x = self._mop(x, TOps.PERMUTE, perm)
      x = TUOp(TOps.REDUCE, x.dtype, (x,), (getattr(TOps, rop.name), len(red)))
    return self._mop(x, TOps.RESHAPE, shape)

  def _get(self, p: UOp) -> TUOp:
    got = self.memo.get(p._id)
    if got is not None: return got
    # a helper node of a pair, asked for on its own (bounded: helpers sit at most two deep)
    t, x = p.tag, p.src[0]
    if t is _BCAST: ret = self._get(x)
    elif t is _EXPAND: ret = self._mop(self._get(x), TOps.RESHAPE, p.shape)
    else:
      rop, axes = p.arg
      ret = self._mop(TUOp(TOps.REDUCE, src=(self._get(x),), arg=(getattr(TOps, rop.name), len(axes))), TOps.RESHAPE,
                      p.shape)
    self.memo[p._id] = ret
    return ret

  def _one(self, p: UOp) -> TUOp:
    op, tag = p.op, p.tag
    if type(tag) is tuple and tag[0] == _TG: return tag[1]
    if op in _TALU:
      src = tuple(self._get(s) for s in p.src)
      # the dtype is given unless every operand is weak (then tinygrad's promotion decides, as it did before)
      for s in src:
        if s.dtype not in _WEAK: return TUOp(_TALU[op], _TDT[p.dtype], src)
      return TUOp(_TALU[op], src=src)
    if op is Ops.CONST: return TUOp.const(p.arg, _TDT[p.dtype])
    if op is Ops.RESHAPE:
      if tag is _REDUCE and p.src[0].tag is _REDUCE and p.src[0].op is Ops.REDUCE_AXIS:
        r = p.src[0]
        return TUOp(TOps.REDUCE, src=(self._get(r.src[0]),), arg=(getattr(TOps, r.arg[0].name), len(r.arg[1])))
      return self._mop(self._get(p.src[0]), TOps.RESHAPE, p.shape)
    if op is Ops.EXPAND:
      if tag is _EXPAND:
        inner = p.src[0].src[0]
        return self._mop(self._get(inner), TOps.EXPAND, p.shape[:len(p.shape) - len(inner.shape)])
      return self._expand(self._get(p.src[0]), p.src[0].shape, p.shape)
    x = self._get(p.src[0]) if p.src else None
    if op is Ops.REDUCE_AXIS: return self._reduce(x, p.src[0].shape, p.arg, p.shape)
    if op is Ops.PERMUTE: return self._mop(x, TOps.PERMUTE, p.arg)
    if op is Ops.FLIP: return self._mop(x, TOps.FLIP, p.arg)
    if op is Ops.PAD: return self._mop(x, TOps.PAD, tuple((b, s + b + a) for (b, a), s in zip(p.arg, p.src[0].shape)))
    if op is Ops.SHRINK: return self._mop(x, TOps.SHRINK, tuple((b, e - b) for b, e in p.arg))
    if op in (Ops.CAST, Ops.BITCAST):
      d = _TDT[p.dtype]
      return TUOp(TOps.CAST if op is Ops.CAST else TOps.BITCAST, d, (x,), d)
    if op is Ops.CONTIGUOUS and type(tag) is tuple and tag[0] == _ASSIGN:
      view = tag[1]
      return view.after(view.store(x))
    if op in (Ops.CONTIGUOUS, Ops.CONTIGUOUS_BACKWARD, Ops.DETACH): return TUOp(getattr(TOps, op.name), x.dtype, (x,))
    if op is Ops.COPY: return TUOp(TOps.COPY, src=(x,), arg=p.arg)
    if op is Ops.BUFFER:
      if isinstance(p.arg[0], TUOp): return p.arg[0]
      n = math.prod(p.shape)
      # a pygrad input becomes the same tinygrad BUFFER in every conversion: its slot is derived from the unique id
      slot = _SLOT0 - p.arg[0] if type(p.arg[0]) is int else None
      b = TUOp.new_buffer(p.device, n, _TDT[p.dtype], num=slot)
      return b if p.shape == (n,) else self._mop(b, TOps.RESHAPE, p.shape)
    if op is Ops.DEFINE_VAR: return TUOp.variable(p.arg[0], p.arg[1], p.arg[2], _TDT[p.dtype])
    if op is Ops.PARAM: return TUOp.param(p.arg[0], _TDT[p.dtype], p.arg[1], p.arg[2])
    if op is Ops.NOOP: return TUOp(TOps.NOOP)
    if op is Ops.TUPLE: return TUOp.maketuple(*(self._get(s) for s in p.src))
    if op is Ops.SINK: return TUOp.sink(*(self._get(s) for s in p.src))
    if op is Ops.GETTUPLE: return TUOp(TOps.GETTUPLE, src=(x,), arg=p.arg)
    if op is Ops.AFTER: return x.after(self._get(p.src[1]))
    if op in (Ops.FUNCTION, Ops.CALL):
      info = tag[1] if type(tag) is tuple and tag[0] == _INFO else _tcallinfo(p)
      if op is Ops.CALL:
        raise ValueError(f"to_tinygrad: CALL {p.arg.name!r} has a pygrad kernel; tinygrad cannot run it")
      return TUOp(TOps.FUNCTION, src=tuple(self._get(s) for s in p.src), arg=info)
    raise ValueError(f"to_tinygrad: pygrad op {op.name} has no tinygrad counterpart")


_SLOT0 = -(1 << 48)  # below tinygrad's own slots (counters from 0, and -id(buffer) for adopted storage)


def _tcallinfo(p: UOp):
  a = p.arg
  gf = a.grad_fxn
  if gf is not None and type(gf) is not _GradFxn:
    raise ValueError(f"to_tinygrad: {p.op.name} {a.name!r} has a pygrad grad_fxn; tinygrad would call it on its UOps")
  return TCallInfo(gf.info.grad_fxn if gf is not None else None, a.name, a.precompile, a.precompile_backward)


# ---- public API ----

def from_tinygrad(roots):
  """tinygrad UOps (one, or a list/tuple) -> the pygrad UOps with the same meaning; every node converted."""
  cin = _In()
  if isinstance(roots, (list, tuple)): return type(roots)(cin.convert(r) for r in roots)
  return cin.convert(roots)


def to_tinygrad(roots):
  """pygrad UOps (one, or a list/tuple) -> tinygrad UOps; nodes that came from tinygrad are tinygrad's own again."""
  if isinstance(roots, (list, tuple)): return type(roots)(_Out().convert(list(roots)))
  return _Out().convert([roots])[0]


class _Ctx:
  __slots__ = ("fwd", "rev")

  def __init__(self, fwd, rev): self.fwd, self.rev = fwd, rev


_local = threading.local()


def _ctx():
  s = getattr(_local, "stack", None)
  return s[-1] if s else None


def compute_gradient(root: TUOp, root_grad: TUOp, targets) -> dict:
  """tinygrad's compute_gradient, derived by pygrad: a dict from each reached target (and root) to its gradient,
  tinygrad UOps in and out. Gradients of nodes between root and the targets are not returned (tinygrad's callers
  read only the targets')."""
  cin, proot, pgrad, ptargets = convert_in(root, root_grad, targets)
  grads = derive(cin, proot, pgrad, ptargets)
  return convert_out(cin, root, root_grad, ptargets, grads)


def convert_in(root: TUOp, root_grad: TUOp, targets):
  """compute_gradient's first phase: the graph above the targets into pygrad (the rest opaque)."""
  targets = set(targets)
  cin = _In(targets=targets)
  proot = cin.convert(root)
  pgrad = cin.convert(root_grad, _DT.get(root.dtype)) if root_grad.dtype in _WEAK else cin.convert(root_grad)
  return cin, proot, pgrad, {t: cin.convert(t) for t in targets if t in cin.live}


def derive(cin, proot: UOp, pgrad: UOp, ptargets: dict) -> dict:
  """compute_gradient's second phase: pygrad's compute_gradient (a grad_fxn met on the way finds the conversions)."""
  stack = _local.__dict__.setdefault("stack", [])
  stack.append(_Ctx(cin.memo, cin.rev))
  try:
    return _pg_gradient.compute_gradient(proot, pgrad, set(ptargets.values()))
  finally:
    stack.pop()


def convert_out(cin, root: TUOp, root_grad: TUOp, ptargets: dict, grads: dict) -> dict:
  """compute_gradient's last phase: the targets' gradients back into tinygrad, forward nodes reused."""
  got = [(t, g) for t, p in ptargets.items() if (g := grads.get(p)) is not None and g.op is not Ops.NOOP]
  ret = {root: root_grad}
  ret.update(zip((t for t, _ in got), _Out(cin.rev).convert([g for _, g in got])))
  return ret


_saved = []


def install() -> None:
  """Make tinygrad's Tensor.backward / Tensor.gradient (which import compute_gradient from
  tinygrad.mixin.gradient when called) derive through pygrad."""
  if not _saved: _saved.append(_tg_gradient.compute_gradient)
  _tg_gradient.compute_gradient = compute_gradient


def uninstall() -> None:
  """Give tinygrad its own compute_gradient back."""
  if _saved: _tg_gradient.compute_gradient = _saved.pop()


@contextlib.contextmanager
def installed():
  """`with installed(): ...` runs the block with pygrad as tinygrad's gradient engine."""
  was = bool(_saved)
  install()
  try:
    yield
  finally:
    if not was: uninstall()
