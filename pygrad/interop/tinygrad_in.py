"""tinygrad -> pygrad: a tinygrad graph as a node table made in one bulk build (see pygrad/interop/tinygrad.py)."""
from __future__ import annotations
import itertools, weakref
import numpy as np
from pygrad import UOp, Metadata
from pygrad.uop import handle
from pygrad.builder import _build
from pygrad.core import CORE
from .tinygrad_tables import AddrSpace, ParamArg, TOps, TUOp, _AFTER, _ALU_I, _ASSIGN, _BCAST, _BITCAST, _BOOL, \
  _BUFFER, _CALL, _CAST, _CMP, _CONST, _CONTIGUOUS, _COPY, _DEFINE_VAR, _DT, _DTI, _EXPAND, _EXPANDOP, _FLIP, \
  _FUNCTION, _GETTUPLE, _INFO, _MD_IN, _MOVE, _NOOP, _NOWANT, _OP, _PAD, _PARAM, _PERMUTE, _REDUCE, _REDUCEOP, \
  _RESHAPE, _ROP, _SAME_I, _SHAPED_MOVE, _SHRINK, _SINK, _TG, _TUPLE, _VOID, _WEAK, _ints, _is_assign, \
  _operand_want, _param_view, _pcallinfo, _pdtype, _tg_metadata, _value_srcs, tdtypes, _ASSIGN_P

_MD_IN1: dict = {}  # (name, backward) of tinygrad's Metadata -> pygrad's metadata 1-tuple
_MD_LONG: list = [None]  # the last metadata tuple of several entries _md_in read, and its distinct (name, backward)
_wref = weakref.ref
_SHN = "_RECURSIVE_PROPERTY__shape"  # where tinygrad caches a node's _shape (read directly: its property is a frame)
_DVN = "_RECURSIVE_PROPERTY_device"  # and its device (read there by the C walk)
# ops whose sources are all values (the rest: _value_srcs)
_PLAIN = frozenset(_ALU_I) | frozenset(_SAME_I) | {TOps.REDUCE, TOps.CAST, TOps.BITCAST, TOps.PERMUTE, TOps.FLIP}
_WEAK_SET = frozenset(_WEAK)
_LEAF = frozenset({TOps.BUFFER, TOps.PARAM, TOps.CONST})  # no value sources (as _value_srcs says)
_FWALK = [CORE.foreign_walk]  # the C core's walk (csrc/pywalk.c); None: the pure-Python core (tests swap it)
# the node class whose slots (op, src, dtype, arg) the C walk reads through their descriptors (tests swap it: any
# other class's instances, or a class without such slots, are read by attribute name)
_NODE = [TUOp]
_COLS = [CORE.rows_columns]  # the C core's columns of the table (csrc/pyrows.c); None: the pure-Python core


def _md_in(md: tuple) -> tuple:
  """pygrad's metadata for a tinygrad metadata tuple: one tuple object per distinct content (the builder interns each
  object once), each entry once. tinygrad makes a new Metadata per Tensor method call, whose hash and == run in
  Python, so tuples are looked up by their items' (name, backward). tinygrad's compute_gradient appends a node's
  backward metadata without looking at what the node has: a node that is in every graph (a shared constant) gains a
  copy per backward pass, hundreds in a training loop; pygrad's metadata holds each entry once (merge_metadata), so
  the copies are one entry, and converting such a node stays as cheap as converting any other."""
  if len(md) == 1:
    m = md[0]
    k = (m.name, m.backward)
    got = _MD_IN1.get(k)
    if got is None:
      if len(_MD_IN1) >= 4096: _MD_IN1.clear()
      got = _MD_IN1[k] = (Metadata(m.name, "", m.backward),)
    return got
  last, pairs = _MD_LONG[0], None
  if last is not None:  # tinygrad's appends make a new tuple each time, starting with the last one's entries: only
    n = len(last[0])  # the new tail is read (the prefix compares item by item by identity, in C)
    if len(md) >= n and md[:n] == last[0]: pairs = dict(last[1])
  if pairs is None: pairs, n = {}, 0
  pairs.update(dict.fromkeys([(m.name, m.backward) for m in md[n:]]))  # str and bool: hashed in C
  _MD_LONG[0] = (md, pairs)
  k = tuple(pairs)
  got = _MD_IN.get(k)
  if got is None:
    if len(_MD_IN) >= 4096: _MD_IN.clear()
    got = _MD_IN[k] = tuple(Metadata(name, "", bw) for name, bw in k)
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


