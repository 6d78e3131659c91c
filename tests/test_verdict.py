"""The verdict rules over measured numbers (losslab.kernelbench.verdict) and how the parent
settles a child's result (evaluate.conclude): cpu tier, no GPU and no child process."""
import math
import re

import pytest
import torch

from losslab import problems
from losslab.kernelbench import verdict as rules
from losslab.kernelbench.evaluate import conclude
from losslab.kernelbench.verdict import ADVICE, STATUSES, Verdict, judge_timing, speed_of_light

KL_DIV, CROSS_ENTROPY = problems.get("kl_div"), problems.get("cross_entropy")

H100 = "NVIDIA H100 80GB HBM3"
FIELDS = dict(problem="kl_div", solution="solution.py", shape=(16384, 16384))


def timing(solution_ms=0.7, event_ms=None, eager_ms=2.0, parent_ms=None, **clock):
    """A child's timing section: device-wide median, events median, speedups (and the parent's clock:
    ``parent_ms`` and the rest of what ``verdict.parent_clock`` returns)."""
    return {**({"parent_ms": parent_ms, "parent_overhead_ms": 0.4, "parent_calls": 51, **clock}
               if parent_ms is not None else {}),
            "solution_ms": solution_ms, "solution_p10_ms": solution_ms, "solution_p90_ms": solution_ms,
            "solution_event_ms": solution_ms if event_ms is None else event_ms, "eager_ms": eager_ms,
            "speedup_eager": eager_ms / solution_ms, "compile_ms": 1.0, "speedup_compile": 1.0 / solution_ms,
            "repeats": 20, "overhead_ms": 0.01}


def test_every_status_has_advice():
    assert set(ADVICE) == set(STATUSES) - {"passed"}


def test_speed_of_light_is_minimum_bytes_at_the_datasheet_peak():
    floor = speed_of_light(KL_DIV, (16384, 16384), "float32", H100)
    nbytes = problems.get("kl_div").cost((16384, 16384), "forward").bytes
    assert nbytes >= 2 * 16384 * 16384 * 4  # reads both inputs once
    assert floor.ms == pytest.approx(nbytes / 3350e9 * 1e3)  # H100 SXM: 3350 GB/s
    half = speed_of_light(KL_DIV, (16384, 16384), "bfloat16", H100)
    assert half.ms == pytest.approx(floor.ms / 2, rel=1e-3)  # 16-bit inputs: half the bytes
    assert speed_of_light(KL_DIV, (16384, 16384), "float32", "Some Future GPU") is None


def test_honest_times_pass():
    assert judge_timing(timing()) is None
    # the host clock's jitter on a short call is not hidden work
    assert judge_timing(timing(solution_ms=0.030, event_ms=0.010)) is None


def test_work_outside_the_callers_stream_is_hidden_work():
    status, message = judge_timing(timing(solution_ms=2.0, event_ms=0.02))
    assert status == "hidden_work" and "outside the caller's stream" in message and "0.02 ms" in message


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_a_time_below_the_floor_is_impossible_not_a_speedup(dtype):
    floor = speed_of_light(KL_DIV, (16384, 16384), dtype, H100)
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
    verdict = conclude(Verdict.from_child(result, **FIELDS), KL_DIV, "", 0, 60, None)
    assert verdict.status == "impossible_time", verdict.format()
    assert verdict.timing["floor_ms"] > 0.6 and "speedup_eager" not in verdict.timing
    text = verdict.format()
    assert "IMPOSSIBLE TIME" in text and "speed-of-light floor" in text
    assert re.search(r"speedup \d", text) is None


def test_conclude_passes_an_honest_time_and_shows_the_floor():
    result = {"status": "passed", "stage": "done", "device": H100, "timing": timing(solution_ms=0.7)}
    verdict = conclude(Verdict.from_child(result, **FIELDS), KL_DIV, "", 0, 60, None)
    assert verdict.passed, verdict.format()
    assert "speedup 2.86x" in verdict.format() and "speed-of-light floor 0.64" in verdict.format()


@pytest.mark.parametrize("returncode, status", [(None, "timed_out"), (-11, "crashed"), (1, "crashed")])
def test_conclude_reports_a_child_that_never_finished(returncode, status):
    result = {"status": "running", "stage": "correctness"}
    verdict = conclude(Verdict.from_child(result, **FIELDS), KL_DIV, "Segmentation fault\n", returncode, 5, None)
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
    assert status == "time_mismatch" and "the evaluator's own clock over 51 synchronised calls in one command saw " \
        "0.7 ms per call (less the same command with an empty call, 0.4 ms)" in message
    assert judge_timing(timing(solution_ms=0.6, parent_ms=0.7)) is None  # within 20 %
    assert judge_timing(timing(solution_ms=0.01, parent_ms=0.05)) is None  # the clocks' jitter on a tiny call


