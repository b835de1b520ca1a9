"""Small kernels keyed in C (csrc/kkey.c): kcache.walked_key's key made from the C walk's buffers, with no Python
object per kernel once its leaves' nodes and movements have been seen. A leaf's load is its node's buffer and a
*view class* (the load's op, dtype, constant, storage type and view, interned here: equal classes over one buffer
are one load), with its pending movements applied; Python registers a node's buffer and class when a walk first
reads it, and what a class becomes under a cell of movements (kcache._leaf, as walked_key reads it) once per plan.
C numbers a kernel's loads and buffers, builds its key and interns it as a class: equal classes, equal walked_key
keys, so a class's first kernel is lowered (KernelCache._miss) and every later one gets those words with its own
buffers."""
from __future__ import annotations
from operator import attrgetter
from .kwalk import Walk
from .records import Buf
from .views import View

_ID, _KIND, _STYPE_ID = attrgetter("id"), attrgetter("kind"), attrgetter("stype.id")
_SMALL = 64  # outputs for kernels of up to this many entries (the cache's bound; the caller checks it)


class KKey:
  """One plan's key state: the C state, the output buffers of a make, the view classes (`vinfo`: per class the
  load's (view, dtype)), and the ids of heads and index spaces."""

  def __init__(self, walk: Walk, sig: list[int]):
    import numpy as np
    from .vmlib import ffi, lib
    self.ffi, self.lib, self.walk = ffi, lib, walk
    self.out_cap = _SMALL  # (the most entries, and loads, of a kernel keyed here)
    self.sig = np.array(sig, np.int64)
    self.n = len(self.sig)
    st = lib.pg_kkey_new(self.n)
    if st == ffi.NULL: raise MemoryError(f"pygrad planner: no memory for the kernel keys of {self.n} nodes")
    self.st = ffi.gc(st, lib.pg_kkey_free)
    self._sig = ffi.from_buffer("int64_t[]", self.sig)
    self._out = ffi.from_buffer("int32_t[]", walk.out)
    new = ffi.new
    self.codes, self.lbuf, self.lvid = new("int64_t[]", _SMALL), new("int32_t[]", _SMALL), new("int32_t[]", _SMALL)
    self.bufs, self.miss, self.info = new("int32_t[]", _SMALL + 1), new("int32_t[]", _SMALL), new("int64_t[]", 4)
    self.obuf, self.ovid = new("int32_t[]", [-1] * _SMALL), new("int32_t[]", [-1] * _SMALL)
    # (the walk's buffers and the graph's operand counts, walk._args[0], are the walk's: held through self.walk)
    rc = lib.pg_kkey_bind(self.st, self._out, len(walk.out) // 3, ffi.from_buffer("int32_t[]", walk.out_src),
                          len(walk.out_src), walk._args[0], self._sig, self.obuf, self.ovid, _SMALL, self.codes,
                          self.lbuf, self.lvid, self.bufs, self.miss, self.info)
    if rc < 0: raise RuntimeError(f"pygrad planner: the kernel keys' arrays were refused ({rc})")
    self.vids: dict = {}  # a view class's identity -> its id
    self.vinfo: list = []  # per view class: (view, dtype)
    self.heads: dict = {}  # (head, store's storage type, store's view key) -> (head id, index space id)
    self.spaces: dict = {}  # index space -> its id
    self.tmpl: dict = {}  # class -> its Template, or None (the VM cannot take it)
    self.direct, self.ndirect = [], 0  # (engine/kbatch.py's: per class, its kernels' ids are its words' ids)
    self.vcache: dict = {}  # id(view) -> (view, {(dtype, buffer's storage type): class}) (non-constant buffers)

  def nodes(self, flat, at: list[int]) -> None:
    """Registers the buffer and view class of the nodes at (each has a view: every leaf a walk can reach), at once:
    a kernel reading a new buffer then needs no Python. A view object shared by many nodes (View.contiguous's,
    the planner's memo of movements) is classified once per dtype and storage type."""
    cols = getattr(flat, "vcols", None)
    if cols is not None: return self._nodes_cols(flat, cols, at)
    bufs, vids, vc = [], [], self.vcache
    for x in at:
      n = flat[x]
      b, v = n.view
      bufs.append(b.id)
      if b.kind == "const":
        vids.append(self._vid(b, v, n.dtype))
        continue
      e = vc.get(id(v))
      if e is None: e = vc[id(v)] = (v, {})  # (the view held: its id is not reused while cached)
      k = (n.dtype, b.stype)
      i = e[1].get(k)
      if i is None: i = e[1][k] = self._vid(b, v, n.dtype)
      vids.append(i)
    arr = self.ffi.new
    rc = self.lib.pg_kkey_nodes(self.st, len(at), arr("int32_t[]", at), arr("int32_t[]", bufs), arr("int32_t[]", vids))
    if rc < 0: raise RuntimeError(f"pygrad planner: the nodes' views were refused ({rc})")

  def _nodes_cols(self, flat, cols, at: list[int]) -> None:
    """nodes' registration from the planner's columns (sweep.py: per node its view's buffer id and class), a class
    of leaves at a time: those of one class, dtype and buffer's storage type (or constant buffer) are one view
    class, numbered in the order the node by node loop meets them."""
    import numpy as np
    from ..dtype import BY_ID
    bid, vcl, views, bl = cols
    at = np.asarray(at, np.int64)
    b = bid[at]
    dts = self.walk.g.dt_ids[at]  # (the graph's column: flat._dts is the same as a list)
    # per buffer: its own id when a constant (the class holds its value), else -1 - its storage type's id
    isc = np.fromiter(map("const".__eq__, map(_KIND, bl)), bool, len(bl))
    bkey = np.where(isc, np.fromiter(map(_ID, bl), np.int64, len(bl)),
                    -1 - np.fromiter(map(_STYPE_ID, bl), np.int64, len(bl)))[b]
    nd, nv = len(BY_ID) + 1, len(views) + 1
    first, inv = np.unique(((bkey + nd) * nv + vcl[at]) * nd + dts, return_index=True, return_inverse=True)[1:]
    by = np.empty(len(first), np.int32)
    for k in np.argsort(first, kind="stable").tolist():
      x = int(first[k])
      by[k] = self._vid(bl[int(b[x])], views[int(vcl[at[x]])], BY_ID[int(dts[x])])
    vids = by[inv.reshape(-1)]
    bufs = b.astype(np.int32)
    cp = self.ffi.from_buffer
    ati = at.astype(np.int32)
    rc = self.lib.pg_kkey_nodes(self.st, len(ati), cp("int32_t[]", ati), cp("int32_t[]", bufs), cp("int32_t[]", vids))
    if rc < 0: raise RuntimeError(f"pygrad planner: the nodes' views were refused ({rc})")

  def make(self, pl, m: int, nsrc: int, head: tuple, sbuf: Buf, sview: View, top, kshape, leaf) -> int:
    """The class of the kernel the walk's buffers hold (m <= 64 entries, nsrc operands). Leaves C misses are
    registered (_register) and the key made again."""
    h = self.head(head, sbuf.stype, sview)
    lib = self.lib
    c = lib.pg_kkey_make(self.st, m, nsrc, 0, h[1], h[0], sbuf.id)
    if c == lib.PG_KKEY_MISS:
      missed = self._register(pl, h[1], top, kshape, leaf)
      c = lib.pg_kkey_make(self.st, m, nsrc, 1, h[1], h[0], sbuf.id)
      for e in missed: self.obuf[e] = self.ovid[e] = -1
    if c < 0:
      if c == lib.PG_ERR_NOMEM: raise MemoryError("pygrad planner: no memory for a kernel's key")
      raise RuntimeError(f"pygrad planner: a kernel's key was refused ({c}) at a {len(kshape)}-d index space")
    return c

  def head(self, head: tuple, stype, sview: View) -> tuple[int, int]:
    """(head id, index space id) of a kernel's head (index space, reduce op, reduced axes, result dtype) storing
    through sview into a buffer of storage type stype."""
    hk = (head, stype, sview.key())
    h = self.heads.get(hk)
    if h is None:
      h = self.heads[hk] = (len(self.heads), self.spaces.setdefault(head[0], len(self.spaces)))
    return h

  def _vid(self, b: Buf, v: View, dtype) -> int:
    """The view class of a load of buffer b through v as dtype: what walked_key's key piece holds (a constant's
    value when the load is a broadcast constant), and the constant's value of any constant buffer (so that a
    class's movements give one class whichever buffer they read)."""
    cv = b.data.item() if b.kind == "const" else None
    k = (v.key(), dtype, b.stype, cv, cv is not None and v.is_scalar())
    i = self.vids.get(k)
    if i is None:
      i = self.vids[k] = len(self.vinfo)
      self.vinfo.append((v, dtype))
    return i

  def _register(self, pl, space: int, top, kshape, leaf) -> list[int]:
    """The leaves the last make missed, in entry order (as walked_key reads them): each node's buffer and view class
    registered, and its cell's view read with leaf (kcache._leaf: it emits a copy kernel when a RESHAPE cannot be a
    view, and fills its memo when the view may be kept: then registered for the plan). Each missed entry's load is
    also passed to the next make (obuf, ovid: a copy's is that make's only). Returns the missed entries."""
    lib, st, out, flat = self.lib, self.st, self._out, pl.flat
    missed = self.ffi.unpack(self.miss, self.info[0])
    for e in missed:
      x, c = out[3 * e], out[3 * e + 1]
      n = flat[x]
      b, v = n.view
      vid = self._vid(b, v, n.dtype)
      if lib.pg_kkey_node(st, x, b.id, vid) < 0: raise RuntimeError(f"pygrad planner: node {x} was refused")
      if c:
        memo: dict = {}
        b, _, _, (_, v2, dt) = leaf(pl, n, c, self.walk.pycells, top, kshape, memo, 0)
        vid2 = self._vid(b, v2, dt)
        if 0 in memo:  # (not a copy)
          rc = lib.pg_kkey_view(st, vid, c, space, vid2)
          if rc < 0: raise MemoryError("pygrad planner: no memory for a kernel's views")
        vid = vid2
      self.obuf[e], self.ovid[e] = b.id, vid
    return missed
