"""A differential fuzzer at the level of the public methods: random valid graphs built by calling pygrad's methods
(elementwise math, comparisons, casts, where, reductions, movement incl. pad/shrink/flip/expand/permute, matmul;
shapes with size-0 and size-1 dims) and, where PyTorch is installed, the same method calls on torch tensors. The
numpy engine, the VM at 1 and at 3 threads, and torch are compared on forward values: the VM's thread counts bit for
bit always, the engines bit for bit where every op is exact (fuzzgraphs.exact_graph), torch exactly on ints and
bools and within the dtype's tolerance on floats (its float16 ops, transcendentals and sum order differ).

The engine fuzzer (fuzzgraphs.py) judges engines against each other on the primitive ops; a derived method that
decomposes into a wrong graph gives the same wrong number on both engines, which only a peer sees (int `//`
truncated where numpy, torch and tinygrad floor). Calls whose peers disagree by documented choice (README "Defined
semantics": the sign of a max of zeros, int division by zero, out-of-range float -> int casts, shifts, int POW,
torch's double rounding into float16/bfloat16) are not made or not compared.

`python tests/fuzzpeers.py [--grad | --grad32] [n_seeds] [first_seed] [steps]` runs seeds and prints each discrepancy
(nice it: it is long); --grad compares gradients of orders 1 and 2 with torch.autograd's instead (grad_run, float64
graphs), --grad32 those of float32 graphs."""
from __future__ import annotations
import math, sys
import numpy as np
import pygrad
from pygrad import UOp, dtypes

try:
  import torch
except ImportError:  # the peer is optional: the engines are still compared with each other
  torch = None

DTS = [dtypes.bool, dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64, dtypes.uint8, dtypes.float16,
       dtypes.bfloat16, dtypes.float32, dtypes.float64, dtypes.uint16, dtypes.uint32, dtypes.uint64]
NO_TORCH = (dtypes.uint16, dtypes.uint32, dtypes.uint64)  # torch's support of these is partial: engines only
TOL = {dtypes.float16: 2e-2, dtypes.bfloat16: 5e-2, dtypes.float32: 2e-4, dtypes.float64: 1e-9}
GRAD_DTS = [None, None, None, dtypes.int32, dtypes.bool]  # grad_run's inputs and casts (None: the float dtype)
UN_F = ["neg", "abs", "relu", "sqrt", "sin", "cos", "exp", "log", "exp2", "log2", "reciprocal", "trunc", "sigmoid",
        "tanh", "sign", "floor", "square"]
UN_I = ["neg", "abs", "sign", "square"]
BIN = ["add", "sub", "mul", "maximum", "minimum", "lt", "le", "gt", "ge", "eq", "ne"]
BIN_F = ["truediv", "pow", "floordiv", "mod"]
BIN_I = ["floordiv", "mod", "and", "or", "xor", "lshift", "rshift", "pow"]


_WIDE = [False]  # grad_run in float32: the twin that judges it runs every float32 op in float64
_MOVE = [0]  # grad_run in float32: torch's float32 inputs moved 2k ulps up (its rounding noise at this point)


def _torch_dtype(dt):
  return torch.float64 if _WIDE[0] and dt is dtypes.float32 else getattr(torch, dt.name)


def _tensor(v, dt):
  t = torch.from_numpy(np.array(v, copy=True))  # ascontiguousarray would make a 0-d array 1-d
  return t.to(_torch_dtype(dt))


class Node:
  """A pygrad node, its torch twin (None when torch is absent or the peer is not comparable here) and the nodes the
  call that made it read."""
  def __init__(self, u, t, srcs=()): self.u, self.t, self.srcs, self.scale, self.prod = u, t, tuple(srcs), None, None


def _values(rng, shape, dt, smooth=False):
  if dtypes.is_float(dt):
    v = rng.standard_normal(shape) * 3
    if smooth: return v.astype(dt.np)  # (gradient mode: no zeros, ties or non-finite values to start from)
    special = np.array([0.0, -0.0, 1.0, -1.0, 0.5, np.inf, -np.inf, np.nan, 1e-3, 100.0])
    v = np.where(rng.random(shape) < 0.2, rng.choice(special, shape), v)
    v = v.astype(np.float32 if dt is dtypes.bfloat16 else dt.np)
    if dt is dtypes.bfloat16: v = torch.from_numpy(v).to(torch.bfloat16).float().numpy() if torch else v
    return v
  if dt is dtypes.bool: return rng.random(shape) < 0.5
  info = np.iinfo(dt.np)
  v = rng.integers(max(info.min, -20), min(info.max, 20), shape, endpoint=True).astype(dt.np)
  return np.where(rng.random(shape) < 0.1, rng.choice(np.array([info.min, info.max], dt.np), shape), v)


