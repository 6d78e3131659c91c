"""The triplet margin loss as a problem: the reference, inputs, sizes, cost model, edge cases and rung table."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from losslab.problems.base import HALF_AND_FLOAT, Cost, Problem, Rung, heavy_rows, misaligned_view
from losslab.problems.triplet_margin_loss import claims, host
from losslab.problems.triplet_margin_loss.host import validate_inputs

MARGIN = 1.0  # KernelBench's get_init_inputs() and PyTorch's default
EPS = 1e-6    # F.pairwise_distance's default, added to each difference


class TripletMarginLoss(Problem):
    """``nn.TripletMarginLoss(margin=1.0)(anchor, positive, negative)`` on (N, D) rows: a row loss
    over three inputs; the rungs' gradient is the anchor's (losslab.nn writes all three)."""

    host = host  # the host code its rungs launch through
    name = "triplet_margin_loss"
    input_names = ("anchor", "positive", "negative")
    # The operators: vectorized (16-byte loads, one block per row) and fused (its forward writes the
    # gradient too); the teaching ladder below them is kernels/triplet_margin_loss/ladder/.
    rungs = (
        Rung("vectorized", dtypes=HALF_AND_FLOAT),
        Rung("fused", dtypes=HALF_AND_FLOAT, writes_grad_in_forward=True, inference="vectorized"),
    )
    sizes = {
        "seed": (32768, 8192),  # KernelBench's size: three 1 GiB inputs
        "small": (128, 4096),
        "odd": (257, 4099),     # neither dimension a multiple of 4 or of a block
        "narrow": (3, 1000),
        "scalar": (1, 1),
    }
    sweep_shapes = ((128, 8192), (2048, 8192), (8192, 8192), (32768, 8192), (2048, 131072))
    saturates = claims.SATURATES
    step_claims = claims.STEP_CLAIMS
    peer_notes = claims.PEER_NOTES

    def reference(self, anchor: torch.Tensor, positive: torch.Tensor, negative: torch.Tensor) -> torch.Tensor:
        return F.triplet_margin_loss(anchor, positive, negative, margin=MARGIN)

    def make_inputs(self, shape, *, seed, device="cuda", dtype=torch.float32):
        """KernelBench's generator: ``torch.rand(N, D) * torch.rand(())`` for the anchor, ``torch.rand``
        for the positive and the negative, from one generator on ``device`` seeded with ``seed``."""
        rows, cols = shape
        gen = torch.Generator(device=device).manual_seed(seed)
        scale = torch.rand((), generator=gen, device=device)
        anchor = torch.rand(rows, cols, generator=gen, device=device) * scale
        positive = torch.rand(rows, cols, generator=gen, device=device)
        negative = torch.rand(rows, cols, generator=gen, device=device)
        return anchor.to(dtype), positive.to(dtype), negative.to(dtype)

    def structured_inputs(self, shape, *, seed, device="cuda", dtype=torch.float32):
        """Anchors scaled by 0.1 to 20 per row; in every row the positive 4 from the anchor and the
        negative 4.99 (a loss of 0.01 beside distances of 4 and 5: the cancellation, a condition number
        of about 40), except in the heavy rows, whose positive is 10 away and negative 0.5 (a loss of
        10.5: most of the mean). Directions at random."""
        rows, cols = shape
        gen = torch.Generator(device=device).manual_seed(seed)
        normal = lambda: torch.randn(rows, cols, generator=gen, device=device)  # noqa: E731

        def direction():  # unit rows
            d = normal()
            return d / d.norm(dim=1, keepdim=True)

        heavy = heavy_rows(rows, gen, device)
        scale = 10 ** torch.empty(rows, 1, device=device).uniform_(-1, 1.3, generator=gen)
        anchor = normal() * scale
        far = torch.full((rows, 1), 4.0, device=device)
        farther = far + 0.99
        far[heavy], farther[heavy] = 10.0, 0.5
        return (anchor.to(dtype), (anchor + far * direction()).to(dtype), (anchor + farther * direction()).to(dtype))

    def validate(self, anchor, positive, negative) -> None:
        validate_inputs(anchor, positive, negative)

    def condition_parts(self, anchor, positive, negative):
        """sum (margin + d(a, p) + d(a, n)) and sum (margin + d(a, p) - d(a, n)) over the rows with a
        loss: the two distances cancel (each about 40 at KernelBench's inputs, their difference about 1)."""
        d_ap = F.pairwise_distance(anchor, positive, eps=EPS)
        d_an = F.pairwise_distance(anchor, negative, eps=EPS)
        terms = MARGIN + d_ap - d_an
        active = terms > 0
        return (MARGIN + d_ap + d_an)[active].sum(), terms[active].sum()

    def cost(self, shape, direction, dtype=torch.float32) -> Cost:
        # forward: read a, p, n, write the 0-d loss. Per element u = a - p + eps and v = a - n + eps
        # (4 flops) and u * u, v * v accumulated (4); per row two square roots, margin + d_ap - d_an,
        # the clamp and the mean's add (4 flops).
        # backward: read a, p, n and grad_loss, write dL/da. The distances are recomputed (8 flops an
        # element, as the forward) and c_ap * u + c_an * v is 3 more; per row the coefficients (4).
        # forward_backward: the least a single fused pass needs (read a, p, n once, write dL/da and
        # the loss): the forward's work and the gradient's 3 flops an element.
        rows, cols = shape
        n = rows * cols
        size = torch.finfo(dtype).bits // 8
        if direction == "forward":
            return Cost(3 * n * size, size, 8 * n + 4 * rows, 2 * rows)
        if direction == "backward":
            return Cost(3 * n * size + size, n * size, 11 * n + 8 * rows, 2 * rows)
        if direction == "forward_backward":
            return Cost(3 * n * size + size, n * size + size, 11 * n + 8 * rows, 2 * rows)
        raise ValueError(f"direction: expected one of forward, backward, forward_backward, got {direction!r}")

    def edge_cases(self, device="cuda"):
        def inputs(rows, cols, seed=0):
            return self.make_inputs((rows, cols), seed=seed, device=device)

        a, p, n = inputs(16, 1000)
        zeros = torch.zeros_like(a)
        near = a + 0.01 * (n - a)  # d(a, n) about 0.13: every row's loss near the margin
        far = n.clone()
        far[::2] += 100.0  # every other row's negative far away: its loss 0 and no gradient
        a_nan = a.clone()
        a_nan[3, 17] = float("nan")
        n_inf = n.clone()
        n_inf[5, 2] = float("inf")
        wide = inputs(9, 2002)
        misaligned = tuple(misaligned_view(x, 8, 1000) for x in wide)
        strided = tuple(x[:, ::2] for x in wide)
        return {
            "every input zero (both distances eps * sqrt(D): loss = margin, zero gradient)": (zeros, zeros, zeros),
            "positive equal to the anchor (d(a, p) = eps * sqrt(D)), negative near": (a, a.clone(), near),
            "negatives far in every other row (those rows' loss and gradient 0)": (a, p, far),
            "NaN in the anchor (NaN loss, NaN in that row's gradient)": (a_nan, p, n),
            "+inf in a negative (that row's loss 0, NaN in its gradient where the inf is, as PyTorch)": (a, p, n_inf),
            "D = 1 (each distance |a - p + eps|)": inputs(64, 1),
            "D not a multiple of 4": inputs(33, 1023),
            "N = 1 (one row)": inputs(1, 4096),
            "storage offset breaks 16-byte alignment": misaligned,
            "non-contiguous (every other column)": strided,
        }


PROBLEM = TripletMarginLoss()
