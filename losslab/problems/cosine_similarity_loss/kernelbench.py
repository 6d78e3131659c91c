"""KernelBench level 1, 97_CosineSimilarityLoss (its first release; later dropped), at losslab's seed size."""
import torch
import torch.nn as nn


class Model(nn.Module):
    """
    A model that computes Cosine Similarity Loss for comparing vectors.

    Parameters:
        None
    """
    def __init__(self):
        super().__init__()

    def forward(self, predictions, targets):
        cosine_sim = torch.nn.functional.cosine_similarity(predictions, targets, dim=1)
        return torch.mean(1 - cosine_sim)


batch_size = 32768  # KernelBench's first release: 128 (losslab's "small" size is its 128 x 4096)
input_shape = (8192,)  # KernelBench's first release: (4096,)
dim = 1


def get_inputs():
    return [torch.randn(batch_size, *input_shape), torch.randn(batch_size, *input_shape)]


def get_init_inputs():
    return []
