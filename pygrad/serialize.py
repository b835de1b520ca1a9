"""Graphs as data: the node table, the bulk builder `build`, and the binary format of `dumps`/`loads`/`save`/`load`
(also what `pickle` of a UOp or a Walk writes).

A graph is a node table in topological order: per node an op, a dtype, its sources as positions of earlier rows,
and references into an arg table of plain values. On the C core, export is one C call (csrc/serial.c) and so is
building: the builder makes every node whose signature (op, dtype, arg, sources' dtypes and shapes) it has seen,
and asks Python (the ordinary `UOp(...)` constructor, with its validation) only for the first node of each
signature and for FUNCTION/CALL/GETTUPLE/AFTER; the store keeps the signatures between loads, so a model's graph is
inferred in Python once per process. The arg table is pygrad/argtable.py's, decoded column by column. Nodes are
hash-consed, so a loaded graph is the live one if it exists. Nothing here recurses on graph depth or on the nesting
of args.

Callables (a CALL's `fxn`, `grad_fxn`) are written as (module, qualified name) and resolved on load from modules
already imported; `loads(..., allow_import=True)` may import the named modules, and nothing else ever runs code.
A callable that cannot be found by its name (a lambda, a local function) is refused when saving: pickle carries
those (pickle writes them with its own machinery, which users know runs code on load).

Pickle writes one node table per pickling call, however many UOps (and Walks, and compiled Programs) the pickled
structure holds: see the pickle section below."""
from __future__ import annotations
import os, struct, threading, weakref, zlib
from operator import is_
from typing import Sequence
import numpy as np
from .ops import Ops, GroupOp
from .dtype import BY_ID
from .core import CORE, ArgGone
from .intern import ARGS, META
from .argtable import encode_args, decode_args, keep
from .shapes import INFER
from .uop import UOp, Walk, Metadata, handle, adopt
from . import uop as _uop

if CORE.name == "c":  # bound once: an import statement in each call was a few microseconds of every small load
  from .core.ccore import ffi as _ffi, lib as _lib
else: _ffi = _lib = None

MAGIC = b"PYGRAD\x00G"
VERSION = 2  # 2: the arg table by skeleton (pygrad/argtable.py); 1 stored each arg's items in turn
# magic, version, flags, nargs, argbytes, n, nsrc, nroots, srcw, argw, and ngiven: rows before the stored ones that the
# loader supplies (a piece of pickle's shared table continues the pieces before it; 0 in every file dumps writes)
_HEAD = struct.Struct("<8sIIQQQQQBBxxI")
_F_SINGLE = 1                           # flags: one UOp was saved (loads returns it, not a list)
_NOPS, _NDT = len(Ops), len(BY_ID)
_ASK = frozenset({Ops.GETTUPLE, Ops.FUNCTION, Ops.CALL, Ops.AFTER})  # inference reads more than the signature
_FLAGS = np.array([2 if o in _ASK else 1 for o in Ops], np.uint8)
_IS_LEAF = np.array([o in GroupOp.Leaf for o in Ops], bool)
_OPS = tuple(Ops)
_JUST_INT = {int}
_SMALL = 32  # a table of at most this many new rows infers no leaf metas up front: the builder asks for its leaves
_PART = 4096  # a pickle piece of at most this many nodes has its args pickled as objects (see _Piece)
_U32 = struct.Struct("<I")


class _Reader:
  """Bounds-checked reads from a buffer: every failure is a ValueError naming what was cut short."""
  __slots__ = ("b", "p", "end")

  def __init__(self, b, p: int, end: int): self.b, self.p, self.end = b, p, end

  def take(self, k: int, what: str):
    if k < 0 or self.p + k > self.end: raise ValueError(f"pygrad.loads: truncated data ({what})")
    p = self.p
    self.p = p + k
    return self.b[p:p + k]

  def u32(self, what: str) -> int: return _U32.unpack(self.take(4, what))[0]


# ---- the node table of live nodes ----
def _as_roots(roots) -> tuple[list[UOp], bool]:
  if isinstance(roots, UOp): return [roots], True
  if not hasattr(roots, "__iter__"):
    raise TypeError(f"pygrad.dumps: roots must be a UOp or a sequence of UOps, got {type(roots).__name__}")
  roots = list(roots)
  for r in roots:
    if not isinstance(r, UOp): raise TypeError(f"pygrad.dumps: roots must be UOps, got {type(r).__name__}")
  return roots, False


