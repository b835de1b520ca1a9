"""The bundled algebraic rules of `UOp.simplify()`: constant folding of every ALU op in the dtype's own arithmetic
(by the numpy reference evaluator, so folding and execution agree), identities that hold for every value (IEEE-safe
for floats: `x + 0.0` is not `x` when x is -0.0, so only `x + -0.0` folds), `where` on constant conditions, casts
through an exact intermediate type, and movement ops of constants."""
from __future__ import annotations
import math
from .ops import Ops, GroupOp
from .dtype import DType, dtypes
from .upat import UPat, PatternMatcher
from .uop import UOp
from .dtype import coerce as _coerce
from .rewrite import graph_rewrite

_FOLDABLE = GroupOp.ALU | {Ops.CAST, Ops.BITCAST}
_REDUCE_FOLD_LIMIT = 1 << 16


def const_value(u: UOp):
  """The scalar a node holds if it is a CONST or a RESHAPE/EXPAND broadcast of one, else None."""
  while u.op in (Ops.RESHAPE, Ops.EXPAND): u = u.src[0]
  return u.arg if u.op is Ops.CONST else None


def _is_const(u: UOp) -> bool: return const_value(u) is not None


def broadcast_const(value, dtype: DType, shape: tuple) -> UOp:
  """The canonical constant of this shape: a () CONST, reshaped to all-ones and expanded."""
  c = UOp.const(value, dtype)
  if not shape: return c
  c = c.reshape((1,) * len(shape))
  return c.expand(shape)


def _canonical(u: UOp) -> bool:
  if u.op is Ops.CONST: return True
  if u.op is Ops.RESHAPE: return u.src[0].op is Ops.CONST and all(s == 1 for s in u.shape)
  if u.op is Ops.EXPAND:
    r = u.src[0]
    return r.op is Ops.RESHAPE and r.src[0].op is Ops.CONST and all(s == 1 for s in r.shape)
  return False


def _scalar(arr, dtype: DType):
  return _coerce(arr.reshape(-1)[0].item(), dtype)


def _exact_reciprocal(v: float, r: float) -> bool:
  """Whether r, the rounded 1 / v, is 1 / v exactly (v a power of two, no overflow or underflow past it; v zero,
  infinite or NaN): only then is x * r the quotient x / v for every x."""
  if v == 0 or math.isinf(v) or math.isnan(v): return True
  return math.frexp(v)[0] in (0.5, -0.5) and r != 0 and math.isfinite(r) and math.frexp(r)[0] in (0.5, -0.5)


def fold_alu(u: UOp) -> UOp | None:
  """An ALU node over constants, computed now. A float RECIPROCAL folds only where exact: MUL(x, RECIPROCAL(c)) is
  the quotient x / c (engine/values.quotient_operands), which x * round(1 / c) is not for c = 3."""
  if not all(_is_const(s) for s in u.src): return None
  from .engine.numpy_eval import evaluate
  scalars = tuple(UOp.const(const_value(s), s.dtype) for s in u.src)
  one = UOp(u.op, u.dtype if u.op in (Ops.CAST, Ops.BITCAST) else None, scalars, u.arg)
  r = _scalar(evaluate([one], {})[0], u.dtype)
  if u.op is Ops.RECIPROCAL and not _exact_reciprocal(float(scalars[0].arg), float(r)): return None
  return broadcast_const(r, u.dtype, u.shape)


def fold_quotient(x: UOp, y: UOp, u: UOp) -> UOp | None:
  """MUL(a, RECIPROCAL(b)) over constants: the quotient a / b, computed now as execution computes it."""
  if not (_is_const(x) and _is_const(y)): return None
  from .engine.numpy_eval import evaluate
  q = UOp.const(const_value(x), x.dtype) * UOp.const(const_value(y), y.dtype).reciprocal()
  return broadcast_const(_scalar(evaluate([q], {})[0], u.dtype), u.dtype, u.shape)


def fold_reduce(u: UOp) -> UOp | None:
  v = const_value(u.src[0])
  if v is None: return None
  op, axes = u.arg
  n = math.prod(u.src[0].shape[a] for a in axes)
  if op is Ops.MAX and n > 0: return broadcast_const(v, u.dtype, u.shape)
  if n > _REDUCE_FOLD_LIMIT: return None
  from .engine.numpy_eval import evaluate
  x = broadcast_const(v, u.dtype, (n,)) if n else UOp.const(v, u.dtype).reshape((1,)).shrink(((0, 0),))
  r = evaluate([x.r(op, (0,))], {})[0]
  return broadcast_const(_scalar(r, u.dtype), u.dtype, u.shape)


def fold_movement(u: UOp) -> UOp | None:
  v = const_value(u)
  if v is None or _canonical(u): return None
  return broadcast_const(v, u.dtype, u.shape)


def _like(x: UOp, u: UOp) -> UOp:
  """x brought to u's shape (x may be a () operand that was broadcast implicitly)."""
  return x if x.shape == u.shape else x.reshape((1,) * len(u.shape)).expand(u.shape)


def _bits(d: DType) -> int: return 8 * d.itemsize


