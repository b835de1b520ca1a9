"""Lowering memoized per kernel shape: a graph built layer by layer (a deep net, its gradient) plans the same few
kernels thousands of times over different buffers (the W1 chain's gradient: 12 distinct kernels in 6,450). A
kernel's key is everything lowering reads (index space, reduction, each node's op, dtypes, constant, operands, each
load's and store's view and storage type) with its buffers numbered by first use; the first kernel of a key is
lowered over stand-in buffers, and every kernel of that key gets those words with its own buffer ids written at the
stand-ins' positions.

Two ways in, one key: `KernelCache.lower` keys a planned Loop from its KNodes; `KernelCache.walked` keys a small
kernel straight from the planner's C walk (its entries), so that a kernel the cache has seen is never made into
KNodes, a Loop and a Store at all (at ~6 nodes per kernel those objects were most of a compile's time)."""
from __future__ import annotations
from itertools import compress, chain
from operator import itemgetter
from typing import NamedTuple
import numpy as np
from ..ops import Ops
from ..dtype import BY_ID
from .planner import Loop, KNode, Store, Buf
from .lower import lower_loop, Part
from .views import View
from .kkey import KKey
from .kwalk import KW_LEAF
from ..ids import value

VM_MAXSIZE = value("consts", "VM_MAXSIZE")
_STANDIN = 1 << 56  # buffer ids of a kernel's template: no other word comes near (sizes, strides < VM_MAXSIZE)
assert VM_MAXSIZE < _STANDIN
_MISS = object()
# larger kernels are rarely repeated, and their key would cost what lowering them does; a layered net's gradient
# repeats kernels of ~50 nodes once per layer (the W1 chain's: sin's and exp2's derivatives fused), which at 32 were
# lowered again every time (10-12% of that compile's CPU time)
CACHE_MAX_NODES = 64
_CONST, _BUFFER = Ops.CONST, Ops.BUFFER
_TMPL = itemgetter(0)  # (a Words' template)


