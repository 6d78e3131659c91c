"""The roofline plot: each (implementation, direction) of a recorded or live section against
the device's ceilings. Plots only: the ceilings are measured by ``losslab.measure.ceilings``.

A loss kernel's floor is ``minimum bytes / measured bandwidth``. Each point sits at its model
arithmetic intensity (cost-model FLOP / minimum bytes) and its achieved FLOP/s (cost-model FLOP /
measured median time). Where Nsight Compute ran (``losslab.measure.ncu``), a hollow marker at the
same height shows the intensity over the DRAM bytes the kernels really moved. A point whose time
is below the physical floor (minimum bytes at the datasheet's peak bandwidth) is no result: it is
crossed out in red and the legend says why.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from losslab import problems, records
from losslab.measure.ceilings import datasheet
from losslab.present.results import as_section, bandwidth_gbps, measured_where


@dataclass(frozen=True)
class Point:
    """One (implementation, direction) on the roofline.

    ``flops`` and ``model_bytes`` come from the cost model (at the row's own dtype),
    ``median_ms`` from the bench, ``measured_bytes`` (DRAM bytes read + written) from Nsight
    Compute, if it ran; ``floor_verdict`` is empty, or why the time is below the physical floor.
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


def points(section: records.Section | dict, directions: tuple[str, ...] = DIRECTIONS) -> list[Point]:
    """Roofline points of one section's rows at its shown shape and dtype (``Section.view``).
    Each point's bytes are its own dtype's (the cost model at the row's dtype); a hollow
    (measured-traffic) point only where ncu profiled that same shape in that same dtype (ncu
    profiles float32), never a bf16 time over float32 bytes."""
    section = as_section(section).view()
    ncu = section.ncu or {}
    measured = {}
    if (ncu.get("status") == "ok" and tuple(ncu.get("shape", ())) == tuple(section.primary_shape or ())
            and section.primary_dtype == (ncu.get("dtype") or "float32")):
        measured = {(r["implementation"], r["direction"]): r["dram_bytes_read"] + r["dram_bytes_written"]
                    for r in ncu["records"]}
    out = []
    for row in section.rows:
        if row.direction not in directions:
            continue
        cost = problems.get(row.problem).cost(tuple(row.shape), row.direction, getattr(torch, row.dtype))
        # no measured-traffic point for a time that is no result: its kernels did not do the work
        traffic = None if row.below_floor else measured.get((row.implementation, row.direction))
        out.append(Point(row.problem, row.implementation, row.kind, row.direction, cost.flops, cost.bytes,
                         row.median_ms, traffic, row.floor_note))
    return out


# --- the plot ---------------------------------------------------------------

COLORS = {"naive": "tab:red", "shared_memory": "tab:orange", "warp_shuffle": "tab:olive",
          "vectorized": "tab:green", "fused": "tab:blue", "cluster": "tab:cyan", "eager": "0.35",
          "compile": "tab:purple"}
MARKERS = {"forward": "o", "backward": "s", "forward_backward": "^"}
SHORT = {"forward": "fwd", "backward": "bwd", "forward_backward": "fwd+bwd"}


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


def _draw_roofs(ax, roofs: dict, x_range: tuple[float, float]) -> None:
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
        ax.annotate("ridge " + ", ".join(f"{x:.1f} ({label})" for label, x in ridges) + " FLOP/B",
                    (max(x for _, x in ridges), compute), xytext=(0, -16), textcoords="offset points", fontsize=8,
                    ha="right")
    sheet = roofs["datasheet"]
    if sheet:
        xs, ys = _roof_line(sheet.memory_gbps * 1e9, sheet.fp32_tflops * 1e12, x_range)
        ax.plot(xs, ys, color="0.6", lw=0.8, ls="-.",
                label=f"datasheet {sheet.product}: {sheet.memory_gbps:.0f} GB/s, {sheet.fp32_tflops:g} TFLOP/s")


def mufu_roofs(sections: list[records.Section], directions: tuple[str, ...] = DIRECTIONS) -> list[tuple[str, float]]:
    """The special-function (MUFU) ceiling in model FLOP/s per (problem, direction) with
    transcendentals: the measured ``mufu_ex2_tops`` times the cost model's FLOP per transcendental
    (a kernel that runs one MUFU op per log or exp cannot do its FLOP faster). [(label, FLOP/s)]."""
    out = []
    for section in sections:
        tops = section.ceilings.get("mufu_ex2_tops")
        problem = section.problem or (section.rows[0].problem if section.rows else "")
        if not tops or not section.primary_shape or problem not in problems.names():
            continue
        for direction in directions:
            cost = problems.get(problem).cost(tuple(section.primary_shape), direction)
            if cost.transcendentals and any(r.direction == direction for r in section.rows):
                per = cost.flops / cost.transcendentals
                out.append((f"MUFU roof {problem} {SHORT.get(direction, direction)}: {tops:.2f} Top/s x "
                            f"{per:.1f} FLOP per log/exp (measured)", tops * 1e12 * per))
    return out


def _draw_mufu(ax, roofs: list[tuple[str, float]], bandwidth_gbps: float | None, x_range) -> None:
    """Each MUFU roof from its ridge with the read roof to the right edge, its ridge marked."""
    for (label, flops), color in zip(roofs, ("tab:purple", "tab:brown", "tab:pink", "tab:cyan", "0.5", "olive"),
                                     strict=False):
        ridge = flops / (bandwidth_gbps * 1e9) if bandwidth_gbps else x_range[0]
        ax.plot([max(ridge, x_range[0]), x_range[1]], [flops, flops], color=color, lw=1.0, ls="-.",
                label=f"{label}, ridge {ridge:.1f} FLOP/B")
        ax.plot([ridge], [flops], "D", color=color, ms=4)


def _annotate_above(ax, pts: list[Point], read_gbps: float | None, sheet) -> int:
    """Mark every point above the measured read roof with how far above it is, and say once on the
    figure why that can be: the ceiling is the best of a large ``torch.sum`` and a two-stream read
    kernel, not the hardware's limit (the datasheet peak, drawn in grey, is). Returns how many."""
    if not read_gbps:
        return 0
    above = [(p, p.flops_per_s / (p.intensity * read_gbps * 1e9)) for p in pts if not p.floor_verdict]
    above = [(p, over) for p, over in above if over > 1]
    for p, over in above:
        ax.annotate(f"{over - 1:+.0%}", (p.intensity, p.flops_per_s), xytext=(-4, 6), textcoords="offset points",
                    fontsize=7, ha="right", color="tab:red")
    if above:
        peak = max(p.flops_per_s / (p.intensity * sheet.memory_gbps * 1e9) for p, _ in above) if sheet else None
        ax.text(0.01, 0.99, f"red +x%: {len(above)} point(s) above the measured read roof. That roof is the best of "
                "a large torch.sum and a two-stream read kernel,\nnot the hardware's limit"
                + (f"; the highest point is at {peak:.0%} of the datasheet peak (grey)" if peak else ""),
                transform=ax.transAxes, fontsize=7, va="top", color="tab:red")
    return len(above)


def _roof_line(bandwidth: float, compute: float | None, x_range: tuple[float, float]):
    """The roof min(x * bandwidth, compute) over x_range as a polyline (bytes/s, FLOP/s)."""
    ridge = compute / bandwidth if compute else math.inf
    xs = [x_range[0], *([ridge] if x_range[0] < ridge < x_range[1] else []), x_range[1]]
    return xs, [min(x * bandwidth, compute or math.inf) for x in xs]


def _draw_points(ax, pts: list[Point], prefix_problem: bool) -> None:
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
        if p.measured_intensity:
            ax.plot([p.measured_intensity], [p.flops_per_s], marker, mfc="none", color=color, ms=7)
            ax.annotate("", (p.measured_intensity, p.flops_per_s), xytext=(p.intensity, p.flops_per_s),
                        arrowprops={"arrowstyle": "->", "color": color, "lw": 0.8})
    # name labels beside the model points, nudged apart where points share an intensity
    for x in sorted({p.intensity for p in pts}):
        column = sorted((p for p in pts if p.intensity == x), key=lambda p: p.flops_per_s)
        last = 0.0
        for p in column:
            y = max(p.flops_per_s, last * 1.25)
            last = y
            name = f"{p.problem} {p.implementation}" if prefix_problem else p.implementation
            flag = " \u2020 below the physical floor" if p.floor_verdict else ""
            ax.annotate(f"{name} ({SHORT.get(p.direction, p.direction)}){flag}", (x, p.flops_per_s),
                        xytext=(x * 1.25, y), fontsize=7, va="center", color=COLORS.get(p.implementation, "tab:gray"))


def _title(sections: list[records.Section]) -> str:
    """Each section's problem, shape and dtype, and the device, dates and versions its numbers come from."""
    return "\n".join(f"{s.problem} {'x'.join(map(str, s.primary_shape or ()))} {s.primary_dtype}:\n{measured_where(s)}"
                     for s in sections)


def _legend(ax, pts: list[Point], directions: tuple[str, ...]) -> None:
    from matplotlib.lines import Line2D

    handles, _ = ax.get_legend_handles_labels()
    keys = [Line2D([], [], marker=MARKERS[d], color="0.4", ls="none", label=d) for d in directions if d in MARKERS]
    if any(p.measured_intensity for p in pts):
        keys.append(Line2D([], [], marker="o", mfc="none", color="0.4", ls="none",
                           label="hollow: over DRAM bytes measured by ncu"))
    if any(p.floor_verdict for p in pts):
        keys.append(Line2D([], [], marker="x", color="tab:red", mew=2, ls="none",
                           label="\u2020 below the physical floor (minimum bytes at the datasheet peak):\n"
                                 "a measurement artifact, not a result"))
    ax.legend(handles=handles + keys, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))


