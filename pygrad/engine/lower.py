"""Lowering: one planned Loop (engine/planner.py) becomes the int64 words of one VM kernel (csrc/vm_read.c's format), in
passes that each do one thing:

1. `index_space`: size-1 dims dropped, dims ordered by the memory order of the main view, adjacent dims merged
   where every view agrees;
2. `contraction`: a multiply-then-sum reduction whose operands broadcast against each other becomes a blocked
   contraction (VK_GEMM) instead of a loop;
3. `peephole`: the rules of `pm_peephole` (UPat patterns over the kernel's KNodes) pick better instructions;
4. `live_nodes`: dead-code elimination from the stores back;
5. `allocate` (engine/regalloc.py): registers by liveness (a dying operand's register is reused in place; linear
   in the kernel's size);
6. `emit`: the words, with the dot-product choice for a row's sum of products;
7. `split`: a kernel whose register file would pass REGFILE_BUDGET (a deep chain's gradient keeps every forward
   value live) is cut into several kernels over the same index space, the values one part needs from an earlier
   part carried in arena buffers (spills)."""
from __future__ import annotations
import math
from operator import attrgetter
from typing import NamedTuple
import numpy as np
from ..ops import Ops
from ..dtype import dtypes
from ..upat import UPat, PatternMatcher
from .planner import Loop, KNode, Buf, compute_dtype
from .vmlib import OPCODES
from .regalloc import CMP as _CMP, OPC as _OPC, Regs, allocate, allocate_c, allocate_cols, ct_id as _ct_id
from ..ids import value

VK_LOOP, VK_GEMM = value("vm_kinds", "LOOP"), value("vm_kinds", "GEMM")
VR = {None: value("vm_redops", "NONE"), Ops.ADD: value("vm_redops", "ADD"), Ops.MAX: value("vm_redops", "MAX"),
      Ops.MUL: value("vm_redops", "MUL")}
VR_DOT = value("vm_redops", "DOT")  # a row's sum of products, without the product tile
# the VM's limits (csrc/tables.h): dims of an index space, its elements, registers of one kernel and their bytes
VM_MAXDIM, VM_MAXSIZE = value("consts", "VM_MAXDIM"), value("consts", "VM_MAXSIZE")
VM_MAXREGS, VM_MAXREGFILE = value("consts", "VM_MAXREGS"), value("consts", "VM_MAXREGFILE")
TILE, TILE_REDUCE = 4096, 8192  # elements per tile: registers of a fused group stay in L1/L2
# bytes of one worker's register file (as PG_VM_MAXREGFILE counts them) past which a kernel is split: the VM
# allocates a file per thread at every run. Not lower: a scalar register (80 bytes) is the cheapest home of a live
# value, and splitting the 1M-deep chain's gradient (80 MB of them) at 16 MiB cost 2.3x its compile CPU time, +1 GB
# of peak RSS and 2.6x its run time (bench/bench_deep_chain.py --regfile-budget); a tile register is 32 KB, so a
# kernel splits past 4096 live tiles
REGFILE_BUDGET = 128 << 20
_G_OP = attrgetter("op")


class KView:
  """A view over the kernel's index space during simplification: buffer, offset, strides, mask (lists, edited in
  place as dims are dropped, reordered and merged)."""
  __slots__ = ("buf", "offset", "strides", "mask")

  def __init__(self, buf, offset, strides, mask):
    self.buf, self.offset, self.strides, self.mask = buf, offset, list(strides), None if mask is None else list(mask)

  @staticmethod
  def of(buf, v) -> KView: return KView(buf, v.offset, v.strides, v.mask)


class Space(NamedTuple):
  """A kernel's simplified index space: dims, which are reduced, and the views of its loads and stores over it."""
  shape: list
  red: list
  loads: dict  # KNode -> KView, in kernel order
  stores: list  # KView per store


