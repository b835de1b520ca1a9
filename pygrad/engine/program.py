"""Compiled programs on the C interpreter: `compile_program(outputs, inputs)` plans a graph once (flatten, plan,
lower, place buffers by liveness) and `program(*arrays)` runs it with one call into C per segment -- one segment
unless the graph has CALLs, whose Python kernels run between segments. `evaluate_c` is compile-and-run-once."""
from __future__ import annotations
import bisect, contextlib, gc, heapq, mmap, os
from itertools import compress, chain, repeat
from operator import attrgetter
from typing import Any
import numpy as np
from ..ops import Ops
from ..uop import UOp
from ..dtype import dtypes
from . import vmlib
from .vmlib import ffi, lib
from ..ids import value
from ..pages import small_pages
from .flatten import LazyNodes, flatten
from .planner import Planner, Loop, CallStep, Buf, compute_dtype
from .lower import Part, VK_GEMM
from .kcache import KernelCache, Words, assemble
from .npkernel import NumpyKernel
from .layout import relayout
from .epilogue import fuse_epilogues
from .fastcall import MISS, make_fast_call
from .values import input_value, round_bfloat16, bindings, map_nested

_MAGIC, _VERSION = value("consts", "VM_MAGIC"), value("consts", "VM_VERSION")
VM_MAXSIZE = value("consts", "VM_MAXSIZE")  # csrc/tables.h: the bytes of a memory slot (the arena is one)
from_buffer, NULL = ffi.from_buffer, ffi.NULL
_ALIGN = 64
_BUF_ID, _BUF_KIND, _BUF_NBYTES = attrgetter("id"), attrgetter("kind"), attrgetter("nbytes")
_BUF_INDEX, _BUF_OFFSET = attrgetter("index"), attrgetter("offset")
_MAP_MIN = 1 << 17  # arenas of this many bytes or more are mapped pages (glibc's default mmap threshold)
_TRIM_NODES = 20_000  # graphs whose plan gives its freed heap pages back to the OS (see Program.__init__)


def _memory_bytes() -> int | None:
  """This machine's physical memory, or None where the OS does not say (no check then)."""
  try: return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  except (AttributeError, ValueError, OSError): return None


def _check_memory(arena_bytes: int, bufs: list[Buf]) -> None:
  """Before anything is allocated: ValueError when the arena (every internal buffer live at once, at its high-water
  mark) passes the VM's bound on a memory slot, MemoryError when the program's buffers (the arena and the outputs)
  exceed the machine's memory; both name the largest buffer."""
  big = [b for b in bufs if b.kind in ("arena", "output")]
  top = max(big, key=lambda b: b.nbytes) if big else None
  if arena_bytes > VM_MAXSIZE:
    raise ValueError(f"pygrad VM: the program's internal buffers need {arena_bytes:,} bytes at once, past the VM's "
                     f"2**{VM_MAXSIZE.bit_length() - 1}; the largest is {top.describe()} ({top.nbytes:,} bytes)")
  mem = _memory_bytes()
  if mem is None: return
  total = arena_bytes + sum(b.nbytes for b in big if b.kind == "output")
  if total <= mem: return
  raise MemoryError(f"pygrad VM: the program's buffers need {total:,} bytes, more than this machine's {mem:,}; the "
                    f"largest is {top.describe()} ({top.nbytes:,} bytes)")


