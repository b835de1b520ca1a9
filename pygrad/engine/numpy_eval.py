"""The numpy reference evaluator: runs a graph op by op, and is the oracle every other engine is tested against.

`evaluate(outputs, inputs)` walks the outputs' toposort once (iteratively, never recursing on graph depth), keeps
each node's value until its last user has run, and returns one numpy array per output (a tuple for TUPLE, SINK and
FUNCTION, None for NOOP). Arrays returned are owned by the caller: writable, never aliasing an input.

Values. A node's value is a numpy array of its dtype's storage type (`DType.numpy`); bfloat16 is stored as float32
holding bfloat16 values exactly. Arithmetic on float16 and bfloat16 is done in float32 and every result is rounded
back (round to nearest, ties to even; bfloat16 rounds the float32 bits to their top 16), so also any conversion into
float16/bfloat16 goes through float32 (e.g. float64 -> float32 -> float16). Reductions accumulate in the operand's
compute type (float32 for float16/bfloat16) and round once at the end.

Results defined here for what C leaves undefined (the C VM matches them):
* IDIV on ints truncates toward zero; MOD has the sign of the dividend (C's `/` and `%`). A divisor of 0 gives 0
  for both. Signed overflow wraps in two's complement: ADD, MUL, POW and `MIN // -1` (which gives MIN, `MIN % -1`
  gives 0).
* SHL/SHR by a negative count gives 0. SHL by a count >= the bit width gives 0. SHR is arithmetic on signed ints
  (logical on unsigned); by a count >= the bit width it gives -1 for a negative signed value, else 0.
* POW on ints: exact (wrapping) integer power for exponents >= 0, 0**0 == 1; a negative exponent gives 0, except
  base 1 (gives 1) and base -1 (gives 1 for an even exponent, -1 for an odd one). POW on bool is `a or not b`.
* CAST float -> int: truncation toward zero; NaN gives 0; values out of range saturate to the int's min/max.
  CAST int -> int wraps (keeps the low bits). CAST to bool is `x != 0` (so NaN -> True). CAST bool -> x is 0/1.
* BITCAST reinterprets the bits (bfloat16 as the top 16 bits of its float32 storage); BITCAST to bool is `x != 0`.
* MAX and the comparisons follow IEEE like numpy: MAX with a NaN operand is NaN; CMPLT/CMPEQ with NaN are False,
  CMPNE is True. ADD/MUL/MAX on bool are OR/AND/OR. REDUCE_AXIS over zero elements gives 0 (ADD), 1 (MUL) and the
  dtype's lowest value (MAX: -inf, the int's min, False). RECIPROCAL/SQRT/LOG2/... follow IEEE (1/0 = inf,
  sqrt(-1) = NaN, log2(0) = -inf); floating warnings are silenced.

Inputs. `inputs` maps BUFFER and DEFINE_VAR nodes to values. A numpy array (or numpy scalar) must have exactly the
node's storage dtype (bfloat16: float32, rounded on entry, or an `ml_dtypes.bfloat16` array) and, for a BUFFER, its
shape; any strides are accepted. Other array-likes (Python scalars, lists) are converted when their kind fits (bool
into anything; int into int or float; float into float) and, for ints, the values fit the dtype. A DEFINE_VAR takes
a scalar within [vmin, vmax]. Anything else -- a missing binding, a wrong shape, a wrong dtype, a value out of range
-- raises ValueError naming the input.

Structure. PARAM slot i inside a FUNCTION body is the FUNCTION's args[i] (the body runs as a sub-evaluation); a
FUNCTION's value is the tuple of its body's outputs. CALL runs `CallInfo.fxn(*arrays)` on writable copies of its
buffers; AFTER(buffer, CALL) is that buffer's array after the call. COPY and the identity ops pass the value on; MULTI
concatenates its shards along its axis (or, replicated, is its first shard).
"""
from __future__ import annotations
import numpy as np
from ..ops import Ops, GroupOp
from ..dtype import DType, dtypes
from ..core import CORE
from ..uop import UOp, handle

