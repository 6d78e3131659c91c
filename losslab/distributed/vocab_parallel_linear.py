"""The vocabulary-parallel linear cross-entropy: an output layer split by vocabulary over the ranks,
whose logits are made and consumed a chunk of tokens at a time, so no rank holds its slice whole.

Per chunk: this rank's logits by one cuBLAS GEMM into a reused buffer, their statistics
(``kernels.statistics``), one all-gather of them, their combination (``kernels.combine``), the
chunk's gradient written over its logits (``kernels.gradient_in_place``) and two GEMMs into the
input's partial and the weight's gradients.
The backward scales those and all-reduces the input's: a collective per chunk forward, one backward.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from losslab.distributed import kernels
from losslab.distributed.checks import check_linear_arguments, validate_across_ranks
from losslab.distributed.collectives import all_gather
from losslab.distributed.partition import VocabPartition, partition_of
from losslab.linear_cross_entropy.kernels import scale_in_place
from losslab.linear_cross_entropy.options import Options
from losslab.linear_cross_entropy.options import chunk_rows as default_chunk_rows


def _chunks(input, local_weight, target, partition, group, ignore_index, label_smoothing, wants, chunk_rows,
            row_scale=None, saved=None):
    """The chunk loop of both directions: (per-row results [4, N], grad_input, grad_weight).

    Forward (``saved`` None): each chunk's statistics are all-gathered and combined into its rows'
    (max, log-sum, loss, kept) as ``kernels.combine`` writes them. Reduction none's backward
    (``saved`` = the forward's results): no collective. Gradients (None unless ``wants``) of the
    loss whose gradient per row is kept x ``row_scale`` (0-d, or [N]; None: 1): the input's is this
    rank's part, to be summed over the ranks; the weight's is accumulated in its dtype chunk by chunk."""
    n, vocab, world = input.shape[0], partition.vocab_size, len(partition.widths)
    math = torch.float64 if input.dtype == torch.float64 else torch.float32
    rows = saved if saved is not None else torch.empty(kernels.COMBINED, n, dtype=math, device=input.device)
    grad_input = torch.empty_like(input) if wants[0] else None
    grad_weight = torch.zeros_like(local_weight) if wants[1] else None
    buffer = input.new_empty(min(chunk_rows, n), partition.size)
    one = torch.ones((), dtype=input.dtype, device=input.device)  # grad_loss: the row weights carry the scale
    for start in range(0, n, chunk_rows):
        end = min(start + chunk_rows, n)
        x, t, logits, chunk = input[start:end], target[start:end], buffer[:end - start], rows[:, start:end]
        torch.mm(x, local_weight.t(), out=logits)
        if saved is None:
            gathered = all_gather(kernels.statistics(logits, t, partition.start), world, group)  # the collective
            chunk.copy_(kernels.combine(gathered, t, vocab, ignore_index, label_smoothing))
        if grad_input is None and grad_weight is None:
            continue
        row_max, row_log_sum, _, kept = chunk
        weight = kept if row_scale is None else kept * (row_scale if row_scale.dim() == 0 else row_scale[start:end])
        kernels.gradient_in_place(logits, t, row_max, row_log_sum, weight, one, partition.start,
                                  1.0 - label_smoothing, label_smoothing / vocab)  # the buffer now holds dL/dz
        if grad_input is not None:
            torch.mm(logits, local_weight, out=grad_input[start:end])
        if grad_weight is not None:
            torch.addmm(grad_weight, logits.t(), x, out=grad_weight)
    return rows, grad_input, grad_weight


class _VocabParallelLinearCrossEntropy(torch.autograd.Function):
    """For reduction mean and sum the forward writes the gradients for grad_loss = 1 and the backward
    scales them in place (so it runs once per forward); for none the backward makes each chunk's
    logits again. Either way the backward all-reduces the input's gradient, its one collective."""

    @staticmethod
    def forward(ctx, input, local_weight, target, partition, group, ignore_index, label_smoothing, reduction,
                chunk_rows):
        ctx.none = reduction == "none"
        wants = (False, False) if ctx.none else tuple(ctx.needs_input_grad[:2])
        math = torch.float64 if input.dtype == torch.float64 else torch.float32
        count = (target != ignore_index).sum().to(math)  # the mean's divisor, known before any chunk's gradient
        scale = 1.0 / count.clamp_min(1) if reduction == "mean" else None
        rows, *grads = _chunks(input, local_weight, target, partition, group, ignore_index, label_smoothing, wants,
                               chunk_rows, scale)
        ctx.group, ctx.partition, ctx.options = group, partition, (ignore_index, label_smoothing, chunk_rows)
        ctx.grads, ctx.backward_calls = grads, 0  # not saved tensors: the backward scales them in place
        if ctx.none:
            ctx.save_for_backward(input, local_weight, target, rows)
        losses = rows[2]
        loss = losses if ctx.none else losses.sum() / count if reduction == "mean" else losses.sum()
        return loss.to(input.dtype)

    @staticmethod
    def backward(ctx, grad_loss):
        if ctx.none:
            input, local_weight, target, rows = ctx.saved_tensors
            ignore_index, label_smoothing, chunk_rows = ctx.options
            _, grad_input, grad_weight = _chunks(input, local_weight, target, ctx.partition, ctx.group, ignore_index,
                                                 label_smoothing, ctx.needs_input_grad[:2], chunk_rows,
                                                 grad_loss.to(rows.dtype), saved=rows)
        else:
            if ctx.backward_calls:
                raise RuntimeError("vocab_parallel_linear_cross_entropy: backward can run once per forward (it "
                                   "scales the gradients the forward computed in place); run the forward again")
            ctx.backward_calls += 1
            (grad_input, grad_weight), ctx.grads = ctx.grads, None
            for grad in (grad_input, grad_weight):
                if grad is not None:
                    scale_in_place(grad, grad_loss)
        if grad_input is not None:
            dist.all_reduce(grad_input, group=ctx.group)  # the backward's one collective: the ranks' parts summed
        return grad_input, grad_weight, None, None, None, None, None, None, None


def vocab_parallel_linear_cross_entropy(input: torch.Tensor, local_weight: torch.Tensor, target: torch.Tensor, *,
                                        group: dist.ProcessGroup | None = None, ignore_index: int = -100,
                                        label_smoothing: float = 0.0, reduction: str = "mean",
                                        chunk_rows: int | None = None, validate: bool = False,
                                        partition: VocabPartition | None = None) -> torch.Tensor:
    """``F.cross_entropy(input @ weight.T, target, ...)`` for an output layer ``weight`` split by
    vocabulary over the ranks of ``group``, without any rank holding its [N, V_local] logits whole.

    Collective: every rank of ``group`` calls it with the same ``input`` and its own rows of the
    weight. Same value and gradients as the single-GPU loss on the whole weight: ``input``'s gradient
    is the full one on every rank, ``local_weight``'s this rank's rows of the weight's. The forward
    issues one all-gather of [world, rows, 4] float32 statistics per chunk of token rows; the backward
    one all-reduce of ``input``'s gradient. No host synchronisation after the first call per (group,
    width), which gathers the slice widths (pass ``partition`` to skip it).

    Args:
        input: [N, H] float32, bfloat16 or float16 (float64 on CPU), the same on every rank.
        local_weight: [V_local, H] in ``input``'s dtype: rank r holds rows of the r-th contiguous
            slice of the vocabulary (widths may differ).
        target: [N] int64 global class ids, the same on every rank; as in
            :func:`losslab.distributed.vocab_parallel_cross_entropy`.
        group, ignore_index, label_smoothing, reduction, validate, partition: as there.
        chunk_rows: token rows per chunk (None: sized as ``losslab.nn.functional.linear_cross_entropy``
            sizes its chunks: the input's gradient and one chunk within about 256 MiB).
    Returns the loss in ``input``'s dtype (softmax math in float32): 0-d, or [N] for reduction "none".
    Memory beside the inputs and gradients: one [chunk_rows, V_local] buffer of input's dtype (the
    chunk's logits, then their gradient) and a few floats a row. A 16-bit weight's gradient is
    rounded to its dtype after each chunk's GEMM.

    Raises:
        TypeError, ValueError: a bad argument, one line naming it.
        RuntimeError: torch.distributed is not initialised, or a second backward of mean or sum.
    """
    check_linear_arguments(input, local_weight, target, ignore_index, label_smoothing, reduction, chunk_rows)
    if not dist.is_initialized():
        raise RuntimeError("group: torch.distributed is not initialised; call torch.distributed.init_process_group "
                           "first (torchrun sets up its environment)")
    width = local_weight.shape[0]
    if partition is None:
        partition = partition_of(width, group, input.device)
    if validate:
        validate_across_ranks(input, target, partition, group, ignore_index, width=width, name="input",
                              width_name="local_weight")
    if partition.size != width:
        raise ValueError(f"partition: it gives this rank {partition.size} classes, local_weight has {width} rows")
    if chunk_rows is None:
        chunk_rows = default_chunk_rows(Options(), *input.shape, width, input.element_size())
    return _VocabParallelLinearCrossEntropy.apply(input.contiguous(), local_weight.contiguous(),
                                                  target.contiguous(), partition, group, ignore_index,
                                                  float(label_smoothing), reduction, chunk_rows)
