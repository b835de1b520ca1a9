"""Making nodes: the paths UOp's constructor and math methods take to the core -- the generic make after inference,
and the hot paths that check by table instead (alu1, alu2, alu2k for ALU nodes, movement for movement and reduce
nodes with its cache of validity results, placeholders' BUFFERs, scalar constants). Each ends in the handle
registry's _wrap or a one-call maker (pygrad/handles.py); anything off a hot path goes to the generic UOp(...),
which raises the precise error. uop.py imports this module at its end (it needs the UOp class) and UOp's methods
reach these functions through it."""
from __future__ import annotations
from .ops import Ops
from .dtype import DType, dtypes, INT_RANGE as _INT_RANGE
from .core import CORE, ArgGone
from .intern import _INTS, ARGS, META, argkey
from .shapes import INFER, SHAPE as _SHAPE, dtype_tables
from . import uop as _u  # its metadata state, read live (_md_open is rebound as blocks open and close)
from .uop import UOp
from .handles import _wrap, _mk_moved, _mk_leaf, _cached_maker, _ERR_GONE

_core_make, _make1, _make2, _make2k = CORE.make, CORE.make1, CORE.make2, CORE.make2k
_args_get, _meta_get, _meta_ids = ARGS.get, META.get, META.ids
_args_key, _args_fresh = ARGS.get_key, ARGS.get_fresh
_VOID = dtypes.void
_BUFFER = Ops.BUFFER
_NONE: dict = {}
_UNARY_OK, _BINARY_OUT = dtype_tables()
_META0 = META.get((), None)


def _make(op: Ops, dtype: DType, src: tuple, arg, tag, shape, device) -> UOp:
  """The node with these fields (its shape and device already inferred), as its unique handle."""
  mk = (shape, device)
  meta = _meta_ids.get(mk)
  if meta is None: meta = _meta_get(shape, device)
  while True:
    aid = 0 if arg is None else _args_get(arg)
    tid = 0 if tag is None else _args_get(tag)
    try:
      nid = _core_make(op, dtype.id, tuple([s._id for s in src]), aid, tid, meta)
      break
    except ArgGone:
      if aid: ARGS.forget(aid)
      if tid: ARGS.forget(tid)
  return _wrap(nid, op, dtype, arg, tag, shape, device, meta)


def alu1(op: Ops, x: UOp) -> UOp:
  """A unary ALU node (the hot path of the math methods: checks by table, no generic inference)."""
  d = x._dtype
  if d not in _UNARY_OK.get(op, ()): return UOp(op, None, (x,))  # the generic path raises the precise error
  m = x._m
  nid = _make1(op, d.id, x._id, 0, 0, m)
  if nid < 0: return UOp(op, None, (x,))
  return _wrap(nid, op, d, None, None, x._shape, x._device, m)


def alu2(op: Ops, a: UOp, b: UOp) -> UOp | None:
  """A binary ALU node over node operands of equal dtype and equal shapes (or one of shape ()) on one device: the
  hot path of the math methods, checked by table. None for anything else (the caller promotes and broadcasts)."""
  d = a._dtype
  if b._dtype is not d: return None
  out = _BINARY_OUT.get(op, _NONE).get(d)
  if out is None: return None
  sa, sb = a._shape, b._shape
  da, db = a._device, b._device
  if da == db:
    if sa == sb or not sb: meta, shape = a._m, sa
    elif not sa: meta, shape = b._m, sb
    else: return None
  elif da is None or db is None:
    if sa != sb and sa and sb: return None
    shape, da = sa or sb, da if da is not None else db
    meta = _meta_ids.get((shape, da))
    if meta is None: meta = _meta_get(shape, da)
  else: return None
  nid = _make2(op, out.id, a._id, b._id, 0, 0, meta)
  if nid < 0: return UOp(op, None, (a, b))
  return _wrap(nid, op, out, None, None, shape, da, meta)


def alu2k(op: Ops, a: UOp, value, reverse: int) -> UOp | None:
  """op(a, value), or op(value, a) if reverse, for a Python scalar of a's dtype kind (a float for float dtypes, an
  int in range for int dtypes, a bool for bool): the constant and the node in one core call, with no handle for
  the constant. None for anything else, and inside a metadata block (the constant gets the metadata there)."""
  t, d = type(value), a._dtype
  k = d.kind
  if k == "f":
    if t is not float:
      if t is not int: return None
      value = float(value)
  elif t is not int or k == "b" or not _INT_RANGE[d][0] <= value <= _INT_RANGE[d][1]:
    if not (t is bool and k == "b"): return None
  out = _BINARY_OUT.get(op, _NONE).get(d)
  if out is None or _u._md_open: return None
  m = a._m
  while True:
    aid = _args_get(value)
    nid = _make2k(op, out.id, a._id, d.id, aid, _META0, reverse, m)
    if nid != _ERR_GONE: break
    ARGS.forget(aid)
  if nid < 0: return None
  return _wrap(nid, op, out, None, None, a._shape, a._device, m)


