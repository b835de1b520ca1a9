"""The C interpreter against the numpy reference evaluator: every VM opcode on every dtype it takes, at sizes 0, 1,
1023, 1024 and 1025, on contiguous and non-contiguous inputs and views; the defined integer/cast edge cases exactly;
transcendentals within a few float32 ulp; reductions; errors naming the input."""
from __future__ import annotations
import itertools
import math
import numpy as np
import pytest
import pygrad
from pygrad import UOp, Ops, dtypes
from pygrad.dtype import VALUE_DTYPES

program = pytest.importorskip("pygrad.engine.program", reason="the compiled interpreter is not built",
                              exc_type=ImportError)
from pygrad.engine import numpy_eval  # noqa: E402
from pygrad.engine.numpy_eval import round_bfloat16  # noqa: E402

SIZES = (0, 1, 1023, 1024, 1025)
FLOATS = (dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64)
INTS = tuple(d for d in VALUE_DTYPES if dtypes.is_int(d))
APPROX = {Ops.SIN, Ops.EXP2, Ops.LOG2, Ops.POW}


def values(dt, n: int, rng, kind: str = "any") -> np.ndarray:
  """n values of dt with the edge cases mixed in (NaN, inf, -0, denormals, int min/max, shift counts...)."""
  if dtypes.is_bool(dt): return rng.integers(0, 2, n).astype(bool)
  if dtypes.is_int(dt):
    info = np.iinfo(dt.numpy)
    if kind == "shift": v = rng.integers(-2, 8 * dt.itemsize + 3, n)
    elif kind == "small": v = rng.integers(max(info.min, -9), min(info.max, 9) + 1, n)
    else: v = rng.integers(info.min, info.max, n, endpoint=True, dtype=dt.numpy)
    v = np.asarray(v).astype(dt.numpy)
    edge = np.array([info.min, info.max, 0, 1, info.max - 1] + ([-1, info.min + 1] if info.min < 0 else []),
                    dtype=dt.numpy)
    if kind == "any" and n: v[:min(n, len(edge))] = edge[:min(n, len(edge))]
    return v
  v = rng.standard_normal(n) * (3 if kind == "small" else 40)
  if kind == "any" and n:
    edge = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-41, -1e-41, 65504.0, 1e5, -3.5, 2.5, 0.5])
    v[:min(n, len(edge))] = edge[:min(n, len(edge))]
  if kind == "pos": v = np.abs(v) + 1e-3
  v = v.astype(np.float32 if dt is not dtypes.float64 else np.float64)
  if dt is dtypes.float16:
    with np.errstate(over="ignore"): return v.astype(np.float16)
  if dt is dtypes.bfloat16: return round_bfloat16(v)
  return v


def check(out, inputs: dict, approx: bool = False, rtol: float | None = None):
  """The VM's value of out equals numpy_eval's (exactly, or within a float tolerance when approx)."""
  want = numpy_eval.evaluate([out], inputs)[0]
  got = program.evaluate_c([out], inputs)[0]
  assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, want.dtype, got.shape, want.shape)
  if approx:
    tol = rtol if rtol is not None else {np.dtype(np.float16): 2e-3, np.dtype(np.float64): 1e-12}.get(want.dtype, 3e-6)
    if out.dtype is dtypes.bfloat16: tol = max(tol, 1.6e-2)
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * 1e-3, equal_nan=True)
  else:
    np.testing.assert_array_equal(got, want)


def _bufs(dt, n, k, rng, kinds=("any",) * 3, strided=False):
  bs, vals = [], []
  for i in range(k):
    b = UOp.placeholder((n,), dt, f"x{i}")
    v = values(dt, 2 * n if strided else n, rng, kinds[i])
    bs.append(b)
    vals.append(v[::2] if strided else v)
  return bs, vals


UNARY = [Ops.RECIPROCAL, Ops.SQRT, Ops.SIN, Ops.LOG2, Ops.EXP2, Ops.TRUNC]


def _unary_ok(op, dt) -> bool:
  return dtypes.is_float(dt) or (op is Ops.TRUNC and dtypes.is_int(dt))


