"""The compiled module (pygrad._core, built by cffi from csrc/), loaded here and nowhere else: the C node store is
reached through CCore (ccore.py), the id tables through `read_tables` (checked by pygrad/ids.py), and the
interpreter, which needs only the compiled module, through these same `ffi` and `lib` (pygrad/engine/vmlib.py).
Importing this module raises ImportError when the compiled module is not built."""
from __future__ import annotations
from .. import _core as module
from .._core import ffi, lib

TABLES = ("ops", "dtypes", "vm_kinds", "vm_redops", "consts", "tpl_rule_inputs", "tpl_acc_inputs")  # csrc/tables.h


def read_tables() -> dict[str, dict[str, tuple[int, int]]]:
  """Every id table of the compiled module: {table: {entry name: (value, second value)}} in table order."""
  if not hasattr(lib, "pg_table_entry"): raise ImportError("pygrad._core predates csrc/tables.c; rebuild it")
  out: dict[str, dict[str, tuple[int, int]]] = {}
  v0, v1 = ffi.new("int64_t *"), ffi.new("int64_t *")
  for t, name in enumerate(TABLES):
    rows, i = {}, 0
    while (p := lib.pg_table_entry(t, i, v0, v1)) != ffi.NULL:
      rows[ffi.string(p).decode()] = (v0[0], v1[0])
      i += 1
    out[name] = rows
  return out
