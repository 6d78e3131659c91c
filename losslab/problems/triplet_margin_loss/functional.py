"""``F.triplet_margin_loss`` and ``nn.TripletMarginLoss`` on the triplet_margin_loss operators, with the
gradients of all three inputs: ``torch.library`` operators (fake kernels, autograd) that
``torch.compile(fullgraph=True)`` traces and CUDA graphs capture, no host synchronisation.
:mod:`losslab.nn` exports them; this package's ``__init__`` does not import this module (losslab.ops
imports the problems)."""
from __future__ import annotations

import functools

import torch
from torch.nn import _reduction
from torch.nn.modules.loss import _Loss

from losslab import build, ops
from losslab.problems.launch import DTYPE_CODES, launch_values
from losslab.problems.triplet_margin_loss.options import REDUCTIONS, options_backward, options_forward
from losslab.problems.triplet_margin_loss.problem import EPS, MARGIN, PROBLEM

FLOATS = (torch.float32, torch.bfloat16, torch.float16)
_LIBRARY = torch.library.Library(ops.NAMESPACE, "FRAGMENT")
_define = functools.partial(ops.define_operator, library=_LIBRARY)
_ARGS = "Tensor anchor, Tensor positive, Tensor negative, float margin, float eps, bool swap, int reduction"
_NEEDS = "bool grad_anchor, bool grad_positive, bool grad_negative"


@functools.cache
def _ext():
    return build.load_extension(PROBLEM.name)


def _loss_fake(anchor: torch.Tensor, reduction: int) -> torch.Tensor:
    return anchor.new_empty((anchor.shape[0],) if reduction == REDUCTIONS["none"] else ())


def _grads_fake(inputs, needs) -> tuple[torch.Tensor, ...]:
    """A gradient where asked for, else an empty tensor (an operator's outputs are tensors)."""
    return tuple(torch.empty_like(x, memory_format=torch.contiguous_format) if wanted else x.new_empty((0,))
                 for x, wanted in zip(inputs, needs, strict=True))


def _filled(inputs, grads) -> tuple[torch.Tensor, ...]:
    return tuple(x.new_empty((0,)) if g is None else g for x, g in zip(inputs, grads, strict=True))


# losslab::nn_triplet_margin_loss_forward(<_ARGS>) -> loss                     vectorized: the loss alone
# losslab::nn_triplet_margin_loss_forward_grad(<_ARGS>, <_NEEDS>) -> (loss, dL/da, dL/dp, dL/dn)
#     fused (sum, mean): the gradients asked for, for grad_loss = 1 (an empty tensor for the others)
# losslab::nn_triplet_margin_loss_backward(a, p, n, grad_loss, <options>, <_NEEDS>) -> (dL/da, dL/dp, dL/dn)
#     vectorized's backward: reads the three inputs again

def _forward_kernel(anchor, positive, negative, margin, eps, swap, reduction):
    return options_forward(_ext(), "vectorized", anchor, positive, negative, margin, eps, swap, reduction)[0]


def _forward_fake(anchor, positive, negative, margin, eps, swap, reduction):
    return _loss_fake(anchor, reduction)


def _forward_grad_kernel(anchor, positive, negative, margin, eps, swap, reduction, *needs):
    inputs = (anchor, positive, negative)
    loss, grads = options_forward(_ext(), "fused", *inputs, margin, eps, swap, reduction, needs)
    return (loss, *_filled(inputs, grads))


def _forward_grad_fake(anchor, positive, negative, margin, eps, swap, reduction, *needs):
    return (_loss_fake(anchor, reduction), *_grads_fake((anchor, positive, negative), needs))


def _backward_kernel(anchor, positive, negative, grad_loss, margin, eps, swap, reduction, *needs):
    inputs = (anchor, positive, negative)
    return _filled(inputs, options_backward(_ext(), *inputs, grad_loss, margin, eps, swap, reduction, needs))


def _backward_fake(anchor, positive, negative, grad_loss, margin, eps, swap, reduction, *needs):
    return _grads_fake((anchor, positive, negative), needs)


forward = _define("nn_triplet_margin_loss_forward", f"({_ARGS}) -> Tensor", _forward_kernel, _forward_fake)
forward_grad = _define("nn_triplet_margin_loss_forward_grad",
                       f"({_ARGS}, {_NEEDS}) -> (Tensor, Tensor, Tensor, Tensor)", _forward_grad_kernel,
                       _forward_grad_fake)
backward = _define("nn_triplet_margin_loss_backward",
                   "(Tensor anchor, Tensor positive, Tensor negative, Tensor grad_loss, float margin, float eps, "
                   f"bool swap, int reduction, {_NEEDS}) -> (Tensor, Tensor, Tensor)", _backward_kernel, _backward_fake)


def _setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:3])
    ctx.options = inputs[3:]


