"""`python -m pygrad train` (an MLP on scikit-learn's digits through one compiled SGD step) in a short version, its
error without the optional dependencies, and the training-step benchmark's smoke run (bench_train.py)."""
from __future__ import annotations
import re
import sys
import numpy as np
import pytest

pytest.importorskip("pygrad.engine.program", reason="the compiled interpreter is not built", exc_type=ImportError)


def test_train_reaches_95_percent_and_plots(tmp_path, capsys):
  pytest.importorskip("sklearn")
  pytest.importorskip("tqdm")
  pytest.importorskip("matplotlib")
  from pygrad.train import main
  png = tmp_path / "loss.png"
  assert main(["--steps", "400", "--plot", str(png), "--no-progress"]) == 0
  out = capsys.readouterr().out
  acc = float(re.search(r"test accuracy ([0-9.]+)%", out).group(1))
  assert acc >= 95.0, out
  assert "built, differentiated and compiled once" in out
  assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_train_loop_takes_a_compiled_step():
  """The loop is a function of the compiled step: the losses it reports are the step's, and they fall."""
  from pygrad.train import mlp_step, init_params, onehot, train_loop
  rng = np.random.default_rng(0)
  x = rng.standard_normal((64, 8)).astype(np.float32)
  labels = (x[:, 0] > 0).astype(int)
  step = mlp_step((8, 16, 2), 32, 0.2)
  params, losses = train_loop(step, init_params((8, 16, 2)), x, onehot(labels, 2), 32, 60)
  assert len(losses) == 60 and len(params) == 4
  assert np.mean(losses[-10:]) < 0.5 * np.mean(losses[:10])


def test_train_without_the_examples_extra_says_what_to_install(monkeypatch, capsys):
  monkeypatch.setitem(sys.modules, "sklearn", None)  # import sklearn now raises ImportError
  from pygrad.train import main
  assert main(["--steps", "1"]) == 2
  err = capsys.readouterr().err
  assert "needs scikit-learn" in err and "pygrad[examples]" in err


def test_train_rejects_bad_arguments(capsys):
  from pygrad.train import main
  for bad in (["--steps", "0"], ["--lr", "-1"], ["--hidden", "a,b"]):
    with pytest.raises(SystemExit) as e: main(bad)
    assert e.value.code == 2


def test_bench_train_smoke(tmp_path):
  from pygrad.bench_train import main
  assert main(["--reps", "1", "--steps", "1", "--only", "mlp,w2", "--out", str(tmp_path)], "smoke") == 0
  md = (tmp_path / "train.md").read_text()
  assert "| pygrad, 1 thread |" in md and "## Targets" in md