def plot_roofline(sections: dict | list[dict], directions: tuple[str, ...] = DIRECTIONS,
                  title: str | None = None, ax=None):
    """Draw the roofline of one or more bench sections (one per problem) from the same device.

    Memory roofs from the measured read and copy bandwidth (GB/s), compute roof from the
    measured FP32 FMA rate (TFLOP/s; the datasheet's, labelled so, for a section recorded
    without it), ridge points marked, the datasheet roofs in grey. Filled markers: model
    intensity; hollow markers with an arrow: intensity over the DRAM bytes Nsight Compute
    measured; a red cross: a time below the physical floor. Circles forward, squares backward;
    black edges for the ladder's variants, none for the peers. The title names the device and
    each section's date.

    Returns the matplotlib Figure.

    Raises:
        ValueError: no section, or sections from different devices (one device's roofs only).
    """
    import matplotlib.pyplot as plt

    sections = [sections] if isinstance(sections, (dict, records.Section)) else list(sections)
    if not sections:
        raise ValueError("sections: expected at least one recorded bench section")
    sections = [as_section(s).view() for s in sections]
    devices = list(dict.fromkeys(s.device for s in sections))
    if len(devices) > 1:
        raise ValueError(f"sections: expected sections of one device (one set of roofs), got {', '.join(devices)}")
    pts = [p for s in sections for p in points(s, directions)]
    if ax is None:
        fig, ax = plt.subplots(figsize=(13, 7), layout="constrained")
    else:
        fig = ax.figure
    roofs = _roofs(sections[0])
    xs = [p.intensity for p in pts] + [p.measured_intensity for p in pts if p.measured_intensity]
    ridge = (roofs["fp32_tflops"] or 0) * 1e3 / (roofs["read_gbps"] or math.inf)
    x_range = (min(xs, default=0.1) / 4, max([*xs, ridge, 1.0]) * 8)
    _draw_roofs(ax, roofs, x_range)
    _draw_mufu(ax, mufu_roofs(sections, directions), roofs["read_gbps"], x_range)
    _draw_points(ax, pts, prefix_problem=len(sections) > 1)
    _annotate_above(ax, pts, roofs["read_gbps"], roofs["datasheet"])
    ax.set(xscale="log", yscale="log", xlim=x_range, xlabel="arithmetic intensity (FLOP / byte)",
           ylabel="achieved FLOP/s (model FLOP / measured time)")
    ys = [p.flops_per_s for p in pts]
    top = (roofs["fp32_tflops"] or 0) * 1e12 or max(ys, default=1e12)
    ax.set_ylim(min(ys, default=top / 1e4) / 5, max(top, *ys) * 3)
    ax.grid(True, which="both", lw=0.3, alpha=0.5)
    ax.set_title(title or _title(sections), fontsize=10)
    _legend(ax, pts, directions)
    return fig


