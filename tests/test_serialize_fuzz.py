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


def _mutated(data: bytes, edits, cut: int) -> bytes:
  """data with the edits ("set", "insert", "delete" at a position) applied, then cut short when cut % 3 == 0."""
  body = bytearray(data)
  for kind, pos, val in edits:
    pos %= len(body) + 1
    if kind == "set" and pos < len(body): body[pos] = val
    elif kind == "insert": body.insert(pos, val)
    elif kind == "delete" and pos < len(body): del body[pos]
  if cut % 3 == 0: body = body[:cut % (len(body) + 1)]
  return bytes(body)


@FUZZ
@given(st.sampled_from(range(len(BLOBS))), st.lists(edit, min_size=1, max_size=6), st.booleans(),
       st.integers(0, 1 << 20))
def test_mutated_blobs_load_or_raise_value_error(which, edits, reseal, cut):
  body = _mutated(BLOBS[which][:-4], edits, cut)
  _check(_seal(body) if reseal else body + BLOBS[which][-4:])


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


# ---- the C arg-table decoder (csrc/pyargs.c) against the Python one (pygrad/argtable.py) ----
def _plain_args():
  from pygrad.dtype import BY_ID
  from pygrad.uop import Metadata
  leaf = st.one_of(st.none(), st.booleans(), st.integers(-(1 << 63), (1 << 63) - 1), st.integers(-300, 300),
                   st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, -0.0, float("nan")]),
                   st.text(max_size=6), st.sampled_from(["CPU", "", "é", "x" * 40]), st.binary(max_size=6),
                   st.sampled_from(list(Ops)), st.sampled_from(list(BY_ID)),
                   st.builds(Metadata, st.text(max_size=4), st.text(max_size=4), st.booleans()),
                   st.lists(st.integers(0, 64), max_size=4).map(tuple))
  return st.recursive(leaf, lambda kids: st.lists(kids, max_size=4).map(tuple), max_leaves=12)


def _table_of(args: list) -> bytes:
  from pygrad.intern import ARGS
  from pygrad.argtable import _encode_args
  aids = list(dict.fromkeys(ARGS.get(a) for a in args if a is not None))
  return _encode_args(aids, None, None), len(aids)


def _both_decoders(table: bytes, nargs: int) -> list:
  """What the Python decoder and the C one (decoding only) make of a table: (argkeys of the values, keys), or the
  ValueError's text; None for the C one when it leaves the table to Python."""
  from pygrad import argtable as at
  from pygrad.intern import argkey
  out = []
  for dec in (lambda: at._decode_args_py(table, nargs, None, False)[:2],
              lambda: at._decode_args(table, nargs, None, False, intern=False)[:2]):
    try:
      vals, keys = dec()
      out.append(([argkey(v) for v in vals], list(keys)))
    except ValueError as e:
      out.append(str(e))
  return out


@pytest.mark.skipif(pygrad.core_name() != "c", reason="compares the C core's arg-table decoder with the Python one")
@FUZZ
@given(st.lists(_plain_args(), min_size=0, max_size=12))
def test_c_arg_decoder_agrees_with_the_python_one(args):
  """csrc/pyargs.c decodes a table of plain args to the values and interning keys argtable.py decodes (type-strict:
  -0.0, NaN, bools, nested tuples, Metadata, non-ASCII strings), and interning it finds the ids ARGS holds."""
  from pygrad import argtable as at
  from pygrad.intern import ARGS, argkey, plain
  table, nargs = _table_of(args)
  py, c = _both_decoders(table, nargs)
  assert not isinstance(py, str), py
  assert c == py
  vals, keys, is_plain, ids = at._decode_args(table, nargs, None, False)
  assert is_plain and list(ids[1:]) == ARGS.get_many(vals, keys) and ids[0] == 0
  assert all(ARGS.objs[int(a)] is v for a, v in zip(ids[1:], vals))  # the interned objects themselves
  assert all(ARGS.ids[argkey(v)] == a and plain(v) for v, a in ARGS.plain.items())  # plain values: their own keys


@pytest.mark.skipif(pygrad.core_name() != "c", reason="compares the C core's arg-table decoder with the Python one")
@FUZZ
@given(st.lists(_plain_args(), min_size=1, max_size=8), st.lists(edit, min_size=1, max_size=6), st.integers(0, 1 << 20),
       st.integers(-2, 2))
def test_c_arg_decoder_refuses_bad_tables_as_the_python_one(args, edits, cut, lie):
  """Mutated and truncated arg tables, under a lying arg count: the C decoder raises the Python decoder's
  ValueError, word for word, or decodes the same values (never a crash, hang or unbounded allocation)."""
  table, nargs = _table_of(args)
  py, c = _both_decoders(_mutated(table, edits, cut), max(0, nargs + lie))
  assert c == py


@pytest.mark.skipif(pygrad.core_name() != "c", reason="the C core's arg-table decoder")
@pytest.mark.parametrize("table,nargs,msg", [
  (b"", 0, "truncated data (skeleton count)"),
  (struct.pack("<I", 1 << 30), 0, "arg skeletons do not fit"),
  (struct.pack("<II", 1, 1) + bytes([7]) + struct.pack("<I", 1 << 31), 0, "a tuple of 2147483648 items"),
  (struct.pack("<II", 1, 102) + (bytes([7]) + struct.pack("<I", 1)) * 101 + bytes([0]), 0, "nested deeper than 100"),
  (struct.pack("<II", 1, 1) + bytes([15]) + struct.pack("<I", (1 << 32) - 1) + struct.pack("<I", 0) * 3, 3,
   "truncated data (int tuple arg)"),
  (struct.pack("<II", 1, 1) + bytes([6]) + struct.pack("<II", 0, (1 << 32) - 1), 1, "truncated data (string arg)"),
  (struct.pack("<II", 1, 1001) + bytes([7]) + struct.pack("<I", 1000) + bytes(1000) + bytes(4 * 20_000), 20_000,
   "expands to more items"),  # 20,000 tuples of 1,000 Nones in 81 kB
  (struct.pack("<II", 1, 1) + bytes([6]) + struct.pack("<II", 0, 2) + b"\xff\xfe", 1, "not UTF-8"),
  (struct.pack("<II", 1, 1) + bytes([8]) + struct.pack("<I", 0) + bytes([250]), 1, "unknown op 250 in an arg"),
  (struct.pack("<II", 1, 4) + bytes([10, 6, 6, 3]) + struct.pack("<I", 0) + struct.pack("<I", 1) + b"a"
   + struct.pack("<I", 1) + b"b" + struct.pack("<q", 1), 1, "bad Metadata fields ['a', 'b', 1]"),
], ids=range(10))
def test_c_arg_decoder_names_the_problem(table, nargs, msg):
  py, c = _both_decoders(table, nargs)
  assert isinstance(c, str) and msg in c and c == py
