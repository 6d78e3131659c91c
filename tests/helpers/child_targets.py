"""Targets for the child-process tests (tests/test_isolated.py): each misbehaves in one way."""
import os
import time


def answer(x):
    return {"twice": 2 * x}


def hang():
    time.sleep(3600)


def abort():
    os.abort()


def raise_value_error():
    raise ValueError("targets: a bad value")


def raise_cuda_error():
    raise RuntimeError("CUDA error: misaligned address\nCompile with TORCH_USE_CUDA_DSA for device-side assertions.")


def not_json():
    return object()


def cuda_index_out_of_range():
    """A real device-side fault: a gather past the end of a CUDA tensor (then a sync to see it)."""
    import torch

    values = torch.zeros(2, device="cuda")
    out = values[torch.tensor([5], device="cuda")]
    torch.cuda.synchronize()
    return out.tolist()
