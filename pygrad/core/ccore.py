"""The C core behind PyCore's interface: the node store and walks of csrc/ (pygrad._core, built by cffi). Ids in,
ids out, the same identity rules, id recycling and walk orders as PyCore; walks return `Ids` over C arrays."""
from __future__ import annotations
import functools, itertools, operator, sys
from collections.abc import Sequence
from typing import Iterator
from .pycore import ArgGone
from .release import deferred
from .clib import ffi, lib, module
from ..ids import tables

tables()  # the C table of op and dtype ids must match Ops and dtypes (ImportError if not)

_ERRORS = {lib.PG_ERR_NOMEM: "out of memory", lib.PG_ERR_BADID: "not a live node id",
           lib.PG_ERR_ARG_GONE: "arg id gone", lib.PG_ERR_ARG: "bad argument (unregistered arg id or size)"}
_CHUNK = 1 << 16
_ERR_GONE, _ERR_NOMEM = lib.PG_ERR_ARG_GONE, lib.PG_ERR_NOMEM
_binds = itertools.count()


def _fast_calls(st):
  """The store's hot calls as CPython builtins that keep the GIL (csrc/pyfast.c): (make0, make1, make2, make2k,
  incref, decref, info), each returning what the cffi function returns; None if they cannot be made (the cffi
  functions serve then). pg_py_bind hands them over as an attribute of the compiled module, taken off at once."""
  name = f"_fast{next(_binds)}"
  if lib.pg_py_bind(st, module.__name__.encode(), name.encode()) != 0: return None
  return module.__dict__.pop(name, None)


def _raise(code: int, what: str, *ids):
  """Turn a negative core result into the exception the Python interface promises."""
  if code == _ERR_GONE: raise ArgGone()
  if code == _ERR_NOMEM: raise MemoryError(f"pygrad C core: {what}: out of memory")
  raise ValueError(f"pygrad C core: {what}{ids}: {_ERRORS.get(code, f'error {code}')}")


def _id_array(ids):
  """An int32 array for C from a list/tuple of ints (or an int32 numpy array, without copying)."""
  if hasattr(ids, "dtype") and hasattr(ids, "__array_interface__"):
    import numpy as np
    a = np.ascontiguousarray(ids, dtype=np.int32)
    return ffi.from_buffer("int32_t[]", a), len(a)
  try:
    return ffi.new("int32_t[]", ids), len(ids)
  except (OverflowError, TypeError) as e:
    raise ValueError(f"pygrad C core: ids must be int32: {e}") from None


class Ids(Sequence):
  """A read-only sequence of node ids in a C array (a walk's result): len, indexing, iteration, reversed, and
  `.numpy()` as a zero-copy int32 view that keeps this object (and so the array) alive."""
  __slots__ = ("_p", "_a", "_n", "__weakref__")

  def __init__(self, p):
    self._p = ffi.gc(p, lib.pg_ids_free)
    self._a, self._n = p.ids, int(p.n)

  def __len__(self) -> int: return self._n

  def __getitem__(self, i):
    if type(i) is not int:
      if isinstance(i, slice): return ffi.unpack(self._a, self._n)[i]
      i = operator.index(i)
    n = self._n
    if i < 0: i += n
    if 0 <= i < n: return self._a[i]
    raise IndexError("Ids index out of range")

  def __iter__(self) -> Iterator[int]:
    a, n = self._a, self._n
    if n <= _CHUNK: return iter(ffi.unpack(a, n))
    return self._chunks(a, n)

  def _chunks(self, a, n) -> Iterator[int]:
    for i in range(0, n, _CHUNK): yield from ffi.unpack(a + i, min(_CHUNK, n - i))

  def __reversed__(self) -> Iterator[int]:
    a, n = self._a, self._n
    for i in range(n, 0, -_CHUNK):
      lo = max(0, i - _CHUNK)
      yield from reversed(ffi.unpack(a + lo, i - lo))

  def __contains__(self, x) -> bool:
    if not isinstance(x, int): return False
    return bool((self.numpy() == x).any())

  def __eq__(self, other):
    if isinstance(other, (Ids, list, tuple)): return len(self) == len(other) and list(self) == list(other)
    return NotImplemented

  __hash__ = None  # type: ignore[assignment]

  def __repr__(self) -> str:
    head = ", ".join(map(str, ffi.unpack(self._a, min(self._n, 8))))
    return f"Ids([{head}{', ...' if self._n > 8 else ''}], n={self._n})"

  @property
  def __array_interface__(self):
    return {"shape": (self._n,), "typestr": "<i4" if _LITTLE else ">i4", "version": 3,
            "data": (int(ffi.cast("uintptr_t", self._a)), True)}

  def numpy(self):
    """The ids as a read-only int32 numpy array sharing the C memory; it keeps this object alive."""
    import numpy as np
    return np.asarray(self)


