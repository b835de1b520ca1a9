"""The planner: a flattened graph (engine/flatten.py) becomes a list of kernels over buffers.

Every node's value is either a *view* of a materialized buffer (inputs, constants, kernel outputs, and any movement
of those: strides, offset and mask, no copy) or an *expression* not stored anywhere, fused into whichever kernel
needs it. A node is materialized (gets a buffer and a kernel of its own) when it is an output, a reduction, used by
two or more nodes (unless they are all elementwise in one kernel at its index: then it is computed once per element
there, see _fused_shared), the source of a PAD or of an EXPAND that would repeat work, a CALL buffer, or a MULTI. A
kernel is built top-down from the value it stores: movement ops on the way down become pending views applied at the
leaves, so the expression is computed once per output element and an EXPAND is a zero stride, never a temporary."""
from __future__ import annotations
import math
from functools import partial
from itertools import chain, repeat
from operator import attrgetter, itemgetter, is_not, not_
from typing import NamedTuple
import numpy as np
from ..ops import Ops, GroupOp
from ..dtype import BY_ID, DType, dtypes
from .flatten import PNode, LazyNodes, _OPS
from .views import View, apply
from .values import const_array, input_name, map_nested
from ..ids import value

VM_MAXSIZE = value("consts", "VM_MAXSIZE")  # csrc/tables.h: bytes of a VM buffer, elements of an index space

_F16, _BF16 = dtypes.float16, dtypes.bfloat16
_ALU = GroupOp.ALU | {Ops.CAST, Ops.BITCAST}
_MOVE = GroupOp.Movement
_ALU_MOVE = _ALU | _MOVE
_PURE_ALU = GroupOp.ALU


def compute_dtype(dt: DType) -> DType:
  """The type a value is computed and kept in inside the VM (float16/bfloat16 in float32)."""
  return dtypes.float32 if dt in (_F16, _BF16) else dt


def storage_dtype(dt: DType) -> DType:
  """The numpy storage of a value at the program boundary (bfloat16 as float32, as numpy_eval keeps it)."""
  return dtypes.float32 if dt is _BF16 else dt


class Buf:
  """A buffer: kind "arena" (internal, placed by liveness), "input"/"output" (slot index), or "const" (data)."""
  __slots__ = ("id", "kind", "index", "stype", "shape", "dtype", "data", "offset", "node", "nbytes")

  def __init__(self, bid, kind, stype: DType, shape, dtype: DType, index=-1, data=None):
    self.id, self.kind, self.stype, self.shape, self.dtype, self.index, self.data = bid, kind, stype, shape, dtype, \
      index, data
    self.offset, self.node = 0, None  # node: the PNode whose value it holds, for error messages
    self.nbytes = math.prod(shape) * stype.itemsize  # (shape and stype never change; placement reads it often)

  def describe(self) -> str:
    """What the buffer holds, for error messages: the op (when known), dtype and shape."""
    op = f"{self.node.op.name} " if self.node is not None else ""
    return f"{op}{self.dtype.name}{list(self.shape)}"

  def __repr__(self): return f"Buf#{self.id}({self.kind}{self.index if self.index >= 0 else ''}, {self.stype.name})"


class KNode:
  """One value of a kernel's expression, shaped like a UOp so that UPat patterns match it (lowering's peepholes).
  A load has op BUFFER (or CONST, with the constant as arg, when it reads a constant broadcast to every index) and
  reads `buf` through `view`; an ALU node (op in GroupOp.ALU, CAST, BITCAST) computes over `src` (KNodes), `sdtype`
  being its first operand's dtype. `opcode` is the VM instruction's name when it is not the op's (a peephole's pick
  that no Ops member names, e.g. ABS). `pos` is scratch for lowering (lower.allocate_c numbers the nodes in it)."""
  __slots__ = ("op", "dtype", "src", "arg", "buf", "view", "sdtype", "opcode", "pos")

  def __init__(self, op: Ops, dtype: DType, src: tuple = (), arg=None, buf=None, view=None, sdtype=None, opcode=None):
    self.op, self.dtype, self.src, self.arg, self.buf, self.view, self.sdtype, self.opcode = op, dtype, src, arg, \
      buf, view, sdtype, opcode

  @staticmethod
  def load(buf: Buf, view: View, dtype: DType) -> KNode:
    if buf.kind == "const" and view.is_scalar(): return KNode(Ops.CONST, dtype, (), buf.data.item(), buf, view)
    return KNode(Ops.BUFFER, dtype, (), None, buf, view)

  @property
  def is_load(self) -> bool: return self.buf is not None

  def __repr__(self):
    return f"KNode({self.op.name}, {self.dtype.name}, {self.buf if self.is_load else len(self.src)})"


