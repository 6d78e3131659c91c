"""cross_entropy's definition and its error handling: what the kernels must reproduce.

The generic tests (test_problems.py, test_compile.py, test_variants_gpu.py) cover
every problem; these cover what is particular to cross-entropy: ignore_index,
the all-ignored NaN, out-of-range targets (NaN, never a wrong number, never a host
wait; ``check_targets`` and strict mode raise), the precision argument for keeping
each row's log-sum-exp as (max, log(sum)), and the fused rung's gradient written
by its forward.
"""
import inspect
import re

import pytest
import torch
import torch.nn.functional as F

import losslab
from losslab import build, problems
from losslab.measure import check
from losslab.problems import misaligned_view
from losslab.problems.cross_entropy import (
    IGNORE_INDEX,
    check_targets,
    cluster_plan,
    out_of_range_message,
)

CROSS_ENTROPY = problems.get("cross_entropy")

CE = problems.get("cross_entropy")
VARIANTS = CE.variants
HALF = (torch.bfloat16, torch.float16)
# conftest.py skips the gpu tier without a GPU; the skipif keeps these tests safe
# when this file is run on its own.
requires_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="gpu tier: no CUDA GPU visible")


def softmax_minus_onehot(x, t):
    """(softmax(x) - onehot(t)) / n_valid, zero on ignored rows, in float64."""
    x = x.double()
    valid = t != IGNORE_INDEX
    onehot = torch.zeros_like(x)
    onehot[valid.nonzero()[:, 0], t[valid]] = 1
    return (x.softmax(-1) - onehot) * valid[:, None] / valid.sum()


# -- cpu tier: the reference semantics the kernels reproduce ------------------

def test_loss_is_mean_over_valid_rows_of_logsumexp_minus_target_logit():
    x, t = CE.make_inputs((6, 9), seed=0, device="cpu")
    t[[1, 4]] = IGNORE_INDEX
    valid = t != IGNORE_INDEX
    rows = x.logsumexp(-1) - x.gather(1, t.clamp(min=0)[:, None])[:, 0]
    torch.testing.assert_close(CE.reference(x, t), rows[valid].sum() / valid.sum())


def test_gradient_formula_with_ignored_rows():
    x, t = CE.make_inputs((6, 9), seed=0, device="cpu")
    t[::2] = IGNORE_INDEX
    _, grad = CE.reference_float64(x, t)
    torch.testing.assert_close(grad, softmax_minus_onehot(x, t))
    assert (grad[::2] == 0).all()


def test_every_target_ignored_gives_nan_loss_and_zero_gradient():
    x, t = CE.make_inputs((5, 7), seed=0, device="cpu")
    loss, grad = CE.reference_float64(x, torch.full_like(t, IGNORE_INDEX))
    assert loss.isnan()
    assert (grad == 0).all()


def test_one_class_gives_zero_loss_and_gradient():
    loss, grad = CE.reference_float64(*CE.make_inputs((4, 1), seed=0, device="cpu"))
    assert loss == 0 and (grad == 0).all()


def test_split_logsumexp_keeps_the_gradient_accurate_at_1e4():
    # The kernels' float32 arithmetic, emulated: softmax as exp((x - max) - log(sum))
    # meets the gradient tolerance on +-1e4 logits; exp(x - (max + log(sum))) does
    # not, because max + log(sum) rounds log(sum) to the ulp of 1e4 (~1e-3).
    x, t = CE.edge_cases("cpu")["logits of +-1e4 (exp overflows without the max)"]
    _, grad64 = CE.reference_float64(x, t)
    row_max = x.max(-1, keepdim=True).values
    log_sum = (x - row_max).exp().sum(-1, keepdim=True).log()
    onehot = F.one_hot(t, x.shape[1]).float()
    split = ((x - row_max - log_sum).exp() - onehot) / len(t)
    joined = ((x - (row_max + log_sum)).exp() - onehot) / len(t)
    assert check.relative_error(split, grad64)[0] <= check.GRAD_RTOL
    assert check.relative_error(joined, grad64)[0] > check.GRAD_RTOL


def test_make_inputs_gives_int64_class_indices():
    x, t = CE.make_inputs((50, 7), seed=0, device="cpu")
    assert x.dtype == torch.float32 and x.shape == (50, 7)
    assert t.dtype == torch.int64 and t.shape == (50,)
    assert 0 <= int(t.min()) and int(t.max()) < 7


