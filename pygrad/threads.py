"""How many threads the C interpreter runs a program on: set_num_threads(n) / get_num_threads(), and
PYGRAD_NUM_THREADS in the environment at start. The default is the number of cores this process may run on (its CPU
affinity where the OS has one). Every thread count gives bit-identical results: work is split into parts that write
disjoint memory, and reductions combine in a fixed order, never in the order threads finish."""
from __future__ import annotations
import operator
import os

MAX_THREADS = 256  # csrc/vm_pool.c's bound
_count: int | None = None


def _default() -> int:
  env = os.environ.get("PYGRAD_NUM_THREADS", "").strip()
  if env:
    try: n = int(env)
    except ValueError: n = 0
    if n < 1: raise ValueError(f"PYGRAD_NUM_THREADS must be a positive integer, got {env!r}")
    return min(n, MAX_THREADS)
  try: return max(1, min(len(os.sched_getaffinity(0)), MAX_THREADS))
  except AttributeError: return max(1, min(os.cpu_count() or 1, MAX_THREADS))  # no affinity API (macOS, Windows)


def get_num_threads() -> int:
  """The number of threads programs run on."""
  global _count
  if _count is None: _count = _default()
  return _count


def set_num_threads(n: int) -> int:
  """Run programs on n threads from now on (1: the calling thread only); returns the count in force (at most 256,
  and 1 where the build has no threads)."""
  global _count
  if isinstance(n, bool): raise TypeError("set_num_threads: n must be an int, got bool")
  try: n = operator.index(n)
  except TypeError: raise TypeError(f"set_num_threads: n must be an int, got {type(n).__name__}") from None
  if n < 1: raise ValueError(f"set_num_threads: n must be >= 1, got {n}")
  _count = min(n, MAX_THREADS)
  try:
    from .engine import vmlib
  except ImportError:  # no compiled interpreter: the numpy engine runs on numpy's own threads
    return _count
  _count = vmlib.apply_threads(_count)
  return _count


__all__ = ["get_num_threads", "set_num_threads"]
