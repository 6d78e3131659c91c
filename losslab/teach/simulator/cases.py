"""The inputs the simulator runs each problem's launchers on, and their float64 references
(``PROBLEMS`` maps a problem to its :class:`ProblemSpec`).
One module: every loss's cases share :class:`Case`'s storage and offsets and the drivers' manifest
format (a loss package cannot hold them: ``losslab.problems`` must not import ``losslab.teach``).

A :class:`Case` holds the inputs as they lie in memory: flat float32 storage with an offset
in elements from a 16-byte boundary, so a misaligned view is one case among others. Standard
cases are random inputs at awkward shapes and offsets (:func:`kl_div_cases`,
:func:`cross_entropy_cases`); probes are one-hot inputs that measure how many times each element
reaches its row's sum (:func:`probe`).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from losslab.problems import (
    cosine_similarity_loss,
    cross_entropy,
    hinge_loss,
    kl_div,
    mse_loss,
    smooth_l1_loss,
    triplet_margin_loss,
)

KL_DIV, CROSS_ENTROPY = kl_div.PROBLEM.name, cross_entropy.PROBLEM.name  # the losses with cases here
HINGE_LOSS = hinge_loss.PROBLEM.name
TRIPLET = triplet_margin_loss.PROBLEM.name
COSINE = cosine_similarity_loss.PROBLEM.name
MSE_LOSS, SMOOTH_L1_LOSS = mse_loss.PROBLEM.name, smooth_l1_loss.PROBLEM.name


@dataclass
class Case:
    """One run of a problem's launchers: ``B`` x ``D`` inputs stored from ``offset_p`` and
    ``offset_t`` elements after a 16-byte boundary (``p``, ``t``: the whole storage, offset
    included: float32 predictions and targets for kl_div; float32 logits and (N,) int64
    targets for cross_entropy, where B, D are N, C); ``grad_loss`` is the backward's upstream
    gradient; ``kind`` is "standard" or "probe"."""

    name: str
    B: int
    D: int
    p: np.ndarray
    t: np.ndarray
    offset_p: int = 0
    offset_t: int = 0
    grad_loss: float = 1.0
    kind: str = "standard"
    positions: tuple[int, ...] = ()  # a probe's hot element in each row

    @property
    def predictions(self) -> np.ndarray:
        """(B, D) float32 view."""
        return self.p[self.offset_p:].reshape(self.B, self.D)

    @property
    def targets(self) -> np.ndarray:
        """(B, D) float32 view."""
        return self.t[self.offset_t:].reshape(self.B, self.D)


def _random(name: str, B: int, D: int, seed: int, offset_p: int = 0, offset_t: int = 0) -> Case:
    rng = np.random.default_rng(seed)
    p = rng.uniform(0.05, 1.0, offset_p + B * D).astype(np.float32)
    t = rng.uniform(0.05, 1.0, offset_t + B * D).astype(np.float32)
    return Case(name, B, D, p, t, offset_p, offset_t, grad_loss=0.75)


# The elements probe_256 measures: every lane of warp 0, and lanes 0, 5, 16 and 31 of the
# other warps of a 256-thread block (a row per element: all 256 would cost 5x the time).
PROBE_256 = tuple(range(32)) + tuple(32 * w + lane for w in range(1, 8) for lane in (0, 5, 16, 31))


def probe(D: int, positions: tuple[int, ...] | None = None, offset: int = 0) -> Case:
    """The one-hot probe: one row of width D per element of ``positions`` (default: every
    element), row r hot at ``positions[r]``.

    It measures how many times each element reaches its row's sum. Row r has targets 1
    everywhere and predictions 1 except exp(-1) at its hot element, so every term is 0 except
    that element's, which is 1: ``rows[r]`` is the *weight* of the element (1 when right)."""
    positions = tuple(range(D)) if positions is None else positions
    B = len(positions)
    p = np.ones(offset + B * D, np.float32)
    p[offset + np.arange(B) * D + np.asarray(positions)] = np.float32(np.exp(-1.0))
    t = np.ones(offset + B * D, np.float32)
    case = Case(f"probe {B} x {D}", B, D, p, t, offset, offset, kind="probe")
    case.positions = positions
    return case


