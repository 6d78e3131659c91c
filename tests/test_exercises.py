"""The graded exercises (losslab.teach.exercises, notebook 05).

cpu tier: the files, the ladder order, the grade's verdicts (green only when everything passes;
a kernel that hung or faulted in its child process is red and says so). compile tier:
skeletons and solutions compile, the solution's machine code shows the rung's idea and the
skeleton's does not. gpu tier: solutions pass and skeletons fail, graded in a child process;
a vectorize that ignores the unaligned head is graded red, not a dead notebook.
"""
import pytest

from losslab import build, problems
from losslab.measure.check import CheckResult
from losslab.teach import custom, exercises, isolated


@pytest.mark.parametrize("exercise", exercises.EXERCISES, ids=lambda e: e.key)
def test_exercise_files(exercise):
    """A skeleton with FILL ME IN and the launcher, a solution without FILL ME IN, no torch headers."""
    skeleton, solution = exercise.skeleton.read_text(), exercise.solution.read_text()
    assert "FILL ME IN" in skeleton and "FILL ME IN" not in solution
    for text in (skeleton, solution):
        assert f"{exercise.problem}_custom_forward(" in text and "torch/" not in text
    assert exercise.key in exercises.task(exercise.key).plain


def test_exercise_ladder_order():
    rungs = [e.rung for e in exercises.EXERCISES]
    ladder = problems.get("kl_div").variants
    assert rungs == sorted(rungs, key=ladder.index) and len(rungs) >= 3


def test_unknown_exercise():
    with pytest.raises(ValueError, match="exercise: no exercise 'tensor_cores'"):
        exercises.get("tensor_cores")


def _check(passed: bool) -> CheckResult:
    return CheckResult("kl_div", "vectorize", "random", (3, 4), "forward", 1e-8 if passed else 1.0, 1e-5, passed)


def test_grade_is_green_only_when_everything_passes():
    assert exercises.Grade("vectorize", "x.cu", True, sass={"LDG.E.128": True}, checks=[_check(True)]).passed
    assert not exercises.Grade("vectorize", "x.cu", True, sass={"LDG.E.128": False}, checks=[_check(True)]).passed
    assert not exercises.Grade("vectorize", "x.cu", True, checks=[_check(True), _check(False)]).passed
    waiting = exercises.Grade("vectorize", "x.cu", True, note="the checks need a CUDA GPU")
    assert not waiting.passed and "not run (the checks need a CUDA GPU)" in "\n".join(waiting.lines())
    assert "not graded yet" in "\n".join(waiting.lines())
    assert "does not compile" in "\n".join(exercises.Grade("vectorize", "x.cu", False, "line 3: error").lines())


def test_a_kernel_that_faulted_is_graded_red_with_the_verdict(monkeypatch):
    """On a GPU the checks run in a child: a fault there is part of the grade, never an exception."""
    outcome = isolated.Outcome("cuda_error", message="AcceleratorError: CUDA error: misaligned address",
                               hint=isolated.cuda_hint("misaligned address"))
    monkeypatch.setattr(custom, "compile_variant", lambda *a, **k: object())
    monkeypatch.setattr(custom, "check", lambda *a, **k: custom.CheckRun(outcome, None))
    monkeypatch.setattr(custom, "check_source", lambda *a, **k: type("C", (), {"sass": lambda self: "LDG.E.128"})())
    grade = exercises.grade("vectorize", "// any source", gpu=True)
    text = "\n".join(grade.lines())
    assert not grade.passed and "RED: not yet" in text and "not graded yet" not in text
    assert "the kernel did not finish" in text and "misaligned address" in text and "peel the row's head" in text
    assert 'color:#b00' in grade._repr_mimebundle_()["text/html"]


# --- compile tier ------------------------------------------------------------------------------------------

@pytest.mark.compile
@pytest.mark.parametrize("exercise", exercises.EXERCISES, ids=lambda e: e.key)
def test_skeleton_and_solution_compile(exercise, tmp_path):
    """Both compile; the solution's machine code shows the rung's idea and the skeleton's does not."""
    compiled = {kind: custom.check_source(exercise.problem, path.read_text(), exercise.key, root=tmp_path)
                for kind, path in (("skeleton", exercise.skeleton), ("solution", exercise.solution))}
    assert compiled["skeleton"].folder != compiled["solution"].folder
    if not exercise.sass:
        return
    try:
        sass = {kind: c.sass() for kind, c in compiled.items()}
    except build.BuildError as err:
        pytest.skip(f"cuobjdump missing: {err}")
    for opcode in exercise.sass:
        assert opcode in sass["solution"] and opcode not in sass["skeleton"]


# --- gpu tier ----------------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("exercise", exercises.EXERCISES, ids=lambda e: e.key)
def test_solution_passes_and_skeleton_fails(exercise):
    solved = exercises.grade(exercise.key, solution=True)
    assert solved.passed, "\n".join(solved.lines())
    skeleton = exercises.grade(exercise.key)
    assert not skeleton.passed and (skeleton.fault or skeleton.checks is not None), "\n".join(skeleton.lines())


@pytest.mark.gpu
def test_vectorize_without_the_head_is_graded_red_and_the_gpu_stays_usable():
    import torch

    solution = exercises.get("vectorize").solution.read_text()
    marker = "head = min(D, int64_t(floats_to_alignment(p)));"
    assert marker in solution
    headless = solution.replace(marker, "head = 0;  // wrong: assumes every row is 16-byte aligned")
    grade = exercises.grade("vectorize", headless)
    text = "\n".join(grade.lines())
    assert not grade.passed and ("misaligned address" in text or grade.checks is not None), text
    assert torch.ones(4, device="cuda").sum().item() == 4.0
