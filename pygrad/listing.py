"""Reading graphs: `listing(roots)` prints one line per node in topological order, like a jaxpr or an SSA dump
(`%12 = MUL f32[16,16] %10 %11`), each shared node once, FUNCTION/CALL bodies indented under their call, metadata
as a trailing comment and the roots named at the end; and the one-line `repr` of a UOp. Nothing recurses on
graph depth or on the nesting of FUNCTIONs."""
from __future__ import annotations
from .ops import Ops
from .dtype import dtypes
from .core import CORE
from .uop import UOp, CallInfo, handle

SHORT = {dtypes.bool: "bool", dtypes.int8: "i8", dtypes.int16: "i16", dtypes.int32: "i32", dtypes.int64: "i64",
         dtypes.uint8: "u8", dtypes.uint16: "u16", dtypes.uint32: "u32", dtypes.uint64: "u64", dtypes.float16: "f16",
         dtypes.bfloat16: "bf16", dtypes.float32: "f32", dtypes.float64: "f64", dtypes.void: ""}
_CALLS = (int(Ops.FUNCTION), int(Ops.CALL))
HEAD, TAIL = 30, 20  # lines kept at each end of a long listing


def typ(u: UOp) -> str:
  """`f32[16,16]` (and `@device` off the default CPU); empty for structural nodes."""
  if u.dtype is dtypes.void: return ""
  dev = u.device
  at = "" if dev is None or dev == "CPU" else "@" + (dev if type(dev) is str else "(" + ",".join(dev) + ")")
  return f"{SHORT[u.dtype]}[{','.join(map(str, u.shape))}]{at}"


def _short(x, limit: int = 60) -> str:
  s = repr(x)
  return s if len(s) <= limit else s[:limit - 3] + "..."


def _fname(f) -> str:
  return getattr(f, "__qualname__", None) or getattr(f, "__name__", None) or type(f).__name__


def arg_text(u: UOp) -> str:
  """The arg of u, compactly: constants inline, axes/shapes/pads as tuples, names for inputs and calls."""
  op, a = u.op, u.arg
  if a is None: return ""
  if op is Ops.CONST: return repr(a)
  if op is Ops.BUFFER: return (a[3] if len(a) > 3 and a[3] is not None else "") + f"#{a[0]}"
  if op is Ops.PARAM: return f"slot={a[0]}"
  if op is Ops.DEFINE_VAR: return f"{a[0]}[{a[1]}..{a[2]}]"
  if op is Ops.REDUCE_AXIS: return f"{a[0].name} axes={_short(a[1]).replace(' ', '')}"
  if op in (Ops.RESHAPE, Ops.EXPAND): return ""  # the new shape is the node's type
  if op is Ops.GETTUPLE: return f"[{a}]"
  if op is Ops.FLIP: return str(tuple(i for i, f in enumerate(a) if f))
  if isinstance(a, CallInfo):
    parts = [a.name or (a.fxn and _fname(a.fxn)) or ""]
    if a.fxn is not None and a.name != _fname(a.fxn): parts.append(f"fxn={_fname(a.fxn)}")
    if a.grad_fxn is not None: parts.append(f"grad_fxn={_fname(a.grad_fxn)}")
    if a.precompile: parts.append("precompile")
    if a.precompile_backward: parts.append("precompile_backward")
    return " ".join(p for p in parts if p)
  return _short(a).replace(" ", "")


def _order(roots: list[UOp]) -> list[tuple[int, int]]:
  """(node id, depth) in listing order: the outer graph without call bodies, each body right after its call."""
  seen: set[int] = set()
  out: list[tuple[int, int]] = []
  calls = {int(i) for i in _call_ids(roots)}
  stack = [(iter(CORE.toposort([r._id for r in roots], False)), 0)]
  while stack:
    it, d = stack[-1]
    nid = next(it, None)
    if nid is None:
      stack.pop()
      continue
    if nid in seen: continue
    seen.add(nid)
    out.append((nid, d))
    if nid in calls: stack.append((iter(CORE.toposort([CORE.src(nid)[0]], False)), d + 1))
  return out


def _call_ids(roots: list[UOp]):
  """The FUNCTION/CALL nodes under roots (bodies included)."""
  from .serialize import export
  import numpy as np
  ids, op = export(roots)[:2]
  return ids[np.isin(op, _CALLS)]


def line(u: UOp, num: dict[int, int]) -> str:
  """One node's line: `%n = OP type arg %src...  # metadata`."""
  parts = [f"%{num[u._id]} = {u.op.name}"]
  t, a = typ(u), arg_text(u)
  if t: parts.append(t)
  if a: parts.append(a)
  srcs = [f"%{num[s]}" if s in num else "%?" for s in CORE.src(u._id)]
  if u.op in (Ops.FUNCTION, Ops.CALL) and srcs: srcs = [f"body={srcs[0]}", "(" + ", ".join(srcs[1:]) + ")"]
  parts += srcs
  if u.tag is not None: parts.append(f"tag={_short(u.tag, 30)}")
  s = " ".join(parts)
  md = u.metadata
  if md: s += "  # " + ", ".join(m.name + (" (backward)" if m.backward else "") for m in md)
  return s


def listing(roots, full: bool = False) -> str:
  """The graph under roots (a UOp or a sequence of UOps) as text, one line per node in topological order; graphs
  of more than HEAD + TAIL nodes keep their first and last lines with a count between, unless full."""
  if not isinstance(roots, UOp) and not hasattr(roots, "__iter__"):
    raise TypeError(f"listing: roots must be a UOp or a sequence of UOps, got {type(roots).__name__}")
  roots = [roots] if isinstance(roots, UOp) else list(roots)
  for r in roots:
    if not isinstance(r, UOp): raise TypeError(f"listing: roots must be UOps, got {type(r).__name__}")
  order = _order(roots)
  num = {nid: i for i, (nid, _) in enumerate(order)}
  n = len(order)
  show = range(n) if full or n <= HEAD + TAIL + 1 else [*range(HEAD), -1, *range(n - TAIL, n)]
  lines = []
  for i in show:
    if i < 0:
      lines.append(f"... {n - HEAD - TAIL} nodes not shown (listing(roots, full=True) shows every node) ...")
      continue
    nid, d = order[i]
    lines.append("    " * d + line(handle(nid), num))
  lines.append("=> " + ", ".join(f"%{num[r._id]}" for r in roots))
  return "\n".join(lines)


def summary(u: UOp) -> str:
  """repr(u): op, type, a short arg, source count and the size of the graph, on one line."""
  a = arg_text(u)
  a = a if len(a) <= 40 else a[:37] + "..."
  t = typ(u)
  n = len(CORE.toposort([u._id], True))
  return f"<UOp {u.op.name}{' ' + t if t else ''}{' ' + a if a else ''}, {len(CORE.src(u._id))} src, {n} nodes>"


__all__ = ["listing", "summary", "line", "arg_text", "typ"]
