"""Flattening for the planner: a graph of UOps becomes a list of plain nodes (PNode) in topological order, with every
FUNCTION inlined (its body's PARAMs bound to the call's arguments, per call), GETTUPLE resolved to the output it
names, and the value-preserving ops (CONTIGUOUS, CONTIGUOUS_BACKWARD, DETACH, COPY between host devices, replicated
MULTI) resolved to their source. Iterative: nothing recurses on graph depth."""
from __future__ import annotations
from itertools import repeat
import numpy as np
from ..ops import Ops, GroupOp
from ..uop import UOp, handle
from ..dtype import BY_ID, dtypes

_ALIAS = GroupOp.Identity | {Ops.COPY}
_INPUTS = (Ops.BUFFER, Ops.DEFINE_VAR)
_MUL, _RECIP = Ops.MUL, Ops.RECIPROCAL


class PNode:
  """One value of the flattened graph. `uop` is the node it came from (inputs are looked up by it)."""
  __slots__ = ("op", "dtype", "shape", "arg", "src", "idx", "nid", "users", "is_output", "view", "mat", "buf",
               "callbufs", "out_slot", "opcode", "_lz")

  def __init__(self, op, dtype, shape, arg, src, nid, idx=0):
    self.op, self.dtype, self.shape, self.arg, self.src, self.nid = op, dtype, shape, arg, src, nid
    self.idx, self.users, self.is_output, self.view, self.mat, self.buf = idx, 0, False, None, False, None
    self.callbufs, self.out_slot = None, None
    self.opcode = None  # "DIV": a MUL computed as the quotient src[0] / src[1] (see _quotient)

  def __getattr__(self, name):  # reached only for a slot never set: a LazyNodes node's src before its first read,
    if name == "src":  # or the fields of a node made bare (LazyNodes.make_bare) before the first read of one
      src = self.src = self._lz.src_of(self.idx)
      return src
    if name in _BARE:
      self._lz.fill(self)
      return object.__getattribute__(self, name)
    raise AttributeError(f"'PNode' object has no attribute {name!r}")

  @property
  def uop(self) -> UOp: return handle(self.nid)

  def __repr__(self): return f"PNode#{self.idx}({self.op.name}, {self.dtype.name}, {self.shape})"


def _quotient(n: PNode, sids) -> PNode:
  """values.quotient_operands' rule on a flattened node: a float MUL whose own source (sids: its UOp sources' ids; a
  PNode of another id came through an identity op, a PARAM or a GETTUPLE, as the numpy engine does not look through
  them) is a RECIPROCAL becomes the quotient (opcode DIV) of the other source by the RECIPROCAL's source."""
  if n.op is not _MUL or not dtypes.is_float(n.dtype): return n
  x, y = n.src
  if y.op is _RECIP and y.nid == sids[1]: n.src, n.opcode = (x, y.src[0]), "DIV"
  elif x.op is _RECIP and x.nid == sids[0]: n.src, n.opcode = (y, x.src[0]), "DIV"
  return n


def _structure(o: UOp, c: int, fctx, get):
  """An output's value: a PNode (via get), None for NOOP, or a tuple (TUPLE/SINK/FUNCTION, nested as they are).
  Iterative, leaves visited left to right: outputs may nest thousands deep."""
  out: list = []
  stack = [(o, c, -1)]
  while stack:
    u, c, n = stack.pop()
    if n >= 0:  # u's n children are the last n values
      k = len(out) - n
      out[k:] = [tuple(out[k:])]
    elif u.op in (Ops.TUPLE, Ops.SINK, Ops.FUNCTION):
      kids, kc = (u.src[0].src, fctx(u, c)) if u.op is Ops.FUNCTION else (u.src, c)
      stack.append((u, c, len(kids)))
      stack.extend((s, kc, -1) for s in reversed(kids))
    else:
      out.append(None if u.op is Ops.NOOP else get(u, c))
  return out[0]


