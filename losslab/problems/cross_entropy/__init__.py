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

The package holds everything about this loss: ``problem`` (the :class:`~losslab.problems.Problem`:
reference, inputs, sizes, cost model, edge cases, rung table), ``host`` (the host code every rung
launches through, the target checks, the cluster rung's plan), ``options`` (PyTorch's options, for
:mod:`losslab.nn`) and ``kernelbench`` (KernelBench's problem file); its kernels are
``kernels/cross_entropy/``.
"""
from losslab.problems.cross_entropy.host import (
    IGNORE_INDEX,
    INDEX_BYTES,
    KNOWN_DTYPES,
    STATE_NAMES,
    backward,
    check_targets,
    cluster_plan,
    empty_state,
    forward,
    out_of_range_message,
    validate_inputs,
)
from losslab.problems.cross_entropy.options import (
    OPTIONS_STATE_NAMES,
    REDUCTIONS,
    WEIGHT_BYTES,
    options_backward,
    options_cost,
    options_empty_state,
    options_forward,
)
from losslab.problems.cross_entropy.problem import PROBLEM, CrossEntropy

__all__ = ["IGNORE_INDEX", "INDEX_BYTES", "KNOWN_DTYPES", "OPTIONS_STATE_NAMES", "PROBLEM", "REDUCTIONS",
           "STATE_NAMES", "WEIGHT_BYTES", "CrossEntropy", "backward", "check_targets", "cluster_plan", "empty_state",
           "forward", "options_backward", "options_cost", "options_empty_state", "options_forward",
           "out_of_range_message", "validate_inputs"]
