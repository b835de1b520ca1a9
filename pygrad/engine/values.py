"""Values every engine agrees on: what an input binding may be, what a CONST holds, how float16/bfloat16 round, and
the ALU table giving each op's result in its dtype's own arithmetic (the defined results of numpy_eval's docstring).

The numpy reference evaluator runs the table over whole arrays; the C runner validates its inputs and converts its
constants here; `simplify`'s constant folding calls `scalar_alu` on Python scalars. One module, so that the engine
under test never imports private helpers of its oracle and a folded constant is the value execution gives."""
from __future__ import annotations
import numpy as np
from ..ops import Ops
from ..dtype import DType, dtypes

_F16, _BF16 = dtypes.float16, dtypes.bfloat16
INPUT_OPS = (Ops.BUFFER, Ops.DEFINE_VAR)


# ---- dtypes ----
def round_bfloat16(x) -> np.ndarray:
  """float32 values rounded to bfloat16 precision (nearest, ties to even), still as float32; NaN stays NaN."""
  a = np.asarray(x, np.float32)
  u = a.view(np.uint32)
  r = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
  r = np.where(np.isnan(a), (u | np.uint32(0x00400000)) & np.uint32(0xFFFF0000), r)
  return np.asarray(r, np.uint32).view(np.float32)


def to_float32_odd(x) -> np.ndarray:
  """Numeric values as float32 rounded to odd (toward zero, then the last bit set if inexact): rounding that once
  more to float16/bfloat16 (nearest even) is the correctly rounded half value, as numpy's float64 -> float16 and
  ml_dtypes' casts give (float32 has more than 11 + 2 bits). Rounding to nearest float32 first rounded twice:
  1 + 2**-11 + 2**-40 became 1.0, not 1 + 2**-10, and 65519.99999 inf, not 65504 (torch's float64 -> float16 cast
  does that too). Exact values (float16, float32, ints of 24 bits or less) pass unchanged; int64/uint64 are split
  into two exact float64 parts, whose rounded sum d and error e (only its sign and being nonzero matter) stand for
  the exact value."""
  a = np.asarray(x)
  if a.dtype.kind == "f" and a.dtype.itemsize <= 4 or a.dtype.kind in "b" or \
     a.dtype.kind in "iu" and a.dtype.itemsize <= 2:
    return a.astype(np.float32)
  if a.dtype.kind in "iu" and a.dtype.itemsize == 8:
    lo = a & a.dtype.type(0xFFFFFFFF)
    hi = (a - lo).astype(np.float64)
    lo = lo.astype(np.float64)
    d = hi + lo
    e = lo - (d - hi)  # Fast2Sum (|hi| >= |lo| or hi == 0): hi + lo = d + e exactly
  else:
    d, e = a.astype(np.float64), np.zeros(a.shape)
  return _float32_odd(d, e)


def _float32_odd(d: np.ndarray, e: np.ndarray) -> np.ndarray:
  """The exact value d + e (d = that value rounded to float64) as float32 rounded to odd."""
  with np.errstate(over="ignore", invalid="ignore"):
    f = np.asarray(d.astype(np.float32))
  fd = f.astype(np.float64)
  above = ((d > 0) & (fd > d)) | ((d < 0) & (fd < d)) | ((fd == d) & (((fd > 0) & (e < 0)) | ((fd < 0) & (e > 0))))
  odd = ((fd != d) | (e != 0)).astype(np.uint32)
  return np.asarray((f.view(np.uint32) - above.astype(np.uint32)) | odd, np.uint32).view(np.float32)


def wide(x: np.ndarray, dt: DType) -> np.ndarray:
  """The compute form of a value: float16 widened to float32 (bfloat16 is float32 already)."""
  return x.astype(np.float32) if dt is _F16 else x


def fin(r, dt: DType) -> np.ndarray:
  """A computed result as a value of dtype dt (float16/bfloat16 rounded from float32)."""
  if dt is _F16: return np.asarray(r, np.float32).astype(np.float16)
  if dt is _BF16: return round_bfloat16(np.asarray(r, np.float32))
  return np.asarray(r, dt.numpy)


