"""The C interpreter on operands in a layout other than row-major: elementwise kernels reading a matrix through its
transpose (csrc/vm.c, gather_columns: the tile is copied column by column) and contractions whose C is written
transposed, a weight's gradient (run_gemm: run as C^T = B^T A^T). Both are copies or reorderings of the same
operations, so results are the exact bits of numpy (elementwise) or of the same sums computed the other way round
(contractions), for 1, 2 and 3 threads."""
from __future__ import annotations
import numpy as np
import pytest
import pygrad
from pygrad import UOp, dtypes

pytest.importorskip("pygrad.engine.program", reason="the compiled interpreter is not built", exc_type=ImportError)
from pygrad.engine import numpy_eval  # noqa: E402


def _val(shape, seed, dt):
  rng = np.random.default_rng(seed)
  if np.dtype(dt).kind == "i": return rng.integers(-1000, 1000, shape).astype(dt)
  return rng.standard_normal(shape).astype(dt)


# (shape of x, permutation that makes the read transposed, whether to flip the permuted view's first axis)
LAYOUTS = [((256, 256), (1, 0), False), ((37, 300), (1, 0), False), ((300, 37), (1, 0), True),
           ((5, 40, 70), (0, 2, 1), False), ((40, 6, 64), (2, 1, 0), False), ((1024, 3), (1, 0), False)]


@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.float64, dtypes.int32], ids=lambda d: d.name)
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda l: f"{l[0]}-{l[1]}-{'flip' if l[2] else 'noflip'}")
def test_elementwise_through_a_transpose_is_exact(layout, dt, restore_threads):
  shape, perm, flip = layout
  x = UOp.placeholder(shape, dt, "x")
  xt = x.permute(perm)
  if flip: xt = xt.flip(0)
  y = UOp.placeholder(xt.shape, dt, "y")
  vx, vy = _val(shape, 1, dt.numpy), _val(xt.shape, 2, dt.numpy)
  outs = [xt + y, xt * y + xt, xt.sum(1)]
  prog = pygrad.compile(outs, [x, y])
  want = numpy_eval.evaluate(outs, {x: vx, y: vy})
  for n in (1, 2, 3):
    pygrad.set_num_threads(n)
    got = prog(vx, vy)
    for g, w in zip(got[:2], want[:2]): np.testing.assert_array_equal(g, w)  # one rounding per op: numpy's bits
    np.testing.assert_allclose(got[2], want[2], rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.float64], ids=lambda d: d.name)
@pytest.mark.parametrize("nkm", [(128, 256, 256), (64, 128, 256), (256, 128, 16), (37, 53, 300), (300, 100, 17)])
def test_weight_gradient_contraction_written_transposed(nkm, dt, restore_threads):
  """The gradient of sum((x @ w) * c) by w is planned as a contraction whose C is written transposed; it adds the
  same products in the same order as x.T @ c and (c.T @ x).T: the same bits on every thread count, numpy's values."""
  n, k, m = nkm
  x, w, c = UOp.placeholder((k, n), dt, "x"), UOp.placeholder((n, m), dt, "w"), UOp.placeholder((k, m), dt, "c")
  vx, vw, vc = _val((k, n), 3, dt.numpy), _val((n, m), 4, dt.numpy), _val((k, m), 5, dt.numpy)
  gw, = ((x @ w) * c).sum().gradient(w)
  half = np.dtype(dt.numpy).type(0.5)
  prog = pygrad.compile([gw, x.T @ c, (c.T @ x).T, w - gw * 0.5], [x, w, c])
  ref = None
  for nt in (1, 2, 3):
    pygrad.set_num_threads(nt)
    got = [np.asarray(o) for o in prog(vx, vw, vc)]
    assert got[0].tobytes() == got[1].tobytes() == got[2].tobytes()
    np.testing.assert_array_equal(got[3], vw - got[0] * half)
    if ref is None: ref = got[0]
    assert got[0].tobytes() == ref.tobytes(), f"{nt} threads differ from 1"
  tol = 2e-4 if dt is dtypes.float32 else 1e-10
  np.testing.assert_allclose(ref, vx.T.astype(np.float64) @ vc.astype(np.float64), rtol=tol, atol=tol * k)



