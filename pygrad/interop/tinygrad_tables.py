"""The tables pygrad's tinygrad interop works from (pygrad/interop/tinygrad.py explains the encodings): dtypes, the
ops both IRs share, the tags of pygrad nodes that encode a tinygrad node differently, which sources of a tinygrad
node are values, and tinygrad's calls as pygrad calls (a tinygrad grad_fxn called from pygrad's derivation)."""
from __future__ import annotations
import contextlib, gc, threading, types, weakref
from pygrad import Ops, dtypes, CallInfo
from pygrad.uop import handle as _handle

try:
  from tinygrad.uop.ops import UOp as TUOp, Ops as TOps, CallInfo as TCallInfo, all_metadata as _tg_metadata
  from tinygrad.uop.ops import ParamArg, shape_to_shape_arg, UOpMetaClass
  from tinygrad.helpers import SPEC
  from tinygrad.dtype import dtypes as tdtypes, AddrSpace
  from tinygrad.helpers import Metadata as TMetadata
  import tinygrad.mixin.gradient as _tg_gradient
except ImportError as e:  # pragma: no cover - exercised only where tinygrad is missing
  raise ImportError("pygrad.interop.tinygrad needs tinygrad 0.14.0 (pip install 'pygrad[tinygrad]')") from e

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
_ASSIGN_P = "tinygrad.assign_param"  # GETTUPLE(TUPLE(value, view), 0) standing for AFTER(view, STORE(view, value))
# where the view is a function body's PARAM (or a view of one): see _param_view


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
  if op is TOps.AFTER and _is_assign(u):
    return (u.src[1].src[1], u.src[0]) if _param_view(u.src[0]) else (u.src[1].src[1],)
  return u.src


def _is_assign(u: TUOp) -> bool:
  if len(u.src) != 2 or u.src[1].op is not TOps.STORE: return False
  st = u.src[1]
  return len(st.src) == 2 and st.src[0] is u.src[0] and st.src[1]._shape == u.src[0]._shape


def _param_view(view: TUOp) -> bool:
  """Whether an assign's view is a PARAM of a function body (or a view of one). Such a view is a source of the
  pygrad node (_ASSIGN_P), not a tag: a FUNCTION's backward renumbers its body's PARAMs, and one hidden in a tag
  kept its old slot, another argument of the backward (tinygrad then stored the value into a gradient's buffer, or
  failed: tests/test_interop_tinygrad_fuzz_ops.py, seed 1119)."""
  return view.op is TOps.PARAM or any(x.op is TOps.PARAM for x in view.toposort())


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

  def __call__(self, *grads, call=None):
    # pygrad's rules call a grad_fxn as tinygrad does: (*grads, call=k), or (grad, k) for a single output
    if call is None: *grads, call = grads
    from .tinygrad_in import _In  # the conversions import these tables
    from .tinygrad_out import _Out
    ctx = _ctx()  # the conversion in of the derivation running (its maps are made on first use)
    out = _Out(ctx.rev() if ctx is not None else None)
    tcall, *tg = out.convert([call, *grads])
    args = tcall.src[1:]
    # a gradient with no device (a broadcast constant) is placed on the call's device, as tinygrad does for calls
    tg = [g.clone(device=(args[i].device if tcall.op is TOps.CALL else tcall.device)) if g.device is None else g
          for i, g in enumerate(tg)]
    ret = self.info.grad_fxn(*tg, call=tcall) if len(tg) > 1 else self.info.grad_fxn(tg[0], tcall)
    cin = _In(known=_Known(out, ctx.fwd() if ctx is not None else None))
    rows = [None if g is None else cin.add(g) for g in ret]
    made = iter(cin.build([r for r in rows if r is not None]))
    return tuple(None if r is None else next(made) for r in rows)


class _Known:
  """The nodes a grad_fxn's result is converted back over: first those the way out made for its call (tinygrad node
  -> the pygrad node it was made from), then the derivation's conversion in (`fwd`). The way out's come first: a
  backward body's PARAMs are pygrad's own (slot n + i for the i-th gradient), and the tinygrad PARAM one converts to
  can be, by hash-consing, a PARAM of a forward body converted in (equal slot, dtype, shape, device: another scope);
  found in `fwd` first, it came back as that forward PARAM, a second PARAM of one slot in the backward body (the
  FUNCTION then failed: 'body uses PARAM slot 3 but 3 args are given'; tests/test_interop_tinygrad_fuzz_ops.py,
  seed 1038). Weak nodes (keyed with their dtype) are looked up in `fwd` only."""
  __slots__ = ("made", "fwd")

  def __init__(self, out, fwd):
    ids = out.ids
    self.made = {t: ids[i] for i, t in enumerate(out.out) if t is not None and t.dtype not in _WEAK}
    self.fwd = fwd

  def __contains__(self, key) -> bool: return key in self.made or (self.fwd is not None and key in self.fwd)

  def get(self, key):
    i = self.made.get(key) if type(key) is TUOp else None
    if i is not None: return _handle(i)
    return self.fwd.get(key) if self.fwd is not None else None


