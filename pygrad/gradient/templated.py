"""The C driver (on a core with gradient runs, the C core): rules stay in Python (the rule set is the source of
truth), but each rule runs once per distinct signature of the matched node -- op, dtype, arg, tag, the
shape/device of the node, of its sources and of the incoming gradient -- on placeholder nodes. Its result graph
becomes a template program that the core instantiates, hash-consing every node, for every later node with that
signature; the reverse walk and the accumulation of gradients run in C as well. Nodes that need Python
(rules.PY_NODE_OPS, gradients of rules.PY_GRAD_OPS) are handed back to the direct driver's `step`, so the
graphs are node for node the ones the direct driver builds. A node's metadata is carried onto its rule's result in
C, as the direct driver's step does it; C asks here (NEED_META) only what a merge of two metadata tuples gives,
once per distinct pair in a run. Templates belong to the rule set that made them (a cache per rule set) and the
cache holds at most LIMIT of them, dropping the least recently used."""
from __future__ import annotations
import os, threading
from collections.abc import Mapping
from ..ops import Ops
from ..core import CORE, ArgGone
from ..intern import ARGS
from ..uop import UOp, handle
from .. import uop as _uop
from ..templates import placeholder as _placeholder, program as _program
from ..ids import order
from .rules import PY_NODE_OPS, PY_GRAD_OPS, accumulate, check_rule_result
from .direct import step, path_test, backward_metadata

LIMIT = 16384  # templates per cache: a few hundred cover a model; past it the least recently used go
_PY_NODE = bytes(1 if o in PY_NODE_OPS else 0 for o in Ops)
_PY_GRAD = bytes(1 if o in PY_GRAD_OPS else 0 for o in Ops)
_cache: dict = {"rules": None, "tc": None}  # tc: the templates of the rule set `rules` (matcher, accumulate)
_lock = threading.Lock()


def enabled() -> bool:
  """Templates are on unless PYGRAD_GRAD_TEMPLATES=0 (the direct path, for comparisons) or a metadata block is open
  (every node the rules make there, kept or not, gets the block's metadata, which C instantiation would not attach;
  metadata that nodes carry is carried in C)."""
  return os.environ.get("PYGRAD_GRAD_TEMPLATES", "1") != "0" and _uop.current_metadata() is None


def template_cache(pm, limit: int | None = None):
  """The template cache of the rule set `pm` (with this module's `accumulate`): a new, empty one when the rule set
  is not the one the current cache was made for, or when `limit` is given (tests bound it)."""
  rules = (pm, accumulate)
  with _lock:
    c = _cache
    old = c["rules"]
    if limit is not None or old is None or old[0] is not pm or old[1] is not accumulate:
      c["tc"], c["rules"] = CORE.template_cache(LIMIT if limit is None else limit), rules
    return c["tc"]


def _rule_template(tc, key, t0: UOp, ctx: UOp, pm) -> None:
  srcs = [_placeholder(i, s) for i, s in enumerate(t0.src)]
  ret = UOp(t0.op, t0.dtype, tuple(srcs), t0.arg, t0.tag)
  cph = _placeholder(len(srcs), ctx)
  lgrads = pm.rewrite(ret, ctx=cph)
  try:
    check_rule_result(ret, lgrads)
  except RuntimeError:
    check_rule_result(t0, pm.rewrite(t0, ctx=ctx))  # the error names the real node
    raise
  parts = {"NODE": [ret], "SRCS": srcs, "GRAD": [cph]}
  inputs = [u for p in order("tpl_rule_inputs") for u in parts[p]]  # the core's order (csrc/tables.h)
  tc.add(key, _program(inputs, list(lgrads)))


def _acc_template(tc, key, k: UOp, prev: UOp | None, v: UOp) -> None:
  pp = _placeholder(0, prev) if prev is not None else None
  vp, kp = _placeholder(1, v), _placeholder(2, k)
  out = accumulate(pp, vp, kp)
  parts = {"PREV": [pp] if pp is not None else [], "NEW": [vp], "NODE": [kp]}
  inputs = [u for p in order("tpl_acc_inputs") for u in parts[p]]  # the core's order (csrc/tables.h)
  tc.add(key, _program(inputs, [out]))


def _merge_metadata(run, md: int, cur: int) -> None:
  """Answer NEED_META: the pdata id of metadata `cur` (0: none) with the backward copies of `md` merged in, as
  direct.step attaches them."""
  merged = _uop.merge_metadata(ARGS.objs[cur] or (), backward_metadata(ARGS.objs[md]))
  while True:
    pid = ARGS.get(merged)
    try:
      run.meta_add(md, cur, pid)
      return
    except ArgGone:  # drained between interning and the run's hold: intern it again
      ARGS.forget(pid)


class GradMap(Mapping):
  """compute_gradient's result on the C driver: a read-only mapping node -> gradient over the run's C map, whose
  handles are made on first use (every Mapping method: lookups, iteration, len, ==, keys/items/values)."""
  __slots__ = ("_run",)

  def __init__(self, run):
    self._run = run

  def __getitem__(self, u):
    gid = self._run.get(u._id) if type(u) is UOp else -1
    if gid < 0: raise KeyError(u)
    return handle(gid)

  def __contains__(self, u) -> bool:
    return type(u) is UOp and self._run.get(u._id) >= 0

  def get(self, u, default=None):
    gid = self._run.get(u._id) if type(u) is UOp else -1
    return handle(gid) if gid >= 0 else default

  def __len__(self) -> int: return len(self._run)

  def __iter__(self): return iter([handle(k) for k, _ in self._run.items()])

  def __repr__(self) -> str: return f"GradMap({ {handle(k): handle(v) for k, v in self._run.items()}!r})"


def walk(root: UOp, root_grad: UOp, targets, pm, enter_calls: bool):
  """compute_gradient with templates, as a generator (see rules.call_gradient) returning a GradMap."""
  targets = set(targets)
  wk, path_ids = CORE.deepwalk(root._id, [t._id for t in targets], enter_calls)
  tc = template_cache(pm)
  run = CORE.grad_run(wk, root._id, root_grad._id, _PY_NODE, _PY_GRAD, bool(_uop._md_count))
  stop, on_path = run.stop, path_test(path_ids)
  DONE, NEED_RULE, NEED_ACC, PY_STEP, NEED_META = run.DONE, run.NEED_RULE, run.NEED_ACC, run.PY_STEP, run.NEED_META

  def get(u: UOp):
    gid = run.get(u._id)
    return handle(gid) if gid >= 0 else None

  def put(u: UOp, v: UOp) -> None: run.set(u._id, v._id)

  while True:
    r = run.resume(tc)
    if r == DONE: break
    if r == NEED_RULE: _rule_template(tc, run.key(), handle(stop.node), handle(stop.ctx), pm)
    elif r == NEED_ACC:
      _acc_template(tc, run.key(), handle(stop.k), handle(stop.prev) if stop.prev >= 0 else None, handle(stop.v))
    elif r == PY_STEP:
      yield from step(handle(stop.node), handle(stop.ctx), get, put, targets, on_path, pm)
      run.skip()
    elif r == NEED_META: _merge_metadata(run, stop.md, stop.mdcur)
    else:  # PY_ACC
      k = handle(stop.k)
      put(k, accumulate(handle(stop.prev) if stop.prev >= 0 else None, handle(stop.v), k))
      run.consume()
  return GradMap(run)
