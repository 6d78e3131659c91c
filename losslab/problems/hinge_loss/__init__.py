"""The hinge loss, mean reduction (KernelBench level 1, problem 100).

    loss = sum_ij max(0, 1 - p_ij * t_j) / (B * D)
    dloss/dp_ij = -(1 - p_ij * t_j > 0) * t_j / (B * D) * grad_loss

``predictions`` p are (B, D); ``targets`` t are (D,) of -1 and +1, broadcast over the rows as the
reference's ``predictions * targets`` does. Everything about this loss: ``problem`` (the Problem:
reference, inputs, sizes, cost, edge cases, rungs), ``host`` (the host code every rung launches
through), ``options`` (losslab.nn's options), ``functional`` (``hinge_loss`` and its operators, imported
by :mod:`losslab.nn.functional`, not here), ``kernelbench`` (KernelBench's file); kernels: ``kernels/hinge_loss/``.
"""
from losslab.problems.hinge_loss.host import KNOWN_DTYPES, MAX_PARTIALS, backward, empty_state, forward, validate_inputs
from losslab.problems.hinge_loss.problem import PROBLEM, Hinge

__all__ = ["KNOWN_DTYPES", "MAX_PARTIALS", "PROBLEM", "Hinge", "backward", "empty_state", "forward",
           "validate_inputs"]
