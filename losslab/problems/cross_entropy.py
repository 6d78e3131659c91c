"""Cross-entropy over class indices with mean reduction (KernelBench level 1, problem 95).

    loss = sum_{i valid} [ logsumexp(x_i) - x_i[t_i] ] / n_valid
    dloss/dx_ij = (softmax(x_i)_j - [j == t_i]) / n_valid * grad_loss      (0 on ignored rows)

``predictions`` x are (N, C) logits, ``targets`` t are N int64 class indices.
A row whose target is ``ignore_index`` (-100) leaves both the sum and the
count n_valid; with every row ignored the loss is 0 / 0 = NaN and the gradient
is zero, as in PyTorch. A target outside [0, C) that is not ignore_index is an
error (ValueError), never a device-side assert and never a wrong number.

The forward keeps O(N) floats for the backward: each row's log-sum-exp, as its
max and the log of sum(exp(x - max)) (kept apart so that x - logsumexp loses
no precision when the logits are large), never the (N, C) softmax.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from .. import build
from ..validation import require_cuda, require_tensor
from . import Cost, Problem

DTYPES = (torch.float32,)                               # what every rung has kernels for
KNOWN_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # what validate lets through to check_dtype
IGNORE_INDEX = -100  # F.cross_entropy's default; kernels/cross_entropy/cross_entropy.cuh agrees
INDEX_BYTES = 8      # int64 targets


def out_of_range_message(targets: torch.Tensor, num_classes: int) -> str:
    """The error message for targets outside [0, num_classes) that are not IGNORE_INDEX.

    Args:
        targets: (N,) int64 class indices, at least one of them out of range.
        num_classes: C, the number of columns of the predictions.
    Returns a message naming ``targets``, the first bad value, its position and the
    valid range.
    """
    bad = (targets != IGNORE_INDEX) & ((targets < 0) | (targets >= num_classes))
    positions = bad.nonzero().flatten()
    first = int(positions[0])
    return (f"targets: class index {int(targets[first])} at position {first} is outside "
            f"[0, {num_classes}) and is not ignore_index ({IGNORE_INDEX}); "
            f"{len(positions)} target(s) out of range")


class CrossEntropy(Problem):
    name = "cross_entropy"
    input_names = ("predictions", "targets")
    sizes = {
        "seed": (32768, 4096),  # DESIGN.md's size: 512 MiB of logits
        "small": (128, 4096),
        "odd": (257, 4099),     # neither dimension a multiple of 4 or of a block
        "narrow": (3, 1000),
        "scalar": (1, 1),
    }

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

    def validate(self, predictions, targets) -> None:
        """Check types, dtypes, devices and shapes on the host, before any launch.

        Device checks come last (so shape and dtype mistakes read the same without a
        GPU); the range of the target values is checked by ``launch_forward`` on the
        device.

        Raises:
            TypeError: an argument is not a tensor; predictions not a floating dtype
                losslab knows (``check_dtype`` then refuses all but float32, naming the
                variant); targets not int64 (float class probabilities and int32
                indices included).
            ValueError: predictions not (N, C), targets not (N,), N differing between
                them, an empty tensor, a tensor not on a CUDA device, or the two on
                different devices.
        """
        require_tensor("predictions", predictions, dtypes=KNOWN_DTYPES, ndim=2)
        if isinstance(targets, torch.Tensor) and targets.dtype != torch.int64:
            hint = " (class probabilities are not supported)" if targets.is_floating_point() else ""
            raise TypeError(f"targets: expected int64 class indices (torch.long), got {targets.dtype}{hint}")
        require_tensor("targets", targets, dtypes=(torch.int64,), ndim=1)
        if targets.shape[0] != predictions.shape[0]:
            raise ValueError(f"targets: expected one class index per row of predictions "
                             f"({predictions.shape[0]}), got shape {tuple(targets.shape)}")
        require_cuda(predictions=predictions, targets=targets)

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
        # a contiguous (8, 1000) view starting one float into the storage: rows
        # are no longer 16-byte aligned, so vector loads must take the slow path
        misaligned = (wide_x.reshape(-1)[1:1 + 8 * 1000].view(8, 1000), wide_t[:8] % 1000)
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

    def launch_forward(self, variant, inputs: Sequence[torch.Tensor], out=None, needs_grad=False,
                       grad_out=None):
        """Run ``variant``'s forward kernels on validated inputs.

        Args:
            inputs: predictions (N, C) float32 and targets (N,) int64 on one CUDA
                device, any strides (made contiguous here).
            out: optional 0-d float32 tensor on that device to write the loss into.
            needs_grad, grad_out: for a fused rung, which cross_entropy does not have
                yet; every rung here runs the same forward either way.
        Returns the 0-d loss and the tensors the backward needs: predictions and
        targets (contiguous), row_max and row_log_sum (N,) float32, and counts (2,)
        int64 = (n_valid, number of out-of-range targets).

        Raises:
            ValueError: a target outside [0, C) that is not ignore_index (-100).
                The second-stage kernel counts such targets while it adds up the
                rows, so the check costs no extra kernel and no extra pass, but one
                host synchronization per forward: this call returns only after the
                kernels finish (not asynchronously), and the host's wake-up and
                return, roughly 10-20 us, show up in CUDA-event timings. The kernels
                never index with a bad target (its row's loss and gradient are NaN),
                so the process's CUDA context stays usable.
        """
        self.check_variant_name(variant)
        predictions, targets = (x.contiguous() for x in inputs)
        rows, cols = predictions.shape
        device = predictions.device
        row_losses, row_max, row_log_sum = torch.empty(3, rows, device=device, dtype=torch.float32)
        counts = torch.empty(2, device=device, dtype=torch.int64)
        loss = torch.empty((), device=device, dtype=torch.float32) if out is None else out
        launcher = getattr(build.load_extension(self.name), f"{variant}_forward")
        with torch.cuda.device(device):  # launch on the inputs' device, not the current one
            launcher(predictions.data_ptr(), targets.data_ptr(), row_losses.data_ptr(), row_max.data_ptr(),
                     row_log_sum.data_ptr(), loss.data_ptr(), counts.data_ptr(), rows, cols,
                     torch.cuda.current_stream(device).cuda_stream)
        if int(counts[1]) > 0:  # the one host synchronization
            raise ValueError(out_of_range_message(targets, cols))
        return loss, (predictions, targets, row_max, row_log_sum, counts)

    def launch_backward(self, variant, saved, grad_loss, out=None):
        """Run ``variant``'s backward kernels.

        Args:
            saved: the tensors ``launch_forward`` returned for the backward.
            grad_loss: the 0-d upstream gradient.
            out: optional contiguous (N, C) float32 tensor to write the gradient into.
        Returns dloss/dpredictions, (N, C) float32: zero on ignored rows.
        """
        self.check_variant_name(variant)
        predictions, targets, row_max, row_log_sum, counts = saved
        rows, cols = predictions.shape
        grad_loss = grad_loss.to(device=predictions.device, dtype=torch.float32).contiguous()
        grad = torch.empty_like(predictions) if out is None else out
        launcher = getattr(build.load_extension(self.name), f"{variant}_backward")
        with torch.cuda.device(predictions.device):
            launcher(predictions.data_ptr(), targets.data_ptr(), row_max.data_ptr(), row_log_sum.data_ptr(),
                     counts.data_ptr(), grad_loss.data_ptr(), grad.data_ptr(), rows, cols,
                     torch.cuda.current_stream(predictions.device).cuda_stream)
        return grad


PROBLEM = CrossEntropy()
