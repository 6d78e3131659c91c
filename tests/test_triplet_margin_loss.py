"""triplet_margin_loss: its definition, PyTorch's conventions the kernels follow, losslab.nn's function and module.

cpu tier: the reference is KernelBench's Model and PyTorch's definition (eps added to each difference); the
simulator's float64 reference and the kernels' gradient formula agree with PyTorch's autograd (clamp_min at 0,
zero distances, swap's ties); the cost model; the public API's signatures and its errors; the operators'
autograd and torch.compile through stand-in CPU kernels.
gpu tier: every option (margin, eps, swap, reduction) and dtype against PyTorch in float64 with the gradients
of all three inputs; NaN and inf where PyTorch has them; misaligned, strided, unbatched and long rows;
torch.compile(fullgraph=True) and CUDA graphs; one backward per fused forward.
"""
import importlib.util
import inspect
import shutil

import pytest
import torch
import torch.nn.functional as F

import losslab.nn
import losslab.nn.functional as LF
from losslab import problems
from losslab.problems.triplet_margin_loss import functional as tml
from losslab.teach.simulator import build as sim_build
from losslab.teach.simulator import cases as sim_cases
from losslab.teach.simulator import run as sim_run

TRIPLET = problems.get("triplet_margin_loss")


def kernel_gradients(a, p, n, margin=1.0, eps=1e-6, swap=False, grad=1.0):
    """The gradients rows.cuh writes, its formula in float64 torch: per row c_ap = g / d(a, p), c_an =
    -g * wa / d(a, n), c_pn = -g * wp / d(p, n) (0 for a zero distance), g = grad where the row's term > 0."""
    u, v, w = a - p + eps, a - n + eps, p - n + eps
    d_ap, d_an, d_pn = (x.norm(dim=1) for x in (u, v, w))
    d_neg = torch.minimum(d_an, d_pn) if swap else d_an
    g = torch.where(margin + d_ap - d_neg > 0, grad, 0.0)
    if swap:
        wa = torch.where(d_an == d_pn, 0.5, (d_an < d_pn).double())
        wp = 1.0 - wa
    else:
        wa, wp = torch.ones_like(g), torch.zeros_like(g)

    def coefficient(num, d):
        return torch.where(d == 0, 0.0, num / torch.where(d == 0, 1.0, d))[:, None]

    c_ap, c_an, c_pn = coefficient(g, d_ap), coefficient(-g * wa, d_an), coefficient(-g * wp, d_pn)
    return c_ap * u + c_an * v, -c_ap * u + c_pn * w, -c_an * v - c_pn * w


def torch_gradients(a, p, n, **options):
    leaves = [x.detach().double().requires_grad_(True) for x in (a, p, n)]
    F.triplet_margin_loss(*leaves, **options).backward()
    return [x.grad for x in leaves]


# --- cpu tier: the definition -----------------------------------------------------------------

def test_reference_is_kernelbench_model_and_pytorch_definition():
    spec = importlib.util.spec_from_file_location("kernelbench_99", TRIPLET.kernelbench_file)
    kernelbench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kernelbench)
    assert kernelbench.get_init_inputs() == [1.0] and (kernelbench.batch_size, *kernelbench.input_shape) == \
        TRIPLET.sizes["seed"]
    a, p, n = TRIPLET.make_inputs((6, 50), seed=0, device="cpu")
    model = kernelbench.Model(*kernelbench.get_init_inputs())
    torch.testing.assert_close(model(a, p, n), TRIPLET.reference(a, p, n))
    by_hand = (1.0 + (a - p + 1e-6).norm(dim=1) - (a - n + 1e-6).norm(dim=1)).clamp_min(0).mean()
    torch.testing.assert_close(TRIPLET.reference(a, p, n), by_hand)
    assert a.max() <= p.max() and a.max() < 1  # the anchor scaled by one draw of torch.rand(())


