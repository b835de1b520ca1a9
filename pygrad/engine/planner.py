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
from operator import itemgetter
import numpy as np
from ..ops import Ops, GroupOp
from .flatten import PNode, LazyNodes
from .views import View, apply
from .kwalk import Graph as _Graph, Walk as _Walk, kcols as _kcols, alu_knodes as _alu_knodes, \
  make_knodes as _make_knodes, PU_ALU as _PU_ALU, PU_ALU_MOVE as _PU_ALU_MOVE, _ALU, _ALU_MOVE
from . import kwalk
from .sweep import sweep as _sweep, covers as _covers
from .records import compute_dtype, storage_dtype, Buf, KNode, Store, Loop, OutRef, CallStep  # noqa: F401 (re-exported)
from .values import const_array, input_name, map_nested
from ..ids import value

VM_MAXSIZE = value("consts", "VM_MAXSIZE")  # csrc/tables.h: bytes of a VM buffer, elements of an index space

_MOVE = GroupOp.Movement
_PURE_ALU = GroupOp.ALU


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
_ORDER = itemgetter(0)  # (a job's (order, sequence))
_C_KEY = True  # small kernels keyed in C (csrc/kkey.c) when the graph has movement ops; else kcache.walked_key
_SWEEP = True  # a large plain graph's visit swept over its columns (sweep.py); else node by node (_visit)
_LAZY_MOVES = 64  # a graph with more than one movement op in this many nodes has its LazyNodes made at once


class Planner:
  """Plan a flattened graph: `kernels` (Loop and CallStep, in order; and lower.Part with a cache), `bufs`, `outputs`
  (per output a Buf or None or a tuple), `inputs` (per input slot the UOp)."""

  def __init__(self, nodes: list[PNode], shaped_outputs: list, inputs: list, cols: dict | None = None, cache=None):
    self.nodes, self.bufs, self.kernels, self.jobs, self.consts = nodes, [], [], [], {}
    self.jobs_sorted = False  # (the sweep's are)
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
    leaf = _sweep(self, graph, nodes, outs) if graph is not None and _SWEEP and _covers(nodes) else None
    if leaf is None:
      for n in (nodes if graph is None else map(nodes.__getitem__, graph.visit)): self._visit(n)
    self.outputs = [map_nested(o, self._output) for o in shaped_outputs]
    # large kernels (few jobs for many nodes) are walked in C (csrc/kwalk.c) over the graph as arrays
    # (small kernels too: _build_c makes their KNodes from the walk's entries, reading every node: made at once)
    self.walk = None
    if len(nodes) >= _WALK_MIN_NODES: self.walk = _Walk(graph or _Graph(nodes), nodes, leaf)
    if cache is None and type(nodes) is LazyNodes and len(nodes) < _WALK_PER_JOB * len(self.jobs): nodes.all()
    # (a list indexed without LazyNodes' method call when every node is made)
    self.flat = nodes._made if type(nodes) is LazyNodes and None not in nodes._made else nodes
    self.vmemo: dict = {}  # (view key, cell) -> the view with the cell's movements applied (_knodes_small)
    self.lmemo, self.sigs = {}, None  # kcache.walked_key's: (node, cell) -> its load; per node its ALU signature
    self.kkey = None  # (kcache.walked_c's state: engine/kkey.py)
    if not self.jobs_sorted: self.jobs.sort(key=_ORDER)
    from .kbatch import run_jobs  # (it imports kcache, which imports this module)
    run_jobs(self, _C_KEY)  # (most of them in one C loop: engine/kbatch.py)
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
    self.jobs.append(((n.idx, len(self.jobs)), n, None))  # (no fn: _emit_root(n), or engine/kbatch.py's C loop)

  def _copy_view(self, view, n: PNode, order, bid: int | None = None) -> Buf:
    """A contiguous copy of a view (a RESHAPE the strides cannot express); bid: its buffer's id, reserved in bufs."""
    if bid is None: b = self._buf("arena", compute_dtype(n.dtype), n.shape, n.dtype)
    else: b = self.bufs[bid] = Buf(bid, "arena", compute_dtype(n.dtype), tuple(n.shape), n.dtype)
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
    if self.cache is not None:  # (lowered now: a gradient copies thousands of views, kcache keys them cheaply)
      parts = self.cache.copied(src, v, dtype, b)
      if parts is not None:
        self.kernels += parts
        return
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
    top_leaf = (top.op not in _ALU_MOVE) if expand_top else (top.view is not None)
    if self.walk.moves and _C_KEY:  # (keyed in C: engine/kkey.py)
      r = self.walk.run_raw(top.idx, top_leaf)
      if r is None: return False
      if r[0] <= min(kwalk.SMALL_KERNEL, self.cache.max_nodes):
        self.kernels += self.cache.walked_c(self, r[0], r[1], top, kshape, (tuple(kshape), *red), b, view)
        return True
      self.prewalk = self.walk.result(*r)
      return False
    w = self.walk.run(top.idx, top_leaf)
    if w[0] is None or len(w[0]) // 3 > min(kwalk.SMALL_KERNEL, self.cache.max_nodes):
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
    if m <= kwalk.SMALL_KERNEL:
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
