"""Device ceilings measured on the device, the cost model, and the roofline plot.

A loss kernel's floor is ``minimum bytes / measured bandwidth`` (DESIGN.md,
"Performance model"). Ceilings are measured, not taken from a datasheet:

- copy bandwidth: a large device-to-device copy (bytes read + written) / time;
- read bandwidth: a large ``torch.sum`` (bytes read) / time;
- FP32 FMA throughput: ``kernels/ceilings/fma_throughput.cu``, independent
  chains of dependent FMAs (2 FLOP each) / time;
- MUFU throughput: the same with ``ex2.approx`` (one special-function op each).

Datasheet figures are shown beside them, labelled as such, with their source.

The roofline places each (implementation, direction) of a recorded bench
section at its model arithmetic intensity (cost-model FLOP / minimum bytes)
and its achieved FLOP/s (cost-model FLOP / measured median time). Where
Nsight Compute ran (``losslab.measure.ncu``), a hollow marker at the same height
shows the intensity over the DRAM bytes the kernels really moved.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from losslab import problems

BANDWIDTH_BYTES = 2**30  # 1 GiB: far beyond any L2
BLOCKS_PER_SM = 8        # x 256 threads: 2048 threads, a full SM
FMA_ITERATIONS = 65536   # about 4 ms on an H100 SXM
MUFU_ITERATIONS = 8192   # about 4 ms on an H100 SXM
FMA_A, FMA_B = 0.999999, 1e-6  # x -> a x + b settles near 1: no overflow, no denormals


@dataclass(frozen=True)
class Datasheet:
    """Vendor peak figures of one product (not measured).

    Attributes:
        product: the product the figures are for.
        memory_gbps: peak DRAM bandwidth in GB/s (1e9 bytes/s).
        fp32_tflops: peak non-tensor FP32 rate in TFLOP/s (1e12 FLOP/s).
        source: where the figures are published.
    """

    product: str
    memory_gbps: float
    fp32_tflops: float
    source: str


_H100 = "NVIDIA H100 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/h100/"
_H200 = "NVIDIA H200 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/h200/"
_A100 = "NVIDIA A100 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/a100/"
# (substring of torch.cuda.get_device_name(), figures); the first match wins, so
# the more specific names come first.
DATASHEETS: tuple[tuple[str, Datasheet], ...] = (
    ("H100 PCIe", Datasheet("H100 PCIe", 2000, 51, _H100)),
    ("H100 NVL", Datasheet("H100 NVL", 3900, 60, _H100)),
    ("H100", Datasheet("H100 SXM", 3350, 67, _H100)),
    ("H200 NVL", Datasheet("H200 NVL", 4800, 60, _H200)),
    ("H200", Datasheet("H200 SXM", 4800, 67, _H200)),
    ("A100-SXM4-80GB", Datasheet("A100 80GB SXM", 2039, 19.5, _A100)),
    ("A100 80GB PCIe", Datasheet("A100 80GB PCIe", 1935, 19.5, _A100)),
    ("A100", Datasheet("A100 40GB", 1555, 19.5, _A100)),
)


def datasheet(device: str) -> Datasheet | None:
    """The datasheet figures for a device name such as 'NVIDIA H100 80GB HBM3', or None if unknown."""
    for key, sheet in DATASHEETS:
        if key.lower() in device.lower():
            return sheet
    return None


def measure_bandwidth(nbytes: int = BANDWIDTH_BYTES, repeats: int = 20) -> dict[str, float]:
    """Measured memory bandwidth of the current CUDA device in GB/s (1e9 bytes/s):
    {"read": ..., "copy": ...}, the best of each kind in :func:`measure_bandwidth_methods`."""
    return best_bandwidth(measure_bandwidth_methods(nbytes, repeats))


def best_bandwidth(by_method: dict[str, float]) -> dict[str, float]:
    """{"read", "copy"}: the best figure of each kind among ``by_method``'s "read ..."/"copy ..." keys."""
    return {kind: max(v for k, v in by_method.items() if k.startswith(kind)) for kind in ("read", "copy")}