@pytest.mark.parametrize("swap", [False, True])
def test_kernel_formula_is_pytorch_autograd_including_the_edges(swap):
    gen = torch.Generator().manual_seed(0)
    a, p, n = (torch.rand(64, 33, generator=gen, dtype=torch.float64) for _ in range(3))
    p[:8] = n[:8]            # d(a, p) = d(a, n): the term is exactly the margin
    n[8:16] = a[8:16] + 5.0  # no loss: clamp_min passes nothing
    a[16:20] = p[16:20] - 1e-6  # d(a, p) = 0: norm's backward passes nothing
    p[20:24] = a[20:24]         # swap: d(p, n) = d(a, n), a tie split in half
    for got, expected in zip(kernel_gradients(a, p, n, swap=swap, grad=1 / 64),
                             torch_gradients(a, p, n, swap=swap), strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-15)


def test_clamp_min_passes_no_gradient_at_zero_as_the_kernels_assume():
    x = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    torch.clamp_min(x, 0).backward()
    assert x.grad.item() == 0.0


def test_simulator_reference_is_pytorch():
    for case in sim_cases.triplet_cases():
        a, p, n = (torch.from_numpy(case.row_view(k).copy()).double() for k in range(3))
        ref = sim_cases.triplet_reference(case)
        torch.testing.assert_close(torch.tensor(ref["loss"][0], dtype=torch.float64), F.triplet_margin_loss(a, p, n))
        grad = torch_gradients(a, p, n)[0] * case.grad_loss
        torch.testing.assert_close(torch.from_numpy(ref["grad"]).view_as(grad), grad, rtol=1e-9, atol=1e-12)
    case = sim_cases.triplet_cases()[4]  # the three at different offsets: each view its own
    assert (case.offset_p, case.offset_t, case.offset_n) == (1, 2, 3)
    assert case.row_view(2).shape == (case.B, case.D) and case.row_view(2)[0, 0] == case.t[2 + case.B * case.D + 3]


def test_edge_cases_hold_what_their_names_say():
    cases = TRIPLET.edge_cases("cpu")
    assert TRIPLET.reference(*cases[next(k for k in cases if k.startswith("every input zero"))]) == pytest.approx(1.0)
    assert TRIPLET.reference(*cases[next(k for k in cases if k.startswith("NaN"))]).isnan()
    a, p, n = cases[next(k for k in cases if k.startswith("+inf"))]
    grads = torch_gradients(a, p, n)
    assert grads[0][5, 2].isnan() and grads[0].isnan().sum() == 1 and grads[2][5, 2].isnan()
    far = cases[next(k for k in cases if k.startswith("negatives far"))]
    assert torch_gradients(*far)[0][::2].abs().sum() == 0


