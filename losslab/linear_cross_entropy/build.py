"""Build the linear cross-entropy's kernel (``kernels/linear_cross_entropy/``) into its own small
extension, ``losslab_linear_cross_entropy``, with the toolkit, flags and architectures of
:func:`losslab.build.extension.load_extension` (cached by ``torch.utils.cpp_extension``)."""
from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

from losslab.build.extension import (
    CSRC,
    KERNELS,
    NVCC_FLAGS,
    BuildError,
    compile_error_line,
    cuda_arch_list,
    find_cuda_home,
)

FOLDER = KERNELS / "linear_cross_entropy"
NAME = "losslab_linear_cross_entropy"


def sources() -> list[Path]:
    """The binding, the kernel ``rows.cu`` and ``kernels/common/scale.cu`` (headers come from kernels/ and csrc/)."""
    return [FOLDER / "binding.cpp", FOLDER / "rows.cu", KERNELS / "common" / "scale.cu"]


@functools.cache
def load(verbose: bool = False):
    """Build (if needed) and import the extension: ``rows(...)`` (kernels/linear_cross_entropy/launchers.h) and
    ``scale_in_place(...)`` (kernels/common/scale.cuh): pointers, sizes and the dtype code as integers, the
    stream last.

    Raises:
        BuildError: torch has no CUDA support, nvcc is missing, or compilation failed.
    """
    import torch

    if torch.version.cuda is None:
        raise BuildError(f"cannot build the linear cross-entropy kernel: torch {torch.__version__} is a CPU-only "
                         "build; install a CUDA build of torch")
    os.environ["CUDA_HOME"] = str(find_cuda_home())
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", cuda_arch_list())
    from torch.utils import cpp_extension

    cpp_extension.CUDA_HOME = os.environ["CUDA_HOME"]  # it was fixed when cpp_extension was imported
    print(f"losslab: building the linear cross-entropy kernel for sm {os.environ['TORCH_CUDA_ARCH_LIST']} "
          "(cached after the first build) ...", file=sys.stderr, flush=True)
    try:
        return cpp_extension.load(name=NAME, sources=[str(s) for s in sources()],
                                  extra_include_paths=[str(KERNELS), str(CSRC)], extra_cflags=["-O2"],
                                  extra_cuda_cflags=list(NVCC_FLAGS), verbose=verbose)
    except (RuntimeError, subprocess.CalledProcessError) as err:
        line = compile_error_line(str(err))
        raise BuildError(f"building the linear cross-entropy kernel failed: {line or err}") from err
