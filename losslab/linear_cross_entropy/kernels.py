"""The op's own kernels, each with its torch twin for the CPU (the path the cpu tier checks against
PyTorch in float64): :func:`rows`, a chunk of logits' losses and dloss/dlogits written over them in place
(``kernels/linear_cross_entropy/rows.cu``), and :func:`scale_in_place` (``kernels/common/scale.cu``)."""
from __future__ import annotations

import torch

from losslab.linear_cross_entropy import build
from losslab.problems.launch import launch


def rows(logits: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None, stats: torch.Tensor,
         row_scale: torch.Tensor | None, row_losses: torch.Tensor, *, ignore_index: int, label_smoothing: float,
         softcap: float, mean: bool, write_grad: bool) -> None:
    """One chunk: ``row_losses`` written, and ``logits`` overwritten with dloss/dlogits when ``write_grad``.

    Args:
        logits: (rows, V) contiguous, float32/bfloat16/float16 (float64 too on the CPU): z = input @ W^T + b.
        target: (rows,) int64 class indices; ``ignore_index`` leaves a row out (loss 0, gradient 0).
        weight: (V,) float32 class weights (float64 with float64 logits), or None.
        stats: (2,) float32 (float64): the mean's divisor (sum of w_t over the rows not ignored) and
            W = sum_j w_j (V without weights).
        row_scale: (rows,) float32 per-row factor of the gradient (reduction none's grad_output), or None.
        row_losses: (rows,) float32 (float64), written: each row's loss; NaN for a target outside [0, V).
        label_smoothing: eps in [0, 1]; softcap: 0 for none, else logits y = softcap * tanh(z / softcap).
        mean: divide the gradient by ``stats[0]``.
    The formulas: ``kernels/linear_cross_entropy/launchers.h`` (PyTorch's F.cross_entropy with weight and
    label_smoothing, applied to y).
    """
    if logits.is_cuda:
        launch(build.load().rows, logits.device, logits, target, weight, stats, row_scale, row_losses,
               logits.shape[0], logits.shape[1], int(ignore_index), float(label_smoothing), float(softcap),
               int(mean), int(write_grad), logits.dtype)
        return
    _rows_torch(logits, target, weight, stats, row_scale, row_losses, ignore_index, label_smoothing, softcap,
                mean, write_grad)


def scale_in_place(grad: torch.Tensor, grad_loss: torch.Tensor) -> None:
    """``grad *= grad_loss`` in place (grad contiguous; grad_loss 0-d, cast to grad's dtype as autograd's
    grad of a loss of that dtype is). On a GPU the kernel reads grad_loss on the device and moves no byte
    when it is 1 (``loss.backward()``): no host synchronization, no pass over a weight-sized gradient."""
    scale = grad_loss.to(grad.dtype).contiguous()
    if grad.is_cuda:
        launch(build.load().scale_in_place, grad.device, grad, scale, grad.numel(), grad.dtype)
    else:
        grad.mul_(scale)


def _rows_torch(logits, target, weight, stats, row_scale, row_losses, ignore_index, label_smoothing, softcap, mean,
                write_grad) -> None:
    math = torch.float64 if logits.dtype == torch.float64 else torch.float32
    vocab = logits.shape[1]
    z = logits.to(math)
    y = softcap * torch.tanh(z / softcap) if softcap else z
    log_p = torch.log_softmax(y, dim=1)
    ignored = target == ignore_index
    in_range = (target >= 0) & (target < vocab)
    safe = torch.where(in_range, target, 0)
    w = torch.ones(vocab, dtype=math) if weight is None else weight.to(math)
    kept = (~ignored).to(math)[:, None]
    a = label_smoothing / vocab * w[None, :] * kept  # a_j (launchers.h)
    a.scatter_add_(1, safe[:, None], ((1 - label_smoothing) * w[safe] * (in_range & ~ignored))[:, None])
    loss = -(a * log_p).sum(dim=1)
    row_losses.copy_(torch.where(in_range | ignored, loss, torch.nan))
    if not write_grad:
        return
    scale = torch.ones(len(target), dtype=math) if row_scale is None else row_scale.to(math)
    if mean:
        scale = scale / stats[0].to(math)
    scale = torch.where(ignored, 0.0, torch.where(in_range, scale, torch.nan))
    grad = (log_p.exp() * a.sum(dim=1, keepdim=True) - a) * scale[:, None]
    if softcap:
        grad = grad * (1 - (y / softcap) ** 2)
    logits.copy_(grad)
