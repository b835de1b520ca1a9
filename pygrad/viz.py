"""Pictures of graphs: `to_dot(roots)` writes Graphviz DOT, `render(roots, "grad.svg")` draws it with Graphviz's
`dot` program (SVG, PNG or PDF by the file's extension). Forward and backward nodes (metadata `backward=True`) get
different colours, FUNCTION/CALL bodies are clusters, inputs and outputs are marked, and edges leave each source in
argument order (numbered when a node has several). Beyond `budget` nodes, nodes of the same kind (op, type,
forward/backward, body) are drawn once with a count, and their edges with counts: a 28,000-node gradient becomes a
picture of its structure. Nothing recurses on graph depth or on the nesting of FUNCTIONs."""
from __future__ import annotations
import os, shutil, subprocess
from collections import Counter
from .ops import Ops
from .core import CORE
from .uop import UOp, handle
from .listing import _order, arg_text, typ

FORWARD, BACKWARD, INPUT, CONST = "#dbe9f6", "#f9d5c5", "#d5ecd4", "#eeeeee"
_LEAVES = (Ops.BUFFER, Ops.DEFINE_VAR, Ops.PARAM)


def _esc(s: str) -> str:
  return s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _kind(u: UOp) -> str:
  if u.op in _LEAVES: return "input"
  if u.op is Ops.CONST: return "const"
  return "backward" if any(m.backward for m in u.metadata) else "forward"


_FILL = {"input": INPUT, "const": CONST, "forward": FORWARD, "backward": BACKWARD}


