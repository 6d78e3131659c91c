"""Build the linear cross-entropy's kernel (``kernels/linear_cross_entropy/``) into its own small
extension, ``losslab_linear_cross_entropy``, with the toolkit, flags and architectures of
:func:`losslab.build.extension.load_extension` (cached by ``torch.utils.cpp_extension``)."""
from __future__ import annotations

import functools
from pathlib import Path

from losslab.build.extension import CSRC, KERNELS, build

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
    return build(NAME, "the linear cross-entropy kernel", sources(), verbose=verbose, include=[CSRC])
