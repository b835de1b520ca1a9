"""The IR: hash-consing, the operator table's shape rules and errors, constructors, walks, substitution, lifetime
(deep chains, leaks, threads). Runs on whichever core the process loaded."""
import gc, math, os, random, threading
import numpy as np
import pytest
import pygrad
from pygrad import UOp, Ops, GroupOp, dtypes, CallInfo
from pygrad.dtype import VALUE_DTYPES
from pygrad.gradient import compute_gradient
from concurrency import run_on_threads

F32, I32, BOOL = dtypes.float32, dtypes.int32, dtypes.bool


def ev(out, inputs=None): return pygrad.evaluate(out, inputs or {}, engine="numpy")


def ph(*shape, dtype=F32, **kw): return UOp.placeholder(shape, dtype, **kw)


def live_after_gc() -> int:
  gc.collect()
  return pygrad.live_nodes()


# ---- hash-consing ----
def test_hash_consing_identity():
  assert UOp(Ops.CONST, F32, (), 1.0) is UOp(Ops.CONST, F32, (), 1.0)
  assert UOp.const(2.5) is UOp.const(2.5)
  x = ph(3)
  assert (x + 1.0) is (x + 1.0)
  assert UOp(Ops.ADD, None, (x, x)) is UOp(Ops.ADD, None, [x, x])
  assert UOp(Ops.ADD, None, (x, UOp.const(1.0))) is not UOp(Ops.ADD, None, (UOp.const(1.0), x))
  assert UOp(Ops.CONST, F32, (), 1.0) is not UOp(Ops.CONST, dtypes.float64, (), 1.0)
  d = {x: 1, x + 1.0: 2}
  assert d[x + 1.0] == 2 and x == x and x != (x + 1.0)


def test_args_are_type_strict():
  i, f, b = (UOp(Ops.SINK, None, (), v) for v in (1, 1.0, True))
  assert len({id(i), id(f), id(b)}) == 3
  assert type(i.arg) is int and type(f.arg) is float and type(b.arg) is bool
  # a CONST's arg is a value of its dtype's kind, in range: anything else would be a silently wrong node
  for bad in (1.0, True):
    with pytest.raises(TypeError, match="CONST"): UOp(Ops.CONST, I32, (), bad)
  with pytest.raises(ValueError, match="out of range"): UOp(Ops.CONST, dtypes.int8, (), 300)
  assert UOp(Ops.CONST, I32, (), 1) is UOp.const(1)
  pz, nz = UOp.const(0.0), UOp.const(-0.0)
  assert pz is not nz and math.copysign(1, pz.arg) == 1 and math.copysign(1, nz.arg) == -1
  assert UOp.const(float("nan")) is UOp.const(float("nan"))
  assert UOp.const(math.inf) is not UOp.const(-math.inf)


def test_nested_tuple_args_and_tags():
  def mk(arg): return UOp(Ops.SINK, None, (), arg)
  base = mk((1, (2.0, ("a", None))))
  assert mk((1, (2.0, ("a", None)))) is base
  for other in ((1, (2, ("a", None))), (True, (2.0, ("a", None))), (1, (-0.0 + 2.0, ("b", None))),
                (1, ((2.0,), ("a", None))),
                (1, (2.0, ("a", 0))), (1.0, (2.0, ("a", None)))):
    assert mk(other) is not base, other
  assert mk((0.0,)) is not mk((-0.0,))
  assert mk((float("nan"), 1)) is mk((float("nan"), 1))
  assert UOp.const(1.0).arg == 1.0
  t1, t2, t3 = (UOp(Ops.CONST, F32, (), 1.0, tag=t) for t in (1, 1.0, (1,)))
  assert len({id(t1), id(t2), id(t3)}) == 3 and UOp(Ops.CONST, F32, (), 1.0, tag=1) is t1


# ---- the operator table: shapes, dtypes, devices ----
def _shape_cases():
  x, y, s = ph(2, 3), ph(2, 3), ph()
  i, u, c = ph(2, 3, dtype=I32), ph(2, 3, dtype=dtypes.uint8), ph(2, 3, dtype=BOOL)
  p = x.param_like(0)
  fn = UOp.maketuple(p * 2.0, p.sum()).call(x)
  kern = UOp.custom_kernel(x, i, fxn=lambda a, b: None)
  a0, a1 = ph(2, 3, device="CPU"), ph(1, 3, device="CPU:1")
  return [
    (UOp.const(1.5), (), F32), (UOp.const(3, dtypes.int8), (), dtypes.int8),
    (UOp.variable("n", 0, 9, I32), (), I32), (ph(4, 0, 2), (4, 0, 2), F32), (p, (2, 3), F32),
    *[(UOp(o, None, (x,)), (2, 3), F32) for o in GroupOp.Unary],
    (UOp(Ops.TRUNC, None, (i,)), (2, 3), I32),
    (x.cast(dtypes.float16), (2, 3), dtypes.float16), (x.bitcast(I32), (2, 3), I32),
    (c.bitcast(dtypes.uint8), (2, 3), dtypes.uint8),
    *[(UOp(o, None, (i, i)), (2, 3), BOOL if o in GroupOp.Comparison else I32) for o in GroupOp.Binary],
    (UOp(Ops.ADD, None, (x, s)), (2, 3), F32), (UOp(Ops.MUL, None, (s, y)), (2, 3), F32),
    (UOp(Ops.CMPLT, None, (s, s)), (), BOOL), (UOp(Ops.AND, None, (c, c)), (2, 3), BOOL),
    (UOp(Ops.SHL, None, (u, UOp.const(1, dtypes.uint8))), (2, 3), dtypes.uint8),
    (UOp(Ops.WHERE, None, (c, x, y)), (2, 3), F32), (UOp(Ops.WHERE, None, (UOp.const(True), s, x)), (2, 3), F32),
    (UOp(Ops.WHERE, None, (c, s, s)), (2, 3), F32),
    (UOp(Ops.REDUCE_AXIS, None, (x,), (Ops.ADD, (1,))), (2, 1), F32),
    (UOp(Ops.REDUCE_AXIS, None, (i,), (Ops.MAX, (0, 1))), (1, 1), I32),
    (UOp(Ops.REDUCE_AXIS, None, (x,), (Ops.MUL, ())), (2, 3), F32),
    (UOp(Ops.RESHAPE, None, (x,), (3, 1, 2)), (3, 1, 2), F32), (UOp(Ops.RESHAPE, None, (s,), (1, 1)), (1, 1), F32),
    (UOp(Ops.EXPAND, None, (x.reshape(2, 1, 3),), (2, 4, 3)), (2, 4, 3), F32),
    (UOp(Ops.PAD, None, (x,), ((1, 0), (2, 3))), (3, 8), F32),
    (UOp(Ops.SHRINK, None, (x,), ((1, 2), (0, 0))), (1, 0), F32),
    (UOp(Ops.PERMUTE, None, (x,), (1, 0)), (3, 2), F32), (UOp(Ops.FLIP, None, (x,), (True, False)), (2, 3), F32),
    *[(UOp(o, None, (i,)), (2, 3), I32) for o in GroupOp.Identity],
    (UOp(Ops.COPY, None, (x,), "CPU:1"), (2, 3), F32),
    (UOp(Ops.MULTI, None, (a0, a1), 0), (3, 3), F32), (UOp(Ops.MULTI, None, (a0, a0.copy_to_device("CPU:1")), None),
                                                       (2, 3), F32),
    (UOp.maketuple(x, i), (), dtypes.void), (UOp.maketuple(x, i).gettuple(1), (2, 3), I32),
    (fn, (), dtypes.void), (fn.gettuple(1), (), F32), (fn.gettuple(0), (2, 3), F32),
    (kern[0].src[1], (), dtypes.void), (kern[1], (2, 3), I32),
    (UOp(Ops.NOOP), (), dtypes.void), (UOp.sink(x, i), (), dtypes.void),
  ]


def test_shape_rules():
  for u, shape, dtype in _shape_cases():
    assert u.shape == shape and u.dtype is dtype, (u.op, u.shape, shape, u.dtype, dtype)
    assert u.ndim == len(shape) and u.numel == math.prod(shape)


def test_devices():
  x = ph(2, 3)
  assert x.device == "CPU" and (x + 1.0).device == "CPU" and UOp.const(1.0).device is None
  assert x.copy_to_device("CPU:1").device == "CPU:1"
  m = x.shard(("CPU", "CPU:1"), 0)
  assert m.device == ("CPU", "CPU:1") and m.shape == (2, 3) and m.op is Ops.MULTI and m.axis == 0
  assert (m * 2.0).device == ("CPU", "CPU:1")
  with pytest.raises(ValueError, match="ADD"):
    x + x.copy_to_device("CPU:1")


