"""Template programs on the C core: a graph recorded once over placeholder inputs, then made again over real nodes
by one C call (csrc/prog.c), hash-consing every node.

Math-method templates. A method that builds several nodes (matmul: eight, relu: three, a broadcasting add: three)
builds the same graph, node for node, for every call whose node operands have the same dtype, shape and device and
whose other arguments are equal: the methods read nothing else of their operands (no method looks at an operand's
op, value or identity). So on the second call with a signature, the method's body runs on placeholder PARAMs and its
graph becomes a program; from then on a call with that signature is one C call plus the result's handle, where the
body would make a handle for every intermediate node. The gradient templates (gradient/templated.py) use the same programs.

Calls take the direct path inside a `metadata` block (every node made there gets the metadata), when
PYGRAD_BUILD_TEMPLATES=0, and for operands that are not nodes or Python scalars. At most LIMIT signatures are
cached; a full cache evicts (see _evict), so one-shot signatures never keep later ones out.
"""
from __future__ import annotations
import os
from .ops import Ops
from .core import CORE
from .intern import argkey
from . import uop as _uop
from .uop import UOp
from .handles import _wrap, _prog_cap, _tmpl_install

if not CORE.programs: raise ImportError("templates need a core with template programs (the C core)")

LIMIT = 4096       # signatures cached at most (met once or with a program); then the cache evicts
_SEEN = object()   # a signature met once: the second meeting records it
_DIRECT = object()  # a signature whose body failed on placeholders: the direct path raises the real error
_entries: dict = {}
_state = {"on": os.environ.get("PYGRAD_BUILD_TEMPLATES", "1") != "0"}
_run1, _run2, _run = CORE.prog_run1, CORE.prog_run2, CORE.prog_run


def placeholder(i: int, like: UOp) -> UOp:
  """The i-th input of a template: a PARAM with like's dtype, shape and device (its negative slot is no function's)."""
  return UOp(Ops.PARAM, like.dtype, (), (-1 - i, like.shape, like.device))


def program(inputs: list[UOp], outputs: list[UOp | None]) -> list[int]:
  """The program words building `outputs` from `inputs` (layout in csrc/prog.h)."""
  ref = {u._id: i for i, u in enumerate(inputs)}
  roots = [o._id for o in outputs if o is not None and o._id not in ref]
  body = CORE.toposort(roots, True, list(ref)) if roots else []
  prog = [len(inputs), len(body), len(outputs)]
  for nid in body:
    op, dt, _, arg, tag, meta, _ = CORE.info(nid)
    srcs = CORE.src(nid)
    prog += [op, dt, arg, tag, meta, len(srcs), *(ref[s] for s in srcs)]
    ref[nid] = len(ref)
  prog += [-1 if o is None else ref[o._id] for o in outputs]
  return prog


def compile_program(inputs: list[UOp], outputs: list[UOp | None]):
  """The checked core program (it holds the arg ids it names, so the recorded graph may die)."""
  return CORE.prog_new(program(inputs, outputs))


def set_enabled(on: bool) -> bool:
  """Turn method templates on or off (tests compare both paths); returns the previous setting."""
  prev, _state["on"] = _state["on"], bool(on)
  return prev


def _record(key, fn, self, args, kw, ins):
  """Run fn's body on placeholders and cache its program under key; the entry, or _DIRECT."""
  try:
    phs = [placeholder(i, u) for i, u in enumerate(ins)]
    it = iter(phs[1:])
    out = fn(phs[0], *[next(it) if type(a) is UOp else a for a in args], **kw)
    if type(out) is not UOp: raise TypeError("method result is not a node")
  except Exception:
    _entries[key] = _DIRECT
    return _DIRECT
  ids = [p._id for p in phs]
  if out._id in ids:  # the body returned an operand as it is
    e = (None, ids.index(out._id))
  else:  # (the program twice: a cffi one for the calls below, a capsule for the C methods' hit path)
    words = program(phs, [out])
    e = (CORE.prog_new(words), out.op, out.dtype, out.arg, out.tag, out.shape, out.device, out._m,
         _prog_cap(words) if _prog_cap is not None else None)
  _entries[key] = e
  return e


def _evict() -> None:
  """Make room in a full cache. Signatures met only once go first: a Python scalar's value is part of a signature,
  so calls with many distinct constants fill the cache with them, and a cache that stopped taking signatures
  would leave every later new shape on the slow path. If programs fill more than half of it, it starts over (their
  signatures are recorded again on their next two calls)."""
  for k in list(_entries):
    if _entries.get(k) is _SEEN: _entries.pop(k, None)
  if len(_entries) > LIMIT // 2: _entries.clear()


