"""The convenience methods of UOp. Each builds graph nodes of the primitive op table; derived ops (exp, log, cos,
tanh, sigmoid, relu, abs, minimum, mean, softmax, matmul, ...) decompose into primitives. Methods broadcast their
operands numpy-style (RESHAPE + EXPAND) and turn Python scalars into () constants of the other operand's dtype."""
from __future__ import annotations
import functools, math, sys
from typing import TYPE_CHECKING, Any, Callable, cast
from .ops import Ops
from .dtype import DType, dtypes, promote, sum_acc_dtype
from .division import float_floordiv, float_mod, int_floordiv, int_mod, no_grad, unit

if TYPE_CHECKING:  # the methods' annotations name the class they are mixed into
  from .uop import UOp
else:
  UOp = None  # bound by uop.py once the class exists, as are the node makers below
_alu2 = _const = _movement = _node = _cached = _uop = None
_LN2, _INV_LN2 = math.log(2), 1 / math.log(2)
_IOTA = tuple(tuple(range(n)) for n in range(9))  # identity orders (a permute by one is the node itself)


def _bind(cls, alu2, const, movement, node, unary_method, binary_method, cached) -> list:
  """Bind the node makers, and make the single-node methods (marked by _unary/_binary) with uop.py's factories;
  returns them as (name, op, reverse, method) (uop.py puts their fast paths in C on the C core)."""
  global UOp, _alu2, _const, _movement, _node, _cached, _uop
  UOp, _alu2, _const, _movement, _node, _cached = cls, alu2, const, movement, node, cached
  _uop = sys.modules[cls.__module__]  # its metadata state (uop.py imports this module: no import back)
  made = []
  for name, v in list(vars(MathMixin).items()):
    if type(v) is _Single:
      fn = unary_method(v.op) if v.reverse is None else binary_method(v.op, v.reverse)
      setattr(MathMixin, name, fn)
      made.append((name, v.op, v.reverse, fn))
  return made


def _index(what: str, v) -> int:
  """v as an int (a Python or numpy integer), or TypeError naming what it was for: never a silent truncation."""
  if type(v) is int: return v
  if isinstance(v, bool) or not hasattr(v, "__index__"):
    raise TypeError(f"{what}: expected an int, got {type(v).__name__} {v!r}")
  return v.__index__()


def _dims(op: Ops, shape: tuple) -> tuple:
  """shape with numpy integers as ints; a float or bool is the generic path's TypeError, even where it equals the
  dim (3.0 == 3)."""
  if any(isinstance(d, bool) or not hasattr(d, "__index__") for d in shape):
    raise TypeError(f"{op.name}: arg must be a tuple of ints (new shape), got {shape!r}")
  return tuple([d.__index__() for d in shape])


def _uop_arg(what: str, x):
  if type(x) is not UOp: raise TypeError(f"{what}: expected a UOp, got {type(x).__name__} {x!r:.60}")
  return x


def _axis(ndim: int, a) -> int:
  """One axis, negative counting from the end, checked (numpy's rules: an int-like, in range)."""
  if isinstance(a, bool) or not hasattr(a, "__index__"):
    raise TypeError(f"axis must be an int or a tuple of ints, got {type(a).__name__} {a!r:.40}")
  a = a.__index__()
  if not -ndim <= a < max(ndim, 1): raise ValueError(f"axis {a} out of range for {ndim} dims")
  return a % ndim if ndim else 0


def _axes(ndim: int, axis) -> tuple[int, ...]:
  if axis is None: return tuple(range(ndim))
  if isinstance(axis, (str, bytes)) or not hasattr(axis, "__iter__"): axis = (axis,)
  out = [_axis(ndim, a) for a in axis]
  if len(set(out)) != len(out):  # numpy and torch refuse a repeated axis rather than reduce it once
    raise ValueError(f"axis {tuple(axis)} names an axis twice")
  return tuple(sorted(out))



def _bshape(a: tuple, b: tuple) -> tuple:
  n = max(len(a), len(b))
  a, b = (1,) * (n - len(a)) + a, (1,) * (n - len(b)) + b
  out = []
  for x, y in zip(a, b):
    if x != y and x != 1 and y != 1: raise ValueError(f"shapes {a} and {b} do not broadcast")
    out.append(y if x == 1 else x)
  return tuple(out)


