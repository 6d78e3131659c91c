"""The arguments of the vocabulary-parallel loss, checked: locally on every call from metadata only
(no host synchronisation), and with ``validate=True`` across the ranks of the group.

Every failure is one ValueError/TypeError line naming the argument; the collective check
raises the same error on every rank, so no rank is left waiting in a collective.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from losslab.distributed.algebra import REDUCTIONS
from losslab.distributed.collectives import all_gather
from losslab.distributed.partition import VocabPartition, gather_widths

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
_CODES = {dtype: code for code, dtype in enumerate(FLOAT_DTYPES)}


def check_arguments(local_logits, target, ignore_index, label_smoothing, reduction) -> None:
    """Shapes, dtypes, devices and options, from metadata alone.

    Raises:
        TypeError: ``local_logits`` not a floating tensor, ``target`` not an int64 tensor.
        ValueError: a shape that is not [N, V_local] and [N], another device, an unknown
            ``reduction``, ``label_smoothing`` outside [0, 1]."""
    if not isinstance(local_logits, torch.Tensor) or local_logits.dtype not in FLOAT_DTYPES:
        raise TypeError("local_logits: expected a float32, bfloat16, float16 or float64 tensor, got "
                        f"{getattr(local_logits, 'dtype', type(local_logits).__name__)}")
    if local_logits.dim() != 2 or local_logits.shape[1] < 1:
        raise ValueError(f"local_logits: expected [N, V_local] with V_local >= 1, got {list(local_logits.shape)}")
    if not isinstance(target, torch.Tensor) or target.dtype != torch.int64:
        raise TypeError(f"target: expected an int64 tensor of global class ids, got "
                        f"{getattr(target, 'dtype', type(target).__name__)}")
    if target.shape != local_logits.shape[:1]:
        raise ValueError(f"target: expected [N] = [{local_logits.shape[0]}] (a class id per row of local_logits), "
                         f"got {list(target.shape)}")
    if target.device != local_logits.device:
        raise ValueError(f"target: expected it on local_logits' device {local_logits.device}, got {target.device}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction: expected one of {', '.join(REDUCTIONS)}, got {reduction!r}")
    if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, (int, float)) \
            or not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing: expected a float in [0, 1], got {label_smoothing!r}")
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise TypeError(f"ignore_index: expected an int, got {ignore_index!r}")


def _fingerprint(target: torch.Tensor) -> torch.Tensor:
    """An int64 that two different targets almost never share: sum of target[i] * (i + 1), wrapping."""
    weights = torch.arange(1, target.numel() + 1, dtype=torch.int64, device=target.device)
    return (target * weights).sum()


def validate_across_ranks(local_logits: torch.Tensor, target: torch.Tensor, partition: VocabPartition,
                          group: dist.ProcessGroup | None, ignore_index: int) -> None:
    """Check collectively that the ranks agree: the same number of rows and dtype, slice widths that
    match ``partition``, the same targets, every target in [0, vocab_size) or ``ignore_index``.
    Two all-gathers and host synchronisations: a debugging aid, not the fast path.

    Raises:
        ValueError: on every rank alike, one line naming the argument that disagrees."""
    widths = gather_widths(local_logits.shape[1], group, local_logits.device)
    if widths != partition.widths:
        raise ValueError(f"local_logits: the ranks' slice widths {list(widths)} differ from the partition's "
                         f"{list(partition.widths)}; pass the partition that describes this layout")
    mine = torch.stack([torch.tensor(local_logits.shape[0], device=target.device),
                        torch.tensor(_CODES[local_logits.dtype], device=target.device), _fingerprint(target)])
    every = all_gather(mine, len(widths), group)
    rows, codes, prints = (column.tolist() for column in every.cpu().unbind(1))
    if len(set(rows)) > 1:
        raise ValueError(f"local_logits: the ranks hold different numbers of rows {rows}; every rank must pass "
                         "the same N tokens, [N, V_local]")
    if len(set(codes)) > 1:
        raise ValueError(f"local_logits: the ranks hold different dtypes {[str(FLOAT_DTYPES[c]) for c in codes]}")
    if len(set(prints)) > 1:
        other = next(r for r, p in enumerate(prints) if p != prints[0])
        raise ValueError(f"target: rank {other}'s targets differ from rank 0's; every rank must pass the same "
                         "[N] global class ids")
    vocab = partition.vocab_size
    bad = ((target < 0) | (target >= vocab)) & (target != ignore_index)
    if bool(bad.any()):
        row = int(bad.nonzero()[0, 0])
        raise ValueError(f"target: {int(bad.sum())} ids outside [0, {vocab}) that are not ignore_index={ignore_index} "
                         f"(first: {int(target[row])} at row {row})")
