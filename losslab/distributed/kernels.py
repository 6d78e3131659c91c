"""The per-rank steps of the vocabulary-parallel cross-entropy as ``torch.library`` operators.

``statistics`` (forward, before the collective), ``combine`` (forward, after it) and ``gradient``
(backward, no collective): on CUDA one kernel each from ``kernels/vocab_parallel/``; on CPU the
same algebra in plain torch (float64 stays float64, so the gloo tests check it exactly). Fake
kernels give shapes to ``torch.compile``. No operator communicates or synchronises the host.
"""
from __future__ import annotations

import functools

import torch

from losslab import build
from losslab.distributed import algebra
from losslab.problems.launch import launch

STATISTICS = 4  # floats per row and rank: max, sum of exp(x - max), target logit, sum of logits
COMBINED = 4  # rows of combine's output: row max, row log-sum, row loss, row weight
CUDA_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@functools.cache
def extension():
    """The kernels of ``kernels/vocab_parallel/``, built once (``build.load_extension``).

    Raises:
        build.BuildError: no CUDA toolkit, or the build failed."""
    return build.load_extension("vocab_parallel")


def _math_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _check_cuda_dtype(local_logits: torch.Tensor) -> None:
    if local_logits.dtype not in CUDA_DTYPES:
        raise TypeError(f"local_logits: the CUDA kernels take float32, bfloat16 or float16, got {local_logits.dtype}")


@torch.library.custom_op("losslab_distributed::statistics", mutates_args=())
def statistics(local_logits: torch.Tensor, target: torch.Tensor, vocab_start: int) -> torch.Tensor:
    """Each row of this rank's slice reduced to (max, sum of exp(x - max), the target's logit where
    the slice holds ``target`` else 0, sum of logits).

    Args:
        local_logits: [N, V] float32/bfloat16/float16 (float64 too on CPU).
        target: [N] int64 global class ids.
        vocab_start: the global id of column 0 of ``local_logits``.
    Returns [N, 4] float32 (float64 for float64 logits).
    """
    x = local_logits.to(_math_dtype(local_logits.dtype))
    # -finfo.max, not -inf, as the kernel starts: a slice of -inf logits gives (that, 0), never NaN
    row_max = x.amax(1).clamp_min(-torch.finfo(x.dtype).max)
    total = torch.exp(x - row_max[:, None]).sum(1)
    local = target - vocab_start
    owns = (local >= 0) & (local < x.shape[1])
    picked = x.gather(1, local.clamp(0, x.shape[1] - 1)[:, None]).squeeze(1)
    return torch.stack([row_max, total, torch.where(owns, picked, 0.0), x.sum(1)], 1)


@statistics.register_fake
def _(local_logits, target, vocab_start):
    return local_logits.new_empty((local_logits.shape[0], STATISTICS), dtype=_math_dtype(local_logits.dtype))


@statistics.register_kernel("cuda")
def _(local_logits, target, vocab_start):
    _check_cuda_dtype(local_logits)
    local_logits, target = local_logits.contiguous(), target.contiguous()  # no copy when already so
    n, v = local_logits.shape
    out = torch.empty((n, STATISTICS), dtype=torch.float32, device=local_logits.device)
    launch(extension().statistics, local_logits.device, local_logits, target, out, n, v, vocab_start,
           local_logits.dtype)
    return out


def _check_gathered(gathered: torch.Tensor, target: torch.Tensor) -> None:
    if gathered.dim() != 3 or gathered.shape[2] != STATISTICS:
        raise ValueError(f"gathered: expected [W, N, {STATISTICS}], got {list(gathered.shape)}")
    if target.shape != gathered.shape[1:2] or target.dtype != torch.int64:
        raise ValueError(f"target: expected [{gathered.shape[1]}] int64, got {list(target.shape)} {target.dtype}")


@torch.library.custom_op("losslab_distributed::combine", mutates_args=())
def combine(gathered: torch.Tensor, target: torch.Tensor, vocab_size: int, ignore_index: int,
            label_smoothing: float) -> torch.Tensor:
    """Every rank's :func:`statistics` of each row combined into the row's log-sum-exp, loss and
    weight: ``algebra.combine``, ``algebra.row_losses`` and ``algebra.kept_rows`` (their docstrings
    give the formulas).

    Args:
        gathered: [W, N, 4] float32 (float64 on CPU for float64 logits), the W ranks' statistics
            as the all-gather stacks them.
        target: [N] int64 global class ids.
        vocab_size: the number of classes over all ranks.
    Returns [4, N] in ``gathered``'s dtype: the row max M, the row log-sum log S (the backward's
    two), the row loss (0 where ``target`` is ``ignore_index``, NaN where it is outside
    [0, vocab_size)) and the row weight (1 kept, 0 ignored, NaN where the loss is NaN).
    Raises:
        ValueError: ``gathered`` is not [W, N, 4] or ``target`` not [N] int64.
        TypeError: ``gathered`` on CUDA is not float32.
    """
    _check_gathered(gathered, target)
    combined = algebra.combine(gathered)
    losses = algebra.row_losses(combined, target, vocab_size, ignore_index, label_smoothing)
    weight = algebra.kept_rows(losses, target, ignore_index)
    return torch.stack([combined.row_max, combined.row_log_sum, losses, weight])


