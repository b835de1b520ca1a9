"""The cffi builder of pygrad._core: cffi sees exactly csrc/pygrad.h; every csrc/*.c is compiled in.
PYGRAD_SANITIZE=1 builds with AddressSanitizer and UBSan (run with libasan preloaded)."""
import glob
import os
import sys
from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
CSRC = os.path.join(HERE, "csrc")


def _rel(p): return os.path.relpath(p, HERE).replace(os.sep, "/")


with open(os.path.join(CSRC, "pygrad.h")) as f: HEADER = f.read()
gnu = sys.platform != "win32" or "gcc" in os.environ.get("CC", "") or "clang" in os.environ.get("CC", "")
# C11 without GNU extensions outside the guarded ISA code (the AVX clones use target attributes and vector types)
cflags = ["-std=c11", "-Wall", "-Wextra", "-Werror=implicit-function-declaration"] if gnu else []
ldflags = []
if os.environ.get("PYGRAD_SANITIZE") == "1":
  san = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-fno-sanitize-recover=undefined"]
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

if __name__ == "__main__":
  ffibuilder.compile(verbose=True)