def plot_model_only(problem_names: tuple[str, ...] | list[str], device: str = "H100 SXM"):
    """A roofline with no measurement: the datasheet roofs of ``device`` (labelled
    datasheet) and a vertical line at each problem's model intensity (seed size, float32)
    per direction. For machines with no recorded results yet. Returns the Figure."""
    import matplotlib.pyplot as plt

    sheet = datasheet(device)
    fig, ax = plt.subplots(figsize=(9, 5), layout="constrained")
    seed = {name: problems.get(name).sizes["seed"] for name in problem_names}
    lines = [(name, direction, problems.get(name).cost(seed[name], direction).arithmetic_intensity)
             for name in problem_names for direction in ("forward", "backward")]
    x_range = (min(x for _, _, x in lines) / 4, 200.0)
    if sheet:
        _draw_roofs(ax, {"read_gbps": None, "copy_gbps": None, "fp32_tflops": None, "datasheet": sheet}, x_range)
        ridge = sheet.fp32_tflops * 1e3 / sheet.memory_gbps
        ax.plot([ridge], [sheet.fp32_tflops * 1e12], "D", color="0.6")
        ax.annotate(f"ridge (datasheet) {ridge:.1f} FLOP/B", (ridge, sheet.fp32_tflops * 1e12), xytext=(0, -16),
                    textcoords="offset points", fontsize=8, ha="right")
    for name, direction, x in lines:
        ax.axvline(x, color="tab:blue", ls="-" if direction == "forward" else "--", lw=0.8)
        ax.annotate(f"{name} {direction}", (x, 1e11), rotation=90, fontsize=8, xytext=(3, 0),
                    textcoords="offset points")
    ax.set(xscale="log", yscale="log", xlim=x_range, ylim=(1e10, 3e14), xlabel="arithmetic intensity (FLOP / byte)",
           ylabel="FLOP/s", title=f"model intensities on the {device} datasheet roofline (nothing measured)")
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
        device = max(newest, key=lambda s: s["date"])["device"]
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
        ncu = section.get("ncu")
        if ncu and ncu.get("status") != "ok":
            print(f"losslab roofline: {name}: no measured-traffic points (ncu: {ncu.get('message')})", file=sys.stderr)
    return written


def _newest(problem: str, device: str | None, results_dir: Path) -> list[dict]:
    """[the newest section of ``problem`` (on ``device``)], or [] when none is recorded."""
    try:
        return [records.latest_section(problem, device, results_dir)]
    except LookupError:
        return []
