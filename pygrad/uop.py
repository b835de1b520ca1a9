"""UOp: a handle on one hash-consed node of the core. Handles are made lazily (a node made inside a core pass has
no Python object until Python asks for it), unique per node while alive (so `is` is node identity), and each owns
one core reference, dropped when the handle dies."""
from __future__ import annotations
import itertools, weakref, contextlib, contextvars, threading, traceback
from _weakref import _remove_dead_weakref  # type: ignore[import-not-found]  # CPython's, as WeakValueDictionary
from dataclasses import dataclass
from operator import attrgetter
from collections.abc import Mapping
from typing import Any, Callable, Iterator
from .ops import Ops
from .dtype import DType, dtypes, BY_ID, coerce as _coerce, INT_RANGE as _INT_RANGE
from .core import CORE, ArgGone
from .intern import _INTS, ARGS, META, argkey
from .shapes import INFER, SHAPE as _SHAPE, dtype_tables
from .mathops import MathMixin

_handles: dict[int, weakref.ref] = {}
_core_make, _core_decref, _core_incref, _core_info = CORE.make, CORE.decref, CORE.incref, CORE.info
_core_release = CORE.release
_make1, _make2, _make2k = CORE.make1, CORE.make2, CORE.make2k
_ERR_GONE = -3  # a core make's code for an arg id drained meanwhile (csrc/pygrad.h PG_ERR_ARG_GONE)
_args_get, _args_objs, _meta_get, _meta_vals, _meta_ids = ARGS.get, ARGS.objs, META.get, META.vals, META.ids
_args_key, _args_fresh = ARGS.get_key, ARGS.get_fresh
_new_handle, _claim = object.__new__, _handles.setdefault
_OPS = tuple(Ops)
_VOID = dtypes.void
_BUFFER = Ops.BUFFER
_INT64_MAX = 2 ** 63 - 1
_uids = itertools.count()


@dataclass(frozen=True)
class CallInfo:
  """The arg of FUNCTION and CALL: a custom gradient, a name, precompile flags, and (CALL) the kernel's `fxn`."""
  grad_fxn: Callable | None = None
  name: str | None = None
  precompile: bool = False
  precompile_backward: bool = False
  fxn: Callable | None = None


@dataclass(frozen=True)
class Metadata:
  """Where a node came from: `name` given to `pygrad.metadata`, the `caller` line, and whether it is `backward`."""
  name: str
  caller: str = ""
  backward: bool = False


# The metadata of the open `metadata` block is kept per thread and per async context (a ContextVar). Reading a
# ContextVar costs ~40 ns on every node made, so the build path first reads _md_open, the number of blocks open in
# the whole process: while it is 0 no context can have metadata and nothing more is looked at.
_md_var: contextvars.ContextVar[tuple[Metadata, ...] | None] = contextvars.ContextVar("pygrad_metadata", default=None)
_md_get = _md_var.get
_md_open = 0
_md_lock = threading.Lock()
_md_count = 0  # how many times metadata was attached: 0 lets the gradient skip metadata work entirely


def current_metadata() -> tuple[Metadata, ...] | None:
  """The metadata of the innermost `metadata` block open in this thread / async context, or None."""
  return _md_get() if _md_open else None


@contextlib.contextmanager
def metadata(name: str, caller: str | None = None):
  """Attach Metadata(name, caller) to every node made inside the block (in this thread or async context) that has
  none yet."""
  global _md_open
  if caller is None:
    fr = traceback.extract_stack(limit=3)[0]
    caller = f"{fr.filename}:{fr.lineno}"
  with _md_lock:
    _md_open += 1
    if _meth_md is not None: _meth_md(_md_open)  # the C methods (csrc/pymeth.c) take the Python path meanwhile
  tok = _md_var.set((Metadata(name, caller),))
  try:
    yield
  finally:
    _md_var.reset(tok)
    with _md_lock:
      _md_open -= 1
      if _meth_md is not None: _meth_md(_md_open)


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


