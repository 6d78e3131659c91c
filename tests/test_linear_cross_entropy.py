"""losslab.linear_cross_entropy: the cpu tier checks the chunked algorithm (the CPU path of the same
driver) against PyTorch's F.linear_cross_entropy / F.cross_entropy(F.linear(...)) in float64, every
option and bad argument; the compile tier the kernel's machine code; the gpu tier the CUDA kernel
against float64, bfloat16 on the real heads against eager, and torch.compile."""
from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F

from losslab.linear_cross_entropy import LinearCrossEntropyLoss, Options, linear_cross_entropy
from losslab.linear_cross_entropy import build as lce_build
from losslab.linear_cross_entropy.options import MiB, as_options, chunk_rows

N, H, V = 37, 16, 29  # N not divisible by the chunk, V no multiple of 8
CHUNK = Options(chunk_rows=8)
CASES = {  # name -> keyword arguments of both functions (softcap handled by the reference below)
    "plain": {},
    "bias": {"linear_bias": True},
    "weight": {"weight": True},
    "smoothing": {"label_smoothing": 0.15},
    "weight+smoothing+bias": {"weight": True, "label_smoothing": 0.3, "linear_bias": True},
    "ignore_index": {"ignore_index": 3},
    "softcap": {"softcap": 2.5},
    "softcap+smoothing+weight": {"softcap": 1.5, "label_smoothing": 0.1, "weight": True},
}


def make(dtype=torch.float64, device="cpu", n=N, h=H, v=V, seed=0):
    """Seeded (input, linear_weight, target), drawn on ``device`` (the heads are GiBs), every 7th target ignored."""
    g = torch.Generator(device=device).manual_seed(seed)
    drawn = torch.float64 if dtype == torch.float64 else torch.float32
    x = torch.randn(n, h, generator=g, dtype=drawn, device=device).to(dtype).requires_grad_()
    w = (torch.randn(v, h, generator=g, dtype=drawn, device=device) / h**0.5).to(dtype).requires_grad_()
    t = torch.randint(0, v, (n,), generator=g, device=device)
    t[::7] = -100
    return x, w, t


def resolve(case, x, v, device="cpu"):
    """The case's keyword arguments with tensors for linear_bias and weight."""
    kwargs = dict(CASES[case])
    g = torch.Generator().manual_seed(1)
    if kwargs.get("linear_bias"):
        kwargs["linear_bias"] = torch.randn(v, generator=g, dtype=torch.float64).to(device, x.dtype).requires_grad_()
    if kwargs.get("weight"):
        kwargs["weight"] = (torch.rand(v, generator=g, dtype=torch.float64) + 0.5).to(device, x.dtype)
    return kwargs


def reference(x, w, t, *, linear_bias=None, softcap=None, **kwargs):
    """F.cross_entropy(F.linear(...)) (torch's F.linear_cross_entropy has no softcap)."""
    logits = F.linear(x, w, linear_bias)
    if softcap:
        logits = softcap * torch.tanh(logits / softcap)
    return F.cross_entropy(logits, t, **kwargs)


def values_and_grads(fn, x, w, t, kwargs, reduction, unit=False):
    """The loss and the gradients of (x, w[, linear_bias]) for a seeded random grad_output (1 with ``unit``:
    a bfloat16 loss would round a random one, and losses of different dtypes would scale differently)."""
    loss = fn(x, w, t, reduction=reduction, **kwargs)
    leaves = [x, w] + ([kwargs["linear_bias"]] if kwargs.get("linear_bias") is not None else [])
    seed = torch.Generator().manual_seed(2)
    grad_out = torch.randn(loss.shape, generator=seed, dtype=torch.float64).to(loss.device, loss.dtype)
    if unit:
        grad_out = torch.ones_like(loss)
    return loss.detach(), torch.autograd.grad(loss, leaves, grad_out)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("case", list(CASES))
