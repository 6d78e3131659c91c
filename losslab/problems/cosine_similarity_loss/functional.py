"""The public operators of this loss, re-exported by :mod:`losslab.nn.functional`:
``cosine_similarity`` (F.cosine_similarity on (B, D) rows) and ``cosine_similarity_loss`` (the
problem's mean of 1 - cos in one fused pass), as ``torch.library`` operators in the ``losslab``
namespace with fake kernels and autograd (``torch.compile(fullgraph=True)``, CUDA graphs, no
host synchronisation), on ``kernels/cosine_similarity_loss/`` (vectorized.cu, fused.cu)."""
from __future__ import annotations

import functools

import torch

from losslab import build
from losslab.ops import NAMESPACE, define_operator
from losslab.problems.cosine_similarity_loss.host import EPS
from losslab.problems.cosine_similarity_loss.problem import PROBLEM
from losslab.problems.launch import DTYPE_CODES, launch_values, scratch

FLOATS = (torch.float32, torch.bfloat16, torch.float16)
_LIBRARY = torch.library.Library(NAMESPACE, "FRAGMENT")
_define = functools.partial(define_operator, library=_LIBRARY)


@functools.cache
def _ext():
    return build.load_extension(PROBLEM.name)


def _nothing(like: torch.Tensor) -> torch.Tensor:
    """What an operator returns for a gradient no one asked for (its schema returns a Tensor)."""
    return like.new_empty(0)


# --- F.cosine_similarity ------------------------------------------------------------------------
# losslab::cosine_similarity_forward(x1, x2, eps) -> (cos (B,) of x1's dtype, dots (3B,) float32)
# losslab::cosine_similarity_backward(x1, x2, dots, grad_cos, eps, x1_grad, x2_grad) -> (grad_x1, grad_x2)
#     each (B, D), or empty where not asked for.

def _similarity_kernel(x1, x2, eps):
    rows, cols = x1.shape
    cos = x1.new_empty(rows)
    dots = torch.empty(3 * rows, device=x1.device, dtype=torch.float32)
    launch_values(_ext().rows_forward, x1.device, x1.data_ptr(), x2.data_ptr(), dots.data_ptr(), cos.data_ptr(),
                  rows, cols, eps, DTYPE_CODES[x1.dtype])
    return cos, dots


def _similarity_fake(x1, x2, eps):
    return x1.new_empty(x1.shape[0]), x1.new_empty(3 * x1.shape[0], dtype=torch.float32)


def _similarity_backward_kernel(x1, x2, dots, grad_cos, eps, x1_grad, x2_grad):
    rows, cols = x1.shape
    g1 = torch.empty_like(x1) if x1_grad else _nothing(x1)
    g2 = torch.empty_like(x2) if x2_grad else _nothing(x2)
    grad_cos = grad_cos.to(dtype=torch.float32).contiguous()
    launch_values(_ext().rows_backward, x1.device, x1.data_ptr(), x2.data_ptr(), dots.data_ptr(),
                  grad_cos.data_ptr(), g1.data_ptr() if x1_grad else 0, g2.data_ptr() if x2_grad else 0, rows, cols,
                  eps, DTYPE_CODES[x1.dtype])
    return g1, g2


def _similarity_backward_fake(x1, x2, dots, grad_cos, eps, x1_grad, x2_grad):
    return (torch.empty_like(x1) if x1_grad else _nothing(x1)), (torch.empty_like(x2) if x2_grad else _nothing(x2))


similarity_forward = _define("cosine_similarity_forward", "(Tensor x1, Tensor x2, float eps) -> (Tensor, Tensor)",
                             _similarity_kernel, _similarity_fake)
similarity_backward = _define("cosine_similarity_backward",
                              "(Tensor x1, Tensor x2, Tensor dots, Tensor grad_cos, float eps, bool x1_grad, "
                              "bool x2_grad) -> (Tensor, Tensor)", _similarity_backward_kernel,
                              _similarity_backward_fake)


def _similarity_setup(ctx, inputs, output):
    x1, x2, eps = inputs
    ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(x1, x2, output[1])
    ctx.eps = eps


def _similarity_backward(ctx, grad_cos, _unused):
    x1, x2, dots = ctx.saved_tensors
    want1, want2 = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    if not (want1 or want2):
        return None, None, None
    g1, g2 = similarity_backward(x1, x2, dots, grad_cos, ctx.eps, want1, want2)
    return (g1 if want1 else None), (g2 if want2 else None), None


torch.library.register_autograd(similarity_forward, _similarity_backward, setup_context=_similarity_setup,
                                lib=_LIBRARY)


