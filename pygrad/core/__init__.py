"""Chooses the core for this process: PYGRAD_CORE=c demands the C core, =python the pure-Python one; unset, the C
core if it is built, else the Python core with one warning. Both cores expose the same id-based interface."""
from __future__ import annotations
import os, warnings
from .pycore import PyCore, ArgGone


def _load():
  want = os.environ.get("PYGRAD_CORE", "").strip().lower()
  if want not in ("", "c", "python"):
    raise ImportError(f"PYGRAD_CORE must be 'c' or 'python', got {want!r}")
  if want == "python": return PyCore()
  try:
    from .ccore import CCore
  except ImportError as e:
    if want == "c":
      raise ImportError(f"PYGRAD_CORE=c but pygrad's C core is not built ({e}); install with `pip install .`") from e
    warnings.warn("pygrad: the C core is not built, using the pure-Python core (set PYGRAD_CORE=python to silence)",
                  RuntimeWarning, stacklevel=2)
    return PyCore()
  return CCore()


CORE = _load()
__all__ = ["CORE", "ArgGone", "PyCore"]
