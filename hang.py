# problem: kl_div
import torch.nn as nn

class ModelNew(nn.Module):
    def forward(self, p, t):
        while True: pass
