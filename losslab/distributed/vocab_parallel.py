"""The vocabulary-parallel cross-entropy: one all-gather in the forward, none in the backward.

Each rank reduces its slice to per-row statistics (``kernels.statistics``), the ranks exchange
them in one all-gather, each combines them (``kernels.combine``) and saves three floats a row;
the backward writes the local gradient from them (``kernels.gradient``) without communicating.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from losslab.distributed import algebra, kernels
from losslab.distributed.checks import check_arguments, validate_across_ranks
from losslab.distributed.collectives import all_gather
from losslab.distributed.partition import VocabPartition, partition_of


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """An autograd.Function, not a torch.library operator: the forward holds a collective on a
    ProcessGroup object, which an operator's schema cannot carry (only by name, resolved through
    a private torch function). Its two kernels are operators (``kernels``), with fake kernels."""

    @staticmethod
    def forward(ctx, local_logits, target, partition, group, ignore_index, label_smoothing, reduction):
        stats = kernels.statistics(local_logits, target, partition.start)
        gathered = all_gather(stats, len(partition.widths), group)  # the one collective
        row_max, row_log_sum, losses, kept = kernels.combine(gathered, target, partition.vocab_size, ignore_index,
                                                             label_smoothing)
        loss, row_weight = algebra.reduce(losses, kept, target, ignore_index, reduction)
        ctx.save_for_backward(local_logits, target, row_max, row_log_sum, row_weight)
        ctx.start, ctx.smoothing = partition.start, label_smoothing / partition.vocab_size
        ctx.target_weight = 1.0 - label_smoothing
        return loss.to(local_logits.dtype)

    @staticmethod
    def backward(ctx, grad_loss):
        local_logits, target, row_max, row_log_sum, row_weight = ctx.saved_tensors
        grad = kernels.gradient(local_logits, target, row_max, row_log_sum, row_weight, grad_loss, ctx.start,
                                ctx.target_weight, ctx.smoothing)
        return grad, None, None, None, None, None, None


def vocab_parallel_cross_entropy(local_logits: torch.Tensor, target: torch.Tensor, *,
                                 group: dist.ProcessGroup | None = None, ignore_index: int = -100,
                                 label_smoothing: float = 0.0, reduction: str = "mean", validate: bool = False,
                                 partition: VocabPartition | None = None) -> torch.Tensor:
    """``F.cross_entropy`` of logits split by vocabulary over the ranks of ``group``, without gathering them.

    Collective: every rank of ``group`` calls it with its own slice. Same value and gradient as
    ``F.cross_entropy(torch.cat(slices, 1), target, ...)``. The forward issues one
    all-gather (``collectives``) of [world, N, 4] float32 statistics, the backward none; no host
    synchronisation after the first call per (group, width), which gathers the slice widths
    (pass ``partition`` to skip it), so a CUDA graph may capture any later call and
    ``torch.compile(fullgraph=True)`` trace it.

    Args:
        local_logits: [N, V_local] float32, bfloat16 or float16 (float64 on CPU): this rank's
            contiguous slice of the vocabulary (rank r holds the r-th slice; widths may differ).
        target: [N] int64 global class ids, the same on every rank; ``ignore_index`` rows leave
            the loss and its mean's count. An id outside [0, V) gives NaN (``validate`` raises).
        group: the process group (default: the world).
        ignore_index, label_smoothing, reduction: as in ``torch.nn.functional.cross_entropy``.
        validate: check across the ranks that shapes, dtypes, slices and targets agree (two
            small all-gathers and host synchronisations).
        partition: the slices' layout; default gathered once and cached (``partition_of``).
    Returns the loss in ``local_logits``' dtype (math in float32, float64 for float64): 0-d, or [N]
    for reduction "none".

    Raises:
        TypeError, ValueError: a bad argument, one line naming it (``checks``), on every rank
            alike under ``validate``.
        RuntimeError: torch.distributed is not initialised.
    """
    check_arguments(local_logits, target, ignore_index, label_smoothing, reduction)
    if not dist.is_initialized():
        raise RuntimeError("group: torch.distributed is not initialised; call torch.distributed.init_process_group "
                           "first (torchrun sets up its environment)")
    if partition is None:
        partition = partition_of(local_logits.shape[1], group, local_logits.device)
    if validate:  # first: a layout that disagrees raises on every rank, leaving none in a collective
        validate_across_ranks(local_logits, target, partition, group, ignore_index)
    if partition.size != local_logits.shape[1]:
        raise ValueError(f"partition: it gives this rank {partition.size} classes, local_logits has "
                         f"{local_logits.shape[1]}")
    return _VocabParallelCrossEntropy.apply(local_logits.contiguous(), target.contiguous(), partition, group,
                                            ignore_index, float(label_smoothing), reduction)
