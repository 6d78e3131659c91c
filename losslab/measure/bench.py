"""Timing every variant and the peers (PyTorch eager, torch.compile) on the same inputs.

Method (after Triton's ``do_bench``): warm-up calls first; before every timed
call, write a buffer several times the L2 size so no input is served from
cache; CUDA events around each call; the median over ``repeats`` calls, with
the 10th-90th percentile range as the spread. Achieved bandwidth is the cost
model's minimum bytes over the median time (GB/s = 1e9 bytes/s), shown as a
fraction of the device bandwidth measured in the same process
(``roofline.measure_bandwidth``).
"""
from __future__ import annotations

import statistics
import sys
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch

from losslab import problems
from losslab.measure.check import relative_error
from losslab.ops import variant as get_variant

PEERS = ("eager", "compile", "liger")  # liger only where Liger-Kernel is importable
FLUSH_BYTES = 256 * 2**20  # > 4x the 50-60 MB L2 of an H100/H200


@dataclass
class Timing:
    """Times of one callable in milliseconds."""

    median_ms: float
    p10_ms: float
    p90_ms: float
    repeats: int


def time_cuda(fn: Callable[[], object], repeats: int = 20, warmup_ms: float = 50.0,
              flush: torch.Tensor | None = None, setup: Callable[[], object] | None = None) -> Timing:
    """Median device time of ``fn()`` over ``repeats`` calls, flushing L2 before each.

    Warm-up calls run first for at least ``warmup_ms`` (and at least 3 calls), as
    Triton's do_bench does: a GPU and host fresh from idle run slower and less
    evenly for a while (seen on an H200: cross_entropy's forward at 0.195 ms,
    p10-p90 0.163-0.265, in a fresh process; 0.145, 0.144-0.146, once warm).
    ``setup()``, if given, runs untimed before each call (and before the flush),
    e.g. a forward pass whose backward is timed.

    Raises:
        ValueError: ``repeats`` < 1.
    """
    if repeats < 1:
        raise ValueError(f"repeats: expected at least 1, got {repeats}")
    flush = torch.empty(FLUSH_BYTES // 4, device="cuda") if flush is None else flush

    def call():
        if setup:
            setup()
        fn()

    call()  # first call outside the estimate: builds, compiles, autotunes
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(3):
        call()
    end.record()
    end.synchronize()
    estimate_ms = max(start.elapsed_time(end) / 3, 1e-3)
    for _ in range(int(warmup_ms / estimate_ms)):
        call()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(repeats)]
    for start, end in events:
        if setup:
            setup()
        flush.zero_()  # evicts the inputs from L2; runs before `start`, so it is not timed
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    times = sorted(start.elapsed_time(end) for start, end in events)
    quantile = lambda q: times[min(len(times) - 1, round(q * (len(times) - 1)))]
    return Timing(statistics.median(times), quantile(0.1), quantile(0.9), repeats)


def peak_extra_memory(fn: Callable[[], object], setup: Callable[[], object] | None = None) -> int:
    """Bytes allocated by ``fn()`` at its peak above what was allocated before it
    (outputs included; what ``setup()`` allocates is not counted)."""
    if setup:
        setup()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    baseline = torch.cuda.memory_allocated()
    result = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - baseline
    del result
    return peak


@dataclass
class BenchRow:
    """One implementation (a variant or a peer) in one direction.

    ``gbps`` is the cost model's minimum bytes over the median time (1e9 bytes/s);
    ``fraction_of_bandwidth`` divides it by the measured ``bandwidth`` ceiling
    ("read" when the direction only reads, else "copy"); ``error`` is the relative
    error against float64 (loss for forward, gradient otherwise).
    """

    problem: str
    implementation: str
    kind: str  # "variant" or "peer"
    direction: str
    shape: tuple[int, ...]
    dtype: str
    median_ms: float
    p10_ms: float
    p90_ms: float
    repeats: int
    gbps: float
    bandwidth: str
    fraction_of_bandwidth: float
    peak_extra_bytes: int
    error: float
    speedup: dict[str, float] = field(default_factory=dict)  # over each peer's median

    def as_dict(self) -> dict:
        return asdict(self)


