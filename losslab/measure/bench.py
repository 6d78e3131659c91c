"""Timing every variant and the peers (PyTorch eager, torch.compile, Liger, quack) on the same inputs.

Each (implementation, direction) is timed by ``timing.time_cuda``: per call with L2 flushed
(median and 10th-90th percentiles), back to back, and on the host, in :data:`ROUNDS` rounds that
take every implementation in turn. Achieved bandwidth is the
cost model's minimum bytes over the median time (GB/s = 1e9 bytes/s), shown as a fraction of
the device bandwidth measured in the same process (``ceilings.measure_bandwidth``). A row
faster than its physical floor (minimum bytes at the datasheet's peak bandwidth) is flagged
``below_floor`` with a ``floor_note`` saying why it is not a result.
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

from losslab import problems
from losslab.measure.ceilings import bandwidth_kind, measure_bandwidth, physical_floor
from losslab.measure.check import relative_error
from losslab.measure.peers import PEERS, peer_implementations
from losslab.measure.timing import FLUSH_BYTES, combine, compile_events, flush_buffer, peak_extra_memory, time_cuda
from losslab.ops import variant as get_variant
from losslab.variants import find_variant

__all__ = ["PEERS", "SWEEP_SHAPES", "SWEEP_DIRECTIONS", "BenchRow", "Skipped", "bench_problem", "bench_table_text",
           "implementations", "flag_physical_floor", "hopeless_reason", "sweep_memory_bytes", "sweep_repeats",
           "sweep_table_text"]

# The sweep: each problem from launch-bound (128 rows) to LLM-sized rows, the seed size among them.
SWEEP_SHAPES: dict[str, tuple[tuple[int, int], ...]] = {p.name: p.sweep_shapes for p in problems.registered()}
SWEEP_DIRECTIONS = ("forward", "forward_backward")
# Each implementation's repeats are timed in this many rounds, every implementation once a round, so
# a slow phase of the host or the GPU falls on all of them alike (interleaved medians).
ROUNDS = 4
SERIAL_COLUMNS = 16384  # naive walks a row in one thread: above this many columns a call takes many ms
SERIAL_US_PER_COLUMN = 0.27  # about naive's time per column at the seed sizes (kl_div, two inputs; H200)


@dataclass
class BenchRow:
    """One implementation (a variant or a peer) in one direction, at one shape and dtype.

    Times in milliseconds: ``median_ms``/``p10_ms``/``p90_ms`` per call with L2 flushed,
    ``back_to_back_ms`` per call queued back to back, ``host_ms`` the host's time for a call
    to return (None in records made before they were measured). ``gbps`` is the cost model's
    minimum bytes over the median time (1e9 bytes/s); ``fraction_of_bandwidth`` divides it by
    the measured ``bandwidth`` ceiling ("read" when the direction only reads, else "copy");
    ``error`` is the relative error against float64 (loss for forward, gradient otherwise).
    ``floor_ms`` is the physical floor (None for a device without datasheet figures);
    ``below_floor`` marks a time under it, ``floor_note`` says why that is no result.
    ``date``, ``torch``, ``cuda`` and ``sources_sha256`` say what produced the row
    (stamped by ``records.measure_section``).
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
    back_to_back_ms: float | None = None
    host_ms: float | None = None
    compiles: int = 0  # torch.compile compilations (frames and graph breaks) while this row was warmed up and timed
    floor_ms: float | None = None
    below_floor: bool = False
    floor_note: str = ""
    date: str = ""
    torch: str = ""
    cuda: str = ""
    sources_sha256: str = ""

    @property
    def key(self) -> tuple:
        """What a newer row replaces an older one by: (problem, shape, dtype, implementation, direction)."""
        return self.problem, tuple(self.shape), self.dtype, self.implementation, self.direction

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class Skipped:
    """An implementation a sweep or bench left out at one shape and dtype, and why (e.g. hopeless
    there, a peer that cannot run here, or the inputs do not fit in the device's memory: then
    ``implementation`` is "*")."""

    problem: str
    shape: tuple[int, ...]
    dtype: str
    implementation: str
    reason: str
    date: str = ""

    @property
    def key(self) -> tuple:
        """(problem, shape, dtype, implementation): a measured row of the same key replaces it."""
        return self.problem, tuple(self.shape), self.dtype, self.implementation

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Skipped:
        return cls(data["problem"], tuple(data["shape"]), data["dtype"], data["implementation"], data["reason"],
                   data.get("date", ""))


