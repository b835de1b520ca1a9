"""The planner's jobs (its kernels, in dependency order) run with the common one in C: a job storing one
materialized node into its buffer, whose kernel is small and of a class the kernel cache has lowered before, is walked
and keyed by csrc/kbatch.c in one loop over the jobs, which returns per kernel its class and buffer ids; Python makes
only its Part (the class's words with those ids written in at assembly). A layered net's gradient plans tens of
thousands of such kernels over a few dozen classes: each was ~10 us of Python (the job's walk, key, head and
buffers one call at a time). C stops at the first job it cannot finish (a new class, a leaf read through movements
not seen yet, a kernel too large for the cache, a walk left to Python, a copy, a CALL): that job runs the planner's
own way (Planner._emit_root and _walked, which also teach the cache what C lacked) and C goes on from the next one.
The words are those the planner's own path gives (tests/test_vm_kcache.py, tests/test_vm_plan_golden.py)."""
from __future__ import annotations
from functools import partial
from itertools import compress
from operator import attrgetter, itemgetter, is_
import numpy as np
from ..ops import Ops
from .kwalk import SMALL_KERNEL, KW_LEAF, PU_ALU_MOVE
from .lower import Part
from .kcache import Words
from .views import View

_C_BATCH = True  # (tests turn it off to compare the planner's own path)
_IDX, _BUF, _ID, _STYPE, _FUSED, _ARG = (attrgetter(a) for a in ("idx", "buf", "id", "stype", "fused", "arg"))
_FN, _NODE, _NOFN = itemgetter(2), itemgetter(1), partial(is_, None)
_WORDS, _PART = partial(tuple.__new__, Words), partial(tuple.__new__, Part)  # (NamedTuples made from a tuple)
_MIN_JOBS = 16  # fewer storing jobs: the planner's own path (it makes the key state only once a kernel is small)
_IDS = 1 << 16  # buffer ids one call may return (it stops early when the largest kernel's would not fit)


def run_jobs(pl, c_key: bool) -> None:
  """Runs the planner's sorted jobs ((order, seq), node, fn): fn() when set, else Planner._emit_root(node); the
  storing ones in C when the plan keys its small kernels in C (c_key: the walk goes through movement ops)."""
  jobs, cache = pl.jobs, pl.cache
  at = list(compress(range(len(jobs)), map(_NOFN, map(_FN, jobs))))  # (the storing jobs: no fn)
  if not (_C_BATCH and c_key and cache is not None and pl.walk is not None and pl.walk.moves and
          min(SMALL_KERNEL, cache.max_nodes) > 0 and len(at) >= _MIN_JOBS):
    for _, n, fn in jobs:
      if fn is None: pl._emit_root(n)
      else: fn()
    return
  kk = cache.kkey_of(pl)
  tops, leaf, space, head, sbuf = _columns(pl, kk, jobs, at)
  w, ffi, lib = pl.walk, kk.ffi, kk.lib
  nj = len(jobs)
  cp = ffi.from_buffer
  cls, nids, ids = np.empty(nj, np.int32), np.empty(nj, np.int32), np.empty(_IDS, np.int32)
  jargs = (cp("int32_t[]", tops), cp("uint8_t[]", leaf), cp("int32_t[]", space), cp("int64_t[]", head),
           cp("int32_t[]", sbuf), min(SMALL_KERNEL, cache.max_nodes))
  outs = (cp("int32_t[]", cls), cp("int32_t[]", nids), cp("int32_t[]", ids), _IDS)
  margs = w._margs  # (the walk's arrays: pg_kernel_walk_moves's)
  wout = (w._mmem[0], w._mmem[2], w._mmem[4], w._mmem[5], w._mmem[6])  # out, out_src, max_cells, keys, info
  ids_len = ffi.new("int64_t *")
  room = kk.out_cap + 1
  tl = tops.tolist()
  ok, nok, seen = None, -1, -1
  i = 0
  while i < nj:
    if tl[i] < 0 or i == seen:  # a job for Python: not a store, or C stopped at it
      _, n, fn = jobs[i]
      if fn is None: pl._emit_root(n)
      else: fn()
      i += 1
      continue
    if len(kk.tmpl) != nok:  # classes lowered since the last call
      nok = len(kk.tmpl)
      ok = np.zeros(max(kk.tmpl, default=-1) + 1, np.uint8)
      ok[[c for c, t in kk.tmpl.items() if t is not None]] = 1
    ids_len[0] = 0
    r = lib.pg_kbatch_run(kk.st, w.kwm, w.n, *margs, *wout, i, nj, *jargs, cp("uint8_t[]", ok), len(ok), *outs,
                          ids_len)
    if r < 0:
      if r == lib.PG_ERR_NOMEM: raise MemoryError("pygrad planner: no memory for a kernel's walk or key")
      raise RuntimeError(f"pygrad planner: the kernels' walks and keys failed at job {i} ({r})")
    if r > i: _parts(pl, kk, cls[i:r], nids[i:r], ids[:ids_len[0]].tolist())
    if r < nj and _IDS - ids_len[0] >= room: seen = r  # (stopped at a job C cannot do, not for room)
    i = r


