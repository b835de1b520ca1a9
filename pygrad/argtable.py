"""The arg table of pygrad's binary format (pygrad/serialize.py): the distinct args, tags and metadata of a graph as
plain data, stored by shape so that saving and loading do the per-value work in bulk.

An arg's *skeleton* is its structure without its values: a token per item in prefix order (a tuple and an int tuple
carry their length). A graph has few skeletons (every BUFFER arg of a model is `(int, (int, int), str, str)`) and
many args, so the table is

  u32 nskel; per skeleton: u32 ntok, then ntok tokens (u8 tag, and a u32 count after T_TUPLE and T_INTS);
  nargs x u32: each arg's skeleton; then per skeleton, for the args that have it (in arg order), one column per
  token that holds data: i64 (T_INT), f64 (T_FLOAT), count x i64 (T_INTS), u8 (T_OPS, T_DTYPE), u32 (T_EXTERN),
  or u32 lengths and the bytes (T_STR as UTF-8, T_BYTES, T_BIGINT as little-endian two's complement).

Loading decodes each column with one numpy call and builds the values of a skeleton's args together (a tuple column
is a zip of its item columns), with their interning keys (intern.argkey's form) built the same way. Nothing recurses:
skeletons are read and assembled with explicit stacks, nesting is bounded by _MAX_NEST, and the values a table
expands to are bounded by its size (_budget), so hostile bytes cannot ask for unbounded memory. Callables are
(module, qualified name) pairs resolved from imported modules (or imported, if allowed), or indices into pickle's
externals: loading runs no other code."""
from __future__ import annotations
import importlib, struct, sys, threading
from typing import NamedTuple
from itertools import chain, repeat
from operator import is_
import numpy as np
from .ops import Ops
from .dtype import DType, BY_ID
from .intern import ARGS, argkey, _INTS
from .core import CORE
from .uop import CallInfo, Metadata

(T_NONE, T_FALSE, T_TRUE, T_INT, T_BIGINT, T_FLOAT, T_STR, T_TUPLE, T_OPS, T_DTYPE, T_META, T_CALLINFO, T_FUNC,
 T_EXTERN, T_BYTES, T_INTS) = range(16)  # T_INTS: a non-empty tuple of int64s, packed
_NOPS, _NDT = len(Ops), len(BY_ID)
_OPS = tuple(Ops)
_DTYPES = tuple(BY_ID)
_C_DECODE = [getattr(CORE, "args_decode", None)]  # the C core's decoder (csrc/pyargs.c); None: decode in Python
_MAX_BIGINT = 1 << 16                   # bytes of one integer arg
_MAX_NEST = 100                         # tuples in tuples: interning compares args recursively, so bound it
_I64 = (-(1 << 63), (1 << 63) - 1)
_NONE_KEY = (type(None), None)
_U32 = struct.Struct("<I")
_KIDS = {T_META: 3, T_CALLINFO: 5, T_FUNC: 2}   # containers of a fixed number of items
_CONST = {T_NONE: None, T_FALSE: False, T_TRUE: True}
_VARLEN = (T_STR, T_BYTES, T_BIGINT)
_INTLIKE = (T_INT, T_BIGINT)                    # items whose value is an int: a tuple of only these keys as _INTS
_FLAT = {int: T_INT, str: T_STR, float: T_FLOAT, bytes: T_BYTES, Ops: T_OPS, tuple: T_INTS}  # _columns' item types
_JUST_INT = {int}


def _budget(argbytes: int) -> int:
  """How many values (tokens times args) a table of argbytes bytes may expand to: every arg costs at least its 4-byte
  skeleton number, so this admits 4 tokens per byte beyond a fixed allowance, and bounds what loading allocates."""
  return 4 * argbytes + (1 << 16)


# ---- saving ----
def _func_ref(f, externals) -> tuple:
  """How a callable is written: an index into pickle's externals, or (module, qualified name)."""
  if externals is not None:
    externals.append(f)
    return (T_EXTERN, len(externals) - 1)
  mod, qual = getattr(f, "__module__", None), getattr(f, "__qualname__", None)
  if type(mod) is str and type(qual) is str and "<" not in qual:
    try:
      if resolve(mod, qual, False) is f: return (T_FUNC, mod, qual)
    except ValueError:
      pass
  raise ValueError(f"cannot save {f!r} by name: it is not reachable as {mod}.{qual}; define it at module level, "
                   f"or use pickle, which carries any picklable callable")


