"""The cffi builder of pygrad._core: cffi sees exactly csrc/pygrad.h; every csrc/*.c is compiled in.
PYGRAD_SANITIZE=1 builds with AddressSanitizer and UBSan (run with libasan preloaded).

Run from the checkout, this file also answers two commands:
  python -m build [args]   this file shadows PyPA's `build` there, so it hands over to it (sdist + wheel in dist/)
  python build.py wheel    the Linux x86-64 abi3 wheel for PyPI: compiled with zig cc against glibc 2.17, repaired
                           by auditwheel to manylinux_2_17_x86_64, stripped; written to wheelhouse/"""
import glob
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CSRC = os.path.join(HERE, "csrc")
PLAT = "manylinux_2_17_x86_64"


def _pypa_build(args, env=None):
  """PyPA's build, imported from anywhere but this folder: python -P (no script folder on sys.path) and this folder
  taken out of PYTHONPATH. Were this file found again all the same (PyPA's build missing, this folder on sys.path some
  other way), each hand-over would start the next without end: the guard variable stops the second one."""
  if os.environ.get("PYGRAD_PYPA_HANDOVER"):
    sys.exit(f"python -m build found pygrad's build.py ({__file__}) instead of PyPA's build: install it "
             "(pip install build) or take this folder off sys.path")
  env = dict(os.environ if env is None else env, PYGRAD_PYPA_HANDOVER="1")
  path = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and os.path.abspath(p) != HERE]
  env["PYTHONPATH"] = os.pathsep.join(path)
  cmd = [sys.executable, "-P", "-m", "build", *args] if sys.version_info >= (3, 11) else \
        [sys.executable, "-c", "import runpy, sys; del sys.path[0]; sys.argv[0] = 'build'; "
         "runpy.run_module('build', run_name='__main__', alter_sys=True)", *args]
  return subprocess.call(cmd, env=env)


def manylinux_wheel(out=os.path.join(HERE, "wheelhouse")):
  """Builds the abi3 wheel with zig cc for glibc 2.17 in a temporary folder, repairs and strips it into `out`."""
  zig = f"{sys.executable} -m ziglang cc -target x86_64-linux-gnu.2.17"
  # LDSHARED without this Python's -L/-rpath (its own lib folder would become the wheel's RUNPATH)
  env = dict(os.environ, CC=zig, LDSHARED=f"{zig} -shared", CFLAGS="-g0")
  with tempfile.TemporaryDirectory() as tmp:
    rc = _pypa_build(["--wheel", "--outdir", tmp, HERE], env)
    if rc: return rc
    whl = glob.glob(os.path.join(tmp, "*.whl"))
    return subprocess.call([sys.executable, "-m", "auditwheel", "repair", "--plat", PLAT, "--strip", "-w", out, *whl])


if __name__ == "__main__" and __spec__ is not None:  # python -m build: PyPA's build was meant
  sys.exit(_pypa_build(sys.argv[1:]))
if __name__ == "__main__" and sys.argv[1:] == ["wheel"]:
  sys.exit(manylinux_wheel())
if __name__ == "__main__":
  sys.exit(f"usage: python build.py wheel   (the manylinux abi3 wheel); python -m build   (sdist and wheel); "
           f"got {sys.argv[1:]}")

from cffi import FFI  # noqa: E402  (not needed by the commands above)


def _rel(p): return os.path.relpath(p, HERE).replace(os.sep, "/")


with open(os.path.join(CSRC, "pygrad.h")) as f: HEADER = f.read()
gnu = sys.platform != "win32" or "gcc" in os.environ.get("CC", "") or "clang" in os.environ.get("CC", "")
# C11 without GNU extensions outside the guarded ISA code (the AVX clones use target attributes and vector types)
# -fvisibility=hidden: the module exports only PyInit__core, so the core's calls to its own small functions (vm_esize
# in every kernel's row loop) are direct calls, not calls through the PLT that the compiler may not inline
cflags = ["-std=c11", "-Wall", "-Wextra", "-Werror=implicit-function-declaration", "-fvisibility=hidden"] if gnu else []
ldflags = []
if os.environ.get("PYGRAD_SANITIZE") in ("1", "thread"):  # 1: ASan + UBSan; thread: TSan (the VM's thread pool)
  san = ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined"] \
      if os.environ["PYGRAD_SANITIZE"] == "1" else ["-fsanitize=thread"]
  san.append("-fno-omit-frame-pointer")
  cflags += san + ["-O1", "-g"]
  ldflags += san

ffibuilder = FFI()
ffibuilder.cdef(HEADER)
ffibuilder.set_source(
  "pygrad._core", '#include "pygrad.h"',
  # the kernel clones take most of the compile time: first, so that the parallel compile ends together
  sources=sorted((_rel(p) for p in glob.glob(os.path.join(CSRC, "*.c"))),
                 key=lambda p: ("/vm_isa_" not in p and "/vm_gemm" not in p, p)),
  include_dirs=[_rel(CSRC)],
  depends=sorted(_rel(p) for p in glob.glob(os.path.join(CSRC, "*.h"))),  # a header edit rebuilds the core
  extra_compile_args=cflags,
  extra_link_args=ldflags,
  libraries=[] if sys.platform == "win32" else ["m", "pthread"],
)
