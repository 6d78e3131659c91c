"""A cheat: remembers its last inputs and answer, and returns the answer again for the same
input objects. It passes every correctness trial (each trial has new inputs) and, timed on
one set of inputs over and over, would look many times faster than it is. The evaluator
gives every timed call fresh inputs, so its time is that of the computation."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.last = None  # (predictions, targets, loss)

    def forward(self, predictions, targets):
        if self.last is not None and self.last[0] is predictions and self.last[1] is targets:
            return self.last[2]
        loss = F.kl_div(torch.log(predictions), targets, reduction="batchmean")
        self.last = (predictions, targets, loss)
        return loss
