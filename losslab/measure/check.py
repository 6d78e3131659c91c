"""Correctness of every variant against a float64 reference.

Each check draws fresh random inputs (the seed is reported, so a failure can be replayed), runs
the variant's forward and backward through autograd, and compares with the reference computed in
float64, within :data:`TOLERANCES` (what is compared: :func:`check_inputs`).
"""
from __future__ import annotations

import functools
import math
import secrets
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from losslab import problems
from losslab.ops import variant as get_variant
from losslab.problems import cross_entropy
from losslab.variants import find_variant

# Tolerances against float64, per input dtype: (loss, gradient). float32 follows
# the bounds. bf16/fp16 kernels compute in fp32 on inputs that are
# exact in float64 too, so their error is the final rounding of each output to
# the 16-bit type: at most half an ulp, i.e. torch.finfo(dtype).eps / 2 relative;
# the bound allows twice that, plus (:func:`rounding_allowance`) the error of the
# float64 result rounded to the dtype itself, which no kernel can beat where
# results fall below the dtype's smallest normal (fp16: 6.1e-5; its subnormals are
# spaced 6e-8 apart): gradients of a mean over 2^19 elements and more, and a
# 1-element loss of 0.5 * 0.01^2.
TOLERANCES = {
    torch.float32: (1e-5, 1e-6),
    torch.bfloat16: (torch.finfo(torch.bfloat16).eps, torch.finfo(torch.bfloat16).eps),  # 7.8e-3
    torch.float16: (torch.finfo(torch.float16).eps, torch.finfo(torch.float16).eps),     # 9.8e-4
}
LOSS_RTOL, GRAD_RTOL = TOLERANCES[torch.float32]
GRAD_LOSS = 0.75  # upstream gradient: a value other than 1 also checks the scaling


@dataclass
class CheckResult:
    """One comparison of a variant with the float64 reference.

    ``error`` is a relative error (dimensionless); ``passed`` is False with a
    ``detail`` saying why.
    """

    problem: str
    variant: str
    case: str
    shape: tuple[int, ...]
    direction: str
    error: float
    tolerance: float
    passed: bool
    detail: str = ""
    seed: int | None = None
    date: str = ""  # what produced the result: stamped by records.measure_section
    sources_sha256: str = ""

    @property
    def key(self) -> tuple:
        """What a newer result replaces an older one by: (problem, variant, case, direction)."""
        return self.problem, self.variant, self.case, self.direction

    def as_dict(self) -> dict:
        return asdict(self)


def relative_error(value: torch.Tensor, reference: torch.Tensor) -> tuple[float, str]:
    """Relative error of ``value`` against ``reference`` (any shapes, same numel).

    Non-finite elements must match the reference exactly (same inf sign, NaN where
    NaN); the rest is compared by ||value - reference|| / ||reference|| (the
    absolute norm where the reference norm is 0). Returns (error, problem found);
    error is inf when non-finite elements disagree.
    """
    value = value.detach().double().reshape(-1)
    reference = reference.detach().double().reshape(-1).to(value.device)
    ref_finite = torch.isfinite(reference)
    nonfinite_mismatch = ~ref_finite & ~((value == reference) | (value.isnan() & reference.isnan()))
    if nonfinite_mismatch.any():
        i = int(nonfinite_mismatch.nonzero()[0])
        return float("inf"), f"element {i}: got {value[i].item()}, reference {reference[i].item()}"
    if not torch.isfinite(value[ref_finite]).all():
        i = int((ref_finite & ~torch.isfinite(value)).nonzero()[0])
        return float("inf"), f"element {i}: got {value[i].item()} where the reference is finite ({reference[i].item()})"
    diff = torch.linalg.vector_norm(value[ref_finite] - reference[ref_finite]).item()
    scale = torch.linalg.vector_norm(reference[ref_finite]).item()
    return (diff / scale if scale > 0 else diff), ""


def rounding_allowance(loss64: torch.Tensor, grad64: torch.Tensor, dtype: torch.dtype) -> tuple[float, float]:
    """(loss, gradient) relative errors of the float64 results merely rounded to the 16-bit ``dtype``;
    ``grad64`` is the gradient for grad_loss = :data:`GRAD_LOSS`.

    The gradient's is the larger of two roundings: once (a backward that computes dL/dp with
    grad_loss), and twice (a rung that writes dL/dp for grad_loss = 1 in its forward, rounded to
    ``dtype``, then scales it by grad_loss in the backward and rounds again: losslab's fused rungs,
    Liger's losses). Among normal numbers the second rounding is inside the eps bound; below the
    smallest normal the spacing is absolute, and rounding twice costs about 1.25 times rounding
    once (the first error, scaled by 0.75, adds to the second: sqrt(1 + 0.75^2)).
    """
    def error(rounded, exact):  # no allowance where the rounding overflows: that result must match
        value = relative_error(rounded, exact)[0]
        return value if math.isfinite(value) else 0.0

    unit = (grad64 / GRAD_LOSS).to(dtype)  # what the forward writes (grad_loss = 1)
    twice = (unit.float() * GRAD_LOSS).to(dtype)
    return error(loss64.to(dtype), loss64), max(error(grad64.to(dtype), grad64), error(twice, grad64))


