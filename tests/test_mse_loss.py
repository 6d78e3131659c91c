"""mse_loss (KernelBench 94): its definition, inputs and cost, and losslab.nn.functional.mse_loss / MSELoss.

cpu tier: the reference and its gradient, KernelBench's Pareto inputs, the cost models, the edge
cases, PyTorch's kinds of error and signatures, the operators' fake shapes.
compile tier: the operator kernels compile without spills for every dtype and are bound.
gpu tier: every reduction, dtype and rung against PyTorch in float64 (odd, broadcast, misaligned,
non-contiguous, inf/NaN), a loss over more than 2^31 elements, opcheck, one backward per fused
forward, and a torch.compile(fullgraph=True) step captured in a CUDA graph.
"""
import inspect
import shutil
import warnings

import pytest
import torch
import torch.nn.functional as F

import losslab.nn as lnn
import losslab.nn.functional as LF
from losslab import build, problems
from losslab.measure.check import TOLERANCES
from losslab.problems import mse_loss as mse_host
from losslab.problems.base import misaligned_view
from losslab.problems.mse_loss import functional as MF
from losslab.teach.simulator import build as sim_build
from losslab.teach.simulator import cases as sim_cases
from losslab.teach.simulator import run as sim_run

MSE = problems.get("mse_loss")
X = torch.randn(4, 5)


# --- cpu tier: the problem -------------------------------------------------------------------------------

def test_reference_is_the_mean_of_squares_and_pytorchs_mse_loss():
    p, t = MSE.make_inputs((3, 5), seed=0, device="cpu")
    torch.testing.assert_close(MSE.reference(p, t), ((p - t) ** 2).sum() / 15)
    torch.testing.assert_close(MSE.reference(p, t), F.mse_loss(p, t))


def test_gradient_formula():
    p, t = MSE.make_inputs((3, 5), seed=0, device="cpu")
    _, grad = MSE.reference_float64(p, t)
    torch.testing.assert_close(grad, 2 * (p.double() - t.double()) / 15)


def test_inputs_are_kernelbenchs_pareto_samples_seeded():
    p, t = MSE.make_inputs((200, 1000), seed=3, device="cpu")
    assert p.min() >= 0.01 and t.min() >= 0.01
    # Pareto(0.01, 1.5): P(x > x0) = (0.01 / x0)^1.5, so the median is 0.01 * 2^(1 / 1.5)
    torch.testing.assert_close(p.median(), torch.tensor(0.01 * 2 ** (1 / 1.5)), rtol=0.01, atol=0)
    assert torch.equal(MSE.make_inputs((200, 1000), seed=3, device="cpu")[0], p)
    assert not torch.equal(MSE.make_inputs((200, 1000), seed=4, device="cpu")[0], p)
    assert MSE.sizes["seed"] == (32768, 32768) and MSE.sweep_shapes[0][0] == 128
    assert MSE.sizes["seed"] in MSE.sweep_shapes