def test_matches_pytorch_in_float64(case, reduction):
    x, w, t = make()
    if case == "ignore_index":  # -100 is then a class index out of range
        t[(t == -100) | (torch.arange(len(t), device=t.device) % 5 == 1)] = 3
    kwargs = resolve(case, x, V)
    loss, grads = values_and_grads(lambda *a, **k: linear_cross_entropy(*a, options=CHUNK, **k), x, w, t, kwargs,
                                   reduction)
    ref_loss, ref_grads = values_and_grads(reference, x, w, t, kwargs, reduction)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-12, atol=1e-12)
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_pytorch_2_13_function_agrees_with_its_reference_here():
    """The reference above is torch's F.linear_cross_entropy where it has no softcap."""
    if not hasattr(F, "linear_cross_entropy"):
        pytest.skip(f"torch {torch.__version__} has no F.linear_cross_entropy (from 2.13)")
    x, w, t = make()
    kwargs = resolve("weight+smoothing+bias", x, V)
    torch.testing.assert_close(linear_cross_entropy(x, w, t, options=CHUNK, **kwargs),
                               F.linear_cross_entropy(x, w, t, **kwargs), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("chunk", [1, 8, 36, 37, 1000])
def test_every_chunk_size_gives_the_same_loss_and_gradients(chunk):
    x, w, t = make()
    loss, grads = values_and_grads(lambda *a, **k: linear_cross_entropy(*a, options=Options(chunk_rows=chunk), **k),
                                   x, w, t, {}, "mean")
    ref_loss, ref_grads = values_and_grads(reference, x, w, t, {}, "mean")
    torch.testing.assert_close(loss, ref_loss, rtol=1e-12, atol=1e-12)
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_leading_dimensions_and_a_single_token():
    x, w, t = make(n=12)
    x3, t3 = x.detach().reshape(3, 4, H), t.reshape(3, 4)
    got = linear_cross_entropy(x3, w, t3, reduction="none", options=CHUNK)
    assert got.shape == (3, 4)
    torch.testing.assert_close(got.reshape(-1), reference(x, w, t, reduction="none"))
    one = linear_cross_entropy(x[0], w, t[0].clone().fill_(4))
    assert one.shape == ()
    torch.testing.assert_close(one, reference(x[0], w, torch.tensor(4)))


def test_every_target_ignored_gives_nan_and_zero_gradients_as_pytorch():
    x, w, t = make()
    t.fill_(-100)
    loss = linear_cross_entropy(x, w, t, options=CHUNK)
    loss.backward()
    assert torch.isnan(loss) and torch.isnan(reference(x, w, t))
    assert not x.grad.any() and not w.grad.any()


def test_ignore_index_none_means_minus_100():
    x, w, t = make()
    torch.testing.assert_close(linear_cross_entropy(x, w, t, ignore_index=None), reference(x, w, t))


def test_float32_and_bfloat16_follow_float64():
    x, w, t = make()
    want = reference(x, w, t)
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
        got = linear_cross_entropy(x.detach().to(dtype), w.detach().to(dtype), t, options=CHUNK)
        assert got.dtype == dtype
        torch.testing.assert_close(got.double(), want.detach(), rtol=tol, atol=tol)


def test_inference_runs_without_gradients_and_module_matches():
    x, w, t = make()
    with torch.no_grad():
        plain = linear_cross_entropy(x, w, t, label_smoothing=0.2, softcap=4.0)
    module = LinearCrossEntropyLoss(label_smoothing=0.2, softcap=4.0)
    torch.testing.assert_close(module(x, w, t).detach(), plain)
    assert plain.grad_fn is None


def test_a_second_backward_through_one_eager_forward_raises():
    x, w, t = make()
    loss = linear_cross_entropy(x, w, t)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="once per forward"):
        loss.backward()


