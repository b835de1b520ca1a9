"""pygrad.viz: DOT text, pictures drawn by Graphviz's dot (the SVG parsed: every node and edge is there), the node
budget, the missing-dot error and `python -m pygrad viz`."""
from __future__ import annotations
import os, re, shutil, subprocess, sys
import xml.etree.ElementTree as ET
import pytest
import pygrad
from pygrad import UOp, Ops, dtypes, viz

HERE = os.path.dirname(os.path.abspath(__file__))
SVG = "{http://www.w3.org/2000/svg}"
needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed (CI installs it)")


def _svg(path) -> tuple[dict[str, str], list[tuple[str, str]]]:
  """(node name -> its text, edges as (tail, head)) of an SVG dot drew."""
  root = ET.parse(path).getroot()
  nodes, edges = {}, []
  for g in root.iter(f"{SVG}g"):
    title = g.find(f"{SVG}title")
    if g.get("class") == "node": nodes[title.text] = " ".join(t.text or "" for t in g.iter(f"{SVG}text"))
    elif g.get("class") == "edge": edges.append(tuple(title.text.split("->")))
  return nodes, edges


def _graph():
  x = UOp.placeholder((4, 4), dtypes.float32, name="x")
  w = UOp.placeholder((4, 4), dtypes.float32, name="w")
  with pygrad.metadata("fwd"):
    p = x.param_like(0)
    f = (p * p).call(x, name="sq").gettuple(0)
    loss = ((x @ w).sin() + f).sum()
  return loss, loss.gradient(x, w)


@needs_dot
def test_svg_has_every_node_and_edge(tmp_path):
  loss, grads = _graph()
  roots = [loss, *grads]
  path = viz.render(roots, tmp_path / "g.svg")
  nodes, edges = _svg(path)
  graph = UOp.sink(*roots).toposort()
  n = len(graph) - 1
  assert len([k for k in nodes if k.startswith("n")]) == n
  assert len([k for k in nodes if k.startswith("out")]) == len(roots)
  nsrc = sum(len(u.src) for u in graph if u.op is not Ops.SINK)
  assert len(edges) == nsrc + len(roots)
  texts = list(nodes.values())
  assert any(t.startswith("BUFFER f32[4,4] x#") for t in texts) and any(t.startswith("FUNCTION sq") for t in texts)
  # the forward SIN, and the backward cos's sin(x/2) and sin(2x) (its sin(x) is the forward one)
  assert sum(t.startswith("SIN f32[4,4]") for t in texts) == 3
  dot = viz.to_dot(roots)
  assert "subgraph cluster_" in dot and viz.BACKWARD in dot and viz.FORWARD in dot and viz.INPUT in dot
  assert dot.count("peripheries=2") == len(roots)


def test_edges_leave_sources_in_argument_order():
  x = UOp.placeholder((3,), dtypes.float32)
  y = UOp.placeholder((3,), dtypes.float32)
  dot = viz.to_dot(x.maximum(y) * y)
  names = dict(re.findall(r'  (n\d+) \[label="([A-Z_]+)', dot))
  edges = re.findall(r'(n\d+) -> (n\d+) \[label="(\d+)"\]', dot)
  mul = next(k for k, v in names.items() if v == "MUL")
  into_mul = [(a, i) for a, b, i in edges if b == mul]
  assert [i for _, i in into_mul] == ["0", "1"] and names[into_mul[1][0]] == "BUFFER"


@needs_dot
def test_budget_collapses_a_big_gradient(tmp_path):
  from pygrad.__main__ import _mlp
  loss, x, ws = _mlp(60, 4)
  grads = loss.gradient(x, *ws)
  total = len(UOp.sink(loss, *grads).toposort())
  assert total > 1500
  path = viz.render([loss, *grads], tmp_path / "big.svg", budget=200)
  nodes, edges = _svg(path)
  assert len(nodes) < 200 and len(edges) < 800
  counts = [int(m) for t in nodes.values() for m in re.findall(r"×(\d+)", t)]
  assert counts and max(counts) >= 60


def test_missing_dot_names_the_package(monkeypatch, tmp_path):
  monkeypatch.setattr(shutil, "which", lambda name: None)
  with pytest.raises(RuntimeError, match="apt-get install graphviz"):
    viz.render(UOp.const(1.0), tmp_path / "x.svg")
  with pytest.raises(ValueError, match=r"\.svg, \.png or \.pdf"):
    viz.render(UOp.const(1.0), tmp_path / "x.gif")


@needs_dot
def test_cli_draws_the_demo(tmp_path):
  env = {**os.environ, "PYTHONPATH": os.path.dirname(HERE)}
  r = subprocess.run([sys.executable, "-m", "pygrad", "viz", "--depth", "2", "--out", str(tmp_path / "d.svg")],
                     env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr
  nodes, edges = _svg(tmp_path / "d.svg")
  assert len(nodes) > 50 and len(edges) > 50
  assert any("w1#" in t for t in nodes.values())
