"""pygrad on Dask's `distributed`: compiled programs run data-parallel on a cluster's workers (`DataParallel`), a
MULTI-sharded graph runs with each device placed on a worker (`evaluate(..., placement=...)`), and the gradients of
many graphs are derived on the workers at once (`map_gradients`).

Graphs travel as bytes in pygrad's own format (`pygrad.dumps`, whose loading executes no code), once per worker:
a worker compiles a graph once and keeps the program under the graph's content hash, so the same graph sent again
(by a second DataParallel, or a later call) compiles nothing. Results are combined on the client in a fixed order
(by chunk index), so they never depend on which worker finished first. Dask is an optional dependency
(`pip install "pygrad[distributed]"`), imported only here."""
from __future__ import annotations
import threading, time
from typing import Any
import numpy as np
from .ops import Ops
from .uop import UOp
from .worker import (_content_key, _evaluate_part, _gradients, _run, _Runner, _set_programs_limit,  # noqa: F401
                     worker_stats)

REDUCTIONS = ("sum", "mean", "concat")
_INLINE_BYTES = 4 << 20  # shared inputs up to this size (times the chunk count) travel inside the tasks
_INPUT_OPS = (Ops.BUFFER, Ops.DEFINE_VAR)
_ACTOR_RECHECK = 5.0  # seconds between looks for workers that joined since a DataParallel made its actors
_ACTOR_POLL = 0.5  # seconds between looks at the actors' workers while a call waits on them


def _dask():
  """The `distributed` module, or ImportError saying how to install it."""
  try:
    import distributed
  except ImportError as e:
    raise ImportError("pygrad.distributed needs Dask's distributed scheduler: pip install 'pygrad[distributed]'") from e
  return distributed


# ---------------------------------------------------------------------------------------------------------------
# client side

def _outputs(outputs) -> tuple[list[UOp], bool]:
  if isinstance(outputs, UOp): return [outputs], True
  if isinstance(outputs, (list, tuple)) and outputs and all(isinstance(o, UOp) for o in outputs):
    return list(outputs), False
  raise TypeError(f"outputs must be a UOp or a non-empty list/tuple of UOps, got {outputs!r:.80}")


def _workers(client) -> list[str]:
  ws = sorted(client.scheduler_info()["workers"])
  if not ws: raise RuntimeError("pygrad.distributed: the Dask cluster has no workers")
  return ws


def _is_future(x) -> bool:
  return type(x).__name__ == "Future" and hasattr(x, "key") and hasattr(x, "status")


def _is_dask_array(x) -> bool:
  return type(x).__module__.startswith("dask.array") and hasattr(x, "chunks") and hasattr(x, "to_delayed")


class _Lost(Exception):
  """A chunk's task or data went away with its worker."""


def _gather_in_order(client, futures: list, resubmit, timeout: float, retries: int, direct: bool | None = None) -> list:
  """The results of `futures` in order. Dask re-runs a task whose worker died elsewhere by itself; a chunk that still
  comes back lost (its worker died too often, or data only it held went with it) is resubmitted by `resubmit(i)`, up
  to `retries` times, on the workers that remain. An error raised by a task is raised here, a chunk not done within
  `timeout` seconds is a TimeoutError naming it and its worker: never a hang, never a partial result. `direct`: fetch
  the results from the workers, not through the scheduler (see _direct)."""
  dist = _dask()
  deadline = time.monotonic() + timeout
  results: list = [None] * len(futures)
  tries = [0] * len(futures)
  futs = dict(enumerate(futures))
  while futs:
    left = deadline - time.monotonic()
    if left <= 0:
      where = {i: _where(client, f) for i, f in futs.items()}
      raise TimeoutError(f"pygrad.distributed: chunks {sorted(where)} not done within {timeout:g} s (on workers "
                         f"{sorted({w for w in where.values() if w})}; workers now: {_workers(client)})")
    try:
      dist.wait(list(futs.values()), timeout=min(left, 2.0))
    except (TimeoutError, dist.client.FuturesCancelledError):
      pass  # a cancelled chunk (its data went with a worker) is looked at, and resubmitted, below
    done = [i for i, f in futs.items() if f.status == "finished"]
    if done:  # one round trip for every finished chunk
      try:
        vals = client.gather([futs[i] for i in done], direct=direct)
      except Exception:  # a result went with its worker between the check and the fetch: its status says so next
        vals = None
      if vals is not None:
        for i, v in zip(done, vals, strict=True): results[i] = v
        for i in done: del futs[i]
    for i, f in list(futs.items()):
      if f.status in ("error", "cancelled", "lost"):
        exc = _exception(f)
        if exc is None:
          if f.status != "cancelled": continue  # Dask re-ran the chunk meanwhile: collected on the next pass
          # cancelled with no exception: the scheduler forgot the task, e.g. data it needed went with a worker
          exc = _Lost(f"chunk {i} was cancelled by the scheduler")
        if not _worker_loss(exc): raise exc
        tries[i] += 1
        if tries[i] > retries:
          raise RuntimeError(f"pygrad.distributed: chunk {i} was lost with its worker {tries[i]} times "
                             f"({type(exc).__name__}: {exc}); workers now: {_workers(client)}") from exc
        futs[i] = resubmit(i)
  return results


