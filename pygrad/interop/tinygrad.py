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
import contextlib, itertools, math, threading
import numpy as np
from pygrad import UOp, Ops, dtypes, CallInfo, Metadata
import pygrad.uop as _pg_uop
from pygrad.uop import handle
from pygrad.core import CORE
from pygrad.intern import ARGS, META
from pygrad.serialize import export, _build
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
_WEAK = {tdtypes.weakfloat: dtypes.float32, tdtypes.weakint: dtypes.int32}  # a weak node with no typed user

# ops both IRs share, with the same sources and meaning (C-style integer division is IDIV/MOD in pygrad)
_ALU = {getattr(TOps, o.name): o for o in (
  Ops.RECIPROCAL, Ops.SQRT, Ops.SIN, Ops.LOG2, Ops.EXP2, Ops.TRUNC, Ops.ADD, Ops.MUL, Ops.MAX, Ops.POW, Ops.AND,
  Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR, Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ, Ops.WHERE)}
_ALU[TOps.CDIV], _ALU[TOps.CMOD] = Ops.IDIV, Ops.MOD
_CMP = frozenset({TOps.CMPLT, TOps.CMPNE, TOps.CMPEQ})
_SAME = {TOps.CONTIGUOUS: Ops.CONTIGUOUS, TOps.CONTIGUOUS_BACKWARD: Ops.CONTIGUOUS_BACKWARD, TOps.DETACH: Ops.DETACH}
_SHAPED_MOVE = frozenset({TOps.RESHAPE, TOps.EXPAND, TOps.PAD, TOps.SHRINK})  # shapes are sources

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
    rows = [None if g is None else cin.add(g) for g in ret]
    made = iter(cin.build([r for r in rows if r is not None]))
    return tuple(None if r is None else next(made) for r in rows)


def _pcallinfo(info) -> CallInfo:
  if not isinstance(info, TCallInfo): raise ValueError(f"from_tinygrad: a call's arg is {info!r}, not a CallInfo")
  gf = _GradFxn(info) if info.grad_fxn is not None else None
  return CallInfo(gf, info.name, info.precompile, info.precompile_backward)


# ---- tinygrad -> pygrad ----

_OP = {o: o.value for o in Ops}  # pygrad ops as the node table's ints
(_RESHAPE, _EXPANDOP, _PAD, _SHRINK, _PERMUTE, _FLIP, _REDUCEOP, _CONST, _CAST, _BITCAST, _BUFFER, _DEFINE_VAR,
 _PARAM, _CONTIGUOUS, _COPY, _AFTER, _SINK, _CALL, _FUNCTION, _TUPLE, _GETTUPLE, _NOOP) = (_OP[o] for o in (
  Ops.RESHAPE, Ops.EXPAND, Ops.PAD, Ops.SHRINK, Ops.PERMUTE, Ops.FLIP, Ops.REDUCE_AXIS, Ops.CONST, Ops.CAST,
  Ops.BITCAST, Ops.BUFFER, Ops.DEFINE_VAR, Ops.PARAM, Ops.CONTIGUOUS, Ops.COPY, Ops.AFTER, Ops.SINK, Ops.CALL,
  Ops.FUNCTION, Ops.TUPLE, Ops.GETTUPLE, Ops.NOOP))
_VOID, _BOOL = dtypes.void.id, dtypes.bool.id
_ALU_I = {k: _OP[v] for k, v in _ALU.items()}
_SAME_I = {k: _OP[v] for k, v in _SAME.items()}
_MOVE = _SHAPED_MOVE | {TOps.PERMUTE, TOps.FLIP}
_DTI = {t: p.id for t, p in _DT.items()}
_ROP = {getattr(TOps, o.name): o for o in (Ops.ADD, Ops.MAX, Ops.MUL)}
_NOWANT = object()  # _one's operand dtype, not worked out yet
_MD_IN: dict = {}   # tinygrad metadata tuple -> pygrad's (few distinct: one per Tensor method and direction)
_MD_OUT: dict = {}  # pygrad metadata tuple -> tinygrad's


def _md_in(md: tuple) -> tuple:
  got = _MD_IN.get(md)
  if got is None:
    if len(_MD_IN) >= 4096: _MD_IN.clear()
    got = _MD_IN[md] = tuple(Metadata(m.name, "", m.backward) for m in md)
  return got


