"""pygrad.shared_arrays: a call's arrays handed to a worker process on the same machine through shared memory."""
import numpy as np
import pytest
from pygrad import shared_arrays as sa


def _roundtrip(w, per_chunk):
  name, layouts, inline = w.pack(per_chunk)
  r = sa.Reader()
  return name, layouts, [r.arrays(name, lay, tuple(rest))[0] for lay, rest in zip(layouts, inline)], r


def test_arrays_arrive_bit_for_bit_and_read_only():
  rng = np.random.default_rng(0)
  x = rng.standard_normal((64, 48)).astype(np.float32)
  wt = rng.standard_normal((48, 40))  # float64
  strided = rng.integers(0, 255, (200, 300), dtype=np.uint8)[::2, 1::3]  # not contiguous: copied element by element
  h = (rng.standard_normal((70, 70)) * 100).astype(np.float16)
  c = (rng.standard_normal(600) + 1j).astype(np.complex64)
  per_chunk = [[x[:32], wt, strided, h, c, 3.5], [x[32:], wt, strided, h, c, 7]]
  w = sa.Writer()
  try:
    _, layouts, got, _r = _roundtrip(w, per_chunk)
    for args, g in zip(per_chunk, got):
      assert len(g) == len(args)
      for a, b in zip(args, g):
        if isinstance(a, np.ndarray):
          assert b.dtype == a.dtype and b.shape == a.shape and b.tobytes() == a.tobytes()
          assert not b.flags.writeable
          with pytest.raises(ValueError): b[(0,) * b.ndim] = 0
        else:
          assert b == a  # not an array: travels with the call
    # an array every chunk reads (the same object) lies in the segment once, at one offset
    assert layouts[0][1][0] == layouts[1][1][0] and layouts[0][0][0] != layouts[1][0][0]
    assert all(lay[5] is None for lay in layouts)
  finally:
    w.close()


def test_small_and_odd_arrays_travel_with_the_call():
  w = sa.Writer()
  try:
    small = np.arange(10, dtype=np.float32)  # below MIN_BYTES
    obj = np.array([object()] * 1000)
    rec = np.zeros(1000, dtype=[("a", np.float32), ("b", np.int32)])
    assert w.pack([[small, obj, rec, "s"]]) is None  # nothing for the segment: no segment made
    assert w.seg is None
  finally:
    w.close()


def test_a_bigger_call_gets_a_new_segment_and_the_reader_follows_it():
  w = sa.Writer()
  try:
    a = np.ones(1 << 16, np.float64)  # 512 KiB: fits the first 1 MiB segment
    name1, _, got1, r = _roundtrip(w, [[a]])
    assert got1[0][0].tobytes() == a.tobytes()
    b = np.full(1 << 18, 2.0)  # 2 MiB: a new, bigger segment; the old one is unlinked
    name2, lay2, inline2 = w.pack([[b]])
    assert name2 != name1
    got2 = r.arrays(name2, lay2[0], tuple(inline2[0]))[0]
    assert got2[0].tobytes() == b.tobytes()
    with pytest.raises(sa.NoSharedMemory, match=name1):
      sa.Reader().arrays(name1, [], ())
  finally:
    w.close()


def test_a_closed_writer_leaves_nothing_to_map():
  w = sa.Writer()
  name, _, _ = w.pack([[np.ones(4096, np.float32)]])
  w.close()
  with pytest.raises(sa.NoSharedMemory):
    sa.Reader().arrays(name, [], ())


def test_no_room_in_shared_memory_means_the_arrays_go_with_the_call(monkeypatch):
  # a full /dev/shm (64 MiB in a default Docker container): writing past it would be SIGBUS, so the segment's
  # pages are reserved first, and when that fails nothing is left behind and the caller sends the arrays itself
  import errno, os

  def full(fd, offset, size):
    raise OSError(errno.ENOSPC, "No space left on device")
  monkeypatch.setattr(os, "posix_fallocate", full)
  w = sa.Writer()
  assert w.pack([[np.ones(1 << 16, np.float32)]]) is None
  assert w.seg is None
  w.close()