_LITTLE = sys.byteorder == "little"


def _store_delete(p, finalizing=sys.is_finalizing, delete=lib.pg_store_delete):
  """ffi.gc destructor of a store: free it, unless the interpreter is exiting (then the OS takes it back)."""
  if not finalizing(): delete(p)


class CCore:
  """Hash-consed nodes addressed by integer id, stored in C (see PyCore for the meaning of every method). Every
  call takes the store's mutex, so threads may share one CCore; cffi releases the GIL meanwhile."""
  name = "c"
  arg_slot_bits = tables()["consts"]["ARG_SLOT_BITS"][0]
  free_order_min = tables()["consts"]["FREE_ORDER_MIN"][0]

  def __init__(self):
    p = lib.pg_store_new()
    if p == ffi.NULL: raise MemoryError("pygrad C core: cannot create a store")
    # freed with its last reference, except while the interpreter shuts down: handles still alive then decref into
    # it from their finalizers, in whatever order modules are torn down, so it is never freed under them
    self._st = st = ffi.gc(p, _store_delete)
    make0, make1, make2, make3, maken = lib.pg_store_make0, lib.pg_store_make1, lib.pg_store_make2, \
      lib.pg_store_make3, lib.pg_store_make
    c_incref, c_decref, new = lib.pg_store_incref, lib.pg_store_decref, ffi.new
    fast = _fast_calls(p)
    if fast is not None:
      f0, f1, f2, f2k, c_incref1, c_decref1, self._info, self.handle_base, self.handle_ctor, self.makers, \
        self.foreign_rows, self.foreign_walk, self.args_decode, self.rows_columns, self.argkeys = fast
    else:
      f0, f1, f2, f2k = (functools.partial(f, st) for f in (make0, make1, make2, lib.pg_store_make2k))
      c_incref1, c_decref1 = functools.partial(c_incref, st), functools.partial(c_decref, st)

    # the hot path: plain closures over the store's calls, set as instance attributes
    def make(op: int, dtype: int, src: tuple[int, ...], arg: int, tag: int, meta: int) -> int:
      """The node with these fields, with one new reference for the caller."""
      n = len(src)
      try:
        if n == 1: r = f1(op, dtype, src[0], arg, tag, meta)
        elif n == 2: r = f2(op, dtype, src[0], src[1], arg, tag, meta)
        elif n == 0: r = f0(op, dtype, arg, tag, meta)
        elif n == 3: r = make3(st, op, dtype, src[0], src[1], src[2], arg, tag, meta)
        else: r = maken(st, op, dtype, new("int32_t[]", src), n, arg, tag, meta)
      except (OverflowError, TypeError) as e:
        raise ValueError(f"pygrad C core: make: ids must be int32: {e}") from None
      if r < 0: _raise(r, "make", op, dtype, src, arg, tag)
      return r

    def incref(nid: int) -> None:
      try: r = c_incref1(nid)
      except (OverflowError, TypeError): r = -2
      if r: _raise(r, "incref", nid)

    def decref(nid: int) -> None:
      try: r = c_decref1(nid)
      except (OverflowError, TypeError): r = -2
      if r: _raise(r, "decref", nid)

    self.make, self.incref, self.decref = make, incref, decref
    c_many = lib.pg_store_decref_many

    def decref_many(ids: list[int]) -> None:
      try: r = c_many(st, ids, len(ids))
      except (OverflowError, TypeError): r = lib.PG_ERR_BADID
      if r: _raise(r, "decref_many", len(ids))
    self.decref_many = decref_many
    c_register = lib.pg_store_arg_register

    def arg_register(aid: int) -> None:  # once per new interned arg: every placeholder makes one
      try: r = c_register(st, aid)
      except (OverflowError, TypeError): r = lib.PG_ERR_BADID
      if r: _raise(r, "arg_register", aid)
    self.arg_register = arg_register
    self.release, pyflush = deferred(decref_many)

    def flush() -> None:  # the Python-side queue, then the C handle registry's (handles.py sets flush_handles)
      pyflush()
      f = self.flush_handles
      if f is not None: f()
    self.flush = flush
    # fixed-arity makes for the math methods' hot path: the raw C result, a negative code on error (the caller then
    # repeats the call through make, which raises the matching exception)
    self.make1, self.make2, self.make2k = f1, f2, f2k
    # template programs over one or two inputs (the math methods' hot path, pygrad/templates.py): the new node's id
    # with one reference for the caller, or a negative code (the caller then builds the nodes directly)
    self.prog_run1 = functools.partial(lib.pg_prog_run1, st)
    self.prog_run2 = functools.partial(lib.pg_prog_run2, st)

  _info = None  # the fast builtin, when there is one (set per instance)
  # the handle base type, its constructor maker, the make-and-publish calls (csrc/pyhandle.c, csrc/pymake.c) and
  # the tinygrad interop's loop, walk and columns (csrc/pyforeign.c, pywalk.c, pyrows.c) and the arg table's decoder
  # (csrc/pyargs.c), and the interner's keys of many args (csrc/pyargkey.c):
  # None where the builtins could not be made (handles.py, the interop, argtable.py and intern.py then use their
  # Python forms)
  handle_base = handle_ctor = makers = foreign_rows = foreign_walk = args_decode = rows_columns = argkeys = None
  flush_handles = None  # the handle registry's flush (csrc/pyreg.c), once handles.py made the registry

  def info(self, nid: int) -> tuple[int, int, int, int, int, int, int]:
    """(op, dtype, nsrc, arg, tag, meta, pdata) of a node."""
    if self._info is not None:
      try: r = self._info(nid)
      except (OverflowError, TypeError): r = lib.PG_ERR_BADID
      if type(r) is tuple: return r
      _raise(r, "info", nid)
    o = ffi.new("pg_info *")
    r = self._call(lib.pg_store_info, nid, o)
    if r: _raise(r, "info", nid)
    return (o.op, o.dtype, o.nsrc, o.arg, o.tag, o.meta, o.pdata)

  def src(self, nid: int) -> tuple[int, ...]:
    buf = ffi.new("int32_t[4]")
    n = self._call(lib.pg_store_src, nid, buf, 4)
    if n > 4:
      buf = ffi.new("int32_t[]", n)
      n = lib.pg_store_src(self._st, nid, buf, n)
    if n < 0: _raise(n, "src", nid)
    return tuple(ffi.unpack(buf, n))

  def rows(self, ids, arrays: bool = False) -> tuple[list, list[int]]:
    """info() of every node of `ids` (a walk's Ids, or ints) as a list of 7-element lists, and their src() all
    concatenated in order: a whole graph read in one call (the planner's flattening). arrays: as numpy int32 arrays
    (n x 7, and flat) instead of lists."""
    import numpy as np
    if isinstance(ids, Ids): a = ids.numpy()
    else:
      a = np.asarray(ids, dtype=np.int64).reshape(-1)
      if len(a) and (a.min() < 0 or a.max() > 0x7FFFFFFF): _raise(lib.PG_ERR_BADID, "rows", f"{len(a)} ids")
      a = np.ascontiguousarray(a, dtype=np.int32)
    n = len(a)
    info = np.empty((n, 7), np.int32)
    src = np.empty(3 * n + 16, np.int32)
    pa, pi = ffi.from_buffer("int32_t[]", a), ffi.cast("pg_info *", ffi.from_buffer(info))
    for _ in range(2):
      m = lib.pg_store_rows(self._st, pa, n, pi, ffi.from_buffer("int32_t[]", src), len(src))
      if m < 0: _raise(m, "rows", f"{n} ids")
      if m <= len(src): return (info, src[:m]) if arrays else (info.tolist(), src[:m].tolist())
      src = np.empty(m, np.int32)
    raise RuntimeError("pygrad C core: rows: the graph changed during the call")

  def set_pdata(self, nid: int, pid: int) -> None:
    r = self._call(lib.pg_store_set_pdata, nid, pid)
    if r: _raise(r, "set_pdata", nid, pid)

  def live(self) -> int:
    self.flush()
    return lib.pg_store_live(self._st)

  def id_bound(self) -> int:
    """One past the largest node id handed out so far (every live id is below it)."""
    return lib.pg_store_id_bound(self._st)

  def free_order(self, k: int) -> None:
    """The next k recycled ids ascending, when k >= free_order_min (PyCore.free_order; the C builder does this)."""
    lib.pg_store_free_order(self._st, k)

  def arg_drain(self) -> list[int]:
    """Ids whose last user was freed; they are marked gone (a later `make` naming one raises ArgGone)."""
    self.flush()
    cap = 256
    buf = ffi.new("int32_t[]", cap)
    out: list[int] = []
    while True:
      n = lib.pg_store_arg_drain(self._st, buf, cap)
      if n < 0: _raise(n, "arg_drain")
      out += ffi.unpack(buf, n)
      if n < cap: return out

  # ---- walks ----
  def toposort(self, roots, enter_calls: bool = True, stop=()) -> Ids:
    """Sources before users (PyCore.toposort's order), as an Ids sequence."""
    ra, nr = _id_array(roots)
    sa, ns = _id_array(stop) if len(stop) else (ffi.NULL, 0)
    out = ffi.new("pg_ids **")
    r = lib.pg_walk_toposort(self._st, ra, nr, 1 if enter_calls else 0, sa, ns, out)
    if r: _raise(r, "toposort", roots if nr <= 8 else f"{nr} roots")
    return Ids(out[0])

  def deepwalk(self, root: int, targets, enter_calls: bool = True) -> tuple[Ids, Ids]:
    """(walk, path) as PyCore.deepwalk, as Ids sequences."""
    ta, nt = _id_array(targets) if len(targets) else (ffi.NULL, 0)
    w, p = ffi.new("pg_ids **"), ffi.new("pg_ids **")
    r = self._call(lib.pg_walk_deepwalk, root, ta, nt, 1 if enter_calls else 0, w, p)
    if r: _raise(r, "deepwalk", root)
    return Ids(w[0]), Ids(p[0])

  # ---- template programs (csrc/prog.c; PyCore has none): pygrad/templates.py records them ----
  programs = True

  def prog_new(self, words: list[int]):
    """A checked program (layout in csrc/prog.h) holding the arg ids it names, freed with its handle; ValueError if
    the words are not one."""
    try:
      p = lib.pg_prog_new(self._st, ffi.new("int32_t[]", words), len(words))
    except (OverflowError, TypeError) as e:
      raise ValueError(f"pygrad C core: program words must be int32: {e}") from None
    if p == ffi.NULL: raise ValueError("pygrad C core: template program rejected (bad words, dead ids or memory)")
    return ffi.gc(p, lib.pg_prog_delete)  # (a program keeps its store alive in C)

  def prog_run(self, prog, inputs) -> int:
    """The program's one output over any number of inputs (prog_run1/prog_run2 for one or two): the new node's id
    with one reference for the caller, or a negative code."""
    out = ffi.new("int32_t[1]")
    r = lib.pg_prog_run(self._st, prog, ffi.new("int32_t[]", inputs), len(inputs), out, 1)
    return out[0] if r == 0 else r

  # ---- node tables (csrc/serial.c, serial_build.c; PyCore has none): serialize.py's C path, with this store ----
  def serial_table(self, *args):
    """pg_serial_table on this store (the arguments after the store, as cffi objects)."""
    return lib.pg_serial_table(self._st, *args)

  def serial_build_new(self, *args):
    """pg_serial_build_new on this store (the arguments after the store, as cffi objects)."""
    return lib.pg_serial_build_new(self._st, *args)

  # ---- gradient runs (csrc/grad.c; PyCore has none) ----
  grad_runs = True

  def template_cache(self, limit: int) -> TemplateCache:
    """An empty cache of gradient templates holding at most `limit` (the least recently used go first)."""
    return TemplateCache(self._st, limit)

  def grad_run(self, walk: Ids, root: int, root_grad: int, py_node: bytes, py_grad: bytes,
               carry_pdata: bool) -> GradRun:
    """A gradient run in C over a reverse walk (a deepwalk's walk), from {root: root_grad}; see GradRun.
    carry_pdata: nodes' metadata is carried onto their rules' results (else no node is looked at for any)."""
    return GradRun(self._st, walk, root, root_grad, py_node, py_grad, carry_pdata)

  def _call(self, fn, *args):
    """fn(store, *args), with ids outside int32 reported like any other bad id."""
    try: return fn(self._st, *args)
    except (OverflowError, TypeError): return lib.PG_ERR_BADID