def _cases(ops, ok, sizes):
  """(op, dtype, n) for every op and dtype the op takes: the combinations it refuses are tested as errors."""
  return [pytest.param(op, dt, n, id=f"{op.name}-{dt.name}-{n}")
          for op in ops for dt in VALUE_DTYPES if ok(op, dt) for n in sizes]


@pytest.mark.parametrize("op,dt,n", _cases(UNARY, _unary_ok, SIZES))
def test_unary(op, dt, n):
  rng = np.random.default_rng(n)
  (x,), (v,) = _bufs(dt, n, 1, rng)
  check(UOp(op, None, (x,)), {x: v}, approx=op in APPROX)
  (x2,), (v2,) = _bufs(dt, n, 1, rng, strided=True)
  check(UOp(op, None, (x2.flip(0),)), {x2: v2}, approx=op in APPROX)


BINARY = [Ops.ADD, Ops.MUL, Ops.MAX, Ops.POW, Ops.IDIV, Ops.MOD, Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR,
          Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ]


def _binary_ok(op, dt) -> bool:
  if op in (Ops.IDIV, Ops.MOD, Ops.SHL, Ops.SHR): return dtypes.is_int(dt)
  if op in (Ops.AND, Ops.OR, Ops.XOR): return not dtypes.is_float(dt)
  return True


@pytest.mark.parametrize("op,dt,n", _cases(BINARY, _binary_ok, SIZES))
def test_binary(op, dt, n):
  rng = np.random.default_rng(n + 7)
  kinds = ("any", "shift") if op in (Ops.SHL, Ops.SHR) else ("any", "small") if op is Ops.POW else ("any", "any")
  (x, y), (a, b) = _bufs(dt, n, 2, rng, kinds)
  if op in (Ops.IDIV, Ops.MOD) and n: b[::3] = 0
  if op in (Ops.IDIV, Ops.MOD) and n and dtypes.is_int(dt) and not dtypes.is_unsigned(dt): b[1::5] = -1
  check(UOp(op, None, (x, y)), {x: a, y: b}, approx=op in APPROX and dtypes.is_float(dt))
  if n:  # the same on strided inputs and through flipped / shrunk views
    (x2, y2), (a2, b2) = _bufs(dt, n, 2, rng, kinds, strided=True)
    check(UOp(op, None, (x2.flip(0), y2)), {x2: a2, y2: b2}, approx=op in APPROX and dtypes.is_float(dt))


REFUSED = [(op, dt) for op in UNARY for dt in VALUE_DTYPES if not _unary_ok(op, dt)] + \
          [(op, dt) for op in BINARY for dt in VALUE_DTYPES if not _binary_ok(op, dt)]


@pytest.mark.parametrize("op,dt", REFUSED, ids=[f"{o.name}-{d.name}" for o, d in REFUSED])
def test_refused_dtypes_are_clear_errors(op, dt):
  """The op/dtype pairs the matrices above leave out are refused when the node is made, naming op and dtype."""
  x = UOp.placeholder((3,), dt, "x")
  with pytest.raises(TypeError, match=rf"^{op.name}: .*:{dt.name}"):
    UOp(op, None, (x,) if op in UNARY else (x, x))


@pytest.mark.parametrize("op,dt,n", _cases(BINARY, _binary_ok, (1, 1025)))
def test_binary_scalar_operand(op, dt, n):
  """A ()-shaped operand (a constant or a DEFINE_VAR) broadcast on either side: the VM's scalar registers."""
  rng = np.random.default_rng(3)
  (x,), (a,) = _bufs(dt, n, 1, rng)
  c = values(dt, 8, rng, "shift" if op in (Ops.SHL, Ops.SHR) else "small")[5].item()
  k = UOp.const(c, dt)
  check(UOp(op, None, (x, k)), {x: a}, approx=op in APPROX and dtypes.is_float(dt))
  check(UOp(op, None, (k, x)), {x: a}, approx=op in APPROX and dtypes.is_float(dt))


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dt", VALUE_DTYPES, ids=lambda d: d.name)
def test_where(dt, n):
  rng = np.random.default_rng(11)
  c = UOp.placeholder((n,), dtypes.bool, "c")
  (x, y), (a, b) = _bufs(dt, n, 2, rng)
  cv = values(dtypes.bool, n, rng)
  check(c.where(x, y), {c: cv, x: a, y: b})
  check(UOp(Ops.WHERE, None, (c, x, UOp.const(values(dt, 1, rng, "small")[0].item(), dt))), {c: cv, x: a})


