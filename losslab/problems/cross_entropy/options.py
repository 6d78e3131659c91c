"""PyTorch's options of ``F.cross_entropy`` (reductions, class weights, probability targets,
label smoothing, any ignore_index) on the operator kernels (``kernels/cross_entropy/options.h``):
what :mod:`losslab.nn` calls."""
from __future__ import annotations

from collections.abc import Sequence

import torch

from losslab.problems.base import Cost
from losslab.problems.cross_entropy.host import INDEX_BYTES
from losslab.problems.launch import DTYPE_CODES, launch, launch_values, scratch

REDUCTIONS = {"none": 0, "mean": 1, "sum": 2}  # torch's Reduction enum; kernels/cross_entropy/options.h
OPTIONS_STATE_NAMES = ("row_max", "row_log_sum", "row_coef", "denominators")
WEIGHT_BYTES = 4  # float32 weights


def options_empty_state(logits: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """What an options forward writes for its backward, unwritten: row_max, row_log_sum and
    row_coef (N,) float32, denominators (2,) float32, on the logits' device."""
    rows, device = logits.shape[0], logits.device
    row = [torch.empty(rows, device=device, dtype=torch.float32) for _ in range(3)]
    return (*row, torch.empty(2, device=device, dtype=torch.float32))


def options_forward(ext, rung: str, logits: torch.Tensor, targets: torch.Tensor | None, probs: torch.Tensor | None,
                    weight: torch.Tensor | None, ignore_index: int, label_smoothing: float, reduction: int,
                    write_grad: bool, keep_state: bool = True,
                    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...], torch.Tensor | None]:
    """Run ``rung``'s options forward (kernels/cross_entropy/options.h) on checked inputs.

    Args:
        logits: (N, C) contiguous, float32/bfloat16/float16, on a CUDA device.
        targets: (N,) int64 class indices, or None; probs: (N, C) class probabilities of the
            logits' dtype, or None (exactly one of the two).
        weight: (C,) float32 contiguous, or None.
        reduction: a REDUCTIONS code; write_grad: fused writes dL/dlogits for grad_loss = 1
            (reduction sum or mean only).
        keep_state: return the backward's state; False writes no row statistics and keeps
            the denominators in the stream's scratch (nothing allocated) and returns ``()``.
    Returns the loss in the logits' dtype ((N,) for none, else 0-d), the backward's state
    (OPTIONS_STATE_NAMES; unwritten rows when the gradient was written) and the gradient or None.
    Never waits for the GPU: a class index outside [0, C) that is not ignore_index makes its row NaN.
    """
    rows, cols = logits.shape
    device = logits.device
    none = reduction == REDUCTIONS["none"]
    # The stream's scratch: the launcher's workspace (2N + 4 words) after 16 bytes for the
    # denominators where the state is not kept.
    base, _keep = scratch(device, 4 * (2 * rows + 8))
    state = options_empty_state(logits) if keep_state else ()
    # addresses, 0 for null: launch()'s conversion of 19 arguments costs microseconds of host time
    rows_at = [t.data_ptr() for t in state[:3]] if keep_state and not write_grad else (0, 0, 0)  # 0: not written
    row_losses = torch.empty(rows, device=device, dtype=torch.float32) if none else None
    loss = None if none else logits.new_empty(())  # written in the logits' dtype
    grad = torch.empty_like(logits) if write_grad else None
    launch_values(getattr(ext, f"{rung}_options_forward"), device, logits.data_ptr(), _address(targets),
                  _address(probs), _address(weight), state[3].data_ptr() if keep_state else base,
                  _address(row_losses), *rows_at, base + 16, _address(loss), _address(grad), rows, cols,
                  ignore_index, float(label_smoothing), reduction, DTYPE_CODES[logits.dtype])
    return (row_losses.to(logits.dtype) if none else loss), state, grad


def _address(tensor: torch.Tensor | None) -> int:
    return 0 if tensor is None else tensor.data_ptr()


def options_backward(ext, logits: torch.Tensor, targets: torch.Tensor | None, probs: torch.Tensor | None,
                     weight: torch.Tensor | None, state: Sequence[torch.Tensor], grad_loss: torch.Tensor,
                     ignore_index: int, label_smoothing: float, reduction: int) -> torch.Tensor:
    """vectorized's options backward: dL/dlogits, (N, C) in the logits' dtype, from the
    forward's state; ``grad_loss`` is 0-d, or (N,) for reduction none."""
    grad = torch.empty_like(logits, memory_format=torch.contiguous_format)
    grad_loss = grad_loss.to(device=grad.device, dtype=torch.float32).contiguous()
    launch(ext.vectorized_options_backward, grad.device, logits, targets, probs, weight, state[3], *state[:3],
           grad_loss, grad, *grad.shape, ignore_index, float(label_smoothing), reduction, grad.dtype)
    return grad


def options_cost(shape: tuple[int, int], direction: str, dtype: torch.dtype = torch.float32, *,
                 weight: bool = False, probs: bool = False, label_smoothing: float = 0.0,
                 reduction: str = "mean") -> Cost:
    """Minimum traffic and arithmetic of the options forward/backward at (rows, classes) ``shape``.

    Each option adds what it must read: ``probs`` the (N, C) class probabilities (in place of
    the N int64 indices), ``weight`` the C float32 weights (each once: a row re-reads them
    from cache) and, for class indices, w[t] per row; reduction none writes N losses
    instead of one (and its backward reads N upstream gradients). Label smoothing and
    probabilities add 3 flops per element (a_j, a_j * x_j, the sum) in the forward and 2 in
    the backward; the row statistics the backward reads (max, log-sum, A: 12 bytes a row)
    are not part of the forward's minimum.
    """
    rows, cols = shape
    n = rows * cols
    size = torch.finfo(dtype).bits // 8
    targets = n * size if probs else rows * INDEX_BYTES
    weights = cols * WEIGHT_BYTES if weight else 0
    if weight and not probs:
        weights += rows * WEIGHT_BYTES  # w[t] of each row, gathered
    extra = (3 * n) if (probs or label_smoothing > 0) else 0
    out = rows * size if reduction == "none" else size
    upstream = rows * 4 if reduction == "none" else 4
    forward = Cost(n * size + targets + weights, out, 3 * n + 3 * rows + extra, n + rows)
    if direction == "forward":
        return forward
    backward = Cost(n * size + targets + weights + rows * 12 + 8 + upstream, n * size,
                    4 * n + rows + (2 * n if extra else 0), n)
    if direction == "backward":
        return backward
    if direction == "forward_backward":
        return Cost(n * size + targets + weights + 8, n * size + out,
                    forward.flops + 3 * n, n + rows)
    raise ValueError(f"direction: expected one of forward, backward, forward_backward, got {direction!r}")
