"""PyTorch's options of ``F.kl_div`` (reductions, ``log_target``) and losslab's ``log_input`` on the
operator kernels (``kernels/kl_div/options.h``): what :mod:`losslab.nn` calls."""
from __future__ import annotations

from collections.abc import Sequence

import torch

from losslab.problems.base import Cost
from losslab.problems.launch import launch, scratch

REDUCTIONS = {"none": 0, "mean": 1, "sum": 2, "batchmean": 3}
MAX_PARTIALS = 1024  # KL_DIV_OPTIONS_MAX_BLOCKS of kernels/kl_div/options.h; its scratch holds 4 floats more


def options_divisor(shape: Sequence[int], reduction: int) -> float:
    """What the options forward divides the sum by: 1 (sum), the number of elements (mean),
    the batch size shape[0] (batchmean; 1 for a 0-d input), and 1 for none (unused)."""
    if reduction == REDUCTIONS["mean"]:
        return float(max(1, _numel(shape)))
    if reduction == REDUCTIONS["batchmean"] and len(shape) > 0:
        return float(shape[0])
    return 1.0


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def options_forward(ext, rung: str, inputs: torch.Tensor, targets: torch.Tensor, reduction: int, log_target: bool,
                    log_input: bool, write_grad: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run ``rung``'s options forward (kernels/kl_div/options.h) on checked inputs.

    Args:
        inputs: log-probabilities (probabilities without ``log_input``), any shape, contiguous,
            float32/bfloat16/float16, on CUDA; targets: the same shape, dtype and device.
        reduction: a REDUCTIONS code; write_grad: fused writes dL/dinput for grad_loss = 1
            (not for none).
    Returns the loss in the inputs' dtype (the inputs' shape for none, else 0-d) and the
    gradient or None.
    """
    device, n = inputs.device, inputs.numel()
    none = reduction == REDUCTIONS["none"]
    partials, _keep = scratch(device, 4 * (MAX_PARTIALS + 4))  # the stream's: no one reads them after
    loss = torch.empty((), device=device, dtype=inputs.dtype)
    terms = torch.empty_like(inputs) if none else None
    grad = torch.empty_like(inputs) if write_grad else None
    launch(getattr(ext, f"{rung}_options_forward"), device, inputs, targets, partials, loss, terms, grad, n,
           int(log_target), int(log_input), options_divisor(inputs.shape, reduction), inputs.dtype)
    return (terms if none else loss), grad


def options_backward(ext, inputs: torch.Tensor | None, targets: torch.Tensor, grad_loss: torch.Tensor, reduction: int,
                     log_target: bool, log_input: bool) -> torch.Tensor:
    """vectorized's options backward: dL/dinput (the targets' shape and dtype), from the
    targets alone with ``log_input`` (``inputs`` may be None), else from the inputs too;
    ``grad_loss`` is 0-d, or the inputs' shape for reduction none.

    Raises:
        ValueError: ``inputs`` is None without ``log_input``.
    """
    if inputs is None and not log_input:
        raise ValueError("inputs: the backward of probabilities (log_input False) divides by them; got None")
    grad = torch.empty_like(targets, memory_format=torch.contiguous_format)
    none = reduction == REDUCTIONS["none"]
    scalar = None if none else grad_loss.to(device=grad.device, dtype=grad.dtype)
    terms = grad_loss.to(device=grad.device, dtype=grad.dtype).contiguous() if none else None
    launch(ext.vectorized_options_backward, grad.device, None if log_input else inputs.contiguous(), targets, scalar,
           terms, grad, grad.numel(), int(log_target), int(log_input), options_divisor(targets.shape, reduction),
           grad.dtype)
    return grad


def options_cost(numel: int, direction: str, dtype: torch.dtype = torch.float32, *, reduction: str = "batchmean",
                 log_target: bool = False, log_input: bool = True) -> Cost:
    """Minimum traffic and arithmetic of the options forward/backward over ``numel`` elements.

    The forward reads input and target and writes the 0-d loss (the n terms for
    reduction none); per element xlogy(t, t) - t * input is a log and 3 flops (with
    log_target exp(t) * (t - input): an exp and 2 flops; without log_input a log more). The
    backward reads the target (dL/dinput = -t * scale; -exp(t) * scale, an exp, with
    log_target), the input too without log_input (a divide), and the n upstream gradients for
    none. forward_backward: the single fused pass.
    """
    n = numel
    size = torch.finfo(dtype).bits // 8
    none = reduction == "none"
    out = n * size if none else size
    flops, special = (2 * n, n) if log_target else (3 * n, n)
    special += 0 if log_input else n
    if direction == "forward":
        return Cost(2 * n * size, out, flops, special)
    if direction == "backward":
        read = n * size + (n * size if none else 4) + (0 if log_input else n * size)
        return Cost(read, n * size, 2 * n + (0 if log_input else n), (n if log_target else 0))
    if direction == "forward_backward":
        if none:
            raise ValueError("direction: reduction none has no single fused pass (its backward needs the "
                             "upstream gradient of each element)")
        return Cost(2 * n * size, n * size + size, flops + n + (0 if log_input else n), special)
    raise ValueError(f"direction: expected one of forward, backward, forward_backward, got {direction!r}")