def test_reduction_none_backward_recomputes_and_allows_retain_graph():
    x, w, t = make()
    loss = linear_cross_entropy(x, w, t, reduction="none", options=CHUNK).sum()
    loss.backward(retain_graph=True)
    first = x.grad.clone()
    loss.backward()
    torch.testing.assert_close(x.grad, 2 * first)


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_torch_compile_fullgraph_traces_the_operators(reduction):
    x, w, t = make()
    compiled = torch.compile(lambda x, w, t: linear_cross_entropy(x, w, t, reduction=reduction, softcap=3.0,
                                                                  options=CHUNK), fullgraph=True, backend="aot_eager")
    loss, grads = values_and_grads(lambda x, w, t, reduction: compiled(x, w, t), x, w, t, {}, reduction)
    ref_loss, ref_grads = values_and_grads(reference, x, w, t, {"softcap": 3.0}, reduction)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-12, atol=1e-12)
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def bad_calls():
    x, w, t = make()
    d = x.detach()
    return [
        ((d, w, t), {"reduction": "batchmean"}, ValueError, "reduction"),
        ((d, w, t), {"label_smoothing": 1.5}, ValueError, "label_smoothing"),
        ((d, w, t), {"label_smoothing": "0.1"}, ValueError, "label_smoothing"),
        ((d, w, t), {"softcap": 0.0}, ValueError, "softcap"),
        ((d, w, t), {"softcap": float("inf")}, ValueError, "softcap"),
        ((d, w, t), {"ignore_index": 1.5}, TypeError, "ignore_index"),
        ((d.int(), w, t), {}, TypeError, "input"),
        ((d[:0], w, t[:0]), {}, ValueError, "input"),
        ((d, w[:, :-1], t), {}, ValueError, "linear_weight"),
        ((d, w.float(), t), {}, TypeError, "linear_weight"),
        ((d, w, t.int()), {}, TypeError, "target"),
        ((d, w, t.double()), {}, TypeError, "target"),
        ((d, w, t[:-1]), {}, ValueError, "target"),
        ((d, w, t.clone().fill_(V)), {}, ValueError, "target: class index 29"),
        ((d, w, t.clone().fill_(-3)), {}, ValueError, "target: class index -3"),
        ((d, w, t), {"linear_bias": torch.zeros(V + 1, dtype=torch.float64)}, ValueError, "linear_bias"),
        ((d, w, t), {"weight": torch.ones(V)}, TypeError, "weight"),
        ((d, w, t), {"weight": torch.ones(V, dtype=torch.float64, requires_grad=True)}, NotImplementedError,
         "weight"),
        ((d, w, t.to("meta")), {}, ValueError, "target: expected a tensor on cpu"),
        ((d, w, t), {"options": {"chunk_rows": 4}}, TypeError, "options"),
        ((d, "w", t), {}, TypeError, "linear_weight"),
    ]


@pytest.mark.parametrize("index", range(len(bad_calls())))
def test_bad_arguments_raise_one_error_naming_the_argument(index):
    args, kwargs, error, text = bad_calls()[index]
    with pytest.raises(error, match=text):
        linear_cross_entropy(*args, **kwargs)


def test_options_chunk_sizes():
    assert chunk_rows(Options(chunk_rows=100), 37, H, V, 8) == 37
    assert chunk_rows(Options(chunk_rows=5), 37, H, V, 8) == 5
    assert chunk_rows(Options(chunk_bytes=100 * V * 2), 1000, H, V, 2) == 64  # 100 rows, a multiple of 64
    # Llama-3-8B's head in bfloat16: 256 MiB less the input's gradient (64 MiB) and 32 MiB, in 64-row tiles
    rows = chunk_rows(Options(), 8192, 4096, 128256, 2)
    assert rows % 64 == 0 and rows * 128256 * 2 <= 160 * MiB < (rows + 64) * 128256 * 2
    assert chunk_rows(Options(), 10**6, 8192, 1000, 2) == 64 * MiB // 2000 // 64 * 64  # at least 64 MiB
    with pytest.raises(ValueError, match="chunk_rows"):
        Options(chunk_rows=0)
    if hasattr(torch.nn, "LinearCrossEntropyOptions"):
        assert as_options(torch.nn.LinearCrossEntropyOptions(batch_chunk_size=7, chunking_method=None)) \
            == Options(chunk_rows=7)