def _wrap(nid: int, op: Ops, dtype: DType, arg, tag, shape, device, meta: int) -> UOp:
  """The unique handle of a node the caller holds one new reference on (dropped if a handle exists already)."""
  r = _handles.get(nid)
  if r is not None:
    o = r()
    if o is not None:
      _core_decref(nid)
      if _md_open: _attach_current(o)
      return o
  o = _hnew(nid, op, dtype, arg, tag, shape, device, meta)
  w = _Ref(o, _on_dead)
  w.nid = nid
  if _claim(nid, w) is not w: o = _register(o, w, nid)
  if _md_open: _attach_current(o)
  return o


class _Ref(weakref.ref):
  """The registry's weak reference to a handle; when the handle dies, its callback drops the core reference. A
  callback (unlike __del__) runs once the handle is unreachable, so no thread can pick the dying handle up again."""
  __slots__ = ("nid",)  # made as _Ref(handle, _on_dead), then nid set: no Python-level constructor on the hot path


# The registry, _handles: node id -> _Ref of its handle. A new handle claims a free entry with dict.setdefault,
# which is atomic under the GIL. An entry is removed only by _remove_dead_weakref (C, atomic under the GIL: it
# deletes the entry only if it holds a dead reference), so no lock is needed: a dying handle's callback can never
# remove a live successor's entry, and a publisher that finds a dead entry removes it and claims again. (A lock
# here cost ~300 ns per handle death, as much as making the node.)


def _on_dead(ref: _Ref) -> None:
  nid = ref.nid
  if nid < 0: return  # a handle that lost the race to publish: it owns no core reference
  try:
    _remove_dead_weakref(_handles, nid)
    _core_release(nid)  # dropped in a batch with other dead handles' (pygrad/core/release.py)
  except Exception:  # interpreter shutdown: the core may already be gone
    pass


def _register(o: UOp, w: _Ref, nid: int) -> UOp:
  """The slow path of publishing handle o (with its _Ref w) for nid, taking over the caller's core reference: the
  entry was taken. If it names a live handle (another thread published one meanwhile), that one is returned and
  the caller's reference dropped; if it names a dead one whose callback is still to run, it is removed (that
  callback then finds no dead entry to remove) and the entry claimed again."""
  while True:
    r = _claim(nid, w)
    if r is w: return o
    other = r()
    if other is not None:
      w.nid = -1
      _core_decref(nid)
      return other
    _remove_dead_weakref(_handles, nid)


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
  if out is None or _md_open: return None
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
      if _md_open: _attach_current(nid)
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
      if _md_open: _attach_current(r)
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


def handle(nid: int) -> UOp:
  """The handle of a live node id (made now if Python has none)."""
  r = _handles.get(nid)
  if r is not None:
    o = r()
    if o is not None: return o
  op, dt, _, aid, tid, mid, _ = _core_info(nid)
  _core_incref(nid)
  shape, device = _meta_vals[mid]
  o = _hnew(nid, _OPS[op], BY_ID[dt], _args_objs[aid], _args_objs[tid] if tid else None, shape, device, mid)
  w = _Ref(o, _on_dead)
  w.nid = nid
  return o if _claim(nid, w) is w else _register(o, w, nid)


def adopt(nid: int, op: Ops, dtype: DType, arg, tag, meta: int) -> UOp:
  """handle(nid) for a node whose fields the caller knows (arg and tag the interned objects), taking over a
  reference the caller holds on it (dropped if a handle exists already): a loader's roots need no core lookup."""
  r = _handles.get(nid)
  if r is not None:
    o = r()
    if o is not None:
      _core_decref(nid)
      return o
  shape, device = _meta_vals[meta]
  o = _hnew(nid, op, dtype, arg, tag, shape, device, meta)
  w = _Ref(o, _on_dead)
  w.nid = nid
  return o if _claim(nid, w) is w else _register(o, w, nid)


def _attach_current(u: UOp) -> None:
  """Give u the metadata of this thread's / context's open block, unless it has metadata already."""
  md = _md_get()
  if md is not None: _attach_metadata(u, md, only_if_none=True)


