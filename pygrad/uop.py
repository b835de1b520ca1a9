"""UOp: a handle on one hash-consed node of the core. Handles are made lazily (a node made inside a core pass has
no Python object until Python asks for it), unique per node while alive (so `is` is node identity), and each owns
one core reference, dropped when the handle dies. This module holds the node (UOp, its walks) and the metadata
state every node maker reads; the handle registry and the core's one-call makers are pygrad/handles.py, the node
makers pygrad/make.py, both imported at the end (they need UOp) and their public names kept here."""
from __future__ import annotations
import itertools, contextlib, contextvars, threading, traceback
from dataclasses import dataclass
from operator import attrgetter
from collections.abc import Mapping
from typing import Any, Callable, Iterator
from .ops import Ops
from .dtype import DType, dtypes, coerce as _coerce
from .core import CORE, ArgGone
from .intern import _INTS, ARGS, META
from .shapes import INFER
from .mathops import MathMixin

_core_info = CORE.info
_args_get, _args_objs = ARGS.get, ARGS.objs
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

  def substitute(self, mapping: dict[UOp, UOp], enter_calls: bool = True) -> UOp:
    """This graph with every node in `mapping` replaced (and every user of a replaced node rebuilt). With
    enter_calls False the bodies (src[0]) of FUNCTION and CALL are left as they are, as toposort's: a body's PARAMs
    are its own scope's, and may be the same hash-consed nodes as an enclosing body's."""
    if not isinstance(mapping, Mapping):
      raise TypeError(f"substitute: mapping must be a dict of UOp -> UOp, got {type(mapping).__name__}")
    for k, v in mapping.items():
      if type(k) is not UOp or type(v) is not UOp:
        raise TypeError(f"substitute: mapping must be UOp -> UOp, got {type(k).__name__} -> {type(v).__name__}")
    if not mapping: return self
    stop = [k._id for k in mapping]
    rep: dict[int, UOp] = {k._id: v for k, v in mapping.items()}
    for nid in CORE.toposort([self._id], enter_calls, stop):
      srcs = CORE.src(nid)
      if not any(s in rep for s in srcs): continue
      u = handle(nid)
      keep = 0 if enter_calls or u.op not in (Ops.FUNCTION, Ops.CALL) else 1  # (the body, kept as it is)
      rep[nid] = rebuild(u, u.src[:keep] + tuple(rep.get(s._id, s) for s in u.src[keep:]))
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


# The registry and the node makers read this module's metadata state and the class, so they come once both exist.
# Their names stay reachable here: other modules name pygrad.uop.handle, adopt and the makers, and the tests and
# bench/bench_core.py some private ones (_wrap, _hnew, _registered, _mk_*, _cached, _moved, the dtype tables).
from .handles import (handle, adopt, _wrap, _hnew, _registered, _mk_unary, _mk_binary, _mk_binaryk,  # noqa: E402,F401
                      _mk_moved, _meth_install, _meth_md, _leaf_maker, _tmpl_install)
if CORE.makers is not None: from .handles import adopt_rows  # noqa: E402,F401
from .make import (_make, _buffer, _cached, _moved, _UNARY_OK, _BINARY_OUT, alu1, alu2, alu2k,  # noqa: E402,F401
                   movement, node, const)
from . import mathops as _mathops  # noqa: E402
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
