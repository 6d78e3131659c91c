"""Drop-in ``torch.nn.functional.kl_div`` and ``cross_entropy`` on losslab's fastest rungs.

Same signatures, semantics and kinds of error as PyTorch's (checked against it in ``tests/test_nn.py``),
through the ``torch.library`` operators of :mod:`losslab.nn.operators` when traced (compile- and
graph-capturable; no host synchronisation), through the same kernels without the dispatcher in eager
mode (where host time is the cost of a small loss). Which kernels run: :func:`kl_div`, :func:`cross_entropy`.
Differences from PyTorch, each raised as an error rather than computed differently: only CUDA tensors
of float32, bfloat16 or float16 (TypeError/ValueError naming the argument); no gradient w.r.t.
``target`` (NotImplementedError); no empty tensors (ValueError). The math runs in float32 whatever the
storage dtype; the loss comes back in the input's dtype.
"""
from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
from torch.nn import _reduction

from losslab.linear_cross_entropy import linear_cross_entropy  # noqa: F401  (PyTorch 2.13's, chunked)
from losslab.nn import operators
from losslab.problems import cosine_similarity_loss as cs_host
from losslab.problems import cross_entropy as ce_host
from losslab.problems import hinge_loss as hinge_host
from losslab.problems import kl_div as kl_host
from losslab.problems.cosine_similarity_loss.functional import cosine_similarity, cosine_similarity_loss  # noqa: F401
from losslab.problems.hinge_loss.functional import hinge_loss  # noqa: F401  (losslab's own: PyTorch has none)
from losslab.problems.mse_loss.functional import PROBLEM as MSE_PROBLEM  # F.mse_loss (reduction)
from losslab.problems.mse_loss.functional import mse_loss
from losslab.problems.smooth_l1_loss.functional import PROBLEM as SMOOTH_L1_PROBLEM  # F.smooth_l1_loss, huber_loss
from losslab.problems.smooth_l1_loss.functional import huber_loss, smooth_l1_loss  # noqa: F401
from losslab.problems.triplet_margin_loss.functional import PROBLEM as TRIPLET
from losslab.problems.triplet_margin_loss.functional import triplet_margin_loss  # noqa: F401  (its package's)

FLOATS = (torch.float32, torch.bfloat16, torch.float16)
# The rung table: True runs fused (cluster in the canonical case) when a gradient will be
# needed (reduction other than none); False always runs vectorized (its own backward kernel,
# which reads the inputs again, but keeps no (N, C) gradient between forward and backward and
# allows retain_graph).
PREFER_FUSED = True
KL_MEAN_WARNING = ("reduction: 'mean' divides the total loss by both the batch size and the support size."
                   "'batchmean' divides only by the batch size, and aligns with the KL div math definition."
                   "'mean' will be changed to behave the same as 'batchmean' in the next major release.")


def _reduction_name(size_average, reduce, reduction: str) -> str:
    if size_average is not None or reduce is not None:
        return _reduction.legacy_get_string(size_average, reduce)
    if reduction not in ("none", "mean", "sum", "batchmean"):
        raise ValueError(f"{reduction} is not a valid value for reduction")
    return reduction


def _require_input(name: str, value, function: str) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{function}(): argument '{name}' must be Tensor, not {type(value).__name__}")
    if not value.is_floating_point():
        raise RuntimeError(f"{function}: {name} must be a floating-point tensor, got {value.dtype}")
    if value.dtype not in FLOATS:
        raise TypeError(f"{name}: losslab has kernels for torch.float32, torch.bfloat16 and torch.float16, "
                        f"got {value.dtype}")
    if value.numel() == 0:
        raise ValueError(f"{name}: expected a non-empty tensor, got shape {tuple(value.shape)}")
    return value