_LOOPBACK = ("tcp://127.", "inproc://", "tls://127.")
_SAME_MACHINE = ("tcp://127.", "tls://127.")  # worker processes on this machine (inproc ones share the arrays anyway)


def _direct(client) -> bool | None:
  """Whether to fetch results from the workers directly: the client's own setting if it has one, else yes when every
  worker is on this machine's loopback (reachable by definition; a fetch through the scheduler costs an extra hop,
  ~2 ms a call here), else Dask's default (through the scheduler: a client outside the cluster's network, as on
  Kubernetes, may not reach the workers)."""
  if client.direct_to_workers is not None: return client.direct_to_workers
  try:
    ws = list(client.scheduler_info()["workers"])
  except Exception:  # a busy scheduler may not answer in time: its own address still tells
    ws = []
  if not ws:  # no worker listed (yet): workers of a scheduler on loopback connected from this machine
    ws = [str(getattr(getattr(client, "scheduler", None), "address", "") or "")]
  return True if all(w.startswith(_LOOPBACK) for w in ws) else None


def _exception(f):
  try:
    return f.exception(timeout=5)
  except Exception as e:  # a cancelled future raises CancelledError instead of returning it
    return e


def _worker_loss(exc: BaseException) -> bool:
  """True when `exc` says a worker (or the data it held) went away, not that the task itself failed."""
  name = type(exc).__name__
  return name in ("KilledWorker", "CancelledError", "FutureCancelledError", "CommClosedError", "_Lost") or \
    "lost" in str(exc).lower()


def _where(client, f) -> str | None:
  try:
    who = client.who_has([f]).get(f.key) or ()
    return next(iter(who), None)
  except Exception:
    return None