def templated(kind: str, fn):
  """fn (a math method) through templates: see the module docstring."""
  def method(self, *args, **kw):
    # the common calls first -- no keywords, no operand or one node operand, a program cached -- with the key the
    # general path below would build, in as few steps as possible
    if not kw and _state["on"] and not _uop._md_open:
      d = self._dtype
      if not args: key = (kind, d.id, self._m)
      elif len(args) == 1 and type(args[0]) is UOp: key = (kind, d.id, self._m, args[0]._dtype.id, args[0]._m)
      else: key = None
      e = _entries.get(key)
      if type(e) is tuple and e[0] is not None:
        nid = _run2(e[0], self._id, args[0]._id) if args else _run1(e[0], self._id)
        if nid >= 0: return _wrap(nid, *e[1:8])
    if not _state["on"] or (_uop._md_open and _uop._md_get() is not None) or self._dtype.kind == "v":
      return fn(self, *args, **kw)
    key, ins = [kind, self.dtype.id, self._m], [self]
    for a in args:
      t = type(a)
      if t is UOp:
        if a.dtype.kind == "v": return fn(self, *args, **kw)
        key += (a.dtype.id, a._m)
        ins.append(a)
      elif t is Ops or t is int or t is float or t is bool or t is str or a is None: key.append(argkey(a))
      elif t is tuple:
        if any(type(x) is UOp for x in a): return fn(self, *args, **kw)
        try: key.append(argkey(a))
        except TypeError: return fn(self, *args, **kw)
      else: return fn(self, *args, **kw)
    if kw:
      for k, a in sorted(kw.items()):
        if not (a is None or type(a) in (int, float, bool, str)): return fn(self, *args, **kw)
        key += (k, argkey(a))
    key = tuple(key)
    e = _entries.get(key)
    if e is None:
      if len(_entries) >= LIMIT: _evict()
      _entries[key] = _SEEN
      return fn(self, *args, **kw)
    if e is _SEEN: e = _record(key, fn, self, args, kw, ins)
    if e is _DIRECT: return fn(self, *args, **kw)
    p = e[0]
    if p is None: return ins[e[1]]
    n = len(ins)
    if n == 1: nid = _run1(p, self._id)
    elif n == 2: nid = _run2(p, self._id, ins[1]._id)
    else: nid = _run(p, [u._id for u in ins])
    if nid < 0: return fn(self, *args, **kw)  # cannot happen for live operands; the direct path says what is wrong
    return _wrap(nid, *e[1:8])
  method.__name__, method.__qualname__, method.__doc__ = fn.__name__, fn.__qualname__, fn.__doc__
  method.__wrapped__ = fn
  return method


# methods that build two or more nodes from node operands and plain arguments
METHODS = ("_bin", "__sub__", "__rsub__", "__truediv__", "__rtruediv__", "neg", "minimum", "where", "cos", "exp",
           "log", "floor", "sign", "abs", "relu", "sigmoid", "tanh", "broadcast_to", "_reduce", "min", "mean",
           "softmax", "log_softmax", "matmul", "__matmul__", "__le__", "__ge__")


# the methods whose hit path is C on the C core (csrc/pytmpl.c): those often called with no argument or one node;
# -, / and @ as the handle type's number slots (with their reflected methods)
C_METHODS = ("relu", "matmul", "neg", "minimum", "cos", "exp", "log", "floor", "sign", "abs", "sigmoid", "tanh")
C_SLOTS = {"__sub__": "__rsub__", "__truediv__": "__rtruediv__", "__matmul__": "__rmatmul__"}


def _python_method(cls, name: str):
  """cls's method name, passing over the C handle type (its number slots' wrappers call the class's methods)."""
  return next(vars(k)[name] for k in cls.__mro__ if name in vars(k) and k is not CORE.handle_base)


def install(cls) -> None:
  """Route cls's multi-node math methods through templates."""
  for name in METHODS:
    fn = _python_method(cls, name)
    setattr(cls, name, templated(name, getattr(fn, "__wrapped__", fn)))
  if _tmpl_install is None: return
  # the C core: the hit path of C_METHODS and C_SLOTS in C, each calling the templated method above otherwise
  specs = [(0, n, n, vars(cls)[n], None) for n in C_METHODS]
  for n, r in C_SLOTS.items():
    specs.append((2, n, n, vars(cls)[n], _python_method(cls, r)))
  for n, descr in _tmpl_install(cls, _entries, _state, tuple(specs)).items(): setattr(cls, n, descr)
  for n, r in C_SLOTS.items():  # so that the handle type's number slots (csrc/pyhandle.c) are the class's
    for k in (n, r):
      if k in vars(cls): delattr(cls, k)
