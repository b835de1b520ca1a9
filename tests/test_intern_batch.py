"""Interner.get_many's batch path (pygrad/intern.py): many values it lacks, a conversion's fresh BUFFER args, are
entered in one batch, and a due drain is made before anything is looked up. The ids are what one `get` each gives."""
from __future__ import annotations
import random
import numpy as np
import pygrad
from pygrad import Ops, dtypes
from pygrad.intern import ARGS, _BATCH, argkey


class _Node:
  """A hashable object compared by identity, as a tinygrad node in a BUFFER arg is."""


def _fresh(n: int, tag: str) -> list:
  nodes = [_Node() for _ in range(n)]
  return [(u, (2, i % 5), "CPU", None if i % 2 else f"{tag}{i}") for i, u in enumerate(nodes)]


def test_batch_gives_the_ids_get_gives():
  xs = _fresh(3 * _BATCH, "a")
  eq = [(x[0], x[1], x[2], x[3]) for x in xs[:_BATCH]]  # equal to interned-in-this-batch values, other objects
  mixed = [None, 1, 1.0, True, -0.0, 0.0, float("nan")] + xs + eq + [xs[0], 7.5]
  got = ARGS.get_many(mixed)
  assert got[0] == 0 and len(set(got[1:7])) == 6
  assert got == [ARGS.get(x) for x in mixed]
  assert got[7:7 + _BATCH] == got[7 + len(xs):7 + len(xs) + _BATCH]  # equal values: one id
  assert len(set(got[7:7 + len(xs)])) == len(xs)
  assert all(ARGS.objs[a] is x for a, x in zip(got[7:7 + len(xs)], xs))  # the first object of a value is kept
  assert all(ARGS.ident[id(x)] == a for a, x in zip(got[7:7 + len(xs)], xs))
  keys = [None] + [argkey(x) for x in mixed[1:]]
  assert ARGS.get_many(mixed, keys) == got
  named = [x for x in xs if x[3] is None]
  assert all(ARGS.ids[argkey(x)] == ARGS.get(x) for x in named)


def _consts(vals: list) -> list:
  """Live CONST nodes of vals, made by pygrad.build (its interning is get_many)."""
  n = len(vals)
  return pygrad.build([int(Ops.CONST)] * n, [dtypes.float32.id] * n, np.zeros((n, 0), np.int64), args=vals)


def test_batch_makes_a_due_drain_first_and_reuses_its_slots():
  """A batch after more than a drain's worth of new ids drains before looking anything up (so that nothing it finds
  is forgotten meanwhile): the ids of values whose nodes died are forgotten and their slots reused, the live ones
  kept; the ids are what get gives."""
  salt = random.random()
  keep = [salt + i for i in range(2 * _BATCH)]
  held = _consts(keep)
  ids_keep = [ARGS.get(v) for v in keep]
  dead = [salt + 1e6 + i for i in range(1100)]
  nodes = _consts(dead)
  assert ARGS.since_drain >= 1024 and len(nodes) == len(dead)
  ids_dead = [ARGS.get(v) for v in dead]
  del nodes  # their args' last users
  fresh = [salt - 1e6 - i for i in range(2 * _BATCH)]
  got = ARGS.get_many(keep + fresh)
  assert got[:len(keep)] == ids_keep and [u.arg for u in held] == keep
  assert not any(argkey(v) in ARGS.ids for v in dead)  # forgotten by the drain
  assert ARGS.since_drain == len(fresh)  # entered after it, with none
  freed = {a % ARGS.slots for a in ids_dead}  # their slots are free again: taken by the fresh ones, or still free
  assert freed <= {a % ARGS.slots for a in got[len(keep):]} | {a % ARGS.slots for a in ARGS.free}
  assert got == [ARGS.get(v) for v in keep + fresh]
