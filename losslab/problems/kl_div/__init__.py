"""KL divergence with ``reduction="batchmean"`` (KernelBench level 1, problem 98).

    loss = sum_ij [ xlogy(t_ij, t_ij) - t_ij * log(p_ij) ] / B
    dloss/dp_ij = -t_ij / (p_ij * B) * grad_loss

``predictions`` p and ``targets`` t are (B, D) probability rows; batchmean divides by B only.
Everything about this loss: ``problem`` (the Problem: reference, inputs, sizes, cost, edge cases,
rungs), ``host`` (the host code every rung launches through), ``options`` (PyTorch's options, for
:mod:`losslab.nn`), ``kernelbench`` (KernelBench's file); its kernels are ``kernels/kl_div/``.
"""
from losslab.problems.kl_div.host import KNOWN_DTYPES, backward, empty_state, forward, validate_inputs
from losslab.problems.kl_div.options import (
    MAX_PARTIALS,
    REDUCTIONS,
    options_backward,
    options_cost,
    options_divisor,
    options_forward,
)
from losslab.problems.kl_div.problem import PROBLEM, KLDiv

__all__ = ["KNOWN_DTYPES", "MAX_PARTIALS", "PROBLEM", "REDUCTIONS", "KLDiv", "backward", "empty_state", "forward",
           "options_backward", "options_cost", "options_divisor", "options_forward", "validate_inputs"]
