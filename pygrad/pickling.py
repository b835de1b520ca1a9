"""`pickle` of UOps and Walks (UOp.__reduce__, Walk.__reduce__) through pygrad's own format (pygrad/serialize.py):
one pickling call writes one shared node table, however many UOps, Walks and compiled Programs the pickled
structure holds. Loading a piece builds its nodes with the same builder as `pygrad.loads`, and checks what pickle
hands it (a piece after a non-piece, rows outside the table) with a ValueError."""
from __future__ import annotations
import threading, weakref
import numpy as np
from .core import CORE
from .uop import UOp, Walk, handle
from .serialize import _Reader, _UTYPE, _decode, _fresh_pos, _nodes, _rows_of, _write

_PART = 4096  # a pickle piece of at most this many nodes has its args pickled as objects (see _Piece)

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


__all__ = ["reduce_uop", "reduce_walk"]
