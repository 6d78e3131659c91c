"""The workbook's charts other than the roofline: achieved bandwidth per implementation, time and
bandwidth against size (a sweep), and which cache lines one warp-wide load touches. matplotlib
Figures made without pyplot, so a notebook cell shows each exactly once."""
from __future__ import annotations

import textwrap
from collections import Counter

import torch

from losslab import problems, records
from losslab.measure.ceilings import AUTOGRAD_FLOOR_SHAPE
from losslab.present.html import message, no_results
from losslab.present.results import bandwidth_gbps, implementation_order, measured_where

WARP = 32
LINE_BYTES = 128  # one L1/L2 cache line; a fully coalesced warp load of 32 floats fills exactly one
SECTOR_BYTES = 32  # the unit in which L2 and DRAM move data
FLAG_HATCH = "xx"  # the hatching of a bar below the physical floor
SWEEP_DTYPES = ("float32", "bfloat16", "float16")
# one colour per implementation in every figure (roofline included), so a rung is found by its colour
COLORS = {"naive": "tab:red", "shared_memory": "tab:orange", "warp_shuffle": "tab:olive",
          "vectorized": "tab:green", "fused": "tab:blue", "cluster": "tab:cyan", "eager": "0.35",
          "compile": "tab:purple", "liger": "tab:pink", "quack": "tab:brown", "losslab.nn": "black"}
NO_SWEEP = "no sweep recorded yet: run `python -m losslab bench --all --sweep` on a GPU machine"


def wrap_title(text: str, fig=None, inches: float | None = None) -> str:
    """``text`` with each of its lines wrapped to the width of ``fig``, or ``inches`` before there is
    a figure (about 12 characters an inch at 10 points): a long device, date and version line would
    otherwise run past the figure's edges."""
    width = int((fig.get_figwidth() if fig is not None else inches) * 12)
    return "\n".join(textwrap.fill(line, width) for line in text.split("\n"))


ELSEWHERE_HATCH = "//"  # the hatching of a bar whose kernels moved almost none of its bytes
ELSEWHERE_MARK = "\u2205"  # and its mark beside the name


def _bandwidth_panel(ax, section: records.Section, direction: str, bw: dict[str, float], log: bool,
                     elsewhere: set[tuple[str, str]]) -> tuple[int, int]:
    """One direction's bars and the two measured bandwidths; returns how many bars are flagged below
    the physical floor and how many did their work elsewhere (``elsewhere``: (implementation, direction))."""
    group = sorted((r for r in section.rows if r.direction == direction),
                   key=lambda r: implementation_order(section, r.implementation))
    away = [(r.implementation, r.direction) in elsewhere for r in group]
    names = [r.implementation + (" \u2020" if r.below_floor else "") + (f" {ELSEWHERE_MARK}" if a else "")
             for r, a in zip(group, away, strict=True)]
    colors = ["tab:blue" if r.kind == "variant" else "black" if r.kind == "operator" else "tab:gray" for r in group]
    bars = ax.bar(names, [r.gbps for r in group], color=colors)
    for bar, row, a in zip(bars, group, away, strict=True):
        if row.below_floor:
            bar.set_hatch(FLAG_HATCH)
            bar.set_edgecolor("tab:red")
        elif a:
            bar.set_hatch(ELSEWHERE_HATCH)
            bar.set_facecolor("white")
            bar.set_edgecolor("0.4")
    ax.axhline(bw["read"], color="tab:red", linestyle="--", label=f"measured read bandwidth {bw['read']:.0f} GB/s")
    ax.axhline(bw["copy"], color="tab:orange", linestyle=":", label=f"measured copy bandwidth {bw['copy']:.0f} GB/s")
    ax.set_title(direction)
    ax.set_xlabel("implementation")
    ax.tick_params(axis="x", labelrotation=45, labelsize=8)
    for label in ax.get_xticklabels():
        label.set_horizontalalignment("right")
        label.set_rotation_mode("anchor")
    if log:
        ax.set_yscale("log")
    return sum(r.below_floor for r in group), sum(away)


def _bar_values(ax, log: bool) -> None:
    """Each bar's GB/s written up its middle (vertical, so that four digits fit a bar's width, and
    inside it, so that no value sits on a bandwidth line)."""
    low = ax.get_ylim()[0]
    for bar in ax.patches:
        height = bar.get_height()
        middle = (low * height) ** 0.5 if log else height / 2
        dark = bar.get_facecolor()[:3] == (1.0, 1.0, 1.0)
        ax.text(bar.get_x() + bar.get_width() / 2, middle, f"{height:.0f}", rotation=90, ha="center", va="center",
                fontsize=7, color="black" if dark else "white")


