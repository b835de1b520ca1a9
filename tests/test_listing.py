"""pygrad.listing / UOp.listing (one line per node, bodies indented, metadata comments, roots at the end, long graphs
elided) and the one-line repr, the same text on both cores."""
from __future__ import annotations
import os, re, subprocess, sys
import pygrad
from pygrad import UOp, Ops, dtypes
from pygrad.listing import HEAD, TAIL

HERE = os.path.dirname(os.path.abspath(__file__))
LINE = re.compile(r"^( *)%(\d+) = ([A-Z_0-9]+)(?: (\S+\[[\d,]*\]\S*))?(.*?)(?:  # (.*))?$")


def graph():
  x = UOp.placeholder((4, 4), dtypes.float32, name="x")
  with pygrad.metadata("fwd"):
    p = x.param_like(0)
    f = ((p * p).sin()).call(x, name="sq").gettuple(0)
    loss = (f + x.const_like(1.5)).sum()
  (gx,) = loss.gradient(x)
  return loss, gx


def test_lines_are_ssa_in_topological_order():
  loss, gx = graph()
  text = pygrad.listing([loss, gx], full=True)
  lines = text.splitlines()
  assert lines[-1].startswith("=> %")
  body = lines[:-1]
  assert len(body) == len(UOp.sink(loss, gx).toposort()) - 1  # every node once (the sink is not listed)
  defined = set()
  for i, ln in enumerate(body):
    m = LINE.match(ln)
    assert m, ln
    assert int(m.group(2)) == i
    op = m.group(3)
    assert op in Ops.__members__
    refs = [int(r) for r in re.findall(r"%(\d+)", m.group(5))]
    if op not in ("FUNCTION", "CALL"): assert all(r in defined for r in refs), ln  # sources come first
    defined.add(i)
  assert any(re.match(r"^%\d+ = MUL f32\[4,4\] %\d+ %\d+", ln) for ln in body) or \
    any(re.match(r"^ +%\d+ = MUL f32\[4,4\] %\d+ %\d+", ln) for ln in body)
  assert any(ln.startswith("    %") and " = PARAM f32[4,4] slot=0" in ln for ln in body)  # body indented
  fn = next(ln for ln in body if " = FUNCTION sq" in ln)
  assert body[body.index(fn) + 1].startswith("    ")
  assert any(ln.endswith("# fwd (backward)") for ln in body) and any(ln.endswith("# fwd") for ln in body)
  assert " 1.5" in next(ln for ln in body if "CONST" in ln and "1.5" in ln)
  roots = lines[-1][3:].split(", ")
  assert len(roots) == 2 and body[int(roots[0][1:])].startswith(f"{roots[0]} = RESHAPE f32[] ")
  assert body[int(roots[1][1:])].startswith(f"{roots[1]} = ") and " f32[4,4] " in body[int(roots[1][1:])]
  assert loss.listing(full=True) == pygrad.listing(loss, full=True)


def test_long_graphs_elide_the_middle():
  x = UOp.placeholder((3,), dtypes.float32)
  y = x
  for _ in range(500): y = y.sin()
  short, full = y.listing(), y.listing(full=True)
  assert len(full.splitlines()) == 502
  s = short.splitlines()
  assert len(s) == HEAD + TAIL + 2 and f"... {501 - HEAD - TAIL} nodes not shown" in s[HEAD]
  assert s[:HEAD] == full.splitlines()[:HEAD] and s[-TAIL - 1:] == full.splitlines()[-TAIL - 1:]


def test_repr_is_one_short_line():
  x = UOp.placeholder((16, 16), dtypes.float32, name="x")
  y = x
  for _ in range(3000): y = (y * x).sin()
  r = repr(y)
  assert "\n" not in r and len(r) < 120
  assert r == "<UOp SIN f32[16,16], 1 src, 6001 nodes>"
  assert repr(UOp.const(2.5)) == "<UOp CONST f32[] 2.5, 0 src, 1 nodes>"


def test_same_text_on_both_cores(tmp_path):
  script = "import test_listing as t, pygrad\nl, g = t.graph()\nprint(pygrad.listing([l, g], full=True))\n"
  outs = []
  for core in ("c", "python"):
    env = {**os.environ, "PYGRAD_CORE": core, "PYTHONPATH": os.pathsep.join([os.path.dirname(HERE), HERE])}
    if core == "c" and pygrad.core_name() != "c": continue
    r = subprocess.run([sys.executable, "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    outs.append(r.stdout)
  l, g = graph()
  # placeholders number their BUFFERs per process: the subprocesses ran the same script, so the texts agree
  assert len(set(outs)) == 1 and outs[0].count("\n") == pygrad.listing([l, g], full=True).count("\n") + 1
