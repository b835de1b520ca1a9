"""pygrad as tinygrad 0.14.0's gradient engine.

`from_tinygrad` / `to_tinygrad` convert graphs both ways in one iterative pass each; `compute_gradient` has the
signature and result type of `tinygrad.mixin.gradient.compute_gradient` and derives through pygrad's core;
`install()` / `uninstall()` / `installed()` make tinygrad's `Tensor.backward` and `Tensor.gradient` use it.

The two IRs differ in encoding more than in meaning, and each difference has one place here:
* tinygrad's movement ops carry their shapes as source UOps (STACKs of weakint CONSTs); pygrad's carry static ints.
  PAD and SHRINK take (offset, size) pairs in tinygrad, (before, after) and (start, end) in pygrad.
* tinygrad's EXPAND prepends axes and its REDUCE reduces (and drops) leading axes; pygrad's EXPAND grows size-1 axes
  and REDUCE_AXIS keeps them. One tinygrad node becomes two pygrad nodes, both tagged, so the way back rebuilds the
  one tinygrad node.
* tinygrad ALU ops broadcast like numpy; pygrad broadcasts only `()`. Explicit RESHAPE/EXPAND nodes tagged
  `_BCAST` are inserted, and dropped again on the way back.
* weak dtypes (weakfloat, weakint: Python constants) take the dtype of the op that uses them; in pygrad they are
  converted in that dtype and tagged with the tinygrad node they stand for.
* Leaves keep their tinygrad node: a BUFFER's unique id is the tinygrad BUFFER itself (it also keeps its realized
  storage alive), variables and function PARAMs carry theirs in the tag.
* tinygrad's assign, AFTER(view, STORE(view, value)), is pygrad's CONTIGUOUS(value) tagged with the view.
* a custom kernel's body (a SINK of RANGE/INDEX/STORE ops pygrad has no use for: a CALL is differentiated only
  through its grad_fxn) is an opaque SINK tagged with the tinygrad kernel.

For compute_gradient only the part of the graph above a target is converted node by node: any other node that has
a device is one opaque pygrad BUFFER standing for it (pygrad never looks inside a value it does not differentiate),
so ops pygrad lacks (THREEFRY, STORE into views, ...) may sit anywhere off the target path.
"""
from __future__ import annotations
import contextlib
from pygrad import UOp
from pygrad.intern import ARGS
import pygrad.gradient as _pg_gradient
from .tinygrad_in import _In
from .tinygrad_out import _Out
from .tinygrad_tables import TUOp, _DT, _WEAK, _local, _no_gc, _tg_gradient

__all__ = ["from_tinygrad", "to_tinygrad", "compute_gradient", "install", "uninstall", "installed"]

# ---- public API ----

def from_tinygrad(roots):
  """tinygrad UOps (one, or a list/tuple) -> the pygrad UOps with the same meaning; every node converted."""
  cin = _In(rev=False)
  with _no_gc():
    if isinstance(roots, (list, tuple)): return type(roots)(cin.build([cin.add(r) for r in roots]))
    return cin.build([cin.add(roots)])[0]


def to_tinygrad(roots):
  """pygrad UOps (one, or a list/tuple) -> tinygrad UOps; nodes that came from tinygrad are tinygrad's own again."""
  with _no_gc():
    if isinstance(roots, (list, tuple)): return type(roots)(_Out().convert(list(roots)))
    return _Out().convert([roots])[0]

def compute_gradient(root: TUOp, root_grad: TUOp, targets) -> dict:
  """tinygrad's compute_gradient, derived by pygrad: a dict from each reached target (and root) to its gradient,
  tinygrad UOps in and out. Gradients of nodes between root and the targets are not returned (tinygrad's callers
  read only the targets')."""
  with _no_gc():
    cin, proot, pgrad, ptargets = convert_in(root, root_grad, targets)
    grads = derive(cin, proot, pgrad, ptargets)
    ret = convert_out(cin, root, root_grad, ptargets, grads)
    del proot, pgrad, ptargets, grads
    release(cin)
    return ret


def convert_in(root: TUOp, root_grad: TUOp, targets):
  """compute_gradient's first phase: the graph above the targets into pygrad (the rest opaque), in one build."""
  targets = set(targets)
  cin = _In(targets=targets)
  with _no_gc():
    rows = [cin.add(root),
            cin.add(root_grad, _DT.get(root.dtype)) if root_grad.dtype in _WEAK else cin.add(root_grad)]
    reached = [t for t in targets if t in cin.live]
    rows += [cin.add(t) for t in reached]
    proot, pgrad, *pts = cin.build(rows)
  return cin, proot, pgrad, dict(zip(reached, pts))


def derive(cin, proot: UOp, pgrad: UOp, ptargets: dict) -> dict:
  """compute_gradient's second phase: pygrad's compute_gradient (a grad_fxn met on the way finds the conversions)."""
  stack = _local.__dict__.setdefault("stack", [])
  stack.append(cin)
  try:
    with _no_gc(): return _pg_gradient.compute_gradient(proot, pgrad, set(ptargets.values()))
  finally:
    stack.pop()


def convert_out(cin, root: TUOp, root_grad: TUOp, ptargets: dict, grads: dict) -> dict:
  """compute_gradient's last phase: the targets' gradients back into tinygrad, forward nodes reused."""
  ret = {root: root_grad}
  with _no_gc(): ret.update(_Out(cin.rev()).gradients(ptargets, grads))
  return ret


def release(cin) -> None:
  """compute_gradient's end: the conversion's pygrad nodes freed (the caller holds no other pygrad node of it) and
  the interner drained. The opaque BUFFERs' args hold tinygrad nodes (a BUFFER's unique id is the node it stands
  for): left to the interner's next due drain, they would keep the caller's graph alive until some later conversion
  forgot them, and that conversion would pay for forgetting them and for freeing the graph."""
  cin.keep, cin.ids, cin.given = [], [], {}
  ARGS.drain()


_saved = []


def install() -> None:
  """Make tinygrad's Tensor.backward / Tensor.gradient (which import compute_gradient from
  tinygrad.mixin.gradient when called) derive through pygrad."""
  if not _saved: _saved.append(_tg_gradient.compute_gradient)
  _tg_gradient.compute_gradient = compute_gradient


def uninstall() -> None:
  """Give tinygrad its own compute_gradient back."""
  if _saved: _tg_gradient.compute_gradient = _saved.pop()


@contextlib.contextmanager
def installed():
  """`with installed(): ...` runs the block with pygrad as tinygrad's gradient engine."""
  was = bool(_saved)
  install()
  try:
    yield
  finally:
    if not was: uninstall()
