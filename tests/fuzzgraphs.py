"""Random graphs for the differential fuzz suites (tests/test_fuzz_*.py).

A recipe is JSON-able: input specs, then steps of random ints. `build` turns it into a graph by the same code on
either core, choosing operands among the nodes built so far by those ints and the nodes' shapes and dtypes, so the
pure core can build the same recipe in a subprocess and the two graphs (and the errors raised on the way) can be
compared. Most steps are valid; a few ("wild" steps) ignore the shape/dtype rules on purpose, so both cores must
raise the same error. Inputs carry special values (NaN, inf, -0.0, extremes of every integer type).

Budget: CI runs 100 examples per test (about a minute per core on a loaded 2-core machine).
PYGRAD_FUZZ=long selects the long hypothesis profile (a million examples per test, for hours; run it as a command,
e.g. `PYGRAD_FUZZ=long nice -n 19 python -m pytest -q -p no:cacheprovider tests/test_fuzz_engines.py`, one suite at
a time, PYGRAD_FUZZ_LOG=<file> to count the cases); PYGRAD_FUZZ=<n> runs n examples per test."""
from __future__ import annotations
import json, math, os, random
import numpy as np
from hypothesis import HealthCheck, settings, strategies as st
import pygrad
from pygrad import UOp, Ops, dtypes
from pygrad.dtype import VALUE_DTYPES

_mode = os.environ.get("PYGRAD_FUZZ", "ci")
_checks = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
settings.register_profile("pygrad-fuzz-ci", max_examples=100, deadline=None, suppress_health_check=_checks,
                          print_blob=True)
settings.register_profile("pygrad-fuzz-long", max_examples=1_000_000, deadline=None, suppress_health_check=_checks,
                          print_blob=True, database=None)
if _mode.isdigit():
  settings.register_profile("pygrad-fuzz-n", max_examples=int(_mode), deadline=None, suppress_health_check=_checks,
                            print_blob=True, database=None)
PROFILE = "pygrad-fuzz-long" if _mode == "long" else "pygrad-fuzz-n" if _mode.isdigit() else "pygrad-fuzz-ci"
FUZZ = settings(settings.get_profile(PROFILE))
LONG = _mode != "ci"

DTYPES = {d.name: d for d in VALUE_DTYPES}
FLOATS = [d for d in VALUE_DTYPES if dtypes.is_float(d)]
INTS = [d for d in VALUE_DTYPES if dtypes.is_int(d)]
KINDS = ("unary", "binary", "binary", "where", "cast", "reduce", "movement", "movement", "matmul", "const",
         "function", "multi", "wild")
UNARY_F = ("sqrt", "sin", "log2", "exp2", "reciprocal", "trunc", "neg", "abs", "relu", "exp", "log", "cos",
           "sigmoid", "tanh", "contiguous", "detach", "sign", "floor")
UNARY_I = ("neg", "abs", "contiguous", "logical_not", "sign")
BIN_ANY = ("__add__", "__sub__", "__mul__", "maximum", "minimum", "__lt__", "eq", "ne", "__le__", "__ge__", "__gt__")
BIN_F = ("__truediv__", "pow")
BIN_I = ("__floordiv__", "__mod__", "__and__", "__or__", "__xor__", "__lshift__", "__rshift__")
SPECIAL_F = [0.0, -0.0, 1.0, -1.0, 0.5, 2.0, 1e-8, -1e30, 65504.0, 1e300, math.inf, -math.inf, math.nan]

# ops whose results are exactly specified (IEEE) and computed the same way by both engines; anything else
# (transcendentals, POW, float reductions, whose order differs) is compared within tolerances
INEXACT = {Ops.SIN, Ops.LOG2, Ops.EXP2, Ops.POW}


def recipes(max_steps: int = 24, float_inputs: bool | str = False):
  """The hypothesis strategy of recipes: 1-3 inputs of rank 0-3 and any dtype, then steps. float_inputs (for
  gradients): inputs mostly float64 (or the float dtype named), and int32; float values and constants ordinary
  (no NaN, inf, or exact zeros: see test_fuzz_grad.py)."""
  shape = st.lists(st.integers(1, 4), min_size=0, max_size=3).map(tuple)
  fname = float_inputs if isinstance(float_inputs, str) else "float64"
  names = [fname] * 4 + ["int32"] if float_inputs else sorted(DTYPES)
  inp = st.tuples(shape, st.sampled_from(names))
  step = st.tuples(st.sampled_from(KINDS), st.lists(st.integers(0, 1 << 16), min_size=8, max_size=8))
  return st.fixed_dictionaries({"inputs": st.lists(inp, min_size=1, max_size=3),
                                "steps": st.lists(step, min_size=4, max_size=max_steps),
                                "seed": st.integers(0, 1 << 30), "plain": st.just(bool(float_inputs))})


