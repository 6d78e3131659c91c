"""The tables of the workbook, as :class:`~losslab.present.html.Html`: the cost model (and the
floor it sets at a measured bandwidth), the correctness checks, the timings and the ceilings.

Every function takes a section as :func:`losslab.present.results.load_results` returns it (a
``records.Section``), or None, and then says there are no results. Captions say on which
device, when and with which versions the numbers were measured; a row below the physical floor
(``BenchRow.below_floor``: its minimum bytes at the datasheet's peak bandwidth) is marked with a
red dagger and its ``floor_note`` spelled out under the table.
"""
from __future__ import annotations

import html
from pathlib import Path

import torch

from losslab import problems, records
from losslab.build import knobs, ladder
from losslab.measure.bench import BenchRow
from losslab.measure.ceilings import bandwidth_kind, datasheet
from losslab.present.html import BAD, Html, format_bytes, format_date, message, no_results, table
from losslab.present.results import (
    bandwidth_gbps,
    implementation_order,
    measured_where,
    run_dates,
    shown_path,
)
from losslab.variants import LADDER_TAG, OPERATOR

FLAG = "&dagger;"  # the mark of a row below the physical floor


def ceiling_for(problem: problems.Problem, shape: tuple[int, int], direction: str, dtype: str = "float32") -> str:
    """Which measured bandwidth bounds ``direction``: "read" or "copy" (``measure.ceilings.bandwidth_kind``)."""
    return bandwidth_kind(problem.cost(shape, direction, getattr(torch, dtype)).bytes_written)


def floor_ms(problem: problems.Problem, shape: tuple[int, int], direction: str, bandwidth_gbps: dict[str, float],
             dtype: str = "float32") -> float:
    """The least time of ``direction`` in ms: minimum bytes over the measured bandwidth
    (``bandwidth_gbps`` in GB/s, keys "read" and "copy")."""
    cost = problem.cost(shape, direction, getattr(torch, dtype))
    return cost.bytes / (bandwidth_gbps[ceiling_for(problem, shape, direction, dtype)] * 1e6)


def cost_table(problem: problems.Problem, shape: tuple[int, int], bandwidth_gbps: dict[str, float] | None = None,
               dtype: str = "float32", measured_on: str = "") -> Html:
    """The cost model (``problem.cost``) per direction at ``shape`` and ``dtype``:
    bytes read and written, FLOPs, transcendentals, arithmetic intensity, and the floor time in
    ms at the measured bandwidth (GB/s) if given, else the time at 1 TB/s.

    ``measured_on`` says where and when the bandwidth was measured, as ``results.measured_where`` does
    ("recorded on NVIDIA H200 on 2026-11-20 10:00 UTC ...").
    """
    floor_head = "floor ms (measured bw)" if bandwidth_gbps else "ms at 1 TB/s"
    body = []
    for direction in problems.DIRECTIONS:
        cost = problem.cost(shape, direction, getattr(torch, dtype))
        ceiling = ceiling_for(problem, shape, direction, dtype)
        if bandwidth_gbps:
            ms = floor_ms(problem, shape, direction, bandwidth_gbps, dtype)
            # two significant digits below 0.01 ms: a small size's floor would print as 0.000
            floor = f"{ms:.3f} " if ms >= 0.01 else f"{ms:.2g} "
            floor += f"({ceiling} {bandwidth_gbps[ceiling]:.0f} GB/s)"
        else:
            floor = f"{cost.bytes / 1e9:.3f} ({ceiling})"
        body.append([direction, format_bytes(cost.bytes_read), format_bytes(cost.bytes_written), f"{cost.flops:.3g}",
                     f"{cost.transcendentals:.3g}", f"{cost.arithmetic_intensity:.2f}", floor])
    head = ["direction", "bytes read", "bytes written", "FLOP", "log/exp", "FLOP/byte", floor_head]
    rows, cols = shape
    caption = f"{problem.name} {rows}x{cols} {dtype}: the least traffic and arithmetic"
    if bandwidth_gbps and measured_on:
        caption += f"; bandwidth {measured_on}"
    return Html(table(head, body, html.escape(caption)), plain=f"cost model of {problem.name} at {rows}x{cols} {dtype}")


