"""The roofline plot: each (implementation, direction) of a recorded or live section against
the device's ceilings. Plots only: the ceilings are measured by ``losslab.measure.ceilings``.

Each point sits at its model arithmetic intensity (cost-model FLOP / minimum bytes) and its
achieved FLOP/s (cost-model FLOP / measured median time); what else is drawn, and how points are
marked and named: :func:`plot_roofline`.

One module: the roofs, the points and their labels are placed together on one figure, none overlapping.
"""
from __future__ import annotations

import math
import string
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from losslab import problems, records
from losslab.measure.ceilings import datasheet
from losslab.present.charts import COLORS, wrap_title
from losslab.present.results import bandwidth_gbps, measured_where


@dataclass(frozen=True)
class Point:
    """One (implementation, direction) on the roofline.

    ``flops`` and ``model_bytes`` come from the cost model (at the row's own dtype),
    ``median_ms`` from the bench, ``measured_bytes`` (DRAM bytes read + written) from Nsight
    Compute, if it ran; ``floor_verdict`` is empty, or why the time is below the physical floor;
    ``elsewhere`` is True where ncu measured the kernels moving almost none of the bytes.
    """

    problem: str
    implementation: str
    kind: str  # "variant" or "peer"
    direction: str
    flops: int
    model_bytes: int
    median_ms: float
    measured_bytes: float | None = None
    floor_verdict: str = ""
    elsewhere: bool = False

    @property
    def intensity(self) -> float:
        """Model arithmetic intensity in FLOP/byte."""
        return self.flops / self.model_bytes

    @property
    def flops_per_s(self) -> float:
        """Achieved FLOP/s: model FLOP over the measured median time."""
        return self.flops / (self.median_ms * 1e-3)

    @property
    def measured_intensity(self) -> float | None:
        """Model FLOP per DRAM byte actually moved (None without an ncu profile)."""
        return self.flops / self.measured_bytes if self.measured_bytes else None


DIRECTIONS = ("forward", "backward", "forward_backward")


def points(section: records.Section, directions: tuple[str, ...] = DIRECTIONS) -> list[Point]:
    """Roofline points of one section's rows at its shown shape and dtype (``Section.view``).
    Each point's bytes are its own dtype's (the cost model at the row's dtype); a hollow
    (measured-traffic) point only where ncu profiled that same shape in that same dtype (ncu
    profiles float32), never a bf16 time over float32 bytes, and never for a row whose kernels
    moved almost none of its bytes (``evidence.work_elsewhere``: ``elsewhere`` is set instead)."""
    from losslab.present.evidence import work_elsewhere

    section = section.view()
    ncu = section.ncu
    measured = {}
    if (ncu is not None and ncu.status == "ok" and tuple(ncu.shape) == tuple(section.primary_shape or ())
            and section.primary_dtype == "float32"):  # ncu profiles float32
        measured = {(r.implementation, r.direction): r.dram_bytes_read + r.dram_bytes_written for r in ncu.records}
    away = {(e.implementation, e.direction) for e in work_elsewhere(section)}
    spec, out = section.spec, []
    for row in section.rows:
        # the rungs and the peers: the teaching rungs and the public operator are in notebooks 01/02 and the sweep
        if row.direction not in directions or row.kind not in ("variant", "peer"):
            continue
        cost = spec.cost(tuple(row.shape), row.direction, getattr(torch, row.dtype))
        key = (row.implementation, row.direction)
        # no measured-traffic point for a time that is no result or for kernels that did not do the work
        traffic = None if row.below_floor or key in away else measured.get(key)
        out.append(Point(row.problem, row.implementation, row.kind, row.direction, cost.flops, cost.bytes,
                         row.median_ms, traffic, row.floor_note, key in away))
    return out


# --- the plot ---------------------------------------------------------------

MARKERS = {"forward": "o", "backward": "s", "forward_backward": "^"}
SHORT = {"forward": "fwd", "backward": "bwd", "forward_backward": "fwd+bwd"}
LABEL_PT = 7  # the size of every text on the axes, in points
# the special-function roofs' colours: none of them an implementation's (charts.COLORS)
MUFU_COLORS = ("darkmagenta", "teal", "darkgoldenrod", "navy", "darkolivegreen", "darkslategray")
ELSEWHERE = "\u2205"  # the mark of a point whose kernels moved almost none of its bytes


