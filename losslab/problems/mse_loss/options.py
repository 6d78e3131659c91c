"""PyTorch's options of ``F.mse_loss`` (reduction) on the operator kernels
(``kernels/mse_loss/options.h``): what :mod:`losslab.nn` calls."""
from __future__ import annotations

import torch

from losslab.problems.base import Cost
from losslab.problems.launch import launch, scratch
from losslab.problems.mse_loss.host import MAX_PARTIALS

REDUCTIONS = {"none": 0, "mean": 1, "sum": 2}


def options_divisor(numel: int, reduction: int) -> float:
    """What the sum is divided by: the number of elements for mean, else 1."""
    return float(max(1, numel)) if reduction == REDUCTIONS["mean"] else 1.0


def options_forward(ext, rung: str, input: torch.Tensor, target: torch.Tensor, reduction: int,
                    write_grad: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run ``rung``'s options forward (kernels/mse_loss/options.h) on checked inputs.

    Args:
        input: any shape, contiguous, float32/bfloat16/float16, on CUDA; target: the same
            shape, dtype and device.
        reduction: a REDUCTIONS code; write_grad: fused writes dL/dinput for grad_loss = 1
            (not for none).
    Returns the loss in the inputs' dtype (the inputs' shape for none, else 0-d) and the
    gradient or None.
    Raises:
        RuntimeError: the launcher returned a CUDA error.
    """
    device, n = input.device, input.numel()
    none = reduction == REDUCTIONS["none"]
    partials, _keep = scratch(device, 4 * (MAX_PARTIALS + 4))  # the stream's: no one reads them after
    loss = torch.empty((), device=device, dtype=input.dtype)
    terms = torch.empty_like(input) if none else None
    grad = torch.empty_like(input) if write_grad else None
    launch(getattr(ext, f"{rung}_options_forward"), device, input, target, partials, loss, terms, grad, n,
           options_divisor(n, reduction), input.dtype)
    return (terms if none else loss), grad


def options_backward(ext, input: torch.Tensor, target: torch.Tensor, grad_loss: torch.Tensor,
                     reduction: int) -> torch.Tensor:
    """vectorized's options backward: dL/dinput = 2 (input - target) * grad_loss / divisor (the
    inputs' shape and dtype); ``grad_loss`` is 0-d, or the inputs' shape for reduction none.

    Raises:
        RuntimeError: the launcher returned a CUDA error.
    """
    grad = torch.empty_like(input, memory_format=torch.contiguous_format)
    none = reduction == REDUCTIONS["none"]
    upstream = grad_loss.to(device=grad.device, dtype=grad.dtype)
    launch(ext.vectorized_options_backward, grad.device, input, target, None if none else upstream,
           upstream.contiguous() if none else None, grad, grad.numel(), options_divisor(grad.numel(), reduction),
           grad.dtype)
    return grad


def options_cost(numel: int, direction: str, dtype: torch.dtype = torch.float32, *,
                 reduction: str = "mean") -> Cost:
    """Minimum traffic (bytes) and arithmetic of the options forward/backward over ``numel`` elements.

    The forward reads input and target and writes the 0-d loss (the n terms for none): a
    subtraction, a multiply and an add per element. The backward reads input and target
    (and the n upstream gradients for none) and writes dL/dinput: a subtraction and a
    multiply. forward_backward: the single fused pass (not for none).

    Raises:
        ValueError: an unknown direction, or forward_backward with reduction none.
    """
    n = numel
    size = torch.finfo(dtype).bits // 8
    none = reduction == "none"
    if direction == "forward":
        return Cost(2 * n * size, n * size if none else size, 3 * n, 0)
    if direction == "backward":
        return Cost(2 * n * size + (n * size if none else size), n * size, 2 * n, 0)
    if direction == "forward_backward":
        if none:
            raise ValueError("direction: reduction none has no single fused pass (its backward needs the "
                             "upstream gradient of each element)")
        return Cost(2 * n * size, n * size + size, 4 * n, 0)
    raise ValueError(f"direction: expected one of forward, backward, forward_backward, got {direction!r}")
