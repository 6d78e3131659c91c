"""Cross-entropy as a problem: the reference, inputs, sizes, cost model, edge cases and rung table."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from losslab.problems.base import HALF_AND_FLOAT, LADDER, Cost, Problem, Rung, heavy_rows, misaligned_view
from losslab.problems.cross_entropy import claims, host
from losslab.problems.cross_entropy.host import (
    IGNORE_INDEX,
    INDEX_BYTES,
    check_targets,
    validate_inputs,
)


class CrossEntropy(Problem):
    host = host  # the host code its rungs launch through
    name = "cross_entropy"
    input_names = ("predictions", "targets")
    # The ladder, and cluster above fused: fused's one pass for rows too long for one SM.
    rungs = (*LADDER, Rung("cluster", dtypes=HALF_AND_FLOAT, writes_grad_in_forward=True, inference="vectorized",
                           falls_back_to="fused"))
    sizes = {
        "seed": (32768, 4096),  # 512 MiB of logits
        "small": (128, 4096),
        "odd": (257, 4099),     # neither dimension a multiple of 4 or of a block
        "narrow": (3, 1000),
        "scalar": (1, 1),
    }
    sweep_shapes = ((128, 4096), (2048, 4096), (32768, 4096), (8192, 32768), (4096, 131072), (2048, 262144))
    saturates = claims.SATURATES
    step_claims = claims.STEP_CLAIMS
    peer_notes = claims.PEER_NOTES

    def liger_op(self):
        """Liger-Kernel's ``liger_cross_entropy`` (mean reduction, ignore_index -100)."""
        from liger_kernel.transformers.functional import liger_cross_entropy

        return lambda x, y: liger_cross_entropy(x, y)

    def condition_parts(self, logits, targets):
        """sum (|lse_i| + |x_i,t|) and sum (lse_i - x_i,t) over the rows whose target is not ignored."""
        valid = targets >= 0  # ignore_index (-100) rows are not in the mean
        lse = torch.logsumexp(logits, -1)[valid]
        picked = logits.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)[valid]
        return lse.abs().sum() + picked.abs().sum(), (lse - picked).sum()

    def quack_op(self):
        """quack's ``cross_entropy`` as a user calls it, ``quack.cross_entropy(logits, targets)`` with
        mean reduction and ignore_index -100 (logits (B, C) float32/bfloat16/float16, targets (B,)
        int64). Its kernel writes one float32 loss per row (and the log-sum-exp the backward kernel
        reads); the mean is then taken in PyTorch ops, a sum of those losses over a count of the
        targets that are not ignore_index (NaN when every row is ignored, as in PyTorch): launches a
        user pays for too. The loss is float32 whatever the logits' dtype; the gradient is written
        to a new tensor (not in place). Needs sm_90+ and the CUDA 13 CuTe-DSL libraries."""
        if torch.cuda.is_available() and torch.cuda.get_device_capability() < (9, 0):
            major, minor = torch.cuda.get_device_capability()
            raise LookupError(f"quack-kernels needs sm_90+ (Hopper or newer); this GPU is sm_{major}{minor}")
        from quack import cross_entropy

        return lambda x, y: cross_entropy(x, y, ignore_index=IGNORE_INDEX, reduction="mean")

    def reference(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(predictions, targets)

    def make_inputs(self, shape, *, seed, device="cuda", dtype=torch.float32):
        """``predictions = torch.rand(N, C)`` (as ``dtype``), ``targets = torch.randint(0, C, (N,))``
        (int64), both from one generator on ``device`` seeded with ``seed``."""
        rows, cols = shape
        gen = torch.Generator(device=device).manual_seed(seed)
        predictions = torch.rand(rows, cols, generator=gen, device=device)
        targets = torch.randint(0, cols, (rows,), generator=gen, device=device, dtype=torch.int64)
        return predictions.to(dtype), targets

    def structured_inputs(self, shape, *, seed, device="cuda", dtype=torch.float32):
        """Logits scaled by 0.1 to 20 per row, the largest raised by a margin of 12: the target
        is that logit (a loss of a fraction of a nat at most), except in the heavy rows, where it
        is the smallest (many nats)."""
        rows, cols = shape
        gen = torch.Generator(device=device).manual_seed(seed)
        heavy = heavy_rows(rows, gen, device)
        scale = 10 ** torch.empty(rows, 1, device=device).uniform_(-1, 1.3, generator=gen)
        logits = torch.randn(rows, cols, generator=gen, device=device) * scale
        targets = logits.argmax(-1)
        logits[torch.arange(rows, device=device), targets] += 12.0
        targets[heavy] = logits[heavy].argmin(-1)
        return logits.to(dtype), targets

    def validate(self, predictions, targets) -> None:
        validate_inputs(predictions, targets)

    def cost(self, shape, direction, dtype=torch.float32) -> Cost:
        # forward: read the logits and the int64 targets, write the 0-d loss. Per
        # element: a compare for the running max, x - max, an add into the sum
        # (3 flops) and one exp; per row: one log, max - x[t], + log(sum) and the
        # mean's add (3 flops). The 8 bytes a row it keeps for the backward are
        # not part of the minimum.
        # backward: read the logits, targets, the row statistics (max and
        # log-sum, 8 bytes a row), n_valid and grad_loss; write the gradient. Per
        # element: (x - max) - log(sum), minus the one-hot, times the scale
        # (4 flops) and one exp; per row one divide for the scale.
        # forward_backward: the least a single fused pass needs (read the logits
        # and targets once, write the gradient and the loss). It keeps exp(x - max)
        # from the forward, so the gradient adds only 3 flops per element (times
        # 1/sum, minus the one-hot, times the scale) and no exp.
        rows, cols = shape
        n = rows * cols
        size = torch.finfo(dtype).bits // 8
        if direction == "forward":
            return Cost(n * size + rows * INDEX_BYTES, size, 3 * n + 3 * rows, n + rows)
        if direction == "backward":
            return Cost(n * size + rows * INDEX_BYTES + rows * 8 + INDEX_BYTES + size, n * size,
                        4 * n + rows, n)
        if direction == "forward_backward":
            return Cost(n * size + rows * INDEX_BYTES + size, n * size + size,
                        6 * n + 4 * rows, n + rows)
        raise ValueError(f"direction: expected one of forward, backward, forward_backward, got {direction!r}")

    def edge_cases(self, device="cuda"):
        def inputs(rows, cols, seed=0):
            return self.make_inputs((rows, cols), seed=seed, device=device)

        x, t = inputs(16, 1000)
        some_ignored = t.clone()
        some_ignored[::3] = IGNORE_INDEX
        # uniform in [-1e4, 1e4]: exp overflows (and underflows) unless the max is
        # subtracted; in every other row the target is the max, so that row's
        # loss is a tiny number beside 1e4-sized logits
        huge = (x * 2 - 1) * 1e4
        huge_t = t.clone()
        huge_t[::2] = huge[::2].argmax(-1)
        x_nan = x.clone()
        x_nan[3, 17] = float("nan")
        wide_x, wide_t = inputs(9, 2002)
        misaligned = (misaligned_view(wide_x, 8, 1000), wide_t[:8] % 1000)
        # every other column of the logits, every other element of the targets
        strided = (wide_x[:, ::2], (wide_t % 1001).repeat_interleave(2)[::2])
        return {
            "every target ignored (PyTorch gives NaN, zero gradient)": (x, torch.full_like(t, IGNORE_INDEX)),
            "some rows ignored (out of the sum and the denominator)": (x, some_ignored),
            "logits of +-1e4 (exp overflows without the max)": (huge, huge_t),
            "NaN in a logit (NaN loss, NaN in that row's gradient)": (x_nan, t),
            "C = 1 (every row's loss is 0)": inputs(64, 1),
            "C not a multiple of 4": inputs(33, 1023),
            "N = 1 (one row)": inputs(1, 4096),
            "storage offset breaks 16-byte alignment": misaligned,
            "non-contiguous (every other column and target)": strided,
        }

    def check_values(self, predictions, targets) -> None:
        """The checks that read the inputs' values (they wait for the GPU): the target range."""
        check_targets(targets, predictions.shape[1])


PROBLEM = CrossEntropy()
