"""The peers every variant is timed against, in the same process on the same inputs:
PyTorch eager (the problem's reference), ``torch.compile`` of it, and two optional libraries
where installed: Liger-Kernel's op and quack's (Dao-AILab's quack-kernels, CuTe-DSL kernels;
cross_entropy only, on sm_90+).

Each peer is a callable with the reference's signature, e.g. ``(predictions, targets) -> loss``.
An optional peer that cannot run here is left out, and :func:`missing_peers` says why.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from losslab import problems
from losslab.problems.cross_entropy import IGNORE_INDEX

PEERS = ("eager", "compile", "liger", "quack")  # liger and quack only where they can run (missing_peers)
QUACK_NOT_INSTALLED = "quack-kernels not installed (needs sm_90+ and CUDA 13 libraries)"


def check_peer_names(peers) -> tuple[str, ...]:
    """``peers`` as a tuple, each one of :data:`PEERS`.

    Raises:
        ValueError: an unknown peer (the message names the allowed ones).
    """
    peers = (peers,) if isinstance(peers, str) else tuple(peers)
    for name in peers:
        if name not in PEERS:
            raise ValueError(f"peers: unknown peer {name!r}; expected some of {', '.join(PEERS)}")
    return peers


def liger_peer(problem: str) -> tuple[Callable | None, str]:
    """Liger-Kernel's op for ``problem`` with the reference's signature and "", or (None, why
    not) when Liger-Kernel is not installed.

    Its kl_div takes log-probabilities, so the peer includes the ``torch.log`` of the
    predictions that a caller with probabilities has to pay for.
    """
    try:
        from liger_kernel.transformers.functional import liger_cross_entropy, liger_kl_div
    except ImportError:
        return None, "Liger-Kernel not installed"
    ops = {
        "kl_div": lambda p, t: liger_kl_div(torch.log(p), t, reduction="batchmean"),
        "cross_entropy": lambda x, y: liger_cross_entropy(x, y),
    }
    return ops[problem], ""


def quack_peer(problem: str) -> tuple[Callable | None, str]:
    """quack's ``cross_entropy`` with the reference's signature and "", or (None, why not): quack
    has no kl_div; it needs sm_90+ and quack-kernels with the CUDA 13 CuTe-DSL libraries.

    The call is the one a user makes, ``quack.cross_entropy(logits, targets)`` with mean reduction
    and ignore_index -100 (logits (B, C) float32/bfloat16/float16, targets (B,) int64). Its kernel
    writes one float32 loss per row (and the log-sum-exp the backward kernel reads); the mean is then
    taken in PyTorch ops, a sum of those losses over a count of the targets that are not
    ignore_index (NaN when every row is ignored, as in PyTorch): launches a user pays for too. The
    loss is float32 whatever the logits' dtype; the gradient is written to a new tensor (not in place).
    """
    if problem != "cross_entropy":
        return None, f"quack-kernels has no {problem} (of the losses here it has cross_entropy only)"
    if torch.cuda.is_available() and torch.cuda.get_device_capability() < (9, 0):
        major, minor = torch.cuda.get_device_capability()
        return None, f"quack-kernels needs sm_90+ (Hopper or newer); this GPU is sm_{major}{minor}"
    try:
        from quack import cross_entropy
    except ImportError:
        return None, QUACK_NOT_INSTALLED
    return (lambda x, y: cross_entropy(x, y, ignore_index=IGNORE_INDEX, reduction="mean")), ""


OPTIONAL_PEERS = {"liger": liger_peer, "quack": quack_peer}


def missing_peers(problem: str, peers=PEERS) -> dict[str, str]:
    """name -> why it is not timed here, for each of ``peers`` that cannot run for ``problem``
    (an optional library not installed, no such op, an older GPU); {} when all can."""
    problems.get(problem)
    return {name: why for name in check_peer_names(peers) if name in OPTIONAL_PEERS
            and (why := OPTIONAL_PEERS[name](problem)[1])}


def peer_implementations(problem: str, peers=PEERS) -> dict[str, Callable]:
    """name -> callable for each of ``peers`` available here (see :func:`missing_peers` for the others)."""
    spec = problems.get(problem)
    impls = {}
    for name in check_peer_names(peers):
        if name == "eager":
            impls[name] = spec.reference
        elif name == "compile":
            # compiled for this call's shapes, as a user with fixed shapes gets it: without the reset,
            # dynamo would recompile the reference with dynamic shapes after the first size of a sweep
            torch._dynamo.reset()
            impls[name] = torch.compile(spec.reference, dynamic=False)
        elif (fn := OPTIONAL_PEERS[name](problem)[0]) is not None:
            impls[name] = fn
    return impls
