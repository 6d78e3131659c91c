"""What the notebooks call: each cell calls one function here and shows its result.

    section = workbook.load_results("kl_div")          # live on a GPU, else the newest record
    workbook.banner(section, "kl_div")                 # live or recorded, device, date, kernel hash
    workbook.side_by_side("kl_div", "naive", "shared_memory")
    workbook.check_table(section)
    workbook.timing_table(section)
    workbook.bandwidth_chart(section)

``load_results`` returns a recorded section dict (the format ``python -m losslab
bench`` writes, see ``results.py``) with two keys added: ``problem`` and
``source`` ("live" or "recorded"); or None when there is no GPU and nothing is
recorded. Every display function accepts None and then renders a message
saying there are no results yet, so a notebook runs top to bottom either way.
Tables are :class:`Html` (a str that Jupyter renders as HTML); charts are
matplotlib Figures made without pyplot, so a cell shows each one exactly once.
"""
from __future__ import annotations

import datetime as dt
import html
from pathlib import Path

import torch

from losslab import problems
from losslab import records
from losslab.measure.bench import PEERS
from losslab.build import KERNELS

METADATA_KEY = "losslab"  # output metadata key under which the banner records what a notebook shows
WARP = 32
LINE_BYTES = 128  # one L1/L2 cache line; a fully coalesced warp load of 32 floats fills exactly one
SECTOR_BYTES = 32  # the unit in which L2 and DRAM move data


class Html(str):
    """A str of HTML that Jupyter renders as HTML.

    ``plain`` is the text/plain form (shown by consoles and text exports);
    ``metadata`` is attached to the notebook output, where ``report.py`` reads it.
    """

    def __new__(cls, text: str, plain: str = "", metadata: dict | None = None):
        obj = super().__new__(cls, text)
        obj.plain = plain or "(HTML output)"
        obj.metadata = metadata or {}
        return obj

    def _repr_mimebundle_(self, include=None, exclude=None):
        return {"text/html": str(self), "text/plain": self.plain}, self.metadata


def _no_results(what: str) -> Html:
    text = f"No results yet, so no {what}: see the note at the top of the notebook."
    return Html(f'<p style="color:#a40"><b>{html.escape(text)}</b></p>', plain=text)


def _table(head: list[str], body: list[list[str]], caption: str = "", text_columns: int = 1) -> str:
    """HTML table; cells are already-escaped HTML. The first ``text_columns`` columns are
    left-aligned, the rest (numbers) right-aligned."""
    cell = 'style="text-align:{};padding:2px 8px"'
    th = "".join(f'<th {cell.format("left")}>{h}</th>' for h in head)
    rows = "".join("<tr>" + "".join(f'<td {cell.format("left" if i < text_columns else "right")}>{c}</td>'
                                    for i, c in enumerate(row)) + "</tr>" for row in body)
    cap = f'<caption style="text-align:left">{caption}</caption>' if caption else ""
    return f'<table style="border-collapse:collapse">{cap}<thead><tr>{th}</tr></thead><tbody>{rows}</tbody></table>'


# --- results: live or recorded ---------------------------------------------------------------

def gpu_name() -> str | None:
    """Name of the visible CUDA device, or None without one."""
    return torch.cuda.get_device_name() if torch.cuda.is_available() else None


def _recorded_device(device: str, results_dir: Path) -> str:
    """The recorded device name that ``device`` (a name or a file-name slug) refers to."""
    for record in records.load_records(results_dir):
        if records.device_slug(record["device"]) == records.device_slug(device):
            return record["device"]
    return device