def _refs(vals, objs: list, seen: dict) -> np.ndarray:
  """1-based references into objs for a column of values (None: 0). A value object met before (by identity: the
  table holds them all alive) is referred to again, so shared shapes and tags are interned once."""
  ref = np.zeros(len(vals), np.int32)
  for i, v in enumerate(vals):
    if v is None: continue
    k = seen.get(id(v))
    if k is None:
      objs.append(v)
      k = seen[id(v)] = len(objs)
    ref[i] = k
  return ref


class _Fwd:
  """The nodes a conversion made, by tinygrad key (node, or (node, dtype) if weak), for a later conversion of a
  grad_fxn's result that refers to them."""
  __slots__ = ("memo", "ids")

  def __init__(self, memo: dict, ids: list): self.memo, self.ids = memo, ids
  def __contains__(self, key) -> bool: return key in self.memo

  def get(self, key):
    r = self.memo.get(key)
    return None if r is None else handle(self.ids[r])


class _In:
  """One conversion tinygrad -> pygrad, into a node table (rows of op, dtype id, source rows, arg, tag) that `build`
  makes in one bulk call (pygrad.build's builder). With `targets`, only nodes on a path to a target (or under a
  PARAM, or without a device) are converted node by node; any other node is an opaque BUFFER standing for it.
  `known` (a _Fwd) holds the nodes of an earlier conversion, used as they are."""

  def __init__(self, targets=None, known=None):
    self.targets, self.known = targets, known
    self.memo: dict = {}   # tinygrad node (or (node, dtype) if weak) -> row
    self.live: dict = {}   # tinygrad node -> converted node by node
    self.rows: list = []   # the table
    self.md: dict = {}     # row -> metadata
    self.given: dict = {}  # row -> pygrad node of `known`
    self.puts: list = []   # (row, tinygrad node) for the way back
    self.ids: list = []    # after build: every row's node id
    self.keep: list = []   # after build: handles that keep every row alive
    self._rev = None
    self.mdon = len(_tg_metadata) > 0

  def _row(self, op: int, dt: int, src: tuple, arg=None, tag=None) -> int:
    rows = self.rows
    rows.append((op, dt, src, arg, tag))
    return len(rows) - 1

  def add(self, root: TUOp, want=None) -> int:
    """The row of a tinygrad node (weak: in the pygrad dtype `want`), converted now if it is not yet."""
    if not isinstance(root, TUOp): raise TypeError(f"from_tinygrad: expected a tinygrad UOp, got {type(root).__name__}")
    if root.dtype not in _WEAK and root not in self.live: self._walk(root)
    return self._get(root, want)

  def build(self, want: list) -> list[UOp]:
    """Make the whole table's nodes (one bulk build) and return the nodes of the rows `want`."""
    n = len(self.rows)
    if not n: return []
    ops, dts, srcs, args, tags = zip(*self.rows)
    start = np.zeros(n + 1, np.int64)
    np.cumsum(np.fromiter(map(len, srcs), np.int64, n), out=start[1:])
    flat = np.fromiter(itertools.chain.from_iterable(srcs), np.int32, int(start[-1]))
    objs: list = []
    seen: dict = {}
    argref, tagref = _refs(args, objs, seen), _refs(tags, objs, seen)
    pdref = None
    if self.md:
      pdref = np.zeros(n, np.int32)
      for r, m in self.md.items():
        objs.append(m)
        pdref[r] = len(objs)
    used = np.zeros(n, bool)
    used[flat] = True
    roots = list(want) + np.flatnonzero(~used).tolist()  # every row is one of these or reached from one
    ids: list = []
    hs = _build(np.array(ops, np.int32), np.array(dts, np.int32), start, flat, argref, tagref, pdref, objs, roots,
                self.given, ids)
    self.ids, self.keep = ids, hs
    return hs[:len(want)]

  def fwd(self) -> _Fwd: return _Fwd(self.memo, self.ids)

  def rev(self) -> dict:
    """pygrad node id -> the tinygrad node it stands for (the first one converted to it)."""
    if self._rev is None:
      ids = self.ids
      self._rev = {ids[r]: u for r, u in reversed(self.puts)}
    return self._rev

  def _walk(self, root: TUOp) -> None:
    """Post-order over value sources; each node on a target path (every node, without targets) is converted when
    its sources are done. Weak, device-less and opaque nodes are made when a converted user asks for them."""
    live, memo, targets, known, one, put = self.live, self.memo, self.targets, self.known, self._one, self._put
    stack: list = [(root, None)]
    while stack:
      u, vs = stack.pop()
      if u in live: continue
      if vs is None:  # first visit: its value sources go first
        if known is not None and u in known:
          live[u] = True
          continue
        vs = _value_srcs(u)
        stack.append((u, vs))
        for s in reversed(vs):
          if s not in live: stack.append((s, None))
        continue
      if targets is None: below = True
      else:
        below = u.op is TOps.PARAM
        for s in vs:
          if live[s]:
            below = True
            break
      live[u] = below or u in targets
      if below and u not in memo and u.dtype not in _WEAK: put(u, one(u, None))

  def _put(self, u: TUOp, r: int, want=None) -> None:
    self.memo[(u, want) if u.dtype in _WEAK else u] = r
    self.puts.append((r, u))
    if self.mdon and (md := _tg_metadata.get(u)):
      m, cur = _md_in(md), self.md.get(r)
      self.md[r] = m if cur is None else cur + tuple(x for x in m if x not in cur)

  def _have(self, key):
    """The row of a key converted already (a node of `known` becomes a row given as that node), or None."""
    r = self.memo.get(key)
    if r is None and self.known is not None:
      g = self.known.get(key)
      if g is not None:
        r = self.memo[key] = self._row(_OP[g.op], g.dtype.id, ())
        self.given[r] = g
    return r

  def _get(self, s: TUOp, want=None) -> int:
    """The row for a source: converted already, or converted now (weak: in `want`; no device: node by node, as
    constants are), or an opaque BUFFER standing for it."""
    weak = s.dtype in _WEAK
    r = self._have((s, want) if weak else s)
    if r is not None: return r
    if weak or s.device is None: return self._structural(s, want)
    if s not in self.live:
      self._walk(s)
      r = self.memo.get(s)
      if r is not None: return r
    r = self._opaque_buffer(s)
    self._put(s, r)
    return r

  def _structural(self, root: TUOp, want) -> int:
    """root converted node by node, off the main walk (a weak constant expression in `want`, or a device-less one)."""
    have = self._have
    stack = [(root, want)]
    while stack:
      u, w = stack[-1]
      if have((u, w) if u.dtype in _WEAK else u) is not None:
        stack.pop()
        continue
      ow = _operand_want(u, w) if u.dtype is not tdtypes.void else None
      todo = [(s, ow if s.dtype in _WEAK else None) for s in _value_srcs(u)
              if (s.dtype in _WEAK or s.device is None) and have((s, ow) if s.dtype in _WEAK else s) is None]
      if todo:
        stack.extend(todo)
        continue
      stack.pop()
      self._put(u, self._one(u, w), w)
    return self.memo[(root, want) if root.dtype in _WEAK else root]

  def _src(self, s: TUOp, want) -> int:
    """_get for a source whose weak form takes `want` (the hot path: a typed source converted already)."""
    if s.dtype in _WEAK: return self._get(s, want)
    r = self.memo.get(s)
    return r if r is not None else self._get(s)

  def _one(self, u: TUOp, want) -> int:
    """The row(s) for one tinygrad node whose value sources are converted; the row that stands for it."""
    op = u.op
    tag = (_TG, u) if u.dtype in _WEAK else None
    rows = self.rows
    if op in _ALU_I:
      shape, memo = u._shape, self.memo
      srcs = []
      w = _NOWANT
      for s in u.src:
        if s.dtype in _WEAK:
          if w is _NOWANT: w = _operand_want(u, want)
          r = self._get(s, w)
        else:
          r = memo.get(s)
          if r is None: r = self._get(s)
        ss = s._shape
        srcs.append(self._bcast(r, ss, shape) if ss and ss != shape else r)
      d = _BOOL if op in _CMP else _DTI.get(u.dtype)
      rows.append((_ALU_I[op], _pdtype(u, want).id if d is None else d, tuple(srcs), None, tag))
      return len(rows) - 1
    if op in _MOVE: return self._movement(u, self._src(u.src[0], want), tag)
    if op is TOps.CONST:
      d = _pdtype(u, want)
      v = u.arg
      if not isinstance(v, (bool, int, float)): raise ValueError(f"from_tinygrad: CONST {v!r} has no pygrad value")
      v = float(v) if d.kind == "f" else bool(v) if d.kind == "b" else _wrap(int(v), d)
      return self._row(_CONST, d.id, (), v, tag)
    if op is TOps.REDUCE:
      if type(u.arg) is not tuple or len(u.arg) != 2 or len(u.src) != 1:
        raise ValueError(f"from_tinygrad: REDUCE with arg {u.arg!r} and {len(u.src)} sources has no pygrad form")
      rop, n = u.arg
      if n == 0: raise ValueError("from_tinygrad: REDUCE over no axes has no pygrad form")
      x = self._src(u.src[0], want)
      d = rows[x][1]
      rows.append((_REDUCEOP, d, (x,), (_ROP.get(rop, rop), tuple(range(n))), _REDUCE))
      rows.append((_RESHAPE, d, (len(rows) - 1,), u._shape, _REDUCE))
      return len(rows) - 1
    if op is TOps.CAST or op is TOps.BITCAST:
      return self._row(_CAST if op is TOps.CAST else _BITCAST, _pdtype(u, want).id, (self._get(u.src[0]),), None, tag)
    if op in _SAME_I:
      if len(u.src) != 1 or u.arg is not None:
        raise ValueError(f"from_tinygrad: {op.name} with arg {u.arg!r} and {len(u.src)} sources has no pygrad form")
      x = self._src(u.src[0], want)
      return self._row(_SAME_I[op], rows[x][1], (x,), None, tag)
    return self._other(u, op, want)

  def _other(self, u: TUOp, op, want) -> int:
    """_one for the ops that are rare in a model's graph: leaves, copies, assigns, calls and tuples."""
    row, get = self._row, self._get
    if op is TOps.BUFFER:
      a = u.arg
      if isinstance(a, ParamArg) and a.addrspace is AddrSpace.ALU and a.vmin_vmax is not None:
        return row(_DEFINE_VAR, _pdtype(u).id, (), (a.name or "", a.vmin_vmax[0], a.vmin_vmax[1]), (_TG, u))
      return self._opaque_buffer(u)
    if op is TOps.PARAM:
      a = u.arg
      shape = _ints(u.shape, u) if u._shape is not None else ()
      return row(_PARAM, _pdtype(u).id, (), (a.slot, shape, a.device), (_TG, u))
    if op is TOps.COPY:
      if len(u.src) != 1 or type(u.arg) is not str:
        raise ValueError(f"from_tinygrad: COPY to {u.arg!r}: pygrad copies one value to one named device")
      x = get(u.src[0])
      return row(_COPY, self.rows[x][1], (x,), u.arg)
    if op is TOps.AFTER:
      if _is_assign(u):
        view = u.src[0]
        val = u.src[1].src[1]
        x = get(val, _DT.get(view.dtype)) if val.dtype in _WEAK else get(val)
        return row(_CONTIGUOUS, self.rows[x][1], (x,), None, (_ASSIGN, view))
      if len(u.src) == 2 and u.src[1].op is TOps.CALL:
        b = get(u.src[0])
        return row(_AFTER, self.rows[b][1], (b, get(u.src[1])))
      raise ValueError(f"from_tinygrad: AFTER over {[s.op.name for s in u.src[1:]]}: pygrad has AFTER of a CALL and "
                       "whole-buffer assigns only (op STORE into a view)")
    if op is TOps.CALL:
      if u.dtype is not tdtypes.void: raise ValueError("from_tinygrad: a value-returning CALL has no pygrad form")
      kernel = row(_SINK, _VOID, (), None, (_TG, u.src[0]))
      return row(_CALL, _VOID, (kernel, *(get(s) for s in u.src[1:])), _pcallinfo(u.arg), (_INFO, u.arg))
    if op is TOps.FUNCTION:
      return row(_FUNCTION, _VOID, tuple(get(s) for s in u.src), _pcallinfo(u.arg), (_INFO, u.arg))
    if op is TOps.TUPLE: return row(_TUPLE, _VOID, tuple(get(s) for s in u.src))
    if op is TOps.GETTUPLE:
      f, i = get(u.src[0]), u.arg
      fo, _, fsrc, _, _ = self.rows[f]
      outs = self.rows[fsrc[0]][2] if fo == _FUNCTION and fsrc else fsrc
      # the output's dtype (the builder checks it, and the index, as UOp(...) does)
      return row(_GETTUPLE, self.rows[outs[i]][1] if type(i) is int and 0 <= i < len(outs) else _pdtype(u).id, (f,), i)
    if op is TOps.NOOP and not u.src: return row(_NOOP, _VOID, ())
    if op is TOps.SINK and u.arg is None: return row(_SINK, _VOID, tuple(get(s) for s in u.src))
    raise ValueError(f"from_tinygrad: tinygrad op {op.name} has no pygrad counterpart")

  def _bcast(self, r: int, ss: tuple, shape: tuple) -> int:
    """Row r, of shape ss, made explicit at `shape` (tinygrad broadcasts ALU operands like numpy, pygrad only
    `()`)."""
    rows = self.rows
    d = rows[r][1]
    if len(ss) < len(shape):
      ss = (1,) * (len(shape) - len(ss)) + ss
      rows.append((_RESHAPE, d, (r,), ss, _BCAST))
      r = len(rows) - 1
    if ss == shape: return r
    rows.append((_EXPANDOP, d, (r,), shape, _BCAST))
    return len(rows) - 1

  def _movement(self, u: TUOp, x: int, tag) -> int:
    """The rows of a movement op; shapes from tinygrad's (static: checked), offsets from its shape operands."""
    op, rows = u.op, self.rows
    d = rows[x][1]
    if op is TOps.PERMUTE: rows.append((_PERMUTE, d, (x,), tuple(u.arg), tag))
    elif op is TOps.FLIP: rows.append((_FLIP, d, (x,), tuple(bool(f) for f in u.arg), tag))
    elif op is TOps.RESHAPE: rows.append((_RESHAPE, d, (x,), _ints(u._shape, u), tag))
    elif op is TOps.EXPAND:
      shape, xsh = _ints(u._shape, u), u.src[0]._shape
      t = tag if tag is not None else _EXPAND
      rows.append((_RESHAPE, d, (x,), (1,) * (len(shape) - len(xsh)) + xsh, t))
      rows.append((_EXPANDOP, d, (len(rows) - 1,), shape, t))
    else:
      pairs = tuple((o, sz) for o, sz in u.marg)
      _ints(sum(pairs, ()), u)
      if op is TOps.PAD:
        rows.append((_PAD, d, (x,), tuple((o, sz - o - s) for (o, sz), s in zip(pairs, u.src[0]._shape)), tag))
      else: rows.append((_SHRINK, d, (x,), tuple((o, o + sz) for o, sz in pairs), tag))
    return len(rows) - 1

  def _opaque_buffer(self, u: TUOp) -> int:
    """A BUFFER row whose unique id is the tinygrad node: a tinygrad BUFFER, or a value pygrad need not see into."""
    dev = u.device
    if type(dev) is not str:
      raise ValueError(f"from_tinygrad: {u.op.name} on device {dev!r}: pygrad places a value on one named device")
    name = u.arg.name if u.op is TOps.BUFFER and isinstance(u.arg, ParamArg) else None
    return self._row(_BUFFER, _pdtype(u).id, (), (u, _ints(u.shape, u), dev, name))