class Store(NamedTuple):
  """A kernel's result: the value of `src` written to `buf` through `view`."""
  src: KNode
  buf: Buf
  view: View


class Loop:
  """One VM loop kernel before lowering over index space `shape`: `knodes` (loads and ALU nodes in dependency
  order), `stores`, and for a reduction the reduce op, the reduced axes and the result's dtype. `reachable`: every
  knode is read by the stores, directly or not (the planner's walk made them from the stores' values). `loads`: the
  load KNodes in knodes order. A kernel walked in C has `kcols` and may make its ALU KNodes only when `knodes` is
  first read (`make`: a function returning knodes): lowering reads the columns, and the stores' sources and their
  operands, which exist from the start and are the same objects in knodes."""
  __slots__ = ("shape", "_knodes", "stores", "redop", "redaxes", "rdtype", "reachable", "kcols", "loads", "_make")

  def __init__(self, shape, knodes: list[KNode] | None, stores: list[Store], redop=None, redaxes=(), rdtype=None,
               reachable: bool = False, kcols=None, loads: list[KNode] | None = None, make=None):
    self.shape, self._knodes, self.stores, self.redop, self.redaxes, self.rdtype = tuple(shape), knodes, stores, \
      redop, tuple(redaxes), rdtype
    self.reachable, self.kcols, self._make = reachable, kcols, make
    self.loads = [k for k in knodes if k.buf is not None] if loads is None else loads

  @property
  def knodes(self) -> list[KNode]:
    if self._knodes is None: self._knodes, self._make = self._make(), None
    return self._knodes

  @property
  def made(self) -> bool:
    """Whether the KNodes exist (else only the loads, the stores' sources and their operands do)."""
    return self._knodes is not None

  @property
  def size(self) -> int:
    """len(knodes), without making them."""
    return len(self._knodes) if self._knodes is not None else self.kcols.nl + len(self.kcols.ns)


class OutRef:
  """Where a program output lives: its buffer, and the shape to return it in."""
  __slots__ = ("buf", "shape")

  def __init__(self, buf, shape):
    self.buf, self.shape = buf, shape


class CallStep:
  """A CALL: run `fxn` on arrays holding these buffers, between two C segments."""
  __slots__ = ("fxn", "name", "bufs")

  def __init__(self, fxn, name, bufs):
    self.fxn, self.name, self.bufs = fxn, name, bufs


def _fused_shared(nodes: list[PNode]) -> bytearray:
  """Per node index, 1 for an elementwise value (ALU, CAST, BITCAST) used several times that stays an expression: all
  its users are elementwise nodes of its own shape that are computed in one kernel, at the same index (no movement
  or broadcast between them and the kernel's root). A kernel's walk computes such a value once per element (a
  register), so a buffer for it would only add a store and loads (exp's reduction reads x and n three times each).
  One user in another kernel, or reading it through a movement, and it is materialized as before. Walked from the
  outputs down: a node's group is its users' one when they share it, else the node itself (a kernel's root, or where
  a movement or broadcast starts)."""
  group = list(range(len(nodes)))
  fused = bytearray(len(nodes))
  users: list = [[] for _ in nodes]
  for n in nodes:
    if n.users or n.is_output or n.op not in _ALU_MOVE:
      for s in n.src: users[s.idx].append(n)
  for n in reversed(nodes):
    us = users[n.idx]
    if n.op not in _ALU or n.is_output or not us: continue
    g = -1
    for u in us:
      if u.op not in _ALU or u.shape != n.shape or (g >= 0 and group[u.idx] != g): break
      g = group[u.idx]
    else:
      group[n.idx], fused[n.idx] = g, len(us) >= 2
  return fused


_GRAPH_MIN_NODES = 4096  # graphs from which the planner's sweeps run in C over arrays
_WALK_MIN_NODES, _WALK_PER_JOB = 4096, 64  # plans whose kernels average this many nodes walk them in C
_MISS = object()
_SMALL_KERNEL = 64  # kernels of at most this many walk entries have their KNodes made one by one (_knodes_small)
_LAZY_MOVES = 64  # a graph with more than one movement op in this many nodes has its LazyNodes made at once
_KW_LEAF, _KW_ALU, _KW_SCALAR, _KW_MOVE = 1, 2, 4, 8  # csrc/pygrad.h's PG_KW_* flags
_PU_ALU, _PU_ALU_MOVE, _PU_OUTPUT = 2, 8, 16  # and PG_PU_*
_G_SRC, _G_OP, _G_DTYPE, _G_OPCODE, _G_IDX, _G_VIEW, _G_SHAPE, _G_OUT, _G_ID = (attrgetter(a) for a in (
  "src", "op", "dtype", "opcode", "idx", "view", "shape", "is_output", "id"))
