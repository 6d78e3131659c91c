"""Variant objects: callable like the reference, differentiable, accepted by the checker and
the bench wherever they take a rung's name.

A :class:`PythonVariant` is defined by its two launch methods (the protocol ``measure.check``
and ``measure.bench`` accept beside a rung's name); a :class:`CustomVariant` is one compiled
from the user's CUDA source, whose launchers run through the problem's own host code (the
module-level ``forward``/``backward`` of ``losslab.problems.<problem>``, one for every rung,
which launch through ``losslab.problems.launch``), exactly as a shipped rung's do.
"""
from __future__ import annotations

import html
from pathlib import Path

import torch

from losslab import problems
from losslab.teach.custom.building import CompiledSource, build_module, check_source


def default_backward(problem: problems.Problem) -> str:
    """The shipped rung whose backward runs after a custom forward without its own: the highest
    rung of the ladder that does not write its gradient in the forward (its backward reads what
    every such forward keeps, as a custom forward does)."""
    return next(r.name for r in reversed(problem.rungs) if not r.writes_grad_in_forward)


class _VariantFunction(torch.autograd.Function):
    """The autograd of a variant object: its ``launch_forward`` and ``launch_backward``. (The
    shipped rungs are ``torch.library`` operators with their own autograd, in ``losslab.ops``;
    a variant object is Python around launchers, so it needs this small Function.)"""

    @staticmethod
    def forward(ctx, variant, *inputs):
        loss, saved = variant.launch_forward(inputs)
        ctx.save_for_backward(*saved)
        ctx.variant, ctx.num_inputs = variant, len(inputs)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        grad = ctx.variant.launch_backward(ctx.saved_tensors, grad_loss) if ctx.needs_input_grad[1] else None
        return (None, grad) + (None,) * (ctx.num_inputs - 1)


class PythonVariant:
    """A variant defined by its two launch methods; callable like the reference (with autograd).

    Subclasses set ``problem`` (a Problem) and ``name`` and implement ``launch_forward(inputs, out=None,
    needs_grad=False, grad_out=None) -> (loss, saved)`` and ``launch_backward(saved, grad_loss,
    out=None) -> grad``, as the problems' launchers do.
    """

    problem: problems.Problem
    name: str
    dtypes: tuple[torch.dtype, ...] = (torch.float32,)

    def validate(self, *inputs) -> None:
        """The problem's input checks (types, shapes, one CUDA device): TypeError/ValueError
        naming the argument."""
        self.problem.validate(*inputs)

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        self.validate(*inputs)
        if inputs[0].dtype not in self.dtypes:
            raise TypeError(f"predictions: {self.problem.name} {self.name} takes dtype "
                            f"{', '.join(map(str, self.dtypes))}, got {inputs[0].dtype}")
        return _VariantFunction.apply(self, *inputs)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.problem.name} {self.name!r}>"


class CustomVariant(PythonVariant):
    """A variant compiled from your CUDA source (see :func:`compile_variant`).

    Attributes:
        problem, name, source: what was compiled.
        compiled: the nvcc check's result (``.folder`` the build folder, ``.warnings``, ``.sass()``).
        module: the imported extension (``forward``/``backward`` and the problem's stages,
            taking pointers as integers).
        backward_from: the shipped rung whose backward runs, or None for the source's own.
    """

    def __init__(self, problem: problems.Problem, name: str, source: str, compiled: CompiledSource, module,
                 backward_from: str | None):
        self.problem, self.name, self.source = problem, name, source
        self.compiled, self.module, self.backward_from = compiled, module, backward_from

    def launch_forward(self, inputs, out=None, needs_grad=False, grad_out=None):
        """Run the source's forward launcher through the problem's host code (which also runs
        the problem's stages); returns the 0-d loss (in ``out`` if given) and what the backward
        needs. ``needs_grad``/``grad_out`` are accepted and ignored: a custom forward never
        writes the gradient (its gradient pointer is null). The problem's ``host`` module runs any
        bound launcher."""
        return self.problem.host.forward(self.module.custom_forward, False, *inputs, out=out)

    def launch_backward(self, saved, grad_loss, out=None):
        """Run the source's backward launcher (or the shipped ``backward_from`` rung's): the
        gradient w.r.t. the first input, scaled by the 0-d ``grad_loss``."""
        if self.backward_from is not None:
            return self.problem.launch_backward(self.backward_from, saved, grad_loss, out=out)
        return self.problem.host.backward(self.module.custom_backward, False, saved, grad_loss, out=out)

    def _repr_html_(self) -> str:
        backward = "its own" if self.backward_from is None else f"the shipped {self.backward_from} rung's"
        warnings = "".join(f"<br>line {w.line}: warning: {html.escape(w.text)}" for w in self.compiled.warnings)
        return (f"<p>{self.problem.name} variant <code>{html.escape(self.name)}</code>: compiled in "
                f"<code>{html.escape(str(self.compiled.folder))}</code>; backward: {backward}.{warnings}</p>")


