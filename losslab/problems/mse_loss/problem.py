"""The mean squared error as a problem: the reference, inputs, sizes, cost model, edge cases and rung table."""
from __future__ import annotations

import torch

from losslab.problems.base import HALF_AND_FLOAT, Cost, Problem, Rung, heavy_rows, misaligned_view
from losslab.problems.mse_loss import claims, host
from losslab.problems.mse_loss.host import validate_inputs

PARETO_SCALE, PARETO_ALPHA = 0.01, 1.5  # KernelBench's inputs: Pareto(0.01, 1.5) samples

# The operators' rungs (kernels/mse_loss/vectorized.cu, fused.cu); the lower rungs of the teaching
# ladder (kernels/mse_loss/ladder/) have no operator of their own.
RUNGS = (
    Rung("vectorized", dtypes=HALF_AND_FLOAT),
    Rung("fused", dtypes=HALF_AND_FLOAT, writes_grad_in_forward=True, inference="vectorized"),
)


class MeanSquaredError(Problem):
    """The mean squared error over all elements of two (B, D) tensors (``torch.mean((p - t) ** 2)``)."""

    host = host  # the host code its rungs launch through

    name = "mse_loss"
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
        return torch.mean((predictions - targets) ** 2)

    def make_inputs(self, shape, *, seed, device="cuda", dtype=torch.float32):
        """KernelBench's Pareto(0.01, 1.5) samples, drawn from a seeded generator: x = 0.01 exp(E / 1.5)
        with E ~ Exp(1) (torch.distributions.Pareto's own transform, which takes no generator)."""
        gen = torch.Generator(device=device).manual_seed(seed)

        def pareto():
            e = torch.empty(shape, device=device).exponential_(generator=gen)
            return PARETO_SCALE * torch.exp(e / PARETO_ALPHA)

        predictions = pareto()
        targets = pareto()
        return predictions.to(dtype), targets.to(dtype)

    def structured_inputs(self, shape, *, seed, device="cuda", dtype=torch.float32):
        """Targets of unit scale; predictions off them by noise whose scale ranges over three orders
        of magnitude from row to row, and by 30 times more in the heavy rows, which carry most of
        the loss."""
        rows, cols = shape
        gen = torch.Generator(device=device).manual_seed(seed)
        targets = torch.randn(rows, cols, generator=gen, device=device)
        scale = 10 ** torch.empty(rows, 1, device=device).uniform_(-3, 0, generator=gen)
        scale[heavy_rows(rows, gen, device)] = 30.0
        predictions = targets + scale * torch.randn(rows, cols, generator=gen, device=device)
        return predictions.to(dtype), targets.to(dtype)

    def validate(self, predictions, targets) -> None:
        validate_inputs(predictions, targets)

    def condition_parts(self, predictions, targets):
        """Every term (p - t)^2 is non-negative: the magnitude is the sum itself (condition 1)."""
        total = (predictions - targets).square_().sum()
        return total, total

    def cost(self, shape, direction, dtype=torch.float32) -> Cost:
        # forward: read p and t, write the 0-d loss; per element a subtract, a multiply, an add.
        # backward: read p, t and grad_loss, write dL/dp; per element a subtract and a multiply.
        # forward_backward: the least a single fused pass needs (read p, t once; write dL/dp
        # and the loss), which a separate forward and backward cannot reach.
        n = shape[0] * shape[1]
        size = torch.finfo(dtype).bits // 8
        if direction == "forward":
            return Cost(2 * n * size, size, 3 * n, 0)
        if direction == "backward":
            return Cost(2 * n * size + size, n * size, 2 * n, 0)
        if direction == "forward_backward":
            return Cost(2 * n * size, n * size + size, 4 * n, 0)
        raise ValueError(f"direction: expected one of forward, backward, forward_backward, got {direction!r}")

    def edge_cases(self, device="cuda"):
        def inputs(rows, cols, seed=0):
            return self.make_inputs((rows, cols), seed=seed, device=device)

        p, t = inputs(8, 300)
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
            "an infinite prediction (loss +inf, that gradient +inf)": (p_inf, t),
            "inf - inf in one element (NaN propagates)": both_inf,
            "NaN in targets (NaN propagates)": (p, t_nan),
            "B = 1 (one row)": inputs(1, 4096),
            "D = 1 (one column)": inputs(64, 1),
            "D not a multiple of 4": inputs(33, 1023),
            "storage offset breaks 16-byte alignment": misaligned,
            "non-contiguous (every other column)": strided,
        }


PROBLEM = MeanSquaredError()
