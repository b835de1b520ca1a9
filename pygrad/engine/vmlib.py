"""The compiled interpreter (csrc/vm.c in pygrad._core): its cffi handles, the opcode map read from C's opcode table,
and thin wrappers that raise on error codes. The VM needs only the compiled module, not the C node store."""
from __future__ import annotations
from ..ids import tables

try:
  from ..core.clib import ffi, lib
except ImportError as e:  # no compiled core at all
  raise ImportError(f"pygrad's compiled module is not built ({e}); install with `pip install -e .`") from e
if not hasattr(lib, "pg_vm_prepare"):
  raise ImportError("pygrad._core was built without the interpreter (csrc/vm.c); rebuild it")
tables()  # the C table of op and dtype ids must match Ops and dtypes (ImportError if not)


def _opcodes() -> dict[str, int]:
  out, i = {}, 0
  while True:
    p = lib.pg_vm_opcode_name(i)
    if p == ffi.NULL: return out
    out[ffi.string(p).decode()] = i
    i += 1


OPCODES = _opcodes()
# instructions the lowering emits that are not IR ops: a compiled module older than this Python code lacks them
_missing = [n for n in ("MOV", "ABS", "DIV") if n not in OPCODES]
if _missing:
  raise ImportError(f"pygrad._core is older than this pygrad: its interpreter has no {', '.join(_missing)} "
                    "instruction; rebuild it (`pip install -e .`, or `python setup.py build_ext --inplace`)")


def prepare(words):
  """A validated C program (freed with its handle) from int64 words, or ValueError saying what is wrong."""
  import numpy as np
  code = np.ascontiguousarray(words, dtype=np.int64)
  out = ffi.new("pg_vm **")
  msg = ffi.new("char[]", 256)
  rc = lib.pg_vm_prepare(ffi.from_buffer("int64_t[]", code), len(code), out, msg, 256)
  if rc == lib.PG_ERR_NOMEM: raise MemoryError("pygrad VM: out of memory preparing a program")
  if rc < 0: raise ValueError(f"pygrad VM: {ffi.string(msg).decode() or f'error {rc}'}")
  return ffi.gc(out[0], lib.pg_vm_free)


def isa_name(i: int = -1) -> str | None:
  """The instruction set the VM runs now (i=-1) or of clone i."""
  p = lib.pg_vm_isa_name(i)
  return None if p == ffi.NULL else ffi.string(p).decode()


def set_isa(i: int) -> int:
  """Force clone i (0 portable, 1 avx2, 2 avx512) or, with -1, the best this CPU runs; ValueError if unsupported."""
  rc = lib.pg_vm_set_isa(i)
  if rc < 0: raise ValueError(f"pygrad VM: instruction set {i} is not available on this CPU")
  return rc


def apply_threads(n: int) -> int:
  """Give the C thread pool n threads (pygrad.set_num_threads calls this); returns the count in force."""
  rc = lib.pg_vm_set_threads(n)
  if rc < 0: raise ValueError(f"pygrad VM: bad thread count {n}")
  return rc


def _init_threads() -> None:
  from ..threads import get_num_threads
  apply_threads(get_num_threads())


_init_threads()

__all__ = ["ffi", "lib", "OPCODES", "prepare", "isa_name", "set_isa", "apply_threads"]