# ---- 1. index space ----
def _simplify(shape, views, red, primary):
  """(shape, reduce flags) after dropping size-1 dims, reordering by the primary view and merging dims."""
  keep = [d for d, s in enumerate(shape)
          if s != 1 or any(v.mask is not None and v.mask[d] != (0, 1) for v in views)]
  shape, red = [shape[d] for d in keep], [red[d] for d in keep]
  for v in views:
    v.strides = [v.strides[d] for d in keep]
    if v.mask is not None: v.mask = [v.mask[d] for d in keep]
  if primary is not None and shape:
    st = primary.strides
    order = sorted(range(len(shape)), key=lambda d: (-(1 << 62) if st[d] == 0 else -abs(st[d])))
    shape, red = [shape[d] for d in order], [red[d] for d in order]
    for v in views:
      v.strides = [v.strides[d] for d in order]
      if v.mask is not None: v.mask = [v.mask[d] for d in order]
  d = len(shape) - 2
  while d >= 0:  # merge d into d+1 when every view steps through both as one dim
    ok = red[d] == red[d + 1] and all(
      v.strides[d] == v.strides[d + 1] * shape[d + 1] and
      (v.mask is None or (v.mask[d] == (0, shape[d]) and v.mask[d + 1] == (0, shape[d + 1]))) for v in views)
    if ok:
      shape[d:d + 2] = [shape[d] * shape[d + 1]]
      red[d:d + 2] = [red[d]]
      for v in views:
        v.strides[d:d + 2] = [v.strides[d + 1]]
        if v.mask is not None: v.mask[d:d + 2] = [(0, shape[d])]
    d -= 1
  if not shape:
    shape, red = [1], [False]
    for v in views:
      v.strides = [0]
      if v.mask is not None: v.mask = [(0, 1)]
  return shape, red


def index_space(loop: Loop) -> Space:
  """The loop's index space simplified for every view it reads and writes."""
  loads = {k: KView.of(k.buf, k.view) for k in loop.loads}
  stores = [KView.of(s.buf, s.view) for s in loop.stores]
  nd = len(loop.shape)
  red0 = [d in loop.redaxes for d in range(nd)] if loop.redop is not None else [False] * nd
  primary = stores[0] if loop.redop is None else next((v for v in loads.values() if any(v.strides)), stores[0])
  shape, red = _simplify(list(loop.shape), list(loads.values()) + stores, red0, primary)
  return Space(shape, red, loads, stores)


# ---- 2. contraction ----
def contraction(loop: Loop, sp: Space) -> list[int] | None:
  """The words of a VK_GEMM kernel if this reduction is a contraction of two broadcast operands, else None."""
  if loop.redop is not Ops.ADD or loop.rdtype not in (dtypes.float32, dtypes.float64): return None
  top = loop.stores[0].src
  if top.is_load or top.op is not Ops.MUL or top.opcode is not None or len(sp.loads) != 2: return None
  ka, kb = top.src
  if ka is kb or not ka.is_load or not kb.is_load: return None
  A, B = sp.loads[ka], sp.loads[kb]
  if A.mask is not None or B.mask is not None or A.buf.stype is not loop.rdtype or B.buf.stype is not loop.rdtype:
    return None
  shape, red = sp.shape, sp.red
  kdims = [d for d in range(len(shape)) if red[d]]
  ndims = [d for d in range(len(shape)) if not red[d] and B.strides[d] == 0 and A.strides[d] != 0]
  mdims = [d for d in range(len(shape)) if not red[d] and A.strides[d] == 0 and B.strides[d] != 0]
  if len(kdims) != 1 or not ndims or not mdims: return None
  if shape[kdims[0]] < 8: return None
  kd, nd, md = kdims[0], ndims[-1], mdims[-1]
  batch = [d for d in range(len(shape)) if d not in (kd, nd, md)]
  C = sp.stores[0]
  w = [VK_GEMM, loop.rdtype.id, A.buf.id, A.offset, B.buf.id, B.offset, C.buf.id, C.offset,
       shape[nd], shape[md], shape[kd], A.strides[nd], A.strides[kd], B.strides[kd], B.strides[md],
       C.strides[nd], C.strides[md], len(batch)]
  for d in batch: w += [shape[d], A.strides[d], B.strides[d], C.strides[d]]
  return w


