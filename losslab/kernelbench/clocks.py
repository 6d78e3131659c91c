"""How a forward is timed: CUDA events on the caller's stream and the host clock around a
device-wide synchronisation, with L2 flushed, each call on fresh inputs made untimed.

The clocks, events and synchronisation are bound when this module is imported, which the child
does before any solution code runs: a solution that patches them later cannot change a
measurement. The parent times eager and torch.compile with the same functions.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from losslab.kernelbench.verdict import ALLCLOSE_TOL

# Bound before any solution code runs: a solution that patches these later cannot change a measurement.
perf_counter = time.perf_counter
synchronize = torch.cuda.synchronize
Event = torch.cuda.Event
record = torch.cuda.Event.record
elapsed_time = torch.cuda.Event.elapsed_time

WARMUP_MS = 50.0  # warm-up calls run at least this long (and at least 3), as Triton's do_bench does


def timed_call(forward: Callable, inputs: tuple, flush: torch.Tensor) -> tuple[float, float, object]:
    """One call of ``forward(*inputs)`` with L2 flushed and the device idle before it.

    Returns (event_ms, wall_ms, output): CUDA events on the caller's stream around the call, and
    the host clock around the call plus a device-wide synchronisation (which waits for every
    stream). Both clocks were bound before the solution loaded.
    """
    flush.zero_()  # evicts the inputs from L2
    synchronize()
    start, end = Event(enable_timing=True), Event(enable_timing=True)
    began = perf_counter()
    record(start)
    output = forward(*inputs)
    record(end)
    synchronize()
    wall_ms = (perf_counter() - began) * 1e3
    return elapsed_time(start, end), wall_ms, output


def time_forward(forward: Callable, make_inputs: Callable[[int], tuple], seeds: list[int], flush: torch.Tensor,
                 reference: Callable | None = None) -> dict:
    """Time ``forward`` once per seed, each call on fresh inputs ``make_inputs(seed)`` made untimed.

    After warm-up calls (at least WARMUP_MS and 3 calls, on the first seed's inputs), each timed
    call runs through :func:`timed_call`. Returns {"event_ms": [...], "wall_ms": [...],
    "mismatched": [indices of timed calls whose output differs from ``reference`` on the same
    inputs, beyond ALLCLOSE_TOL]} (no check without ``reference``).
    """
    inputs = make_inputs(seeds[0])
    began, calls = perf_counter(), 0
    while calls < 3 or (perf_counter() - began) * 1e3 < WARMUP_MS:
        forward(*inputs)
        calls += 1
    synchronize()
    times: dict = {"event_ms": [], "wall_ms": [], "mismatched": []}
    pairs = []
    for seed in seeds:
        inputs = make_inputs(seed)
        expected = reference(*inputs) if reference else None
        event_ms, wall_ms, output = timed_call(forward, inputs, flush)
        times["event_ms"].append(event_ms)
        times["wall_ms"].append(wall_ms)
        if reference:  # a copy: a solution may rightly write every answer into one buffer
            pairs.append((output.detach().clone() if isinstance(output, torch.Tensor) else output, expected))
    if reference:
        times["mismatched"] = [i for i, (got, want) in enumerate(pairs) if not matches(got, want)]
    return times


def back_to_back(forward: Callable, inputs: tuple, calls: int) -> None:
    """``calls`` calls of ``forward(*inputs)``, each followed by a device-wide synchronisation,
    no flush and no clock: the parent's clock brackets them (``verdict.parent_clock``)."""
    for _ in range(calls):
        forward(*inputs)
        synchronize()


def sync_overhead_ms(flush: torch.Tensor, calls: int = 20) -> float:
    """Median host-clock cost of an empty timed call: what the wall clock adds to any call."""
    small = flush[:1]
    return statistics.median(timed_call(lambda: None, (), small)[1] for _ in range(calls))


def summarize(times: dict, overhead_ms: float) -> dict:
    """Medians and p10/p90 (ms) of one implementation's timed calls. Each call's judged time is the
    larger of its event time and its wall time less ``overhead_ms``: the device-wide time."""
    judged = sorted(max(e, w - overhead_ms) for e, w in zip(times["event_ms"], times["wall_ms"], strict=True))
    quantile = lambda q: judged[min(len(judged) - 1, round(q * (len(judged) - 1)))]  # noqa: E731
    return {"ms": statistics.median(judged), "p10_ms": quantile(0.1), "p90_ms": quantile(0.9),
            "event_ms": statistics.median(times["event_ms"]), "wall_ms": statistics.median(times["wall_ms"])}


def matches(got: object, expected: torch.Tensor) -> bool:
    """``got`` is a tensor of ``expected``'s shape, allclose at KernelBench's tolerance for its dtype."""
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
        return False
    tol = ALLCLOSE_TOL.get(expected.dtype, 1e-4)
    return bool(torch.allclose(got.detach().to(expected.dtype), expected, atol=tol, rtol=tol))