def bits(dt: DType) -> int: return 8 * dt.itemsize


def int_range(dt: DType) -> tuple[int, int]:
  n = bits(dt)
  return (0, 2 ** n - 1) if dtypes.is_unsigned(dt) else (-2 ** (n - 1), 2 ** (n - 1) - 1)


def lowest(dt: DType):
  """The identity of MAX in dtype dt (-inf, the int's min, False)."""
  if dtypes.is_float(dt): return -np.inf
  if dtypes.is_bool(dt): return False
  return int_range(dt)[0]


def const_array(value, dt: DType) -> np.ndarray:
  """A CONST's value as a () array of dt's storage type (float16/bfloat16 rounded once: to_float32_odd)."""
  if dt not in (_F16, _BF16): return np.asarray(value, dt.numpy)
  if isinstance(value, int) and not -2 ** 63 <= value < 2 ** 64: value = float(value)  # (a UOp's arg is a float)
  return fin(to_float32_odd(np.asarray(value, np.uint64 if isinstance(value, int) and value >= 2 ** 63 else None)), dt)


# ---- inputs ----
def input_name(u) -> str:
  """How an error message names an input node."""
  if u.op is Ops.BUFFER:
    uid, shape, dev, name = (tuple(u.arg) + (None,))[:4]
    return f"BUFFER {name!r} (id {uid}, {shape}:{u.dtype.name} on {dev})" if name is not None else \
      f"BUFFER id {uid} ({shape}:{u.dtype.name} on {dev})"
  if u.op is Ops.DEFINE_VAR: return f"DEFINE_VAR {u.arg[0]!r} ({u.dtype.name})"
  return f"PARAM slot {u.arg[0]}"


def _kind_fits(kind: str, dt: DType) -> bool:
  if kind == "b": return True
  if kind in "iu": return not dtypes.is_bool(dt)
  return kind == "f" and dtypes.is_float(dt)


def as_value(u, v) -> np.ndarray:
  """The bound value of input u as a value of u's dtype, or ValueError naming u."""
  dt = u.dtype
  if isinstance(v, (np.ndarray, np.generic)):
    a = np.asarray(v)
    if dt is _BF16 and a.dtype.name == "bfloat16": return round_bfloat16(a.astype(np.float32))
    if a.dtype != dt.numpy:
      raise ValueError(f"input {input_name(u)}: expected dtype {dt.name} (numpy {dt.numpy}), got {a.dtype}")
    return round_bfloat16(a) if dt is _BF16 else a
  try:
    a = np.asarray(v)
  except (ValueError, TypeError, OverflowError) as e:
    raise ValueError(f"input {input_name(u)}: cannot convert {type(v).__name__} to an array ({e})") from None
  if a.dtype.kind not in "biuf" or not _kind_fits(a.dtype.kind, dt):
    raise ValueError(f"input {input_name(u)}: expected {dt.name} values, got {a.dtype} from {type(v).__name__}")
  if dtypes.is_int(dt):
    lo, hi = int_range(dt)
    if a.size and (a.min() < lo or a.max() > hi):
      raise ValueError(f"input {input_name(u)}: values out of range for {dt.name}")
  return fin(to_float32_odd(a) if dt in (_F16, _BF16) else a, dt)


def input_value(u, v) -> np.ndarray:
  """The value bound to input u (BUFFER: its shape; DEFINE_VAR: a scalar within [vmin, vmax]; PARAM of a compiled
  program: its shape), or ValueError naming u."""
  a = as_value(u, v)
  if u.op is Ops.DEFINE_VAR:
    if a.shape != (): raise ValueError(f"input {input_name(u)}: expected a scalar, got shape {a.shape}")
    _, vmin, vmax = u.arg
    try:
      ok = bool(vmin <= a.item() <= vmax)
    except TypeError:
      ok = True  # bounds that are not numbers constrain nothing here
    if not ok: raise ValueError(f"input {input_name(u)}: value {a.item()!r} outside [{vmin}, {vmax}]")
  elif a.shape != u.shape:
    raise ValueError(f"input {input_name(u)}: expected shape {u.shape}, got {a.shape}")
  return a