_F16, _BF16, _BOOL = dtypes.float16, dtypes.bfloat16, dtypes.bool
_CALLS = (Ops.FUNCTION, Ops.CALL)
_MISSING = object()


# ---- dtype helpers ----
def round_bfloat16(x) -> np.ndarray:
  """float32 values rounded to bfloat16 precision (nearest, ties to even), still as float32; NaN stays NaN."""
  a = np.asarray(x, np.float32)
  u = a.view(np.uint32)
  r = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
  r = np.where(np.isnan(a), (u | np.uint32(0x00400000)) & np.uint32(0xFFFF0000), r)
  return np.asarray(r, np.uint32).view(np.float32)


def _wide(x: np.ndarray, dt: DType) -> np.ndarray:
  """The compute form of a value: float16 widened to float32 (bfloat16 is float32 already)."""
  return x.astype(np.float32) if dt is _F16 else x


def _fin(r, dt: DType) -> np.ndarray:
  """A computed result as a value of dtype dt (float16/bfloat16 rounded from float32)."""
  if dt is _F16: return np.asarray(r, np.float32).astype(np.float16)
  if dt is _BF16: return round_bfloat16(np.asarray(r, np.float32))
  return np.asarray(r, dt.numpy)


def _bits(dt: DType) -> int: return 8 * dt.itemsize


def _int_range(dt: DType) -> tuple[int, int]:
  n = _bits(dt)
  return (0, 2 ** n - 1) if dtypes.is_unsigned(dt) else (-2 ** (n - 1), 2 ** (n - 1) - 1)


def _lowest(dt: DType):
  if dtypes.is_float(dt): return -np.inf
  if dtypes.is_bool(dt): return False
  return _int_range(dt)[0]


# ---- inputs ----
def _name(u: UOp) -> str:
  if u.op is Ops.BUFFER:
    uid, shape, dev, name = (tuple(u.arg) + (None,))[:4]
    return f"BUFFER {name!r} (id {uid}, {shape}:{u.dtype.name} on {dev})" if name is not None else \
      f"BUFFER id {uid} ({shape}:{u.dtype.name} on {dev})"
  return f"DEFINE_VAR {u.arg[0]!r} ({u.dtype.name})"


def _kind_fits(kind: str, dt: DType) -> bool:
  if kind == "b": return True
  if kind in "iu": return not dtypes.is_bool(dt)
  return kind == "f" and dtypes.is_float(dt)


def _as_value(u: UOp, v) -> np.ndarray:
  """The bound value of input u as a value of u's dtype, or ValueError naming u."""
  dt = u.dtype
  if isinstance(v, (np.ndarray, np.generic)):
    a = np.asarray(v)
    if dt is _BF16 and a.dtype.name == "bfloat16": return round_bfloat16(a.astype(np.float32))
    if a.dtype != dt.numpy:
      raise ValueError(f"input {_name(u)}: expected dtype {dt.name} (numpy {dt.numpy}), got {a.dtype}")
    return round_bfloat16(a) if dt is _BF16 else a
  try:
    a = np.asarray(v)
  except (ValueError, TypeError, OverflowError) as e:
    raise ValueError(f"input {_name(u)}: cannot convert {type(v).__name__} to an array ({e})") from None
  if a.dtype.kind not in "biuf" or not _kind_fits(a.dtype.kind, dt):
    raise ValueError(f"input {_name(u)}: expected {dt.name} values, got {a.dtype} from {type(v).__name__}")
  if dtypes.is_int(dt):
    lo, hi = _int_range(dt)
    if a.size and (a.min() < lo or a.max() > hi):
      raise ValueError(f"input {_name(u)}: values out of range for {dt.name}")
  return _fin(a.astype(np.float32) if dt in (_F16, _BF16) else a, dt)


def _buffer(u: UOp, xs, ctx):
  v = ctx.inputs.get(u._id, _MISSING)
  if v is _MISSING: raise ValueError(f"missing input: {_name(u)} is not bound in inputs")
  a = _as_value(u, v)
  if a.shape != u.shape: raise ValueError(f"input {_name(u)}: expected shape {u.shape}, got {a.shape}")
  a = a.view()
  a.flags.writeable = False  # so that `_own` copies whatever aliases the caller's array
  return a


