"""The verdict rules over measured numbers (losslab.kernelbench.verdict) and how the parent
settles a child's result (evaluate.conclude): cpu tier, no GPU and no child process."""
import re

import pytest
import torch

from losslab import problems
from losslab.kernelbench import verdict as rules
from losslab.kernelbench.evaluate import conclude
from losslab.kernelbench.verdict import ADVICE, STATUSES, Verdict, judge_timing, speed_of_light

H100 = "NVIDIA H100 80GB HBM3"
FIELDS = dict(problem="kl_div", solution="solution.py", shape=(16384, 16384))


def timing(solution_ms=0.7, event_ms=None, eager_ms=2.0, parent_ms=None):
    """A child's timing section: device-wide median, events median, speedups (and the parent's clock)."""
    return {**({"parent_ms": parent_ms, "parent_overhead_ms": 0.03} if parent_ms is not None else {}),
            "solution_ms": solution_ms, "solution_p10_ms": solution_ms, "solution_p90_ms": solution_ms,
            "solution_event_ms": solution_ms if event_ms is None else event_ms, "eager_ms": eager_ms,
            "speedup_eager": eager_ms / solution_ms, "compile_ms": 1.0, "speedup_compile": 1.0 / solution_ms,
            "repeats": 20, "overhead_ms": 0.01}


def test_every_status_has_advice():
    assert set(ADVICE) == set(STATUSES) - {"passed"}


def test_speed_of_light_is_minimum_bytes_at_the_datasheet_peak():
    floor = speed_of_light("kl_div", (16384, 16384), "float32", H100)
    nbytes = problems.get("kl_div").cost((16384, 16384), "forward").bytes
    assert nbytes >= 2 * 16384 * 16384 * 4  # reads both inputs once
    assert floor.ms == pytest.approx(nbytes / 3350e9 * 1e3)  # H100 SXM: 3350 GB/s
    half = speed_of_light("kl_div", (16384, 16384), "bfloat16", H100)
    assert half.ms == pytest.approx(floor.ms / 2, rel=1e-3)  # 16-bit inputs: half the bytes
    assert speed_of_light("kl_div", (16384, 16384), "float32", "Some Future GPU") is None


def test_honest_times_pass():
    assert judge_timing(timing()) is None
    # the host clock's jitter on a short call is not hidden work
    assert judge_timing(timing(solution_ms=0.030, event_ms=0.010)) is None


def test_work_outside_the_callers_stream_is_hidden_work():
    status, message = judge_timing(timing(solution_ms=2.0, event_ms=0.02))
    assert status == "hidden_work" and "outside the caller's stream" in message and "0.02 ms" in message


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_a_time_below_the_floor_is_impossible_not_a_speedup(dtype):
    floor = speed_of_light("kl_div", (16384, 16384), dtype, H100)
    status, message = judge_timing(timing(solution_ms=floor.ms * 0.9), floor)
    assert status == "impossible_time" and "speed-of-light floor" in message and "H100 SXM" in message
    assert judge_timing(timing(solution_ms=floor.ms * 1.01), floor) is None


def test_min_speedup_makes_too_slow():
    assert judge_timing(timing(solution_ms=1.0, eager_ms=1.5), min_speedup=2)[0] == "too_slow"
    assert judge_timing(timing(solution_ms=1.0, eager_ms=2.5), min_speedup=2) is None


def test_conclude_applies_the_floor_and_drops_the_speedups():
    """A passed child result with an impossible time: the parent's verdict is impossible_time,
    with the floor in the timing, no speedup in the timing or the text."""
    result = {"status": "passed", "stage": "done", "device": H100, "timing": timing(solution_ms=0.001)}
    verdict = conclude(Verdict.from_child(result, **FIELDS), "", 0, 60, None)
    assert verdict.status == "impossible_time", verdict.format()
    assert verdict.timing["floor_ms"] > 0.6 and "speedup_eager" not in verdict.timing
    text = verdict.format()
    assert "IMPOSSIBLE TIME" in text and "speed-of-light floor" in text
    assert re.search(r"speedup \d", text) is None


