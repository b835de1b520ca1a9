"""Item 15 of issue 10: op ids, dtype ids, the VM's kernel kinds, reduce ops and magic, and the gradient templates'
input order come from one table (csrc/tables.h), which Python reads from the compiled module and checks at import."""
import pytest
from pygrad import Ops, dtypes
from pygrad.dtype import BY_ID

ids = pytest.importorskip("pygrad.ids")
try:
  TAB = ids.tables()
except ImportError:  # the compiled module is not built: the pure core's Python tables are the only ones
  TAB = None
needs_c = pytest.mark.skipif(TAB is None, reason="the compiled module pygrad._core is not built")


@needs_c
def test_c_table_is_ops_and_dtypes():
  assert TAB["ops"] == {o.name: (o.value, 0) for o in Ops}
  assert TAB["dtypes"] == {d.name: (d.id, d.itemsize) for d in BY_ID}


@needs_c
def test_a_mismatch_fails_naming_the_entry():
  for table, name, bad in (("ops", "SIN", (8, 0)), ("dtypes", "float16", (9, 4)), ("ops", "NEW_OP", (46, 0))):
    tab = {k: dict(v) for k, v in TAB.items()}
    tab[table][name] = bad
    with pytest.raises(ImportError, match=name):
      ids.check(tab)
  tab = {k: dict(v) for k, v in TAB.items()}
  del tab["dtypes"]["bfloat16"]
  with pytest.raises(ImportError, match="bfloat16"):
    ids.check(tab)


@needs_c
def test_engine_and_templates_use_the_c_table():
  from pygrad.engine import lower, program
  assert (lower.VK_LOOP, lower.VK_GEMM) == (ids.value("vm_kinds", "LOOP"), ids.value("vm_kinds", "GEMM"))
  assert lower.VR == {None: 0, Ops.ADD: 1, Ops.MAX: 2, Ops.MUL: 3} and lower.VR_DOT == 4
  assert (program._MAGIC, program._VERSION) == (0x50475650, 1)
  assert ids.order("tpl_rule_inputs") == ("NODE", "SRCS", "GRAD")
  assert ids.order("tpl_acc_inputs") == ("PREV", "NEW", "NODE")


@needs_c
def test_a_program_with_every_kernel_kind_runs():
  # a contraction (GEMM), a dot-reduction, a max-reduction and a plain loop: each kind/redop id is understood by vm.c
  import numpy as np
  from pygrad import UOp, evaluate
  a = UOp.placeholder((4, 5), dtypes.float32)
  b = UOp.placeholder((5, 3), dtypes.float32)
  outs = [a @ b, (a * a).sum(axis=1), a.max(axis=0), (a + 1).exp2()]
  av = np.arange(20, dtype=np.float32).reshape(4, 5) / 7
  bv = np.linspace(-1, 1, 15, dtype=np.float32).reshape(5, 3)
  got = evaluate(outs, {a: av, b: bv}, engine="c")
  want = evaluate(outs, {a: av, b: bv}, engine="numpy")
  for g, w in zip(got, want): np.testing.assert_allclose(g, w, rtol=1e-5)


@needs_c
def test_vm_limits_come_from_the_c_table():
  """The VM's limits (dims, sizes, registers) are csrc/tables.h's, read through cffi: Python's VM_MAXDIM is the
  number vm.c enforces (a kernel of that many dims is accepted, one more is refused)."""
  from pygrad.engine import lower, program, vmlib
  c = TAB["consts"]
  assert (lower.VM_MAXDIM, lower.VM_MAXSIZE, lower.VM_MAXREGS, lower.VM_MAXREGFILE) == \
    (c["VM_MAXDIM"][0], c["VM_MAXSIZE"][0], c["VM_MAXREGS"][0], c["VM_MAXREGFILE"][0])
  head = [program._MAGIC, program._VERSION, 0, 0, 1]
  def kernel(nd): return [lower.VK_LOOP, nd, 1, 0, 0, 0, 0, *([1] * nd), 1, dtypes.float32.id, 0, 0, 0, 0]
  vmlib.prepare(head + kernel(lower.VM_MAXDIM))
  with pytest.raises(ValueError, match="ndim out of range"):
    vmlib.prepare(head + kernel(lower.VM_MAXDIM + 1))
