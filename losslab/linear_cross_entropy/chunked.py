"""The chunked algorithm: for each chunk of token rows, the logits by one cuBLAS GEMM into a
reused buffer, the loss's step over them in place (:func:`kernels.rows`), then the input's and the
weight's gradients by two more GEMMs (the weight's accumulated with beta = 1, in its dtype).
One function for the forward (gradients for grad_output = 1) and one for reduction none's backward."""
from __future__ import annotations

import torch

from losslab.linear_cross_entropy.kernels import rows

REDUCTIONS = {"none": 0, "mean": 1, "sum": 2}  # torch's Reduction enum


def math_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of the row losses and statistics: float64 for float64 inputs, else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def check_target_range(target: torch.Tensor, vocab: int, ignore_index: int) -> None:
    """Raises ValueError naming the first class index outside [0, vocab) that is not ``ignore_index``
    (one reduction over the targets and, on a GPU, one wait for it: PyTorch stops with a device-side assert)."""
    bad = (target != ignore_index) & ((target < 0) | (target >= vocab))
    if bool(bad.any()):
        row = int(bad.nonzero()[0, 0])
        raise ValueError(f"target: class index {int(target[row])} at row {row} is outside [0, {vocab}) "
                         f"and is not ignore_index ({ignore_index})")


def stats(target: torch.Tensor, weight: torch.Tensor | None, vocab: int, ignore_index: int,
          dtype: torch.dtype) -> torch.Tensor:
    """(2,) of ``dtype``: the mean's divisor (the sum of w_t over the rows not ignored, their count
    without weights: PyTorch's, also with label smoothing) and W = sum_j w_j (V without weights)."""
    kept = target != ignore_index
    if weight is None:
        return torch.stack([kept.sum().to(dtype), torch.tensor(float(vocab), dtype=dtype, device=target.device)])
    w = weight.to(dtype)
    safe = torch.where(kept & (target >= 0) & (target < vocab), target, 0)  # never an index out of range
    return torch.stack([(w[safe] * kept).sum(), w.sum()])