# --- the loss: mean over rows of 1 - cos -----------------------------------------------------------
# losslab::cosine_similarity_loss_forward(p, t, eps) -> loss       vectorized's forward (inference)
# losslab::cosine_similarity_loss_forward_grad(p, t, eps, p_grad, t_grad) -> (loss, grad_p, grad_t)
#     fused: the loss and the gradients for grad_loss = 1 (empty where not asked for); its backward
#     scales them.

def _loss_kernel(p, t, eps):
    rows, cols = p.shape
    loss = p.new_empty(())
    partials, _keep = scratch(p.device, 16 + 16 * rows)  # the partials, the launcher's 16 bytes, the dots
    launch_values(_ext().vectorized_forward, p.device, p.data_ptr(), t.data_ptr(), partials + 16 + 4 * rows,
                  partials, loss.data_ptr(), 0, 0, rows, cols, eps, DTYPE_CODES[p.dtype])
    return loss


def _loss_fake(p, t, eps):
    return p.new_empty(())


def _loss_grad_kernel(p, t, eps, p_grad, t_grad):
    rows, cols = p.shape
    loss = p.new_empty(())
    gp = torch.empty_like(p) if p_grad else _nothing(p)
    gt = torch.empty_like(t) if t_grad else _nothing(t)
    # the loss is symmetric in p and t: where only t needs a gradient, fused writes it in p's place
    first, second, g_first, g_second = (p, t, gp, gt if t_grad else None) if p_grad else (t, p, gt, None)
    partials, _keep = scratch(p.device, 16 + 4 * rows)
    launch_values(_ext().fused_forward, p.device, first.data_ptr(), second.data_ptr(), 0, partials, loss.data_ptr(),
                  g_first.data_ptr(), 0 if g_second is None else g_second.data_ptr(), rows, cols, eps,
                  DTYPE_CODES[p.dtype])
    return loss, gp, gt


def _loss_grad_fake(p, t, eps, p_grad, t_grad):
    return p.new_empty(()), *_similarity_backward_fake(p, t, None, None, eps, p_grad, t_grad)


loss_forward = _define("cosine_similarity_loss_forward", "(Tensor predictions, Tensor targets, float eps) -> Tensor",
                       _loss_kernel, _loss_fake)
loss_forward_grad = _define("cosine_similarity_loss_forward_grad",
                            "(Tensor predictions, Tensor targets, float eps, bool p_grad, bool t_grad) "
                            "-> (Tensor, Tensor, Tensor)", _loss_grad_kernel, _loss_grad_fake)


def _loss_setup(ctx, inputs, output):
    ctx.set_materialize_grads(False)  # else autograd fills a zero gradient for the full-size gradient outputs
    ctx.mark_non_differentiable(output[1], output[2])
    ctx.save_for_backward(output[1], output[2])
    ctx.scaled = False


def _eager(tensor: torch.Tensor) -> bool:
    """A plain CUDA tensor (not a fake or functional one being traced): safe to scale in place."""
    return type(tensor) is torch.Tensor and tensor.device.type == "cuda" and not torch.compiler.is_compiling()


def _loss_backward(ctx, grad_loss, _unused_p, _unused_t):
    """The forward's gradients times grad_loss: in place in eager mode (fused's backward, no work when
    grad_loss is 1; once per forward), out of place when traced (AOTAutograd cannot partition a
    backward that mutates a forward output)."""
    grads = ctx.saved_tensors
    wanted = [g if want and g.numel() else None for g, want in zip(grads, ctx.needs_input_grad[:2], strict=True)]
    if grad_loss is None or all(g is None for g in wanted):
        return None, None, None, None, None
    if all(_eager(g) for g in [*grads, grad_loss]):
        if ctx.scaled:
            raise RuntimeError("losslab cosine_similarity_loss: backward can run once per forward (the fused kernel "
                               "wrote the gradient, which it scales in place); run the forward again")
        ctx.scaled = True
        written = [g for g in grads if g.numel()]
        scale = grad_loss.to(device=written[0].device, dtype=written[0].dtype)
        rows, cols = written[0].shape
        launch_values(_ext().fused_backward, written[0].device, 0, 0, 0, scale.data_ptr(), written[0].data_ptr(),
                      written[1].data_ptr() if len(written) > 1 else 0, rows, cols, 0.0, DTYPE_CODES[scale.dtype])
    else:
        wanted = [None if g is None else (g.float() * grad_loss.float()).to(g.dtype) for g in wanted]
    return wanted[0], wanted[1], None, None, None


torch.library.register_autograd(loss_forward_grad, _loss_backward, setup_context=_loss_setup, lib=_LIBRARY)