def _fresh_pos(pos: np.ndarray | None = None) -> np.ndarray:
  """A row per node id (-1: not in the table) covering every id handed out so far; pos's rows kept, if given."""
  bound = max(CORE.id_bound(), 1)
  if pos is not None and len(pos) >= bound: return pos
  new = np.full(bound if pos is None else max(bound, 2 * len(pos)), -1, np.int32)
  if pos is not None: new[:len(pos)] = pos
  return new


def _c_table(root_ids: list[int], pos: np.ndarray, base: int):
  """_table's C table (a pg_table, freed with its handle)."""
  ffi, lib = _ffi, _lib
  out = ffi.new("pg_table **")
  r = CORE.serial_table(ffi.new("int32_t[]", root_ids), len(root_ids), ffi.from_buffer("int32_t[]", pos),
                        len(pos), base, out)
  if r == lib.PG_ERR_NOMEM: raise MemoryError("pygrad: out of memory exporting a graph")
  if r: raise RuntimeError(f"pygrad: export failed ({r})")
  return ffi.gc(out[0], lib.pg_serial_table_free)


def _table(root_ids: list[int], pos: np.ndarray, base: int):
  """(ids, op, dtype, arg, tag, pdata, nsrc, src, args) of the nodes under root_ids that pos does not list yet,
  sources before users (CORE.toposort's order), as the rows base, base + 1, ...: int32 columns, sources as rows
  through pos (which gets the new rows), arg/tag/pdata as 1-based numbers into args, their distinct interned ids in
  order of first use (0: none). With pos all -1 and base 0 that is the whole graph."""
  if CORE.name == "c":
    ffi = _ffi
    t = _c_table(root_ids, pos, base)
    col = lambda p, k: np.frombuffer(ffi.buffer(p, k * 4), np.int32).copy()  # noqa: E731
    n, m = int(t.n), int(t.m)
    return (col(t.ids, n), col(t.op, n), col(t.dtype, n), col(t.arg, n), col(t.tag, n), col(t.pdata, n),
            col(t.nsrc, n), col(t.src, m), col(t.args, int(t.nargs)))
  new: list[int] = []  # the pure core: PyCore.toposort's walk, skipping the nodes pos lists
  for root in root_ids:
    stack = [(root, False)]
    while stack:
      nid, leaving = stack.pop()
      if pos[nid] >= 0: continue
      if leaving:
        pos[nid] = base + len(new)
        new.append(nid)
        continue
      stack.append((nid, True))
      stack.extend((x, False) for x in reversed(CORE.src(nid)))
  n = len(new)
  info = [CORE.info(nid) for nid in new]
  number: dict[int, int] = {}
  for x in info:  # args numbered in order of first use, row by row: arg, tag, pdata (as serial.c numbers them)
    for a in (x[3], x[4], x[6]):
      if a and a not in number: number[a] = len(number) + 1
  number[0] = 0
  cols = [np.array([x[k] if k < 3 else number[x[k]] for x in info], np.int32).reshape(n) for k in (0, 1, 3, 4, 6, 2)]
  src = pos[np.array([s for nid in new for s in CORE.src(nid)], np.int64)].astype(np.int32)
  return (np.array(new, np.int32).reshape(n), *cols, src, np.array(list(number)[:-1], np.int32))


def export(roots: list[UOp]):
  """(ids, op, dtype, arg, tag, pdata, nsrc, src) of every node under roots in toposort order: int32 columns, the
  sources as table positions, args as interned ids."""
  ids, op, dt, arg, tag, pdata, nsrc, src, args = _table([r._id for r in roots], _fresh_pos(), 0)
  full = np.concatenate([np.zeros(1, np.int32), args])
  return ids, op, dt, full[arg], full[tag], full[pdata], nsrc, src


# ---- building ----
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


# ---- the binary format ----
def _width(maxval: int) -> int:
  return 1 if maxval < 1 << 8 else 2 if maxval < 1 << 16 else 4


_UTYPE = {1: np.dtype("<u1"), 2: np.dtype("<u2"), 4: np.dtype("<u4")}