class Flattener:
  """Walks (uop, call context) pairs: context 0 is the top level; a FUNCTION met in context c opens a new context
  binding its PARAMs to its args evaluated in c."""

  def __init__(self):
    self.memo: dict[tuple[int, int], PNode | None] = {}
    self.ctxs: list = [None]
    self.ctx_of: dict[tuple[int, int], int] = {}
    self.nodes: list[PNode] = []

  def fctx(self, f: UOp, c: int) -> int:
    k = (f._id, c)
    n = self.ctx_of.get(k)
    if n is None:
      n = self.ctx_of[k] = len(self.ctxs)
      self.ctxs.append((f, c))
    return n

  def deps(self, u: UOp, c: int) -> list:
    op = u.op
    if op in _ALIAS: return [(u.src[0], c)]
    if op is Ops.PARAM:
      if c == 0: return []
      f, pc = self.ctxs[c]
      return [(f.src[1 + u.arg[0]], pc)]
    if op is Ops.GETTUPLE:
      s = u.src[0]
      if s.op is Ops.FUNCTION: return [(s.src[0].src[u.arg], self.fctx(s, c))]
      return [(s.src[u.arg], c)]
    if op is Ops.CALL: return [(b, c) for b in u.src[1:]]
    if op is Ops.AFTER: return [(u.src[1], c)]
    if op in (Ops.FUNCTION, Ops.TUPLE, Ops.SINK):
      raise ValueError(f"{op.name} is not a value here: take its outputs with GETTUPLE")
    return [(s, c) for s in u.src]

  def make(self, u: UOp, c: int, kids: list) -> PNode | None:
    op = u.op
    if op in _ALIAS or (op is Ops.PARAM and c != 0) or op is Ops.GETTUPLE: return kids[0]
    if op is Ops.MULTI and u.arg is None: return kids[0]
    if op is Ops.NOOP: return None
    if op is Ops.AFTER:
      call = u.src[1]
      for i, b in enumerate(call.src[1:]):
        if b is u.src[0]: return self._new(PNode(op, u.dtype, u.shape, i, (kids[0],), u._id))
      raise ValueError("AFTER: src[0] is not one of its CALL's buffers")
    if any(k is None for k in kids): raise ValueError(f"{op.name}: an operand has no value (NOOP)")
    n = PNode(op, u.dtype, u.shape, u.arg, tuple(kids), u._id)
    return self._new(_quotient(n, [s._id for s in u.src]) if op is _MUL else n)

  def _new(self, n: PNode) -> PNode:
    n.idx = len(self.nodes)
    self.nodes.append(n)
    return n

  def resolve(self, pairs: list) -> list:
    """PNodes for (uop, ctx) pairs, flattening everything below them."""
    memo = self.memo
    for root in pairs:
      stack = [(root[0], root[1], False)]
      while stack:
        u, c, ready = stack.pop()
        k = (u._id, c)
        if k in memo: continue
        ds = self.deps(u, c)
        if not ready:
          stack.append((u, c, True))
          for d in reversed(ds):
            if (d[0]._id, d[1]) not in memo: stack.append((d[0], d[1], False))
          continue
        memo[k] = self.make(u, c, [memo[(d[0]._id, d[1])] for d in ds])
    return [memo[(u._id, c)] for u, c in pairs]


_OPS = tuple(Ops)
_ALIAS_IDS = frozenset(int(o) for o in _ALIAS)
# ops the columnar path leaves to the loop: they resolve to another node's value, or name structure, or are CALLs
_NOT_PLAIN = np.zeros(max(int(o) for o in Ops) + 1, bool)
_NOT_PLAIN[[*_ALIAS_IDS, *(int(o) for o in (Ops.MULTI, Ops.GETTUPLE, Ops.NOOP, Ops.TUPLE, Ops.SINK, Ops.FUNCTION,
                                            Ops.CALL, Ops.AFTER))]] = True
_IS_FLOAT = np.array([d is not None and dtypes.is_float(d) for d in BY_ID], bool)


_LAZY_MIN = 4096  # nodes from which a plain graph's PNodes are made when first read (LazyNodes)