def _require_cuda(*named: tuple[str, torch.Tensor | None]) -> None:
    """Each (name, tensor) with a tensor on CUDA, all on one device."""
    device = None
    for name, tensor in named:
        if tensor is None:
            continue
        if not tensor.is_cuda:  # is_cuda, not device.type: a fraction of the host time
            raise ValueError(f"{name}: losslab's kernels need a CUDA tensor, got a tensor on {tensor.device}")
        if device is None:
            device = tensor.device
        elif tensor.device != device:
            raise RuntimeError("Expected all tensors to be on the same device, got "
                               + ", ".join(str(t.device) for _, t in named if t is not None))


def _require_no_target_grad(target: torch.Tensor) -> None:
    if torch.is_grad_enabled() and target.requires_grad:
        raise NotImplementedError("target: losslab computes no gradient w.r.t. the target; pass target.detach()")


def kl_div(input: torch.Tensor, target: torch.Tensor, size_average=None, reduce=None, reduction: str = "mean",
           log_target: bool = False, log_input: bool = True) -> torch.Tensor:
    """``F.kl_div``: the KL divergence of ``target`` from the distribution whose
    LOG-probabilities are ``input``; with ``log_input=False`` (losslab's, named as
    ``F.poisson_nll_loss``'s) ``input`` holds the probabilities themselves and the log is
    taken inside the kernel: ``kl_div(p, t, log_input=False)`` is
    ``F.kl_div(torch.log(p), t)`` without the pass that writes ``torch.log(p)`` (and the one
    that reads it back in the backward).

    Args:
        input: log-probabilities (probabilities with ``log_input=False``), any shape,
            float32/bfloat16/float16, CUDA.
        target: probabilities (log-probabilities with ``log_target``), broadcastable to
            ``input``; cast to its dtype.
        reduction: ``"none"`` (the elementwise terms), ``"sum"``, ``"mean"`` (the sum over
            ALL elements divided by their number, with PyTorch's warning) or
            ``"batchmean"`` (divided by ``input.size(0)``, the KL divergence's definition).
    Returns the loss in ``input``'s dtype (``input``'s broadcast shape for none, else 0-d).
    Raises: as F.kl_div (ValueError for an unknown reduction, RuntimeError for shapes that
    do not broadcast or integer tensors), and see the module docstring.

    Which kernels run:

    =====================================  =============================================
    the ladder's problem                   the ``fused`` rung (:mod:`losslab.ops`, its
    (:func:`kl_canonical_case`:            operators ``losslab::kl_div_fused_*`` when
    ``log_input=False``, (N, D) rows of    traced): one pass writes the loss and the
    the target's shape, batchmean, no      gradient when a gradient will be needed (the
    ``log_target``)                        backward only scales it), else vectorized's
                                           forward
    a gradient will be needed, reduction   the options kernels' ``fused``: one pass
    sum, mean or batchmean                 writes the loss and the gradient
    otherwise (inference, reduction none)  the options kernels' ``vectorized``: forward,
                                           and its backward (which reads the input too
                                           without ``log_input``)
    =====================================  =============================================
    """
    reduction = _reduction_name(size_average, reduce, reduction)
    if reduction == "mean":
        warnings.warn(KL_MEAN_WARNING, stacklevel=2)
    if not isinstance(target, torch.Tensor):
        raise TypeError(f"kl_div(): argument 'target' must be Tensor, not {type(target).__name__}")
    if isinstance(input, torch.Tensor) and not (input.is_floating_point() and target.is_floating_point()):
        raise RuntimeError("kl_div: Integral inputs not supported.")
    _require_input("input", input, kl_div.__name__)
    _require_no_target_grad(target)
    # broadcast_shapes costs more host time than a whole small launch: equal shapes skip it
    shape = input.shape if input.shape == target.shape else torch.broadcast_shapes(input.shape, target.shape)
    _require_cuda(("input", input), ("target", target))
    if input.shape != shape:
        input = input.expand(shape)
    if target.dtype != input.dtype:  # .to() costs host time even when it changes nothing
        target = target.to(input.dtype)
    if target.shape != shape:  # an expand is a view: host time, even when it changes nothing
        target = target.expand(shape)
    target, input = target.contiguous(), input.contiguous()
    needs_grad = torch.is_grad_enabled() and input.requires_grad
    fused = PREFER_FUSED and reduction != "none" and needs_grad
    if not log_input and kl_canonical_case(input, target, reduction, log_target):
        return operators.kl_div_canonical(fused, needs_grad, input, target)
    return operators.kl_div(fused, needs_grad, input, target, kl_host.REDUCTIONS[reduction], bool(log_target),
                            bool(log_input))


