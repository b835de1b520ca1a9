"""pygrad -> tinygrad: a pygrad graph's node table (one export call) made into tinygrad UOps (see
pygrad/interop/tinygrad.py)."""
from __future__ import annotations
import math, weakref
import numpy as np
from pygrad import UOp, Ops
import pygrad.uop as _pg_uop
from pygrad.core import CORE
from pygrad.intern import ARGS, META
from pygrad.serialize import _fresh_pos, _rows_of, _table
try: from pygrad.gradient.templated import GradMap
except ImportError: GradMap = None  # the pure-Python core has no templates: compute_gradient gives a dict
from .tinygrad_tables import TMetadata, TOps, TUOp, _AFTER, _ASSIGN, _ASSIGN_P, _BCAST, _BITCAST, _BUFFER, _CALL, \
  _CAST, _CONST, _CONTIGUOUS, _COPY, _DEFINE_VAR, _EXPAND, _EXPANDOP, _FLIP, _FUNCTION, _GETTUPLE, _IDENT, _INFO, \
  _MD_OUT, _NOOP, _PAD, _PARAM, _PERMUTE, _REDUCE, _REDUCEOP, _RESHAPE, _SHRINK, _SINK, _TALU_I, _TDT_I, _TG, _TOPS, \
  _TUPLE, _WEAK, _tcallinfo, _tfields, _tg_metadata, _tmake_checked, _tmake_for, shape_to_shape_arg, UOpMetaClass

_args_objs, _meta_vals, _core_info = ARGS.objs, META.vals, CORE.info
_wref = weakref.ref


