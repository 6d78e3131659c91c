"""The peers every variant is timed against, in the same process on the same inputs:
PyTorch eager (the problem's reference), ``torch.compile`` of it, and two optional libraries
where installed: Liger-Kernel's op and quack's (Dao-AILab's quack-kernels, CuTe-DSL kernels,
on sm_90+); each problem says which of them has its loss (``Problem.liger_op``, ``quack_op``).

Each peer is a callable with the reference's signature, e.g. ``(predictions, targets) -> loss``.
An optional peer that cannot run here is left out, and :func:`missing_peers` says why.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from losslab import problems

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


def liger_peer(problem: problems.Problem) -> tuple[Callable | None, str]:
    """Liger-Kernel's op for ``problem`` (``Problem.liger_op``) with the reference's signature and
    "", or (None, why not): Liger-Kernel not installed, or without that loss."""
    try:
        return problem.liger_op(), ""
    except ImportError:
        return None, "Liger-Kernel not installed"
    except LookupError as err:
        return None, str(err)


def quack_peer(problem: problems.Problem) -> tuple[Callable | None, str]:
    """quack's op for ``problem`` (``Problem.quack_op``) with the reference's signature and "", or
    (None, why not): quack has no such loss, this GPU is older than sm_90, or quack-kernels with
    the CUDA 13 CuTe-DSL libraries is not installed."""
    if type(problem).quack_op is problems.Problem.quack_op:
        has = [p.name for p in problems.registered() if type(p).quack_op is not problems.Problem.quack_op]
        return None, f"quack-kernels has no {problem.name} (of the losses here it has {', '.join(has) or 'none'} only)"
    try:
        return problem.quack_op(), ""
    except ImportError:
        return None, QUACK_NOT_INSTALLED
    except LookupError as err:
        return None, str(err)


OPTIONAL_PEERS = {"liger": liger_peer, "quack": quack_peer}


def missing_peers(problem: problems.Problem, peers=PEERS) -> dict[str, str]:
    """name -> why it is not timed here, for each of ``peers`` that cannot run for ``problem``
    (an optional library not installed, no such op, an older GPU); {} when all can."""
    return {name: why for name in check_peer_names(peers) if name in OPTIONAL_PEERS
            and (why := OPTIONAL_PEERS[name](problem)[1])}


def peer_implementations(problem: problems.Problem, peers=PEERS) -> dict[str, Callable]:
    """name -> callable for each of ``peers`` available here (see :func:`missing_peers` for the others)."""
    impls = {}
    for name in check_peer_names(peers):
        if name == "eager":
            impls[name] = problem.reference
        elif name == "compile":
            # compiled for this call's shapes, as a user with fixed shapes gets it: without the reset,
            # dynamo would recompile the reference with dynamic shapes after the first size of a sweep
            torch._dynamo.reset()
            impls[name] = torch.compile(problem.reference, dynamic=False)
        elif (fn := OPTIONAL_PEERS[name](problem)[0]) is not None:
            impls[name] = fn
    return impls
