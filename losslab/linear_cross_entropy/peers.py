"""What the benchmark times, each as ``fn(input, linear_weight, target) -> 0-d loss`` (mean, ignore_index
-100) run forward and backward on the same inputs: the three cuBLAS GEMMs alone (the time floor),
eager PyTorch, torch.compile, Liger-Kernel's fused linear cross-entropy, cut-cross-entropy (default
and exact), PyTorch's own (2.13+) and losslab's; an optional one that cannot run here says why."""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from losslab.linear_cross_entropy.functional import linear_cross_entropy
from losslab.linear_cross_entropy.options import Options

GIB = 2**30
LABELS = {  # peer -> the table's column, in the table's order (losslab last)
    "gemms": "3 cuBLAS GEMMs alone",
    "eager": "eager",
    "compile": "torch.compile",
    "liger": "Liger FLCE",
    "cce": "CCE (default, filtered grads)",
    "cce_exact": "CCE exact",
    "torch": "PyTorch F.linear_cross_entropy",
    "losslab_1gib": "losslab (1 GiB chunks)",
    "losslab_wide": "losslab (float32 weight-gradient accumulator)",
    "losslab": "losslab",
}


def gemms(input: torch.Tensor, linear_weight: torch.Tensor, target: torch.Tensor) -> None:
    """The three GEMMs of the head and nothing else (6 * N * H * V flops): logits = X W^T, then
    dX = G W and dW = G^T X with the logits standing in for G. Not a loss: no backward to run."""
    x, w = input.detach(), linear_weight.detach()
    logits = torch.mm(x, w.t())
    torch.mm(logits, w)
    torch.mm(logits.t(), x)


def eager(input: torch.Tensor, linear_weight: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``F.cross_entropy(F.linear(input, W).float(), target)``: logits upcast to float32 before the loss,
    as Hugging Face's causal language models do (the issue's eager)."""
    return F.cross_entropy(F.linear(input, linear_weight).float(), target)


def peers() -> tuple[dict[str, Callable], dict[str, str]]:
    """(name -> fn for each peer that can run here, name -> why not for the others), names of :data:`LABELS`.
    ``compile`` is compiled for each new shape at its first call (the caller resets dynamo per shape)."""
    found: dict[str, Callable] = {"gemms": gemms, "eager": eager, "compile": torch.compile(eager)}
    missing: dict[str, str] = {}
    try:
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

        liger = LigerFusedLinearCrossEntropyLoss()
        found["liger"] = lambda x, w, t: liger(w, x, t)
    except ImportError as err:
        missing["liger"] = f"Liger-Kernel not installed ({err})"
    try:
        from cut_cross_entropy import linear_cross_entropy as cce

        found["cce"] = lambda x, w, t: cce(x, w, t)
        found["cce_exact"] = lambda x, w, t: cce(x, w, t, filter_eps=None)
    except ImportError as err:
        missing["cce"] = missing["cce_exact"] = f"cut-cross-entropy not installed ({err})"
    if hasattr(F, "linear_cross_entropy") and hasattr(torch.nn, "LinearCrossEntropyOptions"):
        chunked = torch.nn.LinearCrossEntropyOptions()
        found["torch"] = lambda x, w, t: F.linear_cross_entropy(x, w, t, options=chunked)
    else:
        missing["torch"] = f"torch {torch.__version__} has no F.linear_cross_entropy (PyTorch 2.13 and later)"
    big = Options(chunk_bytes=GIB)
    wide = Options(float32_grad_weight=True)
    found["losslab_1gib"] = lambda x, w, t: linear_cross_entropy(x, w, t, options=big)
    found["losslab_wide"] = lambda x, w, t: linear_cross_entropy(x, w, t, options=wide)
    found["losslab"] = linear_cross_entropy
    return found, missing
