"""losslab's own ``hinge_loss`` (PyTorch has none: not ``hinge_embedding_loss``) and ``HingeLoss``,
with its ``torch.library`` operators (compile- and graph-capturable, no host synchronisation);
:mod:`losslab.nn` exports them. Which kernels run: :func:`hinge_loss`.
"""
from __future__ import annotations

import math

import torch
from torch.nn.modules.loss import _Loss

from losslab import build
from losslab.ops import NAMESPACE, define_operator
from losslab.problems.hinge_loss.options import REDUCTIONS, options_backward, options_forward
from losslab.problems.hinge_loss.problem import PROBLEM
from losslab.problems.launch import launch

FLOATS = (torch.float32, torch.bfloat16, torch.float16)
_LIBRARY = torch.library.Library(NAMESPACE, "FRAGMENT")


def _ext():
    return build.load_extension(PROBLEM.name)  # cached: built (or loaded) at the first call


def _eager(tensor: torch.Tensor) -> bool:
    """A plain CUDA tensor (not a fake, functional or meta one being traced): safe to scale in place."""
    return type(tensor) is torch.Tensor and tensor.device.type == "cuda" and not torch.compiler.is_compiling()


# --- the operators: input (B, D) and target (D,), contiguous, checked by hinge_loss ---------------
# losslab::nn_hinge_loss_forward(input, target, int reduction) -> loss                (vectorized)
# losslab::nn_hinge_loss_forward_grad(<the same>) -> (loss, grad)                     (fused)
# losslab::nn_hinge_loss_backward(input, target, grad_loss, int reduction) -> grad    (vectorized)

def _loss_fake(input, reduction):
    return torch.empty_like(input) if reduction == REDUCTIONS["none"] else input.new_empty(())


def _forward_kernel(input, target, reduction):
    return options_forward(_ext(), "vectorized", input, target, reduction, False)[0]


def _forward_fake(input, target, reduction):
    return _loss_fake(input, reduction)


def _forward_grad_kernel(input, target, reduction):
    return options_forward(_ext(), "fused", input, target, reduction, True)


def _forward_grad_fake(input, target, reduction):
    return _loss_fake(input, reduction), torch.empty_like(input)


def _backward_kernel(input, target, grad_loss, reduction):
    return options_backward(_ext(), input, target, grad_loss, reduction)


def _backward_fake(input, target, grad_loss, reduction):
    return torch.empty_like(input)


_ARGS = "Tensor input, Tensor target, int reduction"
forward_op = define_operator("nn_hinge_loss_forward", f"({_ARGS}) -> Tensor", _forward_kernel, _forward_fake,
                             library=_LIBRARY)
forward_grad_op = define_operator("nn_hinge_loss_forward_grad", f"({_ARGS}) -> (Tensor, Tensor)",
                                  _forward_grad_kernel, _forward_grad_fake, library=_LIBRARY)
backward_op = define_operator("nn_hinge_loss_backward",
                              "(Tensor input, Tensor target, Tensor grad_loss, int reduction) -> Tensor",
                              _backward_kernel, _backward_fake, library=_LIBRARY)


def _scale(ctx, grad: torch.Tensor, grad_loss: torch.Tensor) -> torch.Tensor:
    """The fused forward's gradient times grad_loss: in place in eager mode (fused's backward
    kernel, which moves no byte when grad_loss is 1), once per forward; out of place when traced
    (AOTAutograd cannot partition a backward that mutates a forward output)."""
    if not (_eager(grad) and _eager(grad_loss)):
        return (grad.float() * grad_loss.float()).to(grad.dtype)
    if ctx.scaled:
        raise RuntimeError(f"losslab {PROBLEM.name}: backward can run once per forward when the fused kernel wrote "
                           "the gradient (it scales it in place); run the forward again")
    ctx.scaled = True
    rows, cols = grad.shape
    scale = grad_loss.to(device=grad.device, dtype=grad.dtype)
    launch(_ext().fused_backward, grad.device, None, None, scale, grad, rows, cols, grad.dtype)
    return grad