class KernelCache:
  """Lowering with a per-program memo (see the module's doc). `hits`: kernels given an earlier kernel's words."""

  def __init__(self):
    self.memo: dict = {}  # loop_key's keys -> Template, or None (the VM cannot take it)
    self.wmemo: dict = {}  # walked_key's (another form of key: the two never mix)
    self.cmemo: dict = {}  # copied's: a copy's key -> the Template of its loop_key, or None
    self.hits = 0
    self.kkey = None  # the plan's C key state (engine/kkey.py), once walked_c has run

  @property
  def max_nodes(self) -> int:
    """Kernels of at most this many nodes are cached (read at each call: tests turn the cache off with 0)."""
    return CACHE_MAX_NODES

  def lower(self, loop: Loop, new_buf=None) -> list[Part] | None:
    """lower_loop(loop, new_buf)'s result (a kernel small enough to be cached is never split)."""
    if loop.size > CACHE_MAX_NODES: return lower_loop(loop, new_buf)
    kt, bufs, num = loop_key(loop)
    hit = self.memo.get(kt, _MISS)
    if hit is _MISS: return self._miss(self.memo, loop, kt, bufs, num)
    self.hits += 1
    return _patched(hit, bufs)

  def _miss(self, memo: dict, loop: Loop, kt: tuple, bufs: list[Buf], num: dict) -> list[Part] | None:
    """Lower the first kernel of key kt over stand-ins and keep its words and the stand-ins' positions."""
    parts = lower_loop(_standin(loop, bufs, num))
    if parts is None:
      memo[kt] = None
      return None
    (words, fused, _), = parts
    hit = memo[kt] = Template(words, fused)
    return _patched(hit, bufs)

  def copied(self, src: Buf, view: View, dtype, b: Buf) -> list[Part] | None:
    """The lowered Parts of the planner's copy kernel (_emit_copy: src read through view, stored contiguous in b),
    or None when the VM cannot take it (the planner keeps the Loop, which the program runs by numpy). A copy's key
    holds only what varies in its loop_key (view, dtype, storage types, a constant's value), so a plan's thousands
    of copies (a layered gradient's transposed weight gradients) make no KNode, Loop or loop_key each; the first
    copy of a key is lowered as the Loop it is."""
    const = src.kind == "const" and view.is_scalar()
    ck = (view.key(), dtype, src.stype, b.stype, const, src.data.item() if const else None)
    t = self.cmemo.get(ck, _MISS)
    if t is _MISS:
      k = KNode.load(src, view, dtype)
      loop = Loop(view.shape, [k], [Store(k, b, View.contiguous(view.shape))])
      parts = self.lower(loop)
      self.cmemo[ck] = self.memo.get(loop_key(loop)[0])
      return parts
    if t is None: return None
    self.hits += 1
    ids = (src.id, b.id)  # (numbered by first use: the load's buffer, then the store's)
    return [Part(Words(t, [ids[j] for j in t.js]), t.fused, [src, b])]

  def walked(self, pl, walk: tuple, top, kshape, head: tuple, sbuf: Buf, sview: View) -> list:
    """The kernel storing `top` (walked in C: walk is Planner._Walk.run's (entries, operands, cells), at most
    max_nodes entries) into sbuf through sview, head being (shape, reduce op, reduced axes, result dtype): its
    lowered Parts when the cache has its key, else the Loop made and lowered now (its Parts), or the Loop itself
    when the VM cannot take it (the program runs it with numpy). The same KNodes, key and words as the planner's
    _knodes_small, Loop and lower() would give (tests/test_vm_kcache.py checks the words)."""
    kt, bufs, num, lspecs, codes = walked_key(pl, walk, top, kshape, head, sbuf, sview)
    hit = self.wmemo.get(kt, _MISS)
    if hit is not _MISS and hit is not None:
      self.hits += 1
      return [Part(Words(hit, [bufs[j].id for j in hit.js]), hit.fused, bufs)]
    ent, srcs = walk[:2]
    if type(ent) is not list: ent, srcs = ent.tolist(), srcs.tolist()
    kn, top_kn = _knodes(pl, ent, srcs, lspecs, codes)
    loop = Loop(kshape, kn, [Store(top_kn, sbuf, sview)], head[1], head[2], head[3], reachable=True)
    if hit is None: return [loop]
    parts = self._miss(self.wmemo, loop, kt, bufs, num)
    return [loop] if parts is None else parts


  def kkey_of(self, pl) -> KKey:
    """The plan's C key state (engine/kkey.py), made at its first use with every leaf's node registered."""
    kk = pl.kkey
    if kk is None:
      kk = pl.kkey = self.kkey = KKey(pl.walk, pl.sigs if pl.sigs is not None else _sig_array(pl.walk.g))
      kk.nodes(pl.flat, np.flatnonzero(pl.walk.flags & KW_LEAF).tolist())
    return kk

  def walked_c(self, pl, m: int, nsrc: int, top, kshape, head: tuple, sbuf: Buf, sview: View) -> list:
    """walked's result for the kernel the plan's C walk holds (m <= max_nodes entries, nsrc operands: Walk.run_raw),
    keyed in C (engine/kkey.py): the same Parts, or Loop, and the same words."""
    kk = self.kkey_of(pl)
    c = kk.make(pl, m, nsrc, head, sbuf, sview, top, kshape, _leaf)
    hit = kk.tmpl.get(c, _MISS)
    ids = kk.ffi.unpack(kk.bufs, kk.info[2])
    bl = pl.bufs
    if hit is not _MISS and hit is not None:
      self.hits += 1
      return [Part(Words(hit, ids if hit.inorder and len(ids) == len(hit.js) else [ids[j] for j in hit.js]), hit.fused,
                   list(map(bl.__getitem__, ids)))]
    w = pl.walk
    ent, srcs = w.out[:3 * m].tolist(), w.out_src[:nsrc].tolist()
    nl, unpack = kk.info[1], kk.ffi.unpack
    codes = unpack(kk.codes, m)
    lspecs = [(bl[b], *kk.vinfo[v]) for b, v in zip(unpack(kk.lbuf, nl), unpack(kk.lvid, nl))]
    kn, top_kn = _knodes(pl, ent, srcs, lspecs, codes)
    loop = Loop(kshape, kn, [Store(top_kn, sbuf, sview)], head[1], head[2], head[3], reachable=True)
    if hit is None: return [loop]
    bufs = [bl[i] for i in ids]
    parts = self._miss(kk.tmpl, loop, c, bufs, {b.id: j for j, b in enumerate(bufs)})
    return [loop] if parts is None else parts


