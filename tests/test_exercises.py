"""The graded exercises (losslab.teach.exercises, notebook 05).

cpu tier: the files, the ladder order, skeletons that state a contract without the answer, the
grade's verdicts (green only when everything passes; a kernel that hung or faulted in its child
process is red and says so). compile tier (nvcc, and g++ for the simulator): skeletons and
solutions compile, the solution's machine code passes the exercise's checks and the skeleton's
does not; without a GPU a grade runs the kernel in the CPU simulator and names what is wrong;
with a (mocked) failing GPU check the simulator's diagnosis is added; opcode checks and compile
errors explain themselves. gpu tier: solutions pass and skeletons and wrong answers fail, graded
in a child process, wrong answers with the simulator's diagnosis; a vectorize that ignores the
unaligned head is graded red, not a dead notebook.
"""
import shutil
import subprocess

import pytest

from losslab import build
from losslab.build import ladder
from losslab.measure.check import CheckResult
from losslab.teach import custom, exercises, isolated
from losslab.teach import simulator as sim

# The exercises of the losses added after kl_div and cross_entropy (issue 29): four a loss, one a rung above naive.
NEW_KEYS = ["mse_block_sum", "mse_warp_sum", "mse_vectorize", "mse_fused",
            "hinge_coalesce", "hinge_warp_partials", "hinge_vectorize", "hinge_fused",
            "smooth_l1_coalesce", "smooth_l1_warp_sum", "smooth_l1_vectorize", "smooth_l1_fused",
            "cosine_block_dots", "cosine_warp_dots", "cosine_vectorize", "cosine_fused",
            "triplet_block_squares", "triplet_warp_squares", "triplet_vectorize", "triplet_fused"]
NEW = [exercises.get(key) for key in NEW_KEYS]


@pytest.mark.parametrize("exercise", exercises.EXERCISES, ids=lambda e: e.key)
def test_exercise_files(exercise):
    """A skeleton with FILL ME IN and the launcher, a solution without FILL ME IN, no torch headers."""
    skeleton, solution = exercise.skeleton.read_text(), exercise.solution.read_text()
    assert "FILL ME IN" in skeleton and "FILL ME IN" not in solution
    for text in (skeleton, solution):
        assert f"{exercise.problem}_custom_forward(" in text and "torch/" not in text
    assert exercise.key in exercises.task(exercise.key).plain


def test_exercise_ladder_order():
    """One idea of a ladder each; each rebuilds a real rung, and every rung above naive of each loss with
    exercises has one (a skeleton's number is its place in this list)."""
    assert [e.key for e in exercises.EXERCISES] == [
        "coalesce", "warp_shuffle", "vectorize", "online_softmax", "fused",
        "logsumexp_tree", "warp_max", "vectorize_logits", "fused_softmax", "cluster",
        *NEW_KEYS]
    for number, e in enumerate(exercises.EXERCISES, start=1):
        assert e.rung in ladder.rungs(e.problem) and 5 <= e.minutes <= 45
        assert e.skeleton.read_text().startswith(f"// Exercise {number} -- ")
    for problem in {e.problem for e in exercises.EXERCISES}:
        assert {e.rung for e in exercises.EXERCISES if e.problem == problem} == set(ladder.rungs(problem)) - {"naive"}


@pytest.mark.parametrize("exercise", exercises.EXERCISES, ids=lambda e: e.key)
def test_skeleton_states_the_contract_not_the_answer(exercise):
    """The solution's first new line (the loop, the shuffle, the rescale...) is nowhere in the skeleton, not
    even as a comment, and most of its other new lines neither (a skeleton may quote the rung below as context)."""
    skeleton, solution = exercise.skeleton.read_text(), exercise.solution.read_text()
    assert "Contract" in skeleton
    answer = [line.split("//")[0].strip() for line in solution.splitlines()
              if line.strip() and line not in skeleton.splitlines() and not line.lstrip().startswith("//")]
    answer = [a for a in answer if len(a) > 12 and a not in ("}", "{")]
    assert answer, "the solution adds no code line"
    assert answer[0] not in skeleton, f"the skeleton spells out {answer[0]!r}"
    spelled = [line for line in answer if line in skeleton]
    assert len(spelled) <= len(answer) // 2, f"the skeleton spells out {spelled}"


