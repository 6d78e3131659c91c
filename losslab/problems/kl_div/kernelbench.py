"""KernelBench level 1, 98_KLDivLoss, at losslab's seed size for kl_div."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """KL divergence with reduction="batchmean" (KernelBench level 1, 98_KLDivLoss).

    predictions, targets: (B, D) probability rows. Returns a 0-d tensor: the sum over all
    elements of t * (log t - log p), divided by B (not B * D).
    """

    def __init__(self):
        super().__init__()

    def forward(self, predictions, targets):
        return F.kl_div(torch.log(predictions), targets, reduction="batchmean")


batch_size = 16384
input_shape = (16384,)


def get_inputs():
    scale = torch.rand(())
    return [(torch.rand(batch_size, *input_shape) * scale).softmax(dim=-1),
            torch.rand(batch_size, *input_shape).softmax(dim=-1)]


def get_init_inputs():
    return []
