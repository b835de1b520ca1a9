"""Execution: `evaluate` runs a graph once on an engine ("numpy": the reference evaluator, op by op; "c": the planner
and the C interpreter of pygrad.engine.program); `compile` plans a graph once for many runs on the C interpreter."""
from __future__ import annotations
import importlib
from typing import TYPE_CHECKING, Any, Sequence
from ..uop import UOp, core_name

if TYPE_CHECKING:
  from .program import Program

ENGINES = ("numpy", "c")
_program_mod = None


def _program(why: str):
  """pygrad.engine.program (the planner and C runner), or ImportError saying why it was wanted."""
  global _program_mod
  if _program_mod is None:
    try:
      _program_mod = importlib.import_module(".program", __name__)
    except ImportError as e:
      raise ImportError(f"{why} needs pygrad.engine.program (the C interpreter), which is not available: {e}") from e
  return _program_mod


def default_engine() -> str:
  """"c" when the C core is loaded and the C interpreter imports, else "numpy"."""
  if core_name() != "c": return "numpy"
  try:
    _program("the default engine")
  except ImportError:
    return "numpy"
  return "c"


def _outputs(outputs) -> tuple[list[UOp], bool]:
  if isinstance(outputs, UOp): return [outputs], True
  if isinstance(outputs, (list, tuple)):
    outs = list(outputs)
    for o in outs:
      if not isinstance(o, UOp): raise TypeError(f"outputs must be UOps, got {type(o).__name__}")
    return outs, False
  raise TypeError(f"outputs must be a UOp or a list/tuple of UOps, got {type(outputs).__name__}")


def evaluate(outputs: UOp | Sequence[UOp], inputs: dict[UOp, Any] | None = None,
             engine: str | None = None) -> Any:
  """The value of `outputs` (a UOp: one numpy array; a list/tuple of UOps: a list of the same length; a TUPLE,
  SINK or FUNCTION output: a tuple), given `inputs`, a dict from BUFFER/DEFINE_VAR nodes to array-likes/scalars.
  Both engines validate every binding the same way and ignore a valid one the outputs do not use. `engine` is
  "numpy", "c" or None (the default engine)."""
  if engine is None: engine = default_engine()
  if engine not in ENGINES: raise ValueError(f"evaluate: unknown engine {engine!r}, expected one of {ENGINES}")
  outs, single = _outputs(outputs)
  if inputs is not None and not isinstance(inputs, dict):
    raise TypeError(f"evaluate: inputs must be a dict, got {type(inputs).__name__}")
  if engine == "numpy":
    from .numpy_eval import evaluate as run
  else:
    run = _program("engine='c'").evaluate_c
  res = run(outs, inputs)
  return res[0] if single else list(res)


def compile(outputs: UOp | Sequence[UOp], inputs: Sequence[UOp]) -> Program:  # noqa: A001 -- SPEC §5's name
  """Plan `outputs` (a UOp or a list of UOps) over `inputs` (the BUFFER/DEFINE_VAR nodes, in the order
  `program(*arrays)` takes them) once; returns the Program of pygrad.engine.program, whose result mirrors
  `outputs` as evaluate's does."""
  outs, single = _outputs(outputs)
  ins = list(inputs)
  for i in ins:
    if not isinstance(i, UOp): raise TypeError(f"compile: inputs must be UOps, got {type(i).__name__}")
  return _program("compile").compile_program(outs[0] if single else outs, ins)


__all__ = ["evaluate", "compile", "default_engine", "ENGINES"]
