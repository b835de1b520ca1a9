"""Building a graph from its node table in one pass (pygrad/serialize.py's loads, the tinygrad importer, and the public
bulk builder `pygrad.build(ops, dtypes, srcs, args)` for graphs that are already data). On the C core the builder is one
C call (csrc/serial_build.c): it makes every node whose signature (op, dtype, arg, sources' dtypes and shapes) it has
seen, and asks Python (the ordinary `UOp(...)` constructor, with its validation) only for the first node of each
signature and for FUNCTION/CALL/GETTUPLE/AFTER; the store keeps the signatures between builds. Nodes are hash-consed, so
a built graph is the live one if it exists. Nothing here recurses on graph depth."""
from __future__ import annotations
import numpy as np
from .ops import Ops, GroupOp
from .dtype import BY_ID
from .core import CORE, ArgGone
from .intern import ARGS, META
from .shapes import INFER
from .uop import UOp, handle, adopt
from . import uop as _uop

if CORE.name == "c":  # bound once: an import statement in each call was a few microseconds of every small build
  from .core.ccore import ffi as _ffi, lib as _lib
else: _ffi = _lib = None

_NOPS, _NDT = len(Ops), len(BY_ID)
_ASK = frozenset({Ops.GETTUPLE, Ops.FUNCTION, Ops.CALL, Ops.AFTER})  # inference reads more than the signature
_FLAGS = np.array([2 if o in _ASK else 1 for o in Ops], np.uint8)
_IS_LEAF = np.array([o in GroupOp.Leaf for o in Ops], bool)
_OPS = tuple(Ops)
_JUST_INT = {int}
_SMALL = 32  # a table of at most this many new rows infers no leaf metas up front: the builder asks for its leaves


def _starts(nsrc: np.ndarray) -> np.ndarray:
  st = np.zeros(len(nsrc) + 1, np.int64)
  np.cumsum(nsrc, out=st[1:])
  return st


def _intern_all(objs: list, keys: list | None) -> np.ndarray:
  """Interned ids of objs (whose interning keys are keys, where known), with 0 (None) in front: row k + 1 is
  objs[k]."""
  out = np.empty(len(objs) + 1, np.int32)
  out[0] = 0
  out[1:] = ARGS.get_many(objs, keys)
  return out


def _build(op, dt, start, src, argref, tagref, pdref, objs: list, roots, given=None, keys=None, ids=None,
           infer: bool = True, notags: bool = False):
  """The nodes of a checked table whose arg columns are 1-based references into objs (0: none): the roots, as UOps.
  given: the ids of live nodes that are the table's first rows (their columns are zeros); then also the ids of the
  other rows, as an int32 array. ids: _intern_all(objs, keys), if the caller has just made it. infer: on the C core,
  infer the metas of leaves the store's signature cache lacks up front (else the builder asks for each). notags:
  tagref is all zeros (known to the caller: no numpy pass to find out, which cost ~15 us of a small load, its code
  and data cold after what ran between loads)."""
  n = len(op)
  if pdref is not None and pdref.any(): _uop._md_count += 1  # the gradient copies metadata only once some exists
  for _ in range(64):  # an interned id may be drained between interning and the builder's hold: intern again
    if ids is None: ids = _intern_all(objs, keys)
    try:
      if CORE.name == "c":
        ng = 0 if given is None else len(given)
        take = lambda ref: ref if not ref.any() else ids.take(ref)  # noqa: E731  (ids[0] is 0: zeros stay)
        pdata = None if pdref is None else take(pdref)
        return _build_c(op, dt, start, src, ids.take(argref), tagref if notags else take(tagref), pdata, ids, objs,
                        argref, tagref, roots, given, infer and n - ng > _SMALL)
      return _build_py(op, dt, start, src, argref, tagref, pdref, objs, ids, roots, given)
    except ArgGone:
      ids = None  # intern again
      with ARGS.lock: pass  # a concurrent drain finishes forgetting what it marked gone
  raise RuntimeError(f"pygrad.build: args kept being released while building {n} nodes")


