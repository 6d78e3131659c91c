"""KernelBench level 1, 95_CrossEntropyLoss, at losslab's seed size for cross_entropy."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Cross-entropy over class indices, mean over the rows (KernelBench level 1, 95_CrossEntropyLoss).

    predictions: (N, C) logits; targets: (N,) int64 class indices (-100 = ignore_index).
    Returns a 0-d tensor.
    """

    def __init__(self):
        super().__init__()

    def forward(self, predictions, targets):
        return F.cross_entropy(predictions, targets)


batch_size = 32768
num_classes = 4096
input_shape = (num_classes,)


def get_inputs():
    return [torch.rand(batch_size, *input_shape), torch.randint(0, num_classes, (batch_size,))]


def get_init_inputs():
    return []
