"""Timing: the protocol's arguments (cpu tier); per call with L2 flushed, back to back and host
time per call, and peak memory, measured on the device (gpu tier)."""
import time

import pytest
import torch

from losslab.measure import timing


@pytest.mark.parametrize("repeats", [0, -1])
def test_repeats_below_one_are_refused_before_any_gpu_work(repeats):
    with pytest.raises(ValueError, match=f"repeats: expected at least 1, got {repeats}"):
        timing.time_cuda(lambda: pytest.fail("called"), repeats=repeats)


def test_rounds_combine_into_medians_over_every_call():
    rounds = [timing.Timing(1.0, 1.0, 1.0, 5, 0.9, 0.1, 0, (1.0,) * 5, (0.1,) * 5),
              timing.Timing(2.0, 2.0, 2.0, 2, 1.1, 0.2, 1, (2.0, 2.0), (0.2, 0.2)),
              timing.Timing(3.0, 3.0, 3.0, 2, 2.5, 0.4, 0, (3.0, 3.0), (0.4, 0.5))]
    t = timing.combine(rounds)
    # the median of the nine calls, not of the three rounds' medians (2.0)
    assert (t.median_ms, t.p10_ms, t.p90_ms, t.repeats) == (1.0, 1.0, 3.0, 9)
    assert (t.back_to_back_ms, t.host_ms, t.compiles_while_timed) == (1.1, 0.1, 1)
    with pytest.raises(ValueError, match="timings: expected at least one Timing"):
        timing.combine([])
    with pytest.raises(ValueError, match="each with its calls' times"):
        timing.combine([timing.Timing(1.0, 1.0, 1.0, 1)])


def test_timing_imports_nothing_else_from_losslab():
    import ast

    tree = ast.parse(open(timing.__file__).read())
    imported = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [m for m in imported if m.startswith("losslab")], imported


@pytest.mark.gpu
def test_per_call_back_to_back_and_host_times_are_measured():
    x = torch.rand(2**24, device="cuda")
    t = timing.time_cuda(lambda: x.sum(), repeats=10)
    assert 0 < t.p10_ms <= t.median_ms <= t.p90_ms
    assert t.back_to_back_ms is not None and 0 < t.back_to_back_ms
    # back to back the 64 MiB input may sit in L2 and launches overlap: no slower than flushed, within noise
    assert t.back_to_back_ms < 1.5 * t.median_ms
    assert t.host_ms is not None and t.host_ms > 0


@pytest.mark.gpu
def test_a_host_side_wait_shows_in_the_time_per_call():
    """A call whose host work keeps the GPU idle is slow per call, not only on the host: the
    per-call time is what exposes an implementation that waits on the host."""
    x = torch.rand(1024, device="cuda")

    def slow_host():
        time.sleep(0.002)
        return x.sum()

    t = timing.time_cuda(slow_host, repeats=5, warmup_ms=1.0)
    assert t.host_ms >= 2.0 and t.median_ms >= 1.9


@pytest.mark.gpu
def test_setup_state_is_passed_and_not_timed():
    x = torch.rand(2**20, device="cuda", requires_grad=True)
    seen = []

    def setup():
        return (x * 2).sum()

    def backward(loss):
        seen.append(loss)
        return torch.autograd.grad(loss, x)

    t = timing.time_cuda(backward, repeats=4, warmup_ms=1.0, setup=setup)
    assert t.back_to_back_ms is not None and seen and all(isinstance(s, torch.Tensor) for s in seen)
    assert timing.peak_extra_memory(backward, setup) >= x.numel() * 4  # the gradient it returns


def test_compile_events_count_each_compilation_and_graph_break():
    """On the CPU: a new shape under dynamic=False is one more frame compiled; a graph break one more."""
    from losslab.measure.timing import compile_events

    torch._dynamo.reset()
    double = torch.compile(lambda x: x * 2, dynamic=False)
    before = compile_events()
    double(torch.ones(3))
    double(torch.ones(3))  # cached: no compilation
    assert compile_events() - before == 1
    double(torch.ones(4))
    assert compile_events() - before == 2

    def broken(x):
        torch._dynamo.graph_break()
        return x + 1

    before = compile_events()
    torch.compile(broken)(torch.ones(2))
    assert compile_events() - before >= 2  # the frames around the break, and the break


@pytest.mark.gpu
def test_a_compilation_while_timed_is_counted_and_none_when_warm():
    from losslab.measure.timing import time_cuda

    torch._dynamo.reset()
    sizes = iter(range(1, 1000))
    double = torch.compile(lambda x: x * 2, dynamic=False)
    timing = time_cuda(lambda: double(torch.ones(next(sizes), device="cuda")), repeats=3, warmup_ms=0)
    assert timing.compiles_while_timed >= 3  # a new shape each call: compiled while timed
    x = torch.ones(4096, device="cuda")
    assert time_cuda(lambda: double(x), repeats=3).compiles_while_timed == 0