def kl_div_case(name: str, predictions: np.ndarray, targets: np.ndarray, grad_loss: float = 1.0) -> Case:
    """A case from your own (B, D) predictions and targets (converted to float32)."""
    p, t = np.asarray(predictions, np.float32), np.asarray(targets, np.float32)
    if p.ndim != 2 or p.shape != t.shape:
        raise ValueError(f"predictions, targets: expected two (B, D) arrays of one shape, got {p.shape} and {t.shape}")
    return Case(name, p.shape[0], p.shape[1], p.reshape(-1).copy(), t.reshape(-1).copy(), grad_loss=grad_loss)


def kl_div_cases() -> list[Case]:
    """kl_div's standard cases then its probes.

    - standard: random inputs at 3 x 1000, 2 x 37 (odd width), 1 x 1, a view one element past a
      boundary (3 x 1000, every row misaligned), predictions and targets at different offsets
      (no float4 fits both), and targets with exact zeros;
    - probes (:func:`probe`): ``probe 60 x 256`` (one element per thread of a 256-thread block;
      every lane of warp 0 and four lanes of each other warp) shows a reduction's structure;
      ``probe 37 x 37`` (odd width, rows starting at every alignment) shows which of head, float4
      packs and tail each element fell in."""
    zeros = _random("targets with exact zeros (3 x 300)", 3, 300, seed=5)
    zeros.t[::7] = 0.0
    return [
        _random("3 x 1000", 3, 1000, seed=0),
        _random("2 x 37 (odd width)", 2, 37, seed=1),
        _random("1 x 1", 1, 1, seed=2),
        _random("misaligned view (3 x 1000, one element past a 16-byte boundary)", 3, 1000, seed=3,
                offset_p=1, offset_t=1),
        _random("predictions and targets at different offsets (2 x 300)", 2, 300, seed=4, offset_p=1, offset_t=2),
        zeros,
        probe(256, PROBE_256),
        probe(37),
    ]


def kl_div_reference(case: Case) -> dict[str, np.ndarray]:
    """float64 ``rows`` (B,), ``loss`` (1,) = sum / B and ``grad`` (B*D,) = dL/dp for
    ``case.grad_loss``, with torch.kl_div's conventions (a zero target contributes 0)."""
    p = case.predictions.astype(np.float64)
    t = case.targets.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        t_log_t = np.where(t == 0, 0.0, t * np.log(np.where(t == 0, 1.0, t)))
        terms = t_log_t - t * np.log(p)
        grad = -t * (case.grad_loss / case.B) / p
    rows = terms.sum(axis=1)
    return {"rows": rows, "loss": np.array([rows.sum() / case.B]), "grad": grad.reshape(-1)}


def row_roles(case: Case) -> np.ndarray:
    """(B, D) int: for the vectorize exercise's split of each row, 0 where an element is in
    the head (before the first 16-byte boundary, or the whole row when predictions and
    targets sit at different offsets), 1 in a float4 pack, 2 in the scalar tail."""
    roles = np.zeros((case.B, case.D), np.int8)
    for r in range(case.B):
        start_p, start_t = case.offset_p + r * case.D, case.offset_t + r * case.D
        head_p, head_t = (4 - start_p % 4) % 4, (4 - start_t % 4) % 4
        head = min(case.D, head_p) if head_p == head_t else case.D
        packs = (case.D - head) // 4
        roles[r, head:head + 4 * packs] = 1
        roles[r, head + 4 * packs:] = 2
    return roles


def kl_div_manifest_line(i: int, case: Case, path: str) -> str:
    """The driver's manifest line (drivers/kl_div.cpp)."""
    return f"case{i} {case.B} {case.D} {case.offset_p} {case.offset_t} {case.grad_loss!r} {path}"


def mse_loss_cases() -> list[Case]:
    """mse_loss's standard cases: kl_div's random ones (its rows, odd widths and offsets serve an
    elementwise mean as well), predictions equal to the targets in one row, and kl_div's probes
    (each row's loss in one element, so a row's sum shows how often that element was added)."""
    cases = [c for c in kl_div_cases() if c.kind == "standard" and "zeros" not in c.name]
    equal = _random("predictions equal to the targets in row 1 (3 x 300)", 3, 300, seed=6)
    equal.p[300:600] = equal.t[300:600]
    return [*cases, equal, probe(256, PROBE_256), probe(37)]


