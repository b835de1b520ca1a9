"""Shape, dtype and device inference with validation: one function per op family, keyed by op. Each returns
(dtype, shape, device) for a node about to be made, or raises ValueError/TypeError naming the op, what its operands
are and what was expected."""
from __future__ import annotations
import math
from .ops import Ops, GroupOp
from .dtype import DType, dtypes

VOID = dtypes.void


def _desc(src) -> str:
  return ", ".join(f"{s.op.name}{s.shape}:{s.dtype.name}" for s in src) or "none"


def _fail(op, src, why, exc=ValueError):
  raise exc(f"{op.name}: {why} (operands: {_desc(src)})")


def _nsrc(op, src, n):
  if len(src) != n: _fail(op, src, f"expected {n} source{'s' if n != 1 else ''}, got {len(src)}")


def _no_arg(op, src, arg):
  """The ALU ops, CAST and BITCAST take no arg (SPEC section 2's table): one given is a mistake, never ignored."""
  if arg is not None: _fail(op, src, f"takes no arg, got {type(arg).__name__} {arg!r:.60}")


def _want_dtype(op, src, dtype, got):
  if dtype is not None and dtype is not got:
    _fail(op, src, f"dtype {dtype.name} given, but the result is {got.name}", TypeError)
  return got


def _device(op, src):
  dev = None
  for s in src:
    d = s.device
    if d is None: continue
    if dev is None: dev = d
    elif d != dev: _fail(op, src, f"operands on different devices {dev!r} and {d!r}")
  return dev


def _static_ints(op, arg, what):
  if type(arg) is not tuple or not all(type(a) is int for a in arg):
    raise TypeError(f"{op.name}: arg must be a tuple of ints ({what}), got {arg!r}")
  return arg


def _leaf(op, dtype, src, arg):
  _nsrc(op, src, 0)
  if op is Ops.NOOP: return VOID, (), None
  if dtype is None or dtype is VOID: raise TypeError(f"{op.name}: a dtype is required, got {dtype!r}")
  if op is Ops.CONST:
    want = float if dtype.kind == "f" else bool if dtype.kind == "b" else int
    if type(arg) is not want:
      raise TypeError(f"CONST: a {dtype.name} constant holds a Python {want.__name__}, got {type(arg).__name__} {arg!r}")
    if want is int:
      lo, hi = (0, 2 ** (8 * dtype.itemsize) - 1) if dtype.kind == "u" else \
        (-2 ** (8 * dtype.itemsize - 1), 2 ** (8 * dtype.itemsize - 1) - 1)
      if not lo <= arg <= hi: raise ValueError(f"CONST: {arg} is out of range for {dtype.name}")
    return dtype, (), None
  if op is Ops.DEFINE_VAR:
    if type(arg) is not tuple or len(arg) != 3 or type(arg[0]) is not str:
      raise TypeError(f"DEFINE_VAR: arg must be (name, vmin, vmax), got {arg!r}")
    return dtype, (), None
  if type(arg) is not tuple or len(arg) < 3:
    raise TypeError(f"{op.name}: arg must be (id, shape, device, ...), got {arg!r}")
  shape = _static_ints(op, arg[1], "shape")
  if any(d < 0 for d in shape): raise ValueError(f"{op.name}: negative dimension in shape {shape}")
  _fits(op, src, shape)
  dev = arg[2]
  if not (type(dev) is str or (op is Ops.PARAM and (dev is None or (type(dev) is tuple and
                                                                    all(type(d) is str for d in dev))))):
    raise TypeError(f"{op.name}: device must be a str, got {dev!r}")
  return dtype, shape, dev


def _broadcast(op, src):
  shape = ()
  for s in src:
    if s.shape == () or s.shape == shape: continue
    if shape == (): shape = s.shape
    else: _fail(op, src, "operands must have equal shapes, or one of shape ()")
  return shape


def _unary(op, dtype, src, arg):
  _nsrc(op, src, 1)
  _no_arg(op, src, arg)
  x = src[0]
  if x.dtype is VOID: _fail(op, src, "operand has no value", TypeError)
  if op in GroupOp.Transcendental and not dtypes.is_float(x.dtype):
    _fail(op, src, "expected a float operand", TypeError)
  if op is Ops.TRUNC and not (dtypes.is_float(x.dtype) or dtypes.is_int(x.dtype)):
    _fail(op, src, "expected a float or int operand", TypeError)
  return _want_dtype(op, src, dtype, x.dtype), x.shape, x.device


