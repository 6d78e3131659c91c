"""KernelBench level 1, 100_HingeLoss, at losslab's seed size for hinge_loss."""
import torch
import torch.nn as nn
from torch.distributions import Pareto


class Model(nn.Module):
    """The mean hinge loss for binary classification (KernelBench level 1, 100_HingeLoss).

    predictions: (B, D); targets: (D,) of -1 and +1, broadcast over the rows (targets[j] multiplies
    column j of every row; KernelBench draws batch_size of them, which is D there). Returns a 0-d
    tensor: the mean over all B * D elements of max(0, 1 - predictions * targets).
    """

    def __init__(self):
        super().__init__()

    def forward(self, predictions, targets):
        return torch.mean(torch.clamp(1 - predictions * targets, min=0))


batch_size = 32768
input_shape = (32768,)
dim = 1


def get_inputs():
    predictions = Pareto(0.01, 1.5).sample((batch_size, *input_shape))
    targets = torch.randint(0, 2, (batch_size,)).float() * 2 - 1
    return [predictions, targets]


def get_init_inputs():
    return []