def mse_loss_reference(case: Case) -> dict[str, np.ndarray]:
    """float64 ``rows`` (B,), ``loss`` (1,) = sum / (B D) and ``grad`` (B*D,) = 2 (p - t) grad_loss / (B D)."""
    d = case.predictions.astype(np.float64) - case.targets.astype(np.float64)
    rows = (d * d).sum(axis=1)
    n = case.B * case.D
    return {"rows": rows, "loss": np.array([rows.sum() / n]), "grad": (2.0 * case.grad_loss / n * d).reshape(-1)}


def smooth_l1_loss_cases() -> list[Case]:
    """smooth_l1_loss's standard cases: mse_loss's, and one whose predictions are scaled by 4 so that
    the differences fall on both sides of beta = 1 (|d| - 1/2 and d^2 / 2)."""
    wide = _random("differences on both sides of beta (3 x 1000, predictions x 4)", 3, 1000, seed=7)
    wide.p *= np.float32(4.0)
    return [*mse_loss_cases(), wide]


def smooth_l1_loss_reference(case: Case) -> dict[str, np.ndarray]:
    """float64 ``rows`` (B,), ``loss`` (1,) = sum / (B D) and ``grad`` (B*D,) = clamp(p - t, -1, 1)
    grad_loss / (B D): F.smooth_l1_loss with beta 1."""
    d = case.predictions.astype(np.float64) - case.targets.astype(np.float64)
    z = np.abs(d)
    rows = np.where(z < 1.0, 0.5 * d * d, z - 0.5).sum(axis=1)
    n = case.B * case.D
    return {"rows": rows, "loss": np.array([rows.sum() / n]),
            "grad": (np.clip(d, -1.0, 1.0) * case.grad_loss / n).reshape(-1)}


IGNORE_INDEX = -100


def cross_entropy_case(name: str, N: int, C: int, seed: int, offset: int = 0, ignored: int = 0) -> Case:
    """Random logits (N, C) (``p``, float32, from ``offset``) and int64 targets (``t``), the
    first ``ignored`` rows' targets set to ignore_index."""
    rng = np.random.default_rng(seed)
    x = rng.normal(0.0, 3.0, offset + N * C).astype(np.float32)
    t = rng.integers(0, C, N).astype(np.int64)
    t[:ignored] = IGNORE_INDEX
    return Case(name, N, C, x, t, offset, 0, grad_loss=0.75)


def cross_entropy_cases() -> list[Case]:
    """cross_entropy's standard cases: aligned, odd width, one row of one class, a view one
    element past a 16-byte boundary, large logits (an overflowing exp without the max), and
    ignored rows."""
    big = cross_entropy_case("large logits (2 x 300, up to 1e4)", 2, 300, seed=4)
    big.p *= np.float32(3000.0)
    return [
        cross_entropy_case("3 x 1000", 3, 1000, seed=0),
        cross_entropy_case("2 x 37 (odd width)", 2, 37, seed=1),
        cross_entropy_case("1 x 1", 1, 1, seed=2),
        cross_entropy_case("misaligned view (3 x 1000, one element past a 16-byte boundary)", 3, 1000, seed=3,
                           offset=1),
        big,
        cross_entropy_case("ignored rows (5 x 300, rows 0 and 1 ignore_index)", 5, 300, seed=5, ignored=2),
    ]


def cross_entropy_reference(case: Case) -> dict[str, np.ndarray]:
    """float64 ``rows`` (N,: NaN on an ignored row, where any value is accepted), ``loss``
    (1,) = mean over valid rows, ``grad`` (N*C,) for ``case.grad_loss``."""
    x = case.p[case.offset_p:].reshape(case.B, case.D).astype(np.float64)
    t = case.t
    valid = t != IGNORE_INDEX
    m = x.max(axis=1, keepdims=True)
    log_sum = np.log(np.exp(x - m).sum(axis=1, keepdims=True))
    log_softmax = x - m - log_sum
    rows = np.where(valid, -log_softmax[np.arange(case.B), np.where(valid, t, 0)], np.nan)
    n_valid = max(int(valid.sum()), 1)
    grad = np.exp(log_softmax)
    grad[np.arange(case.B)[valid], t[valid]] -= 1.0
    grad *= (case.grad_loss / n_valid) * valid[:, None]
    return {"rows": rows, "loss": np.array([np.nansum(rows) / n_valid]), "grad": grad.reshape(-1)}