def bandwidth_chart(section: records.Section | None):
    """Bars of each variant's and peer's achieved GB/s, one panel per direction, with the
    measured read and copy bandwidth as horizontal lines. The y axis turns logarithmic (and says
    so) when the slowest bar is more than 20x below the fastest. A bar whose time is below the
    physical floor is hatched red and marked with a dagger; a bar whose kernels moved almost none
    of its bytes (``evidence.work_elsewhere``: its work was done in another direction) is hatched
    grey and marked with an empty set; the legend says why neither is a result.

    Returns a matplotlib Figure, or an Html message when ``section`` is None.
    """
    from losslab.present.evidence import work_elsewhere

    if section is None:
        return no_results("bandwidth chart")
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    section = section.view()
    bw = bandwidth_gbps(section)
    elsewhere = {(e.implementation, e.direction) for e in work_elsewhere(section)}
    fig = Figure(figsize=(12, 4.6), layout="constrained")
    axes = fig.subplots(1, len(problems.DIRECTIONS), sharey=True)
    gbps = [r.gbps for r in section.rows]
    log = max(gbps) / max(min(gbps), 1e-9) > 20
    counts = [_bandwidth_panel(ax, section, d, bw, log, elsewhere)
              for ax, d in zip(axes, problems.DIRECTIONS, strict=True)]
    flagged, away = (sum(c[i] for c in counts) for i in (0, 1))
    top = max(*gbps, *bw.values())
    axes[0].set_ylim((min(gbps) / 2, top * 2) if log else (0, top * 1.15))
    for ax in axes:
        _bar_values(ax, log)
    axes[0].set_ylabel("GB/s (minimum bytes / time)" + (", log scale" if log else ""))
    handles, _ = axes[0].get_legend_handles_labels()
    handles = [Patch(color="tab:blue", label="losslab variant"), Patch(color="tab:gray", label="PyTorch peer"),
               *handles]
    if flagged:
        handles.append(Patch(facecolor="tab:gray", edgecolor="tab:red", hatch=FLAG_HATCH,
                             label="\u2020 below the physical floor (minimum bytes at the datasheet peak): "
                                   "a measurement artifact, not a result"))
    if away:
        handles.append(Patch(facecolor="white", edgecolor="0.4", hatch=ELSEWHERE_HATCH,
                             label=f"{ELSEWHERE_MARK} its kernels moved almost none of these bytes (Nsight Compute): "
                                   "its work was done in another direction, so this is no bandwidth"))
    fig.legend(handles=handles, loc="outside lower center", ncols=2 if flagged or away else 4, fontsize=8)
    shape = "x".join(map(str, section.primary_shape or ()))
    title = f"{section.problem} {shape} {section.primary_dtype}: achieved bandwidth\n{measured_where(section)}"
    if flagged:
        title += ("\n\u2020 hatched: below the physical floor (minimum bytes at the datasheet peak), "
                  "a measurement artifact, not a result")
    fig.suptitle(wrap_title(title, fig), fontsize=10)
    return fig


def sweep_dtypes(section: records.Section | None) -> list[str]:
    """The dtypes at which ``section`` holds rows at two or more shapes (a sweep to draw), float32
    first; [] for None or a record of one shape per dtype."""
    if section is None:
        return []
    return [d for d in section.dtypes if len({tuple(r.shape) for r in section.rows if r.dtype == d}) > 1]


def sweep_leaders(lines: list[records.SweepLine]) -> list[tuple[str, tuple[int, int], tuple[int, int]]]:
    """Which implementation is fastest at each size of a sweep, as runs over the sizes, smallest
    first: ``[(implementation, first shape, last shape), ...]``. A time below the physical floor is
    no result and never leads; a size where only such times exist is left out. Two shapes of the
    same bytes (16384 x 16384 and 2048 x 131072) are two sizes, the shorter rows first."""
    best: dict[tuple[int, int], tuple[float, str, tuple[int, int]]] = {}
    for line in lines:
        for p in line.points:
            key = (p.min_bytes, p.shape[1])
            if not p.below_floor and (key not in best or p.median_ms < best[key][0]):
                best[key] = (p.median_ms, line.implementation, tuple(p.shape))
    runs: list[tuple[str, tuple[int, int], tuple[int, int]]] = []
    for key in sorted(best):
        _, name, shape = best[key]
        if runs and runs[-1][0] == name:
            runs[-1] = (name, runs[-1][1], shape)
        else:
            runs.append((name, shape, shape))
    return runs


