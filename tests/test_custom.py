"""Your own variant (losslab.teach.custom): contract, diagnostics, building, variant objects,
the cell magic, evaluation.

cpu tier: the contract read from launchers.h (the parser on a written declaration, the
problems' stages and linked files), nvcc diagnostics in the user's lines, build folders and
the generated binding, a variant object through its autograd and the checker
(a right and a wrong hand-written KL on the CPU). compile tier: real nvcc errors, the
displayed signature compiles as the contract and a changed one does not, full builds of
both problems. gpu tier: custom variants pass the checker in a child process and join the
ladder; a hanging and a misaligned kernel give verdicts and leave this process's CUDA usable.
"""
import pytest
import torch

from losslab import build, problems
from losslab.measure.check import check_inputs
from losslab.teach import custom
from losslab.teach.custom import launchers

KL_DIV, CROSS_ENTROPY = problems.get("kl_div"), problems.get("cross_entropy")

# A complete kl_div variant: the coalesced forward and its own element-wise backward.
FULL_SOURCE = """#include "kl_div/kl_div.cuh"
#include "kl_div/launchers.h"
#include "common/reduce.cuh"
#include "common/sum_partials.cuh"

constexpr int THREADS = 256;

__global__ void forward_kernel(const float* p, const float* t, float* row_partials, int64_t D) {
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < D; j += THREADS) sum += kl_div_term(p[blockIdx.x * D + j], t[blockIdx.x * D + j]);
    sum = block_reduce_sum(sum);
    if (threadIdx.x == 0) row_partials[blockIdx.x] = sum;
}

__global__ void backward_kernel(const float* p, const float* t, const float* grad_loss, float* grad, int64_t n,
                                float B) {
    const int64_t i = blockIdx.x * int64_t(THREADS) + threadIdx.x;
    if (i < n) grad[i] = kl_div_grad(p[i], t[i], *grad_loss / B);
}

cudaError_t kl_div_custom_forward(const void* predictions, const void* targets, float* row_partials, void* loss,
                                  void* grad_predictions, int64_t B, int64_t D, DType dtype, cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;
    forward_kernel<<<B, THREADS, 0, stream>>>(static_cast<const float*>(predictions),
                                              static_cast<const float*>(targets), row_partials, D);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    return launch_sum_partials(row_partials, B, float(B), loss, stream);
}

cudaError_t kl_div_custom_backward(const void* predictions, const void* targets, const void* grad_loss,
                                   void* grad_predictions, int64_t B, int64_t D, DType dtype, cudaStream_t stream) {
    backward_kernel<<<(B * D + THREADS - 1) / THREADS, THREADS, 0, stream>>>(
        static_cast<const float*>(predictions), static_cast<const float*>(targets),
        static_cast<const float*>(grad_loss), static_cast<float*>(grad_predictions), B * D, float(B));
    return cudaGetLastError();
}
"""
BROKEN_LINE = 10  # FULL_SOURCE with an undefined identifier on this line
BROKEN_SOURCE = FULL_SOURCE.replace("sum += kl_div_term(", "sum += kl_term(")
FORWARD_ONLY = FULL_SOURCE[:FULL_SOURCE.index("cudaError_t kl_div_custom_backward")]

NVCC_OUTPUT = """/cache/kl_div-mine-0123/mine.cu(12): error: identifier "x" is undefined
      x = 1;
      ^
custom_variant.cu(4): error: a value of type "cudaError_t (*)(int)" (aka "cudaError (*)(int)") cannot be used
mine.cu:30:5: error: 'foo' was not declared in this scope
/usr/include/x.h(3): warning #177-D: variable "y" was declared but never referenced
mine.cu(7): warning #177-D: variable "z" was declared but never referenced
"""

DECLARATION = """typedef cudaError_t demo_forward_fn(
    const void* predictions,  // (B, D) of dtype
    float* row_partials,      /* (B,) scratch */
    float* loss,              // () float32: a long comment
                              // that goes on here
    int64_t B, int64_t D, DType dtype, cudaStream_t stream);
cudaError_t demo_stage(const int64_t* targets,  // (N,)
                       int64_t* counts,         // (2,) written
                       int64_t N, cudaStream_t stream);
"""


