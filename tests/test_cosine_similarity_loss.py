"""What is special about cosine_similarity_loss (the generic tests pick the rest up from the registry).

cpu tier: the eps semantics of F.cosine_similarity (each norm clamped apart, the norm's derivative kept)
in every float64 formula losslab states (the simulator's reference, cosine.cuh's as numpy), the
KernelBench file against the reference, the operators' fake kernels on meta tensors, and bad input
errors. gpu tier: losslab.nn.functional.cosine_similarity and cosine_similarity_loss against PyTorch in
float64 (both gradients, each dtype, eps, edge cases), torch.compile(fullgraph=True), CUDA graphs,
determinism, and one backward per eager forward.
"""
from __future__ import annotations

import hashlib
import inspect
import math
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import losslab.nn as lnn
import losslab.nn.functional as LF
from losslab import build, problems
from losslab.measure import check
from losslab.problems.cosine_similarity_loss import functional as CF
from losslab.problems.cosine_similarity_loss import kernelbench
from losslab.teach.simulator import build as sim_build
from losslab.teach.simulator import cases as sim_cases
from losslab.teach.simulator import run as sim_run

PROBLEM = problems.get("cosine_similarity_loss")
EPS = 1e-8


def formula(p: torch.Tensor, t: torch.Tensor, eps: float = EPS, scale: float = 1.0):
    """cos and dcos/dp, dcos/dt (times ``scale``) as kernels/cosine_similarity_loss/cosine.cuh computes them."""
    norm_p, norm_t = p.norm(dim=1), t.norm(dim=1)
    a, b = norm_p.clamp_min(eps), norm_t.clamp_min(eps)
    cos = (p * t).sum(1) / a / b
    beta_p = torch.where(norm_p == 0, 0, cos / a / norm_p)
    beta_t = torch.where(norm_t == 0, 0, cos / b / norm_t)
    alpha = 1 / a / b
    return cos, scale * (alpha[:, None] * t - beta_p[:, None] * p), scale * (alpha[:, None] * p - beta_t[:, None] * t)


def hard_rows(dtype=torch.float64):
    """Random rows, a zero row, a row of norm below eps and a row equal to its target."""
    gen = torch.Generator().manual_seed(0)
    p, t = torch.randn(6, 33, generator=gen, dtype=dtype), torch.randn(6, 33, generator=gen, dtype=dtype)
    p[1] = 0.0
    p[2] *= 1e-12
    t[3] = p[3]
    t[4] = 0.0
    return p, t


# --- cpu tier ------------------------------------------------------------------------------------------

def test_the_kernels_formula_is_pytorchs_autograd_with_eps():
    p, t = hard_rows()
    p.requires_grad_(True), t.requires_grad_(True)
    cos = F.cosine_similarity(p, t, dim=1)
    grad_p, grad_t = torch.autograd.grad(cos.sum(), (p, t))
    ours, ours_p, ours_t = formula(p.detach(), t.detach())
    assert torch.allclose(ours, cos.detach(), rtol=1e-12, atol=1e-15)
    assert torch.allclose(ours_p, grad_p, rtol=1e-10) and torch.allclose(ours_t, grad_t, rtol=1e-10)
    # the norms' product clamped instead (max(|p| |t|, eps), PyTorch before 1.12) differs on the tiny row
    product = (p * t).sum(1) / (p.norm(dim=1) * t.norm(dim=1)).clamp_min(EPS)
    assert not torch.allclose(product.detach(), cos.detach())


def test_the_simulators_reference_is_the_problems():
    p, t = hard_rows(torch.float32)
    case = sim_cases.Case("hard rows", 6, 33, p.numpy().reshape(-1).copy(), t.numpy().reshape(-1).copy(),
                          grad_loss=0.75)
    ref = sim_cases.cosine_reference(case)
    loss64, grad64 = PROBLEM.reference_float64(p, t)
    assert np.allclose(ref["loss"], loss64.numpy(), rtol=1e-12)
    assert np.allclose(ref["grad"], 0.75 * grad64.numpy().reshape(-1), rtol=1e-9)