def kl_canonical_case(input: torch.Tensor, target: torch.Tensor, reduction: str, log_target: bool) -> bool:
    """Whether a checked :func:`kl_div` call with ``log_input=False`` is the ladder's problem,
    which the ``fused`` rung computes: (N, D) probabilities ``input`` and ``target`` of one
    shape, reduction batchmean, no ``log_target``. Reads no tensor's values."""
    return reduction == "batchmean" and not log_target and input.dim() == 2 and target.shape == input.shape


def _ce_shapes(input: torch.Tensor, target: torch.Tensor, probs: bool) -> None:
    """PyTorch's shape errors for cross-entropy (RuntimeError/ValueError, its messages)."""
    if input.dim() == 0:
        raise RuntimeError("cross_entropy: input must have at least one dimension (C) or (N, C, ...), got 0-d")
    if probs:
        if target.shape != input.shape:
            raise RuntimeError(f"Expected input and target to have the same shape for class-probability targets, "
                               f"got input {list(input.shape)} and target {list(target.shape)}")
        return
    if input.dim() == 1:
        if target.dim() != 0:
            raise RuntimeError("0D or 1D target tensor expected, multi-target not supported")
        return
    if input.dim() == 2 and target.dim() != 1:
        raise RuntimeError("0D or 1D target tensor expected, multi-target not supported")
    if input.dim() == 2 and target.shape[0] == input.shape[0]:
        return  # (N, C) and (N,): the common case, without building the expected shape
    if target.shape[:1] != input.shape[:1]:
        raise ValueError(f"Expected input batch_size ({input.shape[0]}) to match target batch_size "
                         f"({target.shape[0] if target.dim() else 1}).")
    expected = [input.shape[0], *input.shape[2:]]
    if list(target.shape) != expected:
        raise RuntimeError(f"Expected target size {expected}, got {list(target.shape)}")