def _shape(rng):
  nd = int(rng.integers(0, 4))
  sh = [int(rng.choice([0, 1, 1, 2, 3, 3, 4, 5])) for _ in range(nd)]
  if nd and rng.random() < 0.15:  # one long dim: tile edges, and work the VM's threads split
    sh[int(rng.integers(nd))] = int(rng.choice([1023, 1024, 1025, 4099]))
  return tuple(sh)


class Fuzz:
  """One seed's graph: inputs, then steps that each call one method on pool nodes (and the same on torch). With
  `grad` (float64 or float32), the inputs are mostly of that dtype (torch's leaves require grad), their values are
  ordinary (no zeros, ties or non-finite values to start from) and casts go to it, int32 or bool (see grad_run)."""
  def __init__(self, seed: int, steps: int = 12, grad=None):
    self.rng = np.random.default_rng(seed)
    self.inputs, self.pool, self.grad = {}, [], grad
    for i in range(int(self.rng.integers(1, 4))):
      dt = DTS[int(self.rng.integers(len(DTS)))] if not grad else GRAD_DTS[int(self.rng.integers(len(GRAD_DTS)))] or grad
      sh = _shape(self.rng)
      u = UOp.placeholder(sh, dt, name=f"in{i}")
      v = _values(self.rng, sh, dt, bool(grad))
      self.inputs[u] = v
      t = _tensor(v * (1 + _MOVE[0] * 2.0 ** -22) if dt is grad and _MOVE[0] else v, dt) \
        if torch and dt not in NO_TORCH else None
      if t is not None and dt is grad: t.requires_grad_(True)
      self.pool.append(Node(u, t))
    self.calls = []
    for _ in range(steps):
      n = self._step()
      if n is not None: self.pool.append(n)

  def pick(self, pred=lambda n: True):
    c = [n for n in self.pool if pred(n)]
    return c[int(self.rng.integers(len(c)))] if c else None

  def _step(self):
    r = self.rng
    kind = r.choice(["unary", "binary", "binary", "cast", "where", "reduce", "movement", "movement", "matmul"])
    a = self.pick()
    self._srcs = [a]
    try:
      return getattr(self, "_" + kind)(a, r)
    except (ValueError, TypeError) as e:  # an invalid call the fuzzer made: pygrad must say so, not crash
      if "must" not in str(e) and "expected" not in str(e) and "cannot" not in str(e) and "differ" not in str(e):
        self.calls.append(f"{kind} raised {type(e).__name__}: {e}")
      return None

  def _twin(self, u, t, call):
    self.calls.append(call)
    return Node(u, t, self._srcs)

  def _unary(self, a, r):
    f = dtypes.is_float(a.u.dtype)
    if a.u.dtype is dtypes.bool: return self._twin(a.u.logical_not(), _t(lambda t: ~t, a.t), "logical_not")
    name = str(r.choice(UN_F + (["softmax", "log_softmax"] if a.u.ndim else []) if f else UN_I))
    u = getattr(a.u, name)()
    if name in ("softmax", "log_softmax"):
      tf = lambda t: getattr(torch, name)(t.float() if t.dtype is torch.bfloat16 else t, -1).to(t.dtype)  # noqa
      return self._twin(u, _t(tf, a.t) if a.u.dtype is not dtypes.float16 else None, name)
    tf = {"neg": lambda t: -t, "relu": torch.relu if torch else None, "square": lambda t: t * t,
          "reciprocal": torch.reciprocal if torch else None}.get(name) or (lambda t: getattr(torch, name)(t))
    # torch has no int8/int16 neg of MIN issue (it wraps as pygrad does); abs/sign of ints are exact in both
    # torch's sign(NaN) is 0; numpy's, JAX's, tinygrad's and pygrad's are NaN: no peer there
    return self._twin(u, _t(tf, a.t) if not (f and name == "sign") else None, name)

  def _binary(self, a, r):
    f, b_ = dtypes.is_float(a.u.dtype), a.u.dtype is dtypes.bool
    names = BIN + (BIN_F if f else [] if b_ else BIN_I) + (["and", "or", "xor"] if b_ else [])
    if b_: names = [n for n in names if n not in ("sub",)]
    name = str(r.choice(names))
    # gradients: no x / x, whose derivatives are rounding noise (eps / x**2 at order 2) in pygrad and torch alike,
    # which a later matmul magnifies past any tolerance (seeds 835413 --grad32, 902950 --grad)
    same_ok = not (self.grad and name == "truediv")
    b = self.pick(lambda n: n.u.dtype is a.u.dtype and (n.u.shape == a.u.shape or n.u.shape == ()) and
                  (same_ok or n.u is not a.u))
    if b is None or r.random() < 0.25:
      v = _values(r, (), a.u.dtype, bool(self.grad)).item()
      b = Node(UOp.const(v, a.u.dtype), _tensor(np.asarray(v, np.float32 if a.u.dtype is dtypes.bfloat16
                                                            else a.u.dtype.np), a.u.dtype) if torch else None)
    self._srcs.append(b)
    peer = a.t is not None and b.t is not None
    if name in ("floordiv", "mod") and not f:
      # int division by zero is defined here (0) and an error in torch; MIN // -1 overflows in both
      peer = peer and not bool((b.t == 0).any()) and not bool((b.t == -1).any())
    if name == "mod" and a.u.dtype is dtypes.float64 and peer:
      # float64 % is exact only for |a / b| < 2**99 (README): past that it is NaN (seed 724612: 2**255 %
      # 255 was 0 here, 128 in torch and numpy)
      at, bt = torch.broadcast_tensors(a.t, b.t)
      peer = not bool((torch.isfinite(at) & (bt != 0) & (at.abs() >= bt.abs() * 2.0 ** 99)).any())
    if name == "pow": peer = peer and a.u.dtype in (dtypes.float32, dtypes.float64)
    if name in ("lshift", "rshift"):  # counts past the width are defined here, UB in C and torch: engines only
      b, peer = Node(a.u.const_like(int(r.integers(0, 8 * a.u.dtype.itemsize))), None), False
    ops = {"add": ("__add__", torch.add if torch else None), "sub": ("__sub__", torch.sub if torch else None),
           "mul": ("__mul__", torch.mul if torch else None), "maximum": ("maximum", torch.maximum if torch else None),
           "minimum": ("minimum", torch.minimum if torch else None), "lt": ("__lt__", torch.lt if torch else None),
           "le": ("__le__", torch.le if torch else None), "gt": ("__gt__", torch.gt if torch else None),
           "ge": ("__ge__", torch.ge if torch else None), "eq": ("eq", torch.eq if torch else None),
           "ne": ("ne", torch.ne if torch else None), "truediv": ("__truediv__", torch.div if torch else None),
           "pow": ("pow", torch.pow if torch else None),
           "floordiv": ("__floordiv__", torch.floor_divide if torch else None),
           "mod": ("__mod__", torch.remainder if torch else None),
           "and": ("__and__", torch.bitwise_and if torch else None),
           "or": ("__or__", torch.bitwise_or if torch else None),
           "xor": ("__xor__", torch.bitwise_xor if torch else None), "lshift": ("__lshift__", None),
           "rshift": ("__rshift__", None)}
    m, tf = ops[name]
    if name == "floordiv" and f and self.grad: tf = lambda x, y: torch.floor(x / y)  # noqa: E731 (torch's floor_divide
    # has no derivative; floor's is 0, as pygrad's `//`)
    u = getattr(a.u, m)(b.u)
    t = _t(lambda x, y: tf(x, y), a.t, b.t) if peer else None
    if t is not None and t.dtype != _torch_dtype(u.dtype): t = t.to(_torch_dtype(u.dtype))
    return self._twin(u, t, name)

  def _cast(self, a, r):
    dt = DTS[int(r.integers(len(DTS)))] if not self.grad else GRAD_DTS[int(r.integers(len(GRAD_DTS)))] or self.grad
    if r.random() < 0.2 and a.u.dtype is not dtypes.bool and not self.grad:  # a bitcast to a type of the same size: engines only
      same = [d for d in DTS if d.itemsize == a.u.dtype.itemsize and d is not dtypes.bool]
      d = same[int(r.integers(len(same)))]
      if dtypes.is_float(a.u.dtype):
        # a NaN's payload and sign are not specified (fuzzgraphs: a transcendental's NaN differs by engine)
        x = a.u.ne(a.u).where(a.u.const_like(0.0), a.u)
        from fuzzgraphs import exact_graph
        if not exact_graph(x):  # an inexact value's bits may differ by an ulp: bitcast there and back
          return self._twin(x.bitcast(d).bitcast(a.u.dtype), None, f"bitcast {d.name} and back")
        return self._twin(x.bitcast(d), None, f"bitcast {d.name}")
      return self._twin(a.u.bitcast(d), None, f"bitcast {d.name}")
    src = a.u.dtype
    peer = a.t is not None
    if dtypes.is_float(src) and dtypes.is_int(dt): peer = False  # out-of-range and NaN -> int: UB in torch
    if dt in (dtypes.float16, dtypes.bfloat16) and (src is dtypes.float64 or dtypes.is_int(src)):
      peer = False  # torch rounds twice (README)
    return self._twin(a.u.cast(dt), a.t.to(_torch_dtype(dt)) if peer else None, f"cast {dt.name}")

  def _where(self, a, r):
    c = self.pick(lambda n: n.u.dtype is dtypes.bool and n.u.shape == a.u.shape)
    b = self.pick(lambda n: n.u.dtype is a.u.dtype and n.u.shape == a.u.shape)
    if c is None or b is None: return None
    self._srcs += [c, b]
    t = torch.where(c.t, a.t, b.t) if None not in (c.t, a.t, b.t) else None
    return self._twin(c.u.where(a.u, b.u), t, "where")

  def _reduce(self, a, r):
    nd = a.u.ndim
    axes = tuple(i for i in range(nd) if r.random() < 0.5) or None
    keep = bool(r.random() < 0.5)
    names = ["sum", "prod", "max", "min"] + (["mean"] if dtypes.is_float(a.u.dtype) else [])
    name = str(r.choice(names))
    if name == "prod" and self.grad and math.prod(a.u.shape[i] for i in (axes if axes is not None else range(nd))) > 256:
      # a product of 257+ normals may overflow: its gradient of order 2 is then inf * 0 in the prefix products where
      # others are 0 (NaN, torch's 0); order 1 is exact there (rules._others_product). Not compared
      name = "sum"
    empty = any(a.u.shape[i] == 0 for i in (axes if axes is not None else range(nd)))
    if name in ("max", "min") and empty: return None  # a max over nothing: -inf here, an error in numpy and torch
    u = getattr(a.u, name)(axis=axes, keepdim=keep)
    n = self._twin(u, _t(lambda x: self._treduce(x, a.u, u, name, axes, keep), a.t), f"{name} {axes} keepdim={keep}")
    if name in ("sum", "mean") and dtypes.is_float(a.u.dtype) and n.t is not None:
      # a float sum's rounding error scales with the sum of the magnitudes, not with the result: float32 [2**31,
      # -2**31, ...] sums to 0.1 exactly, to -0.0167 here and in numpy (sequential), to 0.217 in torch (pairwise)
      with np.errstate(all="ignore"):
        mag = np.abs(_np(a.t).astype(np.float64))
        count = max(1, math.prod(mag.shape[i] for i in (axes if axes is not None else range(mag.ndim))))
        n.scale = (mag.sum(axis=axes, keepdims=keep) if mag.ndim else mag) / (count if name == "mean" else 1)
    if name == "prod" and dtypes.is_float(a.u.dtype) and a.u.ndim:
      # a float product of finite entries one of which is 0 is 0 on both engines, even where the others' partial
      # products overflow (README "Defined semantics"); torch's vectors may meet the zero after an inf and give NaN
      # (0 * inf). run() finds the groups whose exact product is 0 (_zero_groups)
      n.prod = (a, axes, keep)
    return n

  @staticmethod
  def _treduce(x0, au, u, name, axes, keep):
    nd = au.ndim
    dims = axes if axes is not None else tuple(range(nd))
    x = x0
    if name in ("sum", "prod") and not dtypes.is_float(au.dtype): x = x.to(torch.int64)
    # pygrad's half reductions accumulate in float32 (README); torch's float16 prod accumulates in float16 (seed 62490:
    # 100 * ... overflowed to inf, times the one 0: NaN, where the product is 0)
    if name == "prod" and x.dtype in (torch.float16, torch.bfloat16): x = x.float()
    if name == "sum": t = x.sum(dim=dims, keepdim=keep) if nd else x
    elif name == "mean": t = x.float().mean(dim=dims, keepdim=keep).to(x.dtype) if nd else x
    elif name == "prod": t = _prod(x, dims, keep)
    elif name == "max": t = x.amax(dim=dims, keepdim=keep) if nd else x
    else: t = x.amin(dim=dims, keepdim=keep) if nd else x
    if name == "mean" and x0.dtype is torch.float64: t = x0.mean(dim=dims, keepdim=keep) if nd else x0
    return t.to(_torch_dtype(u.dtype)) if u.dtype is not dtypes.uint32 else None  # torch's uint32 is partial

  def _movement(self, a, r):
    sh, nd = a.u.shape, a.u.ndim
    k = int(r.integers(6))
    if k == 0:
      new = (math.prod(sh),) if r.random() < 0.5 else sh + (1,)
      return self._twin(a.u.reshape(new), _t(lambda t: t.reshape(new), a.t), f"reshape {new}")
    if k == 1:
      n = int(r.integers(0, 3))
      new = (n,) + sh
      return self._twin(a.u.reshape((1,) + sh).expand(new), _t(lambda t: t.reshape((1,) + sh).expand(new), a.t),
                        f"expand {new}")
    if nd == 0: return None
    if k == 2:
      p = tuple((int(r.integers(3)), int(r.integers(3))) for _ in range(nd))
      flat = tuple(x for pr in reversed(p) for x in pr)
      tf = lambda t: torch.nn.functional.pad(t.float() if t.dtype is torch.bool else t, flat).to(t.dtype)  # noqa
      return self._twin(a.u.pad(p), _t(tf, a.t), f"pad {p}")
    if k == 3:
      b = []
      for s in sh:
        lo = int(r.integers(0, s + 1))
        b.append((lo, int(r.integers(lo, s + 1))))
      sl = tuple(slice(lo, hi) for lo, hi in b)
      return self._twin(a.u.shrink(tuple(b)), _t(lambda t: t[sl], a.t), f"shrink {b}")
    if k == 4:
      perm = tuple(int(i) for i in r.permutation(nd))
      return self._twin(a.u.permute(perm), _t(lambda t: t.permute(perm), a.t), f"permute {perm}")
    axes = tuple(i for i in range(nd) if r.random() < 0.5) or (0,)
    return self._twin(a.u.flip(axes), _t(lambda t: t.flip(axes), a.t), f"flip {axes}")

  def _matmul(self, a, r):
    if a.u.ndim == 0 or a.u.dtype is dtypes.bool: return None
    k = a.u.shape[-1]
    b = self.pick(lambda n: n.u.dtype is a.u.dtype and n.u.ndim in (1, 2) and n.u.shape[0] == k)
    if b is None: return None
    if a.u.numel * (b.u.shape[-1] if b.u.ndim == 2 else 1) > 1 << 24:  # the numpy engine (and torch's double backward)
      return None  # hold the (m, k, n) product: 1028**3 took 4 GiB, torch 17 GB at 40 steps (seeds 52901, 60000+)
    self._srcs.append(b)
    peer = a.t is not None and b.t is not None and a.u.dtype in (dtypes.float32, dtypes.float64, dtypes.int64,
                                                                 dtypes.int32)
    t = torch.matmul(a.t, b.t) if peer else None
    return self._twin(a.u @ b.u, t, "matmul")


