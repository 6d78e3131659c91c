"""A cheat: honest for the evaluator's first calls (five correctness trials on random and on
structured inputs, and the two backward checks), then returns its last answer whatever the
inputs, so that timed calls do nothing. The evaluator checks the output of every timed call
against the reference on that call's fresh inputs."""
import torch
import torch.nn as nn
import torch.nn.functional as F

HONEST_CALLS = 12  # five trials on random and structured inputs, two backward checks


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls, self.answer = 0, None

    def forward(self, predictions, targets):
        self.calls += 1
        if self.calls <= HONEST_CALLS:
            self.answer = F.kl_div(torch.log(predictions), targets, reduction="batchmean")
            return self.answer
        return self.answer.detach()
