"""The benchmark driver's report (pygrad/bench.py): a measurement whose gradient does not end within the time
limit still reports the build figures it had, and the table says `> limit` instead of dropping the row."""
import json, subprocess
import pygrad
from pygrad import bench


def _times_out(printed: bytes):
  def run(cmd, timeout=None, **kw):
    raise subprocess.TimeoutExpired(cmd, timeout, output=printed)  # a timeout leaves undecoded output
  return run


def test_a_gradient_out_of_time_keeps_its_build(monkeypatch):
  built = {"nodes": 1000, "build_s": 2.0, "topo_s": 0.01, "bytes_per_node": 700.0}
  monkeypatch.setattr(bench.subprocess, "run", _times_out(b"warming up\nBUILT " + json.dumps(built).encode() + b"\n"))
  r = bench.run_one("tinygrad", "W3", 1000, timeout_s=5)
  assert r["grad_s"] is None and r["grad_timeout_s"] == 5 and r["build_s"] == 2.0 and r["nodes"] == 1000
  c = {"workload": "W3", "size": 1000, "fw": "pygrad-c", "runs": 1, "nodes": 1000, "build_s": 0.5, "topo_s": 0.001,
       "grad_s": 0.1, "bytes_per_node": 70.0}
  late = {"workload": "W3", "size": 1000, "fw": "tinygrad", "runs": 1, **r}
  line = [x for x in bench.table([c, late]).splitlines() if "tinygrad" in x][0]
  assert "| > 5 |" in line and "| > 50x |" in line and "| 4.0x |" in line  # gradient, gradient vs C, build vs C


def test_a_timeout_before_the_build_is_an_error(monkeypatch):
  monkeypatch.setattr(bench.subprocess, "run", _times_out(b"warming up\n"))
  r = bench.run_one("jax", "W3", 1000, timeout_s=7)
  assert r["error"] == "timed out after 7 s" and "grad_s" not in r


def test_the_worker_reports_its_build_before_the_gradient(capsys):
  fw = "pygrad-c" if pygrad.core_name() == "c" else "pygrad-py"
  bench.worker_main(json.dumps({"fw": fw, "wl": "W1", "size": 3}))
  lines = capsys.readouterr().out.splitlines()
  tags = [ln.split(" ", 1)[0] for ln in lines]
  assert tags == ["BUILT", "RESULT"]
  b, r = (json.loads(ln.split(" ", 1)[1]) for ln in lines)
  assert "grad_s" not in b and r["grad_s"] > 0 and r["build_s"] == b["build_s"] and r["nodes"] == b["nodes"]


def test_compile_bench_runs_every_workload_against_a_baseline(tmp_path):
  """bench/bench_compile.py at a tiny size: every workload (the W1 gradient included) in its own process, beside a
  baseline package (this checkout again), and the table has both columns."""
  import os, sys
  root = os.path.dirname(os.path.dirname(os.path.abspath(pygrad.__file__)))  # the folder the imported pygrad is in
  # the bench scripts sit beside tests/ (the checkout, the sdist, and CI's copies of both), not in the package
  script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "bench_compile.py")
  out = subprocess.run([sys.executable, script, "--sizes", "100", "--repeat", "1", "--baseline", root,
                        "--out", str(tmp_path)], capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-2000:]
  rows = [x for x in (tmp_path / "compile.md").read_text().splitlines() if x.startswith("| ") and "workload" not in x]
  assert [r.split(" | ")[0][2:] for r in rows] == ["grad-scalar", "grad-vector", "forward", "w1-grad"]
  assert all(r.count("|") == 11 and r.split(" | ")[7].endswith("x") for r in rows), rows


def test_tinygrad_bench_reports_every_phase(tmp_path):
  """bench/bench_tinygrad.py at tiny sizes: both workloads, both engines, the four phases of pygrad's (release
  included in its total) and the conversions' per-node figures."""
  import os, sys
  import pytest
  pytest.importorskip("tinygrad", reason="tinygrad is not installed (pip install '.[tinygrad]')")
  script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "bench_tinygrad.py")
  out = subprocess.run([sys.executable, script, "--reps", "1", "--w1", "3", "--w2", "1", "--out",
                        str(tmp_path / "t.md")], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "DEV": "PYTHON"})
  assert out.returncode == 0, out.stderr[-2000:]
  rows = [x.split(" | ") for x in (tmp_path / "t.md").read_text().splitlines() if x.startswith("| W")]
  assert [r[0] for r in rows] == ["| W1", "| W2"] * 2
  for r in rows[:2]:  # pygrad's total is the sum of its phases; each phase took some time
    total, phases = float(r[4]), [float(x) for x in r[5:9]]
    assert all(p > 0 for p in phases) and abs(total - sum(phases)) <= 0.01 * total + 1e-3, r
    assert r[9].endswith("x")
