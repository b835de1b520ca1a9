"""The worker side of pygrad.distributed: graphs arrive as bytes (pygrad's own format, whose loading executes no code)
and are compiled once per worker process, kept under their content hash (at most PROGRAMS_LIMIT, least recently used
dropped first); the tasks and the actor that run them, and the per-process counters `worker_stats` reports. The
client side (DataParallel, evaluate, map_gradients) is pygrad/distributed.py; Dask is imported here only inside
the actor's calls."""
from __future__ import annotations
import hashlib, threading, time
from typing import Any
import numpy as np
from .uop import UOp

_INLINE_RUN = 0.002  # seconds: an actor's program whose last run took less runs on the worker's event loop


_programs: dict[str, Any] = {}  # content key -> program, least recently used first
_programs_lock = threading.Lock()
_stats = {"compiles": 0, "runs": 0, "shared_runs": 0, "run_seconds": 0.0, "run_cpu": 0.0}
PROGRAMS_LIMIT = 64  # programs a worker keeps: a long-lived worker sent many graphs must not grow without bound


def _content_key(blob: bytes) -> str:
  return hashlib.sha256(blob).hexdigest()


def _loaded(blob: bytes, nout: int) -> tuple[list[UOp], list[UOp]]:
  import pygrad
  roots = list(pygrad.loads(blob))
  return roots[:nout], roots[nout:]


def _program(key: str, blob: bytes, nout: int):
  """This worker's compiled program for the graph `blob` (outputs first, then inputs), compiled on first use."""
  with _programs_lock:
    prog = _programs.pop(key, None)
    if prog is None:
      import pygrad
      outs, ins = _loaded(blob, nout)
      prog = pygrad.compile(outs, ins)
      _stats["compiles"] += 1
      while len(_programs) >= max(PROGRAMS_LIMIT, 1): del _programs[next(iter(_programs))]  # the least recent
    _programs[key] = prog  # the most recently used last
  return prog


def _ran(fn, *args) -> list:
  """fn(*args) -- one chunk's run -- as one array per output, counted and timed in this worker's stats: the wall
  and CPU seconds of the runs themselves, so a caller can tell them from the time spent around them."""
  t, c = time.perf_counter(), time.thread_time()
  res = fn(*args)
  _stats["run_seconds"] += time.perf_counter() - t
  _stats["run_cpu"] += time.thread_time() - c
  _stats["runs"] += 1
  return list(res) if isinstance(res, (list, tuple)) else [res]


def _run(key: str, blob: bytes, nout: int, *arrays) -> list:
  """Run the graph's program on one chunk of inputs (a task on a worker): one array per output."""
  return _ran(_program(key, blob, nout), *arrays)


class _Runner:
  """A Dask actor holding one worker's compiled program of a DataParallel graph. DataParallel calls it over the
  client's own connection to the worker (see DataParallel._actor_round), so a call goes to its worker and the result
  straight back without the scheduler: no task to schedule, no notice that it ended, no fetch.

  Its methods are coroutines, which Dask runs on the worker's event loop: a program whose last run took less than
  _INLINE_RUN seconds runs right there (a hand-off to a thread and back would cost more than the run), a longer one
  on the worker's actor thread, so the event loop keeps answering (heartbeats, other calls) while it runs."""

  def __init__(self, key: str, blob: bytes, nout: int):
    self.prog = _program(key, blob, nout)
    self.shared = None  # this worker's mapping of the client's shared memory, made on the first call that uses it
    self.last: float | None = None  # seconds the last run took; None before the first

  async def run(self, *arrays) -> list:
    return await self._call(self._run, *arrays)

  async def run_shared(self, name: str, layout: list, *inline) -> list:
    """run() on arrays the client left in its shared memory segment `name` (a worker on the client's machine)."""
    return await self._call(self._run_shared, name, layout, *inline)

  async def _call(self, fn, *args) -> list:
    if self.last is not None and self.last < _INLINE_RUN: return fn(*args)
    import asyncio
    from distributed import get_worker
    return await asyncio.get_running_loop().run_in_executor(get_worker().executors["actor"], fn, *args)

  def _run(self, *arrays) -> list:
    t = time.perf_counter()
    try:
      return _ran(self.prog, *arrays)
    finally:
      self.last = time.perf_counter() - t

  def _run_shared(self, name: str, layout: list, *inline) -> list:
    from .shared_arrays import Reader
    if self.shared is None: self.shared = Reader()
    arrays, whole = self.shared.arrays(name, layout, inline)
    res = self._run(*arrays)
    _stats["shared_runs"] += 1
    # a result that is a view of the segment would change under the next call: it leaves as a copy
    return [np.array(r) if isinstance(r, np.ndarray) and np.may_share_memory(r, whole) else r for r in res]


def _evaluate_part(key: str, blob: bytes, nout: int, engine: str | None, *arrays) -> list:
  """One device's part of a placed graph (a task on that device's worker)."""
  import pygrad
  if engine != "numpy": return _run(key, blob, nout, *arrays)
  outs, ins = _loaded(blob, nout)
  return _ran(pygrad.evaluate, outs, dict(zip(ins, arrays)), "numpy")


def _gradients(blob: bytes, ntargets: list[int]) -> bytes:
  """Derive the gradients of each (root, *targets) group in `blob` on a worker; returns them as bytes."""
  import pygrad
  roots = list(pygrad.loads(blob))
  grads: list[UOp] = []
  pos = 0
  for n in ntargets:
    root, targets = roots[pos], roots[pos + 1:pos + 1 + n]
    grads.extend(root.gradient(*targets))
    pos += 1 + n
  return pygrad.dumps(grads)


def _set_programs_limit(n: int) -> int:
  """Sets this worker's PROGRAMS_LIMIT (run with client.run); returns the old one."""
  global PROGRAMS_LIMIT
  old, PROGRAMS_LIMIT = PROGRAMS_LIMIT, int(n)
  return old


def worker_stats() -> dict:
  """How many graphs this process compiled, how many chunks it ran (`shared_runs`: of those, how many read their
  arrays from the client's shared memory) and the seconds those runs took (wall, and CPU of the running thread).
  Read on workers through `client.run`."""
  return dict(_stats, programs=len(_programs))


__all__ = ["PROGRAMS_LIMIT", "worker_stats"]