def measured_floor(section: records.Section | None) -> Html:
    """:func:`cost_table` at the shape, dtype and measured bandwidth of ``section``."""
    if section is None:
        return no_results("measured floor")
    return cost_table(section.spec, tuple(section.primary_shape), bandwidth_gbps(section), section.primary_dtype,
                      measured_where(section))


def check_table(section: records.Section | None) -> Html:
    """Correctness against the float64 PyTorch reference: one row per case (random sizes, edge
    cases), one column per variant and direction, each cell the relative error with a tick or a
    cross (hover for the reason of a failure)."""
    if section is None:
        return no_results("correctness table")
    checks = section.checks
    if not checks:
        return Html("<p>The record holds no correctness checks (bench ran with --no-check).</p>",
                    plain="no correctness checks recorded")
    variants = sorted({c.variant for c in checks}, key=lambda v: implementation_order(section, v))
    columns = [(v, d) for v in variants for d in ("forward", "backward")]
    found = {(c.case, c.variant, c.direction): c for c in checks}
    body = []
    for case in dict.fromkeys(c.case for c in checks):
        row = [html.escape(case)]
        for key in columns:
            c = found.get((case, *key))
            if c is None:
                row.append("")
                continue
            mark = "&#10003;" if c.passed else "&#10007;"
            style = "" if c.passed else f' style="color:{BAD};font-weight:bold"'
            row.append(f'<span{style} title="{html.escape(c.detail)}">{c.error:.1e} {mark}</span>')
        body.append(row)
    passed = sum(c.passed for c in checks)
    tol = {c.direction: c.tolerance for c in checks}
    dates = sorted({format_date(c.date) for c in checks if c.date})
    when = f"checked on {section.device}" + (f" on {', '.join(dates)}" if dates else "")
    caption = (f"{passed} of {len(checks)} checks passed ({html.escape(when)}). Relative error "
               f"against the reference in float64 (loss: |l - l64|/|l64| &le; {tol.get('forward', 0):.0e}; "
               f"gradient: ||g - g64||/||g64|| &le; {tol.get('backward', 0):.0e}); each check also reruns into "
               f"NaN-poisoned outputs and must match bitwise.")
    head = ["case"] + [f"{html.escape(v)}<br>{d}" for v, d in columns]
    return Html(table(head, body, caption), plain=f"{passed} of {len(checks)} checks passed ({section.problem})")


def _timing_row(r: BenchRow, below: BenchRow | None, peers: list[str], dated: bool) -> list[str]:
    step = f"{below.median_ms / r.median_ms:.2f}" if r.kind == "variant" and below else ""
    name = f"<b>{r.implementation}</b>" if r.kind == "variant" else f"<i>{r.implementation}</i>"
    median = f"{r.median_ms:.3f}"
    if r.below_floor:
        name += f' <span style="color:{BAD}" title="{html.escape(r.floor_note)}">{FLAG}</span>'
        median = f'<span style="color:{BAD}">{median}</span>'
    return ([r.direction, name, median, f"{r.p10_ms:.3f}-{r.p90_ms:.3f}", f"{r.gbps:.0f}",
             f"{r.fraction_of_bandwidth:.0%} of {r.bandwidth}", f"{r.peak_extra_bytes / 2**20:.2f}", f"{r.error:.1e}"]
            + [f"{r.speedup[p]:.2f}" if p in r.speedup else "" for p in peers] + [step]
            + ([html.escape(format_date(r.date))] if dated else []))