def test_conclude_drops_the_speedups_of_a_time_mismatch():
    result = {"status": "passed", "stage": "done", "device": H100, "timing": timing(solution_ms=0.07, parent_ms=0.7)}
    verdict = conclude(Verdict.from_child(result, **FIELDS), KL_DIV, "", 0, 60, None)
    assert verdict.status == "time_mismatch" and "speedup_eager" not in verdict.timing, verdict.format()


# --- the evaluator's own clock (cause 1 of the H100 run: honest answers were time_mismatch) -------------

# Honest answers on the H100, as (the time their process reported, what the evaluator's clock around one
# timed call added to that): kl_div naive and vectorized at 257 x 4099, kl_div bfloat16 at 257 x 4099,
# vectorized at 16384 x 16384. 0.1 to 0.45 ms more whatever the call's length (cached_result.py: 2.06 ms,
# 0.37 more): a cost of the command around the call, not of the call, which the empty calls measured
# before the warm-up did not have.
H100_HONEST = [(0.732, 0.207), (0.14, 0.114), (0.3, 0.424), (0.918, 0.398)]


def bracketed(call_ms, command_extra_ms, calls, commands=5, fixed_ms=0.45, empty_call_ms=0.02):
    """The evaluator's clock around ``commands`` timed commands (the flushed call and ``calls`` more) and
    around the same commands with an empty forward: made-up times in the H100 run's proportions
    (``fixed_ms``: the pipe, the flush, the stdout capture; ``command_extra_ms``: what only the answer's
    command costs beyond its calls)."""
    answer = [fixed_ms + command_extra_ms + (calls + 1) * (empty_call_ms + call_ms)] * commands
    empty = [fixed_ms + (calls + 1) * empty_call_ms] * commands
    return answer, empty


@pytest.mark.parametrize("reported_ms, extra_ms", H100_HONEST)
def test_an_honest_answer_passes_the_parents_clock_at_every_size(reported_ms, extra_ms):
    one_call = rules.parent_clock(*bracketed(reported_ms, extra_ms, 0), 0)  # the H100 run's method
    assert judge_timing(timing(solution_ms=reported_ms, **one_call))[0] == "time_mismatch"
    calls = rules.back_to_back_calls(60.0, int(60.0 / (reported_ms + 0.05)))  # the warm-up's pace
    clock = rules.parent_clock(*bracketed(reported_ms, extra_ms, calls), calls)
    assert clock["parent_calls"] == calls + 1 and clock["parent_overhead_ms"] == pytest.approx(0.45 + 0.02 * calls
                                                                                                + 0.02)
    assert clock["parent_ms"] == pytest.approx(reported_ms + extra_ms / (calls + 1))
    assert clock["parent_ms"] < 1.05 * reported_ms  # a margin of 15 % or more below the 20 % rule
    assert judge_timing(timing(solution_ms=reported_ms, **clock)) is None


@pytest.mark.parametrize("true_ms", [2.07, 0.2])  # forged_clock.py at 8192 x 16384 (H100), and a small call
def test_a_clock_divided_by_ten_is_still_a_time_mismatch(true_ms):
    calls = rules.back_to_back_calls(60.0, int(60.0 / true_ms))
    clock = rules.parent_clock(*bracketed(true_ms, 0.4, calls), calls)
    status, message = judge_timing(timing(solution_ms=true_ms / 10, **clock))
    assert status == "time_mismatch" and f"over {calls + 1} synchronised calls" in message


def test_the_back_to_back_calls_last_about_50_ms():
    assert rules.back_to_back_calls(60.0, 60) == 50  # 1 ms a call
    assert rules.back_to_back_calls(60.0, 400) == 334  # 0.15 ms
    assert rules.back_to_back_calls(60.0, 3) == 10  # 20 ms a call: at least 10
    assert rules.back_to_back_calls(60.0, 10**6) == 500  # at most 500
    assert rules.back_to_back_calls(0.0, 0) == 500


# --- a verdict that stopped early (cause 2: KeyError 'eager_bytes') --------------------------------------

