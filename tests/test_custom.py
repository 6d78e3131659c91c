"""Your own variant (losslab.custom), the exercises, and the explorer.

cpu tier: compile errors mapped to the user's lines, isolated build folders, the launcher
contract matching kernels/<problem>/launchers.h, the check's extension point, the
exercises' files and grades, the explorer's filtering and caching, the environment.
compile tier: real nvcc errors in the user's line numbers; skeletons, solutions and a full
build. gpu tier: solutions pass and skeletons fail; custom variants pass the checker.
"""
import re

import pytest
import torch
import torch.nn.functional as F

from losslab import build
from losslab.teach import custom
from losslab.teach import environment
from losslab.teach import exercises
from losslab.teach import explorer
from losslab import problems
from losslab import records
from losslab.measure.check import check_inputs

# A complete kl_div variant: the coalesced forward and its own element-wise backward.
FULL_SOURCE = """#include "kl_div/kl_div.cuh"
#include "common/reduce.cuh"
#include "common/sum_partials.cuh"

constexpr int THREADS = 256;

__global__ void forward_kernel(const float* p, const float* t, float* row_partials, int64_t D) {
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < D; j += THREADS) sum += kl_div_term(p[blockIdx.x * D + j], t[blockIdx.x * D + j]);
    sum = block_reduce_sum(sum);
    if (threadIdx.x == 0) row_partials[blockIdx.x] = sum;
}

__global__ void backward_kernel(const float* p, const float* t, const float* grad_loss, float* grad, int64_t n, float B) {
    const int64_t i = blockIdx.x * int64_t(THREADS) + threadIdx.x;
    if (i < n) grad[i] = kl_div_grad(p[i], t[i], *grad_loss / B);
}

cudaError_t kl_div_custom_forward(const float* predictions, const float* targets, float* row_partials,
                                  float* loss, int64_t B, int64_t D, cudaStream_t stream) {
    forward_kernel<<<B, THREADS, 0, stream>>>(predictions, targets, row_partials, D);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    return launch_sum_partials(row_partials, B, float(B), loss, stream);
}

cudaError_t kl_div_custom_backward(const float* predictions, const float* targets, const float* grad_loss,
                                   float* grad_predictions, int64_t B, int64_t D, cudaStream_t stream) {
    backward_kernel<<<(B * D + THREADS - 1) / THREADS, THREADS, 0, stream>>>(predictions, targets, grad_loss,
                                                                            grad_predictions, B * D, float(B));
    return cudaGetLastError();
}
"""
BROKEN_LINE = 9  # FULL_SOURCE with an undefined identifier on this line
BROKEN_SOURCE = FULL_SOURCE.replace("sum += kl_div_term(", "sum += kl_term(")

NVCC_OUTPUT = """/cache/kl_div-mine-0123/mine.cu(12): error: identifier "x" is undefined
      x = 1;
      ^
custom_variant.cu(4): error: a value of type "cudaError_t (*)(int)" (aka "cudaError (*)(int)") cannot be used
mine.cu:30:5: error: 'foo' was not declared in this scope
/usr/include/x.h(3): warning #177-D: variable "y" was declared but never referenced
mine.cu(7): warning #177-D: variable "z" was declared but never referenced
"""


# --- cpu tier: compile errors, build folders, the contract ----------------------------------------------

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
    text = custom.format_diagnostics(messages, source, "kl_div")
    assert 'line 12: error: identifier "x" is undefined\n    12 | line12' in text
    assert "line 30: error: 'foo' was not declared" in text
    assert "kl_div_custom_forward(const float* predictions" in text  # the signature check failed: show it


def test_each_source_builds_in_its_own_folder(tmp_path):
    first = custom.build_dir("kl_div", "mine", FULL_SOURCE, tmp_path)
    assert first == custom.build_dir("kl_div", "mine", FULL_SOURCE, tmp_path)  # unchanged: reused
    assert first.parent == tmp_path and first.name.startswith("kl_div-mine-")
    others = {custom.build_dir("kl_div", "mine", FULL_SOURCE + "\n", tmp_path),
              custom.build_dir("kl_div", "other", FULL_SOURCE, tmp_path),
              custom.build_dir("cross_entropy", "mine", FULL_SOURCE, tmp_path)}
    assert first not in others and len(others) == 3
    assert not any(p.name.startswith("losslab_") for p in [first, *others])  # never a shipped extension's name


def test_cache_root_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("LOSSLAB_CACHE", str(tmp_path))
    assert custom.cache_root() == tmp_path / "custom"