@combine.register_fake
def _(gathered, target, vocab_size, ignore_index, label_smoothing):
    return gathered.new_empty((COMBINED, gathered.shape[1]))


@combine.register_kernel("cuda")
def _(gathered, target, vocab_size, ignore_index, label_smoothing):
    _check_gathered(gathered, target)
    if gathered.dtype != torch.float32:
        raise TypeError(f"gathered: the CUDA kernel takes float32, got {gathered.dtype}")
    gathered, target = gathered.contiguous(), target.contiguous()
    if gathered.data_ptr() % 16:  # the kernel reads float4s; a view may start mid-tuple
        gathered = gathered.clone()
    world, n = gathered.shape[:2]
    out = gathered.new_empty((COMBINED, n))
    launch(extension().combine, gathered.device, gathered, target, out, world, n, vocab_size, ignore_index,
           float(label_smoothing))
    return out


@torch.library.custom_op("losslab_distributed::gradient", mutates_args=())
def gradient(local_logits: torch.Tensor, target: torch.Tensor, row_max: torch.Tensor, row_log_sum: torch.Tensor,
             row_weight: torch.Tensor, grad_loss: torch.Tensor, vocab_start: int, target_weight: float,
             smoothing_per_class: float) -> torch.Tensor:
    """This rank's slice of dL/dx from the saved global log-sum-exp, no communication:
    ``(exp(x - row_max - row_log_sum) - target_weight [j == target] - smoothing_per_class) * scale``,
    ``scale = row_weight * grad_loss`` (0 where ``row_weight`` is 0).

    Args:
        local_logits: [N, V] as for :func:`statistics`.
        target: [N] int64 global class ids.
        row_max, row_log_sum, row_weight: [N] float32 (float64 on CPU for float64 logits).
        grad_loss: 0-d, or [N] for reduction "none", in the logits' dtype.
        target_weight: 1 - label_smoothing; smoothing_per_class: label_smoothing / vocab_size.
    Returns [N, V] in the logits' dtype.
    """
    x = local_logits.to(row_max.dtype)
    scale = torch.where(row_weight == 0, 0.0, row_weight * grad_loss.to(row_weight.dtype))
    grad = torch.exp((x - row_max[:, None]) - row_log_sum[:, None]) - smoothing_per_class
    local = target - vocab_start
    owns = (local >= 0) & (local < x.shape[1])
    grad.scatter_add_(1, local.clamp(0, x.shape[1] - 1)[:, None], owns.to(grad.dtype)[:, None] * -target_weight)
    return (grad * scale[:, None]).to(local_logits.dtype)


@gradient.register_fake
def _(local_logits, target, row_max, row_log_sum, row_weight, grad_loss, vocab_start, target_weight,
      smoothing_per_class):
    return torch.empty_like(local_logits)


@gradient.register_kernel("cuda")
def _(local_logits, target, row_max, row_log_sum, row_weight, grad_loss, vocab_start, target_weight,
      smoothing_per_class):
    local_logits = local_logits.contiguous()
    out = torch.empty_like(local_logits)
    _launch_gradient(local_logits, target, row_max, row_log_sum, row_weight, grad_loss, vocab_start, target_weight,
                     smoothing_per_class, out)
    return out


def _launch_gradient(local_logits, target, row_max, row_log_sum, row_weight, grad_loss, vocab_start, target_weight,
                     smoothing_per_class, out) -> None:
    _check_cuda_dtype(local_logits)
    target = target.contiguous()
    row_max, row_log_sum, row_weight = (t.float().contiguous() for t in (row_max, row_log_sum, row_weight))
    n, v = local_logits.shape
    grad_loss = grad_loss.to(local_logits.dtype).contiguous()
    launch(extension().gradient, local_logits.device, local_logits, target, row_max, row_log_sum, row_weight,
           grad_loss, 0 if grad_loss.dim() == 0 else 1, out, n, v, vocab_start, float(target_weight),
           float(smoothing_per_class), local_logits.dtype)


def gradient_in_place(local_logits: torch.Tensor, target: torch.Tensor, row_max: torch.Tensor,
                      row_log_sum: torch.Tensor, row_weight: torch.Tensor, grad_loss: torch.Tensor, vocab_start: int,
                      target_weight: float, smoothing_per_class: float) -> None:
    """:func:`gradient` written over ``local_logits`` (contiguous), so a chunk loop needs one buffer,
    not two. Not an operator: eager code only (the linear loss's chunks). On CUDA the kernel reads
    each element before the same thread writes it, so reading and writing one tensor is safe."""
    if local_logits.is_cuda:
        _launch_gradient(local_logits, target, row_max, row_log_sum, row_weight, grad_loss, vocab_start,
                         target_weight, smoothing_per_class, local_logits)
    else:
        local_logits.copy_(gradient(local_logits, target, row_max, row_log_sum, row_weight, grad_loss, vocab_start,
                                    target_weight, smoothing_per_class))
