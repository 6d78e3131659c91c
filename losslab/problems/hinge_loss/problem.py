"""The hinge loss as a problem: the reference, inputs, sizes, cost model, edge cases and rung table."""
from __future__ import annotations

import torch

from losslab.problems.base import Cost, Problem, heavy_rows, misaligned_view
from losslab.problems.hinge_loss import claims, host
from losslab.problems.hinge_loss.host import validate_inputs

PARETO_SCALE, PARETO_ALPHA = 0.01, 1.5  # KernelBench's Pareto(0.01, 1.5) predictions


class Hinge(Problem):
    """The mean hinge loss of (B, D) predictions and (D,) targets of -1 and +1 broadcast over the
    rows (KernelBench's 100_HingeLoss); the whole ladder (``problems.LADDER``)."""

    host = host  # the host code its rungs launch through

    name = "hinge_loss"
    input_names = ("predictions", "targets")
    sizes = {
        "seed": (32768, 32768),  # KernelBench's size: 4 GiB of float32 predictions, (32768,) targets
        "small": (128, 4096),
        "odd": (257, 4099),      # neither dimension a multiple of 4 or of a block
        "narrow": (3, 1000),
        "scalar": (1, 1),
    }
    sweep_shapes = ((128, 32768), (1024, 32768), (4096, 32768), (32768, 32768), (2048, 131072))
    step_claims = claims.STEP_CLAIMS
    peer_notes = claims.PEER_NOTES
    saturates = claims.SATURATES

    def reference(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return torch.mean(torch.clamp(1 - predictions * targets, min=0))

    def reference_float64(self, predictions: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The loss of :meth:`reference` in float64 and its gradient written out, -[1 - p t > 0] t / (B D)
        ((B, D), float64): 0 at the hinge (1 - p t = 0) and where the margin is NaN, NaN where t is.

        Not autograd's, whose value at the hinge depends on the torch version: clamp(min=0) passed the
        gradient there from PyTorch 0.4 (pytorch/pytorch#7049, ``self >= min``) to at least 2.11 (the
        H200 record's torch), and passes none, the minimum-norm subgradient as relu's, in torch 2.14.1,
        requirements.txt's pin (its derivatives.yaml: ``where(self > min, grad, 0)``; the change of
        pytorch/pytorch issue #184572). The kernels keep the pinned torch's convention on any torch.
        """
        p, t = predictions.detach().double(), targets.detach().double()
        margin = 1 - p * t
        grad = -(torch.where(margin > 0, margin.new_tensor(1 / margin.numel()), margin.new_tensor(0.0)) * t)
        return torch.mean(torch.clamp(margin, min=0)), grad

    def make_inputs(self, shape, *, seed, device="cuda", dtype=torch.float32):
        """KernelBench's draw from a seeded generator: predictions Pareto(0.01, 1.5) (``scale *
        U ** (-1 / alpha)``, U uniform in (0, 1], as torch.distributions.Pareto samples), (D,)
        targets -1 or +1 with equal chance."""
        rows, cols = shape
        gen = torch.Generator(device=device).manual_seed(seed)
        uniform = 1 - torch.rand(rows, cols, generator=gen, device=device)  # (0, 1]
        predictions = PARETO_SCALE * uniform.pow_(-1 / PARETO_ALPHA)
        targets = torch.randint(0, 2, (cols,), generator=gen, device=device).float() * 2 - 1
        return predictions.to(dtype), targets.to(dtype)

    def structured_inputs(self, shape, *, seed, device="cuda", dtype=torch.float32):
        """Every row but the heavy ones just short of the margin (p t = 1 - s, s below 2e-3: terms of
        about 1e-3, each the difference of two numbers near 1); the heavy rows on the wrong side, at
        a scale of 0.01 to 10 per row (p = -t * scale * U: terms 1 to 11). The loss sits in about one
        row in HEAVY_EVERY, and the light rows' cancellation gives condition numbers of 48 to 118 (257 x 4099,
        seeds 0 to 3)."""
        rows, cols = shape
        gen = torch.Generator(device=device).manual_seed(seed)
        targets = torch.randint(0, 2, (cols,), generator=gen, device=device).float() * 2 - 1
        shortfall = 2e-3 * torch.rand(rows, cols, generator=gen, device=device)
        predictions = (1 - shortfall) * targets
        heavy = heavy_rows(rows, gen, device)
        scale = 10 ** torch.empty(len(heavy), 1, device=device).uniform_(-2, 1, generator=gen)
        predictions[heavy] = -scale * torch.rand(len(heavy), cols, generator=gen, device=device) * targets
        return predictions.to(dtype), targets.to(dtype)

    def condition_parts(self, predictions, targets):
        """Over the terms that pass the hinge (1 - p t > 0), each the difference 1 - p t:
        sum (1 + |p t|) and sum (1 - p t). The clamped terms are exact zeros."""
        margin = predictions * targets  # p t, then 1 - p t in place
        magnitude = torch.where(margin < 1, 1 + margin.abs(), 0).sum()
        total = margin.neg_().add_(1).clamp_(min=0).sum()
        return magnitude, total

    def validate(self, predictions, targets) -> None:
        validate_inputs(predictions, targets)

    def cost(self, shape, direction, dtype=torch.float32) -> Cost:
        # forward: read p (B x D) and t (D) once, write the 0-d loss; per element an FMA
        # (1 - p t, 2 flops), the clamp and the add.
        # backward: read p, t and grad_loss, write dL/dp; per element the FMA, the comparison
        # and a multiply.
        # forward_backward: the least a single fused pass needs (read p, t once; write dL/dp
        # and the loss), which a separate forward and backward cannot reach.
        rows, cols = shape
        n = rows * cols
        size = torch.finfo(dtype).bits // 8
        read = (n + cols) * size
        if direction == "forward":
            return Cost(read, size, 4 * n, 0)
        if direction == "backward":
            return Cost(read + size, n * size, 4 * n, 0)
        if direction == "forward_backward":
            return Cost(read, n * size + size, 6 * n, 0)
        raise ValueError(f"direction: expected one of forward, backward, forward_backward, got {direction!r}")

    def edge_cases(self, device="cuda"):
        def inputs(rows, cols, seed=0):
            return self.make_inputs((rows, cols), seed=seed, device=device)

        p, t = inputs(8, 300)
        on_hinge = p.clone()
        on_hinge[:, ::3] = t[::3]  # p t = 1: a zero term, and a zero gradient (autograd of clamp)
        p_nan = p.clone()
        p_nan[3, 17] = float("nan")
        p_inf = p.clone()
        p_inf[2, :4] = torch.tensor([float("inf"), -float("inf")] * 2, device=device)
        satisfied = (2 + p) * t  # every margin met: the loss is exactly 0
        big_p, big_t = inputs(9, 1001)
        misaligned = (misaligned_view(big_p, 8, 1000), big_t[1:])
        return {
            "predictions exactly on the hinge (p t = 1: term and gradient 0)": (on_hinge, t),
            "NaN in predictions (NaN propagates to the loss; its gradient is 0)": (p_nan, t),
            "infinite predictions (an infinite term, or 0)": (p_inf, t),
            "every margin met (the loss is exactly 0)": (satisfied, t),
            "B = 1 (one row)": inputs(1, 4096),
            "D = 1 (one column)": inputs(64, 1),
            "D not a multiple of 4": inputs(33, 1023),
            "storage offsets break 16-byte alignment": misaligned,
            "non-contiguous (every other column and target)": (big_p[:, ::2], big_t[::2]),
        }


PROBLEM = Hinge()
