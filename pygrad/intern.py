"""Interning of args, tags and side data into integer ids the cores store. Equality is type-strict and deep:
`1`, `1.0` and `True` differ, `0.0` and `-0.0` differ, NaN equals NaN."""
from __future__ import annotations
import math, threading
from collections import deque
from itertools import count
from .core import CORE

_INTS = "ints"
_NONE_KEY = (type(None), None)  # argkey(None)
_BATCH = 32  # get_many interns at least this many values it lacks in one batch (_enter_many), fewer one by one


def argkey(x):
  """A hashable key equal for two args exactly when they are the same value of the same type, deeply."""
  t = type(x)
  if t is float:
    if x != x: return (float, "nan")
    return (float, x, math.copysign(1.0, x) < 0) if x == 0.0 else (float, x)
  if t is tuple:
    for e in x:
      if type(e) is not int: break
    else: return (_INTS, x)  # the common case, a shape or axes: ints only
    out = [tuple]
    for e in x:  # argkey's own form of each item, without a call for the usual ones (a BUFFER's node, index, device,
      te = type(e)  # name)
      if te is int or te is str or te is bool: out.append((te, e))
      elif e is None: out.append(_NONE_KEY)
      elif te is float or te is tuple or te is complex: out.append(argkey(e))
      else:
        try:
          hash(e)
        except TypeError:
          raise TypeError(f"arg of type {te.__name__} is not hashable: {e!r}") from None
        out.append((te, e))
    return tuple(out)
  if t is complex: return (complex, argkey(x.real), argkey(x.imag))
  try:
    hash(x)
  except TypeError:
    raise TypeError(f"arg of type {t.__name__} is not hashable: {x!r}") from None
  return (t, x)


_AKEYS = (CORE.argkeys, (_INTS, _NONE_KEY, argkey))  # the C core's argkeys (csrc/pyargkey.c); None: Python's


def argkeys(xs: list) -> list:
  """[argkey(x) for x in xs]: on the C core one call that makes the usual keys (a conversion's ~1,000 new BUFFER
  args, (node, shape, device, name) each: argkey's Python loop was ~0.5 us of each) and asks argkey for the rest."""
  f, cfg = _AKEYS
  return [argkey(x) for x in xs] if f is None else f(xs, cfg)


def plain(x) -> bool:
  """Whether x is made of exact ints and strs, in tuples: two such values are equal exactly when their argkeys are
  (no bool, float or int subclass in them compares equal to what it is not), so the value is its own key."""
  t = type(x)
  if t is int or t is str: return True
  if t is not tuple: return False
  todo = [x]
  while todo:
    for e in todo.pop():
      te = type(e)
      if te is tuple: todo.append(e)
      elif te is not int and te is not str: return False
  return True