@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.float64], ids=lambda d: d.name)
@pytest.mark.parametrize("nkm", [(256, 128, 256), (64, 128, 256), (256, 128, 10), (37, 53, 300)])
def test_weight_gradient_stored_as_the_update_reads_it(nkm, dt, restore_threads, monkeypatch):
  """engine/layout.py: the gradient's buffer, which only the SGD update reads (transposed), is stored transposed,
  so the update reads it row by row: the same values as numpy's update of the gradient, the same bits on 1, 2 and
  3 threads, and the same as when the layout is left alone."""
  from pygrad.engine import program as prog_mod
  n, k, m = nkm
  x, w, c = UOp.placeholder((k, n), dt, "x"), UOp.placeholder((n, m), dt, "w"), UOp.placeholder((k, m), dt, "c")
  vx, vw, vc = _val((k, n), 3, dt.numpy), _val((n, m), 4, dt.numpy), _val((k, m), 5, dt.numpy)
  gw, = ((x @ w) * c).sum().gradient(w)
  outs = [w - gw * 0.5, gw * 0.25 + w]
  counts = []
  real = prog_mod.relayout
  monkeypatch.setattr(prog_mod, "relayout", lambda steps: counts.append(real(steps)) or counts[-1])
  prog = pygrad.compile(outs, [x, w, c])
  assert counts == [1]
  monkeypatch.setattr(prog_mod, "relayout", lambda steps: 0)
  plain = pygrad.compile(outs, [x, w, c])
  ref = None
  for nt in (1, 2, 3):
    pygrad.set_num_threads(nt)
    got = [np.asarray(o) for o in prog(vx, vw, vc)]
    assert [g.tobytes() for g in got] == [np.asarray(o).tobytes() for o in plain(vx, vw, vc)]
    if ref is None: ref = got[0]
    assert got[0].tobytes() == ref.tobytes(), f"{nt} threads differ from 1"
  tol = 2e-4 if dt is dtypes.float32 else 1e-10
  want = vw - 0.5 * (vx.T.astype(np.float64) @ vc.astype(np.float64))
  np.testing.assert_allclose(ref, want, rtol=tol, atol=tol * k)


def test_a_gradient_read_as_it_is_stored_keeps_its_layout(monkeypatch):
  """No change where the readers read the buffer row by row already, or one of them is not elementwise."""
  from pygrad.engine import program as prog_mod
  x, g = UOp.placeholder((128, 64), dtypes.float32, "x"), UOp.placeholder((128, 32), dtypes.float32, "g")
  counts = []
  real = prog_mod.relayout
  monkeypatch.setattr(prog_mod, "relayout", lambda steps: counts.append(real(steps)) or counts[-1])
  pygrad.compile([(x.T @ g) * 2.0], [x, g])
  pygrad.compile([(g.T @ x).T * 2.0, (g.T @ x).sum(0)], [x, g])
  assert counts == [0, 0]


# (shape of x, shape of the row broadcast over it): tiles of several rows reuse the row they gathered first
ROWS = [((128, 256), (256,)), ((129, 100), (100,)), ((7, 33), (33,)), ((3, 50, 70), (70,)), ((6, 5, 40), (1, 5, 40)),
        ((1000, 3), (3,)), ((2, 9000), (9000,))]


