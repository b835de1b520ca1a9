"""The ids Python and the C core must agree on -- op ids, dtype ids and sizes, the VM's kernel kinds, reduce ops and
program magic, and the input order of gradient templates -- come from one table, csrc/tables.h. The compiled module
serves it (pg_table_entry); whenever that module is loaded, `tables()` reads it once and checks it against `Ops` and
`dtypes`, so a C table that Python does not follow fails at import with ImportError instead of corrupting graphs.
The pure-Python core needs no compiled module: there, ops.py and dtype.py are the tables and nothing is checked."""
from __future__ import annotations
import functools
from .ops import Ops
from .dtype import BY_ID

_NAMES = ("ops", "dtypes", "vm_kinds", "vm_redops", "consts", "tpl_rule_inputs", "tpl_acc_inputs")


def _read(ffi, lib) -> dict[str, dict[str, tuple[int, int]]]:
  """Every table of the compiled module: {table: {entry name: (value, second value)}} in table order."""
  out: dict[str, dict[str, tuple[int, int]]] = {}
  v0, v1 = ffi.new("int64_t *"), ffi.new("int64_t *")
  for t, name in enumerate(_NAMES):
    rows, i = {}, 0
    while (p := lib.pg_table_entry(t, i, v0, v1)) != ffi.NULL:
      rows[ffi.string(p).decode()] = (v0[0], v1[0])
      i += 1
    out[name] = rows
  return out


def check(tab: dict[str, dict[str, tuple[int, int]]]) -> None:
  """ImportError naming the first entry where the C table and Ops/dtypes differ (a stale or mismatched build)."""
  want_ops = {o.name: (o.value, 0) for o in Ops}
  want_dt = {d.name: (d.id, d.itemsize) for d in BY_ID}
  for what, got, want in (("op", tab["ops"], want_ops), ("dtype", tab["dtypes"], want_dt)):
    for name in sorted(set(got) | set(want)):
      if got.get(name) != want.get(name):
        raise ImportError(f"pygrad: the compiled core's {what} table (csrc/tables.h) says {name} = {got.get(name)}, "
                          f"Python says {want.get(name)}; rebuild pygrad._core or fix the tables to agree")


@functools.cache
def tables() -> dict[str, dict[str, tuple[int, int]]]:
  """The compiled module's tables, checked (ImportError if that module is not built or disagrees with Python)."""
  from ._core import ffi, lib
  if not hasattr(lib, "pg_table_entry"): raise ImportError("pygrad._core predates csrc/tables.c; rebuild it")
  tab = _read(ffi, lib)
  check(tab)
  return tab


def value(table: str, name: str) -> int:
  """One id of a table, e.g. value('vm_redops', 'DOT')."""
  return tables()[table][name][0]


def order(table: str) -> tuple[str, ...]:
  """The entry names of a table in order (the template input tables)."""
  return tuple(tables()[table])