def hopeless_reason(problem: problems.Problem, variant: str, shape: tuple[int, int]) -> str | None:
    """Why timing ``variant`` at ``shape`` in a sweep would be wasted GPU time, or None.

    The ladder's first rung walks each row in one thread, so its time grows with the row's
    length whatever the number of rows: above :data:`SERIAL_COLUMNS` columns a call takes many
    milliseconds and teaches nothing the seed size does not.
    """
    if variant in problem.variants[:1] and shape[1] > SERIAL_COLUMNS:
        estimate = shape[1] * SERIAL_US_PER_COLUMN / 1e3
        return (f"one thread walks each row of {shape[1]} columns (about {estimate:.0f} ms a call at the seed "
                f"sizes' rate); the sweep leaves it out above {SERIAL_COLUMNS} columns")
    return None


def sweep_memory_bytes(problem: problems.Problem, shape: tuple[int, int], dtype: torch.dtype) -> int:
    """Device memory a sweep point needs, about: the inputs four times over (the inputs, each
    implementation's copy, its gradient, a peer's intermediates), the float64 reference (its
    inputs, gradient and intermediate), and the L2 flush buffer."""
    elements = shape[0] * shape[1]
    floats = sum(1 for x in problem.make_inputs((1, 8), seed=0, device="cpu", dtype=dtype) if x.is_floating_point())
    inputs = problem.cost(shape, "forward", dtype).bytes_read
    return 4 * inputs + 8 * elements * (floats + 2) + FLUSH_BYTES


