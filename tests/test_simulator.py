"""The CPU simulator (losslab.teach.simulator): solutions pass, skeletons and each wrong answer
in tests/simulator_cases/ get their specific message, and the simulator's own checks
(barriers, shuffle masks, alignment, bounds, time limit) report what they should.
cpu tier: needs g++ with the sanitizers, no GPU."""
import functools
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from losslab.teach.simulator import build, cases, diagnose, run

ROOT = Path(__file__).resolve().parents[1]
CASES = ROOT / "tests" / "simulator_cases"
SOLUTIONS = ROOT / "exercises" / "solutions" / "kl_div"


def _gxx_with_sanitizers() -> bool:
    if shutil.which(build.CXX) is None:
        return False
    probe = subprocess.run([build.CXX, "-x", "c++", "-fsanitize=address,undefined", "-o", "/dev/null", "-"],
                           input="int main() { return 0; }", text=True, capture_output=True)
    return probe.returncode == 0


pytestmark = pytest.mark.skipif(not _gxx_with_sanitizers(),
                                reason="simulator tests skipped: g++ with -fsanitize=address,undefined is missing")


@functools.cache
def grade(key: str, path: Path | None) -> diagnose.CpuGrade:
    return diagnose.grade_on_cpu(key, path)


def joined(g: diagnose.CpuGrade) -> str:
    return "\n".join(g.messages)


# ---- the source rewrite -------------------------------------------------------------------

def test_rewrite_turns_launches_into_calls_and_keeps_every_line():
    text = ("k<<<B, 256, 0, s>>>(p, t,\n   n);\n"
            "ns::run<float, 4><<<dim3(2, 3), THREADS>>>();\n"
            "extern __shared__ float smem[];\n")
    out = build.rewrite(text)
    assert out.count("\n") == text.count("\n")
    assert '::cuda_sim::launch("k", ::cuda_sim::config(B, 256, 0, s), k, p, t,\n   n);' in out
    assert '::cuda_sim::launch("ns::run<float, 4>", ::cuda_sim::config(dim3(2, 3), THREADS), ns::run<float, 4>)' in out
    assert "float* smem = reinterpret_cast<float*>(::cuda_sim::dynamic_shared());" in out


def test_rewrite_registers_shared_arrays_in_functions_only():
    text = ("namespace { __shared__ float g[4]; }\n__device__ void f() {\n  // __shared__ x;\n"
            "  __shared__ float a[2 * 8], b[3];\n}\n")
    out = build.rewrite(text)
    assert out.count("\n") == text.count("\n")
    assert "namespace { __shared__ float g[4]; }" in out
    assert ('static float a[2 * 8], b[3]; ::cuda_sim::shared_region(&a, sizeof(a), "a");'
            ' ::cuda_sim::shared_region(&b, sizeof(b), "b");') in out


def test_rewrite_marks_each_update_of_a_shared_element_and_nothing_else():
    text = ("__device__ void f(float* g) {\n  __shared__ float a[4], b[2];\n  a[threadIdx.x] += b[a[0] > 0];\n"
            "  b[1]++;\n  a[2] = a[2] + 1;\n  a[3] = b[0];\n  atomicAdd(&a[0], 1.f);\n  g[0] += a[1];\n}\n")
    out = build.rewrite(text).splitlines()
    mark = "(*::cuda_sim::update(&({}), __FILE__, __LINE__))"
    assert out[2] == f"  {mark.format('a[threadIdx.x]')} += b[a[0] > 0];"
    assert out[3] == f"  {mark.format('b[1]')}++;" and out[4] == f"  {mark.format('a[2]')} = a[2] + 1;"
    assert out[5:8] == ["  a[3] = b[0];", "  atomicAdd(&a[0], 1.f);", "  g[0] += a[1];"]


def test_rewrite_refuses_a_launch_without_arguments():
    with pytest.raises(build.CompileError, match="line 2"):
        build.rewrite("int x;\nk<<<1, 32>>>;\n")


# ---- solutions, skeletons, wrong answers ----------------------------------------------------

@pytest.mark.parametrize("key", list(diagnose.EXERCISES))
def test_solution_passes(key):
    problem = diagnose.EXERCISES[key].problem
    g = grade(key, SOLUTIONS.parent / problem / f"{key}.cu")
    assert g.passed, joined(g)


