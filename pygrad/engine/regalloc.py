"""Register allocation for one VM kernel (lowering's pass 5, engine/lower.py): loads first, then each ALU node's
result, an operand's register reused where it dies. `allocate` walks KNodes in Python (small kernels);
`allocate_c` and `allocate_cols` hand the kernel to csrc/regalloc.c as columns and also make emit's instruction
words a column at a time, node for node the same as allocate and emit give."""
from __future__ import annotations
from itertools import chain, repeat
from operator import attrgetter, is_
from typing import TYPE_CHECKING, NamedTuple
import numpy as np
from ..ops import Ops
from ..dtype import BY_ID, dtypes
from .planner import Loop, KNode, compute_dtype
from .vmlib import OPCODES, ffi, lib

if TYPE_CHECKING:
  from .lower import Space

CMP = (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ)  # a comparison's register holds bools; its opcode reads the operands' dtype
OPC = {op: OPCODES[op.name] for op in Ops if op.name in OPCODES}
_G_SRC, _G_OP, _G_OPCODE, _G_DTYPE, _G_SDTYPE, _G_ID, _G_POS = (attrgetter(a) for a in (
  "src", "op", "opcode", "dtype", "sdtype", "id", "pos"))


class Regs(NamedTuple):
  """The register file: (compute dtype id, is scalar) per register, and each live node's register and scalarity."""
  file: list
  of: dict
  scalar: dict


_CT_OF_ID = np.array([compute_dtype(d).id if d is not None else -1 for d in BY_ID], np.int64)  # dtype id ->
_CT_OF = _CT_OF_ID.tolist()  # the id of its compute type (a register's type), as an array and as a list


def ct_id(dt) -> int: return _CT_OF[dt.id]


def allocate(kn: list[KNode], live: set[KNode], tops: list[KNode], sp: Space) -> Regs:
  """Loads first (one register each, in kernel order), then each ALU node's result, reusing the register of an
  operand that dies there (every VM kernel is safe in place: it reads an element before writing that element, and
  a register is only reused for its own compute type, so element sizes agree). Free registers are kept per
  (dtype, scalarity) on stacks, so allocation is linear in the kernel's size."""
  regs: list[tuple[int, int]] = []
  free: dict[tuple[int, int], list[int]] = {}
  reg_of: dict[KNode, int] = {}
  scalar: dict[KNode, bool] = {}
  last: dict[KNode, KNode] = {}
  pinned = set(tops)
  shape = sp.shape
  alu = [k for k in kn if k.buf is None and k in live]
  for k in alu:
    for s in k.src: last[s] = k
  for k, v in sp.loads.items():
    if k not in live: continue
    sc = v.mask is None and all(st == 0 or s == 1 for st, s in zip(v.strides, shape))
    reg_of[k], scalar[k] = len(regs), sc
    regs.append((ct_id(v.buf.stype), int(sc)))
  bool_id = dtypes.bool.id
  for k in alu:
    src = k.src
    sc = True
    for s in src:
      if not scalar[s]:
        sc = False
        break
    # operands dying here free their registers first: the result may reuse one (each operand once)
    for s in (src if len(src) == 1 else dict.fromkeys(src)):
      if last[s] is k and s.buf is None and s not in pinned:
        rs = reg_of[s]
        fl = free.get(regs[rs])
        if fl is None: free[regs[rs]] = [rs]
        else: fl.append(rs)
    ct = bool_id if k.op in CMP and k.opcode is None else ct_id(k.dtype)
    fl = free.get((ct, sc))
    if fl: r = fl.pop()
    else:
      r = len(regs)
      regs.append((ct, int(sc)))
    reg_of[k], scalar[k] = r, sc
  return Regs(regs, reg_of, scalar)




_OPC_OF = np.full(max(int(op) for op in Ops) + 1, -1, np.int64)
for _op, _code in OPC.items(): _OPC_OF[int(_op)] = _code
_CMP_IDS = np.array([int(op) for op in CMP])



def allocate_cols(loop: Loop, sp: Space, tops: list[KNode]) -> tuple[Regs, list[int]]:
  """allocate_c's result for a kernel the planner walked in C, from its columns (Loop.kcols): every node is live
  and in the planner's order, so nothing is gathered from the KNodes again."""
  kc = loop.kcols
  lv = list(sp.loads)
  nl, na = kc.nl, len(kc.ns)
  is_cmp = np.isin(kc.ops, _CMP_IDS)
  is_cmp[[r for r, _ in kc.special]] = False
  ct_alu = np.where(is_cmp, dtypes.bool.id, _CT_OF_ID[kc.dt])
  top = tops[0]
  reads = [(k, i) for i, k in enumerate(lv)] + [(top, kc.top)]
  if top.buf is None:
    e = int(kc.ns.sum())
    reads += list(zip(top.src, kc.flat[e - len(top.src):e].tolist()))
  return _regs_words(lv, nl, na, kc.ns, kc.flat, kc.ops, kc.dt, kc.sdt, kc.special, ct_alu, [kc.top], reads, sp)