def compile_variant(problem: problems.Problem | str, name: str, cuda_source: str, *, backward: str | None = None,
                    verbose: bool = False, root: Path | None = None) -> CustomVariant:
    """Compile ``cuda_source`` (CUDA C++ defining ``<problem>_custom_forward`` and optionally
    ``<problem>_custom_backward``, see ``signature(problem)``) into a variant called ``name``.

    nvcc checks the source first (seconds: a compile error comes back as a
    :class:`CustomCompileError` in the source's line numbers); then ``torch.utils.cpp_extension``
    builds it with a generated pybind11 binding in the source's own folder (``build_dir``) and
    imports it. A second call with the same source reuses the build. No GPU is needed to build;
    calling the variant needs one, and runs its kernels in this process: a kernel that faults (an
    illegal or misaligned address) leaves the process's CUDA context unusable, and one that never
    ends hangs it. ``check`` and ``evaluate`` run in a child process with a time limit instead
    (``losslab.teach.isolated``), as the exercises' grades do: a hang or a fault is a verdict.

    What the source defines: ``<problem>_custom_forward`` (and optionally
    ``<problem>_custom_backward``) with the types every rung of the problem has, declared once
    in ``kernels/<problem>/launchers.h`` (``<problem>_forward_fn``, ``<problem>_backward_fn``):
    ``signature(problem)`` prints them with each parameter's shape. Pointers are device pointers
    to contiguous data; launch on ``stream`` and return ``cudaGetLastError()``. A custom forward
    never fuses the gradient: its gradient pointer is null. Without a backward, a shipped rung's
    backward runs on what the forward saved (say which with ``backward=``). The launchers run
    through the problem's own host code, as a rung's do: one call per forward, which does every
    stage. For cross_entropy the forward also writes ``counts`` (rows with a valid target,
    targets out of range) and the loss: after the row kernel, ``cross_entropy_valid_mean``
    (declared in launchers.h) does both, as the teaching rungs' launchers do. A row whose target
    is out of range must not be indexed with it (the shipped rungs write NaN for it;
    ``check_targets`` raises for it). The loss and ``grad_loss`` have the inputs' dtype (float32
    for a custom variant). ``#include`` works relative to ``kernels/`` (``"common/reduce.cuh"``,
    ``"kl_div/kl_div.cuh"``, ...); ``kernels/common/*.cu`` and the problem's non-rung files
    (e.g. ``cross_entropy/valid_mean.cu``) are linked in.

    Args:
        problem: a Problem, or its name (looked up here).
        backward: see ``check_source``.
        verbose: print the build's commands.
        root: the folder of builds (default ``cache_root()``).
    Returns a :class:`CustomVariant`, callable like the reference.

    Raises:
        ValueError: unknown problem, bad name, empty source.
        CustomCompileError: the source does not compile (message in its line numbers).
        build.BuildError: no nvcc, a CPU-only torch, or the build or link failed.
    """
    compiled = check_source(problem, cuda_source, name, backward=backward, root=root)
    module = build_module(compiled, verbose=verbose)
    backward_from = None if compiled.has_backward else (backward or default_backward(compiled.problem))
    return CustomVariant(compiled.problem, name, cuda_source, compiled, module, backward_from)
