"""The host code of every smooth_l1_loss rung: input checks, one forward and one backward (exported
single-file solutions copy these functions, so they import nothing of losslab but the launch path
and the argument checks)."""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from losslab.problems.base import HALF_AND_FLOAT
from losslab.problems.launch import DTYPE_CODES, forward_gradient, gradient_buffer, launch_values, scratch
from losslab.validation import require_cuda, require_no_grad, require_tensor

KNOWN_DTYPES = HALF_AND_FLOAT  # what the rungs take between them (check_dtype narrows per rung)
MAX_PARTIALS = 1024  # SMOOTH_L1_LOSS_MAX_BLOCKS of kernels/smooth_l1_loss/options.h: the operators' partial sums


def validate_inputs(predictions, targets) -> None:
    """Check types, dtypes, shapes and devices on the host, before any launch.

    Raises:
        TypeError: not a tensor, a dtype no rung takes, or targets of another dtype.
        ValueError: not (B, D), empty, shapes differing, targets requiring grad, or
            not both on one CUDA device.
    """
    require_tensor("predictions", predictions, dtypes=KNOWN_DTYPES, ndim=2)
    require_tensor("targets", targets, dtypes=KNOWN_DTYPES, ndim=2)
    if targets.shape != predictions.shape:
        raise ValueError(f"targets: expected the shape of predictions {tuple(predictions.shape)}, "
                         f"got {tuple(targets.shape)}")
    if targets.dtype != predictions.dtype:
        raise TypeError(f"targets: expected the dtype of predictions ({predictions.dtype}), "
                        f"got {targets.dtype}")
    require_no_grad("targets", targets)
    require_cuda(predictions=predictions, targets=targets)


def empty_state(predictions: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """What a forward writes for its backward besides the inputs: nothing (the backward reads
    predictions and targets again)."""
    return ()


def forward(launcher: Callable[..., None], write_grad: bool, predictions: torch.Tensor, targets: torch.Tensor,
            out: torch.Tensor | None = None, grad_out: torch.Tensor | None = None, state: bool = True,
            ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """Run one rung's forward launcher (a bound function of the extension, e.g.
    ``ext.vectorized_forward``) on validated inputs: one call into the extension.

    Args:
        predictions, targets: (B, D) of one dtype the rung takes, on one CUDA device, any
            strides (made contiguous here).
        write_grad: the rung writes dL/dp for grad_loss = 1 in this pass (into ``grad_out``
            if given, else a fresh (B, D) tensor); only for a rung that fuses it.
        out: optional 0-d tensor to write the loss into.
        state: unused (the backward's state is the inputs; cross_entropy's forward has the
            same signature).
    Returns the 0-d loss (the inputs' dtype, written by the kernels: no conversion; ``out``
    if given) and what the backward needs: the gradient alone if written, else
    (predictions, targets).
    Raises:
        RuntimeError: the launcher returned a CUDA error.
    """
    predictions, targets = predictions.contiguous(), targets.contiguous()
    rows, cols = predictions.shape
    dtype, device = predictions.dtype, predictions.device
    direct = out is not None and out.dtype is dtype
    loss = out if direct else predictions.new_empty(())
    grad = gradient_buffer(predictions, grad_out) if write_grad else None
    # the partials (a ladder rung's one per row, an operator's one per block) and the launcher's 16 bytes
    # (launchers.h): the stream's scratch, no allocation
    partials, _keep = scratch(device, 16 + 4 * max(rows, MAX_PARTIALS))
    launch_values(launcher, device, predictions.data_ptr(), targets.data_ptr(), partials, loss.data_ptr(),
                  0 if grad is None else grad.data_ptr(), rows, cols, DTYPE_CODES[dtype])
    saved = (predictions, targets) if grad is None else (grad,)
    if out is not None and not direct:
        loss = out.copy_(loss)
    return loss, saved


def backward(launcher: Callable[..., None], grad_in_forward: bool, saved: Sequence[torch.Tensor],
             grad_loss: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Run one rung's backward launcher (a bound function): dL/dpredictions, (B, D) in the
    predictions' dtype, scaled by the 0-d ``grad_loss`` (written into ``out`` if given).

    ``saved`` is what :func:`forward` returned; ``grad_in_forward`` says it is the forward's
    gradient, which the launcher then scales in place (no work when grad_loss is 1). The
    kernels read ``grad_loss`` in the gradient's dtype (another dtype or device is converted).
    """
    if grad_in_forward:
        grad = forward_gradient(saved[0], out)
        p = t = 0
    else:
        predictions, targets = saved
        grad = gradient_buffer(predictions, out)
        p, t = predictions.data_ptr(), targets.data_ptr()
    if grad_loss.dtype is not grad.dtype or not grad_loss.is_cuda:
        grad_loss = grad_loss.to(device=grad.device, dtype=grad.dtype)
    rows, cols = grad.shape
    launch_values(launcher, grad.device, p, t, grad_loss.data_ptr(), grad.data_ptr(), rows, cols,
                  DTYPE_CODES[grad.dtype])
    return grad
