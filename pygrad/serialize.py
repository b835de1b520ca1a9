"""Graphs as data: the node table, the bulk builder `build`, and the binary format of `dumps`/`loads`/`save`/`load`
(also what `pickle` of a UOp or a Walk writes).

A graph is a node table in topological order: per node an op, a dtype, its sources as positions of earlier rows, and
references into an arg table of plain values. On the C core, export is one C call (csrc/serial.c) and so is building
(csrc/serial_build.c): the builder makes every node whose signature (op, dtype, arg, sources' dtypes and shapes) it has
seen, and asks Python (the ordinary `UOp(...)` constructor, with its validation) only for the first node of each
signature and for FUNCTION/CALL/GETTUPLE/AFTER; the store keeps the signatures between loads, so a model's graph is
inferred in Python once per process. The arg table is pygrad/argtable.py's, decoded column by column. Nodes are
hash-consed, so a loaded graph is the live one if it exists. Nothing here recurses on graph depth or on the nesting of
args.

Callables (a CALL's `fxn`, `grad_fxn`) are written as (module, qualified name) and resolved on load from modules
already imported; `loads(..., allow_import=True)` may import the named modules, and nothing else ever runs code.
A callable that cannot be found by its name (a lambda, a local function) is refused when saving: pickle carries
those (pickle writes them with its own machinery, which users know runs code on load).

Pickle writes one node table per pickling call, however many UOps (and Walks, and compiled Programs) the pickled
structure holds: see pygrad/pickling.py."""
from __future__ import annotations
import os, struct, zlib
from operator import is_
from typing import Sequence
import numpy as np
from .core import CORE
from .intern import ARGS
from .argtable import encode_args, decode_args, keep
from .uop import UOp, Metadata
from .builder import _build, _intern_all, _starts, _ffi, _lib, _NOPS, _NDT

MAGIC = b"PYGRAD\x00G"
VERSION = 2  # 2: the arg table by skeleton (pygrad/argtable.py); 1 stored each arg's items in turn
# magic, version, flags, nargs, argbytes, n, nsrc, nroots, srcw, argw, and ngiven: rows before the stored ones that the
# loader supplies (a piece of pickle's shared table continues the pieces before it; 0 in every file dumps writes)
_HEAD = struct.Struct("<8sIIQQQQQBBxxI")
_F_SINGLE = 1                           # flags: one UOp was saved (loads returns it, not a list)
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


__all__ = ["dumps", "loads", "save", "load", "export", "MAGIC", "VERSION"]