class _Holes:
  """The free blocks of the arena below its high-water mark: `take` is best fit (the smallest block that fits, the
  lowest offset among blocks of that size), `free` coalesces a block with its free neighbours; both O(log n), as a
  plan of 100k kernels frees as many blocks (a scan of every hole per buffer was quadratic)."""

  def __init__(self):
    self.size_at: dict[int, int] = {}  # offset -> size of the block there
    self.start_of: dict[int, int] = {}  # end offset -> offset of the block ending there
    self.sizes: list[int] = []  # the distinct sizes of the blocks, ascending
    self.count: dict[int, int] = {}  # blocks per size
    self.heaps: dict[int, list[int]] = {}  # size -> offsets of blocks of that size (entries of taken blocks linger)

  def _add(self, off: int, sz: int) -> None:
    self.size_at[off], self.start_of[off + sz] = sz, off
    heapq.heappush(self.heaps.setdefault(sz, []), off)
    c = self.count.get(sz, 0)
    if c == 0: bisect.insort(self.sizes, sz)
    self.count[sz] = c + 1

  def _remove(self, off: int) -> int:
    sz = self.size_at.pop(off)
    del self.start_of[off + sz]
    c = self.count[sz] = self.count[sz] - 1
    if c == 0: del self.sizes[bisect.bisect_left(self.sizes, sz)]
    return sz

  def take(self, need: int) -> int | None:
    """The offset of a block of `need` bytes cut from the best fitting hole, or None if none is large enough."""
    i = bisect.bisect_left(self.sizes, need)
    if i == len(self.sizes): return None
    sz = self.sizes[i]
    h = self.heaps[sz]
    off = heapq.heappop(h)
    while self.size_at.get(off) != sz: off = heapq.heappop(h)  # skip the entries of blocks taken since
    self._remove(off)
    if sz > need: self._add(off + need, sz - need)
    return off

  def free(self, off: int, sz: int) -> None:
    prev = self.start_of.get(off)
    if prev is not None: off, sz = prev, sz + self._remove(prev)
    if off + sz in self.size_at: sz += self._remove(off + sz)
    self._add(off, sz)


_PLACE_C_MIN = 256  # plans of this many kernels or more are placed in C (csrc/place.c): the same offsets


def _used(k) -> list[Buf]:
  """The buffers a kernel names, in order (a planned Loop's stores then loads; a step's bufs)."""
  return [s.buf for s in k.stores] + [x.buf for x in k.loads] if isinstance(k, Loop) else k.bufs


