"""The C engine within the VM's limits (issue 10 items 1 and 7): a deep chain's gradient keeps one register per live
value (registers are reused in place, SIN's included), a kernel with more live values than the VM's register file
holds runs by numpy instead of being refused, and a graph whose values exceed what the VM or this machine takes is
a clear error naming the op and shape, raised before anything is allocated."""
from __future__ import annotations
import numpy as np
import pytest
import pygrad
from pygrad import UOp, dtypes

program = pytest.importorskip("pygrad.engine.program", reason="the compiled interpreter is not built",
                              exc_type=ImportError)
from pygrad.engine import numpy_eval, lower, vmlib  # noqa: E402
from pygrad.engine.flatten import flatten  # noqa: E402
from pygrad.engine.planner import Planner, Loop  # noqa: E402

F32, F64 = dtypes.float32, dtypes.float64


def _sin_chain_gradient(depth: int, shape=()):
  x = UOp.placeholder(shape, F32, "x")
  y = x
  for _ in range(depth): y = y.sin()
  return x, y.gradient(x)[0]


def _loops(out, inputs) -> list[Loop]:
  nodes, shaped = flatten([out])
  return [k for k in Planner(nodes, shaped, inputs).kernels if isinstance(k, Loop)]


def _nregs(words) -> int: return words[7 + words[1]]


def test_deep_chain_gradient_keeps_one_register_per_live_value():
  """The gradient of sin applied d times is one fused group in which the d forward values stay live until the
  backward pass reads them: d registers are needed, and the allocator must not need more. It kept every SIN's
  operand (the backward pass's pi/2 - s) for the whole kernel, ~2d registers: at d = 1,000,000 past the VM's
  register limit."""
  for depth in (500, 4000):
    x, g = _sin_chain_gradient(depth)
    (loop,) = _loops(g, [x])
    (part,) = lower.lower_loop(loop)
    words = part.words
    assert part.fused
    assert depth <= _nregs(words) <= depth + 16, (depth, _nregs(words))


def test_deep_chain_gradient_runs_on_the_c_engine():
  x, g = _sin_chain_gradient(20000)
  p = pygrad.compile(g, [x])
  assert p.stats["fused_groups"] == 1 and p.stats["numpy_kernels"] == 0
  for v in (0.5, -1.25, 3.0):
    np.testing.assert_allclose(p(np.float32(v)), numpy_eval.evaluate([g], {x: np.float32(v)})[0], rtol=1e-4)


@pytest.mark.parametrize("dt", [dtypes.float16, dtypes.bfloat16, F32, F64])
@pytest.mark.parametrize("n", [1, 4099])
def test_sin_writes_over_its_operand_exactly(dt, n):
  """A SIN whose operand dies there writes into that operand's register: with large arguments (the libm path),
  inf, NaN and signed zeros, at a size with a SIMD main loop and a tail, the results equal numpy's within an ulp or
  two (float64; non-finite values and zero signs exactly) or within float32's polynomial error."""
  rng = np.random.default_rng(3)
  v = rng.standard_normal(n) * np.where(rng.random(n) < 0.3, 3e6, 3.0)
  v[: min(n, 6)] = [np.inf, -np.inf, np.nan, -0.0, 0.0, 2e7][: min(n, 6)]
  x = UOp.placeholder((n,), dt, "x")
  y = ((x * 1.5).sin() + 0.25).sin()  # x*1.5 and sin(..)+0.25 die at the SINs: their registers are reused
  loops = _loops(y, [x])
  words = lower.lower_loop(loops[-1])[0].words
  assert _nregs(words) == 4  # x, the two constants, and one register that all four ALU ops write in turn
  with np.errstate(over="ignore"):  # float16 holds no 3e6: inf, whose sine is NaN
    val = v.astype(dt.numpy if dt is not dtypes.bfloat16 else np.float32)
  want = numpy_eval.evaluate([y], {x: val})[0]
  got = pygrad.evaluate(y, {x: val}, engine="c")
  if dt is F64:  # within an ulp or two: the wheel's libm and numpy's own SIMD sine round a few inputs differently
    special = ~np.isfinite(want) | (want == 0)
    np.testing.assert_array_equal(got[special], want[special])  # NaN, inf and the sign of zero exactly
    np.testing.assert_allclose(got, want, rtol=5e-16, atol=1e-15, equal_nan=True)  # inner ulp carried
  else: np.testing.assert_allclose(got, want, rtol={F32: 1e-5, dtypes.float16: 1e-3}.get(dt, 8e-3), atol=1e-6,
                                   equal_nan=True)