def bindings(inputs) -> dict:
  """`inputs` of evaluate() checked the same way for every engine: {node id: (node, validated value)}. A key must
  be a BUFFER or DEFINE_VAR UOp (TypeError/ValueError naming it); every value is validated against its node,
  whether the outputs use it or not (an unused binding is then ignored)."""
  from ..uop import UOp
  if inputs is None: return {}
  if not isinstance(inputs, dict): raise TypeError(f"evaluate: inputs must be a dict, got {type(inputs).__name__}")
  out = {}
  for k, v in inputs.items():
    if type(k) is not UOp: raise TypeError(f"evaluate: inputs keys must be UOps, got {type(k).__name__}")
    if k.op not in INPUT_OPS:
      raise ValueError(f"evaluate: inputs key {k.op.name} is not an input (BUFFER or DEFINE_VAR)")
    out[k._id] = (k, input_value(k, v))
  return out


# ---- the ALU table ----
def _float_pow(a, b) -> np.ndarray:
  """C99's pow of float values, computed in float64 (float32 and the half formats then round once: within half an
  ulp but for results within ~1e-16 of a rounding boundary, as the VM's (float)pow((double)x, (double)y)). The
  exponent goes in as a full array, never a 0-d or stride-0 one: numpy's loop for a scalar exponent takes x ** 0.5 as
  sqrt(x) and x ** -1 as 1 / x, which gives pow(-inf, 0.5) = NaN and pow(-0.0, 0.5) = -0.0 (C99: +inf and +0)."""
  shape = np.broadcast_shapes(np.shape(a), np.shape(b))
  x = np.asarray(a, np.float64)
  y = np.empty(shape if shape else (1,), np.float64)
  y[...] = b
  r = np.power(x.reshape(1) if not shape else x, y).reshape(shape)
  return r.astype(np.asarray(a).dtype, copy=False)


def _pow(a, b, dt: DType):
  if dtypes.is_float(dt): return _float_pow(a, b)
  if dtypes.is_bool(dt): return np.logical_or(a, np.logical_not(b))
  if dtypes.is_unsigned(dt): return np.power(a, b)
  neg = b < 0
  r = np.power(a, np.where(neg, 0, b).astype(a.dtype))
  odd = (b & 1) == 1
  return np.where(neg, np.where(a == 1, 1, np.where(a == -1, np.where(odd, -1, 1), 0)), r).astype(a.dtype)


def _divisor(a, b, dt: DType):
  """b with 0 (and, signed, the -1 under MIN) replaced by 1, and the mask of zeros."""
  zero = b == 0
  bs = np.where(zero, 1, b).astype(b.dtype)
  if not dtypes.is_unsigned(dt): bs = np.where((a == int_range(dt)[0]) & (bs == -1), 1, bs).astype(b.dtype)
  return bs, zero


def _idiv(a, b, dt: DType):
  bs, zero = _divisor(a, b, dt)
  q = np.floor_divide(a, bs)
  if not dtypes.is_unsigned(dt):
    q = np.where((a - q * bs != 0) & ((a < 0) != (bs < 0)), q + 1, q).astype(a.dtype)
  return np.where(zero, 0, q).astype(a.dtype)


def _mod(a, b, dt: DType):
  bs, zero = _divisor(a, b, dt)
  return np.where(zero, 0, np.fmod(a, bs)).astype(a.dtype)


def _shift(a, b, dt: DType, left: bool):
  w = bits(dt)
  bad_neg = b < 0 if not dtypes.is_unsigned(dt) else np.zeros(np.shape(b), bool)
  big = b >= w
  cnt = np.where(bad_neg | big, 0, b).astype(b.dtype)
  r = np.left_shift(a, cnt) if left else np.right_shift(a, cnt)
  if left or dtypes.is_unsigned(dt): fill = 0
  else: fill = np.where(a < 0, -1, 0).astype(a.dtype)
  return np.where(bad_neg, 0, np.where(big, fill, r)).astype(a.dtype)


def _max(a, b, dt: DType):
  """MAX: IEEE 754-2019 maximum for floats (NaN if either is NaN, +0 above -0, whichever operand it is), as the VM."""
  r = np.maximum(a, b)
  if not dtypes.is_float(dt): return r
  return np.where(a == b, np.where(np.signbit(a), b, a), r)