def merge_metadata(cur: tuple, md: tuple) -> tuple:
  """A node's metadata `cur` with `md` attached: what it had, then what is new, in order."""
  return cur + tuple(m for m in md if m not in cur)


def _attach_metadata(u: UOp, md: tuple, only_if_none: bool = False) -> None:
  global _md_count
  _md_count += 1
  cur = u.metadata
  if only_if_none and cur: return
  new = merge_metadata(cur, md)
  while True:
    pid = _args_get(new)
    try:
      CORE.set_pdata(u._id, pid)
      return
    except ArgGone:
      ARGS.forget(pid)


class Walk:
  """An ordered, read-only set of nodes (a toposort): len, `in`, iteration, reversed and indexing. Python handles
  are made only for the nodes touched; the walk keeps its roots, and so its nodes, alive."""
  __slots__ = ("_ids", "_roots", "_set")

  def __init__(self, ids, roots):
    self._ids, self._roots, self._set = ids, roots, None

  def __len__(self) -> int: return len(self._ids)
  # generators, not bare map()s: the iterator must keep the walk (and so its roots and nodes) alive, or
  # `for u in x.toposort()` on a temporary root frees the nodes it is about to hand out
  def __iter__(self) -> Iterator[UOp]:
    for n in self._ids: yield handle(n)
  def __reversed__(self) -> Iterator[UOp]:
    for n in reversed(self._ids): yield handle(n)
  def __getitem__(self, i):
    if isinstance(i, slice): return [handle(n) for n in list(self._ids)[i]]
    return handle(self._ids[i])
  def __contains__(self, u) -> bool:
    if not isinstance(u, UOp): return False
    if self._set is None: self._set = set(self._ids)
    return u._id in self._set
  def __repr__(self): return f"<Walk of {len(self)} nodes>"
  def __reduce__(self):
    from .pickling import reduce_walk
    return reduce_walk(self)
  @property
  def ids(self):
    """The node ids in order (a sequence of ints)."""
    return self._ids


class _Fields:
  """A handle's fields on the pure core; the C core's handles keep them in C (its Handle type, csrc/pyhandle.c)."""
  __slots__ = ("_id", "_op", "_dtype", "_arg", "_tag", "_shape", "_device", "_src", "_m", "__weakref__")