def _roofs(section: records.Section) -> dict:
    """Memory roofs (GB/s) and compute roof (TFLOP/s) of a section, with where each came from."""
    sheet = datasheet(section.device)
    bandwidth = bandwidth_gbps(section)
    roofs = {"read_gbps": bandwidth["read"], "copy_gbps": bandwidth["copy"],
             "fp32_tflops": section.ceilings.get("fp32_fma_tflops"), "compute_source": "measured FMA",
             "datasheet": sheet}
    if roofs["fp32_tflops"] is None and sheet:
        roofs["fp32_tflops"], roofs["compute_source"] = sheet.fp32_tflops, "datasheet FP32"
    return roofs


def _roof_line(bandwidth: float, compute: float | None, x_range: tuple[float, float]):
    """The roof min(x * bandwidth, compute) over x_range as a polyline (bytes/s, FLOP/s)."""
    ridge = compute / bandwidth if compute else math.inf
    xs = [x_range[0], *([ridge] if x_range[0] < ridge < x_range[1] else []), x_range[1]]
    return xs, [min(x * bandwidth, compute or math.inf) for x in xs]


def _draw_roofs(ax, roofs: dict, x_range: tuple[float, float]) -> list[tuple[str, float]]:
    """The measured read and copy roofs, the FP32 roof and the datasheet's, each line labelled (for
    the tests and tools that read them); returns the ridges [(read|copy, FLOP/B)]."""
    compute = roofs["fp32_tflops"] * 1e12 if roofs["fp32_tflops"] else None
    ridges = []
    for key, style, label in (("read_gbps", "-", "read"), ("copy_gbps", "--", "copy")):
        if roofs[key]:
            xs, ys = _roof_line(roofs[key] * 1e9, compute, x_range)
            ax.plot(xs, ys, style, color="black", lw=1.2, label=f"{label} roof {roofs[key]:.0f} GB/s (measured)")
            if compute:
                ridges.append((label, compute / (roofs[key] * 1e9)))
    if compute:
        ax.axhline(compute, color="black", lw=0.6, ls=":",
                   label=f"FP32 roof {roofs['fp32_tflops']:.1f} TFLOP/s ({roofs['compute_source']})")
    if ridges:
        ax.plot([x for _, x in ridges], [compute] * len(ridges), "D", color="black", ms=5)
    sheet = roofs["datasheet"]
    if sheet:
        xs, ys = _roof_line(sheet.memory_gbps * 1e9, sheet.fp32_tflops * 1e12, x_range)
        ax.plot(xs, ys, color="0.6", lw=0.8, ls="-.",
                label=f"datasheet {sheet.product}: {sheet.memory_gbps:.0f} GB/s, {sheet.fp32_tflops:g} TFLOP/s")
    return ridges


def mufu_roofs(sections: list[records.Section], directions: tuple[str, ...] = DIRECTIONS) -> list[tuple[str, float]]:
    """The special-function (MUFU) ceiling in model FLOP/s per (problem, direction) with
    transcendentals: the measured ``mufu_ex2_tops`` times the cost model's FLOP per transcendental
    (a kernel that runs one MUFU op per log or exp cannot do its FLOP faster). [(label, FLOP/s)].
    A roof above the measured FP32 roof is left out: it never binds (a square root or two a row)."""
    out = []
    for section in sections:
        tops, fp32_tflops = section.ceilings.get("mufu_ex2_tops"), section.ceilings.get("fp32_fma_tflops")
        spec = section.spec
        if not tops or not section.primary_shape or spec is None:
            continue
        for direction in directions:
            cost = spec.cost(tuple(section.primary_shape), direction)
            if cost.transcendentals and any(r.direction == direction for r in section.rows):
                per = cost.flops / cost.transcendentals
                if fp32_tflops and tops * per > fp32_tflops:
                    continue
                out.append((f"MUFU roof {spec.name} {SHORT.get(direction, direction)}: {tops:.2f} Top/s x "
                            f"{per:.1f} FLOP per log/exp (measured)", tops * 1e12 * per))
    return out