def resolve(problem: problems.Problem, variant) -> tuple[str, Callable, Callable, Callable]:
    """(name, op, launch_forward, launch_backward) of ``variant``: the name of one of the
    problem's rungs, or an object with ``name``, ``__call__`` (the op) and the problem
    launchers' ``launch_forward(inputs, out=, needs_grad=, grad_out=)`` and
    ``launch_backward(saved, grad_loss, out=)`` methods (e.g. ``losslab.teach.custom.CustomVariant``)."""
    variant = find_variant(problem, variant) if isinstance(variant, str) else variant
    if isinstance(variant, str):
        return (variant, get_variant(problem, variant), functools.partial(problem.launch_forward, variant),
                functools.partial(problem.launch_backward, variant))
    return variant.name, variant, variant.launch_forward, variant.launch_backward


def check_inputs(problem: problems.Problem, variant, inputs: tuple[torch.Tensor, ...], case: str,
                 seed: int | None = None) -> list[CheckResult]:
    """Check ``variant`` of ``problem`` on the given inputs: forward, backward, written outputs.

    ``variant`` is a rung's name or a variant object (see :func:`resolve`).
    Returns a forward and a backward CheckResult. Against the float64 reference:

    * loss: relative error |loss - loss64| / |loss64| <= the loss tolerance of the
      inputs' dtype (absolute error where loss64 == 0), for 16-bit inputs plus
      :func:`rounding_allowance`'s (as the gradient's); the output must have the
      reference's shape (0-d);
    * gradient: ||g - g64|| / ||g64|| <= the gradient tolerance, over the finite elements; where
      g64 is exactly 0 but made of terms that cancel (the problem's ``cancelled_gradient_scale``,
      e.g. cosine similarity of one-element rows), ||g|| over the size of those terms;
    * inf and NaN must appear exactly where the reference has them;
    * every output element is written: the kernels are run again into buffers
      poisoned with NaN, and must reproduce the first results bitwise (which also
      shows the run is deterministic); not for a variant without launchers (the public
      operator, ``variants.operator_variant``).
    """
    variant, op, launch_forward, launch_backward = resolve(problem, variant)
    shape = tuple(inputs[0].shape)
    loss64, grad64 = problem.reference_float64(*inputs)
    loss_rtol, grad_rtol = TOLERANCES[inputs[0].dtype]
    grad_loss = torch.tensor(GRAD_LOSS, device=inputs[0].device)
    grad64 = grad64 * GRAD_LOSS
    if inputs[0].dtype != torch.float32:  # 16-bit: the best a result in that dtype can do
        loss_allowance, grad_allowance = rounding_allowance(loss64, grad64, inputs[0].dtype)
        loss_rtol, grad_rtol = loss_rtol + loss_allowance, grad_rtol + grad_allowance
    expected_shape = problem.reference(*inputs).shape

    # detach() keeps the storage offset: a clone would realign a misaligned input
    predictions = inputs[0].detach().requires_grad_(True)
    loss = op(predictions, *inputs[1:])
    # a 1-element loss of the wrong shape still gets its gradient: the shape is reported below
    loss.backward(grad_loss.reshape(loss.shape) if loss.numel() == 1 else grad_loss)
    grad = predictions.grad

    def result(direction, error, tolerance, detail):
        return CheckResult(problem.name, variant, case, shape, direction, error, tolerance,
                           passed=not detail and error <= tolerance, detail=detail, seed=seed)

    forward_detail = ""
    if loss.shape != expected_shape:
        forward_detail = f"output shape {tuple(loss.shape)}, reference {tuple(expected_shape)}"
    loss_error, found = relative_error(loss, loss64)
    forward_detail = forward_detail or found
    backward_error, backward_detail = relative_error(grad, grad64)
    cancelled = problem.cancelled_gradient_scale(*inputs) if not grad64.any() else None  # exactly 0
    if cancelled is not None and not backward_detail:  # measured against the terms that cancel
        backward_error /= cancelled * GRAD_LOSS

    # Run the launchers again into NaN-poisoned outputs: an element the kernels
    # skip stays NaN, and any difference from the first run shows non-determinism.
    if launch_forward is not None:  # the public operator's kernels are reached only through the call
        poisoned_loss = torch.full((), float("nan"), device=loss.device, dtype=loss.dtype)
        poisoned_grad = torch.full_like(grad, float("nan"))
        rerun_loss, saved = launch_forward(inputs, out=poisoned_loss, needs_grad=True, grad_out=poisoned_grad)
        rerun_grad = launch_backward(saved, grad_loss, out=poisoned_grad)
        if not forward_detail and not torch.equal(rerun_loss.nan_to_num(), loss.detach().nan_to_num()):
            forward_detail = (f"second run differs: {rerun_loss.item()} vs {loss.item()} "
                              "(unwritten or non-deterministic)")
        if not backward_detail and not torch.equal(rerun_grad.nan_to_num(), grad.nan_to_num()):
            bad = int((rerun_grad.nan_to_num() != grad.nan_to_num()).reshape(-1).nonzero()[0])
            backward_detail = (f"second run into a NaN-poisoned buffer differs at element {bad} "
                               "(an element left unwritten, or a non-deterministic result)")
    return [result("forward", loss_error, loss_rtol, forward_detail),
            result("backward", backward_error, grad_rtol, backward_detail)]


