"""Contraction epilogues: the elementwise loops right after a contraction that read its output where it is written
(a layer's bias add, relu mask and relu; the backward's relu mask; an SGD update of a weight's gradient) become
EPILOGUE kernels, which the VM runs on each output tile just after the thread that computed it (csrc/vm.c,
run_gemm). On two threads each loop then reads its tile from its own core's cache and runs at once, not as a
kernel of its own that reads half its operand from the other core (a 128x256 bias add was no faster on two threads
than on one). Values are the same: each element gets the same operations.

A pass over the lowered steps (the loops' words, made two-dimensional over the contraction's (n, m), or (m, n)
when that is how its output lies); csrc/vm_epilogue.c checks the same conditions when the program is prepared."""
from __future__ import annotations
from .lower import Part, VK_LOOP
from .kwords import kind_of, gemm_steps, words_of, loop_words, gemm_words
from ..ids import value

VK_EPILOGUE = value("vm_kinds", "EPILOGUE")
_MAX = 16  # epilogues of one contraction (csrc/vm_epilogue.c, EPI_MAX)
# Contractions with a smaller output keep their loops as they are: one tile on one thread, in L1, so an epilogue
# gains nothing there (w1-grad's 16x16 layers ran in the same time either way) while deciding it cost ~1.5 us per
# compiled node of such a gradient (pygrad.compile of w1-grad: 5.5 us/node with both passes, 3.3 without). The
# MLP step's smallest output, its 128x10 logits, is above it.
MIN_OUT = 1024


def _as_2d(w: list[int], shape: tuple[int, int]) -> list[int] | None:
  """VK_LOOP words w over index space `shape` (two dims): the same kernel when its space is shape (as is), shape
  reversed (dims swapped), or one dim of their product (split: a stride s becomes (s * shape[1], s)); None
  otherwise, or with a masked view or a reduction."""
  lw = loop_words(w)
  if lw.redop != 0 or any(v.masked(w) for v in lw.views): return None
  if lw.nd == 2 and tuple(lw.shape) == shape: return w
  if lw.nd == 2 and tuple(lw.shape) == shape[::-1]: remap = lambda st: [st[1], st[0]]  # noqa: E731
  elif lw.nd == 1 and lw.shape[0] == shape[0] * shape[1]: remap = lambda st: [st[0] * shape[1], st[0]]  # noqa: E731
  else: return None
  nd = lw.nd
  head = [VK_LOOP, 2, w[2], w[3], w[4], w[5], 0, *shape]
  out, i = head, 7 + nd
  for v in lw.views:  # registers and instructions copied as they are, each view with its strides remapped
    out += w[i:v.pos + 5] + remap(w[v.pos + 5:v.pos + 5 + nd])
    i = v.pos + 5 + nd
  return out + w[i:]


def _nm(st, tr: int) -> tuple[int, int]:
  """A view's strides along the contraction's (n, m), from the epilogue's (tr: its dims are (m, n))."""
  return (st[1], st[0]) if tr else (st[0], st[1])


def _injective(n: int, m: int, sn: int, sm: int) -> bool:
  """Whether strides (sn, sm) give each index of an n x m space its own element (csrc/vm_epilogue.c's test)."""
  sn, sm = abs(sn), abs(sm)
  if n <= 1 and m <= 1: return True
  if n <= 1: return sm != 0
  if m <= 1: return sn != 0
  return sn != 0 and sm != 0 and (sm * (m - 1) < sn or sn * (n - 1) < sm)


def _epilogue(w2: list[int], tr: int, n: int, m: int, writes: dict, reads: dict, operands: set):
  """The views of loop words w2 (two dims, orientation tr) as (buffer, offset, (n, m) strides, type, is a store)
  when it may join the group: it reads what the group wrote (at least once) only where it was written, and writes
  each element once, where nothing of the group reads or writes it through another view; else None. writes:
  buffer -> the view the group writes it through; reads: buffer -> the views its epilogues read it through."""
  lw = loop_words(w2)
  views = [(v.buf, v.offset(w2), _nm(v.strides(w2, 2), tr), w2[v.pos + 2], v.store) for v in lw.views]
  hits = 0
  for buf, off, st, ty, store in views:
    if store or buf not in writes: continue
    if writes[buf] != (off, st, ty): return None
    hits += 1
  if not hits: return None
  for buf, off, st, ty, store in views:
    if not store: continue
    v = (off, st, ty)
    if not _injective(n, m, *st) or buf in operands or writes.get(buf, v) != v: return None
    if any(r != v for r in reads.get(buf, ())) or any(b == buf and (o, s, t) != v for b, o, s, t, _ in views):
      return None
  return views


def fuse_epilogues(steps: list) -> int:
  """Make the loops that follow each contraction and qualify its epilogues (in place: steps' words become EPILOGUE
  kernels, and every step of a group names all the group's buffers, so the arena keeps them apart for the whole
  group). Returns how many loops became epilogues."""
  fused = 0
  for gi in gemm_steps(steps, MIN_OUT):  # (the test below, before the words are made)
    s = steps[gi]
    g = gemm_words(words_of(s))
    if g.nbatch != 0 or g.c in (g.a, g.b) or g.n * g.m < MIN_OUT: continue
    if not _injective(g.n, g.m, g.scn, g.scm): continue
    writes = {g.c: (g.offc, (g.scn, g.scm), words_of(s)[1])}  # buffer -> the one view the group writes it through
    reads: dict = {}
    operands = {g.a, g.b}
    j = gi + 1
    while j < len(steps) and j - gi <= _MAX and kind_of(steps[j]) == VK_LOOP:
      w = words_of(steps[j])
      got = None
      for tr in ((1, 0) if g.scm != 1 and g.scn == 1 else (0, 1)):  # C's rows first: its contiguous dim inner
        w2 = _as_2d(w, (g.m, g.n) if tr else (g.n, g.m))
        vs = None if w2 is None else _epilogue(w2, tr, g.n, g.m, writes, reads, operands)
        if vs is not None:
          got = (tr, w2, vs)
          break
      if got is None: break
      tr, w2, vs = got
      for b, off, st, t, store in vs:
        if store: writes[b] = (off, st, t)
        else: reads.setdefault(b, set()).add((off, st, t))
      steps[j] = Part([VK_EPILOGUE, tr, *w2[1:]], steps[j].fused, steps[j].bufs)
      j += 1
    if j == gi + 1: continue
    bufs = list({b.id: b for k in range(gi, j) for b in steps[k].bufs}.values())
    for k in range(gi, j): steps[k] = Part(words_of(steps[k]), steps[k].fused, bufs)
    fused += j - gi - 1
  return fused


__all__ = ["fuse_epilogues", "VK_EPILOGUE"]