def _draw_mufu(ax, roofs: list[tuple[str, float]], bandwidth_gbps: float | None, x_range) -> list[tuple]:
    """Each MUFU roof from its ridge with the read roof to the right edge, its ridge marked; returns
    [(name, FLOP/s, ridge FLOP/B, colour)] for :func:`_name_roofs`."""
    drawn = []
    for (label, flops), color in zip(roofs, MUFU_COLORS, strict=False):
        ridge = flops / (bandwidth_gbps * 1e9) if bandwidth_gbps else x_range[0]
        ax.plot([max(ridge, x_range[0]), x_range[1]], [flops, flops], color=color, lw=1.0, ls="-.",
                label=f"{label}, ridge {ridge:.1f} FLOP/B")
        ax.plot([ridge], [flops], "D", color=color, ms=4)
        drawn.append((label.split(":")[0], flops, ridge, color))
    return drawn


def _over_roof(p: Point, read_gbps: float | None) -> float:
    """How far above the measured read roof ``p`` sits (0.06: 6 % above; 0 or less: not above)."""
    if not read_gbps or p.floor_verdict or p.elsewhere:
        return 0.0
    return p.flops_per_s / (p.intensity * read_gbps * 1e9) - 1


def _draw_markers(ax, pts: list[Point], prefix_problem: bool) -> None:
    """Each point's marker (legend: one entry per implementation), a red cross on a time below the
    physical floor, a dashed ring on one whose kernels moved almost no bytes, and the hollow
    measured-traffic marker with its arrow."""
    labelled = set()
    for p in pts:
        color = COLORS.get(p.implementation, "tab:gray")
        marker = MARKERS.get(p.direction, "o")
        name = f"{p.problem} {p.implementation}" if prefix_problem else p.implementation
        legend = name if name not in labelled else None
        labelled.add(name)
        ax.plot([p.intensity], [p.flops_per_s], marker, color=color, ms=7, ls="none", label=legend,
                markeredgecolor="black" if p.kind == "variant" else color)
        if p.floor_verdict:  # crossed out: a time below the physical floor is no result
            ax.plot([p.intensity], [p.flops_per_s], "x", color="tab:red", ms=12, mew=2, ls="none")
        if p.elsewhere:  # ringed: its kernels did not do this direction's work
            ax.plot([p.intensity], [p.flops_per_s], "o", mfc="none", mec="0.2", ms=15, mew=1.0, ls="none")
        if p.measured_intensity:
            ax.plot([p.measured_intensity], [p.flops_per_s], marker, mfc="none", color=color, ms=7)
            ax.annotate("", (p.measured_intensity, p.flops_per_s), xytext=(p.intensity, p.flops_per_s),
                        arrowprops={"arrowstyle": "->", "color": color, "lw": 0.8})


def _pack(wanted: list[float], gap: float, low: float, high: float) -> list[float]:
    """Positions (pixels) as close to ``wanted`` (ascending) as can be, each at least ``gap`` above
    the one before, none below ``low`` and, where they fit, none above ``high``."""
    out: list[float] = []
    for w in wanted:
        out.append(max(w, low if not out else out[-1] + gap))
    if out and out[-1] > high:
        out[-1] = max(high, low + gap * (len(out) - 1))
        for i in range(len(out) - 2, -1, -1):
            out[i] = min(out[i], out[i + 1] - gap)
    return out


def _line_px(fig) -> float:
    """The height of one line of :data:`LABEL_PT` text in pixels, with a little air."""
    return LABEL_PT * fig.dpi / 72 * 1.45


def _text(ax, *args, **kwargs):
    """``ax.annotate`` left out of the layout: the labels go where the axes already are."""
    artist = ax.annotate(*args, fontsize=LABEL_PT, annotation_clip=False, **kwargs)
    artist.set_in_layout(False)
    return artist


def _name_points(ax, pts: list[Point], prefix_problem: bool, read_gbps: float | None, ceiling_px: float) -> None:
    """A label per point in a right-aligned column at the axes' right edge, in the order of the
    points' heights and as near each as the column allows, below ``ceiling_px`` (the lowest
    special-function roof), each joined to its point by a thin line."""
    to_px, to_data = ax.transData.transform, ax.transData.inverted().transform
    box = ax.get_window_extent()
    order = sorted(pts, key=lambda p: (p.flops_per_s, p.intensity))
    gap = _line_px(ax.figure)
    ys = _pack([to_px((p.intensity, p.flops_per_s))[1] for p in order], gap, box.y0 + gap, ceiling_px - gap)
    for p, y in zip(order, ys, strict=True):
        name = f"{p.problem} {p.implementation}" if prefix_problem else p.implementation
        over = _over_roof(p, read_gbps)
        text = (f"{name} ({SHORT.get(p.direction, p.direction)})"
                + (" \u2020 below the physical floor" if p.floor_verdict else "")
                + (f" {ELSEWHERE} its kernels moved no bytes" if p.elsewhere else "")
                + (f" {over:+.0%} over the read roof" if over > 0 else ""))
        color = COLORS.get(p.implementation, "tab:gray")
        _text(ax, text, (p.intensity, p.flops_per_s), xytext=tuple(to_data((box.x1 - 4, y))), textcoords="data",
              ha="right", va="center", color=color,
              arrowprops={"arrowstyle": "-", "color": color, "lw": 0.4, "alpha": 0.6, "relpos": (0, 0.5),
                          "shrinkA": 2, "shrinkB": 4})


