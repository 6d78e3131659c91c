"""Test tiers and the fixtures several test modules share.

Tiers (docs/architecture.md, "Tests"): unmarked tests are the cpu tier and run everywhere;
``compile`` needs nvcc, ``gpu`` a CUDA device, ``browser`` chromium and playwright. A tier whose
tool is missing is skipped with a reason that says so (pytest -rs, the default here, prints it).

Shared fixtures (use them by name; never import one test module from another):
``make_section``  a factory of recorded ``records.Section``s as ``python -m losslab bench`` records them;
``results_dir``   an empty results folder in tmp_path;
``recorded_dir``  a results folder holding one fixture record for kl_div;
``vocab_parallel_record`` a record of ``python -m losslab.distributed.bench`` (a dict).
The sections hold made-up round numbers and are written only to tmp folders, never under reports/.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

from browser.notebook import CHROMIUM

# With no GPU, an extension built in a test runs nowhere: build it for sm_90 only, half the device
# code of the two default architectures. test_compile and test_ladder still compile every kernel
# for sm_80 and sm_90, and the wheel (test_prebuilt) carries both. A list set by the caller stays.
if not torch.cuda.is_available():
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")


def _skip_reasons() -> dict[str, str]:
    reasons = {}
    if not torch.cuda.is_available():
        reasons["gpu"] = ("gpu tier skipped: no CUDA GPU visible here "
                          f"(torch {torch.__version__}, torch.cuda.is_available() is False)")
    if not (shutil.which("nvcc") or os.environ.get("CUDA_HOME")):
        reasons["compile"] = "compile tier skipped: nvcc is not on PATH and CUDA_HOME is unset"
    elif torch.version.cuda is None:
        reasons["compile"] = f"compile tier skipped: torch {torch.__version__} is a CPU-only build"
    browser = browser_skip_reason()
    if browser:
        reasons["browser"] = browser
    return reasons


def browser_skip_reason() -> str | None:
    """Why the browser tier cannot run here, or None if it can."""
    if not os.access(CHROMIUM, os.X_OK):
        return f"browser tier skipped: no {CHROMIUM} (Debian: apt-get install -y chromium; .ci/run does it as root)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "browser tier skipped: the playwright package is missing (pip install -r requirements.txt)"
    return None


def pytest_collection_modifyitems(config, items):
    reasons = _skip_reasons()
    for item in items:
        for tier, reason in reasons.items():
            if tier in item.keywords:
                item.add_marker(pytest.mark.skip(reason=reason))


# --- recorded sections ---------------------------------------------------------------------------------

FIXTURE_BANDWIDTH_GBPS = {"read": 1000.0, "copy": 900.0}
FIXTURE_DATE = "2000-01-01T00:00:00+00:00"


def fixture_section(problem: str = "kl_div", device: str = "Fixture GPU", fresh: bool = True):
    """A recorded ``records.Section`` as `python -m losslab bench` records it, at the problem's seed
    size in float32, with made-up times: naive 100 ms, the other rungs 1 ms, eager 4 ms, compile 2 ms
    (GB/s and fractions follow from the cost model and ``FIXTURE_BANDWIDTH_GBPS``, which are its
    ceilings); one failing check (naive, backward, the first case). Every row and check is dated
    ``FIXTURE_DATE`` (rows: torch and CUDA "fixture") and stamped with today's sources hash, or with
    ``fresh=False`` a hash that matches no source. Each call returns a new Section."""
    from losslab import problems, records
    from losslab.measure.bench import BenchRow, flag_physical_floor
    from losslab.measure.ceilings import bandwidth_kind
    from losslab.measure.check import CheckResult

    spec = problems.get(problem)
    shape = tuple(spec.sizes["seed"])
    sources = records.sources_sha256(problem) if fresh else "0" * 64
    times = {**{v: 1.0 for v in spec.variants}, "naive": 100.0, "eager": 4.0, "compile": 2.0}
    rows = []
    for name, ms in times.items():
        for direction in problems.DIRECTIONS:
            cost = spec.cost(shape, direction)
            ceiling = bandwidth_kind(cost.bytes_written)
            gbps = cost.bytes / ms / 1e6
            rows.append(BenchRow(problem=problem, implementation=name,
                                 kind="peer" if name in ("eager", "compile") else "variant",
                                 direction=direction, shape=shape, dtype="float32", median_ms=ms, p10_ms=ms,
                                 p90_ms=ms, repeats=20, gbps=gbps, bandwidth=ceiling,
                                 fraction_of_bandwidth=gbps / FIXTURE_BANDWIDTH_GBPS[ceiling],
                                 peak_extra_bytes=2**20, error=1e-7, date=FIXTURE_DATE, torch="fixture",
                                 cuda="fixture", sources_sha256=sources))
    for row in rows:
        flag_physical_floor(row, device, spec)  # as reading a record does
        row.speedup = {p.implementation: p.median_ms / row.median_ms for p in rows
                       if p.kind == "peer" and p.direction == row.direction and p is not row}
    cases = ["random 3x1000", "B = 1 (one row)"]
    checks = [CheckResult(problem, v, case, (3, 1000), d, 1e-8, 1e-5, True, date=FIXTURE_DATE, sources_sha256=sources)
              for v in spec.variants for case in cases for d in ("forward", "backward")]
    checks[1] = CheckResult(problem, "naive", cases[0], (3, 1000), "backward", 1.0, 1e-6, False, "fixture failure",
                            date=FIXTURE_DATE, sources_sha256=sources)
    ceilings = {"read_gbps": FIXTURE_BANDWIDTH_GBPS["read"], "copy_gbps": FIXTURE_BANDWIDTH_GBPS["copy"]}
    return records.Section(problem, device, rows=rows, checks=checks, ceilings=ceilings)


@pytest.fixture
def make_section():
    """``make_section(problem="kl_div", device="Fixture GPU", fresh=True) -> records.Section``: see
    ``fixture_section``."""
    return fixture_section


@pytest.fixture
def results_dir(tmp_path) -> Path:
    """An empty folder to record results into (never reports/results/)."""
    folder = tmp_path / "results"
    folder.mkdir()
    return folder


@pytest.fixture
def vocab_parallel_record() -> dict:
    """A two-GPU record as ``losslab.distributed.bench`` writes it, with made-up round numbers on
    "Fixture GPU": losslab 1 ms, Megatron-style 2 ms, loss_parallel 4 ms, one GPU 1.5 ms per size; the
    linear loss at one head: losslab 25 ms / 0.75 GiB, its three GEMMs 20 ms."""
    phases = {"statistics": 0.4, "all_gather": 0.02, "combine": 0.03, "gradient": 0.5}
    sizes = [{"rows": 8192, "vocab": vocab, "dtype": "bfloat16", "widths": [vocab // 2] * 2,
              "ms": {"losslab": 1.0, "megatron_style": 2.0, "loss_parallel": 4.0, "single_gpu_floor": 1.5},
              "phases_ms_per_rank": [phases, phases],
              "goal": {"bytes": 3 * 8192 * vocab, "model_ms": 0.9, "limit_ms": 1.08}} for vocab in (128256, 256000)]
    collectives = {"all_gather_latency_ms": 0.015, "all_reduce_latency_ms": 0.015, "all_gather_statistics_ms": 0.02,
                   "three_all_reduces_ms": 0.06, "statistics_bytes_per_rank": 8192 * 16, "bandwidth_bytes": 2**28,
                   "all_reduce_bus_gbps": 300.0, "all_gather_bus_gbps": 300.0, "copy_gbps": 3000.0}
    linear = [{"head": "Llama-3-8B", "rows": 8192, "hidden": 4096, "vocab": 128256, "dtype": "bfloat16",
               "widths": [64128] * 2, "gradients_gib": 0.56,
               "ms": {"losslab": 25.0, "logits_then_losslab": 24.0, "logits_then_megatron_style": 40.0, "gemms": 20.0},
               "extra_gib": {"losslab": 0.75, "logits_then_losslab": 2.5, "logits_then_megatron_style": 6.0,
                             "gemms": 1.0}}]
    return {"device": "Fixture GPU", "world": 2, "torch": "fixture", "cuda": "fixture", "nccl": "fixture",
            "date": FIXTURE_DATE, "sources_sha256": "0" * 64, "collectives": collectives, "sizes": sizes,
            "linear": linear, "protocol": "fixture"}


@pytest.fixture
def recorded_dir(results_dir) -> Path:
    """A results folder holding one fixture record: kl_div on "Fixture GPU"."""
    from losslab import records

    records.save_section("kl_div", fixture_section(), results_dir)
    return results_dir


def _quiet_host_us(*fns, rounds: int = 10, calls: int = 50) -> float | tuple[float, ...]:
    """Host time of one call of each of ``fns`` in us (a float for one function, else a tuple):
    the least, over ``rounds``, of the median of ``calls`` single calls, each timed on the host
    alone after a synchronisation (so that no kernel fills the launch queue and makes the host
    wait). The functions take turns round by round, so that each meets the same host.

    The GPU machines' host time drifts by up to half over seconds, PyTorch's own calls as much
    as ours (``torch.empty(())`` 3.5-7.3 us, ``F.cross_entropy`` 15-23 us in one H100 process,
    scripts/host_overhead.py), so the quietest round is the one compared with the bound.
    """
    from losslab.measure.timing import single_call_host_us

    for fn in fns:
        for _ in range(20):
            fn()
    rounds_us = [[single_call_host_us(fn, calls) for fn in fns] for _ in range(rounds)]  # a row a round
    best = tuple(min(column) for column in zip(*rounds_us, strict=True))
    return best[0] if len(fns) == 1 else best


@pytest.fixture
def quiet_host_us():
    """:func:`_quiet_host_us`: a call's host time in us on a GPU machine whose host time drifts."""
    return _quiet_host_us


def _gpu_activity(fn) -> tuple[list[str], int]:
    """(names of the kernels ``fn`` ran on the GPU, number of memsets), from torch.profiler,
    after one call outside the profile (builds, allocator)."""
    from torch.profiler import DeviceType, ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == DeviceType.CUDA]
    memsets = [n for n in names if n.lower().startswith("memset")]
    return [n for n in names if n not in memsets], len(memsets)


@pytest.fixture
def gpu_activity():
    """:func:`_gpu_activity`: the kernels and memsets one call runs."""
    return _gpu_activity
