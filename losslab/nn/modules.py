"""``KLDivLoss`` and ``CrossEntropyLoss`` with ``torch.nn``'s constructors, computed by
:mod:`losslab.nn.functional` (see there for which kernels run and what differs)."""
from __future__ import annotations

import torch
from torch.nn.modules.loss import _Loss, _WeightedLoss

from losslab.linear_cross_entropy import LinearCrossEntropyLoss  # noqa: F401  (PyTorch 2.13's, chunked)
from losslab.nn import functional
from losslab.problems.cosine_similarity_loss.modules import CosineSimilarity  # noqa: F401
from losslab.problems.hinge_loss.functional import HingeLoss  # noqa: F401  (losslab's own: PyTorch has none)
from losslab.problems.mse_loss.functional import MSELoss  # noqa: F401  (torch.nn.MSELoss)
from losslab.problems.smooth_l1_loss.functional import HuberLoss, SmoothL1Loss  # noqa: F401  (torch.nn's)
from losslab.problems.triplet_margin_loss.functional import TripletMarginLoss  # noqa: F401  (its package's)


class KLDivLoss(_Loss):
    """``torch.nn.KLDivLoss``: ``forward(input, target)`` is :func:`functional.kl_div`; ``input`` holds
    log-probabilities, as PyTorch's does (``log_input=False``, losslab's: probabilities, their log taken
    in the kernel)."""

    __constants__ = ["reduction"]

    def __init__(self, size_average=None, reduce=None, reduction: str = "mean", log_target: bool = False,
                 log_input: bool = True) -> None:
        super().__init__(size_average, reduce, reduction)
        self.log_target, self.log_input = log_target, log_input

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return functional.kl_div(input, target, reduction=self.reduction, log_target=self.log_target,
                                 log_input=self.log_input)


class CrossEntropyLoss(_WeightedLoss):
    """``torch.nn.CrossEntropyLoss``: ``forward(input, target)`` is :func:`functional.cross_entropy`
    (``weight`` is a buffer, as in PyTorch)."""

    __constants__ = ["ignore_index", "reduction", "label_smoothing"]

    def __init__(self, weight: torch.Tensor | None = None, size_average=None, ignore_index: int = -100,
                 reduce=None, reduction: str = "mean", label_smoothing: float = 0.0) -> None:
        super().__init__(weight, size_average, reduce, reduction)
        self.ignore_index = ignore_index
        self.label_smoothing = label_smoothing

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return functional.cross_entropy(input, target, weight=self.weight, ignore_index=self.ignore_index,
                                        reduction=self.reduction, label_smoothing=self.label_smoothing)