def _setup(ctx, inputs, output):
    input, target, reduction = inputs
    ctx.save_for_backward(input, target)
    ctx.reduction = reduction


def _backward(ctx, grad_loss):
    input, target = ctx.saved_tensors
    grad = backward_op(input, target, grad_loss, ctx.reduction) if ctx.needs_input_grad[0] else None
    return grad, None, None


def _setup_grad(ctx, inputs, output):
    ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(output[1])
    ctx.scaled = False


def _backward_scale(ctx, grad_loss, _unused):
    (grad,) = ctx.saved_tensors
    return _scale(ctx, grad, grad_loss), None, None


torch.library.register_autograd(forward_op, _backward, setup_context=_setup, lib=_LIBRARY)
torch.library.register_autograd(forward_grad_op, _backward_scale, setup_context=_setup_grad, lib=_LIBRARY)


class _EagerHinge(torch.autograd.Function):
    """The operators' kernels in eager mode without the dispatcher (its Python round trips cost
    host time, the whole cost of a small loss): ``fused`` writes the gradient in the forward and
    the backward scales it, else vectorized's forward and backward."""

    @staticmethod
    def forward(ctx, fused, input, target, reduction):
        ctx.fused, ctx.scaled, ctx.reduction = fused, False, reduction
        if fused:
            loss, grad = _forward_grad_kernel(input, target, reduction)
            ctx.save_for_backward(grad)
            return loss
        ctx.save_for_backward(input, target)
        return _forward_kernel(input, target, reduction)

    @staticmethod
    def backward(ctx, grad_loss):
        if ctx.fused:
            (grad,) = ctx.saved_tensors
            return None, _scale(ctx, grad, grad_loss), None, None
        input, target = ctx.saved_tensors
        return None, _backward_kernel(input, target, grad_loss, ctx.reduction), None, None


# --- the public function --------------------------------------------------------------------------

def _grows(target: torch.Size, input: torch.Size) -> bool:
    """Whether ``target`` does not broadcast to ``input``'s shape as it is (it would grow it, or does
    not broadcast at all). The common case, ``target`` without its leading 1s being ``input``'s last
    dimensions, is answered without ``torch.broadcast_shapes``, which costs the host time of a small
    launch (17 us on the development machine)."""
    kept = tuple(target[next((i for i, d in enumerate(target) if d != 1), len(target)):])
    if len(target) <= len(input) and kept == tuple(input[len(input) - len(kept):]):
        return False
    try:
        return torch.broadcast_shapes(input, target) != input
    except RuntimeError:
        return True