# --- cpu tier: the contract -----------------------------------------------------------------------------

def test_declarations_are_read_with_types_names_and_shapes():
    found = {name: launcher.params for name, launcher in launchers.parse_declarations(DECLARATION).items()}
    assert list(found) == ["demo_forward_fn", "demo_stage"]
    forward = found["demo_forward_fn"]
    assert [(p.ctype, p.name, p.shape) for p in forward] == [
        ("const void*", "predictions", ("B", "D")), ("float*", "row_partials", ("B",)), ("float*", "loss", ()),
        ("int64_t", "B", None), ("int64_t", "D", None), ("DType", "dtype", None),
        ("cudaStream_t", "stream", None)]
    assert forward[2].comment == "() float32: a long comment that goes on here"
    assert [(p.ctype, p.const, p.shape) for p in found["demo_stage"][:2]] == [
        ("const int64_t*", True, ("N",)), ("int64_t*", False, ("2",))]


@pytest.mark.parametrize("problem", problems.names())
def test_contract_comes_from_the_problems_launchers_h(problem):
    """The custom launchers take what every rung takes: the function types of launchers.h."""
    c = custom.contract(problems.get(problem))
    header = (build.KERNELS / problem / "launchers.h").read_text()
    assert f"typedef cudaError_t {problem}_forward_fn(" in header and c.type_name("forward") == f"{problem}_forward_fn"
    first = c.forward.params[0]
    assert first.pointer and first.const and len(first.shape) == 2  # the reference's first input, (rows, cols)
    assert c.forward.params[-1].ctype == "cudaStream_t" and c.backward.params[-1].ctype == "cudaStream_t"
    assert not any(f.startswith(f"{problem}/") and f.removeprefix(f"{problem}/").removesuffix(".cu")
                   in problems.get(problem).variants for f in c.support), "a rung's file is linked into custom builds"


def test_cross_entropy_stages_are_bound_and_linked():
    c = custom.contract(CROSS_ENTROPY)
    assert [s.function for s in c.stages] == ["cross_entropy_count_targets", "cross_entropy_valid_mean"]
    assert {"cross_entropy/count_targets.cu", "cross_entropy/valid_mean.cu"} <= set(c.support)
    binding = custom.building.binding_source(CROSS_ENTROPY, has_backward=False)
    assert 'losslab::bind(m, "count_targets", &cross_entropy_count_targets);' in binding
    assert 'losslab::bind(m, "custom_forward", &cross_entropy_custom_forward);' in binding
    assert "custom_backward" not in binding
    assert not custom.contract(KL_DIV).stages


def test_the_default_backward_is_the_highest_rung_that_keeps_the_forwards_tensors():
    for problem in problems.names():
        rung = problems.get(problem).rung(custom.default_backward(problems.get(problem)))
        assert not rung.writes_grad_in_forward
        later = problems.get(problem).variants[problems.get(problem).variants.index(rung.name) + 1:]
        assert all(problems.get(problem).rung(r).writes_grad_in_forward for r in later)


def test_signature_shows_every_parameter_and_the_optional_backward():
    text = custom.signature("cross_entropy")
    assert "cudaError_t cross_entropy_custom_forward(const void* logits," in text and "optional" in text
    for p in (*custom.contract(CROSS_ENTROPY).forward.params, *custom.contract(CROSS_ENTROPY).backward.params):
        assert f"{p.ctype} {p.name}" in text
    assert all(len(line) <= 120 for line in text.splitlines())


# --- cpu tier: diagnostics and building -----------------------------------------------------------------

def test_diagnostics_keep_the_users_line_numbers():
    found = custom.parse_diagnostics(NVCC_OUTPUT, "mine.cu", "custom_variant.cu")
    assert [(m.line, m.kind) for m in found] == [(12, "error"), (None, "error"), (30, "error"), (None, "warning"),
                                                 (7, "warning")]
    assert found[0].text == 'identifier "x" is undefined'
    assert found[1].where == "the launcher-signature check" and "aka" not in found[1].text
    assert found[3].where == "x.h"


