"""gpu tier: every variant, forward and backward, against a float64 reference on
fresh random inputs at every named size, and on each problem's edge cases."""
import shutil
import subprocess
import sys

import pytest
import torch

import losslab
from losslab import build, problems
from losslab.measure import check

pytestmark = pytest.mark.gpu
SIZED = [(p, v, s, d) for p, v in losslab.all_variants() for s in problems.get(p).sizes
         for d in problems.get(p).dtypes(v)]


def assert_passed(results):
    failed = [r for r in results if not r.passed]
    assert not failed, "\n" + check.check_table_text(failed)


@pytest.mark.parametrize("problem, variant, size, dtype", SIZED)
def test_matches_float64_reference(problem, variant, size, dtype):
    assert_passed(check.check_variant(problems.get(problem), variant, problems.get(problem).sizes[size], dtype=dtype))


@pytest.mark.parametrize("problem, variant", losslab.all_variants())
def test_edge_cases_match_pytorch(problem, variant):
    assert_passed(check.check_edge_cases(problems.get(problem), variant))


@pytest.mark.parametrize("problem, variant", losslab.all_variants())
def test_loss_is_bitwise_deterministic(problem, variant):
    inputs = problems.get(problem).make_inputs((300, 5000), seed=7)
    op = losslab.variant(problem, variant)
    first = op(*inputs)
    assert all(torch.equal(first, op(*inputs)) for _ in range(5))


def test_fused_backward_refuses_a_second_call_through_a_retained_graph():
    predictions, targets = problems.get("kl_div").make_inputs((4, 8), seed=0)
    loss = losslab.variant("kl_div", "fused")(predictions.requires_grad_(True), targets)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="fused: backward can run once per forward"):
        loss.backward()


def test_fused_inference_writes_no_gradient():
    predictions, targets = problems.get("kl_div").make_inputs((1024, 4096), seed=0)
    fused = losslab.variant("kl_div", "fused")
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    with torch.no_grad():
        fused(predictions.requires_grad_(True), targets)
    assert torch.cuda.max_memory_allocated() - before < predictions.numel() * 4  # no gradient buffer


@pytest.mark.parametrize("problem", problems.names())
def test_a_cpu_input_beside_a_cuda_one_is_rejected(problem):
    predictions, *others = problems.get(problem).make_inputs((4, 8), seed=0)
    with pytest.raises(ValueError, match="expected a CUDA tensor"):
        losslab.variant(problem, "vectorized")(predictions, *[x.cpu() for x in others])


two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")


@two_gpus
@pytest.mark.parametrize("problem", problems.names())
def test_inputs_on_two_different_gpus_are_rejected(problem):
    predictions, *others = problems.get(problem).make_inputs((4, 8), seed=0, device="cuda:0")
    with pytest.raises(ValueError, match="expected all inputs on one device, got predictions on cuda:0"):
        losslab.variant(problem, "vectorized")(predictions, *[x.to("cuda:1") for x in others])


@two_gpus
@pytest.mark.parametrize("problem, variant", losslab.all_variants())
def test_launches_go_to_the_inputs_gpu_not_the_current_one(problem, variant):
    """The launch path makes the inputs' device current: a loss on cuda:1 computed while cuda:0
    is current equals the same loss on cuda:0 (without the guard the kernels would run on
    cuda:0 with cuda:1's pointers)."""
    spec = problems.get(problem)
    on_0 = spec.make_inputs((65, 1001), seed=0, device="cuda:0")
    on_1 = tuple(x.to("cuda:1").requires_grad_(x.is_floating_point() and i == 0) for i, x in enumerate(on_0))
    op = losslab.variant(problem, variant)
    with torch.cuda.device(0):
        loss = op(*on_1)
        loss.backward()
    expected = op(*(x.clone().requires_grad_(i == 0) for i, x in enumerate(on_0)))
    assert loss.device == torch.device("cuda:1") and on_1[0].grad.device == torch.device("cuda:1")
    torch.testing.assert_close(loss.cpu(), expected.detach().cpu(), rtol=0, atol=0)


SANITIZE = """
import losslab
from losslab import build, problems
for problem, variant in losslab.all_variants():
    for shape in [(3, 1001), (5, 4), (3, 40003)]:  # the last: rows cross_entropy's cluster rung splits
        p, *rest = problems.get(problem).make_inputs(shape, seed=0)
        p.requires_grad_(True)
        losslab.variant(problem, variant)(p, *rest).backward()
# cluster: two clusters of 8 CTAs take 12 rows, so each CTA refills its slice row after row
build.load_extension("cross_entropy").cluster_tune(8, 4096, 2)
p, t = problems.get("cross_entropy").make_inputs((12, 40003), seed=0)
losslab.variant("cross_entropy", "cluster")(p.requires_grad_(True), t).backward()
print("sanitized", len(losslab.all_variants()), "variants")
"""


def test_compute_sanitizer_finds_no_memory_errors():
    sanitizer = shutil.which("compute-sanitizer")
    if sanitizer is None:
        pytest.skip("compute-sanitizer is not on PATH")
    for problem in problems.names():  # build outside the sanitizer: it slows compilation down
        build.load_extension(problem)
    run = subprocess.run([sanitizer, "--tool", "memcheck", "--error-exitcode", "3", sys.executable, "-c", SANITIZE],
                         capture_output=True, text=True, timeout=900)
    if "Device not supported" in run.stdout + run.stderr:
        pytest.skip("compute-sanitizer does not support this device/runtime")
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    assert "ERROR SUMMARY: 0 errors" in run.stdout
