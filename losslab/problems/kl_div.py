"""KL divergence with ``reduction="batchmean"`` (KernelBench level 1, problem 98).

    loss = sum_ij [ xlogy(t_ij, t_ij) - t_ij * log(p_ij) ] / B
    dloss/dp_ij = -t_ij / (p_ij * B) * grad_loss

``predictions`` p and ``targets`` t are (B, D) probability rows. batchmean
divides by the batch size B only, not by B * D.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from losslab import build
from losslab.problems.base import HALF_AND_FLOAT, Cost, Problem, misaligned_view
from losslab.problems.launch import DTYPE_CODES, forward_gradient, gradient_buffer, launch, launch_values, scratch
from losslab.validation import require_cuda, require_no_grad, require_tensor

KNOWN_DTYPES = HALF_AND_FLOAT  # what the rungs take between them (check_dtype narrows per rung)


class KLDiv(Problem):
    """KL divergence, batchmean, on (B, D) probability rows; the whole ladder, see :data:`LADDER`."""

    name = "kl_div"
    input_names = ("predictions", "targets")
    sizes = {
        "seed": (16384, 16384),  # KernelBench's size: two 1 GiB inputs
        "small": (128, 4096),
        "odd": (257, 4099),      # neither dimension a multiple of 4 or of a block
        "narrow": (3, 1000),
        "scalar": (1, 1),
    }

    def reference(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.kl_div(torch.log(predictions), targets, reduction="batchmean")

    def make_inputs(self, shape, *, seed, device="cuda", dtype=torch.float32):
        rows, cols = shape
        gen = torch.Generator(device=device).manual_seed(seed)
        scale = torch.rand((), generator=gen, device=device)
        predictions = (torch.rand(rows, cols, generator=gen, device=device) * scale).softmax(-1)
        targets = torch.rand(rows, cols, generator=gen, device=device).softmax(-1)
        return predictions.to(dtype), targets.to(dtype)

    def validate(self, predictions, targets) -> None:
        validate_inputs(predictions, targets)

    def cost(self, shape, direction, dtype=torch.float32) -> Cost:
        # forward: read p and t, write the 0-d loss; per element xlogy (mul),
        # t * log p (mul), subtract and accumulate, and two logs.
        # backward: read p and t, write dL/dp; per element a mul and a divide.
        # forward_backward: the least a single fused pass needs (read p, t once;
        # write dL/dp), which a separate forward and backward cannot reach.
        n = shape[0] * shape[1]
        size = torch.finfo(dtype).bits // 8
        if direction == "forward":
            return Cost(2 * n * size, size, 4 * n, 2 * n)
        if direction == "backward":
            return Cost(2 * n * size + size, n * size, 2 * n, 0)
        if direction == "forward_backward":
            return Cost(2 * n * size + size, n * size + size, 6 * n, 2 * n)
        raise ValueError(f"direction: expected one of forward, backward, forward_backward, got {direction!r}")

    def edge_cases(self, device="cuda"):
        def inputs(rows, cols, seed=0):
            return self.make_inputs((rows, cols), seed=seed, device=device)

        p, t = inputs(8, 300)
        t_zeros = t.clone()
        t_zeros[:, ::7] = 0.0
        p_zeros = p.clone()
        p_zeros[2, 5] = 0.0
        p_nan = p.clone()
        p_nan[3, 17] = float("nan")
        big_p, big_t = inputs(9, 1001)
        misaligned = tuple(misaligned_view(x, 8, 1000) for x in (big_p, big_t))
        strided = tuple(x[:, ::2] for x in (big_p, big_t))
        return {
            "targets with exact zeros (xlogy(0, 0) = 0)": (p, t_zeros),
            "predictions with an exact zero (loss +inf)": (p_zeros, t),
            "NaN in predictions (NaN propagates)": (p_nan, t),
            "B = 1 (one row)": inputs(1, 4096),
            "D = 1 (each row a single probability 1)": inputs(64, 1),
            "D not a multiple of 4": inputs(33, 1023),
            "storage offset breaks 16-byte alignment": misaligned,
            "non-contiguous (every other column)": strided,
        }

    def launch_forward(self, variant, inputs: Sequence[torch.Tensor], out=None, needs_grad=False, grad_out=None):
        launcher, write_grad = self.rung(variant).forward_launcher(needs_grad)
        return forward(getattr(build.load_extension(self.name), launcher), write_grad, *inputs, out=out,
                       grad_out=grad_out)

    def launch_backward(self, variant, saved, grad_loss, out=None):
        rung = self.rung(variant)
        return backward(getattr(build.load_extension(self.name), rung.backward), rung.writes_grad_in_forward, saved,
                        grad_loss, out=out)


# --- host code: one forward and one backward for every rung (exported solutions copy it) -------

def validate_inputs(predictions, targets) -> None:
    """Check types, dtypes, shapes and devices on the host, before any launch.

    Raises:
        TypeError: not a tensor, a dtype no rung takes, or targets of another dtype.
        ValueError: not (B, D), empty, shapes differing, targets requiring grad, or
            not both on one CUDA device.
    """
    require_tensor("predictions", predictions, dtypes=KNOWN_DTYPES, ndim=2)
    require_tensor("targets", targets, dtypes=KNOWN_DTYPES, ndim=2)
    if targets.shape != predictions.shape:
        raise ValueError(f"targets: expected the shape of predictions {tuple(predictions.shape)}, "
                         f"got {tuple(targets.shape)}")
    if targets.dtype != predictions.dtype:
        raise TypeError(f"targets: expected the dtype of predictions ({predictions.dtype}), "
                        f"got {targets.dtype}")
    require_no_grad("targets", targets)
    require_cuda(predictions=predictions, targets=targets)


def empty_state(predictions: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """What a forward writes for its backward besides the inputs: nothing (the backward reads
    predictions and targets again)."""
    return ()


def forward(launcher: Callable[..., None], write_grad: bool, predictions: torch.Tensor, targets: torch.Tensor,
            out: torch.Tensor | None = None, grad_out: torch.Tensor | None = None, state: bool = True,
            ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """Run one rung's forward launcher (a bound function of the extension, e.g.
    ``ext.vectorized_forward``) on validated inputs: one call into the extension.

    Args:
        predictions, targets: (B, D) of one dtype the rung takes, on one CUDA device, any
            strides (made contiguous here).
        write_grad: the rung writes dL/dp for grad_loss = 1 in this pass (into ``grad_out``
            if given, else a fresh (B, D) tensor); only for a rung that fuses it.
        out: optional 0-d tensor to write the loss into.
        state: unused (the backward's state is the inputs; cross_entropy's forward has the
            same signature).
    Returns the 0-d loss (the inputs' dtype, written by the kernels: no conversion; ``out``
    if given) and what the backward needs: the gradient alone if written, else
    (predictions, targets).
    Raises:
        RuntimeError: the launcher returned a CUDA error.
    """
    predictions, targets = predictions.contiguous(), targets.contiguous()
    rows, cols = predictions.shape
    dtype, device = predictions.dtype, predictions.device
    direct = out is not None and out.dtype is dtype
    loss = out if direct else predictions.new_empty(())
    grad = gradient_buffer(predictions, grad_out) if write_grad else None
    # the row partials and the launcher's 16 bytes (launchers.h): the stream's scratch, no allocation
    partials, _keep = scratch(device, 16 + 4 * rows)
    launch_values(launcher, device, predictions.data_ptr(), targets.data_ptr(), partials, loss.data_ptr(),
                  0 if grad is None else grad.data_ptr(), rows, cols, DTYPE_CODES[dtype])
    saved = (predictions, targets) if grad is None else (grad,)
    if out is not None and not direct:
        loss = out.copy_(loss)
    return loss, saved


def backward(launcher: Callable[..., None], grad_in_forward: bool, saved: Sequence[torch.Tensor],
             grad_loss: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Run one rung's backward launcher (a bound function): dL/dpredictions, (B, D) in the
    predictions' dtype, scaled by the 0-d ``grad_loss`` (written into ``out`` if given).

    ``saved`` is what :func:`forward` returned; ``grad_in_forward`` says it is the forward's
    gradient, which the launcher then scales in place (no work when grad_loss is 1). The
    kernels read ``grad_loss`` in the gradient's dtype (another dtype or device is converted).
    """
    if grad_in_forward:
        grad = forward_gradient(saved[0], out)
        p = t = 0
    else:
        predictions, targets = saved
        grad = gradient_buffer(predictions, out)
        p, t = predictions.data_ptr(), targets.data_ptr()
    if grad_loss.dtype is not grad.dtype or not grad_loss.is_cuda:
        grad_loss = grad_loss.to(device=grad.device, dtype=grad.dtype)
    rows, cols = grad.shape
    launch_values(launcher, grad.device, p, t, grad_loss.data_ptr(), grad.data_ptr(), rows, cols,
                  DTYPE_CODES[grad.dtype])
    return grad