def _split(x, externals) -> tuple[tuple, list]:
  """(skeleton, leaf values in token order) of one arg, walked with an explicit stack."""
  toks: list = []
  leaves: list = []
  todo = [x]
  while todo:
    x = todo.pop()
    t = type(x)
    if x is None: toks.append(T_NONE)
    elif t is bool: toks.append(T_TRUE if x else T_FALSE)
    elif t is int:
      if _I64[0] <= x <= _I64[1]: toks.append(T_INT); leaves.append(x)  # noqa: E702
      else: toks.append(T_BIGINT); leaves.append(x.to_bytes((x.bit_length() + 8) // 8, "little", signed=True))  # noqa
    elif t is str: toks.append(T_STR); leaves.append(x.encode("utf-8", "surrogatepass"))  # noqa: E702
    elif t is tuple:
      if x and all(type(e) is int and _I64[0] <= e <= _I64[1] for e in x):  # a shape or axes: one column
        toks += (T_INTS, len(x))
        leaves.append(x)
      else:
        toks += (T_TUPLE, len(x))
        todo.extend(reversed(x))
    elif t is float: toks.append(T_FLOAT); leaves.append(x)  # noqa: E702
    elif t is bytes: toks.append(T_BYTES); leaves.append(x)  # noqa: E702
    elif t is Ops: toks.append(T_OPS); leaves.append(int(x))  # noqa: E702
    elif isinstance(x, DType): toks.append(T_DTYPE); leaves.append(x.id)  # noqa: E702
    elif t is Metadata:
      toks.append(T_META)
      todo.extend(reversed((x.name, x.caller, x.backward)))
    elif t is CallInfo:
      toks.append(T_CALLINFO)
      todo.extend(reversed((x.grad_fxn, x.name, x.precompile, x.precompile_backward, x.fxn)))
    elif callable(x):
      ref = _func_ref(x, externals)
      toks.append(ref[0])
      if ref[0] == T_EXTERN: leaves.append(ref[1])
      else: todo.extend(reversed(ref[1:]))
    else: raise ValueError(f"cannot save an arg of type {t.__name__}: {x!r}")
  return tuple(toks), leaves


def _data_tokens(skel: tuple) -> list[tuple[int, int]]:
  """(tag, count) of a skeleton's tokens that hold data, in order (count: an int tuple's length, else 0)."""
  out, i = [], 0
  while i < len(skel):
    t = skel[i]
    if t == T_TUPLE or t == T_INTS:
      if t == T_INTS: out.append((t, skel[i + 1]))
      i += 2
      continue
    if t not in _CONST and t not in _KIDS: out.append((t, 0))
    i += 1
  return out


class _Ascii(NamedTuple):
  """A column of ASCII strings, encoded together: a character is a byte, so their lengths are their sizes."""
  blob: bytes
  lens: list


def _columns(xs: list, key) -> tuple[tuple, list] | None:
  """(skeleton, leaf columns) of the args xs, which share key (their type, or for tuples their length), when one
  skeleton fits them all (each tuple position holding one type; ints within int64, int tuples of one length, no
  bools or None); else None. A tuple position's type is read off its column, not off each arg: ~5x cheaper."""
  flat = type(key) is int
  toks: list = [T_TUPLE, key] if flat else []
  cols: list = []
  for col in zip(*xs) if flat else (xs,):
    if flat:
      ts = set(map(type, col))
      if len(ts) != 1: return None
      t = ts.pop()
    else: t = key
    k = 1
    if t is tuple:
      lens = set(map(len, col))
      if len(lens) != 1 or 0 in lens or set(map(type, chain.from_iterable(col))) != _JUST_INT: return None
      k = lens.pop()
      toks += (T_INTS, k)
    elif t in _FLAT: toks.append(_FLAT[t])
    else: return None
    if t is int or t is tuple:  # fromiter: np.array's nested-list discovery costs ~10x more
      try: col = np.fromiter(chain.from_iterable(col) if t is tuple else col, "<i8", len(col) * k)
      except OverflowError: return None  # an int beyond int64: a T_BIGINT, so a skeleton per arg
    elif t is str:
      s = "".join(col)
      col = _Ascii(s.encode("ascii"), list(map(len, col))) if s.isascii() else \
        [v.encode("utf-8", "surrogatepass") for v in col]
    elif t is Ops: col = list(map(int, col))
    cols.append(col)
  return tuple(toks), cols


_ENC: dict = {}  # tuple of interned ids -> (their objects, the arg table, ARGS.forgets then): the tables dumps wrote
# last, oldest first
_ENC_LOCK = threading.Lock()


def encode_args(aids: list[int], externals, cache: dict | None = None) -> bytes:
  """The arg table of the interned ids aids. Args of one shape (a model's BUFFER args) are split into columns in
  bulk; others one by one. cache (pickle's session) maps an id to its (skeleton, leaves) from the one-by-one path,
  for args that name no external (those name an index into one piece's externals). Without either, a table of plain
  data written lately for the same ids is reused while every id still names the object it named then (a forgotten
  id names none): the bytes depend only on those objects, and a model saved again pays for its args once."""
  if externals is not None or cache is not None: return _encode_args(aids, externals, cache)
  key = tuple(aids)
  hit = _ENC.get(key)
  if hit is not None and (hit[2] == ARGS.forgets or all(map(is_, map(ARGS.objs.get, key), hit[0]))): return hit[1]
  forgets = ARGS.forgets  # read before the objects: a forget after it is seen
  objs = tuple(map(ARGS.objs.__getitem__, key))
  data = _encode_args(aids, None, None)
  if len(data) <= _CACHE_BYTES // _CACHE_TABLES and _plain_table(data):
    with _ENC_LOCK:
      _ENC.pop(key, None)
      _ENC[key] = (objs, data, forgets)
      while len(_ENC) > _CACHE_TABLES: del _ENC[next(iter(_ENC))]
  return data


def _plain_table(data: bytes) -> bool:
  """Whether every skeleton of an arg table holds only plain data (_PLAIN: no callable, which is written by name)."""
  skels, _ = _read_skeletons(data, 0, len(data))
  return all(t in _PLAIN for toks in skels for t, _ in toks)


def _encode_args(aids: list[int], externals, cache: dict | None) -> bytes:
  objs = ARGS.objs
  vals = [objs[a] for a in aids]
  groups: dict = {}  # by type, or for a tuple its length (few distinct): the args that have it
  for i, x in enumerate(vals):
    k = len(x) if type(x) is tuple else type(x)
    g = groups.get(k)
    if g is None: g = groups[k] = []
    g.append(i)
  skels: dict = {}   # skeleton -> its number
  cols: list = []    # per skeleton, its leaf columns
  which = np.empty(len(aids), "<u4")
  rows: dict = {}    # skeleton number -> the leaf lists of the args split one by one
  work = list(groups.items())
  for k, g in work:  # (grows: a group of tuples whose positions mix types is regrouped by those types)
    got = _columns([vals[i] for i in g], k if type(k) is int else len(k) if type(k) is tuple else k) \
      if len(g) > 1 else None
    if got is not None:  # a group's key is part of its skeleton: no other group shares the skeleton
      which[g] = skels[got[0]] = len(cols)
      cols.append(got[1])
      continue
    if type(k) is int and len(g) > 1:
      sub: dict = {}
      for i in g:
        t = tuple(map(type, vals[i]))
        sg = sub.get(t)
        if sg is None: sg = sub[t] = []
        sg.append(i)
      if len(sub) > 1:
        work.extend(sub.items())
        continue
    for i in g:
      hit = None if cache is None else cache.get(aids[i])
      if hit is None:
        nx = 0 if externals is None else len(externals)
        hit = _split(vals[i], externals)
        if cache is not None and (externals is None or len(externals) == nx): cache[aids[i]] = hit
      s = skels.get(hit[0])
      if s is None:
        s = skels[hit[0]] = len(cols)
        cols.append(None)
        rows[s] = []
      rows[s].append(hit[1])
      which[i] = s
  for s, r in rows.items(): cols[s] = list(zip(*r))
  counts = np.bincount(which.astype(np.int64), minlength=len(cols)).tolist() if len(aids) else [0] * len(cols)
  out = [_U32.pack(len(skels))]
  tokens = 0
  for skel, s in skels.items():
    ntok = len(skel) - _ncounts(skel)
    b = bytearray(_U32.pack(ntok))
    i = 0
    while i < len(skel):
      b.append(skel[i])
      if skel[i] == T_TUPLE or skel[i] == T_INTS:
        b += _U32.pack(skel[i + 1])
        i += 1
      i += 1
    out.append(bytes(b))
    tokens += counts[s] * ntok
  out.append(which.tobytes())
  for skel, s in skels.items():
    for (t, _), col in zip(_data_tokens(skel), cols[s]):
      if t == T_INT or t == T_INTS: out.append(np.asarray(col, "<i8").tobytes())
      elif t == T_FLOAT: out.append(np.asarray(col, "<f8").tobytes())
      elif t == T_OPS or t == T_DTYPE: out.append(bytes(col))
      elif t == T_EXTERN: out.append(np.asarray(col, "<u4").tobytes())
      elif type(col) is _Ascii:
        out.append(np.fromiter(col.lens, "<u4", len(col.lens)).tobytes())
        out.append(col.blob)
      else:
        out.append(np.fromiter(map(len, col), "<u4", len(col)).tobytes())
        out.append(b"".join(col))
  data = b"".join(out)
  if tokens > _budget(len(data)):
    raise ValueError(f"cannot save these args: {tokens} items in {len(data)} bytes (more than a few None/True/False "
                     f"items per arg, in many args) exceed what pygrad.loads accepts")
  return data


def _ncounts(skel: tuple) -> int:
  """How many entries of a skeleton tuple are counts (after T_TUPLE/T_INTS), not tokens."""
  n, i = 0, 0
  while i < len(skel):
    if skel[i] == T_TUPLE or skel[i] == T_INTS:
      n += 1
      i += 1
    i += 1
  return n


# ---- loading ----
def resolve(mod: str, qual: str, allow_import: bool):
  """The object named qual in module mod: from sys.modules, or imported if allowed. Nothing else runs."""
  m = sys.modules.get(mod)
  if m is None:
    if not allow_import:
      raise ValueError(f"callable {mod}.{qual}: module {mod!r} is not imported (import it first, or pass "
                       f"allow_import=True to let loading import it)")
    try: m = importlib.import_module(mod)
    except Exception as e: raise ValueError(f"callable {mod}.{qual}: cannot import {mod!r}: {e}") from None
  o = m
  for part in qual.split("."):
    if not part.isidentifier(): raise ValueError(f"callable {mod}.{qual}: bad name")
    try: o = getattr(o, part)
    except AttributeError: raise ValueError(f"callable {mod}.{qual}: {mod!r} has no {qual!r}") from None
  if not callable(o): raise ValueError(f"callable {mod}.{qual}: not callable")
  return o


def _cut(what: str) -> ValueError: return ValueError(f"pygrad.loads: truncated data ({what})")


def _read_skeletons(b: bytes, p: int, end: int) -> tuple[list[list[tuple[int, int]]], int]:
  """The skeletons at b[p:end] as token lists [(tag, count)], each checked to be exactly one value nested at most
  _MAX_NEST deep; and the position after them."""
  if p + 4 > end: raise _cut("skeleton count")
  nskel = _U32.unpack_from(b, p)[0]
  p += 4
  if nskel > (end - p) // 5: raise ValueError(f"pygrad.loads: {nskel} arg skeletons do not fit in the data")
  skels = []
  for _ in range(nskel):
    if p + 4 > end: raise _cut("skeleton size")
    ntok = _U32.unpack_from(b, p)[0]
    p += 4
    if ntok == 0 or ntok > end - p: raise ValueError(f"pygrad.loads: an arg skeleton of {ntok} tokens")
    toks: list = []
    open_: list = []  # items still wanted by each open container
    for _ in range(ntok):
      if not open_ and toks: raise ValueError("pygrad.loads: an arg skeleton holds more than one value")
      if p >= end: raise _cut("arg tag")
      t = b[p]
      p += 1
      k = 0
      if t == T_TUPLE or t == T_INTS:
        if p + 4 > end: raise _cut("size")
        k = _U32.unpack_from(b, p)[0]
        p += 4
      elif t > T_INTS: raise ValueError(f"pygrad.loads: unknown arg tag {t}")
      toks.append((t, k))
      if open_: open_[-1] -= 1
      want = k if t == T_TUPLE else _KIDS.get(t, 0)
      if want:
        if t == T_TUPLE and want > ntok:
          raise ValueError(f"pygrad.loads: a tuple of {want} items is longer than the data")
        open_.append(want)
        if len(open_) > _MAX_NEST: raise ValueError(f"pygrad.loads: args nested deeper than {_MAX_NEST}")
      while open_ and open_[-1] == 0: open_.pop()
    if open_: raise ValueError("pygrad.loads: truncated data (an arg is incomplete)")
    skels.append(toks)
  return skels, p


def _column(b: bytes, p: int, end: int, t: int, k: int, cnt: int, externals) -> tuple[list, list, int]:
  """The cnt values of a data token (tag t, count k) at b[p:], their interning keys, and the position after."""
  if t == T_INT or t == T_INTS or t == T_FLOAT:
    w = 8 * (k if t == T_INTS else 1)
    if w * cnt > end - p: raise _cut("int tuple arg" if t == T_INTS else "float arg" if t == T_FLOAT else "int arg")
    a = np.frombuffer(b, "<f8" if t == T_FLOAT else "<i8", cnt * w // 8, p)
    p += w * cnt
    if t == T_INT:
      vals = a.tolist()
      return vals, list(zip(repeat(int), vals)), p
    if t == T_FLOAT:
      vals = a.tolist()
      return vals, [argkey(v) for v in vals], p
    vals = list(map(tuple, a.reshape(cnt, k).tolist()))
    return vals, list(zip(repeat(_INTS), vals)), p
  if t == T_OPS or t == T_DTYPE or t == T_EXTERN:
    w = 4 if t == T_EXTERN else 1
    if w * cnt > end - p: raise _cut("external" if t == T_EXTERN else "op or dtype")
    a = np.frombuffer(b, "<u4" if w == 4 else np.uint8, cnt, p)
    p += w * cnt
    if t == T_OPS:
      if cnt and a.max() >= _NOPS: raise ValueError(f"pygrad.loads: unknown op {int(a.max())} in an arg")
      vals = [_OPS[v] for v in a.tolist()]
      return vals, list(zip(repeat(Ops), vals)), p
    if t == T_DTYPE:
      if cnt and a.max() >= _NDT: raise ValueError(f"pygrad.loads: unknown dtype {int(a.max())} in an arg")
      vals = [BY_ID[v] for v in a.tolist()]
      return vals, [(type(v), v) for v in vals], p
    if cnt and (externals is None or a.max() >= len(externals)):
      raise ValueError(f"pygrad.loads: external callable {int(a.max())} missing")
    vals = [externals[v] for v in a.tolist()]
    return vals, [argkey(v) for v in vals], p
  # T_STR, T_BYTES, T_BIGINT: lengths, then the bytes
  if 4 * cnt > end - p: raise _cut("sizes")
  lens = np.frombuffer(b, "<u4", cnt, p).astype(np.int64)
  p += 4 * cnt
  if t == T_BIGINT and cnt and lens.max() > _MAX_BIGINT:
    raise ValueError(f"pygrad.loads: an integer arg of {int(lens.max())} bytes is too large")
  total = int(lens.sum())
  if total > end - p: raise _cut("string arg" if t != T_BIGINT else "int arg")
  offs = np.zeros(cnt + 1, np.int64)
  np.cumsum(lens, out=offs[1:])
  offs = offs.tolist()
  blob = b[p:p + total]
  p += total
  if t == T_BYTES: vals = [blob[a:c] for a, c in zip(offs, offs[1:])]
  elif t == T_BIGINT: vals = [int.from_bytes(blob[a:c], "little", signed=True) for a, c in zip(offs, offs[1:])]
  elif blob.isascii():  # byte offsets are character offsets: one decode for the whole column
    s = blob.decode("ascii")
    w = offs[1] if cnt else 0
    if cnt > 1 and total == w * cnt and lens.min() == w and s == s[:w] * cnt:  # one string repeated (a model's
      # devices; every length w, as the total of w each says only with the minimum): one object
      one = s[:w]
      return [one] * cnt, [(str, one)] * cnt, p
    vals = [s[a:c] for a, c in zip(offs, offs[1:])]
  else:
    try: vals = [blob[a:c].decode("utf-8", "surrogatepass") for a, c in zip(offs, offs[1:])]
    except UnicodeDecodeError: raise ValueError("pygrad.loads: a string arg is not UTF-8") from None
  return vals, list(zip(repeat(int if t == T_BIGINT else bytes if t == T_BYTES else str), vals)), p


_CACHE: dict = {}             # (nargs, table bytes) -> (values, keys), oldest first: the tables decoded last
_CACHE_TABLES, _CACHE_BYTES = 8, 1 << 24
_CACHE_LOCK = threading.Lock()
_PLAIN = frozenset({T_NONE, T_FALSE, T_TRUE, T_INT, T_BIGINT, T_FLOAT, T_STR, T_TUPLE, T_OPS, T_DTYPE, T_META, T_BYTES,
                    T_INTS})  # tokens of values that are data (no callable: those resolve by name on each load)


def decode_args(b: bytes, nargs: int, externals, allow_import: bool) -> tuple[list, list, tuple | None, object, object]:
  """The nargs values of the arg table b (all of it), their interning keys, the key to `keep` them under if the
  table may be cached (plain data, no callables, not too large; else None), what the caller kept with them (None
  unless they came from the cache), and their interned ids (an int32 array, 0 first) if the C decoder interned them
  (else None: the caller interns). A table kept lately is not decoded again: the same bytes give the same values,
  and handing out the objects interned for them lets interning find them by identity, so loading a graph again
  costs nothing per arg. A table decoded on the C core is decoded and interned by csrc/pyargs.c (the values are
  then the interned objects); in Python, the per-table work is a fixed cost of ~15 numpy calls per skeleton."""
  key = (nargs, b)
  hit = _CACHE.get(key)
  if hit is not None:
    with _CACHE_LOCK:
      if _CACHE.pop(key, None) is not None: _CACHE[key] = hit  # the newest again
    return list(hit[0]), list(hit[1]), None, hit[2], None
  objs, keys, plain, *ids = _decode_args(b, nargs, externals, allow_import)
  return objs, keys, key if plain and externals is None and len(b) <= _CACHE_BYTES // _CACHE_TABLES else None, None, \
    ids[0] if ids else None


def keep(key: tuple, objs: list, keys: list, extra=None) -> None:
  """Cache the args of the table decode_args named key: the interned objects, not the decoded ones (an arg still
  interned from before -- the graph that was saved, alive or lately dropped -- keeps its first object, and only
  that one is found by identity); extra (the caller's: their interned ids) is handed back with them."""
  with _CACHE_LOCK:
    _CACHE[key] = (tuple(objs), tuple(keys), extra)
    while len(_CACHE) > _CACHE_TABLES: del _CACHE[next(iter(_CACHE))]


def _decode_args(b: bytes, nargs: int, externals, allow_import: bool, intern: bool = True) -> tuple:
  """decode_args, decoding: (values, keys, whether every value is plain data (_PLAIN)), and on the C core, for a
  table of plain data, also the interned ids (intern: interned here; else the ids are None)."""
  if _C_DECODE[0] is not None:  # csrc/pyargs.c: the same values, keys and errors; None for a table of callables
    got = _C_DECODE[0]((_OPS, _DTYPES, Metadata, _INTS, ARGS.ids if intern else None, ARGS.get_key, ARGS.objs,
                        ARGS.plain), b, nargs)
    if got is not None:
      return got[0], got[1], True, None if got[2] is None else np.frombuffer(got[2], np.int32)
  return _decode_args_py(b, nargs, externals, allow_import)


def _decode_args_py(b: bytes, nargs: int, externals, allow_import: bool) -> tuple[list, list, bool]:
  """_decode_args in Python: (values, keys, whether every value is plain data)."""
  end = len(b)
  skels, p = _read_skeletons(b, 0, end)
  if 4 * nargs > end - p: raise _cut("arg skeleton numbers")
  which = np.frombuffer(b, "<u4", nargs, p).astype(np.int64)
  p += 4 * nargs
  if nargs and which.max() >= len(skels): raise ValueError("pygrad.loads: an arg names a skeleton that is not there")
  cnt = np.bincount(which, minlength=len(skels)).tolist() if nargs else [0] * len(skels)
  if sum(c * len(s) for c, s in zip(cnt, skels)) > _budget(end):
    raise ValueError("pygrad.loads: the arg table expands to more items than its size allows")
  objs: list = [None] * nargs
  keys: list = [None] * nargs
  order = np.argsort(which, kind="stable").tolist()  # the args of skeleton 0, then of 1, ..., each in arg order
  at = 0
  for toks, c in zip(skels, cnt):
    cols = []  # per token: (values, keys), or None for a container (built below)
    for t, k in toks:
      if t in _CONST: cols.append(([_CONST[t]] * c, [(type(_CONST[t]), _CONST[t])] * c))
      elif t == T_TUPLE or t in _KIDS: cols.append(None)
      else:
        v, ky, p = _column(b, p, end, t, k, c, externals)
        cols.append((v, ky))
    vals, ks = _assemble(toks, cols, c, externals, allow_import)
    for i, v, ky in zip(order[at:at + c], vals, ks):
      objs[i], keys[i] = v, ky
    at += c
  if p != end: raise ValueError("pygrad.loads: arg table size does not match its contents")
  return objs, keys, all(t in _PLAIN for toks in skels for t, _ in toks)


def _assemble(toks: list, cols: list, cnt: int, externals, allow_import: bool) -> tuple[list, list]:
  """The values and keys of a skeleton's cnt args from its leaf columns: containers from the last token back, each
  taking the columns of its items from a stack (no recursion)."""
  stack: list = []  # (values, keys, whether the values are ints)
  for (t, k), col in zip(reversed(toks), reversed(cols)):
    if col is not None:
      stack.append((col[0], col[1], t in _INTLIKE))
      continue
    n = k if t == T_TUPLE else _KIDS[t]
    items = [stack.pop() for _ in range(n)]
    if t == T_TUPLE:
      if n == 0: stack.append(([()] * cnt, [(_INTS, ())] * cnt, False))
      else:
        vals = list(zip(*(it[0] for it in items)))
        if all(it[2] for it in items): ks = list(zip(repeat(_INTS), vals))
        else: ks = list(zip(repeat(tuple), *(it[1] for it in items)))
        stack.append((vals, ks, False))
      continue
    vals = [_finish(t, list(fields), externals, allow_import) for fields in zip(*(it[0] for it in items))]
    stack.append((vals, [argkey(v) for v in vals], False))
  return stack[0][0], stack[0][1]


def _finish(kind: int, items: list, externals, allow_import: bool):
  if kind == T_META:
    name, caller, bw = items
    if type(name) is not str or type(caller) is not str or type(bw) is not bool:
      raise ValueError(f"pygrad.loads: bad Metadata fields {items!r}")
    return Metadata(name, caller, bw)
  if kind == T_FUNC:
    mod, qual = items
    if type(mod) is not str or type(qual) is not str: raise ValueError(f"pygrad.loads: bad callable name {items!r}")
    return resolve(mod, qual, allow_import)
  gf, name, pc, pcb, fxn = items
  if not (gf is None or callable(gf)) or not (fxn is None or callable(fxn)) or not (name is None or type(name) is str) \
     or type(pc) is not bool or type(pcb) is not bool:
    raise ValueError(f"pygrad.loads: bad CallInfo fields {items!r}")
  return CallInfo(gf, name, pc, pcb, fxn)
