"""The numpy reference evaluator: runs a graph op by op, and is the oracle every other engine is tested against.

`evaluate(outputs, inputs)` walks the outputs' toposort once (iteratively, never recursing on graph depth), keeps
each node's value until its last user has run, and returns one numpy array per output (a tuple for TUPLE, SINK and
FUNCTION, None for NOOP). Arrays returned are owned by the caller: writable, never aliasing an input.

Values. A node's value is a numpy array of its dtype's storage type (`DType.numpy`); bfloat16 is stored as float32
holding bfloat16 values exactly. Arithmetic on float16 and bfloat16 is done in float32 and every result is rounded
back (round to nearest, ties to even; bfloat16 rounds the float32 bits to their top 16). A conversion into
float16/bfloat16 (CAST, a constant, a bound value) is rounded once, as numpy's and ml_dtypes' are: through float32
rounded to odd (values.to_float32_odd), not to nearest (float64 -> float32 -> float16 rounded twice). Reductions
accumulate in the operand's compute type (float32 for float16/bfloat16) and round once at the end.

Results defined here for what C leaves undefined (the C VM matches them):
* IDIV on ints truncates toward zero; MOD has the sign of the dividend (C's `/` and `%`). A divisor of 0 gives 0
  for both. Signed overflow wraps in two's complement: ADD, MUL, POW and `MIN // -1` (which gives MIN, `MIN % -1`
  gives 0).
* SHL/SHR by a negative count gives 0. SHL by a count >= the bit width gives 0. SHR is arithmetic on signed ints
  (logical on unsigned); by a count >= the bit width it gives -1 for a negative signed value, else 0.
* POW on ints: exact (wrapping) integer power for exponents >= 0, 0**0 == 1; a negative exponent gives 0, except
  base 1 (gives 1) and base -1 (gives 1 for an even exponent, -1 for an odd one). POW on bool is `a or not b`.
* POW on floats is C99's pow, computed in float64 (float32/float16/bfloat16 round once; values._float_pow).
* CAST float -> int: truncation toward zero; NaN gives 0; values out of range saturate to the int's min/max.
  CAST int -> int wraps (keeps the low bits). CAST to bool is `x != 0` (so NaN -> True). CAST bool -> x is 0/1.
* BITCAST reinterprets the bits (bfloat16 as the top 16 bits of its float32 storage); BITCAST to bool is `x != 0`.
* MAX and the comparisons follow IEEE like numpy: MAX with a NaN operand is NaN; CMPLT/CMPEQ with NaN are False,
  CMPNE is True. ADD/MUL/MAX on bool are OR/AND/OR. REDUCE_AXIS over zero elements gives 0 (ADD), 1 (MUL) and the
  dtype's lowest value (MAX: -inf, the int's min, False). RECIPROCAL/SQRT/LOG2/... follow IEEE (1/0 = inf,
  sqrt(-1) = NaN, log2(0) = -inf); floating warnings are silenced.
* A float MUL whose source is a RECIPROCAL, MUL(a, RECIPROCAL(b)) or MUL(RECIPROCAL(b), a), is the IEEE quotient
  a / b, correctly rounded (what `a / b` builds: numpy's, torch's and JAX's division), not the product of a rounded
  reciprocal; see values.quotient_operands.

Inputs (engine/values.py, shared with the C engine). `inputs` maps BUFFER and DEFINE_VAR nodes to values. A numpy
array (or numpy scalar) must have exactly the node's storage dtype (bfloat16: float32, rounded on entry, or an
`ml_dtypes.bfloat16` array) and, for a BUFFER, its shape; any strides are accepted. Other array-likes (Python scalars,
lists) are converted when their kind fits (bool into anything; int into int or float; float into float) and, for ints,
the values fit the dtype. A DEFINE_VAR takes a scalar within [vmin, vmax]. Anything else -- a missing binding, a wrong
shape, a wrong dtype, a value out of range -- raises ValueError naming the input. Every binding is validated, whether
the outputs use it or not; a valid binding the outputs do not use is ignored (both engines accept exactly the same
inputs).

Structure. PARAM slot i inside a FUNCTION body is the FUNCTION's args[i] (the body runs as a sub-evaluation, on
an explicit stack of frames: FUNCTIONs nest to any depth without recursion); a
FUNCTION's value is the tuple of its body's outputs. CALL runs `CallInfo.fxn(*arrays)` on writable copies of its
buffers; AFTER(buffer, CALL) is that buffer's array after the call. COPY and the identity ops pass the value on; MULTI
concatenates its shards along its axis (or, replicated, is its first shard).
"""
from __future__ import annotations
import math, sys
import numpy as np
from ..ops import Ops, GroupOp
from ..dtype import dtypes
from ..core import CORE
from ..uop import UOp, handle
from .values import round_bfloat16, const_array, input_name, alu, reduce_value, bindings, map_nested, \
  cast_value, bitcast_value, quotient_operands, divide