class UOp(CORE.handle_base or _Fields, MathMixin):  # type: ignore[misc]
  """A node: `UOp(op, dtype=None, src=(), arg=None, tag=None)` returns *the* node with those fields."""
  __slots__ = ()

  def __new__(cls, op: Ops, dtype: DType | None = None, src: tuple = (), arg: Any = None, tag: Any = None) -> UOp:
    if type(op) is not Ops:
      if isinstance(op, int) and not isinstance(op, bool) and 0 <= op < len(_OPS): op = _OPS[op]
      else: raise TypeError(f"UOp: op must be an Ops member, got {op!r}")
    if type(src) is not tuple: src = tuple(src) if isinstance(src, (list, tuple)) else (src,)
    for s in src:
      if type(s) is not UOp: raise TypeError(f"{op.name}: sources must be UOps, got {type(s).__name__}")
    if dtype is not None and not isinstance(dtype, DType): raise TypeError(f"{op.name}: dtype must be a DType")
    d, shape, device = INFER[op](op, dtype, src, arg)
    return _make(op, d, src, arg, tag, shape, device)

  def __reduce__(self):  # the graph in pygrad's binary format (pygrad/serialize.py), not a Python object per node
    from .pickling import reduce_uop
    return reduce_uop(self)
  def __copy__(self): return self  # nodes are immutable and hash-consed: a copy is the same node
  def __deepcopy__(self, memo): return self
  def __bool__(self): raise TypeError("a UOp has no truth value: use .where, or compare nodes with `is`")
  def __repr__(self) -> str:  # one line: op, type, arg, sources and graph size (pygrad/listing.py)
    from .listing import summary
    return summary(self)
  def listing(self, full: bool = False) -> str:
    """This graph as text, one line per node (see pygrad.listing)."""
    from .listing import listing
    return listing(self, full)

  # ---- fields: read-only (a handle that disagreed with its node would give silently wrong results) ----
  op = property(attrgetter("_op"), doc="The op (an Ops member).")
  dtype = property(attrgetter("_dtype"), doc="The dtype (a DType).")
  arg = property(attrgetter("_arg"), doc="The arg (an immutable Python value).")
  tag = property(attrgetter("_tag"), doc="The tag (an immutable Python value, usually None).")
  shape = property(attrgetter("_shape"), doc="The shape, a tuple of ints, computed once at creation.")
  device = property(attrgetter("_device"), doc="The device: a str, a tuple of str for MULTI, None for structure.")

  @property
  def src(self) -> tuple[UOp, ...]:
    s = self._src
    if s is None: s = self._src = tuple(map(handle, CORE.src(self._id)))
    return s
  @property
  def ndim(self) -> int: return len(self.shape)
  @property
  def numel(self) -> int:
    n = 1
    for s in self.shape: n *= s
    return n
  @property
  def metadata(self) -> tuple[Metadata, ...]:
    pid = _core_info(self._id)[6]
    return _args_objs[pid] if pid else ()
  @property
  def axis(self):
    """The sharded axis of a MULTI node (None: replicated)."""
    if self.op is not Ops.MULTI: raise ValueError(f"axis: {self.op.name} is not a MULTI node")
    return self.arg
  @property
  def marg(self): return self.arg

  # ---- walks ----
  def toposort(self, gate: Callable[[UOp], bool] | None = None, enter_calls: bool = True) -> Walk:
    """Sources before users, depth-first, sources left to right. `gate(node)` False stops the walk at that node
    (it is not included); with enter_calls False the body (src[0]) of FUNCTION and CALL is not entered."""
    if gate is None: return Walk(CORE.toposort([self._id], enter_calls), self)
    done: dict[int, None] = {}
    stack = [(self, False)]
    while stack:
      n, visited = stack.pop()
      if n._id in done: continue
      if visited:
        done[n._id] = None
        continue
      if not gate(n): continue
      stack.append((n, True))
      s = n.src if enter_calls or n.op not in (Ops.FUNCTION, Ops.CALL) else n.src[1:]
      for x in reversed(s): stack.append((x, False))
    return Walk(list(done), self)

  def substitute(self, mapping: dict[UOp, UOp]) -> UOp:
    """This graph with every node in `mapping` replaced (and every user of a replaced node rebuilt)."""
    if not isinstance(mapping, Mapping):
      raise TypeError(f"substitute: mapping must be a dict of UOp -> UOp, got {type(mapping).__name__}")
    for k, v in mapping.items():
      if type(k) is not UOp or type(v) is not UOp:
        raise TypeError(f"substitute: mapping must be UOp -> UOp, got {type(k).__name__} -> {type(v).__name__}")
    if not mapping: return self
    stop = [k._id for k in mapping]
    rep: dict[int, UOp] = {k._id: v for k, v in mapping.items()}
    for nid in CORE.toposort([self._id], True, stop):
      srcs = CORE.src(nid)
      if not any(s in rep for s in srcs): continue
      u = handle(nid)
      rep[nid] = rebuild(u, tuple(rep.get(s._id, s) for s in u.src))
    return rep.get(self._id, self)

  def simplify(self) -> UOp:
    """This graph with the bundled algebraic rules applied to a fixed point."""
    from .simplify import simplify
    return simplify(self)

  # ---- constructors ----
  @staticmethod
  def const(value, dtype: DType | None = None) -> UOp:
    """A scalar constant: shape (), dtype from the value's type (float→float32, int→int32, bool→bool)."""
    if hasattr(value, "item") and not isinstance(value, UOp): value = value.item()
    if dtype is None:
      if type(value) is bool: dtype = dtypes.bool
      elif type(value) is int: dtype = dtypes.int32
      elif type(value) is float: dtype = dtypes.float32
      else: raise TypeError(f"CONST: value must be a bool, int or float, got {type(value).__name__}")
    elif not isinstance(dtype, DType):
      if isinstance(value, DType): raise TypeError("CONST: the arguments are (value, dtype), got (DType, value)")
      raise TypeError(f"CONST: dtype must be a DType (e.g. dtypes.float32), got {type(dtype).__name__} {dtype!r:.40}")
    return UOp(Ops.CONST, dtype, (), _coerce(value, dtype))

  @staticmethod
  def placeholder(shape, dtype: DType = dtypes.float32, name: str | None = None, device: str = "CPU") -> UOp:
    """An input tensor (BUFFER); every call makes a distinct node."""
    shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
    ok, n = type(device) is str and (name is None or type(name) is str) and type(dtype) is DType, 1
    for s in shape:
      if type(s) is not int: raise TypeError(f"BUFFER: shape must be ints, got {shape!r}")
      if s < 0: ok = False
      n *= s
    arg = (next(_uids), shape, device, name)
    if not ok or dtype is _VOID or n > _INT64_MAX or (n == 0 and shape and max(shape) > _INT64_MAX):
      return UOp(_BUFFER, dtype, (), arg)  # the generic path raises the precise error
    return _buffer(dtype, arg, shape, device, name)

  @staticmethod
  def variable(name: str, vmin, vmax, dtype: DType = dtypes.float32) -> UOp:
    """A scalar input (DEFINE_VAR) named `name` ranging over [vmin, vmax]."""
    return UOp(Ops.DEFINE_VAR, dtype, (), (name, vmin, vmax))

  def const_like(self, value) -> UOp:
    """A constant of this node's dtype and shape (a () CONST broadcast to the shape)."""
    c = UOp.const(value, self.dtype)
    return c if not self.shape else c.reshape((1,) * len(self.shape)).expand(self.shape)

  def param_like(self, slot: int) -> UOp:
    """A PARAM of this node's shape, dtype and device, for function bodies."""
    return UOp(Ops.PARAM, self.dtype, (), (slot, self.shape, self.device))

  @staticmethod
  def maketuple(*srcs: UOp) -> UOp: return UOp(Ops.TUPLE, None, srcs)

  @staticmethod
  def sink(*srcs: UOp) -> UOp: return UOp(Ops.SINK, None, srcs)

  def gettuple(self, i: int) -> UOp: return UOp(Ops.GETTUPLE, None, (self,), i)

  def call(self, *args: UOp, grad_fxn: Callable | None = None, name: str | None = None, precompile: bool = False,
           precompile_backward: bool = False) -> UOp:
    """A FUNCTION with this node (wrapped in a TUPLE unless it is one) as its body over PARAMs, bound to args."""
    body = self if self.op is Ops.TUPLE else UOp.maketuple(self)
    info = CallInfo(grad_fxn, name, precompile, precompile_backward)
    return UOp(Ops.FUNCTION, None, (body, *args), info)

  @staticmethod
  def custom_kernel(*buffers: UOp, fxn: Callable, grad_fxn: Callable | None = None) -> list[UOp]:
    """A CALL running `fxn(*arrays)` on writable arrays of the buffers; returns one AFTER node per buffer."""
    if not callable(fxn): raise TypeError("custom_kernel: fxn must be callable")
    for i, b in enumerate(buffers):
      if type(b) is not UOp: raise TypeError(f"custom_kernel: buffer {i} must be a UOp, got {type(b).__name__} {b!r:.60}")
    kernel = UOp.sink(*[b.param_like(i) for i, b in enumerate(buffers)])
    k = UOp(Ops.CALL, None, (kernel, *buffers), CallInfo(grad_fxn, getattr(fxn, "__name__", None), fxn=fxn))
    return [UOp(Ops.AFTER, None, (b, k)) for b in buffers]

  # ---- gradients ----
  def gradient(self, *targets: UOp, gradient: UOp | None = None) -> list[UOp]:
    """d(self)/d(target) for each target; self must be scalar unless `gradient` (the incoming grad) is given."""
    from .gradient import gradient as _gradient
    return _gradient(self, targets, gradient)