class DataParallel:
  """A graph run data-parallel on a Dask cluster: `dp(*arrays)` splits the `batch` inputs along axis 0 into chunks
  of the size the graph was built for (the leading size of its batch inputs), runs each chunk on a worker -- every
  worker compiled the graph once -- and combines each output as `reduce` says: "sum", "mean" (weighted by chunk
  size) or "concat" (along axis 0), in chunk order. With one chunk the result is `pygrad.compile`'s, bit for bit.

  `inputs` are the BUFFER/DEFINE_VAR nodes in call order; `reduce` maps each output (the UOp or its index) to a
  reduction. Arrays may also be Dask futures or Dask arrays already on the cluster: they are used in place."""

  def __init__(self, outputs, inputs, client, batch, reduce, timeout: float = 600.0, retries: int = 3):
    import pygrad
    self._outs, self._single = _outputs(outputs)
    self.inputs = list(inputs)
    for u in self.inputs:
      if not isinstance(u, UOp) or u.op not in _INPUT_OPS:
        raise TypeError(f"DataParallel: inputs must be BUFFER/DEFINE_VAR nodes, got {u!r:.80}")
    if len(set(self.inputs)) != len(self.inputs): raise ValueError("DataParallel: an input is listed twice")
    batch = list(batch)
    if not batch: raise ValueError("DataParallel: batch names no input to split")
    pos = {u: i for i, u in enumerate(self.inputs)}
    for b in batch:
      if b not in pos: raise ValueError(f"DataParallel: batch input {_name(b)} is not one of the inputs")
      if b.op is not Ops.BUFFER or not b.shape: raise ValueError(f"DataParallel: batch input {_name(b)} has no axis 0")
    self.chunk = batch[0].shape[0]
    for b in batch:
      if b.shape[0] != self.chunk:
        raise ValueError(f"DataParallel: batch inputs disagree on the chunk size: {_name(batch[0])} has "
                         f"{self.chunk} rows, {_name(b)} has {b.shape[0]}")
    self._batch = [pos[b] for b in batch]
    self.reduce = self._reductions(reduce)
    self.client, self.timeout, self.retries = client, float(timeout), int(retries)
    blob = pygrad.dumps(self._outs + self.inputs)
    self.key = _content_key(blob)
    self.graph_bytes = len(blob)
    self._bytes = blob
    # the graph goes to every worker once; tasks name it by this future (a worker reads its local replica)
    self._blob = client.scatter(blob, broadcast=True, hash=False)
    self._held: list = []
    self._direct = _direct(client)  # asks the scheduler: once, not per call
    # the fast path (actors) needs the client to reach the workers itself, as direct fetches do
    self.use_actors = self._direct is True
    self._actors: list | None = None  # one per worker, made on the first call that uses them
    self._actor_futures: list | None = None
    self._actor_workers: list[str] = []
    self._actors_checked = 0.0
    # actors on this machine's loopback read a call's arrays from shared memory rather than the socket (set False
    # to send them, as to workers elsewhere); one call at a time uses the segment, a concurrent one the socket
    self.shared_memory = True
    self._writer = None
    self._shm_lock = threading.Lock()
    self._shm_workers = False

  def _graph(self):
    """The future of the graph's bytes on the cluster, sent again if Dask lost it: its memory manager keeps one
    replica of data no task waits for, so the worker that held it can die with it."""
    if self._blob.status != "finished":
      self._blob = self.client.scatter(self._bytes, broadcast=True, hash=False)
    return self._blob

  def _reductions(self, reduce) -> list[str]:
    if not isinstance(reduce, dict): raise TypeError(f"DataParallel: reduce must be a dict, got {reduce!r:.80}")
    red: list[str | None] = [None] * len(self._outs)
    for k, how in reduce.items():
      if how not in REDUCTIONS: raise ValueError(f"DataParallel: reduce {how!r} is not one of {REDUCTIONS}")
      idx = [i for i, o in enumerate(self._outs) if o is k] if isinstance(k, UOp) else [k]
      if not idx or not isinstance(idx[0], int) or not 0 <= idx[0] < len(self._outs):
        raise ValueError(f"DataParallel: reduce names {k!r:.80}, which is not an output")
      for i in idx: red[i] = how
    for i, (o, how) in enumerate(zip(self._outs, red)):
      if how is None: raise ValueError(f"DataParallel: output {i} ({_name(o)}) has no reduction in `reduce`")
      if how == "concat" and not o.shape: raise ValueError(f"DataParallel: output {i} is a scalar: cannot concat")
    return red  # type: ignore[return-value]

  def __call__(self, *arrays):
    if len(arrays) != len(self.inputs):
      raise ValueError(f"DataParallel: expected {len(self.inputs)} arrays (one per input), got {len(arrays)}")
    rows = {}
    for i in self._batch:
      a = arrays[i]
      if _is_future(a): raise ValueError(f"DataParallel: batch input {_name(self.inputs[i])} is a future: pass its "
                                         "row count by giving a Dask array instead")
      n = a.shape[0] if hasattr(a, "shape") and len(a.shape) else None
      if n is None: raise ValueError(f"DataParallel: batch input {_name(self.inputs[i])} has no axis 0")
      rows[i] = n
    sizes = set(rows.values())
    if len(sizes) != 1:
      raise ValueError("DataParallel: batch inputs have different sizes: " +
                       ", ".join(f"{_name(self.inputs[i])}={n}" for i, n in rows.items()))
    total = sizes.pop()
    if total == 0 or total % self.chunk:
      raise ValueError(f"DataParallel: a batch of {total} rows does not split into chunks of {self.chunk} (the "
                       f"graph's batch size); build the graph for a size that divides the batch")
    nchunks = total // self.chunk
    chunks = self._chunks(arrays, nchunks)
    shared = self._shared(arrays, nchunks)
    client = self.client

    def args(c: int) -> list:
      return [chunks[c][i] if i in chunks[c] else shared[i] for i in range(len(self.inputs))]

    if self.use_actors and not any(_is_future(a) for ch in chunks for a in ch.values()) and \
       not any(_is_future(a) for a in shared.values()):
      parts = self._run_on_actors([args(c) for c in range(nchunks)])
      if parts is not None:
        self._held = []
        res = [self._combine(j, [p[j] for p in parts]) for j in range(len(self._outs))]
        return res[0] if self._single else res

    def submit(c: int):
      return client.submit(_run, self.key, self._graph(), len(self._outs), *args(c), pure=False)

    # every chunk in one message: the client batches its messages to the scheduler 10 ms apart, so chunks submitted
    # one by one would start 10 ms after each other
    per_chunk = [args(c) for c in range(nchunks)]
    blob = self._graph()
    futures = client.map(_run, [self.key] * nchunks, [blob] * nchunks, [len(self._outs)] * nchunks,
                         *[[a[i] for a in per_chunk] for i in range(len(self.inputs))], pure=False)
    # the last call's futures are released after this call's tasks went out, not before: their release message
    # would otherwise take the batch slot and hold this call's tasks back by up to those 10 ms
    self._held = futures
    parts = _gather_in_order(client, futures, submit, self.timeout, self.retries, self._direct)
    res = [self._combine(j, [p[j] for p in parts]) for j in range(len(self._outs))]
    return res[0] if self._single else res

  def _run_on_actors(self, per_chunk: list[list]) -> list | None:
    """The chunks run by the workers' actors, chunk c on actor c mod n (each actor runs its chunks in order); None
    when a worker went away (the call then runs as tasks, which Dask re-runs elsewhere, and the actors are made
    again on the next call). An error raised by the program itself is raised here."""
    dist = _dask()
    try:
      now = time.monotonic()
      if self._actors is not None and now - self._actors_checked > _ACTOR_RECHECK:
        # a worker that joined since (the cluster scaled up) gets an actor too: asking costs a scheduler round trip,
        # so it is asked every _ACTOR_RECHECK seconds, not every call
        self._actors_checked = now
        if _workers(self.client) != self._actor_workers: self._actors = self._actor_futures = None
      if self._actors is None:
        ws = _workers(self.client)
        blob = self._graph()
        fs = [self.client.submit(_Runner, self.key, blob, len(self._outs), actor=True, workers=[w],
                                 allow_other_workers=False, pure=False) for w in ws]
        self._actors = [f.result(timeout=self.timeout) for f in fs]
        self._actor_futures = fs  # the actors live as long as these futures are held
        self._actor_workers, self._actors_checked = ws, time.monotonic()
        self._shm_workers = all(w.startswith(_SAME_MACHINE) for w in ws)
      # the whole round (every chunk out, every result back) is one coroutine on the client's event loop: one
      # hand-off between this thread and the loop per call, not two per chunk (ActorFuture.result is a sync() each)
      shared = self.shared_memory and self._shm_workers and self._shm_lock.acquire(blocking=False)
      try:
        packed = None
        if shared:
          from .shared_arrays import Writer
          if self._writer is None: self._writer = Writer()
          packed = self._writer.pack(per_chunk)
        return self.client.sync(self._actor_round, per_chunk, packed)
      finally:
        if shared: self._shm_lock.release()
    except Exception as e:  # noqa: BLE001 -- sorted below
      # a worker went away (a closed connection: OSError, which includes TimeoutError, or CommClosedError; an actor
      # or its data lost): the call runs as tasks instead, which Dask re-runs elsewhere under their own deadline.
      # An error raised by the program itself is the caller's.
      if not (isinstance(e, (OSError, dist.comm.CommClosedError)) or _worker_loss(e)): raise
      self._actors = self._actor_futures = None
      return None

  async def _actor_round(self, per_chunk: list[list], packed: tuple | None = None) -> list:
    """On the client's event loop: chunk c sent to actor c mod n (each actor runs its chunks in order), the results
    in chunk order. _Lost when an actor's worker went away or the call's timeout passed.

    Each chunk goes straight to its actor's worker over the client's own connections (the worker's `actor_execute`
    handler, which an Actor method call uses too): a Dask Actor bound to a client without `direct_to_workers=True`
    -- Dask's default -- sends every call through the scheduler (its `proxy` handler), which receives the chunk's
    arrays, sends them on, and does the same with the results: twice the bytes moved and a hop each way."""
    import asyncio
    from distributed.protocol import to_serialize
    from .shared_arrays import NoSharedMemory
    dist = _dask()
    keys, workers = [f.key for f in self._actor_futures], self._actor_workers

    async def one(c: int, a: list):
      k = c % len(keys)
      fn, args = ("run", a) if packed is None else ("run_shared", [packed[0], packed[1][c], *packed[2][c]])
      for _ in range(2):
        try:
          r = await self.client.rpc(workers[k]).actor_execute(function=fn, actor=keys[k],
                                                               args=[to_serialize(v) for v in args], kwargs={})
        except (OSError, dist.comm.CommClosedError) as e:
          raise _Lost(f"chunk {c}: the worker {workers[k]} of its actor went away ({type(e).__name__}: {e})") from e
        if r["status"] == "OK": return r["result"]
        if not (fn == "run_shared" and isinstance(r["exception"], NoSharedMemory)): raise r["exception"]
        self._shm_workers = False  # a worker that cannot map this machine's shared memory: arrays go by socket
        fn, args = "run", a
    tasks = [asyncio.ensure_future(one(c, a)) for c, a in enumerate(per_chunk)]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + self.timeout
    try:
      pending = set(tasks)
      while pending:
        left = deadline - loop.time()
        if left <= 0: raise _Lost()  # an actor silent for the call's whole timeout counts as lost
        done, pending = await asyncio.wait(pending, timeout=min(left, _ACTOR_POLL))
        # every finished chunk's error is read (asyncio would log an unread one when the task is collected) and the
        # lowest-numbered one's raised: a program's own error
        errs = [e for t in tasks if t in done and (e := t.exception()) is not None]
        if errs: raise errs[0]
        # an actor whose worker died may not answer at all: Dask then waits for the actor to be made again, which
        # never happens on a worker that is gone. Its creation task's state tells.
        if pending and any(f.status != "finished" for f in self._actor_futures or ()): raise _Lost()
      return [t.result() for t in tasks]
    finally:
      for t in tasks:
        if not t.done(): t.cancel()
      tasks.clear()  # a raised error's traceback holds this frame: no cycle back to the tasks and their results

  def _chunks(self, arrays, nchunks: int) -> list[dict]:
    """Per chunk, the batch inputs' pieces: numpy slices, or futures of pieces made where the data lives."""
    client, c = self.client, self.chunk
    out: list[dict] = [{} for _ in range(nchunks)]
    for i in self._batch:
      a = arrays[i]
      if _is_dask_array(a):
        a = a.rechunk({0: c, **{d: -1 for d in range(1, a.ndim)}})
        blocks = client.compute(list(a.to_delayed().ravel()))
        for k, f in enumerate(blocks): out[k][i] = f
      else:
        a = np.asarray(a)
        for k in range(nchunks): out[k][i] = a[k * c:(k + 1) * c]
    return out

  def _shared(self, arrays, nchunks: int) -> dict:
    """The inputs every chunk reads whole. Small ones ride along with each chunk's task (cheaper than a round trip);
    larger ones are sent to every worker once per call, in one scatter; futures and Dask arrays stay in place."""
    res, big = {}, {}
    for i, a in enumerate(arrays):
      if i in self._batch: continue
      if _is_future(a): res[i] = a
      elif _is_dask_array(a): res[i] = self.client.compute(a)
      else:
        a = np.asarray(a)
        if a.nbytes * nchunks <= _INLINE_BYTES: res[i] = a
        else: big[i] = a
    if big: res.update(zip(big, self.client.scatter(list(big.values()), broadcast=True, hash=False)))
    return res

  def _combine(self, j: int, parts: list):
    how = self.reduce[j]
    if len(parts) == 1: return parts[0]
    if how == "concat": return np.concatenate(parts, axis=0)
    acc = parts[0].copy()
    for p in parts[1:]: acc += p  # in chunk order: the same sum whichever worker finished first
    if how == "mean":
      acc = (acc / len(parts)).astype(parts[0].dtype, copy=False)  # equal chunks: weights n_i/N = 1/len(parts)
    return acc