def test_structured_inputs_put_most_of_the_loss_in_a_few_rows():
    a, p, n = TRIPLET.structured_inputs((2048, 1024), seed=0, device="cpu")
    rows = F.triplet_margin_loss(a, p, n, reduction="none")
    top = rows.sort(descending=True).values[:2048 // 64].sum()
    assert top > 0.9 * rows.sum()


def test_cost_model_counts_three_inputs_once():
    rows, cols = TRIPLET.sizes["seed"]
    n = rows * cols
    assert TRIPLET.cost((rows, cols), "forward").bytes_read == 3 * n * 4
    assert TRIPLET.cost((rows, cols), "backward").bytes_written == n * 4
    assert TRIPLET.cost((rows, cols), "forward_backward").bytes == 4 * n * 4 + 8
    with pytest.raises(ValueError, match="direction: expected"):
        TRIPLET.cost((rows, cols), "sideways")


def test_condition_follows_the_cancellation_of_the_two_distances():
    a, p, n = (x.double() for x in TRIPLET.make_inputs((64, 8192), seed=0, device="cpu"))
    magnitude, total = TRIPLET.condition_parts(a, p, n)
    assert total == pytest.approx(TRIPLET.reference(a, p, n).item() * 64)
    assert magnitude / total > 20  # distances of about 40 whose difference is about 1


# The operators' row kernel (rows.cuh) as the simulator's custom launchers, float32, at 64 threads and 2 packs
# held a thread (rows of 1000 then read their rest again for the gradient). FORWARD_GRAD: the forward writes
# the gradient (fused's; its backward then scales it), else the forward alone takes rows in turn and the
# backward reads the rows again; WHICH: the gradient written into the driver's buffer (0 anchor, 1 positive,
# 2 negative); SWAP: swap's distance.
ROW_KERNEL = """
#include "common/scale.cuh"
#include "triplet_margin_loss/launchers.h"
#include "triplet_margin_loss/rows.cuh"

constexpr TripletOptions OPTIONS{1.0f, 1e-6f, SWAP, TRIPLET_MEAN};

cudaError_t triplet_margin_loss_custom_forward(const void* a, const void* p, const void* n, float* row_losses,
                                               void* loss, void* grad, int64_t N, int64_t D, DType dtype,
                                               cudaStream_t stream) {
    if (!FORWARD_GRAD)  // the forward alone: rows in turn on the 4 blocks the simulated GPU holds
        return triplet_rows<float, 64, 2, 1>(a, p, n, nullptr, nullptr, nullptr, row_losses, loss, nullptr, nullptr,
                                             0, N, D, OPTIONS, stream);
    return triplet_rows<float, 64, 2>(a, p, n, WHICH == 0 ? grad : nullptr, WHICH == 1 ? grad : nullptr,
                                      WHICH == 2 ? grad : nullptr, row_losses, loss, nullptr, nullptr, 0, N, D,
                                      OPTIONS, stream);
}

cudaError_t triplet_margin_loss_custom_backward(const void* a, const void* p, const void* n, const void* grad_loss,
                                                void* grad, int64_t N, int64_t D, DType dtype, cudaStream_t stream) {
    if (FORWARD_GRAD) return scale_in_place(grad, grad_loss, N * D, dtype, stream);
    return triplet_rows<float, 64, 2>(a, p, n, WHICH == 0 ? grad : nullptr, WHICH == 1 ? grad : nullptr,
                                      WHICH == 2 ? grad : nullptr, nullptr, nullptr, grad_loss, nullptr, 0, N, D,
                                      OPTIONS, stream);
}
"""


@pytest.mark.skipif(shutil.which(sim_build.CXX) is None, reason=f"the CPU simulator needs {sim_build.CXX}")
@pytest.mark.parametrize("forward_grad, which, swap", [(False, 0, False), (True, 0, False), (False, 1, True),
                                                       (True, 2, True)])
def test_operators_row_kernel_matches_float64_on_the_cpu_simulator(forward_grad, which, swap):
    source = f"#define FORWARD_GRAD {int(forward_grad)}\n#define WHICH {which}\n#define SWAP {int(swap)}\n" + ROW_KERNEL
    outcome = sim_run.run(source, TRIPLET.name, label="rows.cuh", order="reverse")
    assert outcome.compiled, outcome.compile_error
    for r in outcome.results:
        assert r.failure is None and (r.forward_status, r.backward_status) == (0, 0), (r.case.name, r.failure)
        inputs = [torch.from_numpy(r.case.row_view(k).copy()).double() for k in range(3)]
        loss = F.triplet_margin_loss(*inputs, swap=swap)
        grad = torch_gradients(*inputs, swap=swap)[which].reshape(-1).numpy() * r.case.grad_loss
        assert r.loss == pytest.approx(loss.item(), rel=1e-6), r.case.name
        assert abs(r.grad - grad).max() <= 1e-6 * abs(grad).max() + 1e-9, r.case.name


# --- cpu tier: the public API -------------------------------------------------------------------

def test_signatures_are_pytorchs():
    for ours, theirs in ((LF.triplet_margin_loss, F.triplet_margin_loss),
                         (losslab.nn.TripletMarginLoss.__init__, torch.nn.TripletMarginLoss.__init__)):
        ours, theirs = inspect.signature(ours).parameters, inspect.signature(theirs).parameters
        assert [(p.name, p.default, p.kind) for p in ours.values()] == \
            [(p.name, p.default, p.kind) for p in theirs.values()]
    assert LF.on_problem(TRIPLET.name).__code__.co_argcount == 3


def test_bad_arguments_raise_one_clear_error():
    a = torch.rand(4, 8)
    cases = [
        (dict(p=1), ValueError, r"p: .*p = 2.* only, got 1"),
        (dict(margin=0.0), ValueError, "margin must be greater than 0, got 0.0"),
        (dict(reduction="batchmean"), ValueError, "batchmean is not a valid value for reduction"),
    ]
    for options, error, message in cases:
        with pytest.raises(error, match=message):
            LF.triplet_margin_loss(a, a, a, **options)
        if "p" not in options:  # PyTorch's own error there: the same kind and message
            with pytest.raises(error, match=message):
                F.triplet_margin_loss(a, a, a, **options)
    inputs = [
        ((a, a, [1.0]), TypeError, "argument 'negative' must be Tensor, not list"),
        ((a, a[0], a), RuntimeError, "same number of dimensions, but got: anchor 2D, positive 1D"),
        ((a, a[:3], a), ValueError, r"positive: expected \(N, D\) or \(D,\) of the anchor's shape \(4, 8\)"),
        ((a, a, a.double()), TypeError, "negative: losslab has kernels for torch.float32"),
        ((a, a, a.half()), TypeError, r"negative: expected the anchor's dtype \(torch.float32\)"),
        ((a[:, :0], a[:, :0], a[:, :0]), ValueError, "anchor: expected a non-empty tensor"),
        ((a, a, a), ValueError, "anchor: losslab's kernels need a CUDA tensor, got a tensor on cpu"),
    ]
    for args, error, message in inputs:
        with pytest.raises(error, match=message):
            LF.triplet_margin_loss(*args)
    with pytest.raises(ValueError, match="TripletMarginLoss: expected margin to be greater than 0, got -1"):
        losslab.nn.TripletMarginLoss(margin=-1)


def test_the_rungs_refuse_a_gradient_they_do_not_give():
    a, p, n = TRIPLET.make_inputs((4, 8), seed=0, device="cpu")
    with pytest.raises(ValueError, match="positive: gradients w.r.t. positive are not supported"):
        TRIPLET.validate(a, p.requires_grad_(True), n)


# --- cpu tier: the operators' plumbing, with stand-in CPU kernels ---------------------------------

def _loss(a, p, n, margin, eps, swap, reduction):
    return F.triplet_margin_loss(a, p, n, margin=margin, eps=eps, swap=swap,
                                 reduction={0: "none", 1: "mean", 2: "sum"}[reduction])


def _stand_in_grads(a, p, n, grad, margin, eps, swap, reduction, needs):
    scale = grad.double() / (a.shape[0] if reduction == 1 else 1)  # 0-d, or (N,) for reduction none
    grads = kernel_gradients(a.double(), p.double(), n.double(), margin, eps, bool(swap), scale)
    return tuple(g.to(a.dtype) if wanted else a.new_empty((0,)) for g, wanted in zip(grads, needs, strict=True))


@pytest.fixture(scope="module")
def cpu_kernels():
    """CPU kernels for the three nn operators: the reference's math in torch."""
    library = torch.library.Library("losslab", "IMPL")
    library.impl("nn_triplet_margin_loss_forward", _loss, "CPU")
    library.impl("nn_triplet_margin_loss_forward_grad", lambda a, p, n, m, e, s, r, *needs: (
        _loss(a, p, n, m, e, s, r), *_stand_in_grads(a, p, n, torch.tensor(1.0), m, e, s, r, needs)), "CPU")
    library.impl("nn_triplet_margin_loss_backward", lambda a, p, n, g, m, e, s, r, *needs: _stand_in_grads(
        a, p, n, g, m, e, s, r, needs), "CPU")
    yield
    library._destroy()


@pytest.mark.parametrize("fused", [False, True])
def test_operators_give_each_input_its_gradient_and_compile(cpu_kernels, fused):
    torch._dynamo.reset()
    a, p, n = TRIPLET.make_inputs((6, 40), seed=0, device="cpu")
    options = (1.5, 1e-6, True, 1)

    def loss_fn(x, y, z):
        if fused:
            return tml.forward_grad(x, y, z, *options, x.requires_grad, y.requires_grad, z.requires_grad)[0] * 3.0
        return tml.forward(x, y, z, *options) * 3.0

    compiled = torch.compile(loss_fn, fullgraph=True, backend="aot_eager")
    leaves = [a.clone().requires_grad_(True), p.clone(), n.clone().requires_grad_(True)]
    compiled(*leaves).backward()
    expected = [x.double().requires_grad_(True) for x in (a, p, n)]
    (F.triplet_margin_loss(*expected, margin=1.5, swap=True) * 3.0).backward()
    assert leaves[1].grad is None
    for got, want in ((leaves[0].grad, expected[0].grad), (leaves[2].grad, expected[2].grad)):
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-7)
    torch.library.opcheck(tml.forward, (a.clone().requires_grad_(True), p, n, *options))
    torch.library.opcheck(tml.backward, (a, p, n, torch.tensor(0.5), *options, True, False, True))


