"""The flattened graph as arrays for the planner's sweeps and walks in C (engine/planner.py): `Graph` holds the
columns (sources as node numbers, op classes, dtypes) and runs the users sweep (csrc/plan_users.c); `Walk` walks one
kernel's expression from the value it stores (csrc/kwalk.c, kwalk_moves.c through movement ops); `kcols`,
`alu_knodes` and `make_knodes` turn a walk's entries into lowering's columns and KNodes."""
from __future__ import annotations
from itertools import chain, repeat
from operator import attrgetter, is_not, not_
from typing import NamedTuple
import math
import numpy as np
from ..ops import Ops, GroupOp
from ..dtype import BY_ID
from .flatten import PNode, LazyNodes, _OPS
from .records import KNode, compute_dtype
from ..ids import value

_ALU = GroupOp.ALU | {Ops.CAST, Ops.BITCAST}
_ALU_MOVE = _ALU | GroupOp.Movement
SMALL_KERNEL = 64  # kernels of at most this many walk entries have their KNodes made one by one (_knodes_small)
KW_LEAF, KW_ALU, KW_SCALAR, KW_MOVE = 1, 2, 4, 8  # csrc/pygrad.h's PG_KW_* flags
PU_ALU, PU_ALU_MOVE, PU_OUTPUT = 2, 8, 16  # and PG_PU_*
VM_MAXSIZE = value("consts", "VM_MAXSIZE")  # csrc/tables.h: bytes of a VM buffer
PURE = 64  # (Python only: a pure ALU op, the planner's _visit's first case)
OP_FLAGS = np.zeros(max(int(o) for o in Ops) + 1, np.uint8)
OP_FLAGS[[int(o) for o in _ALU]] |= PU_ALU
OP_FLAGS[[int(o) for o in _ALU_MOVE]] |= PU_ALU_MOVE
OP_FLAGS[[int(o) for o in GroupOp.ALU]] |= PURE
_G_SRC, _G_OP, _G_DTYPE, _G_OPCODE, _G_IDX, _G_VIEW, _G_SHAPE, _G_ID = (attrgetter(a) for a in (
  "src", "op", "dtype", "opcode", "idx", "view", "shape", "id"))


class KCols(NamedTuple):
  """A walked kernel's ALU KNodes as columns (in knodes order), for lowering (lower.allocate_cols): the loads come
  first as positions 0..nl-1 (in knodes order), then the ALU nodes; `flat` lists every ALU node's operands as such
  positions (`ns` of them each); ops, dtype ids, first operand's dtype ids; `special`: (rank, opcode name) of the
  ALU nodes with an opcode of their own; `top`: the root's position."""
  nl: int
  ns: np.ndarray
  flat: np.ndarray
  ops: np.ndarray
  dt: np.ndarray
  sdt: np.ndarray
  special: list
  top: int


def kcols(g: Graph, ent: np.ndarray, srcs: np.ndarray, first: np.ndarray, keep: np.ndarray, alu_e: np.ndarray,
           ns: np.ndarray) -> KCols:
  """_build_c's entries as KCols: an entry's position is its KNode's (a load read again is its first entry's)."""
  leaf = ent[2::3] != 0
  kept = keep & leaf
  nl = int(kept.sum())
  pos = np.where(leaf, (np.cumsum(kept) - 1)[first], nl + np.cumsum(~leaf) - 1)
  node = ent[3 * alu_e]
  ops = g.op_ids[node]
  special = []  # (rank, opcode name) of the ALU nodes with an opcode of their own
  if g.special:
    at = np.flatnonzero(np.isin(node, np.fromiter(g.special, np.int64, len(g.special))))
    special = [(r, g.special[i]) for r, i in zip(at.tolist(), node[at].tolist())]
  return KCols(nl, ns, pos[srcs[:int(ns.sum())]].astype(np.int32), ops, g.dt_ids[node],
               g.dt_ids[g.src[g.off[node]]], special, int(pos[len(pos) - 1]))


