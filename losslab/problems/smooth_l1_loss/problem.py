"""The smooth L1 (Huber) loss as a problem: the reference, inputs, sizes, cost model, edge cases and rung table."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from losslab.problems.base import HALF_AND_FLOAT, Cost, Problem, Rung, heavy_rows, misaligned_view
from losslab.problems.smooth_l1_loss import claims, host
from losslab.problems.smooth_l1_loss.host import validate_inputs

PARETO_SCALE, PARETO_ALPHA = 0.01, 1.5  # KernelBench's inputs: Pareto(0.01, 1.5) samples

# The operators' rungs (kernels/smooth_l1_loss/vectorized.cu, fused.cu); the lower rungs of the teaching
# ladder (kernels/smooth_l1_loss/ladder/) have no operator of their own.
RUNGS = (
    Rung("vectorized", dtypes=HALF_AND_FLOAT),
    Rung("fused", dtypes=HALF_AND_FLOAT, writes_grad_in_forward=True, inference="vectorized"),
)


class SmoothL1(Problem):
    """The smooth L1 loss, beta 1, mean over all elements of two (B, D) tensors (``F.smooth_l1_loss(p, t)``)."""

    host = host  # the host code its rungs launch through

    name = "smooth_l1_loss"
    input_names = ("predictions", "targets")
    rungs = RUNGS
    sizes = {
        "seed": (32768, 32768),  # KernelBench's size: two 4 GiB inputs
        "small": (128, 4096),
        "odd": (257, 4099),      # neither dimension a multiple of 4 or of a block
        "narrow": (3, 1000),
        "scalar": (1, 1),
    }
    sweep_shapes = ((128, 32768), (2048, 32768), (8192, 32768), (32768, 32768), (2048, 131072))
    saturates = claims.SATURATES
    peer_notes = claims.PEER_NOTES
    step_claims = claims.STEP_CLAIMS

    def reference(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.smooth_l1_loss(predictions, targets)

    def make_inputs(self, shape, *, seed, device="cuda", dtype=torch.float32):
        """KernelBench's Pareto(0.01, 1.5) samples, drawn from a seeded generator: x = 0.01 exp(E / 1.5)
        with E ~ Exp(1) (torch.distributions.Pareto's own transform, which takes no generator); the
        predictions scaled by a uniform random scalar, as KernelBench's."""
        gen = torch.Generator(device=device).manual_seed(seed)
        scale = torch.rand((), generator=gen, device=device)

        def pareto():
            e = torch.empty(shape, device=device).exponential_(generator=gen)
            return PARETO_SCALE * torch.exp(e / PARETO_ALPHA)

        predictions = pareto() * scale
        targets = pareto()
        return predictions.to(dtype), targets.to(dtype)

    def structured_inputs(self, shape, *, seed, device="cuda", dtype=torch.float32):
        """Targets of unit scale; predictions off them by noise whose scale ranges over three orders
        of magnitude from row to row, and by 1000 times more in the heavy rows, which carry most of
        the loss (it grows only linearly beyond beta)."""
        rows, cols = shape
        gen = torch.Generator(device=device).manual_seed(seed)
        targets = torch.randn(rows, cols, generator=gen, device=device)
        scale = 10 ** torch.empty(rows, 1, device=device).uniform_(-3, 0, generator=gen)
        scale[heavy_rows(rows, gen, device)] = 1000.0
        predictions = targets + scale * torch.randn(rows, cols, generator=gen, device=device)
        return predictions.to(dtype), targets.to(dtype)

    def validate(self, predictions, targets) -> None:
        validate_inputs(predictions, targets)

    def condition_parts(self, predictions, targets):
        """Every term is non-negative: the magnitude is the sum itself (condition 1)."""
        total = F.smooth_l1_loss(predictions, targets, reduction="sum")
        return total, total

    def cost(self, shape, direction, dtype=torch.float32) -> Cost:
        # forward: read p and t, write the 0-d loss; per element a subtract, an abs, a compare, two
        # multiplies (or a subtract) and an add: 5 counted.
        # backward: read p, t and grad_loss, write dL/dp; per element a subtract, compares, a multiply.
        # forward_backward: the least a single fused pass needs (read p, t once; write dL/dp
        # and the loss), which a separate forward and backward cannot reach.
        n = shape[0] * shape[1]
        size = torch.finfo(dtype).bits // 8
        if direction == "forward":
            return Cost(2 * n * size, size, 5 * n, 0)
        if direction == "backward":
            return Cost(2 * n * size + size, n * size, 2 * n, 0)
        if direction == "forward_backward":
            return Cost(2 * n * size, n * size + size, 7 * n, 0)
        raise ValueError(f"direction: expected one of forward, backward, forward_backward, got {direction!r}")

    def edge_cases(self, device="cuda"):
        def inputs(rows, cols, seed=0):
            return self.make_inputs((rows, cols), seed=seed, device=device)

        p, t = inputs(8, 300)
        at_beta = p.clone()
        at_beta[:, :4] = t[:, :4] + torch.tensor([-1.0, 1.0, 0.5, -2.0], device=device)  # |d| = beta, inside, outside
        p_inf = p.clone()
        p_inf[2, 5] = float("inf")
        both_inf = p_inf.clone(), t.clone()
        both_inf[1][2, 5] = float("inf")
        t_nan = t.clone()
        t_nan[3, 17] = float("nan")
        big_p, big_t = inputs(9, 1001)
        misaligned = tuple(misaligned_view(x, 8, 1000) for x in (big_p, big_t))
        strided = tuple(x[:, ::2] for x in (big_p, big_t))
        return {
            "predictions equal to the targets (loss and gradient exactly 0)": (t.clone(), t),
            "all zeros": (torch.zeros_like(p), torch.zeros_like(t)),
            "differences at the boundary |d| = beta = 1 and on both sides": (at_beta, t),
            "an infinite prediction (loss +inf, that gradient 1 / (B D))": (p_inf, t),
            "inf - inf in one element (NaN propagates)": both_inf,
            "NaN in targets (NaN propagates)": (p, t_nan),
            "B = 1 (one row)": inputs(1, 4096),
            "D = 1 (one column)": inputs(64, 1),
            "D not a multiple of 4": inputs(33, 1023),
            "storage offset breaks 16-byte alignment": misaligned,
            "non-contiguous (every other column)": strided,
        }


PROBLEM = SmoothL1()
