"""Notebook 08's figures, drawn without a GPU: the bytes of one training step of a head (why the logits
dominate) and the head's roofline with the tensor-core roof, its peers placed from a record."""
from __future__ import annotations

from dataclasses import dataclass

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from losslab.linear_cross_entropy.peers import LABELS

GIB = 2**30


@dataclass(frozen=True)
class Roofs:
    """Datasheet figures (not measured): dense BF16 tensor-core TFLOP/s and DRAM GB/s."""

    product: str
    tensor_tflops: float
    memory_gbps: float


# NVIDIA's datasheets (H100: nvidia.com/en-us/data-center/h100, H200: .../h200, A100: .../a100),
# dense (no sparsity) BF16 tensor-core peaks; the first whose key the device name contains.
ROOFS = (("H100 PCIe", Roofs("H100 PCIe", 756, 2000)), ("H100", Roofs("H100 SXM", 989, 3350)),
         ("H200", Roofs("H200 SXM", 989, 4800)), ("A100", Roofs("A100 SXM", 312, 2039)))


def roofs(device: str) -> Roofs:
    """The datasheet roofs of ``device`` (a name such as 'NVIDIA H100 80GB HBM3'); the H100 SXM's for
    a device not in :data:`ROOFS`."""
    return next((r for key, r in ROOFS if key.lower() in device.lower()), ROOFS[1][1])


def step_bytes(tokens: int, hidden: int, vocab: int, element_bytes: int = 2) -> dict[str, int]:
    """Bytes of each tensor of one forward+backward of the head when the logits are materialized as
    eager PyTorch does (logits upcast to float32 before the loss): name -> bytes."""
    return {"input (N x H)": tokens * hidden * element_bytes,
            "weight (V x H)": vocab * hidden * element_bytes,
            "weight gradient (V x H)": vocab * hidden * element_bytes,
            "logits (N x V)": tokens * vocab * element_bytes,
            "logits in float32": tokens * vocab * 4,
            "logits' gradient in float32": tokens * vocab * 4}


def bytes_figure(heads: dict[str, tuple[int, int, int]]) -> Figure:
    """One panel per head (label -> (N, H, V)): the GiB of each tensor of :func:`step_bytes` in bfloat16."""
    fig = Figure(figsize=(9, 0.6 + 2.2 * len(heads)), layout="constrained")
    axes = fig.subplots(len(heads), 1, sharex=True, squeeze=False)[:, 0]
    for ax, (label, shape) in zip(axes, heads.items(), strict=True):
        sizes = step_bytes(*shape)
        colours = ["tab:blue" if "logits" not in name else "tab:red" for name in sizes]
        ax.barh(list(sizes), [b / GIB for b in sizes.values()], color=colours)
        ax.invert_yaxis()
        ax.set_ylabel("tensor")
        ax.set_title(f"{label}: N, H, V = {', '.join(map(str, shape))}", fontsize="medium")
    axes[-1].set_xlabel("size (bytes, in GiB)")
    axes[0].legend(handles=[Patch(color="tab:red", label="the logits: what a fused or chunked head never stores"),
                            Patch(color="tab:blue", label="inputs and the weight's gradient: every head has them")],
                   loc="upper right", fontsize="small")
    fig.suptitle("One training step of the head: the logits and their gradient dwarf the weights")
    return fig


def intensity(tokens: int, hidden: int, vocab: int, element_bytes: int = 2, logits_passes: int = 0) -> float:
    """FLOP per DRAM byte of the head's forward+backward: 6 N H V flops over reading the input and the
    weight and writing their gradients, plus ``logits_passes`` reads or writes of (N, V) logits
    (0: fused or chunked in cache; eager makes about a dozen, in 16 and 32 bits)."""
    flops = 6 * tokens * hidden * vocab
    nbytes = 2 * (tokens + vocab) * hidden * element_bytes + logits_passes * tokens * vocab * element_bytes
    return flops / nbytes


def roofline_figure(device: str, head: dict | None = None) -> Figure:
    """Log-log roofline of the head on ``device``'s datasheet roofs: the tensor-core roof, the memory roof,
    the head's intensity without the logits in memory and with a dozen passes over them (as eager), and,
    from ``head`` (one head of a linear cross-entropy record), each peer's achieved FLOP/s (6 N H V / its
    median time) at the intensity without the logits. Without ``head`` the Llama-3-8B head's intensities."""
    r = roofs(device)
    n, h, v = (head["tokens"], head["hidden"], head["vocab"]) if head else (8192, 4096, 128256)
    fused, eager = intensity(n, h, v), intensity(n, h, v, logits_passes=12)
    ridge = r.tensor_tflops * 1e3 / r.memory_gbps
    fig = Figure(figsize=(8, 5.2), layout="constrained")
    ax = fig.add_subplot()
    xs = [1.0, ridge, 1e5]
    ax.plot(xs, [min(x * r.memory_gbps * 1e9, r.tensor_tflops * 1e12) for x in xs], color="black", lw=1.5)
    ax.text(1.3, 1.6 * 1.3 * r.memory_gbps * 1e9, f"memory roof {r.memory_gbps:.0f} GB/s", rotation=24,
            fontsize="small")
    ax.text(ridge * 1.3, r.tensor_tflops * 1e12 * 1.25, f"BF16 tensor-core roof {r.tensor_tflops:g} TFLOP/s",
            fontsize="small")
    ax.axvline(fused, color="tab:green", ls="--", label=f"no logits in memory: {fused:.0f} FLOP / byte")
    ax.axvline(eager, color="tab:red", ls=":", label=f"a dozen passes over the logits: {eager:.0f} FLOP / byte")
    if head:
        flops = 6 * n * h * v
        for name, peer in head["peers"].items():
            ax.plot([fused], [flops / (peer["median_ms"] * 1e-3)], "o", label=LABELS[name])
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(1, 1e5)
    ax.set_ylim(1e12, 4e15)
    ax.set_xlabel("arithmetic intensity (FLOP / byte of DRAM traffic)")
    ax.set_ylabel("achieved FLOP/s")
    what = f"{head['label']} head" if head else "Llama-3-8B head (no record: intensities only)"
    ax.set_title(f"The {what} on the {r.product}'s datasheet roofs")
    ax.legend(loc="lower right", fontsize="small")
    return fig
