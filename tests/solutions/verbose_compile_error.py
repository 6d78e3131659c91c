"""Broken on purpose: a KernelBench-style solution that builds with load_inline(verbose=True)
and uses an undeclared name in its launch (line 18 of this file). With verbose=True the
compiler's output goes to stdout, not into the exception; the evaluator captures it."""
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CUDA_SOURCE = r"""
#include <torch/extension.h>

__global__ void kl_div_terms(const float* p, const float* t, float* out, long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n && t[i] > 0.0f) atomicAdd(out, t[i] * (logf(t[i]) - logf(p[i])));
}

torch::Tensor kl_div_forward(torch::Tensor p, torch::Tensor t) {
    auto out = torch::zeros({}, p.options());
    long n = p.numel();
    kl_div_terms<<<(n + 255) / 256, 256>>>(p.data_ptr<float>(), t.data_ptr<float>(), out.data_ptr<float>(), numel);
    return out / p.size(0);
}
"""
CPP_SOURCE = "torch::Tensor kl_div_forward(torch::Tensor p, torch::Tensor t);"

kl_div = load_inline(name="kl_div", cpp_sources=CPP_SOURCE, cuda_sources=CUDA_SOURCE,
                     functions=["kl_div_forward"], verbose=True)


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        return kl_div.kl_div_forward(predictions, targets)