def test_structured_inputs_put_the_loss_in_few_rows():
    p, t = MSE.structured_inputs((640, 100), seed=0, device="cpu")
    rows = ((p - t) ** 2).sum(1)
    assert rows.topk(640 // 64).values.sum() > 0.9 * rows.sum()


def test_cost_model_counts_bytes_once():
    rows, cols = MSE.sizes["seed"]
    n = rows * cols
    assert MSE.cost((rows, cols), "forward").bytes == 2 * n * 4 + 4
    assert MSE.cost((rows, cols), "backward").bytes_written == n * 4
    assert MSE.cost((rows, cols), "forward_backward").bytes == 3 * n * 4 + 4
    assert MSE.cost((rows, cols), "forward", torch.bfloat16).bytes_read == 2 * n * 2
    with pytest.raises(ValueError, match="direction"):
        MSE.cost((rows, cols), "sideways")


def test_options_cost_and_divisors():
    n = 5 * 13 * 7
    assert mse_host.options_cost(n, "forward", reduction="none").bytes_written == n * 4
    assert mse_host.options_cost(n, "backward", reduction="none").bytes_read == 3 * n * 4
    assert mse_host.options_cost(n, "forward_backward").bytes == 3 * n * 4 + 4
    with pytest.raises(ValueError, match="reduction none has no single fused pass"):
        mse_host.options_cost(n, "forward_backward", reduction="none")
    codes = mse_host.REDUCTIONS
    assert [mse_host.options_divisor(n, codes[r]) for r in ("none", "mean", "sum")] == [1.0, float(n), 1.0]


def test_edge_cases_cover_the_issue_list():
    cases = MSE.edge_cases("cpu")
    names = " ".join(cases)
    for needle in ("equal", "zeros", "inf", "NaN", "B = 1", "D = 1", "multiple of 4", "alignment", "non-contiguous"):
        assert needle in names
    loss64, grad64 = MSE.reference_float64(*cases["predictions equal to the targets (loss and gradient exactly 0)"])
    assert loss64 == 0 and not grad64.any()
    assert MSE.reference(*cases["an infinite prediction (loss +inf, that gradient +inf)"]) == float("inf")
    assert MSE.reference(*cases["inf - inf in one element (NaN propagates)"]).isnan()
    p, _ = cases["storage offset breaks 16-byte alignment"]
    assert p.is_contiguous() and p.storage_offset() % 4 != 0


def test_condition_is_one():
    p, t = MSE.make_inputs((4, 8), seed=0, device="cpu")
    magnitude, total = MSE.condition_parts(p.double(), t.double())
    assert magnitude == total > 0


# The operators' forward kernel (options.cuh) on the CPU simulator: its grid is one wave of the simulated GPU
# (2 SMs of 1024 threads: 32 blocks of 64), so a thread takes many rounds of UNROLL packs, the last often
# partial; UNROLL 1 has no partial round. The gradient for grad_loss = 1 comes from the forward, as fused's.
OPERATOR_FORWARD = """
constexpr int THREADS = 64;
#include "common/scale.cuh"
#include "mse_loss/launchers.h"
#include "mse_loss/options.h"
#include "mse_loss/options.cuh"

cudaError_t mse_loss_custom_forward(const void* p, const void* t, float*, void* loss, void* grad, int64_t B,
                                    int64_t D, DType, cudaStream_t stream) {
    static float* partials = nullptr;  // the operators' scratch: a partial a block, then the ticket
    if (!partials) cudaMalloc(reinterpret_cast<void**>(&partials), (MSE_LOSS_MAX_BLOCKS + 4) * sizeof(float));
    return mse_loss_forward_launch<float>(p, t, partials, loss, nullptr, grad, B * D, float(B * D), stream);
}

cudaError_t mse_loss_custom_backward(const void*, const void*, const void* grad_loss, void* grad, int64_t B,
                                     int64_t D, DType dtype, cudaStream_t stream) {
    return scale_in_place(grad, grad_loss, B * D, dtype, stream);
}
"""


@pytest.mark.skipif(shutil.which(sim_build.CXX) is None, reason=f"the CPU simulator needs {sim_build.CXX}")
@pytest.mark.parametrize("unroll", [1, 4])
def test_operator_forward_kernel_matches_float64_on_the_cpu_simulator(unroll):
    source = f"constexpr int UNROLL = {unroll};\n" + OPERATOR_FORWARD
    outcome = sim_run.run(source, MSE.name, label="options.cuh", order="reverse")
    assert outcome.compiled, outcome.compile_error
    for r in outcome.results:
        assert r.failure is None, (r.case.name, r.failure)
        ref = sim_cases.mse_loss_reference(r.case)
        assert r.loss == pytest.approx(ref["loss"][0], rel=1e-6), r.case.name
        assert abs(r.grad - ref["grad"]).max() <= 1e-6 * abs(ref["grad"]).max() + 1e-12, r.case.name


# --- cpu tier: losslab.nn -------------------------------------------------------------------------------

ERRORS = {
    "unknown reduction": lambda f: f(X, X, reduction="avg"),
    "batchmean": lambda f: f(X, X, reduction="batchmean"),
    "shapes that do not broadcast": lambda f: f(X, torch.rand(3, 5)),
    "input not a tensor": lambda f: f(1.0, X),
    "target not a tensor": lambda f: f(X, [1.0]),
}


def _error_type(call):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            call()
        except Exception as error:  # noqa: BLE001  (the kind is what is compared)
            return type(error)
    return None


@pytest.mark.parametrize("case", ERRORS)
def test_raises_pytorchs_kind_of_error(case):
    """On CPU tensors PyTorch computes and ours refuses (ValueError: not CUDA) unless the call is
    wrong before that: then both raise the same kind, or ours a TypeError where PyTorch's is an
    AttributeError on a non-tensor."""
    theirs, ours = _error_type(lambda: ERRORS[case](F.mse_loss)), _error_type(lambda: ERRORS[case](LF.mse_loss))
    assert theirs is not None
    assert ours is theirs or (theirs is AttributeError and ours is TypeError), (case, theirs, ours)


def test_what_pytorch_accepts_but_losslab_cannot_run_is_named():
    with pytest.raises(ValueError, match="input: expected a CUDA tensor"):
        LF.mse_loss(X, X)
    with pytest.raises(TypeError, match="input: losslab has kernels for .*got torch.float64"):
        LF.mse_loss(X.double(), X.double())
    with pytest.raises(TypeError, match="got torch.int64"):
        LF.mse_loss(X.long(), X.long())
    with pytest.raises(NotImplementedError, match="weight: losslab's mse_loss has no kernels"):
        LF.mse_loss(X, X, weight=torch.ones(4, 5))
    with pytest.raises(NotImplementedError, match="target: losslab computes no gradient"):
        LF.mse_loss(X, X.clone().requires_grad_(True))
    with pytest.warns(UserWarning, match="Using a target size"), pytest.raises(ValueError, match="CUDA"):
        LF.mse_loss(X, X[0])


def test_function_and_module_have_pytorchs_signatures():
    assert inspect.signature(LF.mse_loss).parameters.keys() == inspect.signature(F.mse_loss).parameters.keys()
    ours, theirs = inspect.signature(lnn.MSELoss), inspect.signature(torch.nn.MSELoss)
    assert [(p.name, p.default) for p in ours.parameters.values()] == [
        (p.name, p.default) for p in theirs.parameters.values()]
    assert lnn.MSELoss(reduction="sum").reduction == "sum"
    assert LF.on_problem("mse_loss") is LF.mse_loss


@pytest.mark.parametrize("op", [MF.forward_op, MF.forward_grad_op, MF.backward_op], ids=lambda op: op.name())
def test_operators_mutate_nothing(op):
    assert op.name().startswith("losslab::nn_mse_loss")
    assert not op._schema.is_mutable and all(a.alias_info is None for a in op._schema.arguments)


@pytest.mark.parametrize("reduction", list(mse_host.REDUCTIONS))
def test_fakes_give_the_kernels_shapes(reduction):
    x = torch.empty(5, 13, 7, device="meta", dtype=torch.bfloat16, requires_grad=True)
    code = mse_host.REDUCTIONS[reduction]
    loss = MF.forward_op(x, x.detach(), code)
    assert loss.shape == (x.shape if reduction == "none" else ()) and loss.dtype == torch.bfloat16
    assert torch.autograd.grad(loss.sum(), x)[0].shape == x.shape
    if reduction != "none":
        loss, grad = MF.forward_grad_op(x, x.detach(), code)
        assert loss.shape == () and grad.shape == x.shape and grad.is_contiguous()
        assert torch.autograd.grad(loss, x)[0].shape == x.shape


# --- compile tier -------------------------------------------------------------------------------------------

@pytest.mark.compile
def test_option_launchers_are_bound():
    ext = build.load_extension("mse_loss")
    for name in ("vectorized_options_forward", "vectorized_options_backward", "fused_options_forward",
                 "vectorized_forward", "vectorized_backward", "fused_forward", "fused_backward"):
        assert callable(getattr(ext, name))


# --- gpu tier -----------------------------------------------------------------------------------------------

def _relative_error(ours: torch.Tensor, ref: torch.Tensor) -> float:
    """The relative error in norm, NaN where both are NaN and inf where both are the same inf
    counting as equal; inf where only one of them is NaN or inf."""
    ours, ref = ours.detach().double(), ref.detach().double()
    if not torch.equal(ours.isnan(), ref.isnan()) or not torch.equal(ours.isinf(), ref.isinf()):
        return float("inf")
    same = ours.isnan() | (ours.isinf() & (ours == ref))
    ours, ref = torch.where(same, 0, ours), torch.where(same, 0, ref)
    return float((ours - ref).norm() / ref.norm().clamp_min(1e-30))


def _tolerance(dtype: torch.dtype, ref: torch.Tensor, roundings: int = 1) -> float:
    """float32: 1e-5; 16-bit: the dtype's epsilon plus ``roundings`` times the rounding of the exact
    result to it (fused rounds its gradient for grad_loss = 1, then scales and rounds again)."""
    if dtype == torch.float32:
        return 1e-5
    finite = ref.nan_to_num(0.0, 0.0, 0.0)
    return TOLERANCES[dtype][0] + roundings * _relative_error(finite.to(dtype), finite)


def _cases():
    gen = torch.Generator(device="cuda").manual_seed(0)
    # scaled so that float16's sum over the odd shape stays finite (about 2e4, below its 65504)
    p, t = (0.1 * torch.randn(257, 4099, generator=gen, device="cuda") for _ in range(2))
    with_inf, with_nan = p[:8, :300].clone(), t[:8, :300].clone()
    with_inf[2, 5] = float("inf")
    with_nan[3, 7] = float("nan")
    return {
        "odd (257, 4099)": (p, t),
        "3-D (5, 13, 7)": (p.view(-1)[:455].view(5, 13, 7), t.view(-1)[:455].view(5, 13, 7)),
        "0-d": (p[0, 0], t[0, 0]),
        "target broadcast over rows": (p[:64], t[0]),
        "misaligned views": (misaligned_view(p, 64, 1000), misaligned_view(t, 64, 1000)),
        "non-contiguous": (p[:, ::2], t[:, ::2]),
        "an infinite input": (with_inf, t[:8, :300]),
        "a NaN target": (p[:8, :300], with_nan),
    }


CASES = ["odd (257, 4099)", "3-D (5, 13, 7)", "0-d", "target broadcast over rows", "misaligned views",
         "non-contiguous", "an infinite input", "a NaN target"]


@pytest.mark.gpu
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "vectorized"])
@pytest.mark.parametrize("reduction", list(mse_host.REDUCTIONS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", CASES)
def test_matches_pytorch_in_float64(monkeypatch, case, dtype, reduction, fused):
    monkeypatch.setattr(MF, "PREFER_FUSED", fused)
    x, t = (v.to(dtype) for v in _cases()[case])
    ref_x = x.double().requires_grad_(True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the broadcast case's warning, as PyTorch's
        ref = F.mse_loss(ref_x, t.double(), reduction=reduction)
        ours_x = x.clone().requires_grad_(True)
        loss = LF.mse_loss(ours_x, t, reduction=reduction)
    upstream = torch.randn_like(ref) if reduction == "none" else torch.tensor(0.75, device="cuda", dtype=ref.dtype)
    ref.backward(upstream)
    loss.backward(upstream.to(dtype))
    assert loss.shape == ref.shape and loss.dtype == dtype
    assert _relative_error(loss, ref) <= _tolerance(dtype, ref), f"loss {loss} vs {ref}"
    assert _relative_error(ours_x.grad, ref_x.grad) <= _tolerance(dtype, ref_x.grad, 1 + fused)


@pytest.mark.gpu
def test_the_check_fails_on_a_wrong_divisor(monkeypatch):
    """The comparison above can fail: a mean divided by the rows alone, not every element, is caught."""
    x, t = _cases()["odd (257, 4099)"]
    monkeypatch.setattr(mse_host.options, "options_divisor", lambda n, reduction: float(n // 4099))
    loss = LF.mse_loss(x, t)
    assert _relative_error(loss, F.mse_loss(x.double(), t.double())) > 1e-5


@pytest.mark.gpu
def test_mixed_dtypes_promote_as_pytorch():
    x, t = torch.randn(37, 100, device="cuda"), torch.randn(37, 100, device="cuda", dtype=torch.float16)
    loss = LF.mse_loss(x, t)
    assert loss.dtype == F.mse_loss(x, t).dtype == torch.float32
    torch.testing.assert_close(loss, F.mse_loss(x, t))


@pytest.mark.gpu
def test_more_than_2_to_the_31_elements():
    """2^31 + 5 bfloat16 elements (4 GiB a tensor): no 32-bit index overflows; checked against a
    float64 sum taken in chunks, and the gradient at both ends."""
    n = 2**31 + 5
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.empty(n, device="cuda", dtype=torch.bfloat16).uniform_(-1, 1, generator=gen)
    t = torch.empty(n, device="cuda", dtype=torch.bfloat16).uniform_(-1, 1, generator=gen)
    total = sum(((x[i:i + 2**28].double() - t[i:i + 2**28].double()) ** 2).sum() for i in range(0, n, 2**28))
    leaf = x.requires_grad_(True)
    loss = LF.mse_loss(leaf, t)
    assert abs(loss.double().item() - total.item() / n) <= 2 * TOLERANCES[torch.bfloat16][0] * total.item() / n
    loss.backward()
    for i in (0, n - 1):
        expected = 2 * (x[i].double() - t[i].double()) / n
        assert abs(leaf.grad[i].double() - expected) <= 0.01 * abs(expected) + 1e-30


@pytest.mark.gpu
def test_module_matches_pytorchs():
    p, t = torch.randn(6, 50, device="cuda"), torch.randn(6, 50, device="cuda")
    for reduction in mse_host.REDUCTIONS:
        torch.testing.assert_close(lnn.MSELoss(reduction=reduction)(p, t), torch.nn.MSELoss(reduction=reduction)(p, t))


@pytest.mark.gpu
def test_opcheck_every_operator():
    p, q = torch.randn(37, 1001, device="cuda"), torch.randn(37, 1001, device="cuda")
    for code in mse_host.REDUCTIONS.values():
        torch.library.opcheck(MF.forward_op, (p.clone().requires_grad_(True), q, code))
        grad_loss = torch.randn_like(p) if code == 0 else torch.tensor(0.5, device="cuda")
        torch.library.opcheck(MF.backward_op, (p, q, grad_loss, code))
        if code:
            torch.library.opcheck(MF.forward_grad_op, (p.clone().requires_grad_(True), q, code))


@pytest.mark.gpu
def test_fused_backward_runs_once_per_forward_and_the_result_is_bitwise_repeatable():
    x, t = _cases()["odd (257, 4099)"]
    leaf = x.clone().requires_grad_(True)
    loss = LF.mse_loss(leaf, t)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="once per forward"):
        loss.backward()
    again = x.clone().requires_grad_(True)
    second = LF.mse_loss(again, t)
    second.backward()
    assert torch.equal(loss, second) and torch.equal(leaf.grad, again.grad)


@pytest.mark.gpu
def test_compiled_training_step_in_a_cuda_graph_matches_pytorch():
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 1001).cuda()
    reference = torch.nn.Linear(64, 1001).cuda().double()
    reference.load_state_dict(model.state_dict())
    compiled = torch.compile(lambda x, y: LF.mse_loss(model(x), y), fullgraph=True)
    x, y = torch.randn(37, 64, device="cuda"), torch.randn(37, 1001, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            model.zero_grad(set_to_none=True)
            compiled(x, y).backward()
    torch.cuda.current_stream().wait_stream(side)
    model.zero_grad(set_to_none=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_loss = compiled(x, y)
        static_loss.backward()
    for seed in range(3):
        gen = torch.Generator(device="cuda").manual_seed(seed)
        x.copy_(torch.randn(37, 64, device="cuda", generator=gen))
        y.copy_(torch.randn(37, 1001, device="cuda", generator=gen))
        graph.replay()
        reference.zero_grad()
        ref = F.mse_loss(reference(x.double()), y.double())
        ref.backward()
        assert _relative_error(static_loss, ref) <= 1e-5
        assert _relative_error(model.weight.grad, reference.weight.grad) <= 1e-5
