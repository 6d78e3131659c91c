"""Build a problem's kernels into a Python extension.

``load_extension(problem)`` builds ``kernels/common/*.cu``, ``kernels/<problem>/*.cu``
and the pybind11 binding ``losslab/build/csrc/<problem>.cpp`` into one Python
extension with ``torch.utils.cpp_extension`` (ninja: cached, incremental). The
binding includes no torch headers: it binds each launcher of
``kernels/<problem>/launchers.h`` through ``csrc/bind.h``.
"""
from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ROOT / "kernels"
CSRC = Path(__file__).resolve().parent / "csrc"
NVCC_FLAGS = ("-O3", "-std=c++17", "-lineinfo")
DEFAULT_ARCHS = ("8.0", "9.0")  # A100 and H100/H200, when no GPU says which


def dtype_code(dtype) -> int:
    """The DType code (kernels/common/dtype.h) a launcher takes for a torch dtype.

    Raises:
        KeyError: a dtype no launcher takes.
    """
    from losslab.problems.launch import DTYPE_CODES

    return DTYPE_CODES[dtype]


class BuildError(RuntimeError):
    """The kernels cannot be built here: a tool is missing or the compiler failed."""


def find_cuda_home() -> Path:
    """The CUDA toolkit's root.

    Uses $CUDA_HOME if set, else asks the ``nvcc`` on PATH (which may be a
    wrapper script whose parent folder is not the toolkit) via ``nvcc --dryrun``.

    Raises:
        BuildError: no nvcc on PATH and no $CUDA_HOME.
    """
    if os.environ.get("CUDA_HOME"):
        return Path(os.environ["CUDA_HOME"])
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise BuildError("cannot build the kernels: nvcc (the CUDA compiler) is not on PATH and "
                         "CUDA_HOME is not set; install the CUDA toolkit or set CUDA_HOME")
    dry = subprocess.run([nvcc, "--dryrun", "-c", "-x", "cu", os.devnull, "-o", os.devnull],
                         capture_output=True, text=True)
    match = re.search(r"^#\$ TOP=(.+)$", dry.stdout + dry.stderr, re.MULTILINE)
    return Path(match.group(1)).resolve() if match else Path(nvcc).resolve().parent.parent


def nvcc_path() -> Path:
    return find_cuda_home() / "bin" / "nvcc"


def cuda_arch_list() -> str:
    """The architectures to build for: the visible GPU's, else DEFAULT_ARCHS (``"8.0;9.0"``)."""
    import torch

    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        return f"{major}.{minor}"
    return ";".join(DEFAULT_ARCHS)


def sources(problem: str) -> list[Path]:
    """The files one problem's extension is built from."""
    binding = CSRC / f"{problem}.cpp"
    kernels = sorted((KERNELS / problem).glob("*.cu"))
    if not binding.exists() or not kernels:
        raise BuildError(f"problem: no kernels for {problem!r} "
                         f"(expected {binding} and {KERNELS / problem}/*.cu)")
    return [binding, *sorted((KERNELS / "common").glob("*.cu")), *kernels]


@functools.cache
def load_extension(problem: str, verbose: bool = False):
    """Build (if needed) and import the extension of ``problem``'s kernels.

    The first build takes about a minute (less with a warm cache); later calls in
    any process reuse the build unless a source changed. Set $TORCH_EXTENSIONS_DIR
    to move the build cache and $TORCH_CUDA_ARCH_LIST to choose architectures
    (default: the visible GPU's, else sm_80 and sm_90).

    Raises:
        BuildError: torch has no CUDA support, nvcc is missing, or compilation failed.
    """
    import torch

    if torch.version.cuda is None:
        raise BuildError(f"cannot build the kernels: torch {torch.__version__} is a CPU-only build; "
                         "install a CUDA build of torch")
    os.environ["CUDA_HOME"] = str(find_cuda_home())
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", cuda_arch_list())
    from torch.utils import cpp_extension

    cpp_extension.CUDA_HOME = os.environ["CUDA_HOME"]  # it was fixed when cpp_extension was imported
    print(f"losslab: building the {problem} kernels for sm {os.environ['TORCH_CUDA_ARCH_LIST']} "
          "(cached after the first build) ...", file=sys.stderr, flush=True)
    try:
        return cpp_extension.load(
            name=f"losslab_{problem}",
            sources=[str(s) for s in sources(problem)],
            extra_include_paths=[str(KERNELS)],
            extra_cflags=["-O2"],
            extra_cuda_cflags=list(NVCC_FLAGS),
            verbose=verbose,
        )
    except (RuntimeError, subprocess.CalledProcessError) as err:
        raise BuildError(f"building the {problem} kernels failed: {err}") from err


