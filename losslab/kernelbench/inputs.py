"""The inputs an evaluation draws, each from a seed: the problem's own random inputs
(``problem.make_inputs``, what KernelBench's ``get_inputs`` draws) and structured ones.

Random inputs are uniform: every row carries about the same share of the loss, so an answer
that computes the loss from a sample of the rows is off by little more than the sampling
noise. Structured inputs (``Problem.structured_inputs``) put the rows on very different scales and give
a few rows, at positions drawn fresh each time, most of the loss: skipping rows is then off by
a large fraction. Both the parent and the child of an evaluation make the same inputs from
the same seed (same generator, same device type), so no tensor needs to travel between them.
"""
from __future__ import annotations

import torch

from losslab import problems

KINDS = ("random", "structured")
HEAVY_EVERY = problems.HEAVY_EVERY  # about one row in this many carries most of a structured input's loss


def make(problem: problems.Problem, shape: tuple[int, int], seed: int, kind: str, device: str | torch.device,
         dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """The inputs of ``problem`` at ``shape`` drawn from ``seed``: ``kind`` "random" (the
    problem's own, ``Problem.make_inputs``) or "structured" (``Problem.structured_inputs``).

    Raises:
        ValueError: an unknown kind.
        NotImplementedError: a problem without structured inputs.
    """
    if kind == "random":
        return problem.make_inputs(tuple(shape), seed=seed, device=device, dtype=dtype)
    if kind != "structured":
        raise ValueError(f"kind: expected one of {', '.join(KINDS)}, got {kind!r}")
    return problem.structured_inputs(tuple(shape), seed=seed, device=device, dtype=dtype)