def _rows(input: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``input`` as (B, D) and ``target`` as (D,), both contiguous, with target[j] for column j of
    every row: D is the number of elements of ``target`` once its leading 1s are dropped, where the
    rest of its shape is ``input``'s last dimensions (a (D,) target of a (B, D) input, a (H, W) one of
    an (N, H, W) input, or a target of the input's shape: B = 1); any other broadcast is expanded
    to the input's shape first (a copy)."""
    shape = list(target.shape)
    while shape and shape[0] == 1:
        shape.pop(0)
    if not shape or shape != list(input.shape[input.dim() - len(shape):]):
        target, shape = target.expand(input.shape), list(input.shape)
    cols = math.prod(shape)
    # a (B, D) input goes as it is: a reshape, even to its own shape, is a node more in autograd's graph
    rows = input if input.dim() == 2 and input.shape[1] == cols else input.reshape(-1, cols)
    return rows.contiguous(), target.reshape(cols).contiguous()


def hinge_loss(input: torch.Tensor, target: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """The hinge loss ``max(0, 1 - input * target)``, elementwise then reduced: losslab's own (PyTorch
    has no such function; ``F.hinge_embedding_loss`` is another loss). With reduction mean it is
    KernelBench's ``torch.mean(torch.clamp(1 - predictions * targets, min=0))``.

    Args:
        input: predictions (scores), any shape, float32/bfloat16/float16, CUDA.
        target: labels, usually -1 and +1 (any value is computed as the formula says), of a shape
            that broadcasts to ``input``'s as ``input * target`` does, without growing it: e.g. (D,)
            for a (B, D) input, multiplying column j of every row by target[j] (KernelBench's
            problem 100); cast to ``input``'s dtype. No gradient w.r.t. it.
        reduction: ``"mean"`` (over all elements of ``input``), ``"sum"`` or ``"none"`` (the terms,
            ``input``'s shape).
    Returns the loss in ``input``'s dtype (0-d, or ``input``'s shape for none); the math runs in
    float32. The gradient w.r.t. ``input`` is ``-target`` where ``1 - input * target > 0`` and 0
    elsewhere, at the hinge itself and where the margin is NaN too (as autograd of
    ``torch.clamp`` gives from torch 2.14, requirements.txt's pin; torch 2.11 and older pass
    the gradient at the hinge); a NaN in either input makes its term NaN.

    Raises:
        TypeError: ``input`` or ``target`` not a tensor, or ``input`` of another dtype.
        ValueError: an unknown reduction, an empty input, a target that does not broadcast to
            ``input``'s shape, or tensors not on one CUDA device.
        NotImplementedError: ``target`` requires grad (while grad is enabled).

    Which kernels run: ``fused`` (one pass writes the loss and the gradient; the backward only
    scales it) when a gradient will be needed and the reduction is mean or sum; otherwise
    (inference, reduction none) ``vectorized``'s forward, and its backward. The (D,) target is
    read once per block, not once per row.
    """
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction: expected one of {', '.join(REDUCTIONS)}, got {reduction!r}")
    for name, value in (("input", input), ("target", target)):
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"hinge_loss(): argument '{name}' must be Tensor, not {type(value).__name__}")
    if input.dtype not in FLOATS:
        raise TypeError(f"input: losslab has kernels for torch.float32, torch.bfloat16 and torch.float16, "
                        f"got {input.dtype}")
    if input.numel() == 0:
        raise ValueError(f"input: expected a non-empty tensor, got shape {tuple(input.shape)}")
    if torch.is_grad_enabled() and target.requires_grad:
        raise NotImplementedError("target: losslab computes no gradient w.r.t. the target; pass target.detach()")
    if _grows(target.shape, input.shape):
        raise ValueError(f"target: expected a shape that broadcasts to input's {tuple(input.shape)}, "
                         f"got {tuple(target.shape)}")
    for name, value in (("input", input), ("target", target)):
        if not value.is_cuda:
            raise ValueError(f"{name}: losslab's kernels need a CUDA tensor, got a tensor on {value.device}")
    if target.device != input.device:
        raise ValueError(f"target: expected input's device {input.device}, got {target.device}")
    if target.dtype != input.dtype:
        target = target.to(input.dtype)
    rows, cols = _rows(input, target)
    code = REDUCTIONS[reduction]
    needs_grad = torch.is_grad_enabled() and input.requires_grad
    fused = needs_grad and reduction != "none"
    if torch.compiler.is_compiling():
        loss = forward_grad_op(rows, cols, code)[0] if fused else forward_op(rows, cols, code)
    elif needs_grad:
        loss = _EagerHinge.apply(fused, rows, cols, code)
    else:
        loss = _forward_kernel(rows, cols, code)
    return loss.reshape(input.shape) if reduction == "none" else loss


class HingeLoss(_Loss):
    """The module of :func:`hinge_loss` (losslab's own, as ``torch.nn``'s losses are made):
    ``HingeLoss(reduction="mean")(input, target)``."""

    __constants__ = ["reduction"]

    def __init__(self, reduction: str = "mean") -> None:
        super().__init__(reduction=reduction)

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return hinge_loss(input, target, reduction=self.reduction)