def test_kernelbench_file_is_the_reference():
    p, t = PROBLEM.make_inputs((4, 64), seed=1, device="cpu")
    assert torch.equal(kernelbench.Model()(p, t), PROBLEM.reference(p, t))
    inputs = kernelbench.get_inputs.__code__.co_names
    assert "randn" in inputs and kernelbench.get_init_inputs() == []
    assert (kernelbench.batch_size, *kernelbench.input_shape) == PROBLEM.sizes["seed"]


def test_edge_cases_have_finite_references_but_the_nan_one():
    for name, inputs in PROBLEM.edge_cases("cpu").items():
        loss, grad = PROBLEM.reference_float64(*inputs)
        assert math.isnan(loss) == ("NaN" in name), name
        if "NaN" not in name:
            assert torch.isfinite(grad).all(), name


def test_condition_parts_are_the_terms_one_minus_cos():
    p, t = PROBLEM.make_inputs((16, 32), seed=2, device="cpu")
    magnitude, total = PROBLEM.condition_parts(p.double(), t.double())
    assert math.isclose(total / 16, PROBLEM.reference(p.double(), t.double()).item(), rel_tol=1e-12)
    assert magnitude >= abs(total)


def test_cost_is_two_reads_and_one_write_of_the_rows():
    rows, cols = PROBLEM.sizes["seed"]
    n = rows * cols
    assert PROBLEM.cost((rows, cols), "forward").bytes == 2 * 4 * n + 4
    assert PROBLEM.cost((rows, cols), "forward_backward", torch.bfloat16).bytes == 3 * 2 * n + 4
    with pytest.raises(ValueError, match="direction"):
        PROBLEM.cost((rows, cols), "sideways")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_fakes_give_the_kernels_shapes(dtype):
    x1 = torch.empty(8, 16, device="meta", dtype=dtype, requires_grad=True)
    x2 = torch.empty(8, 16, device="meta", dtype=dtype, requires_grad=True)
    cos, dots = CF.similarity_forward(x1, x2, EPS)
    assert cos.shape == (8,) and cos.dtype == dtype and dots.shape == (24,) and dots.dtype == torch.float32
    g1, g2 = torch.autograd.grad(cos.sum(), (x1, x2))
    assert g1.shape == g2.shape == (8, 16) and g1.dtype == dtype
    loss, gp, gt = CF.loss_forward_grad(x1, x2, EPS, True, False)
    assert loss.shape == () and gp.shape == (8, 16) and gt.numel() == 0
    assert CF.loss_forward(x1.detach(), x2.detach(), EPS).shape == ()


def test_operators_mutate_nothing():
    for op in (CF.similarity_forward, CF.similarity_backward, CF.loss_forward, CF.loss_forward_grad):
        assert op.name().startswith("losslab::cosine_similarity")
        assert not op._schema.is_mutable and all(a.alias_info is None for a in op._schema.arguments)


def test_module_and_function_have_pytorchs_parameters():
    def params(f):
        return [(p.name, p.default) for p in inspect.signature(f).parameters.values()]

    assert params(lnn.CosineSimilarity) == params(torch.nn.CosineSimilarity)
    assert params(LF.cosine_similarity) == [("x1", inspect.Parameter.empty), ("x2", inspect.Parameter.empty),
                                            ("dim", 1), ("eps", 1e-8)]  # F's is a builtin without a signature