# --- gpu tier -------------------------------------------------------------------------------------

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def assert_matches_float64(got, expected, dtype, what):
    """Within the README's tolerances: float32 1e-5 (loss) and 1e-5 relative norm here for three
    gradients; 16-bit: the dtype's eps, plus the float64 value's own rounding to the dtype."""
    expected = expected.double()
    assert torch.equal(got.isnan(), expected.isnan()), f"{what}: NaN where PyTorch has none, or none where it has"
    got, expected = got.double().nan_to_num(), expected.nan_to_num()
    rounding = (expected.to(dtype).double() - expected).norm()
    scale = expected.norm() if expected.norm() > 0 else 1.0  # a zero result: the absolute norm, as the checks
    tolerance = (1e-5 if dtype is torch.float32 else 4 * torch.finfo(dtype).eps) * scale + rounding
    assert (got - expected).norm() <= tolerance, f"{what}: off by {(got - expected).norm():.3e}"


def gpu_case(shape, dtype, seed=0):
    return [x.to(dtype) for x in TRIPLET.make_inputs(shape, seed=seed)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("swap", [False, True])
@pytest.mark.parametrize("margin, eps", [(1.0, 1e-6), (40.0, 1e-3)])
def test_options_and_all_three_gradients_match_pytorch_in_float64(dtype, reduction, swap, margin, eps):
    inputs = gpu_case((257, 4099), dtype)
    inputs[1][:9] = inputs[0][:9]  # swap's tie: d(p, n) = d(a, n) on those rows
    options = dict(margin=margin, eps=eps, swap=swap, reduction=reduction)
    leaves = [x.clone().requires_grad_(True) for x in inputs]
    loss = LF.triplet_margin_loss(*leaves, **options)
    upstream = torch.rand(loss.shape, device="cuda", dtype=dtype) + 0.5
    (loss * upstream).sum().backward()
    expected = [x.double().requires_grad_(True) for x in inputs]
    reference = F.triplet_margin_loss(*expected, **options)
    (reference * upstream.double()).sum().backward()
    assert loss.dtype == dtype and loss.shape == reference.shape
    assert_matches_float64(loss, reference.detach(), dtype, "loss")
    for name, leaf, want in zip(TRIPLET.input_names, leaves, expected, strict=True):
        assert_matches_float64(leaf.grad, want.grad, dtype, f"dL/d{name}")


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(TRIPLET.edge_cases("cpu")))
@pytest.mark.parametrize("fused", [False, True])
def test_edge_cases_match_pytorch_nan_and_inf_included(name, fused):
    inputs = TRIPLET.edge_cases("cuda")[name]
    leaves = [x.clone().requires_grad_(True) for x in inputs]
    if fused:
        LF.triplet_margin_loss(*leaves).backward()
    else:
        LF.triplet_margin_loss(*leaves, reduction="none").sum().backward()
    expected = [x.detach().double().requires_grad_(True) for x in inputs]
    reference = F.triplet_margin_loss(*expected, reduction="mean" if fused else "none")
    (reference if fused else reference.sum()).backward()
    for leaf, want in zip(leaves, expected, strict=True):
        assert_matches_float64(leaf.grad, want.grad, torch.float32, name)