def cross_entropy(input: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None = None, size_average=None,
                  ignore_index: int = -100, reduce=None, reduction: str = "mean",
                  label_smoothing: float = 0.0) -> torch.Tensor:
    """``F.cross_entropy``: the cross-entropy between ``input`` logits and ``target``.

    Args:
        input: logits (C,), (N, C) or (N, C, d1, ...), float32/bfloat16/float16, CUDA.
        target: class indices (int64 or uint8) of shape (), (N,) or (N, d1, ...), any integer
            ``ignore_index`` leaving the loss; or class probabilities of ``input``'s shape
            (floating; cast to its dtype; ``ignore_index`` must then be negative).
        weight: (C,) per-class weights of ``input``'s dtype, or None.
        reduction: ``"none"``, ``"mean"`` (class indices: divided by the sum of the weights
            of the targets not ignored, their count without weights; probabilities: by
            the number of rows N * d1 * ...) or ``"sum"``.
        label_smoothing: in [0, 1] (non-positive: none), PyTorch's formula with ``weight``:
            (1 - eps) * nll + eps / C * sum_c w_c * (-log p_c) per row.
    Returns the loss in ``input``'s dtype: 0-d, or the target's shape (class indices) /
    (N, d1, ...) (probabilities) for none.
    Raises: as F.cross_entropy (ValueError for an unknown reduction or a batch-size
    mismatch, RuntimeError for other shape, dtype and weight errors), and see the module
    docstring.

    ``loss = LF.cross_entropy(logits, labels, label_smoothing=0.1); loss.backward()``, as
    F.cross_entropy (``import losslab.nn.functional as LF``). Which kernels run:

    =====================================  =============================================
    the canonical case                     the ``cluster`` rung (:mod:`losslab.ops`, its
    (:func:`canonical_case`: (N, C)        operators ``losslab::cross_entropy_cluster_*``
    logits, (N,) int64 indices, mean, no   when traced): a gradient will be needed, one
    weight, ignore_index -100, no          pass writes the loss and the gradient, a row
    smoothing)                             split over a thread-block cluster where it is
                                           too long for one SM (sm_90), fused's kernels
                                           elsewhere (``cluster_plan`` says why); else
                                           vectorized's forward
    a gradient will be needed, reduction   ``fused``: one pass writes the loss and the
    sum/mean                               gradient; the backward only scales it
    otherwise (inference, reduction none)  ``vectorized``: forward, and its backward
    =====================================  =============================================

    The canonical case returns what the options path would (the 0-d loss in the input's dtype,
    as PyTorch's; NaN for a target out of range or every row ignored; a second backward through
    the forward that wrote the gradient raises the same RuntimeError), from the faster kernels.
    A class index outside [0, C) that is not ``ignore_index`` makes the loss NaN (PyTorch stops
    with a device-side assert); :func:`losslab.problems.cross_entropy.check_targets` raises for
    it. ``(N, C, d1, ...)`` inputs are moved to ``(N * d1 * ..., C)``: a ``permute().contiguous()``
    that costs one extra read and write of the logits (and of class-probability targets) before
    the kernel.
    """
    reduction = _reduction_name(size_average, reduce, reduction)
    if reduction == "batchmean":
        raise ValueError("batchmean is not a valid value for reduction")
    if not isinstance(target, torch.Tensor):
        raise TypeError(f"cross_entropy_loss(): argument 'target' must be Tensor, not {type(target).__name__}")
    if isinstance(input, torch.Tensor) and not input.is_floating_point():
        raise NotImplementedError(f"cross_entropy: logits of dtype {input.dtype} are not supported")
    _require_input("input", input, "cross_entropy_loss")
    if label_smoothing > 1.0:
        raise RuntimeError(f"label_smoothing must be between 0.0 and 1.0. Got: {label_smoothing}")
    probs = target.is_floating_point()
    if not probs and target.dtype not in (torch.int64, torch.uint8):
        raise RuntimeError(f"expected target dtype to be Long or Byte, but got {_short(target.dtype)}")
    if probs and ignore_index >= 0:
        raise RuntimeError("ignore_index is not supported for floating point target")
    _ce_shapes(input, target, probs)
    classes = input.shape[0] if input.dim() == 1 else input.shape[1]
    if weight is not None:
        if weight.dim() != 1 or weight.numel() != classes:
            raise RuntimeError(f"weight tensor should be defined either for all {classes} classes or no classes "
                               f"but got weight tensor of shape: {list(weight.shape)}")
        if weight.dtype != input.dtype:
            raise RuntimeError(f"expected scalar type {_short(input.dtype)} but found {_short(weight.dtype)}")
    if probs:
        _require_no_target_grad(target)
    _require_cuda(("input", input), ("target", target), ("weight", weight))
    ignore_index, label_smoothing = int(ignore_index), max(0.0, float(label_smoothing))
    if canonical_case(input, target, weight, ignore_index, label_smoothing, reduction):
        needs_grad = torch.is_grad_enabled() and input.requires_grad
        return operators.cross_entropy_canonical(PREFER_FUSED and needs_grad, needs_grad, input, target)
    return _cross_entropy_2d(input, target, weight, probs, ignore_index, reduction, label_smoothing)


