"""Evaluating single-file KernelBench solutions (losslab.evaluate); the export's own tests are in test_export.py.

cpu tier: verdicts from fixture results, the CLI, argument and path errors (raised before
anything runs), and the child process end to end in its CPU dry run on Python-only solutions
(each failure kind, bfloat16 and float16, a solution that patches the timer, each cheat of
tests/solutions/ that needs no GPU: a forged verdict, mutated inputs, a sabotaged reference,
reduced precision, skipped rows, an escaped process; forward only);
compile tier: a broken exported solution and a verbose load_inline build give compile_error
with the compiler's first error;
gpu tier: exported solutions pass the full protocol (16-bit too), broken ones give the right
verdict, each timing trick in tests/solutions/ is caught (a forged clock, replayed graphs,
late writes, side streams, cached results), one row in eight fails at KernelBench's size for
both losses, and the caller's CUDA context survives them.
"""
import importlib.util
import json
import os
import re
import textwrap
from pathlib import Path

import pytest
import torch

from losslab import build, problems
from losslab.__main__ import main
from losslab.kernelbench.evaluate import STATUSES, Verdict, evaluate
from losslab.kernelbench.export import export_solution

KL_DIV = problems.get("kl_div")

SOLUTIONS_DIR = Path(__file__).parent / "solutions"  # cheating and broken solutions, one trick each
PAIRS = [(p, v) for p in problems.names() for v in problems.get(p).variants]
# the batchmean mistake: divide by every element, not by the batch size (kl_div vectorized.cu, whose
# grid has one block per row)
RIGHT_DIVISOR = "finish_sum(block_reduce_sum(sum), row_partials, ticket, float(gridDim.x), loss);"
WRONG_DIVISOR = "finish_sum(block_reduce_sum(sum), row_partials, ticket, float(gridDim.x) * float(D), loss);"

# Python-only solutions for kl_div: each shows one way to fail
SOLUTIONS = {
    # float32 arithmetic, one rounding to the inputs' dtype: what an honest kernel does in 16-bit too
    "good": "return ((t.float() * (t.float().log() - p.float().log())).sum() / p.shape[0]).to(p.dtype)",
    "wrong_values": "return (t * (t.log() - p.log())).mean()  # batchmean is not the mean",
    "wrong_shape": "return (t * (t.log() - p.log())).sum().reshape(1) / p.shape[0]",
    "raised": "raise IndexError('row out of range')",
    "timed_out": "while True: pass",
    "crashed": "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)",
}


def write_solution(folder, name: str, body: str) -> str:
    path = folder / f"{name}.py"
    path.write_text(textwrap.dedent(f"""\
        import torch, torch.nn as nn

        class ModelNew(nn.Module):
            def forward(self, p, t):
                {body}
        """))
    return str(path)


