"""PyTorch's options of ``F.triplet_margin_loss`` (margin, eps, swap, reductions; p = 2) on the operator
kernels (``kernels/triplet_margin_loss/options.h``), with the gradients of all three inputs: what
:mod:`losslab.nn` calls."""
from __future__ import annotations

import torch

from losslab.problems.base import Cost
from losslab.problems.launch import DTYPE_CODES, launch_values, scratch

REDUCTIONS = {"none": 0, "mean": 1, "sum": 2}  # torch's Reduction enum; kernels/triplet_margin_loss/options.h


def _address(tensor: torch.Tensor | None) -> int:
    return 0 if tensor is None else tensor.data_ptr()


def options_forward(ext, rung: str, anchor: torch.Tensor, positive: torch.Tensor, negative: torch.Tensor,
                    margin: float, eps: float, swap: bool, reduction: int, needs_grad: tuple[bool, bool, bool] = (
                        False, False, False)) -> tuple[torch.Tensor, tuple[torch.Tensor | None, ...]]:
    """Run ``rung``'s options forward (kernels/triplet_margin_loss/options.h) on checked inputs.

    Args:
        anchor, positive, negative: (N, D) contiguous, one dtype of float32/bfloat16/float16, on one
            CUDA device.
        reduction: a REDUCTIONS code; needs_grad: which of the three gradients fused writes in this
            pass, for grad_loss = 1 (reduction sum or mean only; all False for vectorized).
    Returns the loss in the inputs' dtype ((N,) for none, else 0-d) and the three gradients (None
    where not written). Never waits for the GPU.
    """
    rows = anchor.shape[0]
    device = anchor.device
    none = reduction == REDUCTIONS["none"]
    # the row losses (the output for none) and the launcher's 16 bytes: the stream's scratch otherwise
    row_losses = torch.empty(rows + 4, device=device, dtype=torch.float32) if none else None
    address, _keep = (row_losses.data_ptr(), None) if none else scratch(device, 4 * rows + 16)
    loss = None if none else anchor.new_empty(())
    grads = tuple(torch.empty_like(x) if wanted else None
                  for x, wanted in zip((anchor, positive, negative), needs_grad, strict=True))
    launch_values(getattr(ext, f"{rung}_options_forward"), device, anchor.data_ptr(), positive.data_ptr(),
                  negative.data_ptr(), address, _address(loss), *map(_address, grads), *anchor.shape, float(margin),
                  float(eps), int(swap), reduction, DTYPE_CODES[anchor.dtype])
    return (row_losses[:rows].to(anchor.dtype) if none else loss), grads


def options_backward(ext, anchor: torch.Tensor, positive: torch.Tensor, negative: torch.Tensor,
                     grad_loss: torch.Tensor, margin: float, eps: float, swap: bool, reduction: int,
                     needs_grad: tuple[bool, bool, bool]) -> tuple[torch.Tensor | None, ...]:
    """vectorized's options backward: the gradients ``needs_grad`` asks for, (N, D) each in the inputs'
    dtype (None for the others), from the inputs; ``grad_loss`` is 0-d, or (N,) for reduction none."""
    grads = tuple(torch.empty_like(x) if wanted else None
                  for x, wanted in zip((anchor, positive, negative), needs_grad, strict=True))
    grad_loss = grad_loss.to(device=anchor.device, dtype=torch.float32).contiguous()
    launch_values(ext.vectorized_options_backward, anchor.device, anchor.data_ptr(), positive.data_ptr(),
                  negative.data_ptr(), grad_loss.data_ptr(), *map(_address, grads), *anchor.shape, float(margin),
                  float(eps), int(swap), reduction, DTYPE_CODES[anchor.dtype])
    return grads


def options_cost(shape: tuple[int, int], direction: str, dtype: torch.dtype = torch.float32, *,
                 swap: bool = False, reduction: str = "mean", gradients: int = 3) -> Cost:
    """Minimum traffic and arithmetic of the options forward/backward at (N, D) ``shape``.

    ``swap`` adds the third distance (4 flops an element, one square root a row; 3 more flops an
    element in the backward); reduction none writes N losses (and its backward reads N upstream
    gradients); ``gradients`` is how many of the three (N, D) gradients are written.
    """
    rows, cols = shape
    n = rows * cols
    size = torch.finfo(dtype).bits // 8
    none = reduction == "none"
    out = rows * size if none else size
    upstream = rows * 4 if none else 4
    forward_flops = (12 if swap else 8) * n + 6 * rows
    grad_flops = (2 + gradients * (2 if swap else 1) + 2) * n
    roots = (3 if swap else 2) * rows
    if direction == "forward":
        return Cost(3 * n * size, out, forward_flops, roots)
    if direction == "backward":
        return Cost(3 * n * size + upstream, gradients * n * size, forward_flops + grad_flops, roots)
    if direction == "forward_backward":
        if none:
            raise ValueError("direction: reduction none has no single fused pass (its backward needs the "
                             "upstream gradient of each row)")
        return Cost(3 * n * size + size, gradients * n * size + size, forward_flops + grad_flops, roots)
    raise ValueError(f"direction: expected one of forward, backward, forward_backward, got {direction!r}")