_BF16 = dtypes.bfloat16
_MISSING = object()


# ---- leaves ----
def _input(u: UOp, xs, ctx):
  hit = ctx.inputs.get(u._id, _MISSING)
  if hit is _MISSING: raise ValueError(f"missing input: {input_name(u)} is not bound in inputs")
  a = hit[1].view()
  a.flags.writeable = False  # so that `_own` copies whatever aliases the caller's array
  return a


def _param(u: UOp, xs, ctx):
  slot = u.arg[0]
  if ctx.params is None: raise ValueError(f"PARAM slot {slot} is only bound inside a FUNCTION body")
  if not 0 <= slot < len(ctx.params): raise ValueError(f"PARAM slot {slot}: the FUNCTION has {len(ctx.params)} args")
  return ctx.params[slot]


def _alu(u: UOp, xs, ctx):
  return alu(u.op, u.dtype, xs, u.src[1].dtype if u.op is Ops.WHERE else u.src[0].dtype)


def _quotient(u: UOp, xs, ctx): return divide(u.dtype, xs[0], xs[1])


def _skip(u: UOp, xs, ctx): return None


# ---- reduce and movement ----
def _reduce(u: UOp, xs, ctx): return reduce_value(u.arg[0], u.dtype, xs[0], u.arg[1])


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


# FUNCTION is not here: the driver runs its body in a frame of its own
_EVAL = {
  Ops.CONST: lambda u, xs, ctx: const_array(u.arg, u.dtype), Ops.DEFINE_VAR: _input, Ops.BUFFER: _input,
  Ops.PARAM: _param, Ops.NOOP: lambda u, xs, ctx: None,
  **{o: _alu for o in GroupOp.ALU | {Ops.CAST, Ops.BITCAST}},
  Ops.REDUCE_AXIS: _reduce, **{o: _movement for o in GroupOp.Movement},
  **{o: (lambda u, xs, ctx: xs[0]) for o in GroupOp.Identity}, Ops.COPY: lambda u, xs, ctx: xs[0],
  Ops.MULTI: _multi,
  Ops.TUPLE: lambda u, xs, ctx: tuple(xs), Ops.SINK: lambda u, xs, ctx: tuple(xs),
  Ops.GETTUPLE: lambda u, xs, ctx: xs[0][u.arg],
  Ops.CALL: _call, Ops.AFTER: _after,
}
assert set(_EVAL) | {Ops.FUNCTION} == set(Ops), set(Ops) - set(_EVAL)


# ---- driver ----
class _Ctx:
  __slots__ = ("inputs", "params")

  def __init__(self, inputs: dict, params: tuple | None):
    self.inputs, self.params = inputs, params


