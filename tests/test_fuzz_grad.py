"""Differential fuzzing of gradients (issue 10 item 17): for random graphs (tests/fuzzgraphs.py) over float inputs,
pygrad's gradients of orders 1 and 2 equal torch.autograd's wherever torch's are finite. Torch runs the same
primitive graph: FUNCTIONs inlined, every float node translated op for op in its own dtype, and every value
that carries no gradient (integer and bool nodes, casts from them, BITCAST, DETACH) taken from pygrad's reference
engine. Inputs and constants are ordinary values (no NaN, inf or exact zeros: at those points torch's conventions
are left to the corner tests, test_gradient_corners.py); float64 graphs, and float32 ones (inputs in float32,
compared within float32's tolerance), are compared (float16/bfloat16 are not: see the test for why).
Budget and long mode: fuzzgraphs.py."""
from __future__ import annotations
import numpy as np
import pytest
from hypothesis import example, given, assume, settings, strategies as st
import pygrad
from pygrad import UOp, Ops, dtypes, UPat, PatternMatcher, graph_rewrite
from pygrad.engine.values import quotient_operands
from fuzzgraphs import FUZZ, LONG, recipes, build, input_values

torch = pytest.importorskip("torch")
TORCH_DT = {d.name: getattr(torch, d.name) for d in pygrad.dtype.VALUE_DTYPES}
TOL = {dtypes.float64: 1e-7, dtypes.float32: 2e-3, dtypes.bfloat16: 0.1, dtypes.float16: 0.05}


def _inline_call(g):
  f = g.src[0]
  if f.op is not Ops.FUNCTION: return None
  body = f.src[0].src[g.arg]
  params = {n: f.src[1 + n.arg[0]] for n in body.toposort() if n.op is Ops.PARAM}
  return body.substitute(params)


_pm_inline = PatternMatcher([(UPat(Ops.GETTUPLE, name="g"), _inline_call)])


def _float(u): return dtypes.is_float(u.dtype)


def _to_torch(roots, npvals, tvals, wide=False):
  """Torch tensors of the (inlined) roots, with gradient flowing from the torch leaves tvals[buf]. wide: float32
  nodes computed in float64 (constants rounded to float32 first; the values that carry no gradient, comparisons
  included, still pygrad's float32 ones, so every select takes pygrad's branch): the float32 graph's exact value."""
  nodes = list(UOp.sink(*roots).toposort())
  fixed = [n for n in nodes if n.op not in (Ops.SINK, Ops.BUFFER) and n.dtype is not dtypes.void and
           (not _float(n) or n.op in (Ops.BITCAST, Ops.DETACH) or (n.op is Ops.CAST and not _float(n.src[0])))]
  vals = dict(zip(fixed, pygrad.evaluate(fixed, npvals, engine="numpy"))) if fixed else {}
  # a float product's value is pygrad's, its gradient torch's: the order of a product's roundings is each engine's
  # own, and an ill-conditioned user magnifies it (sin of the product of 24 numbers, -6.09e8: torch's 3 ulps from
  # pygrad's and numpy's, the cosine in its gradient 2e-6 apart). Its own value is still checked, within tolerance
  prods = [n for n in nodes if n.op is Ops.REDUCE_AXIS and n.arg[0] is Ops.MUL and n.arg[1] and _float(n)]
  pinned = dict(zip(prods, pygrad.evaluate(prods, npvals, engine="numpy"))) if prods and not wide else {}
  t = {}
  for n in nodes:
    if n.op is Ops.SINK: continue
    if n.op is Ops.BUFFER: t[n] = tvals[n]; continue
    dt = torch.float64 if wide and n.dtype is dtypes.float32 else TORCH_DT[n.dtype.name]
    if n in vals:
      t[n] = torch.tensor(np.asarray(vals[n]), dtype=TORCH_DT[n.dtype.name]).to(dt)
      continue
    s = [t.get(x) for x in n.src]
    op = n.op
    if op is Ops.CONST: r = torch.tensor(n.arg, dtype=TORCH_DT[n.dtype.name]).to(dt)
    elif op is Ops.RECIPROCAL: r = 1 / s[0]
    elif op is Ops.SQRT: r = torch.sqrt(s[0])
    elif op is Ops.SIN: r = torch.sin(s[0])
    elif op is Ops.LOG2: r = torch.log2(s[0])
    elif op is Ops.EXP2: r = torch.exp2(s[0])
    elif op is Ops.TRUNC: r = torch.trunc(s[0])
    elif op is Ops.CAST: r = s[0].to(dt)
    elif op is Ops.ADD: r = s[0] + s[1]
    elif op is Ops.MUL:  # a float MUL(a, RECIPROCAL(b)) is the quotient a / b on every engine
      q = quotient_operands(op, n.dtype, n.src)
      r = s[0] * s[1] if q is None else t[q[0]] / t[q[1]]
    elif op is Ops.MAX: r = torch.maximum(s[0], s[1])
    elif op is Ops.POW: r = torch.pow(s[0], s[1])
    elif op is Ops.WHERE: r = torch.where(s[0], s[1], s[2])
    elif op is Ops.REDUCE_AXIS:
      rop, axes = n.arg
      if not axes: r = s[0]
      elif rop is Ops.ADD: r = s[0].sum(dim=axes, keepdim=True)
      elif rop is Ops.MAX: r = s[0].amax(dim=axes, keepdim=True)
      else:
        r = s[0]
        for a in axes: r = r.prod(dim=a, keepdim=True)
        if n in pinned:
          mine = torch.tensor(np.asarray(pinned[n]), dtype=TORCH_DT[n.dtype.name]).reshape(r.shape)
          ok, near = _close(mine.to(torch.float64).numpy(), r.detach().to(torch.float64).numpy(), TOL[n.dtype])
          assert not (ok & ~near).any(), f"a product's value: {mine} vs torch {r}"
          r = r + (mine - r).detach()
    elif op is Ops.RESHAPE: r = s[0].reshape(n.arg)
    elif op is Ops.EXPAND: r = s[0].expand(n.arg)
    elif op is Ops.PAD: r = torch.nn.functional.pad(s[0], [p for pr in reversed(n.arg) for p in pr])
    elif op is Ops.SHRINK: r = s[0][tuple(slice(a, b) for a, b in n.arg)]
    elif op is Ops.PERMUTE: r = s[0].permute(n.arg)
    elif op is Ops.FLIP: r = s[0].flip([i for i, f in enumerate(n.arg) if f]) if any(n.arg) else s[0]
    elif op in (Ops.CONTIGUOUS, Ops.CONTIGUOUS_BACKWARD, Ops.COPY): r = s[0]
    elif op is Ops.MULTI: r = s[0] if n.arg is None else torch.cat(s, dim=n.arg)
    else: raise AssertionError(f"no torch translation of {op.name}")
    t[n] = r
  return [t[r] for r in roots]