def test_unknown_exercise():
    with pytest.raises(ValueError, match="exercise: no exercise 'tensor_cores'"):
        exercises.get("tensor_cores")


def _check(passed: bool) -> CheckResult:
    return CheckResult("kl_div", "vectorize", "random", (3, 4), "forward", 1e-8 if passed else 1.0, 1e-5, passed)


def test_grade_is_green_only_when_everything_passes():
    assert exercises.Grade("vectorize", "x.cu", True, sass={"LDG.E.128": True}, checks=[_check(True)]).passed
    assert not exercises.Grade("vectorize", "x.cu", True, sass={"LDG.E.128": False}, checks=[_check(True)]).passed
    assert not exercises.Grade("vectorize", "x.cu", True, checks=[_check(True), _check(False)]).passed
    waiting = exercises.Grade("vectorize", "x.cu", True, note="no CUDA GPU is visible here")
    assert not waiting.passed and "not run (no CUDA GPU is visible here)" in "\n".join(waiting.lines())
    assert "not graded yet" in "\n".join(waiting.lines())
    simulated = exercises.Grade("vectorize", "x.cu", True, simulated=True, diagnosis=["all 8 cases match"])
    assert simulated.passed and "on the CPU simulator" in "\n".join(simulated.lines())
    red = exercises.Grade("vectorize", "x.cu", True, simulated=False, diagnosis=["the tail misses"])
    assert not red.passed and "RED: not yet" in "\n".join(red.lines()) and "the tail misses" in "\n".join(red.lines())
    # one verdict: the GPU's checks and the simulator's must both pass
    assert not exercises.Grade("vectorize", "x.cu", True, checks=[_check(False)], simulated=True).passed
    assert not exercises.Grade("vectorize", "x.cu", True, checks=[_check(True)], simulated=False).passed
    assert exercises.Grade("vectorize", "x.cu", True, checks=[_check(True)], simulated=True).passed
    assert exercises.Grade("vectorize", "x.cu", True, checks=[_check(True)]).passed  # no g++ on the GPU machine
    assert "does not compile" in "\n".join(exercises.Grade("vectorize", "x.cu", False, "line 3: error").lines())


def test_coalesce_machine_code_check_reads_the_load_offsets():
    solution = ("Function : _Z24coalesced_forward_kernelPKfS0_Pfl\n LDG.E.CONSTANT R14, [R8.64+0x800] ;\n"
                " LDG.E.CONSTANT R18, [R8.64+0x400] ;\n LDG.E.CONSTANT R10, [R8.64] ;")
    sm_90 = ("Function : _Z24coalesced_forward_kernelPKfS0_Pfl\n LDG.E.CONSTANT R16, desc[UR8][R8.64+-0x800] ;\n"
             " LDG.E.CONSTANT R12, desc[UR8][R8.64+0x400] ;")
    assert exercises._strided_loads(sm_90) is True
    assert exercises._strided_loads(sm_90.replace("0x400", "0x4")) is False
    whole_row = ("Function : _Z24coalesced_forward_kernelPKfS0_Pfl\n LDG.E.CONSTANT R12, [R2.64+-0x8] ;\n"
                 " LDG.E.CONSTANT R6, [R4.64+0x4] ;")
    assert exercises._strided_loads(solution) is True
    assert exercises._strided_loads(whole_row) is False
    assert exercises._strided_loads(" LDG.E R1, [R2.64] ;") is None  # not unrolled: cannot tell
    check = exercises.get("coalesce").sass[0]
    assert "0x400" in check.label and "4 bytes" in check.why


def test_a_kernel_that_faulted_is_graded_red_with_the_verdict(monkeypatch):
    """On a GPU the checks run in a child: a fault there is part of the grade, never an exception."""
    outcome = isolated.Outcome("cuda_error", message="AcceleratorError: CUDA error: misaligned address",
                               hint=isolated.cuda_hint("misaligned address"))
    monkeypatch.setattr(custom, "compile_variant", lambda *a, **k: object())
    monkeypatch.setattr(custom, "check", lambda *a, **k: custom.CheckRun(outcome, None))
    monkeypatch.setattr(custom, "check_source", lambda *a, **k: type("C", (), {"sass": lambda self: "LDG.E.128"})())
    grade = exercises.grade("vectorize", "// any source", gpu=True, simulate=False)
    text = "\n".join(grade.lines())
    assert not grade.passed and "RED: not yet" in text and "not graded yet" not in text
    assert "the kernel did not finish" in text and "misaligned address" in text and "peel the row's head" in text
    assert 'color:#b00' in grade._repr_mimebundle_()["text/html"]