def canonical_case(input: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None, ignore_index: int,
                   label_smoothing: float, reduction: str) -> bool:
    """Whether a checked :func:`cross_entropy` call is the ladder's problem, which the
    ``cluster`` rung computes: (N, C) logits, (N,) int64 class indices, no weight,
    ignore_index -100, no label smoothing, reduction mean.

    Args are :func:`cross_entropy`'s after its checks (so ``input`` is a floating CUDA tensor
    of a dtype losslab takes, and the shapes agree): ``ignore_index`` an int,
    ``label_smoothing`` clamped at 0 (a negative one is none, as in PyTorch), ``reduction``
    resolved from the legacy ``size_average``/``reduce``. Reads no tensor's values.
    """
    return (reduction == "mean" and weight is None and ignore_index == ce_host.IGNORE_INDEX
            and label_smoothing == 0.0 and target.dtype == torch.int64 and input.dim() == 2 and target.dim() == 1)


def _short(dtype: torch.dtype) -> str:
    return {torch.float32: "Float", torch.float16: "Half", torch.bfloat16: "BFloat16", torch.float64: "Double",
            torch.int32: "Int", torch.int16: "Short", torch.int8: "Char", torch.bool: "Bool"}.get(dtype, str(dtype))


def _cross_entropy_2d(input, target, weight, probs, ignore_index, reduction, label_smoothing):
    """The checked call on (rows, C): the class dim moved last (a copy for (N, C, d1, ...)),
    the operator chosen, the loss reshaped back for none."""
    unbatched = input.dim() == 1
    if unbatched:
        input, target = input.unsqueeze(0), target.unsqueeze(0)
    out_shape = input.shape[:1] + input.shape[2:]
    classes = input.shape[1]
    if input.dim() > 2:  # (N, C, d1, ...) -> (N * d1 * ..., C); (N, C) as it is (a view costs host time)
        input = input.movedim(1, -1).reshape(-1, classes)
        target = target.movedim(1, -1).reshape(-1, classes) if probs else target.reshape(-1)
    logits = input.contiguous()
    wanted = logits.dtype if probs else torch.int64
    if target.dtype != wanted:  # .to() costs host time even when it changes nothing
        target = target.to(wanted)
    target = target.contiguous()
    w = None
    if weight is not None:
        w = (weight.detach() if weight.requires_grad else weight).to(torch.float32).contiguous()
    code = ce_host.REDUCTIONS[reduction]
    args = (logits, None if probs else target, target if probs else None, w, ignore_index, label_smoothing, code)
    needs_grad = torch.is_grad_enabled() and logits.requires_grad
    loss = operators.cross_entropy(PREFER_FUSED and reduction != "none" and needs_grad, needs_grad, *args)
    if reduction != "none":
        return loss
    return loss.reshape(() if unbatched else out_shape)


def on_problem(problem: str) -> Callable[..., torch.Tensor]:
    """This module's function for ``problem`` called as the problem's reference (KernelBench's
    ``Model.forward``) is: with its options (kl_div's ``reduction="batchmean"``), PyTorch's defaults
    otherwise; what a user calls, timed in the records beside the rungs (``losslab.variants``).

    ``cross_entropy(logits, targets)``; ``kl_div(p, t, reduction="batchmean", log_input=False)``:
    the problem's probabilities, their log taken in the kernel (eager's and Liger's rows pay for a
    ``torch.log`` of their own: both take log-probabilities).

    Raises:
        ValueError: no function here for ``problem``.
    """
    calls = {ce_host.PROBLEM.name: lambda x, t: cross_entropy(x, t),
             kl_host.PROBLEM.name: lambda p, t: kl_div(p, t, reduction="batchmean", log_input=False),
             hinge_host.PROBLEM.name: hinge_loss,
             TRIPLET.name: lambda a, p, n: triplet_margin_loss(a, p, n),
             cs_host.PROBLEM.name: lambda p, t: cosine_similarity_loss(p, t),
             MSE_PROBLEM.name: mse_loss,
             SMOOTH_L1_PROBLEM.name: smooth_l1_loss}
    if problem not in calls:
        raise ValueError(f"problem: losslab.nn.functional has no function for {problem!r}")
    return calls[problem]
