"""Contraction epilogues (pygrad/engine/epilogue.py, csrc/vm_epilogue.c, run_gemm in csrc/vm.c): the elementwise
loops after a contraction that read its output where it is written run on each output tile right after it. They
give the bits of the same program without epilogues, on 1, 2 and 3 threads; the C side refuses an epilogue group
whose tiles could meet, and a mutated program is refused or runs."""
from __future__ import annotations
import numpy as np
import pytest
import pygrad
from pygrad import UOp, dtypes

program = pytest.importorskip("pygrad.engine.program", reason="the compiled interpreter is not built",
                              exc_type=ImportError)
from pygrad.engine import numpy_eval, vmlib  # noqa: E402
from pygrad.engine import epilogue  # noqa: E402
from pygrad.engine.epilogue import VK_EPILOGUE  # noqa: E402


def _val(shape, seed, dt):
  return np.random.default_rng(seed).standard_normal(shape).astype(dt)


def _compile_both(outs, ins, monkeypatch):
  """(the program with epilogues, the orientation word of each epilogue, the same program without them)."""
  from pygrad.engine.kwords import words_of
  tr = []
  real = program.fuse_epilogues

  def spy(steps):
    n = real(steps)
    tr.extend(words_of(s)[1] for s in steps if getattr(s, "words", None) is not None and words_of(s)[0] == VK_EPILOGUE)
    assert len(tr) == n
    return n
  monkeypatch.setattr(program, "fuse_epilogues", spy)
  fused = program.Program(outs, ins, keep_words=True)
  monkeypatch.setattr(program, "fuse_epilogues", lambda steps: 0)
  plain = program.Program(outs, ins)
  return fused, tr, plain


def _same_bits(fused, plain, vals):
  ref = None
  for nt in (1, 2, 3):
    pygrad.set_num_threads(nt)
    got = [np.asarray(o).tobytes() for o in fused(*vals)]
    assert got == [np.asarray(o).tobytes() for o in plain(*vals)], f"{nt} threads: epilogues change the values"
    if ref is None: ref = got
    assert got == ref, f"{nt} threads differ from 1"


@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.float64], ids=lambda d: d.name)
@pytest.mark.parametrize("nkm", [(128, 64, 256), (37, 53, 300), (256, 256, 10), (5, 16, 3)])
def test_layer_bias_relu_run_on_the_tiles(nkm, dt, restore_threads, monkeypatch):
  """relu(x @ w + b) and its mask: the bias add, mask and relu become epilogues; numpy's values, the unfused bits.
  (5x3 is below epilogue.MIN_OUT, so compile leaves it unfused: lowered here to 1 to check odd tiny tiles too.)"""
  n, k, m = nkm
  monkeypatch.setattr(epilogue, "MIN_OUT", 1)
  x, w, b = UOp.placeholder((n, k), dt, "x"), UOp.placeholder((k, m), dt, "w"), UOp.placeholder((m,), dt, "b")
  h = x @ w + b
  outs = [h.relu(), (h > 0.0).where(h * 0.5, h * 0.25)]
  fused, tr, plain = _compile_both(outs, [x, w, b], monkeypatch)
  assert len(tr) >= 1
  vals = [_val((n, k), 1, dt.numpy), _val((k, m), 2, dt.numpy), _val((m,), 3, dt.numpy)]
  _same_bits(fused, plain, vals)
  want = numpy_eval.evaluate(outs, dict(zip([x, w, b], vals)))
  tol = 1e-4 if dt is dtypes.float32 else 1e-10
  for g, wv in zip(fused(*vals), want): np.testing.assert_allclose(g, wv, rtol=tol, atol=tol * k)


def test_mlp_step_epilogues_both_orientations(restore_threads, monkeypatch):
  """The MLP training step: forward layers, the backward's relu masks (the contraction's C written transposed:
  epilogues over (m, n)) and the SGD updates become epilogues; the same bits as without, on every thread count."""
  from pygrad.train import mlp_step_graph, init_params, onehot
  outs, ins = mlp_step_graph((64, 256, 256, 10), 128, 0.05)
  fused, tr, plain = _compile_both(outs, ins, monkeypatch)
  assert len(tr) >= 8 and set(tr) == {0, 1}
  rng = np.random.default_rng(0)
  vals = [rng.standard_normal((128, 64)).astype(np.float32), onehot(rng.integers(0, 10, 128), 10),
          *init_params((64, 256, 256, 10), 0)]
  _same_bits(fused, plain, vals)


