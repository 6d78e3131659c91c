"""The log-sum-exp combination: every rank's per-row statistics into the global loss.

With rank r holding (m_r, s_r = sum over its slice of exp(x - m_r)), the whole row has
M = max_r m_r and S = sum_r s_r exp(m_r - M), so logsumexp(x) = M + log S: one exchange of the
tuples is enough (Milakov and Gimelshein, "Online normalizer calculation for softmax", 2018).
With label smoothing eps over C classes (PyTorch's definition) a row's loss is
(1 - eps)(lse - x_t) + eps (lse - sum_j x_j / C). Plain torch: the same on CPU and CUDA.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

REDUCTIONS = ("mean", "sum", "none")


@dataclass(frozen=True)
class Combined:
    """Per-row results of the combination, each [N] (float32, float64 for float64 logits).

    ``row_max`` and ``row_log_sum`` (M and log S) are what the backward needs; ``target_logit``
    is x_t (0 on an ignored row) and ``logit_sum`` is sum_j x_j over the whole vocabulary."""

    row_max: torch.Tensor
    row_log_sum: torch.Tensor
    target_logit: torch.Tensor
    logit_sum: torch.Tensor


def combine(gathered: torch.Tensor) -> Combined:
    """Combine the statistics of every rank, ``gathered`` [world, N, 4] as
    ``kernels.statistics`` writes them (max, sum of exp(x - max), target logit, sum of logits)."""
    part_max, part_sum, target_logit, logit_sum = gathered.unbind(-1)
    row_max = part_max.amax(0)
    row_sum = (part_sum * torch.exp(part_max - row_max)).sum(0)
    return Combined(row_max, row_sum.log(), target_logit.sum(0), logit_sum.sum(0))


def row_losses(combined: Combined, target: torch.Tensor, vocab_size: int, ignore_index: int,
               label_smoothing: float) -> torch.Tensor:
    """Each row's loss [N]: 0 where ``target`` is ``ignore_index``, NaN where it is outside
    [0, vocab_size) (never a host check); lse - x as (M - x) + log S, exact near the max."""
    c = combined
    loss = (c.row_max - c.target_logit) + c.row_log_sum
    if label_smoothing:
        uniform = (c.row_max - c.logit_sum / vocab_size) + c.row_log_sum
        loss = (1 - label_smoothing) * loss + label_smoothing * uniform
    in_range = (target >= 0) & (target < vocab_size)
    return torch.where(target == ignore_index, 0.0, torch.where(in_range, loss, torch.nan))


def kept_rows(losses: torch.Tensor, target: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """[N] of ``losses``' dtype: 1 for a row in the loss, 0 for an ignored one, NaN where its loss is
    NaN (a target out of range), so the backward's gradient there is NaN too."""
    valid = (target != ignore_index).to(losses.dtype)
    return torch.where(losses.isnan(), torch.nan, valid)


def reduce(losses: torch.Tensor, kept: torch.Tensor, target: torch.Tensor, ignore_index: int, reduction: str,
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """The loss as ``reduction`` asks ("mean" over the rows not ignored, as PyTorch: 0/0 = NaN when
    all are; "sum"; "none": [N]) and each row's weight in it [N] (dLoss/dloss_row, which the
    backward scales its gradient by), from the rows' ``losses`` and :func:`kept_rows`."""
    if reduction == "mean":
        count = (target != ignore_index).sum()
        return losses.sum() / count, kept / count.clamp_min(1)  # all ignored: NaN loss, zero gradient
    return (losses.sum() if reduction == "sum" else losses), kept
