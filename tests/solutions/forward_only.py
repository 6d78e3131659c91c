"""Correct, forward only: the loss comes back detached (as from a kernel without a backward).
It passes as forward only: no speedup is claimed for training."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        with torch.no_grad():
            return F.kl_div(torch.log(predictions), targets, reduction="batchmean")