X = torch.randn(4, 8)
BAD = [
    # (call, error, message)
    (lambda: LF.cosine_similarity(X, X, dim=0), ValueError, "dim: losslab takes dim 1 or -1"),
    (lambda: LF.cosine_similarity(X[None], X[None]), ValueError, "x1: losslab takes \\(B, D\\) rows only"),
    (lambda: LF.cosine_similarity(X, X[:, :4]), ValueError, "x2: expected the shape of x1"),
    (lambda: LF.cosine_similarity(X, X.half()), TypeError, "x2: expected the dtype of x1"),
    (lambda: LF.cosine_similarity(X.double(), X.double()), TypeError, "x1: losslab has kernels for"),
    (lambda: LF.cosine_similarity(X, "t"), TypeError, "x2: expected a Tensor, got str"),
    (lambda: LF.cosine_similarity(X[:0], X[:0]), ValueError, "x1: expected a non-empty tensor"),
    (lambda: LF.cosine_similarity(X, X), ValueError, "x1, x2: losslab's kernels need CUDA tensors"),
    (lambda: LF.cosine_similarity_loss(X, X), ValueError, "predictions, targets: losslab's kernels need CUDA"),
    (lambda: PROBLEM.validate(X, X.requires_grad_(True)), ValueError, "targets"),
]


@pytest.mark.parametrize("call, error, message", BAD, ids=[b[2][:40] for b in BAD])
def test_bad_input_is_one_line_naming_the_argument(call, error, message):
    with pytest.raises(error, match=message) as raised:
        call()
    assert "\n" not in str(raised.value)


# --- compile tier: the operator rungs on the CPU simulator ---------------------------------------------

@pytest.mark.compile
@pytest.mark.parametrize("order", ["forward", "reverse"])
@pytest.mark.parametrize("rung", ["vectorized", "fused"])
def test_operator_rungs_match_float64_on_the_cpu_simulator(rung, order):
    """The production rungs' float32 path (register tile, the last block's loss) on the simulator's cases
    and on a row longer than the fused tile (2048 packs): its packs beyond the tile streamed, then re-read."""
    text = (build.KERNELS / PROBLEM.name / f"{rung}.cu").read_text()
    text = re.sub(rf"\b{PROBLEM.name}_{rung}_(forward|backward)\b", rf"{PROBLEM.name}_custom_\1", text)
    # the simulator caches a build by the source's text: the headers' hash in it rebuilds when one changes
    headers = sorted((build.KERNELS / PROBLEM.name).glob("*.*h")) + sorted((build.KERNELS / "common").glob("*.*h"))
    text += f"\n// headers: {hashlib.sha256(b''.join(h.read_bytes() for h in headers)).hexdigest()}\n"
    wide = sim_cases.cosine_case("past the register tile (1 x 9001)", 1, 9001, seed=7)
    try:
        outcome = sim_run.run(text, PROBLEM.name, [*sim_cases.cosine_cases(), wide], label=f"{rung}.cu",
                              order=order)
    except sim_build.SimulatorError as err:
        pytest.skip(f"no CPU simulator here: {err}")
    assert outcome.compiled, outcome.compile_error
    for r in outcome.results:
        assert r.failure is None and (r.forward_status, r.backward_status) == (0, 0), (r.case.name, r.failure)
        ref = sim_cases.cosine_reference(r.case)
        loss_error, detail = check.relative_error(torch.tensor([r.loss]), torch.from_numpy(ref["loss"]))
        assert not detail and loss_error <= check.LOSS_RTOL, (r.case.name, r.loss, ref["loss"])
        grad_error, detail = check.relative_error(torch.from_numpy(r.grad), torch.from_numpy(ref["grad"]))
        assert not detail and grad_error <= check.GRAD_RTOL, (r.case.name, grad_error)


# --- gpu tier ------------------------------------------------------------------------------------------

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _inputs(dtype, rows=33, cols=1027, seed=0):
    p, t = PROBLEM.make_inputs((rows, cols), seed=seed, device="cuda", dtype=dtype)
    return p, t