def _rows_of(table: np.ndarray, ids) -> np.ndarray:
  """The rows of node ids in a table of distinct ids (a scan for a few, a sort for many)."""
  want = np.asarray(ids, np.int64)
  if len(want) <= 16: return np.array([np.flatnonzero(table == i)[0] for i in want], np.int64)
  order = np.argsort(table)
  return order[np.searchsorted(table, want, sorter=order)]


def dumps(roots: UOp | Sequence[UOp]) -> bytes:
  """The graph under roots (a UOp or a sequence of UOps) as bytes: see the module docstring for the format."""
  rl, single = _as_roots(roots)
  return _write([r._id for r in rl], _fresh_pos(), 0, single, None)[0]


def _write(root_ids: list[int], pos: np.ndarray, base: int, single: bool, externals, cache=None, part: int = -1):
  """(bytes, imports, count): the nodes under root_ids that pos does not list yet, written as rows base, base + 1,
  ... of a table (pos gets their rows), in pygrad's format; the rows below base that they use (imports, ascending)
  are the blob's given rows, which the loader supplies. On error pos is as it was. A table of at most part rows
  comes as (counts, node sections, args) instead of bytes: its args the interned objects themselves (pickle's
  small pieces: see _Piece)."""
  if CORE.name == "c":
    ffi, lib = _ffi, _lib
    t = _c_table(root_ids, pos, base)
    try:
      rows = [int(pos[r]) for r in root_ids]
      out = ffi.new("pg_blob **")
      r = lib.pg_serial_encode(t, base, ffi.new("int32_t[]", rows), len(rows), out)
      if r: raise MemoryError("pygrad: out of memory writing a graph") if r == lib.PG_ERR_NOMEM else \
        RuntimeError(f"pygrad: encode failed ({r})")
      b = ffi.gc(out[0], lib.pg_serial_blob_free)
      n, m, nargs, ng = int(t.n), int(t.m), int(t.nargs), int(b.nimports)
      imports = np.frombuffer(ffi.buffer(b.imports, 4 * ng), np.int32).copy()
      if n <= part:
        objs = ARGS.objs
        return ((n, m, len(rows), int(b.srcw), int(b.argw)), bytes(ffi.buffer(b.data, b.size)),
                tuple([objs[a] for a in ffi.unpack(t.args, nargs)])), imports, n
      argb = encode_args(ffi.unpack(t.args, nargs), externals, cache)
      head = _HEAD.pack(MAGIC, VERSION, _F_SINGLE if single else 0, nargs, len(argb), n, m, len(rows), b.srcw, b.argw,
                        ng)
      nodes = ffi.buffer(b.data, b.size)
      crc = zlib.crc32(nodes, zlib.crc32(argb, zlib.crc32(head)))  # the parts' checksum: the bytes copied once
      body = b"".join([head, argb, nodes, _U32.pack(crc)])
    except BaseException:
      pos[np.frombuffer(ffi.buffer(t.ids, 4 * t.n), np.int32)] = -1
      raise
    return body, imports, n
  ids, op, dt, arg, tag, pdata, nsrc, src, args = _table(root_ids, pos, base)
  try:
    old = src < base
    rows = pos[np.array(root_ids, np.int64)].astype(np.int64)
    imports = np.unique(np.concatenate([src[old], rows[rows < base]]))
    local = src.astype(np.int64)
    local[old] = np.searchsorted(imports, src[old])
    local[~old] += len(imports) - base
    rows = np.where(rows < base, np.searchsorted(imports, rows), rows + len(imports) - base)
    cols = (op, dt, arg, tag, pdata, nsrc, local)
    if len(ids) <= part:
      nodes, srcw, argw = _sections(cols, rows, len(imports), len(args))
      blob = (len(ids), len(src), len(rows), srcw, argw), nodes, tuple([ARGS.objs[int(a)] for a in args])
    else: blob = _encode((*cols, args), rows, single, len(imports), externals, cache)
  except BaseException:
    pos[ids] = -1
    raise
  return blob, imports.astype(np.int32), len(ids)


