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