def _py_hnew(nid: int, op: Ops, dtype: DType, arg, tag, shape: tuple, device, meta: int) -> UOp:
  """A new handle with these fields and _src None (not yet published in the registry)."""
  o = _new_handle(UOp)
  o._id, o._op, o._dtype, o._arg, o._tag, o._shape, o._device, o._src, o._m = \
    nid, op, dtype, arg, tag, shape, device, None, meta
  return o


def _publish(nid: int, op: Ops, dtype: DType, arg, shape: tuple, device, meta: int):
  """The new handle of node nid, published, taking over the caller's new reference; nid itself if the registry
  has an entry for it (the caller finishes with _wrap), or a negative code as it is."""
  if nid < 0 or nid in _handles: return nid
  o = _hnew(nid, op, dtype, arg, None, shape, device, meta)
  w = _Ref(o, _on_dead)
  w.nid = nid
  return o if _claim(nid, w) is w else _register(o, w, nid)


def _py_unary(op: Ops, dtype: DType, did: int, x: UOp):
  return _publish(_make1(op, did, x._id, 0, 0, x._m), op, dtype, None, x._shape, x._device, x._m)


def _py_binary(op: Ops, dtype: DType, did: int, a: UOp, b: UOp):
  return _publish(_make2(op, did, a._id, b._id, 0, 0, a._m), op, dtype, None, a._shape, a._device, a._m)