def _patched(hit, bufs: list[Buf]) -> list[Part] | None:
  """A cached kernel's words with this kernel's buffer ids at the stand-ins' positions."""
  if hit is None: return None
  words = list(hit.words)
  for i, j in zip(hit.at, hit.js): words[i] = bufs[j].id
  return [Part(words, hit.fused, bufs)]


class Template:
  """A cached kernel's words over stand-in buffers: `at` the positions of the stand-ins, `js` their numbers (the
  kernel's buffers in order of first use); `arr` the words as an array, for assemble."""
  __slots__ = ("words", "fused", "at", "js", "arr", "pos", "inorder")

  def __init__(self, words: list[int], fused: bool):
    self.words, self.fused = words, fused
    self.at = [i for i, w in enumerate(words) if w >= _STANDIN]
    self.js = [words[i] - _STANDIN for i in self.at]
    self.inorder = self.js == list(range(len(self.js)))  # (each buffer once, in order: the kernel's ids, if all)
    self.arr, self.pos = np.array(words, np.int64), np.array(self.at, np.int64)


class Words(NamedTuple):
  """One kernel's words as a cached template and the kernel's buffer ids at the stand-ins' positions: written when
  the program is assembled (assemble), so a kernel given cached words copies none. `kind`: the VM kernel kind. (A
  tuple: engine/kbatch.py makes a plan's many at C speed, tuple.__new__ through map.)"""
  tmpl: Template
  ids: list

  @property
  def kind(self) -> int: return self.tmpl.words[0]

  def tolist(self) -> list[int]:
    words = list(self.tmpl.words)
    for i, b in zip(self.tmpl.at, self.ids): words[i] = b
    return words


def assemble(prefix: np.ndarray, seg: list) -> np.ndarray:
  """The int64 program of a segment: prefix (an int64 array: the header and buffer table), then each kernel's words
  (a list, or Words: its template's array with the kernel's buffer ids written in, one scatter per template for all
  its kernels)."""
  pieces, run, off = [prefix], [], len(prefix)
  groups: dict = {}  # id(template) -> (template, word offsets of its kernels, their buffer ids)
  for w in seg:
    if type(w) is Words:
      if run:
        pieces.append(np.array(run, np.int64))
        off += len(run)
        run = []
      t = w.tmpl
      g = groups.get(id(t))
      if g is None: g = groups[id(t)] = (t, [], [])
      g[1].append(off)
      g[2].append(w.ids)
      pieces.append(t.arr)
      off += len(t.arr)
    else: run += w
  if run: pieces.append(np.array(run, np.int64))
  code = np.concatenate(pieces) if len(pieces) > 1 else pieces[0]
  for t, offs, ids in groups.values():
    if len(t.pos):  # (the ids through fromiter: np.array of thousands of short lists is 3x slower)
      code[(np.array(offs, np.int64)[:, None] + t.pos).ravel()] = np.fromiter(chain.from_iterable(ids), np.int64,
                                                                               len(ids) * len(t.pos))
  return code