def sweep_repeats(problem: problems.Problem, shape: tuple[int, int], dtype: torch.dtype, repeats: int = 20) -> int:
    """Timed calls per measurement at ``shape``: ``repeats`` up to 1.5 GiB of forward+backward
    traffic, half that (at least 5) above: large calls vary less and cost more."""
    nbytes = problem.cost(shape, "forward_backward", dtype).bytes
    return repeats if nbytes <= 1.5 * 2**30 else max(5, repeats // 2)


def flag_physical_floor(row: BenchRow, device: str, problem: problems.Problem) -> BenchRow:
    """Set ``row``'s ``floor_ms``, ``below_floor`` and ``floor_note`` for ``device`` (in place; returns it);
    ``problem``: the row's."""
    cost = problem.cost(tuple(row.shape), row.direction, getattr(torch, row.dtype))
    floor = physical_floor(cost.bytes, device)
    row.floor_ms = floor.ms if floor else None
    row.floor_note = floor.verdict(row.median_ms) if floor else ""
    row.below_floor = bool(row.floor_note)
    return row


def implementations(problem: problems.Problem, variants: list, peers=PEERS) -> dict[str, tuple[str, Callable]]:
    """name -> (kind, callable with the reference's signature). A variant is a name the records
    give it (a rung's, ``"<rung> [ladder]"``, ``"losslab.nn"``: ``variants.find_variant``) or a callable
    variant object with a ``name`` (e.g. ``losslab.teach.custom.CustomVariant``, ``variants.Variant``);
    its kind is the object's ``kind`` ("ladder", "operator"), else "variant"."""
    impls = {}
    for v in variants:
        found = find_variant(problem, v) if isinstance(v, str) else v
        if isinstance(found, str):
            impls[found] = ("variant", get_variant(problem, found))
        else:
            impls[found.name] = (getattr(found, "kind", "variant"), found)
    impls.update({name: ("peer", fn) for name, fn in peer_implementations(problem, peers).items()})
    return impls


def _calls(fn: Callable, predictions: torch.Tensor, others: tuple, grad_loss: torch.Tensor) -> dict:
    """direction -> (timed callable, untimed setup or None) for one implementation.

    forward runs in inference (no gradient required); backward is timed on a fresh graph
    each call (its forward is the untimed setup); forward_backward times both.
    """
    return {
        "forward": (lambda: fn(predictions.detach(), *others), None),
        "backward": (lambda loss: torch.autograd.grad(loss, predictions, grad_loss),
                     lambda: fn(predictions, *others)),
        "forward_backward": (lambda: torch.autograd.grad(fn(predictions, *others), predictions, grad_loss), None),
    }


def bench_problem(problem: problems.Problem, shape: tuple[int, int] | None = None, variants: list | None = None,
                  peers: tuple[str, ...] = PEERS, repeats: int = 20, seed: int = 0,
                  bandwidth: dict[str, float] | None = None, progress: bool = True,
                  dtype: torch.dtype = torch.float32,
                  directions: tuple[str, ...] = problems.DIRECTIONS,
                  rejected: list[Skipped] | None = None) -> list[BenchRow]:
    """Time each variant and peer of ``problem`` forward, backward and forward+backward.

    Gradients flow as in training, ``loss.backward()``: grad_loss = 1 (check.py covers
    other values). ``fused`` has no backward row: its backward only scales the forward's
    gradient, and not at all when grad_loss = 1. Variants without kernels for ``dtype`` are
    left out. A variant is a rung's name or a variant object (see ``implementations``); an
    empty list times the peers only. Each implementation gets its own copy of the inputs, anew
    each round: Liger-Kernel's cross_entropy writes the gradient into its input (their issue #272).
    The ``repeats`` calls of each (implementation, direction) are timed in :data:`ROUNDS` rounds,
    every implementation once a round, and their medians taken over all the rounds' calls: an
    operator and the rung it runs are compared on interleaved medians in one process.

    Args:
        shape: (rows, columns); default the problem's seed size.
        bandwidth: measured ceilings in GB/s, keys "read" and "copy"
            (``ceilings.measure_bandwidth()`` if None).
        directions: the directions timed (default all of ``problems.DIRECTIONS``).
        rejected: where a measurement during which torch.compile compiled (or broke its graph)
            goes, as a :class:`Skipped` with the count, instead of a row (printed too).
    Returns one BenchRow per (implementation, direction), with speedups over the peers.
    """
    shape = tuple(shape or problem.sizes["seed"])
    variants = [v for v in (problem.variants if variants is None else variants)
                if dtype in (problem.dtypes(v) if isinstance(v, str) else v.dtypes)]
    bandwidth = bandwidth or measure_bandwidth()
    device = torch.cuda.get_device_name()
    inputs = problem.make_inputs(shape, seed=seed, device="cuda", dtype=dtype)
    reference = problem.reference_float64(*inputs)
    grad_loss = torch.tensor(1.0, device="cuda")
    flush = flush_buffer()
    rejected = rejected if rejected is not None else []
    impls = implementations(problem, variants, peers)
    rounds = max(1, min(ROUNDS, repeats))
    timed: dict[tuple[str, str], list] = {}  # (name, direction) -> one Timing a round
    errors, peaks, compiled = {}, {}, {}
    for round_ in range(rounds):
        if progress and round_ > 0:
            print(f"  timing {problem.name} at {shape[0]}x{shape[1]}: round {round_ + 1} of {rounds}, every "
                  "implementation again ...", file=sys.stderr, flush=True)
        for name, (kind, fn) in list(impls.items()):
            if progress and round_ == 0:
                print(f"  timing {problem.name} {name} at {shape[0]}x{shape[1]} ...", file=sys.stderr, flush=True)
            predictions = inputs[0].detach().clone().requires_grad_(True)
            calls = _calls(fn, predictions, inputs[1:], grad_loss)
            if round_ == 0:
                try:
                    errors[name] = _errors(calls, reference)
                except Exception as err:  # an optional peer that fails here is left out, not fatal
                    if kind != "peer":
                        raise
                    print(f"  {name} left out: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
                    del impls[name]
                    continue
            rung = problem.rung(name) if name in problem.variants else getattr(fn, "rung", None)
            # this round's share of the repeats; the first round warms up (builds, compiles, autotunes)
            share = repeats // rounds + (round_ < repeats % rounds)
            for direction, (call, setup) in calls.items():
                if direction not in directions or (direction == "backward" and rung is not None
                                                   and rung.writes_grad_in_forward):
                    continue
                began = compile_events()
                timed.setdefault((name, direction), []).append(
                    time_cuda(call, repeats=share, flush=flush, setup=setup, warmup_ms=50.0 if round_ == 0 else 5.0))
                compiled[(name, direction)] = compiled.get((name, direction), 0) + compile_events() - began
                if round_ == 0:
                    peaks[(name, direction)] = peak_extra_memory(call, setup)
    rows = []
    for (name, direction), rounds_timed in timed.items():
        timing = combine(rounds_timed)
        if timing.compiles_while_timed:  # timed compilation, not compiled code: no result
            why = (f"torch.compile compiled or broke its graph {timing.compiles_while_timed} time(s) while "
                   f"{direction} was timed: rejected")
            print(f"  {name} {direction} at {shape[0]}x{shape[1]}: {why}", file=sys.stderr, flush=True)
            rejected.append(Skipped(problem.name, shape, str(dtype).removeprefix("torch."), name, why))
            continue
        cost = problem.cost(shape, direction, dtype)
        ceiling = bandwidth_kind(cost.bytes_written)
        gbps = cost.bytes / timing.median_ms / 1e6
        row = BenchRow(problem.name, name, impls[name][0], direction, shape, str(dtype).removeprefix("torch."),
                       timing.median_ms, timing.p10_ms, timing.p90_ms, timing.repeats, gbps, ceiling,
                       gbps / bandwidth[ceiling], peaks[(name, direction)], errors[name][direction],
                       back_to_back_ms=timing.back_to_back_ms, host_ms=timing.host_ms,
                       compiles=compiled[(name, direction)])
        rows.append(flag_physical_floor(row, device, problem))
    set_speedups(rows)
    return rows


def _errors(calls: dict, reference: tuple[torch.Tensor, torch.Tensor]) -> dict[str, float]:
    """Relative error against float64 per direction: the forward's loss before any in-place
    gradient (Liger writes one into its input), then the gradient."""
    loss64, grad64 = reference
    forward, _ = calls["forward"]
    backward, make_graph = calls["backward"]
    errors = {"forward": relative_error(forward(), loss64)[0]}
    errors["backward"] = errors["forward_backward"] = relative_error(backward(make_graph())[0], grad64)[0]
    return errors


def set_speedups(rows: list[BenchRow]) -> None:
    """Each row's speedup over each peer row of the same shape, dtype and direction (in place):
    the peer's median over the row's."""
    for row in rows:
        row.speedup = {peer.implementation: peer.median_ms / row.median_ms for peer in rows
                       if peer.kind == "peer" and peer is not row and peer.key[:3] == row.key[:3]
                       and peer.direction == row.direction}


def bench_table_text(rows: list[BenchRow]) -> str:
    """Fixed-width text table of bench rows of one shape and dtype, grouped by direction; a row
    below its physical floor is marked ``!`` and explained under the table."""
    peers = sorted({r.implementation for r in rows if r.kind == "peer"})
    head = (f"{'direction':<16} {'implementation':<14} {'median ms':>10} {'p10-p90 ms':>15} {'b2b ms':>8} "
            f"{'host ms':>8} {'GB/s':>8} {'of bw':>6} {'extra MiB':>10} {'rel. err':>9}"
            + "".join(f" {'x ' + p:>9}" for p in peers))
    lines, notes = [head], []
    fmt = lambda v: f"{v:.3f}" if v is not None else "-"
    for r in sorted(rows, key=lambda r: problems.DIRECTIONS.index(r.direction)):
        speedups = "".join(f" {r.speedup[p]:>9.2f}" if p in r.speedup else f" {'':>9}" for p in peers)
        mark = "!" if r.below_floor else " "
        lines.append(f"{r.direction:<16} {r.implementation:<14} {r.median_ms:>9.3f}{mark} "
                     f"{f'{r.p10_ms:.3f}-{r.p90_ms:.3f}':>15} {fmt(r.back_to_back_ms):>8} {fmt(r.host_ms):>8} "
                     f"{r.gbps:>8.0f} {r.fraction_of_bandwidth:>6.0%} "
                     f"{r.peak_extra_bytes / 2**20:>10.2f} {r.error:>9.1e}{speedups}")
        if r.below_floor:
            notes.append(f"! {r.implementation} {r.direction}: {r.floor_note}")
    return "\n".join(lines + notes)


def sweep_table_text(rows: list[BenchRow], skipped: list[Skipped] = ()) -> str:
    """Fixed-width text table of sweep rows: per dtype and direction, one line per implementation
    with its median ms per call (and fraction of bandwidth) at each shape; then what was skipped,
    one line per implementation and reason (a missing peer: one line for all its shapes and dtypes)."""
    shapes = sorted({tuple(r.shape) for r in rows}, key=lambda s: (s[0] * s[1], s))
    label = lambda s: f"{s[0]}x{s[1]}"
    lines = []
    for dtype in dict.fromkeys(r.dtype for r in rows):
        for direction in [d for d in problems.DIRECTIONS if any(r.direction == d for r in rows)]:
            chosen = [r for r in rows if r.dtype == dtype and r.direction == direction]
            lines.append(f"{dtype} {direction}: median ms per call (of bw)")
            lines.append(f"{'implementation':<14}" + "".join(f" {label(s):>17}" for s in shapes))
            for name in dict.fromkeys(r.implementation for r in chosen):
                cells = {tuple(r.shape): f"{r.median_ms:.3f} ({r.fraction_of_bandwidth:.0%})"
                         for r in chosen if r.implementation == name}
                lines.append(f"{name:<14}" + "".join(f" {cells.get(s, '-'):>17}" for s in shapes))
    groups: dict[tuple[str, str], list[Skipped]] = {}
    for s in skipped:
        groups.setdefault((s.implementation, s.reason), []).append(s)
    for (name, reason), group in groups.items():
        where = ", ".join(dict.fromkeys(label(s.shape) for s in group))
        lines.append(f"skipped {name} at {where} {'/'.join(dict.fromkeys(s.dtype for s in group))}: {reason}")
    return "\n".join(lines)
