"""A cheat: computes the loss on a side stream and returns at once, without making the
caller's stream wait. CUDA events on the caller's stream then see almost nothing; the
caller could even read the output before it is written. The evaluator times each call
with a device-wide synchronisation too and reports the difference as hidden work."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.side = torch.cuda.Stream()

    def forward(self, predictions, targets):
        self.side.wait_stream(torch.cuda.current_stream())  # the inputs are ready
        with torch.cuda.stream(self.side):
            return F.kl_div(torch.log(predictions), targets, reduction="batchmean")
        # missing: torch.cuda.current_stream().wait_stream(self.side)
