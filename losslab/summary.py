"""The summaries ``python -m losslab summary`` prints from the records, and the README copies (a
cpu-tier test keeps the copies in step): what a user calls (``losslab.nn``, the public operator)
beside the best rung of each problem and each peer at the seed size, and the same over the
sweep's sizes, per device.
"""
from __future__ import annotations

from collections.abc import Sequence

from losslab import records
from losslab.measure.bench import SWEEP_DIRECTIONS, SWEEP_SHAPES
from losslab.measure.ceilings import AUTOGRAD_FLOOR_SHAPE
from losslab.variants import OPERATOR

SWEEP_PEERS = ("compile", "liger", "quack")  # the optimised peers; eager is in the record and notebook 03
HOST_BOUND = ("* host-bound: the host takes longer to issue the call than the GPU to run it (its host ms per call, "
              "in the record, is above the GPU time shown), so a lone call costs its host time.")


def stale_note(section: records.Section) -> str | None:
    """One line when some of ``section``'s results were measured on other sources than the
    repository's (``Section.stale``), else None."""
    stale = section.stale()
    if not stale:
        return None
    return (f"{len(stale)} of {len(section.rows) + len(section.checks)} {section.problem} results on "
            f"{section.device} were measured on older sources than the repository's: re-record with "
            "scripts/gpu_suite.sh")


def summary_text(sections: dict[str, records.Section]) -> str:
    """The best variant of each problem against each peer, forward and forward_backward, from each
    section's :meth:`~losslab.records.Section.view` (its seed size and float32 when it holds them),
    headed by exactly what it shows: size and dtype per problem, and the device, versions and dates;
    when the problems come from different devices, a line per problem and a device column; a ``*``
    on each :func:`host_bound` time, with :data:`HOST_BOUND` below; a note per problem measured on
    older sources than the repository's (:func:`stale_note`)."""
    views = {name: s.view() for name, s in sections.items()}
    held = {name: f"{'x'.join(map(str, s.primary_shape or ()))} {s.primary_dtype}" for name, s in views.items()}
    where = {name: f"{s.device} (torch {s.torch}, CUDA {s.cuda})" for name, s in views.items()}
    dates = sorted(s.date[:10] for s in views.values())
    when = dates[0] + ("" if dates[0] == dates[-1] else f" to {dates[-1]}")
    many = len({s.device for s in views.values()}) > 1
    if many:
        head = ["recorded on several devices (compare across them with care); median GPU ms per call:"]
        head += [f"  {name}: {held[name]} on {where[name]}, {views[name].date[:10]}" for name in views]
    else:
        head = [f"recorded on {next(iter(where.values()))}, {when}; "
                f"{', '.join(f'{name} {held[name]}' for name in views)}; median GPU ms per call"]
    device = lambda s: f"{s.device[:22]:<23}" if many else ""
    width = max(len("problem"), *map(len, views))  # the longest problem name sets the first column
    lines = [f"{'problem':<{width}} {'direction':<16} " + (f"{'device':<23}" if many else "")
             + f"{'best rung':<14} {'ms':>8} {'of bw':>5}   {OPERATOR + ' ms (x best rung)':<26} "
             f"peers (ms, speedup of {OPERATOR}, else of the best rung)"]
    notes, starred = [], False
    for name, s in views.items():
        for direction in ("forward", "forward_backward"):
            rows = [r for r in s.rows if r.direction == direction]
            variants = [r for r in rows if r.kind == "variant"]
            if not variants:
                continue
            best = min(variants, key=lambda r: r.median_ms)
            operator = next((r for r in rows if r.implementation == OPERATOR), None)
            mine = operator or best
            public = (f"{operator.median_ms:.3f}{'*' if host_bound(operator) else ''} "
                      f"(x{operator.median_ms / best.median_ms:.2f})" if operator else "—")
            peers = "  ".join(f"{r.implementation} {r.median_ms:.3f}{'!' if r.below_floor else ''}"
                              f"{'*' if host_bound(r) else ''} (x{r.median_ms / mine.median_ms:.2f})"
                              for r in rows if r.kind == "peer")
            starred = starred or host_bound(best) or any(host_bound(r) for r in rows if r.kind != "variant")
            notes += [f"! {name} {r.implementation} {direction}: {r.floor_note}" for r in rows if r.below_floor]
            lines.append(f"{name:<{width}} {direction:<16} {device(s)}{best.implementation:<14} "
                         f"{best.median_ms:>8.3f}{'*' if host_bound(best) else ' '}"
                         f"{best.fraction_of_bandwidth:>5.0%}   {public:<26} {peers}")
    if starred:
        notes.append(HOST_BOUND)
    notes += [f"note: {note}" for s in views.values() if (note := stale_note(s))]
    return "\n".join(head + lines + notes)


