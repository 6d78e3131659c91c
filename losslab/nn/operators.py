"""The operators behind :mod:`losslab.nn.functional`: PyTorch's options on the vectorized
and fused kernels, as ``torch.library`` operators in the ``losslab`` namespace with fake
implementations and autograd (the pattern of :mod:`losslab.ops`), so that
``torch.compile(fullgraph=True)`` traces through them and CUDA graphs capture them (no
operator waits for the host, none mutates its inputs).

Per loss a ``_forward`` (vectorized), a ``_forward_grad`` (fused: the loss and the gradient) and a
``_backward`` operator, each described beside its definition; in eager mode the same kernels run
without the dispatcher. The canonical cross-entropy has no operator here: :func:`cross_entropy_canonical`.
"""
from __future__ import annotations

import functools

import torch

from losslab import build
from losslab import ops as rung_ops
from losslab.problems import Problem
from losslab.problems import cross_entropy as ce_host
from losslab.problems import kl_div as kl_host
from losslab.problems.launch import launch

NAMESPACE = rung_ops.NAMESPACE
_LIBRARY = torch.library.Library(NAMESPACE, "FRAGMENT")
_define = functools.partial(rung_ops.define_operator, library=_LIBRARY)
_EXTENSIONS: dict[str, object] = {}
CROSS_ENTROPY, KL_DIV = ce_host.PROBLEM, kl_host.PROBLEM
# The fused backward launcher's inputs before grad_loss (kernels/<problem>/launchers.h), unread when it scales.
UNREAD_BEFORE_GRAD_LOSS = {KL_DIV.name: 2, CROSS_ENTROPY.name: 5}


def _ext(problem: Problem):
    """The problem's built extension (built at the first call)."""
    if problem.name not in _EXTENSIONS:
        _EXTENSIONS[problem.name] = build.load_extension(problem.name)
    return _EXTENSIONS[problem.name]


def _eager(tensor: torch.Tensor) -> bool:
    """A plain CUDA tensor (not a fake, functional or meta one being traced): safe to scale in place."""
    return type(tensor) is torch.Tensor and tensor.device.type == "cuda" and not torch.compiler.is_compiling()


def _scale_grad(ctx, problem: Problem, grad: torch.Tensor, grad_loss: torch.Tensor,
                scale_in_place=None) -> torch.Tensor:
    """The forward's gradient times grad_loss: the backward of a ``_forward_grad`` operator.

    Out of place when traced (AOTAutograd cannot partition a backward that mutates a forward
    output), in place in eager mode (the fused rung's scale kernel, which moves no byte when
    grad_loss is 1), once per forward. The fused backward launcher scales in place
    (``scale_in_place(grad, grad_loss)`` instead, where given: the canonical rung's); it reads
    none of the inputs before grad_loss (null pointers)."""
    if _eager(grad) and _eager(grad_loss):
        if ctx.scaled:
            raise RuntimeError(f"losslab {problem.name}: backward can run once per forward when the fused kernel "
                               "wrote the gradient (it scales it in place); run the forward again")
        ctx.scaled = True
        if scale_in_place is not None:
            scale_in_place(grad, grad_loss)  # converts grad_loss to the gradient's dtype where it differs
            return grad
        scale = grad_loss.to(device=grad.device, dtype=grad.dtype)  # the scale kernel reads it in that dtype
        nulls = (None,) * UNREAD_BEFORE_GRAD_LOSS[problem.name]
        launch(_ext(problem).fused_backward, grad.device, *nulls, scale, grad, grad.numel(), 1, grad.dtype)
        return grad
    return (grad.float() * grad_loss.float()).to(grad.dtype)


