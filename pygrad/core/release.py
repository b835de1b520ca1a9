"""Deferred release of the references Python handles held. A handle's death used to cost one core call (and, on
the C core, one cffi crossing: ~150-300 ns, as much as making the node); the ids of dead handles are now collected
and dropped in one call per BATCH. Reference counts commute, so the only observable difference is *when* a node
whose last holder was a handle is freed: both cores flush before they report anything that depends on it (`live`,
`arg_drain`), so `pygrad.live_nodes()` and the interner see every dropped handle, and at most BATCH - 1 nodes
wait meanwhile. Both cores defer the same way, so they recycle ids in the same order."""
from __future__ import annotations
from typing import Callable

BATCH = 256


def deferred(decref_many: Callable[[list], None]) -> tuple[Callable[[int], None], Callable[[], None]]:
  """(release, flush): release(nid) drops one reference soon; flush() drops every pending one now."""
  pend: list[int] = []
  append, pop = pend.append, pend.pop

  def flush() -> None:
    # taken one pop at a time: each pop is atomic, so concurrent flushes (or a flush from a finalizer run by a
    # collection in the middle of this one) never take an id twice, and nothing here allocates a GC object
    ids: list[int] = []
    take = ids.append
    while pend:
      try: take(pop())
      except IndexError: break
    if ids:
      ids.reverse()  # in the order the handles died
      decref_many(ids)

  def release(nid: int) -> None:
    append(nid)
    if len(pend) >= BATCH: flush()
  return release, flush