def test_formatted_errors_quote_the_line_and_the_contract():
    source = "\n".join(f"line{i}" for i in range(1, 40))
    messages = custom.parse_diagnostics(NVCC_OUTPUT, "mine.cu", "custom_variant.cu")[:3]
    text = custom.format_diagnostics(messages, source, KL_DIV)
    assert 'line 12: error: identifier "x" is undefined\n    12 | line12' in text
    assert "line 30: error: 'foo' was not declared" in text
    assert "kl_div_custom_forward(const void* predictions" in text  # the signature check failed: show it


def test_each_source_builds_in_its_own_folder(tmp_path):
    first = custom.build_dir(KL_DIV, "mine", FULL_SOURCE, tmp_path)
    assert first == custom.build_dir(KL_DIV, "mine", FULL_SOURCE, tmp_path)  # unchanged: reused
    assert first.parent == tmp_path and first.name.startswith("kl_div-mine-")
    others = {custom.build_dir(KL_DIV, "mine", FULL_SOURCE + "\n", tmp_path),
              custom.build_dir(KL_DIV, "other", FULL_SOURCE, tmp_path),
              custom.build_dir(CROSS_ENTROPY, "mine", FULL_SOURCE, tmp_path)}
    assert first not in others and len(others) == 3


def test_cache_root_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("LOSSLAB_CACHE", str(tmp_path))
    assert custom.cache_root() == tmp_path / "custom"


def test_backward_detected_only_where_defined():
    assert custom.defines_backward(KL_DIV, FULL_SOURCE)
    assert not custom.defines_backward(KL_DIV, FORWARD_ONLY)
    assert not custom.defines_backward(KL_DIV, FORWARD_ONLY + "// kl_div_custom_backward(...) { }\n")
    assert not custom.defines_backward(KL_DIV, FORWARD_ONLY + "cudaError_t kl_div_custom_backward(int);\n")