def _name_roofs(ax, roofs: dict, ridges: list, mufu: list, x_range: tuple[float, float]) -> None:
    """Each ceiling's name on its line: the memory roofs along their slope at the left, the FP32
    roof above its line and the ridge below it, each special-function roof above its line at the
    right (stacked where two lie close)."""
    to_px, to_data = ax.transData.transform, ax.transData.inverted().transform
    gap = _line_px(ax.figure)
    read, copy, sheet = roofs["read_gbps"], roofs["copy_gbps"], roofs["datasheet"]
    slope = read or copy or (sheet.memory_gbps if sheet else None)
    if slope:
        x0 = x_range[0] * 1.2
        (ax0, ay0), (ax1, ay1) = to_px((x0, slope * 1e9 * x0)), to_px((x0 * 10, slope * 1e9 * x0 * 10))
        angle = math.degrees(math.atan2(ay1 - ay0, ax1 - ax0))
        names = [f"read {read:.0f}" if read else "", f"copy {copy:.0f}" if copy else ""]
        text = (", ".join(n for n in names if n) + " GB/s (measured)" if read or copy else "") + \
            (f"; datasheet {sheet.memory_gbps:.0f} (dash-dot)" if sheet else "")
        _text(ax, text.lstrip("; "), (x0, slope * 1e9 * x0), xytext=(0, 3), textcoords="offset points",
              rotation=angle, rotation_mode="anchor", ha="left", va="bottom")
    compute = roofs["fp32_tflops"]
    if compute:
        measured = roofs["compute_source"] != "datasheet FP32"
        sheet_note = f"; datasheet {sheet.fp32_tflops:g}" if sheet and measured else ""
        _text(ax, f"FP32 roof {compute:.1f} TFLOP/s ({roofs['compute_source']}{sheet_note})",
              (x_range[1] / 1.1, compute * 1e12), xytext=(0, 3), textcoords="offset points", ha="right", va="bottom")
        if ridges:
            _text(ax, "ridge " + ", ".join(f"{x:.1f} ({label})" for label, x in ridges) + " FLOP/B",
                  (max(x for _, x in ridges), compute * 1e12), xytext=(-6, -4), textcoords="offset points",
                  ha="right", va="top")
    if mufu:
        top = to_px((1.0, compute * 1e12))[1] - gap if compute else ax.get_window_extent().y1 - gap
        mufu = sorted(mufu, key=lambda m: m[1])
        ys = _pack([to_px((1.0, flops))[1] + gap / 2 for _, flops, _, _ in mufu], gap, 0.0, top)
        for (name, flops, ridge, color), y in zip(mufu, ys, strict=True):
            _text(ax, f"{name}: {flops / 1e12:.1f} TFLOP/s, ridge {ridge:.1f} FLOP/B",
                  (x_range[1] / 1.1, to_data((0.0, y))[1]), ha="right", va="center", color=color)