# --- compile tier ------------------------------------------------------------------------------------------

def _gxx_with_sanitizers() -> bool:
    if shutil.which("g++") is None:
        return False
    probe = subprocess.run(["g++", "-x", "c++", "-fsanitize=address,undefined", "-o", "/dev/null", "-"],
                           input="int main() { return 0; }", text=True, capture_output=True)
    return probe.returncode == 0


simulator = pytest.mark.skipif(not _gxx_with_sanitizers(), reason="g++ with sanitizers missing: no CPU simulator")
CASES = build.ROOT / "tests" / "simulator_cases"

CLUSTER_WRONG = [
    ("cluster_no_first_sync.cu", "the other CTA's part is read before it is written"),
    ("cluster_no_second_sync.cu", "a CTA may exit while the other still reads its shared memory"),
    ("cluster_own_part.cu", "map_shared_rank(&part, rank) is this CTA's own part"),
]


@pytest.mark.compile
@simulator
@pytest.mark.parametrize("key, case, expected", [
    ("coalesce", "coalesce_whole_row.cu", "the loss is 256x too large: each thread sums the whole row"),
    ("warp_shuffle", "warp_shuffle_assign.cu", "a shuffle result must be added"),
    ("warp_shuffle", "warp_shuffle_no16.cu", "offset 16 is missing"),
    ("vectorize", "vectorize_no_head.cu", "misaligned 16-byte load at row 1: peel the head first"),
    ("online_softmax", "online_softmax_no_rescale.cu", "rescale each by exp(its max - the combined max)"),
    ("fused", "fused_no_inv_b.cu", "the gradient is B = 3 times too large"),
])
def test_without_a_gpu_a_wrong_answer_gets_its_specific_message(key, case, expected):
    grade = exercises.grade(key, (CASES / case).read_text(), gpu=False)
    text = "\n".join(grade.lines())
    assert not grade.passed and grade.simulated is False and expected in text, text
    assert "RED: not yet" in text and "not graded yet" not in text


@pytest.mark.compile
@simulator
@pytest.mark.parametrize("exercise", NEW, ids=lambda e: e.key)
def test_without_a_gpu_the_skeleton_is_red_and_the_solution_green(exercise):
    """The skeleton as shipped compiles and is red on the simulator with a hint (and "the FILL ME IN ... is
    still to do"); the solution is green, machine code included."""
    skeleton = exercises.grade(exercise.key, gpu=False)
    text = "\n".join(skeleton.lines())
    assert skeleton.compiled and skeleton.simulated is False and not skeleton.passed, text
    assert "FILL ME IN" in text and skeleton.hint and "RED: not yet" in text, text
    assert not exercise.sass or not all(skeleton.sass.values()), text
    solved = exercises.grade(exercise.key, solution=True, gpu=False)
    assert solved.passed and all(solved.sass.values()), "\n".join(solved.lines())


