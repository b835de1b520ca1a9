"""A hypothesis fuzzer for pygrad.loads: valid blobs mutated (bytes overwritten, inserted, deleted, truncated), with the
checksum left wrong or recomputed so the mutation reaches the decoder. Loading must return UOps or raise ValueError:
never crash, hang or take unbounded memory. CI runs a small budget (also under ASan/UBSan); `PYGRAD_FUZZ=long`
runs 200,000 examples per test (hours): `PYGRAD_FUZZ=long python -m pytest -q tests/test_serialize_fuzz.py`."""
from __future__ import annotations
import os, struct, zlib
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
import pygrad
from pygrad import UOp, Ops, dtypes

LONG = os.environ.get("PYGRAD_FUZZ", "") == "long"
FUZZ = settings(max_examples=200_000 if LONG else 150, deadline=None, derandomize=not LONG,
                suppress_health_check=list(HealthCheck))


def _blobs() -> list[bytes]:
  x = UOp.placeholder((3, 4), dtypes.float32, name="x")
  with pygrad.metadata("f"):
    y = ((x * x).sin() + x.const_like(-0.0)).sum(axis=1).reshape((3,))
  (g,) = y.sum().gradient(x)
  p = x.param_like(0)
  f = (p * p).call(x).gettuple(0)
  v = UOp(Ops.DEFINE_VAR, dtypes.int64, (), ("n", -(1 << 70), (1, (2.5, "s"))))
  return [pygrad.dumps(u) for u in (y, g, f, v)] + [pygrad.dumps([y, g, f])]


BLOBS = _blobs()


def _seal(body: bytes) -> bytes:
  return body + struct.pack("<I", zlib.crc32(body))


def _check(data: bytes) -> None:
  try:
    out = pygrad.loads(data)
  except ValueError:
    return
  for u in (out if isinstance(out, list) else [out]):
    assert isinstance(u, UOp)
    len(u.toposort())


edit = st.tuples(st.sampled_from(["set", "insert", "delete"]), st.integers(0, 1 << 20), st.integers(0, 255))


@FUZZ
@given(st.sampled_from(range(len(BLOBS))), st.lists(edit, min_size=1, max_size=6), st.booleans(),
       st.integers(0, 1 << 20))
def test_mutated_blobs_load_or_raise_value_error(which, edits, reseal, cut):
  body = bytearray(BLOBS[which][:-4])
  for kind, pos, val in edits:
    pos %= len(body) + 1
    if kind == "set" and pos < len(body): body[pos] = val
    elif kind == "insert": body.insert(pos, val)
    elif kind == "delete" and pos < len(body): del body[pos]
  if cut % 3 == 0: body = body[:cut % (len(body) + 1)]
  _check(_seal(bytes(body)) if reseal else bytes(body) + BLOBS[which][-4:])


@FUZZ
@given(st.sampled_from(range(len(BLOBS))), st.integers(0, 95), st.integers(0, (1 << 64) - 1))
def test_lying_header_fields(which, at, value):
  body = bytearray(BLOBS[which][:-4])
  field = at // 8 * 8  # an 8-byte window of the header, overwritten with any value
  body[field:field + 8] = value.to_bytes(8, "little")
  _check(_seal(bytes(body[:len(BLOBS[which]) - 4])))


@pytest.mark.parametrize("which", range(len(BLOBS)))
def test_blobs_are_valid(which):
  assert pygrad.loads(BLOBS[which]) is not None


@pytest.mark.skipif(pygrad.core_name() != "c", reason="compares the C core's reader with the pure core's")
@FUZZ
@given(st.sampled_from(range(len(BLOBS))), st.lists(edit, min_size=1, max_size=6), st.integers(0, 5),
       st.integers(0, 40))
def test_c_node_reader_agrees_with_the_pure_one(which, edits, widen, ngiven):
  """csrc/serial_decode.c reads a blob's node sections as pygrad.serialize._nodes_py does: the same columns, or the
  same ValueError (mutated sections, under lying counts and widths, after given rows)."""
  import numpy as np
  from pygrad.serialize import _HEAD, _Reader, _nodes_c, _nodes_py
  from pygrad.argtable import decode_args
  data = BLOBS[which]
  _, _, _, nargs, argbytes, n, m, nroots, srcw, argw, _ = _HEAD.unpack_from(data, 0)
  body = bytearray(data[_HEAD.size + argbytes:-4])
  for kind, pos, val in edits:
    pos %= len(body) + 1
    if kind == "set" and pos < len(body): body[pos] = val
    elif kind == "insert": body.insert(pos, val)
    elif kind == "delete" and pos < len(body): del body[pos]
  counts = [n, m, nroots, srcw, argw]
  k = edits[0][1] % 3  # a lying count (n, m or nroots), or another width (the callers admit only 1, 2 and 4)
  if 1 <= widen <= 3: counts[widen - 1] = max(0, [counts[widen - 1] + edits[0][2] % 3 - 1, 0, 4][k])
  elif widen: counts[widen - 1] = [1, 2, 4][k]
  body = bytes(body)
  got = []
  for read in (_nodes_py, _nodes_c):
    try: got.append(read(_Reader(body, 0, len(body)), *counts, nargs, ngiven))
    except ValueError as e: got.append(str(e))
  if isinstance(got[0], str): assert got[0] == got[1]
  else:
    assert not isinstance(got[1], str), got[1]
    for a, b in zip(got[0], got[1]):
      if isinstance(a, int): assert a == b
      else: assert np.array_equal(np.asarray(a, np.int64), np.asarray(b, np.int64))