class Graph:
  """The flattened graph as arrays (sources as node numbers, op classes, outputs, shape ids) for the C sweeps."""

  def __init__(self, nodes: list[PNode], cols: dict | None = None):
    n = self.n = len(nodes)
    self.meta = None  # (per node a meta id: equal ids, equal shapes)
    if cols is not None:  # flatten's columns (flatten.py, _flatten_plain)
      self.nsrc, self.src, self.meta = cols["nsrc"], cols["src"], cols["meta"]
      self.op_ids, self.dt_ids = cols["op"], cols["dtype"]
    else:
      srcs = list(map(_G_SRC, nodes))
      self.nsrc = np.fromiter(map(len, srcs), np.int32, n)
      self.src = np.fromiter(map(_G_IDX, chain.from_iterable(srcs)), np.int32)
      self.op_ids = np.fromiter(map(_G_OP, nodes), np.int64, n)
      self.dt_ids = np.fromiter(map(_G_ID, map(_G_DTYPE, nodes)), np.int64, n)
    self.ops = OP_FLAGS[self.op_ids]
    # node -> its opcode name (flatten's quotients)
    self.special = cols["special"] if cols is not None else \
        {i: o for i, o in enumerate(map(_G_OPCODE, nodes)) if o is not None}
    self.off = np.cumsum(self.nsrc, dtype=np.int64) - self.nsrc
    from .vmlib import ffi, lib  # (the planner itself needs no compiled module)
    self.ffi, self.lib = ffi, lib

  def users_fused(self, nodes: list[PNode] | LazyNodes, outs: list[int]) -> bytearray:
    """Sets every node's users (Planner.__init__'s count) and returns _fused_shared's flags. outs: the outputs'
    node numbers."""
    n = self.n
    is_out = np.zeros(n, np.uint8)
    is_out[outs] = PU_OUTPUT
    flags = (self.ops & (PU_ALU | PU_ALU_MOVE)) | is_out
    # equal shapes, one id: canonical among the distinct meta ids, or else the distinct tuple objects
    keys = self.meta if self.meta is not None else np.fromiter(map(id, map(_G_SHAPE, nodes)), np.int64, n)
    first, inv = _groups(keys)
    canon: dict = {}
    shapes = [nodes[i].shape for i in first.tolist()]
    self.scalar = np.array([not sh for sh in shapes], bool)[inv]  # (per node: shape ())
    sid = self.sid = np.array([canon.setdefault(sh, len(canon)) for sh in shapes], np.int32)[inv]
    self.sid_shapes = list(canon)  # (shape id -> the shape)
    users, fused = np.empty(n, np.int32), np.empty(n, np.uint8)
    cp = self.ffi.from_buffer
    rc = self.lib.pg_plan_users(n, cp("int32_t[]", self.nsrc), cp("int64_t[]", self.off), cp("int32_t[]", self.src),
                                len(self.src), cp("uint8_t[]", flags), cp("int32_t[]", sid), cp("int32_t[]", users),
                                cp("uint8_t[]", fused))
    if rc == self.lib.PG_ERR_NOMEM: raise MemoryError(f"pygrad planner: no memory for the users of {n} nodes")
    if rc < 0: raise RuntimeError(f"pygrad planner: the users sweep refused {n} nodes with {len(self.src)} edges "
                                  f"(at most {2**31 - 1} edges in one program) ({rc})")
    self.users, self.fused_np = users, fused  # (sweep.py's columns)
    if type(nodes) is LazyNodes:  # the nodes made so far, and any made later
      nodes.users = users
      made = nodes.made_idx
      for x, u in zip(map(nodes.__getitem__, made), users[made].tolist()): x.users = u
    else:
      for x, u in zip(nodes, users.tolist()): x.users = u
    # the nodes _visit has anything to do for: a pure ALU node neither an output nor read twice stays an expression
    # (and a CAST or BITCAST read once neither: _visit would only check its size against the VM's bound, done here)
    quiet = (self.ops & (PURE | PU_ALU)) != 0
    casts = np.flatnonzero((self.ops & (PURE | PU_ALU)) == PU_ALU)
    if len(casts):
      size = np.array([math.prod(sh) if sh else 0 for sh in self.sid_shapes], np.float64)[sid[casts]]
      isz = np.array([max(compute_dtype(BY_ID[d]).itemsize, 1) for d in range(len(BY_ID))], np.float64)
      quiet[casts[size * isz[self.dt_ids[casts]] > VM_MAXSIZE]] = False  # (left to _visit, which raises)
    self.visit = np.flatnonzero(~quiet | ((flags & PU_OUTPUT) != 0) | (users >= 2)).tolist()
    return bytearray(fused.tobytes())


