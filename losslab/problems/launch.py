"""The one guarded launch path every problem's host code goes through.

A bound launcher (``losslab/build/csrc/bind.h``) takes integers: data pointers, sizes,
a DType code and the CUDA stream. :func:`launch` turns tensors, ``None`` and dtypes into
those, makes the tensors' device current while it launches (a launch on another device
than the current one would otherwise go to the wrong GPU), passes that device's current
stream, and lets a launch error surface as the binding's RuntimeError.

This module imports nothing but torch: ``losslab export`` copies it, with the problems'
host functions, into single-file solutions, so that they launch exactly as the package does.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

# The DType codes of kernels/common/dtype.h.
DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


def launch(launcher: Callable[..., None], device: torch.device, *args: object) -> None:
    """Call one bound launcher on ``device``, on its current stream.

    Args:
        launcher: a function of a problem's extension, e.g. ``ext.naive_forward``.
        device: the CUDA device of the tensors (the launch runs with it current).
        args: the launcher's arguments in declared order, less the trailing stream: a
            tensor passes its data pointer, ``None`` a null pointer, a ``torch.dtype``
            its DType code, an int itself.
    Raises:
        RuntimeError: the launcher returned a CUDA error (its message names the launcher).
        KeyError: a dtype no launcher takes.
    """
    launch_values(launcher, device, *[arg if arg.__class__ in (int, float, bool) else 0 if arg is None
                                      else DTYPE_CODES[arg] if arg.__class__ is torch.dtype else arg.data_ptr()
                                      for arg in args])


def launch_values(launcher: Callable[..., None], device: torch.device, *values: int | float) -> None:
    """:func:`launch` for arguments already converted (data pointers, sizes and DType codes as
    numbers): the path of the rungs' forward and backward, where the host's time per call is
    the whole cost of a small loss.

    Raises:
        RuntimeError: the launcher returned a CUDA error (its message names the launcher).
    """
    # The raw stream handle and the device check directly: torch.cuda.device() and
    # torch.cuda.current_stream() (a Stream object each call) cost several microseconds.
    index = device.index
    if torch._C._cuda_getDevice() == index:
        launcher(*values, torch._C._cuda_getCurrentRawStream(index))
        return
    with torch.cuda.device(index):
        launcher(*values, torch._C._cuda_getCurrentRawStream(index))


_STREAM_SCRATCH: dict[tuple[int, int], torch.Tensor] = {}  # (device index, raw stream) -> its scratch


def scratch(device: torch.device, nbytes: int) -> tuple[int, torch.Tensor | None]:
    """Device memory for what a forward writes and no one reads after it (block partials,
    a launcher's words): the current stream's own buffer, reused by the next call on that
    stream (it runs after this one), so a call allocates nothing for it. While the stream
    captures a CUDA graph, or when ``device`` is not the current device, a fresh buffer
    instead (a graph may replay on another stream, beside this stream's calls).

    Args:
        device: the CUDA device of the call; nbytes: bytes needed.
    Returns the address (16-byte aligned) and the fresh tensor to keep until the launch is
    enqueued (None for the stream's buffer).
    """
    index = device.index
    if torch._C._cuda_getDevice() != index or torch._C._cuda_isCurrentStreamCapturing():
        fresh = torch.empty(nbytes, device=device, dtype=torch.uint8)
        return fresh.data_ptr(), fresh
    key = (index, torch._C._cuda_getCurrentRawStream(index))
    buffer = _STREAM_SCRATCH.get(key)
    if buffer is None or buffer.numel() < nbytes:
        buffer = _STREAM_SCRATCH[key] = torch.empty(max(nbytes, 4096), device=device, dtype=torch.uint8)
    return buffer.data_ptr(), None


def gradient_buffer(like: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """Where a gradient like ``like`` is written: ``out`` if given, else a fresh tensor."""
    return torch.empty_like(like) if out is None else out


def forward_gradient(saved_grad: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """The buffer a rung that wrote its gradient in the forward scales in its backward:
    the forward's (``saved_grad``), or ``out`` holding a copy of it."""
    if out is not None and out.data_ptr() != saved_grad.data_ptr():
        return out.copy_(saved_grad)
    return saved_grad