@pytest.mark.parametrize("n", (0, 1, 1025))
@pytest.mark.parametrize("src,dst", list(itertools.product(VALUE_DTYPES, VALUE_DTYPES)),
                         ids=lambda d: d.name)
def test_cast(src, dst, n):
  rng = np.random.default_rng(5)
  (x,), (v,) = _bufs(src, n, 1, rng)
  check(x.cast(dst), {x: v})


_BITCASTS = [(a, b) for a, b in itertools.product(VALUE_DTYPES, VALUE_DTYPES) if a.itemsize == b.itemsize]


@pytest.mark.parametrize("src,dst", _BITCASTS, ids=lambda d: d.name)
def test_bitcast(src, dst):
  rng = np.random.default_rng(6)
  (x,), (v,) = _bufs(src, 1025, 1, rng)
  if dst is dtypes.bfloat16 or dst is dtypes.float16 or src in (dtypes.bfloat16, dtypes.float16):
    v = v if dtypes.is_float(src) else v
  want = numpy_eval.evaluate([x.bitcast(dst)], {x: v})[0]
  got = program.evaluate_c([x.bitcast(dst)], {x: v})[0]
  assert got.dtype == want.dtype
  if dtypes.is_float(dst):  # NaN payloads may differ: compare the bits of the non-NaN values and NaN positions
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    m = ~np.isnan(want)
    np.testing.assert_array_equal(got[m].view(f"u{got.itemsize}"), want[m].view(f"u{want.itemsize}"))
  else:
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("shape,axes", [((0,), (0,)), ((1,), (0,)), ((1023,), (0,)), ((1024,), (0,)), ((1025,), (0,)),
                                        ((33, 47), (0,)), ((33, 47), (1,)), ((5, 0, 3), (1,)), ((0, 4), (0,)),
                                        ((4, 6, 5), (0, 2)), ((3, 1030), (1,)), ((1030, 3), (0,)),
                                        ((2, 3, 4), (0, 1, 2))])
@pytest.mark.parametrize("rop", [Ops.ADD, Ops.MAX, Ops.MUL], ids=lambda o: o.name)
@pytest.mark.parametrize("dt", VALUE_DTYPES, ids=lambda d: d.name)
def test_reduce(dt, rop, shape, axes):
  rng = np.random.default_rng(8)
  x = UOp.placeholder(shape, dt, "x")
  n = math.prod(shape)
  kind = "small" if rop is Ops.MUL or dtypes.is_float(dt) else "any"
  v = values(dt, n, rng, kind).reshape(shape)
  if rop is Ops.MUL and dtypes.is_float(dt): v = (np.abs(v.astype(np.float64)) * 0 + 1 + 1e-3 * v).astype(v.dtype)
  if rop is Ops.MUL and dt is dtypes.bfloat16: v = round_bfloat16(v)
  check(x.r(rop, axes), {x: v}, approx=dtypes.is_float(dt) and rop is not Ops.MAX,
        rtol={dtypes.float16: 1e-2, dtypes.bfloat16: 4e-2, dtypes.float64: 1e-12}.get(dt, 2e-5))


def test_reduce_max_nan():
  x = UOp.placeholder((3, 4), dtypes.float32, "x")
  v = np.arange(12, dtype=np.float32).reshape(3, 4)
  v[1, 2] = np.nan
  check(x.max(1), {x: v})
  check(x.max(0), {x: v})


# ---- views and non-contiguous inputs ----
def _arr(shape, rng):
  return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("n", (1, 1023, 1024, 1025))
def test_noncontiguous_inputs(n):
  rng = np.random.default_rng(1)
  x, y = UOp.placeholder((3, n), dtypes.float32, "x"), UOp.placeholder((3, n), dtypes.float32, "y")
  a = _arr((6, 2 * n), rng)[::2, ::2]
  b = np.asfortranarray(_arr((3, n), rng))
  check(x * y + x, {x: a, y: b})