class LazyNodes:
  """The PNodes of a large plain graph, each made when first read (by index, or as another's source): the planner
  reads a fraction of them (outputs, shared values, reductions, movements, a walked kernel's loads), the rest only as
  columns. A node's `src` is made when first read too. `users`: every node's users count (an array) once the
  planner knows it (a node made after gets it). `made_idx`: the nodes made, in order. `all()` makes the rest a
  column at a time (a planner that reads most nodes asks for it: one by one they cost 2-3x more); `make_bare()`
  makes nodes whose fields are filled in when first read. Its nodes refer to it: `release()` after planning breaks
  that cycle (Program does). `opcodes`: the nodes with an opcode of their own (flatten's quotients, found on the
  columns: no node is made for them)."""
  __slots__ = ("_made", "_info", "_ops", "_dts", "_args", "_nids", "_sp", "_start", "_ns", "users", "made_idx",
               "_meta_vals", "_arg_objs", "_cols", "view_of", "vcols", "_opcodes")

  def __init__(self, info: np.ndarray, nids: np.ndarray, sp: np.ndarray, start: np.ndarray, ns: np.ndarray,
               opcodes: dict | None = None):
    from ..intern import ARGS, META
    # the columns stay arrays (CORE.rows' info: op, dtype, arg and meta ids per node; nids: the core's ids): a node
    # made reads its row, a column of nodes made at once their rows (a list per column would cost more than the
    # planner's reads of it)
    self._made: list = [None] * len(info)
    self._info, self._nids = info, nids
    self._ops, self._dts, self._args = (info[:, k].astype(np.int64) for k in (0, 1, 3))
    self._sp, self._start, self._ns = sp, start, ns
    self._cols = (sp, start, ns)
    self._opcodes = opcodes or {}  # node -> its opcode (flatten's quotients: "DIV"), else None
    # view_of: node -> its view, once planned (sweep.py); vcols: the same as columns (buffer id, view class per node,
    # the classes' Views, the plan's buffers), for kkey.nodes
    self.users, self.made_idx, self.view_of, self.vcols = None, [], None, None
    self._meta_vals, self._arg_objs = META.vals, ARGS.objs

  def __len__(self) -> int: return len(self._made)

  def __getitem__(self, i: int) -> PNode:
    n = self._made[i]
    return n if n is not None else self._make(int(i))

  def _make(self, i: int) -> PNode:
    n = _new_pnode(PNode)
    op, dt, _, aid, _, mid, _ = self._info[i].tolist()
    n.op, n.dtype, n.shape, n.arg = _OPS[op], BY_ID[dt], self._meta_vals[mid][0], self._arg_objs[aid]
    n.nid, n.idx, n.users = int(self._nids[i]), i, 0 if self.users is None else int(self.users[i])
    n.is_output, n.mat, n.buf, n.callbufs, n.out_slot, n._lz = False, False, None, None, None, self
    n.opcode = self._opcodes.get(i)
    n.view = None if self.view_of is None else self.view_of(i)
    self._made[i] = n
    self.made_idx.append(i)
    return n

  def src_of(self, i: int) -> tuple:
    s = int(self._start[i])
    return tuple([self[j] for j in self._sp[s:s + int(self._ns[i])].tolist()])

  def all(self) -> list[PNode]:
    """Every node, made: those not made yet a column at a time, as flatten makes a small graph's, then every node's
    src from the columns (the same tuples as a node made when read gets)."""
    made = self._made
    if None in made:
      self.make([i for i, x in enumerate(made) if x is None], False)
      sp, start, ns = self._cols
      get = made.__getitem__
      for k in range(1, int(ns.max()) + 1):
        at = np.flatnonzero(ns == k)
        if not len(at): continue
        cols = [map(get, sp[start[at] + j].tolist()) for j in range(k)]
        for x, s in zip(map(get, at.tolist()), zip(*cols)): x.src = s
    return list(made)

  def make(self, miss: list, lazy_src: bool = True) -> list[PNode]:
    """Makes the nodes miss (indices of nodes not made yet, each once), a column at a time, as _make would one by
    one; lazy_src: their src made when first read (else the caller sets it)."""
    if not miss: return []
    at = np.array(miss, np.int64)
    rows = self._info[at]
    mv = self._meta_vals
    new = list(map(PNode, map(_OPS.__getitem__, rows[:, 0].tolist()), map(BY_ID.__getitem__, rows[:, 1].tolist()),
                   [mv[m][0] for m in rows[:, 5].tolist()], map(self._arg_objs.__getitem__, rows[:, 3].tolist()),
                   repeat(()), self._nids[at].tolist(), miss))
    if self.users is not None:
      for x, u in zip(new, self.users[at].tolist()): x.users = u
    if self.view_of is not None:
      for x, v in zip(new, map(self.view_of, miss)): x.view = v
    if self._opcodes:
      for x, c in zip(new, map(self._opcodes.get, miss)): x.opcode = c
    if lazy_src:
      for x in new:
        x._lz = self
        del x.src
    made = self._made
    for i, x in zip(miss, new): made[i] = x
    self.made_idx += miss
    return new

  def make_bare(self, miss: list) -> list[PNode]:
    """make()'s nodes with only idx and arg set (and _lz): the caller sets buf, mat and view, and the rest is filled
    in when first read (fill). For the planner's sweep, whose stored nodes are mostly read by index, buffer and arg
    only (engine/kbatch.py's columns): a third of make()'s cost."""
    if not miss: return []
    new = list(map(_new_pnode, repeat(PNode, len(miss))))
    for x, i, a in zip(new, miss, map(self._arg_objs.__getitem__, self._args[miss].tolist())):
      x.idx, x.arg, x._lz = i, a, self
    made = self._made
    for i, x in zip(miss, new): made[i] = x
    self.made_idx += miss
    return new

  def fill(self, n: PNode) -> None:
    """The fields of a node made bare (make_bare), as _make sets them."""
    i = n.idx
    op, dt, _, _, _, mid, _ = self._info[i].tolist()
    n.op, n.dtype, n.shape, n.nid = _OPS[op], BY_ID[dt], self._meta_vals[mid][0], int(self._nids[i])
    n.users = 0 if self.users is None else int(self.users[i])
    n.is_output, n.callbufs, n.out_slot, n.opcode = False, None, None, self._opcodes.get(i)

  def __iter__(self): return iter(self.all())
  def __reversed__(self): return reversed(self.all())

  def release(self) -> None:
    """Drops the nodes (which refer to this table): after planning, they are freed by reference counting."""
    self._made, self.made_idx, self.view_of, self.vcols = None, [], None, None


