"""gpu tier: every variant, forward and backward, against a float64 reference on
fresh random inputs at every named size, and on each problem's edge cases."""
import shutil
import subprocess
import sys

import pytest
import torch

import losslab
from losslab import build
from losslab.measure import check
from losslab import problems

pytestmark = pytest.mark.gpu
SIZED = [(p, v, s, d) for p, v in losslab.all_variants() for s in problems.get(p).sizes
         for d in problems.get(p).dtypes(v)]


def assert_passed(results):
    failed = [r for r in results if not r.passed]
    assert not failed, "\n" + check.format_table(failed)


@pytest.mark.parametrize("problem, variant, size, dtype", SIZED)
def test_matches_float64_reference(problem, variant, size, dtype):
    assert_passed(check.check_variant(problem, variant, problems.get(problem).sizes[size], dtype=dtype))


@pytest.mark.parametrize("problem, variant", losslab.all_variants())
def test_edge_cases_match_pytorch(problem, variant):
    assert_passed(check.check_edge_cases(problem, variant))


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
def test_inputs_on_different_devices_are_rejected(problem):
    predictions, *others = problems.get(problem).make_inputs((4, 8), seed=0)
    with pytest.raises(ValueError, match="expected a CUDA tensor"):
        losslab.variant(problem, "vectorized")(predictions, *[x.cpu() for x in others])


SANITIZE = """
import losslab
from losslab import problems
for problem, variant in losslab.all_variants():
    for shape in [(3, 1001), (5, 4)]:
        p, *rest = problems.get(problem).make_inputs(shape, seed=0)
        p.requires_grad_(True)
        losslab.variant(problem, variant)(p, *rest).backward()
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