class _Single:
  """A single-node method to be made by uop.py once UOp exists (see _bind): op(self), or op(self, x) (op(x, self)
  if reverse). The common cases -- node operands of one dtype and compatible shapes, or a Python scalar of the node's
  kind -- are one core call; the rest goes through alu2/alu2k, then _bin promotes, broadcasts or reports. The op is
  bound in the method, not read as `Ops.X` in its body: an enum member lookup goes through EnumType's __getattr__
  hook and costs ~150 ns, as much as the rest of the call."""
  __slots__ = ("op", "reverse")

  def __init__(self, op: Ops, reverse: bool | None):
    self.op, self.reverse = op, reverse


# typed as the methods _bind makes of them
def _binary(op: Ops, reverse: bool = False) -> Callable[[Any, Any], UOp]:
  return cast("Callable[[Any, Any], UOp]", _Single(op, reverse))
def _unary(op: Ops) -> Callable[[Any], UOp]: return cast("Callable[[Any], UOp]", _Single(op, None))


# movement ops bound once, for the same reason
_RESHAPE, _EXPAND, _PERMUTE, _PAD, _SHRINK, _REDUCE_AXIS = \
  Ops.RESHAPE, Ops.EXPAND, Ops.PERMUTE, Ops.PAD, Ops.SHRINK, Ops.REDUCE_AXIS


# per float dtype, the |x| below which 2 * x is finite (cos computes sin(2x))
_COS_TOP = {"float16": 2.0 ** 15, "bfloat16": 2.0 ** 127, "float32": 2.0 ** 127, "float64": 2.0 ** 1023}

# tanh's Taylor coefficients, x**1 to x**15: 1, -1/3, 2/15, -17/315, 62/2835, -1382/155925, 21844/6081075, ...
_TANH_TAYLOR = (1.0, -1 / 3, 2 / 15, -17 / 315, 62 / 2835, -1382 / 155925, 21844 / 6081075, -929569 / 638512875)