def _wrap(v: int, d) -> int:
  """An integer constant in d's range, wrapping as the machine does (a weak -1 added to a uint32 is 2**32-1)."""
  bits = 8 * d.itemsize
  v &= (1 << bits) - 1
  return v - (1 << bits) if d.kind == "i" and v >= 1 << (bits - 1) else v


# ---- pygrad -> tinygrad ----

_TOPS = tuple(getattr(TOps, o.name, None) for o in Ops)  # pygrad op int -> tinygrad's op of that name
_TALU_I = {_OP[v]: k for k, v in _ALU.items()}
_TDT_I = {p.id: t for t, p in _DT.items()}
_IDENT = frozenset(_OP[o] for o in (Ops.CONTIGUOUS, Ops.CONTIGUOUS_BACKWARD, Ops.DETACH))
_args_objs, _meta_vals, _core_info = ARGS.objs, META.vals, CORE.info


class _Out:
  """One conversion pygrad -> tinygrad over the node table of the roots' graph (one export call), seeded with the
  nodes a conversion the other way made (pygrad id -> tinygrad node), which map back without being rebuilt."""

  def __init__(self, known=None):
    self.known: dict = known if known is not None else {}
    self.shapes: dict = {}  # static shape -> tinygrad's shape operand
    self.consts: dict = {}  # (dtype id, arg id) -> tinygrad CONST

  def convert(self, roots: list) -> list:
    """The tinygrad nodes of `roots`, rows in topological order; nodes known already, and nodes only they reach,
    are not converted."""
    for r in roots:
      if not isinstance(r, UOp): raise TypeError(f"to_tinygrad: expected a pygrad UOp, got {type(r).__name__}")
    if not roots: return []
    known = self.known
    ids, op, dt, arg, tag, pdata, nsrc, src = export(roots)
    n = len(ids)
    need = set(CORE.toposort([r._id for r in roots], True, list(known))) if known else None
    start = np.zeros(n + 1, np.int64)
    np.cumsum(nsrc, out=start[1:])
    self.ids, self.op, self.dt, self.arg, self.tag = ids.tolist(), op.tolist(), dt.tolist(), arg.tolist(), tag.tolist()
    self.start, self.src = start.tolist(), src.tolist()
    self.out = out = [None] * n
    idl, opl, tagl, pdl, objs = self.ids, self.op, self.tag, pdata.tolist(), _args_objs
    md = _pg_uop._md_count and pdata.any()
    one = self._one
    for i in range(n):
      nid = idl[i]
      t = known.get(nid)
      if t is not None:
        out[i] = t
        continue
      if need is not None and nid not in need: continue  # only nodes known already use it
      tg = objs[tagl[i]] if tagl[i] else None
      o = opl[i]
      # the helper of a pair, or an explicit broadcast: made only if asked for on its own (see _lazy)
      if tg is not None and (tg == _BCAST or tg == _EXPAND and o == _RESHAPE or tg == _REDUCE and o == _REDUCEOP):
        continue
      t = out[i] = one(i, o, tg)
      if md and pdl[i] and t not in _tg_metadata: _tg_metadata[t] = self._md(pdl[i])
    pos = {nid: i for i, nid in enumerate(idl)} if len(roots) > 1 else {roots[0]._id: n - 1}
    return [self._get(pos[r._id]) for r in roots]

  @staticmethod
  def _md(pid: int) -> tuple:
    got = _MD_OUT.get(pid)
    md = _args_objs[pid]
    if got is None or got[0] is not md:
      if len(_MD_OUT) >= 4096: _MD_OUT.clear()
      got = _MD_OUT[pid] = (md, tuple(TMetadata(m.name, m.backward) for m in md))
    return got[1]

  def _srcs(self, i: int) -> list: return self.src[self.start[i]:self.start[i + 1]]

  def _shape(self, i: int) -> tuple: return _meta_vals[_core_info(self.ids[i])[5]][0]

  def _get(self, i: int) -> TUOp:
    t = self.out[i]
    return t if t is not None else self._lazy(i)

  def _lazy(self, i: int) -> TUOp:
    """The tinygrad node of a helper row asked for on its own (bounded: helpers sit at most two deep)."""
    tg, x, a = _args_objs[self.tag[i]], self.src[self.start[i]], _args_objs[self.arg[i]]
    if tg == _BCAST: ret = self._get(x)
    elif tg == _EXPAND: ret = self._mop(self._get(x), TOps.RESHAPE, a)
    else:
      xt = self._get(x)
      ret = self._mop(TUOp(TOps.REDUCE, xt.dtype, (xt,), (getattr(TOps, a[0].name), len(a[1]))), TOps.RESHAPE,
                      self._shape(i))
    self.out[i] = ret
    return ret

  def _shape_arg(self, shape: tuple) -> TUOp:
    got = self.shapes.get(shape)
    if got is None: got = self.shapes[shape] = shape_to_shape_arg(shape)
    return got

  def _mop(self, x: TUOp, op, arg) -> TUOp:
    """tinygrad's x._mop(op, arg) for static arguments, made directly: its symbolic simplify of the shape operands
    changes nothing on ints, and costs more than the node (the round-trip tests check the nodes are tinygrad's)."""
    if op is TOps.PERMUTE or op is TOps.FLIP: return TUOp(op, x.dtype, (x,), arg)
    if op is TOps.RESHAPE: return TUOp(op, x.dtype, (x, self._shape_arg(arg)))
    if not arg: return x
    if op is TOps.EXPAND: return TUOp(op, x.dtype, (x, self._shape_arg(arg)))
    return TUOp(op, x.dtype, (x, self._shape_arg(tuple(a for a, _ in arg)), self._shape_arg(tuple(b for _, b in arg))))

  def _expand(self, x: TUOp, src: tuple, shape: tuple) -> TUOp:
    """pygrad's EXPAND (size-1 axes grow in place) as tinygrad's: drop those axes, prepend them grown, permute back."""
    grow = [i for i, (a, b) in enumerate(zip(src, shape)) if a != b]
    rest = [i for i in range(len(shape)) if i not in grow]
    y = self._mop(self._mop(x, TOps.RESHAPE, tuple(src[i] for i in rest)), TOps.EXPAND, tuple(shape[i] for i in grow))
    order = grow + rest
    perm = tuple(order.index(j) for j in range(len(shape)))
    return y if perm == tuple(range(len(shape))) else self._mop(y, TOps.PERMUTE, perm)

  def _reduce(self, x: TUOp, src: tuple, arg) -> TUOp:
    """pygrad's REDUCE_AXIS (axes kept) as tinygrad's: reduced axes permuted to the front, reduced, reshaped."""
    rop, axes = arg
    red = [a for a in sorted(axes) if src[a] != 1]
    if red:
      perm = tuple(red + [i for i in range(len(src)) if i not in red])
      if perm != tuple(range(len(src))): x = self._mop(x, TOps.PERMUTE, perm)
      x = TUOp(TOps.REDUCE, x.dtype, (x,), (getattr(TOps, rop.name), len(red)))
    return self._mop(x, TOps.RESHAPE, tuple(1 if i in axes else s for i, s in enumerate(src)))

  def _one(self, i: int, o: int, tag) -> TUOp:
    if type(tag) is tuple and tag[0] == _TG: return tag[1]
    a = _args_objs[self.arg[i]]
    get = self._get
    if o in _TALU_I:
      src = tuple(get(j) for j in self._srcs(i))
      # the dtype is given unless every operand is weak (then tinygrad's promotion decides, as it did before)
      for s in src:
        if s.dtype not in _WEAK: return TUOp(_TALU_I[o], _TDT_I[self.dt[i]], src)
      return TUOp(_TALU_I[o], src=src)
    if o == _CONST:
      k = (self.dt[i], self.arg[i])
      got = self.consts.get(k)
      if got is None: got = self.consts[k] = TUOp.const(a, _TDT_I[k[0]])
      return got
    if o == _RESHAPE:
      r = self.src[self.start[i]]
      if tag == _REDUCE and self.op[r] == _REDUCEOP and _args_objs[self.tag[r]] == _REDUCE:
        xt, ra = get(self.src[self.start[r]]), _args_objs[self.arg[r]]
        return TUOp(TOps.REDUCE, xt.dtype, (xt,), (getattr(TOps, ra[0].name), len(ra[1])))
      return self._mop(get(r), TOps.RESHAPE, a)
    if o == _EXPANDOP:
      r = self.src[self.start[i]]
      if tag == _EXPAND:
        inner = self.src[self.start[r]]
        return self._mop(get(inner), TOps.EXPAND, a[:len(a) - len(self._shape(inner))])
      return self._expand(get(r), self._shape(r), a)
    srcs = self._srcs(i)
    x = get(srcs[0]) if srcs else None
    if o == _REDUCEOP: return self._reduce(x, self._shape(srcs[0]), a)
    if o == _PERMUTE: return self._mop(x, TOps.PERMUTE, a)
    if o == _FLIP: return self._mop(x, TOps.FLIP, a)
    if o == _PAD: return self._mop(x, TOps.PAD, tuple((b, s + b + e) for (b, e), s in zip(a, self._shape(srcs[0]))))
    if o == _SHRINK: return self._mop(x, TOps.SHRINK, tuple((b, e - b) for b, e in a))
    if o == _CAST or o == _BITCAST:
      d = _TDT_I[self.dt[i]]
      return TUOp(TOps.CAST if o == _CAST else TOps.BITCAST, d, (x,), d)
    if o == _CONTIGUOUS and type(tag) is tuple and tag[0] == _ASSIGN:
      view = tag[1]
      return view.after(view.store(x))
    if o in _IDENT: return TUOp(_TOPS[o], x.dtype, (x,))
    if o == _COPY: return TUOp(TOps.COPY, src=(x,), arg=a)
    if o == _BUFFER:
      if isinstance(a[0], TUOp): return a[0]
      shape, n = a[1], math.prod(a[1])
      # a pygrad input becomes the same tinygrad BUFFER in every conversion: its slot is derived from the unique id
      slot = _SLOT0 - a[0] if type(a[0]) is int else None
      b = TUOp.new_buffer(a[2], n, _TDT_I[self.dt[i]], num=slot)
      return b if shape == (n,) else self._mop(b, TOps.RESHAPE, shape)
    if o == _DEFINE_VAR: return TUOp.variable(a[0], a[1], a[2], _TDT_I[self.dt[i]])
    if o == _PARAM: return TUOp.param(a[0], _TDT_I[self.dt[i]], a[1], a[2])
    if o == _NOOP: return TUOp(TOps.NOOP)
    if o == _TUPLE: return TUOp.maketuple(*(get(j) for j in srcs))
    if o == _SINK: return TUOp.sink(*(get(j) for j in srcs))
    if o == _GETTUPLE: return TUOp(TOps.GETTUPLE, src=(x,), arg=a)
    if o == _AFTER: return x.after(get(srcs[1]))
    if o == _FUNCTION or o == _CALL:
      info = tag[1] if type(tag) is tuple and tag[0] == _INFO else _tcallinfo(Ops(o).name, a)
      if o == _CALL: raise ValueError(f"to_tinygrad: CALL {a.name!r} has a pygrad kernel; tinygrad cannot run it")
      return TUOp(TOps.FUNCTION, src=tuple(get(j) for j in srcs), arg=info)
    raise ValueError(f"to_tinygrad: pygrad op {Ops(o).name} has no tinygrad counterpart")


