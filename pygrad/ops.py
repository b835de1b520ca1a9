"""The op enum and op groups. The integer values are shared with the C core: csrc/tables.h, checked at import by
pygrad/ids.py."""
from __future__ import annotations
import enum


class Ops(enum.IntEnum):
  """Every op of the IR. Values are stable: the C core and the VM use them."""
  # leaves
  CONST = 0; DEFINE_VAR = 1; BUFFER = 2; PARAM = 3; NOOP = 4  # noqa: E702
  # unary ALU
  RECIPROCAL = 5; SQRT = 6; SIN = 7; LOG2 = 8; EXP2 = 9; TRUNC = 10; CAST = 11; BITCAST = 12  # noqa: E702
  # binary ALU
  ADD = 13; MUL = 14; MAX = 15; POW = 16; IDIV = 17; MOD = 18; AND = 19; OR = 20; XOR = 21  # noqa: E702
  SHL = 22; SHR = 23; CMPLT = 24; CMPNE = 25; CMPEQ = 26  # noqa: E702
  # ternary ALU
  WHERE = 27
  # reduce and movement
  REDUCE_AXIS = 28; RESHAPE = 29; EXPAND = 30; PAD = 31; SHRINK = 32; PERMUTE = 33; FLIP = 34  # noqa: E702
  # identities and devices
  CONTIGUOUS = 35; CONTIGUOUS_BACKWARD = 36; DETACH = 37; COPY = 38; MULTI = 39  # noqa: E702
  # structure
  TUPLE = 40; GETTUPLE = 41; FUNCTION = 42; CALL = 43; AFTER = 44; SINK = 45  # noqa: E702

  def __repr__(self): return f"Ops.{self.name}"


class GroupOp:
  """Sets of ops that share a behaviour."""
  Unary = frozenset({Ops.RECIPROCAL, Ops.SQRT, Ops.SIN, Ops.LOG2, Ops.EXP2, Ops.TRUNC})
  Transcendental = frozenset({Ops.SQRT, Ops.SIN, Ops.LOG2, Ops.EXP2, Ops.RECIPROCAL})
  Binary = frozenset({Ops.ADD, Ops.MUL, Ops.MAX, Ops.POW, Ops.IDIV, Ops.MOD, Ops.AND, Ops.OR, Ops.XOR, Ops.SHL,
                      Ops.SHR, Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ})
  Ternary = frozenset({Ops.WHERE})
  ALU = Unary | Binary | Ternary
  Comparison = frozenset({Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ})
  Commutative = frozenset({Ops.ADD, Ops.MUL, Ops.MAX, Ops.CMPNE, Ops.CMPEQ, Ops.XOR, Ops.AND, Ops.OR})
  Bitwise = frozenset({Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR})
  IntOnly = frozenset({Ops.IDIV, Ops.MOD, Ops.SHL, Ops.SHR})
  Movement = frozenset({Ops.RESHAPE, Ops.EXPAND, Ops.PAD, Ops.SHRINK, Ops.PERMUTE, Ops.FLIP})
  Identity = frozenset({Ops.CONTIGUOUS, Ops.CONTIGUOUS_BACKWARD, Ops.DETACH})
  Leaf = frozenset({Ops.CONST, Ops.DEFINE_VAR, Ops.BUFFER, Ops.PARAM, Ops.NOOP})
  Call = frozenset({Ops.FUNCTION, Ops.CALL})
