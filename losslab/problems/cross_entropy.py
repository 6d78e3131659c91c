"""Cross-entropy over class indices with mean reduction (KernelBench level 1, problem 95).

    loss = sum_{i valid} [ logsumexp(x_i) - x_i[t_i] ] / n_valid
    dloss/dx_ij = (softmax(x_i)_j - [j == t_i]) / n_valid * grad_loss      (0 on ignored rows)

``predictions`` x are (N, C) logits, ``targets`` t are N int64 class indices.
A row whose target is ``ignore_index`` (-100) leaves both the sum and the
count n_valid; with every row ignored the loss is 0 / 0 = NaN and the gradient
is zero, as in PyTorch. A target outside [0, C) that is not ignore_index is never
a wrong number and never a device-side assert: the loss is NaN, and
:func:`check_targets` (or strict mode, ``LOSSLAB_STRICT_TARGETS=1``) raises a
ValueError naming it. The forward never waits for the host.

The forward keeps O(N) floats for the backward: each row's log-sum-exp, as its
max and the log of sum(exp(x - max)) (kept apart so that x - logsumexp loses
no precision when the logits are large), never the (N, C) softmax. The
``fused`` rung, when a gradient will be needed, instead writes the gradient in
its forward (one read of the logits) and keeps only that; ``cluster`` does the same
for rows too long for one SM, each row split over a thread-block cluster (sm_90), and
runs fused's kernels where a cluster does not apply (:func:`cluster_plan` says why).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from losslab import build
from losslab.problems.base import HALF_AND_FLOAT, LADDER, Cost, Problem, Rung, misaligned_view
from losslab.problems.launch import DTYPE_CODES, forward_gradient, gradient_buffer, launch, launch_values, scratch
from losslab.validation import require_cuda, require_tensor

KNOWN_DTYPES = HALF_AND_FLOAT  # what validate lets through to check_dtype
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


def check_targets(targets: torch.Tensor, num_classes: int) -> None:
    """Raise ValueError if a target is outside [0, num_classes) and is not IGNORE_INDEX.

    The forward never waits for the host: it marks a row whose target is out of range
    (its loss, hence the mean, is NaN; the kernels never index with it) and goes on. Call
    this where you want the error with its message (position, value), or run in strict
    mode (``LOSSLAB_STRICT_TARGETS=1``, or ``strict=True`` to :func:`losslab.variant`'s
    loss), which calls it before every launch. PyTorch's ``F.cross_entropy`` instead stops
    the kernel with a device-side assert, which leaves the CUDA context unusable.

    Args:
        targets: (N,) int64 class indices, on any device.
        num_classes: C, the number of columns of the logits.
    Raises:
        ValueError: naming the first bad value, its position and the valid range. The check
            waits for the GPU once (it reads one flag back).
    """
    bad = (targets != IGNORE_INDEX) & ((targets < 0) | (targets >= num_classes))
    if bool(bad.any()):
        raise ValueError(out_of_range_message(targets, num_classes))


class CrossEntropy(Problem):
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

    def launch_forward(self, variant, inputs: Sequence[torch.Tensor], out=None, needs_grad=False,
                       grad_out=None):
        """Run ``variant``'s forward kernels on validated inputs; see :func:`forward`.

        Never waits for the GPU: a target outside [0, C) that is not ignore_index (-100)
        makes the loss NaN (and that row's gradient NaN); :func:`check_targets` raises for it.
        """
        launcher, write_grad = self.rung(variant).forward_launcher(needs_grad)
        return forward(getattr(build.load_extension(self.name), launcher), write_grad, *inputs, out=out,
                       grad_out=grad_out)

    def launch_backward(self, variant, saved, grad_loss, out=None):
        """Run ``variant``'s backward kernels; see :func:`backward`."""
        rung = self.rung(variant)
        return backward(getattr(build.load_extension(self.name), rung.backward), rung.writes_grad_in_forward, saved,
                        grad_loss, out=out)


# --- host code: one forward and one backward for every rung (exported solutions copy it) -------

def validate_inputs(predictions, targets) -> None:
    """Check types, dtypes, devices and shapes on the host, before any launch.

    Device checks come last (so shape and dtype mistakes read the same without a
    GPU); the range of the target values is :meth:`check_values`'s (it waits for
    the GPU), done only on request or in strict mode.

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


STATE_NAMES = ("stats",)  # empty_state's, in order


def empty_state(predictions: torch.Tensor) -> tuple[torch.Tensor]:
    """What a forward writes for its backward besides the inputs, unwritten: ``stats``,
    (8 + 2N,) float32 on the logits' device. From byte 0: counts, (4,) int64 (n_valid, the
    number of targets out of range, then two words the forward zeroes); row_max and
    row_log_sum, (N,) float32 each. One tensor, not three: at small sizes each ``torch.empty``
    is a sizeable part of a call's host time. Every element is written by every forward (an
    operator's outputs must be the same each time it runs: opcheck compares them); the row
    losses, which some rungs write and none reads after the call, are the stream's scratch."""
    return (torch.empty(8 + 2 * predictions.shape[0], device=predictions.device, dtype=torch.float32),)