def _name(u: UOp) -> str:
  if u.op is Ops.BUFFER and len(u.arg) > 3 and u.arg[3]: return repr(u.arg[3])
  if u.op is Ops.DEFINE_VAR: return repr(u.arg[0])
  return f"{u.op.name}{tuple(u.shape)}"


# ---------------------------------------------------------------------------------------------------------------
# MULTI devices as workers

def _home(u: UOp) -> str | None:
  """The device whose worker computes u: its device, the first shard's device for a MULTI value, None for nodes
  that have no device (constants, tuples, FUNCTIONs): those are computed wherever their user is."""
  d = u.device
  return d if type(d) is str else d[0] if type(d) is tuple and d else None


class _Part:
  """One device's part of a placed graph: the value of `node`, computed on the worker of `home` from the values of
  the parts it reads (`reads`, other devices' nodes) and the graph inputs it holds (`inputs`)."""
  __slots__ = ("node", "home", "reads", "inputs")

  def __init__(self, node: UOp, home: str):
    self.node, self.home, self.reads, self.inputs = node, home, [], []


def _split(outs: list[UOp], default: str) -> list[_Part]:
  """The parts of a graph, sources before users: each output is a part, and so is every node read across a device
  boundary (a COPY's source, a MULTI's shard, an input on another device). Iterative."""
  parts: dict[UOp, _Part] = {}
  todo = [(o, _home(o) or default) for o in outs]
  while todo:
    r, h = todo.pop()
    if r in parts: continue
    p = parts[r] = _Part(r, h)
    if r.op in _INPUT_OPS:
      p.inputs.append(r)
      continue
    seen, stack = {r}, [r]
    while stack:
      u = stack.pop()
      for s in (u.src[1:] if u.op in (Ops.FUNCTION, Ops.CALL) else u.src):
        if s in seen: continue
        seen.add(s)
        hs = _home(s)
        if hs is not None and hs != h:
          p.reads.append(s)
          todo.append((s, hs))
        elif s.op in _INPUT_OPS: p.inputs.append(s)
        else: stack.append(s)
  order = {u: i for i, u in enumerate(UOp.sink(*outs).toposort(enter_calls=False))}
  return sorted(parts.values(), key=lambda p: order[p.node])