def _define_var(u: UOp, xs, ctx):
  v = ctx.inputs.get(u._id, _MISSING)
  if v is _MISSING: raise ValueError(f"missing input: {_name(u)} is not bound in inputs")
  a = _as_value(u, v)
  if a.shape != (): raise ValueError(f"input {_name(u)}: expected a scalar, got shape {a.shape}")
  _, vmin, vmax = u.arg
  try:
    ok = bool(vmin <= a.item() <= vmax)
  except TypeError:
    ok = True  # bounds that are not numbers constrain nothing here
  if not ok: raise ValueError(f"input {_name(u)}: value {a.item()!r} outside [{vmin}, {vmax}]")
  return a


def _param(u: UOp, xs, ctx):
  slot = u.arg[0]
  if ctx.params is None: raise ValueError(f"PARAM slot {slot} is only bound inside a FUNCTION body")
  if not 0 <= slot < len(ctx.params): raise ValueError(f"PARAM slot {slot}: the FUNCTION has {len(ctx.params)} args")
  return ctx.params[slot]


def _const(u: UOp, xs, ctx):
  v = u.arg
  return _fin(np.asarray(v, np.float32), u.dtype) if u.dtype in (_F16, _BF16) else np.asarray(v, u.dtype.numpy)


# ---- ALU ----
def _pow(a, b, dt: DType):
  if dtypes.is_float(dt): return np.power(a, b)
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
  if not dtypes.is_unsigned(dt): bs = np.where((a == _int_range(dt)[0]) & (bs == -1), 1, bs).astype(b.dtype)
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
  w = _bits(dt)
  bad_neg = b < 0 if not dtypes.is_unsigned(dt) else np.zeros(np.shape(b), bool)
  big = b >= w
  cnt = np.where(bad_neg | big, 0, b).astype(b.dtype)
  r = np.left_shift(a, cnt) if left else np.right_shift(a, cnt)
  if left or dtypes.is_unsigned(dt): fill = 0
  else: fill = np.where(a < 0, -1, 0).astype(a.dtype)
  return np.where(bad_neg, 0, np.where(big, fill, r)).astype(a.dtype)


_BINARY = {
  Ops.ADD: lambda a, b, dt: np.add(a, b), Ops.MUL: lambda a, b, dt: np.multiply(a, b),
  Ops.MAX: lambda a, b, dt: np.maximum(a, b), Ops.POW: _pow, Ops.IDIV: _idiv, Ops.MOD: _mod,
  Ops.AND: lambda a, b, dt: np.bitwise_and(a, b), Ops.OR: lambda a, b, dt: np.bitwise_or(a, b),
  Ops.XOR: lambda a, b, dt: np.bitwise_xor(a, b),
  Ops.SHL: lambda a, b, dt: _shift(a, b, dt, True), Ops.SHR: lambda a, b, dt: _shift(a, b, dt, False),
  Ops.CMPLT: lambda a, b, dt: np.less(a, b), Ops.CMPNE: lambda a, b, dt: np.not_equal(a, b),
  Ops.CMPEQ: lambda a, b, dt: np.equal(a, b),
}

_UNARY = {
  Ops.RECIPROCAL: np.reciprocal, Ops.SQRT: np.sqrt, Ops.SIN: np.sin, Ops.LOG2: np.log2, Ops.EXP2: np.exp2,
}


def _unary(u: UOp, xs, ctx):
  x, dt = xs[0], u.src[0].dtype
  if u.op is Ops.TRUNC and not dtypes.is_float(dt): return x
  f = np.trunc if u.op is Ops.TRUNC else _UNARY[u.op]
  return _fin(f(_wide(x, dt)), u.dtype)


def _binary(u: UOp, xs, ctx):
  dt = u.src[0].dtype
  return _fin(_BINARY[u.op](_wide(xs[0], dt), _wide(xs[1], dt), dt), u.dtype)


def _where(u: UOp, xs, ctx):
  return np.asarray(np.where(xs[0], xs[1], xs[2]), u.dtype.numpy)