def _t(fn, *ts):
  if torch is None or any(t is None for t in ts): return None
  try:
    return fn(*ts)
  except RuntimeError:  # an op torch lacks for this dtype: no peer for this node
    return None


def _prod(x, dims, keep):
  for d in sorted(dims, reverse=True): x = x.prod(dim=d, keepdim=keep)
  return x


def _np(t):
  if t.dtype is torch.bfloat16: t = t.float()
  return t.detach().numpy()


def _evaluate(outs, inputs, engine, threads):
  old = pygrad.get_num_threads()
  pygrad.set_num_threads(threads)
  try: return pygrad.evaluate(outs, inputs, engine=engine)
  finally: pygrad.set_num_threads(old)


def _tol_dtype(u: UOp):
  """The float dtype whose tolerance judges u: the least precise float computed under it (an inexact float32 exp
  cast to float64 is float32-accurate)."""
  fl = [n.dtype for n in u.toposort() if dtypes.is_float(n.dtype)]
  return max(fl, key=lambda d: TOL[d]) if fl else u.dtype


def compare(a, b, dt, exact: bool, zero_sign: bool = True, tol_dt=None) -> str | None:
  """None if equal (bit for bit when exact, NaN equal to NaN; else within the tolerance of tol_dt, by default dt),
  else where not."""
  a, b = np.asarray(a), np.asarray(b)
  if a.shape != b.shape: return f"shapes {a.shape} vs {b.shape}"
  if not dtypes.is_float(dt):
    return None if np.array_equal(a, b) else f"{a.reshape(-1)[:6].tolist()} vs {b.reshape(-1)[:6].tolist()}"
  a64, b64 = a.astype(np.float64), b.astype(np.float64)
  na, nb = np.isnan(a64), np.isnan(b64)
  same = (a64 == b64) & ((np.signbit(a64) == np.signbit(b64)) | (not zero_sign))
  if not exact:
    with np.errstate(all="ignore"):
      big = np.maximum(1.0, np.max(np.abs(np.where(np.isfinite(b64), b64, 0)), initial=0))
      same |= np.isfinite(a64) & np.isfinite(b64) & (np.abs(a64 - b64) <= TOL[tol_dt or dt] * (np.abs(b64) + big))
  ok = (na & nb) | same
  if ok.all(): return None
  i = tuple(np.argwhere(~ok)[0])
  return f"at {i}: {a[i]!r} vs {b[i]!r}"