def _columns_py(rows: list, md: dict) -> tuple:
  """The node table's columns: (op, dtype, start, src, argref, tagref, pdref or None if md is empty, objs), the
  object columns as references into objs (_refs: args, then tags, then md's metadata, row -> object). The C core's
  rows_columns (csrc/pyrows.c) makes the same in one pass."""
  n = len(rows)
  ops, dts, srcs, args, tags = zip(*rows)
  start = np.zeros(n + 1, np.int64)
  np.cumsum(np.fromiter(map(len, srcs), np.int64, n), out=start[1:])
  flat = np.fromiter(itertools.chain.from_iterable(srcs), np.int64, int(start[-1])).astype(np.int32)
  objs: list = []
  seen: dict = {}
  argref, tagref = _refs(args, objs, seen), _refs(tags, objs, seen)
  pdref = None
  if md:
    pdref = np.zeros(n, np.int32)
    for r, m in md.items():
      k = seen.get(id(m))
      if k is None:
        objs.append(m)
        k = seen[id(m)] = len(objs)
      pdref[r] = k
  return np.array(ops, np.int32), np.array(dts, np.int32), start, flat, argref, tagref, pdref, objs


def _columns(rows: list, md: dict) -> tuple:
  """_columns_py's result, made by the C core where it has rows_columns (_COLS[0]; None: the Python form)."""
  f = _COLS[0]
  if f is None: return _columns_py(rows, md)
  op, dt, start, src, argref, tagref, pdref, objs = f(rows, md)
  a32 = lambda b: np.frombuffer(b, np.int32)  # noqa: E731  (bytearrays: writable arrays over them, no copy)
  return a32(op), a32(dt), np.frombuffer(start, np.int64), a32(src), a32(argref), a32(tagref), \
    None if pdref is None else a32(pdref), objs


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
  `known` (a _Fwd) holds the nodes of an earlier conversion, used as they are. rev: keep what rev() needs (a
  conversion whose nodes are never converted back, from_tinygrad's, skips a row and a node per node)."""

  def __init__(self, targets=None, known=None, rev: bool = True):
    self.targets, self.known = targets, known
    self.memo: dict = {}   # tinygrad node (or (node, dtype) if weak) -> row
    self.live: dict = {}   # tinygrad node -> converted node by node
    self.rows: list = []   # the table
    self.md: dict = {}     # row -> metadata
    self.given: dict = {}  # row -> pygrad node of `known`
    self.puts = [] if rev else None  # row, tinygrad node, row, ... (flat: no pair made per node) for the way back
    self.ids: list = []    # after build: every row's node id
    self.keep: list = []   # after build: handles that keep every row alive
    self._rev = None
    self.mdon = len(_tg_metadata) > 0
    self.shapes: dict = {}  # shape (or other int tuple arg) -> its one object in this conversion
    self.tsh: dict = {}     # tinygrad node -> its _shape (tinygrad's is a property computed in Python)
    self._wcfg = None       # the C walk's configuration (csrc/pywalk.c), made on first use

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
    rows, given = self.rows, sorted(self.given)
    new = None  # the builder takes the given rows (nodes of `known`, no sources) first: renumber if there are any
    if given:
      order = given + sorted(set(range(n)).difference(given))
      new = np.empty(n, np.int64)
      new[order] = np.arange(n)
      rows = [rows[r] for r in order]
    md = self.md if new is None else {int(new[r]): m for r, m in self.md.items()}
    ops, dts, start, flat, argref, tagref, pdref, objs = _columns(rows, md)
    if new is not None: flat = new[flat].astype(np.int32)
    used = np.zeros(n, bool)
    used[flat] = True
    want = list(want) if new is None else new[want].tolist()
    roots = want + np.flatnonzero(~used).tolist()  # every row is one of these or reached from one
    gids = np.array([self.given[r]._id for r in given], np.int32)
    hs, rest = _build(ops, dts, start, flat, argref, tagref, pdref, objs, roots, gids)
    ids = np.concatenate([gids, rest])
    self.ids, self.keep = (ids if new is None else ids[new]).tolist(), hs
    return hs[:len(want)]

  def fwd(self) -> _Fwd: return _Fwd(self.memo, self.ids)

  def rev(self) -> dict:
    """pygrad node id -> the tinygrad node it stands for (the first one converted to it)."""
    if self._rev is None:
      if self.puts is None: raise RuntimeError("_In.rev(): this conversion was made with rev=False")
      ids = self.ids
      p = self.puts
      self._rev = {ids[r]: u for r, u in zip(p[-2::-2], p[::-2])}  # last first: the first node of an id stays
    return self._rev

  def _walk(self, root: TUOp) -> None:
    """Post-order over value sources; each node on a target path (every node, without targets) is converted when
    its sources are done. Weak, device-less and opaque nodes are made when a converted user asks for them. The C
    core walks (csrc/pywalk.c: the usual nodes' rows made there as _node makes them, the others by _node) unless
    nodes of an earlier conversion are `known`."""
    if self.known is None and _FWALK[0] is not None:
      if self._wcfg is None:
        self._wcfg = (self.live, self.memo, self.targets, self.rows, self.puts, self.md, self.tsh, self.shapes,
                      _PLAIN, _SHAPED_MOVE, _ALU_I, _DTI, _CMP, _WEAK_SET, TOps.PARAM, TOps.RESHAPE, TOps.PERMUTE,
                      (_RESHAPE, _PERMUTE, _BOOL, _EXPANDOP, _BCAST, _REDUCEOP, _BUFFER, _REDUCE), _SHN, self._node,
                      self._meta, _value_srcs, _tg_metadata.data if self.mdon else None, _MD_IN1, _DT, TOps.WHERE,
                      TOps.REDUCE, TOps.BUFFER, _ROP, ParamArg, _LEAF, _SAME_I, _DVN, _NODE[0])
      _FWALK[0](self._wcfg, root)
      return
    live, memo, targets, known, node, meta, puts = self.live, self.memo, self.targets, self.known, self._node, \
      self._meta, self.puts
    mdget = _tg_metadata.data.get if self.mdon else None  # the WeakKeyDictionary's dict: its get is a Python frame
    plain, weak, smove = _PLAIN, _WEAK, _SHAPED_MOVE
    stack: list = [(root, None)]
    pop, push = stack.pop, stack.append
    while stack:
      u, vs = pop()
      if u in live: continue
      if vs is None:  # first visit: its value sources go first
        if known is not None and u in known:
          live[u] = True
          continue
        op = u.op
        vs = u.src if op in plain else u.src[:1] if op in smove else _value_srcs(u)
        push((u, vs))
        for s in reversed(vs):
          if s not in live: push((s, None))
        continue
      if targets is None: below = True
      else:
        below = u.op is TOps.PARAM
        for s in vs:
          if live[s]:
            below = True
            break
      live[u] = below or u in targets
      if not below or u in memo or u.dtype in weak: continue
      r = node(u, vs)
      if puts is not None: puts += r, u
      if mdget is not None and (md := mdget(_wref(u))): meta(r, md)

  def _node(self, u: TUOp, vs: tuple) -> int:
    """The row of a node the walk converts (typed, its value sources vs visited), remembered in memo. The usual
    node, a typed ALU op, is converted inline (the per-node Python work is most of a conversion's time)."""
    memo, rows, tsh, weak, get = self.memo, self.rows, self.tsh, _WEAK, self._get
    op, dt = u.op, u.dtype
    a = _ALU_I.get(op)
    if a is not None and (d := _DTI.get(dt)) is not None:  # the hot path: a typed ALU op (vs is u.src)
      shape = u.__dict__.get(_SHN, _NOWANT)
      if shape is _NOWANT: shape = u._shape
      srcs = []
      for s in vs:
        if s.dtype in weak: r = get(s, _operand_want(u, None))
        else:
          r = memo.get(s)
          if r is None: r = get(s)
        ss = tsh.get(s)
        if ss is None:
          ss = s.__dict__.get(_SHN, _NOWANT)
          tsh[s] = ss = s._shape if ss is _NOWANT else ss
        srcs.append(self._bcast(r, ss, shape) if ss and ss is not shape and ss != shape else r)
      rows.append((a, _BOOL if op in _CMP else d, tuple(srcs), None, None))
      r = memo[u] = len(rows) - 1
    elif (op is TOps.RESHAPE or op is TOps.PERMUTE) and dt in _DTI:  # the next most frequent: as _movement does
      s = vs[0]
      x = memo.get(s)
      if x is None: x = get(s)
      rows.append((_RESHAPE, rows[x][1], (x,), self._shape(u), None) if op is TOps.RESHAPE else
                  (_PERMUTE, rows[x][1], (x,), self._canon(tuple(u.arg)), None))
      r = memo[u] = len(rows) - 1
    else: r = memo[u] = self._one(u, None)
    return r

  def _meta(self, r: int, md: tuple) -> None:
    """Row r's metadata from a tinygrad node's (merged into what the row has: two nodes may become one row)."""
    if len(md) == 1:  # the usual: _md_in's lookup inline
      m = md[0]
      m = _MD_IN1.get((m.name, m.backward))
      if m is None: m = _md_in(md)
    else: m = _md_in(md)
    cur = self.md.get(r)
    self.md[r] = m if cur is None else cur + tuple(x for x in m if x not in cur)

  def _put(self, u: TUOp, r: int, want=None) -> None:
    self.memo[(u, want) if u.dtype in _WEAK else u] = r
    if self.puts is not None: self.puts += r, u
    if self.mdon and (md := _tg_metadata.get(u)):
      m, cur = _md_in(md), self.md.get(r)
      self.md[r] = m if cur is None else cur + tuple(x for x in m if x not in cur)

  def _shape(self, u: TUOp) -> tuple:
    """u's shape, static (checked), one tuple object per distinct shape in this conversion (the builder interns
    each object once)."""
    sh = u.__dict__.get(_SHN, _NOWANT)
    if sh is _NOWANT or sh is None: sh = u.shape  # (tinygrad's error if it has none)
    got = self.shapes.get(sh)
    if got is None: got = self.shapes[sh] = _ints(sh, u)
    return got

  def _canon(self, v):
    """One object per distinct hashable arg v of ints (tinygrad's shapes and axes): interned once by the builder."""
    got = self.shapes.get(v)
    if got is None: got = self.shapes[v] = v
    return got

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
      memo, tsh = self.memo, self.tsh
      shape = tsh.get(u)
      if shape is None: shape = tsh[u] = u._shape
      srcs = []
      w = _NOWANT
      for s in u.src:
        if s.dtype in _WEAK:
          if w is _NOWANT: w = _operand_want(u, want)
          r = self._get(s, w)
        else:
          r = memo.get(s)
          if r is None: r = self._get(s)
        ss = tsh.get(s)
        if ss is None: ss = tsh[s] = s._shape
        srcs.append(self._bcast(r, ss, shape) if ss and ss is not shape and ss != shape else r)
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
      rows.append((_REDUCEOP, d, (x,), self._canon((_ROP.get(rop, rop), tuple(range(n)))), _REDUCE))
      rows.append((_RESHAPE, d, (len(rows) - 1,), self._shape(u), _REDUCE))
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
        if _param_view(view):  # (its view a source: see _param_view)
          return row(_GETTUPLE, self.rows[x][1], (row(_TUPLE, _VOID, (x, get(view))),), 0, _ASSIGN_P)
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
    `()`). The shapes are canonical (_canon): one object per distinct shape is interned, not one per node."""
    rows = self.rows
    d = rows[r][1]
    if len(ss) < len(shape):
      ss = (1,) * (len(shape) - len(ss)) + ss
      rows.append((_RESHAPE, d, (r,), self._canon(ss), _BCAST))
      r = len(rows) - 1
    if ss == shape: return r
    rows.append((_EXPANDOP, d, (r,), self._canon(shape), _BCAST))
    return len(rows) - 1

  def _movement(self, u: TUOp, x: int, tag) -> int:
    """The rows of a movement op; shapes from tinygrad's (static: checked), offsets from its shape operands."""
    op, rows = u.op, self.rows
    d = rows[x][1]
    if op is TOps.PERMUTE: rows.append((_PERMUTE, d, (x,), self._canon(tuple(u.arg)), tag))
    elif op is TOps.FLIP: rows.append((_FLIP, d, (x,), tuple(bool(f) for f in u.arg), tag))
    elif op is TOps.RESHAPE: rows.append((_RESHAPE, d, (x,), self._shape(u), tag))
    elif op is TOps.EXPAND:
      shape, xsh = self._shape(u), u.src[0]._shape
      t = tag if tag is not None else _EXPAND
      rows.append((_RESHAPE, d, (x,), self._canon((1,) * (len(shape) - len(xsh)) + xsh), t))
      rows.append((_EXPANDOP, d, (len(rows) - 1,), shape, t))
    else:
      pairs = tuple((o, sz) for o, sz in u.marg)
      _ints(sum(pairs, ()), u)
      if op is TOps.PAD:
        rows.append((_PAD, d, (x,), self._canon(tuple((o, sz - o - s) for (o, sz), s in zip(pairs, u.src[0]._shape))),
                     tag))
      else: rows.append((_SHRINK, d, (x,), self._canon(tuple((o, o + sz) for o, sz in pairs)), tag))
    return len(rows) - 1

  def _opaque_buffer(self, u: TUOp) -> int:
    """A BUFFER row whose unique id is the tinygrad node: a tinygrad BUFFER, or a value pygrad need not see into."""
    dev = u.device
    if type(dev) is not str:
      raise ValueError(f"from_tinygrad: {u.op.name} on device {dev!r}: pygrad places a value on one named device")
    name = u.arg.name if u.op is TOps.BUFFER and isinstance(u.arg, ParamArg) else None
    return self._row(_BUFFER, _pdtype(u).id, (), (u, self._shape(u), dev, name))


def _wrap(v: int, d) -> int:
  """An integer constant in d's range, wrapping as the machine does (a weak -1 added to a uint32 is 2**32-1)."""
  bits = 8 * d.itemsize
  v &= (1 << bits) - 1
  return v - (1 << bits) if d.kind == "i" and v >= 1 << (bits - 1) else v
