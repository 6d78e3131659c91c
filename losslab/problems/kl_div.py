"""KL divergence with ``reduction="batchmean"`` (KernelBench level 1, problem 98).

    loss = sum_ij [ xlogy(t_ij, t_ij) - t_ij * log(p_ij) ] / B
    dloss/dp_ij = -t_ij / (p_ij * B) * grad_loss

``predictions`` p and ``targets`` t are (B, D) probability rows. batchmean
divides by the batch size B only, not by B * D.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from losslab import build
from losslab.validation import require_cuda, require_no_grad, require_tensor
from losslab.problems import LADDER, Cost, Problem, misaligned_view

HALF_AND_FLOAT = (torch.float32, torch.bfloat16, torch.float16)
# Rungs with templated kernels take 16-bit inputs (math in fp32); the teaching rungs float32 only.
TYPED = ("vectorized", "fused")


class KLDiv(Problem):
    name = "kl_div"
    input_names = ("predictions", "targets")
    variants = (*LADDER, "fused")
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

    def dtypes(self, variant):
        return HALF_AND_FLOAT if variant in TYPED else (torch.float32,)

    def validate(self, predictions, targets) -> None:
        require_tensor("predictions", predictions, dtypes=HALF_AND_FLOAT, ndim=2)
        require_tensor("targets", targets, dtypes=HALF_AND_FLOAT, ndim=2)
        if targets.shape != predictions.shape:
            raise ValueError(f"targets: expected the shape of predictions {tuple(predictions.shape)}, "
                             f"got {tuple(targets.shape)}")
        if targets.dtype != predictions.dtype:
            raise TypeError(f"targets: expected the dtype of predictions ({predictions.dtype}), "
                            f"got {targets.dtype}")
        require_no_grad("targets", targets)
        require_cuda(predictions=predictions, targets=targets)

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
        self.check_variant_name(variant)
        predictions, targets = (x.contiguous() for x in inputs)
        rows, cols = predictions.shape
        row_partials = torch.empty(rows, device=predictions.device, dtype=torch.float32)
        loss = torch.empty((), device=predictions.device, dtype=torch.float32)
        ext = build.load_extension(self.name)
        pointers = (predictions.data_ptr(), targets.data_ptr(), row_partials.data_ptr(), loss.data_ptr())
        stream = torch.cuda.current_stream(predictions.device).cuda_stream
        dtype = build.dtype_code(predictions.dtype)
        if variant == "fused" and needs_grad:
            grad = torch.empty_like(predictions) if grad_out is None else grad_out
            ext.fused_forward(*pointers, grad.data_ptr(), rows, cols, dtype, stream)
            saved = (grad,)
        else:
            if variant in TYPED:  # inference with fused: the vectorized forward, no gradient written
                ext.vectorized_forward(*pointers, rows, cols, dtype, stream)
            else:
                getattr(ext, f"{variant}_forward")(*pointers, rows, cols, stream)
            saved = (predictions, targets)
        # the kernels accumulate and write the loss in fp32; it is returned in the inputs' dtype
        if out is not None:
            return out.copy_(loss), saved
        return loss.to(predictions.dtype), saved

    def launch_backward(self, variant, saved, grad_loss, out=None):
        self.check_variant_name(variant)
        ext = build.load_extension(self.name)
        stream = torch.cuda.current_stream(saved[0].device).cuda_stream
        grad_loss = grad_loss.to(device=saved[0].device, dtype=torch.float32).contiguous()
        if variant == "fused":
            (grad,) = saved  # written by the forward for grad_loss = 1; scaled in place here
            if out is not None and out.data_ptr() != grad.data_ptr():
                grad = out.copy_(grad)
            ext.fused_backward(grad.data_ptr(), grad_loss.data_ptr(), grad.numel(),
                               build.dtype_code(grad.dtype), stream)
            return grad
        predictions, targets = saved
        rows, cols = predictions.shape
        grad = torch.empty_like(predictions) if out is None else out
        pointers = (predictions.data_ptr(), targets.data_ptr(), grad_loss.data_ptr(), grad.data_ptr())
        if variant in TYPED:
            ext.vectorized_backward(*pointers, rows, cols, build.dtype_code(predictions.dtype), stream)
        else:
            getattr(ext, f"{variant}_backward")(*pointers, rows, cols, stream)
        return grad


PROBLEM = KLDiv()
