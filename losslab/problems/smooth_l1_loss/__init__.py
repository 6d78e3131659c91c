"""The smooth L1 (Huber) loss, beta 1, reduction mean (KernelBench level 1, problem 96).

    loss = sum_ij smooth_l1(p_ij - t_ij) / (B D),  smooth_l1(d) = |d| < 1 ? d^2 / 2 : |d| - 1/2
    dloss/dp_ij = clamp(p_ij - t_ij, -1, 1) / (B D) * grad_loss

Everything about this loss: ``problem`` (reference, inputs, sizes, cost, edge cases, rungs), ``host``
(the rungs' host code), ``options`` (PyTorch's beta, delta and reductions), ``functional``
(``F.smooth_l1_loss``, ``F.huber_loss`` and their modules; not imported here: it imports losslab.ops),
``kernelbench`` (KernelBench's file); its kernels are ``kernels/smooth_l1_loss/``.
"""
from losslab.problems.smooth_l1_loss.host import (
    KNOWN_DTYPES,
    MAX_PARTIALS,
    backward,
    empty_state,
    forward,
    validate_inputs,
)
from losslab.problems.smooth_l1_loss.options import (
    REDUCTIONS,
    options_backward,
    options_cost,
    options_divisor,
    options_forward,
)
from losslab.problems.smooth_l1_loss.problem import PROBLEM, SmoothL1

__all__ = ["KNOWN_DTYPES", "MAX_PARTIALS", "PROBLEM", "REDUCTIONS", "SmoothL1", "backward", "empty_state",
           "forward", "options_backward", "options_cost", "options_divisor", "options_forward", "validate_inputs"]