def load_results(problem: str, *, device: str | None = None, size: str = "seed",
                 variants: list[str] | None = None, repeats: int = 20, live: bool | None = None,
                 results_dir: Path | str | None = None) -> dict | None:
    """One problem's results: measured now on the GPU, or else the newest record.

    Args:
        device: a device name ("NVIDIA H200") or its slug ("nvidia-h200"); None
            means the visible GPU when measuring live, else the newest record of any device.
        size: a size name of the problem ("seed", "small", ...) for a live run.
        variants: the rungs to measure live (default all); a record holds what was recorded.
        repeats: timed calls per measurement in a live run.
        live: True measures now; False renders the record; None measures now when a
            CUDA GPU is visible (and is ``device``, if one is named).
        results_dir: the folder of records (default ``reports/results/``).

    Returns the section dict (keys device, date, torch, cuda, kernels_sha256,
    shape, dtype, repeats, bandwidth_gbps {read, copy} in GB/s, rows, checks)
    plus ``problem`` and ``source`` ("live" or "recorded"); None when not live
    and nothing is recorded for ``problem`` (on ``device``).

    Raises:
        RuntimeError: ``live=True`` without a CUDA GPU.
        ValueError: unknown problem, size or variant.
    """
    spec = problems.get(problem)
    if size not in spec.sizes:
        raise ValueError(f"size: {problem} has no size {size!r}; expected one of {', '.join(spec.sizes)}")
    for name in variants or []:
        spec.check_variant_name(name)
    here = gpu_name()
    if live is None:
        live = here is not None and (device is None or records.device_slug(device) == records.device_slug(here))
    if live:
        if here is None:
            raise RuntimeError("live=True needs a CUDA GPU and none is visible here; "
                               "use live=None or False to render the recorded results")
        return _measure(problem, spec.sizes[size], variants, repeats)
    results_dir = Path(results_dir) if results_dir else records.RESULTS_DIR
    try:
        section = records.latest_section(problem, device and _recorded_device(device, results_dir), results_dir)
    except LookupError:
        return None
    if variants:  # show the rungs asked for (and the peers), as a live run would
        section = {**section, "rows": [r for r in section["rows"] if r["kind"] == "peer" or r["implementation"] in variants],
                   "checks": [c for c in section["checks"] if c["variant"] in variants]}
    return {**section, "problem": problem, "source": "recorded"}


def _measure(problem: str, shape: tuple[int, int], variants: list[str] | None, repeats: int) -> dict:
    """What ``python -m losslab bench`` records, measured now and not saved."""
    from losslab.measure.bench import bench_problem
    from losslab.measure.check import check_problem
    from losslab.present.roofline import measure_bandwidth

    section = records.provenance(problem)
    bandwidth = measure_bandwidth()
    checks = check_problem(problem, variants)
    rows = bench_problem(problem, shape, variants, repeats=repeats, bandwidth=bandwidth)
    section.update(shape=list(shape), dtype="float32", repeats=repeats, bandwidth_gbps=bandwidth,
                   rows=[r.as_dict() for r in rows], checks=[c.as_dict() for c in checks])
    return {**section, "problem": problem, "source": "live"}


def provenance(section: dict) -> dict:
    """What a banner states: problem, source, device, date, kernel hash, whether it matches kernels/."""
    return {"problem": section["problem"], "source": section["source"], "device": section["device"],
            "date": section["date"], "kernels_sha256": section["kernels_sha256"],
            "fresh": records.is_fresh(section, section["problem"])}


def _date(iso: str) -> str:
    try:
        return dt.datetime.fromisoformat(iso).strftime("%Y-%m-%d %H:%M UTC")
    except ValueError:
        return iso


