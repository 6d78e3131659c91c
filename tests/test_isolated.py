"""The child-process protocol (losslab.teach.isolated), on the CPU: every way a child can end
gives its own verdict, within the time limit, and the parent never raises for it."""
from pathlib import Path

import pytest

from losslab.teach import isolated

HELPERS = (str(Path(__file__).parent / "helpers"),)


def run(function, timeout_s=60.0, **kwargs):
    return isolated.run(f"child_targets:{function}", kwargs, timeout_s, pythonpath=HELPERS)


def test_a_result_comes_back():
    outcome = run("answer", x=21)
    assert outcome.ok and outcome.value == {"twice": 42} and outcome.status == "ok"


def test_a_hang_is_timed_out_and_killed():
    outcome = run("hang", timeout_s=3)
    assert outcome.status == "timed_out" and "no result after 3 s" in outcome.message
    assert outcome.seconds < 30  # killed, not waited for


def test_a_dead_child_is_crashed_with_the_signal():
    outcome = run("abort")
    assert outcome.status == "crashed" and "signal 6" in outcome.message


def test_an_exception_is_raised_with_its_traceback():
    outcome = run("raise_value_error")
    assert outcome.status == "raised" and outcome.message == "ValueError: targets: a bad value"
    assert "Traceback" in outcome.detail and "raise_value_error" in outcome.detail and not outcome.hint


def test_a_cuda_error_is_its_own_verdict_with_a_hint():
    outcome = run("raise_cuda_error")
    assert outcome.status == "cuda_error" and outcome.message == "RuntimeError: CUDA error: misaligned address"
    assert "peel the row's head" in outcome.hint and "what it usually means" in outcome.format()


def test_a_result_that_is_not_json_is_reported():
    outcome = run("not_json")
    assert outcome.status == "raised" and "not JSON" in outcome.message


@pytest.mark.parametrize("target,timeout_s,kwargs,match", [
    ("child_targets.answer", 10, {}, "target"),
    ("child_targets:answer", 0, {}, "timeout_s"),
    ("child_targets:answer", 10, {"x": object()}, "kwargs"),
])
def test_bad_arguments_are_refused(target, timeout_s, kwargs, match):
    with pytest.raises(ValueError, match=match):
        isolated.run(target, kwargs, timeout_s)


def test_hints_match_the_usual_cuda_faults():
    assert "aligned" in isolated.cuda_hint("CUDA error: misaligned address")
    assert "outside the tensor" in isolated.cuda_hint("CUDA error: an illegal memory access was encountered")
    assert isolated.cuda_hint("CUDA error: out of memory") == ""


@pytest.mark.gpu
def test_a_real_device_fault_stays_in_the_child():
    import torch

    outcome = run("cuda_index_out_of_range")
    assert outcome.status in ("cuda_error", "crashed"), outcome.format()
    assert "device-side assert" in outcome.format() and outcome.hint
    assert torch.ones(4, device="cuda").sum().item() == 4.0  # this process's context is untouched
