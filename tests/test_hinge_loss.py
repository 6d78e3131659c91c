"""hinge_loss (KernelBench level 1, problem 100) and losslab.nn.functional.hinge_loss, its own public function.

cpu tier: the reference is KernelBench's, its (D,) targets broadcast over the rows; the gradient is 0 at
the hinge (as autograd of torch.clamp in the pinned torch 2.14.1, written out for any torch); the inputs,
cost model, condition terms and edge cases; bad input named in one line (the rungs' checks and
hinge_loss's); how a target is laid out for the kernels;
the operators' schemas and fake shapes.
gpu tier: hinge_loss against PyTorch's formula in float64 (every reduction, dtype and target layout,
both kernels), at the hinge and with NaN and inf, on KernelBench's own inputs, opcheck, the module,
and a torch.compile(fullgraph=True) training step captured in a CUDA graph.
"""
import itertools
import math
import shutil

import pytest
import torch

import losslab
import losslab.nn as lnn
import losslab.nn.functional as LF
from losslab import problems
from losslab.measure.check import TOLERANCES
from losslab.problems import hinge_loss as hinge_host
from losslab.problems.hinge_loss import functional as HF
from losslab.problems.hinge_loss import kernelbench
from losslab.teach.simulator import build as sim_build
from losslab.teach.simulator import cases as sim_cases
from losslab.teach.simulator import run as sim_run

HINGE = problems.get("hinge_loss")