BINARY = {
  Ops.ADD: lambda a, b, dt: np.add(a, b), Ops.MUL: lambda a, b, dt: np.multiply(a, b),
  Ops.MAX: _max, Ops.POW: _pow, Ops.IDIV: _idiv, Ops.MOD: _mod,
  Ops.AND: lambda a, b, dt: np.bitwise_and(a, b), Ops.OR: lambda a, b, dt: np.bitwise_or(a, b),
  Ops.XOR: lambda a, b, dt: np.bitwise_xor(a, b),
  Ops.SHL: lambda a, b, dt: _shift(a, b, dt, True), Ops.SHR: lambda a, b, dt: _shift(a, b, dt, False),
  Ops.CMPLT: lambda a, b, dt: np.less(a, b), Ops.CMPNE: lambda a, b, dt: np.not_equal(a, b),
  Ops.CMPEQ: lambda a, b, dt: np.equal(a, b),
}

UNARY = {
  Ops.RECIPROCAL: np.reciprocal, Ops.SQRT: np.sqrt, Ops.SIN: np.sin, Ops.LOG2: np.log2, Ops.EXP2: np.exp2,
  Ops.TRUNC: np.trunc,
}


def cast_value(x: np.ndarray, src: DType, dst: DType) -> np.ndarray:
  """CAST of a value of dtype src to dtype dst, with the defined results of numpy_eval's docstring."""
  if dst is src: return x
  if dtypes.is_bool(dst): return np.asarray(x != 0)
  if dtypes.is_float(src) and dtypes.is_int(dst):
    t = np.trunc(x.astype(np.float64))
    lo, hi = int_range(dst)
    over, under, nan = t >= float(hi) + 1.0, t < float(lo), np.isnan(t)
    mid = np.where(over | under | nan, 0, t).astype(dst.numpy)
    return np.asarray(np.where(over, hi, np.where(under, lo, mid)), dst.numpy)
  if dtypes.is_float(dst) and dst.itemsize == 2: return fin(to_float32_odd(x), dst)
  return x.astype(dst.numpy)


