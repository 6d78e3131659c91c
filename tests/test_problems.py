"""cpu tier: every problem's reference, inputs, cost model, rung table and input validation."""
import re

import pytest
import torch

import losslab
from losslab import build, problems

PROBLEMS = problems.names()


@pytest.mark.parametrize("problem", PROBLEMS)
def test_make_inputs_is_seeded_and_shaped(problem):
    spec = problems.get(problem)
    a = spec.make_inputs((5, 7), seed=3, device="cpu")
    b = spec.make_inputs((5, 7), seed=3, device="cpu")
    c = spec.make_inputs((5, 7), seed=4, device="cpu")
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not torch.equal(a[0], c[0])
    assert a[0].shape == (5, 7)


@pytest.mark.parametrize("problem", PROBLEMS)
def test_reference_returns_a_0d_tensor(problem):
    spec = problems.get(problem)
    assert spec.reference(*spec.make_inputs((4, 9), seed=0, device="cpu")).shape == ()


@pytest.mark.parametrize("problem", PROBLEMS)
def test_float64_reference_matches_float32_reference(problem):
    spec = problems.get(problem)
    inputs = spec.make_inputs((6, 50), seed=1, device="cpu")
    loss64, grad64 = spec.reference_float64(*inputs)
    assert loss64.dtype == grad64.dtype == torch.float64
    assert grad64.shape == inputs[0].shape
    torch.testing.assert_close(loss64.float(), spec.reference(*inputs), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("problem", PROBLEMS)
@pytest.mark.parametrize("direction", problems.DIRECTIONS)
def test_cost_model_is_memory_bound(problem, direction):
    # ~1 FLOP per byte: far left of any GPU's ridge point (tens of FLOP/byte)
    cost = problems.get(problem).cost(problems.get(problem).sizes["seed"], direction)
    assert cost.bytes > 0 and 0 < cost.arithmetic_intensity < 4


@pytest.mark.parametrize("problem", PROBLEMS)
def test_sizes_include_seed_and_odd_shapes(problem):
    sizes = problems.get(problem).sizes
    assert "seed" in sizes
    assert any(cols % 4 for _, cols in sizes.values()), "need a size whose rows break float4 alignment"


@pytest.mark.parametrize("problem, variant", losslab.all_variants())
def test_cpu_tensors_are_rejected_before_any_launch(problem, variant):
    inputs = problems.get(problem).make_inputs((4, 8), seed=0, device="cpu")
    with pytest.raises(ValueError, match=rf"{problems.get(problem).input_names[0]}: expected a CUDA tensor"):
        losslab.variant(problem, variant)(*inputs)


@pytest.mark.parametrize("problem", PROBLEMS)
def test_wrong_predictions_are_named_in_the_error(problem):
    spec = problems.get(problem)
    op = losslab.variant(problem, spec.variants[0])
    first, second = spec.input_names[:2]  # predictions and targets, or anchor and positive
    predictions, *others = spec.make_inputs((4, 8), seed=0, device="cpu")
    cases = [
        (predictions.double(), TypeError, rf"{first}: .*dtype torch.float32.*, got torch.float64"),
        (predictions[0], ValueError, rf"{first}: expected 2 dimensions, got shape \(8,\)"),
        (predictions[:, :0], ValueError, rf"{first}: expected a non-empty tensor"),
        (predictions.tolist(), TypeError, rf"{first}: expected a torch.Tensor, got list"),
        # rows and columns no longer match the second input (one or the other ties them, whichever the loss)
        (predictions[:3, :7], ValueError, rf"{second}: expected"),
    ]
    for bad, error, message in cases:
        with pytest.raises(error, match=message):
            op(bad, *others)


def test_unknown_names_are_rejected():
    with pytest.raises(ValueError, match="problem: no problem 'mse'"):
        losslab.variant("mse", "naive")
    with pytest.raises(ValueError, match="variant: kl_div has no variant 'fastest'; expected one of naive"):
        losslab.variant("kl_div", "fastest")


@pytest.mark.parametrize("problem, variant", losslab.all_variants())
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16_bit_inputs_pass_the_dtype_check_exactly_where_the_rung_table_says(problem, variant, dtype):
    """A rung whose table row lists the dtype gets past the dtype check (CPU tensors then fail on
    the device check); any other rung refuses it naming the dtypes it takes."""
    spec = problems.get(problem)
    inputs = [x.to(dtype) if x.is_floating_point() else x for x in spec.make_inputs((4, 8), seed=0, device="cpu")]
    first = spec.input_names[0]
    if dtype in spec.dtypes(variant):
        expected = (ValueError, rf"{first}: expected a CUDA tensor")
    else:
        expected = (TypeError, rf"{first}: {problem} {variant} takes dtype torch\.float32, got {dtype}")
    with pytest.raises(expected[0], match=expected[1]):
        losslab.variant(problem, variant)(*inputs)


# --- the rung table ---------------------------------------------------------------------------

@pytest.mark.parametrize("problem", PROBLEMS)
def test_rung_table_matches_the_kernel_folder_and_the_declared_ladder(problem):
    """Every rung has its .cu; every rung the binding binds (launchers.h's X-macro) is in the
    table, in the same order; the rungs' kernels open with their idea."""
    spec = problems.get(problem)
    header = (build.KERNELS / problem / "launchers.h").read_text()
    declared = re.search(rf"#define {problem.upper()}_RUNGS\(X\) (.*)", header).group(1)
    assert tuple(re.findall(r"X\((\w+)\)", declared)) == spec.variants
    for rung in spec.rungs:
        source = (build.KERNELS / problem / f"{rung.name}.cu").read_text()
        assert source.startswith(f"// {rung.name}: ")
        templated = "dispatch_dtype" in source
        assert templated == (len(rung.dtypes) > 1), f"{rung.name}: rung table dtypes vs its launchers"


@pytest.mark.parametrize("problem", PROBLEMS)
def test_launchers_are_declared_once_as_two_function_types(problem):
    header = (build.KERNELS / problem / "launchers.h").read_text()
    for direction in ("forward", "backward"):
        assert len(re.findall(rf"typedef cudaError_t {problem}_{direction}_fn\(", header)) == 1
    # no rung restates a signature: the rungs are declared through the types
    assert not re.search(rf"cudaError_t {problem}_\w+_(forward|backward)\(", header)


def test_rung_lookup_and_forward_launcher():
    spec = problems.get("kl_div")
    assert spec.rung("naive") == problems.Rung("naive")
    fused = spec.rung("fused")
    assert fused.writes_grad_in_forward and fused.inference == "vectorized"
    assert fused.forward_launcher(needs_grad=True) == ("fused_forward", True)
    assert fused.forward_launcher(needs_grad=False) == ("vectorized_forward", False)
    assert spec.rung("naive").forward_launcher(needs_grad=True) == ("naive_forward", False)
    with pytest.raises(ValueError, match="variant: kl_div has no variant 'turbo'; expected one of naive"):
        spec.rung("turbo")


def test_cluster_tops_cross_entropy_only_and_falls_back_to_fused():
    assert problems.get("kl_div").variants[-1] == "fused"  # 16 KiB rows at its seed size: nothing to split
    variants = problems.get("cross_entropy").variants
    cluster = problems.get("cross_entropy").rung("cluster")
    assert variants[-2:] == ("fused", "cluster") and cluster.falls_back_to == "fused"
    assert cluster.forward_launcher(needs_grad=True) == ("cluster_forward", True)
    assert cluster.forward_launcher(needs_grad=False) == ("vectorized_forward", False)


def test_problems_look_up_without_importlib():
    """problems.get and names are plain dict lookups (torch.compile traces through them); the
    registry imports the packages once, when losslab.problems is imported."""
    import ast
    import inspect

    for function in (problems.get, problems.names):
        tree = ast.parse(inspect.getsource(function))
        assert not [n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == "importlib"], function