def by_hand(p: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """sum_ij max(0, 1 - p_ij t_j) / (B D), written out with loops over the rows."""
    rows = [torch.clamp(1 - p[i] * t, min=0).sum() for i in range(p.shape[0])]
    return torch.stack(rows).sum() / p.numel()


# --- cpu tier: the problem -------------------------------------------------------------------------

def test_reference_is_kernelbenchs_with_targets_broadcast_over_the_rows():
    p, t = HINGE.make_inputs((5, 7), seed=0, device="cpu")
    assert t.shape == (7,)
    torch.testing.assert_close(HINGE.reference(p, t), kernelbench.Model()(p, t))
    torch.testing.assert_close(HINGE.reference(p, t), by_hand(p, t))


def test_kernelbench_file_is_problem_100():
    assert (kernelbench.batch_size, kernelbench.input_shape, kernelbench.dim) == (32768, (32768,), 1)
    assert HINGE.sizes["seed"] == (kernelbench.batch_size, *kernelbench.input_shape)
    assert HINGE.kernelbench_file.name == "kernelbench.py"


def test_gradient_is_minus_the_target_over_n_and_zero_at_the_hinge():
    p, t = HINGE.make_inputs((3, 6), seed=0, device="cpu")
    p[:, ::2] = t[::2]  # on the hinge: 1 - p t = 0
    p[1, 1] = float("nan")
    _, grad = HINGE.reference_float64(p, t)
    margin = 1 - p.double() * t.double()
    expected = torch.where(margin > 0, -t.double() / p.numel(), 0.0).expand(3, 6)
    torch.testing.assert_close(grad, expected)
    assert (grad[:, ::2] == 0).all() and grad[1, 1] == 0


def _clamp_passes_the_gradient_at_min() -> bool:
    x = torch.zeros((), dtype=torch.float64, requires_grad=True)
    torch.clamp(x, min=0).backward()
    return x.grad.item() != 0


@pytest.mark.parametrize("case", list(HINGE.edge_cases("cpu")))
def test_reference_gradient_is_the_pinned_torchs_autograd(case):
    # the written-out gradient equals autograd of KernelBench's reference wherever torch's convention
    # at the hinge is the pinned one (torch 2.14.1: 0); torch 2.11 and older pass 1 there
    if _clamp_passes_the_gradient_at_min():
        pytest.skip(f"torch {torch.__version__}'s clamp passes the gradient at min (requirements.txt pins 2.14.1)")
    p, t = HINGE.edge_cases("cpu")[case]
    ref_p = p.double().requires_grad_(True)
    HINGE.reference(ref_p, t.double()).backward()
    loss, grad = HINGE.reference_float64(p, t)
    torch.testing.assert_close(loss, HINGE.reference(p.double(), t.double()), equal_nan=True)
    torch.testing.assert_close(grad, ref_p.grad, equal_nan=True, rtol=1e-12, atol=0)


def test_inputs_are_kernelbenchs_draw():
    p, t = HINGE.make_inputs((64, 512), seed=3, device="cpu")
    assert set(t.unique().tolist()) == {-1.0, 1.0}
    assert p.min() >= 0.01 and p.dtype == t.dtype == torch.float32
    # Pareto(0.01, 1.5): P(p > 1) = 0.01 ** 1.5 = 1e-3, and the median is 0.01 * 2 ** (1 / 1.5)
    assert abs(p.median().item() - 0.01 * 2 ** (1 / 1.5)) < 1e-3
    half = HINGE.make_inputs((64, 512), seed=3, device="cpu", dtype=torch.bfloat16)
    assert half[0].dtype == half[1].dtype == torch.bfloat16


def test_structured_inputs_put_the_loss_in_a_few_rows():
    p, t = HINGE.structured_inputs((256, 300), seed=0, device="cpu")
    rows = torch.clamp(1 - p * t, min=0).sum(1)
    top = rows.sort(descending=True).values
    assert top[: 256 // problems.HEAVY_EVERY].sum() > 0.9 * rows.sum()


def test_condition_parts_bound_the_cancellation_of_one_minus_p_t():
    p, t = HINGE.make_inputs((4, 50), seed=0, device="cpu")
    magnitude, total = HINGE.condition_parts(p.double(), t.double())
    torch.testing.assert_close(total, HINGE.reference(p.double(), t.double()) * p.numel())
    assert magnitude >= total > 0
    met, met_t = HINGE.edge_cases("cpu")["every margin met (the loss is exactly 0)"]
    assert [x.item() for x in HINGE.condition_parts(met.double(), met_t.double())] == [0, 0]


def test_cost_model_counts_bytes_once():
    rows, cols = HINGE.sizes["seed"]
    n = rows * cols
    assert HINGE.cost((rows, cols), "forward").bytes == (n + cols) * 4 + 4   # p and t read once
    assert HINGE.cost((rows, cols), "backward").bytes_written == n * 4
    assert HINGE.cost((rows, cols), "forward_backward").bytes == (n + cols) * 4 + n * 4 + 4
    assert HINGE.cost((rows, cols), "forward", torch.bfloat16).bytes_read == (n + cols) * 2
    with pytest.raises(ValueError, match="direction: expected one of"):
        HINGE.cost((rows, cols), "sideways")


def test_edge_cases_cover_the_issue_list():
    cases = HINGE.edge_cases("cpu")
    names = " ".join(cases)
    for needle in ("hinge", "NaN", "infinite", "exactly 0", "B = 1", "D = 1", "multiple of 4", "alignment",
                   "non-contiguous"):
        assert needle in names
    p, t = cases["storage offsets break 16-byte alignment"]
    assert p.is_contiguous() and p.storage_offset() % 4 != 0 and t.storage_offset() % 4 != 0
    p, t = cases["non-contiguous (every other column and target)"]
    assert not p.is_contiguous() and not t.is_contiguous()
    for p, t in cases.values():  # every case is a (B, D), (D,) pair
        assert p.dim() == 2 and t.shape == (p.shape[1],)
    p, t = cases["every margin met (the loss is exactly 0)"]
    assert HINGE.reference(p, t) == 0
    p, t = cases["NaN in predictions (NaN propagates to the loss; its gradient is 0)"]
    assert HINGE.reference(p, t).isnan()


BAD_TARGETS = {
    "a target per row, not per column": (lambda p, t: (p, torch.ones(p.shape[0])), ValueError,
                                         r"targets: expected \(7,\), one per column of predictions \(5, 7\)"),
    "(B, D) targets": (lambda p, t: (p, t.expand(5, 7)), ValueError, r"targets: expected 1 dimensions"),
    "float64 targets": (lambda p, t: (p, t.double()), TypeError, r"targets: expected dtype"),
    "bfloat16 targets of float32 predictions": (lambda p, t: (p, t.bfloat16()), TypeError,
                                                r"targets: expected the dtype of predictions"),
    "targets requiring grad": (lambda p, t: (p, t.clone().requires_grad_(True)), ValueError,
                               r"targets: gradients w.r.t. targets are not supported"),
}


@pytest.mark.parametrize("case", BAD_TARGETS)
def test_bad_targets_are_named_before_any_launch(case):
    make, error, message = BAD_TARGETS[case]
    p, t = HINGE.make_inputs((5, 7), seed=0, device="cpu")
    with pytest.raises(error, match=message):
        losslab.variant("hinge_loss", "vectorized")(*make(p, t))


# The operators' forward kernel (forward.cuh: walk.cuh's walk and grid) on the CPU simulator, writing the loss
# and, as fused's, the gradient for grad_loss = 1; the backward scales it. 64 threads and 4 rows in flight, on
# the standard cases and on more rows than a round holds (groups of rows in turn, the last round partial).
OPERATOR_FORWARD = """
#include "common/scale.cuh"
#include "hinge_loss/forward.cuh"
#include "hinge_loss/launchers.h"

cudaError_t hinge_loss_custom_forward(const void* p, const void* t, float* partials, void* loss, void* grad,
                                      int64_t B, int64_t D, DType dtype, cudaStream_t stream) {
    return hinge_loss_forward_launch<64, 4, Mode::sum_and_grad>(p, t, partials, loss, grad, B, D, float(B * D),
                                                                dtype, stream);
}

cudaError_t hinge_loss_custom_backward(const void*, const void*, const void* grad_loss, void* grad, int64_t B,
                                       int64_t D, DType dtype, cudaStream_t stream) {
    return scale_in_place(grad, grad_loss, B * D, dtype, stream);
}
"""


@pytest.mark.skipif(shutil.which(sim_build.CXX) is None, reason=f"the CPU simulator needs {sim_build.CXX}")
def test_operator_forward_kernel_matches_float64_on_the_cpu_simulator():
    cases = [*sim_cases.hinge_loss_cases(), sim_cases.hinge_loss_case("41 x 300 (rows in turn)", 41, 300, seed=7),
             sim_cases.hinge_loss_case("9 x 1001 (odd width, rows in turn)", 9, 1001, seed=8)]
    outcome = sim_run.run(OPERATOR_FORWARD, HINGE.name, cases, label="forward.cuh", order="reverse")
    assert outcome.compiled, outcome.compile_error
    for r in outcome.results:
        assert r.failure is None, (r.case.name, r.failure)
        ref = sim_cases.hinge_loss_reference(r.case)
        assert r.loss == pytest.approx(ref["loss"][0], rel=1e-6), r.case.name
        assert abs(r.grad - ref["grad"]).max() <= 1e-6 * abs(ref["grad"]).max() + 1e-12, r.case.name


# --- cpu tier: losslab.nn.functional.hinge_loss ---------------------------------------------------------

X, T = torch.randn(4, 5), torch.ones(5)
NN_ERRORS = {
    "unknown reduction": (lambda: LF.hinge_loss(X, T, reduction="batchmean"), ValueError,
                          r"reduction: expected one of none, mean, sum, got 'batchmean'"),
    "input not a tensor": (lambda: LF.hinge_loss(X.tolist(), T), TypeError, r"argument 'input' must be Tensor"),
    "target not a tensor": (lambda: LF.hinge_loss(X, 1.0), TypeError, r"argument 'target' must be Tensor"),
    "float64 input": (lambda: LF.hinge_loss(X.double(), T), TypeError, r"input: losslab has kernels for"),
    "empty input": (lambda: LF.hinge_loss(X[:0], T), ValueError, r"input: expected a non-empty tensor"),
    "a target that does not broadcast": (lambda: LF.hinge_loss(X, torch.ones(4)), ValueError,
                                         r"target: expected a shape that broadcasts to input's \(4, 5\)"),
    "a target that grows the input": (lambda: LF.hinge_loss(X, torch.ones(3, 4, 5)), ValueError,
                                      r"target: expected a shape that broadcasts"),
    "a target requiring grad": (lambda: LF.hinge_loss(X, T.clone().requires_grad_(True)), NotImplementedError,
                                r"target: losslab computes no gradient w.r.t. the target"),
    "CPU tensors": (lambda: LF.hinge_loss(X, T), ValueError, r"input: losslab's kernels need a CUDA tensor"),
    "the module, unknown reduction": (lambda: lnn.HingeLoss(reduction="avg")(X, T), ValueError,
                                      r"reduction: expected one of"),
}


@pytest.mark.parametrize("case", NN_ERRORS)
def test_hinge_loss_names_the_bad_argument(case):
    call, error, message = NN_ERRORS[case]
    with pytest.raises(error, match=message):
        call()


def test_the_broadcast_check_agrees_with_torch_on_every_small_shape():
    """hinge_loss's own check that a target broadcasts to the input without growing it (fast for the
    common case, where torch.broadcast_shapes costs a small launch's host time), against torch's
    answer on every pair of shapes of up to 3 and 4 dimensions of sizes 1, 3 and 5."""
    for input_dims in range(4):
        for input_shape in itertools.product((1, 3, 5), repeat=input_dims):
            for target_dims in range(5):
                for target_shape in itertools.product((1, 3, 5), repeat=target_dims):
                    target, input = torch.Size(target_shape), torch.Size(input_shape)
                    try:
                        grows = torch.broadcast_shapes(input, target) != input
                    except RuntimeError:
                        grows = True
                    assert HF._grows(target, input) is grows, (target_shape, input_shape)


LAYOUTS = {
    # name: (input shape, target shape, (B, D) the kernels see)
    "(B, D) and (D,)": ((4, 5), (5,), (4, 5)),
    "(B, D) and (1, D)": ((4, 5), (1, 5), (4, 5)),
    "(N, H, W) and (H, W)": ((2, 3, 5), (3, 5), (2, 15)),
    "(N, H, W) and (W,)": ((2, 3, 5), (5,), (6, 5)),
    "same shape": ((4, 5), (4, 5), (1, 20)),
    "(B, 1): expanded": ((4, 5), (4, 1), (1, 20)),
    "0-d": ((), (), (1, 1)),
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_targets_reach_the_kernels_as_one_value_per_column(layout):
    input_shape, target_shape, kernel_shape = LAYOUTS[layout]
    x = torch.randn(input_shape)
    t = torch.randn(target_shape)
    rows, cols = HF._rows(x, t)
    assert tuple(rows.shape) == kernel_shape and cols.shape == (kernel_shape[1],)
    assert rows.is_contiguous() and cols.is_contiguous()
    torch.testing.assert_close((rows * cols).reshape(input_shape), x * t)


def test_a_batch_of_rows_reaches_the_kernels_as_it_is():
    """A contiguous (B, D) input with a (D,) target is passed on unchanged: no view of it, which
    would add a node to autograd's graph (host time in every backward)."""
    x, t = torch.randn(4, 5, requires_grad=True), torch.randn(5)
    rows, _ = HF._rows(x, t)
    assert rows is x and rows.grad_fn is None


def test_operators_mutate_nothing_and_fakes_give_the_kernels_shapes():
    for op in (HF.forward_op, HF.forward_grad_op, HF.backward_op):
        assert op.name().startswith("losslab::nn_hinge_loss")
        assert not op._schema.is_mutable and all(a.alias_info is None for a in op._schema.arguments)
    x = torch.empty(6, 13, device="meta", requires_grad=True)
    t = torch.empty(13, device="meta")
    for reduction, code in hinge_host.options.REDUCTIONS.items():
        loss = HF.forward_op(x, t, code)
        assert loss.shape == (x.shape if reduction == "none" else ())
        assert torch.autograd.grad(loss.sum(), x)[0].shape == x.shape
        if reduction != "none":
            loss, grad = HF.forward_grad_op(x, t, code)
            assert loss.shape == () and grad.shape == x.shape


def test_hinge_loss_is_public_and_documented():
    assert LF.hinge_loss is HF.hinge_loss and lnn.HingeLoss is HF.HingeLoss
    assert LF.on_problem("hinge_loss") is LF.hinge_loss
    doc = LF.hinge_loss.__doc__
    for needle in ("losslab's own", "hinge_embedding_loss", "broadcasts", "column j", "at the hinge"):
        assert needle in doc
    assert lnn.HingeLoss().reduction == "mean" and lnn.HingeLoss("sum").reduction == "sum"


# --- gpu tier ------------------------------------------------------------------------------------------

def _relative_error(ours: torch.Tensor, ref: torch.Tensor) -> float:
    ours, ref = ours.detach().double(), ref.detach().double()
    both_nan = torch.isnan(ours) & torch.isnan(ref)
    ours, ref = torch.where(both_nan, 0, ours), torch.where(both_nan, 0, ref)
    return float((ours - ref).norm() / ref.norm().clamp_min(1e-30))


def _tolerance(dtype: torch.dtype, ref: torch.Tensor, roundings: int = 1) -> float:
    """float32: 1e-5; 16-bit: the dtype's epsilon plus ``roundings`` times the rounding of the exact
    result to it (fused rounds its gradient for grad_loss = 1, then scales and rounds again)."""
    if dtype == torch.float32:
        return 1e-5
    return TOLERANCES[dtype][0] + roundings * _relative_error(ref.to(dtype), ref)


def _reference(x, t, reduction):
    # relu, not clamp(min=0): its gradient is 0 at the hinge on every torch, the pinned torch's convention
    # for clamp (hinge_loss's reference_float64 says why); 16-bit inputs land on the hinge often
    terms = torch.relu(1 - x * t)
    return {"none": terms, "mean": terms.mean(), "sum": terms.sum()}[reduction]


GPU_LAYOUTS = {**{k: v[:2] for k, v in LAYOUTS.items()}, "37 x 1001 and (1001,)": ((37, 1001), (1001,)),
               "1-D": ((1001,), (1001,))}


@pytest.mark.gpu
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "vectorized"])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layout", GPU_LAYOUTS)
def test_hinge_loss_matches_the_formula_in_float64(layout, dtype, reduction, fused):
    input_shape, target_shape = GPU_LAYOUTS[layout]
    gen = torch.Generator(device="cuda").manual_seed(1)
    x = (torch.randn(input_shape, generator=gen, device="cuda") * 1.5).to(dtype)
    t = (torch.randint(0, 2, target_shape, generator=gen, device="cuda") * 2 - 1).to(dtype)
    ref_x = x.double().requires_grad_(True)
    ref = _reference(ref_x, t.double(), reduction)
    upstream = torch.randn_like(ref) if reduction == "none" else torch.tensor(0.75, device="cuda", dtype=ref.dtype)
    ref.backward(upstream)
    ours_x = x.clone().requires_grad_(True)
    if fused:
        loss = LF.hinge_loss(ours_x, t, reduction=reduction)
    else:  # vectorized's own backward: the function runs it where no fused forward applies (none), else force it
        loss = HF._EagerHinge.apply(False, *HF._rows(ours_x, t), HF.REDUCTIONS[reduction])
        loss = loss.reshape(input_shape) if reduction == "none" else loss
    assert loss.shape == ref.shape and loss.dtype == dtype
    loss.backward(upstream.to(dtype))
    assert _relative_error(loss, ref) <= _tolerance(dtype, ref), f"loss {loss} vs {ref}"
    assert _relative_error(ours_x.grad, ref_x.grad) <= _tolerance(dtype, ref_x.grad, 1 + fused)
    with torch.no_grad():  # inference: vectorized's forward
        assert _relative_error(LF.hinge_loss(x, t, reduction=reduction), ref) <= _tolerance(dtype, ref)


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(HINGE.edge_cases("cpu")))
def test_hinge_loss_on_the_edge_cases_is_the_reference(case):
    p, t = HINGE.edge_cases("cuda")[case]
    ref, ref_grad = HINGE.reference_float64(p, t)  # the pinned torch's gradient at the hinge on any torch
    ours_p = p.clone().requires_grad_(True)
    loss = LF.hinge_loss(ours_p, t)
    loss.backward()
    assert (loss.isnan() == ref.isnan()).all() and (loss.isinf() == ref.isinf()).all(), (loss, ref)
    if torch.isfinite(ref):
        assert _relative_error(loss, ref) <= 1e-5
    assert torch.equal(ours_p.grad == 0, ref_grad == 0), "the gradient is 0 exactly where the reference's is"
    assert _relative_error(ours_p.grad, ref_grad) <= 1e-6