class Built:
  """A built recipe: its inputs, every node made (in order), the error of each step that raised, the outputs."""
  def __init__(self, bufs, nodes, errors, outputs):
    self.bufs, self.nodes, self.errors, self.outputs = bufs, nodes, errors, outputs


def _pick(pool, r, pred=lambda u: True):
  c = [u for u in pool if pred(u)]
  return c[r % len(c)] if c else None


def _value(dt, r, plain=False):
  if dtypes.is_float(dt):
    if plain: return (r % 200 - 100) / 8 + 1 / 16  # never 0: see test_fuzz_grad.py
    return SPECIAL_F[r % len(SPECIAL_F)] if r % 3 == 0 else (r % 200 - 100) / 8
  if dtypes.is_bool(dt): return bool(r & 1)
  info = np.iinfo(dt.np)
  return [0, 1, -1 if info.min < 0 else 2, int(info.max), int(info.min), r % 7 + 2][r % 6]


def _flat_dev(u):
  return isinstance(u.device, str)


def _step(kind, r, pool, plain=False):
  """One step: the new node (or None when nothing fits); raises what the library raises for a wild step."""
  flat = [u for u in pool if _flat_dev(u)]
  a = _pick(flat, r[0])
  if a is None: return None
  if kind == "unary":
    names = UNARY_F if dtypes.is_float(a.dtype) else UNARY_I if not dtypes.is_bool(a.dtype) else ("logical_not",)
    name = names[r[1] % len(names)]
    if name == "logical_not" and not dtypes.is_bool(a.dtype): a = a.ne(a.const_like(_value(a.dtype, r[2], plain)))
    return getattr(a, name)()
  if kind == "binary":
    names = BIN_ANY + (BIN_F if dtypes.is_float(a.dtype) else BIN_I if dtypes.is_int(a.dtype) else
                       ("__and__", "__or__", "__xor__"))
    name = names[r[1] % len(names)]
    if r[2] % 4 == 0: b = _value(a.dtype, r[3], plain)  # a Python scalar operand
    else:
      b = _pick(flat, r[3], lambda u: u.dtype is a.dtype and (u.shape == a.shape or u.shape == () or a.shape == ()))
    if name in ("__lshift__", "__rshift__"):  # shift counts within the width: beyond it the result is undefined
      b = a.const_like(r[3] % (8 * a.dtype.itemsize))
    if name in ("__floordiv__", "__mod__") and not isinstance(b, UOp) and b == 0: b = 3
    return getattr(a, name)(b)
  if kind == "where":
    c = _pick(flat, r[1], lambda u: dtypes.is_bool(u.dtype) and (u.shape == a.shape or u.shape == ()))
    if c is None: c = a.ne(a.const_like(_value(a.dtype, r[2], plain)))
    b = _pick(flat, r[3], lambda u: u.dtype is a.dtype and u.shape == a.shape)
    if b is None: b = a.const_like(_value(a.dtype, r[4], plain))
    return c.where(a, b)
  if kind == "cast":
    if r[1] % 5 == 0:
      same = [d for d in VALUE_DTYPES if d.itemsize == a.dtype.itemsize and not dtypes.is_bool(d)]
      if dtypes.is_bool(a.dtype): return a.cast(dtypes.int8)
      if dtypes.is_float(a.dtype) and not exact_graph(a):
        # the bits of an inexact value are not specified: a float sum's order differs between the engines (one ulp
        # apart, its bitcast differs by one), and so does the sign and payload of a NaN a transcendental returns
        # (IEEE 754 6.3; sin(-nan) is +nan in numpy's SIMD loop, -nan in libm); such a value is bitcast there and
        # back, so the result is compared as a float, within tolerance, NaN equal to NaN
        return a.bitcast(same[r[2] % len(same)]).bitcast(a.dtype)
      return a.bitcast(same[r[2] % len(same)])
    return a.cast(VALUE_DTYPES[r[2] % len(VALUE_DTYPES)])
  if kind == "reduce":
    if a.ndim == 0: return a.sum()
    axes = tuple(i for i in range(a.ndim) if (r[1] >> i) & 1) or None
    name = ("sum", "max", "prod", "min", "mean")[r[2] % (5 if dtypes.is_float(a.dtype) else 4)]
    return getattr(a, name)(axis=axes, keepdim=bool(r[3] & 1))
  if kind == "movement":
    return _movement(a, r)
  if kind == "matmul":
    if not (dtypes.is_float(a.dtype) or dtypes.is_int(a.dtype)) or a.ndim == 0: return None
    if a.ndim == 1: return a @ a
    other = _pick(flat, r[1], lambda u: u.dtype is a.dtype and u.ndim == 2 and u.shape[0] == a.shape[-1])
    if other is not None and a.ndim == 2: return a @ other
    return a @ a.permute(tuple(range(a.ndim - 2)) + (a.ndim - 1, a.ndim - 2))
  if kind == "const":
    dt = VALUE_DTYPES[r[1] % len(VALUE_DTYPES)]
    c = UOp.const(_value(dt, r[2], plain), dt)
    return c if r[3] % 2 else c.reshape((1,) * a.ndim).expand(a.shape)
  if kind == "function":
    p = a.param_like(0)
    body = _step(("unary", "binary", "reduce", "movement")[r[1] % 4], r[2:] + r[:2], [p], plain)
    if body is None: return None
    f = body.call(a, precompile=bool(r[3] & 1))
    return f.gettuple(0)
  if kind == "multi":
    if a.ndim == 0: return None
    ax = r[1] % a.ndim
    n = 2 if a.shape[ax] % 2 == 0 else 1
    m = a.shard(tuple(f"CPU:{i}" for i in range(n)), ax if r[2] % 2 else None)
    return m.sin() if dtypes.is_float(a.dtype) and r[3] % 2 else m
  if kind == "wild":  # any op on any nodes: most raise, and both cores must raise the same
    b = pool[r[1] % len(pool)]
    op = list(Ops)[r[2] % len(Ops)]
    if op in (Ops.BUFFER, Ops.FUNCTION, Ops.CALL, Ops.DEFINE_VAR, Ops.PARAM): return None
    arg = [None, r[3] % 4, (Ops.ADD, (0,)), ((0, 1),), (2, 2), (1, 0), 1.5][r[4] % 7]
    srcs = (a, b, a)[:r[5] % 4]
    return UOp(op, VALUE_DTYPES[r[6] % len(VALUE_DTYPES)] if r[7] % 2 else None, srcs, arg)
  raise AssertionError(kind)


