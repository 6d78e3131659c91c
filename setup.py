"""The wheel's build step (the metadata is pyproject.toml's): beside the package, the sources it
reads (kernels/, exercises/, pitfalls/ as losslab/<folder>/) and each loss's operator kernels
prebuilt with nvcc ($CUDA_HOME/bin/nvcc, else PATH's; losslab/build/prebuilt.py). LOSSLAB_PREBUILT=0
leaves them out, LOSSLAB_NVCC_JOBS bounds the parallel nvcc processes. An editable install builds nothing."""
import importlib.util
import os
import shutil
import sys
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools before 70.1: the wheel package's
    from wheel.bdist_wheel import bdist_wheel

ROOT = Path(__file__).resolve().parent
DATA = ("kernels", "exercises", "pitfalls")


def _prebuilt():
    spec = importlib.util.spec_from_file_location("losslab_prebuilt", ROOT / "losslab" / "build" / "prebuilt.py")
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildPy(build_py):
    def run(self):
        super().run()
        if self.editable_mode:
            return
        package = Path(self.build_lib) / "losslab"
        for folder in DATA:
            shutil.copytree(ROOT / folder, package / folder, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        if os.environ.get("LOSSLAB_PREBUILT", "1") != "0":
            jobs = int(os.environ["LOSSLAB_NVCC_JOBS"]) if os.environ.get("LOSSLAB_NVCC_JOBS") else None
            cuda_home = os.environ.get("CUDA_HOME")
            nvcc = str(Path(cuda_home) / "bin" / "nvcc") if cuda_home else "nvcc"
            _prebuilt().compile_libraries(package / "_prebuilt", ROOT / "kernels", ROOT / "losslab" / "build" / "csrc",
                                          nvcc, jobs)


class PlatformDistribution(Distribution):
    """Machine code inside (the libraries): the wheel is for one platform, its files at its root."""

    def has_ext_modules(self):
        return True


class BdistWheel(bdist_wheel):
    """py3-none-<platform>: the libraries use no Python C API (ctypes loads them), so any Python 3."""

    def get_tag(self):
        return "py3", "none", super().get_tag()[2]


setup(distclass=PlatformDistribution, cmdclass={"build_py": BuildPy, "bdist_wheel": BdistWheel})
