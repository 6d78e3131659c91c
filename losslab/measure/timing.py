"""GPU timing: CUDA events around each call with L2 flushed, back to back, host time, peak memory.

The method is Triton's ``do_bench``'s (:func:`time_cuda` says how each view is measured; the
measurement protocol in ``docs/architecture.md`` says why). This module imports nothing else
from losslab: the kernel-bench child process uses it too.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

FLUSH_BYTES = 256 * 2**20  # > 4x the 50-60 MB L2 of an H100/H200
BACK_TO_BACK_STATES = 8  # calls back to back when each needs its own prepared state (e.g. a graph)


@dataclass
class Timing:
    """Times of one callable in milliseconds.

    ``median_ms``/``p10_ms``/``p90_ms``: GPU time per call, L2 flushed before each (CUDA events);
    ``back_to_back_ms``: GPU time per call over calls queued back to back (None when not
    measured); ``host_ms``: median host time for ``fn()`` to return (None when not measured);
    ``compiles_while_timed``: frames torch.compile compiled and graph breaks it met during the timed
    and back-to-back calls (after the warm-up): a measurement with any timed compilation, not
    the compiled code (``measure.bench`` rejects it). ``times_ms``, ``host_times_ms``: each timed
    call's GPU and host time, for :func:`combine`.
    """

    median_ms: float
    p10_ms: float
    p90_ms: float
    repeats: int
    back_to_back_ms: float | None = None
    host_ms: float | None = None
    compiles_while_timed: int = 0
    times_ms: tuple[float, ...] = ()
    host_times_ms: tuple[float, ...] = ()


def combine(timings: list[Timing]) -> Timing:
    """One Timing of the calls of several (e.g. rounds of one callable, interleaved with others'
    rounds): medians and percentiles over every timed call, the back-to-back time the median of
    the rounds', compilations added up.

    Raises:
        ValueError: no timings, or one without its calls' times.
    """
    if not timings or any(not t.times_ms for t in timings):
        raise ValueError("timings: expected at least one Timing, each with its calls' times (times_ms)")
    together = [t.back_to_back_ms for t in timings if t.back_to_back_ms is not None]
    return _of_calls([x for t in timings for x in t.times_ms], [x for t in timings for x in t.host_times_ms],
                     statistics.median(together) if together else None,
                     sum(t.compiles_while_timed for t in timings))


def _of_calls(times: list[float], host: list[float], together: float | None, compiles: int) -> Timing:
    """The Timing of timed calls: their GPU times and host times (ms), the back-to-back time per
    call and the compilations while they ran."""
    times = sorted(times)
    return Timing(statistics.median(times), _percentile(times, 0.1), _percentile(times, 0.9), len(times),
                  together, statistics.median(host) if host else None, compiles, tuple(times), tuple(host))


def compile_events() -> int:
    """Frames torch.compile has compiled in this process, plus the graph breaks it met (dynamo's
    own counters): a difference across a stretch of calls counts the (re)compilations in it."""
    from torch._dynamo.utils import counters

    return counters["frames"]["total"] + sum(counters["graph_break"].values())


def flush_buffer(nbytes: int = FLUSH_BYTES) -> torch.Tensor:
    """A float32 CUDA buffer of ``nbytes``; ``buffer.zero_()`` evicts earlier data from L2."""
    return torch.empty(nbytes // 4, device="cuda")


def _percentile(sorted_times: list[float], q: float) -> float:
    return sorted_times[min(len(sorted_times) - 1, round(q * (len(sorted_times) - 1)))]


def _warm_up(call: Callable[[], object], warmup_ms: float) -> None:
    """Run ``call`` for at least ``warmup_ms`` of GPU time (and at least 4 calls): a GPU and host
    fresh from idle run slower and less evenly for a while (seen on an H200: cross_entropy's
    forward at 0.195 ms, p10-p90 0.163-0.265, in a fresh process; 0.145, 0.144-0.146, once warm)."""
    call()  # the first call outside the estimate: builds, compiles, autotunes
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(3):
        call()
    end.record()
    end.synchronize()
    estimate_ms = max(start.elapsed_time(end) / 3, 1e-3)
    for _ in range(int(warmup_ms / estimate_ms)):
        call()


def _back_to_back_ms(fn: Callable, setup: Callable | None, calls: int) -> float:
    """GPU time per call of ``calls`` calls queued back to back (states prepared beforehand)."""
    states = [setup() for _ in range(calls)] if setup else None
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    if states is None:
        for _ in range(calls):
            fn()
    else:
        for state in states:
            fn(state)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / calls


def time_cuda(fn: Callable, repeats: int = 20, warmup_ms: float = 50.0, flush: torch.Tensor | None = None,
              setup: Callable[[], object] | None = None, back_to_back: bool = True) -> Timing:
    """GPU time of ``fn`` per call (L2 flushed before each), back to back, and on the host.

    After Triton's ``do_bench``: warm-up calls first; then ``repeats`` timed calls, each
    preceded by writing a buffer several times the L2 size, so no input is served from cache,
    with CUDA events around the call alone; the median, with the 10th-90th percentile range as
    the spread. Two more views of the same callable:

    - back to back: the same number of calls queued with no flush and no synchronisation between
      them, one event pair around them all; the GPU time per call when launches overlap, as in a
      training step (inputs may then sit in L2);
    - host time per call: the wall-clock time ``fn()`` takes to return on the host (launch cost,
      Python and any host synchronisation inside it), median over the flushed calls.

    Args:
        fn: the callable timed; ``fn()``, or ``fn(state)`` when ``setup`` is given.
        repeats: timed calls (at least 1); also the number of back-to-back calls.
        warmup_ms: GPU time of untimed warm-up calls first.
        flush: a buffer from :func:`flush_buffer` (one is made if None).
        setup: run untimed before each call (and before the flush); its result is passed to
            ``fn``, e.g. a forward pass's loss whose backward is timed. Back to back, at most
            :data:`BACK_TO_BACK_STATES` states are prepared first, so they fit in memory.
        back_to_back: also measure back to back (one more batch of calls).
    Returns a :class:`Timing` in milliseconds.

    Raises:
        ValueError: ``repeats`` < 1.
    """
    if repeats < 1:
        raise ValueError(f"repeats: expected at least 1, got {repeats}")
    flush = flush_buffer() if flush is None else flush
    call = (lambda: fn(setup())) if setup else fn
    _warm_up(call, warmup_ms)
    compiled = compile_events()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeats)]
    host = []
    for start, end in events:
        state = setup() if setup else None
        flush.zero_()  # evicts the inputs from L2; runs before `start`, so it is not timed
        start.record()
        began = time.perf_counter()
        fn(state) if setup else fn()
        host.append((time.perf_counter() - began) * 1e3)
        end.record()
    torch.cuda.synchronize()
    times = [start.elapsed_time(end) for start, end in events]
    together = None
    if back_to_back:
        together = _back_to_back_ms(fn, setup, min(repeats, BACK_TO_BACK_STATES) if setup else repeats)
    return _of_calls(times, host, together, compile_events() - compiled)


def single_call_host_us(fn: Callable[[], object], calls: int) -> float:
    """Host time of one ``fn()`` in microseconds: the median of ``calls`` single calls, each timed
    on the host alone after a synchronisation (the launch queue empty, so no kernel makes the
    host wait)."""
    times = []
    for _ in range(calls):
        torch.cuda.synchronize()
        start = time.perf_counter_ns()
        fn()
        times.append((time.perf_counter_ns() - start) / 1e3)
    torch.cuda.synchronize()
    return statistics.median(times)


def peak_extra_memory(fn: Callable, setup: Callable[[], object] | None = None) -> int:
    """Bytes allocated by ``fn`` at its peak above what was allocated before it (outputs
    included; what ``setup()`` allocates is not counted; its result is passed to ``fn``)."""
    state = setup() if setup else None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    baseline = torch.cuda.memory_allocated()
    result = fn(state) if setup else fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - baseline
    del result, state
    return peak