_new_pnode = object.__new__
_BARE = frozenset(("op", "dtype", "shape", "nid", "users", "is_output", "callbufs", "out_slot", "opcode"))


def _flatten_plain(order: np.ndarray, info: np.ndarray, flat: np.ndarray, lazy: bool = False):
  """_flatten_ids' nodes for a graph of plain values only (no op that resolves to another node's value or names
  structure: every node is one PNode and its sources' PNodes are its operands), built a column at a time; None
  when the graph has another op. Returns (nodes, the position of each node id, the columns the planner's sweeps
  read: nsrc, src as node positions, op ids, meta ids and dtype ids per node)."""
  ops = info[:, 0]
  if len(ops) == 0 or _NOT_PLAIN[ops].any(): return None
  from ..intern import ARGS, META
  n = len(order)
  pos = np.empty(int(order.max()) + 1, np.int64)
  pos[order] = np.arange(n)
  sp = pos[flat]  # every source as its node's position
  metas = META.vals
  ns = info[:, 2].astype(np.int64)
  start = np.cumsum(ns) - ns
  mul = np.flatnonzero((ops == _MUL) & _IS_FLOAT[info[:, 1]] & (ns == 2))
  if lazy and n >= _LAZY_MIN:
    # values.quotient_operands' rule (see _quotient) on the columns: a float MUL of a RECIPROCAL (its second operand
    # looked at first) is the quotient of its other operand by the RECIPROCAL's operand
    q = np.zeros(0, np.int64)
    if len(mul):
      s0, s1 = sp[start[mul]], sp[start[mul] + 1]
      b = ops[s1] == _RECIP
      a = (ops[s0] == _RECIP) | b
      q, s0, s1, b = mul[a], s0[a], s1[a], b[a]
      sp[start[q] + 1] = sp[start[np.where(b, s1, s0)]]
      sp[start[q]] = np.where(b, s0, s1)
    special = dict.fromkeys(q.tolist(), "DIV")
    nodes = LazyNodes(info, order, sp, start, ns, special)
    cols = {"nsrc": ns.astype(np.int32), "src": sp.astype(np.int32), "op": ops.astype(np.int64), "meta": info[:, 5],
            "dtype": info[:, 1].astype(np.int64), "special": special}
    return nodes, pos, cols
  else:
    nodes = list(map(PNode, map(_OPS.__getitem__, ops.tolist()), map(BY_ID.__getitem__, info[:, 1].tolist()),
                     [metas[m][0] for m in info[:, 5].tolist()], map(ARGS.objs.__getitem__, info[:, 3].tolist()),
                     repeat(()), order.tolist(), range(n)))
    get = nodes.__getitem__
    for k in range(1, int(ns.max()) + 1 if n else 1):
      at = np.flatnonzero(ns == k)
      if not len(at): continue
      cols = [map(get, sp[start[at] + j].tolist()) for j in range(k)]
      for x, s in zip(map(get, at.tolist()), zip(*cols)): x.src = s
  # values.quotient_operands' rule (see _quotient): a float MUL of a RECIPROCAL is a quotient
  if len(mul):
    a, b = ops[sp[start[mul]]] == _RECIP, ops[sp[start[mul] + 1]] == _RECIP
    for i in mul[a | b].tolist():
      m = nodes[i]
      _quotient(m, (m.src[0].nid, m.src[1].nid))
      sp[start[i]:start[i] + 2] = [m.src[0].idx, m.src[1].idx]
  special = {i: nodes[i].opcode for i in mul[a | b].tolist() if nodes[i].opcode is not None} if len(mul) else {}
  cols = {"nsrc": ns.astype(np.int32), "src": sp.astype(np.int32), "op": ops.astype(np.int64), "meta": info[:, 5],
          "dtype": info[:, 1].astype(np.int64), "special": special}
  return nodes, pos, cols