def _errors(ours, reference, dtype):
    tolerance = check.TOLERANCES[dtype][1] + check.relative_error(reference.to(dtype), reference)[0]
    error, detail = check.relative_error(ours, reference)
    return error, detail, tolerance


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("which", ["both", "x1", "x2"])
@pytest.mark.parametrize("eps", [1e-8, 0.5])
def test_cosine_similarity_matches_pytorch_in_float64(dtype, which, eps):
    x1, x2 = _inputs(dtype)
    if eps > 0.1:  # (at eps 1e-8 a zero row's gradient, 1e8-sized, overflows float16: the float32 edge cases)
        x1[1] = 0.0  # a zero row
        x2[2] *= 1e-3  # a row of norm below eps
    a64, b64 = x1.double().requires_grad_(which != "x2"), x2.double().requires_grad_(which != "x1")
    grad_cos = torch.randn(x1.shape[0], device="cuda", dtype=torch.float64)
    ref = F.cosine_similarity(a64, b64, dim=1, eps=eps)
    wanted = [x for x in (a64, b64) if x.requires_grad]
    refs = torch.autograd.grad(ref, wanted, grad_cos)
    a, b = x1.clone().requires_grad_(a64.requires_grad), x2.clone().requires_grad_(b64.requires_grad)
    cos = LF.cosine_similarity(a, b, dim=-1, eps=eps)
    assert cos.dtype == dtype and cos.shape == ref.shape
    error, detail, tolerance = _errors(cos, ref.detach(), dtype)
    assert not detail and error <= tolerance
    grads = torch.autograd.grad(cos, [x for x in (a, b) if x.requires_grad], grad_cos.to(dtype))
    for ours, reference in zip(grads, refs, strict=True):
        error, detail, tolerance = _errors(ours, reference, dtype)
        assert not detail and error <= 2 * tolerance, (which, error, tolerance)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("which", ["both", "predictions", "targets", "none"])
@pytest.mark.parametrize("shape", [(33, 1027), (4, 8192), (2, 20000)])  # odd, the tile exactly, beyond it
def test_cosine_similarity_loss_matches_float64(dtype, which, shape):
    p, t = _inputs(dtype, *shape)
    p64, t64 = p.double().requires_grad_(which in ("both", "predictions")), t.double().requires_grad_(
        which in ("both", "targets"))
    ref = PROBLEM.reference(p64, t64)
    pp, tt = p.clone().requires_grad_(p64.requires_grad), t.clone().requires_grad_(t64.requires_grad)
    loss = LF.cosine_similarity_loss(pp, tt)
    assert loss.shape == () and loss.dtype == dtype
    error, detail = check.relative_error(loss, ref.detach())
    assert not detail and error <= check.TOLERANCES[dtype][0] * 4
    if which == "none":
        assert not loss.requires_grad
        return
    wanted64 = [x for x in (p64, t64) if x.requires_grad]
    refs = torch.autograd.grad(ref, wanted64, torch.tensor(0.75, device="cuda", dtype=torch.float64))
    grads = torch.autograd.grad(loss, [x for x in (pp, tt) if x.requires_grad],
                                torch.tensor(0.75, device="cuda", dtype=dtype))
    for ours, reference in zip(grads, refs, strict=True):
        error, detail, tolerance = _errors(ours, reference, dtype)
        assert not detail and error <= 2 * tolerance, (which, error, tolerance)


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(PROBLEM.edge_cases("cpu")))
def test_public_loss_matches_float64_on_the_edge_cases(case):
    p, t = (x.cuda() for x in PROBLEM.edge_cases("cpu")[case])
    p64, t64 = p.double().requires_grad_(True), t.double().requires_grad_(True)
    ref = PROBLEM.reference(p64, t64)
    refs = torch.autograd.grad(ref, (p64, t64))
    pp, tt = p.clone().requires_grad_(True), t.clone().requires_grad_(True)
    loss = LF.cosine_similarity_loss(pp, tt)
    error, detail = check.relative_error(loss, ref.detach())
    assert not detail and error <= check.LOSS_RTOL, (case, loss.item(), ref.item())
    for ours, reference in zip(torch.autograd.grad(loss, (pp, tt)), refs, strict=True):
        error, detail = check.relative_error(ours, reference)
        assert not detail and error <= 2 * check.GRAD_RTOL, (case, error, detail)