def test_a_verdict_stopped_before_eager_was_measured_shows_the_memory_it_has():
    """stale_result.py, replayed_graph.py and late_write.py on the H100: wrong_values at a timed call,
    after the answer's memory was measured and before eager's; format() raised KeyError 'eager_bytes'."""
    result = {"status": "wrong_values", "stage": "timing", "message": "timed call 0 (seed 7): the output does not "
              "match the reference on that call's inputs", "repeatable": True,
              "memory": {"solution_bytes": 2 * 2**30}, "timing": {"repeats": 10, "overhead_ms": 0.02}}
    lines = Verdict.from_child(result, **FIELDS).format().splitlines()
    assert "  peak extra memory: 2.0 GiB" in lines and "  time: not measured" in lines
    assert "  peak extra memory: 2.0 GiB (eager 1.0 KiB)" in Verdict.from_child(
        {**result, "memory": {"solution_bytes": 2 * 2**30, "eager_bytes": 1024}}, **FIELDS).format().splitlines()


# --- the tolerance and the condition of the loss (cause 3: cross_entropy naive off by 5.7e-6 > 3e-6) ------

def sequential_float32(problem: str, inputs: tuple) -> float:
    """The loss as a naive kernel computes it: one sequential float32 loop per row (numpy's cumsum is
    sequential), then one over the rows' losses: an honest answer, and the least accurate one."""
    import numpy as np

    if problem == "triplet_margin_loss":  # each squared distance by a sequential loop, then the row's loss
        a, p, n = (v.numpy() for v in inputs)
        d_ap, d_an = (np.sqrt(np.cumsum(np.square(a - x + np.float32(1e-6)), axis=1, dtype=np.float32)[:, -1])
                      for x in (p, n))
        rows = np.maximum(np.float32(1.0) + d_ap - d_an, np.float32(0.0))
        return float(np.cumsum(rows, dtype=np.float32)[-1] / np.float32(len(rows)))
    x, t = (v.numpy() for v in inputs)
    if problem == "cross_entropy":
        top = x.max(1, keepdims=True)
        lse = top[:, 0] + np.log(np.cumsum(np.exp(x - top), axis=1, dtype=np.float32)[:, -1])
        rows = (lse - x[np.arange(len(x)), t]).astype(np.float32)
    elif problem == "hinge_loss":  # the mean over all B x D terms
        rows = np.cumsum(np.maximum(1 - x * t, 0).astype(np.float32), axis=1, dtype=np.float32)[:, -1]
        return float(np.cumsum(rows, dtype=np.float32)[-1] / np.float32(x.size))
    elif problem == "cosine_similarity_loss":
        pt, pp, tt = (np.cumsum((a * b).astype(np.float32), axis=1, dtype=np.float32)[:, -1]
                      for a, b in ((x, t), (x, x), (t, t)))
        norms = (np.maximum(np.sqrt(d), np.float32(1e-8)) for d in (pp, tt))
        rows = (1 - pt / next(norms) / next(norms)).astype(np.float32)
    else:
        rows = np.cumsum((t * (np.log(t) - np.log(x))).astype(np.float32), axis=1, dtype=np.float32)[:, -1]
    return float(np.cumsum(rows, dtype=np.float32)[-1] / np.float32(len(rows)))


def float64(inputs: tuple) -> tuple:
    return tuple(v.double() if v.is_floating_point() else v for v in inputs)


def test_the_condition_number_on_constructed_inputs():
    log2 = math.log(2)
    # cross-entropy: a row of equal logits (loss log 2, lse log 2, target's logit 0) has condition 1;
    # add a row whose target is 30 above the other logit: lse ~ 30 + e^-30 beside a loss of ~e^-30
    even = (torch.zeros(1, 2, dtype=torch.float64), torch.tensor([0]))
    assert rules.condition_number(CROSS_ENTROPY, even) == pytest.approx(1.0)
    sharp = (torch.tensor([[0.0, 0.0], [30.0, 0.0]], dtype=torch.float64), torch.tensor([0, 0]))
    assert rules.condition_number(CROSS_ENTROPY, sharp) == pytest.approx((log2 + 30 + 30) / log2, rel=1e-9)
    ignored = (sharp[0], torch.tensor([0, -100]))  # ignore_index: the row is not in the loss
    assert rules.condition_number(CROSS_ENTROPY, ignored) == pytest.approx(1.0)
    # kl_div: t = (1/2, 1/2), p = (1/4, 3/4): terms t log t - t log p, magnitudes t |log t| + t |log p|
    p, t = torch.tensor([[0.25, 0.75]], dtype=torch.float64), torch.tensor([[0.5, 0.5]], dtype=torch.float64)
    magnitude = (0.5 * log2 + 0.5 * math.log(4)) + (0.5 * log2 + 0.5 * math.log(4 / 3))
    total = 0.5 * math.log(2) + 0.5 * math.log(2 / 3)
    assert rules.condition_number(KL_DIV, (p, t)) == pytest.approx(magnitude / total, rel=1e-9)
    assert rules.condition_number(KL_DIV, (t, t)) == 1.0  # a loss of 0: compared absolutely
    assert rules.tolerance(torch.float32, 1000, 1.0) == rules.tolerance(torch.float32, 1000)  # the old formula
    assert rules.tolerance(torch.float32, 1000, 100.0) == pytest.approx(
        rules.unit_roundoff(torch.float32) * (1 + 2 * (10 + 4 * 100)))