def to_dot(roots, budget: int = 300, title: str | None = None) -> str:
  """Graphviz DOT of the graph under roots (a UOp or a sequence of UOps); see the module docstring."""
  roots = [roots] if isinstance(roots, UOp) else list(roots)
  for r in roots:
    if not isinstance(r, UOp): raise TypeError(f"to_dot: roots must be UOps, got {type(r).__name__}")
  if budget < 1: raise ValueError(f"to_dot: budget must be positive, got {budget}")
  order = _order(roots)
  rootset = {r._id for r in roots}
  # the body each node is drawn in: the call whose listing entered it (depth d nodes follow their call)
  owner: dict[int, int | None] = {}
  calls: list[int | None] = [None]
  for nid, d in order:
    del calls[d + 1:]
    owner[nid] = calls[d]
    calls.append(nid)
  nodes = {nid: handle(nid) for nid, _ in order}
  # a node's drawing: itself, or (collapsed) the class of nodes sharing op, type, kind and body; level 1 keeps
  # inputs, outputs and calls apart, level 2 (when that is still over budget) counts them too
  def key(nid: int, level: int):
    u = nodes[nid]
    if level == 0 or (level == 1 and (nid in rootset or u.op in _LEAVES or u.op in (Ops.FUNCTION, Ops.CALL))):
      return ("n", nid)
    return ("k", u.op, typ(u), _kind(u), owner[nid], nid in rootset, nid if nid in bodies else None)
  bodies = set(owner.values())  # calls whose body is drawn: each stays one node, its cluster's name
  collapse = len(order) > budget
  cls = {nid: key(nid, int(collapse)) for nid in nodes}
  if collapse and len(set(cls.values())) + len({cls[r._id] for r in roots}) > budget:  # output markers count too
    cls = {nid: key(nid, 2) for nid in nodes}
  names = {k: f"n{i}" for i, k in enumerate(dict.fromkeys(cls.values()))}
  count = Counter(cls.values())
  first = {}
  for nid in nodes: first.setdefault(cls[nid], nid)
  out = ["digraph pygrad {", '  graph [rankdir=TB, fontname="Helvetica", fontsize=11, nodesep=0.25, ranksep=0.3];',
         '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=10, height=0.3];',
         '  edge [fontname="Helvetica", fontsize=8, arrowsize=0.6];']
  legend = "blue: forward, orange: backward (metadata backward=True), green: inputs, double border: outputs"
  out.append(f'  label="{_esc((title + chr(10) if title else "") + legend)}"; labelloc=t;')
  if collapse: out.append(f'  // {len(order)} nodes drawn as {len(names)} (budget {budget}): repeated kinds counted')
  # clusters: one per call body, nested as the bodies are (emitted with an explicit stack)
  members: dict[int | None, list] = {}
  for k, nid in first.items(): members.setdefault(owner[nid], []).append(k)
  kids: dict[int | None, list[int]] = {}
  for nid in nodes:
    if nodes[nid].op in (Ops.FUNCTION, Ops.CALL) and nid in members: kids.setdefault(owner[nid], []).append(nid)
  stack: list = [("open", None)]
  while stack:
    what, c = stack.pop()
    pad = "  " * (1 + sum(1 for w, _ in stack if w == "close"))
    if what == "close":
      out.append(pad + "}")
      continue
    if c is not None:
      f = nodes[c]
      out.append(f'{pad}subgraph cluster_{names[cls[c]]} {{ label="{_esc(f.op.name + " " + arg_text(f))} body"; '
                 'style="rounded,dashed"; color="#888888";')
      stack.append(("close", c))
    for k in members.get(c, []):
      u, m = nodes[first[k]], count[k]
      label = u.op.name + (f" ×{m}" if m > 1 else "")
      t, a = typ(u), arg_text(u) if m == 1 else ""
      if t: label += "\n" + t
      if a: label += "\n" + (a if len(a) <= 40 else a[:37] + "...")
      attrs = [f'label="{_esc(label)}"', f'fillcolor="{_FILL[_kind(u)]}"']
      if u.op in _LEAVES: attrs.append("shape=box, style=filled")
      if first[k] in rootset: attrs += ["peripheries=2", "penwidth=1.5"]
      if u.op in (Ops.FUNCTION, Ops.CALL): attrs.append("shape=component, style=filled")
      out.append(f"{pad}  {names[k]} [{', '.join(attrs)}];")
    for f in reversed(kids.get(c, [])): stack.append(("open", f))
  edges: Counter = Counter()
  for nid in nodes:
    srcs = CORE.src(nid)
    for i, s in enumerate(srcs):
      edges[(cls[s], cls[nid], i if len(srcs) > 1 else -1, nodes[nid].op in (Ops.FUNCTION, Ops.CALL) and i == 0)] += 1
  for (a, b, i, body), m in edges.items():
    attrs = []
    if body: attrs += ['style=dashed', 'label="body"']
    elif i >= 0 or m > 1: attrs.append(f'label="{"" if i < 0 else i}{f" ×{m}" if m > 1 else ""}"')
    out.append(f"  {names[a]} -> {names[b]}" + (f" [{', '.join(attrs)}]" if attrs else "") + ";")
  outs: dict = {}
  for i, r in enumerate(roots): outs.setdefault(cls[r._id], []).append(i)
  for j, (k, idx) in enumerate(outs.items()):
    label = f"output {idx[0]}" if len(idx) == 1 else f"outputs {idx[0]}..{idx[-1]} ×{len(idx)}"
    out.append(f'  out{j} [shape=plaintext, style="", label="{label}"];')
    out.append(f"  {names[k]} -> out{j} [arrowhead=none, style=dotted];")
  out.append("}")
  return "\n".join(out) + "\n"


def render(roots, path, budget: int = 300, title: str | None = None) -> str:
  """Draw the graph under roots into path (.svg, .png or .pdf) with Graphviz's `dot`; returns the path."""
  fmt = os.path.splitext(os.fspath(path))[1].lower().lstrip(".")
  if fmt not in ("svg", "png", "pdf"): raise ValueError(f"render: the file must end in .svg, .png or .pdf, got {path!r}")
  dot = shutil.which("dot")
  if dot is None:
    raise RuntimeError("render needs Graphviz's `dot` program, which is not installed: install the Graphviz package "
                       "(Debian/Ubuntu: apt-get install graphviz; macOS: brew install graphviz; conda: conda install "
                       "graphviz), or write the DOT text of pygrad.viz.to_dot yourself")
  src = to_dot(roots, budget, title)
  p = subprocess.run([dot, f"-T{fmt}", "-o", os.fspath(path)], input=src.encode(), capture_output=True, timeout=600)
  if p.returncode != 0: raise RuntimeError(f"dot failed ({p.returncode}): {p.stderr.decode(errors='replace')[:500]}")
  return os.fspath(path)


__all__ = ["to_dot", "render"]