def _logits(out: torch.Tensor, x: torch.Tensor, linear_weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    if bias is None:
        torch.mm(x, linear_weight.t(), out=out)
    else:
        torch.addmm(bias, x, linear_weight.t(), out=out)


def forward(input: torch.Tensor, linear_weight: torch.Tensor, target: torch.Tensor, bias: torch.Tensor | None,
            weight: torch.Tensor | None, reduction: int, ignore_index: int, label_smoothing: float, softcap: float,
            chunk_rows: int, needs: tuple[bool, bool, bool], wide: bool = False, check_targets: bool = True):
    """The loss and, for reduction mean/sum, the gradients it needs for grad_output = 1.

    Args:
        input: (N, H) contiguous; linear_weight: (V, H); target: (N,) int64; bias: (V,) or None;
            weight: (V,) class weights or None (all of input's dtype and device).
        reduction: :data:`REDUCTIONS`' code; chunk_rows: token rows per chunk (>= 1).
        needs: which of (input, linear_weight, bias) want a gradient (ignored for reduction none).
        wide: accumulate the weight's gradient in float32 (cuBLAS's addmm with out_dtype), cast to its
            dtype at the end: V * H * 4 bytes more, and a weight-sized cast; else in its own dtype.
        check_targets: run :func:`check_target_range` first (else a target out of range makes its row NaN).
    Returns (loss, grad_input, grad_weight, grad_bias): the loss 0-d (N, for none) in input's dtype;
    each gradient in its tensor's dtype, or None where not needed. Extra memory: one (chunk_rows, V)
    buffer of input's dtype, the gradients, (N,) row losses.
    Raises:
        ValueError: a target outside [0, V) that is not ignore_index (:func:`check_target_range`).
    """
    count, vocab = input.shape[0], linear_weight.shape[0]
    if check_targets:
        check_target_range(target, vocab, ignore_index)
    math = math_dtype(input.dtype)
    row_stats = stats(target, weight, vocab, ignore_index, math)
    class_weight = None if weight is None else weight.to(math).contiguous()
    row_losses = torch.empty(count, dtype=math, device=input.device)
    write_grad = reduction != REDUCTIONS["none"] and any(needs)
    wants = needs if write_grad else (False, False, False)
    grad_input = torch.empty_like(input) if wants[0] else None
    grad_weight = _zeros_like_weight(linear_weight, wide) if wants[1] else None
    grad_bias = torch.zeros(vocab, dtype=math, device=input.device) if wants[2] else None
    buffer = torch.empty(min(chunk_rows, count), vocab, dtype=input.dtype, device=input.device)
    for start in range(0, count, chunk_rows):
        end = min(start + chunk_rows, count)
        x, logits = input[start:end], buffer[:end - start]
        _logits(logits, x, linear_weight, bias)
        rows(logits, target[start:end], class_weight, row_stats, None, row_losses[start:end],
             ignore_index=ignore_index, label_smoothing=label_smoothing, softcap=softcap,
             mean=reduction == REDUCTIONS["mean"], write_grad=write_grad)
        _gradients(logits, x, linear_weight, grad_input, grad_weight, grad_bias, start, end)
    if reduction == REDUCTIONS["none"]:
        loss = row_losses
    else:
        loss = row_losses.sum()
        if reduction == REDUCTIONS["mean"]:
            loss = loss / row_stats[0]
    return (loss.to(input.dtype), grad_input, _narrowed(grad_weight, linear_weight),
            None if grad_bias is None else grad_bias.to(bias.dtype))


def _zeros_like_weight(linear_weight: torch.Tensor, wide: bool) -> torch.Tensor:
    return torch.zeros_like(linear_weight, dtype=torch.float32 if wide and linear_weight.dtype in (
        torch.bfloat16, torch.float16) else linear_weight.dtype)


def _narrowed(grad_weight: torch.Tensor | None, linear_weight: torch.Tensor) -> torch.Tensor | None:
    return None if grad_weight is None else grad_weight.to(linear_weight.dtype)


def _gradients(grad_logits, x, linear_weight, grad_input, grad_weight, grad_bias, start, end) -> None:
    if grad_input is not None:
        torch.mm(grad_logits, linear_weight, out=grad_input[start:end])
    if grad_weight is not None and grad_weight.dtype == x.dtype:  # beta = 1: rounded once per chunk
        torch.addmm(grad_weight, grad_logits.t(), x, out=grad_weight)
    elif grad_weight is not None and grad_weight.is_cuda:  # a float32 accumulator (torch >= 2.8)
        torch.addmm(grad_weight, grad_logits.t(), x, out_dtype=torch.float32, out=grad_weight)
    elif grad_weight is not None:  # the CPU has no addmm with out_dtype: the GEMM in float32
        grad_weight += torch.mm(grad_logits.t().to(grad_weight.dtype), x.to(grad_weight.dtype))
    if grad_bias is not None:
        grad_bias += grad_logits.sum(dim=0, dtype=grad_bias.dtype)


def backward_none(input: torch.Tensor, linear_weight: torch.Tensor, target: torch.Tensor, bias: torch.Tensor | None,
                  weight: torch.Tensor | None, grad_output: torch.Tensor, ignore_index: int, label_smoothing: float,
                  softcap: float, chunk_rows: int, needs: tuple[bool, bool, bool], wide: bool = False):
    """Reduction none's backward: the forward had no grad_output per row, so each chunk's logits are
    computed again (a fourth GEMM: 8 instead of 6 * N * H * V flops) and its gradient written scaled
    by ``grad_output`` (N,). Returns (grad_input, grad_weight, grad_bias), None where not needed."""
    count, vocab = input.shape[0], linear_weight.shape[0]
    math = math_dtype(input.dtype)
    row_stats = stats(target, weight, vocab, ignore_index, math)
    class_weight = None if weight is None else weight.to(math).contiguous()
    scale = grad_output.to(math).contiguous()
    row_losses = torch.empty(count, dtype=math, device=input.device)
    grad_input = torch.empty_like(input) if needs[0] else None
    grad_weight = _zeros_like_weight(linear_weight, wide) if needs[1] else None
    grad_bias = torch.zeros(vocab, dtype=math, device=input.device) if needs[2] else None
    buffer = torch.empty(min(chunk_rows, count), vocab, dtype=input.dtype, device=input.device)
    for start in range(0, count, chunk_rows):
        end = min(start + chunk_rows, count)
        x, logits = input[start:end], buffer[:end - start]
        _logits(logits, x, linear_weight, bias)
        rows(logits, target[start:end], class_weight, row_stats, scale[start:end], row_losses[start:end],
             ignore_index=ignore_index, label_smoothing=label_smoothing, softcap=softcap, mean=False, write_grad=True)
        _gradients(logits, x, linear_weight, grad_input, grad_weight, grad_bias, start, end)
    return grad_input, _narrowed(grad_weight, linear_weight), None if grad_bias is None else grad_bias.to(bias.dtype)