def cross_entropy_manifest_line(i: int, case: Case, path: str) -> str:
    """The driver's manifest line (drivers/cross_entropy.cpp)."""
    return f"case{i} {case.B} {case.D} {case.offset_p} {case.grad_loss!r} {path}"


def hinge_loss_case(name: str, B: int, D: int, seed: int, offset_p: int = 0, offset_t: int = 0) -> Case:
    """Random (B, D) predictions (normal, scale 1.5: margins on both sides of the hinge) from
    ``offset_p`` and (D,) targets of -1 and +1 from ``offset_t``."""
    rng = np.random.default_rng(seed)
    p = rng.normal(0.0, 1.5, offset_p + B * D).astype(np.float32)
    t = (rng.integers(0, 2, offset_t + D) * 2 - 1).astype(np.float32)
    return Case(name, B, D, p, t, offset_p, offset_t, grad_loss=0.75)


def hinge_loss_cases() -> list[Case]:
    """hinge_loss's standard cases: aligned, odd width, one element, a view one element past a
    16-byte boundary, predictions and targets at different offsets, and predictions exactly on
    the hinge (p * t = 1: a zero term and a zero gradient) in every other column."""
    hinge = hinge_loss_case("every other column on the hinge (3 x 300)", 3, 300, seed=5)
    on_hinge = hinge.predictions[:, ::2]
    on_hinge[...] = hinge.t[::2]  # p = t = +-1: 1 - p * t = 0 exactly
    return [
        hinge_loss_case("3 x 1000", 3, 1000, seed=0),
        hinge_loss_case("2 x 37 (odd width)", 2, 37, seed=1),
        hinge_loss_case("1 x 1", 1, 1, seed=2),
        hinge_loss_case("misaligned view (3 x 1000, one element past a 16-byte boundary)", 3, 1000, seed=3,
                        offset_p=1, offset_t=1),
        hinge_loss_case("predictions and targets at different offsets (2 x 300)", 2, 300, seed=4, offset_p=1,
                        offset_t=2),
        hinge,
    ]


def hinge_loss_reference(case: Case) -> dict[str, np.ndarray]:
    """float64 ``rows`` (B,) each row's sum, ``loss`` (1,) = the mean over B * D and ``grad`` (B*D,)
    for ``case.grad_loss`` (0 where 1 - p * t <= 0, as autograd of torch.clamp gives)."""
    p = case.predictions.astype(np.float64)
    t = case.t[case.offset_t:].astype(np.float64)
    margin = 1.0 - p * t
    rows = np.maximum(margin, 0.0).sum(axis=1)
    grad = -np.where(margin > 0, case.grad_loss / p.size, 0.0) * t
    return {"rows": rows, "loss": np.array([rows.sum() / p.size]), "grad": grad.reshape(-1)}


@dataclass
class TripletCase(Case):
    """A triplet_margin_loss case: ``p`` holds the anchor's storage (from ``offset_p``), ``t`` the
    positive's (from ``offset_t``, ``offset_t + B * D`` elements) followed by the negative's (from
    ``offset_n``), so the input file is the three in order."""

    offset_n: int = 0

    def row_view(self, which: int) -> np.ndarray:
        """(B, D) float32 view of the anchor (0), the positive (1) or the negative (2)."""
        if which == 0:
            return self.predictions
        start = 0 if which == 1 else self.offset_t + self.B * self.D
        offset = self.offset_t if which == 1 else self.offset_n
        return self.t[start + offset:start + offset + self.B * self.D].reshape(self.B, self.D)