def _error_cases():
  x, y, s = ph(2, 3), ph(3, 2), ph()
  i, c = ph(2, 3, dtype=I32), ph(2, 3, dtype=BOOL)
  t = UOp.maketuple(x)
  p = ph(2, 2).param_like(0)
  call = UOp.custom_kernel(x, fxn=lambda a: None)[0].src[1]
  return [
    ("CONST", TypeError, lambda: UOp(Ops.CONST, F32, (), "one")),
    ("CONST", TypeError, lambda: UOp(Ops.CONST, None, (), 1.0)),
    ("CONST", ValueError, lambda: UOp.const(300, dtypes.int8)),
    ("CONST", TypeError, lambda: UOp.const("a")),
    ("CONST", ValueError, lambda: UOp(Ops.CONST, F32, (x,), 1.0)),
    ("DEFINE_VAR", TypeError, lambda: UOp(Ops.DEFINE_VAR, I32, (), ("n", 0))),
    ("BUFFER", ValueError, lambda: ph(2, -1)),
    ("BUFFER", TypeError, lambda: ph(2.0, 3)),
    ("SQRT", TypeError, lambda: i.sqrt()),
    ("LOG2", TypeError, lambda: c.log2()),
    ("RECIPROCAL", ValueError, lambda: UOp(Ops.RECIPROCAL, None, (x, x))),
    ("CAST", TypeError, lambda: UOp(Ops.CAST, None, (x,))),
    ("BITCAST", TypeError, lambda: x.bitcast(dtypes.int8)),
    ("ADD", ValueError, lambda: UOp(Ops.ADD, None, (x, y))),
    ("ADD", TypeError, lambda: UOp(Ops.ADD, None, (x, i))),
    ("ADD", TypeError, lambda: UOp(Ops.ADD, I32, (x, x))),
    ("ADD", ValueError, lambda: UOp(Ops.ADD, None, (x,))),
    ("MUL", TypeError, lambda: UOp(Ops.MUL, None, (t, t))),
    ("IDIV", TypeError, lambda: UOp(Ops.IDIV, None, (x, x))),
    ("MOD", TypeError, lambda: UOp(Ops.MOD, None, (c, c))),
    ("SHL", TypeError, lambda: UOp(Ops.SHL, None, (x, x))),
    ("AND", TypeError, lambda: UOp(Ops.AND, None, (x, x))),
    ("CMPLT", ValueError, lambda: UOp(Ops.CMPLT, None, (x, y))),
    ("CMPEQ", TypeError, lambda: UOp(Ops.CMPEQ, None, (x, i))),
    ("WHERE", TypeError, lambda: UOp(Ops.WHERE, None, (x, x, x))),
    ("WHERE", TypeError, lambda: UOp(Ops.WHERE, None, (c, x, i))),
    ("WHERE", ValueError, lambda: UOp(Ops.WHERE, None, (c, y, y))),
    ("REDUCE_AXIS", TypeError, lambda: UOp(Ops.REDUCE_AXIS, None, (x,), (Ops.POW, (0,)))),
    ("REDUCE_AXIS", ValueError, lambda: UOp(Ops.REDUCE_AXIS, None, (x,), (Ops.ADD, (2,)))),
    ("REDUCE_AXIS", ValueError, lambda: UOp(Ops.REDUCE_AXIS, None, (x,), (Ops.ADD, (0, 0)))),
    ("REDUCE_AXIS", TypeError, lambda: UOp(Ops.REDUCE_AXIS, None, (x,), (Ops.ADD, 0))),
    ("RESHAPE", ValueError, lambda: UOp(Ops.RESHAPE, None, (x,), (5,))),
    ("RESHAPE", TypeError, lambda: UOp(Ops.RESHAPE, None, (x,), (6.0,))),
    ("RESHAPE", TypeError, lambda: UOp(Ops.RESHAPE, None, (x,), [6])),
    ("EXPAND", ValueError, lambda: UOp(Ops.EXPAND, None, (x,), (4, 3))),
    ("EXPAND", ValueError, lambda: UOp(Ops.EXPAND, None, (x,), (1, 2, 3))),
    ("PERMUTE", ValueError, lambda: UOp(Ops.PERMUTE, None, (x,), (0, 0))),
    ("PERMUTE", ValueError, lambda: UOp(Ops.PERMUTE, None, (x,), (0,))),
    ("FLIP", TypeError, lambda: UOp(Ops.FLIP, None, (x,), (1, 0))),
    ("FLIP", TypeError, lambda: UOp(Ops.FLIP, None, (x,), (True,))),
    ("PAD", ValueError, lambda: UOp(Ops.PAD, None, (x,), ((0, -1), (0, 0)))),
    ("PAD", TypeError, lambda: UOp(Ops.PAD, None, (x,), ((0, 1),))),
    ("SHRINK", ValueError, lambda: UOp(Ops.SHRINK, None, (x,), ((0, 3), (0, 3)))),
    ("SHRINK", ValueError, lambda: UOp(Ops.SHRINK, None, (x,), ((2, 1), (0, 3)))),
    ("CONTIGUOUS", TypeError, lambda: UOp(Ops.CONTIGUOUS, None, (t,))),
    ("DETACH", ValueError, lambda: UOp(Ops.DETACH, None, (x, x))),
    ("COPY", TypeError, lambda: UOp(Ops.COPY, None, (x,), 1)),
    ("MULTI", ValueError, lambda: UOp(Ops.MULTI, None, (), 0)),
    ("MULTI", TypeError, lambda: UOp(Ops.MULTI, None, (x, i), 0)),
    ("MULTI", ValueError, lambda: UOp(Ops.MULTI, None, (x, y), 0)),
    ("MULTI", ValueError, lambda: UOp(Ops.MULTI, None, (x, ph(2, 4)), None)),
    ("GETTUPLE", TypeError, lambda: x.gettuple(0)),
    ("GETTUPLE", ValueError, lambda: t.gettuple(1)),
    ("GETTUPLE", TypeError, lambda: UOp(Ops.GETTUPLE, None, (t,), "0")),
    ("FUNCTION", ValueError, lambda: UOp(Ops.FUNCTION, None, (x, x), CallInfo())),
    ("FUNCTION", ValueError, lambda: UOp.maketuple(p).call()),
    ("FUNCTION", ValueError, lambda: UOp.maketuple(p).call(x)),
    ("FUNCTION", TypeError, lambda: UOp(Ops.FUNCTION, None, (UOp.maketuple(p), ph(2, 2)), None)),
    ("FUNCTION", ValueError, lambda: UOp(Ops.FUNCTION, None, (), CallInfo())),
    ("AFTER", TypeError, lambda: UOp(Ops.AFTER, None, (x, x))),
    ("AFTER", ValueError, lambda: UOp(Ops.AFTER, None, (x,))),
    ("custom_kernel", TypeError, lambda: UOp.custom_kernel(x, fxn=None)),
    ("matmul", ValueError, lambda: x @ x),
    ("UOp", TypeError, lambda: UOp("ADD", None, (x, x))),
    ("ADD", TypeError, lambda: UOp(Ops.ADD, None, (x, 1.0))),
    ("CALL", TypeError, lambda: UOp(Ops.CALL, None, (call.src[0], x), "kernel")),
  ]


@pytest.mark.parametrize("case", range(len(_error_cases())))
def test_construction_errors(case):
  name, exc, fn = _error_cases()[case]
  with pytest.raises(exc) as e:
    fn()
  assert name in str(e.value), str(e.value)


def test_alu_ops_take_no_arg():
  """SPEC section 2: the ALU ops, CAST and BITCAST take no arg; one given was silently kept on the node (a distinct
  node computing the same value). Both cores, by UOp(...) and by pygrad.build's table."""
  x, c = ph(2, 3), ph(2, 3, dtype=BOOL)
  for op, src, dt, arg in ((Ops.SIN, (x,), None, 0), (Ops.CAST, (x,), I32, "i"), (Ops.BITCAST, (x,), I32, 1.0),
                           (Ops.ADD, (x, x), None, 5), (Ops.CMPLT, (x, x), None, (1,)), (Ops.WHERE, (c, x, x), None, 0),
                           (Ops.MUL, (x, x), None, False)):
    with pytest.raises(ValueError, match=f"{op.name}: takes no arg"):
      UOp(op, dt, src, arg)
    assert UOp(op, dt, src).arg is None
  with pytest.raises(ValueError, match="ADD: takes no arg"):
    pygrad.build(np.array([int(Ops.BUFFER), int(Ops.ADD)]), np.array([F32.id] * 2), np.array([[-1, -1], [0, 0]]),
                 [x.arg, 7])