MOVES = [
  lambda x: x.permute(1, 0),
  lambda x: x.flip(0),
  lambda x: x.flip((0, 1)),
  lambda x: x.shrink(((1, 3), (2, 7))),
  lambda x: x.pad(((1, 2), (0, 3))),
  lambda x: x.reshape(2, 2, -1),
  lambda x: x.permute(1, 0).reshape(-1),
  lambda x: x.reshape(4, 1, -1).expand(4, 3, -1),
  lambda x: x.pad(((2, 0), (1, 1))).flip(1).shrink(((1, 5), (0, 4))),
  lambda x: x.flip(1).permute(1, 0).pad(((0, 1), (1, 0))).reshape(-1),
]


def _move_ok(mi: int, cols: int) -> bool:
  try: MOVES[mi](UOp.placeholder((4, cols), dtypes.float32))
  except ValueError: return False
  return True


MOVE_CASES = [(mi, cols) for mi in range(len(MOVES)) for cols in (1, 255, 256, 257)]


@pytest.mark.parametrize("mi,cols", [c for c in MOVE_CASES if _move_ok(*c)])
def test_movement_views(mi, cols):
  rng = np.random.default_rng(mi)
  x, y = UOp.placeholder((4, cols), dtypes.float32, "x"), UOp.placeholder((4, cols), dtypes.float32, "y")
  out = MOVES[mi](x)
  a, b = _arr((4, cols), rng), _arr((4, cols), rng)
  check(out, {x: a})                              # a view of an input (a copy kernel)
  check(MOVES[mi](x * y + 1.0) * 2.0, {x: a, y: b})  # movement of an expression


def test_movements_out_of_bounds_are_refused():
  bad = [c for c in MOVE_CASES if not _move_ok(*c)]
  assert bad == [(3, 1), (8, 1)]  # shrink (2, 7) of one column, and the padded shrink (0, 4) of three
  with pytest.raises(ValueError, match=r"SHRINK: .*out of bounds"):
    MOVES[3](UOp.placeholder((4, 1), dtypes.float32))


def test_expand_of_expression_materializes_the_small_source():
  x = UOp.placeholder((64, 1), dtypes.float32, "x")
  y = UOp.placeholder((64, 512), dtypes.float32, "y")
  out = (x.exp() + 1.0).expand(64, 512) * y
  p = program.compile_program(out, [x, y])
  assert p.stats["peak_bytes"] <= 64 * 4 + 64, p.stats
  rng = np.random.default_rng(0)
  a, b = _arr((64, 1), rng), _arr((64, 512), rng)
  np.testing.assert_allclose(p(a, b), numpy_eval.evaluate([out], {x: a, y: b})[0], rtol=3e-6)


def test_shared_elementwise_value_is_a_register_of_its_kernel():
  # a value used twice was stored and read back even when both users were in the one kernel (exp's reduction uses x
  # and n three times each): elementwise users in one kernel now compute it once per element, no buffer
  x = UOp.placeholder((1000,), dtypes.float32, "x")
  t = x * 2 + 1
  rng = np.random.default_rng(0)
  a = _arr((1000,), rng)
  one = program.compile_program(t * t + t.sin(), [x])
  assert one.stats["kernels"] == 1 and one.stats["peak_bytes"] == 0, one.stats
  np.testing.assert_allclose(one(a), numpy_eval.evaluate([t * t + t.sin()], {x: a})[0], rtol=1e-6)
  # a quotient by an expression: the MUL(x, RECIPROCAL(d)) runs as DIV(x, d), and the RECIPROCAL left unused no
  # longer counts as a second user of d (d was stored and read back: two kernels)
  q = x / (t + 0.5)
  one = program.compile_program(q, [x])
  assert one.stats["kernels"] == 1 and one.stats["peak_bytes"] == 0, one.stats
  np.testing.assert_array_equal(one(a), numpy_eval.evaluate([q], {x: a})[0])
  # users in two kernels (an elementwise output and a reduction; a movement) still share one buffer
  outs = [t * t + t.sin(), t.sum(), (t.reshape(10, 100) * t.reshape(100, 10).T).sum(1)]
  two = program.compile_program(outs, [x])
  assert two.stats["peak_bytes"] >= 4000, two.stats
  for g, w in zip(two(a), numpy_eval.evaluate(outs, {x: a})): np.testing.assert_allclose(g, w, rtol=1e-5)


