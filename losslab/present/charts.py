"""The workbook's charts other than the roofline: achieved bandwidth per implementation, time and
bandwidth against size (a sweep), and which cache lines one warp-wide load touches. matplotlib
Figures made without pyplot, so a notebook cell shows each exactly once."""
from __future__ import annotations

import torch

from losslab import problems, records
from losslab.present.html import message, no_results
from losslab.present.results import as_section, bandwidth_gbps, implementation_order, measured_where

WARP = 32
LINE_BYTES = 128  # one L1/L2 cache line; a fully coalesced warp load of 32 floats fills exactly one
SECTOR_BYTES = 32  # the unit in which L2 and DRAM move data
FLAG_HATCH = "xx"  # the hatching of a bar below the physical floor
SWEEP_DTYPES = ("float32", "bfloat16", "float16")
NO_SWEEP = "no sweep recorded yet: run `python -m losslab bench --all --sweep` on a GPU machine"


def _bandwidth_panel(ax, section: records.Section, direction: str, bw: dict[str, float], log: bool) -> int:
    """One direction's bars and the two measured bandwidths; returns how many bars are flagged."""
    group = sorted((r for r in section.rows if r.direction == direction),
                   key=lambda r: implementation_order(section, r.implementation))
    bars = ax.bar([r.implementation + (" \u2020" if r.below_floor else "") for r in group], [r.gbps for r in group],
                  color=["tab:blue" if r.kind == "variant" else "tab:gray" for r in group])
    for bar, row in zip(bars, group, strict=True):
        if row.below_floor:
            bar.set_hatch(FLAG_HATCH)
            bar.set_edgecolor("tab:red")
    ax.bar_label(bars, labels=[f"{r.gbps:.0f}" for r in group], fontsize=8)
    ax.axhline(bw["read"], color="tab:red", linestyle="--", label=f"read bandwidth {bw['read']:.0f} GB/s")
    ax.axhline(bw["copy"], color="tab:orange", linestyle=":", label=f"copy bandwidth {bw['copy']:.0f} GB/s")
    ax.set_title(direction)
    ax.tick_params(axis="x", labelrotation=30, labelsize=8)
    if log:
        ax.set_yscale("log")
    return sum(r.below_floor for r in group)


def bandwidth_chart(section: records.Section | dict | None):
    """Bars of each variant's and peer's achieved GB/s, one panel per direction, with the
    measured read and copy bandwidth as horizontal lines. The y axis turns logarithmic (and says
    so) when the slowest bar is more than 20x below the fastest. A bar whose time is below the
    physical floor is hatched red and marked with a dagger; the title says why it is no result.

    Returns a matplotlib Figure, or an Html message when ``section`` is None.
    """
    section = as_section(section)
    if section is None:
        return no_results("bandwidth chart")
    from matplotlib.figure import Figure

    section = section.view()
    bw = bandwidth_gbps(section)
    fig = Figure(figsize=(12, 4), layout="constrained")
    axes = fig.subplots(1, len(problems.DIRECTIONS), sharey=True)
    gbps = [r.gbps for r in section.rows]
    log = max(gbps) / max(min(gbps), 1e-9) > 20
    flagged = sum(_bandwidth_panel(ax, section, d, bw, log) for ax, d in zip(axes, problems.DIRECTIONS, strict=True))
    top = max(*gbps, *bw.values())
    axes[0].set_ylim((min(gbps) / 2, top * 2) if log else (0, top * 1.15))
    axes[0].set_ylabel("GB/s (minimum bytes / time)" + (", log scale" if log else ""))
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncols=2, fontsize=8)
    shape = "x".join(map(str, section.primary_shape or ()))
    title = (f"{section.problem} {shape} {section.primary_dtype}: achieved bandwidth, {measured_where(section)}\n"
             "blue: variants, grey: PyTorch peers" + ("; log scale" if log else ""))
    if flagged:
        title += ("; \u2020 hatched: below the physical floor (minimum bytes at the datasheet peak), "
                  "a measurement artifact, not a result")
    fig.suptitle(title, fontsize=10)
    return fig