_SLOT0 = -(1 << 48)  # below tinygrad's own slots (counters from 0, and -id(buffer) for adopted storage)


def _tcallinfo(opname: str, a):
  gf = a.grad_fxn
  if gf is not None and type(gf) is not _GradFxn:
    raise ValueError(f"to_tinygrad: {opname} {a.name!r} has a pygrad grad_fxn; tinygrad would call it on its UOps")
  return TCallInfo(gf.info.grad_fxn if gf is not None else None, a.name, a.precompile, a.precompile_backward)


# ---- public API ----

def from_tinygrad(roots):
  """tinygrad UOps (one, or a list/tuple) -> the pygrad UOps with the same meaning; every node converted."""
  cin = _In()
  if isinstance(roots, (list, tuple)): return type(roots)(cin.build([cin.add(r) for r in roots]))
  return cin.build([cin.add(roots)])[0]


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
  """compute_gradient's first phase: the graph above the targets into pygrad (the rest opaque), in one build."""
  targets = set(targets)
  cin = _In(targets=targets)
  rows = [cin.add(root), cin.add(root_grad, _DT.get(root.dtype)) if root_grad.dtype in _WEAK else cin.add(root_grad)]
  reached = [t for t in targets if t in cin.live]
  rows += [cin.add(t) for t in reached]
  proot, pgrad, *pts = cin.build(rows)
  return cin, proot, pgrad, dict(zip(reached, pts))


def derive(cin, proot: UOp, pgrad: UOp, ptargets: dict) -> dict:
  """compute_gradient's second phase: pygrad's compute_gradient (a grad_fxn met on the way finds the conversions)."""
  stack = _local.__dict__.setdefault("stack", [])
  stack.append(_Ctx(cin.fwd(), cin.rev()))
  try:
    return _pg_gradient.compute_gradient(proot, pgrad, set(ptargets.values()))
  finally:
    stack.pop()


def convert_out(cin, root: TUOp, root_grad: TUOp, ptargets: dict, grads: dict) -> dict:
  """compute_gradient's last phase: the targets' gradients back into tinygrad, forward nodes reused."""
  got = [(t, g) for t, p in ptargets.items() if (g := grads.get(p)) is not None and g.op is not Ops.NOOP]
  ret = {root: root_grad}
  ret.update(zip((t for t, _ in got), _Out(cin.rev()).convert([g for _, g in got])))
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
