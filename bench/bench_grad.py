"""The gradient benchmark suite (W1 residual MLP chain, W2 transformer blocks, W3 random DAG; pygrad C core, pure
core, tinygrad 0.14.0, JAX): the same as `python -m pygrad bench`, writing to bench/results/ beside this file.

  python bench/bench_grad.py [--quick] [--only W1,W2,W3] [--repeat N] [--frameworks c,python,tinygrad,jax]
"""
import importlib.util, os, sys

HERE = os.path.dirname(os.path.abspath(__file__))
if importlib.util.find_spec("pygrad") is None: sys.path.insert(0, os.path.dirname(HERE))  # run from a checkout

from pygrad.bench import main  # noqa: E402

if __name__ == "__main__":
  argv = sys.argv[1:]
  command = " ".join(["python bench/bench_grad.py", *argv])
  if not any(a == "--out" or a.startswith("--out=") for a in argv): argv += ["--out", os.path.join(HERE, "results")]
  sys.exit(main(argv, command))
