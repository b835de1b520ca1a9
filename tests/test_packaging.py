"""What a user of the installed package sees of its packaging: `python -m pygrad --version`, a clear error for an
unknown command, one version, the py.typed marker; and, from a checkout, `python -m build` reaching PyPA's build
although the root build.py has the same name."""
from __future__ import annotations
import importlib.metadata
import os
import subprocess
import sys
import pytest
import pygrad

PKG_DIR = os.path.dirname(os.path.abspath(pygrad.__file__))
ROOT = os.path.dirname(PKG_DIR)


def _cli(args, cwd):
  env = dict(os.environ)
  env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
  return subprocess.run([sys.executable, "-m", "pygrad", *args], cwd=cwd, env=env, capture_output=True, text=True,
                        timeout=120)


def test_version_option(tmp_path):
  p = _cli(["--version"], tmp_path)
  assert p.returncode == 0, p.stderr
  assert p.stdout.startswith(f"pygrad {pygrad.__version__} (")


def test_unknown_command_says_what_went_wrong(tmp_path):
  p = _cli(["frobnicate"], tmp_path)
  assert p.returncode == 2
  assert "unknown command 'frobnicate'" in p.stderr and "demo" in p.stderr


def test_one_version():
  try:
    installed = importlib.metadata.version("pygrad")
  except importlib.metadata.PackageNotFoundError:
    pytest.skip("pygrad is imported from a folder, not installed: no metadata to compare")
  assert installed == pygrad.__version__


def test_typed_marker():
  assert os.path.isfile(os.path.join(PKG_DIR, "py.typed"))


@pytest.mark.skipif(not os.path.isfile(os.path.join(ROOT, "build.py")), reason="not run from a checkout")
def test_python_m_build_is_pypa_build_in_the_checkout():
  p = subprocess.run([sys.executable, "-m", "build", "--version"], cwd=ROOT, capture_output=True, text=True,
                     timeout=120)
  if "No module named build" in p.stderr: pytest.skip("PyPA build is not installed")
  assert p.returncode == 0, p.stderr
  assert p.stdout.startswith("build ")


@pytest.mark.skipif(not os.path.isfile(os.path.join(ROOT, "build.py")), reason="not run from a checkout")
def test_python_m_build_with_the_checkout_on_pythonpath_hands_over_once():
  """With the checkout on PYTHONPATH, `python -P -m build` found build.py again and each hand-over started the next:
  ~2,800 processes and the machine's 24 GiB before anyone noticed. The checkout is taken out of the child's
  PYTHONPATH, and a second hand-over stops with a message instead of recursing."""
  env = dict(os.environ, PYTHONPATH=ROOT)
  env.pop("PYGRAD_PYPA_HANDOVER", None)
  p = subprocess.run([sys.executable, "-m", "build", "--version"], cwd=ROOT, capture_output=True, text=True,
                     timeout=120, env=env)
  if "No module named build" in p.stderr: pytest.skip("PyPA build is not installed")
  assert p.returncode == 0 and p.stdout.startswith("build "), p.stderr
  env["PYGRAD_PYPA_HANDOVER"] = "1"  # as in the child of a hand-over that found this build.py again
  p = subprocess.run([sys.executable, "-m", "build", "--version"], cwd=ROOT, capture_output=True, text=True,
                     timeout=120, env=env)
  assert p.returncode != 0 and "instead of PyPA's build" in p.stderr, (p.returncode, p.stderr)