def bitcast_value(x: np.ndarray, src: DType, dst: DType) -> np.ndarray:
  """BITCAST of a value of dtype src to dtype dst (equal itemsize)."""
  bts = (x.view(np.uint32) >> np.uint32(16)).astype(np.uint16) if src is _BF16 else x
  if dst is _BF16: return (bts.view(np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)
  if dtypes.is_bool(dst): return bts.view(np.uint8) != 0
  return bts.view(dst.numpy)


def alu(op: Ops, dt: DType, xs: list, sdt: DType) -> np.ndarray:
  """The value of ALU op (or CAST/BITCAST) of dtype dt over operand values xs of dtype sdt (the first operand's;
  WHERE: the branches')."""
  if op is Ops.WHERE: return np.asarray(np.where(xs[0], xs[1], xs[2]), dt.numpy)
  if op is Ops.CAST: return cast_value(xs[0], sdt, dt)
  if op is Ops.BITCAST: return bitcast_value(np.asarray(xs[0]), sdt, dt)
  if op in BINARY: return fin(BINARY[op](wide(xs[0], sdt), wide(xs[1], sdt), sdt), dt)
  if op is Ops.TRUNC and not dtypes.is_float(sdt): return xs[0]
  return fin(UNARY[op](wide(xs[0], sdt)), dt)


def quotient_operands(op: Ops, dtype: DType, src: tuple):
  """(a, b) when a node op(src) of this dtype is run as the true quotient a / b: a float MUL(a, RECIPROCAL(b)) or
  MUL(RECIPROCAL(b), a) (the second operand checked first), where `src` are the node's own sources (UOps; flatten
  passes the UOp sources it sees, so an identity op between MUL and RECIPROCAL keeps the product on both engines).
  No IR op divides: `a / b` builds that product, and every engine evaluates it as IEEE division, correctly rounded
  (numpy's, torch's and JAX's `/`), like a compiler contracting a multiply-add into an FMA; the RECIPROCAL is still
  computed for any other user."""
  if op is not Ops.MUL or not dtypes.is_float(dtype): return None
  x, y = src
  if y.op is Ops.RECIPROCAL: return x, y.src[0]
  if x.op is Ops.RECIPROCAL: return y, x.src[0]
  return None


def divide(dt: DType, a, b) -> np.ndarray:
  """The quotient a / b of float values of dtype dt, correctly rounded (float16/bfloat16: the float32 quotient
  rounded once, which is the correctly rounded quotient in those formats)."""
  return fin(np.divide(wide(a, dt), wide(b, dt)), dt)


def _exact_zero_product(x: np.ndarray, r: np.ndarray, axes: tuple) -> np.ndarray:
  """A float product r of x over axes with its exact zeros: entries one of which is 0 multiply to 0 (its sign the
  product of the signs) unless one is inf or NaN, though numpy's loop may overflow to inf before it meets the zero
  and give inf * 0 = NaN. Only NaN results are looked at again (the VM does the same: csrc/vm_prodz.c)."""
  nan = np.isnan(r)
  if not nan.any(): return r
  zero = np.logical_or.reduce(x == 0, axis=axes, keepdims=True)
  nonfinite = np.logical_or.reduce(~np.isfinite(x), axis=axes, keepdims=True)
  neg = np.logical_xor.reduce(np.signbit(x), axis=axes, keepdims=True)
  return np.where(nan & zero & ~nonfinite, np.where(neg, -0.0, 0.0).astype(r.dtype), r)


def reduce_value(op: Ops, dt: DType, x: np.ndarray, axes) -> np.ndarray:
  """REDUCE_AXIS (ADD, MUL or MAX over `axes`, kept as size-1 dims) of a value of dtype dt: accumulated in the
  compute type, rounded once at the end; over zero elements 0, 1 or the dtype's lowest value."""
  x = wide(x, dt)
  if op is Ops.ADD: r = np.sum(x, axis=tuple(axes), keepdims=True, dtype=x.dtype)
  elif op is Ops.MUL:
    r = np.prod(x, axis=tuple(axes), keepdims=True, dtype=x.dtype)
    if dtypes.is_float(dt): r = _exact_zero_product(x, r, tuple(axes))
  else:
    r = np.maximum.reduce(x, axis=tuple(axes), keepdims=True, initial=lowest(dt))
    if dtypes.is_float(dt):  # a zero maximum is +0 if any +0 is among the values (IEEE 754-2019, as the VM)
      pos = np.logical_or.reduce((x == 0) & ~np.signbit(x), axis=tuple(axes), keepdims=True)
      r = np.where(r == 0, np.where(pos, 0.0, -0.0).astype(r.dtype), r)
  return fin(r, dt)


def scalar_alu(op: Ops, dt: DType, values: list, dtypes_: list):
  """The Python scalar op gives on Python scalars `values` of dtypes `dtypes_`, as execution computes it (for
  constant folding)."""
  xs = [const_array(v, d) for v, d in zip(values, dtypes_)]
  sdt = dtypes_[1] if op is Ops.WHERE else dtypes_[0]
  with np.errstate(all="ignore"):
    return alu(op, dt, xs, sdt).reshape(-1)[0].item()




def map_nested(x, fn):
  """x with every leaf (anything but a tuple) replaced by fn(leaf), tuples nested as they are; iterative, so a
  structure nested thousands deep is fine."""
  if type(x) is not tuple: return fn(x)
  out: list = []
  stack = [(x, False)]
  while stack:
    v, done = stack.pop()
    if done:
      n = len(out) - len(v)
      out[n:] = [tuple(out[n:])]
    elif type(v) is tuple:
      stack.append((v, True))
      stack.extend((c, False) for c in reversed(v))
    else:
      out.append(fn(v))
  return out[0]


__all__ = ["round_bfloat16", "wide", "fin", "int_range", "lowest", "const_array", "input_name", "as_value",
           "input_value", "bindings", "BINARY", "UNARY", "cast_value", "bitcast_value", "alu", "reduce_value",
           "scalar_alu", "quotient_operands", "divide", "INPUT_OPS", "map_nested"]