# --- compile tier: the kernel's machine code --------------------------------------------------------------------

@pytest.mark.compile
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_kernel_compiles_without_spills(tmp_path, arch):
    from losslab.build import compile_cubin, resource_usage

    _, report = compile_cubin(lce_build.FOLDER / "rows.cu", arch, tmp_path)
    kernels = resource_usage(report, arch)
    assert len(kernels) == 3  # float32, bfloat16, float16
    for k in kernels:
        assert k.spill_store_bytes == k.spill_load_bytes == k.stack_bytes == 0, k


@pytest.mark.compile
def test_extension_builds_and_imports():
    assert callable(lce_build.load().rows)


# --- gpu tier ------------------------------------------------------------------------------------------------

GPU_DTYPES = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (2e-2, 2e-2), torch.float16: (5e-3, 5e-3)}


@pytest.mark.gpu
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dtype", list(GPU_DTYPES), ids=str)
def test_gpu_matches_float64(dtype, case, reduction):
    """The kernel and the chunking on the GPU against PyTorch in float64 on the same (rounded) inputs."""
    n, h, v = 300, 64, 1003
    x, w, t = make(dtype, "cuda", n, h, v)
    if case == "ignore_index":  # -100 is then a class index out of range
        t[(t == -100) | (torch.arange(len(t), device=t.device) % 5 == 1)] = 3
    kwargs = resolve(case, x, v, "cuda")
    wide = {k: (val.detach().double().requires_grad_(val.requires_grad) if torch.is_tensor(val) else val)
            for k, val in kwargs.items()}
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    ref_loss, ref_grads = values_and_grads(reference, x64, w64, t, wide, reduction)
    loss, grads = values_and_grads(lambda *a, **k: linear_cross_entropy(*a, options=Options(chunk_rows=128), **k),
                                   x, w, t, kwargs, reduction)
    rtol, atol = GPU_DTYPES[dtype]
    torch.testing.assert_close(loss.double(), ref_loss, rtol=rtol, atol=atol)
    for got, want in zip(grads, ref_grads, strict=True):
        error = (got.double() - want).norm() / want.norm()
        assert error < rtol, f"{dtype} {case} {reduction}: gradient relative error {error:.2e}"


HEADS = {"llama-3-8b": (8192, 4096, 128256), "gemma-2-2b": (8192, 2304, 256000)}


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm())


@pytest.mark.gpu
@pytest.mark.parametrize("head", list(HEADS))
def test_gpu_bfloat16_heads_against_eager_and_float32(head):
    """The issue's accuracy goal, each gradient within 2e-3 (relative L2) of eager PyTorch (logits upcast to
    float32, as the benchmark's eager) on the same bfloat16 inputs, with the float32 weight-gradient
    accumulator; the default, which rounds the weight's gradient to bfloat16 once per chunk (about a dozen
    chunks here) to stay within the memory goal, within 1e-2 (the record has its number). The input's
    gradient (one GEMM per chunk, no accumulation) meets 2e-3 either way, and no gradient is further from
    the float32 computation on the same inputs than twice eager's own error, with the accumulator."""
    from losslab.linear_cross_entropy.peers import eager as eager_head

    n, h, v = HEADS[head]
    x, w, t = make(torch.bfloat16, "cuda", n, h, v)
    eager_loss, eager = values_and_grads(lambda x, w, t, reduction: eager_head(x, w, t), x, w, t, {}, "mean", True)
    x32, w32 = x.detach().float().requires_grad_(), w.detach().float().requires_grad_()
    _, exact = values_and_grads(reference, x32, w32, t, {}, "mean", True)
    del x32, w32
    for wide, weight_limit in ((True, 2e-3), (False, 1e-2)):
        head_fn = functools.partial(linear_cross_entropy, options=Options(float32_grad_weight=wide))
        loss, ours = values_and_grads(head_fn, x, w, t, {}, "mean", True)
        torch.testing.assert_close(loss.float(), eager_loss.float(), rtol=1e-2, atol=1e-2)
        for name, got, want, truth, limit in zip(("input", "linear_weight"), ours, eager, exact, (2e-3, weight_limit),
                                                 strict=True):
            error = relative_error(got, want)
            assert error <= limit, f"{head} {name} (float32 accumulator: {wide}): {error:.2e} from eager"
            if wide:
                assert relative_error(got, truth) <= 2 * relative_error(want, truth), name


