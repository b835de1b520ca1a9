"""Scalar types. A DType's `id` and itemsize are shared with the C core and the VM: csrc/tables.h, checked at import
by pygrad/ids.py."""
from __future__ import annotations
from dataclasses import dataclass
import numpy as np


@dataclass(frozen=True, eq=False)
class DType:
  """A scalar type: `id` (C enum value), `name`, `itemsize` in bytes, numpy name (`np`), kind 'f', 'i', 'u', 'b', 'v'."""
  id: int
  name: str
  itemsize: int
  np: str
  kind: str

  def __repr__(self): return f"dtypes.{self.name}"
  def __reduce__(self): return (_by_name, (self.name,))
  @property
  def numpy(self) -> np.dtype:
    """The numpy dtype that stores this type (bfloat16 is kept as float32 by the numpy evaluator)."""
    return np.dtype(self.np)


def _by_name(name: str) -> DType: return getattr(dtypes, name)


class dtypes:
  """The dtypes of SPEC §2, plus `void` for structural nodes (TUPLE, SINK, FUNCTION, CALL, NOOP)."""
  bool = DType(0, "bool", 1, "bool", "b")
  int8 = DType(1, "int8", 1, "int8", "i")
  int16 = DType(2, "int16", 2, "int16", "i")
  int32 = DType(3, "int32", 4, "int32", "i")
  int64 = DType(4, "int64", 8, "int64", "i")
  uint8 = DType(5, "uint8", 1, "uint8", "u")
  uint16 = DType(6, "uint16", 2, "uint16", "u")
  uint32 = DType(7, "uint32", 4, "uint32", "u")
  uint64 = DType(8, "uint64", 8, "uint64", "u")
  float16 = DType(9, "float16", 2, "float16", "f")
  bfloat16 = DType(10, "bfloat16", 2, "float32", "f")
  float32 = DType(11, "float32", 4, "float32", "f")
  float64 = DType(12, "float64", 8, "float64", "f")
  void = DType(13, "void", 0, "void", "v")

  @staticmethod
  def is_float(d: DType) -> bool: return d.kind == "f"
  @staticmethod
  def is_int(d: DType) -> bool: return d.kind in "iu"
  @staticmethod
  def is_unsigned(d: DType) -> bool: return d.kind == "u"
  @staticmethod
  def is_bool(d: DType) -> bool: return d.kind == "b"
  @staticmethod
  def from_numpy(d) -> DType:
    """The DType of a numpy dtype."""
    d = np.dtype(d)
    for t in ALL:
      if t.np == d.name and t is not dtypes.bfloat16: return t
    raise TypeError(f"numpy dtype {d} has no pygrad dtype")


ALL: tuple[DType, ...] = tuple(v for v in vars(dtypes).values() if isinstance(v, DType))
BY_ID: tuple[DType, ...] = tuple(sorted(ALL, key=lambda d: d.id))
VALUE_DTYPES: tuple[DType, ...] = tuple(d for d in BY_ID if d is not dtypes.void)

def sum_acc_dtype(d: DType) -> DType:
  """The dtype `sum` and `prod` return for an operand of dtype d (tinygrad's `sum_acc_dtype`, and JAX's result
  dtype): bool and signed ints narrower than 64 bits in int32, unsigned ones in uint32, so 300 `True`s sum to 300
  and a uint8 sum does not wrap at 256; 64-bit ints and floats keep their dtype (a float16/bfloat16 REDUCE_AXIS
  already accumulates in float32 and rounds once)."""
  if dtypes.is_float(d) or d.itemsize == 8: return d
  return dtypes.uint32 if dtypes.is_unsigned(d) else dtypes.int32


def promote(a: DType, b: DType) -> DType:
  """The dtype a binary method computes in when its operands differ: numpy's and torch's for two ints (a signed and
  an unsigned int meet in a signed int that holds both: uint8 and int8 in int16, uint32 and int32 in int64; a rank
  order made uint8 + int8 int8, so 255 + 0 was -1), torch's where a float meets an int (the float type) and for
  float16 with bfloat16 (float32); uint64 with a signed int is a TypeError (no int holds both; numpy's float64 would
  round). bool gives way to anything."""
  if a is b or b is dtypes.bool: return a
  if a is dtypes.bool: return b
  fa, fb = dtypes.is_float(a), dtypes.is_float(b)
  if fa != fb: return a if fa else b
  if fa:
    if a.itemsize == b.itemsize == 2: return dtypes.float32
    return a if a.itemsize > b.itemsize else b
  ua, ub = dtypes.is_unsigned(a), dtypes.is_unsigned(b)
  if ua == ub: return a if a.itemsize > b.itemsize else b
  s, u = (b, a) if ua else (a, b)
  if s.itemsize > u.itemsize: return s
  if u.itemsize == 8:
    raise TypeError(f"no integer dtype holds both {a.name} and {b.name}: cast one of them first")
  return {1: dtypes.int16, 2: dtypes.int32, 4: dtypes.int64}[u.itemsize]


INT_RANGE = {d: ((0, 2 ** (8 * d.itemsize) - 1) if dtypes.is_unsigned(d) else
                 (-2 ** (8 * d.itemsize - 1), 2 ** (8 * d.itemsize - 1) - 1)) for d in BY_ID if dtypes.is_int(d)}


def coerce(value, dtype: DType):
  """value as the Python scalar a CONST of dtype holds: a float, a bool, or an int in range (a ValueError for a
  fraction, NaN or inf as an int, or an int out of range: never truncated or wrapped silently)."""
  if dtypes.is_float(dtype): return float(value)
  if dtypes.is_bool(dtype): return bool(value)
  if dtypes.is_int(dtype):
    if isinstance(value, float) and not value.is_integer():  # NaN, inf and fractions: never truncated silently
      raise ValueError(f"CONST: {value} has no {dtype.name} value")
    v = int(value)
    lo, hi = INT_RANGE[dtype]
    if not lo <= v <= hi: raise ValueError(f"CONST: {v} out of range for {dtype.name}")
    return v
  raise TypeError(f"CONST: dtype {dtype.name} holds no value")