@pytest.mark.gpu
def test_compiles_fullgraph_and_matches_eager():
    p, t = _inputs(torch.float32)
    compiled = torch.compile(lambda a, b: (1 - LF.cosine_similarity(a, b)).mean() + LF.cosine_similarity_loss(a, b),
                             fullgraph=True)
    a, b = p.clone().requires_grad_(True), t.clone().requires_grad_(True)
    out = compiled(a, b)
    out.backward()
    a2, b2 = p.clone().requires_grad_(True), t.clone().requires_grad_(True)
    eager = (1 - LF.cosine_similarity(a2, b2)).mean() + LF.cosine_similarity_loss(a2, b2)
    eager.backward()
    assert torch.allclose(out, eager, rtol=1e-6)
    assert torch.allclose(a.grad, a2.grad, rtol=1e-5, atol=1e-9) and torch.allclose(b.grad, b2.grad, rtol=1e-5,
                                                                                      atol=1e-9)


@pytest.mark.gpu
def test_captured_in_a_cuda_graph():
    p, t = _inputs(torch.float32)
    a = p.clone().requires_grad_(True)
    LF.cosine_similarity_loss(a, t).backward()  # warm-up: builds and loads the kernels
    expected = a.grad.clone()
    a.grad = None
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph):
        loss = LF.cosine_similarity_loss(a, t)
        loss.backward()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(a.grad, expected)


@pytest.mark.gpu
def test_bitwise_repeatable_and_one_backward_per_forward():
    p, t = _inputs(torch.bfloat16, 257, 4099)
    runs = []
    for _ in range(2):
        a = p.clone().requires_grad_(True)
        loss = LF.cosine_similarity_loss(a, t)
        loss.backward(retain_graph=True)
        runs.append((loss.detach(), a.grad.clone()))
        with pytest.raises(RuntimeError, match="backward can run once per forward"):
            loss.backward()
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])


@pytest.mark.gpu
def test_module_is_the_function():
    p, t = _inputs(torch.float16)
    assert torch.equal(lnn.CosineSimilarity(dim=1, eps=0.1)(p, t), LF.cosine_similarity(p, t, 1, 0.1))


@pytest.mark.gpu
def test_eager_loss_calls_reach_the_kernels_without_the_dispatcher(monkeypatch):
    """Not traced, the loss (inference, and forward and backward for either input or both) calls no
    torch.library operator, each a round trip into Python; the gradients still match float64 and the
    backward still runs once per forward."""
    for name in ("loss_forward", "loss_forward_grad"):
        monkeypatch.setattr(CF, name, lambda *args, name=name: pytest.fail(f"eager mode called the operator {name}"))
    p, t = (torch.randn(64, 300, device="cuda") for _ in range(2))
    with torch.no_grad():
        LF.cosine_similarity_loss(p, t)
    for p_grad, t_grad in ((True, False), (False, True), (True, True)):
        leaves = [p.clone().requires_grad_(p_grad), t.clone().requires_grad_(t_grad)]
        loss = LF.cosine_similarity_loss(*leaves)
        loss.backward(retain_graph=True)
        expected = [x.double().requires_grad_(True) for x in (p, t)]
        torch.mean(1 - F.cosine_similarity(*expected, dim=1, eps=EPS)).backward()
        for leaf, want in zip(leaves, expected, strict=True):
            if leaf.requires_grad:
                assert (leaf.grad.double() - want.grad).norm() <= 1e-5 * want.grad.norm()
            else:
                assert leaf.grad is None
        with pytest.raises(RuntimeError, match="backward can run once per forward"):
            loss.backward()