def _zero_groups(n: Node, value):
  """Where a float prod n (Node.prod: its source, axes, keepdim) is exactly 0 (a zero entry, every entry finite),
  given value(source node): the numpy engine's value of it; None for any other node."""
  if n.prod is None: return None
  src, axes, keep = n.prod
  with np.errstate(all="ignore"):
    v = np.asarray(value(src), np.float64)
    return (v == 0).any(axis=axes, keepdims=keep) & np.isfinite(v).all(axis=axes, keepdims=keep)


def _known_prod(a, ref, zero):
  """torch's value a, with ref's where a float prod's exact value is 0 (zero, from _zero_groups), ref is 0 and a is
  NaN (see Fuzz._reduce: torch's product may overflow before it meets the zero)."""
  if zero is None: return a
  a, ref = np.asarray(a), np.asarray(ref)
  with np.errstate(all="ignore"):
    known = zero & np.isnan(a) & (ref == 0)
  if not known.any(): return a  # (the same object: the caller checks)
  KNOWN[0] += int(known.sum())
  return np.where(known, ref, a).astype(a.dtype)


KNOWN = [0]  # torch values _known_prod let pass


def run(seed: int, steps: int = 12) -> list[str]:
  """The discrepancies of one seed. Every node made is evaluated on each engine: the VM's thread counts must agree
  bit for bit, the VM with the numpy engine bit for bit where the node's graph is exact (else within tolerance).
  Each node with a torch twin is compared with it: equal, or (floats) within tolerance, or its call's sources
  already differed from torch's (a difference the call magnifies, as cos of 1248 vs 1240, is not this call's)."""
  from fuzzgraphs import exact_graph
  fz = Fuzz(seed, steps)
  bad = [f"seed {seed}: {c}" for c in fz.calls if "raised" in c]
  nodes = fz.pool[len(fz.inputs):]
  if not nodes: return bad
  outs = [n.u for n in nodes]
  res = {}
  for eng, th in (("numpy", 1), ("c", 1), ("c", 3)):
    if eng == "c" and pygrad.core_name() != "c": continue
    try: res[(eng, th)] = _evaluate(outs, fz.inputs, eng, th)
    except Exception as e:  # noqa: BLE001 -- a valid graph that raises is a finding
      bad.append(f"seed {seed}: {eng}@{th} raised {type(e).__name__}: {e}")
  if bad: return bad + [f"  calls: {fz.calls}"]
  ref = res[("numpy", 1)]
  at = {id(n): i for i, n in enumerate(nodes)}
  zeros = [_zero_groups(n, lambda s: ref[at[id(s)]] if id(s) in at else fz.inputs[s.u]) for n in nodes]
  same_as_torch = {id(n): n.t is not None for n in fz.pool[:len(fz.inputs)]}
  apart: set = set()  # nodes whose VM value is not the numpy engine's bit for bit (an inexact graph's rounding)
  for i, (n, o) in enumerate(zip(nodes, outs)):
    ex, tdt = exact_graph(o), _tol_dtype(o)
    srcs_apart = any(id(s) in apart for s in n.srcs)
    if zeros[i] is not None and np.isnan(np.asarray(ref[i], np.float64)[zeros[i]]).any():
      bad.append(f"seed {seed} node {i} ({fz.calls[i]}): NaN where the product has a zero entry and no inf or NaN")
    for key, vals in res.items():
      if key == ("numpy", 1): continue
      v = vals[i]
      why = compare(v, ref[i], o.dtype, ex, tol_dt=tdt)
      # sources apart within tolerance: a call that magnifies it is not to blame (seed 42221: a float32 sum 1.131298e32
      # here, 1.1313064e32 on the VM, as torch's; its % 5.448981 is then 4.05 against 0.028)
      if why and srcs_apart: why = None
      if key == ("c", 1) and compare(v, ref[i], o.dtype, True) is not None: apart.add(id(n))
      if key == ("c", 3) and why is None: why = compare(vals[i], res[("c", 1)][i], o.dtype, True)
      if why: bad.append(f"seed {seed} node {i} ({fz.calls[i]}) {o.dtype} {o.shape}: {key} vs numpy engine {why}")
    same_as_torch[id(n)] = False
    if n.t is None: continue
    tv = _np(n.t)
    if tv.shape != tuple(o.shape):
      bad.append(f"seed {seed} node {i} ({fz.calls[i]}): torch shape {tv.shape} vs {o.shape}")
      continue
    if not dtypes.is_float(o.dtype): tv = tv.astype(ref[i].dtype)
    tk = _known_prod(tv, ref[i], zeros[i])
    if tk is not tv: continue  # (not the same as torch's: later calls are not blamed)
    if compare(ref[i], tv, o.dtype, True, zero_sign=False) is None:
      # a zero of the other sign is no finding here (README: +0 is above -0 in max, relu included, where torch keeps
      # the first operand), but a later 1/x or log makes it +-inf: only the same signs let later calls be blamed
      same_as_torch[id(n)] = compare(ref[i], tv, o.dtype, True) is None
      continue
    srcs_same = all(same_as_torch.get(id(s), True) for s in n.srcs)
    why = compare(ref[i], tv, o.dtype, not dtypes.is_float(o.dtype), zero_sign=False, tol_dt=tdt)
    if why and n.scale is not None:  # a float sum or mean: within the dtype's tolerance of the magnitudes' sum
      with np.errstate(all="ignore"):
        d = np.abs(np.asarray(ref[i], np.float64) - tv.astype(np.float64))
        fine = (d <= TOL[tdt] * n.scale) | (np.isnan(d) & np.isnan(np.asarray(ref[i], np.float64)) & np.isnan(tv))
      if fine.all(): why = None
    if why and srcs_same: bad.append(f"seed {seed} node {i} ({fz.calls[i]}) {o.dtype} {o.shape}: vs torch {why}")
  return bad + ([f"  calls: {fz.calls}"] if bad else [])