class Interner:
  """key -> id and id -> object for counted ids (> 0); id 0 is None and is never counted.
  An id is a slot of the core's count table (its low core.arg_slot_bits bits) and a generation. A drained id's
  slot is reused, oldest first, with the next generation: a process that makes ever-new args (a new constant every
  step) keeps as many slots as args are alive at once, where fresh ids would grow the core's tables without bound
  and run out of int32 ids; and an id someone still held across its drain never names the slot's new arg (the
  core finds the generation differs and reports it gone, the caller interns again)."""

  def __init__(self, core):
    self.core = core
    self.ids: dict = {}
    self.objs: dict[int, object] = {0: None}
    self.keys: dict[int, object] = {}
    self.ident: dict[int, int] = {}  # id() of each interned object -> its id: equal values found without a key
    self.plain: dict = {}  # plain value (see plain) -> its id: found without building its key (csrc/pyargs.c)
    self.next = 1  # the first slot never used
    self.free: deque[int] = deque()  # drained ids whose slots are free, oldest first
    self.slots = 1 << core.arg_slot_bits
    self.gens = 1 << (31 - core.arg_slot_bits)
    self.on_wrap: list = []  # run (lock held) when a slot's generation wraps: caches keeping ids without counts
    self.since_drain = 0
    self.forgets = 0  # ids forgotten so far: while it stays the same, every id seen before names the same object
    self.lock = threading.Lock()  # new ids, drains and forgets: rare, but threads must not share an id

  def get(self, x) -> int:
    if x is None: return 0
    t = type(x)
    k = (t, x) if t is int or t is bool or (t is float and x != 0.0 and x == x) else argkey(x)  # argkey's own form
    aid = self.ids.get(k)
    if aid is None: aid = self._new(k, x)
    return aid

  def get_key(self, k, x) -> int:
    """get(x) for x not None whose argkey(x) the caller has already computed as k."""
    aid = self.ids.get(k)
    if aid is None: aid = self._new(k, x)
    return aid

  def get_fresh(self, k, x, is_plain: bool) -> int:
    """get_key(k, x) for an x no one can have interned (a placeholder's arg: its uid is fresh) whose plain(x) the
    caller knows: one per placeholder (the Python path's; csrc/pyleaf.c does the same in C), so the probe and the
    plainness scan are skipped where they cannot find anything."""
    with self.lock:
      return self._enter(k, x, is_plain)

  def get_many(self, xs, keys=None) -> list[int]:
    """[get(x) for x in xs] (keys: their argkeys, if the caller has them). An object that is itself the interned one
    (passed again to pygrad.build, or loaded again) is found by identity, without its key: ~30x cheaper for a
    BUFFER's nested tuple. Sound because an interned object stays in objs until its id is forgotten, and forgetting
    drops its ident entry first, so a live object's id() names no other object's entry. Many values it lacks (a
    conversion's fresh BUFFERs) are entered in one batch (_get_batch)."""
    ident, objs = self.ident, self.objs
    out = list(map(ident.get, map(id, xs)))  # None (None's entry) where no interned object is x
    miss = [j for j, x, o in zip(count(), xs, map(objs.get, out)) if o is not x]
    if len(miss) < _BATCH:
      for j in miss: out[j] = self.get(xs[j]) if keys is None else self.get_key(keys[j], xs[j])
      return [0 if a is None else a for a in out] if None in out else out
    if self.since_drain >= 1024:  # a drain due (a batch enters without one): made before anything is looked up,
      with self.lock:  # so that it cannot forget an id found here, unheld as the last conversion's are (ArgGone)
        if self.since_drain >= 1024: self._drain()
      out = list(map(ident.get, map(id, xs)))
      miss = [j for j, x, o in zip(count(), xs, map(objs.get, out)) if o is not x]
    ms = [xs[j] for j in miss]
    ks = argkeys(ms) if keys is None else [keys[j] for j in miss]
    got = list(map(self.ids.get, ks))
    if None in got: self._get_batch(ms, ks, got)
    for j, a in zip(miss, got): out[j] = a
    return [0 if a is None else a for a in out] if None in out else out

  def _get_batch(self, ms: list, ks: list, got: list) -> None:
    """got[i] (None where ks[i] was not found) made the id of ms[i] (whose key is ks[i]): what get_many lacks,
    entered in one batch (_enter_many, no drain) instead of one _enter each. Each new key is hashed twice here (a
    nested tuple, hashed anew each time: ~300 instructions a BUFFER arg's), once to look it up again under the lock
    and once to find a value twice in the batch; its id is taken from _enter_many's list, not looked up again."""
    ids = self.ids
    with self.lock:
      new: dict = {}  # key -> its place among the values entered (a value twice in the batch gets one id)
      vals: list = []
      at_i: list = []  # got's places of the new ones, and their places in vals
      at_j: list = []
      for i, k, a in zip(count(), ks, got):
        if a is None:  # looked up again under the lock: another thread may have entered it meanwhile
          if (a := ids.get(k)) is not None: got[i] = a
          else:
            j = new.setdefault(k, len(vals))
            if j == len(vals): vals.append(ms[i])
            at_i.append(i)
            at_j.append(j)
      if new:
        aids = self._enter_many(list(new), vals)
        for i, j in zip(at_i, at_j): got[i] = aids[j]

  def _new(self, k, x) -> int:
    with self.lock:
      aid = self.ids.get(k)  # another thread may have made it meanwhile
      if aid is not None: return aid
      return self._enter(k, x, plain(x))

  def _enter(self, k, x, is_plain: bool) -> int:
    """A new id for x under key k (lock held): a slot, registered in the core, and the interner's entries."""
    self.since_drain += 1
    if self.since_drain >= 1024: self._drain()
    aid = self._slot()
    self.core.arg_register(aid)
    self.ids[k], self.objs[aid], self.keys[aid] = aid, x, k
    self.ident[id(x)] = aid
    if is_plain: self.plain[x] = aid
    return aid

  def _enter_many(self, ks: list, xs: list) -> list[int]:
    """_enter for each new x under its key k (lock held; none of ks is in ids), with no drain (the next get_many of
    a batch makes it, if it is due); their ids, in order."""
    self.since_drain += len(ks)
    slot = self._slot
    aids = [slot() for _ in ks]
    reg = self.core.arg_register
    for aid in aids: reg(aid)
    self.ids.update(zip(ks, aids))
    self.objs.update(zip(aids, xs))
    self.keys.update(zip(aids, ks))
    self.ident.update(zip(map(id, xs), aids))
    pl = self.plain
    for x, aid in zip(xs, aids):
      if plain(x): pl[x] = aid
    return aids

  def _slot(self) -> int:
    """A free id (lock held): the oldest drained slot with its next generation, else a slot never used."""
    if self.free:
      old = self.free.popleft()
      gen = (old // self.slots + 1) % self.gens
      if gen == 0:  # this id may have been handed out before: no cache may still map a value to it
        for f in self.on_wrap: f()
      return gen * self.slots + old % self.slots
    if self.next < self.slots:
      self.next += 1
      return self.next - 1
    raise MemoryError(f"pygrad: more than {self.slots - 1} distinct args, tags and metadata alive at once")

  def forget(self, aid: int) -> None:
    """The core found aid gone (a race with a drain): wait until that drain has forgotten it, so that `get` makes a
    fresh id. Only a drain forgets an id: an id the core still counts (a make's other arg) keeps its object, which
    live nodes name, and its slot, which it still holds."""
    with self.lock:
      pass

  def drain(self) -> None:
    with self.lock:
      self._drain()

  def _drain(self) -> None:
    self.since_drain = 0
    keys, objs, ident, pl, ids, free = self.keys, self.objs, self.ident, self.plain, self.ids, self.free
    for aid in self.core.arg_drain():  # _forget inline, as a drain after a large conversion forgets thousands
      if aid not in keys: continue  # not ours (a raw registration of a test)
      self.forgets += 1  # first: a reader that saw the old count checks ids the core still holds (or finds them gone)
      k = keys.pop(aid)
      x = objs.get(aid)
      if ident.get(id(x)) == aid: del ident[id(x)]  # before objs': a live object's id() names no other's entry
      if plain(x) and pl.get(x) == aid: del pl[x]
      objs.pop(aid, None)
      a = ids.pop(k, None)  # (one hash of the key, not two: it is a nested tuple, hashed anew each time)
      if a is not None and a != aid: ids[k] = a
      free.append(aid)


ARGS = Interner(CORE)


class MetaTable:
  """Permanent interning of (shape, device) pairs: few distinct ones exist."""

  def __init__(self):
    self.ids: dict = {}
    self.vals: list = []
    self.lock = threading.Lock()

  def get(self, shape, device) -> int:
    k = (shape, device)
    mid = self.ids.get(k)
    if mid is None:
      with self.lock:
        mid = self.ids.get(k)
        if mid is None:
          self.vals.append(k)
          mid = self.ids[k] = len(self.vals) - 1
    return mid


META = MetaTable()
