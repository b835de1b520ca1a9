"""The planner's C walk through movement ops (csrc/kwalk_moves.c, planner._build_c) against its Python walk
(_build_py): on graphs whose kernels read through RESHAPE, PERMUTE, EXPAND, PAD, SHRINK and FLIP (and broadcast ()
operands below them), both must plan the very same kernels -- the same KNodes in the same order, the same loads
(buffer and view), the same buffers and stores -- and so the same program. Each graph is planned three ways: in
Python, in C with small kernels' KNodes made one by one (_knodes_small), and in C with every kernel's made a column
at a time (the large-kernel path)."""
from __future__ import annotations
import numpy as np
import pytest
from pygrad import UOp, dtypes

program = pytest.importorskip("pygrad.engine.program", reason="the compiled interpreter is not built",
                              exc_type=ImportError)
from pygrad.engine import planner, lower, kwalk  # noqa: E402
from pygrad.engine.flatten import flatten  # noqa: E402
from pygrad.engine.planner import Planner, Loop, CallStep  # noqa: E402
from pygrad.bench import w1_model, MethodOps  # noqa: E402
from fuzzgraphs import seeded_graph as _recipe  # noqa: E402

F32 = dtypes.float32


def _moves_in_kernels():
  """Elementwise values read through every movement op, inside one kernel each (no buffer between)."""
  a, b = UOp.placeholder((4, 6), F32, "a"), UOp.placeholder((6, 4), F32, "b")
  s = UOp.placeholder((), F32, "s")
  e = (a * 2.0 + 1.0).sin()  # an expression: the movements below are pending views of its loads
  outs = [
    e.reshape((2, 12)) * 3.0,
    e.permute((1, 0)) + b,
    (e + s).reshape((24,)).reshape((3, 8)).exp2(),  # a () operand broadcast below two reshapes
    e.reshape((4, 1, 6)).expand((4, 5, 6)).sum(1),
    e.shrink(((1, 3), (0, 6))).flip(1) * e.shrink(((0, 2), (0, 6))),
    e.flip(0).flip(1) - e,
    (e.permute((1, 0)).reshape((3, 8)) + 1.0).max(0),  # a reshape strides cannot express: a copy kernel
    ((e * s).reshape((24,)) + (e + 1.0).reshape((24,))).reshape((6, 4)).permute((1, 0)),
    (a.exp2() * s).pad(((1, 0), (2, 1))),
  ]
  return outs, [a, b, s]


def _shared_chains():
  """One value read through equal movement chains on two branches (one cell: one load), and through different
  chains (two cells: two loads, at two indices)."""
  a = UOp.placeholder((3, 4), F32, "a")
  c = UOp.placeholder((3, 4), F32, "c")
  e = (a + c).sqrt()
  p1, p2 = (e * 2.0).reshape((4, 3)), (e * 3.0).reshape((4, 3))  # two RESHAPE nodes, one class
  q = e.permute((1, 0))
  r = (e + 1.0).pad(((0, 1), (1, 0))).shrink(((0, 3), (1, 5)))
  return [p1 * p2 + q, (r * e).flip(0), (q.reshape((12,)) + p1.reshape((12,))).sum()], [a, c]


def _w1(layers: int):
  x = UOp.placeholder((16, 16), F32, "x")
  ws = [UOp.placeholder((16, 16), F32, f"w{i}") for i in range(layers)]
  loss = w1_model(MethodOps, x, ws)
  return [loss, *loss.gradient(x, *ws)], [x, *ws]




GRAPHS = {"moves-in-kernels": _moves_in_kernels, "shared-chains": _shared_chains, "w1-grad-3": lambda: _w1(3),
          **{f"random-{s}": (lambda s=s: _recipe(s)) for s in range(100, 140)}}