# --- cross-entropy ------------------------------------------------------------------------------
# Inputs are 2-D (N, C) contiguous logits, already checked by losslab.nn.functional.
# losslab::nn_cross_entropy_forward(input, target?, probs?, weight?, ignore_index, label_smoothing, reduction)
#     vectorized: the loss ((N,) for none, else 0-d; input's dtype) and the backward's state
#     (row_max, row_log_sum, row_coef (N,) float32, denominators (2,) float32).
# losslab::nn_cross_entropy_forward_grad(<the same>) -> (loss, grad)
#     fused (sum, mean): the loss and dL/dinput for grad_loss = 1.
# losslab::nn_cross_entropy_backward(input, target?, probs?, weight?, <the state>, grad_loss, <the options>)
#     vectorized's backward: dL/dinput (grad_loss 0-d, or (N,) for none).

_CE_ARGS = "Tensor input, Tensor? target, Tensor? probs, Tensor? weight, int ignore_index, float label_smoothing, " \
           "int reduction"


def _ce_loss_fake(input, reduction):
    return input.new_empty((input.shape[0],) if reduction == ce_host.REDUCTIONS["none"] else ())


def _ce_forward_kernel(input, target, probs, weight, ignore_index, label_smoothing, reduction):
    loss, state, _ = ce_host.options_forward(_ext(CROSS_ENTROPY), "vectorized", input, target, probs, weight,
                                             ignore_index, label_smoothing, reduction, False)
    return (loss, *state)


def _ce_forward_fake(input, target, probs, weight, ignore_index, label_smoothing, reduction):
    return (_ce_loss_fake(input, reduction), *ce_host.options_empty_state(input))


def _ce_forward_grad_kernel(input, target, probs, weight, ignore_index, label_smoothing, reduction):
    loss, _, grad = ce_host.options_forward(_ext(CROSS_ENTROPY), "fused", input, target, probs, weight,
                                            ignore_index, label_smoothing, reduction, True, keep_state=False)
    return loss, grad


def _ce_infer(input, target, probs, weight, ignore_index, label_smoothing, reduction):
    """The loss alone (no autograd, no state kept)."""
    return ce_host.options_forward(_ext(CROSS_ENTROPY), "vectorized", input, target, probs, weight, ignore_index,
                                   label_smoothing, reduction, False, keep_state=False)[0]


def _ce_forward_grad_fake(input, target, probs, weight, ignore_index, label_smoothing, reduction):
    return _ce_loss_fake(input, reduction), torch.empty_like(input, memory_format=torch.contiguous_format)


def _ce_backward_kernel(input, target, probs, weight, row_max, row_log_sum, row_coef, denominators, grad_loss,
                        ignore_index, label_smoothing, reduction):
    return ce_host.options_backward(_ext(CROSS_ENTROPY), input, target, probs, weight,
                                    (row_max, row_log_sum, row_coef, denominators), grad_loss, ignore_index,
                                    label_smoothing, reduction)


def _ce_backward_fake(input, *args):
    return torch.empty_like(input, memory_format=torch.contiguous_format)


ce_forward = _define("nn_cross_entropy_forward", f"({_CE_ARGS}) -> (Tensor, Tensor, Tensor, Tensor, Tensor)",
                     _ce_forward_kernel, _ce_forward_fake)
ce_forward_grad = _define("nn_cross_entropy_forward_grad", f"({_CE_ARGS}) -> (Tensor, Tensor)",
                          _ce_forward_grad_kernel, _ce_forward_grad_fake)
ce_backward = _define("nn_cross_entropy_backward",
                      "(Tensor input, Tensor? target, Tensor? probs, Tensor? weight, Tensor row_max, "
                      "Tensor row_log_sum, Tensor row_coef, Tensor denominators, Tensor grad_loss, int ignore_index, "
                      "float label_smoothing, int reduction) -> Tensor", _ce_backward_kernel, _ce_backward_fake)


def _ce_setup(ctx, inputs, output):
    input, target, probs, weight, ignore_index, label_smoothing, reduction = inputs
    ctx.save_for_backward(input, target, probs, weight, *output[1:])
    ctx.options = (ignore_index, label_smoothing, reduction)


def _ce_backward(ctx, grad_loss, *unused_state_grads):
    input, target, probs, weight, *state = ctx.saved_tensors
    grad = ce_backward(input, target, probs, weight, *state, grad_loss, *ctx.options) \
        if ctx.needs_input_grad[0] else None
    return grad, None, None, None, None, None, None