def _flatten_ids(outputs: list[UOp], lazy: bool = False):
  """The same flattening straight from the core's ids (no UOp handles) for graphs without FUNCTION; None if the
  graph has one (the general walk handles call contexts). lazy: a large plain graph's nodes may be LazyNodes."""
  from ..core import CORE
  from ..intern import ARGS, META
  roots, stack = [], list(outputs)
  while stack:
    o = stack.pop()
    if o.op is Ops.FUNCTION: return None
    if o.op in (Ops.TUPLE, Ops.SINK): stack.extend(o.src)
    elif o.op is not Ops.NOOP: roots.append(o._id)
  objs, metas = ARGS.objs, META.vals
  pn: dict[int, PNode | None] = {}
  nodes: list[PNode] = []
  FUNC, TUP, GET, MULTI, NOOP, AFTER, CALL, SINK = (int(x) for x in (Ops.FUNCTION, Ops.TUPLE, Ops.GETTUPLE, Ops.MULTI,
                                                                       Ops.NOOP, Ops.AFTER, Ops.CALL, Ops.SINK))
  MUL = int(Ops.MUL)
  order = CORE.toposort(roots, False)
  info, flat = CORE.rows(order, arrays=True)  # the whole graph's fields in one call into the core
  order = np.asarray(order.numpy() if hasattr(order, "numpy") else order, np.int64).reshape(-1)
  plain = _flatten_plain(order, info, flat, lazy)
  if plain is not None:
    nodes, pos, cols = plain
    if type(nodes) is LazyNodes:  # (the outputs, made at once: they are the roots)
      at = np.unique(pos[roots]).tolist()
      nodes.make([i for i in at if nodes._made[i] is None])
    return nodes, [_structure(o, 0, None, lambda u, c: nodes[pos[u._id]]) for o in outputs], cols
  rows, flat, order = info.tolist(), flat.tolist(), order.tolist()
  tups: dict[int, list[int]] = {}  # the sources of TUPLE nodes, which GETTUPLE looks into
  calls: dict[int, list[int]] = {}  # and of CALL nodes, which AFTER looks into
  p = 0
  for nid, (op, dt, ns, aid, _, mid, _) in zip(order, rows):
    src = flat[p:p + ns]
    p += ns
    if op in _ALIAS_IDS or (op == MULTI and aid == 0):
      pn[nid] = pn[src[0]]
      continue
    if op == GET:
      tup = tups.get(src[0])
      if tup is None: return None  # a FUNCTION's output
      pn[nid] = pn[tup[objs[aid]]]
      continue
    if op == NOOP or op == TUP or op == SINK or op == FUNC:
      if op == FUNC: return None
      if op == TUP: tups[nid] = src
      pn[nid] = None
      continue
    arg = objs[aid]
    if op == CALL: calls[nid] = src
    if op == AFTER:
      kids, arg = (pn[src[1]],), calls[src[1]][1:].index(src[0])
    else:
      kids = tuple([pn[s] for s in (src[1:] if op == CALL else src)])
      if None in kids:
        raise ValueError(f"{_OPS[op].name}: an operand has no value (NOOP)")
    n = PNode(_OPS[op], BY_ID[dt], metas[mid][0], arg, kids, nid)
    if op == MUL: _quotient(n, src)
    n.idx = len(nodes)
    nodes.append(n)
    pn[nid] = n
  return nodes, [_structure(o, 0, None, lambda u, c: pn[u._id]) for o in outputs], None


def flatten(outputs: list[UOp], columns: bool = False):
  """(nodes in topological order, per output: a PNode, None for NOOP, or a tuple of those for TUPLE/SINK/FUNCTION);
  columns: and a third item, the node table's columns when the columnar path made them (else None), and the nodes
  of a large plain graph may be a LazyNodes (a sequence making each when first read: release it after use)."""
  fast = _flatten_ids(outputs, lazy=columns)
  if fast is not None: return fast if columns else fast[:2]
  fl = Flattener()
  pairs: list = []
  for o in outputs: _structure(o, 0, fl.fctx, lambda u, c: pairs.append((u, c)))
  fl.resolve(pairs)
  out = fl.nodes, [_structure(o, 0, fl.fctx, lambda u, c: fl.memo[(u._id, c)]) for o in outputs]
  return (*out, None) if columns else out


__all__ = ["PNode", "LazyNodes", "flatten"]