def _movement(a, r):
  nd, sh = a.ndim, a.shape
  k = r[1] % 6
  if k == 0:  # reshape: flatten, or split/insert unit dims
    if r[2] % 2: return a.reshape((math.prod(sh),))
    return a.reshape(sh + (1,))
  if k == 1:  # expand unit dims (after inserting one)
    b = a.reshape((1,) + sh)
    return b.expand((r[2] % 3 + 1,) + sh)
  if nd == 0: return a.reshape((1,))
  if k == 2: return a.pad(tuple(((r[2] >> (2 * i)) % 3, (r[3] >> (2 * i)) % 3) for i in range(nd)))
  if k == 3:
    bounds = []
    for i, s in enumerate(sh):
      lo = (r[2] >> (2 * i)) % s
      bounds.append((lo, lo + 1 + (r[3] >> (2 * i)) % (s - lo)))
    return a.shrink(tuple(bounds))
  if k == 4:
    perm = sorted(range(nd), key=lambda i: (r[2] >> (3 * i)) % 8 * 10 + i)
    return a.permute(tuple(perm))
  return a.flip(tuple(i for i in range(nd) if (r[2] >> i) & 1) or (0,))


def build(recipe) -> Built:
  """The graph of a recipe on this process' core; an error a step raises is recorded and the step skipped.
  With PYGRAD_FUZZ_LOG=<file>, each call appends a line to that file: how many cases a long run built."""
  if (log := os.environ.get("PYGRAD_FUZZ_LOG")):
    with open(log, "a") as f: f.write(os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0] + "\n")
  bufs = [UOp.placeholder(tuple(s), DTYPES[d], name=f"in{i}") for i, (s, d) in enumerate(recipe["inputs"])]
  pool: list = list(bufs)
  nodes, errors = [], []
  for i, (kind, r) in enumerate(recipe["steps"]):
    try:
      u = _step(kind, list(r), pool, recipe.get("plain", False))
    except (TypeError, ValueError) as e:
      errors.append((i, type(e).__name__, str(e)))
      continue
    if u is None or u.dtype is dtypes.void: continue
    pool.append(u)
    nodes.append(u)
  outs = nodes[-3:] if nodes else bufs[:1]
  return Built(bufs, nodes, errors, outs)