def exact(src: DType, mid: DType) -> bool:
  """Every value of `src` is exactly a value of `mid`."""
  if src is mid or src is dtypes.bool: return True
  if mid is dtypes.bool: return False
  mant = {dtypes.float16: 11, dtypes.bfloat16: 8, dtypes.float32: 24, dtypes.float64: 53}
  if dtypes.is_float(src):
    if not dtypes.is_float(mid): return False
    order = {dtypes.float16: (11, 5), dtypes.bfloat16: (8, 8), dtypes.float32: (24, 8), dtypes.float64: (53, 11)}
    return order[src][0] <= order[mid][0] and order[src][1] <= order[mid][1]
  if dtypes.is_float(mid):
    return _bits(src) - (0 if dtypes.is_unsigned(src) else 1) <= mant[mid]
  if dtypes.is_unsigned(src): return _bits(src) < _bits(mid) or (dtypes.is_unsigned(mid) and _bits(src) <= _bits(mid))
  return not dtypes.is_unsigned(mid) and _bits(src) <= _bits(mid)


def _cast_cast(x: UOp, mid: UOp, u: UOp) -> UOp | None:
  """CAST(CAST(x, mid), dst) is CAST(x, dst) when mid holds every x exactly and the last cast then treats the value
  as the direct one would: to a float or bool only the value counts, but to an integer a float saturates while an
  integer wraps, so the kinds must agree unless every x fits in dst (int16 300 -> float32 -> int8 is 127, directly
  44)."""
  src, dst = x.dtype, u.dtype
  if not exact(src, mid.dtype): return None
  if dtypes.is_int(dst) and dtypes.is_float(src) != dtypes.is_float(mid.dtype) and not exact(src, dst): return None
  return x.cast(dst)


def _where_const(c: UOp, a: UOp, b: UOp, u: UOp) -> UOp | None:
  v = const_value(c)
  return None if v is None else _like(a if v else b, u)


def _neg_zero(x: UOp, z: UOp, u: UOp) -> UOp | None:
  v = const_value(z)
  if v is None or x.shape != u.shape: return None
  if dtypes.is_float(x.dtype): return x if v == 0 and math.copysign(1.0, v) < 0 else None
  return x if v == 0 and dtypes.is_int(x.dtype) else None


def _mul_one(x: UOp, c: UOp, u: UOp) -> UOp | None:
  v = const_value(c)
  return x if v is not None and v == 1 and x.shape == u.shape and not dtypes.is_bool(x.dtype) else None


def _mul_zero(x: UOp, c: UOp, u: UOp) -> UOp | None:
  v = const_value(c)
  return broadcast_const(0, u.dtype, u.shape) if v is not None and v == 0 and dtypes.is_int(u.dtype) else None


def _div_one(x: UOp, c: UOp, u: UOp) -> UOp | None:
  v = const_value(c)
  return x if v == 1 and x.shape == u.shape else None


pm_simplify = PatternMatcher([
  (UPat(tuple(_FOLDABLE), name="u"), fold_alu),
  (UPat(Ops.MUL, src=[UPat.var("x"), UPat(Ops.RECIPROCAL, src=(UPat.var("y"),))], name="u"), fold_quotient),
  (UPat(Ops.REDUCE_AXIS, name="u"), fold_reduce),
  (UPat(tuple(GroupOp.Movement), name="u"), fold_movement),
  (UPat(Ops.ADD, src=[UPat.var("x"), UPat.var("z")], name="u"), _neg_zero),
  (UPat(Ops.MUL, src=[UPat.var("x"), UPat.var("c")], name="u"), _mul_one),
  (UPat(Ops.MUL, src=[UPat.var("x"), UPat.var("c")], name="u"), _mul_zero),
  (UPat(Ops.IDIV, src=(UPat.var("x"), UPat.var("c")), name="u"), _div_one),
  (UPat(Ops.POW, src=(UPat.var("x"), UPat.var("c")), name="u"), _div_one),
  (UPat(Ops.WHERE, src=(UPat.var("c"), UPat.var("a"), UPat.var("b")), name="u"), _where_const),
  (UPat(Ops.WHERE, src=(UPat.var(), UPat.var("a"), UPat.var("a")), name="u"), lambda a, u: _like(a, u)),
  (UPat(Ops.MAX, src=(UPat.var("x"), UPat.var("x"))), lambda x: x),
  (UPat(Ops.CAST, name="u", src=(UPat.var("x"),)), lambda u, x: x if x.dtype is u.dtype else None),
  (UPat(Ops.CAST, name="u", src=(UPat(Ops.CAST, name="mid", src=(UPat.var("x"),)),)), _cast_cast),
  (UPat((Ops.RESHAPE, Ops.EXPAND), name="u", src=(UPat.var("x"),)), lambda u, x: x if x.shape == u.shape else None),
  (UPat(Ops.RESHAPE, name="u", src=(UPat(Ops.RESHAPE, src=(UPat.var("x"),)),)), lambda u, x: x.reshape(u.shape)),
])


def simplify(u: UOp) -> UOp:
  """`u` rewritten with pm_simplify to a fixed point."""
  return graph_rewrite(u, pm_simplify)