def test_errors_name_the_operands():
  x, y = ph(2, 3), ph(3, 2, dtype=I32)
  with pytest.raises((ValueError, TypeError)) as e:
    UOp(Ops.ADD, None, (x, y))
  msg = str(e.value)
  assert "ADD" in msg and "(2, 3)" in msg and "(3, 2)" in msg and "float32" in msg and "int32" in msg


# ---- constructors ----
def test_const():
  assert UOp.const(1.0).dtype is F32 and UOp.const(1).dtype is I32 and UOp.const(True).dtype is BOOL
  for dt in VALUE_DTYPES:
    c = UOp.const(1, dt)
    assert c.op is Ops.CONST and c.dtype is dt and c.shape == () and c.src == ()
    assert type(c.arg) is (float if dtypes.is_float(dt) else bool if dt is BOOL else int)
  assert UOp.const(np.float32(1.5)).arg == 1.5 and UOp.const(np.int64(3)).dtype is I32
  assert UOp.const(2**64 - 1, dtypes.uint64).arg == 2**64 - 1


def test_placeholder_and_variable():
  a, b = ph(2, 3, name="w"), ph(2, 3, name="w")
  assert a is not b and a.op is Ops.BUFFER and a.shape == (2, 3) and a.dtype is F32 and a.device == "CPU"
  assert "w" in a.arg and UOp.placeholder(5).shape == (5,)
  c = UOp.placeholder((4,), dtypes.int8, device="CPU:1")
  assert c.device == "CPU:1" and c.dtype is dtypes.int8
  v = UOp.variable("n", 1, 10, I32)
  assert v.op is Ops.DEFINE_VAR and v.arg == ("n", 1, 10) and v.shape == () and v.dtype is I32
  assert UOp.variable("n", 1, 10, I32) is v and UOp.variable("f", 0.0, 1.0).dtype is F32


def test_const_like_and_param_like():
  x = ph(2, 3, dtype=dtypes.int8)
  k = x.const_like(4)
  assert k.shape == (2, 3) and k.dtype is dtypes.int8
  assert {n.op for n in k.toposort()} <= {Ops.CONST, Ops.RESHAPE, Ops.EXPAND}
  assert [n for n in k.toposort() if n.op is Ops.CONST][0].shape == ()
  assert ev(k).tolist() == [[4] * 3] * 2
  s = ph(dtype=BOOL)
  assert s.const_like(True) is UOp.const(True)
  p = x.param_like(2)
  assert p.op is Ops.PARAM and p.arg[0] == 2 and p.shape == (2, 3) and p.dtype is dtypes.int8
  assert x.param_like(2) is p and x.param_like(1) is not p


def test_tuple_function_call_sink():
  x, y = ph(3), ph(3)
  t = UOp.maketuple(x, y)
  assert t.op is Ops.TUPLE and t.src == (x, y) and t.gettuple(1) is UOp(Ops.GETTUPLE, None, (t,), 1)
  p = x.param_like(0)
  f = (p * 2.0).call(x, name="double", precompile=True)
  assert f.op is Ops.FUNCTION and f.src[0].op is Ops.TUPLE and f.src[1] is x
  assert isinstance(f.arg, CallInfo) and f.arg.name == "double" and f.arg.precompile and not f.arg.precompile_backward
  g = UOp.maketuple(p, p + 1.0).call(y)
  assert g.src[0] is UOp.maketuple(p, p + 1.0) and g.gettuple(1).shape == (3,)
  assert (p * 2.0).call(x, name="double", precompile=True) is f
  sk = UOp.sink(x, f.gettuple(0))
  assert sk.op is Ops.SINK and sk.dtype is dtypes.void and sk.src == (x, f.gettuple(0))


def test_custom_kernel_nodes():
  a, b = ph(2), ph(3, dtype=I32)
  def fxn(x, y): pass
  afters = UOp.custom_kernel(a, b, fxn=fxn)
  assert [u.op for u in afters] == [Ops.AFTER, Ops.AFTER]
  k = afters[0].src[1]
  assert afters[1].src[1] is k and k.op is Ops.CALL and k.src[1:] == (a, b)
  assert afters[0].src[0] is a and afters[1].src[0] is b and afters[1].shape == (3,) and afters[1].dtype is I32
  assert k.arg.fxn is fxn and k.src[0].op is Ops.SINK
  assert [s.op for s in k.src[0].src] == [Ops.PARAM, Ops.PARAM]