# The new exercises' wrong answers: each hint with the mistake it names (the simulator's; the machine code's:
# test_the_machine_code_check_refuses_a_wrong_answer_on_every_architecture).
NEW_WRONG = [
    ("mse_block_sum", "mse_block_sum_no_barrier.cu", "the loss changes with the order the threads run"),
    ("mse_warp_sum", "mse_warp_sum_assign.cu", "a shuffle result must be added"),
    ("mse_warp_sum", "mse_warp_sum_no16.cu", "offset 16 is missing"),
    ("mse_vectorize", "mse_vectorize_no_tail.cu", "the scalar tail misses the last D % 4 elements"),
    ("mse_fused", "mse_fused_no_two.cu", "d/dp of (p - t)^2 is 2 (p - t)"),
    ("mse_fused", "mse_fused_no_mean.cu", "the gradient is B D = 3000 times too large"),
    ("hinge_coalesce", "hinge_coalesce_whole_row.cu", "the loss is 256x too large: each thread sums the whole row"),
    ("hinge_warp_partials", "hinge_warp_partials_no_barrier.cu", "a missing __syncthreads()"),
    ("hinge_warp_partials", "hinge_warp_partials_every_lane.cu", "index 8 out of bounds for type 'float [8]'"),
    ("hinge_vectorize", "hinge_vectorize_whole_tile.cu", "1 element(s) past the end of predictions"),
    ("hinge_fused", "hinge_fused_no_mean.cu", "the gradient is B D = 3000 times too large"),
    ("smooth_l1_coalesce", "smooth_l1_coalesce_step_one.cu", "elements of a row are added the wrong number of times"),
    ("smooth_l1_coalesce", "smooth_l1_coalesce_chunk.cu", "thread k must start at element k and step by THREADS"),
    ("smooth_l1_warp_sum", "smooth_l1_warp_sum_no1.cu", "offset(s) 1 missing"),
    ("smooth_l1_vectorize", "smooth_l1_vectorize_tail_every_thread.cu", "every thread adds the whole tail"),
    ("smooth_l1_vectorize", "smooth_l1_vectorize_no_head.cu", "misaligned 16-byte load at row 1: peel the head first"),
    ("smooth_l1_fused", "smooth_l1_fused_mse_factor.cu", "the gradient is 2 times the reference"),
    ("smooth_l1_fused", "smooth_l1_fused_sign.cu", "the gradient has the wrong sign"),
    ("cosine_block_dots", "cosine_block_dots_no_barrier.cu", "the loss changes with the order the threads run"),
    ("cosine_block_dots", "cosine_block_dots_one_sum.cu", "the row's p.p is wrong on 3 x 1000"),
    ("cosine_warp_dots", "cosine_warp_dots_no16.cu", "a shuffle result added at offsets 16, 8, 4, 2 and 1"),
    ("cosine_vectorize", "cosine_vectorize_no_tail.cu", "the elements in the scalar tail never reach the sums"),
    ("cosine_vectorize", "cosine_vectorize_tail_every_thread.cu", "the scalar tail are added by every thread"),
    ("cosine_vectorize", "cosine_vectorize_scalar.cu", "read the packs through float4 loads"),
    ("cosine_fused", "cosine_fused_sign.cu", "the gradient has the wrong sign"),
    ("cosine_fused", "cosine_fused_no_mean.cu", "the gradient is B = 3 times too large"),
    ("triplet_block_squares", "triplet_block_squares_no_barrier.cu", "the loss changes with the order the threads run"),
    ("triplet_block_squares", "triplet_block_squares_one_sum.cu", "slot 0 must end with the block's sums of both"),
    ("triplet_warp_squares", "triplet_warp_squares_assign.cu", "a shuffle result added at offsets 16, 8, 4, 2 and 1"),
    ("triplet_vectorize", "triplet_vectorize_d_packs.cu", "out-of-bounds read"),
    ("triplet_vectorize", "triplet_vectorize_scalar.cu", "read the packs through float4 loads"),
    ("triplet_fused", "triplet_fused_no_mean.cu", "the gradient is N = 3 times too large"),
]


MACHINE_CODE_ONLY = ("_chunk.cu", "_scalar.cu")  # right numbers: only the machine code's check fails


@pytest.mark.compile
@simulator
@pytest.mark.parametrize("key, case, expected", NEW_WRONG)
def test_without_a_gpu_a_new_exercise_s_wrong_answer_gets_its_hint(key, case, expected):
    """The grade's hint: the machine code's, or the simulator's first message (the grade's hint then; read
    from the simulator alone, no nvcc: the skeleton-and-solution tests build the rest of the grade)."""
    source = (CASES / case).read_text()
    if case.endswith(MACHINE_CODE_ONLY):
        grade = exercises.grade(key, source, gpu=False, simulate=False)
        assert not grade.passed and expected in grade.hint, "\n".join(grade.lines())
    else:
        cpu = sim.grade_on_cpu(key, source)
        assert not cpu.passed and expected in cpu.messages[0], str(cpu)


@pytest.mark.compile
@simulator
def test_without_a_gpu_the_solution_is_green_on_the_simulator():
    grade = exercises.grade("coalesce", solution=True, gpu=False)
    assert grade.passed, "\n".join(grade.lines())
    assert grade.sass == {exercises.get("coalesce").sass[0].label: True}