def _kernels(pl: Planner):
  """Every kernel of a plan as plain values: KNodes by position, buffers by id, views by key."""
  out = []
  for k in pl.kernels:
    if isinstance(k, CallStep):
      out.append(("call", k.name, [b.id for b in k.bufs]))
      continue
    assert isinstance(k, Loop)
    kn = k.knodes
    pos = {id(x): i for i, x in enumerate(kn)}
    rows = [("load", x.op, x.dtype, repr(x.arg), x.buf.id, x.view.key()) if x.buf is not None else
            (x.op, x.dtype, x.sdtype, x.opcode, tuple(pos[id(s)] for s in x.src)) for x in kn]
    stores = [(pos[id(s.src)], s.buf.id, s.view.key()) for s in k.stores]
    out.append((k.shape, k.redop, k.redaxes, k.rdtype, rows, stores))
  return out, [(b.id, b.kind, b.stype, b.shape, b.index) for b in pl.bufs]


def _plan(name: str, mode: str, monkeypatch):
  """The plan in Python ("py"), or walked in C with small kernels' path ("c") or the columnar one ("c-cols");
  None when the planner refuses the graph (then it must in every mode)."""
  with monkeypatch.context() as m:
    if mode != "py":
      m.setattr(planner, "_WALK_MIN_NODES", 0)
      m.setattr(planner, "_GRAPH_MIN_NODES", 0)
    if mode == "c-cols": m.setattr(kwalk, "SMALL_KERNEL", 0)
    outs, ins = GRAPHS[name]()
    used = {"c": 0, "py": 0}
    c_build, py_build = Planner._build_c, Planner._build_py

    def count_c(self, *a):
      r = c_build(self, *a)
      used["c"] += r is not None
      return r

    def count_py(self, *a):
      used["py"] += 1
      return py_build(self, *a)
    m.setattr(Planner, "_build_c", count_c)
    m.setattr(Planner, "_build_py", count_py)
    try:
      pl = Planner(*flatten(outs), ins)
    except (ValueError, TypeError) as e:
      return f"error: {type(e).__name__}: {e}", used
    return _kernels(pl), used


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_c_walk_through_movements_plans_what_the_python_walk_does(name, monkeypatch):
  want, used = _plan(name, "py", monkeypatch)
  assert used["c"] == 0
  for mode in ("c", "c-cols"):
    got, used = _plan(name, mode, monkeypatch)
    assert got == want, mode
    if name in ("moves-in-kernels", "shared-chains", "w1-grad-3"):
      assert used["py"] == 0 and used["c"] > 0, (mode, used)  # every kernel walked in C


@pytest.mark.parametrize("name", ["moves-in-kernels", "shared-chains", "w1-grad-3"])
def test_programs_planned_by_the_c_walk_compute_the_python_walks_values(name, monkeypatch):
  """The programs themselves: the same words, and the same outputs on the same inputs."""
  def run(walk_in_c: bool):
    with monkeypatch.context() as m:
      if walk_in_c:
        m.setattr(planner, "_WALK_MIN_NODES", 0)
        m.setattr(planner, "_GRAPH_MIN_NODES", 0)
      outs, ins = GRAPHS[name]()
      p = program.Program(outs, ins, keep_words=True)
      rng = np.random.default_rng(0)
      vals = [rng.standard_normal(i.shape).astype(np.float32) for i in ins]
      return p._words, [np.asarray(o) for o in p(*vals)]
  (wp, op), (wc, oc) = run(False), run(True)
  assert wc == wp
  assert all(np.array_equal(x, y, equal_nan=True) for x, y in zip(op, oc))


def _walk_args(nsrc, src, flags, mvclass, shape):
  from pygrad.engine.vmlib import ffi
  nsrc, src = np.array(nsrc, np.int32), np.array(src, np.int32)
  off = (np.cumsum(nsrc) - nsrc).astype(np.int64)
  arrs = [nsrc, off, src, np.array(flags, np.uint8), np.array(mvclass, np.int32), np.array(shape, np.int32)]
  cp = ffi.from_buffer
  types = ["int32_t[]", "int64_t[]", "int32_t[]", "uint8_t[]", "int32_t[]", "int32_t[]"]
  return arrs, [cp(t, a) for t, a in zip(types, arrs)]