def test_backward_detected_only_where_defined():
    assert custom.defines_backward("kl_div", FULL_SOURCE)
    forward_only = FULL_SOURCE[:FULL_SOURCE.index("cudaError_t kl_div_custom_backward")]
    assert not custom.defines_backward("kl_div", forward_only)
    assert not custom.defines_backward("kl_div", forward_only + "// kl_div_custom_backward(...) { }\n")


@pytest.mark.parametrize("kwargs,match", [
    ({"problem": "softmax", "source": FULL_SOURCE}, "problem"),
    ({"problem": "kl_div", "source": FULL_SOURCE, "name": "my variant"}, "name"),
    ({"problem": "kl_div", "source": "  \n"}, "empty"),
    ({"problem": "kl_div", "source": FULL_SOURCE[:FULL_SOURCE.index("cudaError_t kl_div_custom_backward")],
      "backward": "source"}, "backward"),
    ({"problem": "kl_div", "source": FULL_SOURCE, "backward": "fastest"}, "variant"),
])
def test_bad_arguments_are_refused_before_compiling(kwargs, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        custom.check_source(root=tmp_path, **kwargs)


def _types(declaration: str) -> list[str]:
    """Parameter types of a C declaration, names and comments dropped."""
    text = re.sub(r"/\*.*?\*/|//[^\n]*|\\\n", " ", declaration)
    params = text[text.index("(") + 1:text.rindex(")")].split(",")
    return [" ".join(p.replace("*", " * ").split()[:-1]).replace(" *", "*") for p in params]


@pytest.mark.parametrize("problem", sorted(custom.CONTRACTS))
def test_contract_is_the_float_rungs_launcher_signature(problem):
    """The custom forward and backward take what the shipped float32 rungs take
    (kernels/<problem>/launchers.h), so a rung's code pastes into a custom variant."""
    header = (build.KERNELS / problem / "launchers.h").read_text()
    for direction in ("forward", "backward"):
        shipped = re.search(rf"cudaError_t {problem}_##variant##_{direction}\((.*?)\);", header, re.DOTALL)
        assert shipped, f"no float rung {direction} launcher in {problem}/launchers.h"
        ours = getattr(custom.contract(problem), direction)
        assert _types(ours) == _types("f(" + shipped.group(1) + ")")


def test_signature_names_the_optional_backward():
    text = custom.signature("kl_div")
    assert "kl_div_custom_forward" in text and "optional" in text and "kl_div_custom_backward" in text


class TorchVariant:
    """A variant object computed with torch on the CPU: the check's extension point without a GPU.
    ``one_element`` returns the loss with shape (1,) (a wrapper mistake)."""

    def __init__(self, one_element=False):
        self.name, self.one_element = "torch_cpu", one_element

    def _shape(self, loss):
        return loss.reshape(1) if self.one_element else loss

    def __call__(self, predictions, targets):  # the autograd glue of custom variants, without the CUDA checks
        return custom._CustomFunction.apply(self, predictions, targets)

    def launch_forward(self, inputs, out=None, needs_grad=False, grad_out=None):
        loss = F.kl_div(inputs[0].detach().log(), inputs[1], reduction="batchmean")
        return self._shape(loss if out is None else out.copy_(loss)), tuple(inputs)

    def launch_backward(self, saved, grad_loss, out=None):
        p, t = saved
        grad = -t / (p * p.shape[0]) * grad_loss.reshape(())
        return grad if out is None else out.copy_(grad)


def test_check_accepts_a_variant_object():
    inputs = problems.get("kl_div").make_inputs((8, 300), seed=0, device="cpu")
    results_ = check_inputs("kl_div", TorchVariant(), inputs, "cpu")
    assert [r.variant for r in results_] == ["torch_cpu", "torch_cpu"] and all(r.passed for r in results_)


def test_check_reports_a_one_element_loss_as_a_failure_not_an_exception():
    inputs = problems.get("kl_div").make_inputs((8, 300), seed=0, device="cpu")
    forward, backward = check_inputs("kl_div", TorchVariant(one_element=True), inputs, "cpu")
    assert not forward.passed and forward.detail == "output shape (1,), reference ()"
    assert backward.passed


# --- cpu tier: exercises ----------------------------------------------------------------------------

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
    with pytest.raises(ValueError, match="exercise"):
        exercises.get("tensor_cores")


def test_grade_is_green_only_when_everything_passes():
    from losslab.measure.check import CheckResult

    ok = CheckResult("kl_div", "vectorize", "random", (3, 4), "forward", 1e-8, 1e-5, True)
    bad = CheckResult("kl_div", "vectorize", "random", (3, 4), "forward", 1.0, 1e-5, False, "")
    assert exercises.Grade("vectorize", "x.cu", True, sass={"LDG.E.128": True}, checks=[ok]).passed
    assert not exercises.Grade("vectorize", "x.cu", True, sass={"LDG.E.128": False}, checks=[ok]).passed
    assert not exercises.Grade("vectorize", "x.cu", True, checks=[ok, bad]).passed
    waiting = exercises.Grade("vectorize", "x.cu", True, note="the checks need a CUDA GPU")
    assert not waiting.passed and "not run (the checks need a CUDA GPU)" in "\n".join(waiting.lines())
    assert "does not compile" in "\n".join(exercises.Grade("vectorize", "x.cu", False, "line 3: error").lines())


# --- cpu tier: the explorer and the environment -----------------------------------------------------------

def _record(tmp_path):
    from test_notebooks import fixture_section

    records.save_section("kl_div", fixture_section(), tmp_path)
    return tmp_path


def test_explorer_filters_the_record(tmp_path):
    ex = explorer.Explorer(live=False, results_dir=_record(tmp_path))
    section = ex.section(explorer.Selection("kl_div", ("naive", "vectorized"), "seed"))
    assert {r["implementation"] for r in section["rows"]} == {"naive", "vectorized", "eager", "compile"}
    items = ex.render(explorer.Selection("kl_div", ("vectorized",), "small"))
    assert "applies to the cost model only" in items[0].plain and "Launch configuration" in items[0].plain
    assert "128x4096" in items[1] and len(items) == 5  # note, cost model, table, chart, roofline


def test_explorer_without_record_shows_the_model_only(tmp_path):
    items = explorer.Explorer(live=False, results_dir=tmp_path).render(explorer.Selection("kl_div", ("naive",), "odd"))
    assert "only the cost model" in items[0].plain and len(items) == 2


def test_explorer_measures_only_what_is_new(monkeypatch):
    """Live, each (implementation, shape, dtype) is measured once: changing the selection
    measures only what it adds."""
    import losslab.measure.bench
    import losslab.present.roofline
    from losslab.measure.bench import BenchRow

    calls = []

    def fake_bench(problem, shape, variants, peers, **kwargs):
        name = (variants or list(peers))[0]
        calls.append(name)
        return [BenchRow(problem, name, "peer" if peers else "variant", "forward", shape, "float32",
                         1.0, 1.0, 1.0, 3, 1.0, "read", 0.1, 0, 0.0)]

    monkeypatch.setattr(losslab.measure.bench, "bench_problem", fake_bench)
    monkeypatch.setattr(losslab.present.roofline, "measure_bandwidth", lambda: {"read": 10.0, "copy": 10.0})
    monkeypatch.setattr(records, "provenance", lambda p: {"device": "fake", "date": "2000-01-01", "torch": "-",
                                                          "cuda": "-", "kernels_sha256": "0" * 64})
    ex = explorer.Explorer(live=True, peers=("eager",))
    ex.section(explorer.Selection("kl_div", ("naive", "vectorized"), "small"))
    ex.section(explorer.Selection("kl_div", ("vectorized", "warp_shuffle"), "small"))
    section = ex.section(explorer.Selection("kl_div", ("naive",), "small"))
    assert calls == ["naive", "vectorized", "eager", "warp_shuffle"] and ex.measurements == 4
    assert section["rows"][0]["speedup"] == {"eager": 1.0}
    ex.section(explorer.Selection("kl_div", ("naive",), "odd"))
    assert calls[-2:] == ["naive", "eager"]


def test_explorer_widget_rerenders_in_place(tmp_path, monkeypatch):
    pytest.importorskip("ipywidgets")
    ex = explorer.Explorer(live=False, results_dir=_record(tmp_path))
    shown = []
    monkeypatch.setattr(ex, "render", lambda sel: shown.append(sel) or [])
    box = ex.widget(explorer.Selection("kl_div", ("naive",), "seed"))
    def walk(widget):
        yield widget
        for child in getattr(widget, "children", ()):
            yield from walk(child)

    controls = {getattr(w, "description", ""): w for w in walk(box)}
    controls["variants"].value = ("naive", "vectorized")
    controls["problem"].value = "cross_entropy"  # resets the variants, sizes and dtypes: one render
    assert [s.variants for s in shown] == [("naive",), ("naive", "vectorized"),
                                           problems.get("cross_entropy").variants]
    assert controls["repeats"].continuous_update is False and box.children[-1].layout.height


def test_environment_and_notebook_map():
    env = environment.detect()
    assert env.torch == torch.__version__ and (env.gpu is not None) == torch.cuda.is_available()
    page = environment.notebook_map(env).plain
    for path in sorted((build.ROOT / "notebooks").glob("*.ipynb")):
        if path.stem[:2] in {n[:2] for n, *_ in environment.NOTEBOOKS}:
            assert path.stem in page
    assert "CUDA GPU" in environment.table(env).plain


# --- compile tier: nvcc --------------------------------------------------------------------------------

@pytest.mark.compile
def test_compile_error_in_the_users_line_numbers(tmp_path):
    with pytest.raises(custom.CustomCompileError) as caught:
        custom.check_source("kl_div", BROKEN_SOURCE, "broken", root=tmp_path)
    err = caught.value
    assert [m.line for m in err.messages] == [BROKEN_LINE]
    line = BROKEN_SOURCE.splitlines()[BROKEN_LINE - 1]
    assert f'line {BROKEN_LINE}: error: identifier "kl_term" is undefined' in str(err) and line in str(err)


@pytest.mark.compile
def test_wrong_launcher_signature_names_the_contract(tmp_path):
    source = FULL_SOURCE.replace("float* loss, int64_t B, int64_t D, cudaStream_t stream) {",
                                 "float* loss, int B, int64_t D, cudaStream_t stream) {")
    with pytest.raises(custom.CustomCompileError, match="launcher-signature check") as caught:
        custom.check_source("kl_div", source, "mine", root=tmp_path)
    assert "exactly these signatures" in str(caught.value)


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


@pytest.mark.compile
def test_cell_magic_reports_errors_without_raising(capsys, monkeypatch, tmp_path):
    InteractiveShell = pytest.importorskip("IPython.core.interactiveshell").InteractiveShell
    monkeypatch.setenv("LOSSLAB_CACHE", str(tmp_path))
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "losslab.teach.custom")
    assert shell.run_cell_magic("losslab_variant", "kl_div broken", BROKEN_SOURCE) is None
    assert f"line {BROKEN_LINE}: error" in capsys.readouterr().err and "broken" not in shell.user_ns


