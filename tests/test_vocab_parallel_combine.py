"""losslab.distributed.kernels.combine: every rank's per-row statistics into the row's loss.

cpu tier: the operator on CPU in float64, fed by ``statistics`` of W slices of full logits (even,
uneven, ignored and out-of-range targets, label smoothing, a slice of -inf logits), against
F.cross_entropy and torch.logsumexp on the full logits and equal to losslab.distributed.algebra's
result; its fake shapes; torch.library.opcheck; one-line errors. compile tier: the kernels build
and combine.cu's sm_90 SASS has no spills. gpu tier: the CUDA kernel against the CPU operator in
float64 on random tuples (W 2 and 8, N 8192 and 3) with ignored, out-of-range and -FLT_MAX rows.
"""
import pytest
import torch
import torch.nn.functional as F

from losslab import build
from losslab.distributed import algebra
from losslab.distributed import kernels as K

IGNORE = -100
FLT_MAX = torch.finfo(torch.float32).max


def gathered_statistics(full, target, widths):
    """[W, N, 4]: ``statistics`` of each slice of ``full`` [N, sum(widths)], stacked as the
    all-gather stacks them."""
    starts = [sum(widths[:r]) for r in range(len(widths))]
    slices = zip(starts, widths, strict=True)
    return torch.stack([K.statistics(full[:, s:s + w].contiguous(), target, s) for s, w in slices])


def norm_relative(got, want) -> float:
    """||got - want|| / ||want|| over the entries where ``want`` is finite, which must be those
    where ``got`` is; the others equal (inf to inf, NaN to NaN)."""
    finite = want.isfinite()
    assert torch.equal(finite, got.isfinite())
    torch.testing.assert_close(got[~finite], want[~finite], rtol=0, atol=0, equal_nan=True)
    return float((got[finite] - want[finite]).norm() / want[finite].norm().clamp_min(1e-30))


# --- cpu tier ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
@pytest.mark.parametrize("widths", [(25, 25), (7, 13, 30)], ids=["even", "uneven"])
def test_cpu_combine_matches_f_cross_entropy_and_the_algebra(widths, label_smoothing):
    vocab, n = sum(widths), 16
    g = torch.Generator().manual_seed(len(widths))
    full = torch.randn(n, vocab, generator=g, dtype=torch.float64) * 4
    target = torch.randint(widths[0], vocab, (n,), generator=g)  # never in the first slice, -inf on rows 2, 6
    target[[3, 10]] = IGNORE
    target[5], target[12] = vocab, -5  # out of range
    full[[2, 6], :widths[0]] = -torch.inf  # a slice of -inf logits: (-DBL_MAX, 0, 0, -inf) from statistics
    gathered = gathered_statistics(full, target, widths)

    out = K.combine(gathered, target, vocab, IGNORE, label_smoothing)

    assert out.shape == (4, n) and out.dtype == torch.float64
    kept, in_range = target != IGNORE, (target >= 0) & (target < vocab)
    assert torch.allclose(out[0] + out[1], torch.logsumexp(full, 1), rtol=1e-12, atol=0)
    want = F.cross_entropy(full, torch.where(in_range, target, 0), reduction="none", ignore_index=IGNORE,
                           label_smoothing=label_smoothing)
    assert torch.allclose(out[2][in_range], want[in_range], rtol=1e-12, atol=1e-12)
    assert out[2][~kept].eq(0).all() and out[2][kept & ~in_range].isnan().all()
    assert out[3][in_range & kept].eq(1).all() and out[3][~kept].eq(0).all()
    assert out[3][kept & ~in_range].isnan().all()
    combined = algebra.combine(gathered)
    losses = algebra.row_losses(combined, target, vocab, IGNORE, label_smoothing)
    expected = torch.stack([combined.row_max, combined.row_log_sum, losses,
                            algebra.kept_rows(losses, target, IGNORE)])
    torch.testing.assert_close(out, expected, rtol=0, atol=0, equal_nan=True)


def test_a_row_of_all_minus_flt_max_slices_gives_no_nan_from_the_max():
    """Every slice of -inf logits: M - m_r is 0 - 0, exp 1, times s_r = 0: log S is -inf, not NaN."""
    gathered = torch.tensor([[[-FLT_MAX, 0.0, 0.0, -torch.inf]]] * 3, dtype=torch.float64)
    out = K.combine(gathered, torch.tensor([IGNORE]), 30, IGNORE, 0.0)
    assert out[:, 0].tolist() == [-FLT_MAX, -torch.inf, 0.0, 0.0]


