"""Reading and editing lowered kernels' words (csrc/vm_read.c's format, as lower.emit and lower.contraction write them)
for the passes that run on the program's steps after lowering (engine/layout.py, engine/epilogue.py): where each
view of a VK_LOOP kernel lies, and a contraction's operands."""
from __future__ import annotations
from typing import NamedTuple
from .lower import Part, VK_LOOP, VK_GEMM


def kind_of(step) -> int:
  """A step's kernel kind (its first word: VK_LOOP, VK_GEMM, ...), or -1 for a step that is no lowered kernel."""
  if type(step) is not Part: return -1
  w = step.words
  return w[0] if type(w) is list else w.kind


def gemm_steps(steps: list, min_out: int = 0) -> list[int]:
  """The positions of the VK_GEMM steps; with min_out, of those without batch dims and with at least min_out
  outputs (gemm_dims's test). A cached kernel's kind and dims are its template's: tested once per template, as the
  step passes look for the few large contractions among tens of thousands of steps over a dozen templates."""
  out, memo = [], {}
  for i, s in enumerate(steps):
    if type(s) is not Part: continue
    w = s.words
    if type(w) is list: ok = w[0] == VK_GEMM and (not min_out or (w[17] == 0 and w[8] * w[9] >= min_out))
    else:
      t = w[0]  # (its Template)
      ok = memo.get(t)
      if ok is None:
        tw = t.words
        ok = memo[t] = tw[0] == VK_GEMM and (not min_out or (tw[17] == 0 and tw[8] * tw[9] >= min_out))
    if ok: out.append(i)
  return out


def words_of(part) -> list[int]:
  """A Part's words as a list of ints (cached kernels hold a template: kcache.Words)."""
  w = part.words
  return w if type(w) is list else w.tolist()


class LoopView(NamedTuple):
  """A view of a VK_LOOP kernel: its first word's position (register, buffer, storage type, offset, mask flag,
  strides follow), whether it is a store, and its buffer id."""
  pos: int
  store: bool
  buf: int

  def strides(self, w: list[int], nd: int) -> list[int]: return w[self.pos + 5:self.pos + 5 + nd]
  def offset(self, w: list[int]) -> int: return w[self.pos + 3]
  def masked(self, w: list[int]) -> bool: return w[self.pos + 4] != 0


class LoopWords(NamedTuple):
  """A VK_LOOP kernel's layout: dims, index space, reduce op and views."""
  nd: int
  shape: list
  redop: int
  views: list


def loop_words(w: list[int]) -> LoopWords:
  """The layout of VK_LOOP words w (lower.emit's order: header, shape, registers, loads, instructions, stores)."""
  assert w[0] == VK_LOOP
  nd, redop = w[1], w[3]
  shape = w[7:7 + nd]
  i = 7 + nd
  i += 1 + 2 * w[i]  # registers
  views = []
  for store in (False, True):
    if store: i += 1 + 6 * w[i]  # instructions
    n, i = w[i], i + 1
    for _ in range(n):
      views.append(LoopView(i, store, w[i + 1]))
      i += 5 + nd + (2 * nd if w[i + 4] else 0)
  assert i == len(w)
  return LoopWords(nd, shape, redop, views)


class GemmWords(NamedTuple):
  """A VK_GEMM kernel (lower.contraction's words): C[n][m] = sum_k A[n][k] B[k][m] with element strides, and its
  batch dims."""
  a: int
  offa: int
  b: int
  offb: int
  c: int
  offc: int
  n: int
  m: int
  k: int
  san: int
  sak: int
  sbk: int
  sbm: int
  scn: int
  scm: int
  nbatch: int


GEMM_SCN = 15  # the position of C's strides (scn, scm) in VK_GEMM words


def gemm_words(w: list[int]) -> GemmWords:
  assert w[0] == VK_GEMM
  return GemmWords(*w[2:18])


def gemm_dims(step) -> tuple[int, int, int]:
  """(batch dims, n, m) of a VK_GEMM step, read without making its words (a cached kernel's are its template's: no
  buffer id among them): the step passes skip the many small contractions of a layered gradient on these alone."""
  w = step.words
  if type(w) is not list: w = w.tmpl.words
  return w[17], w[8], w[9]


__all__ = ["kind_of", "gemm_steps", "words_of", "gemm_dims", "LoopView", "LoopWords", "loop_words", "GemmWords", "gemm_words",
           "GEMM_SCN"]