def test_register_limit_is_the_c_one():
  """lower.regfile_fits counts a kernel's registers as vm.c does: at tile size 65,536 the last register file that
  fits is accepted by the VM, one register more is refused by both."""
  def kernel(nregs):
    return [lower.VK_LOOP, 1, 65536, 0, 0, 0, 0, 1, nregs] + [F32.id, 0] * nregs + [0, 0, 0]

  tile = 65536 * 8
  n = (lower.VM_MAXREGFILE - 128) // (16 + tile)
  head = [program._MAGIC, program._VERSION, 0, 0, 1]
  assert lower.regfile_fits(kernel(n))
  vmlib.prepare(head + kernel(n))
  assert not lower.regfile_fits(kernel(n + 1))
  with pytest.raises(ValueError, match="register file too large"):
    vmlib.prepare(head + kernel(n + 1))


def _shifted_sum(n=60):
  """60 shifted views of x summed: each a load with a register of its own, all live to the kernel's end."""
  x = UOp.placeholder((n + 8,), F32, "x")
  h = x.shrink(((0, 8),))
  for i in range(1, n): h = h + x.shrink(((i, i + 8),)) * float(i)
  return x, h


def test_a_kernel_past_the_register_file_is_split_and_runs_in_c(monkeypatch):
  """A fused group whose live values do not fit the VM's register file is cut into kernels that do, the values
  between them carried in arena buffers: it stays in C (on main it ran by numpy, op by op)."""
  x, h = _shifted_sum()
  v = np.linspace(-1, 1, 68, dtype=np.float32)
  want = numpy_eval.evaluate([h, h.sum()], {x: v})
  whole = pygrad.compile([h, h.sum(), x * 2.0], [x])
  assert whole.stats["numpy_kernels"] == 0 and whole.stats["spills"] == 0
  monkeypatch.setattr(lower, "VM_MAXREGFILE", 128 + 30 * (16 + 64))  # 30 registers of an 8-element tile
  p = pygrad.compile([h, h.sum(), x * 2.0], [x])
  assert p.stats["numpy_kernels"] == 0 and p.stats["spills"] > 0 and p.stats["kernels"] > whole.stats["kernels"]
  got, total, x2 = p(v)
  for a, b in zip(whole(v), (got, total, x2)): assert a.tobytes() == b.tobytes()  # split: the same bits
  np.testing.assert_allclose(got, want[0], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(total, want[1], rtol=1e-5, atol=1e-4)
  np.testing.assert_array_equal(x2, v * 2)


def test_a_kernel_no_split_can_fit_runs_by_numpy(monkeypatch):
  """A register file too small for even one instruction's operands: the kernel runs by numpy, never a program the
  VM refuses."""
  x, h = _shifted_sum(8)
  v = np.linspace(-1, 1, 16, dtype=np.float32)
  monkeypatch.setattr(lower, "VM_MAXREGFILE", 128 + 2 * (16 + 64))
  p = pygrad.compile([h, x * 2.0], [x])
  assert p.stats["numpy_kernels"] == 2 and p.stats["kernels"] == 0
  got, x2 = p(v)
  np.testing.assert_allclose(got, numpy_eval.evaluate([h], {x: v})[0], rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(x2, v * 2)


# ---- sizes past the VM's bound (issue 10 item 7) ----
def test_a_value_past_the_vm_bound_is_refused_naming_op_and_shape():
  x = UOp.placeholder((4,), F32, "x")
  big = x.reshape(4, 1, 1).expand(4, 2 ** 24, 2 ** 24)  # 2**50 elements: past the VM's 2**48
  for out in (big.sum(), big.max(axis=2)):
    with pytest.raises(ValueError, match=r"EXPAND float32\[4, 16777216, 16777216\]"):
      pygrad.compile(out, [x])
    with pytest.raises(ValueError, match="EXPAND"):
      pygrad.evaluate(out, {x: np.ones(4, np.float32)}, engine="c")


@pytest.mark.parametrize("swept", [False, True])
def test_a_cast_past_the_vm_bound_is_refused_naming_it(swept, monkeypatch):
  """A CAST read once is an expression the planner need not visit (planner sweeps in C: kwalk.Graph leaves it out),
  but its value is still checked against the VM's bound: a float64 cast of 2**46 float32 elements (2**48 bytes,
  within the bound) is 2**49 bytes."""
  from pygrad.engine import planner
  if swept: monkeypatch.setattr(planner, "_GRAPH_MIN_NODES", 0)
  x = UOp.placeholder((4,), F32, "x")
  big = x.reshape(4, 1, 1).expand(4, 2 ** 22, 2 ** 22)
  with pytest.raises(ValueError, match=r"CAST float64\[4, 4194304, 4194304\]"):
    pygrad.compile(big.cast(F64).sum(), [x])


def test_buffers_past_the_machines_memory_are_refused_before_allocating():
  """An output of 2**46 bytes (64 TiB) fits the VM's bound but no machine's memory: compile refuses it with a
  MemoryError naming the buffer, instead of a program whose every call attempts that allocation."""
  x = UOp.placeholder((4,), F32, "x")
  out = x.reshape(4, 1).expand(4, 2 ** 42)
  with pytest.raises(MemoryError, match=r"EXPAND float32\[4, 4398046511104\]"):
    pygrad.compile(out, [x])
  with pytest.raises(MemoryError, match=r"ADD float32\[4, 4398046511104\]"):
    pygrad.evaluate(out + 1.0, {x: np.ones(4, np.float32)}, engine="c")
  # a smaller expansion read as a view: nothing of its size is stored
  assert pygrad.evaluate(x.reshape(4, 1).expand(4, 2 ** 20).sum(), {x: np.ones(4, np.float32)}, engine="c") == 2 ** 22


def test_internal_buffers_past_the_vm_bound_together_are_refused_naming_the_largest():
  """Three internal values of 2**47 bytes each, live at once: each is within the VM's bound, their arena is not.
  compile says so with a ValueError naming the buffer (before: the C validator's "bad program at word 6: slot size
  out of range"); the numpy engine's allocation failure names the op and its size. (Each value is read by two
  reductions, so it is a buffer: read by one kernel only, it would be computed there, in registers.)"""
  x = UOp.placeholder((4,), F32, "x")
  xe = x.reshape(4, 1).expand(4, 2 ** 43)
  a, b, c = xe + 1.0, xe * 2.0, xe - 3.0
  out = (a * b + c * a + b * c).sum() + (a + b + c).max()
  # 3 * 2**47 bytes, and the two reductions' results (64 bytes each)
  with pytest.raises(ValueError, match=r"internal buffers need 422,212,465,066,112 bytes at once.*float32\[4, "
                                       r"8796093022208\] \(140,737,488,355,328 bytes\)"):
    pygrad.compile(out, [x])
  with pytest.raises(MemoryError, match=r"numpy engine: (ADD|MUL) float32\[4, 8796093022208\] needs "
                                        r"140,737,488,355,328 bytes"):
    pygrad.evaluate(out, {x: np.ones(4, np.float32)}, engine="numpy")


def test_numpy_engine_names_a_value_no_array_can_hold():
  """A PAD to 2**62 elements of float32 (2**64 bytes: fits int64 as a shape, not as an array): the numpy engine says
  which op and how many bytes, as the C engine does, instead of numpy's bare "array is too big"."""
  x = UOp.placeholder((4,), F32, "x")
  out = x.pad(((0, 2 ** 62 - 4),))
  with pytest.raises(ValueError, match=r"numpy engine: PAD float32\[4611686018427387904\] needs "
                                       r"18,446,744,073,709,551,616 bytes"):
    pygrad.evaluate(out, {x: np.ones(4, np.float32)}, engine="numpy")
  with pytest.raises(ValueError, match=r"PAD float32\[4611686018427387904\]"):
    pygrad.evaluate(out, {x: np.ones(4, np.float32)}, engine="c")
  with pytest.raises(MemoryError, match=r"numpy engine: PAD float32\[17592186044416\] needs 70,368,744,177,664"):
    pygrad.evaluate(x.pad(((0, 2 ** 44 - 4),)), {x: np.ones(4, np.float32)}, engine="numpy")