def leaders_text(lines: list[records.SweepLine]) -> str:
    """:func:`sweep_leaders` for a title: "compile 16.8 MB, vectorized 268\u20132,147 MB", each end in
    minimum MB; an end whose MB two shapes share (as printed) also names its shape, so that two
    leaders at one byte count (16384 x 16384 and 2048 x 131072) read as the two sizes they are."""
    mb = {tuple(p.shape): _mb(p.min_bytes) for line in lines for p in line.points}
    shared = {text for text, count in Counter(mb.values()).items() if count > 1}

    def end(shape: tuple[int, int]) -> str:
        return f"{mb[shape]} MB ({shape[0]}\u00d7{shape[1]})" if mb[shape] in shared else f"{mb[shape]} MB"

    def run(name: str, lo: tuple[int, int], hi: tuple[int, int]) -> str:
        if lo == hi:
            return f"{name} {end(lo)}"
        if mb[lo] not in shared and mb[hi] not in shared:
            return f"{name} {mb[lo]}\u2013{mb[hi]} MB"
        return f"{name} {end(lo)} \u2013 {end(hi)}"

    return ", ".join(run(*leader) for leader in sweep_leaders(lines))


def _mb(n: int) -> str:
    """``n`` bytes in MB for a title: 16777220 -> "16.8", 2147483652 -> "2,147"."""
    return f"{n / 1e6:.3g}" if n < 1e9 else f"{n / 1e6:,.0f}"


def _time_ms(p: records.SweepPoint) -> float:
    return p.median_ms


def _percent(p: records.SweepPoint) -> float:
    return 100 * p.fraction_of_bandwidth


SIDE_BY_SIDE = 1.4  # x factor between two shapes of the same minimum bytes, so that neither hides the other


def sweep_positions(lines: list[records.SweepLine]) -> dict[tuple[int, int], float]:
    """Each recorded shape's x position in MB: its minimum traffic (cost model), except that a shape
    within :data:`SIDE_BY_SIDE` of the one before it (16384 x 16384 and 2048 x 131072 move the same
    bytes) stands that factor to its right on the log axis, so that neither hides the other."""
    shapes = sorted({(p.min_bytes, tuple(p.shape)) for line in lines for p in line.points},
                    key=lambda s: (s[0], s[1][1]))
    out, last = {}, 0.0
    for nbytes, shape in shapes:
        last = out[shape] = max(nbytes / 1e6, last * SIDE_BY_SIDE)
    return out


def _sweep_panels(axes, lines: list[records.SweepLine]) -> int:
    """One line per implementation on the time (log) and the bandwidth panel (x: :func:`sweep_positions`,
    log), a point below the physical floor left out of its line and crossed out in red. Returns how
    many points are crossed out."""
    x_of = sweep_positions(lines)
    flagged = 0
    for line in lines:
        points = sorted(line.points, key=lambda p: x_of[tuple(p.shape)])
        x = [x_of[tuple(p.shape)] for p in points]
        style = "-" if line.kind in ("variant", "operator") else "--"  # losslab's own solid, the peers dashed
        color = COLORS.get(line.implementation)
        for ax, y in zip(axes, (_time_ms, _percent), strict=True):
            drawn = ax.plot(x, [float("nan") if p.below_floor else y(p) for p in points], style, marker="o",
                            ms=4, color=color, label=line.implementation if ax is axes[0] else None)
            color = drawn[0].get_color()
            marked = [(xi, p) for xi, p in zip(x, points, strict=True) if p.below_floor]
            if marked:  # crossed out, as on the roofline: a time below the physical floor is no result
                ax.plot([xi for xi, _ in marked], [y(p) for _, p in marked], "x", color="tab:red", ms=10,
                        mew=2, ls="none", clip_on=False)
        flagged += sum(p.below_floor for p in points)
    real = [p for line in lines for p in line.points if not p.below_floor] or [p for line in lines
                                                                               for p in line.points]
    axes[1].set_ylim(0, max(110.0, 1.1 * max(map(_percent, real))))
    ticks = sorted(x_of.items(), key=lambda kv: kv[1])
    for ax in axes:
        ax.set_xscale("log")
        ax.set_xticks([x for _, x in ticks], minor=False)
        ax.set_xticks([], minor=True)
        ax.set_xlim(ticks[0][1] / 1.6, ticks[-1][1] * 1.6)
    axes[0].set_yscale("log")
    axes[1].set_xticklabels([f"{shape[0]}\u00d7{shape[1]} ({_mb(_bytes_of(shape, lines))} MB)" for shape, _ in ticks],
                            rotation=90, fontsize=8)
    return flagged


def _bytes_of(shape: tuple[int, int], lines: list[records.SweepLine]) -> int:
    return next(p.min_bytes for line in lines for p in line.points if tuple(p.shape) == shape)