class TemplateCache:
  """Gradient templates in C: a rule's (or an accumulation's) result graph as a program (pygrad.templates.program)
  under the key grad.c computes for a node; it holds the arg ids its programs name, and at most `limit` programs."""
  __slots__ = ("_p", "_st")

  def __init__(self, st, limit: int):
    if type(limit) is not int or not 2 <= limit < 2 ** 31:
      raise ValueError(f"template cache limit must be an int in [2, 2**31), got {limit!r}")
    p = lib.pg_tcache_new(st, limit)
    if p == ffi.NULL: raise MemoryError("pygrad C core: cannot create a template cache")
    self._p, self._st = ffi.gc(p, lib.pg_tcache_delete), st  # (it keeps the store alive in C)

  def add(self, key, words: list[int]) -> None:
    """Record the program `words` under `key` (a run's stop key); a key already there keeps its program."""
    r = lib.pg_tcache_add(self._st, self._p, ffi.new("int32_t[]", list(key)), len(key), ffi.new("int32_t[]", words),
                          len(words))
    if r < 0: _raise(r, "template cache add")

  def __len__(self) -> int: return int(lib.pg_tcache_count(self._p))


class GradRun:
  """A reverse walk run in C: it instantiates cached templates and accumulates gradients, and stops (`resume`'s
  result) when Python must act: NEED_RULE / NEED_ACC (a template of `key()` is missing), PY_STEP (the node `node`
  with gradient `ctx` is Python's step; then `skip`), PY_ACC (accumulate `v` into the source `k`, whose gradient so
  far is `prev`, -1 for none; then `consume`), NEED_META (the merge of the node's metadata `md` into a result node's
  metadata `mdcur` is unknown: `meta_add`). The run holds a reference on every node and gradient it maps."""
  DONE, NEED_RULE, NEED_ACC = lib.PG_GRAD_DONE, lib.PG_GRAD_NEED_RULE, lib.PG_GRAD_NEED_ACC
  PY_STEP, PY_ACC, NEED_META = lib.PG_GRAD_PY_STEP, lib.PG_GRAD_PY_ACC, lib.PG_GRAD_NEED_META
  __slots__ = ("_p", "stop", "__weakref__")

  def __init__(self, st, walk, root: int, root_grad: int, py_node: bytes, py_grad: bytes, carry_pdata: bool):
    if len(py_node) != len(py_grad): raise ValueError("grad_run: the two op masks differ in length")
    wa, nw = _id_array(walk.numpy() if isinstance(walk, Ids) else walk)
    try:
      p = lib.pg_grad_new(st, wa, nw, root, root_grad, py_node, py_grad, len(py_node), 1 if carry_pdata else 0)
    except (OverflowError, TypeError) as e:
      raise ValueError(f"pygrad C core: grad_run: ids must be int32: {e}") from None
    if p == ffi.NULL: raise ValueError("pygrad C core: cannot start a gradient run (bad ids, masks or memory)")
    self._p = ffi.gc(p, lib.pg_grad_delete)  # (the run keeps the store alive in C)
    self.stop = ffi.new("pg_stop *")  # why it stopped: node, ctx, k, prev, v (ids), md, mdcur (pdata ids), key()

  def resume(self, tc: TemplateCache) -> int:
    r = lib.pg_grad_run(self._p, tc._p, self.stop)
    if r < 0: _raise(r, "gradient run")
    return r

  def key(self) -> tuple[int, ...]:
    """The key of the missing template (NEED_RULE / NEED_ACC), for TemplateCache.add."""
    return tuple(ffi.unpack(self.stop.key, self.stop.nkey))

  def get(self, nid: int) -> int:
    """The gradient of a node so far, or -1."""
    return lib.pg_grad_get(self._p, nid)

  def set(self, nid: int, gid: int) -> None:
    r = lib.pg_grad_set(self._p, nid, gid)
    if r < 0: _raise(r, "gradient run set", nid, gid)

  def skip(self) -> None:
    if lib.pg_grad_skip(self._p) < 0: raise ValueError("pygrad C core: gradient run: nothing to skip")

  def consume(self) -> None:
    if lib.pg_grad_consume(self._p) < 0: raise ValueError("pygrad C core: gradient run: nothing to consume")

  def meta_add(self, md: int, mdcur: int, merged: int) -> None:
    """Answer NEED_META: `merged` is the pdata id of `mdcur`'s metadata with `md`'s backward copies merged in
    (ArgGone if that id was drained meanwhile: intern it again)."""
    try: r = lib.pg_grad_meta_add(self._p, md, mdcur, merged)
    except (OverflowError, TypeError): r = lib.PG_ERR_ARG
    if r < 0: _raise(r, "gradient run metadata", md, mdcur, merged)

  def __len__(self) -> int: return int(lib.pg_grad_count(self._p))

  def items(self) -> list[tuple[int, int]]:
    """Every (node, gradient) id pair."""
    n = lib.pg_grad_count(self._p)
    ks, vs = ffi.new("int32_t[]", n), ffi.new("int32_t[]", n)
    m = lib.pg_grad_items(self._p, ks, vs, n)
    return list(zip(ffi.unpack(ks, m), ffi.unpack(vs, m)))