def input_values(recipe, bufs):
  """Arrays for the inputs: mostly ordinary values, a sprinkling of special ones."""
  rng = np.random.default_rng(recipe["seed"])
  vals = {}
  for b in bufs:
    d = b.dtype
    if dtypes.is_float(d):
      v = rng.standard_normal(b.shape) * 3
      mask = rng.random(b.shape) < (0 if recipe.get("plain") else 0.15)
      v = np.where(mask, rng.choice(np.array(SPECIAL_F), b.shape), v)
      v = v.astype(np.float32 if d is dtypes.bfloat16 else d.np)
      if d is dtypes.bfloat16: v = _round_bf16(v)
    elif dtypes.is_bool(d): v = rng.random(b.shape) < 0.5
    else:
      info = np.iinfo(d.np)
      v = rng.integers(-50 if info.min < 0 else 0, 50, b.shape, dtype=np.int64, endpoint=True)
      mask = rng.random(b.shape) < 0.15
      v = np.where(mask, rng.choice(np.array([info.min, info.max], dtype=object), b.shape), v)
      v = np.asarray(v.astype(np.int64) if d is not dtypes.uint64 else v.astype(np.uint64)).astype(d.np)
    vals[b] = np.asarray(v)
  return vals


def _round_bf16(v):
  u = v.astype(np.float32).view(np.uint32).astype(np.uint64)
  u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16 << 16).astype(np.uint32)
  out = u.view(np.float32)
  return np.where(np.isnan(v), np.float32("nan"), out)


def exact_graph(u: UOp) -> bool:
  """Whether every op under u is exactly specified and done the same way by both engines (bit-exact checks)."""
  for n in u.toposort():
    if n.op in INEXACT: return False
    if n.op is Ops.REDUCE_AXIS and dtypes.is_float(n.dtype) and n.arg[0] is not Ops.MAX: return False
  return True


def same_values(a, b, dt, exact: bool) -> str | None:
  """None if a and b agree: bit for bit (NaN equal to NaN) when exact, else within dt's tolerances; else why not."""
  a, b = np.asarray(a), np.asarray(b)
  if a.shape != b.shape: return f"shapes {a.shape} vs {b.shape}"
  if a.dtype != b.dtype: return f"dtypes {a.dtype} vs {b.dtype}"
  if dtypes.is_float(dt):
    na, nb = np.isnan(a), np.isnan(b)
    if exact:
      ok = (na & nb) | ((a == b) & (np.signbit(a) == np.signbit(b)))
    else:
      tol = {dtypes.float16: 2e-2, dtypes.bfloat16: 5e-2, dtypes.float32: 1e-4, dtypes.float64: 1e-6}[dt]
      with np.errstate(all="ignore"):
        big = np.maximum(1.0, np.nanmax(np.abs(np.where(np.isfinite(a), a, 0)), initial=0))
        ok = (na & nb) | (a == b) | (np.isfinite(a) & np.isfinite(b) &
                                     (np.abs(a.astype(np.float64) - b) <= tol * (np.abs(b) + big)))
    if not ok.all():
      i = np.argwhere(~ok)[0]
      return f"at {tuple(i)}: {a[tuple(i)]!r} vs {b[tuple(i)]!r}"
    return None
  if not np.array_equal(a, b): return f"{a.tolist()} vs {b.tolist()}"
  return None


def serialize(outs) -> list:
  """The graph under outs as JSON-able rows, node for node (BUFFER ids replaced by their names)."""
  rows, index = [], {}
  for n in UOp.sink(*outs).toposort():
    arg = n.arg
    if n.op is Ops.BUFFER: arg = ("BUFFER", arg[1], arg[2], arg[3])
    elif n.op in (Ops.FUNCTION, Ops.CALL): arg = ("CALL", getattr(arg, "name", None), getattr(arg, "precompile", None))
    index[n] = len(rows)
    rows.append([n.op.name, n.dtype.name, [index[s] for s in n.src], repr(arg), repr(n.tag)])
  return rows


def report(recipe) -> dict:
  """What the other core must reproduce: the graph rows and the errors of a recipe."""
  b = build(recipe)
  return {"rows": serialize(b.outputs), "errors": b.errors}


def worker() -> None:
  """Serve `report` for recipes read as JSON lines on stdin (the cross-core suite runs this on the other core)."""
  import sys
  for line in sys.stdin:
    try: out = report(json.loads(line))
    except Exception as e:  # noqa: BLE001 -- anything else is a finding the suite reports
      out = {"crash": f"{type(e).__name__}: {e}"}
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()


def evaluate(outs, vals, engine):
  return pygrad.evaluate(list(outs), vals, engine=engine)



def seeded_graph(seed: int):
  """The graph of a recipe drawn from a plain seed (no hypothesis): (outputs, buffers), for the planner tests that
  compare plans and golden digests of the same graphs."""
  r = random.Random(seed)
  names = sorted(DTYPES)
  inputs = [([r.randint(1, 4) for _ in range(r.randint(0, 3))], r.choice(names)) for _ in range(r.randint(1, 3))]
  steps = [(r.choice(KINDS), [r.randint(0, 1 << 16) for _ in range(8)]) for _ in range(r.randint(8, 24))]
  b = build({"inputs": inputs, "steps": steps, "seed": seed, "plain": False})
  return b.outputs, b.bufs


if __name__ == "__main__": worker()
