"""How a node id gets its one Python handle: the registry of live handles (node id -> handle, so `is` is node
identity) and the one-call makers that make a node and publish its handle, in the form of the core this process runs.
On the pure core both are the Python functions below (the registry a dict of weak references); on the C core they
come from C (csrc/pyreg.c, pymake.c, pyhandle.c, pyleaf.c), and the Python forms are not used. uop.py imports this
module at its end (it needs the UOp class) and takes the registry's functions from here, as make.py and
fastmethods.py take the makers."""
from __future__ import annotations
import weakref
from _weakref import _remove_dead_weakref  # type: ignore[import-not-found]  # CPython's, as WeakValueDictionary
from .ops import Ops
from .dtype import DType, BY_ID
from .core import CORE, ArgGone
from .intern import ARGS, META
from . import uop as _u  # its metadata state, read live (_md_open is rebound as blocks open and close)
from .uop import UOp

_handles: dict[int, weakref.ref] = {}
_core_make, _core_decref, _core_incref, _core_info = CORE.make, CORE.decref, CORE.incref, CORE.info
_core_release = CORE.release
_make1, _make2, _make2k = CORE.make1, CORE.make2, CORE.make2k
_ERR_GONE = -3  # a core make's code for an arg id drained meanwhile (csrc/pygrad.h PG_ERR_ARG_GONE)
_args_objs, _meta_vals = ARGS.objs, META.vals
_new_handle, _claim = object.__new__, _handles.setdefault
_OPS = tuple(Ops)


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


def _py_hnew(nid: int, op: Ops, dtype: DType, arg, tag, shape: tuple, device, meta: int) -> UOp:
  """A new handle with these fields and _src None (not yet published in the registry)."""
  o = _new_handle(UOp)
  o._id, o._op, o._dtype, o._arg, o._tag, o._shape, o._device, o._src, o._m = \
    nid, op, dtype, arg, tag, shape, device, None, meta
  return o


def _wrap(nid: int, op: Ops, dtype: DType, arg, tag, shape, device, meta: int) -> UOp:
  """The unique handle of a node the caller holds one new reference on (dropped if a handle exists already)."""
  r = _handles.get(nid)
  if r is not None:
    o = r()
    if o is not None:
      _core_decref(nid)
      if _u._md_open: _u._attach_current(o)
      return o
  o = _hnew(nid, op, dtype, arg, tag, shape, device, meta)
  w = _Ref(o, _on_dead)
  w.nid = nid
  if _claim(nid, w) is not w: o = _register(o, w, nid)
  if _u._md_open: _u._attach_current(o)
  return o


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


def _registered(nid: int) -> bool:
  """Whether the registry holds a live handle of node nid."""
  r = _handles.get(nid)
  return r is not None and r() is not None


# The math methods' fast path in one call each (csrc/pymake.c on the C core): make the node and, if Python has no
# handle for it, make the handle and publish it (see _publish for what comes back otherwise). The C core also makes
# any handle in one call (csrc/pyhandle.c): ~200 ns field by field from Python.
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


_meth_install = _meth_md = _leaf_maker = _tmpl_install = _prog_cap = _cached_maker = None  # (the C core's, below)
if CORE.makers is None:
  _hnew = _py_hnew
  _mk_unary, _mk_binary, _mk_binaryk, _mk_moved, _mk_leaf = _py_unary, _py_binary, _py_binaryk, _py_moved, _py_leaf
else:
  # The C core keeps the registry in C (csrc/pyreg.c): each node id's slot holds a borrowed pointer to its live
  # handle, and a handle's dealloc empties the slot and queues its core reference for release (in the batches of
  # pygrad/core/release.py, so both cores free nodes in the same order). _handles stays empty; these replace the
  # Python forms above, which weighed a weak reference object and a dict entry per handle.
  _hnew = CORE.handle_ctor(UOp)  # (an unpublished handle: no registry entry, no core reference)
  _mk_unary, _mk_binary, _mk_binaryk, _mk_moved, _mk_leaf, _cached_maker, _cwrap, _lookup, CORE.flush_handles, \
    _cwrap_many, _meth_install, _meth_md, _leaf_maker, _tmpl_install, _prog_cap = CORE.makers(UOp)

  def _wrap(nid: int, op: Ops, dtype: DType, arg, tag, shape, device, meta: int) -> UOp:  # noqa: F811
    """The unique handle of a node the caller holds one new reference on (dropped if a handle exists already)."""
    o = _cwrap(nid, op, dtype, arg, tag, shape, device, meta)
    if _u._md_open: _u._attach_current(o)
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