@pytest.mark.parametrize("nm", [(16, 16), (31, 33), (32, 32)])
def test_small_contractions_keep_their_loops(nm, restore_threads, monkeypatch):
  """Below epilogue.MIN_OUT output elements (one tile, in L1: nothing to gain, and deciding it was ~40% of compiling
  a gradient of 16x16 layers) no loop becomes an epilogue and no gradient changes layout; from it, both happen."""
  from pygrad.engine import layout
  n, m = nm
  x, w, b = UOp.placeholder((n, n), dtypes.float32, "x"), UOp.placeholder((n, m), dtypes.float32, "w"), \
    UOp.placeholder((m,), dtypes.float32, "b")  # (the forward's output and w's gradient both n x m)
  h = (x @ w + b).relu()
  loss = (h * h).sum()
  gx, gw = loss.gradient(x, w)
  outs = [h, w - gw * 0.1, gx]
  moved = []
  real = layout.relayout
  monkeypatch.setattr(program, "relayout", lambda steps: moved.append(real(steps)) or moved[-1])
  fused, tr, plain = _compile_both(outs, [x, w, b], monkeypatch)
  big = n * m >= epilogue.MIN_OUT
  assert (len(tr) > 0) == big and (moved[0] > 0) == big, (tr, moved)
  _same_bits(fused, plain, [_val((n, n), 1, np.float32), _val((n, m), 2, np.float32), _val((m,), 3, np.float32)])


def test_a_loop_reading_the_output_elsewhere_is_not_an_epilogue(restore_threads, monkeypatch):
  """A loop that reads C transposed, or shifted, would read another tile's elements: it stays a kernel of its own."""
  x, w = UOp.placeholder((64, 64), dtypes.float32, "x"), UOp.placeholder((64, 64), dtypes.float32, "w")
  c = x @ w
  outs = [c + c.T, c.shrink(((1, 64), (0, 64))) * 2.0]
  fused, tr, plain = _compile_both(outs, [x, w], monkeypatch)
  assert tr == []
  _same_bits(fused, plain, [_val((64, 64), 1, np.float32), _val((64, 64), 2, np.float32)])


def _layer_words():
  """(program, its words, where its epilogue kernels start, the layout of each as loop words) of relu(x @ w + b)."""
  from pygrad.engine.kwords import loop_words
  x, w, b = UOp.placeholder((32, 16), dtypes.float32, "x"), UOp.placeholder((16, 48), dtypes.float32, "w"), \
    UOp.placeholder((48,), dtypes.float32, "b")
  p = program.Program([(x @ w + b).relu()], [x, w, b], keep_words=True)
  words, at = p._words, []
  for i in range(len(words) - 10):  # (kind, orientation, dims 2, T, reduce op, ..., the index space 32 x 48)
    if words[i] == VK_EPILOGUE and words[i + 1] in (0, 1) and words[i + 2] == 2 and words[i + 8:i + 10] == [32, 48]:
      at.append(i)
  lws = []
  for i in at:
    for end in range(i + 10, len(words) + 1):
      try: lws.append(loop_words([1, *words[i + 2:end]]))
      except (AssertionError, IndexError): continue
      break
  return p, words, at, lws


def test_the_vm_refuses_unsafe_epilogue_groups():
  """csrc/vm_epilogue.c: an epilogue spans its contraction's output, in the orientation it says, reads C only where
  it is written and writes each element once; a program breaking any of it is refused, naming the epilogue."""
  p, words, at, lws = _layer_words()
  vmlib.prepare(words)  # the planner's program is accepted
  assert at and len(lws) == len(at)
  e, lw = at[0], lws[0]
  base = e + 1  # loop_words' positions count from the kind word, which for an epilogue is followed by its orientation

  def refused(i, v):
    bad = list(words)
    bad[i] = v
    with pytest.raises(ValueError, match="epilogue|contraction"):
      vmlib.prepare(bad)
  refused(e + 8, 31)  # its index space is not C's
  refused(e + 1, 1 - words[e + 1])  # the other orientation: (48, 32) is not its index space either
  load = next(v for v in lw.views if not v.store and v.strides([1, *words[e + 2:]], 2) == [48, 1])
  refused(base + load.pos + 5, 0)  # C read at row 0 for every row: another tile's elements
  store = next(v for v in lw.views if v.store)
  refused(base + store.pos + 5, 0)  # every row written into row 0: an element written by every tile


def test_mutated_epilogue_programs_are_refused_or_run(restore_threads):
  """Any mutation of a program with epilogues is refused with ValueError or runs (never a crash)."""
  p, words, _, _ = _layer_words()
  rng = np.random.default_rng(1)
  slots = [np.zeros(max(n, 1), np.uint8) for n in p._slot_sizes]
  refused = 0
  for trial in range(2000):
    w = list(words)
    for _ in range(int(rng.integers(1, 3))):
      i = int(rng.integers(0, len(w)))
      w[i] = int(rng.choice([w[i] + 1, w[i] - 1, -1, 0, 1, 2, 3, int(rng.integers(-50, 50))]))
    try:
      h = vmlib.prepare(w)
    except ValueError:
      refused += 1
      continue
    ptrs = vmlib.ffi.new("void *[]", [vmlib.ffi.cast("void *", s.ctypes.data) for s in slots])
    sizes = vmlib.ffi.new("int64_t[]", [s.nbytes for s in slots])
    for nt in (1, 2):
      pygrad.set_num_threads(nt)
      assert vmlib.lib.pg_vm_run(h, ptrs, sizes, len(slots)) in (0, vmlib.lib.PG_VM_ERR_SLOTS)
  assert refused > 500
