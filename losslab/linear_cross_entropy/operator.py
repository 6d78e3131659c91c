"""The linear cross-entropy as ``torch.library`` operators (CPU and CUDA, fake kernels, autograd:
``torch.compile(fullgraph=True)`` traces through it) and, in eager mode, as an autograd.Function that
scales the forward's gradients in place (a traced backward cannot mutate a forward's output, so the
operators' backward scales them out of place: one more weight-gradient-sized tensor while it runs)."""
from __future__ import annotations

import torch

from losslab.linear_cross_entropy import chunked
from losslab.linear_cross_entropy.kernels import scale_in_place
from losslab.ops import NAMESPACE, define_operator

_LIBRARY = torch.library.Library(NAMESPACE, "FRAGMENT")
_ARGS = ("Tensor input, Tensor linear_weight, Tensor target, Tensor? linear_bias, Tensor? weight")
_OPTIONS = "int ignore_index, float label_smoothing, float softcap, int chunk_rows, bool[] needs, bool wide"
_CHECK = "bool check_targets"


def _forward_kernel(input, linear_weight, target, linear_bias, weight, reduction, ignore_index, label_smoothing,
                    softcap, chunk_rows, needs, wide, check_targets):
    loss, *grads = chunked.forward(input, linear_weight, target, linear_bias, weight, reduction, ignore_index,
                                   label_smoothing, softcap, chunk_rows, tuple(needs), wide, check_targets)
    return (loss, *[input.new_empty(0) if g is None else g for g in grads])


def _wanted(reduction, needs):
    return tuple(reduction != chunked.REDUCTIONS["none"] and need for need in needs)


def _forward_fake(input, linear_weight, target, linear_bias, weight, reduction, ignore_index, label_smoothing,
                  softcap, chunk_rows, needs, wide, check_targets):
    loss = input.new_empty((input.shape[0],) if reduction == chunked.REDUCTIONS["none"] else ())
    grads = [torch.empty_like(t) if want else input.new_empty(0)
             for t, want in zip((input, linear_weight, linear_bias), _wanted(reduction, needs), strict=True)]
    return (loss, *grads)


def _backward_kernel(input, linear_weight, target, linear_bias, weight, grad_output, ignore_index, label_smoothing,
                     softcap, chunk_rows, needs, wide):
    grads = chunked.backward_none(input, linear_weight, target, linear_bias, weight, grad_output, ignore_index,
                                  label_smoothing, softcap, chunk_rows, tuple(needs), wide)
    return tuple(input.new_empty(0) if g is None else g for g in grads)


def _backward_fake(input, linear_weight, target, linear_bias, weight, grad_output, ignore_index, label_smoothing,
                   softcap, chunk_rows, needs, wide):
    return tuple(torch.empty_like(t) if need else input.new_empty(0)
                 for t, need in zip((input, linear_weight, linear_bias), needs, strict=True))


forward = define_operator("linear_cross_entropy_forward",
                          f"({_ARGS}, int reduction, {_OPTIONS}, {_CHECK}) -> (Tensor, Tensor, Tensor, Tensor)",
                          _forward_kernel, _forward_fake, _LIBRARY)
backward = define_operator("linear_cross_entropy_backward",
                           f"({_ARGS}, Tensor grad_output, {_OPTIONS}) -> (Tensor, Tensor, Tensor)",
                           _backward_kernel, _backward_fake, _LIBRARY)
_LIBRARY.impl("linear_cross_entropy_forward", _forward_kernel, "CPU")
_LIBRARY.impl("linear_cross_entropy_backward", _backward_kernel, "CPU")


def _setup(ctx, inputs, output):
    input, linear_weight, target, linear_bias, weight, reduction, *options, _ = inputs
    ctx.none = reduction == chunked.REDUCTIONS["none"]
    ctx.options = options
    if ctx.none:
        ctx.save_for_backward(input, linear_weight, target, linear_bias, weight)
    else:
        ctx.mark_non_differentiable(*output[1:])
        ctx.save_for_backward(*output[1:])


def _scaled(grad: torch.Tensor, grad_loss: torch.Tensor) -> torch.Tensor:
    math = chunked.math_dtype(grad.dtype)  # grad_loss is not rounded to a 16-bit dtype first
    return (grad.to(math) * grad_loss.to(math)).to(grad.dtype)


def _backward(ctx, grad_loss, *unused):
    saved = ctx.saved_tensors
    if ctx.none:
        grads = backward(*saved, grad_loss, *ctx.options)
    else:
        grads = [_scaled(g, grad_loss) if g.numel() else None for g in saved]
    grads = [g if g is not None and g.numel() else None for g in grads]
    return (grads[0], grads[1], None, grads[2], None) + (None,) * 8


torch.library.register_autograd(forward, _backward, setup_context=_setup, lib=_LIBRARY)


class EagerLinearCrossEntropy(torch.autograd.Function):
    """Eager mode: the same kernels; the backward of mean/sum scales the forward's gradients in place
    (no copy of the weight's gradient), so it runs once per forward."""

    @staticmethod
    def forward(ctx, input, linear_weight, target, linear_bias, weight, reduction, *options):
        *options, check_targets = options
        loss, *grads = chunked.forward(input, linear_weight, target, linear_bias, weight, reduction, *options,
                                       check_targets)
        ctx.none, ctx.options, ctx.backward_calls = reduction == chunked.REDUCTIONS["none"], options, 0
        ctx.grads = grads  # not saved tensors: the backward hands them on after scaling them in place
        if ctx.none:
            ctx.save_for_backward(input, linear_weight, target, linear_bias, weight)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        if ctx.none:
            grads = chunked.backward_none(*ctx.saved_tensors, grad_loss, *ctx.options)
        else:
            if ctx.backward_calls:
                raise RuntimeError("linear_cross_entropy: backward can run once per forward (it scales the "
                                   "gradients the forward computed in place); run the forward again")
            ctx.backward_calls += 1
            grads, ctx.grads = ctx.grads, None
            for g in grads:
                if g is not None:
                    scale_in_place(g, grad_loss)
        return (grads[0], grads[1], None, grads[2], None, None) + (None,) * 7