PROBLEM = KLDiv()


# --- PyTorch's options (losslab.nn.functional.kl_div): vectorized and fused only --------------

REDUCTIONS = {"none": 0, "mean": 1, "sum": 2, "batchmean": 3}
MAX_PARTIALS = 1024  # KL_DIV_OPTIONS_MAX_BLOCKS of kernels/kl_div/options.h; its scratch holds 4 floats more


def options_divisor(shape: Sequence[int], reduction: int) -> float:
    """What the options forward divides the sum by: 1 (sum), the number of elements (mean),
    the batch size shape[0] (batchmean; 1 for a 0-d input), and 1 for none (unused)."""
    if reduction == REDUCTIONS["mean"]:
        return float(max(1, _numel(shape)))
    if reduction == REDUCTIONS["batchmean"] and len(shape) > 0:
        return float(shape[0])
    return 1.0


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def options_forward(ext, rung: str, inputs: torch.Tensor, targets: torch.Tensor, reduction: int, log_target: bool,
                    write_grad: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run ``rung``'s options forward (kernels/kl_div/options.h) on checked inputs.

    Args:
        inputs: log-probabilities, any shape, contiguous, float32/bfloat16/float16, on CUDA;
            targets: the same shape, dtype and device.
        reduction: a REDUCTIONS code; write_grad: fused writes dL/dinput for grad_loss = 1
            (not for none).
    Returns the loss in the inputs' dtype (the inputs' shape for none, else 0-d) and the
    gradient or None.
    """
    device, n = inputs.device, inputs.numel()
    none = reduction == REDUCTIONS["none"]
    partials, _keep = scratch(device, 4 * (MAX_PARTIALS + 4))  # the stream's: no one reads them after
    loss = torch.empty((), device=device, dtype=inputs.dtype)
    terms = torch.empty_like(inputs) if none else None
    grad = torch.empty_like(inputs) if write_grad else None
    launch(getattr(ext, f"{rung}_options_forward"), device, inputs, targets, partials, loss, terms, grad, n,
           int(log_target), options_divisor(inputs.shape, reduction), inputs.dtype)
    return (terms if none else loss), grad


def options_backward(ext, targets: torch.Tensor, grad_loss: torch.Tensor, reduction: int,
                     log_target: bool) -> torch.Tensor:
    """vectorized's options backward: dL/dinput (the targets' shape and dtype), from the
    targets alone; ``grad_loss`` is 0-d, or the inputs' shape for reduction none."""
    grad = torch.empty_like(targets, memory_format=torch.contiguous_format)
    none = reduction == REDUCTIONS["none"]
    scalar = None if none else grad_loss.to(device=grad.device, dtype=grad.dtype)
    terms = grad_loss.to(device=grad.device, dtype=grad.dtype).contiguous() if none else None
    launch(ext.vectorized_options_backward, grad.device, targets, scalar, terms, grad, grad.numel(),
           int(log_target), options_divisor(targets.shape, reduction), grad.dtype)
    return grad


