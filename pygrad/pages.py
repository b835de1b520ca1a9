"""numpy's huge-page advice paused while pygrad builds tables (a compile's plan, a conversion's columns).

numpy advises the kernel to back every array of 4 MiB or more with transparent huge pages (madvise MADV_HUGEPAGE).
Where the kernel's THP defrag policy is "madvise" (a common default, and this project's machines), the first touch
of such an array may then compact memory to find a free 2 MiB page, and on a machine whose memory is fragmented
that stalls: a 55 MB int64 table first filled in 0.25-0.8 s instead of 0.02 s, in the same process state, which made
a 619k-node compile 40% slower per node than a 206k-node one. The tables built here are written once and read a
few times, so huge pages win them nothing; small pages fault in a steady 0.02 s per 55 MB.

The advice is a process-wide numpy setting: it is switched off while at least one caller is inside `small_pages()`
and restored to what it was when the last one leaves (a counter under a lock, so overlapping callers on several
threads never restore it early). Where numpy has no such switch (other versions), nothing changes."""
from __future__ import annotations
import contextlib, threading
import numpy as np


def _switch():
  for mod in ("_core", "core"):
    f = getattr(getattr(getattr(np, mod, None), "multiarray", None), "_set_madvise_hugepage", None)
    if f is not None: return f
  return None


_SET = _switch()
_lock = threading.Lock()
_inside = 0
_saved = True


@contextlib.contextmanager
def small_pages():
  """numpy's huge-page advice off for the duration (see the module's doc)."""
  global _inside, _saved
  if _SET is None:
    yield
    return
  with _lock:
    if _inside == 0: _saved = _SET(False)
    _inside += 1
  try: yield
  finally:
    with _lock:
      _inside -= 1
      if _inside == 0: _SET(_saved)


__all__ = ["small_pages"]