def _pcallinfo(info) -> CallInfo:
  if not isinstance(info, TCallInfo): raise ValueError(f"from_tinygrad: a call's arg is {info!r}, not a CallInfo")
  gf = _GradFxn(info) if info.grad_fxn is not None else None
  return CallInfo(gf, info.name, info.precompile, info.precompile_backward)


# ---- the node tables' ints, and lookups for the hot loops ----

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
_MD_IN: dict = {}   # distinct (name, backward) pairs of a tinygrad metadata tuple -> pygrad's (few distinct)
_MD_OUT: dict = {}  # pygrad metadata arg id -> (its tuple, tinygrad's)
_TOPS = tuple(getattr(TOps, o.name, None) for o in Ops)  # pygrad op int -> tinygrad's op of that name
_TALU_I = {_OP[v]: k for k, v in _ALU.items()}
_TDT_I = {p.id: t for t, p in _DT.items()}
_IDENT = frozenset(_OP[o] for o in (Ops.CONTIGUOUS, Ops.CONTIGUOUS_BACKWARD, Ops.DETACH))


def _tcallinfo(opname: str, a):
  gf = a.grad_fxn
  if gf is not None and type(gf) is not _GradFxn:
    raise ValueError(f"to_tinygrad: {opname} {a.name!r} has a pygrad grad_fxn; tinygrad would call it on its UOps")
  return TCallInfo(gf.info.grad_fxn if gf is not None else None, a.name, a.precompile, a.precompile_backward)


def _tmake_checked(op, dtype, src, arg=None) -> TUOp: return TUOp(op, dtype, src, arg)


def _tmake_for():
  """tinygrad's UOp(op, dtype, src, arg) for a given dtype, as UOpMetaClass.__call__ makes it with SPEC <= 1 and no
  metadata: the same hash-consing key in the same ucache, without the constructor's per-call Python checks (SPEC is
  read there on every call; a gradient makes ~10^4 nodes). With SPEC > 1 tinygrad's constructor is used."""
  if SPEC.value > 1: return _tmake_checked
  ucache, new, ref = UOpMetaClass.ucache, type.__call__, weakref.ref

  def tmake(op, dtype, src, arg=None) -> TUOp:
    key = (op, dtype, src, arg, None)
    w = ucache.get(key)
    if w is not None and (t := w()) is not None: return t
    t = new(TUOp, *key)
    ucache[key] = ref(t)
    return t
  return tmake


def _tfields(cls=TUOp):
  """The descriptors of cls's fields (op, dtype, src, arg, tag) if making a node is just setting them: cls has
  object's __new__ and __setattr__, and its __init__ is the one dataclass generates for those slots (it assigns each
  and does nothing else). The C loop of the way out (csrc/pyforeign.c) then sets them on a bare instance, skipping
  the __init__ frame (a fifth of a node's cost); else None, and it calls the class."""
  names = ("op", "dtype", "src", "arg", "tag")
  init = cls.__dict__.get("__init__")
  code = getattr(init, "__code__", None)
  if code is None or code.co_varnames[:6] != ("self", *names) or code.co_argcount != 6 or \
     code.co_filename != "<string>" or init.__qualname__ != f"{cls.__qualname__}.__init__" or hasattr(cls, "__post_init__") or \
     cls.__new__ is not object.__new__ or cls.__setattr__ is not object.__setattr__ or \
     getattr(cls, "__slots__", None) != names:
    return None
  ds = tuple(cls.__dict__.get(k) for k in names)
  return ds if all(type(d) is types.MemberDescriptorType for d in ds) else None


@contextlib.contextmanager
def _no_gc():
  """Python's cyclic GC paused while a conversion runs. A conversion makes ~10^4 tinygrad UOps, tuples and weakrefs
  and no reference cycles; each allocation burst would trigger collections, and the full ones walk every object of
  the (large) graphs alive, so their cost grows with the model: at W1 depth 2000, 2.8x of convert out and 1.7x of
  convert in. Nothing collectable is made, so pausing only moves the next collection to after the conversion;
  the previous state is restored (nested uses keep the outer one's).

  The outermost use then moves the young objects into the oldest generation (gc.freeze then gc.unfreeze: two list
  splices) instead of leaving them to the first young collection, which would walk every object the conversion
  made and kept (the ~470K tinygrad objects of W1 depth 2000's gradient: ~27 ms; the node table of a
  from_tinygrad: ~6 ms). They are what a collection would have promoted anyway (nothing of the conversion's is
  garbage), and any cyclic garbage among the young objects made before is found by the next full collection. Not
  when objects are frozen already (gc.freeze by the program): unfreezing would release them."""
  was = gc.isenabled()
  gc.disable()
  try:
    yield
  finally:
    if was:
      if gc.get_freeze_count() == 0:
        gc.freeze()
        gc.unfreeze()
      gc.enable()


_local = threading.local()  # .stack: the conversions in (tinygrad_in._In) of the derivations running here


def _ctx():
  s = getattr(_local, "stack", None)
  return s[-1] if s else None
