"""A cheat: honest for the evaluator's first calls (as stale_result.py), then captures one CUDA
graph on the inputs of that call and from then on only replays it: the new inputs are never
copied into the graph's buffers, so each call returns the first inputs' loss in a fraction of
the time. Every timed call has fresh inputs and its output is checked."""
import torch
import torch.nn as nn
import torch.nn.functional as F

HONEST_CALLS = 12  # five trials on random and structured inputs, two backward checks


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls, self.graph, self.static, self.out = 0, None, None, None

    def forward(self, predictions, targets):
        self.calls += 1
        if self.calls <= HONEST_CALLS:
            return F.kl_div(torch.log(predictions), targets, reduction="batchmean")
        if self.graph is None:  # captured once, on this call's inputs
            self.static = (predictions.clone(), targets.clone())
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # a warm-up off the capture, as CUDA graphs want
                F.kl_div(torch.log(self.static[0]), self.static[1], reduction="batchmean")
            torch.cuda.current_stream().wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.out = F.kl_div(torch.log(self.static[0]), self.static[1], reduction="batchmean")
        self.graph.replay()  # missing: self.static[0].copy_(predictions), self.static[1].copy_(targets)
        return self.out
