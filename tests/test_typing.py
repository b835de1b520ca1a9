"""The package ships py.typed: a user's fully annotated program over the public API (tests/typing_public_api.py)
passes `mypy --strict`. Errors inside pygrad's own modules are not the user's and are not reported
(--follow-imports=silent); what is checked is that the public names have types a strict user can rely on."""
import os
import subprocess
import sys
import pytest

pytest.importorskip("mypy", reason="mypy is in the test extra")
HERE = os.path.dirname(os.path.abspath(__file__))


def test_public_api_passes_mypy_strict(tmp_path):
  import pygrad
  env = dict(os.environ)
  top = os.path.dirname(os.path.dirname(os.path.abspath(pygrad.__file__)))
  if os.path.basename(top) not in ("site-packages", "dist-packages"):
    env["MYPYPATH"] = top  # a checkout or an editable install (whose import hook mypy does not follow)
  r = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent", "--no-incremental",
                      "--cache-dir", str(tmp_path), os.path.join(HERE, "typing_public_api.py")],
                     capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
  assert r.returncode == 0, r.stdout + r.stderr
