"""The training-step benchmark (MLP 64-256-256-10 and a W2 transformer block, one SGD step; pygrad compiled on 1 and
all threads vs torch eager on 1 and all threads vs jax.jit), writing bench/results/train.md and train.png beside
this file. The same as `python -m pygrad bench --only train`.

  python bench/bench_train.py [--reps N] [--steps K] [--only mlp,w2]
"""
import os, sys

HERE = os.path.dirname(os.path.abspath(__file__))
# this checkout's pygrad, not whichever one is installed (an editable install of another worktree would be timed)
if os.path.isdir(os.path.join(os.path.dirname(HERE), "pygrad")): sys.path.insert(0, os.path.dirname(HERE))

from pygrad.bench_train import main  # noqa: E402

if __name__ == "__main__":
  argv = sys.argv[1:]
  command = " ".join(["python bench/bench_train.py", *argv])
  if not any(a == "--out" or a.startswith("--out=") for a in argv): argv += ["--out", os.path.join(HERE, "results")]
  sys.exit(main(argv, command))