def _encode(cols, root_rows, single: bool, ngiven: int, externals, cache=None) -> bytes:
  """The bytes of a table (op, dtype, arg, tag, pdata, nsrc, src, args) whose first ngiven rows are not stored (the
  loader supplies them): its columns are the other rows, and sources and roots are rows counting the given ones.
  Args are numbered in order of first use, so the bytes do not depend on interning ids. (The pure core's writer:
  csrc/serial.c's pg_serial_encode writes the same bytes.)"""
  op, dt, arg, tag, pdata, nsrc, src, args = cols
  argb = encode_args(args.tolist(), externals, cache)
  nodes, srcw, argw = _sections(cols[:7], root_rows, ngiven, len(args))
  head = _HEAD.pack(MAGIC, VERSION, _F_SINGLE if single else 0, len(args), len(argb), len(op), len(src),
                    len(root_rows), srcw, argw, ngiven)
  body = b"".join([head, argb, nodes])
  return body + _U32.pack(zlib.crc32(body))


def _sections(cols, root_rows, ngiven: int, nargs: int) -> tuple[bytes, int, int]:
  """(bytes, source width, arg width) of the node sections of _encode's table (op, dtype, arg, tag, pdata, nsrc,
  src): everything after the arg table but the checksum."""
  op, dt, arg, tag, pdata, nsrc, src = cols
  n = len(op)
  argw = _width(nargs)
  rows = np.repeat(np.arange(ngiven, ngiven + n, dtype=np.int64), nsrc)
  delta = rows - src
  srcw = _width(int(delta.max()) if len(delta) else 0)
  big = nsrc >= 255
  side = np.nonzero((tag != 0) | (pdata != 0))[0]
  parts = [op.astype(np.uint8).tobytes(), dt.astype(np.uint8).tobytes(),
           np.minimum(nsrc, 255).astype(np.uint8).tobytes(), nsrc[big].astype("<u4").tobytes(),
           arg.astype(_UTYPE[argw]).tobytes(), delta.astype(_UTYPE[srcw]).tobytes(),
           np.asarray(root_rows).astype("<u4").tobytes(), _U32.pack(len(side)),
           np.stack([side, tag[side], pdata[side]], 1).astype("<u4").tobytes()]
  return b"".join(parts), srcw, argw


def _col(r: _Reader, k: int, dtype, what: str) -> np.ndarray:
  dtype = np.dtype(dtype)
  if k > (r.end - r.p) // max(dtype.itemsize, 1): raise ValueError(f"pygrad.loads: truncated data ({what})")
  return np.frombuffer(r.take(k * dtype.itemsize, what), dtype)


def loads(data: bytes | bytearray | memoryview, allow_import: bool = False) -> UOp | list[UOp]:
  """The graph `dumps` wrote: a UOp if one was saved, else a list of UOps. Bad bytes raise ValueError.
  allow_import: let loading import the modules that saved callables name (otherwise they must be imported)."""
  try:
    memoryview(data)
  except TypeError:  # any buffer (bytes, bytearray, memoryview, mmap, a uint8 array) is taken
    raise TypeError(f"pygrad.loads: expected bytes (what pygrad.dumps returns), got {type(data).__name__}") from None
  return _decode(data, allow_import, None, None)


