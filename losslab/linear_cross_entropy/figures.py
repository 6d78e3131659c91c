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
    """Bytes of the tensors of one forward+backward of the head at eager PyTorch's peak (logits upcast
    to float32 before the loss): name -> bytes. The inputs and the weight's gradient in ``element_bytes``;
    then the three float32 (N, V) tensors alive together in the backward, when log_softmax's gradient is
    made: its output (saved by the forward), nll_loss's gradient of it, and its own gradient (the logits'
    gradient in float32). The bfloat16 logits and their float32 copy are freed by then: autograd saves
    neither. Every name but the inputs' and the weight gradient's contains "logits"."""
    logits = tokens * vocab * 4
    return {"input (N x H)": tokens * hidden * element_bytes,
            "weight (V x H)": vocab * hidden * element_bytes,
            "weight gradient (V x H)": vocab * hidden * element_bytes,
            "logits' log_softmax, float32 (saved)": logits,
            "logits' log_softmax gradient, float32 (nll_loss's)": logits,
            "logits' gradient, float32 (log_softmax's)": logits}


def bytes_figure(heads: dict[str, tuple[int, int, int]]) -> Figure:
    """One panel per head (label -> (N, H, V)): the GiB of each tensor of :func:`step_bytes` (a bfloat16 head)."""
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
    logits = "the logits' float32 tensors at eager's peak: a fused or chunked head stores none"
    axes[0].legend(handles=[Patch(color="tab:red", label=logits),
                            Patch(color="tab:blue", label="inputs and the weight's gradient: every head has them")],
                   loc="upper right", fontsize="small")
    fig.suptitle("Eager's peak in one training step of the head: the logits' tensors dwarf the weights")
    return fig


# Eager's passes over the (N, V) logits in one forward+backward (F.cross_entropy(F.linear(x, W).float(), t)),
# each a read or a write of every logit, and its element size in bytes. Too large for L2 at these heads' sizes,
# each goes to DRAM; a kernel that reads a row more than once (log_softmax's maximum, then its sum) adds more.
EAGER_LOGITS_PASSES = (
    ("the GEMM writes the bfloat16 logits", 2),
    (".float() reads them", 2), (".float() writes the float32 logits", 4),
    ("log_softmax reads them", 4), ("log_softmax writes its output", 4),
    ("nll_loss's backward writes its gradient", 4),
    ("log_softmax's backward reads that gradient", 4), ("and its saved output", 4),
    ("and writes the logits' gradient", 4),
    ("the cast back reads it", 4), ("and writes it in bfloat16", 2),
    ("the input gradient's GEMM reads it", 2), ("the weight gradient's GEMM reads it", 2),
)


def intensity(tokens: int, hidden: int, vocab: int, element_bytes: int = 2, logits_bytes: int = 0) -> float:
    """FLOP per DRAM byte of the head's forward+backward: 6 N H V flops over reading the input and the
    weight and writing their gradients (``element_bytes`` each), plus ``logits_bytes`` per logit for the
    passes over the (N, V) logits (0: fused or chunked in cache; eager's: the sum of
    :data:`EAGER_LOGITS_PASSES`' element sizes, in 16 and 32 bits)."""
    flops = 6 * tokens * hidden * vocab
    nbytes = 2 * (tokens + vocab) * hidden * element_bytes + logits_bytes * tokens * vocab
    return flops / nbytes


def eager_intensity(tokens: int, hidden: int, vocab: int) -> float:
    """:func:`intensity` of a bfloat16 head with eager's passes over its logits (:data:`EAGER_LOGITS_PASSES`)."""
    return intensity(tokens, hidden, vocab, logits_bytes=sum(size for _, size in EAGER_LOGITS_PASSES))


def ridge(device: str) -> float:
    """The ridge point of ``device``'s datasheet roofs (:func:`roofs`): tensor-core FLOP/s over DRAM bytes/s."""
    r = roofs(device)
    return r.tensor_tflops * 1e12 / (r.memory_gbps * 1e9)


def roofline_figure(device: str, head: dict | None = None) -> Figure:
    """Log-log roofline of a bfloat16 head on ``device``'s datasheet roofs: the tensor-core roof, the memory roof,
    the head's intensity without the logits in memory and with eager's passes over them
    (:data:`EAGER_LOGITS_PASSES`), and,
    from ``head`` (one head of a linear cross-entropy record), each peer's achieved FLOP/s (6 N H V / its
    median time) at the intensity without the logits. Without ``head`` the Llama-3-8B head's intensities."""
    r = roofs(device)
    n, h, v = (head["tokens"], head["hidden"], head["vocab"]) if head else (8192, 4096, 128256)
    fused, eager, point = intensity(n, h, v), eager_intensity(n, h, v), ridge(device)
    fig = Figure(figsize=(8, 5.2), layout="constrained")
    ax = fig.add_subplot()
    xs = [1.0, point, 1e5]
    ax.plot(xs, [min(x * r.memory_gbps * 1e9, r.tensor_tflops * 1e12) for x in xs], color="black", lw=1.5)
    ax.text(1.3, 1.6 * 1.3 * r.memory_gbps * 1e9, f"memory roof {r.memory_gbps:.0f} GB/s", rotation=24,
            fontsize="small")
    ax.text(point * 1.3, r.tensor_tflops * 1e12 * 1.25, f"BF16 tensor-core roof {r.tensor_tflops:g} TFLOP/s",
            fontsize="small")
    ax.axvline(fused, color="tab:green", ls="--", label=f"no logits in memory: {fused:.0f} FLOP / byte")
    wide = sum(size == 4 for _, size in EAGER_LOGITS_PASSES)
    ax.axvline(eager, color="tab:red", ls=":",
               label=f"eager's {len(EAGER_LOGITS_PASSES)} passes over the logits ({wide} in float32): "
                     f"{eager:.0f} FLOP / byte")
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
