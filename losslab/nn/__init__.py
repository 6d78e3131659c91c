"""losslab's losses as drop-in PyTorch functions and modules: ``losslab.nn.functional.kl_div`` /
``cross_entropy`` and ``losslab.nn.KLDivLoss`` / ``CrossEntropyLoss``, with PyTorch's signatures
and options, on the vectorized and fused kernels, and cross_entropy's canonical case on the cluster
rung's (see :mod:`losslab.nn.functional`); ``linear_cross_entropy`` / ``LinearCrossEntropyLoss`` from
:mod:`losslab.linear_cross_entropy`."""
from losslab.nn import functional
from losslab.nn.modules import (
    CosineSimilarity,
    CrossEntropyLoss,
    HingeLoss,
    HuberLoss,
    KLDivLoss,
    LinearCrossEntropyLoss,
    MSELoss,
    SmoothL1Loss,
    TripletMarginLoss,
)

__all__ = ["CosineSimilarity", "CrossEntropyLoss", "HingeLoss", "HuberLoss", "KLDivLoss", "LinearCrossEntropyLoss",
           "MSELoss", "SmoothL1Loss", "TripletMarginLoss", "functional"]