def banner(section: dict | None, problem: str, size: str | None = None) -> Html:
    """One line saying where the numbers below come from: live or recorded, device, date,
    versions, shape, and whether the record's kernel hash still matches ``kernels/``.

    ``size`` (the notebook's parameter) is mentioned when a record was taken at another shape.
    The output carries the provenance as metadata, which ``report.py`` reads.
    """
    if section is None:
        text = (f"No recorded results yet for {problem} (looked in "
                f"{records.RESULTS_DIR.relative_to(records.RESULTS_DIR.parents[1])}/) and no GPU here: "
                f"the cells below show the model and the kernels but no measurements. Run "
                f"`python -m losslab bench {problem}` on a GPU machine and commit the record.")
        return Html(f'<p style="color:#a40"><b>{html.escape(text)}</b></p>', plain=text,
                    metadata={METADATA_KEY: {"problem": problem, "source": "none"}})
    info = provenance(section)
    rows, cols = section["shape"]
    when = "measured now" if info["source"] == "live" else "recorded"
    head = "LIVE results" if info["source"] == "live" else "RECORDED results (not measured now)"
    text = (f"{head}: {problem} {rows}x{cols} {section['dtype']}, {when} on {info['device']} "
            f"on {_date(info['date'])} (torch {section['torch']}, CUDA {section['cuda']}); "
            f"kernels sha256 {info['kernels_sha256'][:12]} ")
    if info["fresh"]:
        text += "matches kernels/."
    else:
        text += ("does NOT match kernels/: the kernels changed since; rerun "
                 f"`python -m losslab bench {problem}` on a GPU and commit the record.")
    spec = problems.get(problem)
    if size is not None and info["source"] == "recorded" and tuple(spec.sizes.get(size, ())) != (rows, cols):
        text += f" (The size parameter {size!r} applies to live runs only.)"
    color = "#060" if info["fresh"] else "#a40"
    return Html(f'<p style="color:{color}"><b>{html.escape(text)}</b></p>', plain=text,
                metadata={METADATA_KEY: info})


# --- the ladder ------------------------------------------------------------------------------

def kernel_source(problem: str, variant: str) -> str:
    """The text of ``kernels/<problem>/<variant>.cu``.

    Raises:
        ValueError: unknown problem or variant.
    """
    problems.get(problem).check_variant_name(variant)
    return (KERNELS / problem / f"{variant}.cu").read_text()


def rung_header(problem: str, variant: str) -> str:
    """The opening ``//`` comment of a rung's .cu file as one paragraph: what the rung does
    and which flaw of the rung below it fixes."""
    lines = []
    for line in kernel_source(problem, variant).splitlines():
        if not line.startswith("//"):
            break
        lines.append(line[2:].strip())
    return " ".join(lines)


def ladder_summary(problem: str, variants: list[str] | None = None) -> Html:
    """A table of the rungs, each with its header comment (what it fixes)."""
    variants = list(variants or problems.get(problem).variants)
    body = [[f"<code>{html.escape(v)}</code>", html.escape(rung_header(problem, v))] for v in variants]
    plain = "\n".join(f"{v}: {rung_header(problem, v)}" for v in variants)
    return Html(_table(["rung", "what it does, and what it fixes"], body, text_columns=2), plain=plain)


def side_by_side(problem: str, left: str, right: str) -> Html:
    """The sources of two rungs (e.g. "naive", "shared_memory") as a two-column HTML table,
    escaped and monospaced, each headed by its path under ``kernels/``.

    Raises:
        ValueError: unknown problem or variant.
    """
    columns = [(v, kernel_source(problem, v)) for v in (left, right)]
    head = "".join(f'<th style="text-align:left">kernels/{problem}/{html.escape(v)}.cu</th>' for v, _ in columns)
    cells = "".join('<td style="text-align:left;vertical-align:top;width:50%">'
                    '<pre style="font-family:monospace;font-size:11px;white-space:pre;overflow-x:auto">'
                    f"{html.escape(src)}</pre></td>" for _, src in columns)
    plain = "\n\n".join(f"==> kernels/{problem}/{v}.cu <==\n{src}" for v, src in columns)
    return Html(f'<table style="table-layout:fixed;width:100%"><tr>{head}</tr><tr>{cells}</tr></table>',
                plain=plain)


# --- the model, before measuring ---------------------------------------------------------------

