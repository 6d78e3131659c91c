"""The mean squared error, reduction mean (KernelBench level 1, problem 94).

    loss = sum_ij (p_ij - t_ij)^2 / (B D)
    dloss/dp_ij = 2 (p_ij - t_ij) / (B D) * grad_loss

``predictions`` p and ``targets`` t are (B, D) of one shape (any shape in :mod:`losslab.nn`).
Everything about this loss: ``problem`` (the Problem: reference, inputs, sizes, cost, edge cases,
rungs), ``host`` (the host code every rung launches through), ``options`` (PyTorch's options, for
:mod:`losslab.nn`), ``functional`` (``F.mse_loss`` and ``MSELoss`` on the operators; not imported
here: it imports losslab.ops), ``kernelbench`` (KernelBench's file); its kernels are ``kernels/mse_loss/``.
"""
from losslab.problems.mse_loss.host import KNOWN_DTYPES, MAX_PARTIALS, backward, empty_state, forward, validate_inputs
from losslab.problems.mse_loss.options import (
    REDUCTIONS,
    options_backward,
    options_cost,
    options_divisor,
    options_forward,
)
from losslab.problems.mse_loss.problem import PROBLEM, MeanSquaredError

__all__ = ["KNOWN_DTYPES", "MAX_PARTIALS", "PROBLEM", "REDUCTIONS", "MeanSquaredError", "backward", "empty_state",
           "forward", "options_backward", "options_cost", "options_divisor", "options_forward", "validate_inputs"]
