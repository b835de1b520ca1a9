"""Planner._visit as a sweep over a large plain graph's columns (Planner.__init__ with LazyNodes and a kwalk.Graph):
the same buffers, in the same order, and the same jobs, without a PNode per visited node.

The per-node visit decides, in node order, which values get a buffer (inputs, constants, reductions, and elementwise
or movement values that are outputs or read twice) and gives every other stored value a view. Only movement ops
depend on what came before them (their source's view at that point, which a later PAD or EXPAND may give it), so
the rest is decided as arrays and the movement ops alone are swept in Python, over integers: a view is a class (one
per distinct View), a movement a transition between classes (a layered graph has a handful). The buffers are then
made by the planner's own _materialize, _const and _copy_view in the visit's order (events), and a node's view is
made when it is first read (LazyNodes.view_of). A graph the sweep does not cover (a CALL, AFTER or MULTI, an
unknown op, a missing input, a value past the VM's bound) is left to the per-node visit, which raises its errors."""
from __future__ import annotations
import math
from itertools import count, repeat
import numpy as np
from ..ops import Ops
from ..dtype import BY_ID
from .views import View, apply
from .records import compute_dtype, Buf
from .flatten import LazyNodes, _OPS
from .kwalk import PU_ALU, PU_ALU_MOVE, PURE, VM_MAXSIZE

_INPUT_IDS = [int(o) for o in (Ops.BUFFER, Ops.DEFINE_VAR, Ops.PARAM)]
_CONST, _REDUCE, _PAD, _EXPAND = (int(o) for o in (Ops.CONST, Ops.REDUCE_AXIS, Ops.PAD, Ops.EXPAND))
_NAMES = [o.name for o in _OPS]
_ITEMSIZE = [max(compute_dtype(d).itemsize, 1) for d in BY_ID]
# event kinds: a node's buffer (Planner._materialize's arena buffer), a copy of a view, a CONST's buffer, an output's
_MAT, _COPY, _CONSTEV, _OUTEV = 0, 1, 2, 3
_CT = {d: compute_dtype(d) for d in BY_ID if d is not None}


def covers(nodes) -> bool:
  """Whether the sweep may replace the per-node visit: a LazyNodes graph (whose columns it reads)."""
  return type(nodes) is LazyNodes