def _bytes(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def ceiling_for(problem: str, shape: tuple[int, int], direction: str) -> str:
    """Which measured bandwidth bounds ``direction``: "read" when it writes (almost) nothing,
    else "copy" (the same rule as ``bench.py``)."""
    return "read" if problems.get(problem).cost(shape, direction).bytes_written <= 64 else "copy"


def floor_ms(problem: str, shape: tuple[int, int], direction: str, bandwidth_gbps: dict[str, float]) -> float:
    """The least time of ``direction`` in ms: minimum bytes over the measured bandwidth
    (``bandwidth_gbps`` in GB/s, keys "read" and "copy")."""
    cost = problems.get(problem).cost(shape, direction)
    return cost.bytes / (bandwidth_gbps[ceiling_for(problem, shape, direction)] * 1e6)


def cost_table(problem: str, shape: tuple[int, int], bandwidth_gbps: dict[str, float] | None = None) -> Html:
    """The cost model per direction at ``shape``: bytes read and written, FLOPs,
    transcendentals, arithmetic intensity, and the floor time in ms at the measured
    bandwidth (GB/s) if given, else the time at 1 TB/s."""
    spec = problems.get(problem)
    floor_head = "floor ms (measured bw)" if bandwidth_gbps else "ms at 1 TB/s"
    body = []
    for direction in problems.DIRECTIONS:
        cost = spec.cost(shape, direction)
        ceiling = ceiling_for(problem, shape, direction)
        if bandwidth_gbps:
            floor = f"{floor_ms(problem, shape, direction, bandwidth_gbps):.3f} ({ceiling} {bandwidth_gbps[ceiling]:.0f} GB/s)"
        else:
            floor = f"{cost.bytes / 1e9:.3f} ({ceiling})"
        body.append([direction, _bytes(cost.bytes_read), _bytes(cost.bytes_written), f"{cost.flops:.3g}",
                     f"{cost.transcendentals:.3g}", f"{cost.arithmetic_intensity:.2f}", floor])
    head = ["direction", "bytes read", "bytes written", "FLOP", "log/exp", "FLOP/byte", floor_head]
    rows, cols = shape
    return Html(_table(head, body, f"{problem} {rows}x{cols} float32: the least traffic and arithmetic"),
                plain=f"cost model of {problem} at {rows}x{cols}")


def measured_floor(section: dict | None) -> Html:
    """:func:`cost_table` at the shape and measured bandwidth of ``section``."""
    if section is None:
        return _no_results("measured floor")
    return cost_table(section["problem"], tuple(section["shape"]), section["bandwidth_gbps"])


def coalescing_figure(cols: int = 16384):
    """Which 128-byte cache lines one warp-wide load of float32 touches, per rung:
    naive (lane k reads row k: 32 lines and 32 sectors for 32 floats), shared_memory and
    warp_shuffle (32 consecutive floats: one line), vectorized (a float4 per lane: 4 full lines).

    ``cols`` is the row length D (floats between two naive lanes). Returns a matplotlib Figure.
    """
    from matplotlib.figure import Figure

    floats_per_line = LINE_BYTES // 4
    patterns = {  # element offsets (in floats) that lanes 0..31 read in one load instruction
        f"naive: lane k reads p[k*D + j]\n(D = {cols})": [k * cols for k in range(WARP)],
        "shared_memory / warp_shuffle:\nlane k reads p[row*D + j + k]": list(range(WARP)),
        "vectorized: lane k reads a float4\nat p[row*D + 4*(j + k)]": [4 * k + e for k in range(WARP) for e in range(4)],
    }
    fig = Figure(figsize=(11, 3.6), layout="constrained")
    axes = fig.subplots(1, len(patterns))
    for ax, (title, offsets) in zip(axes, patterns.items()):
        lines = sorted({o // floats_per_line for o in offsets})
        sectors = {o * 4 // SECTOR_BYTES for o in offsets}
        grid = torch.zeros(WARP, floats_per_line)  # row i: the i-th line touched; blank rows: none
        for o in offsets:
            grid[lines.index(o // floats_per_line), o % floats_per_line] = 1
        ax.imshow(grid.numpy(), cmap="Greens", vmin=0, vmax=1.3, aspect="equal", interpolation="nearest")
        ax.set_title(f"{title}\n{len(lines)} line(s), {len(sectors)} sectors fetched: "
                     f"{len(offsets) * 4} of {len(sectors) * SECTOR_BYTES} bytes used", fontsize=9)
        ax.set_xlabel("float within a 128-byte line")
        ax.set_ylabel("cache lines touched (one per row)")
        ax.set_yticks([])
        ax.set_xticks([0, 31])
    fig.suptitle("One warp-wide load instruction: the cache lines it touches (green: the floats the warp uses; "
                 "memory moves in 32-byte sectors)", fontsize=10)
    return fig


# --- the measurements -------------------------------------------------------------------------

def _order(section: dict, implementation: str) -> int:
    """Sort key: the ladder's rungs in order, then the peers."""
    order = [*problems.get(section["problem"]).variants, *PEERS]
    return order.index(implementation) if implementation in order else len(order)


def check_table(section: dict | None) -> Html:
    """Correctness against the float64 PyTorch reference: one row per case (random
    sizes, edge cases), one column per variant and direction, each cell the relative
    error with a tick or a cross (hover for the reason of a failure)."""
    if section is None:
        return _no_results("correctness table")
    checks = section["checks"]
    if not checks:
        return Html("<p>The record holds no correctness checks (bench ran with --no-check).</p>",
                    plain="no correctness checks recorded")
    variants = sorted({c["variant"] for c in checks}, key=lambda v: _order(section, v))
    columns = [(v, d) for v in variants for d in ("forward", "backward")]
    cases = list(dict.fromkeys(c["case"] for c in checks))
    found = {(c["case"], c["variant"], c["direction"]): c for c in checks}
    body = []
    for case in cases:
        row = [html.escape(case)]
        for key in columns:
            c = found.get((case, *key))
            if c is None:
                row.append("")
                continue
            mark = "&#10003;" if c["passed"] else "&#10007;"
            style = "" if c["passed"] else ' style="color:#b00;font-weight:bold"'
            row.append(f'<span{style} title="{html.escape(c["detail"])}">{c["error"]:.1e} {mark}</span>')
        body.append(row)
    passed = sum(c["passed"] for c in checks)
    first = checks[0]
    tol = {c["direction"]: c["tolerance"] for c in checks}
    caption = (f"{passed} of {len(checks)} checks passed. Relative error against the reference in float64 "
               f"(loss: |l - l64|/|l64| &le; {tol.get('forward', 0):.0e}; gradient: "
               f"||g - g64||/||g64|| &le; {tol.get('backward', 0):.0e}); each check also reruns into "
               f"NaN-poisoned outputs and must match bitwise.")
    head = ["case"] + [f"{html.escape(v)}<br>{d}" for v, d in columns]
    return Html(_table(head, body, caption), plain=f"{passed} of {len(checks)} checks passed ({first['problem']})")


def timing_table(section: dict | None) -> Html:
    """Times per direction and implementation: median and p10-p90 in ms, achieved GB/s,
    fraction of the measured bandwidth, peak extra MiB, relative error, speedups over the
    peers (eager, compile) and over the rung below."""
    if section is None:
        return _no_results("timing table")
    rows = section["rows"]
    peers = sorted({r["implementation"] for r in rows if r["kind"] == "peer"}, key=lambda p: _order(section, p))
    bw = section["bandwidth_gbps"]
    head = (["direction", "implementation", "median ms", "p10-p90 ms", "GB/s", "of bandwidth", "extra MiB",
             "rel. error"] + [f"&times; {p}" for p in peers] + ["&times; rung below"])
    body = []
    for direction in problems.DIRECTIONS:
        group = sorted((r for r in rows if r["direction"] == direction), key=lambda r: _order(section, r["implementation"]))
        below = None
        for r in group:
            step = ""
            if r["kind"] == "variant":
                step = f"{below['median_ms'] / r['median_ms']:.2f}" if below else ""
                below = r
            name = f"<b>{r['implementation']}</b>" if r["kind"] == "variant" else f"<i>{r['implementation']}</i>"
            body.append([direction, name, f"{r['median_ms']:.3f}", f"{r['p10_ms']:.3f}-{r['p90_ms']:.3f}",
                         f"{r['gbps']:.0f}", f"{r['fraction_of_bandwidth']:.0%} of {r['bandwidth']}",
                         f"{r['peak_extra_bytes'] / 2**20:.2f}", f"{r['error']:.1e}"]
                        + [f"{r['speedup'][p]:.2f}" if p in r["speedup"] else "" for p in peers] + [step])
    shape = "x".join(map(str, section["shape"]))
    caption = (f"{section['problem']} {shape} {section['dtype']}, median of {section['repeats']} calls with L2 "
               f"flushed; GB/s = the cost model's minimum bytes / median time; measured bandwidth: "
               f"read {bw['read']:.0f} GB/s, copy {bw['copy']:.0f} GB/s. Peers in italics.")
    return Html(_table(head, body, caption, text_columns=2), plain=f"timing table of {section['problem']} ({len(rows)} rows)")


def bandwidth_chart(section: dict | None):
    """Bars of each variant's and peer's achieved GB/s, one panel per direction, with the
    measured read and copy bandwidth as horizontal lines. The y axis turns logarithmic
    (and says so) when the slowest bar is more than 20x below the fastest.

    Returns a matplotlib Figure, or an Html message when ``section`` is None.
    """
    if section is None:
        return _no_results("bandwidth chart")
    from matplotlib.figure import Figure

    rows, bw = section["rows"], section["bandwidth_gbps"]
    fig = Figure(figsize=(12, 4), layout="constrained")
    axes = fig.subplots(1, len(problems.DIRECTIONS), sharey=True)
    gbps = [r["gbps"] for r in rows]
    log = max(gbps) / max(min(gbps), 1e-9) > 20
    for ax, direction in zip(axes, problems.DIRECTIONS):
        group = sorted((r for r in rows if r["direction"] == direction), key=lambda r: _order(section, r["implementation"]))
        names = [r["implementation"] for r in group]
        values = [r["gbps"] for r in group]
        colors = ["tab:blue" if r["kind"] == "variant" else "tab:gray" for r in group]
        bars = ax.bar(names, values, color=colors)
        ax.bar_label(bars, labels=[f"{v:.0f}" for v in values], fontsize=8)
        ax.axhline(bw["read"], color="tab:red", linestyle="--", label=f"read bandwidth {bw['read']:.0f} GB/s")
        ax.axhline(bw["copy"], color="tab:orange", linestyle=":", label=f"copy bandwidth {bw['copy']:.0f} GB/s")
        ax.set_title(direction)
        ax.tick_params(axis="x", labelrotation=30, labelsize=8)
        if log:
            ax.set_yscale("log")
    top = max(*gbps, *bw.values())
    axes[0].set_ylim((min(gbps) / 2, top * 2) if log else (0, top * 1.15))
    axes[0].set_ylabel("GB/s (minimum bytes / time)" + (", log scale" if log else ""))
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncols=2, fontsize=8)
    shape = "x".join(map(str, section["shape"]))
    where = "measured now" if section["source"] == "live" else "recorded"
    fig.suptitle(f"{section['problem']} {shape}: achieved bandwidth ({where} on {section['device']}, "
                 f"{_date(section['date'])}; blue: variants, grey: PyTorch peers"
                 + ("; log scale" if log else "") + ")", fontsize=10)
    return fig