@pytest.mark.compile
@simulator
def test_shfl_down_is_explained_not_refused():
    grade = exercises.grade("warp_shuffle", (CASES / "warp_shuffle_down.cu").read_text(), gpu=False)
    text = "\n".join(grade.lines())
    assert grade.passed and "SHFL.DOWN (__shfl_down_sync) is fine here: only lane 0's result is used" in text, text


@pytest.mark.compile
@simulator
def test_a_failing_gpu_check_gets_the_simulator_s_diagnosis(monkeypatch):
    """On a GPU the numbers say by how much; the simulator's message says what is wrong."""
    failing = custom.CheckRun(isolated.Outcome("ok", value=[]), [_check(False)])
    monkeypatch.setattr(custom, "compile_variant", lambda *a, **k: object())
    monkeypatch.setattr(custom, "check", lambda *a, **k: failing)
    grade = exercises.grade("coalesce", (CASES / "coalesce_whole_row.cu").read_text(), gpu=True)
    text = "\n".join(grade.lines())
    assert not grade.passed and "GPU checks: 0 of 1 passed" in text
    assert "what is wrong (CPU simulator):" in text and "each thread sums the whole row" in text, text


ONE_VERDICT = [  # answers whose numbers pass on a GPU, rejected by the machine code or the simulator
    ("coalesce", "coalesce_chunk.cu", "each thread walks its own run of consecutive elements"),
    ("warp_shuffle", "warp_shuffle_half_mask.cu", "lane 16 is not in the mask 0x0000ffff: its value is undefined"),
    ("coalesce", "coalesce_lost_update.cu", "lost update: threads 0 and 1 of block 0 both update shared partial[0]"),
]


@pytest.mark.compile
@simulator
@pytest.mark.parametrize("key, case, expected", ONE_VERDICT)
def test_one_verdict_a_passing_gpu_does_not_overrule_the_simulator(key, case, expected, monkeypatch):
    """The GPU's checks (faked: all pass) add evidence on top of the simulator and the machine code, never
    instead: both false passes seen on an H100 are red, with the hint a machine without a GPU gives."""
    passing = custom.CheckRun(isolated.Outcome("ok", value=[]), [_check(True)])
    monkeypatch.setattr(custom, "compile_variant", lambda *a, **k: object())
    monkeypatch.setattr(custom, "check", lambda *a, **k: passing)
    source = (CASES / case).read_text()
    on_gpu, on_cpu = exercises.grade(key, source, gpu=True), exercises.grade(key, source, gpu=False)
    text = "\n".join(on_gpu.lines())
    assert on_gpu.on_gpu and not on_gpu.passed and "GPU checks: 1 of 1 passed" in text and "RED" in text, text
    assert not on_cpu.passed and on_gpu.hint == on_cpu.hint and expected in on_gpu.hint, on_gpu.hint
    solved = exercises.grade(key, solution=True, gpu=True)
    assert solved.passed and "GREEN: done (on the GPU and the CPU simulator)" in solved.lines()[-1]


@pytest.mark.compile
def test_a_compile_error_gets_a_hint():
    source = (CASES / "warp_shuffle_no_sync.cu").read_text()
    grade = exercises.grade("warp_shuffle", source, gpu=False, simulate=False)
    assert not grade.compiled
    assert "hint: did you mean __shfl_xor_sync (CUDA 9+ needs the mask)?" in "\n".join(grade.lines())

ARCHS = pytest.mark.parametrize("arch", ["8.0", "9.0"])  # sm_80 here (no GPU), sm_90 on an H100/H200


@pytest.mark.compile
@pytest.mark.parametrize("exercise, arch", [(e, arch) for e in exercises.EXERCISES for arch in ("8.0", "9.0")
                                            if e not in NEW or (e.sass and arch == "8.0")],
                         ids=lambda x: getattr(x, "key", x))