def forward(launcher: Callable[..., None], write_grad: bool, predictions: torch.Tensor, targets: torch.Tensor,
            out: torch.Tensor | None = None, grad_out: torch.Tensor | None = None, state: bool = True,
            ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """Run one rung's forward launcher (a bound function of the extension, e.g.
    ``ext.vectorized_forward``): one call into the extension, which runs every stage.

    Args:
        predictions: (N, C) logits of a dtype the rung takes; targets: (N,) int64; one
            CUDA device, any strides (made contiguous here).
        write_grad: the rung writes dL/dx for grad_loss = 1 in this pass (into ``grad_out``
            if given, else a fresh (N, C) tensor); only for a rung that fuses it.
        out: optional 0-d tensor to write the loss into.
        state: return ``stats`` for the backward (False: inference, one allocation, the
            loss's; the returned state's ``stats`` is then None).
    Returns the 0-d loss (the logits' dtype, written by the kernels: no conversion; ``out`` if
    given; NaN if a target is outside [0, C) and not ignore_index) and what the backward
    needs: the gradient alone if written, else predictions, targets and ``stats``
    (:func:`empty_state`).
    Raises:
        RuntimeError: the launcher returned a CUDA error.
    """
    predictions, targets = predictions.contiguous(), targets.contiguous()
    rows, cols = predictions.shape
    dtype, device = predictions.dtype, predictions.device
    direct = out is not None and out.dtype is dtype
    loss = out if direct else predictions.new_empty(())
    grad = gradient_buffer(predictions, grad_out) if write_grad else None
    # the row losses (16-byte aligned), then stats' layout where no one reads it after the call:
    # the stream's scratch, no allocation
    aligned = 16 * ((rows + 3) // 4)
    stats = None
    if state and not write_grad:  # the backward reads stats: an output of its own
        (stats,) = empty_state(predictions)
        row_losses, _keep = scratch(device, aligned)
        base = stats.data_ptr()
    else:
        row_losses, _keep = scratch(device, aligned + 32 + 8 * rows)
        base = row_losses + aligned
    launch_values(launcher, device, predictions.data_ptr(), targets.data_ptr(), base, row_losses, base + 32,
                  base + 32 + 4 * rows, loss.data_ptr(), 0 if grad is None else grad.data_ptr(), rows, cols,
                  DTYPE_CODES[dtype])
    saved = (predictions, targets, stats) if grad is None else (grad,)
    if out is not None and not direct:
        loss = out.copy_(loss)
    return loss, saved


def backward(launcher: Callable[..., None], grad_in_forward: bool, saved: Sequence[torch.Tensor],
             grad_loss: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Run one rung's backward launcher (a bound function): dL/dlogits, (N, C) in the logits'
    dtype, zero on ignored rows, scaled by the 0-d ``grad_loss`` (written into ``out`` if given).

    ``saved`` is what :func:`forward` returned for the backward; ``grad_in_forward`` says
    it is the forward's gradient, which the launcher then scales in place (no work when
    grad_loss is 1). The kernels read ``grad_loss`` in the gradient's dtype (another dtype
    or device is converted).
    """
    if grad_in_forward:
        grad = forward_gradient(saved[0], out)
        x = t = row_max = row_log_sum = counts = 0
    else:
        predictions, targets, stats = saved
        grad = gradient_buffer(predictions, out)
        base, rows = stats.data_ptr(), predictions.shape[0]
        x, t, counts, row_max, row_log_sum = (predictions.data_ptr(), targets.data_ptr(), base, base + 32,
                                              base + 32 + 4 * rows)
    if grad_loss.dtype is not grad.dtype or not grad_loss.is_cuda:
        grad_loss = grad_loss.to(device=grad.device, dtype=grad.dtype)
    rows, cols = grad.shape
    launch_values(launcher, grad.device, x, t, row_max, row_log_sum, counts, grad_loss.data_ptr(), grad.data_ptr(),
                  rows, cols, DTYPE_CODES[grad.dtype])
    return grad


PROBLEM = CrossEntropy()


def cluster_plan(predictions: torch.Tensor, grad: torch.Tensor | None = None) -> tuple[int, int, str]:
    """How the ``cluster`` rung splits the rows of ``predictions`` (kernels/cross_entropy/cluster.cu).

    Args:
        predictions: (N, C) contiguous logits, float32/bfloat16/float16, on a CUDA device.
        grad: the buffer its gradient goes to (default: a fresh one, which is 16-byte aligned).
    Returns (CTAs per row, bytes of a row per CTA, ""), or (0, 0, why fused's kernels run
    instead), as the launcher decides it on ``predictions``' device.
    """
    rows, cols = predictions.shape
    address = 0 if grad is None else grad.data_ptr()  # the plan reads its offset from 16 bytes
    with torch.cuda.device(predictions.device):
        return build.load_extension("cross_entropy").cluster_plan(predictions.data_ptr(), address, rows, cols,
                                                                  DTYPE_CODES[predictions.dtype])


# --- PyTorch's options (losslab.nn.functional.cross_entropy): vectorized and fused only ---------

REDUCTIONS = {"none": 0, "mean": 1, "sum": 2}  # torch's Reduction enum; kernels/cross_entropy/options.h
OPTIONS_STATE_NAMES = ("row_max", "row_log_sum", "row_coef", "denominators")
WEIGHT_BYTES = 4  # float32 weights


def options_empty_state(logits: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """What an options forward writes for its backward, unwritten: row_max, row_log_sum and
    row_coef (N,) float32, denominators (2,) float32, on the logits' device."""
    rows, device = logits.shape[0], logits.device
    row = [torch.empty(rows, device=device, dtype=torch.float32) for _ in range(3)]
    return (*row, torch.empty(2, device=device, dtype=torch.float32))


def options_forward(ext, rung: str, logits: torch.Tensor, targets: torch.Tensor | None, probs: torch.Tensor | None,
                    weight: torch.Tensor | None, ignore_index: int, label_smoothing: float, reduction: int,
                    write_grad: bool, keep_state: bool = True,
                    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...], torch.Tensor | None]:
    """Run ``rung``'s options forward (kernels/cross_entropy/options.h) on checked inputs.

    Args:
        logits: (N, C) contiguous, float32/bfloat16/float16, on a CUDA device.
        targets: (N,) int64 class indices, or None; probs: (N, C) class probabilities of the
            logits' dtype, or None (exactly one of the two).
        weight: (C,) float32 contiguous, or None.
        reduction: a REDUCTIONS code; write_grad: fused writes dL/dlogits for grad_loss = 1
            (reduction sum or mean only).
        keep_state: return the backward's state; False writes no row statistics and keeps
            the denominators in the stream's scratch (nothing allocated) and returns ``()``.
    Returns the loss in the logits' dtype ((N,) for none, else 0-d), the backward's state
    (OPTIONS_STATE_NAMES; unwritten rows when the gradient was written) and the gradient or None.
    Never waits for the GPU: a class index outside [0, C) that is not ignore_index makes its row NaN.
    """
    rows, cols = logits.shape
    device = logits.device
    none = reduction == REDUCTIONS["none"]
    # The stream's scratch: the launcher's workspace (2N + 4 words) after 16 bytes for the
    # denominators where the state is not kept.
    base, _keep = scratch(device, 4 * (2 * rows + 8))
    state = options_empty_state(logits) if keep_state else ()
    # addresses, 0 for null: launch()'s conversion of 19 arguments costs microseconds of host time
    rows_at = [t.data_ptr() for t in state[:3]] if keep_state and not write_grad else (0, 0, 0)  # 0: not written
    row_losses = torch.empty(rows, device=device, dtype=torch.float32) if none else None
    loss = None if none else logits.new_empty(())  # written in the logits' dtype
    grad = torch.empty_like(logits) if write_grad else None
    launch_values(getattr(ext, f"{rung}_options_forward"), device, logits.data_ptr(), _address(targets),
                  _address(probs), _address(weight), state[3].data_ptr() if keep_state else base,
                  _address(row_losses), *rows_at, base + 16, _address(loss), _address(grad), rows, cols,
                  ignore_index, float(label_smoothing), reduction, DTYPE_CODES[logits.dtype])
    return (row_losses.to(logits.dtype) if none else loss), state, grad