def _ask(i: int, op, dt, start, src, argref, tagref, objs, made) -> UOp:
  """Node i made by the UOp constructor (its validation names any problem)."""
  o = Ops(int(op[i]))
  d = BY_ID[int(dt[i])]
  s = tuple(made(int(j)) for j in src[start[i]:start[i + 1]])
  a, t = int(argref[i]), int(tagref[i])
  try:
    u = UOp(o, d, s, objs[a - 1] if a else None, objs[t - 1] if t else None)
  except (TypeError, ValueError) as e:
    raise ValueError(f"node {i}: {e}") from None
  if u.dtype is not d: raise ValueError(f"node {i}: {o.name} has dtype {u.dtype.name}, the table says {d.name}")
  return u


def _leaf_metas(op, dt, argref, objs, rows: np.ndarray, known: np.ndarray) -> None:
  """known[i] for the rows (ascending) of a leaf op (BUFFER, CONST, DEFINE_VAR, ...) among rows: the meta (interned
  shape and device), inferred and validated once per distinct (op, dtype, arg) as UOp(...) would. Each such leaf is
  then no stop in the builder (BUFFERs and CONSTs are the graph's distinct signatures: otherwise each would be a
  call back to Python). rows are the builder's misses (pg_serial_build_misses): the leaves whose signature the
  store's cache lacks, so a graph loaded before in this process costs nothing here."""
  rows = rows[_IS_LEAF[op[rows]]]
  if len(rows) == 0: return
  key = (argref[rows].astype(np.int64) << 16) | (op[rows].astype(np.int64) << 8) | dt[rows]
  _, idx, inv = np.unique(key, return_index=True, return_inverse=True)
  order = np.argsort(idx)  # in row order, so an error names the first bad row
  firsts = rows[idx[order]]
  got_metas: list = []
  meta_ids, buffer = META.ids, Ops.BUFFER
  seen: dict = {}  # a BUFFER's validity and meta follow from (dtype, shape, device): the rest of its arg is a name
  for i, oi, di, a in zip(firsts.tolist(), op[firsts].tolist(), dt[firsts].tolist(), argref[firsts].tolist()):
    o, d = _OPS[oi], BY_ID[di]
    arg = objs[a - 1] if a else None
    fast = o is buffer and type(arg) is tuple and len(arg) >= 3 and type(arg[1]) is tuple and \
      type(arg[2]) is str and set(map(type, arg[1])) <= _JUST_INT
    if fast:
      m = seen.get((d, arg[1], arg[2]))
      if m is not None:
        got_metas.append(m)
        continue
    try: got, shape, dev = INFER[o](o, d, (), arg)
    except (TypeError, ValueError) as e: raise ValueError(f"node {i}: {e}") from None
    if got is not d: raise ValueError(f"node {i}: {o.name} has dtype {got.name}, the table says {d.name}")
    m = meta_ids.get((shape, dev))
    if m is None: m = META.get(shape, dev)
    got_metas.append(m)
    if fast: seen[d, arg[1], arg[2]] = m
  metas = np.empty(len(idx), np.int32)
  metas[order] = got_metas
  known[rows] = metas[inv.reshape(-1)]


_FLAGS_C: list = []


def _flags_c():
  """_FLAGS as a cffi array (made once: the builder reads it, never writes)."""
  if not _FLAGS_C:
    ffi = _ffi
    _FLAGS_C.append(ffi.from_buffer("uint8_t[]", _FLAGS))
  return _FLAGS_C[0]


