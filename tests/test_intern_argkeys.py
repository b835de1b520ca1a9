"""intern.argkeys (the C core's csrc/pyargkey.c) against argkey, value by value: the same keys (equal, and of the same
types all the way down, so equal values of different types keep different ids) for the forms it makes itself and
for those it hands back to argkey, and argkey's own errors. On the pure-Python core argkeys is argkey's loop."""
from __future__ import annotations
import random
import pytest
from pygrad import dtypes
from pygrad.core import CORE
from pygrad.intern import _AKEYS, argkey, argkeys


class _Node:
  """A hashable object compared by identity, as a tinygrad node in a BUFFER arg is."""


class _IntSub(int):
  pass


class _Unhashable:
  __hash__ = None  # type: ignore[assignment]


def _shape(k):
  """k's structure: its types all the way down (equal keys may still differ in type: 1 == 1.0 == True)."""
  if type(k) is tuple: return (tuple, tuple(_shape(e) for e in k))
  return (type(k), k) if type(k) in (type, str) else type(k)


def _same(xs: list) -> None:
  got, want = argkeys(xs), [argkey(x) for x in xs]
  assert got == want
  assert [_shape(k) for k in got] == [_shape(k) for k in want]


def test_the_usual_forms():
  u = _Node()
  _same([(u, (4, 8), "CPU", None), (u, (4, 8), "CPU", "w0"), (1, 2, 3), (), (u,), (True, 1, False), ("a", None),
         ((1, 2), (3,)), ((), "x"), (_IntSub(3), 1), (dtypes.float32, 2), (1, (2, "b")), ((1, 2.0), 3)])


def test_what_it_hands_back_to_argkey():
  _same([1, 1.5, -0.0, 0.0, float("nan"), 2j, "s", None, True, dtypes.float32, _IntSub(2),
         (1.0,), (-0.0, 0.0), (float("nan"), 1), (1j, 2), ((1.5,), 2), (((1,),),), ((1, (2.5, "x")), None)])


def test_random_args_against_argkey():
  rng = random.Random(14)
  nodes = [_Node() for _ in range(4)]
  leaves = [0, 1, -7, 2 ** 70, True, False, None, 0.0, -0.0, 1.5, float("nan"), 1j, "", "CPU", dtypes.int32,
            _IntSub(5), *nodes]

  def val(depth):
    if depth > 2 or rng.random() < 0.4: return rng.choice(leaves)
    if rng.random() < 0.3: return tuple(rng.randrange(9) for _ in range(rng.randrange(4)))
    return tuple(val(depth + 1) for _ in range(rng.randrange(5)))

  _same([val(0) for _ in range(2000)])


def test_argkeys_errors_are_argkeys():
  for bad in ([(1, [2])], [(_Node(), _Unhashable())], [((1, {}),)], [[1]]):
    with pytest.raises(TypeError) as c:
      argkeys(bad)
    with pytest.raises(TypeError) as p:
      argkey(bad[0])
    assert str(c.value) == str(p.value)


def test_c_argkeys_checks_its_arguments():
  f, cfg = _AKEYS
  if f is None:
    assert CORE.name == "python"
    pytest.skip("the pure-Python core has no C argkeys (argkey's loop is what runs)")
  assert f([], cfg) == []
  for args in (((1,), cfg), ([1], cfg[:2]), ([1], list(cfg)), ([1], cfg[:2] + (1,))):
    with pytest.raises(TypeError):
      f(*args)
  with pytest.raises(TypeError):
    f([1])
