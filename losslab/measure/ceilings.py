"""Device ceilings, measured on the device, and the datasheet figures beside them.

A loss kernel's floor is ``minimum bytes / measured bandwidth``, so ceilings are measured, not
taken from a datasheet: read and copy bandwidth (:func:`measure_bandwidth_methods`), FP32 FMA
and MUFU throughput (:func:`measure_compute`), and the host's floor for a call through autograd
(:func:`measure_autograd_floor`), all at once by :func:`measure_ceilings`.
Datasheet figures (:data:`DATASHEETS`) are kept beside them, labelled as such, with their
source; they give a row's physical floor (:func:`physical_floor`).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from losslab import build
from losslab.measure.timing import time_cuda

BANDWIDTH_BYTES = 2**30  # 1 GiB: far beyond any L2
BLOCKS_PER_SM = 8        # x 256 threads: 2048 threads, a full SM
FMA_ITERATIONS = 65536   # about 4 ms on an H100 SXM
MUFU_ITERATIONS = 8192   # about 4 ms on an H100 SXM
FMA_A, FMA_B = 0.999999, 1e-6  # x -> a x + b settles near 1: no overflow, no denormals
READ_ONLY_BYTES_WRITTEN = 64  # a direction writing at most this (a scalar loss) is bound by read bandwidth


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


def bandwidth_kind(bytes_written: int) -> str:
    """Which measured bandwidth bounds a direction that writes ``bytes_written`` bytes:
    "read" when it writes (almost) nothing but a scalar, else "copy"."""
    return "read" if bytes_written <= READ_ONLY_BYTES_WRITTEN else "copy"


@dataclass(frozen=True)
class PhysicalFloor:
    """The least time any implementation can take: minimum bytes at the datasheet's peak bandwidth.
    No real run can be faster; a time below it is a measurement artifact.

    ``ms`` in milliseconds; ``nbytes`` the cost model's minimum bytes; ``sheet`` the datasheet used.
    """

    ms: float
    nbytes: int
    sheet: Datasheet

    def verdict(self, median_ms: float) -> str:
        """Empty when ``median_ms`` is at or above the floor, else why the time cannot be a result."""
        if median_ms >= self.ms:
            return ""
        return (f"{median_ms:.3f} ms is below the physical floor of {self.ms:.3f} ms ({self.nbytes / 1e9:.2f} GB "
                f"at the {self.sheet.product} datasheet peak of {self.sheet.memory_gbps:.0f} GB/s, "
                f"{self.ms / median_ms:.0%} of it): a measurement artifact, not a result (the work was done "
                "elsewhere, e.g. a gradient computed in the forward and only returned here)")


def physical_floor(nbytes: int, device: str) -> PhysicalFloor | None:
    """The physical floor of moving ``nbytes`` on ``device`` (None for a device without datasheet figures)."""
    sheet = datasheet(device)
    return PhysicalFloor(nbytes / (sheet.memory_gbps * 1e6), nbytes, sheet) if sheet else None


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
    source = torch.rand(nbytes // 4, device="cuda")
    dest = torch.empty_like(source)
    once = dict(repeats=repeats, back_to_back=False)
    by_method = {
        "read torch.sum": nbytes / time_cuda(lambda: source.sum(), **once).median_ms / 1e6,
        "copy Tensor.copy_": 2 * nbytes / time_cuda(lambda: dest.copy_(source), **once).median_ms / 1e6,
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
            read = time_cuda(lambda u=unroll: ext.stream_read(source.data_ptr(), n4, sums.data_ptr(), u, stream),
                             **once)
            by_method[f"read stream kernel x{unroll}"] = 16 * n4 / read.median_ms / 1e6
    return by_method


def measure_compute(repeats: int = 10) -> dict[str, float]:
    """Measured FP32 FMA and MUFU (exp2) throughput of the current CUDA device.

    Returns {"fp32_fma_tflops": TFLOP/s (1e12 FLOP/s, 2 FLOP per FMA),
    "mufu_ex2_tops": 1e12 ex2 operations/s}, from the kernels in
    ``kernels/ceilings/`` run on every SM at full occupancy (median of ``repeats``):
    ``fma_throughput.cu``'s independent chains of dependent FMAs, and the same with
    ``ex2.approx`` (one special-function op each).

    Raises:
        build.BuildError: the ceilings kernels cannot be built here.
    """
    ext = build.load_extension("ceilings")
    blocks = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count * BLOCKS_PER_SM
    out = torch.empty(blocks * ext.THREADS, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    per_iteration = blocks * ext.THREADS * ext.CHAINS
    once = dict(repeats=repeats, back_to_back=False)
    fma = time_cuda(lambda: ext.fma_throughput(out.data_ptr(), blocks, FMA_ITERATIONS, FMA_A, FMA_B, stream), **once)
    mufu = time_cuda(lambda: ext.mufu_ex2_throughput(out.data_ptr(), blocks, MUFU_ITERATIONS, stream), **once)
    return {"fp32_fma_tflops": 2 * per_iteration * FMA_ITERATIONS / fma.median_ms / 1e9,
            "mufu_ex2_tops": per_iteration * MUFU_ITERATIONS / mufu.median_ms / 1e9}


AUTOGRAD_FLOOR_SHAPE = (128, 4096)  # the sweep's smallest cross_entropy and kl_div size


def measure_autograd_floor(repeats: int = 20) -> dict[str, float]:
    """PyTorch's own smallest forward+backward on this host: ``x.sum().backward()`` for a float32
    leaf of :data:`AUTOGRAD_FLOOR_SHAPE`, timed as a loss is (``timing.time_cuda``). Any loss called
    through autograd pays at least its host time a call (autograd hands the backward to its device
    thread and waits for it), so at launch-bound sizes it bounds ours and every peer's alike.

    Returns ``host_ms`` (host time per call), ``median_ms`` (GPU time per call, L2 flushed) and
    ``back_to_back_ms``, in milliseconds.
    """
    leaf = torch.randn(AUTOGRAD_FLOOR_SHAPE, device="cuda", requires_grad=True)

    def step():
        leaf.grad = None
        leaf.sum().backward()

    timing = time_cuda(step, repeats=repeats)
    return {"host_ms": timing.host_ms, "median_ms": timing.median_ms, "back_to_back_ms": timing.back_to_back_ms}


def measure_ceilings(repeats: int = 20) -> dict:
    """Every ceiling of the current CUDA device, measured, with the datasheet beside it.

    Returns a dict with ``read_gbps`` and ``copy_gbps`` (GB/s, 1e9 bytes/s),
    ``bandwidth_by_method_gbps``, ``fp32_fma_tflops`` (1e12 FLOP/s) and ``mufu_ex2_tops``
    (1e12 ops/s), ``autograd_floor`` (:func:`measure_autograd_floor`), all measured;
    ``datasheet``: the vendor's figures for this device (see
    :data:`DATASHEETS`, each with its source) or None; and ``compute_error``
    (a message) instead of the compute keys when the ceilings kernels cannot be built.
    """
    by_method = measure_bandwidth_methods(repeats=repeats)
    bandwidth = best_bandwidth(by_method)
    ceilings: dict = {"read_gbps": bandwidth["read"], "copy_gbps": bandwidth["copy"],
                      "bandwidth_by_method_gbps": by_method}
    try:
        ceilings.update(measure_compute(repeats=max(3, repeats // 2)))
    except build.BuildError as err:
        ceilings["compute_error"] = str(err)
    ceilings["autograd_floor"] = measure_autograd_floor(repeats=repeats)
    sheet = datasheet(torch.cuda.get_device_name())
    ceilings["datasheet"] = asdict(sheet) if sheet else None
    return ceilings
