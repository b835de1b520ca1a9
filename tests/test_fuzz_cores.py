"""Differential fuzzing of the two cores (issue 10 item 17): every random recipe (tests/fuzzgraphs.py) builds node
for node the same graph on the C core and on the pure-Python core and raises the same errors on the way. The other
core runs in one subprocess for the whole module, fed recipes as JSON lines. Budget and long mode: fuzzgraphs.py."""
from __future__ import annotations
import json, os, subprocess, sys
import pytest
from hypothesis import given
import pygrad
from fuzzgraphs import FUZZ, recipes, report

HERE = os.path.dirname(os.path.abspath(__file__))
OTHER = "python" if pygrad.core_name() == "c" else "c"


@pytest.fixture(scope="module")
def other_core():
  if OTHER == "c": pytest.importorskip("pygrad._core")
  pkg = os.path.dirname(os.path.dirname(os.path.abspath(pygrad.__file__)))
  env = dict(os.environ, PYGRAD_CORE=OTHER, PYTHONPATH=os.pathsep.join([HERE, pkg]))
  p = subprocess.Popen([sys.executable, "-W", "ignore", os.path.join(HERE, "fuzzgraphs.py")], stdin=subprocess.PIPE,
                       stdout=subprocess.PIPE, text=True, env=env, cwd=HERE)

  def ask(recipe):
    p.stdin.write(json.dumps(recipe) + "\n")
    p.stdin.flush()
    line = p.stdout.readline()
    assert line, f"the {OTHER} core's worker died (exit {p.poll()})"
    return json.loads(line)
  yield ask
  p.stdin.close()
  p.wait(timeout=60)


@FUZZ
@given(recipes())
def test_both_cores_build_the_same_graphs_and_errors(other_core, recipe):
  mine = json.loads(json.dumps(report(recipe)))  # tuples become lists, as on the other side of the pipe
  theirs = other_core(recipe)
  assert "crash" not in theirs, theirs["crash"]
  assert mine["errors"] == theirs["errors"], f"{pygrad.core_name()} vs {OTHER}"
  assert len(mine["rows"]) == len(theirs["rows"])
  for i, (a, b) in enumerate(zip(mine["rows"], theirs["rows"])):
    assert a == b, f"node {i}: {pygrad.core_name()} {a} vs {OTHER} {b}"