def test_solution_outputs_match_the_float64_reference():
    outcome = run.run(SOLUTIONS / "vectorize.cu")
    assert outcome.compiled and not outcome.failures
    for r in outcome.results:
        ref = cases.kl_div_reference(r.case)
        np.testing.assert_allclose(r.rows, ref["rows"], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(r.loss, ref["loss"][0], rtol=1e-4)
    assert [x["block"] for x in outcome.launches[:2]] == [[256, 1, 1], [1024, 1, 1]]


@pytest.mark.parametrize("key, expected", [
    ("coalesce", "the loss is 0 for every input: no element is added"),
    ("warp_shuffle", "only thread 0's own value reaches the loss"),
    ("vectorize", "the elements in the float4 packs never reach the loss"),
    ("online_softmax", "the combined max is wrong on 3 x 1000: row 0 has max"),
    ("fused", "elements of the gradient are never written on 3 x 1000"),
    ("logsumexp_tree", "the combined max is wrong on 3 x 1000: row 0 has max"),
    ("warp_max", "some lanes' values never reach the warp's max"),
    ("vectorize_logits", "a row's sum is 0 (its log is -inf): no float4 pack reaches it"),
    ("fused_softmax", "elements of the gradient are never written on 3 x 1000"),
])
def test_untouched_skeleton_fails_with_a_clear_message(key, expected):
    g = grade(key, None)
    assert not g.passed
    assert expected in joined(g)
    assert "FILL ME IN" in joined(g)


WRONG = [
    ("coalesce", "coalesce_whole_row.cu",
     "the loss is 256x too large: each thread sums the whole row"),
    ("coalesce", "coalesce_missing_barrier.cu",
     "the loss is NaN on 3 x 1000: a thread read shared memory that no thread of its block had written"),
    ("coalesce", "coalesce_missing_barrier.cu",
     "the loss changes with the order the threads run"),
    ("coalesce", "coalesce_step_one.cu",
     "elements of a row are added the wrong number of times (element 1: 2, element 2: 3,"),
    ("coalesce", "coalesce_no_division.cu",
     "every row's sum is right but the loss is B times too large: divide the sum of the rows by B"),
    ("coalesce", "coalesce_lost_update.cu",
     "lost update: threads 0 and 1 of block 0 both update shared partial[0] (read, change, write) with no barrier"),
    ("warp_shuffle", "warp_shuffle_no1.cu",
     "lanes [1, 3, 5, 7, 9, 11]... of each warp never reach lane 0: offset(s) 1 missing"),
    ("warp_shuffle", "warp_shuffle_assign.cu",
     "lane 0 holds only one lane's value, nothing is summed (value = __shfl_xor_sync(...) replaces the value): "
     "a shuffle result must be added"),
    ("warp_shuffle", "warp_shuffle_no16.cu",
     "only half of each warp's values reach lane 0: the offsets must run 16, 8, 4, 2, 1"),
    ("warp_shuffle", "warp_shuffle_divergent.cu",
     "lanes 0x0000ffff wait at __shfl_xor_sync (line 13) with mask 0xffffffff, but lane 16 waits at __syncthreads"),
    ("warp_shuffle", "warp_shuffle_no_sync.cu",
     "hint: did you mean __shfl_xor_sync (CUDA 9+ needs the mask)?"),
    ("vectorize", "vectorize_no_head.cu",
     "misaligned 16-byte load at row 1: peel the head first"),
    ("vectorize", "vectorize_no_tail.cu",
     "wrong values on odd widths: the scalar tail misses the last D % 4 elements"),
    ("vectorize", "vectorize_tail_every_thread.cu",
     "wrong values on odd widths: every thread adds the whole tail (256 times each)"),
    ("vectorize", "vectorize_tail_overrun.cu",
     "out-of-bounds read: 1 element(s) past the end of targets"),
    ("online_softmax", "online_softmax_no_rescale.cu",
     "the max is right but the sum is not on 3 x 1000"),
    ("online_softmax", "online_softmax_overflow.cu",
     "the sum is NaN or inf on 3 x 1000: exp of a logit or of a max itself overflows"),
    ("fused", "fused_no_inv_b.cu",
     "the gradient is B = 3 times too large on 3 x 1000: L is the sum divided by B"),
    ("fused", "fused_sign.cu",
     "the gradient has the wrong sign on 3 x 1000"),
    ("logsumexp_tree", "logsumexp_tree_no_barrier.cu",
     "the loss changes with the order the threads run"),
    ("logsumexp_tree", "logsumexp_tree_no_rescale.cu",
     "the max is right but the sum is not on 3 x 1000"),
    ("warp_max", "warp_max_down.cu",
     "__shfl_down_sync leaves it in lane 0 only"),
    ("warp_max", "warp_max_no16.cu",
     "some lanes' values never reach the warp's max: a butterfly"),
    ("vectorize_logits", "vectorize_logits_no_tail.cu",
     "wrong only on the rows with a tail: the scalar tail misses the last (C - head) % 4 logits"),
    ("vectorize_logits", "vectorize_logits_tail_every_thread.cu",
     "wrong only on the rows with a tail: the tail is added more than once"),
    ("vectorize_logits", "vectorize_logits_no_head.cu",
     "misaligned 16-byte load at row 1: peel the head first"),
    ("fused_softmax", "fused_softmax_no_onehot.cu",
     "the gradient is wrong only at each row's target class on 3 x 1000"),
    ("fused_softmax", "fused_softmax_no_scale.cu",
     "the gradient is n_valid = 3 times too large on 3 x 1000"),
]


@pytest.mark.parametrize("key, name, expected", WRONG, ids=[f"{w[1]}-{i}" for i, w in enumerate(WRONG)])
def test_wrong_answer_gets_its_specific_message(key, name, expected):
    g = grade(key, CASES / name)
    assert not g.passed
    assert expected in g.messages[0] or expected in joined(g), joined(g)


def test_every_wrong_answer_file_is_tested():
    """Each file under simulator_cases/ (but the endless loop's, tested on its own) is a wrong answer above or
    in tests/test_exercises.py."""
    named = {w[1] for w in WRONG} | {"coalesce_endless.cu", "warp_shuffle_down.cu"}
    other = (ROOT / "tests" / "test_exercises.py").read_text()
    assert {p.name for p in CASES.glob("*.cu") if p.name not in named and p.name not in other} == set()


def test_an_atomic_update_of_one_shared_address_is_no_lost_update():
    """The lost update's fix passes: atomicAdd is one operation (the simulator's two thread orders alone
    never exposed the lost update: each thread's read, add and write run whole here)."""
    lost = (CASES / "coalesce_lost_update.cu").read_text()
    source = lost.replace("partial[0] += sum;", "atomicAdd(&partial[0], sum);")
    assert "atomicAdd(&partial[0], sum);" in source
    g = diagnose.grade_on_cpu("coalesce", source)
    assert g.passed, joined(g)


def test_an_endless_loop_is_stopped_by_the_time_limit():
    g = diagnose.grade_on_cpu("coalesce", CASES / "coalesce_endless.cu", time_limit=2)
    assert not g.passed
    assert g.messages[0].startswith("no result within 2 s: a loop that never ends")
    assert "row 0, thread 0; coalesce_endless.cu line" in g.messages[0]


def test_shfl_down_passes_with_a_note_on_its_opcode():
    g = grade("warp_shuffle", CASES / "warp_shuffle_down.cu")
    assert g.passed, joined(g)
    assert "SHFL.DOWN" in joined(g) and "lane 0's result" in joined(g)


def test_misaligned_load_is_a_structured_failure_with_row_and_line():
    case = cases.kl_div_cases()[1]  # 2 x 37: row 1 starts 148 bytes in
    outcome = run.run(CASES / "vectorize_no_head.cu", case_list=[case])
    f = outcome.results[0].failure
    assert f.kind == "misaligned" and f.block == (1, 0, 0) and f.line == 27
    assert f.file == "vectorize_no_head.cu" and "float4" in f.message


def test_compile_error_keeps_the_source_s_line_numbers():
    outcome = run.run(CASES / "warp_shuffle_no_sync.cu")
    assert not outcome.compiled
    assert "warp_shuffle_no_sync.cu:13:" in outcome.compile_error


# ---- the simulator's own checks, on small kernels --------------------------------------------

def launcher(kernel: str, launch: str = "k<<<B, 64, 0, stream>>>(row_partials, B);") -> str:
    """A kl_div custom forward that launches ``kernel`` (named k) and writes loss = 1."""
    return ('#include "kl_div/launchers.h"\n' + kernel +
            "\ncudaError_t kl_div_custom_forward(const void*, const void*, float* row_partials, void* loss, void*,"
            " int64_t B, int64_t D, DType, cudaStream_t stream) {\n"
            f"    {launch}\n    *static_cast<float*>(loss) = 1.0f;\n    return cudaGetLastError();\n}}\n")


def run_small(source: str):
    return run.run(source, case_list=[cases.kl_div_cases()[2]], label="small.cu", time_limit=5)


def test_syncthreads_orders_shared_memory_between_threads():
    # thread 63 writes, thread 0 reads after the barrier: forward order runs thread 0 first
    kernel = ("__global__ void k(float* out, int64_t B) {\n  __shared__ float s[64];\n"
              "  s[threadIdx.x] = float(threadIdx.x);\n  __syncthreads();\n"
              "  if (threadIdx.x == 0) out[blockIdx.x] = s[63];\n}\n")
    outcome = run_small(launcher(kernel))
    assert outcome.results[0].failure is None
    assert outcome.results[0].rows.tolist() == [63.0]


def test_barriers_on_different_lines_are_divergence():
    kernel = ("__global__ void k(float* out, int64_t B) {\n"
              "  if (threadIdx.x < 32) { __syncthreads(); }\n  else { __syncthreads(); }\n"
              "  out[blockIdx.x] = 0.0f;\n}\n")
    f = run_small(launcher(kernel)).results[0].failure
    assert f.kind == "barrier_divergence" and f.line == 4 and "line 3" in f.message


def test_shuffle_checks_its_mask():
    kernel = ("__global__ void k(float* out, int64_t B) {\n"
              "  float v = __shfl_xor_sync(0x0000ffffu, 1.0f, 1);\n  out[blockIdx.x] = v;\n}\n")
    f = run_small(launcher(kernel)).results[0].failure
    assert f.kind == "shuffle_mask" and "leaves the lane out" in f.message and f.thread == (16, 0, 0)


def test_shuffles_exchange_lanes_like_the_gpu():
    kernel = ("__global__ void k(float* out, int64_t B) {\n  float lane = float(threadIdx.x % 32);\n"
              "  float x = __shfl_xor_sync(0xffffffffu, lane, 5), d = __shfl_down_sync(0xffffffffu, lane, 30);\n"
              "  float u = __shfl_up_sync(0xffffffffu, lane, 3), i = __shfl_sync(0xffffffffu, lane, 7, 8);\n"
              "  unsigned b = __ballot_sync(0xffffffffu, threadIdx.x % 2);\n"
              "  if (threadIdx.x == 33) out[0] = x * 1e6f + d * 1e4f + u * 1e2f + i + (b == 0xaaaaaaaau ? 0.5f : 0);\n"
              "}\n")
    rows = run_small(launcher(kernel)).results[0].rows
    # lane 1: xor 5 -> lane 4; down 30 -> lane 31; up 3 -> itself (1); width 8, lane 7 -> 7
    assert rows.tolist() == [np.float32(4e6 + 31e4 + 1e2 + 7 + 0.5)]


def test_an_impossible_launch_returns_the_gpu_s_error():
    outcome = run_small(launcher("__global__ void k(float* out, int64_t B) { out[0] = 0.0f; }\n",
                                 "k<<<B, 2048, 0, stream>>>(row_partials, B);"))
    assert outcome.results[0].forward_status == 9  # cudaErrorInvalidConfiguration


def test_out_of_bounds_names_the_buffer():
    kernel = "__global__ void k(float* out, int64_t B) { if (threadIdx.x == 0) out[B + 6] = 0.0f; }\n"  # B + 4 floats
    f = run_small(launcher(kernel)).results[0].failure
    assert (f.kind, f.buffer, f.elements, f.access) == ("out_of_bounds", "row_partials", 3, "write")


# ---- the shipped rungs: kernels that pass on a GPU pass in the simulator ----------------------

def rung_source(problem: str, rung: str) -> str:
    """A custom variant whose launchers call the shipped rung's (its .cu included)."""
    if problem == "kl_div":
        fwd = ("const void* p, const void* t, float* r, void* l, void* g, int64_t B, int64_t D, DType d, "
               "cudaStream_t s", "p, t, r, l, g, B, D, d, s")
        bwd = ("const void* p, const void* t, const void* gl, void* g, int64_t B, int64_t D, DType d, cudaStream_t s",
               "p, t, gl, g, B, D, d, s")
    else:
        fwd = ("const void* x, const int64_t* t, int64_t* c, float* r, float* m, float* ls, void* l, void* g, "
               "int64_t N, int64_t C, DType d, cudaStream_t s", "x, t, c, r, m, ls, l, g, N, C, d, s")
        bwd = ("const void* x, const int64_t* t, const float* m, const float* ls, const int64_t* c, const void* gl, "
               "void* g, int64_t N, int64_t C, DType d, cudaStream_t s", "x, t, m, ls, c, gl, g, N, C, d, s")
    return (f'#include "{problem}/{rung}.cu"\n'
            f"cudaError_t {problem}_custom_forward({fwd[0]}) {{ return {problem}_{rung}_forward({fwd[1]}); }}\n"
            f"cudaError_t {problem}_custom_backward({bwd[0]}) {{ return {problem}_{rung}_backward({bwd[1]}); }}\n")


# rows: the scratch holds each row's loss (False: cross_entropy vectorized adds a block's rows first)
@pytest.mark.parametrize("problem, rung, rows", [(p, r, p == "kl_div" or r != "vectorized")
                                                 for p in ("kl_div", "cross_entropy")
                                                 for r in ("warp_shuffle", "vectorized", "fused")])
def test_shipped_rung_matches_the_reference_forward_and_backward(problem, rung, rows):
    outcome = run.run(rung_source(problem, rung), problem, label=f"{rung}.cu")
    assert outcome.compiled, outcome.compile_error
    for r in outcome.results:
        ref = cases.PROBLEMS[problem].reference(r.case)
        assert r.failure is None and r.forward_status == 0 and r.backward_status == 0, (r.case.name, r.failure)
        assert diagnose._close([r.loss], ref["loss"]), r.case.name
        assert not rows or diagnose._close(r.rows, ref["rows"]), r.case.name
        assert diagnose._close(r.grad, ref["grad"]), r.case.name


def test_a_wrong_backward_is_named():
    source = (SOLUTIONS / "coalesce.cu").read_text() + (
        "\n__global__ void g(const float* p, const float* t, float* grad, int64_t n) {\n"
        "  int64_t i = blockIdx.x * 256 + threadIdx.x;\n"
        "  if (i < n) grad[i] = -t[i] / p[i];  // forgets grad_loss / B\n}\n"
        "cudaError_t kl_div_custom_backward(const void* p, const void* t, const void* gl, void* grad, int64_t B,"
        " int64_t D, DType, cudaStream_t s) {\n"
        "  g<<<(B * D + 255) / 256, 256, 0, s>>>((const float*)p, (const float*)t, (float*)grad, B * D);\n"
        "  return cudaGetLastError();\n}\n")
    g = diagnose.grade_on_cpu("coalesce", source)
    assert not g.passed and g.messages[0].startswith("wrong gradient on 3 x 1000: element 0 is")


def test_run_takes_your_own_inputs():
    p = np.full((2, 5), 0.5, np.float32)
    outcome = run.run(SOLUTIONS / "coalesce.cu", case_list=[cases.kl_div_case("mine", p, np.ones_like(p))])
    assert outcome.results[0].rows == pytest.approx([5 * np.log(2)] * 2, rel=1e-6)


def test_command_line_prints_the_grade_and_exits_by_it(capsys):
    from losslab.teach.simulator.__main__ import main

    assert main(["warp_shuffle", str(CASES / "warp_shuffle_down.cu")]) == 0
    assert "GREEN on the CPU simulator" in capsys.readouterr().out
    assert main(["no_such_exercise"]) == 2
    assert "exercise: the CPU simulator grades" in capsys.readouterr().err


def test_a_launcher_with_the_wrong_signature_is_named():
    source = (SOLUTIONS / "coalesce.cu").read_text().replace(
        "kl_div_custom_forward(const void* predictions_", "kl_div_custom_forward(const float* predictions_")
    source = source.replace("static_cast<const float*>(predictions_)", "predictions_")
    g = diagnose.grade_on_cpu("coalesce", source)
    assert not g.passed
    assert "link: undefined reference to `kl_div_custom_forward(" in joined(g)
    assert "hint: kl_div_custom_forward is missing, or its parameters differ from the contract" in joined(g)


def test_command_line_takes_a_path_never_a_folder_or_missing_file_as_cuda(tmp_path, capsys):
    """`coalesce some_folder/` compiled the folder's name as CUDA text."""
    from losslab.teach.simulator.__main__ import main

    assert main(["coalesce", f"{tmp_path}/"]) == 2
    assert capsys.readouterr().err == f"error: source: {tmp_path}/ is a folder; expected a .cu file\n"
    assert main(["coalesce", str(tmp_path / "mine.cu")]) == 2
    assert "mine.cu is not a file (no such file); expected a .cu file" in capsys.readouterr().err


def test_an_unwritable_cache_is_one_line_naming_it_and_the_variable_that_moves_it(tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("LOSSLAB_CACHE", str(blocker))
    with pytest.raises(build.SimulatorError, match=rf"^the simulator's cache folder {blocker}/simulator is not "
                                                   r"writable \(.*\); set LOSSLAB_CACHE to a writable folder"):
        build.build("kl_div", "// nothing")
    from losslab.teach.simulator.__main__ import main

    assert main(["coalesce"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "LOSSLAB_CACHE" in err and "Traceback" not in err


def test_a_killed_builds_temporary_folder_is_removed_by_the_next_build(tmp_path):
    """A build killed before its cleanup ran left <name>.tmp... behind for good."""
    stale = tmp_path / "kl_div-0123.tmp999999999-x1"  # a pid above any pid_max: its process is gone
    running = tmp_path / f"kl_div-4567.tmp{os.getpid()}-x2"  # a build still running (this process)
    stale.mkdir()
    running.mkdir()
    final = build._atomic_dir(tmp_path / "kl_div-89ab", lambda tmp: (tmp / "sim").write_text(""))
    assert (final / "sim").exists() and not stale.exists() and running.exists()


FILL_HINT = "the FILL ME IN in the source is still to do"


def test_fill_me_in_hint_follows_the_code_not_the_comment(tmp_path):
    """A wrong answer that replaced the placeholder but kept the comment gets no "still to do" hint;
    an untouched placeholder whose comment was deleted still gets it."""
    skeleton = (ROOT / "exercises" / "kl_div" / "warp_shuffle.cu").read_text()
    placeholder = "    return value;\n}"
    assert placeholder in skeleton
    done_but_wrong = skeleton.replace(placeholder, "    value += __shfl_xor_sync(FULL_WARP, value, 16);\n"
                                                   "    return value;\n}", 1)
    g = diagnose.grade_on_cpu("warp_shuffle", done_but_wrong)
    assert not g.passed and "FILL ME IN" in done_but_wrong and FILL_HINT not in joined(g), joined(g)
    comment_gone = "\n".join(line for line in skeleton.splitlines() if "FILL ME IN" not in line)
    g = diagnose.grade_on_cpu("warp_shuffle", comment_gone)
    assert not g.passed and FILL_HINT in joined(g)


@pytest.mark.parametrize("key", list(diagnose.EXERCISES))
def test_unfilled_reads_the_code(key):
    problem = diagnose.PROBLEM_OF[key]
    skeleton = (ROOT / "exercises" / problem / f"{key}.cu").read_text()
    solution = (ROOT / "exercises" / "solutions" / problem / f"{key}.cu").read_text()
    assert diagnose.unfilled(key, skeleton) and diagnose.unfilled(key, skeleton.replace("FILL ME IN", "done"))
    assert not diagnose.unfilled(key, solution)
    assert not diagnose.unfilled(key, solution + "\n// FILL ME IN (a comment left behind)\n")


def test_an_empty_source_is_a_red_grade_not_an_error():
    g = diagnose.grade_on_cpu("coalesce", "")
    assert not g.passed and g.messages[0].startswith("the file is empty")
