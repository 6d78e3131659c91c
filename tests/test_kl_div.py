"""kl_div's definition: what the kernels must reproduce."""
import pytest
import torch

import losslab
from losslab import problems

KL = problems.get("kl_div")


def test_batchmean_divides_by_batch_size_only():
    p, t = KL.make_inputs((3, 5), seed=0, device="cpu")
    by_hand = (torch.xlogy(t, t) - t * torch.log(p)).sum() / 3
    torch.testing.assert_close(KL.reference(p, t), by_hand)


def test_gradient_formula():
    p, t = KL.make_inputs((3, 5), seed=0, device="cpu")
    _, grad = KL.reference_float64(p, t)
    torch.testing.assert_close(grad, -t.double() / (p.double() * 3))


def test_zero_targets_contribute_nothing_and_zero_predictions_give_inf():
    p, t = KL.make_inputs((2, 4), seed=0, device="cpu")
    t0 = t.clone()
    t0[0, 0] = 0
    p0 = p.clone()
    p0[1, 1] = 0
    assert torch.isfinite(KL.reference(p, t0))
    assert KL.reference(p0, t) == float("inf")


def test_cost_model_counts_bytes_once():
    rows, cols = KL.sizes["seed"]
    n = rows * cols
    assert KL.cost((rows, cols), "forward").bytes_read == 2 * n * 4      # read p and t
    assert KL.cost((rows, cols), "backward").bytes_written == n * 4      # write dL/dp
    assert KL.cost((rows, cols), "forward_backward").bytes == 3 * n * 4 + 8  # fused minimum
    assert KL.cost((rows, cols), "forward").transcendentals == 2 * n     # two logs per element


def test_edge_cases_cover_the_issue_list():
    cases = " ".join(KL.edge_cases("cpu"))
    for needle in ("zeros", "exact zero", "NaN", "B = 1", "D = 1", "multiple of 4", "alignment", "non-contiguous"):
        assert needle in cases


def test_misaligned_edge_case_really_is_misaligned():
    p, _ = KL.edge_cases("cpu")["storage offset breaks 16-byte alignment"]
    assert p.is_contiguous() and p.storage_offset() % 4 != 0


def test_targets_requiring_grad_are_refused():
    p, t = KL.make_inputs((2, 4), seed=0, device="cpu")
    with pytest.raises(ValueError, match="targets: gradients w.r.t. targets are not supported"):
        losslab.variant("kl_div", "vectorized")(p, t.requires_grad_(True))
