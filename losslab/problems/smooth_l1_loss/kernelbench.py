"""KernelBench level 1, 96_HuberLoss, at losslab's seed size for smooth_l1_loss (KernelBench's inputs:
Pareto(0.01, 1.5) samples, the predictions scaled by a random scalar)."""
import torch
import torch.nn as nn
from torch.distributions import Pareto


class Model(nn.Module):
    """Smooth L1 (Huber) loss, beta 1, mean (KernelBench level 1, 96_HuberLoss).

    predictions, targets: (B, D) of one shape. Returns a 0-d tensor.
    """

    def __init__(self):
        super().__init__()

    def forward(self, predictions, targets):
        return torch.nn.functional.smooth_l1_loss(predictions, targets)


batch_size = 32768
input_shape = (32768,)
dim = 1


def get_inputs():
    scale = torch.rand(())
    predictions = Pareto(0.01, 1.5).sample((batch_size, *input_shape))
    targets = Pareto(0.01, 1.5).sample((batch_size, *input_shape))
    return [predictions * scale, targets]


def get_init_inputs():
    return []