def _groups(keys: np.ndarray):
  """np.unique(keys, return_index=True, return_inverse=True)[1:] for ints >= 0: through a table when the largest is
  a few times the count or less (meta ids: no sort of every node's), else np.unique."""
  n = len(keys)
  top = int(keys.max()) + 1 if n else 0
  if n == 0 or keys.min() < 0 or top > 4 * n + 1024:
    return np.unique(keys, return_index=True, return_inverse=True)[1:]
  first = np.full(top, n, np.int64)
  np.minimum.at(first, keys, np.arange(n))  # (each key's first position)
  present = np.flatnonzero(first < n)
  rank = np.empty(top, np.int64)
  rank[present] = np.arange(len(present))
  return first[present], rank[keys]


class Walk:
  """The graph's arrays with each node's class for csrc/kwalk.c (made once per plan, once every node has its
  view), and the walk's scratch memory: a memo, all -1 between calls, and output buffers for the largest kernel."""

  def __init__(self, g: Graph, nodes: list[PNode], leaf: np.ndarray | None = None):
    n = self.n = g.n
    self.g, self.nsrc = g, g.nsrc
    flags = g.ops & KW_ALU
    if leaf is not None: flags |= leaf.astype(np.uint8) * KW_LEAF  # (per node: has a view; sweep.py's)
    elif type(nodes) is LazyNodes:  # a node not made has no view
      made = nodes.made_idx
      flags[made] |= np.fromiter(map(is_not, (nodes[i].view for i in made), repeat(None)), bool,
                                 len(made)).astype(np.uint8) * KW_LEAF
    else: flags |= np.fromiter(map(is_not, map(_G_VIEW, nodes), repeat(None)), bool, n).astype(np.uint8) * KW_LEAF
    scalar = getattr(g, "scalar", None)
    if scalar is None: scalar = np.fromiter(map(not_, map(_G_SHAPE, nodes)), bool, n)
    flags |= scalar.astype(np.uint8) * KW_SCALAR
    moves = np.flatnonzero((g.ops & (PU_ALU | PU_ALU_MOVE)) == PU_ALU_MOVE)  # the movement ops
    flags[moves] |= KW_MOVE
    self.flags = flags
    self.moves = len(moves) > 0  # (else every kernel takes csrc/kwalk.c's walk, with its dense memo)
    if self.moves:
      # a movement's class: equal (op, arg), equal class, as _build_py's cells key them; shape ids for broadcasts
      classes: dict = {}
      mvclass = np.full(n, -1, np.int32)
      if type(nodes) is LazyNodes:  # from the columns, a (op id, arg id) pair at a time: no node made
        pair = np.asarray(nodes._ops)[moves] * (1 << 32) + np.asarray(nodes._args)[moves]
        first, inv = np.unique(pair, return_index=True, return_inverse=True)[1:]
        by = np.empty(len(first), np.int32)
        for k in np.argsort(first, kind="stable").tolist():  # (numbered by first appearance, as below)
          i = int(moves[first[k]])
          op, arg = _OPS[nodes._ops[i]], nodes._arg_objs[nodes._args[i]]
          by[k] = classes.setdefault((op.name, tuple(arg) if op is Ops.FLIP else arg), len(classes))
        mvclass[moves] = by[inv]
      else:
        mvclass[moves] = [classes.setdefault((nd.op.name, tuple(nd.arg) if nd.op is Ops.FLIP else nd.arg),
                                             len(classes)) for nd in map(nodes.__getitem__, moves.tolist())]
      self.mv = list(classes)  # class -> (op name, arg)
      sid = getattr(g, "sid", None)
      if sid is None:
        canon: dict = {}
        sid = np.fromiter((canon.setdefault(nd.shape, len(canon)) for nd in nodes), np.int32, n)
        g.sid, g.sid_shapes = sid, list(canon)
      self.mvclass, self.sid, self.sid_shapes = mvclass, sid, g.sid_shapes
      self.info, self.pycells = np.zeros(2, np.int64), []  # pycells: the plan's cells as _build_py's (cells())
      self.max_cells = n + 64
      self.keys = np.empty(2 * n + self.max_cells, np.int64)  # (an entry per (node, cell): 2n, see out below)
      st = g.lib.pg_kwm_new()
      if st == g.ffi.NULL: raise MemoryError("pygrad planner: no memory for the kernel walk's state")
      self.kwm = g.ffi.gc(st, g.lib.pg_kwm_free)
    self.memo = np.full(2 * n, -1, np.int32)
    self.out, self.out_src = np.empty(6 * n, np.int32), np.empty(6 * n, np.int32)
    self._lib, cp = g.lib, g.ffi.from_buffer
    self._args = (cp("int32_t[]", g.nsrc), cp("int64_t[]", g.off), cp("int32_t[]", g.src), len(g.src),
                  cp("uint8_t[]", self.flags))
    self._mem = (cp("int32_t[]", self.memo), cp("int32_t[]", self.out), len(self.out) // 3,
                 cp("int32_t[]", self.out_src), len(self.out_src))
    if self.moves:
      self._margs = (*self._args, cp("int32_t[]", self.mvclass), cp("int32_t[]", self.sid))
      self._mmem = (cp("int32_t[]", self.out), len(self.out) // 3, cp("int32_t[]", self.out_src), len(self.out_src),
                    self.max_cells, cp("int64_t[]", self.keys), cp("int64_t[]", self.info))

  def run(self, top: int, top_leaf: bool):
    """(entries as a flat int array, or a list for a small kernel: node, cell + 1 (0: no pending movement), leaf
    per entry; the ALU entries' operands as entry numbers; the cells, as _build_py's) or (None, None, None) when
    the C walk leaves the kernel to _build_py (csrc/kwalk.c: it has a movement op; kwalk_moves.c: it passes the
    buffers). Without movements in the graph, the cells are this kernel's: cell 0 is the broadcast to its shape
    (None is returned for them); with them, they are the plan's (`pycells`, one list for every kernel)."""
    lib = self._lib
    if not self.moves:
      m = lib.pg_kernel_walk(self.n, *self._args, top, int(top_leaf), *self._mem)
      if m == lib.PG_KW_MOVES: return None, None, None
      if m < 0: raise RuntimeError(f"pygrad planner: the kernel walk failed ({m})")
      ent = self.out[:3 * m].copy()
      nsrc = int(self.nsrc[ent[0::3]][ent[2::3] == 0].sum())
      return ent, self.out_src[:nsrc].copy(), None
    m = lib.pg_kernel_walk_moves(self.kwm, self.n, *self._margs, top, int(top_leaf), *self._mmem)
    if m == lib.PG_KW_MOVES or m == lib.PG_KW_FULL: return None, None, None
    if m == lib.PG_ERR_NOMEM: raise MemoryError("pygrad planner: no memory for a kernel's walk")
    if m < 0: raise RuntimeError(f"pygrad planner: the kernel walk failed ({m})")
    nsrc, ncell = self.info.tolist()
    if ncell > len(self.pycells): self._new_cells(ncell)
    return self.result(m, nsrc)  # (_knodes_small reads lists)

  def run_raw(self, top: int, top_leaf: bool):
    """run's walk through movement ops (self.moves only), its result left in the walk's buffers: (entries, operands)
    counts, or None when the walk leaves the kernel to _build_py. `result` makes run's tuple of them."""
    lib = self._lib
    m = lib.pg_kernel_walk_moves(self.kwm, self.n, *self._margs, top, int(top_leaf), *self._mmem)
    if m == lib.PG_KW_MOVES or m == lib.PG_KW_FULL: return None
    if m == lib.PG_ERR_NOMEM: raise MemoryError("pygrad planner: no memory for a kernel's walk")
    if m < 0: raise RuntimeError(f"pygrad planner: the kernel walk failed ({m})")
    info = self._mmem[-1]
    if info[1] > len(self.pycells): self._new_cells(info[1])
    return m, info[0]

  def result(self, m: int, nsrc: int):
    """run's result from the buffers run_raw filled."""
    if m <= SMALL_KERNEL: return self.out[:3 * m].tolist(), self.out_src[:nsrc].tolist(), self.pycells
    return self.out[:3 * m].copy(), self.out_src[:nsrc].copy(), self.pycells

  def _new_cells(self, ncell: int) -> None:
    """The cells the walks made since the last call, as _build_py's: (movement (op name, arg) or ("BCAST", shape),
    parent cell or None)."""
    k = ncell - len(self.pycells)
    flat = np.empty(2 * k, np.int32)
    got = self._lib.pg_kwm_cells(self.kwm, len(self.pycells), self.g.ffi.from_buffer("int32_t[]", flat), k)
    if got != k: raise RuntimeError(f"pygrad planner: the walk's cells were not read ({got} of {k})")
    mv, shapes, fl = self.mv, self.sid_shapes, flat.tolist()
    self.pycells += [(mv[c] if c >= 0 else ("BCAST", shapes[-2 - c]), p if p >= 0 else None)
                     for c, p in zip(fl[0::2], fl[1::2])]