@pytest.mark.gpu
def test_gpu_torch_compile_fullgraph_matches_eager():
    x, w, t = make(torch.bfloat16, "cuda", 300, 64, 1003)

    def head(x, w, t):
        return linear_cross_entropy(x, w, t, label_smoothing=0.1, options=Options(chunk_rows=128))

    eager_loss, eager = values_and_grads(lambda x, w, t, reduction: head(x, w, t), x, w, t, {}, "mean")
    compiled = torch.compile(head, fullgraph=True)
    loss, grads = values_and_grads(lambda x, w, t, reduction: compiled(x, w, t), x, w, t, {}, "mean")
    torch.testing.assert_close(loss, eager_loss)
    for got, want in zip(grads, eager, strict=True):
        torch.testing.assert_close(got, want)


@pytest.mark.gpu
def test_gpu_out_of_range_target_is_an_error_not_an_assert():
    x, w, t = make(torch.bfloat16, "cuda", 64, 32, 100)
    t[5] = 100
    with pytest.raises(ValueError, match="target: class index 100 at row 5"):
        linear_cross_entropy(x, w, t)
    torch.cuda.synchronize()  # the device is still usable


# --- the benchmark's records (cpu tier: made-up round numbers, written to tmp_path only) -------------------------

def fake_record(time_ms=40.0, extra_gib=1.2):
    from losslab.linear_cross_entropy import results

    peer = {"median_ms": 50.0, "p10_ms": 49.0, "p90_ms": 51.0, "extra_bytes": 3 * 2**30,
            "input_grad_error": 1e-3, "weight_grad_error": 1e-3}
    ours = dict(peer, median_ms=time_ms, extra_bytes=int(extra_gib * 2**30))
    floor = 36.0
    limit = 128 * 4 * 2**20 * 2 + results.EXTRA_BYTES_OVER_FLOOR
    head = {"name": "llama-3-8b", "label": "Llama-3-8B", "tokens": 8192, "hidden": 4096, "vocab": 128256,
            "dtype": "bfloat16", "chunk_rows": 640,
            "peers": {"gemms": {"median_ms": floor, "p10_ms": floor, "p90_ms": floor, "extra_bytes": None},
                      "eager": peer, "losslab": ours},
            "goals": {"time_ratio": time_ms / floor, "time_met": time_ms <= 1.1 * floor,
                      "extra_bytes": ours["extra_bytes"], "memory_limit_bytes": limit,
                      "memory_met": ours["extra_bytes"] <= limit, "input_grad_error": 1e-3,
                      "weight_grad_error": 1e-3, "grad_errors_met": True}}
    return {"schema": results.SCHEMA, "device": "NVIDIA H100 80GB HBM3", "torch": "2.11", "cuda": "13.0",
            "date": "2026-11-26T00:00:00+00:00", "repeats": 10, "missing": {}, "heads": [head]}


def test_record_round_trip_table_and_goal_lines(tmp_path):
    from losslab.linear_cross_entropy import results
    from losslab.records.files import write_json

    record = fake_record(time_ms=45.0)
    path = results.record_path(record["device"], tmp_path)
    assert path.name == "nvidia-h100-80gb-hbm3.json"
    write_json(path, record)
    (loaded,) = results.load_records(tmp_path)
    table = results.table(loaded).splitlines()
    assert table[0].endswith("| eager | losslab |") and "3 cuBLAS GEMMs alone" in table[0]
    assert "| 36.0 ms | 50.0 ms / 3.00 GiB | 45.0 ms / 1.20 GiB |" in table[2]
    (goals,) = results.goal_lines(loaded)
    assert "time 1.250x the GEMMs (goal 1.1x: MISSED)" in goals and "GiB (met)" in goals
    assert results.goal_lines(fake_record(time_ms=38.0, extra_gib=2.0))[0].count("MISSED") == 1


