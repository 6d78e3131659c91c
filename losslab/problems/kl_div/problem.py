"""KL divergence as a problem: the reference, inputs, sizes, cost model, edge cases and rung table."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from losslab.problems.base import Cost, Problem, heavy_rows, misaligned_view
from losslab.problems.kl_div import claims, host
from losslab.problems.kl_div.host import validate_inputs


class KLDiv(Problem):
    """KL divergence, batchmean, on (B, D) probability rows; the whole ladder, see :data:`LADDER`."""

    host = host  # the host code its rungs launch through

    name = "kl_div"
    input_names = ("predictions", "targets")
    sizes = {
        "seed": (16384, 16384),  # KernelBench's size: two 1 GiB inputs
        "small": (128, 4096),
        "odd": (257, 4099),      # neither dimension a multiple of 4 or of a block
        "narrow": (3, 1000),
        "scalar": (1, 1),
    }
    sweep_shapes = ((128, 4096), (2048, 16384), (16384, 16384), (2048, 131072))
    saturates = claims.SATURATES
    peer_notes = claims.PEER_NOTES
    step_claims = claims.STEP_CLAIMS

    def liger_op(self):
        """Liger-Kernel's ``liger_kl_div``. It takes log-probabilities, so the peer includes the
        ``torch.log`` of the predictions that a caller with probabilities has to pay for."""
        from liger_kernel.transformers.functional import liger_kl_div

        return lambda p, t: liger_kl_div(torch.log(p), t, reduction="batchmean")

    def condition_parts(self, predictions, targets):
        """sum (|t log t| + |t log p|) and sum (t log t - t log p), one temporary at a time."""
        a = torch.xlogy(targets, targets)
        total = a.sum()
        magnitude = a.abs_().sum()
        del a
        b = predictions.log().mul_(targets)
        return magnitude + b.abs().sum(), total - b.sum()

    def reference(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.kl_div(torch.log(predictions), targets, reduction="batchmean")

    def make_inputs(self, shape, *, seed, device="cuda", dtype=torch.float32):
        rows, cols = shape
        gen = torch.Generator(device=device).manual_seed(seed)
        scale = torch.rand((), generator=gen, device=device)
        predictions = (torch.rand(rows, cols, generator=gen, device=device) * scale).softmax(-1)
        targets = torch.rand(rows, cols, generator=gen, device=device).softmax(-1)
        return predictions.to(dtype), targets.to(dtype)

    def structured_inputs(self, shape, *, seed, device="cuda", dtype=torch.float32):
        """Predictions: softmax rows of logits scaled by 0.1 to 5 per row; the targets equal the
        predictions up to a small perturbation, except in the heavy rows, whose targets are drawn
        independently (KL of order 1 there, near 0 elsewhere). Every distribution mixes in a
        uniform share (:data:`UNIFORM_SHARE`), so no probability rounds to 0, even in float16."""
        rows, cols = shape
        gen = torch.Generator(device=device).manual_seed(seed)
        normal = lambda: torch.randn(rows, cols, generator=gen, device=device)  # noqa: E731
        heavy = heavy_rows(rows, gen, device)
        scale = 10 ** torch.empty(rows, 1, device=device).uniform_(-1, 0.7, generator=gen)
        logits = normal() * scale
        predictions = _mixed(logits)
        targets = _mixed(logits + 0.05 * normal())
        targets[heavy] = _mixed(5 * normal()[heavy])
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


UNIFORM_SHARE = 0.1  # mixed into every structured distribution


def _mixed(logits: torch.Tensor) -> torch.Tensor:
    """Rows of probabilities: softmax mixed with a uniform share, so none is 0."""
    return (1 - UNIFORM_SHARE) * logits.softmax(-1) + UNIFORM_SHARE / logits.shape[-1]


PROBLEM = KLDiv()