class _EagerLoss(torch.autograd.Function):
    """The loss operators' kernels in eager mode without the dispatcher (its Python round trips cost
    host time, the whole cost of a small loss): fused writes the gradients asked for in the forward,
    the backward scales them (:func:`_loss_backward`)."""

    @staticmethod
    def forward(ctx, p, t, eps, p_grad, t_grad):
        loss, gp, gt = _loss_grad_kernel(p, t, eps, p_grad, t_grad)
        ctx.save_for_backward(gp, gt)
        ctx.scaled = False
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        return _loss_backward(ctx, grad_loss, None, None)


# --- the public functions --------------------------------------------------------------------------

def _check(name1: str, x1, name2: str, x2) -> None:
    for name, x in ((name1, x1), (name2, x2)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name}: expected a Tensor, got {type(x).__name__}")
        if x.dtype not in FLOATS:
            raise TypeError(f"{name}: losslab has kernels for torch.float32, torch.bfloat16 and torch.float16, "
                            f"got {x.dtype}")
        if x.dim() != 2:
            raise ValueError(f"{name}: losslab takes (B, D) rows only, got {x.dim()}-D shape {tuple(x.shape)}")
        if x.numel() == 0:
            raise ValueError(f"{name}: expected a non-empty tensor, got shape {tuple(x.shape)}")
    if x2.shape != x1.shape:
        raise ValueError(f"{name2}: expected the shape of {name1} {tuple(x1.shape)} (no broadcasting), "
                         f"got {tuple(x2.shape)}")
    if x2.dtype != x1.dtype:
        raise TypeError(f"{name2}: expected the dtype of {name1} ({x1.dtype}), got {x2.dtype}")


def _check_cuda(name1: str, x1: torch.Tensor, name2: str, x2: torch.Tensor) -> None:
    if not x1.is_cuda or not x2.is_cuda:
        raise ValueError(f"{name1}, {name2}: losslab's kernels need CUDA tensors, got {x1.device} and {x2.device}")
    if x1.device != x2.device:
        raise ValueError(f"{name2}: expected the device of {name1} ({x1.device}), got {x2.device}")


def cosine_similarity(x1: torch.Tensor, x2: torch.Tensor, dim: int = 1, eps: float = EPS) -> torch.Tensor:
    """``F.cosine_similarity`` of (B, D) rows: cos_i = x1_i . x2_i / (max(|x1_i|, eps) max(|x2_i|, eps)),
    each norm clamped apart as PyTorch does (and its gradient: the norm's derivative kept where it is
    below eps, 0 where it is 0).

    Args:
        x1, x2: (B, D), one dtype of float32/bfloat16/float16, one CUDA device (no broadcasting).
        dim: 1 or -1 (the rows' dimension); eps: the clamp of each norm.
    Returns (B,) in x1's dtype (math in float32). Autograd: the gradient of whichever inputs require it.
    Raises:
        TypeError: not tensors, another dtype, or dtypes differing.
        ValueError: not 2-D, empty, shapes differing, dim not 1 or -1, or not one CUDA device.
    """
    _check("x1", x1, "x2", x2)
    if dim not in (1, -1):
        raise ValueError(f"dim: losslab takes dim 1 or -1 of (B, D) rows, got {dim!r}")
    _check_cuda("x1", x1, "x2", x2)
    return similarity_forward(x1.contiguous(), x2.contiguous(), float(eps))[0]


def cosine_similarity_loss(predictions: torch.Tensor, targets: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """``torch.mean(1 - F.cosine_similarity(predictions, targets, dim=1, eps=eps))`` (KernelBench level 1,
    problem 97) in one pass: a losslab function (PyTorch has none). Where a gradient will be needed
    the forward writes it (``fused``), for whichever inputs require one, and the backward only scales
    it; otherwise vectorized's one-kernel forward runs.

    Args:
        predictions, targets: (B, D), one dtype of float32/bfloat16/float16, one CUDA device.
        eps: the clamp of each row's norm (F.cosine_similarity's).
    Returns the 0-d loss in the inputs' dtype (math in float32).
    Raises:
        TypeError, ValueError: as :func:`cosine_similarity`. RuntimeError: a second backward through
        one eager forward (the gradient is scaled in place).
    """
    _check("predictions", predictions, "targets", targets)
    _check_cuda("predictions", predictions, "targets", targets)
    p, t = predictions.contiguous(), targets.contiguous()
    grad = torch.is_grad_enabled()
    p_grad, t_grad = grad and predictions.requires_grad, grad and targets.requires_grad
    if torch.compiler.is_compiling():
        return loss_forward_grad(p, t, float(eps), p_grad, t_grad)[0] if p_grad or t_grad else loss_forward(
            p, t, float(eps))
    if p_grad or t_grad:
        return _EagerLoss.apply(p, t, float(eps), p_grad, t_grad)
    return _loss_kernel(p, t, float(eps))
