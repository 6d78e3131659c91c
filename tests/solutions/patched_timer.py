"""A cheat: replaces the clocks an evaluator might time it with (CUDA events, the host
clock, device synchronisation) when the file is imported. The evaluator bound its own
clocks before loading the file, and reports the replaced functions as tampering."""
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.cuda.Event.elapsed_time = lambda self, end: 1e-3
time.perf_counter = lambda: 0.0
torch.cuda.synchronize = lambda device=None: None


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        return F.kl_div(torch.log(predictions), targets, reduction="batchmean")
