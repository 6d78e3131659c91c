"""What notebook 09 shows from a vocab_parallel record: the per-rank timeline of one forward+backward
and a scaling model to more GPUs, both computed from the recorded times; nothing here measures.
"""
from __future__ import annotations

from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np

# the phases of losslab's forward+backward, in order, and whether each computes or communicates
PHASES = (("statistics", "compute"), ("all_gather", "communication"), ("combine", "compute"),
          ("gradient", "compute"))
COLOURS = {"statistics": "tab:blue", "all_gather": "tab:orange", "combine": "tab:gray", "gradient": "tab:green"}
GPUS = (2, 4, 8, 16, 32, 64)


def timeline_figure(data: dict):
    """One row per rank and size: the recorded median of each phase of losslab's forward+backward
    laid end to end (the GPU runs them in this order on one stream), each phase its colour."""
    sizes = data["sizes"]
    fig, axes = plt.subplots(len(sizes), 1, figsize=(9, 1.2 + 0.6 * data["world"] * len(sizes)), squeeze=False)
    for ax, size in zip(axes[:, 0], sizes, strict=True):
        for rank, phases in enumerate(size["phases_ms_per_rank"]):
            start = 0.0
            for name, _ in PHASES:
                ax.barh(f"rank {rank}", phases[name], left=start, color=COLOURS[name], edgecolor="white")
                start += phases[name]
        ax.invert_yaxis()
        ax.set_ylabel("rank")
        ax.set_xlabel("phase medians, each timed alone, end to end (ms)")
        ax.set_title(f"{size['rows']} x {size['vocab']} {size['dtype']}", fontsize=10)
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLOURS[name]) for name, _ in PHASES]
    fig.legend(handles, [f"{name} ({kind})" for name, kind in PHASES], loc="lower center", ncol=4, fontsize=8)
    fig.suptitle(f"Per-rank timeline on {data['world']} x {data['device']} (recorded phase medians)")
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


@dataclass(frozen=True)
class ScalingModel:
    """Modelled ms per forward+backward at ``gpus`` GPUs for one size, from one record.

    Assumptions: the vocabulary splits evenly, so each rank's kernels take the recorded time
    scaled by (recorded world / W); a collective costs its recorded small-message latency, the
    same at every W, plus its bytes over the recorded bus bandwidth (ring algorithms: an
    all-gather of b bytes per rank moves (W-1) b, an all-reduce of b bytes 2 (W-1)/W b). Past one
    node (8 GPUs) the links are slower and the latency grows: the model is a lower bound there."""

    gpus: tuple[int, ...]
    losslab_ms: tuple[float, ...]
    megatron_ms: tuple[float, ...]
    losslab_collective_ms: tuple[float, ...]
    megatron_collective_ms: tuple[float, ...]


def losslab_parts(data: dict, size: dict, w: int) -> dict[str, float]:
    """The terms of losslab's modelled ms at ``w`` GPUs for one recorded ``size`` (:class:`ScalingModel`):
    "local" (the statistics and gradient kernels, the slowest rank's medians scaled by recorded world / w),
    "combine" (the slowest rank's recorded median, the same at every w) and "all_gather" (the recorded
    4-byte back-to-back latency plus (w - 1) x the statistics' bytes per rank over the recorded bus bandwidth)."""
    c = data["collectives"]
    phases = {name: max(r[name] for r in size["phases_ms_per_rank"]) for name, _ in PHASES}
    return {"local": (phases["statistics"] + phases["gradient"]) * data["world"] / w,
            "combine": phases["combine"],
            "all_gather": c["all_gather_latency_ms"] + (w - 1) * c["statistics_bytes_per_rank"]
            / c["all_gather_bus_gbps"] / 1e6}


def scaling_model(data: dict, size: dict, gpus: tuple[int, ...] = GPUS) -> ScalingModel:
    """The :class:`ScalingModel` of one recorded ``size`` of ``data``."""
    c, world, rows = data["collectives"], data["world"], size["rows"]
    megatron_local = size["ms"]["megatron_style"] - c["three_all_reduces_ms"]
    reduce_bytes = rows * 4
    ours, theirs, our_comm, their_comm = [], [], [], []
    for w in gpus:
        parts = losslab_parts(data, size, w)
        reduce = 3 * (c["all_reduce_latency_ms"] + 2 * (w - 1) / w * reduce_bytes / c["all_reduce_bus_gbps"] / 1e6)
        ours.append(sum(parts.values()))
        theirs.append(megatron_local * world / w + reduce)
        our_comm.append(parts["all_gather"])
        their_comm.append(reduce)
    return ScalingModel(tuple(gpus), tuple(ours), tuple(theirs), tuple(our_comm), tuple(their_comm))