def _placement(client, devices: set[str], placement) -> dict[str, str]:
  """Device -> worker address: as given (an address or an index into the sorted workers), else round-robin."""
  workers = _workers(client)
  if placement is None: return {d: workers[i % len(workers)] for i, d in enumerate(sorted(devices))}
  if not isinstance(placement, dict): raise TypeError(f"placement must be a dict, got {placement!r:.80}")
  res = {}
  for d in sorted(devices):
    if d not in placement: raise ValueError(f"placement: device {d!r} is used by the graph but not placed")
    w = placement[d]
    if isinstance(w, int) and not isinstance(w, bool):
      if not 0 <= w < len(workers): raise ValueError(f"placement: worker index {w} for {d!r} out of range "
                                                     f"({len(workers)} workers)")
      w = workers[w]
    if w not in workers: raise ValueError(f"placement: {d!r} is placed on {w!r}, which is not a worker ({workers})")
    res[d] = w
  return res


def evaluate(outputs, inputs: dict | None = None, client=None, placement: dict | None = None,
             engine: str | None = None, timeout: float = 600.0):
  """Evaluate a graph whose nodes live on several devices (`shard`, `copy_to_device`) with each device on a Dask
  worker: `placement` maps a device name to a worker (address, or index into the sorted worker addresses;
  default: devices round-robin over the workers). The graph is split by device; each part runs on its device's
  worker (compiled there once), the inputs are sent to the workers of their devices, and a value read across devices
  (a COPY, a MULTI's shards) moves between workers. The result mirrors `outputs` as `pygrad.evaluate`'s does and
  equals it; ops on a MULTI value run on the worker of its first device, which reads the shards."""
  import pygrad
  if client is None: raise TypeError("pygrad.distributed.evaluate: a Dask client is required")
  outs, single = _outputs(outputs)
  inputs = {} if inputs is None else inputs
  if not isinstance(inputs, dict): raise TypeError(f"evaluate: inputs must be a dict, got {type(inputs).__name__}")
  devices = {h for u in UOp.sink(*outs).toposort(enter_calls=False) if (h := _home(u)) is not None}
  place = _placement(client, devices or {"CPU"}, placement)
  if engine is None:  # this process's default, so the workers compute what pygrad.evaluate computes here
    from .engine import default_engine
    engine = default_engine()
  parts = _split(outs, min(place))
  futs: dict[UOp, Any] = {}
  for p in parts:
    w = place[p.home]
    if p.node.op in _INPUT_OPS:  # an input: its data goes to its device's worker once
      if p.node not in inputs: raise ValueError(f"evaluate: no value bound for input {_name(p.node)}")
      futs[p.node] = client.scatter(inputs[p.node], workers=[w], hash=False) if p.node.op is Ops.BUFFER else \
        inputs[p.node]
      continue
    stand_ins = [UOp.placeholder(s.shape, s.dtype, name=f"from {_home(s)}", device=_home(s)) for s in p.reads]
    node = p.node.substitute(dict(zip(p.reads, stand_ins))) if p.reads else p.node
    ins = stand_ins + p.inputs
    blob = pygrad.dumps([node] + ins)
    args = [futs[s] for s in p.reads]
    for u in p.inputs:
      if u not in inputs: raise ValueError(f"evaluate: no value bound for input {_name(u)}")
      args.append(inputs[u])
    futs[p.node] = client.submit(_evaluate_one, _content_key(blob), blob, engine, *args, workers=[w], pure=False)

  def lost(i):
    raise RuntimeError(f"pygrad.distributed.evaluate: output {i}'s worker was lost; workers now: {_workers(client)}")
  res = _gather_in_order(client, [futs[o] if _is_future(futs[o]) else client.submit(_identity, futs[o])
                                  for o in outs], lost, timeout, 0)
  return res[0] if single else res


