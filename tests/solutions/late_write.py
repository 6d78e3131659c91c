"""A cheat: honest for the evaluator's first calls (as stale_result.py), then returns a buffer
at once and writes the loss into it 50 ms later from a thread: a timed call looks almost free,
and an evaluator that reads the outputs only after all the timed calls finds them right. Each
timed call's output is copied and sent back as soon as the call and a device-wide
synchronisation return."""
import threading
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

HONEST_CALLS = 12  # five trials on random and structured inputs, two backward checks


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, predictions, targets):
        self.calls += 1
        if self.calls <= HONEST_CALLS:
            return F.kl_div(torch.log(predictions), targets, reduction="batchmean")
        out = torch.zeros((), device=predictions.device)

        def late():
            time.sleep(0.05)
            with torch.no_grad():
                out.copy_(F.kl_div(torch.log(predictions), targets, reduction="batchmean"))

        threading.Thread(target=late, daemon=True).start()
        return out