def _walk(st, n, args, src_len, top, out_cap=16, max_cells=16):
  from pygrad.engine.vmlib import ffi, lib
  cp = ffi.from_buffer
  out, out_src = np.full(3 * out_cap, -7, np.int32), np.full(3 * out_cap, -7, np.int32)
  keys, info = np.empty(out_cap + max_cells, np.int64), np.zeros(2, np.int64)
  r = lib.pg_kernel_walk_moves(st, n, args[0], args[1], args[2], src_len, args[3], args[4], args[5], top, 0,
                               cp("int32_t[]", out), out_cap, cp("int32_t[]", out_src), 3 * out_cap, max_cells,
                               cp("int64_t[]", keys), cp("int64_t[]", info))
  return r, out, out_src, info


def test_the_c_walk_through_movements_reads_its_cells_and_refuses_malformed_arrays():
  """pg_kernel_walk_moves on hand-made arrays: a leaf read through a movement is one entry with its cell; sources
  that are not earlier nodes (a cycle), or lie past src, are refused; more entries or cells than fit hand the
  kernel back to Python (PG_KW_FULL); the state stays usable after each."""
  from pygrad.engine.vmlib import ffi, lib
  st = ffi.gc(lib.pg_kwm_new(), lib.pg_kwm_free)
  LEAF, ALU, MOVE = 1, 2, 8
  # 0: a leaf; 1: a movement of 0 (class 5); 2: ALU(1, 0)
  _, args = _walk_args([0, 1, 2], [0, 1, 0], [LEAF, MOVE, ALU], [-1, 5, -1], [0, 1, 0])
  r, out, out_src, info = _walk(st, 3, args, 3, 2)
  assert r == 3
  assert out[:9].tolist() == [0, 1, 1, 0, 0, 1, 2, 0, 0]  # node 0 under cell 0, node 0 with none, then node 2
  assert out_src[:2].tolist() == [0, 1] and info.tolist() == [2, 1]
  cells = np.empty(2, np.int32)
  assert lib.pg_kwm_cells(st, 0, ffi.from_buffer("int32_t[]", cells), 1) == 1 and cells.tolist() == [5, -1]
  # the same walk again: the plan's cell is found, not made twice
  assert _walk(st, 3, args, 3, 2)[0] == 3 and info.tolist() == [2, 1]
  # too few entries, or cells: PG_KW_FULL
  assert _walk(st, 3, args, 3, 2, out_cap=2)[0] == lib.PG_KW_FULL
  st2 = ffi.gc(lib.pg_kwm_new(), lib.pg_kwm_free)
  assert _walk(st2, 3, args, 3, 2, max_cells=0)[0] == lib.PG_KW_FULL
  # a cycle (node 1 reads node 2, which reads node 1) and a source past src
  _, bad = _walk_args([0, 1, 1], [2, 1], [LEAF, ALU, ALU], [-1, -1, -1], [0, 0, 0])
  assert _walk(st, 3, bad, 2, 2)[0] == lib.PG_ERR_ARG
  _, args = _walk_args([0, 1, 2], [0, 1, 0], [LEAF, MOVE, ALU], [-1, 5, -1], [0, 1, 0])
  assert _walk(st, 3, args, 2, 2)[0] == lib.PG_ERR_ARG  # node 2's operands lie past src's 2 entries
  assert _walk(st, 3, args, 3, 2)[0] == 3  # and the state is whole after each


def test_the_plan_falls_back_to_python_when_the_c_walk_is_full(monkeypatch):
  """A kernel whose walk passes the C buffers is walked in Python: the same plan."""
  want, _ = _plan("moves-in-kernels", "py", monkeypatch)
  orig = planner._Walk.__init__

  def tiny(self, *a):
    orig(self, *a)
    if self.moves: self._mmem = (*self._mmem[:4], 0, *self._mmem[5:])  # max_cells 0: any movement is too many
  monkeypatch.setattr(planner._Walk, "__init__", tiny)
  got, used = _plan("moves-in-kernels", "c", monkeypatch)
  assert got == want and used["py"] > 0
