"""The peers every variant is timed against, in the same process on the same inputs:
PyTorch eager (the problem's reference), ``torch.compile`` of it, and Liger-Kernel's op
where Liger-Kernel is installed (it is optional).

Each peer is a callable with the reference's signature, e.g. ``(predictions, targets) -> loss``.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from losslab import problems

PEERS = ("eager", "compile", "liger")  # liger only where Liger-Kernel is importable


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


def liger_peer(problem: str) -> Callable | None:
    """Liger-Kernel's op for ``problem`` with the reference's signature, or None when
    Liger-Kernel is not installed or has no such op.

    Its kl_div takes log-probabilities, so the peer includes the ``torch.log`` of the
    predictions that a caller with probabilities has to pay for.
    """
    try:
        from liger_kernel.transformers.functional import liger_cross_entropy, liger_kl_div
    except ImportError:
        return None
    ops = {
        "kl_div": lambda p, t: liger_kl_div(torch.log(p), t, reduction="batchmean"),
        "cross_entropy": lambda x, y: liger_cross_entropy(x, y),
    }
    return ops.get(problem)


def peer_implementations(problem: str, peers=PEERS) -> dict[str, Callable]:
    """name -> callable for each of ``peers`` available here (Liger left out when not installed)."""
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
        elif (liger := liger_peer(problem)) is not None:
            impls[name] = liger
    return impls