@pytest.mark.parametrize("n,k,m", [(1, 1, 1), (7, 9, 5), (64, 64, 64), (33, 300, 17), (130, 8, 257), (0, 5, 3),
                                   (4, 0, 3)])
@pytest.mark.parametrize("dt", (dtypes.float32, dtypes.float64), ids=lambda d: d.name)
def test_matmul(n, k, m, dt):
  rng = np.random.default_rng(n * 100 + m)
  x, w = UOp.placeholder((n, k), dt, "x"), UOp.placeholder((k, m), dt, "w")
  a, b = rng.standard_normal((n, k)).astype(dt.numpy), rng.standard_normal((k, m)).astype(dt.numpy)
  p = program.compile_program(x @ w, [x, w])
  np.testing.assert_allclose(p(a, b), a @ b, rtol=1e-4 if dt is dtypes.float32 else 1e-10, atol=1e-4)


@pytest.mark.parametrize("isa", [0, 1, 2])
@pytest.mark.parametrize("n,k,m", [(37, 300, 10), (130, 64, 15), (9, 600, 3), (128, 256, 10), (64, 520, 1),
                                   (5, 7, 11), (258, 33, 5), (131, 1000, 12)])
@pytest.mark.parametrize("dt", (dtypes.float32, dtypes.float64), ids=lambda d: d.name)
def test_narrow_matmul_on_every_instruction_set(isa, n, k, m, dt):
  """A C narrower than 16 columns whose A rows are contiguous runs as dot products along the depth (gemm_dot): column
  counts that are no multiple of the 5 columns of a tile, row counts no multiple of its 2 or 4 rows, depths shorter
  than a vector, no multiple of one and past one block, and a transposed B (w.T, copied by rows) all give A @ B, on
  every instruction-set clone, and the same bits on 1, 2 and 3 threads."""
  from pygrad.engine import vmlib
  before = pygrad.get_num_threads()
  try:
    vmlib.set_isa(isa)
  except ValueError:
    pytest.skip("this CPU lacks it")
  try:
    rng = np.random.default_rng(n + k + m)
    x, w, wt = (UOp.placeholder((n, k), dt, "x"), UOp.placeholder((k, m), dt, "w"),
                UOp.placeholder((m, k), dt, "wt"))
    a, b = rng.standard_normal((n, k)).astype(dt.numpy), rng.standard_normal((k, m)).astype(dt.numpy)
    p = program.compile_program([x @ w, x @ wt.T], [x, w, wt])
    tol = dict(rtol=1e-4, atol=1e-4) if dt is dtypes.float32 else dict(rtol=1e-10, atol=1e-10)
    outs = []
    for nt in (1, 2, 3):
      pygrad.set_num_threads(nt)
      outs.append(p(a, b, np.ascontiguousarray(b.T)))
      for o in outs[-1]: np.testing.assert_allclose(o, a @ b, **tol)
    for o in outs[1:]:
      for o1, o2 in zip(outs[0], o): np.testing.assert_array_equal(o1, o2)
  finally:
    vmlib.set_isa(-1)
    pygrad.set_num_threads(before)


def test_matmul_is_a_contraction_without_the_expanded_product():
  x, w = UOp.placeholder((96, 200), dtypes.float32, "x"), UOp.placeholder((200, 80), dtypes.float32, "w")
  p = program.compile_program(x @ w, [x, w])
  assert p.stats["contractions"] == 1 and p.stats["peak_bytes"] < 96 * 80 * 4, p.stats
  rng = np.random.default_rng(2)
  a, b = _arr((96, 200), rng), _arr((200, 80), rng)
  np.testing.assert_allclose(p(a, b), a @ b, rtol=1e-4, atol=1e-4)
  xt = UOp.placeholder((200, 96), dtypes.float32, "xt")
  q = program.compile_program(xt.T @ w.T.T, [xt, w])  # transposed operands: strided packing
  np.testing.assert_allclose(q(np.ascontiguousarray(a.T), b), a @ b, rtol=1e-4, atol=1e-4)


