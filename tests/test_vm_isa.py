"""The VM's run-time choice of kernel clone matches what this CPU runs, whichever compiler (gcc, clang, zig cc)
built the core: a compiler whose CPU detection fell through to 'portable' would ship only the scalar path."""
from __future__ import annotations
import platform
import sys
import pytest

vmlib = pytest.importorskip("pygrad.engine.vmlib", reason="the compiled interpreter is not built", exc_type=ImportError)


def _cpu_flags() -> set[str]:
  """The flags Linux reports for this CPU (the kernel drops those whose register state the OS does not enable)."""
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("flags"): return set(line.split(":", 1)[1].split())
  except OSError:
    pass
  return set()


def _expected(flags: set[str]) -> str:
  if {"avx512f", "avx512dq", "avx512bw", "avx512vl"} <= flags: return "avx512"
  if {"avx2", "fma"} <= flags: return "avx2"
  return "portable"


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64") or not _cpu_flags(),
                    reason="the expected ISA is read from Linux's /proc/cpuinfo on x86-64")
def test_best_isa_is_what_the_cpu_runs():
  vmlib.set_isa(-1)
  assert vmlib.isa_name() == _expected(_cpu_flags())


def test_isa_table():
  names = [vmlib.isa_name(i) for i in range(3)]
  assert names[0] == "portable"
  if platform.machine() in ("x86_64", "AMD64") and sys.platform != "win32":  # MSVC builds the portable clone only
    assert names[1:] == ["avx2", "avx512"]
  assert vmlib.isa_name(3) is None
  with pytest.raises(ValueError, match="instruction set 7"):
    vmlib.set_isa(7)
