"""UPat, a pattern over UOps, and PatternMatcher, an ordered rule table dispatched by op. Each UPat is compiled once
into a matcher closure that returns the list of consistent bindings (several where a permutation matches)."""
from __future__ import annotations
import inspect, itertools
from typing import Any, Callable
from .ops import Ops
from .dtype import DType
from .intern import argkey
from .uop import UOp

_ANY = object()


class UPat:
  """A pattern: `op` (an Ops or a collection of them), `dtype` (one or several), `src` (a tuple matched in order,
  a list matched in any permutation, or a single UPat every source must match), `arg` (equal, type-strictly),
  `name` (binds the node; a repeated name must bind the same node), `allow_any_len` (a tuple src matches a
  prefix of the sources)."""
  __slots__ = ("op", "dtype", "src", "arg", "name", "allow_any_len", "alternatives", "_match")

  def __init__(self, op=None, dtype=None, src=None, arg: Any = _ANY, name: str | None = None,
               allow_any_len: bool = False):
    self.op = None if op is None else frozenset((op,) if isinstance(op, Ops) else op)
    if self.op is not None and not all(isinstance(o, Ops) for o in self.op): raise TypeError(f"UPat: bad op {op!r}")
    self.dtype = None if dtype is None else frozenset((dtype,) if isinstance(dtype, DType) else dtype)
    if src is not None and not isinstance(src, (tuple, list, UPat)):
      raise TypeError(f"UPat: src must be a tuple, a list or a UPat, got {type(src).__name__}")
    self.src, self.arg, self.name, self.allow_any_len = src, arg, name, allow_any_len
    self.alternatives: tuple[UPat, ...] | None = None
    self._match = None

  @staticmethod
  def var(name: str | None = None, dtype=None) -> UPat:
    """Any node, bound to `name`."""
    return UPat(dtype=dtype, name=name)

  @staticmethod
  def cvar(name: str | None = None, dtype=None) -> UPat:
    """A CONST node, bound to `name`."""
    return UPat(Ops.CONST, dtype=dtype, name=name)

  @staticmethod
  def any(*pats: UPat) -> UPat:
    """Matches when any of `pats` matches."""
    p = UPat()
    p.alternatives = pats
    return p

  def match(self, u: UOp, bindings: dict | None = None) -> list[dict]:
    """Every consistent binding of this pattern's names against u (empty: no match)."""
    if self._match is None: self._match = _compile(self)
    return self._match(u, {} if bindings is None else bindings)

  def ops(self) -> frozenset | None:
    """The ops a node must have to match (None: any)."""
    if self.alternatives is not None:
      sets = [p.ops() for p in self.alternatives]
      return None if any(s is None for s in sets) else frozenset().union(*sets)
    return self.op

  def __repr__(self):
    return f"UPat(op={self.op and sorted(o.name for o in self.op)}, name={self.name!r}, src={self.src!r})"


def _compile(p: UPat) -> Callable[[UOp, dict], list[dict]]:
  if p.alternatives is not None:
    alts = [_compile(a) for a in p.alternatives]
    def m_any(u, b):
      for a in alts:
        r = a(u, b)
        if r: return r
      return []
    return m_any
  ops, dts, name, any_len = p.op, p.dtype, p.name, p.allow_any_len
  akey = None if p.arg is _ANY else argkey(p.arg)
  src = p.src
  if src is None: subs, kind = (), "none"
  elif isinstance(src, UPat): subs, kind = (_compile(src),), "every"
  elif isinstance(src, list): subs, kind = tuple(_compile(s) for s in src), "perm"
  else: subs, kind = tuple(_compile(s) for s in src), "tuple"

  def chain(pairs, b):
    res = [b]
    for sm, s in pairs:
      res = [r2 for r in res for r2 in sm(s, r)]
      if not res: break
    return res

  def m(u, b):
    if ops is not None and u.op not in ops: return []
    if dts is not None and u.dtype not in dts: return []
    if akey is not None and argkey(u.arg) != akey: return []
    if name is not None:
      prev = b.get(name)
      if prev is not None:
        if prev is not u: return []
      else: b = {**b, name: u}
    if kind == "none": return [b]
    us = u.src
    if kind == "every": return chain([(subs[0], s) for s in us], b)
    if len(us) != len(subs) and not (any_len and len(us) >= len(subs)): return []
    if kind == "tuple": return chain(zip(subs, us), b)
    out = []
    for perm in itertools.permutations(subs):
      out.extend(chain(zip(perm, us), b))
    return out
  return m


class PatternMatcher:
  """An ordered table of (UPat, fxn) rules. `rewrite(u, ctx)` returns the first non-None result of a rule whose
  pattern matches u; rules are tried in order among those whose op can match. A rule function takes the bound
  names it declares (and `ctx` if it declares it)."""

  def __init__(self, rules: list[tuple[UPat, Callable]]):
    self.rules = list(rules)
    self._by_op: dict[Ops, list] = {o: [] for o in Ops}
    for pat, fxn in self.rules:
      if not isinstance(pat, UPat) or not callable(fxn): raise TypeError("PatternMatcher: rules are (UPat, callable)")
      params = inspect.signature(fxn).parameters
      var_kw = any(v.kind is inspect.Parameter.VAR_KEYWORD for v in params.values())
      names = None if var_kw else frozenset(params)
      entry = (pat, fxn, names, var_kw or "ctx" in params)
      for o in (pat.ops() or Ops): self._by_op[o].append(entry)

  def __add__(self, other: PatternMatcher) -> PatternMatcher: return PatternMatcher(self.rules + other.rules)

  def rewrite(self, u: UOp, ctx=None):
    for pat, fxn, names, wants_ctx in self._by_op[u.op]:
      for b in pat.match(u):
        kw = b if names is None else {k: v for k, v in b.items() if k in names}
        if wants_ctx: kw = {**kw, "ctx": ctx}
        ret = fxn(**kw)
        if ret is not None: return ret
    return None