@pytest.mark.gpu
def test_kernelbench_inputs_give_the_reference():
    torch.manual_seed(0)
    p, t = (x.cuda() for x in kernelbench.get_inputs())
    p, t = p[:512].contiguous(), t  # KernelBench's draw, fewer rows: (512, 32768) and (32768,)
    ref = kernelbench.Model()(p.double(), t.double())
    assert _relative_error(LF.hinge_loss(p, t), ref) <= 1e-5
    assert _relative_error(losslab.variant("hinge_loss", "fused")(p, t), ref) <= 1e-5


@pytest.mark.gpu
def test_opcheck_every_operator_and_the_module():
    x = torch.randn(37, 1001, device="cuda")
    t = torch.randint(0, 2, (1001,), device="cuda").float() * 2 - 1
    for code in HF.REDUCTIONS.values():
        torch.library.opcheck(HF.forward_op, (x.clone().requires_grad_(True), t, code))
        grad_loss = torch.randn_like(x) if code == 0 else torch.tensor(0.5, device="cuda")
        torch.library.opcheck(HF.backward_op, (x, t, grad_loss, code))
        if code:
            torch.library.opcheck(HF.forward_grad_op, (x.clone().requires_grad_(True), t, code))
    torch.testing.assert_close(lnn.HingeLoss(reduction="sum")(x, t), torch.clamp(1 - x * t, min=0).sum())