def timing_table(section: records.Section | None, rung_below: list[BenchRow] | tuple = ()) -> Html:
    """Times per direction and implementation: median and p10-p90 in ms, achieved GB/s, fraction
    of the measured bandwidth, peak extra MiB, relative error, speedups over the peers and over
    the rung below (and each row's date when the rows come from several runs). Rows below the
    physical floor are marked (&dagger;) and explained under the table, and what the record left
    out at that shape and dtype (e.g. a peer that could not run there) is named with its reason.

    "x rung below" compares a rung with the one below it in the problem's ladder, looked up in
    the section's rows and in ``rung_below`` (rows not shown, e.g. a rung the reader did not
    select); blank when that rung was not timed. A rung's other launch configuration
    (``build.knobs``) is compared with the rung's default build; another variant outside the
    ladder (your own) with the variant listed before it."""
    if section is None:
        return no_results("timing table")
    section = section.view()
    rows = section.rows
    peers = sorted({r.implementation for r in rows if r.kind == "peer"}, key=lambda p: implementation_order(section, p))
    dated = len(run_dates(section)) > 1
    head = (["direction", "implementation", "median ms", "p10-p90 ms", "GB/s", "of bandwidth", "extra MiB",
             "rel. error"] + [f"&times; {p}" for p in peers] + ["&times; rung below"] + (["measured"] if dated else []))
    body = []
    ladder = list(section.ladder)
    for direction in problems.DIRECTIONS:
        timed = {r.implementation: r for r in (*rung_below, *rows) if r.direction == direction
                 and r.kind == "variant" and tuple(r.shape) == tuple(section.primary_shape or ())
                 and r.dtype == section.primary_dtype}
        previous = None
        for r in sorted((r for r in rows if r.direction == direction),
                        key=lambda r: implementation_order(section, r.implementation)):
            rung = ladder.index(r.implementation) if r.implementation in ladder else -1
            below = previous if rung < 0 else timed.get(ladder[rung - 1]) if rung > 0 else None
            if rung < 0 and knobs.rung_of(r.implementation) in ladder:  # a launch configuration: its default
                below = timed.get(knobs.rung_of(r.implementation))
            body.append(_timing_row(r, below, peers, dated))
            previous = r if r.kind == "variant" else previous
    flagged = [f"{r.implementation} {r.direction}: {r.floor_note}" for r in rows if r.below_floor]
    absent = [f"{s.implementation} not timed: {s.reason}" for s in section.skipped
              if tuple(s.shape) == tuple(section.primary_shape or ()) and s.dtype == section.primary_dtype]
    bw = bandwidth_gbps(section)
    shape = "x".join(map(str, section.primary_shape or ()))
    caption = (f"{section.problem} {shape} {section.primary_dtype}, {html.escape(measured_where(section))}: median "
               f"of {max((r.repeats for r in rows), default=0)} calls with L2 flushed; GB/s = the cost model's minimum "
               f"bytes / median time; measured bandwidth: read {bw['read']:.0f} GB/s, copy {bw['copy']:.0f} GB/s. "
               "Peers in italics.")
    notes = "".join(f'<p style="color:{BAD}">{FLAG} {html.escape(f)}</p>' for f in flagged)
    notes += "".join(f"<p><small>{html.escape(a)}</small></p>" for a in absent)
    plain = f"timing table of {section.problem} ({len(rows)} rows)" + "".join(f"\n* {f}" for f in (*flagged, *absent))
    return Html(table(head, body, caption, text_columns=2) + notes, plain=plain)


def ceilings_table(section: records.Section | None) -> Html:
    """A section's ceilings: measured beside the datasheet, with units, device, date and source."""
    if section is None:
        return no_results("ceilings")
    ceilings = section.ceilings
    sheet = datasheet(section.device)
    rows = [("read bandwidth", ceilings.get("read_gbps"), sheet and sheet.memory_gbps, "GB/s"),
            ("copy bandwidth", ceilings.get("copy_gbps"), sheet and sheet.memory_gbps, "GB/s"),
            ("FP32 FMA", ceilings.get("fp32_fma_tflops"), sheet and sheet.fp32_tflops, "TFLOP/s"),
            ("MUFU ex2", ceilings.get("mufu_ex2_tops"), None, "Tops/s")]

    def fmt(v) -> str:
        return f"{v:,.1f}" if isinstance(v, (int, float)) else "not measured"

    body = [[name, fmt(measured), fmt(peak) if peak else "-", unit] for name, measured, peak, unit in rows]
    notes = [measured_where(section)]
    if sheet:
        notes.append(f"datasheet ({sheet.product}, not measured; the bandwidth is the DRAM peak): {sheet.source}")
    if "compute_error" in ceilings:
        notes.append(f"FP32/MUFU not measured: {ceilings['compute_error']}")
    plain = "\n".join([f"{'ceiling':<16} {'measured':>14} {'datasheet':>12}  unit",
                       *(f"{n:<16} {m:>14} {p:>12}  {u}" for n, m, p, u in body), *notes])
    caption = f"{section.problem}: " + "; ".join(html.escape(n) for n in notes)
    return Html(table(["ceiling", "measured", "datasheet", "unit"], body, caption, text_columns=1), plain=plain)