def sweep_dtypes(section: records.Section | dict | None) -> list[str]:
    """The dtypes at which ``section`` holds rows at two or more shapes (a sweep to draw), float32
    first; [] for None or a record of one shape per dtype."""
    section = as_section(section)
    if section is None:
        return []
    return [d for d in section.dtypes if len({tuple(r.shape) for r in section.rows if r.dtype == d}) > 1]


def sweep_leaders(lines: list[records.SweepLine]) -> list[tuple[str, int, int]]:
    """Which implementation is fastest at each size of a sweep, as runs over the sizes, smallest
    first: ``[(implementation, first min_bytes, last min_bytes), ...]``. A time below the physical
    floor is no result and never leads; a size where only such times exist is left out."""
    best: dict[int, tuple[float, str]] = {}
    for line in lines:
        for p in line.points:
            if not p.below_floor and (p.min_bytes not in best or p.median_ms < best[p.min_bytes][0]):
                best[p.min_bytes] = (p.median_ms, line.implementation)
    runs: list[tuple[str, int, int]] = []
    for size in sorted(best):
        name = best[size][1]
        if runs and runs[-1][0] == name:
            runs[-1] = (name, runs[-1][1], size)
        else:
            runs.append((name, size, size))
    return runs


def _mb(n: int) -> str:
    """``n`` bytes in MB for a title: 16777220 -> "16.8", 2147483652 -> "2,147"."""
    return f"{n / 1e6:.3g}" if n < 1e9 else f"{n / 1e6:,.0f}"


def _time_ms(p: records.SweepPoint) -> float:
    return p.median_ms


def _percent(p: records.SweepPoint) -> float:
    return 100 * p.fraction_of_bandwidth


def _sweep_tops(lines: list[records.SweepLine]) -> tuple[float, float]:
    """The y-axis tops of the time and the bandwidth panel. Linear axes: one slow rung (naive, tens of
    ms) or one impossible time would flatten every other line to the floor, so the time axis ends at
    1.5x the slowest peer (all lines when there is no peer) and the bandwidth axis just above the best
    real result (110 % at least); a point below the physical floor never sets either."""
    real = [(line, p) for line in lines for p in line.points if not p.below_floor] or \
        [(line, p) for line in lines for p in line.points]
    peers = [p for line, p in real if line.kind == "peer"] or [p for _, p in real]
    return 1.5 * max(map(_time_ms, peers)), max(110.0, 1.1 * max(_percent(p) for _, p in real))


def _sweep_panels(axes, lines: list[records.SweepLine]) -> tuple[int, list[str]]:
    """One line per implementation on the time and the bandwidth panel (x: minimum MB), a point below
    the physical floor left out of its line and crossed out in red (at the axis top when above it).
    Returns how many points are crossed out, and "name (up to N ms)" per line off the time axis."""
    tops = _sweep_tops(lines)
    flagged, off_scale = 0, []
    for line in lines:
        x = [p.min_bytes / 1e6 for p in line.points]
        style = "-" if line.kind == "variant" else "--"
        color = None
        for ax, y, top in zip(axes, (_time_ms, _percent), tops, strict=True):
            drawn = ax.plot(x, [float("nan") if p.below_floor else y(p) for p in line.points], style, marker="o",
                            ms=4, color=color, label=line.implementation if color is None else None)
            color = drawn[0].get_color()
            marked = [(xi, p) for xi, p in zip(x, line.points, strict=True) if p.below_floor]
            if marked:  # crossed out, as on the roofline: a time below the physical floor is no result
                ax.plot([xi for xi, _ in marked], [min(y(p), top) for _, p in marked], "x", color="tab:red", ms=10,
                        mew=2, ls="none", clip_on=False)
        flagged += sum(p.below_floor for p in line.points)
        slowest = max((p.median_ms for p in line.points if not p.below_floor), default=0.0)
        if slowest > tops[0]:
            off_scale.append(f"{line.implementation} (up to {slowest:.3g} ms)")
    for ax, top in zip(axes, tops, strict=True):
        ax.set_ylim(0, top)
    axes[0].set_xlim(left=0)
    return flagged, off_scale