def _notes(ax, pts: list[Point], read_gbps: float | None, sheet) -> None:
    """What the marks mean, in one box at the top left (above the memory roof, where no point can be)."""
    notes = []
    above = [p for p in pts if _over_roof(p, read_gbps) > 0]
    if above:
        peak = max(p.flops_per_s / (p.intensity * sheet.memory_gbps * 1e9) for p in above) if sheet else None
        notes.append(f"+x% over the read roof: {len(above)} point(s) above the measured read roof. That roof is the "
                     "best of a large torch.sum and a two-stream read kernel, not the hardware's limit"
                     + (f"; the highest point is at {peak:.0%} of the datasheet peak (grey)" if peak else ""))
    if any(p.elsewhere for p in pts):
        notes.append(f"{ELSEWHERE} ringed: Nsight Compute measured its kernels moving almost none of the "
                     "direction's bytes: its work was done in another direction (Liger's cross-entropy writes "
                     "the gradient in its forward). Its time is no kernel's work, so it has no measured point.")
    if notes:
        text = "\n".join(textwrap.fill(n, 75) for n in notes)
        artist = ax.text(0.01, 0.99, text, transform=ax.transAxes, fontsize=LABEL_PT, va="top", ha="left",
                         bbox={"facecolor": "white", "edgecolor": "0.8", "alpha": 0.9, "pad": 2})
        artist.set_in_layout(False)


def _title(sections: list[records.Section]) -> str:
    """Each section's problem, shape and dtype, and the device, dates and versions its numbers come from."""
    return "\n".join(f"{s.problem} {'x'.join(map(str, s.primary_shape or ()))} {s.primary_dtype}:\n{measured_where(s)}"
                     for s in sections)


def _legend(ax, pts: list[Point], directions: tuple[str, ...]) -> None:
    """Outside the axes at the right: the implementations' colours (the points' handles only: the
    ceilings are named on their lines), the directions' markers and what each mark means."""
    from matplotlib.lines import Line2D

    handles = [h for h in ax.get_legend_handles_labels()[0]
               if isinstance(h, Line2D) and h.get_marker() not in ("None", "", None) and h.get_linestyle() == "None"]
    keys = [Line2D([], [], marker=MARKERS[d], color="0.4", ls="none", label=d) for d in directions if d in MARKERS]
    if any(p.measured_intensity for p in pts):
        keys.append(Line2D([], [], marker="o", mfc="none", color="0.4", ls="none",
                           label="hollow: over DRAM bytes measured by ncu"))
    if any(p.floor_verdict for p in pts):
        keys.append(Line2D([], [], marker="x", color="tab:red", mew=2, ls="none",
                           label="\u2020 below the physical floor (minimum bytes at the datasheet peak):\n"
                                 "a measurement artifact, not a result"))
    if any(p.elsewhere for p in pts):
        keys.append(Line2D([], [], marker="o", mfc="none", mec="0.2", ms=10, ls="none",
                           label=f"{ELSEWHERE} its kernels moved almost no bytes:\nits work was done elsewhere"))
    ax.legend(handles=handles + keys, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0),
              title="implementation, direction", title_fontsize=7)


def figure_size(n_points: int, room: float = 1.0, title_lines: int = 2) -> tuple[float, float]:
    """(width, height) in inches for a roofline of ``n_points`` labels: tall enough that the label
    column fits under the special-function roofs without overlapping. ``room``: the fraction of the
    axes' height below the lowest of those roofs; ``title_lines``: the title's lines."""
    return 14.0, max(7.5, 1.5 + 0.17 * title_lines + 0.2 * n_points / max(room, 0.2))


