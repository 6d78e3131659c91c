"""Cross-entropy over class indices with mean reduction (KernelBench level 1, problem 95).

    loss = sum_{i valid} [ logsumexp(x_i) - x_i[t_i] ] / n_valid
    dloss/dx_ij = (softmax(x_i)_j - [j == t_i]) / n_valid * grad_loss      (0 on ignored rows)

``predictions`` x are (N, C) logits, ``targets`` t N int64 class indices (ignore_index -100 leaves a
row out; a target out of range makes the loss NaN, see :func:`check_targets`). Everything about this
loss: ``problem``, ``host`` (the launches, the target checks, the cluster rung's plan), ``options``
(PyTorch's options, for :mod:`losslab.nn`), ``kernelbench``; its kernels are ``kernels/cross_entropy/``.
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
