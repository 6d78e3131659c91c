"""The cosine-similarity loss (KernelBench level 1, problem 97, its first release).

    loss = sum_i [ 1 - cos(p_i, t_i) ] / B,  cos = p.t / (max(|p|, eps) max(|t|, eps)),  eps = 1e-8
    dloss/dp_i = -grad_loss / B * ( t_i / (a b) - cos * p_i / (a |p_i|) )      (a, b the clamped norms)

``predictions`` p and ``targets`` t are (B, D) rows. Everything about this loss: ``problem`` (the
Problem: reference, inputs, sizes, cost, edge cases, rungs), ``host`` (the host code every rung
launches through), ``functional`` (the public operators, for :mod:`losslab.nn`; not imported here),
``kernelbench`` (KernelBench's file); its kernels are ``kernels/cosine_similarity_loss/``.
"""
from losslab.problems.cosine_similarity_loss.host import (
    EPS,
    KNOWN_DTYPES,
    STATE_NAMES,
    backward,
    empty_state,
    forward,
    validate_inputs,
)
from losslab.problems.cosine_similarity_loss.problem import PROBLEM, CosineSimilarityLoss

__all__ = ["EPS", "KNOWN_DTYPES", "PROBLEM", "STATE_NAMES", "CosineSimilarityLoss", "backward", "empty_state",
           "forward", "validate_inputs"]