@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.float64, dtypes.int32], ids=lambda d: d.name)
@pytest.mark.parametrize("shapes", ROWS, ids=lambda s: f"{s[0]}+{s[1]}")
def test_row_broadcast_is_exact(shapes, dt, restore_threads):
  """A bias broadcast over a batch (the same row for every outer index) and one read backwards and strided."""
  xs, bs = shapes
  x, b = UOp.placeholder(xs, dt, "x"), UOp.placeholder(bs, dt, "b")
  wide = UOp.placeholder(bs[:-1] + (2 * bs[-1],), dt, "w")
  vx, vb, vw = _val(xs, 6, dt.numpy), _val(bs, 7, dt.numpy), _val(bs[:-1] + (2 * bs[-1],), 8, dt.numpy)
  strided = wide.reshape(bs[:-1] + (bs[-1], 2)).shrink(tuple((0, s) for s in bs) + ((1, 2),)).reshape(bs)
  outs = [x + b, (x * b + b).maximum(x), x + b.flip(len(bs) - 1), x + strided]
  prog = pygrad.compile(outs, [x, b, wide])
  want = numpy_eval.evaluate(outs, {x: vx, b: vb, wide: vw})
  for n in (1, 2, 3):
    pygrad.set_num_threads(n)
    for g, w in zip(prog(vx, vb, vw), want): np.testing.assert_array_equal(g, w)


# (shape of x, shape of the column broadcast over it): one value along each row (a softmax's row max or sum over
# 10 classes), filled across the row
COLS = [((128, 10), (128, 1)), ((7, 33), (7, 1)), ((1000, 3), (1000, 1)), ((3, 50, 70), (3, 50, 1)),
        ((4, 5, 6), (4, 1, 1))]


@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.float64, dtypes.int32, dtypes.float16], ids=lambda d: d.name)
@pytest.mark.parametrize("shapes", COLS, ids=lambda s: f"{s[0]}+{s[1]}")
def test_column_broadcast_is_exact(shapes, dt, restore_threads):
  xs, cs = shapes
  x, c = UOp.placeholder(xs, dt, "x"), UOp.placeholder(cs, dt, "c")
  vx, vc = _val(xs, 9, dt.numpy), _val(cs, 10, dt.numpy)
  outs = [x + c, (x * c).maximum(c)]
  prog = pygrad.compile(outs, [x, c])
  want = numpy_eval.evaluate(outs, {x: vx, c: vc})
  for n in (1, 2, 3):
    pygrad.set_num_threads(n)
    for g, w in zip(prog(vx, vc), want): np.testing.assert_array_equal(g, w)


# a matrix broadcast over an outer dim, in a loop that multiplies and reduces (the backward of sum(x @ w) has this
# shape: a constant times w, summed): the tile's rows are whole rows of w that follow each other in memory, copied
# one run at a time (csrc/vm.c, gather). Runs that a tile cuts, runs longer than a tile, and rows of odd length;
# the sums are the reference's (exact in int32) and the same bits on 1, 2 and 3 threads.
@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.float64, dtypes.int32], ids=lambda d: d.name)
@pytest.mark.parametrize("shape", [(16, 32, 32), (3, 7, 5), (5, 33, 16), (4, 300, 40), (2, 1, 9)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("axis", [0, 1])
def test_a_matrix_broadcast_over_an_outer_dim(shape, axis, dt, restore_threads):
  b, r, c = shape
  w = UOp.placeholder((r, c), dt, "w")
  s = UOp.placeholder((b, 1, 1), dt, "s")
  out = (w.reshape(1, r, c).expand(b, r, c) * s).sum(axis)
  wv, sv = _val((r, c), 1, dt.numpy), _val((b, 1, 1), 2, dt.numpy)
  ref = (np.broadcast_to(wv, (b, r, c)).astype(np.float64) * sv).sum(axis)
  got = []
  for n in (1, 2, 3):
    pygrad.set_num_threads(n)
    got.append(pygrad.compile(out, [w, s])(wv, sv))
    assert got[-1].dtype == wv.dtype and got[-1].tobytes() == got[0].tobytes(), n  # the same bits on any threads
  if dt is dtypes.int32: np.testing.assert_array_equal(got[0], ref.astype(np.int32))
  else: np.testing.assert_allclose(got[0], ref, rtol=1e-5 if dt is dtypes.float32 else 1e-12, atol=1e-5)