def _place(kernels: list, bufs: list[Buf]) -> int:
  """Arena offsets for the internal buffers by liveness (first write to last use); returns the arena size. Kernels
  are planned Loops or program steps (lowered Parts, CallSteps, NumpyKernels: each names its buffers). A large plan
  is placed in C (_place_c)."""
  if len(kernels) >= _PLACE_C_MIN: return _place_c(kernels, bufs)
  first, last = {}, {}
  for i, k in enumerate(kernels):
    used = _used(k)
    for b in used:
      if b.kind != "arena": continue
      first.setdefault(b.id, i)
      last[b.id] = i
  frees: dict[int, list[Buf]] = {}
  for bid, i in last.items(): frees.setdefault(i, []).append(bufs[bid])
  starts: dict[int, list[Buf]] = {}
  for bid, i in first.items(): starts.setdefault(i, []).append(bufs[bid])
  holes = _Holes()
  top = 0
  for i in range(len(kernels)):
    for b in starts.get(i, ()):
      need = max(_ALIGN, -(-b.nbytes // _ALIGN) * _ALIGN)
      off = holes.take(need)
      if off is None:
        off = top
        top += need
      b.offset = off
    for b in frees.get(i, ()): holes.free(b.offset, max(_ALIGN, -(-b.nbytes // _ALIGN) * _ALIGN))
  return top


def _place_c(kernels: list, bufs: list[Buf]) -> int:
  """_place's offsets and arena size from csrc/place.c: the kernels' buffer ids and the buffers' kinds and sizes as
  arrays, one call (made through map: a gradient has tens of thousands of kernels)."""
  us = [k.bufs if type(k) is Part else _used(k) for k in kernels]
  c = np.fromiter(map(len, us), np.int32, len(us))
  i = np.fromiter(map(_BUF_ID, chain.from_iterable(us)), np.int32, int(c.sum()))
  arena = np.fromiter(map("arena".__eq__, map(_BUF_KIND, bufs)), np.uint8, len(bufs))
  need = np.fromiter(map(_BUF_NBYTES, bufs), np.int64, len(bufs))
  need = np.maximum(_ALIGN, -(-need // _ALIGN) * _ALIGN)
  offset = np.zeros(len(bufs), np.int64)
  top = lib.pg_place(len(c), from_buffer("int32_t[]", c), from_buffer("int32_t[]", i), len(i), len(bufs),
                     from_buffer("uint8_t[]", arena), from_buffer("int64_t[]", need), from_buffer("int64_t[]", offset))
  if top == lib.PG_ERR_NOMEM: raise MemoryError(f"pygrad VM: no memory to place {len(bufs)} buffers")
  if top < 0: raise RuntimeError(f"pygrad VM: the placement of {len(bufs)} buffers was refused ({top})")
  placed = np.zeros(len(bufs), bool)
  placed[i[arena[i] != 0]] = True
  for b, o in zip(compress(bufs, placed.tolist()), offset[placed].tolist()): b.offset = o
  return top


_KIND = {"arena": 0, "const": 1, "input": 2}  # (any other kind: an output, 3)


def _slot_table(bufs: list[Buf], nin: int, slot_size: list) -> tuple[list, np.ndarray]:
  """Per buffer id its slot (0: the arena, 1: the constants' pool, then the inputs' and the outputs'), and the
  program's buffer table (slot, offset, bytes per buffer); the inputs' and outputs' sizes go into slot_size. As
  columns: a gradient plans tens of thousands of buffers."""
  n = len(bufs)
  kind = np.fromiter(map(_KIND.get, map(_BUF_KIND, bufs), repeat(3)), np.int64, n)
  index = np.fromiter(map(_BUF_INDEX, bufs), np.int64, n)
  nbytes = np.fromiter(map(_BUF_NBYTES, bufs), np.int64, n)
  slot = np.where(kind == 2, 2 + index, np.where(kind == 3, 2 + nin + index, kind))
  io = np.flatnonzero(kind >= 2)
  for k, nb in zip(slot[io].tolist(), nbytes[io].tolist()): slot_size[k] = nb
  table = np.stack([slot, np.fromiter(map(_BUF_OFFSET, bufs), np.int64, n), nbytes], 1).ravel()
  return slot.tolist(), table


@contextlib.contextmanager
def _no_cycle_gc():
  """The cyclic collector paused while planning: a plan allocates a few small objects per node (PNodes, KNodes,
  views, words), none of them garbage, and with a large graph alive the collector's generation-2 passes walk every
  object of it again and again (40% of a 50k-node compile). Resumed after, unless the caller had paused it."""
  was = gc.isenabled()
  gc.disable()
  try: yield
  finally:
    if was: gc.enable()


def _raise_rc(rc: int) -> None:
  """The error of a failed C run (rc < 0)."""
  raise MemoryError("pygrad VM: out of memory") if rc == lib.PG_ERR_NOMEM else \
      RuntimeError(f"pygrad VM: run failed with error {rc}")


class Program:
  """A graph planned for the C interpreter. Call it with one array per input (in `inputs` order); its result mirrors
  `outputs`: a UOp gives an array, a list/tuple a list of the same length (one element included); a TUPLE, SINK or
  FUNCTION output gives a tuple (nested as deep as the graph nests them).

  `stats`: "kernels" (VM kernels: loops and contractions), "fused_groups" (kernels computing at least one ALU op
  or a contraction), "peak_bytes" (the arena of internal buffers at its high-water mark: every temporary the
  program holds; inputs and outputs excluded), "contractions" (matmuls run blocked), "segments" (C calls per run:
  one plus one per CALL or numpy kernel), "numpy_kernels" (kernels whose index space has more dims than the VM takes
  even after merging, run by numpy between C segments), "spills" (values carried in arena buffers between the
  kernels of a fused group split because its register file would pass lower.REGFILE_BUDGET)."""

  def __init__(self, outputs: UOp | list[UOp], inputs: list[UOp], keep_words: bool = False):
    self._single = isinstance(outputs, UOp)
    outputs = [outputs] if self._single else list(outputs)
    self._outputs = outputs[0] if self._single else outputs  # what pickle writes: the graph, compiled again on load
    for u in inputs:
      if not isinstance(u, UOp) or u.op not in (Ops.BUFFER, Ops.DEFINE_VAR, Ops.PARAM):
        raise ValueError(f"compile: inputs must be BUFFER or DEFINE_VAR nodes, got {getattr(u, 'op', u)!r}")
    self.inputs = list(inputs)
    with _no_cycle_gc(), small_pages(): self.nodes = self._plan(outputs, keep_words)
    # planning made ~1 KB of short-lived Python objects per node, now freed; glibc keeps freed heap pages that lie
    # below live blocks for good, so a long-running process planning big graphs would hold its largest plan's
    # transient memory forever (csrc/mem.c, pg_mem_trim): under 1 ms after a plan of 0.4 s (20k nodes) or more
    if self.nodes >= _TRIM_NODES: lib.pg_mem_trim()

  def _plan(self, outputs: list[UOp], keep_words: bool) -> int:
    """Plans the graph; returns its node count."""
    nodes, shaped, cols = flatten(outputs, columns=True)
    try: return self._plan_nodes(nodes, shaped, cols, keep_words)
    finally:
      if type(nodes) is LazyNodes: nodes.release()

  def _plan_nodes(self, nodes, shaped, cols, keep_words: bool) -> int:
    """_plan's work on the flattened graph."""
    lowering = KernelCache()  # (small kernels walked in C come out of the planner lowered by it)
    pl = Planner(nodes, shaped, self.inputs, cols, lowering)
    self._shaped = pl.outputs
    self._out_bufs = sorted((b for b in pl.bufs if b.kind == "output"), key=lambda b: b.index)
    # lowering first: a loop whose register file would be too large is split, with arena buffers of its own
    nplanned = len(pl.bufs)

    def spill_buf(stype, shape, dtype): return pl._buf("arena", stype, shape, dtype)
    steps, nnp = [], 0
    for k in pl.kernels:
      if isinstance(k, Loop):
        parts = lowering.lower(k, spill_buf)
        if parts is not None:
          steps += parts
          continue
        k = NumpyKernel(k)  # more dims or registers than the VM takes: a numpy step between two C segments
        nnp += 1
      steps.append(k)
    relayout(steps)  # (a weight's gradient stored as its update reads it)
    fuse_epilogues(steps)  # (the loops after a contraction run on its tiles)
    self.arena_bytes = _place(steps, pl.bufs)
    _check_memory(self.arena_bytes, pl.bufs)
    # (named in errors until here) no buffer keeps the graph alive, nor a cycle
    for b in pl.bufs: b.node = None
    pool, consts = 0, []
    for b in pl.bufs:
      if b.kind == "const":
        b.offset = pool
        consts.append(b)
        pool += 8
    self._pool = np.zeros(max(pool, 8), np.uint8)
    for b in consts: self._pool[b.offset:b.offset + b.nbytes] = np.frombuffer(b.data.tobytes(), np.uint8)
    nin = len(self.inputs)
    self._nslots = 2 + nin + len(self._out_bufs)
    slot_size = [self.arena_bytes, len(self._pool)] + [0] * (nin + len(self._out_bufs))
    self._slot_of, table = _slot_table(pl.bufs, nin, slot_size)
    head = [_MAGIC, _VERSION, self._nslots, len(pl.bufs)]
    self._slot_sizes = slot_size
    self._steps, seg, nk, nfused, ngemm = [], [], 0, 0, 0
    for k in steps + [None]:
      if isinstance(k, Part):
        w = k.words
        seg.append(w)
        nk, nfused, ngemm = nk + 1, nfused + k.fused, ngemm + ((w.kind if type(w) is Words else w[0]) == VK_GEMM)
        continue
      if seg:
        code = assemble(np.concatenate([np.array(head + [len(seg)] + slot_size, np.int64), table]), seg)
        self._steps.append(vmlib.prepare(code))
        if keep_words: self._words = code.tolist()  # the last segment's program, for tests of the C validator
        seg = []
      if k is not None: self._steps.append(k)
    self.stats = {"kernels": nk, "fused_groups": nfused, "peak_bytes": self.arena_bytes, "contractions": ngemm,
                  "segments": sum(1 for s in self._steps if not isinstance(s, (CallStep, NumpyKernel))),
                  "numpy_kernels": nnp, "spills": len(pl.bufs) - nplanned}
    # run state (arena, slot table): a free list of one; a call pops it, or makes a private one while another thread
    # runs this program, and puts it back after (list.pop/append are atomic: no lock on the call path)
    self._free: list = []
    self._made = False
    self._in_spec = [(u.shape, np.dtype(u.dtype.numpy), u.op is Ops.BUFFER and u.dtype is not dtypes.bfloat16)
                     for u in self.inputs]
    self._out_spec = [(b.shape, b.stype.numpy) for b in self._out_bufs]
    # the common program: one C segment and plain array outputs. Its call skips the general step loop and the walk
    # of nested outputs: the output at position i is buffer `_flat[i][0]` reshaped to `_flat[i][1]`
    plain = len(self._steps) == 1 and not isinstance(self._steps[0], (CallStep, NumpyKernel)) and \
        all(o is not None and type(o) is not tuple for o in self._shaped)
    # (shape None: the buffer is made in the output's shape, no reshape needed)
    self._flat = [(o.buf.index, None if o.shape == self._out_spec[o.buf.index][0] else o.shape)
                  for o in self._shaped] if plain else None
    # the lean call (fastcall.py), made at the second call: a plain program whose inputs are all arrays of a
    # planned shape and dtype and whose buffers are all non-empty
    self._lean = plain and all(f for _, _, f in self._in_spec) and all(sz > 0 for sz in slot_size[2:])
    self._fast, self._ncalls = None, 0
    return len(nodes)

  def __reduce__(self):
    """A program pickles as its graph and inputs (in pygrad's format, through the UOps' pickling) and is compiled
    again when loaded: its C programs and arena are this process's memory, and the plan is a function of the graph."""
    return compile_program, (self._outputs, self.inputs)

  def _arena_array(self) -> np.ndarray:
    if self.arena_bytes >= _MAP_MIN:
      # the OS's pages (page-aligned), as csrc/mem.c maps the VM's workspace: glibc serves a block this large by mmap
      # too, but freeing it raises glibc's mmap threshold to its size (up to 32 MiB), and from then on the process's
      # large mallocs come from the heap, which keeps their pages (a 4.9 MB arena did that once the program died)
      return np.frombuffer(mmap.mmap(-1, self.arena_bytes), np.uint8)
    a = np.empty(self.arena_bytes + _ALIGN, np.uint8)
    off = (-a.ctypes.data) % _ALIGN
    return a[off:off + self.arena_bytes]

  @staticmethod
  def _check(u: UOp, v) -> np.ndarray:
    return np.require(input_value(u, v), requirements="CA")  # C-contiguous and aligned, as the VM's loads need

  def _fixed_slots(self, arena):
    n = self._nslots
    slots, sizes = ffi.new("void *[]", n), ffi.new("int64_t[]", n)
    keep = [arena]
    for i, a in enumerate((arena, self._pool)):
      if a.nbytes:
        keep.append(ffi.from_buffer(a))
        slots[i] = keep[-1]
      sizes[i] = a.nbytes
    sizes[2:n] = self._slot_sizes[2:n]
    return slots, sizes, keep

  def _take(self) -> tuple[Any, bool]:
    """The run state (slot table with the planned sizes, sizes, kept arena) and whether to put it back after: the
    program's own, or a private one while another thread runs the program."""
    try:
      return self._free.pop(), True
    except IndexError:
      mine, self._made = not self._made, True
      return self._fixed_slots(self._arena_array()), mine

  def __call__(self, *arrays: Any) -> Any:
    fast = self._fast
    if fast is not None:
      res = fast(arrays)
      if res is not MISS: return res
    return self._call_general(arrays)

  def _call_general(self, arrays: tuple) -> Any:
    if len(arrays) != len(self.inputs):
      raise ValueError(f"program takes {len(self.inputs)} inputs, got {len(arrays)}")
    ins = []
    for u, v, (shape, npdt, fast) in zip(self.inputs, arrays, self._in_spec):
      if fast and type(v) is np.ndarray and v.dtype == npdt and v.shape == shape:
        f = v.flags
        if f.c_contiguous and f.aligned:
          ins.append(v)  # already what the VM reads: no conversion, no copy
          continue
      ins.append(self._check(u, v))
    outs = [np.empty(shape, dt) for shape, dt in self._out_spec]
    io = ins + outs
    keep = [from_buffer(a) if a.nbytes else NULL for a in io]  # (kept alive until the run returns)
    state, mine = self._take()
    slots, sizes, kept = state
    n = self._nslots
    try:
      if n > 2:
        slots[2:n] = keep
        sizes[2:n] = [a.nbytes for a in io]  # the sizes the VM checks: a converted input's own
      if self._flat is not None:  # one C segment: no step dispatch, no memory map
        self._vm_run(self._steps[0], slots, sizes, n)
      else:
        mem = [kept[0], self._pool] + io
        for st in self._steps:
          if isinstance(st, CallStep): self._call(st, mem)
          elif isinstance(st, NumpyKernel): st.run(lambda b: self._memory(mem, b))
          else: self._vm_run(st, slots, sizes, n)
    finally:
      if n > 2: sizes[2:n] = self._slot_sizes[2:n]  # the planned sizes again, which the lean call relies on
      if mine: self._free.append(state)
    self._ncalls += 1
    if self._lean and self._ncalls == 2:  # called again, likely many times: the lean call from now on
      self._fast = make_fast_call([(sh, dt) for sh, dt, _ in self._in_spec], self._out_spec, self._flat,
                                  self._single, self._steps[0], self._nslots, self._free, _raise_rc)
    if self._flat is not None:
      res = [outs[i] if shape is None else outs[i].reshape(shape) for i, shape in self._flat]
    else:
      res = [map_nested(o, lambda b: None if b is None else outs[b.buf.index].reshape(b.shape))
             for o in self._shaped]
    return res[0] if self._single else res

  @staticmethod
  def _vm_run(st, slots, sizes, n: int) -> None:
    rc = lib.pg_vm_run(st, slots, sizes, n)
    if rc < 0: _raise_rc(rc)

  def _memory(self, mem: list, b: Buf) -> np.ndarray:
    """Buffer b's storage in this run's memory, as a flat array of its storage type."""
    m = mem[self._slot_of[b.id]].reshape(-1).view(np.uint8)
    return m[b.offset:b.offset + b.nbytes].view(b.stype.numpy)

  def _call(self, st: CallStep, mem: list) -> None:
    views = []
    for b in st.bufs:  # the buffer's memory: in the arena, or an output array it became
      m = mem[self._slot_of[b.id]].reshape(-1).view(np.uint8)
      views.append(m[b.offset:b.offset + b.nbytes].view(compute_dtype(b.dtype).numpy).reshape(b.shape))
    arrays = [v.astype(b.dtype.numpy, copy=True) for v, b in zip(views, st.bufs)]
    st.fxn(*arrays)
    for v, a, b in zip(views, arrays, st.bufs):
      if a.shape != b.shape or a.dtype != b.dtype.numpy:
        raise ValueError(f"CALL {st.name!r}: the kernel changed a buffer to {a.shape}:{a.dtype}")
      v[...] = round_bfloat16(a) if b.dtype is dtypes.bfloat16 else a


def compile_program(outputs: UOp | list[UOp], inputs: list[UOp]) -> Program:
  """Plan `outputs` (a UOp, or a list of them) over `inputs` (BUFFER/DEFINE_VAR nodes, in the order the program
  takes arrays)."""
  return Program(outputs if isinstance(outputs, UOp) else list(outputs), list(inputs))


def evaluate_c(outputs: list[UOp], inputs: dict | None) -> list:
  """The values of outputs (a list) on the C interpreter, given a dict from BUFFER/DEFINE_VAR nodes to array-likes,
  validated by values.bindings as the numpy engine does: a valid binding the outputs do not use is ignored."""
  binds = bindings(inputs)
  keys = [k for k, _ in binds.values()]
  prog = Program(list(outputs), keys)
  res, big = prog(*[v for _, v in binds.values()]), prog.nodes >= _TRIM_NODES
  del prog  # a big program's tables (~0.6 KB per node) are heap the process would keep: trim after them too
  if big: lib.pg_mem_trim()
  return res


__all__ = ["Program", "compile_program", "evaluate_c"]