def _build_c(op, dt, start, src, arg, tag, pdata, holds, objs, argref, tagref, roots, given, infer: bool):
  """The C core's _build (arg, tag, pdata: interned ids, all of them among holds, which the builder holds once each).
  infer: infer the metas of the leaves whose signature the store's cache lacks up front, in one pass (_leaf_metas),
  rather than stopping the builder for each."""
  ffi, lib = _ffi, _lib
  i32 = lambda a: ffi.from_buffer("int32_t[]", a)  # noqa: E731
  err, where, pos = ffi.new("int *"), ffi.new("int64_t *"), ffi.new("int64_t *")
  ng = 0 if given is None else len(given)
  known = np.full(len(op), -1, np.int32) if infer else None
  b = CORE.serial_build_new(len(op), i32(op), i32(dt), ffi.from_buffer("int64_t[]", start), i32(src),
                            i32(arg), i32(tag), ffi.NULL if pdata is None else i32(pdata), i32(holds), len(holds),
                            i32(given) if ng else ffi.NULL, ng, ffi.NULL if known is None else i32(known),
                            _flags_c(), _NOPS, _NDT, err, where)
  if b == ffi.NULL:
    if err[0] == lib.PG_ERR_ARG_GONE: raise ArgGone()
    if err[0] == lib.PG_ERR_NOMEM: raise MemoryError(f"pygrad.build: out of memory for {len(op)} nodes")
    if not (np.diff(start) < 0).any(): _check_sources(start, src)
    raise _BadTable(f"pygrad.build: bad node table at row {where[0]}")
  b = ffi.gc(b, lib.pg_serial_build_delete)
  if infer:
    miss = np.empty(len(op) - ng, np.int64)
    k = lib.pg_serial_build_misses(b, ffi.from_buffer("int64_t[]", miss), len(miss))
    if k < 0: raise RuntimeError(f"pygrad.build: core error {k}")
    if k: _leaf_metas(op, dt, argref, objs, miss[:k], known)
  made = lambda j: handle(lib.pg_serial_build_id(b, j))  # noqa: E731
  while True:
    r = lib.pg_serial_build_run(b, pos)
    if r == lib.PG_BUILD_DONE: break
    if r != lib.PG_BUILD_ASK:
      if r == lib.PG_ERR_ARG_GONE: raise ArgGone()
      raise MemoryError(f"pygrad.build: out of memory at row {pos[0]}") if r == lib.PG_ERR_NOMEM else \
        RuntimeError(f"pygrad.build: core error {r} at row {pos[0]}")
    u = _ask(pos[0], op, dt, start, src, argref, tagref, objs, made)
    r = lib.pg_serial_build_set(b, u._id)
    if r: raise MemoryError("pygrad.build: out of memory") if r == lib.PG_ERR_NOMEM else \
      RuntimeError(f"pygrad.build: core error {r} at row {pos[0]}")
  out = _roots_c(b, roots, op, dt, arg, tag)
  if given is not None:
    every = np.empty(len(op), np.int32)
    if lib.pg_serial_build_ids(b, ffi.from_buffer("int32_t[]", every), len(op)): raise RuntimeError("pygrad.build")
    ffi.release(b)  # the table's references go now; the roots' handles keep what they reach
    return out, every[ng:]
  ffi.release(b)
  return out


def _roots_c(b, roots, op, dt, arg, tag) -> list[UOp]:
  """The handles of rows roots of builder b: their ids and metas (each id with a reference) in one C call, the other
  fields from the table (arg, tag: interned ids)."""
  ffi, lib = _ffi, _lib
  objs = ARGS.objs
  if len(roots) <= 8:  # a pickle piece has one root: cffi arrays and plain ints, not a dozen numpy calls
    rows = [int(x) for x in roots]
    k = len(rows)
    ids, metas = ffi.new("int32_t[]", k), ffi.new("int32_t[]", k)
    r = lib.pg_serial_build_rows(b, ffi.new("int64_t[]", rows), k, ids, metas)
    if r: raise MemoryError("pygrad.build: out of memory") if r == lib.PG_ERR_NOMEM else \
      RuntimeError(f"pygrad.build: core error {r} for the roots")
    return [adopt(ids[j], _OPS[int(op[i])], BY_ID[int(dt[i])], objs[int(arg[i])], objs[int(tag[i])] if tag[i] else None,
                  metas[j]) for j, i in enumerate(rows)]
  rows = np.ascontiguousarray(roots, np.int64).reshape(-1)
  ids, metas = np.empty(len(rows), np.int32), np.empty(len(rows), np.int32)
  r = lib.pg_serial_build_rows(b, ffi.from_buffer("int64_t[]", rows), len(rows), ffi.from_buffer("int32_t[]", ids),
                               ffi.from_buffer("int32_t[]", metas))
  if r: raise MemoryError("pygrad.build: out of memory") if r == lib.PG_ERR_NOMEM else \
    RuntimeError(f"pygrad.build: core error {r} for the roots")
  col = lambda c: np.ascontiguousarray(c[rows], np.int32).tobytes()  # noqa: E731
  return _uop.adopt_rows(ids.tobytes(), metas.tobytes(), col(op), col(dt), col(arg), col(tag))