def sweep_chart(section: records.Section | dict | None, dtype: str = "float32", direction: str = "forward"):
    """Time per call and fraction of the measured bandwidth against size, one line per
    implementation (``records.Section.sweep``): the upper panel the median ms per call, the lower
    the achieved share of the measured bandwidth ceiling in %, both over the cost model's minimum
    traffic in MB at ``dtype``, on linear axes. Solid lines: the ladder's variants; dashed: the
    PyTorch peers. A point below the physical floor is crossed out in red (a dagger in the title: no result). The
    title names the fastest implementation over each range of sizes (:func:`sweep_leaders`).

    ``section`` must hold every shape (``records.latest_section``), not one ``view()``.

    Returns a matplotlib Figure, or an Html message (:data:`NO_SWEEP`) when ``section`` is None or
    holds rows at fewer than two shapes for ``dtype`` and ``direction``.

    Raises:
        ValueError: ``dtype`` or ``direction`` is not one of the names a record uses.
    """
    if dtype not in SWEEP_DTYPES:
        raise ValueError(f"dtype: expected one of {', '.join(SWEEP_DTYPES)}, got {dtype!r}")
    if direction not in problems.DIRECTIONS:
        raise ValueError(f"direction: expected one of {', '.join(problems.DIRECTIONS)}, got {direction!r}")
    section = as_section(section)
    lines = section.sweep(dtype, direction) if section is not None else []
    if len({p.min_bytes for line in lines for p in line.points}) < 2:
        where = f"{section.problem} {dtype} {direction}: " if section is not None else ""
        return message(where + NO_SWEEP)
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 7), layout="constrained")
    time_ax, fraction_ax = fig.subplots(2, 1, sharex=True)
    flagged, off_scale = _sweep_panels((time_ax, fraction_ax), lines)
    time_ax.set_ylabel("median ms per call (L2 flushed)")
    fraction_ax.set_ylabel("% of the measured bandwidth\n(read; copy where it writes)")
    fraction_ax.set_xlabel("minimum traffic at this shape, MB (cost model; linear)")
    fraction_ax.axhline(100, color="tab:red", linestyle=":", linewidth=1)  # the measured ceiling
    fig.legend(*time_ax.get_legend_handles_labels(), loc="outside right center", fontsize=8)
    leaders = ", ".join(f"{name} {_mb(lo)}\u2013{_mb(hi)} MB" if lo != hi else f"{name} {_mb(lo)} MB"
                        for name, lo, hi in sweep_leaders(lines))
    title = (f"{section.problem} {dtype} {direction}: time and bandwidth against size, {measured_where(section)}\n"
             f"solid: variants, dashed: PyTorch peers; fastest: {leaders}")
    if off_scale:
        title += f"\nabove the time axis (1.5x the slowest peer): {', '.join(off_scale)}"
    if flagged:
        title += "\n\u2020 red x: below the physical floor (minimum bytes at the datasheet peak), not a result"
    fig.suptitle(title, fontsize=10)
    return fig


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
        "vectorized: lane k reads a float4\nat p[row*D + 4*(j + k)]":
            [4 * k + e for k in range(WARP) for e in range(4)],
    }
    fig = Figure(figsize=(11, 3.6), layout="constrained")
    axes = fig.subplots(1, len(patterns))
    for ax, (title, offsets) in zip(axes, patterns.items(), strict=True):
        lines = sorted({o // floats_per_line for o in offsets})
        sectors = {o * 4 // SECTOR_BYTES for o in offsets}
        grid = torch.zeros(WARP, floats_per_line)  # row i: the i-th line touched; blank rows: none
        for o in offsets:
            grid[lines.index(o // floats_per_line), o % floats_per_line] = 1
        ax.imshow(grid.numpy(), cmap="Greens", vmin=0, vmax=1.3, aspect="equal", interpolation="nearest")
        ax.set_title(f"{title}\n{len(lines)} line(s), {len(sectors)} sectors requested from L1/L2 "
                     f"for {len(offsets) * 4} bytes", fontsize=9)
        ax.set_xlabel("float within a 128-byte line")
        ax.set_ylabel("cache lines touched (one per row)")
        ax.set_yticks([])
        ax.set_xticks([0, 31])
    fig.suptitle("One warp-wide load instruction: the cache lines it touches (green: the floats the warp uses; caches "
                 "move 32-byte sectors).\nMore sectors per request cost L1/L2 requests and bandwidth, not DRAM bytes: "
                 "a naive lane's next loads use the rest of its sector while it is still cached", fontsize=10)
    return fig