@pytest.mark.gpu
def test_the_fused_backward_runs_once_and_the_host_does_not_wait():
    x = torch.randn(64, 4096, device="cuda", requires_grad=True)
    t = torch.randint(0, 2, (4096,), device="cuda").float() * 2 - 1
    loss = LF.hinge_loss(x, t)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="once per forward"):
        loss.backward()
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)
    done = torch.cuda.Event()
    LF.hinge_loss(x, t).backward()
    done.record()
    assert not done.query(), "the host waited for the GPU"
    torch.cuda.synchronize()


@pytest.mark.gpu
def test_compiled_training_step_in_a_cuda_graph_matches_pytorch():
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 1001).cuda()
    reference = torch.nn.Linear(64, 1001).cuda().double()
    reference.load_state_dict(model.state_dict())
    t = torch.randint(0, 2, (1001,), device="cuda").float() * 2 - 1

    compiled = torch.compile(lambda x: LF.hinge_loss(model(x), t), fullgraph=True)
    x = torch.randn(37, 64, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            model.zero_grad(set_to_none=True)
            compiled(x).backward()
    torch.cuda.current_stream().wait_stream(side)
    model.zero_grad(set_to_none=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_loss = compiled(x)
        static_loss.backward()
    for seed in range(3):
        x.copy_(torch.randn(37, 64, device="cuda", generator=torch.Generator(device="cuda").manual_seed(seed)))
        graph.replay()
        reference.zero_grad()
        ref = _reference(reference(x.double()), t.double(), "mean")
        ref.backward()
        assert _relative_error(static_loss, ref) <= 1e-5
        assert _relative_error(model.weight.grad, reference.weight.grad) <= 1e-5
        assert math.isfinite(static_loss.item())