def _parts(pl, kk, cls: np.ndarray, nids: np.ndarray, ids: list) -> None:
  """The Parts of kernels done in C (per kernel its class, its buffer count, its buffer ids in ids, in order),
  appended to the plan's kernels: each its class's words with its buffer ids (as KernelCache.walked_c makes them on
  a hit), made through map, at C speed but for the kernels whose template lists its buffers out of order."""
  tmpl, bl = kk.tmpl, pl.bufs
  cl = cls.tolist()
  ts = list(map(tmpl.__getitem__, cl))
  ends = np.cumsum(nids)
  cuts = list(map(slice, (ends - nids).tolist(), ends.tolist()))
  qs = list(map(ids.__getitem__, cuts))
  bs = list(map(list(map(bl.__getitem__, ids)).__getitem__, cuts))
  direct = kk.direct if kk.ndirect == len(tmpl) else _direct(kk)  # (per class: see _direct)
  for i in np.flatnonzero(direct[cls] != nids).tolist():  # (stand-ins in another order, or a buffer twice)
    qs[i] = list(map(qs[i].__getitem__, ts[i].js))
  pl.kernels += map(_PART, zip(map(_WORDS, zip(ts, qs)), map(_FUSED, ts), bs))
  pl.cache.hits += len(cl)


def _direct(kk) -> np.ndarray:
  """Per class with words: its buffer count when the template's stand-ins are its buffers once each in order (a
  kernel's ids are then its words' ids), else -1; -1 for a class without."""
  d = np.full(max(kk.tmpl, default=-1) + 1, -1, np.int64)
  for c, t in kk.tmpl.items():
    if t is not None and t.inorder: d[c] = len(t.js)
  kk.direct, kk.ndirect = d, len(kk.tmpl)
  return d


def _columns(pl, kk, jobs, at: list):
  """Per job, what C needs to walk and key it (-1 as the top: a job for Python; at: the storing jobs): the top
  node, whether the top is a load, the index space's and head's ids (KKey.head's) and the store buffer's id, as
  _emit_root passes them. Read from the graph's columns (a reduction's source is not made into a PNode), a head made
  once per distinct one."""
  w = pl.walk
  g, nj = w.g, len(jobs)
  tops, leaf = np.full(nj, -1, np.int32), np.zeros(nj, np.uint8)
  space, head, sbuf = np.zeros(nj, np.int32), np.zeros(nj, np.int64), np.zeros(nj, np.int32)
  if not at: return tops, leaf, space, head, sbuf
  ns = list(map(_NODE, map(jobs.__getitem__, at)))
  at = np.array(at, np.int64)
  idx = np.fromiter(map(_IDX, ns), np.int64, len(ns))
  bufs = list(map(_BUF, ns))
  st = np.fromiter(map(_ID, map(_STYPE, bufs)), np.int64, len(ns))
  op = g.op_ids[idx]
  sid, shapes = w.sid, w.sid_shapes
  store = (op != int(Ops.REDUCE_AXIS)) & (op != int(Ops.MULTI))
  h = np.zeros((len(ns), 2), np.int64)
  k = np.flatnonzero(store)
  if len(k):  # (index space, no reduction) per distinct (shape, storage type)
    u, first, inv = np.unique(sid[idx[k]].astype(np.int64) * 256 + st[k], return_index=True, return_inverse=True)
    hu = [kk.head((shapes[int(x) >> 8], None, (), None), bufs[int(k[f])].stype, View.contiguous(shapes[int(x) >> 8]))
          for x, f in zip(u.tolist(), first.tolist())]
    h[k] = np.array(hu, np.int64).reshape(-1, 2)[inv.ravel()]
    tops[at[k]] = idx[k]
    leaf[at[k]] = (g.ops[idx[k]] & PU_ALU_MOVE) == 0
  r = np.flatnonzero(op == int(Ops.REDUCE_AXIS))
  if len(r):  # reductions: a head per distinct (source's shape, shape, dtype, storage type, reduce arg)
    src = g.src[g.off[idx[r]]]
    nr = list(map(ns.__getitem__, r.tolist()))
    keys = list(zip(sid[src].tolist(), sid[idx[r]].tolist(), g.dt_ids[idx[r]].tolist(), st[r].tolist(),
                    map(id, map(_ARG, nr))))  # (each node holds its arg: ids not reused)
    some = dict(zip(keys, range(len(keys))))  # (a reduction of each key: equal keys, one head)
    heads = {}
    for key, f in some.items():
      n, ssh = nr[f], shapes[key[0]]
      heads[key] = kk.head((tuple(ssh), n.arg[0], tuple(n.arg[1]), n.dtype), bufs[int(r[f])].stype,
                           View(ssh, View.contiguous(n.shape).strides))
    h[r] = np.array(list(map(heads.__getitem__, keys)), np.int64).reshape(-1, 2)
    tops[at[r]] = src
    leaf[at[r]] = (w.flags[src] & KW_LEAF) != 0
  ja = at[store | (op == int(Ops.REDUCE_AXIS))]
  sel = store | (op == int(Ops.REDUCE_AXIS))
  head[ja], space[ja] = h[sel, 0], h[sel, 1]
  sbuf[ja] = np.fromiter(map(_ID, bufs), np.int64, len(bufs))[sel]
  return tops, leaf, space, head, sbuf


__all__ = ["run_jobs"]
