"""``linear_cross_entropy``: PyTorch 2.13's ``F.linear_cross_entropy`` (class indices) plus Gemma's
``softcap``, chunked so that the (N, V) logits never exist whole: its argument checks, and the call
of the operators (traced) or of the eager autograd.Function."""
from __future__ import annotations

import math

import torch

from losslab.linear_cross_entropy import operator
from losslab.linear_cross_entropy.chunked import REDUCTIONS
from losslab.linear_cross_entropy.options import as_options, chunk_rows

IGNORE_INDEX = -100
GPU_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _tensor(name: str, value) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name}: expected a Tensor, got {type(value).__name__}")
    return value


def _check(input, linear_weight, target, linear_bias, weight) -> None:
    """One error naming the first argument that does not fit (see :func:`linear_cross_entropy`)."""
    for name, t in (("input", input), ("linear_weight", linear_weight), ("target", target)):
        _tensor(name, t)
    allowed = GPU_DTYPES if input.is_cuda else (*GPU_DTYPES, torch.float64)
    if input.dtype not in allowed:
        raise TypeError(f"input: expected one of {', '.join(map(str, allowed))} on {input.device.type}, "
                        f"got {input.dtype}")
    if input.dim() == 0 or input.numel() == 0:
        raise ValueError(f"input: expected a non-empty (..., H) tensor, got shape {tuple(input.shape)}")
    if linear_weight.dim() != 2 or linear_weight.shape[1] != input.shape[-1] or linear_weight.shape[0] == 0:
        raise ValueError(f"linear_weight: expected shape (V, {input.shape[-1]}) for input of shape "
                         f"{tuple(input.shape)}, got {tuple(linear_weight.shape)}")
    if target.is_floating_point():
        raise TypeError("target: expected int64 class indices; class-probability targets are not supported here")
    if target.dtype != torch.int64:
        raise TypeError(f"target: expected int64 class indices, got {target.dtype}")
    if target.shape != input.shape[:-1]:
        raise ValueError(f"target: expected shape {tuple(input.shape[:-1])} (input's without H), "
                         f"got {tuple(target.shape)}")
    vocab = linear_weight.shape[0]
    named = [("linear_weight", linear_weight), ("linear_bias", linear_bias), ("weight", weight)]
    for name, t in named:
        if t is None:
            continue
        _tensor(name, t)
        if t.dtype != input.dtype:
            raise TypeError(f"{name}: expected {input.dtype} (input's dtype), got {t.dtype}")
        if name != "linear_weight" and tuple(t.shape) != (vocab,):
            raise ValueError(f"{name}: expected shape ({vocab},) (linear_weight's rows), got {tuple(t.shape)}")
    for name, t in [("target", target), *named]:
        if t is not None and t.device != input.device:
            raise ValueError(f"{name}: expected a tensor on {input.device} (input's device), got {t.device}")
    if weight is not None and weight.requires_grad and torch.is_grad_enabled():
        raise NotImplementedError("weight: no gradient w.r.t. the class weights (as in F.cross_entropy); "
                                  "pass weight.detach()")


