"""Buffer layouts chosen by their readers. The planner stores every buffer row-major in its node's shape; a weight's
gradient is planned as (g.T @ x).T, so its contraction fills an (out, in) buffer that the SGD update then reads
transposed, a column at a time (a 256x256 update was 22 us of gathers in a 440 us MLP step, 13 us read row by row).
A contraction writes any layout at the same speed and with the same sums (csrc/vm.c orients it by C's strides), so
such a buffer is stored transposed instead and its readers read it along its rows. Each element's value is
unchanged: only where it lives. A pass over the lowered steps (their words), so a program is the same whichever way
its kernels were lowered (one by one, or cached from the planner's C walk)."""
from __future__ import annotations
from .lower import Part, VK_LOOP
from .kwords import kind_of, gemm_steps, words_of, loop_words, gemm_words, GEMM_SCN
from . import epilogue


def _plain(strides, sizes, R: int, S: int) -> bool:
  """Whether strides over dims of these sizes read an (R, S) row-major buffer one element per index (the caller
  checks offset 0 and no mask): each of its two dims along one dim (stride S over R, 1 over S), others broadcast."""
  seen = []
  for n, st in zip(sizes, strides):
    if st == 0: continue
    if (st, n) not in ((S, R), (1, S)) or st in seen: return False
    seen.append(st)
  return len(seen) == 2


def _swap(strides, R: int, S: int) -> list[int]:
  """The strides over the same buffer stored transposed, (S, R) row-major: S becomes 1 and 1 becomes R."""
  return [R if st == 1 else 1 if st == S else st for st in strides]


def _readers(steps, touch: list[int], writer: int, bid: int, R: int, S: int):
  """[(step index, words, its views of buffer bid, dims)] for the steps other than the writer that touch it, when
  each is a loop that only reads it, plainly and column by column (its fastest dim steps S elements); else None."""
  out = []
  for i in touch:
    s = steps[i]
    if i == writer: continue
    if kind_of(s) != VK_LOOP: return None
    w = words_of(s)
    lw = loop_words(w)
    vs = [v for v in lw.views if v.buf == bid]
    if lw.redop != 0 or any(v.store or v.masked(w) or v.offset(w) != 0 for v in vs): return None
    for v in vs:
      st = v.strides(w, lw.nd)
      if not _plain(st, lw.shape, R, S) or st[-1] != S: return None
    out.append((i, w, vs, lw.nd))
  return out


def relayout(steps: list) -> int:
  """Store transposed each arena buffer of two dims > 1 (and any of size 1) that one contraction writes whole and
  that only elementwise loops read, every one of them column by column. Edits the steps' words (a changed step is
  a new Part); returns how many buffers changed layout."""
  cands = {}  # C's buffer id -> (the contraction's step, its words, R, S)
  for gi in gemm_steps(steps, epilogue.MIN_OUT):  # (the test below, before the words are made)
    s = steps[gi]
    w = words_of(s)
    g = gemm_words(w)
    b = next((b for b in s.bufs if b.id == g.c), None)
    if b is None or b.kind != "arena" or g.nbatch != 0 or g.offc != 0 or g.c in (g.a, g.b) or \
       g.n * g.m < epilogue.MIN_OUT: continue  # (small: a column gather in L1 costs nothing; epilogue.MIN_OUT)
    dims = [n for n in b.shape if n != 1]  # (a reduction's buffer keeps its reduced dims, of size 1)
    if len(dims) == 2 and _plain((g.scn, g.scm), (g.n, g.m), *dims): cands[b.id] = (gi, w, *dims)
  if not cands: return 0
  touch: dict[int, list[int]] = {bid: [] for bid in cands}
  for i, s in enumerate(steps):
    for b in getattr(s, "bufs", ()):
      t = touch.get(b.id)
      if t is not None and (not t or t[-1] != i): t.append(i)
  changed = 0
  for bid, (gi, w, R, S) in cands.items():
    s = steps[gi]
    rs = _readers(steps, touch[bid], gi, bid, R, S)
    if not rs: continue
    w = list(w)
    w[GEMM_SCN:GEMM_SCN + 2] = _swap(w[GEMM_SCN:GEMM_SCN + 2], R, S)
    steps[gi] = Part(w, s.fused, s.bufs)
    for i, rw, vs, nd in rs:
      rw = list(rw)
      for v in vs: rw[v.pos + 5:v.pos + 5 + nd] = _swap(rw[v.pos + 5:v.pos + 5 + nd], R, S)
      steps[i] = Part(rw, steps[i].fused, steps[i].bufs)
    changed += 1
  return changed


__all__ = ["relayout"]