def test_cost_model_counts_bytes_once():
    rows, cols = CE.sizes["seed"]
    n = rows * cols
    forward = CE.cost((rows, cols), "forward")
    assert forward.bytes_read == n * 4 + rows * 8  # logits and int64 targets
    assert forward.bytes_written == 4              # the 0-d loss
    assert forward.transcendentals == n + rows     # an exp per element, a log per row
    assert CE.cost((rows, cols), "backward").bytes_written == n * 4
    assert CE.cost((rows, cols), "forward_backward").bytes == 2 * n * 4 + rows * 8 + 8


def test_edge_cases_cover_the_issue_list():
    cases = " ".join(CE.edge_cases("cpu"))
    for needle in ("every target ignored", "some rows ignored", "1e4", "C = 1", "multiple of 4",
                   "N = 1", "alignment", "non-contiguous"):
        assert needle in cases


@pytest.mark.parametrize("case", list(CE.edge_cases("cpu")))
def test_edge_case_targets_are_valid_class_indices(case):
    x, t = CE.edge_cases("cpu")[case]
    assert t.dtype == torch.int64 and t.shape == (x.shape[0],)
    assert ((t == IGNORE_INDEX) | ((t >= 0) & (t < x.shape[1]))).all()


def test_misaligned_edge_case_really_is_misaligned():
    x, _ = CE.edge_cases("cpu")["storage offset breaks 16-byte alignment"]
    assert x.is_contiguous() and x.storage_offset() % 4 != 0


def test_ignore_index_agrees_with_the_kernels():
    header = (build.KERNELS / "cross_entropy" / "cross_entropy.cuh").read_text()
    assert re.search(r"constexpr int64_t IGNORE_INDEX = (-?\d+);", header).group(1) == str(IGNORE_INDEX)
    assert IGNORE_INDEX == inspect.signature(F.cross_entropy).parameters["ignore_index"].default


def test_cost_model_scales_with_the_element_size():
    shape = CE.sizes["seed"]
    n = shape[0] * shape[1]
    full, half = CE.cost(shape, "forward_backward"), CE.cost(shape, "forward_backward", torch.bfloat16)
    # logits read, gradient written, grad_loss read and loss written: 2 bytes each, not 4
    assert full.bytes - half.bytes == (2 * n + 2) * (4 - 2)


# -- cpu tier: bad input is refused on the host, before any build or launch ---