# ---- 3. peepholes ----
def _abs(x: KNode, m: KNode, z0: KNode, z1: KNode, z2: KNode, neg: KNode, pos: KNode) -> KNode | None:
  """mathops' abs, x * where(x != 0, where(x < 0, -1, 1), 0), as one ABS instruction with exactly that product's
  results (zeros keep their sign); the select chain is left to dead-code elimination."""
  if not (z0.arg == 0 and z1.arg == 0 and z2.arg == 0 and neg.arg == -1 and pos.arg == 1): return None
  return KNode(m.op, m.dtype, (x,), None, None, None, m.dtype, "ABS")


_SIGN = UPat(Ops.WHERE, src=(UPat(Ops.CMPNE, src=(UPat.var("x"), UPat.cvar("z0"))),
                             UPat(Ops.WHERE, src=(UPat(Ops.CMPLT, src=(UPat.var("x"), UPat.cvar("z1"))),
                                                  UPat.cvar("neg"), UPat.cvar("pos"))),
                             UPat.cvar("z2")))
pm_peephole = PatternMatcher([
  (UPat(Ops.MUL, src=[UPat.var("x"), _SIGN], name="m"), _abs),
])
_PEEP_NEEDS = Ops.WHERE  # every rule's pattern has one: kernels without it skip the matcher
# the ops the rules' roots match, and the op one of the root's operands has: a node failing that cheap test cannot
# match, and the matcher (~2 us a node) is not asked
_PEEP_ROOTS = frozenset({Ops.MUL})  # (and _PEEP_NEEDS is the op of one of the root's operands)


def _sign_shaped(w: KNode) -> bool:
  """A WHERE that may be _SIGN: the rules' roots need one (a cheap test of the pattern's first levels)."""
  src = w.src
  return len(src) == 3 and src[0].op is Ops.CMPNE and src[1].op is Ops.WHERE and src[2].op is Ops.CONST


_CMPNE_ID, _WHERE_ID, _CONST_ID = int(Ops.CMPNE), int(Ops.WHERE), int(Ops.CONST)


def _sign_shaped_cols(kc, loads: list[KNode]) -> bool:
  """_sign_shaped's test on a walked kernel's columns (KCols): whether any WHERE may be _SIGN."""
  w = np.flatnonzero((kc.ops == _WHERE_ID) & (kc.ns == 3))
  if not len(w): return False
  op_at = np.concatenate([np.array([int(k.op) for k in loads], np.int64), kc.ops])  # the op at each position
  start = (np.cumsum(kc.ns) - kc.ns)[w]
  return bool(((op_at[kc.flat[start]] == _CMPNE_ID) & (op_at[kc.flat[start + 1]] == _WHERE_ID) &
               (op_at[kc.flat[start + 2]] == _CONST_ID)).any())


def peephole(loop: Loop) -> tuple[list[KNode], list[KNode]]:
  """(knodes, the stores' sources) with pm_peephole's rewrites applied in one forward pass (later nodes read the
  rewritten ones)."""
  kn, tops = loop.knodes, [s.src for s in loop.stores]
  if _PEEP_NEEDS not in map(_G_OP, kn): return kn, tops
  if len(kn) >= _C_MIN and not any(map(_sign_shaped, (k for k in kn if k.op is _PEEP_NEEDS))):
    return kn, tops  # no operand the rules need (rewrites make no WHERE): nothing to rewrite
  new: dict[KNode, KNode] = {}
  out = []
  for k0 in kn:
    k = k0
    if new and not k.is_load and any(s in new for s in k.src):
      k = new[k0] = KNode(k.op, k.dtype, tuple(new.get(s, s) for s in k.src), k.arg, None, None, k.sdtype, k.opcode)
    r = None
    if k.op in _PEEP_ROOTS and k.buf is None and k.opcode is None and any(s.op is _PEEP_NEEDS for s in k.src):
      r = pm_peephole.rewrite(k)
    if r is not None: new[k0] = k = r
    out.append(k)
  if not new: return kn, tops
  return out, [new.get(t, t) for t in tops]


# ---- 4. dead code ----
def live_nodes(kn: list[KNode], tops: list[KNode]) -> set[KNode]:
  """The nodes the stores read, directly or not."""
  live = set(tops)
  for k in reversed(kn):
    if k.buf is None and k in live: live.update(k.src)
  return live