def alu_knodes(g: Graph, kn_of: np.ndarray, ent: np.ndarray, at: np.ndarray) -> None:
  """The KNodes of the walk's ALU entries at (without operands yet) into kn_of, from the graph's columns (op, dtype,
  first operand's dtype, a quotient's opcode) as _build_py makes them from the PNodes."""
  node = ent[3 * at]
  ops, dts, sdts = g.op_ids[node].tolist(), g.dt_ids[node].tolist(), g.dt_ids[g.src[g.off[node]]].tolist()
  opc = map(g.special.get, node.tolist()) if g.special else repeat(None)
  kn_of[at] = list(map(KNode, map(_OPS.__getitem__, ops), map(BY_ID.__getitem__, dts), repeat(()), repeat(None),
                       repeat(None), repeat(None), map(BY_ID.__getitem__, sdts), opc))


def make_knodes(g, kn_of, ent, srcs, keep, alu_e, ns, start, made) -> list[KNode]:
  """_build_c's knodes: the ALU KNodes not made yet (made: the entries that are), all given their operands a
  column at a time."""
  alu_knodes(g, kn_of, ent, np.setdiff1d(alu_e, made, assume_unique=True))
  for k in range(1, int(ns.max()) + 1):
    at = np.flatnonzero(ns == k)
    if not len(at): continue
    cols = [kn_of[srcs[start[at] + j]].tolist() for j in range(k)]
    for x, s in zip(kn_of[alu_e[at]].tolist(), zip(*cols)): x.src = s
  return kn_of[keep].tolist()


__all__ = ["Graph", "Walk", "KCols", "kcols", "alu_knodes", "make_knodes", "OP_FLAGS", "SMALL_KERNEL"]