def records_table(results_dir: Path | str | None = None) -> Html:
    """Every record under ``results_dir`` (default ``reports/results/``): per device and problem,
    the sizes and dtypes it holds, the dates of its runs, the torch and CUDA versions, its
    sources hash and whether that matches the sources now; or a line saying there is none."""
    folder = Path(results_dir) if results_dir else records.RESULTS_DIR
    found = records.load_records(folder) if folder.is_dir() else []
    body, plain = [], []
    for record in found:
        for problem, section in sorted(record.sections.items()):
            holds = ", ".join("x".join(map(str, s)) for s in section.shapes) + "; " + ", ".join(section.dtypes)
            dates = ", ".join(format_date(d) for d in run_dates(section))
            fresh = "yes" if section.is_fresh() else f'<b style="color:{BAD}">no</b>'
            body.append([html.escape(record.device), html.escape(problem), html.escape(holds), html.escape(dates),
                         html.escape(f"torch {section.torch}, CUDA {section.cuda}"),
                         f"<code>{section.sources_sha256[:12]}</code>", fresh])
            state = "matches the sources now" if section.is_fresh() else "sources changed since"
            plain.append(f"{record.device:<24} {problem:<14} {holds}; {dates} ({state})")
    if not body:
        return message(f"No recorded results under {shown_path(folder)}: without a GPU the notebooks show the model "
                       "only. Run `python -m losslab bench <problem>` on a GPU machine and commit the record.")
    head = ["device", "problem", "sizes; dtypes", "runs (UTC)", "versions", "sources sha256", "matches the sources now"]
    caption = f"Recorded results under {html.escape(shown_path(folder))}"
    return Html(table(head, body, caption, text_columns=5), plain="\n".join(plain))


def operator_table(problem: problems.Problem, device: str | None = None, results_dir: Path | str | None = None) -> Html:
    """From the top teaching rung to the operator, timed: at the record's seed size, forward and
    forward+backward median ms (L2 flushed) of the top teaching rung (float32), of the operator's
    kernels of the same name and of the public operator (``losslab.nn``, PyTorch's default options)
    in every dtype recorded, each with its time over the teaching rung's in float32 (×). What
    dtypes and options cost, or save, in time; the diff shows them in code.

    A record without teaching or operator rows (made before they were recorded) says so."""
    try:
        section = records.latest_section(problem, device, Path(results_dir) if results_dir else records.RESULTS_DIR)
    except LookupError as err:
        return no_results(str(err))
    top = ladder.rungs(problem.name)[-1]
    taught = f"{top} {LADDER_TAG}"
    seed = tuple(problem.sizes["seed"])
    rows = [r for r in section.rows if tuple(r.shape) == seed]
    times = {(r.implementation, r.dtype, r.direction): r.median_ms for r in rows}
    base = {d: times.get((taught, "float32", d)) for d in ("forward", "forward_backward")}
    if not all(base.values()) or not any(r.implementation == OPERATOR for r in rows):
        return message(f"the {section.device} record of {problem.name} holds no teaching rung or public operator rows "
                       f"at {seed[0]}x{seed[1]}: re-record with scripts/gpu_suite.sh")
    body, plain = [], []
    for name, label in ((taught, f"teaching {top} (kernels/{problem.name}/ladder/{top}.cu)"),
                        (top, f"operator kernels {top} (kernels/{problem.name}/{top}.cu)"),
                        (OPERATOR, f"{OPERATOR}.functional, default options")):
        for dtype in section.dtypes:
            cells = [times.get((name, dtype, d)) for d in ("forward", "forward_backward")]
            if not any(cells):
                continue
            shown = [f"{ms:.3f} (×{ms / base[d]:.2f})" if ms else "—"
                     for ms, d in zip(cells, ("forward", "forward_backward"), strict=True)]
            body.append([html.escape(label), dtype, *shown])
            plain.append(f"{label:<58} {dtype:<9} " + "  ".join(f"{c:>16}" for c in shown))
    caption = (f"{problem.name} at {seed[0]}x{seed[1]} on {section.device}: median ms per call, × the teaching "
               f"{top} in float32")
    return Html(table(["implementation", "dtype", "forward ms", "forward+backward ms"], body, caption,
                      text_columns=2), plain=caption + "\n" + "\n".join(plain))