def check_variant(problem: problems.Problem, variant, shape: tuple[int, int], *, seed: int | None = None,
                  device: str = "cuda", dtype: torch.dtype = torch.float32) -> list[CheckResult]:
    """Check ``variant`` on fresh random ``dtype`` inputs of ``shape`` (a new seed per call unless given)."""
    seed = secrets.randbits(31) if seed is None else seed
    inputs = problem.make_inputs(shape, seed=seed, device=device, dtype=dtype)
    name = str(dtype).removeprefix("torch.")
    return check_inputs(problem, variant, inputs, f"random {shape[0]}x{shape[1]} {name}", seed=seed)


def check_edge_cases(problem: problems.Problem, variant, device: str = "cuda") -> list[CheckResult]:
    """Check ``variant`` on each of the problem's named edge cases."""
    results = []
    for case, inputs in problem.edge_cases(device).items():
        results += check_inputs(problem, variant, inputs, case)
    return results


def check_problem(problem: problems.Problem, variants: list | None = None, sizes: list[str] | None = None,
                  *, edge_cases: bool = True, device: str = "cuda", progress: bool = True) -> list[CheckResult]:
    """Check several variants (default: all; rung names or variant objects, see :func:`resolve`)
    at several named sizes (default: all of the problem's sizes) in every dtype each takes, then
    on the edge cases. Prints progress to stdout."""
    variants = list(problem.variants if variants is None else variants)
    sizes = list(sizes or problem.sizes)
    results = []
    for variant in variants:
        name = variant if isinstance(variant, str) else variant.name
        for size in sizes:
            for dtype in (problem.dtypes(variant) if isinstance(variant, str) else variant.dtypes):
                if progress:
                    print(f"  checking {problem.name} {name} at {size} {problem.sizes[size]} {dtype} ...", flush=True)
                results += check_variant(problem, variant, problem.sizes[size], device=device, dtype=dtype)
        if edge_cases:
            if progress:
                print(f"  checking {problem.name} {name} on the edge cases ...", flush=True)
            results += check_edge_cases(problem, variant, device=device)
    return results


def check_table_text(results: list[CheckResult]) -> str:
    """A fixed-width text table of check results, one line each."""
    lines = [f"{'variant':<14} {'direction':<9} {'case':<46} {'rel. error':>10} {'tol':>7}  result"]
    for r in results:
        verdict = "ok" if r.passed else f"FAIL {r.detail}".rstrip()
        lines.append(f"{r.variant:<14} {r.direction:<9} {r.case[:46]:<46} {r.error:>10.2e} "
                     f"{r.tolerance:>7.0e}  {verdict}")
    return "\n".join(lines)


def cluster_edge_cases(device="cuda") -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The edge cases on rows the cluster rung splits (12 x 40003 and 9 x 40001 logits, float32,
    int64 targets): ignored rows, every row ignored, logits of +-1e4, NaN in the first and the
    last rank's slice, rows at odd offsets. Split over several CTAs when the slices are small
    (``cluster_tune(8, 4096, clusters)``)."""
    spec = cross_entropy.PROBLEM
    x, t = spec.make_inputs((12, 40003), seed=2, device=device)
    ignored = t.clone()
    ignored[::3] = cross_entropy.IGNORE_INDEX
    huge = (x * 2 - 1) * 1e4
    huge_t = t.clone()
    huge_t[::2] = huge[::2].argmax(-1)
    x_nan = x.clone()
    x_nan[3, 17] = float("nan")  # in rank 0's slice
    x_nan[5, 39000] = float("nan")  # in the last rank's
    return {"some rows ignored": (x, ignored), "every row ignored": (x, torch.full_like(t, cross_entropy.IGNORE_INDEX)),
            "logits of +-1e4": (huge, huge_t), "NaN in two logits": (x_nan, t),
            "rows at odd offsets": spec.make_inputs((9, 40001), seed=4, device=device)}