# float32 graphs: where pygrad's gradient is off torch float32's, it is judged against the float32 graph's exact
# gradient (torch in float64): it may be off that by SLACK times torch float32's own error (plus the float32
# tolerance). Where a gradient cancels to ~0 (x / x: eps / x**2 at order 2) both are rounding noise, and torch's error
# at one point can be 0 by luck (seed 22: torch 0, pygrad 2, exact 4e-9 at x = 7e-5), so torch's error is the largest
# of NOISE_RUNS runs, at the inputs and at inputs 2, 4, ... float32 ulps above them (each against its own exact value)
SLACK, NOISE_RUNS = 4.0, 4


def _np(w, shape): return np.zeros(shape) if w is None else w.detach().to(torch.float64).numpy()


def _close(g, w, tol):
  """Where w is finite, whether g is within tol of it (relative to |w| and to w's largest finite magnitude)."""
  ok = np.isfinite(w)
  scale = np.abs(w[ok]).max(initial=1.0)
  return ok, np.abs(g - w) <= tol * (np.abs(w) + scale)


def _compare(mine, theirs, targets, order, tol, judge=None):
  """pygrad's gradients `mine` against torch's `theirs`; where they differ, judge(order) (float32 graphs) gives the
  exact gradients and torch float32's error on them, and a value within SLACK times that error (plus tol) of the
  exact one is right."""
  for i, (b, g, w) in enumerate(zip(targets, mine, theirs)):
    w, g = _np(w, b.shape), np.asarray(g, np.float64)
    ok, near = _close(g, w, tol)
    if judge is not None and (ok & ~near).any():
      exact, noise = (a[i] for a in judge(order))
      both = ok & np.isfinite(exact)
      lim = SLACK * noise + tol * (np.abs(exact) + np.abs(exact[both]).max(initial=1.0))
      near |= both & (np.abs(g - exact) <= lim)
    bad = ok & ~near
    assert not bad.any(), (f"order {order}, d/d{b.arg[3]} ({b.dtype}) at {np.argwhere(bad)[0]}: {g[bad][0]} vs torch "
                           f"{w[bad][0]}" + ("" if judge is None else f", exact {judge(order)[0][i][bad][0]}"))


