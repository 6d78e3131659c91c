"""KernelBench level 1, 94_MSELoss, at losslab's seed size for mse_loss (KernelBench's inputs:
Pareto(0.01, 1.5) samples, heavy-tailed)."""
import torch
import torch.nn as nn
from torch.distributions import Pareto


class Model(nn.Module):
    """The mean squared error (KernelBench level 1, 94_MSELoss).

    predictions, targets: (B, D) of one shape. Returns a 0-d tensor: the mean over all
    B * D elements of (predictions - targets) ** 2.
    """

    def __init__(self):
        super().__init__()

    def forward(self, predictions, targets):
        return torch.mean((predictions - targets) ** 2)


batch_size = 32768
input_shape = (32768,)
dim = 1


def get_inputs():
    predictions = Pareto(0.01, 1.5).sample((batch_size, *input_shape))
    targets = Pareto(0.01, 1.5).sample((batch_size, *input_shape))
    return [predictions, targets]


def get_init_inputs():
    return []