# The losses whose terms cancel (condition above 20 on structured inputs); the elementwise means of
# non-negative terms (mse_loss, smooth_l1_loss) have condition 1, and sequential_float32 knows only these two.
CANCELLING = [p for p in problems.names() if p in ("cross_entropy", "kl_div")]


@pytest.mark.parametrize("problem", CANCELLING)
def test_an_honest_float32_loss_passes_with_margin_on_structured_inputs(problem):
    """At 257 x 4099 (the gpu tier's "odd" size) on four seeds: a sequential float32 loop stays below a
    quarter of its tolerance. The cross-entropy rows whose target is the raised maximum have a loss far
    smaller than lse and the target's logit; the tolerance without the condition number (3e-6) is what
    the naive rung exceeded on the H100 (5.7e-6), and what this loop exceeds here (up to 1e-5)."""
    spec = problems.get(problem)
    n = 257 * 4099
    errors = []
    for seed in range(4):
        inputs = spec.structured_inputs((257, 4099), seed=seed, device="cpu")
        reference = spec.reference(*float64(inputs)).item()
        condition = rules.condition_number(problems.get(problem), float64(inputs))
        error = abs(sequential_float32(problem, inputs) - reference) / abs(reference)
        errors.append(error)
        assert condition > 20 and error < rules.tolerance(torch.float32, n, condition) / 4, (seed, condition, error)
        assert spec.reference(*inputs).item() == pytest.approx(reference, rel=rules.tolerance(torch.float32, n))
    if problem == "cross_entropy":
        assert max(errors) > rules.tolerance(torch.float32, n)


@pytest.mark.parametrize("problem", problems.names())
def test_one_row_in_eight_stays_far_outside_the_tolerance_on_structured_inputs(problem):
    """tests/solutions/one_row_in_eight.py, in float64 (its error is the rows it skips, not rounding).

    At KernelBench's size (in float64 on the CPU, structured inputs drawn in blocks of 2048 rows, one
    heavy row in 64 as in one draw; 12 seeds for cross_entropy, 8 for kl_div):
      cross_entropy 32768 x 4096: condition number 80 to 85, float32 tolerance 4.1e-5 to 4.4e-5; the
        cheat is off by 0.13 (median; 0.011 to 0.21), 250 to 5000 times the tolerance;
      kl_div 16384 x 16384: condition number 159 to 164, tolerance 7.9e-5 to 8.2e-5; the cheat is
        off by 0.19 (median; 0.05 to 0.32), 600 to 4000 times the tolerance.
    (It sees about one in eight of the 512 or 256 heavy rows, a count that varies by 10 to 15 %.)
    On random inputs it is off by 5.5e-4 for cross_entropy (the H100 log; condition 1.1, tolerance 4e-6:
    it fails there first) and by 5e-6 to 2.3e-4 for kl_div (condition 350 to 380, tolerance 1.7e-4 to
    1.9e-4: it may pass there; the structured trial of the same seed does not). Here at 2048 x 4096."""
    spec = problems.get(problem)
    for seed in range(3):
        inputs = float64(spec.structured_inputs((2048, 4096), seed=seed, device="cpu"))
        reference = spec.reference(*inputs).item()
        cheat = spec.reference(*(v if problem == "hinge_loss" and v.dim() == 1 else v[::8] for v in inputs)).item()
        tol = rules.tolerance(torch.float32, 2048 * 4096, rules.condition_number(spec, inputs))
        assert tol < 2e-4 and abs(cheat - reference) / abs(reference) > 20 * tol, (seed, cheat, reference, tol)
