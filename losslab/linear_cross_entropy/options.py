"""The ``options`` of :func:`losslab.linear_cross_entropy.linear_cross_entropy`: how many token rows
each chunk of logits holds (:class:`Options`, or PyTorch's ``LinearCrossEntropyOptions``)."""
from __future__ import annotations

from dataclasses import dataclass

MiB = 2**20
EXTRA_BYTES = 256 * MiB  # the memory the op may use beside the weight's gradient (the goal of issue 30)
MARGIN_BYTES = 32 * MiB  # of it, kept for the row losses and cuBLAS's workspace
MIN_CHUNK_BYTES = 64 * MiB  # the chunk's logits never get less, however large the input's gradient
ROW_MULTIPLE = 64  # chunks of whole 64-row tiles keep cuBLAS's tensor-core tiles full
ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}  # a record's dtype name -> bytes an element


@dataclass(frozen=True)
class Options:
    """How the tokens are chunked.

    ``chunk_rows``: token rows per chunk (an int >= 1), or None to size chunks from ``chunk_bytes``.
    ``chunk_bytes``: the bytes one chunk's logits may take (chunk_rows * V * the element size), or None
    for the default: :data:`EXTRA_BYTES` less the input's gradient (N * H elements) and
    :data:`MARGIN_BYTES`, at least :data:`MIN_CHUNK_BYTES`, so that the op's memory beside the weight's
    gradient stays within 256 MiB. Either way the rows are rounded down to a multiple of
    :data:`ROW_MULTIPLE` (when there are that many), at least 1 and at most N.
    ``check_targets``: raise ValueError for a class index outside [0, V) that is not ignore_index (one
    wait for the device per call, which also keeps the op out of a CUDA graph); False: no wait, and such
    a row's loss is NaN (the loss with it), its gradient NaN, and nothing is read out of bounds.
    ``float32_grad_weight``: accumulate a 16-bit weight's gradient over the chunks in float32 (one
    rounding at the end instead of one per chunk) for V * H * 4 more bytes; the default rounds it to the
    weight's dtype after each chunk's GEMM (as Liger-Kernel's default does).

    Raises:
        ValueError: ``chunk_rows`` or ``chunk_bytes`` that is not a positive int.
    """

    chunk_rows: int | None = None
    chunk_bytes: int | None = None
    check_targets: bool = True
    float32_grad_weight: bool = False

    def __post_init__(self):
        for name in ("chunk_rows", "chunk_bytes"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"options: {name} must be a positive int or None, got {value!r}")
        for name in ("check_targets", "float32_grad_weight"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"options: {name} must be True or False, got {getattr(self, name)!r}")


def as_options(options) -> Options:
    """``options`` as :class:`Options`: None (the defaults), an Options, or PyTorch 2.13's
    ``torch.nn.LinearCrossEntropyOptions``, whose ``batch_chunk_size`` (when set) is the rows per
    chunk; its other fields (``chunking_method``, ``acc_policy``, ``acc_dtype``, ``allow_retain_graph``)
    choose among PyTorch's own paths and have no meaning here.

    Raises:
        TypeError: anything else.
    """
    if options is None:
        return Options()
    if isinstance(options, Options):
        return options
    if type(options).__name__ == "LinearCrossEntropyOptions" and hasattr(options, "batch_chunk_size"):
        return Options(chunk_rows=options.batch_chunk_size)
    raise TypeError(f"options: expected None, losslab.linear_cross_entropy.Options or "
                    f"torch.nn.LinearCrossEntropyOptions, got {type(options).__name__}")


def chunk_rows(options: Options, rows: int, hidden: int, vocab: int, element_bytes: int) -> int:
    """Token rows per chunk for ``rows`` x ``hidden`` inputs and a ``vocab``-row weight of
    ``element_bytes``-byte elements (see :class:`Options`)."""
    if options.chunk_rows is not None:
        wanted = options.chunk_rows
    else:
        budget = options.chunk_bytes
        if budget is None:
            budget = max(MIN_CHUNK_BYTES, EXTRA_BYTES - rows * hidden * element_bytes - MARGIN_BYTES)
        wanted = budget // (vocab * element_bytes)
        if wanted >= ROW_MULTIPLE:
            wanted -= wanted % ROW_MULTIPLE
    return max(1, min(rows, wanted))