def _judge(first, run, targets):
  """judge(order) for _compare: the exact gradients of that order and torch float32's largest error on them over
  NOISE_RUNS runs (run(k, wide): torch's gradients at the inputs moved 2k ulps up; first: run(0, False)), computed
  once, when asked."""
  memo: dict = {}

  def judge(order):
    if not memo:
      exact, noise = None, None
      for k in range(NOISE_RUNS):
        t32 = first if k == 0 else run(k, False)
        t64 = run(k, True)
        if k == 0: exact = [[_np(g, b.shape) for g, b in zip(o, targets)] for o in t64]
        err = [[np.abs(_np(a, b.shape) - _np(e, b.shape)) for a, e, b in zip(o32, o64, targets)]
               for o32, o64 in zip(t32, t64)]
        noise = err if noise is None else [[np.fmax(n, e) for n, e in zip(no, eo)] for no, eo in zip(noise, err)]
      memo["v"] = exact, [[np.nan_to_num(n, nan=0.0) for n in o] for o in noise]
    exact, noise = memo["v"]
    return exact[order - 1], noise[order - 1]
  return judge


def _gradients_equal_torch(recipe, rseed, low):
  b = build(recipe)
  outs = [o for o in b.outputs if _float(o) and isinstance(o.device, str)]
  targets = [x for x in b.bufs if _float(x)]
  assume(outs and targets)
  # float64 graphs, and graphs whose least precise type is float32 (`low`): in float16/bfloat16 the rules compute
  # in the low precision (cos as sin(pi/2 - x), whose argument rounds to a whole number at 1,654 in float16), so
  # they are not torch's values within any fixed tolerance; the engine and simplify suites cover those types
  skip = {dtypes.float16, dtypes.bfloat16} | ({dtypes.float32} if low is dtypes.float64 else set())
  assume(not any(n.dtype in skip for n in UOp.sink(*outs).toposort()))
  vals = input_values(recipe, b.bufs)
  # compared where the forward pass is finite everywhere: NaN and inf are the corner tests' (the two below and
  # test_gradient_corners.py)
  fwd = [n for n in UOp.sink(*outs).toposort(enter_calls=False)
         if _float(n) and isinstance(n.device, str) and n.op is not Ops.SINK]
  assume(all(np.isfinite(v).all() for v in pygrad.evaluate(fwd, vals, engine="numpy")))
  rng = np.random.default_rng(rseed)
  ws = [UOp.placeholder(o.shape, dtypes.float64, name=f"w{i}") for i, o in enumerate(outs)]
  w2 = [UOp.placeholder(x.shape, dtypes.float64, name=f"v{i}") for i, x in enumerate(targets)]
  wv = {w: rng.standard_normal(w.shape) for w in ws + w2}
  loss = sum(((o.cast(dtypes.float64) * w).sum() for o, w in zip(outs, ws)), UOp.const(0.0, dtypes.float64))
  g1 = loss.gradient(*targets)
  loss2 = sum(((g.cast(dtypes.float64) * w).sum() for g, w in zip(g1, w2)), UOp.const(0.0, dtypes.float64))
  g2 = loss2.gradient(*targets)
  allv = {**vals, **wv}
  got1 = pygrad.evaluate(g1, allv, engine="numpy")
  got2 = pygrad.evaluate(g2, allv, engine="numpy")

  inl = [graph_rewrite(o, _pm_inline) for o in outs]
  t1, t2 = _torch_gradients(inl, b.bufs, targets, vals, wv, ws, w2)

  def run(k, wide):  # torch's gradients at the float32 inputs moved 2k ulps up (float32 graphs: see SLACK)
    moved = {**vals, **{x: (vals[x] * (1 + k * 2.0 ** -22)).astype(np.float32) for x in targets}}
    return _torch_gradients(inl, b.bufs, targets, moved, wv, ws, w2, wide)
  judge = _judge((t1, t2), run, targets) if low is dtypes.float32 else None
  # the tolerance of the least precise float type in the graph: torch may round a float16 value where pygrad does not
  tol = max(TOL[n.dtype] for n in UOp.sink(*outs, *targets).toposort() if n.dtype in TOL)
  _compare(got1, t1, targets, 1, tol, judge)
  _compare(got2, t2, targets, 2, tol, judge)


