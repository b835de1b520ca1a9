"""Helper for thread-safety tests: run a body on several threads at once and fail with what any of them raised."""
from __future__ import annotations
import threading
from typing import Callable


def run_on_threads(body: Callable[[int], None], n: int) -> None:
  """Start body(0) .. body(n - 1) on n threads, wait for all, and raise if any body raised (all errors listed)."""
  errs: list[BaseException] = []

  def guarded(i: int) -> None:
    try:
      body(i)
    except Exception as e:  # noqa: BLE001 -- collected and reported below
      errs.append(e)
  ts = [threading.Thread(target=guarded, args=(i,)) for i in range(n)]
  for t in ts: t.start()
  for t in ts: t.join()
  assert not errs, errs
