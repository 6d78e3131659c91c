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
no precision when the logits are large), never the (N, C) softmax. The
``fused`` rung, when a gradient will be needed, instead writes the gradient in
its forward (one read of the logits) and keeps only that.
"""
from __future__ import annotations

import functools
from typing import Sequence

import torch
import torch.nn.functional as F

from losslab import build
from losslab.validation import require_cuda, require_tensor
from losslab.problems import LADDER, Cost, Problem, misaligned_view

KNOWN_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # what validate lets through to check_dtype
# Rungs with templated kernels take 16-bit logits (math in fp32); the teaching rungs float32 only.
TYPED = ("vectorized", "fused")
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


@functools.cache
def _copy_stream(device: torch.device) -> torch.cuda.Stream:
    """A side stream per device for copying the target counts to the host."""
    return torch.cuda.Stream(device)


def _counts_to_host(counts: torch.Tensor, counted: torch.cuda.Event) -> tuple[torch.Tensor, torch.cuda.Event]:
    """Start copying ``counts`` into pinned host memory once ``counted`` has fired.

    The copy runs on a side stream, so the kernels enqueued on the main stream
    never wait for it. Returns the host tensor and an event recorded after the
    copy: synchronize on it before reading the tensor.
    """
    side = _copy_stream(counts.device)
    side.wait_event(counted)
    counts.record_stream(side)  # its memory is not reused before the copy has read it
    host = torch.empty(counts.shape, dtype=counts.dtype, pin_memory=True)
    with torch.cuda.stream(side):
        host.copy_(counts, non_blocking=True)
    return host, side.record_event()


class CrossEntropy(Problem):
    name = "cross_entropy"
    input_names = ("predictions", "targets")
    variants = (*LADDER, "fused")
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

    def dtypes(self, variant):
        return KNOWN_DTYPES if variant in TYPED else (torch.float32,)

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

    def launch_forward(self, variant, inputs: Sequence[torch.Tensor], out=None, needs_grad=False,
                       grad_out=None):
        """Run ``variant``'s forward kernels on validated inputs.

        Args:
            inputs: predictions (N, C) and targets (N,) int64 on one CUDA device,
                any strides (made contiguous here); predictions in a dtype
                ``dtypes(variant)`` lists.
            out: optional 0-d tensor of the predictions' dtype to write the loss into.
            needs_grad: a backward will follow. ``fused`` then writes the gradient
                for grad_loss = 1 in this pass (into ``grad_out`` if given, an
                (N, C) tensor like predictions); without it, ``fused`` runs the
                vectorized forward and writes no gradient. Other rungs ignore it.
        Returns the 0-d loss (the predictions' dtype) and the tensors the backward
        needs: for ``fused`` with needs_grad, the gradient alone; otherwise
        predictions and targets (contiguous), row_max and row_log_sum (N,)
        float32, and counts (2,) int64 = (n_valid, number of out-of-range targets).

        Raises:
            ValueError: a target outside [0, C) that is not ignore_index (-100).
                A one-block kernel counts such targets before the row kernels,
                its two counts travel to pinned host memory on a side stream
                while the row kernels run, and the host waits only for that
                copy, after it has enqueued every kernel: the GPU never idles on
                the check (the counting kernel itself takes a few microseconds). The kernels
                never index with a bad target (its row's loss and gradient are
                NaN, and ``out`` is written), so the CUDA context stays usable.
        """
        self.check_variant_name(variant)
        predictions, targets = (x.contiguous() for x in inputs)
        rows, cols = predictions.shape
        device = predictions.device
        row_losses, row_max, row_log_sum = torch.empty(3, rows, device=device, dtype=torch.float32)
        counts = torch.empty(2, device=device, dtype=torch.int64)
        # the kernels accumulate and write the loss in fp32; it is returned in the predictions' dtype
        loss = out if out is not None and out.dtype == torch.float32 else torch.empty((), device=device,
                                                                                       dtype=torch.float32)
        fused = variant == "fused" and needs_grad
        if fused:
            grad = torch.empty_like(predictions) if grad_out is None else grad_out
        ext = build.load_extension(self.name)
        dtype = build.dtype_code(predictions.dtype)
        with torch.cuda.device(device):  # launch on the inputs' device, not the current one
            stream = torch.cuda.current_stream(device)
            ext.count_targets(targets.data_ptr(), counts.data_ptr(), rows, cols, stream.cuda_stream)
            counted = stream.record_event()
            head = (predictions.data_ptr(), targets.data_ptr(), counts.data_ptr())
            if fused:
                ext.fused_forward(*head, row_losses.data_ptr(), loss.data_ptr(), grad.data_ptr(), rows, cols,
                                  dtype, stream.cuda_stream)
                saved = (grad,)
            else:
                pointers = (*head, row_losses.data_ptr(), row_max.data_ptr(), row_log_sum.data_ptr(),
                            loss.data_ptr())
                if variant in TYPED:  # inference with fused: the vectorized forward, no gradient written
                    ext.vectorized_forward(*pointers, rows, cols, dtype, stream.cuda_stream)
                else:
                    getattr(ext, f"{variant}_forward")(*pointers, rows, cols, stream.cuda_stream)
                saved = (predictions, targets, row_max, row_log_sum, counts)
            # enqueued after the row kernels, so that the host's bookkeeping for the
            # copy does not delay their launch
            host_counts, copied = _counts_to_host(counts, counted)
        result = loss.to(predictions.dtype) if out is None else out
        if out is not None and out is not loss:
            out.copy_(loss)
        # Wait for the counts only (the row kernels may still be running), spinning:
        # a blocking wait sometimes woke up late, after the row kernels had
        # finished, and the GPU then idled (seen on an H200: the forward's p90
        # at 0.26 ms against a median of 0.145).
        while not copied.query():
            pass
        if int(host_counts[1]) > 0:
            raise ValueError(out_of_range_message(targets, cols))
        return result, saved

    def launch_backward(self, variant, saved, grad_loss, out=None):
        """Run ``variant``'s backward kernels.

        Args:
            saved: the tensors ``launch_forward`` returned for the backward.
            grad_loss: the 0-d upstream gradient.
            out: optional contiguous (N, C) tensor like predictions to write the gradient into.
        Returns dloss/dpredictions, (N, C) in the predictions' dtype: zero on ignored rows.
        For ``fused`` that is the forward's gradient buffer (or ``out``), scaled
        in place by grad_loss, with no work at all when grad_loss is 1.
        """
        self.check_variant_name(variant)
        ext = build.load_extension(self.name)
        device = saved[0].device
        grad_loss = grad_loss.to(device=device, dtype=torch.float32).contiguous()
        with torch.cuda.device(device):
            stream = torch.cuda.current_stream(device).cuda_stream
            if variant == "fused":
                (grad,) = saved  # written by the forward for grad_loss = 1; scaled in place here
                if out is not None and out.data_ptr() != grad.data_ptr():
                    grad = out.copy_(grad)
                ext.fused_backward(grad.data_ptr(), grad_loss.data_ptr(), grad.numel(),
                                   build.dtype_code(grad.dtype), stream)
                return grad
            predictions, targets, row_max, row_log_sum, counts = saved
            rows, cols = predictions.shape
            grad = torch.empty_like(predictions) if out is None else out
            pointers = (predictions.data_ptr(), targets.data_ptr(), row_max.data_ptr(), row_log_sum.data_ptr(),
                        counts.data_ptr(), grad_loss.data_ptr(), grad.data_ptr())
            if variant in TYPED:
                ext.vectorized_backward(*pointers, rows, cols, build.dtype_code(predictions.dtype), stream)
            else:
                getattr(ext, f"{variant}_backward")(*pointers, rows, cols, stream)
        return grad


PROBLEM = CrossEntropy()
