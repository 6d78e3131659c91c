"""``torch.nn.CosineSimilarity`` on this loss's operators (:mod:`.functional`), re-exported by
:mod:`losslab.nn`."""
from __future__ import annotations

import torch
from torch import nn

from losslab.problems.cosine_similarity_loss.functional import EPS, cosine_similarity


class CosineSimilarity(nn.Module):
    """``torch.nn.CosineSimilarity(dim=1, eps=1e-8)``: ``forward(x1, x2)`` is
    :func:`losslab.nn.functional.cosine_similarity` ((B, D) rows, dim 1 or -1; see there)."""

    __constants__ = ["dim", "eps"]

    def __init__(self, dim: int = 1, eps: float = EPS) -> None:
        super().__init__()
        self.dim = dim
        self.eps = eps

    def forward(self, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
        return cosine_similarity(x1, x2, self.dim, self.eps)