def _decode(data, allow_import: bool, externals, given):
  """loads, for a table whose first rows are the live nodes given (an int32 array of ids; then the result is
  (roots, the ids of the stored rows)), with callables written as indices into externals (pickle's)."""
  mv = memoryview(data).cast("B")
  if len(mv) < _HEAD.size + 4: raise ValueError(f"pygrad.loads: {len(mv)} bytes is too short for a pygrad graph")
  magic, ver, flags, nargs, argbytes, n, m, nroots, srcw, argw, ng = _HEAD.unpack_from(mv, 0)
  if magic != MAGIC: raise ValueError("pygrad.loads: not a pygrad graph (bad magic)")
  if ver != VERSION: raise ValueError(f"pygrad.loads: format version {ver}, this pygrad reads version {VERSION}")
  end = len(mv) - 4
  if zlib.crc32(mv[:end]) != _U32.unpack_from(mv, end)[0]: raise ValueError("pygrad.loads: checksum mismatch")
  if flags & ~_F_SINGLE or srcw not in _UTYPE or argw not in _UTYPE:
    raise ValueError(f"pygrad.loads: bad header (flags {flags}, widths {srcw}/{argw})")
  if ng != (0 if given is None else len(given)):
    if given is None: raise ValueError("pygrad.loads: this graph continues another one (a piece of a pickle)")
    raise ValueError(f"pygrad.loads: a piece continuing {ng} rows was given {len(given)}")
  room = end - _HEAD.size
  if argbytes > room or nargs > argbytes or n > room // 3 or m > room or nroots > room // 4 or ng + n >= 1 << 31:
    raise ValueError(f"pygrad.loads: counts larger than the data (args {nargs}, nodes {n}, sources {m}, roots "
                     f"{nroots})")
  if (flags & _F_SINGLE) and nroots != 1: raise ValueError(f"pygrad.loads: a single-root graph with {nroots} roots")
  forgets = ARGS.forgets  # read before interning: a forget after it is seen
  objs, keys, cache_as, kept, ids = decode_args(bytes(mv[_HEAD.size:_HEAD.size + argbytes]), nargs, externals,
                                                allow_import)
  # every arg still interned under the id it had: no id forgotten since they were interned (a counter; ~210 cold dict
  # lookups otherwise), or each still naming its object (an id forgotten names none)
  if kept is not None and (kept[2] == ARGS.forgets or all(map(is_, map(ARGS.objs.get, kept[1]), objs))):
    ids = kept[0]
  if cache_as is not None:  # the table may be cached: intern now, and cache the interned objects with their ids
    if ids is None:  # (the C decoder interned them, the values already the interned objects)
      ids = _intern_all(objs, keys)
      objs = list(map(ARGS.objs.get, ids[1:].tolist(), objs))
    keep(cache_as, objs, keys, (ids, ids[1:].tolist(), forgets))
  # an arg table loaded before in this process: its graph's leaves were inferred then, and the store's signature
  # cache has them (if it was emptied since, the builder asks for each): no pass over the rows to look for them
  out = _nodes(_Reader(mv, _HEAD.size + argbytes, end), n, m, nroots, srcw, argw, objs, keys, given, ids,
               kept is None)
  if given is not None: return out
  return out[0] if flags & _F_SINGLE else out


def _nodes(r: _Reader, n: int, m: int, nroots: int, srcw: int, argw: int, objs: list, keys, given, ids=None,
           infer: bool = True):
  """The nodes of a table's node sections (read by r, to its end; the counts checked against the data size), their
  args objs (with their interning keys, if known), built after the rows given: see _decode (infer: see _build)."""
  ng = 0 if given is None else len(given)
  read = _nodes_c if CORE.name == "c" else _nodes_py
  op, dt, start, src, argref, tagref, pdref, rts, nside = read(r, n, m, nroots, srcw, argw, len(objs), ng)
  if nside: _check_pdata(pdref, objs)
  else: pdref = None  # no side entries: no row has metadata or a tag (and the builder need not look)
  return _build(op, dt, start, src, argref, tagref, pdref, objs, rts, given, keys, ids, infer, not nside)


