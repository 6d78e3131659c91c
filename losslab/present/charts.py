"""The workbook's charts other than the roofline: achieved bandwidth per implementation, and
which cache lines one warp-wide load touches. matplotlib Figures made without pyplot, so a
notebook cell shows each exactly once."""
from __future__ import annotations

import torch

from losslab import problems, records
from losslab.present.html import no_results
from losslab.present.results import as_section, bandwidth_gbps, implementation_order, measured_where

WARP = 32
LINE_BYTES = 128  # one L1/L2 cache line; a fully coalesced warp load of 32 floats fills exactly one
SECTOR_BYTES = 32  # the unit in which L2 and DRAM move data
FLAG_HATCH = "xx"  # the hatching of a bar below the physical floor


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

