"""Device ceilings measured on the device, for the performance model.

A loss kernel's floor is ``minimum bytes / measured bandwidth`` (DESIGN.md,
"Performance model"). Bandwidth is measured, not taken from a datasheet:
copy bandwidth from a large device-to-device copy (bytes read + written), read
bandwidth from a large ``torch.sum`` (bytes read).
"""
from __future__ import annotations

import torch

BANDWIDTH_BYTES = 2**30  # 1 GiB: far beyond any L2


def measure_bandwidth(nbytes: int = BANDWIDTH_BYTES, repeats: int = 20) -> dict[str, float]:
    """Measured memory bandwidth of the current CUDA device in GB/s (1e9 bytes/s).

    Returns {"read": ..., "copy": ...}: ``torch.sum`` over ``nbytes`` of float32
    (bytes read / median time), and ``Tensor.copy_`` of ``nbytes``
    (2 x nbytes / median time).
    """
    from .bench import time_cuda

    source = torch.rand(nbytes // 4, device="cuda")
    dest = torch.empty_like(source)
    read = time_cuda(lambda: source.sum(), repeats=repeats)
    copy = time_cuda(lambda: dest.copy_(source), repeats=repeats)
    return {"read": nbytes / read.median_ms / 1e6, "copy": 2 * nbytes / copy.median_ms / 1e6}