def sweep_chart(section: records.Section | None, dtype: str = "float32", direction: str = "forward"):
    """Time per call and fraction of the measured bandwidth against size, one line per
    implementation (``records.Section.sweep``): the upper panel the median ms per call (log), the
    lower the achieved share of the measured bandwidth ceiling in %, both over the cost model's
    minimum traffic in MB at ``dtype`` on a log axis with a tick at every recorded shape
    (:func:`sweep_positions`). Solid lines: the ladder's variants; dashed: the PyTorch peers. A
    point below the physical floor is crossed out in red (a dagger in the title: no result). The
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
    lines = section.sweep(dtype, direction) if section is not None else []
    if len({tuple(p.shape) for line in lines for p in line.points}) < 2:
        where = f"{section.problem} {dtype} {direction}: " if section is not None else ""
        return message(where + NO_SWEEP)
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 7.5), layout="constrained")
    time_ax, fraction_ax = fig.subplots(2, 1, sharex=True)
    flagged = _sweep_panels((time_ax, fraction_ax), lines)
    time_ax.set_ylabel("median ms per call\n(L2 flushed; log scale)")
    fraction_ax.set_ylabel("% of the measured bandwidth\n(read; copy where it writes)")
    fraction_ax.set_xlabel("shape (rows \u00d7 columns) and its minimum traffic in MB (cost model; log scale)")
    fraction_ax.axhline(100, color="tab:red", linestyle=":", linewidth=1, label="the measured bandwidth")
    for ax in (time_ax, fraction_ax):
        ax.grid(True, which="major", lw=0.3, alpha=0.5)
    fig.legend(*time_ax.get_legend_handles_labels(), loc="outside right center", fontsize=8,
               title="implementation", title_fontsize=8)
    leaders = leaders_text(lines)
    title = (f"{section.problem} {dtype} {direction}: time and bandwidth against size\n{measured_where(section)}\n"
             f"solid: variants, dashed: PyTorch peers; fastest: {leaders}")
    if flagged:
        title += "\n\u2020 red x: below the physical floor (minimum bytes at the datasheet peak), not a result"
    fig.suptitle(wrap_title(title, fig), fontsize=10)
    return fig


def sweep_growth(section: records.Section | None, dtype: str = "float32", direction: str = "forward"):
    """From each recorded shape to the next larger one: how many times the minimum bytes grow and
    how many times the fastest implementation's time grows, as a Markdown list read from the sweep.
    Where the time grows far less than the bytes, a call is mostly its fixed cost (launch-bound);
    where it grows as the bytes do, bandwidth-bound. Under forward+backward, where the section's
    ceilings hold it, the host's floor: PyTorch's own ``x.sum()`` forward+backward, measured in the
    same process (``ceilings.measure_autograd_floor``). One line where there is no sweep."""
    from losslab.present.html import markdown

    lines = section.sweep(dtype, direction) if section is not None else []
    best: dict[tuple[int, int], tuple[float, str, int]] = {}
    for line in lines:
        for p in line.points:
            key = tuple(p.shape)
            if not p.below_floor and (key not in best or p.median_ms < best[key][0]):
                best[key] = (p.median_ms, line.implementation, p.min_bytes)
    shapes = sorted(best, key=lambda s: (best[s][2], s[1]))
    if len(shapes) < 2:
        return markdown(f"{section.problem if section else ''} {dtype} {direction}: {NO_SWEEP}".strip())
    out = [f"{section.problem} {dtype} {direction}, fastest implementation at each shape ({section.device}):"]
    for a, b in zip(shapes, shapes[1:], strict=False):
        (ta, na, ba), (tb, nb, bb) = best[a], best[b]
        out.append(f"- {a[0]}\u00d7{a[1]} \u2192 {b[0]}\u00d7{b[1]}: bytes \u00d7{bb / ba:.3g}, time "
                   f"\u00d7{tb / ta:.3g} ({na} {ta:.3f} ms \u2192 {nb} {tb:.3f} ms)")
    floor = section.ceilings.get("autograd_floor")
    shape = "\u00d7".join(map(str, AUTOGRAD_FLOOR_SHAPE))
    if direction == "forward_backward" and floor:
        out.append(f"- the host's floor: PyTorch's own `x.sum()` forward+backward at {shape} takes "
                   f"{floor['host_ms']:.3f} ms of host time a call ({floor['median_ms']:.3f} ms on the GPU): "
                   "no forward+backward call through autograd costs less on this machine")
    elif direction == "forward_backward":
        out.append(f"- the host's floor (PyTorch's own `x.sum()` forward+backward at {shape}): not in this "
                   "record, which predates it; a bench or sweep run records it with the device's ceilings")
    return markdown("\n".join(out))


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
        ax.set_ylabel("cache lines touched\n(one row each)")
        ax.set_yticks([])
        ax.set_xticks([0, 31])
    fig.suptitle("One warp-wide load instruction: the cache lines it touches (green: the floats the warp uses; caches "
                 "move 32-byte sectors).\nMore sectors per request cost L1/L2 requests and bandwidth, not DRAM bytes: "
                 "a naive lane's next loads use the rest of its sector while it is still cached", fontsize=10)
    return fig

