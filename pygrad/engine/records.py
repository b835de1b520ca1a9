"""The records the compile stages hand each other (engine/planner.py makes them, engine/lower.py and
engine/regalloc.py read them, engine/program.py places and runs them): buffers, a kernel's expression nodes and
stores, a loop kernel before lowering, where an output lives, a CALL step; and the dtypes a value is computed and
stored in."""
from __future__ import annotations
import math
from typing import NamedTuple
from ..ops import Ops
from ..dtype import DType, dtypes
from .views import View

_F16, _BF16 = dtypes.float16, dtypes.bfloat16


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


__all__ = ["compute_dtype", "storage_dtype", "Buf", "KNode", "Store", "Loop", "OutRef", "CallStep"]