def cast_value(x: np.ndarray, src: DType, dst: DType) -> np.ndarray:
  """CAST of a value of dtype src to dtype dst, with the defined results of the module docstring."""
  if dst is src: return x
  if dtypes.is_bool(dst): return np.asarray(x != 0)
  if dtypes.is_float(src) and dtypes.is_int(dst):
    t = np.trunc(x.astype(np.float64))
    lo, hi = _int_range(dst)
    over, under, nan = t >= float(hi) + 1.0, t < float(lo), np.isnan(t)
    mid = np.where(over | under | nan, 0, t).astype(dst.numpy)
    return np.asarray(np.where(over, hi, np.where(under, lo, mid)), dst.numpy)
  if dtypes.is_float(dst) and dst.itemsize == 2: return _fin(x.astype(np.float32), dst)
  return x.astype(dst.numpy)


def _cast(u: UOp, xs, ctx): return cast_value(xs[0], u.src[0].dtype, u.dtype)


def bitcast_value(x: np.ndarray, src: DType, dst: DType) -> np.ndarray:
  """BITCAST of a value of dtype src to dtype dst (equal itemsize)."""
  bits = (x.view(np.uint32) >> np.uint32(16)).astype(np.uint16) if src is _BF16 else x
  if dst is _BF16: return (bits.view(np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)
  if dtypes.is_bool(dst): return bits.view(np.uint8) != 0
  return bits.view(dst.numpy)


def _bitcast(u: UOp, xs, ctx): return bitcast_value(np.asarray(xs[0]), u.src[0].dtype, u.dtype)


# ---- reduce and movement ----
def _reduce(u: UOp, xs, ctx):
  op, axes = u.arg
  dt = u.dtype
  x = _wide(xs[0], dt)
  if op is Ops.ADD: r = np.sum(x, axis=axes, keepdims=True, dtype=x.dtype)
  elif op is Ops.MUL: r = np.prod(x, axis=axes, keepdims=True, dtype=x.dtype)
  else: r = np.maximum.reduce(x, axis=axes, keepdims=True, initial=_lowest(dt))
  return _fin(r, dt)


def _pad(x: np.ndarray, arg) -> np.ndarray:
  out = np.zeros(tuple(s + b + a for s, (b, a) in zip(x.shape, arg)), x.dtype)
  out[tuple(slice(b, b + s) for s, (b, _) in zip(x.shape, arg))] = x
  return out


_MOVEMENT = {
  Ops.RESHAPE: lambda x, arg: np.reshape(x, arg),
  Ops.EXPAND: lambda x, arg: np.broadcast_to(x, arg),
  Ops.PAD: _pad,
  Ops.SHRINK: lambda x, arg: x[tuple(slice(b, e) for b, e in arg)],
  Ops.PERMUTE: lambda x, arg: np.transpose(x, arg),
  Ops.FLIP: lambda x, arg: x[tuple(slice(None, None, -1) if f else slice(None) for f in arg)],
}


def _movement(u: UOp, xs, ctx): return _MOVEMENT[u.op](xs[0], u.arg)


# ---- structure ----
def _function(u: UOp, xs, ctx):
  return _run([u.src[0]], _Ctx(ctx.inputs, tuple(xs)))[0]


def _call(u: UOp, xs, ctx):
  fxn = getattr(u.arg, "fxn", None)
  if fxn is None: raise ValueError("CALL: the kernel has no Python fxn to run (custom_kernel(..., fxn=...))")
  arrays = [np.array(x, copy=True) for x in xs]
  fxn(*arrays)
  out = []
  for b, a in zip(u.src[1:], arrays):
    if a.shape != b.shape or a.dtype != b.dtype.numpy:
      raise ValueError(f"CALL {u.arg.name!r}: the kernel changed a buffer to {a.shape}:{a.dtype}")
    out.append(round_bfloat16(a) if b.dtype is _BF16 else a)
  return tuple(out)


def _after(u: UOp, xs, ctx):
  buf, call = u.src
  for i, b in enumerate(call.src[1:]):
    if b is buf: return xs[1][i]
  raise ValueError("AFTER: src[0] is not one of its CALL's buffers")


def _multi(u: UOp, xs, ctx): return xs[0] if u.arg is None else np.concatenate(xs, axis=u.arg)


_EVAL = {
  Ops.CONST: _const, Ops.DEFINE_VAR: _define_var, Ops.BUFFER: _buffer, Ops.PARAM: _param,
  Ops.NOOP: lambda u, xs, ctx: None,
  **{o: _unary for o in GroupOp.Unary}, Ops.CAST: _cast, Ops.BITCAST: _bitcast,
  **{o: _binary for o in GroupOp.Binary}, Ops.WHERE: _where,
  Ops.REDUCE_AXIS: _reduce, **{o: _movement for o in GroupOp.Movement},
  **{o: (lambda u, xs, ctx: xs[0]) for o in GroupOp.Identity}, Ops.COPY: lambda u, xs, ctx: xs[0],
  Ops.MULTI: _multi,
  Ops.TUPLE: lambda u, xs, ctx: tuple(xs), Ops.SINK: lambda u, xs, ctx: tuple(xs),
  Ops.GETTUPLE: lambda u, xs, ctx: xs[0][u.arg],
  Ops.FUNCTION: _function, Ops.CALL: _call, Ops.AFTER: _after,
}
assert set(_EVAL) == set(Ops), set(Ops) - set(_EVAL)


# ---- driver ----
class _Ctx:
  __slots__ = ("inputs", "params")

  def __init__(self, inputs: dict, params: tuple | None):
    self.inputs, self.params = inputs, params


def _run(roots: list[UOp], ctx: _Ctx) -> list:
  """Values of roots: one pass over their toposort (FUNCTION/CALL bodies not entered), each value dropped after
  its last user."""
  nodes = [handle(n) for n in CORE.toposort([r._id for r in roots], False)]
  keep = {r._id for r in roots}
  uses: dict[int, int] = {}
  operands = []
  for u in nodes:
    s = u.src[1:] if u.op in _CALLS else u.src
    operands.append(s)
    for x in s: uses[x._id] = uses.get(x._id, 0) + 1
  vals: dict[int, object] = {}
  for u, srcs in zip(nodes, operands):
    vals[u._id] = _EVAL[u.op](u, [vals[s._id] for s in srcs], ctx)
    for s in srcs:
      k = s._id
      uses[k] -= 1
      if not uses[k] and k not in keep: del vals[k]
  return [vals[r._id] for r in roots]


def _own(v, seen: set):
  """v as an array the caller owns (a copy unless it is a fresh, writable array not returned yet)."""
  if not isinstance(v, np.ndarray): return v
  if not (v.flags.owndata and v.flags.writeable) or id(v) in seen: v = np.array(v, copy=True)
  seen.add(id(v))
  return v


def evaluate(outputs: list[UOp], inputs: dict | None = None) -> list:
  """The values of `outputs` (numpy arrays; tuples for TUPLE/SINK/FUNCTION) given `inputs`, a dict from BUFFER and
  DEFINE_VAR nodes to array-likes/scalars."""
  outs = list(outputs)
  for o in outs:
    if type(o) is not UOp: raise TypeError(f"evaluate: outputs must be UOps, got {type(o).__name__}")
  binds: dict[int, object] = {}
  for k, v in (inputs or {}).items():
    if type(k) is not UOp: raise TypeError(f"evaluate: inputs keys must be UOps, got {type(k).__name__}")
    if k.op not in (Ops.BUFFER, Ops.DEFINE_VAR):
      raise ValueError(f"evaluate: inputs key {k.op.name} is not an input (BUFFER or DEFINE_VAR)")
    binds[k._id] = v
  with np.errstate(all="ignore"):
    vals = _run(outs, _Ctx(binds, None))
  seen: set = set()
  return [tuple(_own(x, seen) for x in v) if type(v) is tuple else _own(v, seen) for v in vals]


__all__ = ["evaluate", "round_bfloat16", "cast_value", "bitcast_value"]