def _backward(ctx, grad_loss):
    needs = ctx.needs_input_grad[:3]
    grads = backward(*ctx.saved_tensors, grad_loss, *ctx.options, *needs)
    return (*(g if wanted else None for g, wanted in zip(grads, needs, strict=True)), None, None, None, None)


def _setup_grad(ctx, inputs, output):
    ctx.set_materialize_grads(False)  # else autograd fills a zero gradient for each full-size gradient output
    ctx.mark_non_differentiable(*output[1:])
    ctx.save_for_backward(*output[1:])
    ctx.needs = inputs[7:]
    ctx.scaled = False


def _eager(tensor: torch.Tensor) -> bool:
    """A plain CUDA tensor (not a fake or functional one being traced): safe to scale in place."""
    return type(tensor) is torch.Tensor and tensor.device.type == "cuda" and not torch.compiler.is_compiling()


def _backward_scale(ctx, grad_loss, *_unused):
    """The forward's gradients times grad_loss: out of place when traced (AOTAutograd cannot partition a
    backward that mutates a forward output), in place in eager mode (fused's scale kernel, no work when
    grad_loss is 1), once per forward."""
    if grad_loss is None:  # the loss reached no output that was differentiated
        return (None,) * 10
    grads = [g if wanted else None for g, wanted in zip(ctx.saved_tensors, ctx.needs, strict=True)]
    if all(_eager(g) for g in grads if g is not None) and _eager(grad_loss):
        if ctx.scaled:
            raise RuntimeError("losslab triplet_margin_loss: backward can run once per forward when the fused kernel "
                               "wrote the gradients (it scales them in place); run the forward again")
        ctx.scaled = True
        for g in grads:
            if g is not None:
                scale = grad_loss.to(device=g.device, dtype=g.dtype)  # the scale kernel reads it in that dtype
                launch_values(_ext().fused_backward, g.device, 0, 0, 0, scale.data_ptr(), g.data_ptr(), g.numel(), 1,
                              DTYPE_CODES[g.dtype])
    else:
        grads = [None if g is None else (g.float() * grad_loss.float()).to(g.dtype) for g in grads]
    return (*grads, None, None, None, None, None, None, None)


torch.library.register_autograd(forward, _backward, setup_context=_setup, lib=_LIBRARY)
torch.library.register_autograd(forward_grad, _backward_scale, setup_context=_setup_grad, lib=_LIBRARY)


class _EagerTriplet(torch.autograd.Function):
    """The operators' kernels in eager mode without the dispatcher (its Python round trips cost host
    time, the whole cost of a small loss): ``fused`` writes the gradients asked for in the forward
    and the backward scales them (:func:`_backward_scale`), else vectorized's forward and backward."""

    @staticmethod
    def forward(ctx, fused, anchor, positive, negative, margin, eps, swap, reduction):
        inputs, options = (anchor, positive, negative), (margin, eps, swap, reduction)
        ctx.fused, ctx.needs = fused, ctx.needs_input_grad[1:4]
        if fused:
            loss, *grads = _forward_grad_kernel(*inputs, *options, *ctx.needs)
            ctx.save_for_backward(*grads)
            ctx.scaled = False
            return loss
        ctx.save_for_backward(*inputs)
        ctx.options = options
        return _forward_kernel(*inputs, *options)

    @staticmethod
    def backward(ctx, grad_loss):
        if ctx.fused:
            grads = _backward_scale(ctx, grad_loss)[:3]
        else:
            grads = _backward_kernel(*ctx.saved_tensors, grad_loss, *ctx.options, *ctx.needs)
            grads = [g if wanted else None for g, wanted in zip(grads, ctx.needs, strict=True)]
        return (None, *grads, None, None, None, None)


def _require_inputs(anchor, positive, negative) -> None:
    """PyTorch's errors where it has them, losslab's (one line naming the argument) where it computes;
    the devices last, so that the other mistakes read the same without a GPU."""
    named = (("anchor", anchor), ("positive", positive), ("negative", negative))
    for name, x in named:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"triplet_margin_loss(): argument '{name}' must be Tensor, not {type(x).__name__}")
    if not anchor.dim() == positive.dim() == negative.dim():
        raise RuntimeError("The anchor, positive, and negative tensors are expected to have the same number of "
                           f"dimensions, but got: anchor {anchor.dim()}D, positive {positive.dim()}D, and negative "
                           f"{negative.dim()}D inputs")
    for name, x in named:
        if x.dtype not in FLOATS:
            raise TypeError(f"{name}: losslab has kernels for torch.float32, torch.bfloat16 and torch.float16, "
                            f"got {x.dtype}")
        if x.dim() not in (1, 2) or x.shape != anchor.shape:
            raise ValueError(f"{name}: expected (N, D) or (D,) of the anchor's shape {tuple(anchor.shape)} "
                             f"(losslab does not broadcast), got {tuple(x.shape)}")
        if x.dtype != anchor.dtype:
            raise TypeError(f"{name}: expected the anchor's dtype ({anchor.dtype}), got {x.dtype}")
        if x.numel() == 0:
            raise ValueError(f"{name}: expected a non-empty tensor, got shape {tuple(x.shape)}")
    for name, x in named:
        if not x.is_cuda:
            raise ValueError(f"{name}: losslab's kernels need a CUDA tensor, got a tensor on {x.device}")
    if not anchor.device == positive.device == negative.device:
        raise RuntimeError("Expected all tensors to be on the same device, got "
                           + ", ".join(str(x.device) for _, x in named))


