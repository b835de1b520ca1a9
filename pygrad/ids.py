"""The ids Python and the C core must agree on -- op ids, dtype ids and sizes, the VM's kernel kinds, reduce ops and
program magic, and the input order of gradient templates -- come from one table, csrc/tables.h. The compiled module
serves it (pg_table_entry, read by the core layer: pygrad/core/clib.py); whenever that module is loaded, `tables()`
reads it once and checks it against `Ops` and `dtypes`, so a C table that Python does not follow fails at import
with ImportError instead of corrupting graphs.
The pure-Python core needs no compiled module: there, ops.py and dtype.py are the tables and nothing is checked."""
from __future__ import annotations
import functools
from .ops import Ops
from .dtype import BY_ID


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
  from .core.clib import read_tables
  tab = read_tables()
  check(tab)
  return tab


def value(table: str, name: str) -> int:
  """One id of a table, e.g. value('vm_redops', 'DOT')."""
  return tables()[table][name][0]


def order(table: str) -> tuple[str, ...]:
  """The entry names of a table in order (the template input tables)."""
  return tuple(tables()[table])