def triplet_case(name: str, B: int, D: int, seed: int, offsets: tuple[int, int, int] = (0, 0, 0)) -> TripletCase:
    """KernelBench-like inputs (the anchor uniform in [0, 0.5), the positive and the negative in
    [0, 1)) stored after ``offsets`` elements each: some rows have a loss, some none."""
    rng = np.random.default_rng(seed)
    oa, op, on = offsets
    a = (0.5 * rng.random(oa + B * D)).astype(np.float32)
    t = np.concatenate([rng.random(op + B * D), rng.random(on + B * D)]).astype(np.float32)
    return TripletCase(name, B, D, a, t, oa, op, grad_loss=0.75, offset_n=on)


def triplet_cases() -> list[Case]:
    """triplet_margin_loss's standard cases: aligned, odd width, one element, a view one element past a
    16-byte boundary, the three inputs at different offsets, every input zero (both distances
    eps * sqrt(D): the loss is the margin, the gradient zero), and the positive equal to the anchor."""
    zeros = triplet_case("every input zero (2 x 64)", 2, 64, seed=5)
    zeros.p[:] = 0.0
    zeros.t[:] = 0.0
    # d(a, p) = eps * sqrt(D) from D equal terms: a sequential float32 sum of them drifts (naive's, plain,
    # 2.7e-6 off in the gradient); the negative near, so every row has a loss
    equal = triplet_case("positive equal to the anchor, negative near (16 x 1000)", 16, 1000, seed=7)
    anchor = equal.row_view(0)
    equal.row_view(1)[:] = anchor
    equal.row_view(2)[:] = anchor + np.float32(0.01) * (equal.row_view(2) - anchor)
    return [
        triplet_case("3 x 1000", 3, 1000, seed=0),
        triplet_case("2 x 37 (odd width)", 2, 37, seed=1),
        triplet_case("1 x 1", 1, 1, seed=9),
        triplet_case("misaligned view (3 x 1000, one element past a 16-byte boundary)", 3, 1000, seed=3,
                     offsets=(1, 1, 1)),
        triplet_case("the three at different offsets (2 x 300)", 2, 300, seed=4, offsets=(1, 2, 3)),
        triplet_case("8 x 20 (rows with and without a loss)", 8, 20, seed=6),
        zeros,
        equal,
    ]


def triplet_reference(case: TripletCase) -> dict[str, np.ndarray]:
    """float64 ``rows`` (B,), ``loss`` (1,) = their mean and ``grad`` (B*D,) = dL/danchor for
    ``case.grad_loss``, with PyTorch's conventions (clamp_min passes no gradient at 0, a zero distance none)."""
    a, p, n = (case.row_view(k).astype(np.float64) for k in range(3))
    u, v = a - p + triplet_margin_loss.EPS, a - n + triplet_margin_loss.EPS
    d_ap, d_an = np.sqrt((u * u).sum(axis=1)), np.sqrt((v * v).sum(axis=1))
    x = triplet_margin_loss.MARGIN + d_ap - d_an
    rows = np.where(x < 0, 0.0, x)
    g = np.where(x > 0, case.grad_loss / case.B, 0.0)
    c_ap = np.divide(g, d_ap, out=np.zeros_like(g), where=d_ap != 0)
    c_an = np.divide(-g, d_an, out=np.zeros_like(g), where=d_an != 0)
    grad = c_ap[:, None] * u + c_an[:, None] * v
    return {"rows": rows, "loss": np.array([rows.mean()]), "grad": grad.reshape(-1)}


def triplet_manifest_line(i: int, case: TripletCase, path: str) -> str:
    """The driver's manifest line (drivers/triplet_margin_loss.cpp)."""
    return f"case{i} {case.B} {case.D} {case.offset_p} {case.offset_t} {case.offset_n} {case.grad_loss!r} {path}"


def cosine_case(name: str, B: int, D: int, seed: int, offset_p: int = 0, offset_t: int = 0) -> Case:
    """Normal predictions and targets (B, D), float32, stored from ``offset_p`` and ``offset_t``."""
    rng = np.random.default_rng(seed)
    p = rng.normal(0.0, 1.0, offset_p + B * D).astype(np.float32)
    t = rng.normal(0.0, 1.0, offset_t + B * D).astype(np.float32)
    return Case(name, B, D, p, t, offset_p, offset_t, grad_loss=0.75)


