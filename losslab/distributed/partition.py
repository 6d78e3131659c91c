"""Which slice of the vocabulary each rank holds: its offset and the full vocabulary size.

Found once per (process group, local width) by one all-gather of the ranks' widths (a host
synchronisation), then cached, so the loss's fast path never gathers them again.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from losslab.distributed.collectives import all_gather

_CACHE: dict[tuple[object, int, str], VocabPartition] = {}


@dataclass(frozen=True)
class VocabPartition:
    """The contiguous vocabulary slices of the ranks of one group, in rank order.

    Attributes:
        widths: each rank's number of classes (uneven splits allowed, each at least 1).
        rank: this process's rank in the group.
    Raises:
        ValueError: a width below 1, or ``rank`` outside the group.
    """

    widths: tuple[int, ...]
    rank: int

    def __post_init__(self):
        if not self.widths or min(self.widths) < 1:
            raise ValueError(f"widths: expected every rank's slice to hold at least 1 class, got {self.widths}")
        if not 0 <= self.rank < len(self.widths):
            raise ValueError(f"rank: expected 0 <= rank < {len(self.widths)}, got {self.rank}")

    @property
    def start(self) -> int:
        """The global class id of this rank's first column."""
        return sum(self.widths[: self.rank])

    @property
    def size(self) -> int:
        """This rank's number of classes (columns of its local logits)."""
        return self.widths[self.rank]

    @property
    def vocab_size(self) -> int:
        """The number of classes of the full vocabulary."""
        return sum(self.widths)


@torch.compiler.disable  # run eagerly: traced, its host read of the gathered widths hangs dynamo
def gather_widths(width: int, group: dist.ProcessGroup | None, device: torch.device) -> tuple[int, ...]:
    """Every rank's ``width``, in rank order: one all-gather on ``device`` (a CUDA device for NCCL)
    and a host synchronisation. Collective: every rank of ``group`` must call it. Never traced by
    ``torch.compile`` (a graph break; with ``fullgraph=True`` an error: call the loss once eagerly
    first, or pass its ``partition``)."""
    mine = torch.tensor(width, dtype=torch.int64, device=device)
    return tuple(all_gather(mine, dist.get_world_size(group), group).tolist())


def partition_of(width: int, group: dist.ProcessGroup | None, device: torch.device) -> VocabPartition:
    """The partition of ``group`` in which this rank holds ``width`` classes: gathered by
    :func:`gather_widths` on the first call with this (group, width, device type) and cached,
    so later calls communicate nothing (call once before capturing a CUDA graph). A layout that
    changes while this rank's width stays the same needs an explicit ``partition``."""
    key = (group if group is not None else dist.group.WORLD, width, device.type)
    if key not in _CACHE:
        _CACHE[key] = VocabPartition(gather_widths(width, group, device), dist.get_rank(group))
    return _CACHE[key]
