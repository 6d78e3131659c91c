"""Your own variant: compile CUDA you write for a problem's launcher signature, then check
it, time it and place it on the ladder beside the shipped rungs.

    from losslab.teach import custom
    print(custom.signature("kl_div"))                          # what your source defines
    mine = custom.compile_variant("kl_div", "mine", source)   # source: a str of CUDA C++
    mine(predictions, targets)                                # a 0-d loss, like the reference
    custom.check(mine).checks                                 # float64 checks, in a child process
    section = custom.evaluate(mine)                           # checks + bench, the ladder beside it

The source defines ``<problem>_custom_forward`` (and optionally ``<problem>_custom_backward``)
with the types every rung of the problem has, declared once in ``kernels/<problem>/launchers.h``
(``<problem>_forward_fn``, ``<problem>_backward_fn``): :func:`signature` prints them with each
parameter's shape. Pointers are device pointers to contiguous data; launch on ``stream`` and
return ``cudaGetLastError()``. A custom forward never fuses the gradient: its gradient pointer
is null. Without a backward, a shipped rung's backward runs on what the forward saved (say
which with ``backward=``). Your launchers run through the problem's own host code, as a
rung's do: one call per forward, which does every stage. For cross_entropy your forward
also writes ``counts`` (rows with a valid target, targets out of range) and the loss: after
your row kernel, ``cross_entropy_valid_mean`` (declared in launchers.h) does both, as the
teaching rungs' launchers do. A row whose target is out of range must not be indexed with it
(the shipped rungs write NaN for it; ``check_targets`` raises for it). The loss and
``grad_loss`` have the inputs' dtype (float32 for a custom variant).
``#include`` works relative to ``kernels/`` (``"common/reduce.cuh"``,
``"kl_div/kl_div.cuh"``, ...); ``kernels/common/*.cu`` and the problem's non-rung files
(e.g. ``cross_entropy/valid_mean.cu``) are linked in.

Each source builds in its own folder, ``~/.cache/losslab/custom/<problem>-<name>-<hash>/``
($LOSSLAB_CACHE moves it): no clash with the shipped variants or an earlier attempt, and an
unchanged source is not rebuilt. nvcc runs first on your source alone, so a compile error
comes back in seconds as a :class:`CustomCompileError` in your source's line numbers.
Calling a variant (``mine(x, t)``) runs its kernels in this process: a kernel that faults
(an illegal or misaligned address) leaves the process's CUDA context unusable, and one that
never ends hangs it. :func:`check` and :func:`evaluate` run in a child process with a time
limit instead (``losslab.teach.isolated``), as the exercises' grades do: a hang or a fault
is a verdict.

In Jupyter, ``%load_ext losslab.teach.custom`` adds the cell magic
``%%losslab_variant <problem> <name> [backward rung]``, which compiles the cell into ``<name>``.

Modules: ``contract`` (the launcher declarations, read from launchers.h), ``diagnostics``
(nvcc's errors in your line numbers), ``building`` (nvcc check, binding, extension build,
cache), ``variant`` (variant objects and their autograd, through the problem's host code),
``evaluation`` (checks and bench in a child process), ``magic`` (the cell magic).
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