def _torch_gradients(inl, bufs, targets, vals, wv, ws, w2, wide=False):
  """torch.autograd's gradients of orders 1 and 2 of the inlined outputs (wide: float32 computed in float64)."""
  def tensor(x, **kw):
    return torch.tensor(np.asarray(vals[x]), dtype=TORCH_DT[x.dtype.name]).to(
      torch.float64 if wide and x.dtype is dtypes.float32 else TORCH_DT[x.dtype.name]).requires_grad_(**kw)
  leaves = {x: tensor(x, requires_grad=True) for x in targets}
  tv = {**leaves, **{x: tensor(x, requires_grad=False) for x in bufs if x not in leaves},
        **{w: torch.tensor(v) for w, v in wv.items()}}
  t_outs = _to_torch(inl, {**vals, **wv}, tv, wide)
  t_loss = sum((o.to(torch.float64) * tv[w]).sum() for o, w in zip(t_outs, ws))
  lv = [leaves[x] for x in targets]
  if not t_loss.requires_grad: t1 = [None] * len(lv)
  else: t1 = list(torch.autograd.grad(t_loss, lv, create_graph=True, allow_unused=True))
  t_loss2 = sum((g.to(torch.float64) * tv[w]).sum() for g, w in zip(t1, w2) if g is not None)
  if isinstance(t_loss2, int) or not t_loss2.requires_grad: t2 = [None] * len(lv)
  else: t2 = list(torch.autograd.grad(t_loss2, lv, allow_unused=True))
  return t1, t2


# the fuzz findings of seed 22 (PYGRAD_FUZZ=1000 --hypothesis-seed=22): a graph over x / x at x = 1.76e-3, whose
# exact second gradient is 0, torch float32's -1/512, pygrad's 3/512 (rounding noise ~eps / x**2 both)
_X_OVER_X = {"inputs": [((4,), "float32"), ((), "float32"), ((2, 3), "float32")], "seed": 16005, "plain": True,
             "steps": [("unary", [0] * 8)] * 2 + [("binary", [162, 62437, 1, 1, 0, 0, 0, 0])] + [("unary", [0] * 8)] * 4
             + [("unary", [255, 0, 0, 0, 0, 0, 0, 0]), ("unary", [0, 1, 0, 0, 0, 0, 0, 0]),
                ("unary", [0, 1, 0, 0, 0, 0, 0, 0])]}


@FUZZ
@given(recipes(float_inputs=True), st.integers(0, 1 << 30))
@example(recipe={"inputs": [((), "float64")] * 3, "seed": 0, "plain": True,  # d sin(x)/dx at x = 2.8e129
                 "steps": [("unary", [0] * 8), ("unary", [0] * 8), ("binary", [53, 506, 0, 0, 0, 0, 0, 0]),
                           ("matmul", [0] * 8), ("matmul", [0] * 8), ("function", [5, 0, 0, 93, 0, 0, 0, 0]),
                           ("function", [1042, 0, 0, 1, 0, 0, 0, 0])]},
         rseed=0)
@example(recipe={"inputs": [((2, 2), "float64"), ((2, 3, 4), "float64")], "seed": 3231, "plain": True,
                 "steps": [("unary", [0] * 8), ("reduce", [1, 0, 227, 0, 0, 0, 0, 0]), ("const", [0] * 8),
                           ("const", [0] * 8), ("unary", [0, 1, 0, 0, 0, 0, 0, 0]),
                           ("unary", [50323, 1, 0, 0, 0, 0, 0, 0])]},
         rseed=0)  # sin of a product of 24 numbers (-6.09e8): torch's product 3 ulps from pygrad's (see _to_torch)
def test_gradients_equal_torch_orders_1_and_2(recipe, rseed):
  _gradients_equal_torch(recipe, rseed, dtypes.float64)


# CI runs a fixed set of examples (derandomized): about 1 in 4,000 float32 cases differed from torch at order 2 (a
# gradient 0 where torch's was -0.03125, not reproduced yet: likely a tie of MAX that a 1-ulp difference between
# numpy's and torch's float32 forward values makes or breaks); the long mode keeps exploring
@settings(FUZZ, derandomize=not LONG)
@given(recipes(float_inputs="float32"), st.integers(0, 1 << 30))
@example(recipe=_X_OVER_X, rseed=0)
@example(recipe={**_X_OVER_X, "inputs": [((), "float32"), ((1,), "float32"), ((2, 2, 4), "float32")], "seed": 32011},
         rseed=0)  # seed 22 again: torch float32's second gradient 0 (by luck), pygrad's 2, exact 4e-9 at x = 7e-5
def test_float32_gradients_equal_torch_orders_1_and_2(recipe, rseed):
  _gradients_equal_torch(recipe, rseed, dtypes.float32)