def test_skeleton_and_solution_compile(exercise, arch, tmp_path, monkeypatch):
    """Both compile; the solution's machine code shows the rung's idea and the skeleton's does not, for the
    architecture of a machine without a GPU and of the GPU machine (sm_90's SASS spells loads desc[UR][R.64]
    and keeps more of an unfinished skeleton: a relative check compares with the skeleton's own SASS). The
    new exercises at sm_80 alone, where they have a machine-code check: their red and green grades read
    sm_90's (test_without_a_gpu_the_skeleton_is_red_and_the_solution_green; the tests build for sm_90 where
    no GPU is visible, conftest.py)."""
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", arch)
    compiled = {kind: custom.check_source(exercise.problem, path.read_text(), exercise.key, root=tmp_path)
                for kind, path in (("skeleton", exercise.skeleton), ("solution", exercise.solution))}
    assert compiled["skeleton"].folder != compiled["solution"].folder
    if not exercise.sass:
        return
    try:
        sass = {kind: c.sass() for kind, c in compiled.items()}
    except build.BuildError as err:
        pytest.skip(f"cuobjdump missing: {err}")
    assert all(check.found(sass["solution"], sass["skeleton"]) for check in exercise.sass)
    assert not all(check.found(sass["skeleton"], sass["skeleton"]) for check in exercise.sass)


@pytest.mark.compile
@ARCHS
@pytest.mark.parametrize("key, case, expected", [
    ("coalesce", "coalesce_chunk.cu", "thread k must start at element k and step by THREADS"),
    ("online_softmax", "online_softmax_no_rescale.cu", "rescale each part's sum"),
    ("mse_block_sum", "mse_block_sum_no_barrier.cu", "a __syncthreads() after each step of the tree"),
    ("mse_vectorize", "mse_vectorize_scalar.cu", "read the packs through float4 loads"),
    ("hinge_coalesce", "hinge_coalesce_chunk.cu", "thread k must start at element k and step by THREADS"),
    ("hinge_vectorize", "hinge_vectorize_scalar.cu", "read the packs through float4 loads"),
])
def test_the_machine_code_check_refuses_a_wrong_answer_on_every_architecture(key, case, expected, arch, monkeypatch):
    """A thread walking its own chunk (4-byte load offsets), a combine without the rescale (no more exps
    than the skeleton), a tree without its barriers and packs read one float at a time fail their SASS
    check on sm_80 and on sm_90 alike, with the check's hint."""
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", arch)
    grade = exercises.grade(key, (CASES / case).read_text(), gpu=False, simulate=False)
    assert grade.compiled and list(grade.sass.values()) == [False], grade.lines()
    assert not grade.passed and grade.hint.startswith("the machine code lacks") and expected in grade.hint, grade.hint


# --- gpu tier ----------------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("exercise", exercises.EXERCISES, ids=lambda e: e.key)
def test_solution_passes_and_skeleton_fails(exercise):
    solved = exercises.grade(exercise.key, solution=True)
    assert solved.passed, "\n".join(solved.lines())
    skeleton = exercises.grade(exercise.key)
    assert not skeleton.passed and (skeleton.fault or skeleton.checks is not None), "\n".join(skeleton.lines())


@pytest.mark.gpu
@pytest.mark.parametrize("key, case, expected", [
    ("coalesce", "coalesce_whole_row.cu", "each thread sums the whole row"),
    ("warp_shuffle", "warp_shuffle_assign.cu", "a shuffle result must be added"),
    ("warp_shuffle", "warp_shuffle_no16.cu", "offset 16 is missing"),
    ("vectorize", "vectorize_no_tail.cu", "the scalar tail misses"),
    ("online_softmax", "online_softmax_no_rescale.cu", "the max is right but the sum is not"),
    ("online_softmax", "online_softmax_overflow.cu", "the sum is NaN or inf"),
    ("fused", "fused_no_inv_b.cu", "the gradient is B = 3 times too large"),
    ("fused", "fused_sign.cu", "the gradient has the wrong sign"),
    ("logsumexp_tree", "logsumexp_tree_no_barrier.cu", "the loss changes with the order the threads run"),
    ("logsumexp_tree", "logsumexp_tree_no_rescale.cu", "the max is right but the sum is not"),
    ("warp_max", "warp_max_down.cu", "every lane needs the warp's max"),
    ("warp_max", "warp_max_no16.cu", "some lanes' values never reach the warp's max"),
    ("vectorize_logits", "vectorize_logits_no_tail.cu", "the scalar tail misses"),
    ("vectorize_logits", "vectorize_logits_tail_every_thread.cu", "the tail is added more than once"),
    ("vectorize_logits", "vectorize_logits_no_head.cu", "misaligned 16-byte load"),
    ("fused_softmax", "fused_softmax_no_onehot.cu", "wrong only at each row's target class"),
    ("fused_softmax", "fused_softmax_no_scale.cu", "the gradient is n_valid = 3 times too large"),
    *(("cluster", case, expected) for case, expected in CLUSTER_WRONG),
    *((key, case, expected) for key, case, expected in NEW_WRONG if not case.endswith(MACHINE_CODE_ONLY)),
])
def test_wrong_answers_fail_on_the_gpu_with_the_diagnosis(key, case, expected):
    grade = exercises.grade(key, (CASES / case).read_text())
    text = "\n".join(grade.lines())
    assert not grade.passed and (grade.fault or grade.checks is not None), text
    if _gxx_with_sanitizers() or exercises.get(key).cpu_check:
        assert expected in text, text


