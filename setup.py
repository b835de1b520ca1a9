"""Only what pyproject.toml cannot say: the cffi extension (cffi_modules), the abi3 wheel tag and a parallel compile."""
import os
import sys
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from setuptools import setup
from setuptools.command.build_ext import build_ext
try:
  from setuptools.command.bdist_wheel import bdist_wheel  # setuptools >= 70.1
except ImportError:
  from wheel.bdist_wheel import bdist_wheel


class bdist_wheel_abi3(bdist_wheel):
  """One wheel for every CPython >= 3.10: cffi's module uses the limited API (not on free-threaded builds)."""
  def finalize_options(self):
    if sys.implementation.name == "cpython" and not sysconfig.get_config_var("Py_GIL_DISABLED"):
      self.py_limited_api = "cp310"
    super().finalize_options()


class build_ext_parallel(build_ext):
  """Compiles an extension's sources on every core, in build.py's order (distutils compiles them one by one)."""
  def build_extension(self, ext):
    cc = self.compiler
    if cc.compiler_type == "unix":  # its _compile(obj, ...) compiles one object; MSVC's compiler has no such hook
      def compile(sources, output_dir=None, macros=None, include_dirs=None, debug=0, extra_preargs=None,
                  extra_postargs=None, depends=None):
        macros, objects, extra_postargs, pp_opts, build = cc._setup_compile(output_dir, macros, include_dirs, sources,
                                                                            depends, extra_postargs)
        cc_args = cc._get_cc_args(pp_opts, debug, extra_preargs)
        jobs = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        with ThreadPoolExecutor(jobs) as pool:
          list(pool.map(lambda o: cc._compile(o, build[o][0], build[o][1], cc_args, extra_postargs, pp_opts), objects))
        return objects
      cc.compile = compile
    super().build_extension(ext)


setup(cffi_modules=["build.py:ffibuilder"], cmdclass={"bdist_wheel": bdist_wheel_abi3, "build_ext": build_ext_parallel})
