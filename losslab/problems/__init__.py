"""Loss problems: one package per loss, each defining one :class:`Problem`, and their registry.

A problem bundles what every part of losslab needs to know about a loss: the
PyTorch reference, a seeded input generator, named sizes, the input checks,
the cost model, its rung table (:class:`Rung`: what differs between the rungs
of its kernel ladder) and the host code that launches them (through
:mod:`losslab.problems.launch`, the one guarded launch path). What adding a
loss takes, and the one line of :data:`REGISTRY` it touches here: the recipe
in docs/architecture.md ("How to add ...").
"""
from __future__ import annotations

import importlib

from losslab.problems.base import (
    DIRECTIONS,
    FLOAT32,
    HALF_AND_FLOAT,
    HEAVY_EVERY,
    LADDER,
    Cost,
    Problem,
    Rung,
    misaligned_view,
)

# The registry: one line per loss package, in the order the workbook presents them.
REGISTRY = (
    "kl_div",
    "cross_entropy",
    "hinge_loss",
    "triplet_margin_loss",
    "cosine_similarity_loss",
    "mse_loss",
    "smooth_l1_loss",
)
_PROBLEMS: dict[str, Problem] = {name: importlib.import_module(f"{__name__}.{name}").PROBLEM for name in REGISTRY}

__all__ = ["DIRECTIONS", "FLOAT32", "HALF_AND_FLOAT", "HEAVY_EVERY", "LADDER", "Cost", "Problem", "Rung", "get",
           "misaligned_view", "names", "registered"]


def names() -> tuple[str, ...]:
    """Names of all problems, in the order the workbook presents them."""
    return tuple(_PROBLEMS)


def registered() -> tuple[Problem, ...]:
    """All problems, in the order the workbook presents them."""
    return tuple(_PROBLEMS.values())


def get(name: str | Problem) -> Problem:
    """The problem called ``name`` (a Problem is returned as it is: what a public function that
    takes either calls once). Raises ValueError for an unknown name."""
    if isinstance(name, Problem):
        return name
    problem = _PROBLEMS.get(name)
    if problem is None:
        raise ValueError(f"problem: no problem {name!r}; expected one of {', '.join(_PROBLEMS)}")
    return problem
