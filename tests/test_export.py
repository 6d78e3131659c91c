"""Exporting single-file KernelBench solutions (losslab.kernelbench.export).

cpu tier: the template is real, lintable Python; the export's text, reference and host code;
the command line. compile tier: an exported solution's CUDA and C++ build with load_inline and
bind every launcher of its rung. (gpu tier: tests/test_evaluate.py runs exported solutions
through ``losslab evaluate``.)
"""
import ast
import importlib.util
import os
import shutil
import subprocess
import sys

import pytest
import torch

from losslab import build, problems
from losslab.__main__ import main
from losslab.kernelbench import export
from losslab.kernelbench.export import ExportError, cuda_source, export_solution, inline_includes

CROSS_ENTROPY = problems.get("cross_entropy")

PAIRS = [(p, v) for p in problems.names() for v in problems.get(p).variants]


def load_module(path):
    """Import one of OUR exported files (it builds nothing until ModelNew())."""
    spec = importlib.util.spec_from_file_location("exported_solution", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def ruff():
    found = shutil.which("ruff") or (os.path.join(os.path.dirname(sys.executable), "ruff"))
    return found if os.path.exists(found) else None


# --- cpu tier: the template ------------------------------------------------------------------

def test_the_template_is_an_importable_solution_with_marked_placeholders():
    from losslab.kernelbench import solution_template as template

    assert {"Model", "ModelNew", "get_inputs", "get_init_inputs", "extension"} <= set(vars(template))
    placeholders = set(export.PLACEHOLDER.findall(export.TEMPLATE.read_text()))
    assert placeholders == {"PROBLEM", "RUNG", "WRITES_GRAD_IN_FORWARD", "DTYPES", "EXTENSION_NAME", "CUDA_SOURCE",
                            "CPP_SOURCE"}
    for block in ("reference", "host"):
        assert f"# >>> {block}" in export.TEMPLATE.read_text() and f"# <<< {block}" in export.TEMPLATE.read_text()


@pytest.mark.skipif(ruff() is None, reason="ruff is not installed (pip install ruff)")
def test_exported_files_and_the_template_lint_clean(tmp_path):
    paths = [export.TEMPLATE]
    for problem, variant in PAIRS:
        paths.append(tmp_path / f"{problem}_{variant}.py")
        paths[-1].write_text(export_solution(problems.get(problem), variant))
    run = subprocess.run([ruff(), "check", "--no-cache", "--config", str(build.ROOT / "pyproject.toml"),
                          *map(str, paths)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-4000:]


# --- cpu tier: the export's text ---------------------------------------------------------------

@pytest.mark.parametrize("problem, variant", PAIRS)
def test_export_is_one_self_contained_python_file(problem, variant):
    text = export_solution(problems.get(problem), variant)
    tree = ast.parse(text)
    defined = {node.name for node in tree.body if isinstance(node, (ast.ClassDef, ast.FunctionDef))}
    assert {"Model", "ModelNew", "get_inputs", "get_init_inputs", "forward", "backward", "launch_values"} <= defined
    imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert not [n for n in imports if "losslab" in ast.unparse(n)], "an exported file imports losslab"
    assert f"{problem}_{variant}_forward" in text  # the rung's launcher, defined in the inlined .cu
    assert f"#define BOUND_RUNGS(X) X({variant})" in text  # the binding binds this rung only
    assert '#include "' not in text, "a local include was left unresolved"
    source = cuda_source(problems.get(problem), variant)
    assert (build.KERNELS / problem / f"{variant}.cu").read_text().splitlines()[0] in source


@pytest.mark.parametrize("problem", problems.names())
def test_host_code_is_the_packages_own(problem):
    """The exported forward/backward are the problem module's, and the launch path is launch.py's."""
    import inspect

    from losslab.problems import launch

    module = problems.get(problem).host
    text = export.host_code(problems.get(problem))
    for function in (module.forward, module.backward, module.validate_inputs, launch.launch_values):
        assert inspect.getsource(function) in text


def test_exported_constants_are_their_source_not_this_process_state(monkeypatch):
    """A cache this process has filled (the stream's scratch, after any GPU call) is exported as
    its module writes it: a solution exported after a GPU run carries no tensor's repr."""
    from losslab.problems import launch

    monkeypatch.setitem(launch._STREAM_SCRATCH, (0, 0), torch.empty(4))
    text = export.host_code(CROSS_ENTROPY)
    assert "_STREAM_SCRATCH: dict[tuple[int, int], torch.Tensor] = {}" in text
    constants = text.split("\n\n\n")[0]
    namespace = {"torch": torch}
    exec(constants, namespace)  # each constant's expression runs, in order
    assert namespace["DTYPE_CODES"] == launch.DTYPE_CODES and namespace["_STREAM_SCRATCH"] == {}


def test_a_rung_that_falls_back_links_the_rung_it_falls_back_to():
    names = [path.name for path in export.kernel_files(CROSS_ENTROPY, "cluster")]
    assert names[:2] == ["cluster.cu", "fused.cu"]
    assert "fused.cu" not in [path.name for path in export.kernel_files(CROSS_ENTROPY, "vectorized")]


def test_inlining_takes_each_header_once(tmp_path):
    (tmp_path / "a.cuh").write_text('#pragma once\nint a;\n')
    (tmp_path / "b.cuh").write_text('#pragma once\n#include "a.cuh"\nint b;\n')
    (tmp_path / "main.cu").write_text('#include "a.cuh"\n#include "b.cuh"\n#include <cstdint>\nint main;\n')
    text = inline_includes(tmp_path / "main.cu")
    assert text.count("int a;") == 1 and "int b;" in text and "#include <cstdint>" in text
    assert "pragma once" not in text
    (tmp_path / "bad.cu").write_text('#include "nowhere.cuh"\n')
    with pytest.raises(ExportError, match="nowhere.cuh"):
        inline_includes(tmp_path / "bad.cu")


def test_inlining_fits_long_lines_without_changing_the_code(tmp_path):
    code = "    if (i < n) out[i] = load<T, EVICT_FIRST>(" + " + ".join(f"a{k} * b{k}" for k in range(12)) + ");"
    comment = "    int x = 1;" + " " * 110 + "  // why"
    define = "#define LONG " + "x" * 120
    (tmp_path / "long.cu").write_text("\n".join((code, comment, define)) + "\n")
    lines = inline_includes(tmp_path / "long.cu").splitlines()[1:]
    assert len(code) > export.LINE_LENGTH and all(len(line) <= export.LINE_LENGTH for line in lines[:-1])
    assert " ".join("".join(lines[:-3]).split()) == " ".join(code.split())  # the same tokens, in order
    assert lines[-3:] == ["    // why", "    int x = 1;", define]  # a macro's line is left whole


@pytest.mark.parametrize("problem", problems.names())
def test_exported_model_and_inputs_are_the_problems(tmp_path, problem):
    """Model is the problem's reference; get_inputs() follows its generator at its seed size."""
    spec = problems.get(problem)
    path = tmp_path / "solution.py"
    path.write_text(export_solution(problems.get(problem), spec.variants[0]))
    module = load_module(path)
    assert (module.batch_size, *module.input_shape) == spec.sizes["seed"]
    init = module.get_init_inputs()  # KernelBench's Model(*init): [] or, for the triplet loss, its margin
    # small, so the test stays quick; KernelBench's hinge loss draws its (D,) targets with batch_size
    # elements (its file is consistent only where B == D, as at its size)
    rows, cols = (33, 33) if problem == "hinge_loss" else (7, 33)
    module.batch_size, module.input_shape = rows, (cols,)
    if hasattr(module, "num_classes"):
        module.num_classes = cols
    inputs = module.get_inputs()
    mine = spec.make_inputs((rows, cols), seed=0, device="cpu")
    assert [(x.shape, x.dtype) for x in inputs] == [(x.shape, x.dtype) for x in mine]
    torch.testing.assert_close(module.Model(*init)(*inputs), spec.reference(*inputs))


@pytest.mark.parametrize("problem", problems.names())
def test_exported_model_new_checks_its_inputs_before_any_build(tmp_path, problem):
    spec = problems.get(problem)
    path = tmp_path / "solution.py"
    path.write_text(export_solution(spec, spec.variants[0]))
    module = load_module(path)
    inputs = spec.make_inputs((4, 8), seed=0, device="cpu")
    first = spec.input_names[0]
    with pytest.raises(ValueError, match=f"{first}: expected a CUDA tensor"):
        module.ModelNew.forward(None, *inputs)  # no __init__: nothing is built
    with pytest.raises(TypeError, match=f"{first}: expected a torch.Tensor"):
        module.ModelNew.forward(None, inputs[0].tolist(), *inputs[1:])
    with pytest.raises(ValueError, match="ModelNew: the kernels compute Model"):
        module.ModelNew(*module.get_init_inputs(), 2.0)  # other init inputs than KernelBench's: refused


# --- cpu tier: the command line ----------------------------------------------------------------

def test_cli_export_writes_the_solution(capsys, tmp_path):
    assert main(["export", "kl_div", "vectorized"]) == 0
    assert "class ModelNew" in capsys.readouterr().out
    assert main(["export", "cross_entropy", "naive", "--output", str(tmp_path / "s.py")]) == 0
    assert "cross_entropy_naive_forward" in (tmp_path / "s.py").read_text()
    capsys.readouterr()
    assert main(["export", "kl_div", "nope"]) != 0
    assert "variant: kl_div has no variant 'nope'" in capsys.readouterr().err


# --- compile tier --------------------------------------------------------------------------------

def build_env(tmp_path) -> dict:
    return {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext"), "TORCH_CUDA_ARCH_LIST": "9.0",
            "CUDA_HOME": str(build.find_cuda_home())}


@pytest.mark.compile
@pytest.mark.parametrize("problem, variant", [("kl_div", "warp_shuffle"), ("kl_div", "fused"),
                                              ("cross_entropy", "vectorized"), ("cross_entropy", "fused"),
                                              ("cross_entropy", "cluster"), ("hinge_loss", "fused")])
def test_exported_solution_builds_with_load_inline(tmp_path, problem, variant):
    """A few rungs, for sm_90 only, to keep it quick (about 10 s each); no GPU is needed to
    build and import, and importing fails on any launcher the binding misses."""
    path = tmp_path / "solution.py"
    path.write_text(export_solution(problems.get(problem), variant))
    code = (f"import importlib.util as u; s = u.spec_from_file_location('s', r'{path}'); "
            "m = u.module_from_spec(s); s.loader.exec_module(m); e = m.extension(); "
            f"print(callable(e.{variant}_forward), callable(e.{variant}_backward))")
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=build_env(tmp_path),
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and run.stdout.split() == ["True", "True"], run.stderr[-3000:]
