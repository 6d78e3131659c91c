"""The tolerances of the float64 checks on the CPU. 16-bit (measure.check.rounding_allowance): what a
correct float16 kernel must round (results below the smallest normal, a gradient rounded twice by a
fused rung) passes; a kernel that loses those results (flushes subnormals to zero) still fails. A
gradient that is exactly 0 in float64 but made of cancelling terms: held to the terms' size."""
import pytest
import torch

from losslab import problems
from losslab.measure import check
from losslab.teach.custom import PythonVariant

MSE = problems.get("mse_loss")
SMOOTH_L1 = problems.get("smooth_l1_loss")


class EmulatedFused(PythonVariant):
    """The arithmetic of mse_loss's fused rung in float16 (kernels/mse_loss/fused.cu): float32 math,
    the forward writes dL/dp for grad_loss = 1 rounded to float16, the backward scales it by
    grad_loss in float32 and rounds again. ``flush`` zeroes subnormal results, as a kernel built
    with flush-to-zero (or computing in a type without fp16's subnormals) would."""

    problem = MSE
    dtypes = (torch.float16,)

    def __init__(self, flush=False):
        self.name, self.flush = f"emulated_fused{'_ftz' if flush else ''}", flush

    def validate(self, *inputs):  # CPU tensors: skip the device check
        pass

    def _round(self, x):
        if self.flush:
            x = torch.where(x.abs() < torch.finfo(torch.float16).tiny, torch.zeros_like(x), x)
        return x.to(torch.float16)

    def launch_forward(self, inputs, out=None, needs_grad=False, grad_out=None):
        p, t = (x.detach().float() for x in inputs)
        loss = self._round((p - t).square().mean())
        grad = self._round((p - t) * (2 / p.numel()))
        return (loss if out is None else out.copy_(loss)), (grad,)

    def launch_backward(self, saved, grad_loss, out=None):
        grad = self._round(saved[0].float() * grad_loss.float())
        return grad if out is None else out.copy_(grad)


def test_a_fused_float16_gradient_below_the_smallest_normal_passes():
    # 128 x 4096: every gradient 2 (p - t) / 2^19 is subnormal in float16; rounding it twice
    # (the fused rung's design) costs about 1.25 times rounding it once, which the tolerance of
    # the H200 record (eps + one rounding) refused: 1.89e-2 vs 1.62e-2
    inputs = MSE.make_inputs((128, 4096), seed=900293863, device="cpu", dtype=torch.float16)
    forward, backward = check.check_inputs(MSE, EmulatedFused(), inputs, "cpu")
    assert forward.passed and backward.passed, (forward, backward)
    _, grad64 = MSE.reference_float64(*inputs)
    once = check.relative_error((grad64 * check.GRAD_LOSS).half(), grad64 * check.GRAD_LOSS)[0]
    assert backward.error > torch.finfo(torch.float16).eps + once  # what the old tolerance refused


def test_flushing_subnormal_gradients_still_fails():
    inputs = MSE.make_inputs((128, 4096), seed=900293863, device="cpu", dtype=torch.float16)
    forward, backward = check.check_inputs(MSE, EmulatedFused(flush=True), inputs, "cpu")
    assert not backward.passed, backward


@pytest.mark.parametrize("flush", [False, True])
def test_a_subnormal_float16_loss_is_held_to_its_rounding(flush):
    # 1 x 1: the loss 0.5 (p - t)^2 falls below float16's smallest normal (6.1e-5) for about a
    # quarter of KernelBench's inputs; rounded correctly it misses eps (the H200 record's 2.7e-3
    # vs 9.8e-4), flushed to zero it is wrong
    seed = next(s for s in range(100) if 0 < SMOOTH_L1.reference_float64(
        *SMOOTH_L1.make_inputs((1, 1), seed=s, device="cpu", dtype=torch.float16))[0] < 1e-5)
    inputs = SMOOTH_L1.make_inputs((1, 1), seed=seed, device="cpu", dtype=torch.float16)
    loss64, _ = SMOOTH_L1.reference_float64(*inputs)
    rounded = loss64.half()
    if flush:
        rounded = torch.zeros_like(rounded)
    error = check.relative_error(rounded, loss64)[0]
    loss_tolerance = torch.finfo(torch.float16).eps + check.rounding_allowance(
        loss64, torch.zeros(1, dtype=torch.float64), torch.float16)[0]
    assert (error <= loss_tolerance) != flush, (error, loss_tolerance)
    if not flush:
        assert error > torch.finfo(torch.float16).eps  # beyond eps alone


def test_an_overflowing_rounding_gives_no_allowance():
    # 1e5 rounds to inf in float16: no allowance, so a finite result must meet eps
    loss, grad = check.rounding_allowance(torch.tensor(1e5, dtype=torch.float64),
                                          torch.full((4,), 1e5, dtype=torch.float64), torch.float16)
    assert loss == 0.0 and grad == 0.0


COSINE = problems.get("cosine_similarity_loss")


class EmulatedCosine(PythonVariant):
    """The float32 arithmetic of cosine_similarity_loss's kernels (kernels/cosine_similarity_loss/
    cosine.cuh): dL/dp = k_other t + k_p p for grad_loss = 1, then scaled by grad_loss; ``bias`` adds
    a wrong constant to the gradient."""

    problem = COSINE
    dtypes = (torch.float32,)

    def __init__(self, bias=0.0):
        self.name, self.bias = "emulated_cosine", bias

    def validate(self, *inputs):  # CPU tensors: skip the device check
        pass

    def launch_forward(self, inputs, out=None, needs_grad=False, grad_out=None):
        p, t = (x.detach().float() for x in inputs)
        norm_p, norm_t = p.norm(dim=1), t.norm(dim=1)
        a, b = norm_p.clamp_min(1e-8), norm_t.clamp_min(1e-8)
        cos = (p * t).sum(dim=1) / a / b
        scale = -1.0 / p.shape[0]
        k_other, k_p = scale / a / b, -scale * (cos / a / norm_p)
        grad = k_other[:, None] * t + k_p[:, None] * p + self.bias
        loss = (1 - cos).mean()
        return (loss if out is None else out.copy_(loss)), (grad,)

    def launch_backward(self, saved, grad_loss, out=None):
        grad = saved[0] * grad_loss.float()
        return grad if out is None else out.copy_(grad)


def test_a_one_element_cosine_gradient_is_held_to_the_size_of_its_cancelled_terms():
    # 1 x 1: cos = +-1 and dL/dp is exactly 0 in float64, but float32 leaves rounding noise of
    # size 1 / |p|; as an absolute error it failed the H200 record's check (1.02e-6 vs 1e-6)
    seed = next(s for s in range(1000) if COSINE.make_inputs((1, 1), seed=s, device="cpu")[0].abs() < 0.05)
    inputs = COSINE.make_inputs((1, 1), seed=seed, device="cpu")
    _, backward = check.check_inputs(COSINE, EmulatedCosine(), inputs, "cpu")
    assert backward.passed, backward
    grad = EmulatedCosine().launch_forward(inputs)[1][0] * check.GRAD_LOSS
    assert grad.abs().max() > check.TOLERANCES[torch.float32][1]  # what the absolute error refused
    _, wrong = check.check_inputs(COSINE, EmulatedCosine(bias=1e-3), inputs, "cpu")
    assert not wrong.passed, wrong
