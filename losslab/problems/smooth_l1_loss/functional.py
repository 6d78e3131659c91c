"""``F.smooth_l1_loss`` and ``F.huber_loss`` on smooth_l1_loss's operator kernels (vectorized, fused):
``torch.library`` operators with fake kernels and autograd (compile- and graph-capturable, no host
synchronisation), and the same kernels without the dispatcher in eager mode: :func:`smooth_l1_loss`,
:func:`huber_loss`, :class:`SmoothL1Loss` and :class:`HuberLoss`, which ``losslab.nn`` exports."""
from __future__ import annotations

import functools
import warnings

import torch
from torch.nn import _reduction
from torch.nn.modules.loss import _Loss

from losslab import build
from losslab import ops as rung_ops
from losslab.problems.launch import launch
from losslab.problems.smooth_l1_loss.options import REDUCTIONS, options_backward, options_forward
from losslab.problems.smooth_l1_loss.problem import PROBLEM
from losslab.validation import require_cuda

FLOATS = (torch.float32, torch.bfloat16, torch.float16)
# True: fused (one pass writes the loss and the gradient, the backward only scales it) when a
# gradient will be needed and the reduction is sum or mean; False: always vectorized.
PREFER_FUSED = True
_LIBRARY = torch.library.Library(rung_ops.NAMESPACE, "FRAGMENT")


@functools.cache
def _ext():
    """smooth_l1_loss's extension (built at the first call)."""
    return build.load_extension(PROBLEM.name)


def _forward_kernel(input, target, reduction, beta, factor):
    return options_forward(_ext(), "vectorized", input, target, reduction, beta, factor, False)[0]


def _forward_grad_kernel(input, target, reduction, beta, factor):
    return options_forward(_ext(), "fused", input, target, reduction, beta, factor, True)


def _backward_kernel(input, target, grad_loss, reduction, beta, factor):
    return options_backward(_ext(), input, target, grad_loss, reduction, beta, factor)


def _loss_fake(input, target, reduction, beta, factor):
    if reduction == REDUCTIONS["none"]:
        return torch.empty_like(input, memory_format=torch.contiguous_format)
    return input.new_empty(())


def _forward_grad_fake(input, target, reduction, beta, factor):
    return _loss_fake(input, target, reduction, beta, factor), torch.empty_like(
        input, memory_format=torch.contiguous_format)


def _backward_fake(input, target, grad_loss, reduction, beta, factor):
    return torch.empty_like(input, memory_format=torch.contiguous_format)


# losslab::nn_smooth_l1_loss_forward(input, target, reduction, beta, factor) -> loss  (vectorized)
# losslab::nn_smooth_l1_loss_forward_grad(<the same>) -> (loss, grad)                   (fused: sum, mean)
# losslab::nn_smooth_l1_loss_backward(input, target, grad_loss, <the options>) -> grad  (vectorized)
# factor: 1 for smooth_l1_loss, delta for huber_loss (whose beta is delta).
_ARGS = "Tensor input, Tensor target, int reduction, float beta, float factor"
forward_op = rung_ops.define_operator("nn_smooth_l1_loss_forward", f"({_ARGS}) -> Tensor", _forward_kernel, _loss_fake,
                                      library=_LIBRARY)
forward_grad_op = rung_ops.define_operator("nn_smooth_l1_loss_forward_grad", f"({_ARGS}) -> (Tensor, Tensor)",
                                           _forward_grad_kernel, _forward_grad_fake, library=_LIBRARY)
backward_op = rung_ops.define_operator("nn_smooth_l1_loss_backward",
                                       "(Tensor input, Tensor target, Tensor grad_loss, int reduction, float beta, "
                                       "float factor) -> Tensor",
                                       _backward_kernel, _backward_fake, library=_LIBRARY)


def _scale(ctx, grad: torch.Tensor, grad_loss: torch.Tensor) -> torch.Tensor:
    """The fused forward's gradient times grad_loss: in place in eager mode (fused's backward
    kernel, which moves no byte when grad_loss is 1), once per forward; out of place when traced
    (AOTAutograd cannot partition a backward that mutates a forward output).

    Raises:
        RuntimeError: a second backward through one eager forward.
    """
    eager = not torch.compiler.is_compiling() and all(
        type(t) is torch.Tensor and t.is_cuda for t in (grad, grad_loss))
    if not eager:
        return (grad.float() * grad_loss.float()).to(grad.dtype)
    if ctx.scaled:
        raise RuntimeError("losslab smooth_l1_loss: backward can run once per forward when the fused kernel wrote the "
                           "gradient (it scales it in place); run the forward again")
    ctx.scaled = True
    launch(_ext().fused_backward, grad.device, None, None, grad_loss.to(grad.dtype), grad, grad.numel(), 1,
           grad.dtype)
    return grad