class _Out:
  """One conversion pygrad -> tinygrad over the node table of the roots' graph (one export call), seeded with the
  nodes a conversion the other way made (pygrad id -> tinygrad node), which map back without being rebuilt."""

  def __init__(self, known=None):
    self.known: dict = known if known is not None else {}
    # a gradient's reshape chains are folded (made on demand, of the first node below that is no reshape made here;
    # none if the shapes agree): not in a fresh conversion, which gives back tinygrad's own nodes, chains included
    self.fold = known is not None
    self.consts: dict = {}  # (dtype id, arg id) -> tinygrad CONST
    # REDUCE_AXIS row (or a PERMUTE of one) -> (its tinygrad node without the reduced axes, that node's shape, the
    # row's shape, the row's axes the node lacks: all of size 1)
    self.reduced: dict = {}
    self.mk = _tmake_for()  # tinygrad's UOp(op, dtype, src, arg), hash-consed
    self.rshape: dict = {}  # row -> its shape (read from the core once)

  def convert(self, roots: list) -> list:
    """The tinygrad nodes of `roots`, rows in topological order; nodes known already, and nodes only they reach,
    are not converted."""
    for r in roots:
      if not isinstance(r, UOp): raise TypeError(f"to_tinygrad: expected a pygrad UOp, got {type(r).__name__}")
    return self.convert_ids([r._id for r in roots])

  def gradients(self, ptargets: dict, grads) -> dict:
    """tinygrad target -> its gradient, for the targets (tinygrad node -> pygrad node) whose gradient in grads (a
    pygrad compute_gradient result) is not NOOP. A GradMap (the C driver's) is read by node id: no handle is made
    for a gradient (a handle costs ~2 us, and W1 has 2,000 targets)."""
    run = grads._run if type(grads) is GradMap else None
    if run is None:
      got = [(t, g._id) for t, p in ptargets.items() if (g := grads.get(p)) is not None]
    else:
      got = [(t, g) for t, p in ptargets.items() if (g := run.get(p._id)) >= 0]
    nodes = self.convert_ids([g for _, g in got], _NOOP)
    return {t: x for (t, _), x in zip(got, nodes) if x is not None}

  def convert_ids(self, root_ids: list, skip: int = -1) -> list:
    """convert() of the nodes with these ids (live pygrad nodes the caller holds); a root whose op is `skip` is
    not made (None in its place)."""
    if not root_ids: return []
    known = self.known
    # rows known already (rows 0.. of the table) map back as they are; rows only they reach are not converted
    base = len(known)
    if base: ids, op, dt, arg, tag, pdata, nsrc, src, rowof = _export_above(root_ids, known)
    else:  # serialize.export's columns, from ids
      ids, op, dt, arg, tag, pdata, nsrc, src, args = _table(root_ids, _fresh_pos(), 0)
      full = np.concatenate([np.zeros(1, np.int32), args])
      arg, tag, pdata = full[arg], full[tag], full[pdata]
    n = len(ids)
    start = np.zeros(n + 1, np.int64)
    np.cumsum(nsrc, out=start[1:])
    one, lazy, mk, talu, tdt, weak, reduced = self._one, self._lazy, self.mk, _TALU_I, _TDT_I, _WEAK, self.reduced
    # tinygrad's hash-consed creation inline for the ALU ops (see _tmake_for), unless its checked constructor is in use
    direct = mk is not _tmake_checked
    # a small table is made by the Python loop: the C loop's setup (plans, the columns as bytes) costs more than the
    # Python loop's ~1.5 us a row below a few hundred rows (see _C_ROWS)
    fast = CORE.foreign_rows if direct and n - base >= _C_ROWS else None
    # the Python loop reads the columns as lists if it makes every row, else as views of the arrays (it makes few
    # rows; the C loop reads the arrays' bytes)
    cols = memoryview if fast is not None else np.ndarray.tolist
    self.ids, self.op, self.dt, self.arg, self.tag = cols(ids), cols(op), cols(dt), cols(arg), cols(tag)
    self.start, self.src = stl, srcl = cols(start), cols(src)
    self.out = out = [*known.values(), *[None] * (n - base)] if base else [None] * n
    opl, dtl, tagl, pdl, objs = self.op, self.dt, self.tag, cols(pdata), _args_objs
    md = _pg_uop._md_count and pdata[base:].any()  # (the known rows are not made)
    mdata, mdrm, mds = _tg_metadata.data, _tg_metadata._remove, {}  # the WeakKeyDictionary's own dict (see below)
    ucache, new, ref = UOpMetaClass.ucache, type.__call__, weakref.ref
    ucget = ucache.get
    # helper rows are made only when asked for (see _lazy), so the loop skips them
    helpers, bcast = self._helpers(op[base:], tag[base:])
    todo_a = np.flatnonzero(~helpers) + base
    # the C loop reads the rows to make as int32 bytes (a list of ~10^5 int objects cost W1 ~2 ms to make and free)
    todo = memoryview(todo_a.astype(np.int32)) if fast is not None else todo_a.tolist()
    tb = todo.tobytes() if fast is not None else None
    # the C core's loop makes the plain rows (typed ALU, CAST, BITCAST) as the branches below do (sources not made
    # yet by _lazy, as they do) and the rows _row_plans gives a plan (reduces and permutes), and stops at any other
    # row, which the Python loop makes; with tinygrad's checked constructor in use, Python makes every row
    pos, end = 0, len(todo)
    if fast is not None:
      if md:
        for p in np.unique(pdata[base:]).tolist():
          if p: mds[p] = self._md(p)
      b32 = lambda a: a.astype(np.int32, copy=False).tobytes()  # noqa: E731
      cfg = (out, b32(op), b32(dt), b32(tag), start.astype(np.int64, copy=False).tobytes(), b32(src), b32(pdata),
             _TALU_T, _TDT_T, _WEAK_T, ucache, TUOp, (_CAST, _TCAST, _BITCAST, _TBITCAST), mdata if md else None,
             mdrm, mds, lazy, _TFIELDS, reduced,
             self._row_plans(todo_a, np.flatnonzero(helpers) + base, np.flatnonzero(bcast) + base, ids, op, tag, arg,
                             start, src))
    while pos < end:
      if fast is not None:
        pos = fast(cfg, tb, pos, end)
        if pos >= end: break
      i = todo[pos]
      pos += 1
      o = opl[i]
      fresh = False  # t made here, so it has no metadata yet
      if o in talu and not tagl[i]:  # the hot path: an ALU op (sources inline for the usual one or two)
        a, b = stl[i], stl[i + 1]
        j = srcl[a]
        x = out[j]
        if x is None: x = lazy(j)
        if b - a == 2:
          j = srcl[a + 1]
          y = out[j]
          if y is None: y = lazy(j)
          src, typed = (x, y), x.dtype not in weak or y.dtype not in weak
        else:
          src = (x,) if b - a == 1 else tuple([out[j] if out[j] is not None else lazy(j) for j in srcl[a:b]])
          typed = any(x.dtype not in weak for x in src)
        # the dtype is given unless every operand is weak (then tinygrad's promotion decides, as it did before)
        if not typed: t = TUOp(talu[o], src=src)
        elif direct:
          key = (talu[o], tdt[dtl[i]], src, None, None)
          w = ucget(key)
          if w is None or (t := w()) is None:
            t = new(TUOp, *key)
            ucache[key] = ref(t)
            fresh = True
        else: t = mk(talu[o], tdt[dtl[i]], src)
        out[i] = t
      elif (o == _BITCAST or o == _CAST) and not tagl[i]:  # frequent in gradients (sign and magnitude tricks)
        j = srcl[stl[i]]
        x = out[j]
        if x is None: x = lazy(j)
        d = tdt[dtl[i]]
        t = out[i] = mk(_TCAST if o == _CAST else _TBITCAST, d, (x,), d)
      else:
        tg = objs[tagl[i]] if tagl[i] else None
        if o == _REDUCEOP and tg is None:  # its keepdim reshape is made only if a user needs it (see _reshaped)
          t = self._reduce(i)
        elif o == _PERMUTE and tg is None and (got := reduced.get(srcl[stl[i]])) is not None:
          t = self._permuted(i, got)  # likewise
        else: t = out[i] = one(i, o, tg)
      # all_metadata[t] = ... unless t has some, as tinygrad's WeakKeyDictionary would set it, minus its Python frames
      if md and (p := pdl[i]) and (fresh or _wref(t) not in mdata):
        m = mds.get(p)
        if m is None: m = mds[p] = self._md(p)
        mdata[_wref(t, mdrm)] = m
    rows = rowof[root_ids] if base else _rows_of(ids, root_ids)
    rows = (rows if skip < 0 else np.where(op[rows] == skip, -1, rows)).tolist()
    if fast is not None:  # roots left to be made on demand (a gradient's folded reshapes) are made by plan in C
      left = [i for i in rows if i >= 0 and out[i] is None and i not in reduced]
      pos = 0
      while pos < len(left):
        pos = fast(cfg, left, pos, len(left)) + 1
        if pos <= len(left): self._get(left[pos - 1])
    return [self._get(i) if i >= 0 else None for i in rows]

  def _helpers(self, op: np.ndarray, tag: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rows made only when asked for on their own (see _lazy): the helper of a pair (the RESHAPE of an EXPAND,
    the REDUCE_AXIS of a REDUCE), an explicit broadcast, and with fold an untagged RESHAPE (see _reshaped); and the
    explicit broadcasts among them."""
    skip = (op == _RESHAPE) & (tag == 0) if self.fold else np.zeros(len(op), bool)
    kr = np.zeros(len(op), np.int8)  # 1: every row with the tag, 2: its RESHAPE rows, 3: its REDUCE_AXIS rows
    tagged = np.flatnonzero(tag)  # (few rows: a gradient's table has none)
    if len(tagged):
      ut, inv = np.unique(tag[tagged], return_inverse=True)
      kind = np.zeros(len(ut), np.int8)
      for k, t in enumerate(ut.tolist()):
        tg = _args_objs[t]
        if type(tg) is str: kind[k] = 1 if tg == _BCAST else 2 if tg == _EXPAND else 3 if tg == _REDUCE else 0
      kr[tagged] = kind[inv.reshape(-1)]
    return skip | (kr == 1) | (kr == 2) & (op == _RESHAPE) | (kr == 3) & (op == _REDUCEOP), kr == 1

  @staticmethod
  def _md(pid: int) -> tuple:
    got = _MD_OUT.get(pid)
    md = _args_objs[pid]
    if got is None or got[0] is not md:
      if len(_MD_OUT) >= 4096: _MD_OUT.clear()
      got = _MD_OUT[pid] = (md, tuple(TMetadata(m.name, m.backward) for m in md))
    return got[1]

  def _srcs(self, i: int) -> list: return self.src[self.start[i]:self.start[i + 1]]

  def _shape(self, i: int) -> tuple:
    got = self.rshape.get(i)
    if got is None: got = self.rshape[i] = _meta_vals[_core_info(self.ids[i])[5]][0]
    return got

  def _get(self, i: int) -> TUOp:
    t = self.out[i]
    return t if t is not None else self._lazy(i)

  def _lazy(self, i: int) -> TUOp:
    """The tinygrad node of a helper row asked for on its own (bounded: helpers sit at most two deep), or of a
    REDUCE_AXIS whose keepdim shape a user needs."""
    tg, x, a = _args_objs[self.tag[i]] if self.tag[i] else None, self.src[self.start[i]], _args_objs[self.arg[i]]
    if i in self.reduced: ret = self._reshaped(i, self.reduced[i][2])
    elif tg is None and self.op[i] == _RESHAPE: ret = self._reshaped(i, a)  # left to be made on demand (fold)
    elif tg == _BCAST: ret = self._get(x)
    elif tg == _EXPAND: ret = self._mop(self._get(x), TOps.RESHAPE, a)
    else:
      xt = self._get(x)
      ret = self._mop(self.mk(TOps.REDUCE, xt.dtype, (xt,), (_trop(a[0]), len(a[1]))), TOps.RESHAPE,
                      self._shape(i))
    self.out[i] = ret
    return ret

  @staticmethod
  def _shape_arg(shape: tuple) -> TUOp:
    got = _SHAPES.get(shape)
    if got is None:
      if len(_SHAPES) >= 4096: _SHAPES.clear()
      got = _SHAPES[shape] = shape_to_shape_arg(shape)
    return got

  def _mop(self, x: TUOp, op, arg) -> TUOp:
    """tinygrad's x._mop(op, arg) for static arguments, made directly: its symbolic simplify of the shape operands
    changes nothing on ints, and costs more than the node (the round-trip tests check the nodes are tinygrad's)."""
    mk = self.mk
    if op is TOps.PERMUTE or op is TOps.FLIP: return mk(op, x.dtype, (x,), arg)
    if op is TOps.RESHAPE: return mk(op, x.dtype, (x, self._shape_arg(arg)))
    if not arg: return x
    if op is TOps.EXPAND: return mk(op, x.dtype, (x, self._shape_arg(arg)))
    return mk(op, x.dtype, (x, self._shape_arg(tuple(a for a, _ in arg)), self._shape_arg(tuple(b for _, b in arg))))

  def _expand(self, r: int, shape: tuple) -> TUOp:
    """pygrad's EXPAND of row r (size-1 axes grow in place) as tinygrad's: drop those axes, prepend them grown,
    permute back."""
    kept, grown, perm = self._eplan(self._shape(r), shape)
    y = self._mop(self._reshaped(r, kept), TOps.EXPAND, grown)
    return y if perm is None else self._mop(y, TOps.PERMUTE, perm)

  def _eplan(self, src: tuple, shape: tuple) -> tuple:
    """How an EXPAND of a row of shape src to shape is made (see _expand): (the shape without the grown axes, the
    grown axes' sizes, the permute that puts them back or None)."""
    k = (_EXPAND, src, shape)
    plan = _PLANS.get(k)
    if plan is None:
      grow = [i for i, (a, b) in enumerate(zip(src, shape)) if a != b]
      rest = [i for i in range(len(shape)) if i not in grow]
      order = grow + rest
      perm = tuple(order.index(j) for j in range(len(shape)))
      plan = _plan(k, (tuple(src[i] for i in rest), tuple(shape[i] for i in grow),
                       None if perm == tuple(range(len(shape))) else perm))
    return plan

  def _rplan(self, src: tuple, axes: tuple) -> tuple:
    """How a REDUCE_AXIS over `axes` of a row of shape src is made (see _reduce): (number of axes reduced, the
    permute that puts them first or None, the shape without them, the keepdim shape, the axes reduced)."""
    k = (src, axes)
    plan = _PLANS.get(k)
    if plan is None:
      red = [a for a in sorted(axes) if src[a] != 1]
      rest = [k for k in range(len(src)) if k not in red]
      perm = tuple(red + rest)
      plan = _plan(k, (len(red), None if perm == tuple(range(len(src))) else perm,
                       tuple(src[k] for k in rest), tuple(1 if k in axes else s for k, s in enumerate(src)),
                       tuple(red)))
    return plan

  def _reduce(self, i: int) -> TUOp:
    """pygrad's REDUCE_AXIS (axes kept) as tinygrad's: reduced axes permuted to the front and reduced (dropped).
    Remembered with its shape and the keepdim shape, which a reshape is made to only if a user needs it."""
    x, rop, axes = self.src[self.start[i]], *_args_objs[self.arg[i]]
    n, perm, kept, keep, red = self._rplan(self._shape(x), axes)
    x = self._get(x)
    if n:
      if perm is not None: x = self._mop(x, TOps.PERMUTE, perm)
      x = self.mk(TOps.REDUCE, x.dtype, (x,), (_trop(rop), n))
    self.reduced[i] = (x, kept, keep, red)
    return x

  def _pplan(self, keep: tuple, red: tuple, p: tuple) -> tuple:
    """How a PERMUTE by p of a row held without its axes red (keepdim shape keep) is made (see _permuted): (the
    permute of the held node or None, the permuted shape without those axes, the permuted keepdim shape, where
    those axes went)."""
    k = (keep, red, p)
    plan = _PLANS.get(k)
    if plan is None:
      rem = [a for a in range(len(keep)) if a not in red]
      pp = tuple(rem.index(a) for a in p if a not in red)
      shape = tuple(keep[a] for a in p)
      gone = tuple(j for j, a in enumerate(p) if a in red)
      plan = _plan(k, (None if pp == tuple(range(len(pp))) else pp,
                       tuple(s for j, s in enumerate(shape) if j not in gone), shape, gone))
    return plan

  def _permuted(self, i: int, got: tuple) -> TUOp:
    """A PERMUTE (row i) of a row held without its reduced axes (see _reduce) as the permute of that node: the
    size-1 axes carry no order. Remembered as the reduce is, so a user reshaping it back gets the node itself."""
    x, _, keep, red = got
    pp, kept, shape, gone = self._pplan(keep, red, _args_objs[self.arg[i]])
    y = x if pp is None else self._mop(x, TOps.PERMUTE, pp)
    self.reduced[i] = (y, kept, shape, gone)
    return y

  def _row_plans(self, todo: np.ndarray, lazy: np.ndarray, bcast: np.ndarray, ids, op, tag, arg, start: np.ndarray,
                 src) -> list:
    """For the C loop (csrc/pyforeign.c), each row's plan (None: none) for the untagged rows it makes by plan rather
    than by op alone: a REDUCE_AXIS (1, PERMUTE, its perm or None, REDUCE, its arg or None, then what _reduce
    remembers: the shape without the reduced axes, the keepdim shape, the axes reduced; then RESHAPE and the keepdim
    shape's operand, for a user that needs that shape), a PERMUTE of a row held reduced (2, PERMUTE, its perm of the
    held node or None, then what _permuted remembers, then RESHAPE and the shape operand of what it remembers as its
    users' shape) and any other PERMUTE or FLIP (0, the tinygrad op, its arg); and for the helper rows among lazy
    (rows to convert that are made when asked for), the plans by which the C loop makes them as _lazy does: an
    explicit broadcast (4,) (bcast: their rows), with fold an untagged RESHAPE (5: see _fold_plans). Plans come from
    _rplan and _pplan once per distinct (arg, source shape) and (arg, source's plan), so the C loop makes the nodes
    _reduce, _permuted and _mop make; at each row it checks that the source is held reduced (kinds 1, 2) or not (kind
    0), and leaves the row to Python if not."""
    plans = np.full(len(op), None, object)
    t = todo[tag[todo] == 0]
    ot = op[t]  # (each selection below reads this once: W1 makes ~10^5 rows)
    first = lambda rows: src[start[rows]]  # noqa: E731  (their one source row)
    held: list = []  # the held shapes (kept, keep, axes gone) of the plans made
    ent = np.full(len(op), -1, np.int64)  # row -> its index in held
    red = t[ot == _REDUCEOP]
    if len(red):
      keys, inv = _pairs(arg[red], CORE.rows(ids[first(red)], arrays=True)[0][:, 5])
      made = []
      for a, m in keys:
        rop, axes = _args_objs[a]
        n, perm, kept, keep, rd = self._rplan(_meta_vals[m][0], axes)
        made.append((1, _TPERMUTE, perm if n else None, _TREDUCE, (_trop(rop), n) if n else None, kept, keep, rd,
                     _TRESHAPE, self._shape_arg(keep)))
        held.append((kept, keep, rd))
      ent[red] = inv
      plans[red] = _objs(made)[inv]
    perm = t[ot == _PERMUTE]
    while len(held):  # a permute of a held row is held: one more link of such chains a pass
      lvl = perm[(ent[first(perm)] >= 0) & (ent[perm] < 0)]
      if not len(lvl): break
      keys, inv = _pairs(arg[lvl], ent[first(lvl)])
      made = []
      for a, e in keys:
        pp, kept, shape, gone = self._pplan(held[e][1], held[e][2], _args_objs[a])
        made.append((2, _TPERMUTE, pp, kept, shape, gone, _TRESHAPE, self._shape_arg(shape)))
        held.append((kept, shape, gone))
      ent[lvl] = inv + (len(held) - len(made))
      plans[lvl] = _objs(made)[inv]
    plain = t[((ot == _PERMUTE) & (ent[t] < 0)) | (ot == _FLIP)]
    if len(plain):
      keys, inv = _pairs(op[plain], arg[plain])
      plans[plain] = _objs([(0, _TPERMUTE if o == _PERMUTE else _TFLIP, _args_objs[a]) for o, a in keys])[inv]
    plans[bcast] = _BCAST_PLAN
    if self.fold:
      ex, rs = t[ot == _EXPANDOP], lazy[(op[lazy] == _RESHAPE) & (tag[lazy] == 0)]
      if len(ex) or len(rs): self._fold_plans(plans, ex, rs, ids, arg, first)
    return plans.tolist()

  def _fold_plans(self, plans: np.ndarray, ex: np.ndarray, rs: np.ndarray, ids, arg, first) -> None:
    """_row_plans with reshapes folded (a gradient's), for the untagged EXPAND rows ex: (3, the rows' shape ids,
    RESHAPE, the shape id of the shape without the grown axes, that shape, tinygrad's RESHAPE, its shape operand,
    EXPAND, the grown axes' shape operand, PERMUTE, the permute back or None), from _eplan once per distinct (arg,
    source shape), so the C loop makes the nodes _expand makes (an expand that grows nothing is left to Python); and
    for the untagged RESHAPE rows rs (made when asked for, as _lazy makes them): (5, the rows' shape ids, RESHAPE,
    the row's shape, tinygrad's RESHAPE, that shape's operand)."""
    # the C loop reads the shape ids of these rows only (an expand's source below its chain of reshapes made on
    # demand, a reshape made on demand and the row below its chain): reading every row's shape cost W1 ~8 ms
    need = np.zeros(len(ids), bool)
    for rows in (rs, first(rs), first(ex)): need[rows] = True
    need = np.flatnonzero(need)
    metas = np.full(len(ids), -1, np.int32)
    metas[need] = CORE.rows(ids[need], arrays=True)[0][:, 5]
    um, inv = np.unique(metas[need], return_inverse=True)
    sid: dict = {}  # shape -> its id
    shid = -2 - np.arange(len(ids), dtype=np.int32)  # a row whose shape is not read: an id no other row has
    shid[need] = np.array([sid.setdefault(_meta_vals[m][0], len(sid)) for m in um.tolist()], np.int32)[inv.reshape(-1)]
    shid = shid.tobytes()
    if len(ex):
      keys, inv = _pairs(arg[ex], metas[first(ex)])
      made = []
      for a, m in keys:
        kept, grown, perm = self._eplan(_meta_vals[m][0], _args_objs[a])
        made.append((3, shid, _RESHAPE, sid.get(kept, -1), kept, _TRESHAPE, self._shape_arg(kept), _TEXPAND,
                     self._shape_arg(grown), _TPERMUTE, perm) if grown else None)
      plans[ex] = _objs(made)[inv]
    if len(rs):
      keys, inv = np.unique(arg[rs], return_inverse=True)
      made = [(5, shid, _RESHAPE, a, _TRESHAPE, self._shape_arg(a)) for a in map(_args_objs.__getitem__, keys.tolist())]
      plans[rs] = _objs(made)[inv.reshape(-1)]

  def _reshaped(self, r: int, shape: tuple) -> TUOp:
    """Row r's tinygrad node reshaped to `shape` (a REDUCE_AXIS's reduce, not its keepdim reshape)."""
    if self.fold:  # reshapes left to be made on demand are skipped: a reshape of a reshape is one
      op, tag, out = self.op, self.tag, self.out
      while op[r] == _RESHAPE and not tag[r] and out[r] is None: r = self.src[self.start[r]]
    got = self.reduced.get(r)
    if got is None:
      if self.fold and self._shape(r) == shape: return self._get(r)
      return self._mop(self._get(r), TOps.RESHAPE, shape)
    return got[0] if got[1] == shape else self._mop(got[0], TOps.RESHAPE, shape)

  def _one(self, i: int, o: int, tag) -> TUOp:
    if type(tag) is tuple and tag[0] == _TG: return tag[1]
    a = _args_objs[self.arg[i]]
    get = self._get
    if o in _TALU_I:
      src = tuple(get(j) for j in self._srcs(i))
      # the dtype is given unless every operand is weak (then tinygrad's promotion decides, as it did before)
      for s in src:
        if s.dtype not in _WEAK: return self.mk(_TALU_I[o], _TDT_I[self.dt[i]], src)
      return TUOp(_TALU_I[o], src=src)
    if o == _CONST:
      k = (self.dt[i], self.arg[i])
      got = self.consts.get(k)
      if got is None: got = self.consts[k] = TUOp.const(a, _TDT_I[k[0]])
      return got
    if o == _RESHAPE:
      r = self.src[self.start[i]]
      if tag == _REDUCE and self.op[r] == _REDUCEOP and _args_objs[self.tag[r]] == _REDUCE:
        xt, ra = get(self.src[self.start[r]]), _args_objs[self.arg[r]]
        return self.mk(TOps.REDUCE, xt.dtype, (xt,), (_trop(ra[0]), len(ra[1])))
      return self._reshaped(r, a)
    if o == _EXPANDOP:
      r = self.src[self.start[i]]
      if tag == _EXPAND:
        inner = self.src[self.start[r]]
        return self._mop(get(inner), TOps.EXPAND, a[:len(a) - len(self._shape(inner))])
      return self._expand(r, a)
    srcs = self._srcs(i)
    x = get(srcs[0]) if srcs else None
    if o == _PERMUTE: return self._mop(x, TOps.PERMUTE, a)
    if o == _FLIP: return self._mop(x, TOps.FLIP, a)
    if o == _PAD: return self._mop(x, TOps.PAD, tuple((b, s + b + e) for (b, e), s in zip(a, self._shape(srcs[0]))))
    if o == _SHRINK: return self._mop(x, TOps.SHRINK, tuple((b, e - b) for b, e in a))
    if o == _CAST or o == _BITCAST:
      d = _TDT_I[self.dt[i]]
      return self.mk(TOps.CAST if o == _CAST else TOps.BITCAST, d, (x,), d)
    if o == _CONTIGUOUS and type(tag) is tuple and tag[0] == _ASSIGN:
      view = tag[1]
      return view.after(view.store(x))
    if o in _IDENT: return self.mk(_TOPS[o], x.dtype, (x,))
    if o == _COPY: return TUOp(TOps.COPY, src=(x,), arg=a)
    if o == _BUFFER:
      if isinstance(a[0], TUOp): return a[0]
      shape, n = a[1], math.prod(a[1])
      # a pygrad input becomes the same tinygrad BUFFER in every conversion: its slot is derived from the unique id
      slot = _SLOT0 - a[0] if type(a[0]) is int else None
      b = TUOp.new_buffer(a[2], n, _TDT_I[self.dt[i]], num=slot)
      return b if shape == (n,) else self._mop(b, TOps.RESHAPE, shape)
    if o == _DEFINE_VAR: return TUOp.variable(a[0], a[1], a[2], _TDT_I[self.dt[i]])
    if o == _PARAM: return TUOp.param(a[0], _TDT_I[self.dt[i]], a[1], a[2])
    if o == _NOOP: return TUOp(TOps.NOOP)
    if o == _TUPLE: return TUOp.maketuple(*(get(j) for j in srcs))
    if o == _SINK: return TUOp.sink(*(get(j) for j in srcs))
    if o == _GETTUPLE:
      if tag == _ASSIGN_P:  # an assign into a function body's PARAM: GETTUPLE(TUPLE(value, view), 0)
        v, view = (get(j) for j in self._srcs(srcs[0]))
        return view.after(view.store(v))
      return TUOp(TOps.GETTUPLE, src=(x,), arg=a)
    if o == _AFTER: return x.after(get(srcs[1]))
    if o == _FUNCTION or o == _CALL:
      info = tag[1] if type(tag) is tuple and tag[0] == _INFO else _tcallinfo(Ops(o).name, a)
      if o == _CALL:
        # a tinygrad kernel (converted in as a tagged SINK) goes back as itself; a pygrad kernel tinygrad cannot run
        kt = _args_objs[self.tag[srcs[0]]]
        if not (type(kt) is tuple and kt[0] == _TG):
          raise ValueError(f"to_tinygrad: CALL {a.name!r} has a pygrad kernel; tinygrad cannot run it")
        return TUOp(TOps.CALL, src=tuple(get(j) for j in srcs), arg=info)
      src = tuple(get(j) for j in srcs)
      if any(s.dtype in _WEAK for s in src[1:]): src = (_weak_params(src[0], src[1:]), *src[1:])
      return TUOp(TOps.FUNCTION, src=src, arg=info)
    raise ValueError(f"to_tinygrad: pygrad op {Ops(o).name} has no tinygrad counterpart")


def _weak_params(body: TUOp, args: tuple) -> TUOp:
  """body with the PARAMs of its weak arguments (a bound variable) in their weak dtype, as tinygrad's param_like
  makes them: pygrad has no weak dtypes, so a PARAM of a backward pygrad made (renumbered) came out int32 and
  tinygrad refused the FUNCTION ('arg 1 dtype mismatch: expected dtypes.int, got dtypes.weakint': seed 6047)."""
  subs = {}
  for p in body.toposort(enter_calls=False):
    if p.op is TOps.PARAM and 0 <= p.arg.slot < len(args):
      a = args[p.arg.slot]
      if a.dtype in _WEAK and p.dtype is not a.dtype: subs[p] = a.param_like(p.arg.slot)
  return body.substitute(subs) if subs else body


_TROP = {o: getattr(TOps, o.name) for o in (Ops.ADD, Ops.MAX, Ops.MUL)}


def _trop(o) -> TOps:
  """tinygrad's reduce op of pygrad's (by table: an enum's .name is a Python property)."""
  t = _TROP.get(o)
  return t if t is not None else getattr(TOps, o.name)


def _export_above(root_ids: list, known: dict) -> tuple:
  """export's columns for a conversion with nodes known already (pygrad id -> tinygrad node): rows 0, 1, ... the
  known nodes, in known's order, then the nodes under root_ids that are reached without passing through a known one
  (the export stops at known nodes: a gradient's table leaves out the forward graph below them), and the table's
  row of each node id (-1: none). The known rows are never made, so they have no sources and op -1; their ids are
  theirs (for their shapes)."""
  kid = np.fromiter(known, np.int64, len(known))
  k = len(kid)
  pos = _fresh_pos()
  pos[kid] = np.arange(k, dtype=np.int32)
  ids, op, dt, arg, tag, pdata, nsrc, src, args = _table(root_ids, pos, k)
  full = np.concatenate([np.zeros(1, np.int32), args])
  z = np.zeros(k, np.int32)
  return (np.concatenate([kid.astype(np.int32), ids]), np.concatenate([np.full(k, -1, np.int32), op]),
          np.concatenate([z, dt]), np.concatenate([z, full[arg]]), np.concatenate([z, full[tag]]),
          np.concatenate([z, full[pdata]]), np.concatenate([z, nsrc]), src, pos)


# the fewest rows to make for which the C loop is used (CPU time, busy machine: a W1 gradient of 268 rows 0.53 ms
# with the C loop and 0.45 with the Python one, 523 rows 0.62 and 0.74; the MLP of tests/ (49 nodes) 0.48 and 0.25)
_C_ROWS = 300
# plans and shape operands depend on the shapes and args alone (a shape operand is a hash-consed node: holding it
# keeps it the one tinygrad makes), so they are kept across conversions: a small graph's conversion made them anew
# for a third of its time; bounded, as _MD_OUT is
_PLANS: dict = {}  # (shape, axes or shape) -> how a REDUCE_AXIS, EXPAND or PERMUTE of that shape is made
_SHAPES: dict = {}  # static shape -> tinygrad's shape operand


def _plan(k: tuple, plan: tuple) -> tuple:
  if len(_PLANS) >= 4096: _PLANS.clear()
  _PLANS[k] = plan
  return plan


def _pairs(a: np.ndarray, b: np.ndarray) -> tuple[list, np.ndarray]:
  """The distinct pairs (a[k], b[k]) of two columns of non-negative ints below 2**31 (as a list of int pairs), and
  each k's index among them: np.unique on one int64 key (its axis=0 form sorts a structured view, several times
  slower)."""
  key = a.astype(np.int64) << 32 | b.astype(np.int64)
  keys, inv = np.unique(key, return_inverse=True)
  return list(zip((keys >> 32).tolist(), (keys & 0xFFFFFFFF).tolist())), inv.reshape(-1)


def _objs(items: list) -> np.ndarray:
  """items as a 1-d object array (np.array would make tuples of equal length into a 2-d one)."""
  ret = np.empty(len(items), object)
  for k, x in enumerate(items): ret[k] = x
  return ret


_TCAST, _TBITCAST, _TPERMUTE, _TFLIP, _TREDUCE = TOps.CAST, TOps.BITCAST, TOps.PERMUTE, TOps.FLIP, TOps.REDUCE
_TRESHAPE, _TEXPAND = TOps.RESHAPE, TOps.EXPAND
# an explicit broadcast's plan: its source's node (an object array: numpy would unpack a tuple assigned to rows)
_BCAST_PLAN = _objs([(4,)])
# the C loop's tables (csrc/pyforeign.c): pygrad op -> tinygrad ALU op, dtype id -> tinygrad dtype (None: none)
_TALU_T = tuple(_TALU_I.get(o) for o in range(max(_TALU_I) + 1))
_TDT_T = tuple(_TDT_I.get(d) for d in range(max(_TDT_I) + 1))
_WEAK_T = tuple(_WEAK)
_TFIELDS = _tfields()  # the C loop makes tinygrad's nodes by setting these (see _tfields)
_SLOT0 = -(1 << 48)  # below tinygrad's own slots (counters from 0, and -id(buffer) for adopted storage)
