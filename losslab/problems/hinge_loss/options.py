"""losslab.nn's options of the hinge loss (reductions none, mean and sum) on the operator kernels
(``kernels/hinge_loss/options.h``): what :mod:`losslab.problems.hinge_loss.functional` calls."""
from __future__ import annotations

import torch

from losslab.problems.hinge_loss.host import MAX_PARTIALS
from losslab.problems.launch import launch, scratch

REDUCTIONS = {"none": 0, "mean": 1, "sum": 2}  # torch's Reduction enum


def options_divisor(numel: int, reduction: int) -> float:
    """What the options forward divides the sum by: the number of elements for mean, else 1."""
    return float(numel) if reduction == REDUCTIONS["mean"] else 1.0


def options_forward(ext, rung: str, input: torch.Tensor, target: torch.Tensor, reduction: int,
                    write_grad: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run ``rung``'s options forward (kernels/hinge_loss/options.h) on checked inputs.

    Args:
        input: (B, D) contiguous, float32/bfloat16/float16, on CUDA; target: (D,) contiguous, its
            dtype and device (target[j] multiplies column j).
        reduction: a REDUCTIONS code; write_grad: fused writes dL/dinput for grad_loss = 1
            (not for none).
    Returns the loss in the input's dtype ((B, D) terms for none, else 0-d) and the gradient or None.
    """
    device = input.device
    rows, cols = input.shape
    none = reduction == REDUCTIONS["none"]
    partials, _keep = scratch(device, 4 * (MAX_PARTIALS + 4))  # the stream's: no one reads them after
    loss = torch.empty((), device=device, dtype=input.dtype)
    terms = torch.empty_like(input) if none else None
    grad = torch.empty_like(input) if write_grad else None
    launch(getattr(ext, f"{rung}_options_forward"), device, input, target, partials, loss, terms, grad, rows, cols,
           options_divisor(input.numel(), reduction), input.dtype)
    return (terms if none else loss), grad


def options_backward(ext, input: torch.Tensor, target: torch.Tensor, grad_loss: torch.Tensor,
                     reduction: int) -> torch.Tensor:
    """vectorized's options backward: dL/dinput ((B, D), the input's dtype) from the input and the
    target; ``grad_loss`` is 0-d, or (B, D) for reduction none."""
    grad = torch.empty_like(input)
    none = reduction == REDUCTIONS["none"]
    upstream = grad_loss.to(device=grad.device, dtype=grad.dtype)
    scalar, terms = (None, upstream.contiguous()) if none else (upstream, None)
    rows, cols = input.shape
    launch(ext.vectorized_options_backward, grad.device, input, target, scalar, terms, grad, rows, cols,
           options_divisor(input.numel(), reduction), grad.dtype)
    return grad

