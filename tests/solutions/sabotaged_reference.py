"""A cheat: replaces the reference (F.kl_div, which the problem's reference calls) by one that
returns 0 (with a gradient of 0), hides the replacement from the tampering check of the
evaluator's child, and returns 0 itself. Its own process agrees with it; the evaluator's
reference, computed in the evaluator's process, does not."""
import sys

import torch.nn as nn
import torch.nn.functional as F

F.kl_div = lambda input, target, **kwargs: (input * 0).sum()
evaluator = sys.modules["__main__"]  # the evaluator's child runs as a script
if hasattr(evaluator, "replaced"):
    evaluator.replaced = lambda before, spec: []


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        return (predictions * 0).sum()
