"""Lowering: one planned Loop (engine/planner.py) becomes the int64 words of one VM kernel (csrc/vm.c's format).
Here the index space is simplified (size-1 dims dropped, dims ordered by the memory order of the main view, adjacent
dims merged where every view agrees), registers are allocated by liveness (a dying operand's register is reused in
place), and a multiply-then-sum reduction whose operands broadcast against each other becomes a blocked contraction
(VK_GEMM) instead of a loop."""
from __future__ import annotations
import math
from ..ops import Ops
from ..dtype import dtypes
from .planner import Loop, compute_dtype
from .vmlib import OPCODES
from ..ids import value

VK_LOOP, VK_GEMM = value("vm_kinds", "LOOP"), value("vm_kinds", "GEMM")
VR = {None: value("vm_redops", "NONE"), Ops.ADD: value("vm_redops", "ADD"), Ops.MAX: value("vm_redops", "MAX"),
      Ops.MUL: value("vm_redops", "MUL")}
VR_DOT = value("vm_redops", "DOT")
TILE, TILE_REDUCE = 4096, 8192  # elements per tile: registers of a fused group stay in L1/L2
_CMP = (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ)
_OPC = {op: OPCODES[op.name] for op in Ops if op.name in OPCODES}


class KView:
  """A view over the kernel's index space during simplification: buffer, storage dtype, offset, strides, mask."""
  __slots__ = ("buf", "offset", "strides", "mask")

  def __init__(self, buf, offset, strides, mask):
    self.buf, self.offset, self.strides, self.mask = buf, offset, list(strides), None if mask is None else list(mask)


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


def _gemm(loop: Loop, shape, red, loads, store, kn):
  """The words of a VK_GEMM kernel if this reduction is a contraction of two broadcast operands, else None."""
  if loop.redop is not Ops.ADD or loop.rdtype not in (dtypes.float32, dtypes.float64): return None
  top = kn[loop.stores[0][0]]
  if top[0] != "alu" or top[1] is not Ops.MUL or len(loads) != 2: return None
  ia, ib = top[3]
  if ia == ib or kn[ia][0] != "load" or kn[ib][0] != "load": return None
  A, B = loads[ia], loads[ib]
  if A.mask is not None or B.mask is not None or A.buf.stype is not loop.rdtype or B.buf.stype is not loop.rdtype:
    return None
  kdims = [d for d in range(len(shape)) if red[d]]
  ndims = [d for d in range(len(shape)) if not red[d] and B.strides[d] == 0 and A.strides[d] != 0]
  mdims = [d for d in range(len(shape)) if not red[d] and A.strides[d] == 0 and B.strides[d] != 0]
  if len(kdims) != 1 or not ndims or not mdims: return None
  if shape[kdims[0]] < 8: return None
  kd, nd, md = kdims[0], ndims[-1], mdims[-1]
  batch = [d for d in range(len(shape)) if d not in (kd, nd, md)]
  C = store
  w = [VK_GEMM, loop.rdtype.id, A.buf.id, A.offset, B.buf.id, B.offset, C.buf.id, C.offset,
       shape[nd], shape[md], shape[kd], A.strides[nd], A.strides[kd], B.strides[kd], B.strides[md],
       C.strides[nd], C.strides[md], len(batch)]
  for d in batch: w += [shape[d], A.strides[d], B.strides[d], C.strides[d]]
  return w


def _is_const(kn, i, v) -> bool:
  k = kn[i]
  return k[0] == "load" and k[1].kind == "const" and k[2].is_scalar() and float(k[1].data) == v


def _abs_peephole(kn: list) -> list:
  """x * sign(x), the form mathops' abs takes (x * where(x != 0, where(x < 0, -1, 1), 0)), as one ABS op with
  exactly that product's results; the select chain is left to dead-code elimination."""
  out = list(kn)
  for i, k in enumerate(kn):
    if k[0] != "alu" or k[1] is not Ops.MUL: continue
    for x, s in (k[3], k[3][::-1]):
      w = kn[s]
      if w[0] != "alu" or w[1] is not Ops.WHERE or not _is_const(kn, w[3][2], 0): continue
      ne, wi = kn[w[3][0]], kn[w[3][1]]
      if not (ne[0] == "alu" and ne[1] is Ops.CMPNE and ne[3][0] == x and _is_const(kn, ne[3][1], 0)): continue
      if not (wi[0] == "alu" and wi[1] is Ops.WHERE and _is_const(kn, wi[3][1], -1) and _is_const(kn, wi[3][2], 1)):
        continue
      lt = kn[wi[3][0]]
      if not (lt[0] == "alu" and lt[1] is Ops.CMPLT and lt[3][0] == x and _is_const(kn, lt[3][1], 0)): continue
      out[i] = ("alu", "ABS", k[2], (x,), k[2])
      break
  return out


