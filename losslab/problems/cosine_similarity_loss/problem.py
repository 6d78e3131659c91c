"""The cosine-similarity loss as a problem: the reference, inputs, sizes, cost model, edge cases and rung table."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from losslab.problems.base import Cost, Problem, heavy_rows, misaligned_view
from losslab.problems.cosine_similarity_loss import claims, host
from losslab.problems.cosine_similarity_loss.host import validate_inputs

ROW_DOTS_BYTES = 12  # p.t, p.p, t.t of a row, float32: what the backward reads besides the inputs


class CosineSimilarityLoss(Problem):
    """mean(1 - cos) over the rows of (B, D) predictions and targets; the whole ladder."""

    host = host  # the host code its rungs launch through

    name = "cosine_similarity_loss"
    input_names = ("predictions", "targets")
    sizes = {
        "seed": (32768, 8192),  # the size issue 29 sets: two 1 GiB inputs
        "small": (128, 4096),   # KernelBench's first release
        "odd": (257, 4099),     # neither dimension a multiple of 4 or of a block
        "narrow": (3, 1000),
        "scalar": (1, 1),
    }
    sweep_shapes = ((128, 4096), (128, 8192), (2048, 8192), (8192, 8192), (32768, 8192), (2048, 131072))
    step_claims = claims.STEP_CLAIMS
    peer_notes = claims.PEER_NOTES
    saturates = claims.SATURATES

    def reference(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return torch.mean(1 - F.cosine_similarity(predictions, targets, dim=1))

    def make_inputs(self, shape, *, seed, device="cuda", dtype=torch.float32):
        """``torch.randn(B, D)`` twice (KernelBench's ``get_inputs``), from one generator on ``device``
        seeded with ``seed``, as ``dtype``."""
        rows, cols = shape
        gen = torch.Generator(device=device).manual_seed(seed)
        predictions = torch.randn(rows, cols, generator=gen, device=device)
        targets = torch.randn(rows, cols, generator=gen, device=device)
        return predictions.to(dtype), targets.to(dtype)

    def structured_inputs(self, shape, *, seed, device="cuda", dtype=torch.float32):
        """Rows scaled by 0.1 to 10 (predictions and targets apart); the targets are the predictions
        up to a small perturbation (1 - cos near 0), except in the heavy rows, where they are drawn
        independently (1 - cos near 1)."""
        rows, cols = shape
        gen = torch.Generator(device=device).manual_seed(seed)
        heavy = heavy_rows(rows, gen, device)
        predictions = torch.randn(rows, cols, generator=gen, device=device)
        targets = predictions + 0.05 * torch.randn(rows, cols, generator=gen, device=device)
        targets[heavy] = torch.randn(len(heavy), cols, generator=gen, device=device)
        for x in (predictions, targets):
            x *= 10 ** torch.empty(rows, 1, device=device).uniform_(-1, 1, generator=gen)
        return predictions.to(dtype), targets.to(dtype)

    def cancelled_gradient_scale(self, predictions: torch.Tensor, targets: torch.Tensor) -> float:
        """The size of dL/dp's terms where its float64 value is exactly 0 (rows of one element,
        cos = +-1): alpha t and beta p cancel, each of norm 1 / (B max(|p|, eps)) a row, so float32
        leaves rounding noise of that size. ``measure.check`` measures the gradient's error against
        it (against 1, an absolute error, a row with |p| below 0.1 failed the float32 tolerance)."""
        p = predictions.detach().double()
        return torch.linalg.vector_norm(1.0 / (p.shape[0] * p.norm(dim=1).clamp_min(1e-8))).item()

    def validate(self, predictions, targets) -> None:
        validate_inputs(predictions, targets)

    def condition_parts(self, predictions, targets):
        """sum (1 + |cos_i|) and sum (1 - cos_i): the terms 1 - cos_i the loss sums."""
        cos = F.cosine_similarity(predictions, targets, dim=1)
        return (1 + cos.abs()).sum(), (1 - cos).sum()

    def cost(self, shape, direction, dtype=torch.float32) -> Cost:
        # forward: read p and t, write the 0-d loss; per element three FMAs (p.t, p.p, t.t: 6
        # flops); per row two square roots (counted as transcendentals), two clamps, two divides
        # and 1 - cos into the mean (6 flops). The 12 bytes a row it keeps for the backward are
        # not part of the minimum.
        # backward: read p, t, the row dots and grad_loss, write dL/dp; per element
        # k_other * t + k_p * p (3 flops); per row the coefficients (about 10 flops, 2 roots).
        # forward_backward: the least a single fused pass needs (read p, t once; write dL/dp
        # and the loss): 9 flops an element.
        rows, cols = shape
        n = rows * cols
        size = torch.finfo(dtype).bits // 8
        if direction == "forward":
            return Cost(2 * n * size, size, 6 * n + 6 * rows, 2 * rows)
        if direction == "backward":
            return Cost(2 * n * size + rows * ROW_DOTS_BYTES + size, n * size, 3 * n + 10 * rows, 2 * rows)
        if direction == "forward_backward":
            return Cost(2 * n * size + size, n * size + size, 9 * n + 16 * rows, 2 * rows)
        raise ValueError(f"direction: expected one of forward, backward, forward_backward, got {direction!r}")

    def edge_cases(self, device="cuda"):
        def inputs(rows, cols, seed=0):
            return self.make_inputs((rows, cols), seed=seed, device=device)

        p, t = inputs(8, 300)
        identical = t.clone()
        identical[::2] = p[::2]  # half the rows: the mean stays well away from 0
        zero_row = p.clone()
        zero_row[2] = 0.0
        tiny_row = p.clone()
        tiny_row[5] *= 1e-12  # |p| below eps: the norm is clamped, its derivative kept
        p_nan = p.clone()
        p_nan[3, 17] = float("nan")
        big_p, big_t = inputs(9, 1001)
        misaligned = tuple(misaligned_view(x, 8, 1000) for x in (big_p, big_t))
        strided = tuple(x[:, ::2] for x in (big_p, big_t))
        return {
            "identical rows (cos = 1, a zero gradient there)": (p, identical),
            "a zero row of predictions (norm clamped to eps, cos = 0)": (zero_row, t),
            "a row of norm below eps (clamped; the norm's derivative kept)": (tiny_row, t),
            "NaN in predictions (NaN loss, NaN in that row's gradient)": (p_nan, t),
            "B = 1 (one row)": inputs(1, 4096),
            "D = 1 (cos = +-1)": inputs(64, 1),
            "D not a multiple of 4": inputs(33, 1023),
            "storage offset breaks 16-byte alignment": misaligned,
            "non-contiguous (every other column)": strided,
        }


PROBLEM = CosineSimilarityLoss()