def implementations(problem: str, variants: list, peers: tuple[str, ...]) -> dict[str, tuple[str, Callable]]:
    """name -> (kind, callable with the reference's signature). A variant is a rung's name
    or a callable variant object with a ``name`` (e.g. ``losslab.teach.custom.CustomVariant``)."""
    spec = problems.get(problem)
    impls = {}
    for v in variants:
        impls[v if isinstance(v, str) else v.name] = ("variant", get_variant(problem, v) if isinstance(v, str) else v)
    if "eager" in peers:
        impls["eager"] = ("peer", spec.reference)
    if "compile" in peers:
        impls["compile"] = ("peer", torch.compile(spec.reference))
    if "liger" in peers and (liger := liger_peer(problem)) is not None:
        impls["liger"] = ("peer", liger)
    return impls


def liger_peer(problem: str) -> Callable | None:
    """Liger-Kernel's op for ``problem`` with the reference's signature, or None when
    Liger-Kernel is not installed (it is optional) or has no such op.

    Its kl_div takes log-probabilities, so the peer includes the ``torch.log`` of the
    predictions that a caller with probabilities has to pay for.
    """
    try:
        from liger_kernel.transformers.functional import liger_cross_entropy, liger_kl_div
    except ImportError:
        return None
    ops = {
        "kl_div": lambda p, t: liger_kl_div(torch.log(p), t, reduction="batchmean"),
        "cross_entropy": lambda x, y: liger_cross_entropy(x, y),
    }
    return ops.get(problem)