def lower_loop(loop: Loop) -> tuple[list[int], bool]:
  """(words, is_fused_group) of one kernel."""
  kn = loop.knodes
  loads = {i: KView(k[1], k[2].offset, k[2].strides, k[2].mask) for i, k in enumerate(kn) if k[0] == "load"}
  stores = [KView(b, v.offset, v.strides, v.mask) for _, b, v in loop.stores]
  red0 = [d in loop.redaxes for d in range(len(loop.shape))] if loop.redop is not None else [False] * len(loop.shape)
  views = list(loads.values()) + stores
  primary = stores[0] if loop.redop is None else next(
    (v for v in loads.values() if any(v.strides)), stores[0])
  shape, red = _simplify(list(loop.shape), views, red0, primary)
  if loop.redop is not None:
    g = _gemm(loop, shape, red, loads, stores[0], kn)
    if g is not None: return g, True
  numel = math.prod(shape)
  T = max(1, min(TILE if loop.redop is None else TILE_REDUCE, numel))
  kn = _abs_peephole(kn)
  live = {i for i, _, _ in loop.stores}
  for i in range(len(kn) - 1, -1, -1):  # dead-code elimination from the stores back
    if i in live and kn[i][0] == "alu": live.update(kn[i][3])
  nalu = sum(1 for k in kn if k[0] == "alu")
  # registers
  regs: list[tuple[int, int]] = []
  free: dict[tuple[int, int], list[int]] = {}
  reg_of: dict[int, int] = {}
  scalar: dict[int, bool] = {}
  last: dict[int, int] = {}
  pinned = {i for i, _, _ in loop.stores}
  for i, k in enumerate(kn):
    if k[0] == "alu" and i in live:
      for s in k[3]: last[s] = i

  def alloc(ct: int, sc: bool) -> int:
    fl = free.get((ct, sc))
    if fl: return fl.pop()
    regs.append((ct, int(sc)))
    return len(regs) - 1

  load_words, ins_words = [], []
  nd = len(shape)
  for i, k in enumerate(kn):
    if k[0] != "load" or i not in live: continue
    v = loads[i]
    sc = v.mask is None and all(st == 0 or s == 1 for st, s in zip(v.strides, shape))
    r = len(regs)
    regs.append((compute_dtype(v.buf.stype).id, int(sc)))
    reg_of[i], scalar[i] = r, sc
    load_words += [r, v.buf.id, v.buf.stype.id, v.offset, 0 if v.mask is None else 1, *v.strides]
    if v.mask is not None: load_words += [m[0] for m in v.mask] + [m[1] for m in v.mask]
  nins = 0
  for i, k in enumerate(kn):
    if k[0] != "alu" or i not in live: continue
    _, op, dt, srcs, sdt = k
    sc = all(scalar[s] for s in srcs)
    for s in srcs:  # operands dying here free their registers first: the result may reuse one in place
      if last.get(s) == i and s not in pinned and kn[s][0] == "alu" and op is not Ops.SIN:
        rs = reg_of[s]
        fl = free.setdefault(regs[rs], [])
        if rs not in fl: fl.append(rs)
    ct = dtypes.bool if op in _CMP else compute_dtype(dt)
    r = alloc(ct.id, sc)
    reg_of[i], scalar[i] = r, sc
    a = reg_of[srcs[0]]
    b = reg_of[srcs[1]] if len(srcs) > 1 else -1
    if op is Ops.WHERE: c = reg_of[srcs[2]]
    elif op is Ops.BITCAST: c = sdt.id
    else: c = -1
    lt = sdt.id if op in _CMP else dt.id
    ins_words += [OPCODES["ABS"] if op == "ABS" else _OPC[op], lt, r, a, b, c]
    nins += 1
  store_words = []
  top_vec = None
  for (ki, b, _), v in zip(loop.stores, stores):
    r = reg_of[ki]
    if loop.redop is not None and scalar[ki]:  # a reduction reads a full tile: broadcast a scalar first
      ct = regs[r][0]
      top_vec = len(regs)
      regs.append((ct, 0))
      ins_words += [OPCODES["MOV"], compute_dtype(loop.rdtype).id, top_vec, r, -1, -1]
      nins += 1
      r = top_vec
    store_words += [r, b.id, b.stype.id, v.offset, 0, *v.strides]
  redmask = sum(1 << d for d in range(nd) if red[d]) if loop.redop is not None else 0
  post = 0
  if loop.redop is not None: post = 1 if loop.rdtype is dtypes.float16 else 2 if loop.rdtype is dtypes.bfloat16 else 0
  redop = VR[loop.redop]
  top = kn[loop.stores[0][0]]
  if (loop.redop is Ops.ADD and loop.rdtype in (dtypes.float32, dtypes.float64) and top[0] == "alu" and
      top[1] is Ops.MUL and loop.stores[0][0] == len(kn) - 1 and not any(scalar[s] for s in top[3])):
    redop = VR_DOT  # a row's sum of products, without the product tile
  words = [VK_LOOP, nd, T, redop, loop.rdtype.id if loop.rdtype is not None else 0, post, redmask, *shape,
           len(regs)]
  for ct, sc in regs: words += [ct, sc]
  words += [sum(1 for i in loads if i in live), *load_words, nins, *ins_words, len(stores), *store_words]
  return words, nalu > 0


__all__ = ["lower_loop", "TILE", "TILE_REDUCE"]