def _ce_setup_grad(ctx, inputs, output):
    ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(output[1])
    ctx.scaled = False


def _ce_backward_scale(ctx, grad_loss, _unused):
    (grad,) = ctx.saved_tensors
    return _scale_grad(ctx, CROSS_ENTROPY, grad, grad_loss), None, None, None, None, None, None


torch.library.register_autograd(ce_forward, _ce_backward, setup_context=_ce_setup, lib=_LIBRARY)
torch.library.register_autograd(ce_forward_grad, _ce_backward_scale, setup_context=_ce_setup_grad, lib=_LIBRARY)


# --- KL divergence ------------------------------------------------------------------------------
# Inputs are any-shape contiguous tensors, already checked by losslab.nn.functional.
# losslab::nn_kl_div_forward(input, target, int reduction, bool log_target, bool log_input) -> loss (vectorized)
# losslab::nn_kl_div_forward_grad(<the same>) -> (loss, grad)                                       (fused)
# losslab::nn_kl_div_backward(input?, target, grad_loss, <the options>) -> grad                     (vectorized)
# The backward reads the input only without log_input (dL/dinput divides by it): it is saved only then.

def _kl_loss_fake(input, reduction):
    if reduction == kl_host.REDUCTIONS["none"]:
        return torch.empty_like(input, memory_format=torch.contiguous_format)
    return input.new_empty(())


def _kl_forward_kernel(input, target, reduction, log_target, log_input):
    return kl_host.options_forward(_ext(KL_DIV), "vectorized", input, target, reduction, log_target, log_input,
                                   False)[0]


def _kl_forward_fake(input, target, reduction, log_target, log_input):
    return _kl_loss_fake(input, reduction)


def _kl_forward_grad_kernel(input, target, reduction, log_target, log_input):
    return kl_host.options_forward(_ext(KL_DIV), "fused", input, target, reduction, log_target, log_input, True)


def _kl_forward_grad_fake(input, target, reduction, log_target, log_input):
    return _kl_loss_fake(input, reduction), torch.empty_like(input, memory_format=torch.contiguous_format)


def _kl_backward_kernel(input, target, grad_loss, reduction, log_target, log_input):
    return kl_host.options_backward(_ext(KL_DIV), input, target, grad_loss, reduction, log_target, log_input)


def _kl_backward_fake(input, target, grad_loss, reduction, log_target, log_input):
    return torch.empty_like(target, memory_format=torch.contiguous_format)


_KL_OPTIONS = "int reduction, bool log_target, bool log_input"
kl_forward = _define("nn_kl_div_forward", f"(Tensor input, Tensor target, {_KL_OPTIONS}) -> Tensor",
                     _kl_forward_kernel, _kl_forward_fake)
kl_forward_grad = _define("nn_kl_div_forward_grad", f"(Tensor input, Tensor target, {_KL_OPTIONS}) -> (Tensor, Tensor)",
                          _kl_forward_grad_kernel, _kl_forward_grad_fake)
kl_backward = _define("nn_kl_div_backward",
                      f"(Tensor? input, Tensor target, Tensor grad_loss, {_KL_OPTIONS}) -> Tensor",
                      _kl_backward_kernel, _kl_backward_fake)


def _kl_setup(ctx, inputs, output):
    input, target, reduction, log_target, log_input = inputs
    ctx.save_for_backward(None if log_input else input, target)
    ctx.options = (reduction, log_target, log_input)


def _kl_backward(ctx, grad_loss):
    input, target = ctx.saved_tensors
    grad = kl_backward(input, target, grad_loss, *ctx.options) if ctx.needs_input_grad[0] else None
    return grad, None, None, None, None


def _kl_setup_grad(ctx, inputs, output):
    ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(output[1])
    ctx.scaled = False


def _kl_backward_scale(ctx, grad_loss, _unused):
    (grad,) = ctx.saved_tensors
    return _scale_grad(ctx, KL_DIV, grad, grad_loss), None, None, None, None


