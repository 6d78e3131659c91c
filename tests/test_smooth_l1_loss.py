"""smooth_l1_loss (KernelBench 96): its definition, inputs and cost, and losslab.nn.functional.smooth_l1_loss /
huber_loss, losslab.nn.SmoothL1Loss / HuberLoss.

cpu tier: the reference and its gradient, KernelBench's Pareto inputs, the cost models, the edge
cases, PyTorch's kinds of error and signatures, the operators' fake shapes.
compile tier: the operator kernels compile without spills for every dtype and are bound.
gpu tier: every reduction, beta/delta, dtype and rung against PyTorch in float64 (odd, broadcast, misaligned,
non-contiguous, inf/NaN), a loss over more than 2^31 elements, opcheck, one backward per fused
forward, and a torch.compile(fullgraph=True) step captured in a CUDA graph.
"""
import inspect
import warnings

import pytest
import torch
import torch.nn.functional as F

import losslab.nn as lnn
import losslab.nn.functional as LF
from losslab import build, problems
from losslab.measure import check
from losslab.measure.check import TOLERANCES
from losslab.problems import smooth_l1_loss as sl1_host
from losslab.problems.base import misaligned_view
from losslab.problems.smooth_l1_loss import functional as MF

SL1 = problems.get("smooth_l1_loss")
X = torch.randn(4, 5)


# --- cpu tier: the problem -------------------------------------------------------------------------------

def test_reference_is_the_mean_smooth_l1_with_beta_1():
    p, t = SL1.make_inputs((3, 5), seed=0, device="cpu")
    d = (p - t).abs()
    torch.testing.assert_close(SL1.reference(p, t), torch.where(d < 1, 0.5 * d * d, d - 0.5).sum() / 15)


def test_gradient_formula():
    p, t = SL1.make_inputs((30, 50), seed=0, device="cpu")
    _, grad = SL1.reference_float64(p, t)
    torch.testing.assert_close(grad, (p.double() - t.double()).clamp(-1, 1) / 1500)
    assert ((p - t).abs() > 1).any() and ((p - t).abs() < 1).any(), "the inputs reach both branches"


def test_inputs_are_kernelbenchs_pareto_samples_seeded():
    p, t = SL1.make_inputs((200, 1000), seed=3, device="cpu")
    assert t.min() >= 0.01 and p.min() > 0
    # Pareto(0.01, 1.5): P(x > x0) = (0.01 / x0)^1.5, so the median is 0.01 * 2^(1 / 1.5); the
    # predictions are scaled by one uniform scalar
    torch.testing.assert_close(t.median(), torch.tensor(0.01 * 2 ** (1 / 1.5)), rtol=0.01, atol=0)
    torch.testing.assert_close(p.median() / p.min(), t.median() / t.min(), rtol=0.02, atol=0)
    assert torch.equal(SL1.make_inputs((200, 1000), seed=3, device="cpu")[0], p)
    assert not torch.equal(SL1.make_inputs((200, 1000), seed=4, device="cpu")[0], p)
    assert SL1.sizes["seed"] == (32768, 32768) and SL1.sweep_shapes[0][0] == 128
    assert SL1.sizes["seed"] in SL1.sweep_shapes