def triplet_margin_loss(anchor: torch.Tensor, positive: torch.Tensor, negative: torch.Tensor, margin: float = 1.0,
                        p: float = 2, eps: float = 1e-6, swap: bool = False, size_average=None, reduce=None,
                        reduction: str = "mean") -> torch.Tensor:
    """``F.triplet_margin_loss``: max(margin + d(a, p) - d(a, n), 0) per row, d(x, y) = ||x - y + eps||_2
    (``F.pairwise_distance``); with ``swap``, d(a, n) is min(d(a, n), d(p, n)) (Balntas et al., 2016).

    Args:
        anchor, positive, negative: (N, D) or (D,), one shape and dtype (float32/bfloat16/float16), CUDA.
        margin: > 0. p: 2 only (the Euclidean distance). eps: added to each difference.
        reduction: ``"none"`` ((N,) losses, () for (D,) inputs), ``"mean"`` or ``"sum"`` (0-d).
    Returns the loss in the inputs' dtype; differentiable w.r.t. each input that requires grad, with
    PyTorch's autograd conventions (no gradient where a row's term is 0, none for a zero distance, a
    tie of swap's minimum split in half).
    Raises:
        ValueError: margin <= 0 or an unknown reduction (as PyTorch); p other than 2; shapes that
            differ (losslab does not broadcast) or not 1-D/2-D; an empty tensor; a tensor not on CUDA.
        TypeError: a non-tensor argument, or a dtype other than float32/bfloat16/float16, or dtypes
            that differ. RuntimeError: different numbers of dimensions or devices (PyTorch's messages).

    Which kernels run: ``fused`` (one pass writes the loss and the gradients asked for; the backward
    only scales them) when a gradient will be needed and the reduction is sum or mean; otherwise
    ``vectorized``'s forward, and its backward (which reads the three inputs again).
    """
    if size_average is not None or reduce is not None:
        reduction = _reduction.legacy_get_string(size_average, reduce)
    if reduction not in REDUCTIONS:
        raise ValueError(f"{reduction} is not a valid value for reduction")
    if margin <= 0:
        raise ValueError(f"margin must be greater than 0, got {margin}")
    if p != 2:
        raise ValueError(f"p: losslab's triplet_margin_loss computes the Euclidean distance (p = 2) only, got {p}; "
                         "torch.nn.functional.triplet_margin_loss computes the others")
    _require_inputs(anchor, positive, negative)
    unbatched = anchor.dim() == 1
    inputs = [x.reshape(1, -1) if unbatched else x for x in (anchor, positive, negative)]
    inputs = [x if x.is_contiguous() else x.contiguous() for x in inputs]
    code = REDUCTIONS[reduction]
    needs = [torch.is_grad_enabled() and x.requires_grad for x in inputs]
    options = (float(margin), float(eps), bool(swap), code)
    fused = any(needs) and code != REDUCTIONS["none"]
    if torch.compiler.is_compiling():
        loss = forward_grad(*inputs, *options, *needs)[0] if fused else forward(*inputs, *options)
    elif any(needs):
        loss = _EagerTriplet.apply(fused, *inputs, *options)
    else:
        loss = _forward_kernel(*inputs, *options)
    return loss.reshape(()) if unbatched and code == REDUCTIONS["none"] else loss


class TripletMarginLoss(_Loss):
    """``torch.nn.TripletMarginLoss``: ``forward(anchor, positive, negative)`` is :func:`triplet_margin_loss`."""

    __constants__ = ["margin", "p", "eps", "swap", "reduction"]

    def __init__(self, margin: float = MARGIN, p: float = 2.0, eps: float = EPS, swap: bool = False,
                 size_average=None, reduce=None, reduction: str = "mean") -> None:
        super().__init__(size_average, reduce, reduction)
        if margin <= 0:
            raise ValueError(f"TripletMarginLoss: expected margin to be greater than 0, got {margin} instead")
        self.margin, self.p, self.eps, self.swap = margin, p, eps, swap

    def forward(self, anchor: torch.Tensor, positive: torch.Tensor, negative: torch.Tensor) -> torch.Tensor:
        return triplet_margin_loss(anchor, positive, negative, margin=self.margin, p=self.p, eps=self.eps,
                                   swap=self.swap, reduction=self.reduction)
