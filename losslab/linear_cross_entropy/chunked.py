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
        return torch.stack([kept.sum().to(dtype), torch.full((), float(vocab), dtype=dtype, device=target.device)])
    w = weight.to(dtype)
    safe = torch.where(kept & (target >= 0) & (target < vocab), target, 0)  # never an index out of range
    return torch.stack([(w[safe] * kept).sum(), w.sum()])


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
    if check_targets:
        check_target_range(target, linear_weight.shape[0], ignore_index)
    wants = needs if reduction != REDUCTIONS["none"] else (False, False, False)
    row_losses, row_stats, *grads = _chunks(input, linear_weight, target, bias, weight, None, ignore_index,
                                            label_smoothing, softcap, chunk_rows, reduction == REDUCTIONS["mean"],
                                            wants, wide)
    if reduction == REDUCTIONS["none"]:
        loss = row_losses
    else:
        loss = row_losses.sum()
        if reduction == REDUCTIONS["mean"]:
            loss = loss / row_stats[0]
    return (loss.to(input.dtype), *grads)


def backward_none(input: torch.Tensor, linear_weight: torch.Tensor, target: torch.Tensor, bias: torch.Tensor | None,
                  weight: torch.Tensor | None, grad_output: torch.Tensor, ignore_index: int, label_smoothing: float,
                  softcap: float, chunk_rows: int, needs: tuple[bool, bool, bool], wide: bool = False):
    """Reduction none's backward: the forward had no grad_output per row, so each chunk's logits are
    computed again (a fourth GEMM: 8 instead of 6 * N * H * V flops) and its gradient written scaled
    by ``grad_output`` (N,). Returns (grad_input, grad_weight, grad_bias), None where not needed."""
    _, _, *grads = _chunks(input, linear_weight, target, bias, weight, grad_output, ignore_index, label_smoothing,
                           softcap, chunk_rows, False, needs, wide)
    return tuple(grads)


def _chunks(input, linear_weight, target, bias, weight, row_scale, ignore_index, label_smoothing, softcap, chunk_rows,
            mean, wants, wide):
    """The chunk loop of both directions: (row losses, row stats, grad_input, grad_weight, grad_bias), each
    gradient None unless ``wants`` it; the gradients are written only if one is wanted."""
    count, vocab = input.shape[0], linear_weight.shape[0]
    math = math_dtype(input.dtype)
    row_stats = stats(target, weight, vocab, ignore_index, math)
    class_weight = None if weight is None else weight.to(math).contiguous()
    scale = None if row_scale is None else row_scale.to(math).contiguous()
    row_losses = torch.empty(count, dtype=math, device=input.device)
    grad_input = torch.empty_like(input) if wants[0] else None
    grad_weight = torch.zeros_like(linear_weight, dtype=torch.float32 if wide and linear_weight.dtype in (
        torch.bfloat16, torch.float16) else linear_weight.dtype) if wants[1] else None
    grad_bias = torch.zeros(vocab, dtype=math, device=input.device) if wants[2] else None
    buffer = torch.empty(min(chunk_rows, count), vocab, dtype=input.dtype, device=input.device)
    for start in range(0, count, chunk_rows):
        end = min(start + chunk_rows, count)
        x, logits = input[start:end], buffer[:end - start]
        if bias is None:
            torch.mm(x, linear_weight.t(), out=logits)
        else:
            torch.addmm(bias, x, linear_weight.t(), out=logits)
        rows(logits, target[start:end], class_weight, row_stats, None if scale is None else scale[start:end],
             row_losses[start:end], ignore_index=ignore_index, label_smoothing=label_smoothing, softcap=softcap,
             mean=mean, write_grad=any(wants))
        if grad_input is not None:
            torch.mm(logits, linear_weight, out=grad_input[start:end])
        if grad_weight is not None:
            _accumulate(grad_weight, logits, x)
        if grad_bias is not None:
            grad_bias += logits.sum(dim=0, dtype=grad_bias.dtype)
    return (row_losses, row_stats, grad_input, None if grad_weight is None else grad_weight.to(linear_weight.dtype),
            None if grad_bias is None else grad_bias.to(bias.dtype))


def _accumulate(grad_weight: torch.Tensor, grad_logits: torch.Tensor, x: torch.Tensor) -> None:
    """grad_weight += grad_logits^T x, by cuBLAS with beta = 1."""
    if grad_weight.dtype == x.dtype:  # rounded to the weight's dtype once per chunk
        torch.addmm(grad_weight, grad_logits.t(), x, out=grad_weight)
    elif grad_weight.is_cuda:  # a float32 accumulator (torch >= 2.8)
        torch.addmm(grad_weight, grad_logits.t(), x, out_dtype=torch.float32, out=grad_weight)
    else:  # the CPU has no addmm with out_dtype: the GEMM in float32
        grad_weight += torch.mm(grad_logits.t().to(grad_weight.dtype), x.to(grad_weight.dtype))