torch.library.register_autograd(kl_forward, _kl_backward, setup_context=_kl_setup, lib=_LIBRARY)
torch.library.register_autograd(kl_forward_grad, _kl_backward_scale, setup_context=_kl_setup_grad, lib=_LIBRARY)


# --- eager mode: the same kernels, without the dispatcher -----------------------------------------
# Through torch.ops, each call goes from the dispatcher back into Python (the kernel, then
# register_autograd's wrapper): about 10 us of host time a forward on an H100 machine
# (scripts/host_overhead.py), where a whole small forward takes about 15. Not traced,
# losslab.nn.functional calls the kernels through these instead, as losslab.ops does.

class _EagerLoss(torch.autograd.Function):
    """The backward both eager losses share. Their forward takes ``(fused, input, *rest)`` and
    sets ``ctx.problem`` and ``ctx.fused``; unfused, also ``ctx.backward_kernel`` and
    ``ctx.options``, so that the gradient is ``backward_kernel(*saved, grad_loss, *options)``.
    Fused, it saves the gradient it wrote, which the backward scales."""

    @staticmethod
    def backward(ctx, grad_loss):
        if ctx.fused:
            (grad,) = ctx.saved_tensors
            grad = _scale_grad(ctx, ctx.problem, grad, grad_loss)
        else:
            grad = ctx.backward_kernel(*ctx.saved_tensors, grad_loss, *ctx.options)
        return (None, grad) + (None,) * ctx.num_rest


class EagerCrossEntropy(_EagerLoss):
    """The cross-entropy operators' kernels with autograd by hand: ``fused`` writes the
    gradient in the forward (the backward scales it), else vectorized's forward and backward."""

    @staticmethod
    def forward(ctx, fused, input, target, probs, weight, ignore_index, label_smoothing, reduction):
        ctx.problem, ctx.fused, ctx.scaled, ctx.num_rest = CROSS_ENTROPY, fused, False, 6
        if fused:
            loss, grad = _ce_forward_grad_kernel(input, target, probs, weight, ignore_index, label_smoothing,
                                                 reduction)
            ctx.save_for_backward(grad)
            return loss
        loss, *state = _ce_forward_kernel(input, target, probs, weight, ignore_index, label_smoothing, reduction)
        ctx.save_for_backward(input, target, probs, weight, *state)
        ctx.backward_kernel, ctx.options = _ce_backward_kernel, (ignore_index, label_smoothing, reduction)
        return loss


class EagerKLDiv(_EagerLoss):
    """The KL operators' kernels with autograd by hand (as :class:`EagerCrossEntropy`)."""

    @staticmethod
    def forward(ctx, fused, input, target, reduction, log_target, log_input):
        ctx.problem, ctx.fused, ctx.scaled, ctx.num_rest = KL_DIV, fused, False, 4
        if fused:
            loss, grad = _kl_forward_grad_kernel(input, target, reduction, log_target, log_input)
            ctx.save_for_backward(grad)
            return loss
        ctx.save_for_backward(None if log_input else input, target)
        ctx.backward_kernel, ctx.options = _kl_backward_kernel, (reduction, log_target, log_input)
        return _kl_forward_kernel(input, target, reduction, log_target, log_input)


def cross_entropy(fused: bool, needs_grad: bool, *args) -> torch.Tensor:
    """The loss of ``ce_forward``'s arguments ``args``: through the operators when traced
    (``fused``: ``ce_forward_grad``), through their kernels in eager mode (autograd by
    :class:`EagerCrossEntropy` when ``needs_grad``)."""
    if torch.compiler.is_compiling():
        return (ce_forward_grad if fused else ce_forward)(*args)[0]
    if needs_grad:
        return EagerCrossEntropy.apply(fused, *args)
    return _ce_infer(*args)


