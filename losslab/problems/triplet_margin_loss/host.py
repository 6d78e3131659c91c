"""The host code of every triplet_margin_loss rung: input checks, one forward and one backward
(exported single-file solutions copy these functions, so they import nothing of losslab but the
launch path and the argument checks)."""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from losslab.problems.base import HALF_AND_FLOAT
from losslab.problems.launch import DTYPE_CODES, forward_gradient, gradient_buffer, launch_values, scratch
from losslab.validation import require_cuda, require_no_grad, require_tensor

KNOWN_DTYPES = HALF_AND_FLOAT  # what the rungs take between them (check_dtype narrows per rung)


def validate_inputs(anchor, positive, negative) -> None:
    """Check types, dtypes, shapes and devices on the host, before any launch.

    Raises:
        TypeError: not a tensor, a dtype no rung takes, or positive/negative of another dtype
            than the anchor.
        ValueError: not (N, D), empty, shapes differing, positive or negative requiring grad, or
            not all on one CUDA device.
    """
    require_tensor("anchor", anchor, dtypes=KNOWN_DTYPES, ndim=2)
    for name, other in (("positive", positive), ("negative", negative)):
        require_tensor(name, other, dtypes=KNOWN_DTYPES, ndim=2)
        if other.shape != anchor.shape:
            raise ValueError(f"{name}: expected the shape of anchor {tuple(anchor.shape)}, got {tuple(other.shape)}")
        if other.dtype != anchor.dtype:
            raise TypeError(f"{name}: expected the dtype of anchor ({anchor.dtype}), got {other.dtype}")
        require_no_grad(name, other)  # the rungs give the anchor's gradient; losslab.nn gives all three
    require_cuda(anchor=anchor, positive=positive, negative=negative)


def empty_state(anchor: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """What a forward writes for its backward besides the inputs: nothing (the backward reads the
    three rows again and recomputes their distances: one pass, as it must read them anyway)."""
    return ()


def forward(launcher: Callable[..., None], write_grad: bool, anchor: torch.Tensor, positive: torch.Tensor,
            negative: torch.Tensor, out: torch.Tensor | None = None, grad_out: torch.Tensor | None = None,
            state: bool = True) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """Run one rung's forward launcher (a bound function of the extension, e.g.
    ``ext.vectorized_forward``) on validated inputs: one call into the extension.

    Args:
        anchor, positive, negative: (N, D) of one dtype the rung takes, on one CUDA device, any
            strides (made contiguous here).
        write_grad: the rung writes dL/danchor for grad_loss = 1 in this pass (into ``grad_out``
            if given, else a fresh (N, D) tensor); only for a rung that fuses it.
        out: optional 0-d tensor to write the loss into.
        state: unused (the backward's state is the inputs; cross_entropy's forward has the
            same signature).
    Returns the 0-d loss (the inputs' dtype, written by the kernels; ``out`` if given) and what the
    backward needs: the gradient alone if written, else (anchor, positive, negative).
    Raises:
        RuntimeError: the launcher returned a CUDA error.
    """
    anchor, positive, negative = anchor.contiguous(), positive.contiguous(), negative.contiguous()
    rows, cols = anchor.shape
    dtype, device = anchor.dtype, anchor.device
    direct = out is not None and out.dtype is dtype
    loss = out if direct else anchor.new_empty(())
    grad = gradient_buffer(anchor, grad_out) if write_grad else None
    # the row losses and the launcher's 16 bytes (launchers.h): the stream's scratch, no allocation
    row_losses, _keep = scratch(device, 16 + 4 * rows)
    launch_values(launcher, device, anchor.data_ptr(), positive.data_ptr(), negative.data_ptr(), row_losses,
                  loss.data_ptr(), 0 if grad is None else grad.data_ptr(), rows, cols, DTYPE_CODES[dtype])
    saved = (anchor, positive, negative) if grad is None else (grad,)
    if out is not None and not direct:
        loss = out.copy_(loss)
    return loss, saved


def backward(launcher: Callable[..., None], grad_in_forward: bool, saved: Sequence[torch.Tensor],
             grad_loss: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Run one rung's backward launcher (a bound function): dL/danchor, (N, D) in the anchor's
    dtype, scaled by the 0-d ``grad_loss`` (written into ``out`` if given).

    ``saved`` is what :func:`forward` returned; ``grad_in_forward`` says it is the forward's
    gradient, which the launcher then scales in place (no work when grad_loss is 1). The kernels
    read ``grad_loss`` in the gradient's dtype (another dtype or device is converted).
    """
    if grad_in_forward:
        grad = forward_gradient(saved[0], out)
        a = p = n = 0
    else:
        anchor, positive, negative = saved
        grad = gradient_buffer(anchor, out)
        a, p, n = anchor.data_ptr(), positive.data_ptr(), negative.data_ptr()
    if grad_loss.dtype is not grad.dtype or not grad_loss.is_cuda:
        grad_loss = grad_loss.to(device=grad.device, dtype=grad.dtype)
    rows, cols = grad.shape
    launch_values(launcher, grad.device, a, p, n, grad_loss.data_ptr(), grad.data_ptr(), rows, cols,
                  DTYPE_CODES[grad.dtype])
    return grad
