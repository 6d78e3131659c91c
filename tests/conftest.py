"""Test tiers (DESIGN.md): unmarked tests are the cpu tier and run everywhere;
`compile` needs nvcc, `gpu` needs a CUDA device. A tier whose tool is missing
is skipped with a reason that says so (shown by `pytest -rs`)."""
import os
import shutil

import pytest
import torch


def _skip_reasons() -> dict[str, str]:
    reasons = {}
    if not torch.cuda.is_available():
        reasons["gpu"] = ("gpu tier skipped: no CUDA GPU visible here "
                          f"(torch {torch.__version__}, torch.cuda.is_available() is False)")
    if not (shutil.which("nvcc") or os.environ.get("CUDA_HOME")):
        reasons["compile"] = "compile tier skipped: nvcc is not on PATH and CUDA_HOME is unset"
    elif torch.version.cuda is None:
        reasons["compile"] = f"compile tier skipped: torch {torch.__version__} is a CPU-only build"
    return reasons


def pytest_collection_modifyitems(config, items):
    reasons = _skip_reasons()
    for item in items:
        for tier, reason in reasons.items():
            if tier in item.keywords:
                item.add_marker(pytest.mark.skip(reason=reason))