# --- the canonical case: the cluster rung ---------------------------------------------------------
# Class indices, mean, no weight, ignore_index -100, no smoothing: the loss of the ladder's
# problem, which the cluster rung computes with the fastest kernels losslab has (a thread-block
# cluster per row where a row is too long for one SM on sm_90, fused's kernels elsewhere, see
# losslab.problems.cross_entropy.cluster_plan; vectorized's forward when no gradient is needed).

CANONICAL = rung_ops.OPS[(CROSS_ENTROPY.name, "cluster")]


class EagerCanonicalCrossEntropy(torch.autograd.Function):
    """The cluster rung's forward that writes the gradient, with autograd by hand (as
    ``losslab.ops.EagerLoss``, whose eager path this is, less its arguments): the backward
    scales that gradient in place, once per forward, and raises the options path's error
    (:func:`_scale_grad`) for a second backward."""

    @staticmethod
    def forward(ctx, input, target):
        ctx.scaled = False
        loss, grad = CANONICAL.forward_grad_kernel(input, target)
        ctx.save_for_backward(grad)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        (grad,) = ctx.saved_tensors
        return _scale_grad(ctx, CROSS_ENTROPY, grad, grad_loss, CANONICAL.scale_kernel), None


def cross_entropy_canonical(fused: bool, needs_grad: bool, input: torch.Tensor, target: torch.Tensor
                            ) -> torch.Tensor:
    """The mean cross-entropy of (N, C) logits ``input`` and (N,) int64 ``target`` (checked by
    :mod:`losslab.nn.functional`; any strides) on the cluster rung's kernels: its forward that
    writes the gradient when ``fused`` (a gradient will be needed and ``PREFER_FUSED``), else
    vectorized's forward and, when ``needs_grad``, its backward kernel. Traced, through the
    rung's ``torch.library`` operators (``losslab::cross_entropy_cluster_forward`` /
    ``_forward_grad`` / ``_backward``). The 0-d loss is in ``input``'s dtype. The same autograd
    rules as the operators here: its backward scales in place, once per forward, in eager mode."""
    if torch.compiler.is_compiling():
        return (CANONICAL.forward_grad if fused else CANONICAL.forward)(input, target)[0]
    if fused:
        return EagerCanonicalCrossEntropy.apply(input, target)
    if needs_grad:
        return rung_ops.EagerLoss.apply(CANONICAL, False, input, target)
    return CANONICAL.infer(input, target)


# --- the canonical case of kl_div: the fused rung -----------------------------------------------
# Probabilities (log_input=False), batchmean over (N, D) rows, no log_target: the ladder's problem,
# on the fused rung's kernels (vectorized's forward when no gradient is needed).

KL_CANONICAL = rung_ops.OPS[(KL_DIV.name, "fused")]


def kl_div_canonical(fused: bool, needs_grad: bool, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The batchmean KL divergence of (N, D) probabilities ``input`` from ``target`` (checked by
    :mod:`losslab.nn.functional`, contiguous), as ``F.kl_div(torch.log(input), target,
    reduction="batchmean")``, on the fused rung's kernels: its forward that writes the gradient
    when ``fused``, else vectorized's forward and, when ``needs_grad``, its backward kernel.
    Traced, through the rung's ``torch.library`` operators (``losslab::kl_div_fused_forward`` /
    ``_forward_grad`` / ``_backward``). The 0-d loss is in ``input``'s dtype."""
    if torch.compiler.is_compiling():
        return KL_CANONICAL.forward_grad(input, target)[0] if fused else KL_CANONICAL.forward(input, target)
    if needs_grad:
        return rung_ops.EagerLoss.apply(KL_CANONICAL, fused, input, target)
    return KL_CANONICAL.infer(input, target)


def kl_div(fused: bool, needs_grad: bool, *args) -> torch.Tensor:
    """The loss of ``kl_forward``'s arguments, as :func:`cross_entropy`."""
    if torch.compiler.is_compiling():
        return kl_forward_grad(*args)[0] if fused else kl_forward(*args)
    if needs_grad:
        return EagerKLDiv.apply(fused, *args)
    return _kl_forward_kernel(*args)
