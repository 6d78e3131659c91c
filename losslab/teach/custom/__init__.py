"""Your own variant: compile CUDA you write for a problem's launcher signature, then check
it, time it and place it on the ladder beside the shipped rungs.

    mine = custom.compile_variant("kl_div", "mine", source)  # what source defines: custom.signature("kl_div")
    section = custom.evaluate(mine)                          # float64 checks + bench, in a child process

Modules: ``launchers`` (the launcher contract, read from launchers.h), ``diagnostics`` (nvcc's errors
in your line numbers), ``building`` (nvcc check, binding, extension build, cache), ``variant``
(variant objects and their autograd), ``evaluation`` (checks and bench in a child process), ``magic``.
"""
from losslab.teach.custom.building import (
    CompiledSource,
    build_dir,
    cache_root,
    check_source,
    defines_backward,
    source_hash,
)
from losslab.teach.custom.diagnostics import (
    CompileMessage,
    CustomCompileError,
    format_diagnostics,
    parse_diagnostics,
)
from losslab.teach.custom.evaluation import CheckRun, check, evaluate
from losslab.teach.custom.launchers import Contract, Launcher, Param, contract, signature
from losslab.teach.custom.magic import load_ipython_extension
from losslab.teach.custom.variant import CustomVariant, PythonVariant, compile_variant, default_backward

__all__ = ["CheckRun", "CompileMessage", "CompiledSource", "Contract", "CustomCompileError", "CustomVariant",
           "Launcher", "Param", "PythonVariant", "build_dir", "cache_root", "check", "check_source",
           "compile_variant", "contract", "default_backward", "defines_backward", "evaluate", "format_diagnostics",
           "load_ipython_extension", "parse_diagnostics", "signature", "source_hash"]
