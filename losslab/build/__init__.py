"""Compile the kernels, and read what the compiler made of them.

``extension``: build a problem's kernels and binding into a Python extension
(``load_extension``), the default launch configuration or another (``knobs``: the knobs each
rung file declares, checked, as compiler defines). ``sass``: compile one kernel file to a cubin and read its
resources and SASS (``compile_cubin``, ``resource_usage``, ``disassemble``). ``prebuilt``: the
wheel's prebuilt kernels, which ``load_extension`` serves where built from these sources.
"""
from losslab.build import knobs
from losslab.build.extension import (
    CSRC,
    DEFAULT_ARCHS,
    KERNELS,
    NVCC_FLAGS,
    ROOT,
    BuildError,
    compile_error_line,
    cuda_arch_list,
    define_flags,
    dtype_code,
    extension_name,
    find_cuda_home,
    find_tool,
    load_extension,
    nvcc_path,
    sources,
)
from losslab.build.sass import KernelResources, compile_cubin, disassemble, find_cuobjdump, resource_usage, run_tool

__all__ = [
    "CSRC", "DEFAULT_ARCHS", "KERNELS", "NVCC_FLAGS", "ROOT", "BuildError", "KernelResources", "compile_cubin",
    "compile_error_line", "cuda_arch_list", "define_flags", "disassemble", "dtype_code", "extension_name",
    "find_cuda_home", "find_cuobjdump", "find_tool", "knobs", "load_extension", "nvcc_path", "resource_usage",
    "run_tool", "sources",
]