@pytest.mark.parametrize("kwargs,match", [
    ({"problem": "softmax", "source": FULL_SOURCE}, "problem"),
    ({"problem": "kl_div", "source": FULL_SOURCE, "name": "my variant"}, "name"),
    ({"problem": "kl_div", "source": "  \n"}, "empty"),
    ({"problem": "kl_div", "source": FORWARD_ONLY, "backward": "source"}, "backward"),
    ({"problem": "kl_div", "source": FULL_SOURCE, "backward": "fastest"}, "variant"),
])
def test_bad_arguments_are_refused_before_compiling(kwargs, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        custom.check_source(root=tmp_path, **kwargs)


# --- cpu tier: a variant object through the autograd glue and the checker ----------------------------------

class HandKL(custom.PythonVariant):
    """KL divergence written out by hand with torch on the CPU (not F.kl_div): the checker's
    extension point without a GPU. ``divide_by`` "B" is right; "BD" is batchmean's classic slip."""

    problem = KL_DIV

    def __init__(self, divide_by="B"):
        self.name, self.divide_by = f"hand_{divide_by}", divide_by

    def validate(self, *inputs):  # CPU tensors: skip the device check
        pass

    def _scale(self, p):
        return p.shape[0] * (p.shape[1] if self.divide_by == "BD" else 1)

    def launch_forward(self, inputs, out=None, needs_grad=False, grad_out=None):
        p, t = (x.detach() for x in inputs)
        terms = torch.where(t > 0, t * (t.log() - p.log()), torch.zeros_like(t))
        loss = terms.sum() / self._scale(p)
        return (loss if out is None else out.copy_(loss)), (p, t)

    def launch_backward(self, saved, grad_loss, out=None):
        p, t = saved
        grad = -t / p / self._scale(p) * grad_loss.reshape(())
        return grad if out is None else out.copy_(grad)


def test_a_variant_object_passes_the_checker_through_its_autograd():
    inputs = problems.get("kl_div").make_inputs((8, 300), seed=0, device="cpu")
    forward, backward = check_inputs(KL_DIV, HandKL(), inputs, "cpu")
    assert forward.variant == "hand_B" and forward.passed and backward.passed, (forward, backward)


def test_a_wrong_variant_object_fails_the_checker():
    inputs = problems.get("kl_div").make_inputs((8, 300), seed=0, device="cpu")
    forward, backward = check_inputs(KL_DIV, HandKL("BD"), inputs, "cpu")
    assert not forward.passed and forward.error == pytest.approx(1 - 1 / 300, rel=1e-6)
    assert not backward.passed


def test_a_variant_object_backward_runs_twice_through_a_retained_graph():
    p, t = problems.get("kl_div").make_inputs((4, 16), seed=1, device="cpu")
    p.requires_grad_(True)
    loss = HandKL()(p, t)
    loss.backward(retain_graph=True)
    first = p.grad.clone()
    loss.backward()
    assert torch.allclose(p.grad, 2 * first)


def test_a_variant_refuses_a_dtype_it_has_no_kernels_for():
    p, t = problems.get("kl_div").make_inputs((4, 16), seed=1, device="cpu", dtype=torch.float16)
    with pytest.raises(TypeError, match="predictions: kl_div hand_B takes dtype torch.float32"):
        HandKL()(p, t)


def test_a_check_run_reads_as_its_verdict_or_its_failures():
    from losslab.measure.check import CheckResult
    from losslab.teach import isolated

    hung = custom.CheckRun(isolated.Outcome("timed_out", message="no result after 60 s: killed"), None)
    assert not hung.passed and hung.format() == "checks did not finish: timed out: no result after 60 s: killed"
    bad = CheckResult("kl_div", "mine", "random 3x4 float32", (3, 4), "forward", 0.5, 1e-5, False)
    ran = custom.CheckRun(isolated.Outcome("ok", seconds=12.0), [bad, CheckResult(**{**bad.as_dict(), "passed": True})])
    assert not ran.passed and ran.format().splitlines() == [
        "checks: 1 of 2 passed (12 s in a child process)", "  FAIL forward random 3x4 float32: error 5.00e-01 > 1e-05"]
    assert "color:#b00" in ran._repr_mimebundle_()["text/html"]


# --- compile tier: nvcc ------------------------------------------------------------------------------------

@pytest.mark.compile
def test_compile_error_in_the_users_line_numbers(tmp_path):
    with pytest.raises(custom.CustomCompileError) as caught:
        custom.check_source("kl_div", BROKEN_SOURCE, "broken", root=tmp_path)
    err = caught.value
    assert [m.line for m in err.messages] == [BROKEN_LINE]
    line = BROKEN_SOURCE.splitlines()[BROKEN_LINE - 1]
    assert f'line {BROKEN_LINE}: error: identifier "kl_term" is undefined' in str(err) and line in str(err)


def _stubs(problem: str, signature: str) -> str:
    """A source defining each declaration of ``signature`` with an empty body."""
    body = signature.replace(");", ") { return cudaSuccess; }")
    return f'#include "{problem}/launchers.h"\n{body}\n'


@pytest.mark.compile
@pytest.mark.parametrize("problem", problems.names())
def test_the_shown_signature_is_the_contract(problem, tmp_path):
    """What ``signature`` shows compiles as the launchers; one changed parameter type does not."""
    shown = custom.signature(problem)
    assert custom.check_source(problem, _stubs(problem, shown), "stubs", root=tmp_path).has_backward
    changed = shown.replace("int64_t", "int", 1)
    with pytest.raises(custom.CustomCompileError, match="launcher-signature check") as caught:
        custom.check_source(problem, _stubs(problem, changed), "changed", root=tmp_path)
    assert "exactly these signatures" in str(caught.value)


@pytest.mark.compile
def test_cell_magic_reports_errors_without_raising(capsys, monkeypatch, tmp_path):
    InteractiveShell = pytest.importorskip("IPython.core.interactiveshell").InteractiveShell
    monkeypatch.setenv("LOSSLAB_CACHE", str(tmp_path))
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "losslab.teach.custom")
    assert shell.run_cell_magic("losslab_variant", "kl_div broken", BROKEN_SOURCE) is None
    assert f"line {BROKEN_LINE}: error" in capsys.readouterr().err and "broken" not in shell.user_ns
    assert shell.run_cell_magic("losslab_variant", "kl_div", BROKEN_SOURCE) is None
    assert "usage: %%losslab_variant" in capsys.readouterr().err