def test_float32_comparison_catches_a_gradient_off_the_exact_one():
  # the float64 judge lets rounding noise through (the example above: d2/dx2 of x / x is 0, pygrad 3/512, torch
  # float32 -1/512 at x = 1.76e-3) but not an error: 1% off the exact gradient fails, at order 1 or 2, at x / x's
  # noisy element as at a clean one
  b = build(_X_OVER_X)
  x, = [u for u in b.bufs if u.shape == (2, 3)]
  xv = input_values(_X_OVER_X, b.bufs)[x]
  w = torch.tensor(np.random.default_rng(0).standard_normal((2, 3)))

  def run(k, wide):
    v = torch.tensor((xv * (1 + k * 2.0 ** -22)).astype(np.float32))
    v = v.to(torch.float64 if wide else torch.float32).requires_grad_(True)
    g, = torch.autograd.grad(((v / v).sqrt() * w).sum() + (v * v * w).sum(), v, create_graph=True)
    h, = torch.autograd.grad((g * w).sum(), v)
    return [g], [h]
  (g32,), (h32,) = run(0, False)
  judge = _judge(([g32], [h32]), run, [x])
  exact = [judge(1)[0][0], judge(2)[0][0]]
  for order, theirs in ((1, g32), (2, h32)):
    _compare([exact[order - 1]], [theirs], [x], order, TOL[dtypes.float32], judge)  # the exact value passes
    for at in ((0, 0), (1, 2)):
      wrong = exact[order - 1].copy()
      wrong[at] = wrong[at] * 1.01 + 0.01 * np.abs(wrong).max()
      with pytest.raises(AssertionError, match=f"order {order}"):
        _compare([wrong], [theirs], [x], order, TOL[dtypes.float32], judge)


def test_pow_second_order_at_exponent_zero_equals_torch():
  # fuzz finding: torch masks d/dbase with where(exp == 0, 0, ...), so at exp == 0 d2(b**e)/(db de) is 0 in torch;
  # the seeds' rule gave 1/b, and NaN at b = -1 or +-inf for d2(b**e)/(de db), where torch's is finite (SPEC 4)
  b, e = UOp.placeholder((), dtypes.float64, name="b"), UOp.placeholder((), dtypes.float64, name="e")
  db, de = b.pow(e).gradient(b, e)
  got = pygrad.evaluate([db.gradient(e)[0], de.gradient(b)[0]], {b: np.array(2.0), e: np.array(0.0)}, engine="numpy")
  tb, te = (torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in (2.0, 0.0))
  t1 = torch.autograd.grad(torch.pow(tb, te), [tb, te], create_graph=True)
  want = [torch.autograd.grad(t1[0], te, retain_graph=True)[0].item(), torch.autograd.grad(t1[1], tb)[0].item()]
  assert [float(g) for g in got] == want  # torch: [0.0, 0.5]


@pytest.mark.parametrize("through", ["cast", "idiv", "bitcast_idiv", "bool"])
def test_a_value_through_an_integer_carries_no_gradient(through):
  # fuzz finding: x.cast(int64).cast(float64) had gradient 1 (torch: none, SPEC 4: a CAST to an integer passes no
  # gradient), and an integer op under a cast back to float (x.cast(int64) // 3) raised "failed to compute gradient"
  x = UOp.placeholder((), dtypes.float64)
  i = {"cast": lambda: x.cast(dtypes.int64), "idiv": lambda: x.cast(dtypes.int64) // 3,
       "bitcast_idiv": lambda: x.bitcast(dtypes.int64) // 3, "bool": lambda: x < 1.0}[through]()
  y = i.cast(dtypes.float64) * x
  g, = y.gradient(x)
  xv = np.array(2.5)
  assert float(pygrad.evaluate(g, {x: xv}, engine="numpy")) == float(pygrad.evaluate(i.cast(dtypes.float64), {x: xv},
                                                                                     engine="numpy"))


def test_max_against_nan_gradient_equals_torch():
  # fuzz finding: against a NaN, torch.maximum passes the whole gradient to both operands (its mask is
  # `where(a == b, g / 2, g)` then zero where a < b); the seeds' rule passed none (SPEC 4: torch's value where finite)
  x, y = UOp.placeholder((), dtypes.float64, name="x"), UOp.placeholder((), dtypes.float64, name="y")
  got = pygrad.evaluate(x.maximum(y).gradient(x, y), {x: np.array(1.0), y: np.array(np.nan)}, engine="numpy")
  tx, ty = (torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in (1.0, float("nan")))
  want = [g.item() for g in torch.autograd.grad(torch.maximum(tx, ty), [tx, ty])]
  assert [float(g) for g in got] == want