_G_SRC0 = itemgetter(0)
_OP_FLAGS = np.zeros(max(int(o) for o in Ops) + 1, np.uint8)
_OP_FLAGS[[int(o) for o in _ALU]] |= _PU_ALU
_OP_FLAGS[[int(o) for o in _ALU_MOVE]] |= _PU_ALU_MOVE
_PURE = 64  # (Python only: a pure ALU op, _visit's first case)
_OP_FLAGS[[int(o) for o in _PURE_ALU]] |= _PURE


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


def _kcols(g: _Graph, ent: np.ndarray, srcs: np.ndarray, first: np.ndarray, keep: np.ndarray, alu_e: np.ndarray,
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


class _Graph:
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
    self.ops = _OP_FLAGS[self.op_ids]
    sp = (cols["special"] if cols is not None else
          [i for i, o in enumerate(map(_G_OPCODE, nodes)) if o is not None])  # (flatten's quotients: few)
    self.special = {i: nodes[i].opcode for i in sp}  # node -> its opcode name
    self.off = np.cumsum(self.nsrc, dtype=np.int64) - self.nsrc
    from .vmlib import ffi, lib  # (the planner itself needs no compiled module)
    self.ffi, self.lib = ffi, lib

  def users_fused(self, nodes: list[PNode] | LazyNodes, outs: list[int]) -> bytearray:
    """Sets every node's users (Planner.__init__'s count) and returns _fused_shared's flags. outs: the outputs'
    node numbers."""
    n = self.n
    is_out = np.zeros(n, np.uint8)
    is_out[outs] = _PU_OUTPUT
    flags = (self.ops & (_PU_ALU | _PU_ALU_MOVE)) | is_out
    # equal shapes, one id: canonical among the distinct meta ids, or else the distinct tuple objects
    keys = self.meta if self.meta is not None else np.fromiter(map(id, map(_G_SHAPE, nodes)), np.int64, n)
    first, inv = np.unique(keys, return_index=True, return_inverse=True)[1:]
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
    ul = users.tolist()
    if type(nodes) is LazyNodes:  # the nodes made so far, and any made later
      nodes.users = ul
      for i in nodes.made_idx: nodes[i].users = ul[i]
    else:
      for _ in map(setattr, nodes, repeat("users"), ul): pass
    # the nodes _visit has anything to do for: a pure ALU node neither an output nor read twice stays an expression
    self.visit = np.flatnonzero(~((self.ops & _PURE) != 0) | ((flags & _PU_OUTPUT) != 0) | (users >= 2)).tolist()
    return bytearray(fused.tobytes())


class _Walk:
  """The graph's arrays with each node's class for csrc/kwalk.c (made once per plan, once every node has its
  view), and the walk's scratch memory: a memo, all -1 between calls, and output buffers for the largest kernel."""

  def __init__(self, g: _Graph, nodes: list[PNode]):
    n = self.n = g.n
    self.g, self.nsrc = g, g.nsrc
    flags = g.ops & _KW_ALU
    if type(nodes) is LazyNodes:  # a node not made has no view
      made = nodes.made_idx
      flags[made] |= np.fromiter(map(is_not, (nodes[i].view for i in made), repeat(None)), bool,
                                 len(made)).astype(np.uint8) * _KW_LEAF
    else: flags |= np.fromiter(map(is_not, map(_G_VIEW, nodes), repeat(None)), bool, n).astype(np.uint8) * _KW_LEAF
    scalar = getattr(g, "scalar", None)
    if scalar is None: scalar = np.fromiter(map(not_, map(_G_SHAPE, nodes)), bool, n)
    flags |= scalar.astype(np.uint8) * _KW_SCALAR
    moves = np.flatnonzero((g.ops & (_PU_ALU | _PU_ALU_MOVE)) == _PU_ALU_MOVE)  # the movement ops
    flags[moves] |= _KW_MOVE
    self.flags = flags
    self.moves = len(moves) > 0  # (else every kernel takes csrc/kwalk.c's walk, with its dense memo)
    if self.moves:
      # a movement's class: equal (op, arg), equal class, as _build_py's cells key them; shape ids for broadcasts
      classes: dict = {}
      mvclass = np.full(n, -1, np.int32)
      mvclass[moves] = [classes.setdefault((nd.op.name, tuple(nd.arg) if nd.op is Ops.FLIP else nd.arg), len(classes))
                        for nd in map(nodes.__getitem__, moves.tolist())]
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
    if m <= _SMALL_KERNEL:  # (_knodes_small reads lists)
      return self.out[:3 * m].tolist(), self.out_src[:nsrc].tolist(), self.pycells
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


def _alu_knodes(g: _Graph, kn_of: np.ndarray, ent: np.ndarray, at: np.ndarray) -> None:
  """The KNodes of the walk's ALU entries at (without operands yet) into kn_of, from the graph's columns (op, dtype,
  first operand's dtype, a quotient's opcode) as _build_py makes them from the PNodes."""
  node = ent[3 * at]
  ops, dts, sdts = g.op_ids[node].tolist(), g.dt_ids[node].tolist(), g.dt_ids[g.src[g.off[node]]].tolist()
  opc = map(g.special.get, node.tolist()) if g.special else repeat(None)
  kn_of[at] = list(map(KNode, map(_OPS.__getitem__, ops), map(BY_ID.__getitem__, dts), repeat(()), repeat(None),
                       repeat(None), repeat(None), map(BY_ID.__getitem__, sdts), opc))


def _make_knodes(g, kn_of, ent, srcs, keep, alu_e, ns, start, made) -> list[KNode]:
  """_build_c's knodes: the ALU KNodes not made yet (made: the entries that are), all given their operands a
  column at a time."""
  _alu_knodes(g, kn_of, ent, np.setdiff1d(alu_e, made, assume_unique=True))
  for k in range(1, int(ns.max()) + 1):
    at = np.flatnonzero(ns == k)
    if not len(at): continue
    cols = [kn_of[srcs[start[at] + j]].tolist() for j in range(k)]
    for _ in map(setattr, kn_of[alu_e[at]].tolist(), repeat("src"), zip(*cols)): pass
  return kn_of[keep].tolist()


class Planner:
  """Plan a flattened graph: `kernels` (Loop and CallStep, in order; and lower.Part with a cache), `bufs`, `outputs`
  (per output a Buf or None or a tuple), `inputs` (per input slot the UOp)."""

  def __init__(self, nodes: list[PNode], shaped_outputs: list, inputs: list, cols: dict | None = None, cache=None):
    self.nodes, self.bufs, self.kernels, self.jobs, self.consts = nodes, [], [], [], {}
    # cache: a kcache.KernelCache, to which small kernels walked in C go lowered (kernels then holds lower.Parts)
    self.cache, self.prewalk = cache, None
    self.input_bufs: dict[int, Buf] = {}
    for i, u in enumerate(inputs):
      if u._id in self.input_bufs: raise ValueError(f"compile: input {i} ({u.op.name}) is listed twice")
      self.input_bufs[u._id] = self._buf("input", storage_dtype(u.dtype), u.shape, u.dtype, index=i)
    self.n_out, self.out_used = 0, set()
    self.amemo: dict = {}  # (view key, movement op, arg) -> the view after it (or None: a copy), for _visit
    stack, outs = list(shaped_outputs), []
    while stack:  # mark every output (tuples nest)
      x = stack.pop()
      if type(x) is tuple: stack.extend(x)
      elif x is not None:
        x.is_output = True
        outs.append(x.idx)
    graph = _Graph(nodes, cols) if len(nodes) >= _GRAPH_MIN_NODES else None
    # (with a cache, small kernels are keyed from the walk, which reads only leaves' nodes: the rest stay unmade)
    if cache is None and type(nodes) is LazyNodes and graph is not None and \
       np.count_nonzero((graph.ops & (_PU_ALU | _PU_ALU_MOVE)) == _PU_ALU_MOVE) * _LAZY_MOVES > len(nodes):
      nodes.all()  # many movements: most kernels are walked in Python (_build_py), reading most nodes
    if graph is not None: self.fused = graph.users_fused(nodes, outs)  # csrc/plan_users.c: the two sweeps below
    else:
      for n in reversed(nodes):  # users that are computed: a MUL made a quotient (flatten's _quotient) leaves its
        if n.users or n.is_output or n.op not in _ALU_MOVE:  # RECIPROCAL unused, whose divisor was then "shared"
          for s in n.src: s.users += 1
      self.fused = _fused_shared(nodes)
    for n in (nodes if graph is None else map(nodes.__getitem__, graph.visit)): self._visit(n)
    self.outputs = [map_nested(o, self._output) for o in shaped_outputs]
    # large kernels (few jobs for many nodes) are walked in C (csrc/kwalk.c) over the graph as arrays
    # (small kernels too: _build_c makes their KNodes from the walk's entries, reading every node: made at once)
    self.walk = None
    if len(nodes) >= _WALK_MIN_NODES: self.walk = _Walk(graph or _Graph(nodes), nodes)
    if cache is None and type(nodes) is LazyNodes and len(nodes) < _WALK_PER_JOB * len(self.jobs): nodes.all()
    # (a list indexed without LazyNodes' method call when every node is made)
    self.flat = nodes._made if type(nodes) is LazyNodes and None not in nodes._made else nodes
    self.vmemo: dict = {}  # (view key, cell) -> the view with the cell's movements applied (_knodes_small)
    self.lmemo, self.sigs = {}, None  # kcache.walked_key's: (node, cell) -> its load; per node its ALU signature
    self.jobs.sort(key=lambda j: j[0])
    for j in self.jobs: j[2]()
    self.jobs = []  # its closures hold the planner: dropped, the plan is freed by reference counting

  # ---- buffers ----
  def _buf(self, kind, stype, shape, dtype, index=-1, data=None) -> Buf:
    b = Buf(len(self.bufs), kind, stype, tuple(shape), dtype, index, data)
    self.bufs.append(b)
    return b

  def _const(self, n: PNode) -> Buf:
    ct = compute_dtype(n.dtype)
    data = const_array(n.arg, n.dtype).astype(ct.numpy).reshape(())
    key = (ct.name, data.tobytes())
    b = self.consts.get(key)
    if b is None: b = self.consts[key] = self._buf("const", ct, (), n.dtype, data=data)
    return b

  def _out_buf(self, n: PNode) -> Buf:
    b = self._buf("output", storage_dtype(n.dtype), n.shape, n.dtype, index=self.n_out)
    b.node = n
    self.n_out += 1
    return b

  # ---- materialization decisions (bottom-up) ----
  def _visit(self, n: PNode) -> None:
    op = n.op
    if op in _PURE_ALU:  # the common case: an expression, given a buffer when it is an output or shared
      if n.view is None and (n.is_output or (n.users >= 2 and math.prod(n.shape) > 1 and not self.fused[n.idx])):
        self._materialize(n)
      return
    # every value within the VM's bound (an ALU op's is checked with its operands': its shape is one of theirs and
    # its compute type no wider)
    if n.shape and math.prod(n.shape) * max(compute_dtype(n.dtype).itemsize, 1) > \
       VM_MAXSIZE:
      raise ValueError(f"the C interpreter takes values of at most 2**{VM_MAXSIZE.bit_length() - 1} bytes: "
                       f"{op.name} {n.dtype.name}{list(n.shape)} has {math.prod(n.shape):,} elements")
    if op in (Ops.BUFFER, Ops.DEFINE_VAR, Ops.PARAM):
      b = self.input_bufs.get(n.nid)
      if b is None:
        raise ValueError(f"missing input: {input_name(n.uop)} is not among the program's inputs")
      n.view = (b, View.contiguous(n.shape))
    elif op is Ops.CONST:
      n.view = (self._const(n), View.contiguous(()))
    elif op is Ops.CALL:
      n.callbufs = [self._buf("arena", compute_dtype(s.dtype), s.shape, s.dtype) for s in n.src]
      for s, b in zip(n.src, n.callbufs): b.node = s
      self._job(n.idx, lambda n=n: self._emit_call(n))
    elif op is Ops.AFTER:
      n.view = (n.src[0].callbufs[n.arg], View.contiguous(n.shape))
    elif op in (Ops.REDUCE_AXIS, Ops.MULTI):
      self._materialize(n)
    elif op in _MOVE:
      s = n.src[0]
      if s.view is None and (op is Ops.PAD or (op is Ops.EXPAND and math.prod(s.shape) > 1)): self._materialize(s)
      if s.view is not None:
        b, v = s.view
        ak = (v.key(), op, n.arg if op is not Ops.FLIP else tuple(n.arg))
        v2 = self.amemo.get(ak, _MISS)
        if v2 is _MISS: v2 = self.amemo[ak] = apply(v, op.name, n.arg)  # (a layered graph repeats them)
        if v2 is None:
          b = self._copy_view(s.view, s, n.idx)
          v2 = apply(View.contiguous(s.shape), op.name, n.arg)
        n.view = (b, v2)
    elif op not in _ALU:
      raise ValueError(f"the C interpreter cannot run {op.name} here")
    if n.view is None and op in _ALU_MOVE and (n.is_output or (n.users >= 2 and math.prod(n.shape) > 1 and
                                                               not self.fused[n.idx])):
      self._materialize(n)

  def _job(self, order, fn) -> None:
    self.jobs.append(((order, len(self.jobs)), None, fn))

  def _materialize(self, n: PNode) -> None:
    """Give an expression node (or a reduction/MULTI) a buffer and a kernel; its users then read the buffer."""
    if n.mat: return
    ct = compute_dtype(n.dtype)
    if n.is_output and n.out_slot is None and (n.op is not Ops.REDUCE_AXIS or storage_dtype(n.dtype) is ct):
      b = n.out_slot = self._out_buf(n)
    else:
      b = self._buf("arena", ct, n.shape, n.dtype)
      b.node = n
    n.buf, n.mat, n.view = b, True, (b, View.contiguous(n.shape))
    self._job(n.idx, lambda n=n: self._emit_root(n))

  def _copy_view(self, view, n: PNode, order) -> Buf:
    """A contiguous copy of a view (a RESHAPE the strides cannot express)."""
    b = self._buf("arena", compute_dtype(n.dtype), n.shape, n.dtype)
    b.node = n
    self._job(order - 0.5, lambda: self._emit_copy(view, n.dtype, b))
    return b

  def _output(self, n: PNode | None):
    """The buffer holding output n and the shape to return it in (a copy only when no buffer can be it)."""
    if n is None: return None
    if n.out_slot is not None and n.idx not in self.out_used:
      self.out_used.add(n.idx)
      return OutRef(n.out_slot, n.shape)
    b, v = n.view
    if (b.kind == "arena" and v.mask is None and v.offset == 0 and v.strides == View.contiguous(v.shape).strides
        and math.prod(v.shape) == math.prod(b.shape) and b.stype is storage_dtype(n.dtype)):
      b.kind, b.index = "output", self.n_out  # e.g. a reduction's result reshaped: the output is that buffer
      self.n_out += 1
      return OutRef(b, n.shape)
    b = self._out_buf(n)
    self._job(float("inf"), lambda: self._emit_copy(n.view, n.dtype, b))
    return OutRef(b, n.shape)

  # ---- kernel emission (top-down, in dependency order) ----
  def _emit_root(self, n: PNode) -> None:
    b = n.buf
    if n.op is Ops.REDUCE_AXIS:
      src = n.src[0]
      st = View.contiguous(n.shape).strides  # the reduced dims have size 1, so stride 0
      if self._walked(src, src.shape, False, b, View(src.shape, st), (n.arg[0], tuple(n.arg[1]), n.dtype)): return
      knodes, top = self._build(src, src.shape, expand_top=False)
      self.kernels.append(Loop(src.shape, knodes, [Store(top, b, View(src.shape, st))], redop=n.arg[0],
                               redaxes=n.arg[1], rdtype=n.dtype, reachable=True, kcols=self.kcols,
                               loads=self.kloads, make=self.kmake))
    elif n.op is Ops.MULTI:
      axis, start = n.arg, 0
      for s in n.src:
        region = tuple((start, start + s.shape[axis]) if i == axis else (0, d) for i, d in enumerate(n.shape))
        start += s.shape[axis]
        self._emit_store(s, b, View.contiguous(n.shape).shrink(region), n.dtype)
    else:
      self._emit_store(n, b, View.contiguous(n.shape), n.dtype, expand_top=True)

  def _emit_store(self, n: PNode, b: Buf, view: View, dtype, expand_top=False) -> None:
    if self._walked(n, n.shape, expand_top, b, view, (None, (), None)): return
    knodes, top = self._build(n, n.shape, expand_top=expand_top)
    self.kernels.append(Loop(n.shape, knodes, [Store(top, b, view)], reachable=True, kcols=self.kcols,
                             loads=self.kloads, make=self.kmake))

  def _emit_copy(self, view, dtype, b: Buf) -> None:
    src, v = view
    k = KNode.load(src, v, dtype)
    self.kernels.append(Loop(v.shape, [k], [Store(k, b, View.contiguous(v.shape))]))

  def _emit_call(self, n: PNode) -> None:
    for s, b in zip(n.src, n.callbufs): self._emit_store(s, b, View.contiguous(s.shape), s.dtype)
    info = n.arg
    fxn = getattr(info, "fxn", None)
    if fxn is None: raise ValueError("CALL: the kernel has no Python fxn to run (custom_kernel(..., fxn=...))")
    self.kernels.append(CallStep(fxn, getattr(info, "name", None), n.callbufs))

  def _leaf_view(self, view, cell, cells, kshape, dtype):
    """A leaf's view with the pending movements of `cell` applied (copying when a RESHAPE cannot be a view)."""
    b, v = view
    if cell is None: return b, v
    if v.is_scalar(): return b, View(kshape, (0,) * len(kshape), v.offset)
    c = cell
    while c is not None:
      mv, c = cells[c]
      v2 = apply(v, mv[0], mv[1])
      if v2 is None:
        nb = self._buf("arena", compute_dtype(dtype), v.shape, dtype)
        self._emit_copy((b, v), dtype, nb)
        b, v2 = nb, apply(View.contiguous(v.shape), mv[0], mv[1])
      v = v2
    return b, v

  def _walked(self, top: PNode, kshape, expand_top: bool, b: Buf, view: View, red: tuple) -> bool:
    """With a kernel cache (Program's: kcache.KernelCache), a small kernel walked in C goes to the cache straight
    from the walk's entries (red: reduce op, reduced axes, result dtype) and is appended lowered: no KNode, Loop or
    Store is made for a kernel the cache has seen. False (the walk kept for _build_c) when it is not such a kernel."""
    if self.cache is None or self.walk is None: return False
    w = self.walk.run(top.idx, (top.op not in _ALU_MOVE) if expand_top else (top.view is not None))
    if w[0] is None or len(w[0]) // 3 > min(_SMALL_KERNEL, self.cache.max_nodes):
      self.prewalk = w
      return False
    self.kernels += self.cache.walked(self, w, top, kshape, (tuple(kshape), *red), b, view)
    return True

  def _build(self, top: PNode, kshape, expand_top: bool):
    """(knodes in dependency order, top's KNode) computing `top` over index space kshape: _build_c's when the plan
    walks in C, else _build_py's (the same KNodes, in the same order)."""
    self.kcols = None  # _build_c's columns of the kernel, for lowering (KCols)
    self.kloads = self.kmake = None  # and its loads and the function making its knodes (knodes is None then)
    if self.walk is not None:
      r = self._build_c(top, kshape, expand_top)
      if r is not None: return r
    return self._build_py(top, kshape, expand_top)

  def _build_c(self, top: PNode, kshape, expand_top: bool):
    """_build_py's result from the C walk (csrc/kwalk.c, or kwalk_moves.c when the graph has movement ops): the
    entries in order, a load per leaf with its pending movements applied (loads with the same buffer, view and dtype
    are one KNode), then the ALU KNodes: a small kernel's one by one, a large one's a column at a time. None when
    the walk leaves the kernel to _build_py."""
    w = self.walk
    if self.prewalk is not None: (ent, srcs, cells), self.prewalk = self.prewalk, None  # (_walked's)
    else: ent, srcs, cells = w.run(top.idx, (top.op not in _ALU_MOVE) if expand_top else (top.view is not None))
    if ent is None: return None
    m = len(ent) // 3
    if m <= _SMALL_KERNEL:
      if type(ent) is not list: ent, srcs = ent.tolist(), srcs.tolist()
      return self._knodes_small(ent, srcs, cells, top, kshape)
    nodes = self.nodes
    kn_of = np.empty(m, object)
    keep = np.ones(m, bool)
    leaf_e = ent[2::3].nonzero()[0]
    if cells is None: cells = [(("BCAST", top.shape), None)]
    loads: dict = {}
    first = np.arange(m)  # each entry's first entry of the same KNode (a load read again)
    for e in leaf_e.tolist():
      n = nodes[ent[3 * e]]
      c = ent[3 * e + 1]
      b, v = self._leaf_view(n.view, c - 1, cells, kshape, n.dtype) if c else n.view
      lk = (b.id, v.key(), n.dtype)
      hit = loads.get(lk)
      if hit is None:
        kn = KNode.load(b, v, n.dtype)
        loads[lk] = (kn, e)
      else:
        kn, first[e] = hit
        keep[e] = False
      kn_of[e] = kn
    alu_e = (ent[2::3] == 0).nonzero()[0]
    if not len(alu_e): return kn_of[keep].tolist(), kn_of[m - 1]
    ns = w.nsrc[ent[3 * alu_e]].astype(np.int64)
    start = np.cumsum(ns) - ns
    self.kcols = _kcols(w.g, ent, srcs, first, keep, alu_e, ns)
    self.kloads = kn_of[leaf_e[keep[leaf_e]]].tolist()
    # the top (the last entry, an ALU one) and its operands now: the store and lowering read them
    ops_e = srcs[start[-1]:start[-1] + ns[-1]]
    now = np.unique(np.append(ops_e[ent[3 * ops_e + 2] == 0], m - 1))
    _alu_knodes(w.g, kn_of, ent, now)
    kn_of[m - 1].src = tuple(kn_of[ops_e].tolist())
    # (a function of the arrays only: a Loop holding the planner would make a reference cycle)
    self.kmake = partial(_make_knodes, w.g, kn_of, ent, srcs, keep, alu_e, ns, start, now)
    return None, kn_of[m - 1]

  def _knodes_small(self, ent: list, srcs: list, cells, top: PNode, kshape):
    """_build_c's result for a small kernel (its KNodes would all be read: lowering's cache keys them): made one
    by one from the entries, with no array operation per kernel. With the plan's cells, a view with a chain of
    pending movements applied is kept (vmemo) for the next leaf with equal view and chain."""
    nodes, knodes, kn_of, loads, vmemo = self.flat, [], [], {}, self.vmemo
    p = 0
    for e in range(0, len(ent), 3):
      n = nodes[ent[e]]
      if ent[e + 2]:  # a load
        c = ent[e + 1]
        if not c: b, v = n.view
        elif cells is None: b, v = self._leaf_view(n.view, 0, [(("BCAST", top.shape), None)], kshape, n.dtype)
        else:
          b, v = n.view
          if v.is_scalar(): v = View(kshape, (0,) * len(kshape), v.offset)
          else:
            vk = (v.key(), c)
            v2 = vmemo.get(vk)
            if v2 is None:
              b2, v2 = self._leaf_view(n.view, c - 1, cells, kshape, n.dtype)
              if b2 is b: vmemo[vk] = v2
              else: b = b2  # (a copy: emitted again for the next leaf, as _build_py does)
            v = v2
        lk = (b.id, v.key(), n.dtype)
        kn = loads.get(lk)
        if kn is None:
          kn = loads[lk] = KNode.load(b, v, n.dtype)
          knodes.append(kn)
      else:
        src = n.src
        k = len(src)
        kn = KNode(n.op, n.dtype, tuple([kn_of[j] for j in srcs[p:p + k]]), None, None, None, src[0].dtype,
                   n.opcode)
        p += k
        knodes.append(kn)
      kn_of.append(kn)
    return knodes, kn_of[-1]


  def _build_py(self, top: PNode, kshape, expand_top: bool):
    """(knodes in dependency order, top's KNode) computing `top` over index space kshape. A (node, pending
    movements) pair is keyed by one int, idx + (cell + 1) * N (cell -1: none), so the walk builds no tuples."""
    knodes: list = []
    memo: dict[int, KNode] = {}
    loads: dict = {}
    cells: list = []  # cell c: (movement, parent cell or None), the pending movements of a leaf read below it
    cell_ids: dict = {}
    N = len(self.nodes)

    def cell_of(mv, parent):
      k = (mv, parent)
      c = cell_ids.get(k)
      if c is None:
        c = cell_ids[k] = len(cells)
        cells.append(k)
      return c

    stack: list = [(top, None, None)]
    while stack:
      n, cell, kids = stack.pop()
      key = n.idx if cell is None else n.idx + (cell + 1) * N
      if kids is None:  # first visit: a leaf's load, or its operands pushed
        if key in memo: continue
        if (n.op not in _ALU_MOVE) if (expand_top and n is top and cell is None) else (n.view is not None):
          b, v = self._leaf_view(n.view, cell, cells, kshape, n.dtype)
          lk = (b.id, v.key(), n.dtype)
          kn = loads.get(lk)
          if kn is None:
            kn = loads[lk] = KNode.load(b, v, n.dtype)
            knodes.append(kn)
          memo[key] = kn
          continue
        if n.op in _MOVE:
          c = cell_of((n.op.name, n.arg if n.op is not Ops.FLIP else tuple(n.arg)), cell)
          s = n.src[0]
          kids = ((s, c, s.idx + (c + 1) * N),)
        else:
          bc, sh = None, n.shape
          kids = []
          for s in n.src:
            if s.shape == () and sh != ():  # a () operand broadcast to this shape
              if bc is None: bc = cell_of(("BCAST", sh), cell)
              kids.append((s, bc, s.idx + (bc + 1) * N))
            else:
              kids.append((s, cell, s.idx if cell is None else s.idx + (cell + 1) * N))
        stack.append((n, cell, kids))
        for s, c, sk in reversed(kids):
          if sk not in memo: stack.append((s, c, None))
        continue
      if n.op in _MOVE:  # a movement is only a view change: it is its source's value
        memo[key] = memo[kids[0][2]]
        continue
      kn = memo[key] = KNode(n.op, n.dtype, tuple([memo[sk] for _, _, sk in kids]), None, None, None, n.src[0].dtype,
                             n.opcode)
      knodes.append(kn)
    return knodes, memo[top.idx]


__all__ = ["Planner", "Buf", "KNode", "Store", "Loop", "CallStep", "compute_dtype", "storage_dtype"]