def _forward_agrees(fz, ref) -> bool:
  """Whether every node with a torch twin has torch's value (within tolerance on floats, exactly otherwise): only then
  do the two gradients differentiate the same function (a comparison or floor one ulp apart takes another branch)."""
  for n, v in zip(fz.pool[len(fz.inputs):], ref):
    if n.t is None: continue
    tv = _np(n.t)
    if tv.shape != tuple(n.u.shape): return False
    if not dtypes.is_float(n.u.dtype): tv = tv.astype(v.dtype)
    if compare(v, tv, n.u.dtype, not dtypes.is_float(n.u.dtype), zero_sign=False, tol_dt=_tol_dtype(n.u)): return False
  return True


GRAD_TOL = 1e-6  # float64 gradients, relative to the larger of |torch's| and its largest finite magnitude


def _twins(fz, dt):
  """(fz, the `dt` inputs with a torch twin, the `dt` nodes whose twin requires grad): grad_run's targets and loss."""
  return fz, [n for n in fz.pool[:len(fz.inputs)] if n.u.dtype is dt and n.t is not None], \
    [n for n in fz.pool[len(fz.inputs):] if n.u.dtype is dt and n.t is not None and n.t.requires_grad]


def _torch_grads(fz, xs, outs, ws, vs, wv):
  """torch.autograd's gradients of orders 1 and 2 of grad_run's loss (its weights in the twin's dtype)."""
  leaves = [x.t for x in xs]
  def w(k): return torch.from_numpy(wv[k]).to(leaves[0].dtype)
  tloss = sum(((n.t * w(k)).sum() for n, k in zip(outs, ws)))
  t1 = torch.autograd.grad(tloss, leaves, create_graph=True, allow_unused=True)
  tl2 = [(g * w(k)).sum() for g, k in zip(t1, vs) if g is not None and g.requires_grad]
  t2 = torch.autograd.grad(sum(tl2), leaves, allow_unused=True) if tl2 else [None] * len(leaves)
  return [np.zeros(x.u.shape) if t is None else t.detach().numpy(force=True).astype(np.float64)
          for t, x in zip(list(t1) + list(t2), xs + xs)]