def _address(tensor: torch.Tensor | None) -> int:
    return 0 if tensor is None else tensor.data_ptr()


def options_backward(ext, logits: torch.Tensor, targets: torch.Tensor | None, probs: torch.Tensor | None,
                     weight: torch.Tensor | None, state: Sequence[torch.Tensor], grad_loss: torch.Tensor,
                     ignore_index: int, label_smoothing: float, reduction: int) -> torch.Tensor:
    """vectorized's options backward: dL/dlogits, (N, C) in the logits' dtype, from the
    forward's state; ``grad_loss`` is 0-d, or (N,) for reduction none."""
    grad = torch.empty_like(logits, memory_format=torch.contiguous_format)
    grad_loss = grad_loss.to(device=grad.device, dtype=torch.float32).contiguous()
    launch(ext.vectorized_options_backward, grad.device, logits, targets, probs, weight, state[3], *state[:3],
           grad_loss, grad, *grad.shape, ignore_index, float(label_smoothing), reduction, grad.dtype)
    return grad


def options_cost(shape: tuple[int, int], direction: str, dtype: torch.dtype = torch.float32, *,
                 weight: bool = False, probs: bool = False, label_smoothing: float = 0.0,
                 reduction: str = "mean") -> Cost:
    """Minimum traffic and arithmetic of the options forward/backward at (rows, classes) ``shape``.

    Each option adds what it must read: ``probs`` the (N, C) class probabilities (in place of
    the N int64 indices), ``weight`` the C float32 weights (each once: a row re-reads them
    from cache) and, for class indices, w[t] per row; reduction none writes N losses
    instead of one (and its backward reads N upstream gradients). Label smoothing and
    probabilities add 3 flops per element (a_j, a_j * x_j, the sum) in the forward and 2 in
    the backward; the row statistics the backward reads (max, log-sum, A: 12 bytes a row)
    are not part of the forward's minimum.
    """
    rows, cols = shape
    n = rows * cols
    size = torch.finfo(dtype).bits // 8
    targets = n * size if probs else rows * INDEX_BYTES
    weights = cols * WEIGHT_BYTES if weight else 0
    if weight and not probs:
        weights += rows * WEIGHT_BYTES  # w[t] of each row, gathered
    extra = (3 * n) if (probs or label_smoothing > 0) else 0
    out = rows * size if reduction == "none" else size
    upstream = rows * 4 if reduction == "none" else 4
    forward = Cost(n * size + targets + weights, out, 3 * n + 3 * rows + extra, n + rows)
    if direction == "forward":
        return forward
    backward = Cost(n * size + targets + weights + rows * 12 + 8 + upstream, n * size,
                    4 * n + rows + (2 * n if extra else 0), n)
    if direction == "backward":
        return backward
    if direction == "forward_backward":
        return Cost(n * size + targets + weights + 8, n * size + out,
                    forward.flops + 3 * n, n + rows)
    raise ValueError(f"direction: expected one of forward, backward, forward_backward, got {direction!r}")
