"""cpu tier: every problem's reference, inputs, cost model and input validation."""
import pytest
import torch

import losslab
from losslab import problems

PROBLEMS = problems.names()


@pytest.mark.parametrize("problem", PROBLEMS)
def test_make_inputs_is_seeded_and_shaped(problem):
    spec = problems.get(problem)
    a = spec.make_inputs((5, 7), seed=3, device="cpu")
    b = spec.make_inputs((5, 7), seed=3, device="cpu")
    c = spec.make_inputs((5, 7), seed=4, device="cpu")
    assert all(torch.equal(x, y) for x, y in zip(a, b))
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
    with pytest.raises(ValueError, match=r"predictions: expected a CUDA tensor"):
        losslab.variant(problem, variant)(*inputs)


@pytest.mark.parametrize("problem", PROBLEMS)
def test_wrong_predictions_are_named_in_the_error(problem):
    op = losslab.variant(problem, "naive")
    predictions, *others = problems.get(problem).make_inputs((4, 8), seed=0, device="cpu")
    cases = [
        (predictions.double(), TypeError, r"predictions: .*dtype torch.float32.*, got torch.float64"),
        (predictions[0], ValueError, r"predictions: expected 2 dimensions, got shape \(8,\)"),
        (predictions[:, :0], ValueError, r"predictions: expected a non-empty tensor"),
        (predictions.tolist(), TypeError, r"predictions: expected a torch.Tensor, got list"),
        (predictions[:3], ValueError, r"targets: expected"),  # rows no longer match targets
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
def test_dtypes_a_variant_lacks_are_named(problem, variant):
    spec = problems.get(problem)
    for dtype in (torch.bfloat16, torch.float16):
        if dtype not in spec.dtypes(variant):
            inputs = [x.to(dtype) if x.is_floating_point() else x
                      for x in spec.make_inputs((4, 8), seed=0, device="cpu")]
            with pytest.raises(TypeError, match=rf"predictions: .*torch\.float32, got {dtype}"):
                losslab.variant(problem, variant)(*inputs)
