# problem: kl_div
import torch, torch.nn as nn

class ModelNew(nn.Module):
    def forward(self, p, t):
        return (t * (t.log() - p.log())).mean()