@pytest.mark.gpu
@pytest.mark.parametrize("key, case, expected", ONE_VERDICT)
def test_one_verdict_on_the_gpu(key, case, expected):
    """On the hardware these answers' numbers may well be right; the grade is red with the CPU's hint."""
    grade = exercises.grade(key, (CASES / case).read_text())
    text = "\n".join(grade.lines())
    assert grade.on_gpu and not grade.passed, text
    if _gxx_with_sanitizers() or case == "coalesce_chunk.cu":  # the machine code's check: no simulator needed
        assert expected in grade.hint, text


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


def test_the_simulator_knows_every_exercise_and_its_problem():
    """Every exercise but those the CPU checks otherwise (cluster: no clusters in the simulator)."""
    from losslab.teach.simulator import diagnose

    assert {k: t.problem for k, t in diagnose.EXERCISES.items()} == \
        {e.key: e.problem for e in exercises.EXERCISES if e.cpu_check is None}
    assert [e.key for e in exercises.EXERCISES if e.cpu_check] == ["cluster"]
    assert "on a GPU only" in exercises.get("cluster").skeleton.read_text()


@pytest.mark.parametrize("case, expected", CLUSTER_WRONG)
def test_the_cluster_exercise_s_source_check_names_each_mistake(case, expected):
    """No clusters on the CPU: the source shows the barriers and the DSMEM read (the GPU grades the numbers)."""
    check = exercises.get("cluster").cpu_check
    messages = check((CASES / case).read_text())
    assert len(messages) == 1 and expected in messages[0], messages
    assert check(exercises.get("cluster").solution.read_text()) == []
    assert "is never read" in check(exercises.get("cluster").skeleton.read_text())[0]


@pytest.mark.parametrize("exercise", exercises.EXERCISES, ids=lambda e: e.key)
def test_skeleton_names_the_grade_command_and_a_real_module(exercise):
    """The skeleton says how to grade it: the shell command with its own path, and a module that exists."""
    skeleton = exercise.skeleton.read_text()
    assert f"python -m losslab grade {exercise.skeleton.relative_to(build.ROOT)}" in skeleton
    assert "losslab.exercises" not in skeleton and f'losslab.teach.exercises.grade("{exercise.key}")' in skeleton


@pytest.mark.parametrize("exercise", exercises.EXERCISES, ids=lambda e: e.key)
def test_find_names_the_exercise_from_its_path_or_its_marker(exercise, tmp_path):
    assert exercises.find(exercise.skeleton) == (exercise, False)
    assert exercises.find(exercise.solution) == (exercise, True)
    copy = tmp_path / "mine.cu"  # a copy elsewhere: the skeleton's comment names it
    copy.write_text(exercise.skeleton.read_text())
    assert exercises.find(copy) == (exercise, False)


def test_find_refuses_a_file_that_is_no_exercise(tmp_path):
    other = tmp_path / "other.cu"
    other.write_text("__global__ void k() {}\n")
    with pytest.raises(ValueError, match="is not an exercise"):
        exercises.find(other)


@pytest.mark.parametrize("source", ["", "  \n\n"])
def test_an_empty_answer_is_red_the_file_is_empty(source):
    """No nvcc, no simulator needed: an empty source is a verdict, not a ValueError from the build."""
    grade = exercises.grade("coalesce", source, gpu=False)
    assert not grade.passed and not grade.waiting
    assert grade.hint.startswith("the file is empty")
    assert "the file is empty" in "\n".join(grade.lines()) and "RED: not yet" in grade.lines()[-1]