def loop_key(loop: Loop) -> tuple[tuple, list[Buf], dict]:
  """A planned Loop's key, its buffers in order of first use, and buffer id -> number."""
  bufs: list[Buf] = []
  num: dict[int, int] = {}  # buffer id -> its number in this kernel
  pos: dict[KNode, int] = {}
  key: list = [loop.shape, loop.redop, loop.redaxes, loop.rdtype]
  for i, k in enumerate(loop.knodes):
    pos[k] = i
    b = k.buf
    if b is None: key.append((k.op, k.dtype, k.sdtype, k.opcode, tuple([pos[s] for s in k.src])))
    else:
      j = num.get(b.id)
      if j is None:
        j = num[b.id] = len(bufs)
        bufs.append(b)
      key.append((k.op, k.dtype, k.arg, j, b.stype, k.view.key()))
  for st in loop.stores:
    j = num.get(st.buf.id)
    if j is None:
      j = num[st.buf.id] = len(bufs)
      bufs.append(st.buf)
    key.append((pos[st.src], j, st.buf.stype, st.view.key()))
  return tuple(key), bufs, num


def walked_key(pl, walk: tuple, top, kshape, head: tuple, sbuf: Buf, sview: View):
  """A key for the kernel the planner's _knodes_small would make from this walk, without making it: (key, buffers in
  order of first use, buffer id -> number, the loads' specs (buffer, view, dtype) in order, per entry its code).
  A code is the node's ALU signature (op, dtype, first operand's dtype, operand count, opcode: _sigs) or, for a
  leaf, -1 - its load's number (leaves with equal buffer, view and dtype are one load); the key is the codes, the
  operands as entry numbers, per load its (op, dtype, constant, storage type, view key) and buffer number, and the
  store: everything that makes the KNodes, so equal keys make equal KNodes over renumbered buffers. Each leaf's view
  is found as _knodes_small finds it; what a (node, cell) gives is kept in the plan's lmemo (unless a RESHAPE the
  strides cannot express made a copy kernel: then that is emitted here, before this kernel, each time, as
  _build_py does)."""
  ent, srcs, cells = walk
  if type(ent) is not list: ent, srcs = ent.tolist(), srcs.tolist()
  sig = pl.sigs
  if sig is None: sig = pl.sigs = _sigs(pl.walk.g)
  codes = list(map(sig.__getitem__, ent[0::3]))
  nodes, lmemo = pl.flat, pl.lmemo
  key: list = list(head)
  lspecs: list = []
  loads: dict = {}
  bufs: list[Buf] = []
  num: dict[int, int] = {}
  for e in compress(range(len(codes)), ent[2::3]):  # the leaves
    x, c = ent[3 * e], ent[3 * e + 1]
    mk = x if not c else (x, c, kshape)
    r = lmemo.get(mk)
    if r is None: r = _leaf(pl, nodes[x], c, cells, top, kshape, lmemo, mk)
    i = loads.get(r[2])
    if i is None:
      b = r[0]
      i = loads[r[2]] = len(lspecs)
      lspecs.append(r[3])
      j = num.get(b.id)
      if j is None:
        j = num[b.id] = len(bufs)
        bufs.append(b)
      key.append(r[1])
      key.append(j)
    codes[e] = -1 - i
  j = num.get(sbuf.id)
  if j is None:
    j = num[sbuf.id] = len(bufs)
    bufs.append(sbuf)
  key += (tuple(codes), tuple(srcs), j, sbuf.stype, sview.key())
  return tuple(key), bufs, num, lspecs, codes


def _knodes(pl, ent: list, srcs: list, lspecs: list, codes: list) -> list[KNode]:
  """The KNodes of a walked kernel (in knodes order; the stored value last made) from walked_key's specs and codes,
  as _knodes_small makes them."""
  nodes, kn, kn_of, lkn = pl.flat, [], [], []
  p = 0
  for e, cd in enumerate(codes):
    if cd < 0:  # a load: made at its first leaf (loads are numbered in entry order)
      i = -1 - cd
      if i == len(lkn):
        lkn.append(KNode.load(*lspecs[i]))
        kn.append(lkn[i])
      kn_of.append(lkn[i])
      continue
    n = nodes[ent[3 * e]]
    src = n.src
    k = len(src)
    kn.append(KNode(n.op, n.dtype, tuple([kn_of[q] for q in srcs[p:p + k]]), None, None, None, src[0].dtype,
                    n.opcode))
    kn_of.append(kn[-1])
    p += k
  return kn, kn_of[-1]