def bench_problem(problem: str, shape: tuple[int, int] | None = None, variants: list | None = None,
                  peers: tuple[str, ...] = PEERS, repeats: int = 20, seed: int = 0,
                  bandwidth: dict[str, float] | None = None, progress: bool = True,
                  dtype: torch.dtype = torch.float32) -> list[BenchRow]:
    """Time each variant and peer of ``problem`` forward, backward and forward+backward.

    forward runs in inference (no gradient required); backward is timed on a
    fresh graph each call (its forward untimed); forward_backward times both.
    Gradients flow as in training, ``loss.backward()``: grad_loss = 1 (check.py
    covers other values). ``fused`` has no backward row: its backward only
    scales the forward's gradient, and not at all when grad_loss = 1.
    Variants without kernels for ``dtype`` are left out. A variant is a rung's name or a
    variant object (see ``implementations``); an empty list times the peers only.

    Args:
        shape: (rows, columns); default the problem's seed size.
        bandwidth: measured ceilings in GB/s, keys "read" and "copy"
            (``roofline.measure_bandwidth()`` if None).
    Returns one BenchRow per (implementation, direction), with speedups over the peers.
    """
    from losslab.present.roofline import measure_bandwidth

    spec = problems.get(problem)
    shape = tuple(shape or spec.sizes["seed"])
    variants = [v for v in (spec.variants if variants is None else variants)
                if dtype in (spec.dtypes(v) if isinstance(v, str) else v.dtypes)]
    bandwidth = bandwidth or measure_bandwidth()
    inputs = spec.make_inputs(shape, seed=seed, device="cuda", dtype=dtype)
    loss64, grad64 = spec.reference_float64(*inputs)
    grad_loss = torch.tensor(1.0, device="cuda")
    flush = torch.empty(FLUSH_BYTES // 4, device="cuda")
    rows = []
    for name, (kind, fn) in implementations(problem, variants, peers).items():
        if progress:
            print(f"  timing {problem} {name} at {shape[0]}x{shape[1]} ...", file=sys.stderr, flush=True)
        # A copy per implementation: Liger-Kernel's cross_entropy writes the gradient
        # into its input (their issue #272), which would corrupt the others' inputs.
        predictions = inputs[0].detach().clone().requires_grad_(True)
        others = inputs[1:]
        graph = {}

        def forward():
            return fn(predictions.detach(), *others)

        def make_graph():
            graph["loss"] = fn(predictions, *others)

        def backward():
            return torch.autograd.grad(graph.pop("loss"), predictions, grad_loss)

        def forward_backward():
            return torch.autograd.grad(fn(predictions, *others), predictions, grad_loss)

        try:
            errors = {"forward": relative_error(forward(), loss64)[0]}  # before any in-place gradient
            make_graph()
            errors["backward"] = relative_error(backward()[0], grad64)[0]
        except Exception as err:  # an optional peer that fails here is left out, not fatal
            if kind == "variant":
                raise
            print(f"  {name} left out: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
            continue
        errors["forward_backward"] = errors["backward"]
        for direction, call, setup in (("forward", forward, None), ("backward", backward, make_graph),
                                       ("forward_backward", forward_backward, None)):
            if name == "fused" and direction == "backward":
                continue
            cost = spec.cost(shape, direction, dtype)
            ceiling = "read" if cost.bytes_written <= 64 else "copy"
            timing = time_cuda(call, repeats=repeats, flush=flush, setup=setup)
            gbps = cost.bytes / timing.median_ms / 1e6
            rows.append(BenchRow(problem, name, kind, direction, shape, str(dtype).removeprefix("torch."),
                                 timing.median_ms, timing.p10_ms, timing.p90_ms, repeats, gbps, ceiling,
                                 gbps / bandwidth[ceiling], peak_extra_memory(call, setup), errors[direction]))
    for row in rows:
        for peer in rows:
            if peer.kind == "peer" and peer.direction == row.direction and peer is not row:
                row.speedup[peer.implementation] = peer.median_ms / row.median_ms
    return rows


def format_table(rows: list[BenchRow]) -> str:
    """Fixed-width text table of bench rows, grouped by direction."""
    peers = sorted({r.implementation for r in rows if r.kind == "peer"})
    head = (f"{'direction':<16} {'implementation':<14} {'median ms':>10} {'p10-p90 ms':>15} {'GB/s':>8} "
            f"{'of bw':>6} {'extra MiB':>10} {'rel. err':>9}" + "".join(f" {'x ' + p:>9}" for p in peers))
    lines = [head]
    for r in sorted(rows, key=lambda r: problems.DIRECTIONS.index(r.direction)):
        speedups = "".join(f" {r.speedup[p]:>9.2f}" if p in r.speedup else f" {'':>9}" for p in peers)
        lines.append(f"{r.direction:<16} {r.implementation:<14} {r.median_ms:>10.3f} "
                     f"{f'{r.p10_ms:.3f}-{r.p90_ms:.3f}':>15} {r.gbps:>8.0f} {r.fraction_of_bandwidth:>6.0%} "
                     f"{r.peak_extra_bytes / 2**20:>10.2f} {r.error:>9.1e}{speedups}")
    return "\n".join(lines)


def summary_table(sections: dict[str, dict]) -> str:
    """The best variant of each problem against each peer, forward and forward_backward.

    ``sections`` maps a problem to its recorded section (``results``' format: rows as
    dicts). Times in ms; "of bw" is the fraction of the measured bandwidth.
    """
    lines = [f"{'problem':<14} {'direction':<16} {'best variant':<14} {'ms':>8} {'of bw':>6}   peers (ms, speedup)"]
    for problem, section in sections.items():
        for direction in ("forward", "forward_backward"):
            rows = [r for r in section["rows"] if r["direction"] == direction]
            variants = [r for r in rows if r["kind"] == "variant"]
            if not variants:
                continue
            best = min(variants, key=lambda r: r["median_ms"])
            peers = "  ".join(f"{r['implementation']} {r['median_ms']:.3f} (x{r['median_ms'] / best['median_ms']:.2f})"
                              for r in rows if r["kind"] == "peer")
            lines.append(f"{problem:<14} {direction:<16} {best['implementation']:<14} {best['median_ms']:>8.3f} "
                         f"{best['fraction_of_bandwidth']:>6.0%}   {peers}")
    return "\n".join(lines)