def test_the_operator_has_fake_shapes_and_passes_opcheck():
    with torch.device("meta"):
        out = K.combine(torch.empty(3, 5, 4), torch.empty(5, dtype=torch.int64), 100, IGNORE, 0.1)
        out64 = K.combine(torch.empty(2, 5, 4, dtype=torch.float64), torch.empty(5, dtype=torch.int64), 100,
                          IGNORE, 0.0)
    assert out.shape == (4, 5) and out.dtype == torch.float32 and out64.dtype == torch.float64
    gathered = torch.rand(3, 5, 4, dtype=torch.float64) + 0.5
    torch.library.opcheck(K.combine, (gathered, torch.tensor([0, 3, 99, IGNORE, 4]), 100, IGNORE, 0.1))


@pytest.mark.parametrize(("gathered", "target", "start"), [
    (torch.zeros(2, 5, 3), torch.zeros(5, dtype=torch.int64), "gathered: expected [W, N, 4], got [2, 5, 3]"),
    (torch.zeros(5, 4), torch.zeros(5, dtype=torch.int64), "gathered: expected [W, N, 4], got [5, 4]"),
    (torch.zeros(2, 5, 4), torch.zeros(4, dtype=torch.int64), "target: expected [5] int64, got [4]"),
    (torch.zeros(2, 5, 4), torch.zeros(5, dtype=torch.int32), "target: expected [5] int64, got [5] torch.int32"),
])
def test_bad_shapes_raise_one_line(gathered, target, start):
    with pytest.raises(ValueError) as err:
        K.combine(gathered, target, 10, IGNORE, 0.0)
    assert str(err.value).startswith(start) and "\n" not in str(err.value)


# --- compile tier ------------------------------------------------------------------------------------


@pytest.mark.compile
def test_the_kernels_build_with_combine():
    assert callable(K.extension().combine)


@pytest.mark.compile
def test_combine_has_no_spills_on_sm_90(tmp_path):
    from losslab.build import sass

    _, report = sass.compile_cubin(build.KERNELS / "vocab_parallel" / "combine.cu", "sm_90", tmp_path)
    usage = sass.resource_usage(report, "sm_90")
    assert len(usage) == 1 and usage[0].spill_store_bytes == usage[0].spill_load_bytes == 0, usage


# --- gpu tier ----------------------------------------------------------------------------------------


def random_tuples(world: int, n: int, vocab: int, seed: int):
    """Float32 statistics [W, N, 4] as ``statistics`` could write them, and [N] targets: every
    fifth row has a slice of -inf logits (-FLT_MAX, 0, 0, -inf) on a rank that does not own the
    target, row 1 only such slices; rows 7k + 2 are ignored, rows 7k + 3 out of range."""
    g = torch.Generator().manual_seed(seed)
    rows, width = torch.arange(n), vocab // world
    part_max = torch.randn(world, n, generator=g) * 4
    part_sum = 1 + torch.rand(world, n, generator=g) * width
    owner = torch.randint(0, world, (n,), generator=g)
    target = owner * width + torch.randint(0, width, (n,), generator=g)
    target_logit = torch.zeros(world, n)
    target_logit[owner, rows] = part_max[owner, rows] - torch.rand(n, generator=g) * 5
    logit_sum = torch.randn(world, n, generator=g) * width
    gathered = torch.stack([part_max, part_sum, target_logit, logit_sum], -1)
    empty = torch.tensor([-FLT_MAX, 0.0, 0.0, -torch.inf])
    gathered[(owner[::5] + 1) % world, rows[::5]] = empty
    gathered[:, 1] = empty
    gathered[owner[1], 1, 2] = -torch.inf  # the target's logit in a slice of -inf
    target[rows % 7 == 2] = IGNORE
    target[rows % 7 == 3] = torch.where(rows[rows % 7 == 3] % 2 == 0, -1, vocab)
    return gathered, target


@pytest.mark.gpu
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
@pytest.mark.parametrize("n", [8192, 3])
@pytest.mark.parametrize("world", [2, 8])
def test_cuda_combine_against_float64(world, n, label_smoothing):
    vocab = 128256
    gathered, target = random_tuples(world, n, vocab, seed=world * n)
    want = K.combine(gathered.double(), target, vocab, IGNORE, label_smoothing)
    got = K.combine(gathered.cuda(), target.cuda(), vocab, IGNORE, label_smoothing).cpu()
    assert got.shape == (4, n) and got.dtype == torch.float32
    got = got.double()
    for row in range(3):  # max, log-sum, loss
        error = norm_relative(got[row], want[row])
        assert error <= 1e-5, (row, error)
    torch.testing.assert_close(got[3], want[3], rtol=0, atol=0, equal_nan=True)