def _sigs(g) -> list[int]:
  """_sig_array's signatures as a list (walked_key reads them one by one)."""
  return _sig_array(g).tolist()


def _sig_array(g) -> np.ndarray:
  """Per node of the plan's graph (planner._Graph's columns) its ALU signature as one int: op, dtype, first
  operand's dtype, operand count and opcode (a quotient's), 8 bits each."""
  assert max(int(o) for o in Ops) < 256 and len(BY_ID) < 256
  has = g.nsrc > 0
  sdt = np.where(has, g.dt_ids[g.src[np.minimum(g.off, max(len(g.src) - 1, 0))]] if len(g.src) else 0, 0)
  names = {o: k + 1 for k, o in enumerate(sorted(set(g.special.values())))}
  opc = np.zeros(g.n, np.int64)
  if g.special: opc[list(g.special)] = [names[o] for o in g.special.values()]
  return g.op_ids | (g.dt_ids << 8) | (sdt << 16) | (np.minimum(g.nsrc, 255).astype(np.int64) << 24) | (opc << 32)


def _leaf(pl, n, c: int, cells, top, kshape, lmemo: dict, mk) -> tuple:
  """A leaf read with pending movements `c` (cell + 1; 0: none), as _knodes_small loads it: (buffer, its key piece
  (op, dtype, constant, storage type, view key), the load's identity (buffer id, view key, dtype), its spec)."""
  b, v = n.view
  if c:
    if cells is None: b, v = pl._leaf_view(n.view, 0, [(("BCAST", top.shape), None)], kshape, n.dtype)
    elif v.is_scalar(): v = View(kshape, (0,) * len(kshape), v.offset)
    else:
      vk = (v.key(), c)
      v2 = pl.vmemo.get(vk)
      if v2 is None:
        b2, v2 = pl._leaf_view(n.view, c - 1, cells, kshape, n.dtype)
        if b2 is b: pl.vmemo[vk] = v2
        else: b = b2
      v = v2
  vk = v.key()
  const = b.kind == "const" and v.is_scalar()
  r = ((_CONST, n.dtype, b.data.item(), b.stype, vk) if const else (_BUFFER, n.dtype, None, b.stype, vk))
  r = (b, r, (b.id, vk, n.dtype), (b, v, n.dtype))
  if b is n.view[0]: lmemo[mk] = r  # (not a copy's: a copy is emitted again for the next leaf)
  return r


def _standin(loop: Loop, bufs: list[Buf], num: dict[int, int]) -> Loop:
  """The loop over stand-in buffers: the same storage types, ids _STANDIN + their number."""
  sub = [Buf(_STANDIN + j, b.kind, b.stype, b.shape, b.dtype, b.index, b.data) for j, b in enumerate(bufs)]
  new: dict[KNode, KNode] = {}
  for k in loop.knodes:
    if k.buf is None:
      new[k] = KNode(k.op, k.dtype, tuple([new[s] for s in k.src]), k.arg, None, None, k.sdtype, k.opcode)
    else: new[k] = KNode(k.op, k.dtype, (), k.arg, sub[num[k.buf.id]], k.view, k.sdtype, k.opcode)
  stores = [Store(new[s.src], sub[num[s.buf.id]], s.view) for s in loop.stores]
  return Loop(loop.shape, [new[k] for k in loop.knodes], stores, loop.redop, loop.redaxes, loop.rdtype)


__all__ = ["KernelCache", "CACHE_MAX_NODES", "loop_key", "walked_key", "Words", "assemble"]