class MathMixin:
  __slots__ = ()
  __array_ufunc__ = None  # numpy operands defer to these methods (`array @ x` is then our TypeError, not numpy's)

  # ---- operand preparation ----
  def _operand(self, x, dtype: DType | None = None):
    if type(x) is UOp: return x
    if type(x) in (int, float, bool):
      d = dtype if dtype is not None else self.dtype
      return _const(float(x) if d.kind == "f" else x, d)
    if isinstance(x, (int, float)) or hasattr(x, "item"):
      if getattr(x, "size", 1) != 1:  # a numpy array: graphs take tensors as placeholders, not as constants
        raise TypeError(f"cannot use a {type(x).__name__} of shape {tuple(getattr(x, 'shape', ()))} as a UOp operand "
                        "(only scalars; make a tensor an input with UOp.placeholder)")
      return UOp.const(x, dtype if dtype is not None else self.dtype)
    raise TypeError(f"cannot use a {type(x).__name__} as a UOp operand")

  def broadcast_to(self, shape) -> UOp:
    """This node expanded numpy-style to `shape`."""
    shape = tuple(shape)
    if self.shape == shape: return self
    if len(self.shape) > len(shape) or _bshape(self.shape, shape) != shape:
      raise ValueError(f"cannot broadcast {self.shape} to {shape}")
    x = self if len(self.shape) == len(shape) else self.reshape((1,) * (len(shape) - len(self.shape)) + self.shape)
    return x.expand(shape)

  def _pair(self, other, reverse: bool = False):
    a = self
    if type(other) is not UOp:
      k = "f" if isinstance(other, float) else "b" if isinstance(other, bool) else "i" if isinstance(other, int) else \
        getattr(getattr(other, "dtype", None), "kind", None)  # numpy scalars too
      if k == "f" and not dtypes.is_float(a.dtype): a = a.cast(dtypes.float32)
      # an int with a bool node: the int's arithmetic, as numpy's and torch's (it was the bool of the int: x + 2 was
      # x | True, x < 2 was x < True); int32, as a float makes float32
      elif k in ("i", "u") and dtypes.is_bool(a.dtype): a = a.cast(dtypes.int32)
      b = a._operand(other)
    else:
      b = other
      if a.dtype is not b.dtype:
        d = promote(a.dtype, b.dtype)
        a, b = a.cast(d), b.cast(d)
    if a.shape != b.shape and a.shape != () and b.shape != ():
      s = _bshape(a.shape, b.shape)
      a, b = a.broadcast_to(s), b.broadcast_to(s)
    return (b, a) if reverse else (a, b)

  def alu(self, op: Ops, *srcs) -> UOp:
    """The node `op(self, *srcs)` with srcs taken as they are (no broadcasting or casting)."""
    return UOp(op, None, (self, *srcs))

  def _bin(self, op: Ops, other, reverse: bool = False) -> UOp:
    a, b = self._pair(other, reverse)
    r = _alu2(op, a, b)
    return _node(op, (a, b), None) if r is None else r  # the generic path raises the precise error

  # ---- arithmetic ----
  __add__, __radd__ = _binary(Ops.ADD), _binary(Ops.ADD, True)
  __mul__, __rmul__ = _binary(Ops.MUL), _binary(Ops.MUL, True)
  def __sub__(self, x):
    a, b = self._pair(x)
    return a + b.neg()
  def __rsub__(self, x):
    a, b = self._pair(x, True)
    return a + b.neg()
  def __neg__(self): return self.neg()
  def neg(self) -> UOp:
    """-x (logical not for bool). On unsigned ints it wraps modulo 2**bits as numpy and torch do: x * (2**bits - 1),
    since that constant is -1 modulo 2**bits and MUL wraps (so x - y is x + y * (2**bits - 1) there)."""
    if self.dtype is dtypes.bool: return self.ne(True)
    if dtypes.is_unsigned(self.dtype): return self * (2 ** (8 * self.dtype.itemsize) - 1)
    return self * -1
  # a / b is MUL(a, RECIPROCAL(b)): every engine evaluates that product as the correctly rounded quotient
  # (engine/values.quotient_operands), as the IR has no divide op
  def __truediv__(self, x):
    a, b = self._pair(x)
    if not dtypes.is_float(a.dtype): a, b = a.cast(dtypes.float32), b.cast(dtypes.float32)
    return a * b.reciprocal()
  def __rtruediv__(self, x):
    a, b = self._pair(x, True)
    if not dtypes.is_float(a.dtype): a, b = a.cast(dtypes.float32), b.cast(dtypes.float32)
    return a * b.reciprocal()
  def __floordiv__(self, x):
    a, b = self._pair(x)
    return int_floordiv(a, b) if dtypes.is_int(a.dtype) else float_floordiv(a, b)
  def __rfloordiv__(self, x):
    a, b = self._pair(x, True)
    return int_floordiv(a, b) if dtypes.is_int(a.dtype) else float_floordiv(a, b)
  def __mod__(self, x):
    a, b = self._pair(x)
    return int_mod(a, b) if dtypes.is_int(a.dtype) else float_mod(a, b)
  def __rmod__(self, x):
    a, b = self._pair(x, True)
    return int_mod(a, b) if dtypes.is_int(a.dtype) else float_mod(a, b)
  __pow__, __rpow__ = _binary(Ops.POW), _binary(Ops.POW, True)
  pow = _binary(Ops.POW)
  __and__, __rand__ = _binary(Ops.AND), _binary(Ops.AND, True)
  __or__, __ror__ = _binary(Ops.OR), _binary(Ops.OR, True)
  __xor__, __rxor__ = _binary(Ops.XOR), _binary(Ops.XOR, True)
  __lshift__, __rlshift__ = _binary(Ops.SHL), _binary(Ops.SHL, True)
  __rshift__, __rrshift__ = _binary(Ops.SHR), _binary(Ops.SHR, True)
  __lt__, __gt__ = _binary(Ops.CMPLT), _binary(Ops.CMPLT, True)
  # a <= b is not(b < a) only without NaN: on floats that made NaN <= 1 True, so floats compare (a < b) | (a == b)
  def __le__(self, x):
    a, b = self._pair(x)
    return (a < b) | a.eq(b) if dtypes.is_float(a.dtype) else (b < a).ne(True)
  def __ge__(self, x):
    a, b = self._pair(x)
    return (b < a) | a.eq(b) if dtypes.is_float(a.dtype) else (a < b).ne(True)
  eq, ne = _binary(Ops.CMPEQ), _binary(Ops.CMPNE)
  def logical_not(self) -> UOp: return self.ne(True)
  maximum = _binary(Ops.MAX)
  def minimum(self, x) -> UOp:
    a, b = self._pair(x)
    # on ints -x is no order reversal: -MIN wraps to MIN (so minimum(MIN, 3) was 3), hence a select
    if not dtypes.is_float(a.dtype): return (a < b).where(a, b)
    return -((-a).maximum(-b))
  def where(self, x, y) -> UOp:
    """cond.where(x, y): x where self is True, else y."""
    if type(x) is not UOp and type(y) is UOp: x = y._operand(x)
    if type(y) is not UOp and type(x) is UOp: y = x._operand(y)
    if type(x) is not UOp: x, y = UOp.const(x), UOp.const(y)
    x, y = x._pair(y)
    c = self
    shape = x.shape if x.shape != () else c.shape
    if c.shape != shape and c.shape != () and shape != ():
      shape = _bshape(c.shape, shape)
    if c.shape not in ((), shape): c = c.broadcast_to(shape)
    if x.shape not in ((), shape): x, y = x.broadcast_to(shape), y.broadcast_to(shape)
    return _node(Ops.WHERE, (c, x, y), None)
  def cast(self, dtype: DType) -> UOp: return self if self.dtype is dtype else UOp(Ops.CAST, dtype, (self,))
  def bitcast(self, dtype: DType) -> UOp: return UOp(Ops.BITCAST, dtype, (self,))

  # ---- unary math ----
  reciprocal, sqrt, sin = _unary(Ops.RECIPROCAL), _unary(Ops.SQRT), _unary(Ops.SIN)
  exp2, log2, trunc = _unary(Ops.EXP2), _unary(Ops.LOG2), _unary(Ops.TRUNC)
  def cos(self) -> UOp:
    # 1 - 2 sin(x/2)**2 (x/2 is exact: sin(pi/2 - x) rounded x's low bits away) is within 2 ulp of 1, but near a zero
    # of cos it cancels: up to 1e5 ulp off there, in float32 and float64. For 1 <= |x| < 2**emax (2x finite) the
    # value is sin(2x) / (2 sin x) (2x exact, sin x never 0 there: a few ulp everywhere, as accurate as SIN at large
    # |x|); 1 - 2 sin(x/2)**2 below 1 (cos >= 0.54 there) and in the top binade (absolute accuracy only). The quotient's
    # own derivative cancels near sin x = 0, so the value is detached and the gradient is that of 1 - 2 sin(x/2)**2:
    # -2 sin(x/2) cos(x/2), accurate (w - no_grad(w) is 0 with w's derivatives of every order)
    # (w is built three ways, the same value each time, so that no node but h has two users: the planner would
    # store each such node in a buffer of its own)
    x = self if dtypes.is_float(self.dtype) else self.cast(dtypes.float32)
    h = (x * 0.5).sin()
    w = 1 - 2 * (h * h)
    top = _COS_TOP[x.dtype.name]
    q = (x * 2).sin() / (2 * x.sin())
    mid = ((x < 1.0) & (x > -1.0)).ne(True) & (x < top) & (x > -top)
    return no_grad(mid.where(q, w)) + ((h * -2) * h + 1 - no_grad((h * 2) * h * -1 + 1))
  def exp(self) -> UOp:
    """e**x. exp2(x * log2(e)) was off by up to 64 ulp (the product's rounding error, |x| * 2**-24, is multiplied by
    the exponent), so x is reduced first (Cody and Waite): x = n ln2 + r with n = round(x log2(e)) and r computed
    exactly by a two-part ln2 (n * c1 is exact, and so is x - n * c1), and e**x = exp2(r log2(e)) * 2**n. n is
    clamped to the normal exponents: past them r grows, exp2 of it takes the rest (down to 2**-24 while the result
    is not 0) and the product rounds once into the denormals or to inf. n is rounded by adding 1.5 * 2**52 (float32:
    2**23) plus the exponent bias, whose sum's low bits are then n + bias, 2**n's exponent field: one shift makes
    2**n. n passes no gradient: it is read from s through a BITCAST pair (as no_grad; tinygrad's simplifier keeps
    a DETACH), the first BITCAST shared with 2**n's, so the graph is no larger. The gradient is exp2's,
    ctx * 2**n * exp2(r log2(e)), never 2**n past the range. float16/bfloat16 are computed in float32 and rounded
    once; integers and bools give float32."""
    if not dtypes.is_float(self.dtype): return self.cast(dtypes.float32).exp()
    if self.dtype.itemsize == 2: return self.cast(dtypes.float32).exp().cast(self.dtype)
    if self.dtype is dtypes.float64:
      it, shift, magic, nlo, nhi, c1, c2 = dtypes.int64, 52, 1.5 * 2 ** 52 + 1023, -1022, 1023, \
        6.93147180369123816490e-01, 1.90821492927058770002e-10
    else:
      it, shift, magic, nlo, nhi, c1, c2 = dtypes.int32, 23, 1.5 * 2 ** 23 + 127, -126, 127, 0.693359375, \
        -2.12194440e-4
    s = (self * _INV_LN2 + magic).maximum(magic + nlo)  # a NaN x: a NaN or clamped s; r is NaN
    s = (s > magic + nhi).where(magic + nhi, s)
    sb = s.bitcast(it)
    n = sb.bitcast(self.dtype) + (-magic)  # exact, and passing no gradient (the BITCAST pair, as no_grad)
    r = (self + n * -c1) + n * -c2
    return (r * _INV_LN2).exp2() * (sb << shift).bitcast(self.dtype)
  def log(self) -> UOp: return self.log2() * _LN2
  def floor(self) -> UOp:
    t = self.trunc()
    return (self < t).where(t - 1, t)
  def sign(self) -> UOp:
    if dtypes.is_unsigned(self.dtype): return self.ne(0).cast(self.dtype)  # no -1 to pick: numpy's 0 or 1
    # x * 0 + 0 at zero and NaN: sign(NaN) is NaN (numpy, JAX; it was 1), sign(-0.0) is +0.0 (numpy, torch; x * 0
    # alone gave -0.0). Detached: sign passes no gradient (torch's is 0), where x * 0 would pass upstream * 0, NaN
    # for an infinite upstream gradient at x = 0
    return unit(self, self.detach() * 0 + 0)
  def abs(self) -> UOp:
    # x times its sign with -0.0 kept (-0.0 * -0.0 is +0.0; sign's +0.0 would give -0.0)
    return self * (self.ne(0).cast(self.dtype) if dtypes.is_unsigned(self.dtype) else unit(self, self.detach() * 0))
  def relu(self) -> UOp:
    # relu(NaN) is NaN as torch's and JAX's ((x > 0).where(x, 0) gave 0), with torch's gradient there (JAX's is 0);
    # relu(-0.0) is +0.0 as JAX's (torch's is -0.0: they disagree)
    return ((self > 0) | self.ne(self)).where(self, 0)
  def sigmoid(self) -> UOp:
    """1 / (1 + e**-x) for x >= 0, e**x / (1 + e**x) below: e**-x overflowed for x < -88.7 (float32; -709.8 in
    float64), so sigmoid was 0 where it is a (denormal) e**x. One exp of -|x| (never past 1: no inf / inf in the
    value or the gradient), -|x| by a select so that its derivative at 0 is -1, not abs's 0."""
    if not dtypes.is_float(self.dtype): return self.cast(dtypes.float32).sigmoid()
    if self.dtype.itemsize == 2: return self.cast(dtypes.float32).sigmoid().cast(self.dtype)  # rounded once
    neg = self < 0
    e = neg.where(self, -self).exp()
    return neg.where(e, 1.0) / (1 + e)
  def tanh(self) -> UOp:
    """Below |x| = 1/8 the Taylor series to x**15 (within 2 ulp of float64 there: 2 sigmoid(2x) - 1 cancelled, so
    tanh(1e-8) was 0 in float32); its argument is 0 elsewhere so that its gradient, masked to 0 there, is never
    0 * inf. Above, sign(x) (1 - e) / (1 + e) with e = e**-2|x| in (0, 0.78]: 1 - e is exact for e >= 1/2 and past
    1/2 elsewhere, where 2 sigmoid(2x) - 1 lost 3 bits near 1/8 (15 ulp; now 4), and e never overflows (sigmoid's
    e**-2x was inf for x < -44 in float32, the gradient inf / inf = NaN). float16/bfloat16 in float32, rounded once."""
    if not dtypes.is_float(self.dtype): return self.cast(dtypes.float32).tanh()
    if self.dtype.itemsize == 2: return self.cast(dtypes.float32).tanh().cast(self.dtype)
    x = self
    small = (x < 0.125) & (x > -0.125)
    xs = small.where(x, 0.0)
    z, p = xs * xs, x.const_like(_TANH_TAYLOR[-1])
    for c in reversed(_TANH_TAYLOR[:-1]): p = p * z + c
    neg = x < 0
    e = small.where(0.0, neg.where(x, -x) * 2).exp()  # -|x| by a select: its derivative is -+1, abs's is 0 at 0
    t = (1 - e) / (1 + e)
    return small.where(xs * p, neg.where(-t, t))
  def square(self) -> UOp: return self * self

  # ---- movement ----
  # the common calls (one exact tuple, or ints; no -1; non-negative axes) skip the normalisation of the others, and
  # a repeated one (its validity cached by make.movement) is one call: _cached gives the node, or None for the rest
  def reshape(self, *shape) -> UOp:
    if len(shape) == 1:
      shape = shape[0] if type(shape[0]) is tuple else tuple(shape[0]) if isinstance(shape[0], (tuple, list)) else shape
    r = _cached(_RESHAPE, self, shape)
    if r is not None:
      if _uop._md_open: _uop._attach_current(r)
      return r
    for d in shape:  # inline: the common all-int shape pays one loop, no call
      if type(d) is not int:
        shape = _dims(Ops.RESHAPE, shape)
        break
    if -1 in shape:
      known = math.prod(s for s in shape if s != -1)
      if shape.count(-1) > 1 or known == 0 or self.numel % known:
        raise ValueError(f"RESHAPE: cannot infer -1 in {shape} from {self.shape}")
      shape = tuple(self.numel // known if s == -1 else s for s in shape)
    return self if shape == self._shape else _movement(_RESHAPE, self, shape)
  def expand(self, *shape) -> UOp:
    if len(shape) == 1:
      shape = shape[0] if type(shape[0]) is tuple else tuple(shape[0]) if isinstance(shape[0], (tuple, list)) else shape
    r = _cached(_EXPAND, self, shape)
    if r is not None:
      if _uop._md_open: _uop._attach_current(r)
      return r
    for d in shape:  # inline: the common all-int shape pays one loop, no call
      if type(d) is not int:
        shape = _dims(Ops.EXPAND, shape)
        break
    if -1 in shape and len(shape) == len(self._shape):
      shape = tuple(o if n == -1 else n for o, n in zip(self._shape, shape))
    return self if shape == self._shape else _movement(_EXPAND, self, shape)
  def permute(self, *order) -> UOp:
    if len(order) == 1:
      order = order[0] if type(order[0]) is tuple else tuple(order[0]) if isinstance(order[0], (tuple, list)) else order
    r = _cached(_PERMUTE, self, order)
    if r is not None:
      if _uop._md_open: _uop._attach_current(r)
      return r
    n = len(self._shape)
    for o in order:
      if type(o) is not int or o < 0:
        order = tuple([o + n if -n <= o < 0 else o for o in map(functools.partial(_index, "permute"), order)])
        break
    return self if order == (_IOTA[n] if n < len(_IOTA) else tuple(range(n))) else _movement(_PERMUTE, self, order)
  def flip(self, *axes) -> UOp:
    axes = tuple(axes[0]) if len(axes) == 1 and isinstance(axes[0], (tuple, list)) else tuple(axes)
    ax = set(_axes(self.ndim, axes))
    return UOp(Ops.FLIP, None, (self,), tuple(i in ax for i in range(self.ndim)))
  def pad(self, padding) -> UOp:
    """Pad each axis by (before, after) elements (None: no padding); one pair per axis."""
    padding = tuple(padding)
    if len(padding) != self.ndim:
      raise ValueError(f"pad: {len(padding)} (before, after) pairs given for {self.ndim} dims {self.shape}")
    arg = tuple((0, 0) if p is None else (_index("pad", p[0]), _index("pad", p[1])) for p in padding)
    return self if all(p == (0, 0) for p in arg) else _movement(_PAD, self, arg)
  def shrink(self, bounds) -> UOp:
    """Keep [start, end) of each axis (None: all of it); one pair per axis."""
    bounds = tuple(bounds)
    if len(bounds) != self.ndim:
      raise ValueError(f"shrink: {len(bounds)} (start, end) bounds given for {self.ndim} dims {self.shape}")
    arg = tuple((0, s) if b is None else (_index("shrink", b[0]), _index("shrink", b[1]))
                for b, s in zip(bounds, self.shape))
    return self if all(b == (0, s) for b, s in zip(arg, self.shape)) else _movement(_SHRINK, self, arg)
  def transpose(self, dim0: int = 1, dim1: int = 0) -> UOp:
    dim0, dim1 = _axis(self.ndim, dim0), _axis(self.ndim, dim1)
    order = list(range(self.ndim))
    order[dim0], order[dim1] = order[dim1], order[dim0]
    return self.permute(order)
  @property
  def T(self) -> UOp: return self.transpose()

  # ---- reductions ----
  def r(self, op: Ops, axes) -> UOp:
    """REDUCE_AXIS over `axes` (kept as size 1)."""
    return _movement(_REDUCE_AXIS, self, (op, tuple(axes)))
  def _reduce(self, op: Ops, axis, keepdim: bool) -> UOp:
    axes = _axes(self.ndim, axis)
    ret = self.r(op, axes) if axes else self
    return ret if keepdim else ret.reshape(tuple(s for i, s in enumerate(self.shape) if i not in axes))
  def _acc(self, name: str, dtype) -> UOp:
    if dtype is None: return self.cast(sum_acc_dtype(self.dtype))
    if not isinstance(dtype, DType) or dtype is dtypes.void:
      raise TypeError(f"{name}: dtype must be a value DType such as dtypes.int64, got {dtype!r}")
    return self.cast(dtype)
  def sum(self, axis=None, keepdim: bool = False, dtype: DType | None = None) -> UOp:
    """The sum over `axis`, in `dtype`; by default bool and narrow ints in int32, unsigned ones in uint32 (see
    `pygrad.dtype.sum_acc_dtype`), other dtypes as they are."""
    return self._acc("sum", dtype)._reduce(Ops.ADD, axis, keepdim)
  def prod(self, axis=None, keepdim: bool = False, dtype: DType | None = None) -> UOp:
    """The product over `axis`, in `dtype`; by default in the dtype `sum` gives (JAX's rule)."""
    return self._acc("prod", dtype)._reduce(Ops.MUL, axis, keepdim)
  def max(self, axis=None, keepdim: bool = False) -> UOp: return self._reduce(Ops.MAX, axis, keepdim)
  def min(self, axis=None, keepdim: bool = False) -> UOp:
    if not dtypes.is_float(self.dtype):
      # x -> x ^ all-ones (~x = -x - 1 on signed ints) reverses the order of ints and bools exactly, where wrapping
      # -x does not (-MIN is MIN, so the min of [MIN, 5] was 5; on unsigned ints -0 is 0, the bottom of the order),
      # so the min is the max of the flipped values, flipped back; over an empty axis that is the dtype's maximum
      ones = True if dtypes.is_bool(self.dtype) else -1 if not dtypes.is_unsigned(self.dtype) else \
        2 ** (8 * self.dtype.itemsize) - 1
      return (self ^ ones).max(axis, keepdim) ^ ones
    return -((-self).max(axis, keepdim))
  def mean(self, axis=None, keepdim: bool = False) -> UOp:
    # float16/bfloat16 divide in float32 before rounding (as tinygrad): their sum alone overflows past 65504
    half = self.dtype in (dtypes.float16, dtypes.bfloat16)
    x = self if dtypes.is_float(self.dtype) and not half else self.cast(dtypes.float32)
    n = math.prod(self.shape[a] for a in _axes(self.ndim, axis))
    ret = x.sum(axis, keepdim) / n  # a quotient, as numpy's and torch's mean (0 / 0 = NaN over no elements)
    return ret.cast(self.dtype) if half else ret
  def softmax(self, axis: int = -1) -> UOp:
    m = self - self.max(axis, keepdim=True)
    e = m.exp()
    return e / e.sum(axis, keepdim=True)
  def log_softmax(self, axis: int = -1) -> UOp:
    m = self - self.max(axis, keepdim=True)
    return m - m.exp().sum(axis, keepdim=True).log()

  # ---- matmul ----
  def matmul(self, w) -> UOp:
    """self @ w as reshape/expand/mul/sum over the contracted axis."""
    x, w = self, _uop_arg("matmul", w)
    if x.ndim == 0 or w.ndim == 0: raise ValueError(f"matmul: operands must be at least 1-D, got {x.shape} @ {w.shape}")
    x1, w1 = x.ndim == 1, w.ndim == 1
    if x1: x = x.reshape((1, x.shape[0]))
    if w1: w = w.reshape((w.shape[0], 1))
    if x.shape[-1] != w.shape[-2]: raise ValueError(f"matmul: contracted dims differ in {self.shape} @ {w.shape}")
    n, k, m = x.shape[-2], x.shape[-1], w.shape[-1]
    batch = _bshape(x.shape[:-2], w.shape[:-2])
    xe = x.reshape(x.shape[:-1] + (1, k)).broadcast_to(batch + (n, m, k))
    wt = w.transpose(-1, -2)
    we = wt.reshape(wt.shape[:-2] + (1, m, k)).broadcast_to(batch + (n, m, k))
    out = (xe * we)._reduce(Ops.ADD, -1, False)  # in the operands' dtype, as numpy's, torch's and tinygrad's matmul
    if x1: out = out.reshape(out.shape[:-2] + (m,))
    if w1: out = out.reshape(out.shape[:-1])
    return out
  def __matmul__(self, w): return self.matmul(w)
  def __rmatmul__(self, x): return _uop_arg("matmul", x).matmul(self)

  # ---- identities and devices ----
  def contiguous(self) -> UOp: return UOp(Ops.CONTIGUOUS, None, (self,))
  def contiguous_backward(self) -> UOp: return UOp(Ops.CONTIGUOUS_BACKWARD, None, (self,))
  def detach(self) -> UOp: return UOp(Ops.DETACH, None, (self,))
  def copy_to_device(self, device) -> UOp:
    """A copy on another device; a tuple of devices gives a replicated MULTI."""
    if isinstance(device, tuple): return self.shard(device, None)
    return UOp(Ops.COPY, None, (self,), device)
  def shard(self, devices, axis: int | None = None) -> UOp:
    """This tensor split along `axis` (or replicated, axis None) over `devices`, as a MULTI."""
    devices = tuple(devices)
    if not devices: raise ValueError("shard: needs at least one device")
    if axis is None: return UOp(Ops.MULTI, None, tuple(self.copy_to_device(d) for d in devices), None)
    axis = _index("shard", axis)
    if not -self.ndim <= axis < self.ndim: raise ValueError(f"shard: axis {axis} out of range for {self.ndim} dims")
    axis %= self.ndim
    size = self.shape[axis]
    if size % len(devices):
      raise ValueError(f"shard: axis {axis} of size {size} does not split over {len(devices)} devices")
    step = size // len(devices)
    pieces = []
    for i, d in enumerate(devices):
      b = tuple((i * step, (i + 1) * step) if j == axis else (0, s) for j, s in enumerate(self.shape))
      pieces.append(UOp(Ops.SHRINK, None, (self,), b).copy_to_device(d))
    return UOp(Ops.MULTI, None, tuple(pieces), axis)