@pytest.fixture
def no_build(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("validation should have failed before building the kernels")
    monkeypatch.setattr(build, "load_extension", refuse)


@pytest.mark.parametrize("variant", VARIANTS)
def test_cpu_tensors_are_rejected_before_any_build(no_build, variant):
    x, t = CE.make_inputs((4, 8), seed=0, device="cpu")
    with pytest.raises(ValueError, match=r"predictions: expected a CUDA tensor"):
        losslab.variant("cross_entropy", variant)(x, t)


BAD_TARGETS = {
    "float class probabilities": (lambda t: t.float(), TypeError,
                                  r"targets: expected int64 class indices .* got torch.float32 "
                                  r"\(class probabilities are not supported\)"),
    "int32 indices": (lambda t: t.int(), TypeError, r"targets: expected int64 class indices .* got torch.int32"),
    "a list": (lambda t: t.tolist(), TypeError, r"targets: expected a torch.Tensor, got list"),
    "a column (N, 1)": (lambda t: t[:, None], ValueError, r"targets: expected 1 dimensions, got shape \(4, 1\)"),
    "one target short": (lambda t: t[:3], ValueError,
                         r"targets: expected one class index per row of predictions \(4\), got shape \(3,\)"),
}


@pytest.mark.parametrize("case", list(BAD_TARGETS))
def test_bad_targets_are_named_in_the_error(no_build, case):
    make_bad, error, message = BAD_TARGETS[case]
    x, t = CE.make_inputs((4, 8), seed=0, device="cpu")
    with pytest.raises(error, match=message):
        losslab.variant("cross_entropy", "vectorized")(x, make_bad(t))


@pytest.mark.parametrize("variant", ["naive", "shared_memory", "warp_shuffle"])
def test_16_bit_logits_are_refused_by_the_float_rungs(no_build, variant):
    x, t = CE.make_inputs((4, 8), seed=0, device="cpu", dtype=torch.bfloat16)
    with pytest.raises(TypeError, match=rf"predictions: cross_entropy {variant} takes dtype torch.float32, "
                                        r"got torch.bfloat16"):
        losslab.variant("cross_entropy", variant)(x, t)


def test_out_of_range_message_names_targets_the_value_and_the_range():
    message = out_of_range_message(torch.tensor([1, IGNORE_INDEX, 7, -3, 2]), 5)
    assert message.startswith("targets: class index 7 at position 2 is outside [0, 5)")
    assert "ignore_index (-100)" in message and "2 target(s) out of range" in message


def test_check_targets_raises_for_a_bad_target_and_passes_good_ones():
    check_targets(torch.tensor([0, 4, IGNORE_INDEX]), 5)
    for bad, position in ((5, 1), (-1, 1), (-101, 1), (2**40, 1)):
        with pytest.raises(ValueError, match=rf"targets: class index {bad} at position {position} is outside"):
            check_targets(torch.tensor([0, bad, 3]), 5)


@pytest.mark.parametrize("strict", [True, "env"])
def test_strict_mode_raises_before_any_build(no_build, monkeypatch, strict):
    """Strict mode checks the values on the host first: the error comes before any launch."""
    x, t = CE.make_inputs((4, 8), seed=0, device="cpu")
    t[2] = 8
    if strict == "env":
        monkeypatch.setenv("LOSSLAB_STRICT_TARGETS", "1")
    op = losslab.variant("cross_entropy", "vectorized", **({} if strict == "env" else {"strict": True}))
    monkeypatch.setattr(CE, "validate", lambda *inputs: None)  # CPU tensors: let the value check run
    with pytest.raises(ValueError, match=r"targets: class index 8 at position 2 is outside \[0, 8\)"):
        op(x, t)


# -- gpu tier ------------------------------------------------------------------

@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("bad", [4099, -1, -101, 2**40])
def test_out_of_range_target_gives_nan_check_targets_raises_and_cuda_still_works(variant, bad):
    x, t = CE.make_inputs((257, 4099), seed=0)
    t[100] = bad
    op = losslab.variant("cross_entropy", variant)
    assert op(x, t).isnan()  # never a wrong number, never a device-side assert
    with pytest.raises(ValueError, match=rf"targets: class index {bad} at position 100 is outside \[0, 4099\)"):
        check_targets(t, x.shape[1])
    with pytest.raises(ValueError, match=rf"targets: class index {bad} at position 100"):
        losslab.variant("cross_entropy", variant, strict=True)(x, t)
    torch.cuda.synchronize()  # a device-side assert would surface here, and poison what follows
    t[100] = 5
    x.requires_grad_(True)
    loss = op(x, t)
    loss.backward()
    torch.testing.assert_close(loss, F.cross_entropy(x.detach(), t), rtol=1e-5, atol=0)
    assert check.relative_error(x.grad, softmax_minus_onehot(x.detach(), t))[0] <= check.GRAD_RTOL


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("shape", [(33, 1023), (12, 40003)])  # the second: rows the cluster rung splits
def test_kernels_give_nan_only_on_the_out_of_range_row(variant, shape):
    # That row's loss and gradient are NaN, nothing is read out of bounds, the other rows
    # are untouched (compute-sanitizer in test_variants_gpu.py checks the bounds).
    x, t = CE.make_inputs(shape, seed=0)
    grad_loss = torch.tensor(1.0, device="cuda")
    ignored = t.clone()
    ignored[7] = IGNORE_INDEX  # the same n_valid as with the bad target, which is not valid either
    _, saved = CE.launch_forward(variant, (x, ignored), needs_grad=True)
    grad = CE.launch_backward(variant, saved, grad_loss)
    bad = t.clone()
    bad[7] = shape[1]
    out = torch.zeros((), device="cuda")
    _, bad_saved = CE.launch_forward(variant, (x, bad), out=out, needs_grad=True)
    bad_grad = CE.launch_backward(variant, bad_saved, grad_loss)
    assert out.isnan()
    assert bad_grad[7].isnan().all()
    others = torch.arange(shape[0], device="cuda") != 7
    assert torch.equal(bad_grad[others], grad[others])
    torch.cuda.synchronize()


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("variant", VARIANTS)
def test_ignored_rows_leave_the_sum_and_the_denominator(variant):
    x, t = CE.make_inputs((257, 4099), seed=1)
    t[::3] = IGNORE_INDEX
    x.requires_grad_(True)
    loss = losslab.variant("cross_entropy", variant)(x, t)
    loss.backward()
    loss64, grad64 = CE.reference_float64(x, t)
    assert check.relative_error(loss, loss64)[0] <= check.LOSS_RTOL
    assert check.relative_error(x.grad, grad64)[0] <= check.GRAD_RTOL
    assert (x.grad[::3] == 0).all()


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("variant", VARIANTS)
def test_every_target_ignored_matches_pytorch(variant):
    x, t = CE.make_inputs((64, 1000), seed=2)
    t[:] = IGNORE_INDEX
    mine = x.clone().requires_grad_(True)
    theirs = x.clone().requires_grad_(True)
    loss = losslab.variant("cross_entropy", variant)(mine, t)
    expected = F.cross_entropy(theirs, t)
    loss.backward()
    expected.backward()
    assert loss.shape == () and loss.isnan() and expected.isnan()
    assert torch.equal(mine.grad, theirs.grad) and (mine.grad == 0).all()


# -- gpu tier: the fused rung ----------------------------------------------------

def run_fused(x, t, grad_loss=None):
    """Loss and gradient through autograd with the fused rung (a fresh leaf each call)."""
    leaf = x.detach().clone().requires_grad_(True)
    loss = losslab.variant("cross_entropy", "fused")(leaf, t)
    loss.backward(grad_loss)
    return loss.detach(), leaf.grad


def run_vectorized(x, t, grad_loss=None):
    leaf = x.detach().clone().requires_grad_(True)
    loss = losslab.variant("cross_entropy", "vectorized")(leaf, t)
    loss.backward(grad_loss)
    return loss.detach(), leaf.grad


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("dtype", [torch.float32, *HALF])
@pytest.mark.parametrize("shape", [(257, 4099), (64, 4096), (3, 9000), (5, 1)])
def test_fused_gradient_equals_vectorized(shape, dtype):
    # (3, 9000) is longer than one register tile, so the gradient re-reads all but the last tile
    x, t = CE.make_inputs(shape, seed=3, dtype=dtype)
    t[::5] = IGNORE_INDEX
    fused_loss, fused_grad = run_fused(x, t)
    loss, grad = run_vectorized(x, t)
    assert fused_grad.dtype == dtype and fused_loss.dtype == dtype
    # the same formula; only the order of the row's sum differs (a few fp32 ulps), then
    # each output is rounded to the dtype
    tolerance = {torch.float32: 1e-6, torch.bfloat16: 8e-3, torch.float16: 1e-3}[dtype]
    torch.testing.assert_close(fused_grad, grad, rtol=tolerance, atol=tolerance * grad.abs().max().item())
    torch.testing.assert_close(fused_loss, loss, rtol=tolerance, atol=0)
    assert (fused_grad[::5] == 0).all()


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("grad_loss", [0.75, -2.0, 0.0])
def test_fused_backward_scales_by_grad_loss(grad_loss):
    x, t = CE.make_inputs((129, 1000), seed=4)
    _, unit = run_fused(x, t)
    _, scaled = run_fused(x, t, torch.tensor(grad_loss, device="cuda"))
    assert torch.equal(scaled, unit * grad_loss)  # one fp32 multiply, as the scale kernel does
    _, grad64 = CE.reference_float64(x, t)
    assert check.relative_error(scaled, grad64 * grad_loss)[0] <= check.GRAD_RTOL


@pytest.mark.gpu
@requires_gpu
def test_fused_with_every_target_ignored_gives_nan_loss_and_zero_gradient():
    x, t = CE.make_inputs((64, 1000), seed=5)
    loss, grad = run_fused(x, torch.full_like(t, IGNORE_INDEX))
    assert loss.isnan() and (grad == 0).all()


@pytest.mark.gpu
@requires_gpu
def test_fused_never_writes_into_the_logits():
    # Liger-Kernel's in-place gradient corrupted tensors saved for backward (their issue #272)
    x, t = CE.make_inputs((33, 1023), seed=6)
    before = x.clone()
    leaf = x.requires_grad_(True)
    losslab.variant("cross_entropy", "fused")(leaf, t).backward(torch.tensor(0.5, device="cuda"))
    assert torch.equal(leaf.detach(), before)
    assert leaf.grad.data_ptr() != leaf.data_ptr()


@pytest.mark.gpu
@requires_gpu
def test_fused_inference_writes_no_gradient():
    x, t = CE.make_inputs((1024, 4096), seed=7)
    fused = losslab.variant("cross_entropy", "fused")
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    with torch.no_grad():
        loss = fused(x.requires_grad_(True), t)
    assert torch.cuda.max_memory_allocated() - before < x.numel() * 4  # no gradient buffer
    torch.testing.assert_close(loss, F.cross_entropy(x.detach(), t), rtol=1e-5, atol=0)


# -- gpu tier: the cluster rung, on rows it splits and where it falls back to fused ----------------

def has_clusters() -> bool:
    return torch.cuda.get_device_capability()[0] >= 9


def assert_passed(results):
    failed = [r for r in results if not r.passed]
    assert not failed, "\n" + check.check_table_text(failed)


@pytest.fixture(params=[0, 2], ids=["a cluster per row", "2 clusters for every row"])
def small_slices(request):
    """cluster_tune(8, 4096, clusters): rows of 40003 floats split over 8 CTAs, so the edge
    cases run on split rows at a small size; with 2 clusters each CTA refills its slice and
    reuses its barriers row after row. The defaults come back afterwards."""
    ext = build.load_extension("cross_entropy")
    ext.cluster_tune(8, 4096, request.param)
    yield
    ext.cluster_tune(0, 0, 0)


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("dtype", [torch.float32, *HALF])
@pytest.mark.parametrize("shape", [(64, 131072), (4, 100003), (20, 262144)])  # 20: fp32 clusters take 2 rows
def test_cluster_splits_long_rows_and_matches_float64(shape, dtype):
    x = torch.empty(shape, device="cuda", dtype=dtype)
    ctas, slice_bytes, why = cluster_plan(x)
    if has_clusters():
        assert ctas > 1 and not why, why  # the row is split: these sizes exercise the cluster path
        assert (ctas - 1) * slice_bytes < shape[1] * x.element_size() <= ctas * slice_bytes + 16
    else:
        assert ctas == 0 and "sm_90" in why
    assert_passed(check.check_variant(CROSS_ENTROPY, "cluster", shape, dtype=dtype, seed=11))


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("case", ["some rows ignored", "every row ignored", "logits of +-1e4", "NaN in two logits",
                                  "rows at odd offsets"])
def test_cluster_edge_cases_on_split_rows(small_slices, case):
    inputs = check.cluster_edge_cases()[case]
    if has_clusters():
        assert cluster_plan(inputs[0])[0] == 8
    assert_passed(check.check_inputs(CROSS_ENTROPY, "cluster", inputs, case))


@pytest.mark.gpu
@requires_gpu
def test_cluster_falls_back_to_fused_and_says_why():
    """Where no cluster applies the cluster rung runs fused's kernels: bitwise fused's results."""
    short = torch.empty(8, 4096, device="cuda")
    wide = torch.empty(2, 40004, device="cuda")
    huge = torch.empty(1, 600_000, device="cuda")  # 2.4 MB: more than 8 CTAs x 200 KiB
    cases = {"a row fits fused's registers": short, "not at the logits' offset": misaligned_view(wide, 1, 40003),
             "larger than the cluster's shared memory": huge}
    for expected, x in cases.items():
        ctas, _, why = cluster_plan(x)
        assert ctas == 0 and (expected in why if has_clusters() else "sm_90" in why), why
    for x, t in [CE.make_inputs((8, 4096), seed=5), (misaligned_view(CE.make_inputs((2, 40004), seed=6)[0], 1, 40003),
                                                     torch.tensor([7], device="cuda"))]:
        results = []
        for rung in ("fused", "cluster"):
            leaf = x.detach().requires_grad_(True)
            loss = losslab.variant("cross_entropy", rung)(leaf, t)
            loss.backward()
            results.append((loss.detach(), leaf.grad))
        assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])