def _cast(op, dtype, src, arg):
  _nsrc(op, src, 1)
  _no_arg(op, src, arg)
  if not isinstance(dtype, DType) or dtype is VOID: _fail(op, src, f"target dtype required, got {dtype!r}", TypeError)
  if src[0].dtype is VOID: _fail(op, src, "operand has no value", TypeError)
  if op is Ops.BITCAST and dtype.itemsize != src[0].dtype.itemsize:
    _fail(op, src, f"BITCAST to {dtype.name} needs itemsize {src[0].dtype.itemsize}", TypeError)
  return dtype, src[0].shape, src[0].device


def _binary(op, dtype, src, arg):
  _nsrc(op, src, 2)
  _no_arg(op, src, arg)
  a, b = src
  if a.dtype is not b.dtype: _fail(op, src, "operands must have equal dtypes", TypeError)
  d = a.dtype
  if d is VOID: _fail(op, src, "operands have no value", TypeError)
  if op in GroupOp.IntOnly and not dtypes.is_int(d): _fail(op, src, "expected int operands", TypeError)
  if op in (Ops.AND, Ops.OR, Ops.XOR) and dtypes.is_float(d): _fail(op, src, "expected int or bool operands", TypeError)
  out = dtypes.bool if op in GroupOp.Comparison else d
  return _want_dtype(op, src, dtype, out), _broadcast(op, src), _device(op, src)


def _where(op, dtype, src, arg):
  _nsrc(op, src, 3)
  _no_arg(op, src, arg)
  c, a, b = src
  if c.dtype is not dtypes.bool: _fail(op, src, "condition must be bool", TypeError)
  if a.dtype is not b.dtype or a.dtype is VOID: _fail(op, src, "branches must have equal value dtypes", TypeError)
  return _want_dtype(op, src, dtype, a.dtype), _broadcast(op, src), _device(op, src)


def reduce_shape(op, src, arg):
  """REDUCE_AXIS's validity function (see the movement ones below): the reduced shape, or the error."""
  x = src[0]
  if type(arg) is not tuple or len(arg) != 2 or arg[0] not in (Ops.ADD, Ops.MAX, Ops.MUL):
    raise TypeError(f"REDUCE_AXIS: arg must be (Ops.ADD|Ops.MAX|Ops.MUL, axes), got {arg!r}")
  axes = _static_ints(op, arg[1], "axes")
  if any(not 0 <= a < len(x.shape) for a in axes) or len(set(axes)) != len(axes):
    _fail(op, src, f"axes {axes} out of range or repeated for {len(x.shape)} dims")
  return tuple([1 if i in axes else s for i, s in enumerate(x.shape)])


def _reduce(op, dtype, src, arg):
  _nsrc(op, src, 1)
  shape = reduce_shape(op, src, arg)
  x = src[0]
  if x.dtype is VOID: _fail(op, src, "operand has no value", TypeError)
  return _want_dtype(op, src, dtype, x.dtype), shape, x.device


INT64_MAX = 2 ** 63 - 1


def _fits(op, src, shape) -> tuple:
  """shape, if every size and the element count fit in int64 (the VM's and numpy's index type)."""
  n = 1
  for d in shape: n *= d
  if n > INT64_MAX or (shape and max(shape) > INT64_MAX):
    _fail(op, src, f"size {max(n, max(shape))} of shape {shape} does not fit in int64")
  return shape


def _ints(op, arg, what, n=None):
  if type(arg) is not tuple or (n is not None and len(arg) != n):
    raise TypeError(f"{op.name}: arg must be a tuple of {'' if n is None else f'{n} '}ints ({what}), got {arg!r}")
  for a in arg:
    if type(a) is not int: raise TypeError(f"{op.name}: arg must be a tuple of ints ({what}), got {arg!r}")
  return arg