def _build_py(op, dt, start, src, argref, tagref, pdref, objs, ids, roots, given):
  made: list[UOp] = [] if given is None else [handle(int(g)) for g in given]
  CORE.free_order(len(op) - len(made))  # as the C builder does: the same ids on both cores
  for i in range(len(made), len(op)):
    u = _ask(i, op, dt, start, src, argref, tagref, objs, made.__getitem__)
    p = int(pdref[i]) if pdref is not None else 0
    if p and not CORE.info(u._id)[6]: CORE.set_pdata(u._id, int(ids[p]))
    made.append(u)
  out = [made[int(i)] for i in roots]
  if given is None: return out
  return out, np.array([u._id for u in made[len(given):]], np.int32)


def _check_sources(start: np.ndarray, src: np.ndarray) -> None:
  """Raise ValueError naming the first node with a source that is not an earlier row, if there is one (the builder
  checks the same; this names the problem when it refuses a table)."""
  rows = np.repeat(np.arange(len(start) - 1), np.diff(start))
  bad = (src < 0) | (src >= rows)
  if bad.any(): raise ValueError(f"pygrad.build: node {int(rows[bad][0])} names a source that is not an earlier row")


class _BadTable(ValueError):
  """The C builder refused a table (pygrad.build then names the problem, if its cheap checks skipped it)."""


def _fits(a: np.ndarray) -> bool:
  """Whether every value of int array a is an int32 as it is (cast, a wider value would wrap into range)."""
  return a.dtype.itemsize < 4 or (a.dtype.itemsize == 4 and a.dtype.kind == "i")


def _int_col(a, n: int, name: str, lo: int, hi: int, checked: bool = False) -> np.ndarray:
  """a as an int32 column of n values in [lo, hi); checked: the C builder checks the range (and build names the
  problem when it refuses the table), so only values that would not survive the cast to int32 are looked at."""
  a = np.asarray(a)
  if a.shape != (n,) or a.dtype.kind not in "iu":
    raise ValueError(f"pygrad.build: {name} must be an integer array of shape ({n},), got {a.dtype} {a.shape}")
  if n and not (checked and CORE.name == "c" and _fits(a)) and (a.min() < lo or a.max() >= hi):
    raise ValueError(f"pygrad.build: {name} out of range [{lo}, {hi})")
  return np.ascontiguousarray(a, np.int32)


def _name_problem(op: np.ndarray, dt: np.ndarray, start: np.ndarray) -> None:
  """Raise ValueError naming what the C builder found wrong with a table, among the checks build left to it."""
  _int_col(op, len(op), "ops", 0, _NOPS)
  _int_col(dt, len(dt), "dtypes", 0, _NDT)
  if (np.diff(start) < 0).any():
    raise ValueError("pygrad.build: srcs (starts, flat) must have n + 1 increasing starts from 0 to len(flat)")