def load_module(path):
    """Import one of OUR exported files (it builds nothing until ModelNew())."""
    spec = importlib.util.spec_from_file_location("exported_solution", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- cpu tier: verdicts ----------------------------------------------------------------------

FIXTURE_PASSED = {
    "status": "passed", "stage": "done", "device": "Fixture GPU",
    "trials": [{"trial": i, "seed": i, "shape": [], "dtype": "float32", "value": 1.0, "reference": 1.0,
                "max_abs_diff": 1e-7, "allclose": True, "rel_error_fp64": 2e-8} for i in range(5)],
    "backward": {"supported": True, "rel_error": 3e-8, "tolerance": 1e-6, "passed": True, "detail": ""},
    "repeatable": True, "memory": {"solution_bytes": 65536, "eager_bytes": 4 * 2**30},
    "timing": {"solution_ms": 0.5, "solution_p10_ms": 0.49, "solution_p90_ms": 0.52, "eager_ms": 2.0,
               "eager_p10_ms": 2.0, "eager_p90_ms": 2.1, "compile_ms": 0.6, "compile_p10_ms": 0.6,
               "compile_p90_ms": 0.6, "speedup_eager": 4.0, "speedup_compile": 1.2, "repeats": 20},
    "solution_inputs": {"get_inputs": ["(16384, 16384) float32"] * 2, "get_init_inputs": []},
    "an_unknown_key": "ignored",
}
FIELDS = dict(problem="kl_div", solution="solution.py", shape=(16384, 16384))


def test_passed_verdict_formats_every_measurement():
    verdict = Verdict.from_child(FIXTURE_PASSED, **FIELDS)
    text = verdict.format()
    assert verdict.passed and text.startswith("solution.py: PASSED (kl_div 16384x16384 float32, Fixture GPU)")
    for shown in ("5/5 random trials", "speedup 4.00x", "speedup 1.20x", "64.0 KiB", "4.0 GiB",
                  "bitwise repeatable: yes", "relative error vs float64 3e-08", "reported; the problem's"):
        assert shown in text, shown
    assert "what to do" not in text


@pytest.mark.parametrize("status, result, expected", [
    ("wrong_values", {"message": "trial 2 (seed 2): got 1e-05, reference 0.05", "stage": "correctness",
                      "trials": [{"trial": 0, "max_abs_diff": 0.05, "allclose": False, "rel_error_fp64": 1.0}]},
     ["WRONG VALUES", "trial 2 (seed 2)", "batchmean divides by the batch size B only", "0/1 random trials"]),
    ("compile_error", {"message": "cuda.cu(12): error: expected a \";\"", "stage": "load",
                       "detail": "Error building extension 'x':\ncuda.cu(12): error: expected a \";\""},
     ["COMPILE ERROR", "cuda.cu(12): error", "Fix the build error", "details:"]),
    ("timed_out", {"message": "no result after 5 s; it was in stage 'correctness' (killed)"},
     ["TIMED OUT", "infinite loop"]),
    ("crashed", {"message": "the process died (killed by signal 11)"}, ["CRASHED", "compute-sanitizer"]),
])
def test_failed_verdict_says_why_and_what_to_do(status, result, expected):
    text = Verdict.from_child({"status": status, **result}, **FIELDS).format()
    for shown in expected:
        assert shown in text, shown


def test_every_failure_has_advice():
    from losslab.kernelbench.evaluate import ADVICE

    assert set(ADVICE) == set(STATUSES) - {"passed"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_without_gpu_evaluate_fails_fast(tmp_path):
    verdict = evaluate(write_solution(tmp_path, "good", SOLUTIONS["good"]), "kl_div")
    assert verdict.status == "no_gpu" and "no CUDA GPU" in verdict.message and verdict.seconds == 0.0


def test_evaluate_rejects_bad_arguments(tmp_path):
    with pytest.raises(FileNotFoundError, match="solution_path"):
        evaluate(tmp_path / "missing.py", "kl_div")
    path = write_solution(tmp_path, "good", SOLUTIONS["good"])
    with pytest.raises(ValueError, match="size"):
        evaluate(path, "kl_div", size="huge")
    with pytest.raises(ValueError, match="problem"):
        evaluate(path, "softmax")


def test_path_errors_name_the_argument_before_anything_runs(tmp_path, monkeypatch):
    """The CLI prints these as one line: nothing may be spawned first."""
    from losslab import child_process

    def spawn(*args, **kwargs):
        raise AssertionError("a child was started")

    monkeypatch.setattr(child_process.subprocess, "Popen", spawn)
    good = write_solution(tmp_path, "good", SOLUTIONS["good"])
    with pytest.raises(FileNotFoundError, match=r"^solution_path: no file .*missing\.py"):
        evaluate(tmp_path / "missing.py", "kl_div", device="cpu")
    with pytest.raises(ValueError, match=r"^solution_path: .* is a directory"):
        evaluate(tmp_path, "kl_div", device="cpu")
    with pytest.raises(FileNotFoundError, match=r"^json_path: the folder .*nowhere does not exist"):
        evaluate(good, "kl_div", device="cpu", json_path=tmp_path / "nowhere" / "v.json")
    with pytest.raises(ValueError, match=r"^json_path: .* is a directory"):
        evaluate(good, "kl_div", device="cpu", json_path=tmp_path)
    with pytest.raises(ValueError, match=r"^size: expected a size name or two positive integers"):
        evaluate(good, "kl_div", device="cpu", size=(0, 5))
    with pytest.raises(ValueError, match=r"^dtype: expected one of float32, bfloat16, float16, got 'float64'"):
        evaluate(good, "kl_div", device="cpu", dtype="float64")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_the_verdict_is_written_to_json_path(tmp_path):
    verdict = evaluate(write_solution(tmp_path, "good", SOLUTIONS["good"]), "kl_div", json_path=tmp_path / "v.json")
    assert json.loads((tmp_path / "v.json").read_text())["status"] == verdict.status == "no_gpu"


# --- cpu tier: the child end to end, in its CPU dry run -----------------------------------------

@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("kind", ["good", "wrong_values"])
def test_evaluate_in_16_bit(tmp_path, dtype, kind):
    """bfloat16 used to crash the child (numpy has no bfloat16): every solution was 'crashed'."""
    path = write_solution(tmp_path, kind, SOLUTIONS[kind])
    verdict = evaluate(path, "kl_div", size="narrow", dtype=dtype, device="cpu")
    assert verdict.status == ("passed" if kind == "good" else kind), verdict.format()
    assert verdict.dtype == dtype and f"3x1000 {dtype}" in verdict.format()
    if kind == "good":
        assert verdict.repeatable and verdict.backward["passed"] and len(verdict.trials) == 10


def test_a_solution_that_patches_the_timer_is_tampered(tmp_path):
    verdict = evaluate(SOLUTIONS_DIR / "patched_timer.py", "kl_div", size="narrow", device="cpu")
    assert verdict.status == "tampered", verdict.format()
    for name in ("torch.cuda.Event.elapsed_time", "time.perf_counter", "torch.cuda.synchronize"):
        assert name in verdict.message


# --- cpu tier: the child end to end, in its CPU dry run -----------------------------------------

@pytest.mark.parametrize("kind", list(SOLUTIONS))
def test_child_classifies_each_failure(tmp_path, kind):
    """Python-only solutions on CPU tensors: load, correctness, backward, repeatability."""
    path = write_solution(tmp_path, kind, SOLUTIONS[kind])
    verdict = evaluate(path, "kl_div", size="narrow", device="cpu", timeout_s=20 if kind == "timed_out" else 120)
    expected = "passed" if kind == "good" else kind
    assert verdict.status == expected, verdict.format()
    if kind == "good":
        assert len(verdict.trials) == 10 and verdict.backward["passed"] and verdict.repeatable
        assert {t["kind"] for t in verdict.trials} == {"random", "structured"}
        assert all(t["condition"] > 1 for t in verdict.trials) and "condition number" in verdict.format()
    if kind == "wrong_values":
        assert re.match(r"trial 0 \(random inputs, seed \d+\)", verdict.message), verdict.message
    if kind == "raised":
        assert "IndexError" in verdict.message and "row out of range" in verdict.detail


def test_a_file_without_modelnew_is_reported(tmp_path):
    path = tmp_path / "empty.py"
    path.write_text("x = 1\n")
    verdict = evaluate(path, "kl_div", size="narrow", device="cpu")
    assert verdict.status == "raised" and "no class ModelNew" in verdict.message


# --- cpu tier: cheats and escapes, through the dry run (tests/solutions/, one trick each) ---------

@pytest.mark.parametrize("name, status, says", [
    ("forged_verdict.py", "crashed", "exited with code 0) in stage 'load'"),  # its forged file is never read
    ("forged_channel.py", "tampered", "wrote into the evaluator's channel"),
    ("mutated_inputs.py", "mutated_inputs", "changed its input(s) targets in place"),
    ("sabotaged_reference.py", "wrong_values", "float64 reference"),  # the reference is the parent's
    ("reduced_precision.py", "wrong_values", "what an honest float32 kernel reaches"),
])
def test_a_cheat_is_caught_in_the_dry_run(name, status, says):
    verdict = evaluate(SOLUTIONS_DIR / name, "kl_div", size="narrow", device="cpu", timeout_s=120)
    assert verdict.status == status and says in verdict.message, verdict.format()


@pytest.mark.parametrize("problem", problems.names())
def test_an_answer_from_one_row_in_eight_fails(problem):
    """On CPU at 64 rows; the gpu tier repeats it at KernelBench's size."""
    verdict = evaluate(SOLUTIONS_DIR / "one_row_in_eight.py", problem, size=(64, 1000), device="cpu")
    assert verdict.status == "wrong_values", verdict.format()


def test_kernelbench_verdict_is_shown_beside_and_a_disagreement_explained(tmp_path):
    """One row in eight at 512 x 4096 (seed 0): within KernelBench's fixed tolerance, far outside float64's."""
    verdict = evaluate(SOLUTIONS_DIR / "one_row_in_eight.py", "kl_div", size=(512, 4096), device="cpu", seed=0)
    text = verdict.format()
    assert verdict.status == "wrong_values" and verdict.trials[0]["allclose"], text
    assert "KernelBench's verdict would be pass, losslab's is fail: KernelBench's fixed tolerance" in text


def test_an_answer_without_a_backward_passes_as_forward_only():
    verdict = evaluate(SOLUTIONS_DIR / "forward_only.py", "kl_div", size="narrow", device="cpu")
    assert verdict.passed and verdict.forward_only, verdict.format()
    assert "PASSED (FORWARD ONLY)" in verdict.format() and "no speedup is claimed for training" in verdict.format()


def test_a_process_the_answer_starts_in_a_session_of_its_own_is_killed(tmp_path, monkeypatch):
    """The README says everything the child started is killed: killpg of its group missed this one."""
    pid_file = tmp_path / "pid"
    monkeypatch.setenv("LOSSLAB_TEST_PID_FILE", str(pid_file))
    verdict = evaluate(SOLUTIONS_DIR / "escaped_process.py", "kl_div", size="narrow", device="cpu", trials=1)
    assert verdict.passed, verdict.format()
    pid = int(pid_file.read_text())
    assert not os.path.exists(f"/proc/{pid}"), f"pid {pid} outlived the evaluation"
    assert verdict.processes["contained"] and verdict.processes["survivors"] == []


def test_survivors_and_a_missing_subreaper_are_reported():
    result = {"status": "passed", "processes": {"contained": False, "how": "not contained: no prctl here",
                                                "survivors": ["pid 7: sleep 60"]}}
    text = Verdict.from_child(result, **FIELDS).format()
    assert "processes: not contained: no prctl here" in text
    assert "processes: 1 started by the solution survived the kill: pid 7: sleep 60" in text


@pytest.mark.parametrize("bad", [float("nan"), -1.0, 0.0, float("inf")])
def test_min_speedup_must_be_a_positive_number(tmp_path, bad):
    with pytest.raises(ValueError, match="^min_speedup: expected None or a positive number"):
        evaluate(write_solution(tmp_path, "good", SOLUTIONS["good"]), "kl_div", size="narrow", device="cpu",
                 min_speedup=bad)


@pytest.mark.parametrize("problem", problems.names())
def test_structured_inputs_put_most_of_the_loss_in_a_few_rows(problem):
    from losslab.kernelbench import inputs

    spec = problems.get(problem)
    made = inputs.make(problems.get(problem), (256, 512), 3, "structured", "cpu", torch.float32)
    again = inputs.make(problems.get(problem), (256, 512), 3, "structured", "cpu", torch.float32)
    assert all(torch.equal(a, b) for a, b in zip(made, again, strict=True))  # the parent's and the child's
    upcast = [x.double() if x.is_floating_point() else x for x in made]
    # each row with its targets: hinge_loss's (D,) targets are every row's
    shared = [problem == "hinge_loss" and x.dim() == 1 for x in upcast]
    per_row = torch.stack([spec.reference(*[x if s else x[i:i + 1] for x, s in zip(upcast, shared, strict=True)])
                           for i in range(256)])
    heaviest = per_row.sort(descending=True).values
    assert heaviest[:256 // inputs.HEAVY_EVERY].sum() > 0.5 * per_row.sum()  # 4 rows in 256 carry most
    scale = made[0].abs().median(dim=1).values if problem == "cross_entropy" else made[0].max(dim=1).values
    assert scale.max() > 10 * scale.min()


# --- cpu tier: the command line ----------------------------------------------------------------

@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_cli_evaluate_without_gpu(capsys, tmp_path):
    path = write_solution(tmp_path, "good", SOLUTIONS["good"])
    assert main(["evaluate", path, "--problem", "kl_div", "--json", str(tmp_path / "v.json")]) == 1
    assert "NO GPU" in capsys.readouterr().out and (tmp_path / "v.json").exists()


# --- compile tier --------------------------------------------------------------------------------

def build_env(tmp_path) -> dict:
    return {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext"), "TORCH_CUDA_ARCH_LIST": "9.0",
            "CUDA_HOME": str(build.find_cuda_home())}


@pytest.mark.compile
def test_a_solution_that_does_not_compile_gets_the_compilers_message(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
    text = export_solution(KL_DIV, "vectorized")
    assert RIGHT_DIVISOR in text
    path = tmp_path / "broken.py"
    path.write_text(text.replace(RIGHT_DIVISOR, RIGHT_DIVISOR.rstrip(";")))
    verdict = evaluate(path, "kl_div", size="narrow", device="cpu", timeout_s=600)
    assert verdict.status == "compile_error", verdict.format()
    assert "error" in verdict.message and "cuda.cu(" in verdict.message


@pytest.mark.compile
def test_a_verbose_build_that_fails_shows_the_first_compiler_error(monkeypatch):
    """load_inline(verbose=True) sends the compiler's output to stdout; the exception says only
    "Error building extension 'kl_div'". The build comes before any launch: no GPU needed."""
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
    verdict = evaluate(SOLUTIONS_DIR / "verbose_compile_error.py", "kl_div", size="narrow", device="cpu")
    assert verdict.status == "compile_error", verdict.format()
    assert re.match(r'cuda\.cu\(\d+\): error: identifier "numel" is undefined', verdict.message), verdict.message
    assert "kl_div_terms<<<" in verdict.message and verdict.stage == "load"
    assert verdict.message.endswith("[line 18 of the solution file]"), verdict.message
    assert "-DTORCH_EXTENSION_NAME" not in verdict.detail


# --- gpu tier --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ext_cache(tmp_path_factory):
    """One build cache for the exported solutions of this module (each evaluate still runs
    in its own child); the broken ones get fresh directories."""
    return tmp_path_factory.mktemp("torch_extensions")


@pytest.mark.gpu
@pytest.mark.parametrize("problem, variant", [("kl_div", "naive"), ("kl_div", "vectorized"), ("kl_div", "fused"),
                                              ("cross_entropy", "naive"), ("cross_entropy", "vectorized"),
                                              ("cross_entropy", "fused")])
def test_exported_solutions_pass(tmp_path, ext_cache, problem, variant):
    path = tmp_path / "solution.py"
    path.write_text(export_solution(problems.get(problem), variant))
    verdict = evaluate(path, problem, size="odd", repeats=5, build_dir=ext_cache)
    assert verdict.passed, verdict.format()
    assert verdict.backward["supported"] and verdict.backward["passed"] and verdict.repeatable
    assert verdict.timing["solution_ms"] > 0 and "speedup_compile" in verdict.timing


@pytest.mark.gpu
def test_exported_solution_passes_at_kernelbench_size(tmp_path, ext_cache):
    path = tmp_path / "solution.py"
    path.write_text(export_solution(KL_DIV, "vectorized"))
    verdict = evaluate(path, "kl_div", build_dir=ext_cache)
    print(verdict.format())
    assert verdict.passed and verdict.timing["speedup_eager"] > 1, verdict.format()
    assert verdict.memory["solution_bytes"] <= 2**20


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["compile_error", "wrong_values", "wrong_shape", "raised", "timed_out", "crashed"])
def test_broken_solutions_get_their_verdict_and_leave_cuda_usable(tmp_path, kind):
    if kind in ("compile_error", "wrong_values"):
        text = export_solution(KL_DIV, "vectorized")
        broken = RIGHT_DIVISOR.rstrip(";") if kind == "compile_error" else WRONG_DIVISOR
        path = tmp_path / f"{kind}.py"
        path.write_text(text.replace(RIGHT_DIVISOR, broken))
    else:
        path = write_solution(tmp_path, kind, SOLUTIONS[kind])
    verdict = evaluate(path, "kl_div", size="small", repeats=3, timeout_s=30 if kind == "timed_out" else 600)
    assert verdict.status == kind, verdict.format()
    assert (torch.ones(4, device="cuda") + 1).sum().item() == 8.0  # the caller's CUDA context is fine


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("problem", problems.names())
def test_exported_solutions_pass_in_16_bit(tmp_path, ext_cache, problem, dtype):
    spec = problems.get(problem)
    variant = next(v for v in spec.variants if getattr(torch, dtype) in spec.dtypes(v))
    path = tmp_path / "solution.py"
    path.write_text(export_solution(problems.get(problem), variant))
    verdict = evaluate(path, problem, size="odd", dtype=dtype, repeats=5, build_dir=ext_cache)
    assert verdict.passed, verdict.format()
    assert verdict.repeatable is not None and verdict.backward["passed"]
    assert verdict.timing["floor_ms"] <= verdict.timing["solution_ms"]


CHEAT_SIZE = (8192, 16384)  # 0.5 GiB per input: hidden work far above the host clock's jitter


@pytest.mark.gpu
@pytest.mark.parametrize("name, status, says", [
    ("stale_result.py", "wrong_values", "timed call 0"),
    ("replayed_graph.py", "wrong_values", "timed call 0"),
    ("late_write.py", "wrong_values", "timed call 0"),
    ("side_stream.py", "hidden_work", "outside the caller's stream"),
    ("patched_timer.py", "tampered", "torch.cuda.Event.elapsed_time"),
    ("forged_clock.py", "time_mismatch", "the evaluator's own clock"),
    ("sabotaged_reference.py", "wrong_values", "float64 reference"),
    ("mutated_inputs.py", "mutated_inputs", "targets"),
])
def test_each_timing_trick_is_caught(name, status, says):
    verdict = evaluate(SOLUTIONS_DIR / name, "kl_div", size=CHEAT_SIZE, repeats=10, compare_compile=False)
    print(verdict.format())
    assert verdict.status == status and says in verdict.message, verdict.format()
    assert (torch.ones(4, device="cuda") + 1).sum().item() == 8.0


@pytest.mark.gpu
def test_a_cached_answer_gains_nothing_from_the_timing():
    """Its cache hits only for the same input objects; every timed call has fresh ones."""
    verdict = evaluate(SOLUTIONS_DIR / "cached_result.py", "kl_div", size=CHEAT_SIZE, repeats=10,
                       compare_compile=False)
    print(verdict.format())
    assert verdict.passed, verdict.format()  # right for every input: the cache never answers
    assert verdict.timing["speedup_eager"] < 1.5 and verdict.timing["solution_ms"] > verdict.timing["floor_ms"]


@pytest.mark.gpu
@pytest.mark.parametrize("problem", problems.names())
def test_an_answer_from_one_row_in_eight_fails_at_kernelbench_size(problem):
    """The issue's skipped work: forward only, one row in eight, at the seed size (kl_div 16384 x
    16384, cross_entropy 32768 x 4096). KernelBench's fixed tolerance may pass it on random
    inputs, and so may losslab's for kl_div (its tolerance follows the condition number of the
    loss, 350 there); the structured inputs do not (off by about 1e-1 against 4e-5 to 8e-5:
    tests/test_verdict.py)."""
    verdict = evaluate(SOLUTIONS_DIR / "one_row_in_eight.py", problem, repeats=3, compare_compile=False)
    print(verdict.format())
    assert verdict.status == "wrong_values" and verdict.stage == "correctness", verdict.format()
    assert "speedup_eager" not in (verdict.timing or {})
