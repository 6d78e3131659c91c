"""The triplet margin loss with PyTorch's defaults (KernelBench level 1, problem 99).

    d(x, y)_i = || x_i - y_i + eps ||_2      (F.pairwise_distance: eps = 1e-6 added to each difference)
    loss = mean_i max(margin + d(a, p)_i - d(a, n)_i, 0)          margin = 1
    dloss/da_i = [u_i / d(a, p)_i - v_i / d(a, n)_i] / N * grad_loss where the row's term is > 0
    (u = a - p + eps, v = a - n + eps; dloss/dp = -u / d(a, p) / N, dloss/dn = v / d(a, n) / N there)

``anchor``, ``positive`` and ``negative`` are (N, D) rows. Everything about this loss: ``problem``,
``host`` (the launches), ``options`` (PyTorch's options, for :mod:`losslab.nn`), ``kernelbench``;
its kernels are ``kernels/triplet_margin_loss/``.
"""
from losslab.problems.triplet_margin_loss.host import KNOWN_DTYPES, backward, empty_state, forward, validate_inputs
from losslab.problems.triplet_margin_loss.options import (
    REDUCTIONS,
    options_backward,
    options_cost,
    options_forward,
)
from losslab.problems.triplet_margin_loss.problem import EPS, MARGIN, PROBLEM, TripletMarginLoss

__all__ = ["EPS", "KNOWN_DTYPES", "MARGIN", "PROBLEM", "REDUCTIONS", "TripletMarginLoss", "backward", "empty_state",
           "forward", "options_backward", "options_cost", "options_forward", "validate_inputs"]
