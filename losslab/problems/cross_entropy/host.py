"""The host code of every cross_entropy rung: input and target checks, one forward and one
backward (exported single-file solutions copy these functions), and the cluster rung's plan."""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from losslab import build
from losslab.problems.base import HALF_AND_FLOAT
from losslab.problems.launch import DTYPE_CODES, forward_gradient, gradient_buffer, launch_values, scratch
from losslab.validation import require_cuda, require_tensor

KNOWN_DTYPES = HALF_AND_FLOAT  # what validate lets through to check_dtype
IGNORE_INDEX = -100  # F.cross_entropy's default; kernels/cross_entropy/cross_entropy.cuh agrees
INDEX_BYTES = 8      # int64 targets


def out_of_range_message(targets: torch.Tensor, num_classes: int) -> str:
    """The error message for targets outside [0, num_classes) that are not IGNORE_INDEX.

    Args:
        targets: (N,) int64 class indices, at least one of them out of range.
        num_classes: C, the number of columns of the predictions.
    Returns a message naming ``targets``, the first bad value, its position and the
    valid range.
    """
    bad = (targets != IGNORE_INDEX) & ((targets < 0) | (targets >= num_classes))
    positions = bad.nonzero().flatten()
    first = int(positions[0])
    return (f"targets: class index {int(targets[first])} at position {first} is outside "
            f"[0, {num_classes}) and is not ignore_index ({IGNORE_INDEX}); "
            f"{len(positions)} target(s) out of range")


def check_targets(targets: torch.Tensor, num_classes: int) -> None:
    """Raise ValueError if a target is outside [0, num_classes) and is not IGNORE_INDEX.

    The forward never waits for the host: it marks a row whose target is out of range
    (its loss, hence the mean, is NaN; the kernels never index with it) and goes on. Call
    this where you want the error with its message (position, value), or run in strict
    mode (``LOSSLAB_STRICT_TARGETS=1``, or ``strict=True`` to :func:`losslab.variant`'s
    loss), which calls it before every launch. PyTorch's ``F.cross_entropy`` instead stops
    the kernel with a device-side assert, which leaves the CUDA context unusable.

    Args:
        targets: (N,) int64 class indices, on any device.
        num_classes: C, the number of columns of the logits.
    Raises:
        ValueError: naming the first bad value, its position and the valid range. The check
            waits for the GPU once (it reads one flag back).
    """
    bad = (targets != IGNORE_INDEX) & ((targets < 0) | (targets >= num_classes))
    if bool(bad.any()):
        raise ValueError(out_of_range_message(targets, num_classes))


def validate_inputs(predictions, targets) -> None:
    """Check types, dtypes, devices and shapes on the host, before any launch.

    Device checks come last (so shape and dtype mistakes read the same without a
    GPU); the range of the target values is :meth:`check_values`'s (it waits for
    the GPU), done only on request or in strict mode.

    Raises:
        TypeError: an argument is not a tensor; predictions not a floating dtype
            losslab knows (``check_dtype`` then refuses all but float32, naming the
            variant); targets not int64 (float class probabilities and int32
            indices included).
        ValueError: predictions not (N, C), targets not (N,), N differing between
            them, an empty tensor, a tensor not on a CUDA device, or the two on
            different devices.
    """
    require_tensor("predictions", predictions, dtypes=KNOWN_DTYPES, ndim=2)
    if isinstance(targets, torch.Tensor) and targets.dtype != torch.int64:
        hint = " (class probabilities are not supported)" if targets.is_floating_point() else ""
        raise TypeError(f"targets: expected int64 class indices (torch.long), got {targets.dtype}{hint}")
    require_tensor("targets", targets, dtypes=(torch.int64,), ndim=1)
    if targets.shape[0] != predictions.shape[0]:
        raise ValueError(f"targets: expected one class index per row of predictions "
                         f"({predictions.shape[0]}), got shape {tuple(targets.shape)}")
    require_cuda(predictions=predictions, targets=targets)


STATE_NAMES = ("stats",)  # empty_state's, in order


def empty_state(predictions: torch.Tensor) -> tuple[torch.Tensor]:
    """What a forward writes for its backward besides the inputs, unwritten: ``stats``,
    (8 + 2N,) float32 on the logits' device. From byte 0: counts, (4,) int64 (n_valid, the
    number of targets out of range, then two words the forward zeroes); row_max and
    row_log_sum, (N,) float32 each. One tensor, not three: at small sizes each ``torch.empty``
    is a sizeable part of a call's host time. Every element is written by every forward (an
    operator's outputs must be the same each time it runs: opcheck compares them); the row
    losses, which some rungs write and none reads after the call, are the stream's scratch."""
    return (torch.empty(8 + 2 * predictions.shape[0], device=predictions.device, dtype=torch.float32),)


