"""numpy arrays handed to worker processes on the same machine through one POSIX shared-memory segment, instead of
being sent over a socket: the client copies a call's arrays into the segment once (an array every chunk reads, such
as a weight, once for all chunks) and sends each worker only where they lie; a worker maps the segment once and
reads them in place. On loopback this saves the socket's copies on both sides (the kernel's, the receiver's) and
the client's CPU time writing them, which on a small machine is the time the workers' runs wait for.

Used by pygrad.distributed for workers whose address is this machine's loopback; anything the segment cannot hold
(non-numpy values, dtypes numpy cannot name, small arrays) still travels with the call."""
from __future__ import annotations
import mmap, os, weakref
from multiprocessing import shared_memory
import numpy as np

ALIGN = 64  # bytes: each array starts on a cache line
MIN_BYTES = 4096  # smaller arrays ride along with the call (cheaper than a layout entry)


class NoSharedMemory(RuntimeError):
  """A worker could not map the client's segment (another machine, or another /dev/shm): send the arrays instead."""


def _shareable(a) -> bool:
  return type(a) is np.ndarray and a.nbytes >= MIN_BYTES and a.dtype.kind in "biufc" and not a.dtype.fields and \
    np.dtype(a.dtype.str) == a.dtype


def _unlink(seg: shared_memory.SharedMemory) -> None:
  try:
    seg.close()
  except BufferError:  # a view of it is still alive here: the mapping goes with the last view
    pass
  try:
    seg.unlink()
  except FileNotFoundError:
    pass


def _reserve(seg: shared_memory.SharedMemory, size: int) -> None:
  """Backs every page of a new segment now, or raises OSError: tmpfs hands pages out on first write, and a write
  past a full /dev/shm (64 MiB in a default Docker container) is SIGBUS, which kills the process, where
  posix_fallocate is ENOSPC. Without posix_fallocate (not Linux) the segment is not used."""
  fd = getattr(seg, "_fd", -1)
  if fd < 0 or not hasattr(os, "posix_fallocate"): raise OSError("no posix_fallocate for shared memory here")
  os.posix_fallocate(fd, 0, size)


class Writer:
  """The client's segment (one per DataParallel, grown when a call needs more). Not thread-safe: one call at a time
  (the caller holds a lock), and a call's arrays are overwritten only by the next call, after every worker answered
  the previous one."""

  def __init__(self):
    self.seg: shared_memory.SharedMemory | None = None
    self._finalizer = None

  def pack(self, per_chunk: list[list]) -> tuple[str, list[list], list[list]] | None:
    """Copies the shareable arrays of every chunk into the segment: (segment name, per chunk a layout -- per
    argument (offset, shape, dtype) or None -- and per chunk the arguments that travel with the call). None when no
    argument is shareable."""
    offsets: dict[int, int] = {}
    total = 0
    for args in per_chunk:
      for a in args:
        if id(a) not in offsets and _shareable(a):
          offsets[id(a)] = total
          total += -(-a.nbytes // ALIGN) * ALIGN
    if not offsets: return None
    seg = self._segment(total)
    if seg is None: return None  # no room in this machine's shared memory: the arrays go by socket
    written: set[int] = set()
    layouts, inline = [], []
    for args in per_chunk:
      lay, rest = [], []
      for a in args:
        off = offsets.get(id(a))
        if off is None:
          lay.append(None)
          rest.append(a)
          continue
        if id(a) not in written:
          np.copyto(np.ndarray(a.shape, a.dtype, buffer=seg.buf, offset=off), a, casting="no")
          written.add(id(a))
        lay.append((off, a.shape, a.dtype.str))
      layouts.append(lay)
      inline.append(rest)
    return seg.name, layouts, inline

  def _segment(self, size: int) -> shared_memory.SharedMemory | None:
    if self.seg is None or self.seg.size < size:
      self.close()
      size = max(size, 1 << 20)
      try:
        seg = shared_memory.SharedMemory(create=True, size=size)
      except OSError:  # no /dev/shm, or no room in it
        return None
      try:
        _reserve(seg, size)
      except OSError:
        _unlink(seg)
        return None
      self.seg = seg
      self._finalizer = weakref.finalize(self, _unlink, seg)  # unlinked when the writer goes, or at exit
    return self.seg

  def close(self) -> None:
    """Unlinks the segment (workers that mapped it keep their mapping until they map the next one)."""
    if self._finalizer is not None: self._finalizer()
    self.seg = self._finalizer = None


def _attach(name: str) -> mmap.mmap:
  """The segment `name` mapped read-only. Not through SharedMemory: before Python 3.13 that registers the segment
  with this process's resource tracker, which unlinks it -- the client's -- when this process exits (or, when the
  tracker is the client's own, takes the client's registration away)."""
  try:
    import _posixshmem
  except ImportError as e:  # not a POSIX system
    raise NoSharedMemory(f"cannot map the client's shared memory {name!r} here: no POSIX shared memory") from e
  try:
    fd = _posixshmem.shm_open("/" + name, os.O_RDONLY, mode=0o600)
  except OSError as e:
    raise NoSharedMemory(f"cannot map the client's shared memory {name!r}: {e}") from e
  try:
    return mmap.mmap(fd, os.fstat(fd).st_size, prot=mmap.PROT_READ)
  finally:
    os.close(fd)


class Reader:
  """A worker's read-only mapping of one client segment, replaced when the client's segment is (it grew, or
  another client)."""

  def __init__(self):
    self.name: str | None = None
    self.map: mmap.mmap | None = None

  def arrays(self, name: str, layout: list, inline: tuple) -> tuple[list, np.ndarray]:
    """The call's arguments: read-only views into the segment where `layout` says, the `inline` ones in between;
    and the whole segment as bytes (to tell a result that is a view of it)."""
    if self.name != name:
      old, self.map, self.name = self.map, _attach(name), name
      if old is not None:
        try:
          old.close()
        except BufferError:  # a view of the old segment is still alive: its mapping goes with the view
          pass
    whole = np.frombuffer(self.map, np.uint8)  # read-only, as the mapping is
    out, rest = [], iter(inline)
    for spec in layout:
      if spec is None:
        out.append(next(rest))
        continue
      off, shape, dt = spec
      dt = np.dtype(dt)
      n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
      if not 0 <= off <= off + n <= whole.nbytes: raise ValueError(f"shared arrays: {spec} lies outside {name!r}")
      out.append(whole[off:off + n].view(dt).reshape(tuple(shape)))
    return out, whole
