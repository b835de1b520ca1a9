"""Only what pyproject.toml cannot say: the cffi extension (cffi_modules) and the abi3 wheel tag."""
import sys
import sysconfig
from setuptools import setup
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


setup(cffi_modules=["build.py:ffibuilder"], cmdclass={"bdist_wheel": bdist_wheel_abi3})