def measure_bandwidth_methods(nbytes: int = BANDWIDTH_BYTES, repeats: int = 20) -> dict[str, float]:
    """Memory bandwidth of the current CUDA device by each method, in GB/s (1e9 bytes/s).

    Over ``nbytes`` of float32 (median of ``repeats``): "read torch.sum" and "read
    stream kernel xU" (the two-stream read kernel of ``kernels/ceilings/``, U loads
    of each stream in flight per thread), bytes read / time; "copy Tensor.copy_",
    2 x bytes / time. torch.sum alone can sit below what a loss kernel reaches
    (seen on an H200: torch.sum 4.14 TB/s against 4.44 TB/s for kl_div's
    vectorized forward, which reads two tensors at once), which would put a rung
    above its ceiling; the ceiling is the best of them (:func:`best_bandwidth`).
    """
    from losslab import build
    from losslab.measure.bench import time_cuda

    source = torch.rand(nbytes // 4, device="cuda")
    dest = torch.empty_like(source)
    by_method = {
        "read torch.sum": nbytes / time_cuda(lambda: source.sum(), repeats=repeats).median_ms / 1e6,
        "copy Tensor.copy_": 2 * nbytes / time_cuda(lambda: dest.copy_(source), repeats=repeats).median_ms / 1e6,
    }
    try:
        ext = build.load_extension("ceilings")
    except build.BuildError as err:
        print(f"losslab: streaming bandwidth kernels unavailable, using torch only: {err}")
    else:
        n4 = source.numel() // 4
        sums = torch.empty(ext.stream_blocks(n4) * ext.THREADS, device="cuda")
        stream = torch.cuda.current_stream().cuda_stream
        for unroll in (4, 8):
            read = time_cuda(lambda: ext.stream_read(source.data_ptr(), n4, sums.data_ptr(), unroll, stream),
                             repeats=repeats)
            by_method[f"read stream kernel x{unroll}"] = 16 * n4 / read.median_ms / 1e6
    return by_method


def measure_compute(repeats: int = 10) -> dict[str, float]:
    """Measured FP32 FMA and MUFU (exp2) throughput of the current CUDA device.

    Returns {"fp32_fma_tflops": TFLOP/s (1e12 FLOP/s, 2 FLOP per FMA),
    "mufu_ex2_tops": 1e12 ex2 operations/s}, from the kernels in
    ``kernels/ceilings/`` run on every SM at full occupancy (median of ``repeats``).

    Raises:
        build.BuildError: the ceilings kernels cannot be built here.
    """
    from losslab import build
    from losslab.measure.bench import time_cuda

    ext = build.load_extension("ceilings")
    blocks = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count * BLOCKS_PER_SM
    out = torch.empty(blocks * ext.THREADS, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    per_iteration = blocks * ext.THREADS * ext.CHAINS
    fma = time_cuda(lambda: ext.fma_throughput(out.data_ptr(), blocks, FMA_ITERATIONS, FMA_A, FMA_B, stream),
                    repeats=repeats)
    mufu = time_cuda(lambda: ext.mufu_ex2_throughput(out.data_ptr(), blocks, MUFU_ITERATIONS, stream),
                     repeats=repeats)
    return {"fp32_fma_tflops": 2 * per_iteration * FMA_ITERATIONS / fma.median_ms / 1e9,
            "mufu_ex2_tops": per_iteration * MUFU_ITERATIONS / mufu.median_ms / 1e9}


def measure_ceilings(repeats: int = 20) -> dict:
    """Every ceiling of the current CUDA device, measured, with the datasheet beside it.

    Returns a dict with ``read_gbps`` and ``copy_gbps`` (GB/s, 1e9 bytes/s),
    ``fp32_fma_tflops`` (1e12 FLOP/s) and ``mufu_ex2_tops`` (1e12 ops/s), all
    measured; ``datasheet``: the vendor's figures for this device (see
    :data:`DATASHEETS`, each with its source) or None; and ``compute_error``
    (a message) instead of the compute keys when the ceilings kernels cannot be built.
    """
    from losslab.build import BuildError

    by_method = measure_bandwidth_methods(repeats=repeats)
    bandwidth = best_bandwidth(by_method)
    ceilings: dict = {"read_gbps": bandwidth["read"], "copy_gbps": bandwidth["copy"],
                      "bandwidth_by_method_gbps": by_method}
    try:
        ceilings.update(measure_compute(repeats=max(3, repeats // 2)))
    except BuildError as err:
        ceilings["compute_error"] = str(err)
    sheet = datasheet(torch.cuda.get_device_name())
    ceilings["datasheet"] = asdict(sheet) if sheet else None
    return ceilings


def ceilings_text(section: dict) -> str:
    """A text table of a section's ceilings: measured beside the datasheet, with units and source."""
    ceilings = section.get("ceilings") or {}
    bandwidth = section.get("bandwidth_gbps") or {}
    sheet = datasheet(section.get("device", ""))
    rows = [("read bandwidth", ceilings.get("read_gbps", bandwidth.get("read")), sheet and sheet.memory_gbps, "GB/s"),
            ("copy bandwidth", ceilings.get("copy_gbps", bandwidth.get("copy")), sheet and sheet.memory_gbps, "GB/s"),
            ("FP32 FMA", ceilings.get("fp32_fma_tflops"), sheet and sheet.fp32_tflops, "TFLOP/s"),
            ("MUFU ex2", ceilings.get("mufu_ex2_tops"), None, "Tops/s")]
    fmt = lambda v: f"{v:,.1f}" if isinstance(v, (int, float)) else "not measured" if v is None else str(v)
    lines = [f"{'ceiling':<16} {'measured':>14} {'datasheet':>12}  unit"]
    lines += [f"{name:<16} {fmt(measured):>14} {fmt(peak) if peak else '-':>12}  {unit}"
              for name, measured, peak, unit in rows]
    lines.append(f"measured on {section.get('device')} on {section.get('date')}")
    if sheet:
        lines.append(f"datasheet ({sheet.product}, not measured; the bandwidth is the DRAM peak): {sheet.source}")
    if "compute_error" in ceilings:
        lines.append(f"FP32/MUFU not measured: {ceilings['compute_error']}")
    return "\n".join(lines)


# --- cost model -------------------------------------------------------------

def cost_table(problem: str, shape: tuple[int, int] | None = None, dtype: str = "float32",
               directions: tuple[str, ...] = problems.DIRECTIONS) -> list[dict]:
    """The cost model of ``problem`` per direction: the same for every variant.

    Each row: direction, flops (FLOP, adds/multiplies/divides), transcendentals
    (log/exp calls), bytes (minimum bytes read + written) and intensity
    (FLOP per byte). ``shape`` defaults to the problem's seed size.
    """
    spec = problems.get(problem)
    shape = tuple(shape or spec.sizes["seed"])
    table = []
    for direction in directions:
        cost = spec.cost(shape, direction, getattr(torch, dtype))
        table.append({"problem": problem, "direction": direction, "flops": cost.flops,
                      "transcendentals": cost.transcendentals, "bytes": cost.bytes,
                      "intensity": cost.arithmetic_intensity})
    return table


@dataclass(frozen=True)
class Point:
    """One (implementation, direction) on the roofline.

    ``flops`` and ``model_bytes`` come from the cost model, ``median_ms`` from the
    bench, ``measured_bytes`` (DRAM bytes read + written) from Nsight Compute, if it ran.
    """

    problem: str
    implementation: str
    kind: str  # "variant" or "peer"
    direction: str
    flops: int
    model_bytes: int
    median_ms: float
    measured_bytes: float | None = None

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


def points(section: dict, directions: tuple[str, ...] = ("forward", "backward")) -> list[Point]:
    """Roofline points of one recorded bench section (see ``__main__.cmd_bench``)."""
    ncu = section.get("ncu") or {}
    measured = {}
    if ncu.get("status") == "ok" and list(ncu.get("shape", [])) == list(section["shape"]):
        measured = {(r["implementation"], r["direction"]): r["dram_bytes_read"] + r["dram_bytes_written"]
                    for r in ncu["records"]}
    spec_cache = {}
    out = []
    for row in section["rows"]:
        if row["direction"] not in directions:
            continue
        spec = spec_cache.setdefault(row["problem"], problems.get(row["problem"]))
        cost = spec.cost(tuple(row["shape"]), row["direction"], getattr(torch, row["dtype"]))
        out.append(Point(row["problem"], row["implementation"], row["kind"], row["direction"], cost.flops,
                         cost.bytes, row["median_ms"], measured.get((row["implementation"], row["direction"]))))
    return out


# --- the plot ---------------------------------------------------------------

COLORS = {"naive": "tab:red", "shared_memory": "tab:orange", "warp_shuffle": "tab:olive",
          "vectorized": "tab:green", "fused": "tab:blue", "eager": "0.35", "compile": "tab:purple"}
MARKERS = {"forward": "o", "backward": "s", "forward_backward": "^"}
SHORT = {"forward": "fwd", "backward": "bwd", "forward_backward": "fwd+bwd"}


def _roofs(section: dict) -> dict:
    """Memory roofs (GB/s) and compute roof (TFLOP/s) of a section, with where each came from."""
    ceilings = section.get("ceilings") or {}
    bandwidth = section.get("bandwidth_gbps") or {}
    sheet = datasheet(section.get("device", ""))
    roofs = {"read_gbps": ceilings.get("read_gbps", bandwidth.get("read")),
             "copy_gbps": ceilings.get("copy_gbps", bandwidth.get("copy")),
             "fp32_tflops": ceilings.get("fp32_fma_tflops"), "compute_source": "measured FMA",
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
            ax.annotate(f"{name} ({SHORT.get(p.direction, p.direction)})", (x, p.flops_per_s), xytext=(x * 1.25, y),
                        fontsize=7, va="center", color=COLORS.get(p.implementation, "tab:gray"))


def plot_roofline(sections: dict | list[dict], directions: tuple[str, ...] = ("forward", "backward"),
                  title: str | None = None, ax=None):
    """Draw the roofline of one or more bench sections (one per problem) from the same device.

    Memory roofs from the measured read and copy bandwidth (GB/s), compute roof
    from the measured FP32 FMA rate (TFLOP/s; the datasheet's, labelled so, for a
    section recorded without it), ridge points marked, the datasheet roofs in
    grey. Filled markers: model intensity; hollow markers with an arrow: intensity
    over the DRAM bytes Nsight Compute measured. Circles forward, squares backward;
    black edges for the ladder's variants, none for the peers (eager, compile).

    Returns the matplotlib Figure.
    """
    import matplotlib.pyplot as plt

    sections = [sections] if isinstance(sections, dict) else list(sections)
    if not sections:
        raise ValueError("sections: expected at least one recorded bench section")
    pts = [p for s in sections for p in points(s, directions)]
    if ax is None:
        fig, ax = plt.subplots(figsize=(9, 6), layout="constrained")
    else:
        fig = ax.figure
    roofs = _roofs(sections[0])
    xs = [p.intensity for p in pts] + [p.measured_intensity for p in pts if p.measured_intensity]
    ridge = (roofs["fp32_tflops"] or 0) * 1e3 / (roofs["read_gbps"] or math.inf)
    x_range = (min(xs, default=0.1) / 4, max([*xs, ridge, 1.0]) * 8)
    _draw_roofs(ax, roofs, x_range)
    _draw_points(ax, pts, prefix_problem=len(sections) > 1)
    ax.set(xscale="log", yscale="log", xlim=x_range, xlabel="arithmetic intensity (FLOP / byte)",
           ylabel="achieved FLOP/s (model FLOP / measured time)")
    ys = [p.flops_per_s for p in pts]
    top = (roofs["fp32_tflops"] or 0) * 1e12 or max(ys, default=1e12)
    ax.set_ylim(min(ys, default=top / 1e4) / 5, top * 3)
    ax.grid(True, which="both", lw=0.3, alpha=0.5)
    first = sections[0]
    shapes = "; ".join(f"{s['rows'][0]['problem'] if s['rows'] else '?'} "
                       f"{'x'.join(map(str, s['shape']))} {s['dtype']}" for s in sections)
    ax.set_title(title or f"{shapes}\n{first['device']}, {first['date']}", fontsize=10)
    from matplotlib.lines import Line2D

    handles, labels = ax.get_legend_handles_labels()
    keys = [Line2D([], [], marker=MARKERS[d], color="0.4", ls="none", label=d) for d in directions if d in MARKERS]
    if any(p.measured_intensity for p in pts):
        keys.append(Line2D([], [], marker="o", mfc="none", color="0.4", ls="none",
                           label="hollow: over DRAM bytes measured by ncu"))
    ax.legend(handles=handles + keys, fontsize=7, loc="lower right")
    return fig


def plot_model_only(problem_names: tuple[str, ...] | list[str], device: str = "H100 SXM"):
    """A roofline with no measurement: the datasheet roofs of ``device`` (labelled
    datasheet) and a vertical line at each problem's model intensity per direction.
    For machines with no recorded results yet. Returns the Figure."""
    import matplotlib.pyplot as plt

    sheet = datasheet(device)
    fig, ax = plt.subplots(figsize=(9, 5), layout="constrained")
    rows = [r for name in problem_names for r in cost_table(name, directions=("forward", "backward"))]
    x_range = (min(r["intensity"] for r in rows) / 4, 200.0)
    if sheet:
        _draw_roofs(ax, {"read_gbps": None, "copy_gbps": None, "fp32_tflops": None, "datasheet": sheet}, x_range)
        ridge = sheet.fp32_tflops * 1e3 / sheet.memory_gbps
        ax.plot([ridge], [sheet.fp32_tflops * 1e12], "D", color="0.6")
        ax.annotate(f"ridge (datasheet) {ridge:.1f} FLOP/B", (ridge, sheet.fp32_tflops * 1e12), xytext=(0, -16),
                    textcoords="offset points", fontsize=8, ha="right")
    for r in rows:
        ax.axvline(r["intensity"], color="tab:blue", ls="-" if r["direction"] == "forward" else "--", lw=0.8)
        ax.annotate(f"{r['problem']} {r['direction']}", (r["intensity"], 1e11), rotation=90, fontsize=8,
                    xytext=(3, 0), textcoords="offset points")
    ax.set(xscale="log", yscale="log", xlim=x_range, ylim=(1e10, 3e14), xlabel="arithmetic intensity (FLOP / byte)",
           ylabel="FLOP/s", title=f"model intensities on the {device} datasheet roofline (nothing measured)")
    ax.grid(True, which="both", lw=0.3, alpha=0.5)
    ax.legend(fontsize=7, loc="lower right")
    return fig


def write_figures(problem_names: list[str] | None = None, output_dir: Path | str = "reports/figures",
                  device: str | None = None, results_dir: Path | None = None) -> list[Path]:
    """Write ``roofline_<problem>.png`` for each problem with a recorded section, and
    ``roofline_all.png`` over all of them, from the newest records (no GPU needed).

    ``device`` picks a device's record (default: the device of the newest section
    among the problems). Problems without a record are reported on stderr and skipped.
    Returns the written paths (empty when nothing is recorded).
    """
    import sys

    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    from losslab import records

    results_dir = Path(results_dir) if results_dir else records.RESULTS_DIR
    problem_names = list(problem_names or problems.names())
    found = {}
    for name in problem_names:
        try:
            found[name] = records.latest_section(name, device, results_dir)
        except LookupError as err:
            print(f"losslab roofline: {err}", file=sys.stderr)
    if not found:
        return []
    device = device or max(found.values(), key=lambda s: s["date"])["device"]
    found = {k: s for k, s in found.items() if s["device"] == device}
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, section in found.items():
        for key, value in (("ncu", section.get("ncu")),):
            if value and value.get("status") != "ok":
                print(f"losslab roofline: {name}: no measured-traffic points ({key}: {value.get('message')})",
                      file=sys.stderr)
        fig = plot_roofline(section)
        written.append(output_dir / f"roofline_{name}.png")
        fig.savefig(written[-1], dpi=120)
        plt.close(fig)
    fig = plot_roofline(list(found.values()), title=f"all problems on {device}")
    written.append(output_dir / "roofline_all.png")
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)
    return written


def live_section(problem: str, size: str = "seed", variants: list[str] | None = None, repeats: int = 10,
                 ncu: bool = False, compile_peer: bool = True) -> dict:
    """Measure a section now on the current GPU (ceilings, bench, optionally ncu), without recording it.

    Returns a dict shaped like a recorded section (see ``__main__.cmd_bench``) with ``"live": True``.
    """
    from losslab import records
    from losslab.measure.bench import PEERS, bench_problem

    spec = problems.get(problem)
    shape = spec.sizes[size]
    ceilings = measure_ceilings()
    bandwidth = {"read": ceilings["read_gbps"], "copy": ceilings["copy_gbps"]}
    peers = tuple(p for p in PEERS if compile_peer or p != "compile")
    section = records.provenance(problem)
    rows = bench_problem(problem, shape, variants, peers=peers, repeats=repeats, bandwidth=bandwidth)
    section.update(shape=list(shape), dtype="float32", repeats=repeats, bandwidth_gbps=bandwidth,
                   rows=[r.as_dict() for r in rows], checks=[], ceilings=ceilings, live=True)
    if ncu:
        from losslab.measure.ncu import profile_problem

        section["ncu"] = profile_problem(problem, shape, variants, peers)
    return section