def floor_lines(data: dict, gpus: int = GPUS[-1]) -> list[str]:
    """Per recorded size, losslab's modelled ms at ``gpus`` GPUs split into its terms (:func:`losslab_parts`),
    which of the combination and the all-gather is the larger (about equal within 10 %), and the
    combination's recorded median on each rank (the same [W, N, 4] input at every size)."""
    lines = []
    for size in data["sizes"]:
        parts = losslab_parts(data, size, gpus)
        combine = " / ".join(f"{r['combine']:.3f}" for r in size["phases_ms_per_rank"])
        ratio = parts["combine"] / parts["all_gather"]
        which = ("the two are about equal terms of the floor" if 0.9 <= ratio <= 1.1 else
                 f"the {'combination' if ratio > 1 else 'all-gather'} is the larger term of the floor")
        lines.append(f"{size['rows']} x {size['vocab']} at {gpus} GPUs: local kernels {parts['local']:.3f} ms, "
                     f"combination {parts['combine']:.3f} ms, all-gather {parts['all_gather']:.3f} ms: {which} "
                     f"(the combination recorded {combine} ms on the {data['world']} ranks)")
    return lines


def all_gather_lines(data: dict) -> list[str]:
    """The all-gather of the statistics as the timeline draws it (timed alone, the slowest rank) against what
    the scaling model charges for it at the recorded world, and the record's back-to-back latencies."""
    from losslab.distributed.bench import LATENCY_CALLS  # the benchmark's module: torch.distributed, lazily

    c, lines = data["collectives"], []
    for size in data["sizes"]:
        alone = max(r["all_gather"] for r in size["phases_ms_per_rank"])
        charged = losslab_parts(data, size, data["world"])["all_gather"]
        lines.append(f"{size['rows']} x {size['vocab']}: the all-gather timed alone {alone:.3f} ms; "
                     f"the model charges {charged:.3f} ms for it")
    lines.append(f"back to back ({LATENCY_CALLS} calls, one event pair around them): a 4-byte all-gather "
                 f"{c['all_gather_latency_ms']:.3f} ms per call, the statistics' "
                 f"{c['statistics_bytes_per_rank'] // 1024} KiB {c['all_gather_statistics_ms']:.3f} ms")
    return lines


def scaling_figure(data: dict):
    """The modelled ms per call against the number of GPUs, losslab and Megatron-style, each size,
    with losslab's all-gather dotted; the recorded points marked."""
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for i, size in enumerate(data["sizes"]):
        colour = plt.cm.tab10(2 * i)
        model = scaling_model(data, size)
        label = f"{size['rows']} x {size['vocab']}"
        ax.plot(model.gpus, model.losslab_ms, "-o", color=colour, label=f"losslab, {label}")
        ax.plot(model.gpus, model.megatron_ms, "-s", color=colour, alpha=0.5, label=f"Megatron-style, {label}")
        ax.plot(model.gpus, model.losslab_collective_ms, ":", color=colour, label=f"losslab's all-gather, {label}")
        ax.plot([data["world"]], [size["ms"]["losslab"]], "k*", markersize=10,
                label="recorded (losslab)" if i == 0 else None)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(GPUS, [str(g) for g in GPUS])
    ax.set_xlabel("GPUs (vocabulary split evenly)")
    ax.set_ylabel("modelled forward+backward (ms)")
    ax.set_title(f"Scaling model from the {data['world']}-GPU record on {data['device']}")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return fig


def model_rows(data: dict) -> list[str]:
    """The scaling model as text rows: GPUs, and per size losslab's and Megatron-style's modelled ms."""
    rows = [f"{'modelled ms per call at GPUs':<32}" + "".join(f"{g:>8}" for g in GPUS)]
    for size in data["sizes"]:
        m = scaling_model(data, size)
        for name, values in (("losslab", m.losslab_ms), ("Megatron-style", m.megatron_ms)):
            label = f"{size['rows']} x {size['vocab']} {name}"
            rows.append(f"{label:<32}" + "".join(f"{v:>8.3f}" for v in values))
    return rows


def combination_demo(world: int = 4, vocab: int = 10, seed: int = 0) -> list[str]:
    """The log-sum-exp combination on a small random row split over ``world`` slices, next to
    logsumexp of the whole row (float64): lines of text, the numbers computed here."""
    rng = np.random.default_rng(seed)
    row = rng.normal(0, 3, vocab)
    slices = np.array_split(row, world)
    m = np.array([s.max() for s in slices])
    s = np.array([np.exp(p - p.max()).sum() for p in slices])
    whole_max = m.max()
    combined = whole_max + np.log((s * np.exp(m - whole_max)).sum())
    direct = row.max() + np.log(np.exp(row - row.max()).sum())
    lines = [f"rank {r}: m = {m[r]:+.4f}, s = {s[r]:.4f}" for r in range(world)]
    lines.append(f"combined M + log S = {combined:.12f}; logsumexp of the whole row = {direct:.12f}")
    return lines