class _Frame:
  """One graph (the top level or a FUNCTION body) being run: its toposort (FUNCTION/CALL bodies not entered), each
  node's operands, how many users each value still has, and the values kept so far."""
  __slots__ = ("roots", "ctx", "nodes", "operands", "fns", "uses", "keep", "vals", "i")

  def __init__(self, roots: list[UOp], ctx: _Ctx):
    self.roots, self.ctx, self.i, self.vals = roots, ctx, 0, {}
    self.nodes = [handle(n) for n in CORE.toposort([r._id for r in roots], False)]
    self.keep = {r._id for r in roots}
    self.uses: dict[int, int] = {}
    self.operands, self.fns = [], []
    for u in self.nodes:
      op = u.op
      s = u.src[1:] if op is Ops.FUNCTION or op is Ops.CALL else u.src
      q = quotient_operands(op, u.dtype, s) if op is Ops.MUL else None
      if q is not None: s = q  # a float MUL(a, RECIPROCAL(b)) is the quotient a / b (values.quotient_operands)
      self.operands.append(s)
      self.fns.append(_quotient if q is not None else _EVAL.get(op))
      for x in s: self.uses[x._id] = self.uses.get(x._id, 0) + 1
    for i, u in enumerate(self.nodes):  # a RECIPROCAL only divisions read is not computed
      if u.op is Ops.RECIPROCAL and not self.uses.get(u._id) and u._id not in self.keep:
        self.uses[u.src[0]._id] -= 1
        self.operands[i], self.fns[i] = (), _skip

  def put(self, value) -> None:
    """Store the current node's value, drop operands whose last user it was, and move on."""
    u, srcs, vals, uses = self.nodes[self.i], self.operands[self.i], self.vals, self.uses
    vals[u._id] = value
    for s in srcs:
      k = s._id
      uses[k] -= 1
      if not uses[k] and k not in self.keep: del vals[k]
    self.i += 1


def _run(roots: list[UOp], ctx: _Ctx) -> list:
  """Values of roots, each value dropped after its last user. A FUNCTION pushes a frame for its body (bound to its
  args' values) and takes the body's value when that frame ends: nothing recurses on the nesting depth."""
  stack = [_Frame(roots, ctx)]
  while True:
    f = stack[-1]
    nodes, operands, vals = f.nodes, f.operands, f.vals
    while f.i < len(nodes):
      u = nodes[f.i]
      xs = [vals[s._id] for s in operands[f.i]]
      if u.op is Ops.FUNCTION:
        stack.append(_Frame([u.src[0]], _Ctx(f.ctx.inputs, tuple(xs))))
        break
      try: f.put(f.fns[f.i](u, xs, f.ctx))
      except (MemoryError, ValueError) as e: _too_big(u, e)
    else:
      stack.pop()
      out = [vals[r._id] for r in f.roots]
      if not stack: return out
      stack[-1].put(out[0])


def _too_big(u: UOp, e: Exception):
  """Re-raise numpy's failure to allocate node u's value (MemoryError, or ValueError past the address space) naming
  the node and its size; any other error as it was."""
  if u.dtype is dtypes.void: raise e  # a CALL's kernel's own error
  n = math.prod(u.shape)
  nbytes = n * u.dtype.itemsize
  what = f"numpy engine: {u.op.name} {u.dtype.name}{list(u.shape)} needs {nbytes:,} bytes ({n:,} elements)"
  if isinstance(e, MemoryError): raise MemoryError(f"{what}, which cannot be allocated: {e}") from e
  if nbytes > sys.maxsize: raise ValueError(f"{what}, more than an array can hold: {e}") from e
  raise e


def _own(v, seen: set):
  """v as an array the caller owns (a copy unless it is a fresh, writable array not returned yet)."""
  if not isinstance(v, np.ndarray): return v
  if not (v.flags.owndata and v.flags.writeable) or id(v) in seen: v = np.array(v, copy=True)
  seen.add(id(v))
  return v


def evaluate(outputs: list[UOp], inputs: dict | None = None) -> list:
  """The values of `outputs` (numpy arrays; tuples for TUPLE/SINK/FUNCTION) given `inputs`, a dict from BUFFER and
  DEFINE_VAR nodes to array-likes/scalars (validated by values.bindings, as the C engine does)."""
  outs = list(outputs)
  for o in outs:
    if type(o) is not UOp: raise TypeError(f"evaluate: outputs must be UOps, got {type(o).__name__}")
  binds = bindings(inputs)
  with np.errstate(all="ignore"):
    vals = _run(outs, _Ctx(binds, None))
  seen: set = set()
  return [map_nested(v, lambda x: _own(x, seen)) for v in vals]


__all__ = ["evaluate", "round_bfloat16", "cast_value", "bitcast_value"]