def _setup(ctx, inputs, output):
    input, target, *options = inputs
    ctx.save_for_backward(input, target)
    ctx.options = options


def _backward(ctx, grad_loss):
    input, target = ctx.saved_tensors
    grad = backward_op(input, target, grad_loss, *ctx.options) if ctx.needs_input_grad[0] else None
    return grad, None, None, None, None


def _setup_grad(ctx, inputs, output):
    ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(output[1])
    ctx.scaled = False


def _backward_scale(ctx, grad_loss, _unused):
    (grad,) = ctx.saved_tensors
    return _scale(ctx, grad, grad_loss), None, None, None, None


torch.library.register_autograd(forward_op, _backward, setup_context=_setup, lib=_LIBRARY)
torch.library.register_autograd(forward_grad_op, _backward_scale, setup_context=_setup_grad, lib=_LIBRARY)


class EagerSmoothL1Loss(torch.autograd.Function):
    """The operators' kernels with autograd by hand, without the dispatcher (its host time per call
    is a visible share of a small loss): ``fused`` writes the gradient in the forward and the
    backward scales it; else vectorized's forward and backward."""

    @staticmethod
    def forward(ctx, fused, input, target, *options):
        ctx.fused, ctx.scaled, ctx.options = fused, False, options
        if fused:
            loss, grad = _forward_grad_kernel(input, target, *options)
            ctx.save_for_backward(grad)
            return loss
        ctx.save_for_backward(input, target)
        return _forward_kernel(input, target, *options)

    @staticmethod
    def backward(ctx, grad_loss):
        if ctx.fused:
            (grad,) = ctx.saved_tensors
            return None, _scale(ctx, grad, grad_loss), None, None, None, None
        input, target = ctx.saved_tensors
        return None, _backward_kernel(input, target, grad_loss, *ctx.options), None, None, None, None


def _reduction_name(size_average, reduce, reduction: str) -> str:
    """``reduction``, or the one PyTorch's legacy ``size_average``/``reduce`` name.

    Raises:
        ValueError: an unknown reduction.
    """
    if size_average is not None or reduce is not None:
        reduction = _reduction.legacy_get_string(size_average, reduce)
    if reduction not in REDUCTIONS:
        raise ValueError(f"{reduction} is not a valid value for reduction")
    return reduction