def test_batched_matmul():
  rng = np.random.default_rng(4)
  x, w = UOp.placeholder((3, 20, 30), dtypes.float32, "x"), UOp.placeholder((3, 30, 10), dtypes.float32, "w")
  a, b = _arr((3, 20, 30), rng), _arr((3, 30, 10), rng)
  np.testing.assert_allclose(program.evaluate_c([x @ w], {x: a, w: b})[0], a @ b, rtol=1e-4, atol=1e-4)


def test_fused_reduce_has_no_temporary():
  x, y = UOp.placeholder((256, 512), dtypes.float32, "x"), UOp.placeholder((256, 512), dtypes.float32, "y")
  p = program.compile_program((x * y).sum(axis=1), [x, y])
  assert p.stats["kernels"] <= 2 and p.stats["peak_bytes"] <= 256 * 4 + 64, p.stats
  rng = np.random.default_rng(9)
  a, b = _arr((256, 512), rng), _arr((256, 512), rng)
  np.testing.assert_allclose(p(a, b), (a * b).sum(1), rtol=1e-4, atol=1e-4)


# ---- inputs ----
def test_bad_inputs_raise_value_error_naming_the_input():
  x = UOp.placeholder((3,), dtypes.float32, "xin")
  v = UOp.variable("scale", 0.0, 10.0)
  p = program.compile_program(x * v, [x, v])
  np.testing.assert_allclose(p(np.ones(3, np.float32), 2.0), [2, 2, 2])
  with pytest.raises(ValueError, match="xin"): p(np.ones(4, np.float32), 2.0)
  with pytest.raises(ValueError, match="xin"): p(np.ones(3, np.int32), 2.0)
  with pytest.raises(ValueError, match="scale"): p(np.ones(3, np.float32), 20.0)
  with pytest.raises(ValueError): p(np.ones(3, np.float32))
  with pytest.raises(ValueError, match="xin"): program.evaluate_c([x * 2.0], {})
  with pytest.raises(ValueError, match="xin"): program.compile_program([x * v], [v])


def test_program_reuse_and_multiple_outputs():
  x = UOp.placeholder((5,), dtypes.float32, "x")
  p = program.compile_program([x + 1.0, (x * x).sum(), x], [x])
  for i in range(3):
    a = np.arange(5, dtype=np.float32) * i
    r = p(a)
    np.testing.assert_array_equal(r[0], a + 1)
    np.testing.assert_allclose(r[1], (a * a).sum())
    np.testing.assert_array_equal(r[2], a)
    assert r[2] is not a


def test_program_alternating_converted_and_exact_inputs():
  """A call whose input is converted (a list, a strided view) passes that array's sizes to the VM; a call whose
  inputs are exact arrays uses the planned sizes kept with the program: alternating them stays right."""
  x, y = UOp.placeholder((4, 6), dtypes.float32, "x"), UOp.placeholder((6, 3), dtypes.float32, "y")
  p = program.compile_program([x @ y, x.sum(1)], [x, y])
  rng = np.random.default_rng(3)
  for i in range(4):
    a, b = _arr((4, 6), rng), _arr((6, 3), rng)
    ins = [(a, b), (a.tolist(), b), (a, _arr((6, 6), rng)[:, ::2]), (a, b)][i]
    r = p(*ins)
    na, nb = (np.asarray(v, np.float32) for v in ins)
    np.testing.assert_allclose(r[0], na @ nb, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(r[1], na.sum(1), rtol=1e-5, atol=1e-5)
    assert r[0].shape == (4, 3) and r[1].shape == (4,)


@pytest.mark.parametrize("fn,ref,lo,hi", [("sin", np.sin, -8000, 8000), ("sin", np.sin, -3e7, 3e7),
                                          ("exp2", np.exp2, -149, 128), ("log2", np.log2, -100, 88)])
def test_transcendentals_within_two_ulp(fn, ref, lo, hi):
  x = UOp.placeholder((1 << 16,), dtypes.float32, "x")
  v = np.random.default_rng(0).uniform(lo, hi, 1 << 16)
  v = (np.exp(v) if fn == "log2" else v).astype(np.float32)
  got = program.evaluate_c([getattr(x, fn)()], {x: v})[0].astype(np.float64)
  want = ref(v.astype(np.float64))
  ulp = np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)
  assert np.nanmax(np.abs(got - want) / ulp) <= 2.0


