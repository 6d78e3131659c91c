"""Device ceilings: datasheet lookup, which bandwidth bounds a direction, the physical floor (cpu
tier); the ceilings kernels' machine code and their extension building (compile tier); measured
ceilings (gpu tier)."""
import math
import re

import pytest
import torch

from losslab import build, problems
from losslab.measure import ceilings


def test_datasheet_lookup_prefers_the_specific_name():
    assert ceilings.datasheet("NVIDIA H100 PCIe").product == "H100 PCIe"
    assert ceilings.datasheet("NVIDIA H100 80GB HBM3").product == "H100 SXM"
    assert ceilings.datasheet("NVIDIA H200").product == "H200 SXM"
    assert ceilings.datasheet("NVIDIA A100-SXM4-80GB").memory_gbps == 2039
    assert ceilings.datasheet("NVIDIA GeForce RTX 4090") is None
    for _, sheet in ceilings.DATASHEETS:
        assert sheet.source.startswith("NVIDIA") and "https://" in sheet.source


def test_a_direction_writing_only_a_scalar_is_bound_by_read_bandwidth():
    spec = problems.get("kl_div")
    seed = spec.sizes["seed"]
    assert ceilings.bandwidth_kind(spec.cost(seed, "forward").bytes_written) == "read"
    assert ceilings.bandwidth_kind(spec.cost(seed, "backward").bytes_written) == "copy"
    assert ceilings.bandwidth_kind(64) == "read" and ceilings.bandwidth_kind(65) == "copy"


def test_physical_floor_is_minimum_bytes_at_the_datasheet_peak():
    floor = ceilings.physical_floor(1_070_000_000, "NVIDIA H200")
    assert floor.ms == pytest.approx(1.07e9 / 4800e9 * 1e3)
    assert floor.verdict(floor.ms) == "" and floor.verdict(1.0) == ""
    note = floor.verdict(0.118)
    assert note.startswith("0.118 ms is below the physical floor of 0.223 ms (1.07 GB at the H200 SXM datasheet peak")
    assert "artifact" in note
    assert ceilings.physical_floor(10**9, "NVIDIA GeForce RTX 4090") is None


# --- compile tier: the ceilings kernels -----------------------------------------------------

@pytest.mark.compile
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_ceilings_kernels_compile_without_spills_and_keep_their_chains(tmp_path, arch):
    cubin, report = build.compile_cubin(build.KERNELS / "ceilings" / "fma_throughput.cu", arch, tmp_path)
    kernels = build.resource_usage(report, arch)
    assert {k.kernel for k in kernels} >= {"_Z21fma_throughput_kernelPfiff", "_Z26mufu_ex2_throughput_kernelPfi"}
    for k in kernels:
        assert k.spill_store_bytes == k.spill_load_bytes == k.stack_bytes == 0, k
    sass = build.disassemble(cubin)
    fma = next(body for name, body in sass.items() if "fma_throughput" in name)
    mufu = next(body for name, body in sass.items() if "mufu_ex2" in name)
    # the unrolled loop body: 16 iterations x 8 chains, nothing folded away
    assert len(re.findall(r"\bFFMA\b", fma)) >= 128
    assert len(re.findall(r"\bMUFU\.EX2\b", mufu)) >= 128


@pytest.mark.compile
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_stream_read_kernel_compiles_to_128_bit_loads_without_spills(tmp_path, arch):
    cubin, report = build.compile_cubin(build.KERNELS / "ceilings" / "stream_bandwidth.cu", arch, tmp_path)
    kernels = build.resource_usage(report, arch)
    assert kernels and all(k.spill_store_bytes == k.spill_load_bytes == 0 for k in kernels), kernels
    assert any("LDG.E.128" in body for body in build.disassemble(cubin).values())


@pytest.mark.compile
def test_ceilings_extension_builds_and_exposes_its_launchers(tmp_path, monkeypatch):
    """The extension measure_ceilings loads: binding and launchers compiled and linked (no GPU needed)."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
    build.load_extension.cache_clear()
    try:
        ext = build.load_extension("ceilings")
    finally:
        build.load_extension.cache_clear()
    assert ext.THREADS == 256 and ext.CHAINS == 8
    for name in ("fma_throughput", "mufu_ex2_throughput", "stream_read", "stream_blocks"):
        assert callable(getattr(ext, name)), name
    assert ext.stream_blocks(2**26) > 0


# --- gpu tier: measured ceilings ------------------------------------------------------------

@pytest.mark.gpu
def test_measured_ceilings_are_plausible():
    measured = ceilings.measure_ceilings(repeats=5)
    assert "compute_error" not in measured, measured.get("compute_error")
    for key in ("read_gbps", "copy_gbps", "fp32_fma_tflops", "mufu_ex2_tops"):
        assert math.isfinite(measured[key]) and measured[key] > 0, key
    floor = measured["autograd_floor"]
    assert set(floor) == {"host_ms", "median_ms", "back_to_back_ms"}, floor
    assert all(math.isfinite(v) and v > 0 for v in floor.values()), floor
    sheet = ceilings.datasheet(torch.cuda.get_device_name())
    if sheet:  # measured within sane bounds of the vendor's peaks
        assert 0.3 * sheet.memory_gbps < measured["read_gbps"] < 1.1 * sheet.memory_gbps
        assert 0.3 * sheet.fp32_tflops < measured["fp32_fma_tflops"] < 1.1 * sheet.fp32_tflops