def _nodes_py(r: _Reader, n: int, m: int, nroots: int, srcw: int, argw: int, nargs: int, ng: int):
  """The columns of a table's node sections for ng given rows and n stored ones, read by r to its end: (op, dtype,
  start, src, arg, tag, pdata, roots, side entries), every count and reference checked (the pure core's reader;
  the C core's is csrc/serial_decode.c, which checks the same, in this order)."""
  end = r.end
  op = _col(r, n, np.uint8, "ops").astype(np.int32)
  dt = _col(r, n, np.uint8, "dtypes").astype(np.int32)
  ns = _col(r, n, np.uint8, "source counts").astype(np.int64)
  big = ns == 255
  ns[big] = _col(r, int(big.sum()), "<u4", "source counts")
  # int64 until checked: a u32 above 2**31 cast to int32 first wrapped negative, passed the check and named an arg
  # counted from the end of the table
  argref = _col(r, n, _UTYPE[argw], "args").astype(np.int64)
  if ns.sum() != m: raise ValueError(f"pygrad.loads: source counts add up to {int(ns.sum())}, the header says {m}")
  delta = _col(r, m, _UTYPE[srcw], "sources").astype(np.int64)
  rts = _col(r, nroots, "<u4", "roots").astype(np.int64)
  nside = r.u32("side table size")
  side = _col(r, 3 * nside, "<u4", "side table").reshape(nside, 3).astype(np.int64)
  if r.p != end: raise ValueError(f"pygrad.loads: {end - r.p} bytes after the graph")
  if (op >= _NOPS).any(): raise ValueError(f"pygrad.loads: unknown op {int(op[op >= _NOPS][0])}")
  if (dt >= _NDT).any(): raise ValueError(f"pygrad.loads: unknown dtype {int(dt[dt >= _NDT][0])}")
  if (argref > nargs).any(): raise ValueError("pygrad.loads: an arg reference is outside the arg table")
  argref = argref.astype(np.int32)
  src = np.repeat(np.arange(ng, ng + n, dtype=np.int64), ns) - delta
  if m and (src < 0).any(): raise ValueError("pygrad.loads: a source reference points before the first node")
  if (delta == 0).any(): raise ValueError("pygrad.loads: a node is its own source (a cycle)")
  if len(rts) and rts.max() >= ng + n: raise ValueError("pygrad.loads: a root is outside the node table")
  tagref, pdref = np.zeros(n, np.int32), np.zeros(n, np.int32)
  if nside:
    rows, tg, pd = side[:, 0], side[:, 1], side[:, 2]
    if rows.max() >= n or tg.max() > nargs or pd.max() > nargs:
      raise ValueError("pygrad.loads: a side entry is outside the node or arg table")
    tagref[rows], pdref[rows] = tg, pd
  if ng:  # the given rows come first: no sources, no args
    z32 = np.zeros(ng, np.int32)
    op, dt, argref, tagref, pdref = (np.concatenate([z32, c]) for c in (op, dt, argref, tagref, pdref))
    ns = np.concatenate([np.zeros(ng, np.int64), ns])
  return op, dt, _starts(ns), np.ascontiguousarray(src, np.int32), argref, tagref, pdref, rts, nside


def _check_pdata(pdref: np.ndarray, objs: list) -> None:
  for p in np.unique(pdref[pdref != 0]):
    v = objs[int(p) - 1]
    if type(v) is not tuple or not all(type(x) is Metadata for x in v):
      raise ValueError(f"pygrad.loads: node metadata must be a tuple of Metadata, got {v!r}")


_SECTIONS = ("ops", "dtypes", "source counts", "args", "sources", "roots", "side table size", "side table")


def _nodes_c(r: _Reader, n: int, m: int, nroots: int, srcw: int, argw: int, nargs: int, ng: int):
  """_nodes' columns (op, dtype, start, src, arg, tag, pdata, roots, side entries), read by one C call
  (csrc/serial_decode.c), which checks what _nodes checks, in the same order, and names the same problems."""
  ffi, lib = _ffi, _lib
  k = ng + n
  if m > r.end - r.p: raise ValueError("pygrad.loads: truncated data (sources)")
  i32, i64 = np.empty(5 * k + m, np.int32), np.empty(k + 1 + nroots, np.int64)
  op, dt, arg, tag, pd, src = i32[:k], i32[k:2 * k], i32[2 * k:3 * k], i32[3 * k:4 * k], i32[4 * k:5 * k], i32[5 * k:]
  start, rts = i64[:k + 1], i64[k + 1:]
  nside, what = ffi.new("int64_t[2]"), ffi.new("int64_t *")
  p32, p64 = ffi.from_buffer("int32_t[]", i32), ffi.from_buffer("int64_t[]", i64)
  data = ffi.from_buffer("uint8_t[]", r.b)
  e = lib.pg_serial_decode(data + r.p, r.end - r.p, n, m, nroots, srcw, argw, ng, nargs, _NOPS, _NDT, p32, p32 + k, p64,
                           p32 + 5 * k, p32 + 2 * k, p32 + 3 * k, p32 + 4 * k, p64 + k + 1, nside, what)
  if e == 0: return op, dt, start, src, arg, tag, pd, rts, int(nside[0])
  w = int(what[0])
  raise ValueError({lib.PG_DEC_TRUNC: f"pygrad.loads: truncated data ({_SECTIONS[w] if 0 <= w < 8 else w})",
                    lib.PG_DEC_SUM: f"pygrad.loads: source counts add up to {w}, the header says {m}",
                    lib.PG_DEC_TRAIL: f"pygrad.loads: {w} bytes after the graph",
                    lib.PG_DEC_OP: f"pygrad.loads: unknown op {w}", lib.PG_DEC_DTYPE: f"pygrad.loads: unknown dtype {w}",
                    lib.PG_DEC_ARG: "pygrad.loads: an arg reference is outside the arg table",
                    lib.PG_DEC_BEFORE: "pygrad.loads: a source reference points before the first node",
                    lib.PG_DEC_CYCLE: "pygrad.loads: a node is its own source (a cycle)",
                    lib.PG_DEC_ROOT: "pygrad.loads: a root is outside the node table",
                    lib.PG_DEC_SIDE: "pygrad.loads: a side entry is outside the node or arg table"}.get(
                      e, f"pygrad.loads: decoding failed ({e})"))