def _judged(g, w64, w32s=(), mine=(), tol: float = GRAD_TOL) -> str | None:
  """Where torch's float64 gradient w64 is finite, whether pygrad's g is within tol of it (relative to |w64| and to
  its largest finite magnitude). float32 (w32s, mine given; tol GRAD_TOL32) adds GRAD_SLACK32 times the rounding
  noise at this element: the larger of torch float32's error (w32s, against the graph run in float64) and of how much
  pygrad's own value moves (mine), over runs at the inputs moved 0, 2, 4 and 6 ulps: a gradient of x / x at a small x
  is rounding noise ~eps / x**2, which either float32 computation may cancel to 0."""
  ok = np.isfinite(w64)
  scale = np.abs(w64[ok]).max(initial=1.0)
  with np.errstate(invalid="ignore"):  # (inf - inf)
    noise = np.zeros(w64.shape)
    for w32 in w32s: noise = np.fmax(noise, np.where(np.isfinite(w32), np.abs(w32 - w64), np.inf))
    for m in mine[1:]: noise = np.fmax(noise, np.abs(np.asarray(m, np.float64) - mine[0]))
    bad = ok & ~(np.abs(g - w64) <= GRAD_SLACK32 * noise + tol * (np.abs(w64) + scale))
  if not bad.any(): return None
  i = tuple(np.argwhere(bad)[0])
  if not w32s: return f"at {i}: {g[i]!r} vs torch {w64[i]!r}"
  return f"at {i}: {g[i]!r} vs torch float64 {w64[i]!r} (float32 {w32s[0][i]!r}, its error up to {noise[i]:.3g})"


