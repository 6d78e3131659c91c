"""A cheat: divides every time the evaluator's child measures by ten (it wraps the child's
timed_call) and hides that from the child's tampering check. The child's clocks then say
10x faster; the evaluator's own clock around the same calls does not."""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

evaluator = sys.modules["__main__"]  # the evaluator's child runs as a script
if hasattr(evaluator, "timed_call"):
    honest = evaluator.timed_call

    def faster(forward, inputs, flush):
        event_ms, wall_ms, output = honest(forward, inputs, flush)
        return event_ms / 10, wall_ms / 10, output

    evaluator.timed_call = faster
    evaluator.replaced = lambda before, spec: []


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        return F.kl_div(torch.log(predictions), targets, reduction="batchmean")