def save(path: str | os.PathLike[str], roots: UOp | Sequence[UOp]) -> None:
  """Write dumps(roots) to path (written to a temporary name first, so a crash never leaves half a file)."""
  data = dumps(roots)
  tmp = f"{os.fspath(path)}.tmp{os.getpid()}"
  with open(tmp, "wb") as f: f.write(data)
  os.replace(tmp, path)


def load(path: str | os.PathLike[str], allow_import: bool = False) -> UOp | list[UOp]:
  """The graph saved at path (see loads)."""
  with open(path, "rb") as f: return loads(f.read(), allow_import)


# ---- pickle ----
# One pickling call writes one shared node table, however many UOps it meets: the first UOp's reduce writes a piece
# holding its graph, a later UOp that adds nodes writes a piece holding only those (its sources in earlier pieces are
# rows of the table), and a UOp already in the table is a row. A piece refers to the piece before it, and pickle's
# memo writes each piece once per stream and refers back to it after (also in a stream that meets a piece its memo
# lacks: then the pieces before it come along, so every stream is complete). The table of a pickling call lives in
# a per-thread session that exists exactly as long as something holds one of its pieces -- the pickler's memo
# while the call runs -- so the next call starts a new table.
_local = threading.local()


class _Session:
  """The table of one pickling call: pos (node id -> row), the rows so far, the UOps that keep its nodes (and so
  their ids, and their args' ids) alive, a weak reference to its newest piece, and the bytes of args written."""
  __slots__ = ("pos", "n", "keep", "last", "args", "__weakref__")

  def __init__(self):
    self.pos, self.n, self.keep, self.last, self.args = None, 0, [], None, {}


class _Piece:
  """Rows [base, base + k) of a session's table: pickled as the piece before it, the rows its sources use from the
  earlier pieces, and the bytes of its nodes (pygrad's format, those rows given). A piece of at most _PART rows --
  a UOp of a container that adds a few nodes to what the items before it wrote -- is its node sections, their
  counts and its args as the interned objects, which pickle writes itself: its memo writes each arg once per
  stream, and loading the piece decodes no arg table (with an arg table, each piece cost ~100 us: 32,260 pieces
  loaded 17x slower than one pygrad.loads of the whole table)."""
  __slots__ = ("session", "prev", "imports", "blob", "ext", "__weakref__")

  def __reduce__(self):
    if type(self.blob) is tuple: return _load_part, (self.prev, self.imports, *self.blob)
    return _load_piece, (self.prev, self.imports, self.blob, self.ext)


def _session() -> _Session:
  """This thread's open session, or a new one (a session whose newest piece is gone is over)."""
  ref = getattr(_local, "session", None)
  s = ref() if ref is not None else None
  if s is None or s.last is None or s.last() is None:
    s = _Session()
    _local.session = weakref.ref(s)
  return s


def reduce_uop(u: UOp):
  s = _session()
  s.pos = _fresh_pos(s.pos)
  row = int(s.pos[u._id])
  if row < 0:
    ext: list = []
    blob, imports, k = _write([u._id], s.pos, s.n, True, ext, s.args, _PART)
    p = _Piece()
    p.session, p.prev, p.imports, p.blob, p.ext = s, None if s.last is None else s.last(), \
      imports.astype("<u4").tobytes(), blob, tuple(ext)
    s.n, s.last = s.n + k, weakref.ref(p)
    s.keep.append(u)
    row = s.n - 1
  return _load_row, (s.last(), row)


