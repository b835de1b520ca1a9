"""The command line: `python -m pygrad demo` prints what it promises, and `python -m pygrad bench --quick` completes
and writes its table. Both run as subprocesses of the pygrad this interpreter imports."""
import os, subprocess, sys
import pygrad

PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(pygrad.__file__)))


def run_cli(args, cwd, timeout=120):
  env = dict(os.environ)
  env["PYTHONPATH"] = PKG_DIR + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
  return subprocess.run([sys.executable, "-m", "pygrad", *args], cwd=cwd, env=env, capture_output=True, text=True,
                        timeout=timeout)


def test_usage(tmp_path):
  p = run_cli([], tmp_path)
  assert p.returncode == 0 and "demo" in p.stdout and "bench" in p.stdout
  assert run_cli(["nonsense"], tmp_path).returncode == 2


def test_demo(tmp_path):
  p = run_cli(["demo"], tmp_path)
  assert p.returncode == 0, p.stderr
  out = p.stdout
  core = pygrad.core_name()
  other = "python" if core == "c" else "c"
  assert f"{core} core" in out.splitlines()[0]
  assert "depth 200" in out
  for promised in ("nodes, built in", "toposort:", "deepwalk:", f"{core} core: derived in", "finite differences",
                   "evaluate ("):
    assert promised in out, f"demo output lacks {promised!r}:\n{out}"
  # the other core's derivation time, from a subprocess (or why it could not run)
  assert f"gradients, {other} core" in out
  assert "max relative error" in out and ": ok" in out
  nodes = int(out.split("graph: ")[1].split(" nodes")[0])
  assert nodes > 10 * 200  # matmul alone decomposes into several primitives a layer


def test_bench_quick(tmp_path):
  out_dir = tmp_path / "results"
  p = run_cli(["bench", "--quick", "--only", "W1", "--out", str(out_dir)], tmp_path, timeout=300)
  assert p.returncode == 0, p.stderr + p.stdout
  md = (out_dir / "grad.md").read_text()
  assert "| workload | size | framework |" in md and "## Targets" in md
  assert "| W1 | depth 20 | pygrad pure core |" in md and "| W1 | depth 100 |" in md
  if "pygrad C core: not built" not in p.stdout:
    assert "| W1 | depth 100 | pygrad C core |" in md
  # peers are an optional extra: measured when importable, else skipped with a printed note
  for peer, label in (("tinygrad", "tinygrad 0.14.0"), ("jax", "JAX")):
    skipped = f"note: {peer}: not installed" in p.stdout
    assert (f"| W1 | depth 20 | {label} |" in md) != skipped
  assert (out_dir / "grad.json").exists()
  assert "W1" in p.stdout and "measuring" in p.stdout  # progress output
  assert not (tmp_path / "bench").exists()  # --out is honoured: nothing lands in the working folder