@pytest.mark.compile
def test_custom_variant_builds_and_imports(tmp_path):
    variant = custom.compile_variant("kl_div", "full", FULL_SOURCE, root=tmp_path)
    assert variant.backward_from is None and callable(variant.module.backward)
    assert variant.compiled.folder.parent == tmp_path
    again = custom.compile_variant("kl_div", "full", FULL_SOURCE, root=tmp_path)  # cached: no rebuild
    assert again.compiled.folder == variant.compiled.folder


# --- gpu tier -------------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("exercise", exercises.EXERCISES, ids=lambda e: e.key)
def test_solution_passes_and_skeleton_fails(exercise):
    solved = exercises.grade(exercise.key, solution=True)
    assert solved.passed, "\n".join(solved.lines())
    skeleton = exercises.grade(exercise.key)
    assert skeleton.checks is not None and not all(c.passed for c in skeleton.checks), "\n".join(skeleton.lines())


@pytest.mark.gpu
def test_custom_variant_with_its_own_backward_passes_and_joins_the_ladder():
    variant = custom.compile_variant("kl_div", "full", FULL_SOURCE)
    section = custom.evaluate(variant, size="small", ladder=["naive", "vectorized"], repeats=5)
    failed = [c for c in section["checks"] if not c["passed"]]
    assert not failed, failed[:3]
    names = {r["implementation"] for r in section["rows"]}
    assert names == {"naive", "vectorized", "full", "eager"}
    from losslab.present import roofline
    from losslab.present import workbook

    assert "full" in workbook.timing_table(section)
    assert any(p.implementation == "full" for p in roofline.points(section))