# (op, source meta, source dtype, arg) -> (shape, meta, arg id, dtype id): the validity functions' results and the
# interned arg, bounded. An all-int tuple arg (a shape or an order) is its own key: all-int tuples are equal only
# when their ints are, so the key stays type-strict; any other arg is keyed by its argkey (which never equals an
# all-int tuple). A void source is never cached (its movement is an error), so a hit needs no dtype check: the
# movement methods' hit path (_cached: csrc/pymake.c on the C core) is the key, the lookup and the make.
_moved: dict = {}
_MOVED_LIMIT = 8192
ARGS.on_wrap.append(_moved.clear)  # its arg ids are not counted: after a generation wraps one may name another arg


def movement(op: Ops, x: UOp, arg) -> UOp:
  """A movement or reduce node of x, its shape from the op's validity function (shapes.SHAPE): the math methods'
  hot path, with the errors of the generic path. Valid results are remembered (see _moved), so a repeated
  reshape/permute/expand/reduce costs one dict lookup and one core call."""
  d = x._dtype
  if d is _VOID: return UOp(op, None, (x,), arg)  # the generic path raises the precise error
  ak = arg
  if type(arg) is tuple:
    for e in arg:
      if type(e) is not int:
        ak = None
        break
  else: ak = None
  if ak is None:
    try: ak = argkey(arg)
    except TypeError: return UOp(op, None, (x,), arg)
  ck = (op, x._m, d, ak)
  hit = _moved.get(ck)
  if hit is not None:
    nid = _mk_moved(op, d, d.id, x, arg, hit[2], hit[0], hit[1])
    if type(nid) is UOp:
      if _u._md_open: _u._attach_current(nid)
      return nid
    if nid >= 0: return _wrap(nid, op, d, arg, None, hit[0], x._device, hit[1])
    if nid != _ERR_GONE: return UOp(op, None, (x,), arg)
    ARGS.forget(hit[2])  # drained since it was cached: intern it again below
  shape = _SHAPE[op](op, (x,), arg)
  dev = x._device
  meta = _meta_ids.get((shape, dev))
  if meta is None: meta = _meta_get(shape, dev)
  k = argkey(arg) if ak is arg else ak
  while True:
    aid = _args_key(k, arg)
    try: nid = _make1(op, d.id, x._id, aid, 0, meta)
    except ArgGone: nid = _ERR_GONE
    if nid != _ERR_GONE: break
    ARGS.forget(aid)
  if nid < 0: return UOp(op, None, (x,), arg)
  if len(_moved) >= _MOVED_LIMIT: _moved.clear()
  _moved[ck] = (shape, meta, aid, d.id)
  return _wrap(nid, op, d, arg, None, shape, dev, meta)


def _buffer(dtype: DType, arg: tuple, shape: tuple, device: str, name) -> UOp:
  """A new BUFFER node for placeholder's checked fields: its arg's interning key built directly (it is new: the
  uid is), where argkey would recurse into the arg, and no generic inference (~12 us a placeholder before, the
  bulk of a W1 build, which makes one per layer)."""
  meta = _meta_ids.get((shape, device))
  if meta is None: meta = _meta_get(shape, device)
  k = (tuple, (int, arg[0]), (_INTS, shape), (str, device), (type(name), name))  # == argkey(arg): shape is ints
  while True:
    aid = _args_fresh(k, arg, name is not None)  # (new: its uid is; plain exactly when the name is a str)
    r = _mk_leaf(_BUFFER, dtype, dtype.id, arg, aid, shape, device, meta)  # the node and its handle in one call
    if type(r) is UOp:
      if _u._md_open: _u._attach_current(r)
      return r
    if r >= 0: return _wrap(r, _BUFFER, dtype, arg, None, shape, device, meta)
    if r != _ERR_GONE: return UOp(_BUFFER, dtype, (), arg)  # the generic path raises the precise error
    ARGS.forget(aid)


def node(op: Ops, src: tuple, arg) -> UOp:
  """UOp(op, None, src, arg) for sources the caller knows are UOps: inference (the validity check) and the node."""
  d, shape, device = INFER[op](op, None, src, arg)
  return _make(op, d, src, arg, None, shape, device)


def const(value, dtype: DType) -> UOp:
  """UOp.const for a Python scalar already of the dtype's kind (the math methods' hot path)."""
  t, kind = type(value), dtype.kind
  if not ((kind == "f" and t is float) or (kind == "b" and t is bool) or
          (t is int and kind in "iu" and _INT_RANGE[dtype][0] <= value <= _INT_RANGE[dtype][1])):
    return UOp.const(value, dtype)
  return _make(Ops.CONST, dtype, (), value, None, (), None)



def _py_cached(op: Ops, x: UOp, arg):
  """The movement methods' hit path: op(x, arg) for an arg of non-negative ints other than x's shape whose result
  _moved holds, else None (the caller takes movement())."""
  if type(arg) is not tuple: return None
  for e in arg:
    if type(e) is not int or e < 0: return None
  if arg == x._shape: return None
  d = x._dtype
  hit = _moved.get((op, x._m, d, arg))
  if hit is None: return None
  r = _mk_moved(op, d, hit[3], x, arg, hit[2], hit[0], hit[1])
  if type(r) is UOp or r < 0: return r if type(r) is UOp else None
  return _wrap(r, op, d, arg, None, hit[0], x._device, hit[1])


_cached = _py_cached if _cached_maker is None else _cached_maker(_moved)