GRAD_SLACK32, GRAD_TOL32 = 16.0, 1e-4  # (test_fuzz_grad: 2e-3; x / x at order 2 differs by an ulp of 1 / x**2)


def grad_run(seed: int, steps: int = 12, dt=dtypes.float64) -> list[str]:
  """The gradient discrepancies of one seed (SPEC 4: gradients agree with torch.autograd's wherever torch's are
  finite). A graph of method calls over inputs of the float dtype `dt` (Fuzz with grad=dt); the loss is the sum of
  every `dt` node with a torch twin times random weights; its gradients of orders 1 and 2 with respect to the `dt`
  inputs are evaluated on the numpy engine and the VM at 1 and 3 threads, and compared with torch.autograd.grad's
  where torch's forward values agree with pygrad's (else the functions differ: the forward fuzzer's finding, not
  this). float64: within GRAD_TOL. float32: against torch's gradients of the same graph run in float64, within
  GRAD_SLACK32 times torch float32's own error there (_judged): two float32 computations differ by their roundings,
  which the graph may magnify."""
  fz, xs, outs = _twins(Fuzz(seed, steps, grad=dt), dt)
  bad = [f"seed {seed}: {c}" for c in fz.calls if "raised" in c]
  nodes = fz.pool[len(fz.inputs):]
  if torch is None or not xs or not outs or bad: return bad
  ref = _evaluate([n.u for n in nodes], fz.inputs, "numpy", 1)
  if not _forward_agrees(fz, ref): return []
  # where a forward value is NaN or inf, torch's gradients of order 2 may be finite where its order 1 is not (its
  # double backward treats floor(a / b) of `%` as a constant): those points are the corner tests' (as test_fuzz_grad)
  if not all(np.isfinite(v).all() for n, v in zip(nodes, ref) if n.u.dtype is dt): return []
  # an empty node: a scalar broadcast over it gets an empty sum (0) times its own local derivative, NaN where that is
  # infinite (d/db of sum(a / b) at b = 0, a empty: -0 * inf), where torch computes on the broadcast shape, empty, and
  # gets 0. A documented difference (README, Defined semantics), not compared
  if any(0 in n.u.shape for n in nodes): return []
  wide = None
  if dt is not dtypes.float64:  # the same calls, torch's twin in float64 (pygrad's graph is the same, hash-consed)
    _WIDE[0] = True
    try: fzw = Fuzz(seed, steps, grad=dt)
    finally: _WIDE[0] = False
    if not _forward_agrees(fzw, ref): return []  # a comparison or floor that float32 rounding moves
    wide = fzw
  rng = np.random.default_rng(seed + (1 << 40))
  ws = [UOp.placeholder(n.u.shape, dt, name=f"w{i}") for i, n in enumerate(outs)]
  vs = [UOp.placeholder(x.u.shape, dt, name=f"v{i}") for i, x in enumerate(xs)]
  wv = {w: rng.standard_normal(w.shape).astype(dt.np) for w in ws + vs}
  loss = sum(((n.u * w).sum() for n, w in zip(outs, ws)), UOp.const(0.0, dt))
  g1 = loss.gradient(*[x.u for x in xs])
  loss2 = sum(((g * v).sum() for g, v in zip(g1, vs)), UOp.const(0.0, dt))
  g2 = loss2.gradient(*[x.u for x in xs])
  vals = {**fz.inputs, **wv}
  got = {}
  for eng, th in (("numpy", 1), ("c", 1), ("c", 3)):
    if eng == "c" and pygrad.core_name() != "c": continue
    try: got[(eng, th)] = _evaluate(g1 + g2, vals, eng, th)
    except Exception as e:  # noqa: BLE001 -- a gradient that does not run is a finding
      return [f"seed {seed}: gradient on {eng}@{th} raised {type(e).__name__}: {e}", f"  calls: {fz.calls}"]
  want = _torch_grads(fz, xs, outs, ws, vs, wv)
  if wide is not None:
    want64, runs, mine = _torch_grads(*_twins(wide, dt), ws, vs, wv), [want], [got[("numpy", 1)]]
    for k in (1, 2, 3):
      _MOVE[0] = k
      try: moved = Fuzz(seed, steps, grad=dt)
      finally: _MOVE[0] = 0
      runs.append(_torch_grads(*_twins(moved, dt), ws, vs, wv))
      mv = {x.u: (fz.inputs[x.u] * (1 + k * 2.0 ** -22)).astype(dt.np) for x in xs}
      mine.append(_evaluate(g1 + g2, {**vals, **mv}, "numpy", 1))
  for key, vals_ in got.items():
    for k, (g, w) in enumerate(zip(vals_, want)):
      order, x = 1 + k // len(xs), xs[k % len(xs)]
      g = np.asarray(g, np.float64)
      why = _judged(g, w) if wide is None else _judged(g, want64[k], [r[k] for r in runs],
                                                            [np.asarray(m[k], np.float64) for m in mine], GRAD_TOL32)
      if why: bad.append(f"seed {seed} order {order} d/d{x.u.arg[3] if x.u.arg else k} ({dt.name}) on {key}: {why}")
  return bad + ([f"  calls: {fz.calls}"] if bad else [])


if __name__ == "__main__":
  grad = "--grad" in sys.argv or "--grad32" in sys.argv
  gdt = dtypes.float32 if "--grad32" in sys.argv else dtypes.float64
  argv = [a for a in sys.argv if a not in ("--grad", "--grad32")]
  n = int(argv[1]) if len(argv) > 1 else 1000
  first = int(argv[2]) if len(argv) > 2 else 0
  steps = int(argv[3]) if len(argv) > 3 else 12
  found = 0
  for s in range(first, first + n):
    out = grad_run(s, steps, gdt) if grad else run(s, steps)
    if out:
      found += 1
      print("\n".join(out), flush=True)
  print(f"{n} seeds, {found} with discrepancies" + (f"; {KNOWN[0]} torch values NaN where the product is 0 "
                                                    f"(its product overflowed before the zero) passed" if KNOWN[0] else ""))