def _evaluate_one(key: str, blob: bytes, engine: str | None, *arrays):
  return _evaluate_part(key, blob, 1, engine, *arrays)[0]


def _identity(x): return x


# ---------------------------------------------------------------------------------------------------------------
# many gradients at once

def map_gradients(client, graphs, targets, timeout: float = 600.0) -> list[list[UOp]]:
  """The gradients of many independent graphs, derived on the workers in parallel: `graphs` is a list of scalar
  roots, `targets` a list (one per graph) of target lists, or one list of targets shared by every graph. Each graph
  travels to a worker as bytes, its gradients come back the same way; the result is one list of gradient UOps per
  graph, the same nodes `root.gradient(*targets)` makes here."""
  import pygrad
  graphs = list(graphs)
  for i, g in enumerate(graphs):
    if not isinstance(g, UOp): raise TypeError(f"map_gradients: graph {i} is not a UOp: {g!r:.80}")
  tl = list(targets)
  if all(isinstance(t, UOp) for t in tl): per = [tl] * len(graphs)
  else: per = [list(t) for t in tl]
  if len(per) != len(graphs):
    raise ValueError(f"map_gradients: {len(graphs)} graphs but {len(per)} target lists")
  blobs = [pygrad.dumps([g, *t]) for g, t in zip(graphs, per)]

  def submit(i): return client.submit(_gradients, blobs[i], [len(per[i])], pure=False)
  out = _gather_in_order(client, [submit(i) for i in range(len(graphs))], submit, timeout, 3)
  return [list(pygrad.loads(b)) for b in out]
