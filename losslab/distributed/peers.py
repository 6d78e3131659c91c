"""Peers of the vocabulary-parallel loss, timed beside it: a Megatron-style version (three
all-reduces in the forward, written here for comparison, not Megatron-LM's code) and PyTorch's
``loss_parallel()`` on a DTensor sharded by vocabulary (which issues its own collectives).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh

from losslab.distributed.partition import VocabPartition


class _MegatronStyle(torch.autograd.Function):
    """Megatron-style, written here for comparison: after Megatron-LM's
    ``_VocabParallelCrossEntropy`` (max, target logit and sum of exponentials, each all-reduced
    in turn), keeping the float32 softmax for the backward. Per-row loss, no label smoothing."""

    @staticmethod
    def forward(ctx, local_logits, target, start, group):
        x = local_logits.float()
        row_max = x.amax(1)
        dist.all_reduce(row_max, op=dist.ReduceOp.MAX, group=group)
        x = x - row_max[:, None]
        local = target - start
        owns = (local >= 0) & (local < x.shape[1])
        local = local.clamp(0, x.shape[1] - 1)
        predicted = torch.where(owns, x.gather(1, local[:, None]).squeeze(1), 0.0)
        dist.all_reduce(predicted, group=group)
        softmax = x.exp_()
        sum_exp = softmax.sum(1)
        dist.all_reduce(sum_exp, group=group)
        softmax.div_(sum_exp[:, None])
        ctx.save_for_backward(softmax, owns, local)
        ctx.dtype = local_logits.dtype
        return sum_exp.log() - predicted

    @staticmethod
    def backward(ctx, grad_rows):
        softmax, owns, local = ctx.saved_tensors
        grad = softmax.scatter_add(1, local[:, None], -owns.to(softmax.dtype)[:, None])
        return (grad * grad_rows[:, None]).to(ctx.dtype), None, None, None


def megatron_style_cross_entropy(local_logits: torch.Tensor, target: torch.Tensor, partition: VocabPartition, *,
                                 group: dist.ProcessGroup | None = None, ignore_index: int = -100) -> torch.Tensor:
    """Megatron-style, written here for comparison: the mean loss over the rows whose ``target``
    is not ``ignore_index``, from [N, V_local] logits and [N] int64 global ids, with three
    all-reduces of [N] float32 in the forward and none in the backward. Collective."""
    rows = _MegatronStyle.apply(local_logits, target, partition.start, group)
    valid = target != ignore_index
    return (torch.where(valid, rows, 0.0).sum() / valid.sum()).to(local_logits.dtype)


def loss_parallel_forward_backward(local_logits: torch.Tensor, target: torch.Tensor, partition: VocabPartition, *,
                                   group: dist.ProcessGroup | None = None, ignore_index: int = -100,
                                   mesh: DeviceMesh | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """PyTorch's ``loss_parallel()``: ``local_logits`` [N, V_local] as a DTensor sharded on the class
    dimension of ``mesh`` (default: a mesh over ``group``, made on each call), ``F.cross_entropy``
    (mean) and its backward, both inside the context as it requires. Returns (the 0-d loss, this
    rank's [N, V_local] gradient). Collective; the split must be the one DTensor makes (even)."""
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.parallel import loss_parallel

    mesh = mesh or DeviceMesh.from_group(group or dist.group.WORLD, local_logits.device.type)
    leaf = local_logits.detach().requires_grad_()
    n = local_logits.shape[0]
    logits = DTensor.from_local(leaf, mesh, [Shard(1)], run_check=False, shape=(n, partition.vocab_size),
                                stride=(partition.vocab_size, 1))
    with loss_parallel():
        loss = F.cross_entropy(logits, target, ignore_index=ignore_index)
        loss.backward()
    return loss.full_tensor(), leaf.grad