@pytest.mark.gpu
def test_custom_cross_entropy_variant_passes():
    """The int32 pitfall with its targets read as int64 is a correct cross_entropy forward."""
    source = (build.ROOT / "pitfalls" / "cross_entropy" / "int32_targets.cu").read_text()
    fixed = re.sub(r"const int target = reinterpret_cast<const int\*>\(targets\)\[blockIdx.x\];.*",
                   "const int64_t target = targets[blockIdx.x];", source)
    assert fixed != source
    variant = custom.compile_variant("cross_entropy", "fixed", fixed)
    from losslab.measure.check import check_edge_cases, check_variant

    checks = check_variant("cross_entropy", variant, (257, 4099)) + check_edge_cases("cross_entropy", variant)
    assert all(c.passed for c in checks), [c for c in checks if not c.passed][:3]


@pytest.mark.gpu
def test_custom_cross_entropy_refuses_out_of_range_targets():
    source = (build.ROOT / "pitfalls" / "cross_entropy" / "int32_targets.cu").read_text()
    variant = custom.compile_variant("cross_entropy", "int32_targets", source)
    x, t = problems.get("cross_entropy").make_inputs((4, 10), seed=0)
    t[1] = 10
    with pytest.raises(ValueError, match="targets"):
        variant(x, t)

