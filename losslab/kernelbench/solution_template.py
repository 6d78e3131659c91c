"""losslab kernels as a single-file KernelBench solution.

    python -m losslab export PROBLEM RUNG > solution.py
    python -m losslab evaluate solution.py --problem PROBLEM

Model is the PyTorch reference, get_inputs()/get_init_inputs() give KernelBench's inputs, and ModelNew computes the
same 0-d loss with the kernels of one rung of losslab's ladder, built with torch.utils.cpp_extension.load_inline on
the first ModelNew() (CUDA_HOME must name the CUDA toolkit; set TORCH_CUDA_ARCH_LIST to build for other GPUs than
the visible one). ModelNew supports autograd: loss.backward() runs the rung's backward kernels.
This file is the template `losslab export` fills in (export.export_solution); as it stands it builds nothing.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence  # noqa: F401  (the host code's annotations)

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

# The blocks below are replaced in this order, so they keep it.
# isort: off
# >>> reference: the problem's KernelBench file (losslab/problems/<problem>/kernelbench.py)
from losslab.problems.kl_div.kernelbench import Model, batch_size, get_init_inputs, get_inputs  # noqa: F401

# <<< reference
# >>> host: losslab's input checks and launch path (losslab/validation.py, losslab/problems/launch.py)
# and the problem's host functions (validate_inputs, forward, backward in losslab/problems/<problem>/host.py)
from losslab.problems.kl_div import backward, forward, validate_inputs

# <<< host
# isort: on

PROBLEM = "kl_div"  # export: the problem's name
RUNG = "vectorized"  # export: the rung's name
WRITES_GRAD_IN_FORWARD = False  # export: the rung table's writes_grad_in_forward
DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # export: the dtypes the rung takes
EXTENSION_NAME = "losslab_solution"  # export: one name per problem and rung (torch's build cache)
CUDA_SOURCE = ""  # export: the rung's .cu, the problem's other stages and kernels/common, headers inlined
CPP_SOURCE = ""  # export: losslab/build/csrc/<problem>.cpp and bind.h, binding this rung only

_extension = None


def extension():
    """Build (once per process; torch caches the build on disk) and import the kernels."""
    global _extension
    if _extension is None:
        _extension = load_inline(name=EXTENSION_NAME, cpp_sources=[CPP_SOURCE], cuda_sources=[CUDA_SOURCE],
                                 extra_cuda_cflags=["-O3", "-std=c++17"], no_implicit_headers=True)
    return _extension


class LossFunction(torch.autograd.Function):
    """The rung's forward and backward launchers, as losslab's own autograd glue runs them."""

    @staticmethod
    def forward(ctx, *inputs):
        loss, saved = forward(getattr(extension(), f"{RUNG}_forward"), WRITES_GRAD_IN_FORWARD, *inputs)
        ctx.save_for_backward(*saved)
        ctx.backward_calls = 0
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        if WRITES_GRAD_IN_FORWARD and ctx.backward_calls:
            raise RuntimeError(f"{PROBLEM} {RUNG}: backward can run once per forward (it scales in place)")
        ctx.backward_calls += 1
        grad = backward(getattr(extension(), f"{RUNG}_backward"), WRITES_GRAD_IN_FORWARD, ctx.saved_tensors,
                        grad_loss)
        return (grad,) + (None,) * (len(ctx.needs_input_grad) - 1)


class ModelNew(nn.Module):
    """Model's loss computed by the rung's kernels: the same signature, the same 0-d output."""

    def __init__(self, *init_inputs):
        super().__init__()
        if list(init_inputs) not in ([], get_init_inputs()):  # KernelBench passes get_init_inputs()
            raise ValueError(f"ModelNew: the kernels compute Model({', '.join(map(repr, get_init_inputs()))}), "
                             f"got {init_inputs}")
        extension()  # build now, not inside the first timed call

    def forward(self, *inputs):  # the reference's arguments, e.g. (predictions, targets)
        validate_inputs(*inputs)
        if inputs[0].dtype not in DTYPES:
            raise TypeError(f"{PROBLEM} {RUNG} takes dtype {DTYPES}, got {inputs[0].dtype}")
        return LossFunction.apply(*inputs)