def plot_roofline(sections: records.Section | list[records.Section], directions: tuple[str, ...] = DIRECTIONS,
                  title: str | None = None, ax=None, implementations: tuple[str, ...] | None = None):
    """Draw the roofline of one or more bench sections (one per problem) from the same device.
    ``implementations``: only these implementations' points; by default every one of a single
    section, and of several only the fused rung's (the public operator's kernels) and torch.compile's:
    two points per problem and direction, where a hundred and fifty labelled points would be no figure
    to read.

    Log axes. Memory roofs from the measured read and copy bandwidth (GB/s), compute roof from
    the measured FP32 FMA rate (TFLOP/s; the datasheet's, labelled so, for a section recorded
    without it), the special-function (MUFU) roofs, ridge points marked, the datasheet roofs in
    grey; each named on its line. Filled markers: model intensity; hollow markers with an arrow:
    intensity over the DRAM bytes Nsight Compute measured; a red cross: a time below the physical
    floor; a ring: kernels that moved almost none of their bytes. Circles forward, squares
    backward, triangles forward + backward; black edges for the ladder's variants, none for the
    peers. Each point is named in a column at the right with a line to it. The title names the
    device and each section's date. With ``ax``, draws there (size its figure with
    :func:`figure_size`).

    A point whose time is below the physical floor (minimum bytes at the datasheet's peak
    bandwidth) is no result: it is crossed out in red and the legend says why. A point whose
    kernels moved almost none of its bytes (``evidence.work_elsewhere``: its work was done in
    another direction) gets no measured-traffic point (its intensity over almost no bytes would
    run off the axis) and is marked and explained. Every ceiling is named on its line and every
    label placed so that no two texts overlap (``tests/test_figures.py`` measures the rendered
    boxes).

    Returns the matplotlib Figure.

    Raises:
        ValueError: no section, or sections from different devices (one device's roofs only).
    """
    import matplotlib.pyplot as plt

    sections = [sections] if isinstance(sections, records.Section) else list(sections)
    if not sections:
        raise ValueError("sections: expected at least one recorded bench section")
    sections = [s.view() for s in sections]
    devices = list(dict.fromkeys(s.device for s in sections))
    if len(devices) > 1:
        raise ValueError(f"sections: expected sections of one device (one set of roofs), got {', '.join(devices)}")
    if implementations is None and len(sections) > 1:
        implementations = ("fused", "compile")
    pts = [p for s in sections for p in points(s, directions)
           if implementations is None or p.implementation in implementations]
    roofs = _roofs(sections[0])
    ys = [p.flops_per_s for p in pts]
    top = (roofs["fp32_tflops"] or 0) * 1e12 or max(ys, default=1e12)
    y_range = (min(ys, default=top / 1e4) / 8, max(top, *ys) * 6)
    mufu_lines = mufu_roofs(sections, directions)
    lowest = min([flops for _, flops in mufu_lines] + [top])  # the label column goes below it
    if ax is None:
        room = math.log(lowest / y_range[0]) / math.log(y_range[1] / y_range[0])
        lines = wrap_title(title or _title(sections), inches=figure_size(0)[0]).count("\n") + 1
        fig, ax = plt.subplots(figsize=figure_size(len(pts), room, lines), layout="constrained")
    else:
        fig = ax.figure
    xs = [p.intensity for p in pts] + [p.measured_intensity for p in pts if p.measured_intensity]
    ridge = (roofs["fp32_tflops"] or 0) * 1e3 / (roofs["read_gbps"] or math.inf)
    # room at the left for the memory roofs' name, at the right for the points' labels
    x_range = (min(xs, default=0.1) / 25, max([*xs, ridge, 1.0]) * 12)
    ridges = _draw_roofs(ax, roofs, x_range)
    mufu = _draw_mufu(ax, mufu_lines, roofs["read_gbps"], x_range)
    _draw_markers(ax, pts, prefix_problem=len(sections) > 1)
    ax.set(xscale="log", yscale="log", xlim=x_range, xlabel="arithmetic intensity (FLOP / byte, log scale)",
           ylabel="achieved FLOP/s (model FLOP / measured time, log scale)")
    ax.set_ylim(*y_range)
    ax.grid(True, which="both", lw=0.3, alpha=0.5)
    ax.set_title(wrap_title(title or _title(sections), fig), fontsize=10)
    _legend(ax, pts, directions)
    fig.draw_without_rendering()  # settle the layout: the labels below are placed in pixels
    to_px = ax.transData.transform
    ceiling = min([to_px((1.0, flops))[1] for _, flops, _, _ in mufu] +
                  ([to_px((1.0, top))[1]] if roofs["fp32_tflops"] else [ax.get_window_extent().y1]))
    _name_roofs(ax, roofs, ridges, mufu, x_range)
    _name_points(ax, pts, len(sections) > 1, roofs["read_gbps"], ceiling)
    _notes(ax, pts, roofs["read_gbps"], roofs["datasheet"])
    return fig