@pytest.mark.compile
def test_custom_variants_build_with_their_launchers_and_stages(tmp_path):
    variant = custom.compile_variant("kl_div", "full", FULL_SOURCE, root=tmp_path)
    assert variant.backward_from is None and callable(variant.module.custom_backward)
    assert variant.compiled.folder.parent == tmp_path
    again = custom.compile_variant("kl_div", "full", FULL_SOURCE, root=tmp_path)  # cached: no rebuild
    assert again.compiled.folder == variant.compiled.folder
    source = (build.ROOT / "pitfalls" / "cross_entropy" / "int32_targets.cu").read_text()
    entropy = custom.compile_variant("cross_entropy", "int32_targets", source, root=tmp_path)
    assert entropy.backward_from == custom.default_backward(CROSS_ENTROPY) and callable(entropy.module.count_targets)
    assert not hasattr(entropy.module, "custom_backward")


# --- gpu tier -------------------------------------------------------------------------------------------

# a volatile read each turn (a loop without side effects may be compiled away); targets are in (0, 1)
HANG = FULL_SOURCE.replace("    sum = block_reduce_sum(sum);",
                           "    while (*(volatile const float*)t != 2.0f) {}\n    sum = block_reduce_sum(sum);")
MISALIGNED = FULL_SOURCE.replace(
    "    sum = block_reduce_sum(sum);",
    "    { const float4 v = reinterpret_cast<const float4*>(p + 1)[threadIdx.x];  // p + 1: never 16-byte aligned\n"
    "      sum += v.x + v.y + v.z + v.w; }  // all four lanes used: one 16-byte load\n"
    "    sum = block_reduce_sum(sum);")


def _cuda_still_works():
    assert torch.ones(4, device="cuda").sum().item() == 4.0


@pytest.mark.gpu
def test_custom_variant_with_its_own_backward_passes_and_joins_the_ladder():
    variant = custom.compile_variant("kl_div", "full", FULL_SOURCE)
    run = custom.check(variant, ["small", "odd"])
    assert run.outcome.ok and run.passed, run.outcome.format() + str([c for c in run.checks or [] if not c.passed])
    section = custom.evaluate(variant, size="small", ladder=["naive", "vectorized"], repeats=5)
    assert section.source == "live" and {c.variant for c in section.checks} == {"full"}
    assert all(c.passed for c in section.checks)
    assert {r.implementation for r in section.rows} == {"naive", "vectorized", "full", "eager"}
    from losslab.present import roofline, tables

    assert "full" in tables.timing_table(section)
    assert any(p.implementation == "full" for p in roofline.points(section))


@pytest.mark.gpu
def test_custom_cross_entropy_variant_passes():
    """The int32 pitfall with its targets read as int64 is a correct cross_entropy forward."""
    source = (build.ROOT / "pitfalls" / "cross_entropy" / "int32_targets.cu").read_text()
    fixed = source.replace("reinterpret_cast<const int*>(targets)[row]", "targets[row]")
    assert fixed != source
    variant = custom.compile_variant("cross_entropy", "fixed", fixed)
    run = custom.check(variant)
    assert run.passed, run.outcome.format() + str([c for c in run.checks or [] if not c.passed][:3])
    x, t = problems.get("cross_entropy").make_inputs((64, 100), seed=0)
    assert torch.allclose(variant(x, t), torch.nn.functional.cross_entropy(x, t), rtol=1e-5)


@pytest.mark.gpu
def test_a_hanging_kernel_times_out_and_this_process_keeps_its_gpu():
    variant = custom.compile_variant("kl_div", "hang", HANG)
    run = custom.check(variant, ["small"], edge_cases=False, timeout_s=60)
    assert run.outcome.status == "timed_out" and run.checks is None and not run.passed
    _cuda_still_works()


@pytest.mark.gpu
def test_a_misaligned_vector_load_is_a_verdict_with_a_hint():
    variant = custom.compile_variant("kl_div", "misaligned", MISALIGNED)
    run = custom.check(variant, ["small"], edge_cases=False)
    assert run.outcome.status in ("cuda_error", "crashed"), run.outcome.format()
    assert "misaligned address" in run.outcome.format() and "16-byte" not in run.outcome.message
    assert "aligned" in run.outcome.hint
    _cuda_still_works()