def _pairs(op, arg, n):
  if type(arg) is not tuple or len(arg) != n:
    raise TypeError(f"{op.name}: arg must be a tuple of {n} (int, int) pairs, got {arg!r}")
  for p in arg:
    if not (type(p) is tuple and len(p) == 2 and type(p[0]) is int and type(p[1]) is int):
      raise TypeError(f"{op.name}: arg must be a tuple of {n} (int, int) pairs, got {arg!r}")
  return arg


# One validity function per movement op: the node's shape, or the error. Inference (INFER) and the math methods'
# fast paths both call these, so an error never depends on the path that met it.
def _value_src(op, src):
  if len(src) != 1: _nsrc(op, src, 1)
  x = src[0]
  if x.dtype is VOID: _fail(op, src, "operand has no value", TypeError)
  return x


def reshape_shape(op, src, arg):
  new, shp = _ints(op, arg, "new shape"), src[0].shape
  if (new and min(new) < 0) or math.prod(new) != math.prod(shp): _fail(op, src, f"cannot reshape to {new}")
  return _fits(op, src, new)


def expand_shape(op, src, arg):
  new, shp = _ints(op, arg, "new shape"), src[0].shape
  if len(new) != len(shp) or any(o != s and o != 1 for o, s in zip(shp, new)) or (new and min(new) < 0):
    _fail(op, src, f"cannot expand to {new}: only size-1 axes grow, and the rank stays")
  return _fits(op, src, new)


def permute_shape(op, src, arg):
  shp = src[0].shape
  order = _ints(op, arg, "order")
  if sorted(order) != list(range(len(shp))): _fail(op, src, f"{order} is not a permutation of {len(shp)} axes")
  return tuple([shp[i] for i in order])


def flip_shape(op, src, arg):
  shp = src[0].shape
  if type(arg) is not tuple or len(arg) != len(shp) or not all(type(a) is bool for a in arg):
    raise TypeError(f"FLIP: arg must be a tuple of {len(shp)} bools, got {arg!r}")
  return shp


def pad_shape(op, src, arg):
  shp = src[0].shape
  _pairs(op, arg, len(shp))
  if any(b < 0 or a < 0 for b, a in arg): _fail(op, src, f"negative padding {arg}")
  return _fits(op, src, tuple([s + b + a for s, (b, a) in zip(shp, arg)]))


def shrink_shape(op, src, arg):
  shp = src[0].shape
  _pairs(op, arg, len(shp))
  if any(not 0 <= b <= e <= s for s, (b, e) in zip(shp, arg)): _fail(op, src, f"shrink {arg} out of bounds")
  return tuple([e - b for b, e in arg])


SHAPE = {Ops.RESHAPE: reshape_shape, Ops.EXPAND: expand_shape, Ops.PERMUTE: permute_shape, Ops.FLIP: flip_shape,
         Ops.PAD: pad_shape, Ops.SHRINK: shrink_shape, Ops.REDUCE_AXIS: reduce_shape}


def _movement(op, dtype, src, arg):
  x = _value_src(op, src)
  new = SHAPE[op](op, src, arg)
  return _want_dtype(op, src, dtype, x.dtype), new, x.device


def _identity(op, dtype, src, arg):
  _nsrc(op, src, 1)
  if src[0].dtype is VOID: _fail(op, src, "operand has no value", TypeError)
  return _want_dtype(op, src, dtype, src[0].dtype), src[0].shape, src[0].device


def _copy(op, dtype, src, arg):
  _nsrc(op, src, 1)
  if type(arg) is not str: raise TypeError(f"COPY: arg must be a device name, got {arg!r}")
  return _want_dtype(op, src, dtype, src[0].dtype), src[0].shape, arg


def _multi(op, dtype, src, arg):
  if not src: _fail(op, src, "needs at least one shard")
  if any(s.dtype is not src[0].dtype for s in src): _fail(op, src, "shards must share a dtype", TypeError)
  if any(type(s.device) is not str for s in src): _fail(op, src, "every shard must be on one device")
  shp = src[0].shape
  if arg is None:
    if any(s.shape != shp for s in src): _fail(op, src, "replicated shards must have equal shapes")
    shape = shp
  else:
    if type(arg) is not int or not 0 <= arg < len(shp): _fail(op, src, f"axis {arg!r} out of range", TypeError)
    if any(len(s.shape) != len(shp) or any(a != b for i, (a, b) in enumerate(zip(s.shape, shp)) if i != arg)
           for s in src):
      _fail(op, src, f"shards must agree on every axis but {arg}")
    shape = _fits(op, src, tuple(sum(s.shape[arg] for s in src) if i == arg else d for i, d in enumerate(shp)))
  return _want_dtype(op, src, dtype, src[0].dtype), shape, tuple(s.device for s in src)


