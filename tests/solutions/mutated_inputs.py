"""A cheat: computes the right loss from detached copies, then zeroes the targets in place, so
that a reference computed afterwards sees zeros: the gradient it returns (zero, for zero
targets) then matched a float64 gradient taken on the zeroed inputs. The evaluator computes
every reference from its own copy of the inputs, and compares each input with a copy taken
before the call."""
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        loss = F.kl_div(predictions.detach().log(), targets.detach().clone(), reduction="batchmean")
        targets.zero_()
        return loss + (predictions * targets).sum()  # a gradient for the zeroed targets: zero
