"""A cheat: computes a float32 problem in bfloat16 (half the bytes to read, in a real kernel)
and returns float32. Its error against float64, about 1e-3, is what bfloat16 reaches, not
float32: far outside what an honest float32 kernel reaches."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        half = predictions.bfloat16(), targets.bfloat16()
        return F.kl_div(torch.log(half[0]), half[1], reduction="batchmean").float()