def plot_model_only(specs: Sequence[problems.Problem], device: str = "H100 SXM"):
    """A roofline with no measurement: the datasheet roofs of ``device`` (labelled
    datasheet) and a vertical line at each problem's (of ``specs``) model intensity (seed size, float32)
    per direction. For machines with no recorded results yet. Returns the Figure."""
    import matplotlib.pyplot as plt

    sheet = datasheet(device)
    fig, ax = plt.subplots(figsize=(9, 5), layout="constrained")
    lines = [(spec.name, direction, spec.cost(spec.sizes["seed"], direction).arithmetic_intensity)
             for spec in specs for direction in ("forward", "backward")]
    x_range = (min(x for _, _, x in lines) / 4, 200.0)
    if sheet:
        _draw_roofs(ax, {"read_gbps": None, "copy_gbps": None, "fp32_tflops": None, "datasheet": sheet}, x_range)
        ridge = sheet.fp32_tflops * 1e3 / sheet.memory_gbps
        ax.plot([ridge], [sheet.fp32_tflops * 1e12], "D", color="0.6")
        ax.annotate(f"ridge (datasheet) {ridge:.1f} FLOP/B", (ridge, sheet.fp32_tflops * 1e12), xytext=(0, -16),
                    textcoords="offset points", fontsize=8, ha="right")
    at: dict[float, list[str]] = {}  # lines closer than their letters (2.5 % of the axis) share one
    span = math.log(x_range[1] / x_range[0])
    for name, direction, x in sorted(lines, key=lambda line: line[2]):
        near = next((k for k in at if math.log(x / k) < 0.025 * span), None)
        at.setdefault(near or x, []).append(f"{name} {SHORT.get(direction, direction)}")
    # each line lettered at its foot; what it stands for listed at the top left, above the memory roof
    keys = []
    for letter, (x, names) in zip(string.ascii_uppercase, sorted(at.items()), strict=False):
        ax.axvline(x, color="tab:blue", lw=0.8, label="model intensity (cost model, seed size, float32)"
                   if x == min(at) else None)
        ax.annotate(letter, (x, 1.3e10), fontsize=8, xytext=(3, 0), textcoords="offset points", color="tab:blue")
        keys.append(textwrap.fill(f"{letter}: {', '.join(names)} ({x:.2f} FLOP/B)", 60, subsequent_indent="   "))
    box = ax.text(0.01, 0.99, "\n".join(keys), transform=ax.transAxes, fontsize=7, va="top", ha="left",
                  bbox={"facecolor": "white", "edgecolor": "0.8", "alpha": 0.9, "pad": 2})
    box.set_in_layout(False)
    ax.set(xscale="log", yscale="log", xlim=x_range, ylim=(1e10, 3e14),
           xlabel="arithmetic intensity (FLOP / byte, log scale)", ylabel="FLOP/s (log scale)",
           title=f"model intensities on the {device} datasheet roofline (nothing measured)")
    ax.grid(True, which="both", lw=0.3, alpha=0.5)
    ax.legend(fontsize=7, loc="lower right")
    return fig


def write_figures(problem_names: list[str] | None = None, output_dir: Path | str = "reports/figures",
                  device: str | None = None, results_dir: Path | None = None) -> list[Path]:
    """Write ``roofline_<problem>.png`` for each problem with a recorded section, and
    ``roofline_all.png`` over all of them, from the newest records of one device (no GPU needed).

    ``device`` (a name or its file-name slug) picks the device; default: the device of the newest
    section among the problems. Problems without a record on it are reported on stderr and
    skipped. Returns the written paths (empty when nothing is recorded).
    """
    import sys

    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    results_dir = Path(results_dir) if results_dir else records.RESULTS_DIR
    problem_names = list(problem_names or problems.names())
    if device is None:
        newest = [s for name in problem_names for s in _newest(name, None, results_dir)]
        if not newest:
            print(f"losslab roofline: no recorded results for {', '.join(problem_names)} under {results_dir}",
                  file=sys.stderr)
            return []
        device = max(newest, key=lambda s: s.date).device
    found = {}
    for name in problem_names:
        try:
            found[name] = records.latest_section(name, device, results_dir).view()
        except LookupError as err:
            print(f"losslab roofline: {err}", file=sys.stderr)
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    written = []
    figures = [(f"roofline_{name}.png", [section]) for name, section in found.items()]
    figures += [("roofline_all.png", list(found.values()))] if found else []
    for file_name, sections in figures:
        fig = plot_roofline(sections)
        written.append(output_dir / file_name)
        fig.savefig(written[-1], dpi=120)
        plt.close(fig)
    for name, section in found.items():
        ncu = section.ncu
        if ncu and ncu.status != "ok":
            print(f"losslab roofline: {name}: no measured-traffic points (ncu: {ncu.message})", file=sys.stderr)
    return written


def _newest(problem: str, device: str | None, results_dir: Path) -> list[records.Section]:
    """[the newest section of ``problem`` (on ``device``)], or [] when none is recorded."""
    try:
        return [records.latest_section(problem, device, results_dir)]
    except LookupError:
        return []