@pytest.mark.gpu
def test_unbatched_long_rows_and_inference():
    a, p, n = gpu_case((3, 40000), torch.float32)  # longer than THREADS * CACHE packs: read again for the gradient
    leaves = [x.clone().requires_grad_(True) for x in (a, p, n)]
    LF.triplet_margin_loss(*leaves, margin=100.0).backward()
    for leaf, want in zip(leaves, torch_gradients(a, p, n, margin=100.0), strict=True):
        assert_matches_float64(leaf.grad, want, torch.float32, "long rows")
    with torch.no_grad():
        one = LF.triplet_margin_loss(a[0], p[0], n[0], reduction="none")
    assert one.shape == () and one.item() == pytest.approx(F.triplet_margin_loss(a[0], p[0], n[0]).item(), rel=1e-5)
    module = losslab.nn.TripletMarginLoss(margin=2.0, swap=True, reduction="sum")
    torch.testing.assert_close(module(a, p, n), torch.nn.TripletMarginLoss(margin=2.0, swap=True, reduction="sum")(
        a, p, n), rtol=1e-5, atol=0)


@pytest.mark.gpu
def test_compile_graphs_and_one_backward_per_fused_forward():
    torch._dynamo.reset()
    a, p, n = gpu_case((65, 1001), torch.float32)
    compiled = torch.compile(lambda x, y, z: LF.triplet_margin_loss(x, y, z, swap=True) * 2.0, fullgraph=True)
    leaves = [x.clone().requires_grad_(True) for x in (a, p, n)]
    compiled(*leaves).backward()
    for leaf, want in zip(leaves, torch_gradients(a, p, n, swap=True), strict=True):
        assert_matches_float64(leaf.grad, want * 2.0, torch.float32, "compiled")
    static = [x.clone().requires_grad_(True) for x in (a, p, n)]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            LF.triplet_margin_loss(*static).backward()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    for x in static:
        x.grad = None
    with torch.cuda.graph(graph):
        loss = LF.triplet_margin_loss(*static)
        loss.backward()
    fresh = gpu_case((65, 1001), torch.float32, seed=1)
    with torch.no_grad():
        for x, f in zip(static, fresh, strict=True):
            x.copy_(f)
    graph.replay()
    torch.cuda.synchronize()
    assert_matches_float64(loss, F.triplet_margin_loss(*(x.double() for x in fresh)), torch.float32, "graph")
    for x, want in zip(static, torch_gradients(*fresh), strict=True):
        assert_matches_float64(x.grad, want, torch.float32, "graph gradient")
    retained = LF.triplet_margin_loss(*[x.detach().clone().requires_grad_(True) for x in (a, p, n)])
    retained.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="backward can run once per forward"):
        retained.backward()