def _py_binaryk(op: Ops, dtype: DType, did: int, a: UOp, kdid: int, karg: int, kmeta: int, reverse: int):
  return _publish(_make2k(op, did, a._id, kdid, karg, kmeta, reverse, a._m), op, dtype, None, a._shape, a._device,
                  a._m)


def _py_moved(op: Ops, dtype: DType, did: int, x: UOp, arg, aid: int, shape: tuple, meta: int):
  try: nid = _make1(op, did, x._id, aid, 0, meta)
  except ArgGone: return _ERR_GONE  # the pure core raises where the C core returns the code
  return _publish(nid, op, dtype, arg, shape, x._device, meta)


def _py_leaf(op: Ops, dtype: DType, did: int, arg, aid: int, shape: tuple, device, meta: int):
  try: nid = _core_make(op, did, (), aid, 0, meta)
  except ArgGone: return _ERR_GONE  # the pure core raises where the C core returns the code
  return _publish(nid, op, dtype, arg, shape, device, meta)


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


# The math methods' fast path in one call each (csrc/pymake.c on the C core): make the node and, if Python has no
# handle for it, make the handle and publish it (see _publish for what comes back otherwise). The C core also makes
# any handle in one call (csrc/pyhandle.c): ~200 ns field by field from Python.
def _registered(nid: int) -> bool:
  """Whether the registry holds a live handle of node nid."""
  r = _handles.get(nid)
  return r is not None and r() is not None


_meth_md = _leaf_maker = _tmpl_install = _prog_cap = None  # (the C core's, below)
if CORE.makers is None:
  _hnew = _py_hnew
  _mk_unary, _mk_binary, _mk_binaryk, _mk_moved, _mk_leaf = _py_unary, _py_binary, _py_binaryk, _py_moved, _py_leaf
  _cached = _py_cached