def test_corrupted_programs_raise_and_never_crash():
  """The C side validates every word: any mutation of a valid program is accepted or refused with ValueError."""
  from pygrad.engine import vmlib
  x, y = UOp.placeholder((6, 5), dtypes.float32, "x"), UOp.placeholder((5, 9), dtypes.float32, "y")
  p = program.Program([(x.pad(((1, 1), (0, 2))).flip(0) * 2.0).sum(1), x @ y, x.cast(dtypes.int8) >> 2], [x, y],
                      keep_words=True)
  words = p._words
  rng = np.random.default_rng(0)
  slots = [np.zeros(max(n, 1), np.uint8) for n in p._slot_sizes]
  refused = 0
  for trial in range(3000):
    w = list(words)
    for _ in range(int(rng.integers(1, 4))):
      i = int(rng.integers(0, len(w)))
      w[i] = int(rng.choice([w[i] + 1, w[i] - 1, -1, 0, 1 << 50, -(1 << 50), int(rng.integers(-50, 50))]))
    if trial % 50 == 0: w = w[:int(rng.integers(0, len(w)))]
    try:
      h = vmlib.prepare(w)
    except ValueError:
      refused += 1
      continue
    if any(abs(v) >= 1 << 50 for v in w): continue  # accepted only if unused: a legal but enormous loop
    ptrs = vmlib.ffi.new("void *[]", [vmlib.ffi.cast("void *", s.ctypes.data) for s in slots])
    sizes = vmlib.ffi.new("int64_t[]", [s.nbytes for s in slots])
    assert vmlib.lib.pg_vm_run(h, ptrs, sizes, len(slots)) in (0, vmlib.lib.PG_VM_ERR_SLOTS)
  assert refused > 1000


def test_counts_past_the_programs_words_are_refused_without_allocating_them():
  """A kernel claiming 2**28 instructions (or 2**20 stores) in a few words is refused as truncated, and
  its arrays come from the program's arena sized by the words left (vm_read.c rd_take), not by the claim: 8 GB of
  instructions are neither zeroed nor mapped."""
  import resource
  from pygrad.engine import vmlib, lower
  head = [program._MAGIC, program._VERSION, 1, 1, 1, 64, 0, 0, 64]  # one slot, one buffer of 64 bytes, one kernel
  loop = [lower.VK_LOOP, 1, 16, 0, 0, 0, 0, 16, 1, dtypes.float32.id, 0]  # 16 elements, one float32 register
  before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  for tail in ([0, 1 << 28], [0, 0, 1 << 20, 0, 0]):  # instructions, stores
    with pytest.raises(ValueError, match="truncated"): vmlib.prepare(head + loop + tail)
  assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200_000  # (KB: far below the claims)
  f32 = dtypes.float32.id
  vmlib.prepare(head + loop + [1, 0, 0, f32, 0, 0, 1, 0, 1, 0, 0, f32, 0, 0, 1])  # (the same words, complete)


@pytest.mark.parametrize("dt", [d for d in VALUE_DTYPES if not dtypes.is_unsigned(d) and not dtypes.is_bool(d)],
                         ids=lambda d: d.name)
def test_abs_is_lowered_with_the_products_exact_results(dt):
  """x.abs() (x * sign(x)) runs as one VM op; results match the product bit for bit, -0.0 and int MIN included."""
  x = UOp.placeholder((1025,), dt, "x")
  v = values(dt, 1025, np.random.default_rng(0))
  want = numpy_eval.evaluate([x.abs()], {x: v})[0]
  got = program.evaluate_c([x.abs()], {x: v})[0]
  np.testing.assert_array_equal(got, want)
  if dtypes.is_float(dt): np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