def test_structured_inputs_put_the_loss_in_few_rows():
    p, t = SL1.structured_inputs((640, 100), seed=0, device="cpu")
    rows = F.smooth_l1_loss(p, t, reduction="none").sum(1)
    assert rows.topk(640 // 64).values.sum() > 0.9 * rows.sum()


def test_cost_model_counts_bytes_once():
    rows, cols = SL1.sizes["seed"]
    n = rows * cols
    assert SL1.cost((rows, cols), "forward").bytes == 2 * n * 4 + 4
    assert SL1.cost((rows, cols), "backward").bytes_written == n * 4
    assert SL1.cost((rows, cols), "forward_backward").bytes == 3 * n * 4 + 4
    assert SL1.cost((rows, cols), "forward", torch.bfloat16).bytes_read == 2 * n * 2
    with pytest.raises(ValueError, match="direction"):
        SL1.cost((rows, cols), "sideways")


def test_options_cost_and_divisors():
    n = 5 * 13 * 7
    assert sl1_host.options_cost(n, "forward", reduction="none").bytes_written == n * 4
    assert sl1_host.options_cost(n, "backward", reduction="none").bytes_read == 3 * n * 4
    assert sl1_host.options_cost(n, "forward_backward").bytes == 3 * n * 4 + 4
    with pytest.raises(ValueError, match="reduction none has no single fused pass"):
        sl1_host.options_cost(n, "forward_backward", reduction="none")
    codes = sl1_host.REDUCTIONS
    assert [sl1_host.options_divisor(n, codes[r]) for r in ("none", "mean", "sum")] == [1.0, float(n), 1.0]


def test_edge_cases_cover_the_issue_list():
    cases = SL1.edge_cases("cpu")
    names = " ".join(cases)
    for needle in ("equal", "zeros", "beta", "inf", "NaN", "B = 1", "D = 1", "multiple of 4", "alignment",
                   "non-contiguous"):
        assert needle in names
    loss64, grad64 = SL1.reference_float64(*cases["predictions equal to the targets (loss and gradient exactly 0)"])
    assert loss64 == 0 and not grad64.any()
    assert SL1.reference(*cases["an infinite prediction (loss +inf, that gradient 1 / (B D))"]) == float("inf")
    assert SL1.reference(*cases["inf - inf in one element (NaN propagates)"]).isnan()
    p, _ = cases["storage offset breaks 16-byte alignment"]
    assert p.is_contiguous() and p.storage_offset() % 4 != 0


def test_condition_is_one():
    p, t = SL1.make_inputs((4, 8), seed=0, device="cpu")
    magnitude, total = SL1.condition_parts(p.double(), t.double())
    assert magnitude == total > 0


# --- cpu tier: losslab.nn -------------------------------------------------------------------------------

ERRORS = {
    "unknown reduction": lambda f: f(X, X, reduction="avg"),
    "batchmean": lambda f: f(X, X, reduction="batchmean"),
    "shapes that do not broadcast": lambda f: f(X, torch.rand(3, 5)),
    "input not a tensor": lambda f: f(1.0, X),
    "target not a tensor": lambda f: f(X, [1.0]),
}
SMOOTH_L1_ERRORS = {"negative beta": lambda f: f(X, X, beta=-1.0)}
HUBER_ERRORS = {"delta 0": lambda f: f(X, X, delta=0.0), "negative delta": lambda f: f(X, X, delta=-1.0)}


def _error_type(call):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            call()
        except Exception as error:  # noqa: BLE001  (the kind is what is compared)
            return type(error)
    return None


@pytest.mark.parametrize("function", ["smooth_l1_loss", "huber_loss"])
@pytest.mark.parametrize("case", [*ERRORS, *SMOOTH_L1_ERRORS, *HUBER_ERRORS])
def test_raises_pytorchs_kind_of_error(case, function):
    """On CPU tensors PyTorch computes and ours refuses (ValueError: not CUDA) unless the call is
    wrong before that: then both raise the same kind, or ours a TypeError where PyTorch's is an
    AttributeError on a non-tensor."""
    own = SMOOTH_L1_ERRORS if function == "smooth_l1_loss" else HUBER_ERRORS
    call = ERRORS.get(case) or own.get(case)
    if call is None:
        pytest.skip(f"{case}: an argument of the other function")
    theirs, ours = _error_type(lambda: call(getattr(F, function))), _error_type(lambda: call(getattr(LF, function)))
    assert theirs is not None
    assert ours is theirs or (theirs is AttributeError and ours is TypeError), (case, theirs, ours)


def test_what_pytorch_accepts_but_losslab_cannot_run_is_named():
    with pytest.raises(ValueError, match="input: expected a CUDA tensor"):
        LF.smooth_l1_loss(X, X)
    with pytest.raises(TypeError, match="input: losslab has kernels for .*got torch.float64"):
        LF.smooth_l1_loss(X.double(), X.double())
    with pytest.raises(TypeError, match="got torch.int64"):
        LF.smooth_l1_loss(X.long(), X.long())
    with pytest.raises(NotImplementedError, match="weight: losslab's huber_loss has no kernels"):
        LF.huber_loss(X, X, weight=torch.ones(4, 5))
    with pytest.raises(NotImplementedError, match="target: losslab computes no gradient"):
        LF.smooth_l1_loss(X, X.clone().requires_grad_(True))
    with pytest.warns(UserWarning, match="Using a target size"), pytest.raises(ValueError, match="CUDA"):
        LF.smooth_l1_loss(X, X[0])


@pytest.mark.parametrize("function, module", [("smooth_l1_loss", "SmoothL1Loss"), ("huber_loss", "HuberLoss")])
def test_functions_and_modules_have_pytorchs_signatures(function, module):
    assert inspect.signature(getattr(LF, function)).parameters.keys() == inspect.signature(
        getattr(F, function)).parameters.keys()
    ours, theirs = inspect.signature(getattr(lnn, module)), inspect.signature(getattr(torch.nn, module))
    assert [(p.name, p.default) for p in ours.parameters.values()] == [
        (p.name, p.default) for p in theirs.parameters.values()]


def test_modules_keep_their_options():
    assert lnn.SmoothL1Loss(reduction="sum", beta=0.5).beta == 0.5 and lnn.HuberLoss(delta=2.0).delta == 2.0
    assert LF.on_problem("smooth_l1_loss") is LF.smooth_l1_loss


@pytest.mark.parametrize("op", [MF.forward_op, MF.forward_grad_op, MF.backward_op], ids=lambda op: op.name())
def test_operators_mutate_nothing(op):
    assert op.name().startswith("losslab::nn_smooth_l1_loss")
    assert not op._schema.is_mutable and all(a.alias_info is None for a in op._schema.arguments)


@pytest.mark.parametrize("reduction", list(sl1_host.REDUCTIONS))
def test_fakes_give_the_kernels_shapes(reduction):
    x = torch.empty(5, 13, 7, device="meta", dtype=torch.bfloat16, requires_grad=True)
    code = sl1_host.REDUCTIONS[reduction]
    loss = MF.forward_op(x, x.detach(), code, 1.0, 1.0)
    assert loss.shape == (x.shape if reduction == "none" else ()) and loss.dtype == torch.bfloat16
    assert torch.autograd.grad(loss.sum(), x)[0].shape == x.shape
    if reduction != "none":
        loss, grad = MF.forward_grad_op(x, x.detach(), code, 0.5, 0.5)
        assert loss.shape == () and grad.shape == x.shape and grad.is_contiguous()
        assert torch.autograd.grad(loss, x)[0].shape == x.shape


# --- compile tier -------------------------------------------------------------------------------------------

@pytest.mark.compile
def test_option_launchers_are_bound():
    ext = build.load_extension("smooth_l1_loss")
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


def _tolerance(dtype: torch.dtype, ref: torch.Tensor, twice: bool = False) -> float:
    """float32: 1e-5; 16-bit: the dtype's epsilon plus the rounding of the exact result to it; ``twice``:
    of a gradient rounded twice, as check.rounding_allowance emulates it (fused writes dL/dp for grad_loss
    1 in its forward, then scales it by the upstream 0.75 and rounds again: below float16's smallest
    normal, Huber's clamped gradients lose 15 % so, not twice the 7 % of one rounding)."""
    if dtype == torch.float32:
        return 1e-5
    finite = ref.nan_to_num(0.0, 0.0, 0.0)
    if twice:
        return TOLERANCES[dtype][0] + check.rounding_allowance(finite, finite, dtype)[1]
    return TOLERANCES[dtype][0] + _relative_error(finite.to(dtype), finite)


def _cases():
    gen = torch.Generator(device="cuda").manual_seed(0)
    # differences of about 0.14: both sides of the betas and deltas below; float16's sum over the odd
    # shape stays finite (at most about 3e4 with beta 0, below its 65504)
    p, t = (0.1 * torch.randn(257, 1031, generator=gen, device="cuda") for _ in range(2))
    with_inf, with_nan = p[:8, :300].clone(), t[:8, :300].clone()
    with_inf[2, 5] = float("inf")
    with_nan[3, 7] = float("nan")
    return {
        "odd (257, 1031)": (p, t),
        "3-D (5, 13, 7)": (p.view(-1)[:455].view(5, 13, 7), t.view(-1)[:455].view(5, 13, 7)),
        "0-d": (p[0, 0], t[0, 0]),
        "target broadcast over rows": (p[:64], t[0]),
        "misaligned views": (misaligned_view(p, 64, 1000), misaligned_view(t, 64, 1000)),
        "non-contiguous": (p[:, ::2], t[:, ::2]),
        "an infinite input": (with_inf, t[:8, :300]),
        "a NaN target": (p[:8, :300], with_nan),
    }


CASES = ["odd (257, 1031)", "3-D (5, 13, 7)", "0-d", "target broadcast over rows", "misaligned views",
         "non-contiguous", "an infinite input", "a NaN target"]


OPTIONS = {  # name: (function name, its option)
    "smooth_l1 beta 1": ("smooth_l1_loss", {"beta": 1.0}),
    "smooth_l1 beta 0.1": ("smooth_l1_loss", {"beta": 0.1}),
    "smooth_l1 beta 0 (L1)": ("smooth_l1_loss", {"beta": 0.0}),
    "huber delta 0.1": ("huber_loss", {"delta": 0.1}),
    "huber delta 2": ("huber_loss", {"delta": 2.0}),
}


@pytest.mark.gpu
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "vectorized"])
@pytest.mark.parametrize("reduction", list(sl1_host.REDUCTIONS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("option", OPTIONS)
def test_matches_pytorch_in_float64(monkeypatch, option, case, dtype, reduction, fused):
    monkeypatch.setattr(MF, "PREFER_FUSED", fused)
    function, kwargs = OPTIONS[option]
    x, t = (v.to(dtype) for v in _cases()[case])
    ref_x = x.double().requires_grad_(True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the broadcast case's warning, as PyTorch's
        ref = getattr(F, function)(ref_x, t.double(), reduction=reduction, **kwargs)
        ours_x = x.clone().requires_grad_(True)
        loss = getattr(LF, function)(ours_x, t, reduction=reduction, **kwargs)
    upstream = torch.randn_like(ref) if reduction == "none" else torch.tensor(0.75, device="cuda", dtype=ref.dtype)
    ref.backward(upstream)
    loss.backward(upstream.to(dtype))
    assert loss.shape == ref.shape and loss.dtype == dtype
    assert _relative_error(loss, ref) <= _tolerance(dtype, ref), f"loss {loss} vs {ref}"
    assert _relative_error(ours_x.grad, ref_x.grad) <= _tolerance(dtype, ref_x.grad, fused and reduction != "none")


@pytest.mark.gpu
def test_the_check_fails_on_a_wrong_divisor(monkeypatch):
    """The comparison above can fail: a mean divided by the rows alone, not every element, is caught."""
    x, t = _cases()["odd (257, 1031)"]
    monkeypatch.setattr(sl1_host.options, "options_divisor", lambda n, reduction: float(n // 1031))
    loss = LF.smooth_l1_loss(x, t)
    assert _relative_error(loss, F.smooth_l1_loss(x.double(), t.double())) > 1e-5


@pytest.mark.gpu
def test_mixed_dtypes_promote_as_pytorch():
    x, t = torch.randn(37, 100, device="cuda"), torch.randn(37, 100, device="cuda", dtype=torch.float16)
    loss = LF.smooth_l1_loss(x, t)
    assert loss.dtype == F.smooth_l1_loss(x, t).dtype == torch.float32
    torch.testing.assert_close(loss, F.smooth_l1_loss(x, t))


@pytest.mark.gpu
def test_more_than_2_to_the_31_elements():
    """2^31 + 5 bfloat16 elements (4 GiB a tensor): no 32-bit index overflows; checked against a
    float64 sum taken in chunks, and the gradient at both ends."""
    n = 2**31 + 5
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.empty(n, device="cuda", dtype=torch.bfloat16).uniform_(-1, 1, generator=gen)
    t = torch.empty(n, device="cuda", dtype=torch.bfloat16).uniform_(-1, 1, generator=gen)
    total = sum(F.smooth_l1_loss(x[i:i + 2**28].double(), t[i:i + 2**28].double(), reduction="sum")
                for i in range(0, n, 2**28))
    leaf = x.requires_grad_(True)
    loss = LF.smooth_l1_loss(leaf, t)
    assert abs(loss.double().item() - total.item() / n) <= 2 * TOLERANCES[torch.bfloat16][0] * total.item() / n
    loss.backward()
    for i in (0, n - 1):
        expected = (x[i].double() - t[i].double()).clamp(-1, 1) / n
        assert abs(leaf.grad[i].double() - expected) <= 0.01 * abs(expected) + 1e-30


@pytest.mark.gpu
def test_modules_match_pytorchs():
    p, t = torch.randn(6, 50, device="cuda"), torch.randn(6, 50, device="cuda")
    for reduction in sl1_host.REDUCTIONS:
        torch.testing.assert_close(lnn.SmoothL1Loss(reduction=reduction, beta=0.5)(p, t),
                                   torch.nn.SmoothL1Loss(reduction=reduction, beta=0.5)(p, t))
        torch.testing.assert_close(lnn.HuberLoss(reduction=reduction, delta=0.5)(p, t),
                                   torch.nn.HuberLoss(reduction=reduction, delta=0.5)(p, t))


@pytest.mark.gpu
def test_opcheck_every_operator():
    p, q = torch.randn(37, 1001, device="cuda"), torch.randn(37, 1001, device="cuda")
    for code in sl1_host.REDUCTIONS.values():
        torch.library.opcheck(MF.forward_op, (p.clone().requires_grad_(True), q, code, 1.0, 1.0))
        grad_loss = torch.randn_like(p) if code == 0 else torch.tensor(0.5, device="cuda")
        torch.library.opcheck(MF.backward_op, (p, q, grad_loss, code, 0.5, 0.5))
        if code:
            torch.library.opcheck(MF.forward_grad_op, (p.clone().requires_grad_(True), q, code, 0.0, 1.0))


@pytest.mark.gpu
def test_fused_backward_runs_once_per_forward_and_the_result_is_bitwise_repeatable():
    x, t = _cases()["odd (257, 1031)"]
    leaf = x.clone().requires_grad_(True)
    loss = LF.smooth_l1_loss(leaf, t)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="once per forward"):
        loss.backward()
    again = x.clone().requires_grad_(True)
    second = LF.smooth_l1_loss(again, t)
    second.backward()
    assert torch.equal(loss, second) and torch.equal(leaf.grad, again.grad)


@pytest.mark.gpu
def test_compiled_training_step_in_a_cuda_graph_matches_pytorch():
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 1001).cuda()
    reference = torch.nn.Linear(64, 1001).cuda().double()
    reference.load_state_dict(model.state_dict())
    compiled = torch.compile(lambda x, y: LF.huber_loss(model(x), y, delta=0.5), fullgraph=True)
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
        ref = F.huber_loss(reference(x.double()), y.double(), delta=0.5)
        ref.backward()
        assert _relative_error(static_loss, ref) <= 1e-5
        assert _relative_error(model.weight.grad, reference.weight.grad) <= 1e-5