# ---- derived methods decompose into primitives ----
def _derived():
  rng = np.random.default_rng(0)
  av = rng.uniform(0.5, 2.0, (3, 4)).astype(np.float32)
  bv = rng.uniform(-2.0, 2.0, (3, 4)).astype(np.float32)
  wv = rng.standard_normal((4, 5)).astype(np.float32)
  e = lambda v: np.exp(v)  # noqa: E731
  return av, bv, wv, [
    ("add", lambda a, b, w: a + b, lambda a, b, w: a + b), ("sub", lambda a, b, w: a - b, lambda a, b, w: a - b),
    ("rsub", lambda a, b, w: 1.0 - b, lambda a, b, w: 1 - b), ("mul", lambda a, b, w: a * b, lambda a, b, w: a * b),
    ("div", lambda a, b, w: b / a, lambda a, b, w: b / a), ("rdiv", lambda a, b, w: 2.0 / a, lambda a, b, w: 2 / a),
    ("floordiv", lambda a, b, w: b // a, lambda a, b, w: b // a), ("mod", lambda a, b, w: b % a, lambda a, b, w: b % a),
    ("pow", lambda a, b, w: a ** b, lambda a, b, w: a ** b), ("neg", lambda a, b, w: -b, lambda a, b, w: -b),
    ("lt", lambda a, b, w: a < b, lambda a, b, w: a < b), ("gt", lambda a, b, w: a > b, lambda a, b, w: a > b),
    ("le", lambda a, b, w: a <= b, lambda a, b, w: a <= b), ("ge", lambda a, b, w: a >= b, lambda a, b, w: a >= b),
    ("eq", lambda a, b, w: a.eq(b), lambda a, b, w: a == b), ("ne", lambda a, b, w: a.ne(b), lambda a, b, w: a != b),
    ("and", lambda a, b, w: (a < b) & (b > 0), lambda a, b, w: (a < b) & (b > 0)),
    ("or", lambda a, b, w: (a < b) | (b > 0), lambda a, b, w: (a < b) | (b > 0)),
    ("xor", lambda a, b, w: (a < b) ^ (b > 0), lambda a, b, w: (a < b) ^ (b > 0)),
    ("maximum", lambda a, b, w: a.maximum(b), lambda a, b, w: np.maximum(a, b)),
    ("minimum", lambda a, b, w: a.minimum(b), lambda a, b, w: np.minimum(a, b)),
    ("where", lambda a, b, w: (a < b).where(a, b), lambda a, b, w: np.where(a < b, a, b)),
    ("cast", lambda a, b, w: b.cast(I32), lambda a, b, w: b.astype(np.int32)),
    ("bitcast", lambda a, b, w: b.bitcast(I32), lambda a, b, w: b.view(np.int32)),
    ("reciprocal", lambda a, b, w: a.reciprocal(), lambda a, b, w: 1 / a),
    ("sqrt", lambda a, b, w: a.sqrt(), lambda a, b, w: np.sqrt(a)),
    ("sin", lambda a, b, w: b.sin(), lambda a, b, w: np.sin(b)),
    ("cos", lambda a, b, w: b.cos(), lambda a, b, w: np.cos(b)), ("exp", lambda a, b, w: b.exp(), lambda a, b, w: e(b)),
    ("exp2", lambda a, b, w: b.exp2(), lambda a, b, w: np.exp2(b)),
    ("log", lambda a, b, w: a.log(), lambda a, b, w: np.log(a)),
    ("log2", lambda a, b, w: a.log2(), lambda a, b, w: np.log2(a)),
    ("trunc", lambda a, b, w: b.trunc(), lambda a, b, w: np.trunc(b)),
    ("abs", lambda a, b, w: b.abs(), lambda a, b, w: np.abs(b)),
    ("relu", lambda a, b, w: b.relu(), lambda a, b, w: np.maximum(b, 0)),
    ("sigmoid", lambda a, b, w: b.sigmoid(), lambda a, b, w: 1 / (1 + e(-b))),
    ("tanh", lambda a, b, w: b.tanh(), lambda a, b, w: np.tanh(b)),
    ("reshape", lambda a, b, w: b.reshape(2, 6), lambda a, b, w: b.reshape(2, 6)),
    ("expand", lambda a, b, w: b.reshape(3, 1, 4).expand(3, 2, 4),
     lambda a, b, w: np.broadcast_to(b.reshape(3, 1, 4), (3, 2, 4))),
    ("pad", lambda a, b, w: b.pad(((1, 0), (0, 2))), lambda a, b, w: np.pad(b, ((1, 0), (0, 2)))),
    ("shrink", lambda a, b, w: b.shrink(((1, 3), None)), lambda a, b, w: b[1:3]),
    ("permute", lambda a, b, w: b.permute(1, 0), lambda a, b, w: b.T),
    ("flip", lambda a, b, w: b.flip(1), lambda a, b, w: b[:, ::-1]),
    ("transpose", lambda a, b, w: b.transpose(), lambda a, b, w: b.T),
    ("sum", lambda a, b, w: b.sum(), lambda a, b, w: b.sum()),
    ("sum1", lambda a, b, w: b.sum(1, keepdim=True), lambda a, b, w: b.sum(1, keepdims=True)),
    ("max", lambda a, b, w: b.max(0), lambda a, b, w: b.max(0)),
    ("min", lambda a, b, w: b.min((0, 1)), lambda a, b, w: b.min()),
    ("prod", lambda a, b, w: a.prod(1), lambda a, b, w: a.prod(1)),
    ("mean", lambda a, b, w: b.mean(-1), lambda a, b, w: b.mean(-1)),
    ("matmul", lambda a, b, w: b @ w, lambda a, b, w: b @ w),
    ("matvec", lambda a, b, w: b @ w.shrink((None, (0, 1))).reshape(4), lambda a, b, w: b @ w[:, 0]),
    ("softmax", lambda a, b, w: b.softmax(), lambda a, b, w: e(b) / e(b).sum(-1, keepdims=True)),
    ("log_softmax", lambda a, b, w: b.log_softmax(0), lambda a, b, w: b - np.log(e(b).sum(0, keepdims=True))),
    ("contiguous", lambda a, b, w: b.contiguous().contiguous_backward().detach(), lambda a, b, w: b),
    ("copy", lambda a, b, w: b.copy_to_device("CPU:1"), lambda a, b, w: b),
    ("shard", lambda a, b, w: b.shard(("CPU", "CPU:1"), 1), lambda a, b, w: b),
  ]


def test_derived_methods_use_only_primitives():
  av, bv, wv, cases = _derived()
  a, b, w = ph(3, 4, name="a"), ph(3, 4, name="b"), ph(4, 5, name="w")
  primitives = set(Ops)
  for name, fn, ref in cases:
    out = fn(a, b, w)
    ops = [n.op for n in out.toposort()]
    assert all(type(o) is Ops and o in primitives for o in ops), name
    assert not {Ops.FUNCTION, Ops.CALL, Ops.PARAM} & set(ops), name
    got = ev(out, {a: av, b: bv, w: wv})
    want = ref(av, bv, wv)
    assert got.shape == np.shape(want), (name, got.shape)
    np.testing.assert_allclose(got.astype(np.float64), np.asarray(want, np.float64), rtol=2e-5, atol=2e-6, err_msg=name)
  assert {n.op for n in (b @ w).toposort()} <= {Ops.BUFFER, Ops.RESHAPE, Ops.EXPAND, Ops.PERMUTE, Ops.MUL,
                                                Ops.REDUCE_AXIS}
  assert Ops.EXP2 in {n.op for n in b.exp().toposort()} and Ops.LOG2 in {n.op for n in a.log().toposort()}


# ---- walks ----
def rec_toposort(root, gate=None, enter_calls=True):
  """The seeds' order, written recursively (small graphs only): sources left to right, post-order."""
  out: dict = {}
  def visit(n):
    if n in out or (gate is not None and not gate(n)): return
    srcs = n.src if enter_calls or n.op not in (Ops.FUNCTION, Ops.CALL) else n.src[1:]
    for s in srcs: visit(s)
    out[n] = None
  visit(root)
  return list(out)


def random_dag(rng: random.Random, n: int) -> UOp:
  leaves = [ph(2) for _ in range(3)] + [UOp.const(1.5), UOp.const(-2.0)]
  nodes = list(leaves)
  for _ in range(n):
    k = rng.random()
    a, b, c = (rng.choice(nodes[-8:] if rng.random() < 0.6 else nodes) for _ in range(3))
    if k < 0.35: nodes.append(a + b)
    elif k < 0.6: nodes.append(a * b)
    elif k < 0.75: nodes.append((a < b).where(c, a))
    elif k < 0.85: nodes.append(a.sin())
    elif k < 0.95: nodes.append(a.maximum(b).reciprocal())
    else: nodes.append(UOp.maketuple(a, b).gettuple(rng.randrange(2)))
  return UOp.sink(*rng.sample(nodes, 4), nodes[-1])


def test_toposort_order_matches_recursive_reference():
  rng = random.Random(1234)
  for trial in range(40):
    root = random_dag(rng, rng.randrange(5, 120))
    walk = root.toposort()
    assert list(walk) == rec_toposort(root)
    pos = {u: i for i, u in enumerate(walk)}
    assert all(pos[s] < pos[u] for u in walk for s in u.src) and walk[-1] is root
    gate = lambda u: u.op is not Ops.MUL  # noqa: E731
    assert list(root.toposort(gate)) == rec_toposort(root, gate)


def test_gate_stops_below():
  x, y = ph(2), ph(2)
  inner = x * y
  root = (inner + x).sin()
  w = root.toposort(gate=lambda u: u is not inner)
  assert inner not in w and y not in w and x in w and root in w
  assert len(root.toposort(gate=lambda u: False)) == 0
  assert list(root.toposort(gate=lambda u: True)) == list(root.toposort())


def test_enter_calls():
  x, y = ph(3), ph(3)
  p = x.param_like(0)
  f = (p.sin() * 2.0).call(x)
  out = UOp.sink(f.gettuple(0), UOp.custom_kernel(y, fxn=lambda a: None)[0])
  full, outer = out.toposort(), out.toposort(enter_calls=False)
  assert p in full and f.src[0] in full
  assert p not in outer and f.src[0] not in outer and x in outer and f in outer and y in outer
  call = out.src[1].src[1]
  assert call.src[0] in full and call.src[0] not in outer and call in outer
  assert list(outer) == rec_toposort(out, enter_calls=False)
  assert list(full) == rec_toposort(out)


def test_walk_api():
  x = ph(2)
  y = (x + 1.0) * x
  w = y.toposort()
  nodes = rec_toposort(y)
  assert len(w) == len(nodes) == 4 and w[0] is x and w[-1] is y and w[1] is nodes[1]
  assert list(reversed(w)) == nodes[::-1] and w[1:3] == nodes[1:3]
  assert x in w and y in w and ph(2) not in w and "x" not in w and 3 not in w
  assert [u for u in w] == nodes
  with pytest.raises(IndexError):
    w[10]
  assert isinstance(w, pygrad.Walk) and "4" in repr(w)


def test_iterating_a_temporary_walk():
  # the iterator alone must keep the walk's nodes alive: nothing else references this root
  x = ph(3)
  assert [u.op for u in (x * 3.0).sin().toposort()] == [Ops.BUFFER, Ops.CONST, Ops.MUL, Ops.SIN]
  assert [u.op for u in reversed((x * 5.0).exp2().toposort())] == [Ops.EXP2, Ops.MUL, Ops.CONST, Ops.BUFFER]
  it = iter((x + 7.0).toposort())
  gc.collect()
  assert [u.op for u in it] == [Ops.BUFFER, Ops.CONST, Ops.ADD]


def test_walk_keeps_nodes_alive():
  base = live_after_gc()
  w = (ph(3).sin() + 2.0).toposort()
  assert live_after_gc() > base
  assert [u.op for u in w] == [Ops.BUFFER, Ops.SIN, Ops.CONST, Ops.ADD]
  del w
  assert live_after_gc() == base


def test_substitute():
  x, y, z = ph(3), ph(3), ph(3)
  f = ((x + 1.0) * x).sin()
  assert f.substitute({x: y}) is ((y + 1.0) * y).sin()
  assert f.substitute({}) is f and f.substitute({z: y}) is f
  inner = x + 1.0
  assert f.substitute({inner: z}) is (z * x).sin()
  assert f.substitute({x: y, inner: z}) is (z * y).sin()
  g = UOp.sink(f, x)
  assert g.substitute({x: y}).src == (((y + 1.0) * y).sin(), y)
  b = ph(3, dtype=I32)
  assert (x.cast(I32) + b).substitute({b: b * 2}) is x.cast(I32) + b * 2



def test_substitute_enter_calls():
  # a body's PARAMs are its own scope's: with enter_calls False only the calling graph's nodes are replaced
  x = ph(3)
  p0, p1 = x.param_like(0), x.param_like(1)
  call = (p0 * 2.0).call(x, x)
  g = UOp.sink(call.gettuple(0) + p0)
  assert g.substitute({p0: p1}).src[0] is (p1 * 2.0).call(x, x).gettuple(0) + p1  # (the default enters bodies)
  assert g.substitute({p0: p1}, enter_calls=False).src[0] is call.gettuple(0) + p1
  assert call.substitute({call.src[0]: (p0 * 3.0)}, enter_calls=False) is call  # the body itself is kept too


# ---- lifetime ----
def test_live_nodes_back_to_baseline():
  base = live_after_gc()
  x = ph(4, 4)
  y = (x @ x).softmax().sum() + x.mean()
  f = (x.param_like(0) * 2.0).call(x)
  k = UOp.custom_kernel(x, fxn=lambda a: None)
  n = len(UOp.sink(y, f.gettuple(0), *k).toposort())
  assert live_after_gc() >= base + n - 5
  del x, y, f, k
  assert live_after_gc() == base


def test_million_node_chain():
  n = 1_000_000 if pygrad.core_name() == "c" else 200_000
  base = live_after_gc()
  c = UOp.const(1.0)
  x = ph(1)
  y = x
  for _ in range(n): y = UOp(Ops.ADD, None, (y, c))
  assert live_after_gc() >= base + n
  assert len(y.toposort()) == n + 2
  assert len(y.toposort(enter_calls=False)) == n + 2
  del y, x, c
  assert live_after_gc() == base


def _round(size: int) -> int:
  x = ph(8)
  y = x
  for i in range(size): y = (y * 1.0001 + float(i % 7)).maximum(x) if i % 3 else y.sin()
  return len(y.toposort())


def test_memory_flat_over_rounds():
  psutil = pytest.importorskip("psutil")
  proc = psutil.Process()
  size = 4000 if pygrad.core_name() == "c" else 1500
  base = live_after_gc()
  lens, rss = [], []
  for r in range(20):
    lens.append(_round(size))
    assert live_after_gc() == base, r
    rss.append(proc.memory_info().rss)
  assert len(set(lens)) == 1
  # under AddressSanitizer (.ci/run sets PYGRAD_SANITIZED) freed memory sits in ASan's quarantine instead of being
  # reused, so RSS grows whatever pygrad does; the live-node checks above still hold there, RSS is checked elsewhere
  if os.environ.get("PYGRAD_SANITIZED") != "1":
    assert rss[-1] - rss[4] < 8 * 2**20, [m // 2**20 for m in rss]


def test_threads_build_and_drop():
  base = live_after_gc()
  shared = ph(4, name="shared")

  def work(tid: int):
    rng = np.random.default_rng(tid)
    for it in range(15):
      x = ph(4, name=f"t{tid}")
      y = x
      for i in range(60): y = (y + shared) * 0.5 if i % 2 else (y - float(tid)).maximum(shared)
      xv, sv = rng.standard_normal(4).astype(np.float32), rng.standard_normal(4).astype(np.float32)
      want = xv
      for i in range(60): want = (want + sv) * np.float32(0.5) if i % 2 else np.maximum(want - np.float32(tid), sv)
      got = ev(y, {x: xv, shared: sv})
      np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
      walk = y.toposort()
      assert walk[-1] is y and walk[0] is x and shared in walk
      assert (x + shared) is (x + shared)
      del x, y, walk

  run_on_threads(work, 4)
  del shared
  assert live_after_gc() == base


def test_handle_identity_under_racing_threads():
  """Many threads making and dropping handles of the same few nodes: one handle per live node at every moment, and
  every node freed at the end (the registry's lock-free claim and its slow path under races)."""
  base = live_after_gc()
  x = ph(3, name="racing")

  def work(_):
    for i in range(3000):
      a, b = x + 1.0, x + 1.0
      assert a is b and a.src[0] is x
      if i % 7 == 0: gc.collect(0)
      del a, b
      c = (x * 2.0).sin()
      assert c is (x * 2.0).sin()
      d, e = (x + x).exp2(), x.reshape((1, 3))
      assert d is (x + x).exp2() and e is x.reshape((1, 3)) and d.src[0].src == (x, x) and e.src[0] is x
      del c, d, e

  run_on_threads(work, 4)
  del x
  assert live_after_gc() == base


def test_fast_calls_refuse_what_is_no_handle():
  """The methods' one-call makes (csrc/pymake.c on the C core) and the handle constructor raise TypeError for
  operands that are not complete handles, and leave the node count as it was."""
  from pygrad import uop as U
  x = ph(3)
  base = live_after_gc()
  empty = object.__new__(UOp)  # a handle without fields
  for bad in (1, None, "x", empty):
    with pytest.raises((TypeError, AttributeError)): U._mk_unary(Ops.SIN, F32, F32.id, bad)
    with pytest.raises((TypeError, AttributeError)): U._mk_binary(Ops.ADD, F32, F32.id, x, bad)
    with pytest.raises((TypeError, AttributeError)): U._mk_binary(Ops.ADD, F32, F32.id, bad, x)
    with pytest.raises((TypeError, AttributeError)): U._mk_binaryk(Ops.MUL, F32, F32.id, bad, F32.id, 0, 0, 0)
    with pytest.raises((TypeError, AttributeError)): U._mk_moved(Ops.RESHAPE, F32, F32.id, bad, (3,), 0, (3,), 0)
  with pytest.raises(TypeError): U._mk_binary(Ops.ADD, F32, F32.id, x)
  if pygrad.core_name() == "c":  # (the pure core keeps whatever ints it is given)
    with pytest.raises(OverflowError): U._mk_unary(Ops.SIN, F32, 2**40, x)
  with pytest.raises(AttributeError): empty.sin()
  del empty
  assert live_after_gc() == base and x.sin().src[0] is x


# ---- handles are read-only ----
def test_fields_are_read_only():
  x = ph(2, 3)
  for field, value in (("shape", (3, 2)), ("dtype", I32), ("op", Ops.CONST), ("arg", None), ("tag", 1),
                       ("device", "CPU:1"), ("src", ())):
    with pytest.raises(AttributeError): setattr(x, field, value)
    with pytest.raises(AttributeError): delattr(x, field)
  with pytest.raises(AttributeError): x.anything = 1
  assert x.shape == (2, 3) and x.dtype is F32 and x.op is Ops.BUFFER and x.device == "CPU"
  xv = np.arange(6, dtype=np.float32).reshape(2, 3)
  np.testing.assert_allclose(ev(x.sum(axis=1), {x: xv}), xv.sum(1))


# ---- misuse is a clear error ----
def test_misuse_raises_naming_what_was_wrong():
  x, i = ph(2, 3), ph(3, dtype=I32)
  with pytest.raises(TypeError, match="matmul: expected a UOp, got int 5"): x @ 5
  with pytest.raises(TypeError, match="matmul: expected a UOp, got ndarray"): x @ np.ones((3, 2), np.float32)
  with pytest.raises(TypeError, match="matmul: expected a UOp, got ndarray"): np.ones((3, 2), np.float32) @ x
  with pytest.raises(TypeError, match="matmul: expected a UOp, got int"): 5 @ x
  with pytest.raises(TypeError, match="buffer 1 must be a UOp, got int"): UOp.custom_kernel(x, 5, fxn=lambda a, b: None)
  y = x.sin()
  with pytest.raises(TypeError, match="UOp -> UOp, got int -> UOp"): y.substitute({5: x})
  with pytest.raises(TypeError, match="dict of UOp -> UOp, got list"): y.substitute([x])
  with pytest.raises(TypeError, match="UOp -> UOp, got UOp -> float"): y.substitute({x: 1.0})


def test_misuse_is_not_silently_coerced():
  x, i = ph(2, 3), ph(3, dtype=I32)
  with pytest.raises(TypeError, match="pad: expected an int, got float 1.5"): x.pad(((1.5, 1), (0, 0)))
  with pytest.raises(ValueError, match="pad: 1 .* pairs given for 2 dims"): x.pad(((1, 1),))
  with pytest.raises(ValueError, match="shrink: 3 .* bounds given for 2 dims"): x.shrink(((0, 1), (0, 2), (0, 1)))
  with pytest.raises(TypeError, match="shrink: expected an int"): x.shrink(((0, 1.0), None))
  with pytest.raises(ValueError, match="shard: axis 5 out of range for 2 dims"): x.shard(("CPU:0", "CPU:1"), axis=5)
  with pytest.raises(ValueError, match="PERMUTE"): x.permute((0, 5))
  with pytest.raises(ValueError, match="1.5 has no int32 value"): i.const_like(1.5)
  with pytest.raises(ValueError, match="has no int32 value"): UOp.const(2.5, I32)
  assert i.const_like(2.0).src[0].src[0].arg == 2 and type(UOp.const(3.0, I32).arg) is int
  assert x.pad(((1, 1), None)).shape == (4, 3) and x.pad([(np.int64(1), 0), (0, 0)]).shape == (3, 3)
  assert x.shard(("CPU:0", "CPU:1"), axis=-2).shape == (2, 3)



def test_wrong_arguments_name_what_was_wrong():
  # found by probing the public API with wrong types: each was an AttributeError/IndexError from inside pygrad, or
  # (a repeated axis) silently reduced once where numpy and torch refuse
  x = ph(3, 4)
  with pytest.raises(TypeError, match=r"CONST: the arguments are \(value, dtype\)"): UOp.const(F32, 3.0)
  with pytest.raises(TypeError, match="CONST: dtype must be a DType"): UOp.const(3.0, "float32")
  with pytest.raises(TypeError, match="CONST: dtype must be a DType"): UOp.const(3.0, float)
  with pytest.raises(TypeError, match="axis must be an int or a tuple of ints, got str"): x.sum("a")
  with pytest.raises(TypeError, match="axis must be an int"): x.max((0, None))
  with pytest.raises(ValueError, match="names an axis twice"): x.mean(axis=(0, 0))
  with pytest.raises(ValueError, match="names an axis twice"): x.sum(axis=(1, -1))
  with pytest.raises(ValueError, match="axis 5 out of range for 2 dims"): x.transpose(0, 5)
  with pytest.raises(TypeError, match="ndarray of shape \\(3, 4\\) as a UOp operand"): x + np.ones((3, 4), np.float32)
  with pytest.raises(TypeError, match="root_grad must be a UOp, got float"): compute_gradient(x.sum(), 1.0, [x])
  with pytest.raises(TypeError, match="targets must be an iterable of UOps, got UOp"):
    compute_gradient(x.sum(), x.sum().const_like(1.0), x)
  # what stays accepted: numpy ints as axes, negative transposes, a one-element array operand, any iterable of targets
  with pytest.raises(TypeError, match=r"RESHAPE: arg must be a tuple of ints \(new shape\), got \(3.0, 4\)"):
    x.reshape((3.0, 4))
  with pytest.raises(TypeError, match=r"EXPAND: arg must be a tuple of ints \(new shape\), got \(3.0, 4\)"):
    x.expand((3.0, 4))
  with pytest.raises(TypeError, match="RESHAPE: arg must be a tuple of ints"): x.reshape((True, 12))
  assert x.reshape((np.int64(12),)).shape == (12,) and x.expand(np.int64(3), 4) is x
  assert x.sum(np.int64(1)).shape == (3,) and x.transpose(-1, -2).shape == (4, 3)
  assert (x + np.float32(2.0)).shape == (3, 4) and (x + np.ones((1,), np.float32)).shape == (3, 4)
  with pytest.raises(TypeError, match="pygrad.dumps: roots must be a UOp or a sequence of UOps, got int"):
    pygrad.dumps(3)
  with pytest.raises(TypeError, match="pygrad.loads: expected bytes .*, got str"): pygrad.loads("abc")
  with pytest.raises(TypeError, match="listing: roots must be a UOp or a sequence of UOps, got int"): pygrad.listing(3)
  loss = x.sum()
  assert set(compute_gradient(loss, loss.const_like(1.0), iter([x]))) >= {x}

def test_reflected_integer_operators():
  i = ph(3, dtype=I32)
  iv = np.array([1, 2, 5], np.int32)
  for got, want in ((3 % i, 3 % iv), (1 << i, 1 << iv), (64 >> i, 64 >> iv), (7 // i, 7 // iv)):
    np.testing.assert_array_equal(ev(got, {i: iv}), want)
  assert any(n.op is Ops.MOD and n.src[0] is UOp.const(3) and n.src[1] is i for n in (3 % i).toposort())
  np.testing.assert_array_equal(ev(-7 // i, {i: iv}), -7 // iv)  # floor, as numpy's: -4, not C's -3
  np.testing.assert_array_equal(ev(-7 % i, {i: iv}), -7 % iv)


@pytest.mark.parametrize("make", [
  lambda: ph(2 ** 62, 4),
  lambda: ph(2 ** 64),
  lambda: ph(1, 3).expand((2 ** 62, 3)),
  lambda: ph(3).pad(((0, 2 ** 63),)),
  lambda: ph(3).reshape((1, 3)).expand((2 ** 63, 3)),
  lambda: UOp(Ops.EXPAND, None, (ph(1, 1),), (2 ** 40, 2 ** 40)),
  lambda: UOp(Ops.PARAM, F32, (), (0, (2 ** 70,), "CPU")),
], ids=["buffer elements", "buffer size", "expand", "pad", "expand after reshape", "generic expand", "param"])
def test_sizes_beyond_int64_rejected_at_construction(make):
  with pytest.raises(ValueError, match=r"(BUFFER|EXPAND|PAD|PARAM): .*size \d+ .*does not fit in int64"): make()


def test_shape_errors_do_not_depend_on_the_path():
  """The math methods' fast paths and the generic constructor share one validity function per op: same
  exception type and message."""
  x, v = ph(2, 3), UOp.sink()
  cases = [(Ops.RESHAPE, x, (4, 2), lambda: x.reshape(4, 2)), (Ops.EXPAND, x, (2, 3, 1), lambda: x.expand(2, 3, 1)),
           (Ops.EXPAND, x, (4, 3), lambda: x.expand(4, 3)), (Ops.PERMUTE, x, (1, 1), lambda: x.permute(1, 1)),
           (Ops.PAD, x, ((0, -1), (0, 0)), lambda: x.pad(((0, -1), (0, 0)))),
           (Ops.SHRINK, x, ((0, 3), (0, 3)), lambda: x.shrink(((0, 3), (0, 3)))),
           (Ops.REDUCE_AXIS, x, (Ops.ADD, (2,)), lambda: x.r(Ops.ADD, (2,))),
           (Ops.RESHAPE, x, (6.0,), lambda: x.reshape((6.0,))), (Ops.RESHAPE, v, (1,), lambda: v.reshape(1))]
  for op, src, arg, method in cases:
    with pytest.raises((TypeError, ValueError)) as generic: UOp(op, None, (src,), arg)
    with pytest.raises((TypeError, ValueError)) as fast: method()
    assert type(fast.value) is type(generic.value) and str(fast.value) == str(generic.value), (op, arg)


# ---- metadata: per thread and per async context ----
def _names(u): return [m.name for m in u.metadata]


def test_metadata_blocks_are_per_thread():
  x = ph(4)
  inside, outside = threading.Event(), threading.Event()
  made: dict = {}

  def a():
    with pygrad.metadata("A"):
      made["a1"] = x.sin()
      inside.set()
      outside.wait(10)
      made["a2"] = x.exp2()

  def b():
    inside.wait(10)
    made["b"] = x.log2()  # while A's block is open in the other thread
    with pygrad.metadata("B"):
      made["b2"] = x.sqrt()
    outside.set()

  ts = [threading.Thread(target=a), threading.Thread(target=b)]
  for t in ts: t.start()
  for t in ts: t.join()
  assert _names(made["a1"]) == ["A"] and _names(made["a2"]) == ["A"]
  assert _names(made["b"]) == [] and _names(made["b2"]) == ["B"]
  assert pygrad.uop.current_metadata() is None and pygrad.uop._md_open == 0
  assert _names(x.reciprocal()) == []


def test_overlapping_blocks_in_two_threads_leave_nothing_behind():
  x = ph(4)
  a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()

  def a():
    with pygrad.metadata("A"):
      a_in.set()
      b_in.wait(10)
    a_out.set()

  def b():
    a_in.wait(10)
    with pygrad.metadata("B"):
      b_in.set()
      a_out.wait(10)  # A's block ends while B's is open: B's stays B's
      assert _names(x.trunc()) == ["B"]

  ts = [threading.Thread(target=a), threading.Thread(target=b)]
  for t in ts: t.start()
  for t in ts: t.join()
  y = (x * 3.0).sin()
  assert _names(y) == [] and pygrad.uop.current_metadata() is None


def test_metadata_per_asyncio_task():
  import asyncio
  x = ph(5)

  async def task(name, gate, other):
    with pygrad.metadata(name):
      gate.set()
      await other.wait()  # the other task opens its block meanwhile
      return (x * float(len(name))).sin()

  async def main():
    g1, g2 = asyncio.Event(), asyncio.Event()
    return await asyncio.gather(task("one", g1, g2), task("three", g2, g1))

  one, three = asyncio.run(main())
  assert _names(one) == ["one"] and _names(three) == ["three"]
  assert _names(one.src[0]) == ["one"]
  assert pygrad.uop.current_metadata() is None


def test_dead_handles_are_released_batched_and_unregistered():
  """A dead handle's reference is dropped in a batch (pygrad/core/release.py) and its registry entry removed without
  a lock; live_nodes() still sees every dropped handle, whether fewer or more than one batch is pending."""
  from pygrad.core.release import BATCH
  base = live_after_gc()
  for n in (3, BATCH - 1, BATCH, 3 * BATCH + 7):
    ps = [ph(3) for _ in range(n)]  # distinct inputs: every sin below is a new node only its handle holds
    ys = [p.sin() for p in ps]
    ids = [y._id for y in ys]
    assert pygrad.live_nodes() == base + 2 * n
    del ys
    assert pygrad.live_nodes() == base + n
    assert not any(pygrad.uop._registered(i) for i in ids)
    del ps
    assert pygrad.live_nodes() == base


def test_a_dying_handle_is_never_found_again():
  """A weak reference callback of a dying handle runs when nothing can reach it: looking its node up from there
  makes a new handle (never the dying one back), and every node is freed once that one goes too."""
  import weakref
  from pygrad.uop import handle
  base = live_after_gc()
  x = ph(5)
  y = x.sin()
  nid, seen = y._id, []

  def cb(_):
    h = handle(nid)  # the node is alive (the dying handle's reference is not dropped yet): a fresh handle
    seen.append((h._id, h.op, h.src[0] is x))

  w = weakref.ref(y, cb)
  del y
  assert seen == [(nid, Ops.SIN, True)] and w() is None
  assert x.sin()._id == nid or not pygrad.uop._registered(nid)
  del x
  assert live_after_gc() == base


def test_handles_of_every_path_are_one_registry():
  """Methods, handle(), a loaded graph's roots, the bulk builder's roots and a gradient's results give the one
  handle of each node: `is` across paths, and live_nodes() back to the baseline once they all go."""
  import pickle
  from pygrad.uop import handle
  base = live_after_gc()
  x = ph(2, 3, name="paths")
  y = (x * 2.0).sin() + x
  assert handle(y._id) is y and handle(y.src[0]._id) is y.src[0]
  z = pickle.loads(pickle.dumps(y))
  assert z is y
  g = y.sum().gradient(x)[0]
  assert handle(g._id) is g and g is y.sum().gradient(x)[0]
  from pygrad import builder, serialize
  assert serialize.loads(serialize.dumps(y)) is y
  n = 3  # the bulk builder: placeholder-free rows, so the table's nodes are the method-made ones
  c = UOp.const(1.5)
  built = builder.build([int(Ops.CONST), int(Ops.SIN), int(Ops.EXP2)][:n], [F32.id] * n,
                          np.array([[-1], [0], [1]]), [1.5, None, None])
  assert built[0] is c.sin().exp2() and built[0].src[0].src[0] is c
  del y, z, g, c, built
  del x
  assert live_after_gc() == base


def test_cycles_through_a_handle_are_collected():
  """A handle reachable from its own arg (a custom gradient closing over the node) is freed by the cyclic
  collector, and its node with it; a lookup meanwhile finds no half-cleared handle."""
  base = live_after_gc()
  for _ in range(50):
    x = ph(3)
    box: list = []
    f = UOp(Ops.SINK, None, (x.sin(),)).call(x, grad_fxn=lambda *a: box)
    box.append(f)
    del x, f, box
  assert live_after_gc() == base


def test_deep_chains_of_cached_sources_are_freed():
  """Dropping the last handle of a long chain whose handles cache their sources (a chain of handle deaths the
  interpreter defers in its trashcan) frees every node, with lookups of the chain's nodes in between."""
  from pygrad.uop import handle
  base = live_after_gc()
  x = ph(4)
  y, ids = x, []
  for _ in range(20000):
    y = y.sin()
    _ = y.src  # the handle now holds its source's handle
    ids.append(y._id)
  assert handle(ids[100]) is handle(ids[100])
  del y, _
  assert live_after_gc() == base + 1
  del x
  assert live_after_gc() == base


def test_repeated_movements_take_the_one_call_path_with_every_guarantee():
  """A repeated reshape/expand/permute is one call (uop._cached: csrc/pymake.c on the C core) giving the same node
  as the general path, whatever form the arg takes; anything it does not cover is None (the general path then
  answers or raises); a hit inside a metadata block gets the block's metadata; a void node never hits."""
  from pygrad import uop as U
  x, e = ph(4, 3), ph(1, 3)
  r, p, x2 = x.reshape((3, 4)), x.permute((1, 0)), e.expand((4, 3))
  assert U._cached(Ops.RESHAPE, x, (3, 4)) is r and U._cached(Ops.PERMUTE, x, (1, 0)) is p
  assert x.reshape(3, 4) is r and x.reshape([3, 4]) is r and x.reshape((np.int64(3), 4)) is r and x.reshape(-1, 4) is r
  assert x.permute(1, 0) is p and x.permute((-1, 0)) is p and e.expand(4, 3) is x2 and e.expand((4, -1)) is x2
  for arg in ((3, -4), (3, 4.0), [3, 4], (4, 3), (2, 6), 5):
    assert U._cached(Ops.RESHAPE, x, arg) is None
  assert U._cached(Ops.RESHAPE, ph(4, 3, dtype=I32), (3, 4)) is None  # another dtype: its own entry
  with pygrad.metadata("moved"):
    assert x.reshape((3, 4)) is r and [m.name for m in r.metadata] == ["moved"]
  s = UOp.sink(x)
  with pytest.raises((TypeError, ValueError)): s.reshape((1,))
  with pytest.raises(ValueError): x.reshape((5, 4))
  with pytest.raises(ValueError): x.permute((0, 0))


def test_cached_movement_survives_its_arg_id_being_drained():
  """movement() caches the interned arg id with the validity result; once the last node naming that arg is freed
  and the interner drains the id, the next identical reshape/permute interns the arg again (both cores)."""
  from pygrad.intern import ARGS
  x = ph(2, 3, 4241)
  for _ in range(3):
    y, z = x.reshape((1, 4241, 6, 1)), x.permute((2, 0, 1))
    assert y.shape == (1, 4241, 6, 1) and y.arg == (1, 4241, 6, 1) and z.shape == (4241, 2, 3)
    aid = pygrad.uop._core_info(y._id)[3]
    del y, z
    gc.collect()
    pygrad.live_nodes()
    ARGS.drain()
    assert aid not in ARGS.objs  # drained (no other graph names this shape): the cached id is gone


def test_placeholder_fast_path_is_the_generic_node():
  """placeholder builds its BUFFER without generic inference and with its arg's interning key made directly: the
  key is argkey's (so a loaded or rebuilt BUFFER with that arg is the same node), and every bad input still gets
  the generic path's error."""
  from pygrad.intern import ARGS, argkey
  for kw in ({}, {"name": "w"}, {"device": "CPU:1", "dtype": dtypes.int8}, {"name": "e"}):
    a = UOp.placeholder((2, 0, 3) if kw.get("name") == "e" else (2, 3), **kw)
    aid = pygrad.uop._core_info(a._id)[3]
    assert ARGS.ids[argkey(a.arg)] == aid and ARGS.objs[aid] is a.arg
    assert UOp(Ops.BUFFER, a.dtype, (), a.arg) is a
  for shape, kw, err in [((2, -1), {}, ValueError), ((2, 2 ** 63), {}, ValueError), ((0, 2 ** 64), {}, ValueError),
                         ((2,), {"device": 3}, TypeError),
                         ((2,), {"dtype": dtypes.void}, TypeError), ((2,), {"dtype": "float32"}, TypeError),
                         ((2.0,), {}, TypeError), ((True,), {}, TypeError)]:
    with pytest.raises(err):
      UOp.placeholder(shape, **kw)


def test_placeholder_in_one_call_is_the_python_placeholder():
  """On the C core UOp.placeholder's common case is one C call (csrc/pyleaf.c) that does what the Python placeholder
  does: the same uid numbering (one per call, on either path, so both cores name placeholders alike), arg, interning
  (keyed, plain when named), node and handle; metadata inside a block; anything else the Python path's errors."""
  from pygrad.intern import ARGS, argkey
  if pygrad.core_name() == "c": assert type(UOp.placeholder).__name__ == "builtin_function_or_method"
  calls = [((2, 3), {}), ([2, 3], {}), (7, {}), ((), {}), ((5, 0), {"name": "z"}), ((2, 3), {"dtype": dtypes.int8}),
           ((4,), {"device": "CPU:1"}), ((2, 3), {"name": "w", "dtype": F32, "device": "CPU"})]
  for shape, kw in calls + calls:  # the second round: every (shape, device) known, so the C call does it all
    first = UOp.placeholder((1,))
    a = UOp.placeholder(shape, **kw)
    want = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
    assert a.arg == (first.arg[0] + 1, want, kw.get("device", "CPU"), kw.get("name"))
    assert (a.op, a.shape, a.dtype, a.device) == (Ops.BUFFER, want, kw.get("dtype", F32), kw.get("device", "CPU"))
    aid = pygrad.uop._core_info(a._id)[3]
    assert ARGS.ids[argkey(a.arg)] == aid and ARGS.objs[aid] is a.arg and ARGS.keys[aid] == argkey(a.arg)
    assert (a.arg in ARGS.plain) == ("name" in kw) and UOp(Ops.BUFFER, a.dtype, (), a.arg) is a
  x = UOp.placeholder((2, 3), F32, "n", "CPU")  # all four positionally
  assert x.arg[1:] == ((2, 3), "CPU", "n")
  with pygrad.metadata("inputs"):
    m = UOp.placeholder((2, 3))
  assert [md.name for md in m.metadata] == ["inputs"] and not UOp.placeholder((2, 3)).metadata
  for args, kw, err in [(((2,), F32, None, "CPU", 1), {}, TypeError), (((2,),), {"shape": (3,)}, TypeError),
                        (((2,),), {"size": 3}, TypeError),
                        (((2, 3),), {"device": b"CPU"}, TypeError), (((2, 3.0),), {}, TypeError),
                        (((2, 3),), {"dtype": None}, TypeError), ((), {}, TypeError), (("23",), {}, TypeError)]:
    with pytest.raises(err):
      UOp.placeholder(*args, **kw)


def test_placeholders_made_on_threads_are_distinct():
  """Threads making and dropping placeholders at once (the interner's lock, its drains and reused slots taken from
  C and from Python) get distinct nodes with consistent interning."""
  from pygrad.intern import ARGS, argkey
  kept: list = [[] for _ in range(4)]

  def body(i: int) -> None:
    for r in range(1500):
      p = UOp.placeholder((3,), name=None if r % 3 else f"t{i}") if i % 2 else UOp.placeholder([3, 1])
      if r % 5 == 0: kept[i].append(p)
  run_on_threads(body, 4)
  ps = [p for k in kept for p in k]
  assert len({p.arg[0] for p in ps}) == len(ps) == 4 * 300 and len({id(p) for p in ps}) == len(ps)
  for p in ps:
    aid = pygrad.uop._core_info(p._id)[3]
    assert ARGS.ids[argkey(p.arg)] == aid and ARGS.objs[aid] is p.arg


def test_single_node_methods_are_the_generic_nodes():
  """The single-node methods' fast paths (uop.unary_method / binary_method: the core call and the handle's
  publication inline) give the node, and the one handle, that the generic constructor gives: fresh and existing
  nodes, every value dtype an op takes, node and float operands, shapes equal or ()."""
  from pygrad.uop import _UNARY_OK, _BINARY_OUT
  for op, name in ((Ops.SIN, "sin"), (Ops.EXP2, "exp2"), (Ops.SQRT, "sqrt"), (Ops.RECIPROCAL, "reciprocal"),
                   (Ops.TRUNC, "trunc"), (Ops.LOG2, "log2")):
    for d in _UNARY_OK[op]:
      x = ph(2, 3, dtype=d)
      y = getattr(x, name)()  # fresh
      assert y is UOp(op, None, (x,)) and y is getattr(x, name)() and (y.op, y.dtype, y.shape) == (op, d, (2, 3))
  for op, method in ((Ops.ADD, "__add__"), (Ops.MUL, "__mul__"), (Ops.MAX, "maximum"), (Ops.CMPLT, "__lt__"),
                     (Ops.CMPNE, "ne"), (Ops.XOR, "__xor__"), (Ops.POW, "__pow__")):
    for d, out in _BINARY_OUT[op].items():
      a, b, s = ph(2, 3, dtype=d), ph(2, 3, dtype=d), ph(dtype=d)
      for u, v in ((a, b), (a, s), (s, a), (a, a)):
        y = getattr(u, method)(v)
        assert y is UOp(op, None, (u, v)) and y is getattr(u, method)(v)
        assert (y.dtype, y.shape, y.device, y.src) == (out, (2, 3), "CPU", (u, v))
      if d.kind == "f":
        for k in (2.5, -0.0, 0.0, math.nan, math.inf, 1e300):
          y = getattr(a, method)(k)
          c = y.src[1]
          assert c.op is Ops.CONST and c.dtype is d and type(c.arg) is float and y is getattr(a, method)(k)
          assert c is UOp.const(k, d) and y is UOp(op, None, (a, c))
        assert a.__mul__(0.0) is not a.__mul__(-0.0)


def test_single_node_methods_keep_the_generic_errors():
  """Off the fast paths (dtype, device, shape, operand type) the methods raise what they raised before."""
  a, i = ph(2, 3), ph(2, 3, dtype=I32)
  with pytest.raises(ValueError, match="broadcast"): a + ph(3, 2)
  with pytest.raises(TypeError, match="SIN"): UOp.sink().sin()
  with pytest.raises(TypeError, match="SIN"): ph(2, dtype=BOOL).sin()
  with pytest.raises(ValueError, match="different devices"): a + ph(2, 3, device="CPU:1")
  with pytest.raises(TypeError, match="operand"): a * "2"
  with pytest.raises(TypeError, match="XOR"): a ^ a
  assert (a + i).dtype is F32 and (i * 2.5).dtype is F32 and (i * 2).dtype is I32


def test_single_node_methods_called_every_way():
  """The methods give the same node called on the class, reflected or in place, and refuse what is no operand (on
  the C core they are C functions: the handle type's number slots and method descriptors on UOp)."""
  a, b, p, q = ph(2, 3), ph(2, 3), ph(4, dtype=BOOL), ph(4, dtype=BOOL)
  assert UOp.__add__(a, b) is a + b and UOp.__radd__(a, b) is b + a and UOp.sin(a) is a.sin()
  assert UOp.maximum(a, b) is a.maximum(b) and UOp.__mul__(a, 2.0) is a * 2.0 and UOp.__rmul__(a, 2.0) is 2.0 * a
  assert (p & q) is UOp(Ops.AND, None, (p, q)) and (p | q).op is Ops.OR and (True ^ p).src[1] is p
  c = a
  c += b
  assert c is a + b
  c *= b
  assert c is (a + b) * b and sum([a, b]) is (0.0 + a) + b
  with pytest.raises(TypeError): a + object()
  with pytest.raises(TypeError): object() * a
  with pytest.raises(TypeError, match="operand"): a.maximum("x")


def test_metadata_reaches_the_single_node_methods():
  """Nodes made by `+`, `*`, `&` and the named methods inside a metadata block carry its metadata, and only there."""
  a, b, p = ph(7), ph(7), ph(7, dtype=BOOL)
  with pygrad.metadata("blk"):
    made = [a + b, a * b, a.sin(), a.maximum(b), p & p, a * 3.0, a.reshape((7, 1))]
  assert all(y.metadata and y.metadata[0].name == "blk" for y in made)
  assert not (a + a).metadata and not a.exp2().metadata


def test_float_constant_ids_survive_being_drained():
  """The binary methods remember a float constant's interned arg id without holding it: once every node naming the
  constant is freed and the interner drains (and reuses) the id, `x * k` interns k again (both cores)."""
  from pygrad.intern import ARGS
  k = 4241.25
  for _ in range(3):
    x = ph(5)
    y = x * k
    aid = pygrad.uop._core_info(y.src[1]._id)[3]
    del x, y
    gc.collect()
    pygrad.live_nodes()
    ARGS.drain()
    assert aid not in ARGS.objs  # drained: the remembered id is gone
    keep = [UOp.const(k + 1 + j) for j in range(4)]  # new constants take the freed slots, a later generation
    y = ph(5) * k
    assert y.src[1].arg == k and y.src[1] is UOp.const(k) and ARGS.objs[pygrad.uop._core_info(y.src[1]._id)[3]] == k
    del keep, y


def test_single_node_methods_free_what_they_make():
  """Nodes made by the fast paths are freed with their last handle: live_nodes() returns to its baseline."""
  base = live_after_gc()
  x = ph(64)
  y = x
  for j in range(2000): y = (y * 1.5 + x).sin() if j % 2 else (y.exp2() * x).maximum(x)
  del x, y
  assert live_after_gc() == base