def test_conclude_passes_an_honest_time_and_shows_the_floor():
    result = {"status": "passed", "stage": "done", "device": H100, "timing": timing(solution_ms=0.7)}
    verdict = conclude(Verdict.from_child(result, **FIELDS), "", 0, 60, None)
    assert verdict.passed, verdict.format()
    assert "speedup 2.86x" in verdict.format() and "speed-of-light floor 0.64" in verdict.format()


@pytest.mark.parametrize("returncode, status", [(None, "timed_out"), (-11, "crashed"), (1, "crashed")])
def test_conclude_reports_a_child_that_never_finished(returncode, status):
    result = {"status": "running", "stage": "correctness"}
    verdict = conclude(Verdict.from_child(result, **FIELDS), "Segmentation fault\n", returncode, 5, None)
    assert verdict.status == status and "'correctness'" in verdict.message


def test_a_tampered_verdict_lists_what_was_replaced():
    result = {"status": "tampered", "stage": "load", "message": "after loading, the solution had replaced "
              "torch.cuda.Event.elapsed_time", "detail": "torch.cuda.Event.elapsed_time\ntime.perf_counter"}
    text = Verdict.from_child(result, **FIELDS).format()
    assert "TAMPERED" in text and "time.perf_counter" in text and "may not replace" in text


def test_the_tolerance_follows_from_the_dtype_and_the_reduction_length():
    """kl_div at 16384 x 16384 in float32: the ladder's kernels reach 4.3e-7 (recorded on H100 and
    H200), one row in eight is off by 3e-4; KernelBench's fixed 1e-4 lets the second through."""
    seed = rules.tolerance(torch.float32, 16384 * 16384)
    assert 4.3e-7 * 5 < seed < 3e-4 / 50
    assert rules.tolerance(torch.float32, 3 * 1000) < seed  # a shorter reduction rounds less
    assert rules.tolerance(torch.bfloat16, 3 * 1000) == pytest.approx(torch.finfo(torch.bfloat16).eps / 2, rel=1e-2)
    assert rules.tolerance(torch.float16, 3 * 1000) == pytest.approx(torch.finfo(torch.float16).eps / 2, rel=1e-2)


def trial(kind="random", passed=False, allclose=True, error=3e-4, eager_error=1e-7):
    return {"kind": kind, "passed": passed, "allclose": allclose, "rel_error_fp64": error, "tolerance": 3.9e-6,
            "reference": 0.05, "eager_rel_error_fp64": eager_error, "max_abs_diff": 1e-5}


@pytest.mark.parametrize("trials, says", [
    ([trial()], "KernelBench's fixed tolerance (atol = rtol = 0.0001) allows a relative error of about 0.0021"),
    ([trial(passed=True), trial("structured", allclose=False, error=0.9)], "draws uniform random inputs only"),
    ([trial(passed=True, allclose=False, eager_error=2e-3)], "compares with eager float32, itself off by 0.002"),
    ([trial(passed=True)], ""),
    ([trial(allclose=False)], ""),
])
def test_a_disagreement_with_kernelbench_is_explained_in_one_line(trials, says):
    line = rules.why_they_differ(trials, "float32", 16384 * 16384)
    assert says in line and "\n" not in line and (line == "") == (says == "")


def test_a_time_well_below_the_parents_clock_is_a_time_mismatch():
    """The child's clocks are the solution's to tamper with; the parent's clock is not."""
    status, message = judge_timing(timing(solution_ms=0.07, parent_ms=0.7))
    assert status == "time_mismatch" and "the evaluator's own clock around the same calls saw 0.7 ms" in message
    assert judge_timing(timing(solution_ms=0.6, parent_ms=0.7)) is None  # within 20 %
    assert judge_timing(timing(solution_ms=0.01, parent_ms=0.05)) is None  # the clocks' jitter on a tiny call


def test_conclude_drops_the_speedups_of_a_time_mismatch():
    result = {"status": "passed", "stage": "done", "device": H100, "timing": timing(solution_ms=0.07, parent_ms=0.7)}
    verdict = conclude(Verdict.from_child(result, **FIELDS), "", 0, 60, None)
    assert verdict.status == "time_mismatch" and "speedup_eager" not in verdict.timing, verdict.format()
