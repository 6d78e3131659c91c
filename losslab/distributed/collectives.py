"""The one collective the package issues: an all-gather into one tensor, by whichever name this
torch has (``all_gather_single`` from torch 2.14, where ``all_gather_into_tensor`` is deprecated).
"""
from __future__ import annotations

import torch
import torch.distributed as dist


def gather_name() -> str:
    """The name of torch.distributed's all-gather into one tensor in this torch."""
    return "all_gather_single" if hasattr(dist, "all_gather_single") else "all_gather_into_tensor"


def all_gather(local: torch.Tensor, world: int, group: dist.ProcessGroup | None) -> torch.Tensor:
    """Every rank's ``local`` [*shape], stacked in rank order: [world, *shape]. Collective; no host
    synchronisation. The output is gathered flat along dim 0, the layout gloo requires too."""
    out = local.new_empty((world * local.shape[0], *local.shape[1:]) if local.dim() else (world,))
    getattr(dist, gather_name())(out, local.reshape(-1, *local.shape[1:]) if local.dim() else local.reshape(1),
                                 group=group)
    return out.view(world, *local.shape)