def _group(op, dtype, src, arg):
  return VOID, (), None


def _gettuple(op, dtype, src, arg):
  _nsrc(op, src, 1)
  t = src[0]
  if type(arg) is not int: raise TypeError(f"GETTUPLE: arg must be an int index, got {arg!r}")
  outs = t.src[0].src if t.op is Ops.FUNCTION else t.src if t.op is Ops.TUPLE else None
  if outs is None: _fail(op, src, "source must be a FUNCTION or a TUPLE", TypeError)
  if not 0 <= arg < len(outs): _fail(op, src, f"index {arg} out of range for {len(outs)} outputs")
  o = outs[arg]
  return _want_dtype(op, src, dtype, o.dtype), o.shape, o.device


def _function(op, dtype, src, arg):
  from .uop import CallInfo
  if not src: _fail(op, src, "needs a body")
  if not isinstance(arg, CallInfo): raise TypeError(f"{op.name}: arg must be a CallInfo, got {arg!r}")
  body, args = src[0], src[1:]
  if op is Ops.FUNCTION:
    if body.op is not Ops.TUPLE: _fail(op, src, "body (src[0]) must be a TUPLE")
    for p in body.toposort(enter_calls=False):
      if p.op is not Ops.PARAM: continue
      slot = p.arg[0]
      if not 0 <= slot < len(args): _fail(op, src, f"body uses PARAM slot {slot} but {len(args)} args are given")
      a = args[slot]
      if a.shape != p.shape or a.dtype is not p.dtype:
        _fail(op, src, f"arg {slot} is {a.shape}:{a.dtype.name}, PARAM expects {p.shape}:{p.dtype.name}")
  elif arg.fxn is None and arg.grad_fxn is None and body.op is not Ops.SINK:
    _fail(op, src, "a CALL needs a kernel")
  return VOID, (), None


def _after(op, dtype, src, arg):
  _nsrc(op, src, 2)
  if src[1].op is not Ops.CALL: _fail(op, src, "src[1] must be a CALL", TypeError)
  return _want_dtype(op, src, dtype, src[0].dtype), src[0].shape, src[0].device


INFER = {
  **{o: _leaf for o in GroupOp.Leaf},
  **{o: _unary for o in GroupOp.Unary},
  Ops.CAST: _cast, Ops.BITCAST: _cast,
  **{o: _binary for o in GroupOp.Binary},
  Ops.WHERE: _where, Ops.REDUCE_AXIS: _reduce,
  **{o: _movement for o in GroupOp.Movement},
  **{o: _identity for o in GroupOp.Identity},
  Ops.COPY: _copy, Ops.MULTI: _multi, Ops.TUPLE: _group, Ops.SINK: _group, Ops.GETTUPLE: _gettuple,
  Ops.FUNCTION: _function, Ops.CALL: _function, Ops.AFTER: _after,
}
assert set(INFER) == set(Ops), set(Ops) - set(INFER)


def dtype_tables():
  """Which unary ops take which dtypes, and which dtype each binary op gives per operand dtype, by probing the
  generic inference once: op -> frozenset of dtypes, op -> {dtype: result dtype} (no tuple key to build per call)."""
  from .ops import GroupOp
  from .dtype import VALUE_DTYPES
  from types import SimpleNamespace
  probe = {d: SimpleNamespace(op=Ops.CONST, dtype=d, shape=(), device=None) for d in VALUE_DTYPES}
  un: dict = {}
  bi: dict = {}
  for op in GroupOp.Unary:
    ok = set()
    for d, p in probe.items():
      try: INFER[op](op, None, (p,), None)
      except (TypeError, ValueError): continue
      ok.add(d)
    un[op] = frozenset(ok)
  for op in GroupOp.Binary:
    outs = bi[op] = {}
    for d, p in probe.items():
      try: outs[d] = INFER[op](op, None, (p, p), None)[0]
      except (TypeError, ValueError): continue
  return un, bi