def linear_cross_entropy(input: torch.Tensor, linear_weight: torch.Tensor, target: torch.Tensor, *,
                         linear_bias: torch.Tensor | None = None, weight: torch.Tensor | None = None,
                         reduction: str = "mean", ignore_index: int | None = -100, label_smoothing: float = 0.0,
                         softcap: float | None = None, options=None) -> torch.Tensor:
    """``F.cross_entropy(F.linear(input, linear_weight, linear_bias), target, ...)`` with the logits
    computed and consumed a chunk of tokens at a time (PyTorch 2.13's ``F.linear_cross_entropy``).

    Args:
        input: (..., H) hidden states (H,) or (N, H) as in PyTorch, or any leading shape: float32,
            bfloat16, float16 on CUDA (float64 too on the CPU); the softmax math runs in float32.
        linear_weight: (V, H), input's dtype and device. linear_bias: (V,) or None.
        target: int64 class indices of shape input.shape[:-1].
        weight: (V,) class weights of input's dtype, or None (no gradient for it).
        reduction: "none" (the loss per token, target's shape), "mean" (divided by the sum of the
            class weights of the targets not ignored: their count without weights, PyTorch's
            divisor, also with label smoothing) or "sum".
        ignore_index: the class index that leaves a token out; None means -100 (PyTorch 2.13's default).
        label_smoothing: in [0, 1], PyTorch's formula with ``weight``.
        softcap: None, or a positive float: logits = softcap * tanh(z / softcap) (Gemma 2).
        options: None, :class:`losslab.linear_cross_entropy.Options` or PyTorch's
            ``LinearCrossEntropyOptions``: the chunk size (token rows, or the chunk logits' bytes;
            default: the op's memory beside the weight's gradient within 256 MiB) and whether the
            targets are checked (default; ``check_targets=False``: no wait for the device, NaN instead),
            and the weight gradient's accumulator (``float32_grad_weight``).
    Returns the loss in input's dtype: 0-d, or target's shape for "none".
    Raises: TypeError/ValueError naming the argument for a wrong type, dtype, shape or device, an
    unknown reduction, a label_smoothing outside [0, 1], a softcap that is not a positive finite number, or
    a class index outside [0, V) that is not ignore_index (one wait for the device to check it, unless
    ``Options(check_targets=False)``);
    NotImplementedError for a weight that requires grad; RuntimeError for a second backward through one
    eager forward of mean/sum (their gradients are computed in the forward and scaled in place).

    Cost: 6 * N * H * V flops in three cuBLAS GEMMs per chunk (a fourth, 2 * N * H * V, for reduction
    none with a gradient, whose backward computes the logits again) and about one read and one write of
    each chunk's logits by the kernel; memory: the gradients, one chunk of logits, (N,) float32 row losses.
    """
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction: expected 'none', 'mean' or 'sum', got {reduction!r}")
    ignore_index = IGNORE_INDEX if ignore_index is None else ignore_index
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise TypeError(f"ignore_index: expected an int or None, got {ignore_index!r}")
    if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, int | float) \
            or not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing: expected a float in [0, 1], got {label_smoothing!r}")
    if softcap is not None and not (isinstance(softcap, int | float) and math.isfinite(softcap) and softcap > 0):
        raise ValueError(f"softcap: expected None or a positive finite float, got {softcap!r}")
    _check(input, linear_weight, target, linear_bias, weight)
    config = as_options(options)
    shape = target.shape
    hidden, vocab = input.shape[-1], linear_weight.shape[0]
    # (N, H) as it is: a view would make autograd copy the input's gradient instead of keeping ours
    flat = (input if input.dim() == 2 else input.reshape(-1, hidden)).contiguous()
    labels = (target if target.dim() == 1 else target.reshape(-1)).contiguous()
    grad = torch.is_grad_enabled()
    needs = [grad and t is not None and t.requires_grad for t in (input, linear_weight, linear_bias)]
    args = (flat, linear_weight.contiguous(), labels, None if linear_bias is None else linear_bias.contiguous(),
            None if weight is None else weight.detach().contiguous(), REDUCTIONS[reduction], ignore_index,
            float(label_smoothing), float(softcap or 0.0),
            chunk_rows(config, flat.shape[0], hidden, vocab, input.element_size()), needs, config.float32_grad_weight,
            config.check_targets)
    if torch.compiler.is_compiling() or not any(needs):
        loss = operator.forward(*args)[0]
    else:
        loss = operator.EagerLinearCrossEntropy.apply(*args)
    return loss.reshape(shape) if reduction == "none" else loss


class LinearCrossEntropyLoss(torch.nn.Module):
    """``forward(input, linear_weight, target, linear_bias=None)`` is :func:`linear_cross_entropy` with
    the options given to the constructor (PyTorch 2.13's keyword arguments plus ``softcap``)."""

    def __init__(self, *, weight: torch.Tensor | None = None, reduction: str = "mean",
                 ignore_index: int | None = -100, label_smoothing: float = 0.0, softcap: float | None = None,
                 options=None) -> None:
        super().__init__()
        self.register_buffer("weight", weight)
        self.reduction, self.ignore_index, self.label_smoothing = reduction, ignore_index, label_smoothing
        self.softcap, self.options = softcap, options

    def forward(self, input: torch.Tensor, linear_weight: torch.Tensor, target: torch.Tensor,
                linear_bias: torch.Tensor | None = None) -> torch.Tensor:
        return linear_cross_entropy(input, linear_weight, target, linear_bias=linear_bias, weight=self.weight,
                                    reduction=self.reduction, ignore_index=self.ignore_index,
                                    label_smoothing=self.label_smoothing, softcap=self.softcap,
                                    options=self.options)