def test_a_file_that_is_no_record_is_one_line_naming_it(tmp_path):
    from losslab.linear_cross_entropy import results
    from losslab.records.files import RecordError

    (tmp_path / "x.json").write_text('{"schema": 2}')
    with pytest.raises(RecordError, match="x.json: not a linear cross-entropy record"):
        results.load_records(tmp_path)
    assert results.load_records(tmp_path / "none") == []


def test_bench_arguments_are_checked_before_any_gpu_work(capsys):
    from losslab.linear_cross_entropy import bench

    with pytest.raises(SystemExit) as stop:
        bench.parse(["--heads", "llama-3-8b,nope"])
    assert stop.value.code == 2 and "--heads: expected some of" in capsys.readouterr().err
    assert bench.parse(["--heads", "small,huge"]).heads == ["small", "huge"]


# --- the CUDA kernel itself, on the CPU simulator (cpu tier: g++ with AddressSanitizer and UBSan) ---------------

SIM_DTYPES = {0: torch.float32, 1: torch.bfloat16, 2: torch.float16}  # kernels/common/dtype.h's codes


@pytest.fixture(scope="module")
def simulated_rows(tmp_path_factory):
    """The kernel (kernels/linear_cross_entropy/rows.cu, launches rewritten for the simulator) linked with
    the simulator and tests/helpers/linear_cross_entropy_driver.cpp: the path of the executable."""
    import shutil
    import subprocess
    from pathlib import Path

    from losslab.teach.simulator import build as sim

    if shutil.which(sim.CXX) is None:
        pytest.skip(f"the CPU simulator needs {sim.CXX}")
    out = tmp_path_factory.mktemp("simulated_rows")
    (out / "rows.cu").write_text(sim.rewrite((lce_build.FOLDER / "rows.cu").read_text()))
    driver = Path(__file__).parent / "helpers" / "linear_cross_entropy_driver.cpp"
    include = ["-I", str(sim.HERE / "include"), "-I", str(sim.HERE), "-I", str(sim.KERNELS)]
    cuda = ["-x", "c++", "-include", str(sim.HERE / "cuda_sim.h")]
    objects = []
    for source, as_cuda in ((out / "rows.cu", True), (driver, True), (sim.HERE / "cuda_sim.cpp", False)):
        objects.append(out / f"{source.stem}.o")
        subprocess.run([sim.CXX, *(cuda if as_cuda else []), *sim.FLAGS, *include, "-c", str(source), "-o",
                        str(objects[-1])], check=True, capture_output=True)
    subprocess.run([sim.CXX, *sim.FLAGS, *map(str, objects), "-o", str(out / "driver")], check=True,
                   capture_output=True)
    return out / "driver"


SIM_CASES = [  # (dtype code, V, label_smoothing, softcap, class weights, mean, write_grad, row scale)
    (0, 1003, 0.0, 0.0, False, True, True, False),
    (0, 2056, 0.1, 0.0, True, False, True, True),
    (1, 1003, 0.2, 4.0, False, True, True, False),
    (1, 2056, 0.0, 2.0, True, False, True, True),
    (2, 1003, 0.1, 0.0, True, True, True, False),
    (2, 2056, 0.0, 0.0, False, False, False, False),
    (1, 13, 0.1, 3.0, True, True, True, True),  # rows shorter than a pack past their head
]