def sweep(pl, g, nodes: LazyNodes, outs: list[int]) -> np.ndarray | None:
  """Does Planner.__init__'s visit of nodes (g: its kwalk.Graph, after users_fused; outs: the outputs' node
  numbers). Returns per node whether it has a view after the visit (kwalk.Walk's leaves), or None, having changed
  nothing, when the graph is left to the per-node visit."""
  n, ops, flags = g.n, g.op_ids, g.ops
  alu = (flags & PU_ALU) != 0  # (elementwise: pure ALU, CAST, BITCAST)
  move = (flags & (PU_ALU | PU_ALU_MOVE)) == PU_ALU_MOVE
  inp, const, red = np.isin(ops, _INPUT_IDS), ops == _CONST, ops == _REDUCE
  if not (alu | move | inp | const | red).all(): return None
  input_bufs = pl.input_bufs
  at_in = np.flatnonzero(inp)
  in_nids = nodes._nids[at_in].tolist()
  if any(i not in input_bufs for i in in_nids): return None
  shapes, sid = g.sid_shapes, g.sid
  # every value but a pure ALU op's within the VM's bound (its size by shape id and dtype id)
  chk = np.flatnonzero((flags & PURE) == 0)
  if len(chk):
    nd = len(BY_ID)
    for k in np.unique(sid[chk].astype(np.int64) * nd + g.dt_ids[chk]).tolist():
      sh = shapes[k // nd]
      if sh and math.prod(sh) * _ITEMSIZE[k % nd] > VM_MAXSIZE: return None
  many = np.array([math.prod(sh) > 1 for sh in shapes], bool)  # per shape id: more than one element
  is_out = np.zeros(n, bool)
  is_out[outs] = True
  # _visit's rule for an elementwise or movement value without a view: a buffer when an output, or read twice and
  # not one element and not computed where its readers are (_fused_shared)
  dec = is_out | ((g.users >= 2) & many[sid] & (g.fused_np == 0))
  own = red | (alu & dec)  # buffers decided at the node's own visit, in node order (CONSTs too, below)
  # per node: the node whose event made the buffer its view reads (an input's: -2 - its buffer's id; none: -1), the
  # class of that view (views[c]); classes by View.key, the contiguous ones per shape id first made when needed
  bref = np.full(n, -1, np.int64)
  bref[at_in] = [-2 - input_bufs[i].id for i in in_nids]
  at_own = np.flatnonzero(own | const)
  bref[at_own] = at_own
  views, vkey, contig = [], {}, {}

  def cls(v: View) -> int:
    k = v.key()
    c = vkey.get(k)
    if c is None:
      c = vkey[k] = len(views)
      views.append(v)
    return c

  def contig_cls(s: int) -> int:
    c = contig.get(s)
    if c is None: c = contig[s] = cls(View.contiguous(shapes[s]))
    return c

  vc = np.full(n, -1, np.int64)
  has = bref != -1
  at_v = np.flatnonzero(has & ~const)
  if len(at_v):
    us, inv = np.unique(sid[at_v], return_inverse=True)
    vc[at_v] = np.array([contig_cls(s) for s in us.tolist()], np.int64)[inv]
  at_c = np.flatnonzero(const)
  if len(at_c): vc[at_c] = cls(View.contiguous(()))
  # the events, (time, sub-order, kind, node) arrays: the buffers decided at a node's own visit, then the movements'
  ev = [(at_own, np.full_like(at_own, 2), np.full_like(at_own, _MAT), at_own)]
  at_mv = np.flatnonzero(move)
  if len(at_mv): ev += _moves(at_mv, nodes, ops, dec, sid, shapes, many, bref, vc, views, cls, contig_cls)
  br, vcl = bref.tolist(), vc.tolist()
  # the buffers, in the visit's order; the nodes they store (and the copies' sources) made a column at a time
  ev_t, ev_s, ev_k, ev_n = (np.concatenate(c) for c in zip(*ev))
  order = np.argsort(ev_t * 4 + ev_s)  # (one key per event)
  en, ek = ev_n[order], ev_k[order]
  ek[(ek == _MAT) & const[en]] = _CONSTEV
  ek[(ek == _MAT) & is_out[en]] = _OUTEV
  cps = nodes._cols[0][nodes._cols[1][en[ek == _COPY]]].tolist()
  need = np.unique(np.concatenate((en[ek != _COPY], cps)).astype(np.int64)).tolist()
  made = nodes._made
  # (the nodes made before the events, and those made for them but the arena buffers': their views set at the end)
  fix = list(nodes.made_idx) + np.unique(np.concatenate((en[(ek == _CONSTEV) | (ek == _OUTEV)], cps)).astype(
    np.int64)).tolist()
  at_a = np.flatnonzero(ek == _MAT)
  ja = en[at_a].tolist()
  nodes.make_bare([i for i in ja if made[i] is None])  # (the arena buffers' nodes: read by index, buffer, arg)
  nodes.make([i for i, m in zip(need, map(made.__getitem__, need)) if m is None])
  # the events in order but the arena buffers of plain nodes (most of them): their ids reserved (None in bl) where
  # they come, the buffers made after as columns
  bufs: dict = {}  # event node -> its buffer
  bl, jobs, aid, copies = pl.bufs, pl.jobs, [], []
  j0 = len(jobs)
  odd = np.flatnonzero(ek != _MAT)
  for q, p, j, k in zip(range(len(odd)), odd.tolist(), en[odd].tolist(), ek[odd].tolist()):
    if p - q > len(aid): _reserve(bl, aid, p - q - len(aid))  # (p - q arena buffers come before this event)
    if k == _CONSTEV: bufs[j] = pl._const(made[j])
    elif k == _OUTEV:
      m = made[j]
      pl._materialize(m)
      bufs[j] = m.buf
    else:
      copies.append((len(bl), j))
      bl.append(None)
  _reserve(bl, aid, len(at_a) - len(aid))
  ms = list(map(made.__getitem__, ja))
  dts, sa = list(map(BY_ID.__getitem__, g.dt_ids[en[at_a]].tolist())), sid[en[at_a]].tolist()
  new = list(map(Buf, aid, repeat("arena"), map(_CT.__getitem__, dts), map(shapes.__getitem__, sa), dts))
  cv = [View.contiguous(sh) for sh in shapes]  # (per shape id)
  for i, b, m, s in zip(aid, new, ms, sa):
    bl[i] = b
    b.node, m.buf, m.mat, m.view = m, b, True, (b, cv[s])
  jobs += zip(zip(ja, count(len(jobs))), ms, repeat(None))  # (Planner._materialize's jobs)
  bufs.update(zip(ja, new))
  for (bid, j), s in zip(copies, cps):  # (in order: a copy may read an earlier one)
    rs = br[s]
    bufs[j] = pl._copy_view((bufs[rs] if rs >= 0 else bl[-2 - rs], views[vcl[s]]), made[s], j, bid)
  # the jobs in their order (the planner's sort key: the stored node, a copy's movement node - 0.5, each once), as
  # appended: the outputs', the arena buffers', the copies'
  key = np.concatenate((en[odd][ek[odd] == _OUTEV], ja, np.array([j for _, j in copies], np.float64) - 0.5))
  if j0 == 0 and len(key) == len(jobs):
    jobs[:] = map(jobs.__getitem__, np.argsort(key, kind="stable").tolist())
    pl.jobs_sorted = True  # (the jobs the planner appends after, its outputs' copies, come last: order inf)
  inb = pl.bufs  # (an input's buffer: pl.bufs[its id])

  def view_of(i: int):
    r = br[i]
    if r == -1: return None
    return (bufs[r] if r >= 0 else inb[-2 - r], views[vcl[i]])
  nodes.view_of = view_of
  ids = np.full(n + 2, -1, np.int64)  # (per event node its buffer's id; -1 at the end for the nodes without a view)
  ids[en[at_a]] = aid
  oj = en[odd].tolist()  # (the consts', outputs' and copies' buffers, made one by one)
  ids[oj] = [bufs[j].id for j in oj]
  nodes.vcols = (np.where(bref >= 0, ids[np.maximum(bref, -1)], -2 - bref), vc, views, inb)
  for i in fix:
    m = made[i]
    if m.view is None: m.view = view_of(i)
  return bref != -1


def _reserve(bl: list, aid: list, k: int) -> None:
  """k buffer ids reserved at the end of bl (None there), listed in aid."""
  aid += range(len(bl), len(bl) + k)
  bl += repeat(None, k)


_ROUND_MIN = 1024  # movements from which a round of them is swept as arrays (fewer: one by one, in node order)
_ROUND_SHARE = 8  # and at least 1/this of the movements left


def _moves(at_mv, nodes: LazyNodes, ops, dec, sid, shapes, many, bref, vc, views, cls, contig_cls) -> list:
  """The movement ops' views and events ((time, sub-order, kind, node) arrays), bref and vc updated. A movement
  depends on its source only: one whose source is settled (not a movement, or a movement swept before) is swept
  with the others of its round as arrays, a transition computed once per distinct (class, op, arg); all readers of a
  source are in one round, so a PAD or EXPAND storing its source stores it at its first such reader, and the
  readers before that one read it as an expression, as the per-node visit has them. What is left when a round would
  be small, or small against what is left (long chains of movements), is swept one by one (_moves_seq)."""
  sp, start = nodes._cols[:2]
  srcs = sp[start[at_mv]]
  opm, argm = ops[at_mv], nodes._args[at_mv]
  argobj = nodes._arg_objs
  settled = np.ones(len(bref), bool)
  settled[at_mv] = False
  ev: list = []
  left = np.arange(len(at_mv))
  trans: dict = {}  # (class, op id, arg id) -> class after the movement, or -1: a copy
  copied: dict = {}  # (shape id, op id, arg id) -> the class of the movement on a contiguous copy
  while len(left):
    ready = settled[srcs[left]]
    r = left[ready]
    if len(r) < _ROUND_MIN or not len(r) or len(r) < len(left) // _ROUND_SHARE:  # (a round costs O(left))
      ev += _moves_seq(left, at_mv, srcs, opm, argm, argobj, dec, sid, shapes, many, bref, vc, views, cls,
                       contig_cls, trans, copied)
      break
    left = left[~ready]
    i, s, o, a = at_mv[r], srcs[r], opm[r], argm[r]
    sb, sc, ssid = bref[s], vc[s], sid[s]
    st = (sb == -1) & ((o == _PAD) | ((o == _EXPAND) & many[ssid]))
    if st.any():  # sources stored first, at their first such reader
      us, first = np.unique(s[st], return_index=True)
      t0 = i[st][first]
      cu = _classes(sid[us], contig_cls)
      ev.append((t0, np.zeros_like(t0), np.full_like(t0, _MAT), us))
      bref[us], vc[us] = us, cu
      p = np.minimum(np.searchsorted(us, s), len(us) - 1)
      later = (sb == -1) & (us[p] == s) & (i >= t0[p])
      sb[later], sc[later] = s[later], cu[p[later]]
    h = np.flatnonzero(sb != -1)
    if len(h):  # views moved: a class per distinct (class, op, arg), or a copy (-1)
      t = _per_key((sc[h], o[h], a[h]), trans, lambda c, oo, aa: _trans(views, cls, c, oo, argobj[aa]))
      cp = t < 0
      if cp.any():  # (a RESHAPE the strides cannot express: a contiguous copy of the source's view)
        hc = h[cp]
        t[cp] = _per_key((ssid[hc], o[hc], a[hc]), copied, lambda q, oo, aa: cls(apply(
          View.contiguous(shapes[q]), _NAMES[oo], argobj[aa])))
        ev.append((i[hc], np.ones_like(hc), np.full_like(hc, _COPY), i[hc]))
        sb[hc] = i[hc]
      bref[i[h]], vc[i[h]] = sb[h], t
    d = np.flatnonzero((sb == -1) & dec[i])
    if len(d):  # no view, and stored
      ev.append((i[d], np.full_like(d, 2), np.full_like(d, _MAT), i[d]))
      bref[i[d]], vc[i[d]] = i[d], _classes(sid[i[d]], contig_cls)
    settled[i] = True
  return ev


def _trans(views, cls, c: int, o: int, arg) -> int:
  v2 = apply(views[c], _NAMES[o], arg)
  return -1 if v2 is None else cls(v2)


def _classes(q: np.ndarray, contig_cls) -> np.ndarray:
  """The contiguous view classes of the shape ids q."""
  u, inv = np.unique(q, return_inverse=True)
  return np.array([contig_cls(x) for x in u.tolist()], np.int64)[inv.reshape(-1)]


def _per_key(cols: tuple, memo: dict, fn) -> np.ndarray:
  """fn(*key) per row of the int columns cols, computed once per distinct key (memo: key tuple -> result)."""
  k = np.stack(cols, 1)
  span = k.max(0) + 1  # (one int per row when the columns' ranges fit: np.unique's axis=0 sorts much slower)
  if math.prod(span.tolist()) < 1 << 62:
    code = k[:, 0].copy()
    for j in range(1, k.shape[1]): code = code * span[j] + k[:, j]
    first, inv = np.unique(code, return_index=True, return_inverse=True)[1:]
    u = k[first]
  else: u, inv = np.unique(k, axis=0, return_inverse=True)
  out = []
  for key in map(tuple, u.tolist()):
    x = memo.get(key)
    if x is None: x = memo[key] = fn(*key)
    out.append(x)
  return np.array(out, np.int64)[inv.reshape(-1)]


def _moves_seq(left, at_mv, srcs, opm, argm, argobj, dec, sid, shapes, many, bref, vc, views, cls, contig_cls, trans,
               copied) -> list:
  """_moves' sweep of the movements left (positions in at_mv, in node order) one by one: the per-node visit's."""
  ev_t, ev_s, ev_k, ev_n = [], [], [], []
  mv, sv = at_mv[left], srcs[left]
  ml, sl, opl, argl, decm = mv.tolist(), sv.tolist(), opm[left].tolist(), argm[left].tolist(), dec[mv].tolist()
  bs, cs, ssid, msid, manyl = bref[sv].tolist(), vc[sv].tolist(), sid[sv].tolist(), sid[mv].tolist(), many.tolist()
  upd: dict = {}  # node -> (buffer ref, class) of the views given here (movements, sources stored here)
  for k, i in enumerate(ml):
    s, o = sl[k], opl[k]
    u = upd.get(s)
    sb, sc = u if u is not None else (bs[k], cs[k])
    if sb == -1 and (o == _PAD or (o == _EXPAND and manyl[ssid[k]])):  # its source stored first
      ev_t.append(i), ev_s.append(0), ev_k.append(_MAT), ev_n.append(s)
      sb, sc = upd[s] = (s, contig_cls(ssid[k]))
    if sb != -1:
      a = argl[k]
      tk = (sc, o, a)
      t = trans.get(tk)
      if t is None: t = trans[tk] = _trans(views, cls, sc, o, argobj[a])
      if t < 0:  # (a RESHAPE the strides cannot express: a contiguous copy of the source's view)
        ck = (ssid[k], o, a)
        t = copied.get(ck)
        if t is None: t = copied[ck] = cls(apply(View.contiguous(shapes[ssid[k]]), _NAMES[o], argobj[a]))
        ev_t.append(i), ev_s.append(1), ev_k.append(_COPY), ev_n.append(i)
        upd[i] = (i, t)
      else: upd[i] = (sb, t)
    elif decm[k]:
      ev_t.append(i), ev_s.append(2), ev_k.append(_MAT), ev_n.append(i)
      upd[i] = (i, contig_cls(msid[k]))
  if upd:
    at_u = np.fromiter(upd, np.int64, len(upd))
    bc = np.array(list(upd.values()), np.int64).reshape(-1, 2)
    bref[at_u], vc[at_u] = bc[:, 0], bc[:, 1]
  return [tuple(np.array(x, np.int64) for x in (ev_t, ev_s, ev_k, ev_n))]
