"""compute_gradient on the C core: rules stay in Python (pm_gradient is the source of truth), but each rule runs
once per distinct signature of the matched node -- op, dtype, arg, tag, the shape/device of the node, of its
sources and of the incoming gradient -- on placeholder nodes. Its result graph becomes a template program that
csrc/grad.c instantiates, hash-consing every node, for every later node with that signature; the reverse walk and
the accumulation of gradients run in C as well. Nodes that need Python (FUNCTION, CALL, GETTUPLE, TUPLE, MULTI,
AFTER, metadata) are handed back to the same per-node step the direct path runs, so the graphs are node for node
the ones the direct path builds."""
from __future__ import annotations
import os
from collections.abc import Mapping
from .ops import Ops
from .core import CORE
from .uop import UOp, handle
from . import gradient as _g
from . import uop as _uop
from .templates import placeholder as _placeholder, program as _program

if CORE.name != "c": raise ImportError("gradfast needs the C core")
from ._core import ffi, lib  # noqa: E402
from .ids import order  # noqa: E402

# ops whose rule result depends only on the signature: everything but calls, tuples and multi-source ops
FAST_OPS = frozenset(Ops) - {Ops.GETTUPLE, Ops.FUNCTION, Ops.CALL, Ops.TUPLE, Ops.AFTER, Ops.MULTI, Ops.SINK}
_mask = ffi.new("uint8_t[]", [1 if o in FAST_OPS else 0 for o in Ops])
_st = CORE._st
_tc = ffi.gc(lib.pg_tcache_new(_st), lib.pg_tcache_delete)  # (it holds arg ids, and keeps the store alive in C)


def enabled() -> bool:
  """Templates are on unless PYGRAD_GRAD_TEMPLATES=0 (the direct path, for comparisons) or a metadata block is open
  (nodes made there get its metadata, which C instantiation would not attach)."""
  return os.environ.get("PYGRAD_GRAD_TEMPLATES", "1") != "0" and _uop.current_metadata() is None


def _add(key, prog) -> None:
  k = ffi.new("int32_t[]", list(key))
  p = ffi.new("int32_t[]", prog)
  r = lib.pg_tcache_add(_st, _tc, k, len(key), p, len(prog))
  if r < 0: raise RuntimeError(f"pygrad: template rejected by the C core (error {r})")


def _rule_template(key, t0: UOp, ctx: UOp) -> None:
  srcs = [_placeholder(i, s) for i, s in enumerate(t0.src)]
  ret = UOp(t0.op, t0.dtype, tuple(srcs), t0.arg, t0.tag)
  cph = _placeholder(len(srcs), ctx)
  lgrads = _g.pm_gradient.rewrite(ret, ctx=cph)
  try:
    _g.check_rule_result(ret, lgrads)
  except RuntimeError:
    _g.check_rule_result(t0, _g.pm_gradient.rewrite(t0, ctx=ctx))  # the error names the real node
    raise
  parts = {"NODE": [ret], "SRCS": srcs, "GRAD": [cph]}
  inputs = [u for p in order("tpl_rule_inputs") for u in parts[p]]  # grad.c's order
  _add(key, _program(inputs, list(lgrads)))


def _acc_template(key, k: UOp, prev: UOp | None, v: UOp) -> None:
  pp = _placeholder(0, prev) if prev is not None else None
  vp, kp = _placeholder(1, v), _placeholder(2, k)
  out = _g.accumulate(pp, vp, kp)
  parts = {"PREV": [pp] if pp is not None else [], "NEW": [vp], "NODE": [kp]}
  inputs = [u for p in order("tpl_acc_inputs") for u in parts[p]]  # grad.c's order
  _add(key, _program(inputs, [out]))


class GradMap(Mapping):
  """compute_gradient's result on the C core: a read-only mapping node -> gradient over the run's C map, whose
  handles are made on first use (every Mapping method: lookups, iteration, len, ==, keys/items/values)."""
  __slots__ = ("_run",)

  def __init__(self, run):
    self._run = run

  def __getitem__(self, u):
    gid = lib.pg_grad_get(self._run, u._id) if type(u) is UOp else -1
    if gid < 0: raise KeyError(u)
    return handle(gid)

  def __contains__(self, u) -> bool:
    return type(u) is UOp and lib.pg_grad_get(self._run, u._id) >= 0

  def get(self, u, default=None):
    gid = lib.pg_grad_get(self._run, u._id) if type(u) is UOp else -1
    return handle(gid) if gid >= 0 else default

  def __len__(self) -> int: return int(lib.pg_grad_count(self._run))

  def _items(self) -> list[tuple[UOp, UOp]]:
    n = lib.pg_grad_count(self._run)
    ks, vs = ffi.new("int32_t[]", n), ffi.new("int32_t[]", n)
    m = lib.pg_grad_items(self._run, ks, vs, n)
    return [(handle(ks[i]), handle(vs[i])) for i in range(m)]

  def __iter__(self): return iter([k for k, _ in self._items()])

  def __repr__(self) -> str: return f"GradMap({dict(self._items())!r})"


def compute_gradient_fast(root: UOp, root_grad: UOp, targets) -> GradMap:
  """compute_gradient with templates (see the module docstring)."""
  targets = set(targets)
  walk, path_ids = CORE.deepwalk(root._id, [t._id for t in targets])
  wn = walk.numpy()
  p = lib.pg_grad_new(_st, ffi.from_buffer("int32_t[]", wn), len(wn), root._id, root_grad._id, _mask, len(Ops),
                      1 if _uop._md_count else 0)
  if p == ffi.NULL: raise MemoryError("pygrad: cannot start a gradient run")
  run = ffi.gc(p, lib.pg_grad_delete)  # (the run keeps the store alive in C)
  stop = ffi.new("pg_stop *")
  path: set[int] | None = None

  def on_path(u: UOp) -> bool:
    nonlocal path
    if path is None: path = set(path_ids)
    return u._id in path

  def get(u: UOp):
    gid = lib.pg_grad_get(run, u._id)
    return handle(gid) if gid >= 0 else None

  def put(u: UOp, v: UOp) -> None:
    if lib.pg_grad_set(run, u._id, v._id) < 0: raise RuntimeError("pygrad: gradient run rejected a gradient")

  while True:
    r = lib.pg_grad_run(run, _tc, stop)
    if r == lib.PG_GRAD_DONE: break
    if r == lib.PG_GRAD_NEED_RULE:
      _rule_template(ffi.unpack(stop.key, stop.nkey), handle(stop.node), handle(stop.ctx))
    elif r == lib.PG_GRAD_NEED_ACC:
      _acc_template(ffi.unpack(stop.key, stop.nkey), handle(stop.k), handle(stop.prev) if stop.prev >= 0 else None,
                    handle(stop.v))
    elif r == lib.PG_GRAD_PY_STEP:
      _g.step(handle(stop.node), handle(stop.ctx), get, put, targets, on_path)
      lib.pg_grad_skip(run)
    elif r == lib.PG_GRAD_PY_ACC:
      k = handle(stop.k)
      put(k, _g.accumulate(handle(stop.prev) if stop.prev >= 0 else None, handle(stop.v), k))
      lib.pg_grad_consume(run)
    else:
      raise RuntimeError(f"pygrad: gradient run failed in the C core (error {r})")
  return GradMap(run)