def _checked(input, target, size_average, reduce, reduction, weight) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`smooth_l1_loss`'s and :func:`huber_loss`'s arguments checked as PyTorch checks them (its
    warning for a target of another size included), and ``input``, ``target`` in their promoted dtype
    and broadcast shape, contiguous.
    Raises as :func:`smooth_l1_loss`."""
    for name, value in (("input", input), ("target", target)):
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"loss(): argument '{name}' must be Tensor, not {type(value).__name__}")
    if target.size() != input.size():
        warnings.warn(f"Using a target size ({target.size()}) that is different to the input size ({input.size()}). "
                      "This will likely lead to incorrect results due to broadcasting. "
                      "Please ensure they have the same size.", stacklevel=3)  # the caller of smooth_l1_loss
    _reduction_name(size_average, reduce, reduction)
    if weight is not None:
        raise NotImplementedError("weight: losslab's huber_loss has no kernels for a weighted loss; use "
                                  "torch.nn.functional.huber_loss")
    dtype = torch.promote_types(input.dtype, target.dtype)
    if dtype not in FLOATS:
        raise TypeError(f"input: losslab has kernels for torch.float32, torch.bfloat16 and torch.float16, "
                        f"got {dtype}")
    if torch.is_grad_enabled() and target.requires_grad:
        raise NotImplementedError("target: losslab computes no gradient w.r.t. the target; pass target.detach()")
    shape = input.shape if input.shape == target.shape else torch.broadcast_shapes(input.shape, target.shape)
    require_cuda(input=input, target=target)
    if shape.numel() == 0:
        raise ValueError(f"input: expected a non-empty tensor, got shape {tuple(shape)}")
    if input.dtype != dtype:
        input = input.to(dtype)
    if target.dtype != dtype:
        target = target.to(dtype)
    if input.shape != shape:
        input = input.expand(shape)
    if target.shape != shape:
        target = target.expand(shape)
    return input.contiguous(), target.contiguous()


def _loss(input, target, reduction: str, beta: float, factor: float) -> torch.Tensor:
    """The checked call: which operator or kernels run (see :func:`smooth_l1_loss`)."""
    code = REDUCTIONS[reduction]
    needs_grad = torch.is_grad_enabled() and input.requires_grad
    fused = PREFER_FUSED and needs_grad and reduction != "none"
    args = (input, target, code, float(beta), float(factor))
    if torch.compiler.is_compiling():
        return forward_grad_op(*args)[0] if fused else forward_op(*args)
    if needs_grad:
        return EagerSmoothL1Loss.apply(fused, *args)
    return _forward_kernel(*args)


def smooth_l1_loss(input: torch.Tensor, target: torch.Tensor, size_average=None, reduce=None, reduction: str = "mean",
                   beta: float = 1.0) -> torch.Tensor:
    """``F.smooth_l1_loss``: 0.5 d^2 / beta where |d| < beta, else |d| - 0.5 beta, for d = input - target;
    their mean, sum or each (beta = 0: the L1 loss).

    Args:
        input: any shape, float32/bfloat16/float16, CUDA.
        target: broadcastable to ``input`` (with PyTorch's warning when its size differs); both
            are cast to their promoted dtype.
        reduction: ``"none"``, ``"mean"`` (over all elements) or ``"sum"``; ``size_average``/``reduce``
            as PyTorch's legacy. beta: the threshold, >= 0.
    Returns the loss in the promoted dtype (the broadcast shape for none, else 0-d); the math runs
    in float32. dL/dinput = clamp(d / beta, -1, 1) * grad_loss / divisor (sign(d) for beta 0).
    Raises:
        ValueError: an unknown reduction; an empty or non-CUDA tensor, or tensors on two devices.
        TypeError: a tensor of a dtype without kernels, or not a tensor.
        RuntimeError: shapes that do not broadcast; a negative beta (PyTorch's message).
        NotImplementedError: a target that requires grad.

    Which kernels run: ``fused`` (one pass writes the loss and the gradient; the backward only
    scales it) when a gradient will be needed and the reduction is sum or mean; otherwise
    (inference, reduction none) ``vectorized``'s forward, and its backward.
    """
    if beta < 0:
        raise RuntimeError("smooth_l1_loss does not support negative values for beta.")
    input, target = _checked(input, target, size_average, reduce, reduction, None)
    return _loss(input, target, _reduction_name(size_average, reduce, reduction), beta, 1.0)


def huber_loss(input: torch.Tensor, target: torch.Tensor, reduction: str = "mean", delta: float = 1.0,
               weight: torch.Tensor | None = None) -> torch.Tensor:
    """``F.huber_loss``: 0.5 d^2 where |d| < delta, else delta (|d| - 0.5 delta), for d = input - target:
    ``delta * smooth_l1_loss(input, target, beta=delta)``, on the same kernels.

    Args and returns as :func:`smooth_l1_loss`; delta: > 0. dL/dinput = clamp(d, -delta, delta) *
    grad_loss / divisor.
    Raises: as :func:`smooth_l1_loss`; RuntimeError for delta <= 0 (PyTorch's message);
    NotImplementedError for ``weight``.
    """
    if delta <= 0:
        raise RuntimeError("huber_loss does not support non-positive values for delta.")
    input, target = _checked(input, target, None, None, reduction, weight)
    return _loss(input, target, reduction, delta, delta)


class SmoothL1Loss(_Loss):
    """``torch.nn.SmoothL1Loss``: ``forward(input, target)`` is :func:`smooth_l1_loss`."""

    __constants__ = ["reduction"]

    def __init__(self, size_average=None, reduce=None, reduction: str = "mean", beta: float = 1.0) -> None:
        super().__init__(size_average, reduce, reduction)
        self.beta = beta

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return smooth_l1_loss(input, target, reduction=self.reduction, beta=self.beta)


class HuberLoss(_Loss):
    """``torch.nn.HuberLoss``: ``forward(input, target)`` is :func:`huber_loss`."""

    __constants__ = ["reduction", "delta"]

    def __init__(self, reduction: str = "mean", delta: float = 1.0) -> None:
        super().__init__(reduction=reduction)
        self.delta = delta

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return huber_loss(input, target, reduction=self.reduction, delta=self.delta)