def allocate_c(kn: list[KNode], live: set[KNode], tops: list[KNode], sp: Space) -> tuple[Regs, list[int]]:
  """allocate's registers (csrc/regalloc.c runs its loop over the kernel as arrays) and emit's instruction words,
  both computed a whole column at a time: the same registers and words as allocate and emit, node for node. The
  Regs name the registers of the nodes emit reads them of (loads, the stores' sources and their operands)."""
  lv = [k for k in sp.loads if k in live]
  alu = [k for k in kn if k.buf is None and k in live]
  order = lv + alu
  n, nl, na = len(order), len(lv), len(alu)
  for i, k in enumerate(order): k.pos = i  # (a dict of n KNodes costs 5x more)
  srcs = list(map(_G_SRC, alu))
  ns = np.fromiter(map(len, srcs), np.int64, na)
  flat = np.fromiter(map(_G_POS, chain.from_iterable(srcs)), np.int32)
  ops = np.fromiter(map(_G_OP, alu), np.int64, na)
  special = [(i, alu[i].opcode) for i, o in enumerate(map(_G_OPCODE, alu)) if o is not None] \
      if not all(map(is_, map(_G_OPCODE, alu), repeat(None))) else []
  dt_ids = np.fromiter(map(_G_ID, map(_G_DTYPE, alu)), np.int64, na)
  sdt_ids = np.fromiter(map(_G_ID, map(_G_SDTYPE, alu)), np.int64, na)
  is_cmp = np.isin(ops, _CMP_IDS)
  is_cmp[[i for i, _ in special]] = False  # a peephole's instruction computes in its own dtype
  ct_alu = np.where(is_cmp, dtypes.bool.id, _CT_OF_ID[dt_ids])
  # what emit and _is_dot read of the registers: the loads', the stores' sources' and their operands'
  reads = lv + [t for t in tops if t in live] + [s for t in tops if t.buf is None and t in live for s in t.src]
  return _regs_words(lv, nl, na, ns, flat, ops, dt_ids, sdt_ids, special, ct_alu, [t.pos for t in tops if t in live],
                     [(k, k.pos) for k in reads], sp)


def _regs_words(lv, nl, na, ns, flat, ops, dt_ids, sdt_ids, special, ct_alu, pinned_at, reads, sp):
  """allocate_c's second half, over columns: csrc/regalloc.c's registers, the Regs of the (KNode, position) pairs
  in reads, and the instruction words."""
  n = nl + na
  nsrc = np.zeros(n, np.int8)
  nsrc[nl:] = ns
  ct = np.empty(n, np.int32)
  ct[:nl] = [ct_id(v.buf.stype) for v in map(sp.loads.__getitem__, lv)]
  ct[nl:] = ct_alu
  sc_in = np.zeros(n, np.uint8)
  shape = sp.shape
  for i, v in enumerate(map(sp.loads.__getitem__, lv)):
    sc_in[i] = v.mask is None and all(st == 0 or s == 1 for st, s in zip(v.strides, shape))
  pinned = np.zeros(n, np.uint8)
  pinned[pinned_at] = 1
  reg, sc = np.empty(n, np.int32), np.empty(n, np.uint8)
  fct, fsc = np.empty(n, np.int32), np.empty(n, np.uint8)
  cp = ffi.from_buffer
  m = lib.pg_regalloc(n, cp("int8_t[]", nsrc), cp("int32_t[]", flat), len(flat), cp("int32_t[]", ct),
                      cp("uint8_t[]", sc_in), cp("uint8_t[]", pinned), cp("int32_t[]", reg), cp("uint8_t[]", sc),
                      cp("int32_t[]", fct), cp("uint8_t[]", fsc))
  if m < 0: raise RuntimeError(f"pygrad lowering: register allocation failed ({m})")
  rg = Regs(list(zip(fct[:m].tolist(), fsc[:m].tolist())), {k: int(reg[i]) for k, i in reads},
            {k: bool(sc[i]) for k, i in reads})
  # the instructions: (opcode, dtype, dest, a, b, c) per ALU node, as emit writes them
  ins = np.empty((na, 6), np.int64)
  opc = _OPC_OF[ops]
  for i, name in special: opc[i] = OPCODES[name]
  ins[:, 0] = opc
  cmp_lt = np.isin(ops, _CMP_IDS)
  ins[:, 1] = np.where(cmp_lt, sdt_ids, dt_ids)
  ins[:, 2] = reg[nl:]
  start = np.cumsum(ns) - ns
  ins[:, 3] = reg[flat[start]]
  last = len(flat) - 1
  ins[:, 4] = np.where(ns >= 2, reg[flat[np.minimum(start + 1, last)]], -1)
  c = np.where(ops == int(Ops.BITCAST), sdt_ids, -1)
  ins[:, 5] = np.where((ops == int(Ops.WHERE)) & (ns == 3), reg[flat[np.minimum(start + 2, last)]], c)
  return rg, ins.ravel().tolist()


__all__ = ["CMP", "OPC", "Regs", "ct_id", "allocate", "allocate_c", "allocate_cols"]