def build(ops, dtypes, srcs, args=None, arg_index=None, tags=None, roots=None) -> list[UOp]:
  """Make a whole graph from a node table -- one C call on the C core -- and return its roots as UOps.

  ops: int array (n,) of Ops values. dtypes: int array (n,) of DType ids (`DType.id`; structural nodes use
  dtypes.void). srcs: each node's sources as positions of *earlier* rows, either a 2-D int array (n, k) padded
  with -1, or a pair (starts (n + 1,), flat) with node i's sources flat[starts[i]:starts[i + 1]]. args: either a
  sequence of n args (None: no arg), or, with arg_index (an int array (n,), -1 for none), the distinct args that
  arg_index points into. tags: None, or a sequence of n tags. roots: row positions to return (default: every row
  no other row uses, in table order). Every node is validated as `UOp(...)` would; a bad table raises ValueError."""
  n = len(ops)
  # the C builder checks ops, dtypes, starts and sources itself (one pass, in rows_ok): only what it cannot is
  # checked here, and a table it refuses is looked at again to name the problem (_name_problem)
  op = _int_col(ops, n, "ops", 0, _NOPS, True)
  dt = _int_col(dtypes, n, "dtypes", 0, _NDT, True)
  if isinstance(srcs, tuple) and len(srcs) == 2:
    start = np.ascontiguousarray(srcs[0], np.int64)
    src = np.asarray(srcs[1])
    if start.shape != (n + 1,) or (n and (start[0] != 0 or (CORE.name != "c" and (np.diff(start) < 0).any()))) \
       or src.ndim != 1 or start[-1] != len(src):
      raise ValueError("pygrad.build: srcs (starts, flat) must have n + 1 increasing starts from 0 to len(flat)")
  else:
    try: s2 = np.asarray(srcs)
    except (ValueError, TypeError):  # ragged lists: numpy's own message names no argument
      raise ValueError("pygrad.build: srcs must be an int array (n, k) padded with -1, or a pair (starts, flat); got "
                       f"{type(srcs).__name__} of rows of different lengths") from None
    if s2.ndim != 2 or len(s2) != n or s2.dtype.kind not in "iu":
      raise ValueError(f"pygrad.build: srcs must be an int array (n, k) padded with -1, got {s2.dtype} {s2.shape}")
    if (s2 < -1).any():
      raise ValueError(f"pygrad.build: node {int(np.nonzero((s2 < -1).any(1))[0][0])} names a source that is not an "
                       "earlier row")
    keep = s2 >= 0
    if (keep[:, 1:] & ~keep[:, :-1]).any(): raise ValueError("pygrad.build: -1 padding must follow the sources")
    start = _starts(keep.sum(1))
    src = s2[keep]
  if len(src) and src.dtype.kind not in "iu": raise ValueError("pygrad.build: source positions must be integers")
  if CORE.name != "c": _check_sources(start, src)
  elif len(src) and not _fits(src) and (src.min() < 0 or src.max() >= n): _check_sources(start, src)  # (raises)
  src = np.ascontiguousarray(src, np.int32)  # in [0, n): the C builder checks that each row's come earlier
  if arg_index is None:
    objs = [] if args is None else list(args)
    if args is not None and len(objs) != n: raise ValueError(f"pygrad.build: args must hold {n} values")
    argref = np.arange(1, n + 1, dtype=np.int32) if args is not None else np.zeros(n, np.int32)
    argref[[i for i, a in enumerate(objs) if a is None]] = 0
  else:
    objs = list(args or ())
    argref = _int_col(arg_index, n, "arg_index", -1, len(objs)) + 1
  if tags is not None:
    tags = list(tags)
    if len(tags) != n: raise ValueError(f"pygrad.build: tags must hold {n} values")
    tagref = np.array([0 if t is None else len(objs) + 1 + i for i, t in enumerate(tags)], np.int32)
    objs = objs + tags
  else: tagref = np.zeros(n, np.int32)
  if roots is None:
    used = np.zeros(n, bool)
    used[src] = True
    rts = np.nonzero(~used)[0]
  else:
    rts = np.asarray(roots, np.int64).reshape(-1)
    if len(rts) and (rts.min() < 0 or rts.max() >= n): raise ValueError("pygrad.build: a root is not a row")
  try: return _build(op, dt, start, src, argref, tagref, None, objs, rts, notags=tags is None)
  except _BadTable:
    _name_problem(op, dt, start)
    raise


__all__ = ["build"]
