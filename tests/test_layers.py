"""The import rules of the layers (issue 9): the compiled module pygrad._core is loaded by the core layer
(pygrad/core/) only, and no module outside it reads a core's private fields (`CORE._...`); everything else reaches C
through the core's interface. Checked on the source of every module, so a new module that breaks a rule fails here."""
from __future__ import annotations
import ast, os
import pygrad

PKG = os.path.dirname(os.path.abspath(pygrad.__file__))


def _modules():
  for d, _, files in os.walk(PKG):
    for f in sorted(files):
      if f.endswith(".py"): yield os.path.join(d, f)


def _module_name(path: str) -> str:
  rel = os.path.relpath(path, os.path.dirname(PKG))[:-3].split(os.sep)
  return ".".join(rel[:-1] if rel[-1] == "__init__" else rel)


def _imported(path: str, node) -> list[str]:
  """The absolute module names an import statement names (for `from X import a, b`: X and X.a, X.b)."""
  if isinstance(node, ast.Import): return [a.name for a in node.names]
  if node.level:
    pkg = _module_name(path).split(".")
    if not path.endswith("__init__.py"): pkg = pkg[:-1]
    base = ".".join(pkg[:len(pkg) - node.level + 1] + ([node.module] if node.module else []))
  else: base = node.module or ""
  return [base] + [f"{base}.{a.name}" for a in node.names]


def violations(path: str, source: str) -> list[str]:
  out = []
  for node in ast.walk(ast.parse(source, path)):
    if isinstance(node, (ast.Import, ast.ImportFrom)):
      if any(m == "pygrad._core" or m.startswith("pygrad._core.") for m in _imported(path, node)):
        out.append(f"{os.path.relpath(path, PKG)}:{node.lineno} imports pygrad._core")
    elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__") and \
        isinstance(node.value, ast.Name) and node.value.id == "CORE":
      out.append(f"{os.path.relpath(path, PKG)}:{node.lineno} reads CORE.{node.attr}")
  return out


def test_only_the_core_layer_touches_the_compiled_module_and_core_internals():
  core_dir = os.path.join(PKG, "core") + os.sep
  bad = []
  for path in _modules():
    if path.startswith(core_dir): continue
    with open(path, encoding="utf-8") as f: bad += violations(path, f.read())
  assert not bad, "\n".join(bad)


def test_the_rule_check_sees_every_form_of_the_import():
  here = os.path.join(PKG, "engine", "x.py")
  for src in ("from .._core import ffi", "from .. import _core", "import pygrad._core", "from pygrad._core import lib",
              "from pygrad import _core as c", "def f():\n  from .._core import lib", "st = CORE._st"):
    assert violations(here, src), src
  for src in ("from ..core.clib import ffi, lib", "from ..core import CORE", "CORE.toposort([1])", "x._st",
              "from .. import core"):
    assert not violations(here, src), src
  assert violations(os.path.join(PKG, "templates.py"), "from ._core import lib")
  assert not violations(os.path.join(PKG, "templates.py"), "from .core import clib")


# pygrad/gradient/: the rules <- the drivers (direct <- templated) <- the package's compute_gradient
GRADIENT_MAY_IMPORT = {"rules": set(), "direct": {"rules"}, "templated": {"rules", "direct"}}


def _gradient_imports(path: str, source: str | None = None) -> set[str]:
  """The pygrad.gradient modules a module imports ("__init__" for the package itself)."""
  if source is None:
    with open(path, encoding="utf-8") as f: source = f.read()
  tree = ast.parse(source, path)
  out = set()
  for node in ast.walk(tree):
    if not isinstance(node, (ast.Import, ast.ImportFrom)): continue
    names = _imported(path, node)
    subs = [m.split(".")[2] for m in names if m.split(".")[:2] == ["pygrad", "gradient"] and len(m.split(".")) > 2]
    subs = [m for m in subs if m in GRADIENT_MAY_IMPORT]
    out.update(subs)
    if "pygrad.gradient" in names and not subs: out.add("__init__")  # names taken from the package itself
  return out


def test_gradient_package_imports_run_one_way():
  for mod, allowed in GRADIENT_MAY_IMPORT.items():
    got = _gradient_imports(os.path.join(PKG, "gradient", f"{mod}.py")) - {mod}
    assert got <= allowed, f"pygrad/gradient/{mod}.py imports {sorted(got - allowed)}"
  rules = os.path.join(PKG, "gradient", "rules.py")
  for src, want in (("from .direct import step", {"direct"}), ("from . import templated", {"templated"}),
                    ("from . import compute_gradient", {"__init__"}), ("import pygrad.gradient", {"__init__"}),
                    ("from ..core import CORE", set())):
    assert _gradient_imports(rules, src) == want, src