else:
  # The C core keeps the registry in C (csrc/pyreg.c): each node id's slot holds a borrowed pointer to its live
  # handle, and a handle's dealloc empties the slot and queues its core reference for release (in the batches of
  # pygrad/core/release.py, so both cores free nodes in the same order). _handles stays empty; these replace the
  # Python forms above, which weighed a weak reference object and a dict entry per handle.
  _hnew = CORE.handle_ctor(UOp)  # (an unpublished handle: no registry entry, no core reference)
  _mk_unary, _mk_binary, _mk_binaryk, _mk_moved, _mk_leaf, _cached_maker, _cwrap, _lookup, CORE.flush_handles, \
    _cwrap_many, _meth_install, _meth_md, _leaf_maker, _tmpl_install, _prog_cap = CORE.makers(UOp)
  _cached = _cached_maker(_moved)

  def _wrap(nid: int, op: Ops, dtype: DType, arg, tag, shape, device, meta: int) -> UOp:  # noqa: F811
    """The unique handle of a node the caller holds one new reference on (dropped if a handle exists already)."""
    o = _cwrap(nid, op, dtype, arg, tag, shape, device, meta)
    if _md_open: _attach_current(o)
    return o

  def handle(nid: int) -> UOp:  # noqa: F811
    """The handle of a live node id (made now if Python has none)."""
    o = _lookup(nid)
    if o is not None: return o
    op, dt, _, aid, tid, mid, _ = _core_info(nid)
    _core_incref(nid)
    shape, device = _meta_vals[mid]
    return _cwrap(nid, _OPS[op], BY_ID[dt], _args_objs[aid], _args_objs[tid] if tid else None, shape, device, mid)

  def adopt(nid: int, op: Ops, dtype: DType, arg, tag, meta: int) -> UOp:  # noqa: F811
    """handle(nid) for a node whose fields the caller knows, taking over a reference the caller holds on it."""
    shape, device = _meta_vals[meta]
    return _cwrap(nid, op, dtype, arg, tag, shape, device, meta)

  def adopt_rows(ids: bytes, metas: bytes, ops: bytes, dts: bytes, args: bytes, tags: bytes) -> list[UOp]:
    """adopt for many nodes in one C call (csrc/pyreg.c): int32 columns as bytes, args and tags interned ids (a
    loader's roots: through adopt, ~0.5 us each)."""
    return _cwrap_many(ids, metas, ops, dts, args, tags, _OPS, BY_ID, _args_objs, _meta_vals)

  def _registered(nid: int) -> bool:  # noqa: F811
    """Whether the registry holds a live handle of node nid."""
    return _lookup(nid) is not None
_KEEP_DTYPE = frozenset({Ops.CAST, Ops.BITCAST, Ops.CONST, Ops.DEFINE_VAR, Ops.BUFFER, Ops.PARAM})


def rebuild(u: UOp, src: tuple) -> UOp:
  """u with new sources (its dtype inferred again unless the op fixes it)."""
  return UOp(u.op, u.dtype if u.op in _KEEP_DTYPE else None, src, u.arg, u.tag)


def live_nodes() -> int:
  """How many nodes the core holds now."""
  return CORE.live()


def core_name() -> str:
  """'c' or 'python': the core this process runs."""
  return CORE.name


_NONE: dict = {}
_UNARY_OK, _BINARY_OUT = dtype_tables()
from . import mathops as _mathops  # noqa: E402
_META0 = META.get((), None)
from .fastmethods import unary_method, binary_method, install_c  # noqa: E402
_made = _mathops._bind(UOp, alu2, const, movement, node, unary_method, binary_method, _cached)


if _meth_md is not None: install_c(UOp, _made, _meth_install, _tmpl_install)
del _made
if _leaf_maker is not None:
  # UOp.placeholder's common case in one C call (csrc/pyleaf.c): the same steps as placeholder and _buffer, falling
  # back to them for anything else; a builtin set on the class is not bound to instances, as a staticmethod is not
  UOp.placeholder = _leaf_maker((_uids, META.ids, ARGS, Ops.BUFFER, dtypes.void, dtypes.float32,
                                 lambda d, a: UOp(Ops.BUFFER, d, (), a), UOp.__dict__["placeholder"].__func__, _INTS,
                                 "CPU"))
if CORE.programs:  # multi-node methods instantiate cached programs in one C call (pygrad/templates.py)
  from . import templates as _templates  # noqa: E402
  _templates.install(UOp)
__all__ = ["UOp", "Walk", "CallInfo", "Metadata", "metadata", "current_metadata", "handle", "rebuild", "alu1", "alu2",
           "alu2k", "movement", "node", "const", "live_nodes", "core_name"]