class _Loaded:
  """The nodes of the pieces loaded so far: their ids by row (shared with the pieces after it while they append in
  order), and each piece's root, which keeps its rows alive."""
  __slots__ = ("ids", "end", "root", "prev")


def _load_piece(prev, imports: bytes, blob: bytes, ext: tuple) -> _Loaded:
  return _append(prev, imports, lambda given: _decode(blob, False, list(ext), given))


def _load_part(prev, imports: bytes, counts: tuple, nodes: bytes, args: tuple) -> _Loaded:
  if type(counts) is not tuple or len(counts) != 5 or any(type(c) is not int or not 0 <= c < 1 << 31 for c in counts) \
     or type(nodes) is not bytes or type(args) is not tuple:
    raise ValueError("pygrad: bad pickle (a piece's counts, nodes or args)")
  n, m, nroots, srcw, argw = counts
  if srcw not in _UTYPE or argw not in _UTYPE or n > len(nodes) // 3 or m > len(nodes) or nroots != 1:
    raise ValueError(f"pygrad: bad pickle (a piece of {n} nodes, {m} sources, {nroots} roots in {len(nodes)} bytes)")

  def decode(given):
    if len(given) + n >= 1 << 31: raise ValueError("pygrad: bad pickle (a table of more than 2**31 rows)")
    try: return _nodes(_Reader(nodes, 0, len(nodes)), n, m, nroots, srcw, argw, list(args), None, given)
    except TypeError as e: raise ValueError(f"pygrad: bad pickle (an arg: {e})") from None
  return _append(prev, imports, decode)


def _append(prev, imports: bytes, decode) -> _Loaded:
  """The table so far with a piece's rows appended: decode(the ids of the rows it imports) builds them."""
  if prev is not None and type(prev) is not _Loaded: raise ValueError("pygrad: bad pickle (a piece after a non-piece)")
  if type(imports) is not bytes: raise ValueError("pygrad: bad pickle (a piece's imports)")
  base = 0 if prev is None else prev.end
  imp = np.frombuffer(imports, "<u4", len(imports) // 4).astype(np.int64)
  if len(imp) and imp.max() >= base: raise ValueError("pygrad: bad pickle (a piece uses rows not loaded before it)")
  if prev is None: rows = [np.zeros(0, np.int32), 0]
  elif prev.ids[1] == base: rows = prev.ids  # the pieces come in order: append to the shared array
  else: rows = [prev.ids[0][:base].copy(), base]
  got = decode(rows[0][imp])
  if len(got[0]) != 1: raise ValueError("pygrad: bad pickle (a piece without one root)")
  new = got[1]
  end = base + len(new)
  if end > len(rows[0]):
    grown = np.empty(max(end, 2 * len(rows[0])), np.int32)
    grown[:base] = rows[0][:base]
    rows[0] = grown
  rows[0][base:end] = new
  rows[1] = end
  out = _Loaded()
  out.ids, out.end, out.root, out.prev = rows, end, got[0][0], prev
  return out


def _load_row(t, row) -> UOp:
  if type(t) is not _Loaded or type(row) is not int or not 0 <= row < t.end:
    raise ValueError("pygrad: bad pickle (a node row outside its table)")
  return handle(int(t.ids[0][row]))


def reduce_walk(w: Walk):
  """A walk pickles as its root (a UOp, in the pickling call's shared table) and the rows of the nodes it lists in
  its root's toposort."""
  table = np.asarray(CORE.toposort([w._roots._id], True), np.int64)
  return _unpickle_walk, (w._roots, _rows_of(table, np.asarray(w.ids, np.int64)).astype("<u4").tobytes())


def _unpickle_walk(root, rows: bytes) -> Walk:
  if type(root) is not UOp: raise ValueError("pygrad: bad pickle (a walk without its root)")
  table = np.asarray(CORE.toposort([root._id], True), np.int32)
  r = np.frombuffer(rows, "<u4").astype(np.int64)
  if len(r) and r.max() >= len(table): raise ValueError("pygrad: bad pickle (a walk row outside its graph)")
  return Walk(table[r].tolist(), root)


__all__ = ["build", "dumps", "loads", "save", "load", "export", "MAGIC", "VERSION"]