@pytest.mark.gpu
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_eager_calls_reach_the_kernels_without_the_dispatcher(monkeypatch, reduction):
    """Not traced, a call (inference, and forward and backward: fused for mean, vectorized's
    backward for none) calls no torch.library operator, each a round trip into Python; the
    gradients still match float64, and the fused backward still runs once per forward."""
    for name in ("forward", "forward_grad", "backward"):
        monkeypatch.setattr(tml, name, lambda *args, name=name: pytest.fail(f"eager mode called the operator {name}"))
    a, p, n = gpu_case((64, 300), torch.float32)
    leaves = [a.clone().requires_grad_(True), p.clone(), n.clone().requires_grad_(True)]
    with torch.no_grad():
        LF.triplet_margin_loss(a, p, n, reduction=reduction)
    loss = LF.triplet_margin_loss(*leaves, swap=True, reduction=reduction)
    loss.backward(torch.ones_like(loss), retain_graph=True)
    expected = [x.double().requires_grad_(True) for x in (a, p, n)]
    ref = F.triplet_margin_loss(*expected, swap=True, reduction=reduction)
    ref.backward(torch.ones_like(ref))
    assert leaves[1].grad is None
    for got, want in ((leaves[0].grad, expected[0].grad), (leaves[2].grad, expected[2].grad)):
        assert_matches_float64(got, want, torch.float32, "gradient")
    if reduction == "mean":
        with pytest.raises(RuntimeError, match="backward can run once per forward"):
            loss.backward()