@pytest.mark.parametrize("case", SIM_CASES, ids=[f"{SIM_DTYPES[c[0]]}-V{c[1]}-{i}" for i, c in enumerate(SIM_CASES)])
def test_the_cuda_kernel_matches_its_cpu_twin_on_the_simulator(simulated_rows, tmp_path, case):
    """rows.cu run by the simulator against kernels.rows's torch path (what the cpu tier checks against
    PyTorch): losses (NaN for a class index out of range, 0 where ignored) and the gradient written in place."""
    import subprocess

    import numpy as np

    from losslab.linear_cross_entropy.chunked import stats
    from losslab.linear_cross_entropy.kernels import rows

    code, vocab, smoothing, softcap, weighted, mean, write_grad, scaled = case
    dtype, count, ignore = SIM_DTYPES[code], 5, 7
    g = torch.Generator().manual_seed(code * 10 + vocab)
    logits = (torch.randn(count, vocab, generator=g) * 3).to(dtype)
    target = torch.randint(0, vocab, (count,), generator=g)
    target[1], target[3] = ignore, vocab + 5  # one row ignored, one out of range
    weight = torch.rand(vocab, generator=g) + 0.5 if weighted else None
    row_stats = stats(torch.where(target < vocab, target, ignore), weight, vocab, ignore, torch.float32)
    scale = torch.randn(count, generator=g) if scaled else None
    parts = [logits.view(torch.int32 if code == 0 else torch.int16), target, weight, row_stats, scale]
    (tmp_path / "in.bin").write_bytes(b"".join(p.numpy().tobytes() for p in parts if p is not None))
    subprocess.run([str(simulated_rows), *map(str, (count, vocab, code, ignore, smoothing, softcap, int(mean),
                    int(write_grad), int(weighted), int(scaled))), str(tmp_path / "in.bin"), str(tmp_path)],
                   check=True, capture_output=True, timeout=120)
    losses = torch.from_numpy(np.fromfile(tmp_path / "losses.bin", dtype=np.float32))
    raw = np.fromfile(tmp_path / "logits.bin", dtype=np.int32 if code == 0 else np.int16)
    after = torch.from_numpy(raw).view(dtype).reshape(count, vocab)
    want, want_losses = logits.clone(), torch.empty(count)
    rows(want, target, weight, row_stats, scale, want_losses, ignore_index=ignore, label_smoothing=smoothing,
         softcap=softcap, mean=mean, write_grad=write_grad)
    assert torch.isnan(losses[3]) and losses[1] == 0
    torch.testing.assert_close(losses, want_losses, rtol=1e-5, atol=1e-5, equal_nan=True)
    tolerance = {0: 1e-5, 1: 1e-2, 2: 1e-3}[code]
    torch.testing.assert_close(after.float(), want.float(), rtol=tolerance, atol=tolerance * 1e-2, equal_nan=True)


def test_unchecked_targets_make_their_rows_nan_without_an_error():
    x, w, t = make()
    t[4] = V + 3
    unchecked = Options(check_targets=False)
    losses = linear_cross_entropy(x, w, t, reduction="none", weight=torch.ones(V, dtype=torch.float64),
                                  options=unchecked)
    assert torch.isnan(losses[4]) and not torch.isnan(losses[:4]).any()
    assert torch.isnan(linear_cross_entropy(x, w, t, options=unchecked))
    with pytest.raises(ValueError, match="check_targets"):
        Options(check_targets=1)


def test_a_float32_weight_gradient_accumulator_rounds_once():
    x, w, t = make(torch.bfloat16, n=64)
    wide64 = [x.detach().double().requires_grad_(), w.detach().double().requires_grad_()]
    _, truth = values_and_grads(reference, *wide64, t, {}, "sum", True)
    low = [x, w]
    errors = {}
    for wide in (False, True):
        options = Options(chunk_rows=4, float32_grad_weight=wide)
        _, (_, grad_weight) = values_and_grads(functools.partial(linear_cross_entropy, options=options),
                                               *low, t, {}, "sum", True)
        assert grad_weight.dtype == torch.bfloat16
        errors[wide] = float((grad_weight.double() - truth[1]).norm() / truth[1].norm())
    assert errors[True] < errors[False] / 1.5, errors