def options_cost(numel: int, direction: str, dtype: torch.dtype = torch.float32, *, reduction: str = "batchmean",
                 log_target: bool = False) -> Cost:
    """Minimum traffic and arithmetic of the options forward/backward over ``numel`` elements.

    The forward reads input and target and writes the 0-d loss (the n terms for
    reduction none); per element xlogy(t, t) - t * input is a log and 3 flops (with
    log_target exp(t) * (t - input): an exp and 2 flops). The backward reads only the
    target (dL/dinput = -t * scale; -exp(t) * scale, an exp, with log_target), and the n
    upstream gradients for none. forward_backward: the single fused pass.
    """
    n = numel
    size = torch.finfo(dtype).bits // 8
    none = reduction == "none"
    out = n * size if none else size
    flops, special = (2 * n, n) if log_target else (3 * n, n)
    if direction == "forward":
        return Cost(2 * n * size, out, flops, special)
    if direction == "backward":
        return Cost(n * size + (n * size if none else 4), n * size, 2 * n, n if log_target else 0)
    if direction == "forward_backward":
        if none:
            raise ValueError("direction: reduction none has no single fused pass (its backward needs the "
                             "upstream gradient of each element)")
        return Cost(2 * n * size, n * size + size, flops + n, special)
    raise ValueError(f"direction: expected one of forward, backward, forward_backward, got {direction!r}")