def cosine_cases() -> list[Case]:
    """cosine_similarity_loss's standard cases: aligned, odd width, one element, a misaligned view,
    the inputs at different offsets, a zero row (its norm clamped to eps), identical rows, and a
    row longer than the fused rung's register tile (8192 floats), whose rest is read twice."""
    zero = cosine_case("a zero row of predictions (3 x 300)", 3, 300, seed=5)
    zero.p[300:600] = 0.0
    same = cosine_case("identical rows 0 and 2 (3 x 300)", 3, 300, seed=6)
    same.t[:300], same.t[600:] = same.p[:300], same.p[600:]
    # eighths: every sum of products is exact in float32, in any order (8300 random-sign products
    # summed in naive's one-thread loop would otherwise lose digits to cancellation)
    long = cosine_case("1 x 8300 (longer than fused's register tile)", 1, 8300, seed=7)
    long.p, long.t = np.round(long.p * 8) / 8, np.round(long.t * 8) / 8
    return [
        cosine_case("3 x 1000", 3, 1000, seed=0),
        cosine_case("2 x 37 (odd width)", 2, 37, seed=1),
        cosine_case("1 x 1", 1, 1, seed=2),
        cosine_case("misaligned view (3 x 1000, one element past a 16-byte boundary)", 3, 1000, seed=3,
                    offset_p=1, offset_t=1),
        cosine_case("predictions and targets at different offsets (2 x 300)", 2, 300, seed=4, offset_p=1, offset_t=2),
        zero,
        same,
        long,
    ]


def cosine_reference(case: Case, eps: float = 1e-8) -> dict[str, np.ndarray]:
    """float64 ``rows`` (B,) = 1 - cos, ``loss`` (1,) = their mean and ``grad`` (B*D,) = dL/dp for
    ``case.grad_loss``, with F.cosine_similarity's conventions (each norm clamped to eps, the
    norm's derivative kept, 0 where the norm is 0)."""
    p = case.predictions.astype(np.float64)
    t = case.targets.astype(np.float64)
    norm_p, norm_t = np.linalg.norm(p, axis=1), np.linalg.norm(t, axis=1)
    a, b = np.maximum(norm_p, eps), np.maximum(norm_t, eps)
    cos = (p * t).sum(axis=1) / a / b
    beta = np.divide(cos, a * norm_p, out=np.zeros_like(cos), where=norm_p > 0)
    grad = -(case.grad_loss / case.B) * (t / (a * b)[:, None] - beta[:, None] * p)
    return {"rows": 1 - cos, "loss": np.array([(1 - cos).mean()]), "grad": grad.reshape(-1)}


@dataclass(frozen=True)
class ProblemSpec:
    """What the simulator needs of a problem: its cases, float64 reference and manifest line,
    and the extra outputs its driver writes (name -> numpy dtype)."""

    cases: Callable[[], list[Case]]
    reference: Callable[[Case], dict[str, np.ndarray]]
    manifest_line: Callable[[int, Case, str], str]
    extra_outputs: tuple[tuple[str, type], ...] = ()


PROBLEMS = {
    KL_DIV: ProblemSpec(kl_div_cases, kl_div_reference, kl_div_manifest_line),
    MSE_LOSS: ProblemSpec(mse_loss_cases, mse_loss_reference, kl_div_manifest_line),  # kl_div's driver, renamed
    SMOOTH_L1_LOSS: ProblemSpec(smooth_l1_loss_cases, smooth_l1_loss_reference, kl_div_manifest_line),
    CROSS_ENTROPY: ProblemSpec(cross_entropy_cases, cross_entropy_reference, cross_entropy_manifest_line,
                                 (("row_max", np.float32), ("row_log_sum", np.float32), ("counts", np.int64))),
    HINGE_LOSS: ProblemSpec(hinge_loss_cases, hinge_loss_reference, kl_div_manifest_line),
    TRIPLET: ProblemSpec(triplet_cases, triplet_reference, triplet_manifest_line),
    COSINE: ProblemSpec(cosine_cases, cosine_reference, kl_div_manifest_line, (("row_dots", np.float32),)),
}
