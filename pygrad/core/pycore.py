"""The pure-Python core: the same node store and walks as csrc/, in Python. It is the reference for the C core:
same ids-in, ids-out interface, same identity rules, same walk orders."""
from __future__ import annotations
import threading
from ..ops import Ops
from .release import deferred

_CALLS = (int(Ops.FUNCTION), int(Ops.CALL))
_DETACH = int(Ops.DETACH)
_CONST = int(Ops.CONST)
_ERR_ARG_GONE = -3  # csrc/pygrad.h's PG_ERR_ARG_GONE


class ArgGone(Exception):
  """An interned arg id was released between its lookup and its use; the caller interns it again."""


class PyCore:
  """Hash-consed nodes addressed by integer id. A node holds op, dtype, sources, arg id, tag id, meta id (interned
  shape/device) and a pdata id (side data such as metadata). Ids > 0 of args, tags and pdata are counted: when the
  last node naming one is freed it is queued, and `arg_drain` hands it back to the interner. An id's low
  `arg_slot_bits` bits are the slot of its count, the bits above a generation: the interner reuses a drained id's
  slot with the next generation, so the counts stay as many as the ids alive at once, and an id held across its
  drain reads as gone whether or not its slot holds a later id now."""
  name = "python"
  # the C core's handle type and calls (handles.py and the tinygrad interop have Python forms)
  handle_base = handle_ctor = makers = foreign_rows = foreign_walk = rows_columns = argkeys = None
  arg_slot_bits = 24  # csrc/tables.h's PG_ARG_SLOT_BITS
  free_order_min = 16384  # and its PG_FREE_ORDER_MIN

  def __init__(self):
    self._table: dict[tuple, int] = {}
    self._key: list = []
    self._rc: list[int] = []
    self._src: list[tuple[int, ...]] = []
    self._info: list = []  # (op, dtype, nsrc, arg, tag, meta) per id
    self._pdata: list[int] = []
    self._free: list[int] = []
    self._argrc: list[int] = [0]  # per slot: the count of its id, -1 once drained
    self._argid: list[int] = [0]  # per slot: the id registered in it
    self._slot = (1 << self.arg_slot_bits) - 1
    self._dead: list[int] = []
    self._live = 0
    # every change of the store under one reentrant lock: counts are read-modify-write, and a handle's finalizer
    # may decref on this very thread in the middle of a make (a collection triggered by an allocation)
    self._lock = threading.RLock()
    self.release, self.flush = deferred(self.decref_many)

  # ---- store ----
  def make(self, op: int, dtype: int, src: tuple[int, ...], arg: int, tag: int, meta: int) -> int:
    """The node with these fields, with one new reference for the caller."""
    with self._lock:
      key = (op, dtype, src, arg, tag)
      nid = self._table.get(key)
      if nid is not None:
        self._rc[nid] += 1
        return nid
      argrc, m = self._argrc, self._slot
      if (arg and self._arg_gone(arg)) or (tag and self._arg_gone(tag)): raise ArgGone()
      if arg: argrc[arg & m] += 1
      if tag: argrc[tag & m] += 1
      rc = self._rc
      for s in src: rc[s] += 1
      info = (op, dtype, len(src), arg, tag, meta)
      if self._free:
        nid = self._free.pop()
        self._key[nid], rc[nid], self._src[nid], self._info[nid], self._pdata[nid] = key, 1, src, info, 0
      else:
        nid = len(rc)
        self._key.append(key); rc.append(1); self._src.append(src); self._info.append(info); self._pdata.append(0)  # noqa: E702
      self._table[key] = nid
      self._live += 1
      return nid

  def make1(self, op: int, dtype: int, s0: int, arg: int, tag: int, meta: int) -> int:
    """make with one source (the fixed-arity hot path; same result as make)."""
    return self.make(op, dtype, (s0,), arg, tag, meta)

  def make2(self, op: int, dtype: int, s0: int, s1: int, arg: int, tag: int, meta: int) -> int:
    """make with two sources."""
    return self.make(op, dtype, (s0, s1), arg, tag, meta)

  def make2k(self, op: int, dtype: int, s: int, kdtype: int, karg: int, kmeta: int, reverse: int, meta: int) -> int:
    """op over node s and the CONST (kdtype, karg, kmeta), made or found first: op(s, k), or op(k, s) if reverse;
    a negative code (ArgGone's) if karg is gone. The constant's own new reference is dropped again."""
    with self._lock:
      try: k = self.make(_CONST, kdtype, (), karg, 0, kmeta)
      except ArgGone: return _ERR_ARG_GONE
      r = self.make(op, dtype, (k, s) if reverse else (s, k), 0, 0, meta)
      self.decref(k)
      return r

  def incref(self, nid: int) -> None:
    with self._lock: self._rc[nid] += 1

  def decref(self, nid: int) -> None:
    with self._lock:
      rc = self._rc
      rc[nid] -= 1
      if rc[nid]: return
      stack = [nid]  # freeing is iterative: a 1,000,000-deep chain frees without recursion
      while stack:
        n = stack.pop()
        del self._table[self._key[n]]
        info = self._info[n]
        for aid in (info[3], info[4], self._pdata[n]):
          if aid: self._arg_release(aid)
        for s in self._src[n]:
          rc[s] -= 1
          if rc[s] == 0: stack.append(s)
        self._key[n], self._src[n], self._info[n], self._pdata[n] = None, (), None, 0
        self._free.append(n)
        self._live -= 1

  def decref_many(self, ids: list[int]) -> None:
    """decref each id in order (the handles that died since the last flush: pygrad/core/release.py)."""
    with self._lock:
      for nid in ids: self.decref(nid)

  def info(self, nid: int) -> tuple[int, int, int, int, int, int, int]:
    """(op, dtype, nsrc, arg, tag, meta, pdata) of a node."""
    return self._info[nid] + (self._pdata[nid],)

  def src(self, nid: int) -> tuple[int, ...]: return self._src[nid]

  def rows(self, ids, arrays: bool = False) -> tuple[list, list[int]]:
    """info() of every node of `ids` as a list of 7-element lists, and their src() all concatenated in order (the
    planner reads a whole graph at once). arrays: as numpy int32 arrays (n x 7, and flat) instead of lists."""
    info, src, pdata, n = self._info, self._src, self._pdata, len(self._info)
    rows = []
    for i in ids:
      r = info[i] if type(i) is int and 0 <= i < n else None
      if r is None: raise ValueError(f"pygrad core: rows: {i!r} is not a live node id")
      rows.append([*r, pdata[i]])
    flat = [s for i in ids for s in src[i]]
    if arrays:
      import numpy as np
      return np.array(rows, np.int32).reshape(-1, 7), np.array(flat, np.int32)
    return rows, flat

  def set_pdata(self, nid: int, pid: int) -> None:
    with self._lock:
      if pid and self._arg_gone(pid): raise ArgGone()
      old = self._pdata[nid]
      if pid: self._argrc[pid & self._slot] += 1
      self._pdata[nid] = pid
      if old: self._arg_release(old)

  def live(self) -> int:
    self.flush()
    return self._live

  def id_bound(self) -> int:
    """One past the largest node id handed out so far (every live id is below it)."""
    return len(self._rc)

  def free_order(self, k: int) -> None:
    """The next k ids that makes recycle are taken in ascending order (a bulk builder's rows then sit on ascending
    nodes; csrc/store_impl.h says why), when k >= free_order_min; the same ids as the C core's."""
    with self._lock:
      f = self._free
      if k < self.free_order_min or len(f) < 2: return
      lo = max(len(f) - k, 0)
      f[lo:] = sorted(f[lo:], reverse=True)

  def _arg_gone(self, aid: int) -> bool:
    """Whether a registered id was drained (or its slot reused); ValueError for an id never registered."""
    k = aid & self._slot
    if aid < 0 or k == 0 or k >= len(self._argrc): raise ValueError(f"arg id {aid} was never registered")
    return self._argid[k] != aid or self._argrc[k] < 0

  def _arg_release(self, aid: int) -> None:
    k = aid & self._slot
    self._argrc[k] -= 1
    if self._argrc[k] == 0: self._dead.append(aid)

  def arg_register(self, aid: int) -> None:
    """Count aid (from 0); its slot must be new, drained, or aid's own (ValueError otherwise)."""
    with self._lock:
      argrc, argid, k = self._argrc, self._argid, aid & self._slot
      if not 0 < aid < 1 << 31 or k == 0: raise ValueError(f"arg_register: bad arg id {aid}")
      if k < len(argrc) and argid[k] != aid and argrc[k] >= 0:
        raise ValueError(f"arg_register: arg id {aid}'s slot holds the live id {argid[k]}")
      while len(argrc) <= k:  # slots in between count as registered with generation 0, as in the C core
        argid.append(len(argrc))
        argrc.append(0)
      argrc[k], argid[k] = 0, aid

  def arg_drain(self) -> list[int]:
    """Ids whose last user was freed; they are marked gone (a later `make` naming one raises ArgGone)."""
    self.flush()
    with self._lock:
      out = []
      for aid in self._dead:
        k = aid & self._slot
        if self._argrc[k] == 0 and self._argid[k] == aid:
          self._argrc[k] = -1
          out.append(aid)
      self._dead.clear()
      return out

  # ---- template programs and gradient runs: only the C core has them (math methods then build their nodes
  # directly, and pygrad.gradient runs every rule directly) ----
  programs = False
  grad_runs = False

  # ---- walks ----
  def toposort(self, roots: list[int], enter_calls: bool = True, stop: list[int] | tuple = ()) -> list[int]:
    """Sources before users: depth-first, sources left to right, each node after all of its sources. Nodes in
    `stop` are neither included nor descended into; with enter_calls False the body (src[0]) of FUNCTION and CALL
    is skipped."""
    done: dict[int, None] = {}
    stopset = set(stop)
    srcs, info = self._src, self._info
    for root in roots:
      stack = [(root, False)]
      while stack:
        n, visited = stack.pop()
        if n in done: continue
        if visited:
          done[n] = None
          continue
        if n in stopset: continue
        stack.append((n, True))
        s = srcs[n]
        if not enter_calls and info[n][0] in _CALLS: s = s[1:]
        for x in reversed(s): stack.append((x, False))
    return list(done)

  def deepwalk(self, root: int, targets: list[int], enter_calls: bool = True) -> tuple[list[int], list[int]]:
    """The seeds' `_deepwalk`: nodes with a source that is a target or on a target path are on the path. Returns
    (walk: the path in toposort order less DETACH nodes, path: every node on the path). With enter_calls False,
    FUNCTION/CALL bodies are neither walked nor count as sources."""
    tset = set(targets)
    on: dict[int, bool] = {}
    srcs, info = self._src, self._info
    walk, path = [], []
    for n in self.toposort([root], enter_calls):
      m = False
      s_n = srcs[n] if enter_calls or info[n][0] not in _CALLS else srcs[n][1:]
      for s in s_n:
        if s in tset or on.get(s, False):
          m = True
          break
      on[n] = m
      if m:
        path.append(n)
        if self._info[n][0] != _DETACH: walk.append(n)
    return walk, path