def short_device(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'H100': the model, as a table column shows it."""
    words = name.split()
    return words[1] if len(words) > 1 and words[0] == "NVIDIA" else name


def _cells(section: records.Section, dtype: str, direction: str) -> dict[tuple, dict[str, records.BenchRow]]:
    """shape -> {"best": the fastest rung's row, OPERATOR and each peer name: its row} at ``dtype``
    and ``direction``."""
    found: dict[tuple, dict[str, records.BenchRow]] = {}
    for r in section.rows:
        if r.dtype != dtype or r.direction != direction:
            continue
        cell = found.setdefault(tuple(r.shape), {})
        if r.kind == "variant":
            if "best" not in cell or r.median_ms < cell["best"].median_ms:
                cell["best"] = r
        elif r.implementation in (OPERATOR, *SWEEP_PEERS):
            cell[r.implementation] = r
    return found


def host_bound(row: records.BenchRow) -> bool:
    """Whether a call of ``row``'s implementation takes the host longer to return than the GPU to run
    (host ms per call above the median GPU ms per call): a lone call then costs its host time."""
    return row.host_ms is not None and row.host_ms > row.median_ms


def _host_cause(operator: records.BenchRow, best: records.BenchRow) -> str:
    """Where the operator's call is :func:`host_bound`, its host time per call beside the rung's: the
    measured cause of the gap (the host issuing the call, not the kernels), as a suffix."""
    if not host_bound(operator) or best.host_ms is None:
        return ""
    return f"; host-bound: host {operator.host_ms:.4f} ms a call, {best.implementation}'s {best.host_ms:.4f}"


SMALLEST_CALL = (OPERATOR, "eager", "compile")  # whose host time :func:`smallest_call_host_times` shows


def smallest_call_host_times(sections: Sequence[records.Section], shape: tuple) -> str | None:
    """One line: the host ms per float32 forward+backward call at ``shape`` (the sweep's smallest),
    with its GPU ms, of each of :data:`SMALLEST_CALL` on each device that recorded them, or None where
    no device did. At launch-bound sizes the host's time, PyTorch's autograd included, sets what a
    lone call costs: the measured cause of the host-bound cells, eager PyTorch's own beside ours, and
    where the section's ceilings hold it, ``x.sum()``'s (``ceilings.measure_autograd_floor``: the
    least a call through autograd costs on that host, measured in the same process)."""
    parts, floors = [], False
    for s in sections:
        rows = {r.implementation: r for r in s.rows if r.dtype == "float32" and r.direction == "forward_backward"
                and tuple(r.shape) == shape and r.implementation in SMALLEST_CALL and r.host_ms is not None}
        times = [(k, rows[k].host_ms, rows[k].median_ms) for k in SMALLEST_CALL if k in rows]
        floor = s.ceilings.get("autograd_floor")
        if times and floor:
            times.append(("x.sum()", floor["host_ms"], floor["median_ms"]))
            floors = True
        if times:
            parts.append(f"{short_device(s.device)} "
                         + ", ".join(f"{k} {host:.3f} ({gpu:.3f})" for k, host, gpu in times))
    if not parts:
        return None
    floor_note = (f" x.sum() is PyTorch's own forward+backward of a sum at {'×'.join(map(str, AUTOGRAD_FLOOR_SHAPE))}: "
                  "the least any call through autograd costs on that host." if floors else "")
    return (f"One float32 forward+backward call at {'×'.join(map(str, shape))}, the smallest size above: host ms "
            f"per call (GPU ms in brackets): {'; '.join(parts)}.{floor_note}")


def sweep_markdown(problem: str, sections: Sequence[records.Section]) -> str:
    """A markdown table of ``problem``'s sweep on each device of ``sections`` (one Section per
    device): per dtype and direction, at each shape of ``bench.SWEEP_SHAPES`` that some device
    recorded, the median ms per call (L2 flushed) of what a user calls (:data:`OPERATOR`), of the
    best losslab rung and of each peer in :data:`SWEEP_PEERS` that some device ran ("—" where it
    did not run; ``*`` marks a :func:`host_bound` time); then the cells where a peer was faster
    than the operator (than the best rung in a record without operator rows), the cells where
    the operator is behind the best rung by more than max(3 %, 1 µs) (with both host times where
    the operator's call is host-bound), each device's date and versions, and a note for results
    measured on other sources than the repository's."""
    cells = {(s.device, d, di): _cells(s, d, di) for s in sections for d in ("float32", "bfloat16")
             for di in SWEEP_DIRECTIONS}
    shapes = [s for s in SWEEP_SHAPES[problem] if any(s in c for c in cells.values())]
    peers = [p for p in SWEEP_PEERS if any(p in cell for c in cells.values() for cell in c.values())]
    head = ["device", "dtype", "direction", *("×".join(map(str, s)) for s in shapes)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    behind, lagging = [], []
    for (device, dtype, direction), found in cells.items():
        if not any(found.get(s, {}).get("best") for s in shapes):
            continue
        row = [short_device(device), dtype, direction.replace("_", "+")]
        for shape in shapes:
            cell = found.get(shape, {})
            best, operator = cell.get("best"), cell.get(OPERATOR)
            mine = operator or best
            where = f"{short_device(device)} {dtype} {direction} {'×'.join(map(str, shape))}"
            row.append(" / ".join(f"{cell[k].median_ms:.3f}{'*' if host_bound(cell[k]) else ''}" if k in cell
                                  else "—" for k in (OPERATOR, "best", *peers)))
            faster = [cell[p] for p in peers if mine and p in cell and cell[p].median_ms < mine.median_ms]
            behind += [f"{where}: {p.implementation} {p.median_ms:.4f} ms, {mine.implementation} "
                       f"{mine.median_ms:.4f}" for p in faster]
            if operator and best and operator.median_ms - best.median_ms > max(0.03 * best.median_ms, 0.001):
                lagging.append(f"{where}: {OPERATOR} {operator.median_ms:.4f} ms, {best.implementation} "
                               f"{best.median_ms:.4f} (x{operator.median_ms / best.median_ms:.2f})"
                               + _host_cause(operator, best))
        lines.append("| " + " | ".join(row) + " |")
    counted = sum(1 for c in cells.values() for s in shapes if c.get(s, {}).get("best"))
    out = [f"{problem}: median ms per call (L2 flushed), {OPERATOR} / best losslab rung / {' / '.join(peers)}",
           "", *lines, ""]
    out.append("\\" + HOST_BOUND)
    host_line = smallest_call_host_times(sections, shapes[0]) if shapes else None
    if host_line:
        out.append(host_line)
    out.append(f"{' or '.join(peers) or 'A peer'} is faster than what a user calls in {len(behind)} of {counted} "
               "cells" + (" (by any margin; the goal allows max(3 %, 1 µs)):" if behind else "."))
    out += [f"- {b}" for b in behind]
    out.append(f"{OPERATOR} is behind the best rung by more than max(3 %, 1 µs) in {len(lagging)} of {counted} cells"
               + (":" if lagging else "."))
    out += [f"- {b}" for b in lagging]
    out.append("")
    for s in sections:
        note = stale_note(s)
        out.append(f"{short_device(s.device)}: {s.device}, torch {s.torch}, CUDA {s.cuda}, {s.date[:10]}"
                   + (f"; {note}" if note else ""))
    return "\n".join(out)