def forward(launcher: Callable[..., None], write_grad: bool, predictions: torch.Tensor, targets: torch.Tensor,
            out: torch.Tensor | None = None, grad_out: torch.Tensor | None = None, state: bool = True,
            ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """Run one rung's forward launcher (a bound function of the extension, e.g.
    ``ext.vectorized_forward``): one call into the extension, which runs every stage.

    Args:
        predictions: (N, C) logits of a dtype the rung takes; targets: (N,) int64; one
            CUDA device, any strides (made contiguous here).
        write_grad: the rung writes dL/dx for grad_loss = 1 in this pass (into ``grad_out``
            if given, else a fresh (N, C) tensor); only for a rung that fuses it.
        out: optional 0-d tensor to write the loss into.
        state: return ``stats`` for the backward (False: inference, one allocation, the
            loss's; the returned state's ``stats`` is then None).
    Returns the 0-d loss (the logits' dtype, written by the kernels: no conversion; ``out`` if
    given; NaN if a target is outside [0, C) and not ignore_index) and what the backward
    needs: the gradient alone if written, else predictions, targets and ``stats``
    (:func:`empty_state`): O(N) floats, each row's max and the log of sum(exp(x - max)), kept apart
    so that x - logsumexp loses no precision when the logits are large; never the (N, C) softmax.
    A row whose target is ignore_index leaves the sum and the count n_valid; every row ignored
    gives 0 / 0 = NaN and a zero gradient, as PyTorch does. Never waits for the host.
    Raises:
        RuntimeError: the launcher returned a CUDA error.
    """
    predictions, targets = predictions.contiguous(), targets.contiguous()
    rows, cols = predictions.shape
    dtype, device = predictions.dtype, predictions.device
    direct = out is not None and out.dtype is dtype
    loss = out if direct else predictions.new_empty(())
    grad = gradient_buffer(predictions, grad_out) if write_grad else None
    # the row losses (16-byte aligned), then stats' layout where no one reads it after the call:
    # the stream's scratch, no allocation
    aligned = 16 * ((rows + 3) // 4)
    stats = None
    if state and not write_grad:  # the backward reads stats: an output of its own
        (stats,) = empty_state(predictions)
        row_losses, _keep = scratch(device, aligned)
        base = stats.data_ptr()
    else:
        row_losses, _keep = scratch(device, aligned + 32 + 8 * rows)
        base = row_losses + aligned
    launch_values(launcher, device, predictions.data_ptr(), targets.data_ptr(), base, row_losses, base + 32,
                  base + 32 + 4 * rows, loss.data_ptr(), 0 if grad is None else grad.data_ptr(), rows, cols,
                  DTYPE_CODES[dtype])
    saved = (predictions, targets, stats) if grad is None else (grad,)
    if out is not None and not direct:
        loss = out.copy_(loss)
    return loss, saved


def backward(launcher: Callable[..., None], grad_in_forward: bool, saved: Sequence[torch.Tensor],
             grad_loss: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Run one rung's backward launcher (a bound function): dL/dlogits, (N, C) in the logits'
    dtype, zero on ignored rows, scaled by the 0-d ``grad_loss`` (written into ``out`` if given).

    ``saved`` is what :func:`forward` returned for the backward; ``grad_in_forward`` says
    it is the forward's gradient, which the launcher then scales in place (no work when
    grad_loss is 1). The kernels read ``grad_loss`` in the gradient's dtype (another dtype
    or device is converted).
    """
    if grad_in_forward:
        grad = forward_gradient(saved[0], out)
        x = t = row_max = row_log_sum = counts = 0
    else:
        predictions, targets, stats = saved
        grad = gradient_buffer(predictions, out)
        base, rows = stats.data_ptr(), predictions.shape[0]
        x, t, counts, row_max, row_log_sum = (predictions.data_ptr(), targets.data_ptr(), base, base + 32,
                                              base + 32 + 4 * rows)
    if grad_loss.dtype is not grad.dtype or not grad_loss.is_cuda:
        grad_loss = grad_loss.to(device=grad.device, dtype=grad.dtype)
    rows, cols = grad.shape
    launch_values(launcher, grad.device, x, t, row_max, row_log_sum, counts, grad_loss.data_ptr(), grad.data_ptr(),
                  rows, cols, DTYPE_CODES[grad.dtype])
    return grad


def cluster_plan(predictions: torch.Tensor, grad: torch.Tensor | None = None) -> tuple[int, int, str]:
    """How the ``cluster`` rung splits the rows of ``predictions`` (kernels/cross_entropy/cluster.cu).

    Args:
        predictions: (N, C) contiguous logits, float32/bfloat16/float16, on a CUDA device.
        grad: the buffer its gradient goes to (default: a fresh one, which is 16-byte aligned).
    Returns (CTAs per row, bytes of a row per CTA, ""), or (0, 0, why fused's kernels run
    instead), as the launcher decides it on ``predictions``' device.
    """
    rows, cols = predictions.shape
    address = 0 if grad is None else grad.data_ptr()  # the plan reads its offset from 16 bytes
    with torch.cuda.device(predictions.device):
        return build.load_extension("cross_entropy").cluster_plan(predictions.data_ptr(), address, rows, cols,
                                                                  DTYPE_CODES[predictions.dtype])