# ---- 5. registers: engine/regalloc.py ----
_C_MIN = 256  # live ALU nodes from which allocate_c's arrays cost less than allocate's loop


class _All:
  """The live set of a kernel whose every node is live (lower_loop's columns path): contains everything."""
  __slots__ = ()
  def __contains__(self, k) -> bool: return True


_ALL = _All()


# ---- 6. words ----
def _is_dot(loop: Loop, kn: list[KNode] | None, tops: list[KNode], rg: Regs) -> bool:
  """A float sum whose expression ends in a product of two tiles: the VM sums products row by row (VR_DOT). kn None:
  the loop's KNodes are not made (lower_loop's columns path), and its columns say which node is last."""
  top = tops[0]
  if not (loop.redop is Ops.ADD and loop.rdtype in (dtypes.float32, dtypes.float64) and not top.is_load and
          top.op is Ops.MUL and top.opcode is None and not any(rg.scalar[s] for s in top.src)): return False
  if kn is not None: return top is kn[-1]
  kc = loop.kcols
  return kc.top == kc.nl + len(kc.ns) - 1


def _tile(loop: Loop, sp: Space) -> int:
  return max(1, min(TILE if loop.redop is None else TILE_REDUCE, math.prod(sp.shape)))


def emit(loop: Loop, sp: Space, kn: list[KNode], tops: list[KNode], live: set[KNode], rg: Regs, T: int = 0,
         dot_ok: bool = True, ins: list[int] | None = None) -> list[int]:
  """The VK_LOOP words: header, register file, loads, instructions, stores. T: the tile size (0: the loop's own);
  dot_ok False keeps a reduction of a product from being a dot reduction (a split kernel decides as the whole);
  ins: the instruction words when allocate_c made them."""
  shape, nd, regs, reg_of = sp.shape, len(sp.shape), list(rg.file), rg.of
  T = T or _tile(loop, sp)
  load_words, nload = [], 0
  for k, v in sp.loads.items():
    if k not in live: continue
    nload += 1
    load_words += [reg_of[k], v.buf.id, v.buf.stype.id, v.offset, 0 if v.mask is None else 1, *v.strides]
    if v.mask is not None: load_words += [m[0] for m in v.mask] + [m[1] for m in v.mask]
  ins_words, nins = ([], 0) if ins is None else (ins, len(ins) // 6)
  WHERE, BITCAST = Ops.WHERE, Ops.BITCAST
  for k in (kn if ins is None else ()):
    if k.buf is not None or k not in live: continue
    op, src = k.op, k.src
    if op is WHERE: b, c = reg_of[src[1]], reg_of[src[2]]
    else:
      b = reg_of[src[1]] if len(src) > 1 else -1
      c = k.sdtype.id if op is BITCAST else -1
    lt = k.sdtype.id if op in _CMP else k.dtype.id
    ins_words += (_OPC[op] if k.opcode is None else OPCODES[k.opcode], lt, reg_of[k], reg_of[src[0]], b, c)
    nins += 1
  store_words = []
  for t, v in zip(tops, sp.stores):
    r = reg_of[t]
    if loop.redop is not None and rg.scalar[t]:  # a reduction reads a full tile: broadcast a scalar first
      vec = len(regs)
      regs.append((regs[r][0], 0))
      ins_words += [OPCODES["MOV"], compute_dtype(loop.rdtype).id, vec, r, -1, -1]
      nins += 1
      r = vec
    store_words += [r, v.buf.id, v.buf.stype.id, v.offset, 0, *v.strides]
  redmask = sum(1 << d for d in range(nd) if sp.red[d]) if loop.redop is not None else 0
  post = 0
  if loop.redop is not None: post = 1 if loop.rdtype is dtypes.float16 else 2 if loop.rdtype is dtypes.bfloat16 else 0
  redop = VR_DOT if dot_ok and _is_dot(loop, kn, tops, rg) else VR[loop.redop]
  words = [VK_LOOP, nd, T, redop, loop.rdtype.id if loop.rdtype is not None else 0, post, redmask, *shape,
           len(regs)]
  for ct, sc in regs: words += [ct, sc]
  words += [nload, *load_words, nins, *ins_words, len(sp.stores), *store_words]
  return words


def regfile_bytes(words: list[int]) -> int:
  """One worker's register file of a VK_LOOP kernel, as csrc/tables.h's PG_VM_MAXREGFILE counts it."""
  nd, T = words[1], words[2]
  nregs = words[7 + nd]
  nsc = sum(words[9 + nd:9 + nd + 2 * nregs:2])  # (compute type, scalar) pairs
  return 128 + 16 * nregs + 64 * nsc + (T * 8 + 63) // 64 * 64 * (nregs - nsc)


def regfile_fits(words: list[int]) -> bool:
  """Whether a VK_LOOP kernel's registers fit the VM: their count, and one worker's register file."""
  return words[7 + words[1]] <= VM_MAXREGS and regfile_bytes(words) <= VM_MAXREGFILE


# ---- 7. split ----
_SCALAR_COST = 64 + 16  # register-file bytes of a scalar register (its slot and its two pointers)


def _vec_cost(T: int) -> int: return (T * 8 + 63) // 64 * 64 + 16


class Part(NamedTuple):
  """One VM kernel of a planned loop: its words, whether it computes (a fused group), and the buffers it reads and
  writes (for the arena's liveness)."""
  words: list
  fused: bool
  bufs: list


class Runs(NamedTuple):
  """A kernel's ALU nodes cut into runs (one kernel each) and the run of each node."""
  runs: list
  run_of: dict


def runs(kn: list[KNode], live: set[KNode], tops: list[KNode], sp: Space, T: int, cap: int,
         maxregs: int) -> Runs | None:
  """Cut the live ALU nodes, in order, into runs whose register files (loads, spill loads, results) stay within cap
  bytes and maxregs registers. Within a run, registers are given exactly as `allocate` gives them to that run's
  kernel: a value a later run reads is one of its stores, so it holds its register to the run's end, as it would
  have held it to its later use; a load (a buffer's or an earlier run's value) holds one from the run's start.
  Linear in the kernel's size. None when one node alone does not fit."""
  vcost, shape = _vec_cost(T), sp.shape
  load_sc = {k: v.mask is None and all(st == 0 or n == 1 for st, n in zip(v.strides, shape))
             for k, v in sp.loads.items() if k in live}
  spill_sc = math.prod(shape) == 1  # an earlier run's value is read from a buffer over the whole index space
  alu = [k for k in kn if k.buf is None and k in live]
  last: dict[KNode, KNode] = {}
  for k in alu:
    for s in k.src: last[s] = k
  pinned, run_of, bool_id = set(tops), {}, dtypes.bool.id
  cur: list[KNode] = []
  out = [cur]
  sc_of: dict = {}  # this run's loads and results -> scalar
  reg_of: dict = {}  # this run's results -> register
  rtype: list = []  # this run's result registers' (compute type, scalar)
  free: dict = {}
  used = nregs = i = 0
  while i < len(alu):
    k = alu[i]
    src = k.src
    if len(src) == 2 and src[0] is src[1]: src = src[:1]
    elif len(src) == 3: src = tuple(dict.fromkeys(src))
    add, sc, loads = 0, True, None
    for s in src:
      ssc = sc_of.get(s)
      if ssc is None:  # a buffer's load, or an earlier run's value: a load register in this run
        ssc = load_sc[s] if s.buf is not None else spill_sc
        if loads is None: loads = [(s, ssc)]
        else: loads.append((s, ssc))
        add += _SCALAR_COST if ssc else vcost
      if not ssc: sc = False
    key = (bool_id if k.op in _CMP and k.opcode is None else _ct_id(k.dtype), sc)
    reuse, dying = bool(free.get(key)), None
    for s in src:
      if last[s] is k:
        r = reg_of.get(s)
        if r is not None and s not in pinned:
          if dying is None: dying = [r]
          else: dying.append(r)
          if rtype[r] == key: reuse = True
    if not reuse: add += _SCALAR_COST if sc else vcost
    grow = (len(loads) if loads else 0) + (not reuse)
    if used + add > cap or nregs + grow > maxregs:
      if not cur: return None  # alone in a run, it still does not fit
      cur = []
      out.append(cur)
      sc_of, reg_of, rtype, free, used, nregs = {}, {}, [], {}, 0, 0
      continue  # the same node again, first of a new run
    if loads:
      for s, ssc in loads: sc_of[s] = ssc
    if dying:
      for r in dying: free.setdefault(rtype[r], []).append(r)
    fl = free.get(key)
    if fl: r = fl.pop()
    else:
      r = len(rtype)
      rtype.append(key)
    used, nregs = used + add, nregs + grow
    reg_of[k], sc_of[k], run_of[k] = r, sc, len(out) - 1
    cur.append(k)
    i += 1
  return Runs(out, run_of)


def _unsplit_scalar(kn: list[KNode], live: set[KNode], sp: Space) -> dict:
  """Each live node's scalarity in the kernel unsplit (allocate's)."""
  sc = {k: v.mask is None and all(st == 0 or n == 1 for st, n in zip(v.strides, sp.shape))
        for k, v in sp.loads.items() if k in live}
  for k in kn:
    if k.buf is None and k in live: sc[k] = all(sc[s] for s in k.src)
  return sc


def split(loop: Loop, sp: Space, kn: list[KNode], tops: list[KNode], live: set[KNode], T: int, rs: Runs,
          new_buf) -> list[Part] | None:
  """One kernel per run, all over the kernel's simplified index space and tile size (so every element is computed
  in the same tile as unsplit: the same results, bit for bit). A value read outside its run is stored by its run
  into an arena buffer of its compute type over the whole index space (new_buf(stype, shape, dtype) makes it) and
  loaded by the runs that read it; the kernel's stores go with the run computing their value, a reduction's with
  the last run; a dot reduction stays one only if it was one unsplit."""
  run_of, last_run = rs.run_of, len(rs.runs) - 1
  red = loop.redop is not None
  st, acc = [0] * len(sp.shape), 1
  for d in range(len(sp.shape) - 1, -1, -1): st[d], acc = acc, acc * sp.shape[d]
  store_run = [last_run if red or t.buf is not None else run_of[t] for t in tops]
  carried: dict[KNode, Buf] = {}
  for j, run in enumerate(rs.runs):
    for k in run:
      for s in k.src:
        if s.buf is None and run_of[s] != j and s not in carried: carried[s] = None
  for t, j in zip(tops, store_run):
    if t.buf is None and run_of[t] != j: carried[t] = None
  for s in carried: carried[s] = new_buf(compute_dtype(s.dtype), tuple(sp.shape), s.dtype)
  top = tops[0]
  dot_ok = (loop.redop is Ops.ADD and not top.is_load and top.op is Ops.MUL and
            _is_dot(loop, kn, tops, Regs(None, None, _unsplit_scalar(kn, live, sp))))
  parts = []
  for j, run in enumerate(rs.runs):
    new: dict[KNode, KNode] = {}
    loads: dict[KNode, KView] = {}
    kj: list[KNode] = []

    def operand(s):
      """s as this run reads it: a buffer's load, this run's node (rewritten or not), or an earlier run's value."""
      if s.buf is not None:
        if s not in loads:
          loads[s] = sp.loads[s]
          kj.append(s)
        return s
      r = new.get(s)
      if r is None and run_of[s] != j:
        b = carried[s]
        r = new[s] = KNode(Ops.BUFFER, s.dtype, (), None, b, None)
        loads[r] = KView(b, 0, st, None)
        kj.append(r)
      return s if r is None else r
    for k in run:
      changed = False
      for s in k.src:
        if s.buf is not None or s in new or run_of[s] != j: changed = operand(s) is not s or changed
      if changed:
        new[k] = KNode(k.op, k.dtype, tuple([new.get(s, s) for s in k.src]), k.arg, None, None, k.sdtype, k.opcode)
      kj.append(new.get(k, k))
    tj, vj = [], []
    for k in run:
      if k in carried:
        tj.append(new.get(k, k))
        vj.append(KView(carried[k], 0, st, None))
    for t, v, r in zip(tops, sp.stores, store_run):
      if r == j:
        tj.append(operand(t))
        vj.append(v)
    lp = Loop(loop.shape, kj, [], loop.redop if j == last_run else None, loop.redaxes,
              loop.rdtype if j == last_run else None)
    spj, livej = Space(sp.shape, sp.red, loads, vj), set(kj)
    words = emit(lp, spj, kj, tj, livej, allocate(kj, livej, tj, spj), T, dot_ok)
    if not regfile_fits(words): return None
    bufs = list({id(v.buf): v.buf for v in (*loads.values(), *vj)}.values())
    parts.append(Part(words, True, bufs))
  return parts


def _loop_bufs(loop: Loop, sp: Space | None = None) -> list[Buf]:
  """The distinct buffers a loop reads and writes, in order of first use (sp: its space, whose loads are the loop's
  in order)."""
  seen: dict[int, Buf] = {}
  for k in (loop.knodes if sp is None else sp.loads):
    if k.buf is not None and k.buf.id not in seen: seen[k.buf.id] = k.buf
  for st in loop.stores: seen.setdefault(st.buf.id, st.buf)
  return list(seen.values())


def lower_loop(loop: Loop, new_buf=None) -> list[Part] | None:
  """The VM kernels of one planned loop: one, or (given new_buf, which makes arena buffers) several when its register
  file would pass REGFILE_BUDGET; None when the VM cannot take it: an index space of more than VM_MAXDIM dims after
  simplification, or a register file past the VM's (the program runs such a kernel with numpy:
  engine/npkernel.py)."""
  sp = index_space(loop)
  if len(sp.shape) > VM_MAXDIM: return None
  if loop.redop is not None:
    g = contraction(loop, sp)
    if g is not None: return [Part(g, True, _loop_bufs(loop))]
  kc = loop.kcols
  if (kc is not None and not loop.made and loop.size >= _C_MIN and len(sp.loads) == kc.nl and
          not _sign_shaped_cols(kc, loop.loads)):
    # a kernel the planner walked in C, without a WHERE shaped as every peephole needs: every node is live, and
    # registers and words come from its columns (its KNodes are made only if it must be split)
    kn, tops, live = None, [s.src for s in loop.stores], _ALL
    rg, ins = allocate_cols(loop, sp, tops)
  else:
    kn, tops = peephole(loop)
    live = set(kn) if kn is loop.knodes and loop.reachable else live_nodes(kn, tops)
    if len(kn) < _C_MIN: rg, ins = allocate(kn, live, tops, sp), None
    elif kn is loop.knodes and kc is not None and len(sp.loads) == kc.nl: rg, ins = allocate_cols(loop, sp, tops)
    else: rg, ins = allocate_c(kn, live, tops, sp)
  if new_buf is not None:
    T = _tile(loop, sp)
    cap = min(REGFILE_BUDGET, VM_MAXREGFILE) - 128 - (_vec_cost(T) if loop.redop is not None else 0)  # (a MOV's)
    nsc = sum(sc for _, sc in rg.file)
    if nsc * _SCALAR_COST + (len(rg.file) - nsc) * _vec_cost(T) > cap or len(rg.file) >= VM_MAXREGS:
      if kn is None: kn, live = loop.knodes, set(loop.knodes)
      rs = runs(kn, live, tops, sp, T, cap, VM_MAXREGS - 1)
      if rs is not None and len(rs.runs) > 1: return split(loop, sp, kn, tops, live, T, rs, new_buf)
  # (ins: allocate_c's words, one per live ALU node)
  fused = bool(ins) or (kn is not None and any(k.buf is None for k in kn))
  words = emit(loop, sp, kn, tops, live, rg, ins=ins)  # (which appends to ins)
  if not regfile_fits(words): return None
  return [Part(words, fused, _loop_bufs(loop, sp))]


__all__ = ["lower_loop", "Part", "REGFILE_BUDGET", "regfile_bytes", "regfile_fits", "pm_peephole",
           "TILE", "TILE_REDUCE", "VM_MAXDIM", "VM_MAXSIZE"]
