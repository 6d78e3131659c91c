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


def check_arguments(local_logits, target, ignore_index, label_smoothing, reduction, name: str = "local_logits",
                    width: str = "V_local") -> None:
    """Shapes, dtypes, devices and options, from metadata alone. ``local_logits`` is the [N, width]
    tensor whose rows the targets label, called ``name`` in the errors (the linear loss's ``input``).

    Raises:
        TypeError: ``local_logits`` not a floating tensor, ``target`` not an int64 tensor.
        ValueError: a shape that is not [N, width] and [N], another device, an unknown
            ``reduction``, ``label_smoothing`` outside [0, 1]."""
    if not isinstance(local_logits, torch.Tensor) or local_logits.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name}: expected a float32, bfloat16, float16 or float64 tensor, got "
                        f"{getattr(local_logits, 'dtype', type(local_logits).__name__)}")
    if local_logits.dim() != 2 or local_logits.shape[1] < 1:
        raise ValueError(f"{name}: expected [N, {width}] with {width} >= 1, got {list(local_logits.shape)}")
    if not isinstance(target, torch.Tensor) or target.dtype != torch.int64:
        raise TypeError(f"target: expected an int64 tensor of global class ids, got "
                        f"{getattr(target, 'dtype', type(target).__name__)}")
    if target.shape != local_logits.shape[:1]:
        raise ValueError(f"target: expected [N] = [{local_logits.shape[0]}] (a class id per row of {name}), "
                         f"got {list(target.shape)}")
    if target.device != local_logits.device:
        raise ValueError(f"target: expected it on {name}'s device {local_logits.device}, got {target.device}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction: expected one of {', '.join(REDUCTIONS)}, got {reduction!r}")
    if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, (int, float)) \
            or not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing: expected a float in [0, 1], got {label_smoothing!r}")
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise TypeError(f"ignore_index: expected an int, got {ignore_index!r}")


def check_linear_arguments(input, local_weight, target, ignore_index, label_smoothing, reduction,
                           chunk_rows) -> None:
    """:func:`check_arguments` for the linear loss, plus ``local_weight`` [V_local, H] of ``input``'s
    dtype and device, and ``chunk_rows`` None or an int >= 1.

    Raises:
        TypeError, ValueError: one line naming the argument."""
    check_arguments(input, target, ignore_index, label_smoothing, reduction, name="input", width="H")
    if not isinstance(local_weight, torch.Tensor) or local_weight.dtype != input.dtype:
        raise TypeError(f"local_weight: expected a {input.dtype} tensor (input's dtype), got "
                        f"{getattr(local_weight, 'dtype', type(local_weight).__name__)}")
    if local_weight.dim() != 2 or local_weight.shape[0] < 1 or local_weight.shape[1] != input.shape[1]:
        raise ValueError(f"local_weight: expected [V_local, {input.shape[1]}] (this rank's rows of the output layer, "
                         f"input's H) with V_local >= 1, got {list(local_weight.shape)}")
    if local_weight.device != input.device:
        raise ValueError(f"local_weight: expected it on input's device {input.device}, got {local_weight.device}")
    if chunk_rows is not None and (isinstance(chunk_rows, bool) or not isinstance(chunk_rows, int)
                                   or chunk_rows < 1):
        raise ValueError(f"chunk_rows: expected None or an int >= 1, got {chunk_rows!r}")


def _fingerprint(target: torch.Tensor) -> torch.Tensor:
    """An int64 that two different targets almost never share: sum of target[i] * (i + 1), wrapping."""
    weights = torch.arange(1, target.numel() + 1, dtype=torch.int64, device=target.device)
    return (target * weights).sum()


def validate_across_ranks(local_logits: torch.Tensor, target: torch.Tensor, partition: VocabPartition,
                          group: dist.ProcessGroup | None, ignore_index: int, width: int | None = None,
                          name: str = "local_logits", width_name: str | None = None) -> None:
    """Check collectively that the ranks agree: the same number of rows (of ``local_logits``, called
    ``name``) and dtype, slice widths (``width``, default its columns; called ``width_name``, default
    ``name``) that match ``partition``, the same targets, every target in [0, vocab_size) or
    ``ignore_index``. Two all-gathers and host synchronisations: a debugging aid, not the fast path.

    Raises:
        ValueError: on every rank alike, one line naming the argument that disagrees."""
    widths = gather_widths(local_logits.shape[1] if width is None else width, group, local_logits.device)
    if widths != partition.widths:
        raise ValueError(f"{width_name or name}: the ranks' slice widths {list(widths)} differ from the partition's "
                         f"{list(partition.widths)}; pass the partition that describes this layout")
    mine = torch.stack([torch.tensor(local_logits.shape[0], device=target.device),
                        torch.tensor(_CODES[local_logits.dtype], device=target.device), _fingerprint(target)])
    every = all_gather(mine, len(widths), group)
    rows, codes, prints = (column.tolist() for column in every.cpu().unbind(1))
    if len(set(rows)) > 1:
        raise ValueError(f"{name}: the ranks hold different numbers of rows {rows}; every rank must pass "
                         "the same N tokens")
    if len(set(codes)) > 1:
        raise ValueError(f"{name}: the ranks hold different dtypes {[str(FLOAT_DTYPES[c]) for c in codes]}")
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
