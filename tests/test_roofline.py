"""The roofline: cost model and intensities, ncu CSV parsing, the plot and the CLI (cpu tier);
the ceilings kernels' machine code (compile tier); measured ceilings (gpu tier).

The sections and the CSV below are test fixtures with made-up round numbers, built here
to exercise the code; they are never written under reports/.
"""
import json
import math
import re

import pytest
import torch

from losslab import build
from losslab.measure import ncu
from losslab.present import roofline
from losslab.__main__ import main

SEED = (16384, 16384)
N = SEED[0] * SEED[1]


def fixture_section(with_ncu: bool = True) -> dict:
    """A bench section shaped like `python -m losslab bench kl_div` writes (made-up times)."""
    times = {"naive": 40.0, "shared_memory": 1.0, "warp_shuffle": 0.9, "vectorized": 0.8, "eager": 2.0, "compile": 0.9}
    rows = [{"problem": "kl_div", "implementation": impl, "kind": "peer" if impl in ("eager", "compile") else "variant",
             "direction": direction, "shape": list(SEED), "dtype": "float32", "median_ms": ms * scale}
            for impl, ms in times.items() for direction, scale in (("forward", 1.0), ("backward", 1.5),
                                                                    ("forward_backward", 2.5))]
    section = {"device": "NVIDIA H100 80GB HBM3", "date": "2000-01-01T00:00:00+00:00", "torch": "fixture",
               "cuda": "fixture", "kernels_sha256": "0" * 64, "shape": list(SEED), "dtype": "float32",
               "repeats": 1, "bandwidth_gbps": {"read": 3000.0, "copy": 2800.0}, "rows": rows, "checks": [],
               "ceilings": {"read_gbps": 3000.0, "copy_gbps": 2800.0, "fp32_fma_tflops": 50.0,
                            "mufu_ex2_tops": 4.0, "datasheet": None}}
    if with_ncu:
        section["ncu"] = {"status": "ok", "message": "fixture", "shape": list(SEED), "records": [
            {"implementation": "naive", "kind": "variant", "direction": "forward",
             "kernels": ["kl_div_naive_forward_kernel", "sum_partials_kernel"], "launches": 2,
             "dram_bytes_read": 4.0 * 8 * N, "dram_bytes_written": 0.0, "duration_ms": 40.0,
             "fadd": 0.0, "fmul": 0.0, "ffma": 0.0, "fp32_flops": 0.0},
        ]}
    return section


# --- cpu tier: cost model -------------------------------------------------------------------

def test_kl_div_intensity_is_below_one_flop_per_byte():
    table = {r["direction"]: r for r in roofline.cost_table("kl_div", SEED)}
    # forward: 4 FLOP per element over 2 fp32 reads (8 bytes) + the 4-byte loss
    assert table["forward"]["flops"] == 4 * N
    assert table["forward"]["bytes"] == 8 * N + 4
    assert table["forward"]["intensity"] == pytest.approx(0.5)
    # backward: 2 FLOP per element over 2 reads + 1 write (12 bytes)
    assert table["backward"]["intensity"] == pytest.approx(2 / 12)
    assert table["forward"]["transcendentals"] == 2 * N


def test_points_sit_at_model_intensity_and_flops_over_time():
    pts = {(p.implementation, p.direction): p for p in roofline.points(fixture_section())}
    assert {d for _, d in pts} == {"forward", "backward"}  # forward_backward is left out by default
    naive = pts["naive", "forward"]
    assert naive.intensity == pytest.approx(0.5)
    assert naive.flops_per_s == pytest.approx(4 * N / 40e-3)
    # ncu saw 4x the minimum bytes: the measured point sits 4x to the left
    assert naive.measured_intensity == pytest.approx(naive.intensity / 4, rel=1e-6)
    assert pts["vectorized", "forward"].measured_intensity is None


def test_measured_points_need_the_same_shape():
    section = fixture_section()
    section["ncu"]["shape"] = [128, 4096]  # profiled at another size: bytes are not comparable
    assert all(p.measured_bytes is None for p in roofline.points(section))


def test_datasheet_lookup_prefers_the_specific_name():
    assert roofline.datasheet("NVIDIA H100 PCIe").product == "H100 PCIe"
    assert roofline.datasheet("NVIDIA H100 80GB HBM3").product == "H100 SXM"
    assert roofline.datasheet("NVIDIA H200").product == "H200 SXM"
    assert roofline.datasheet("NVIDIA A100-SXM4-80GB").memory_gbps == 2039
    assert roofline.datasheet("NVIDIA GeForce RTX 4090") is None
    for _, sheet in roofline.DATASHEETS:
        assert sheet.source.startswith("NVIDIA") and "https://" in sheet.source


# --- cpu tier: ncu CSV ----------------------------------------------------------------------

# parser fixture: the shape of `ncu --csv --print-units base` output (details page), values made up
NCU_CSV = '''==PROF== Connected to process 123 (/usr/bin/python3.11)
==PROF== Profiling "spin_kernel": 0%....50%....100% - 1 pass
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","123","python3.11","127.0.0.1","spin_kernel(long)","1","7","(1, 1, 1)","(1, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_read.sum","byte","0"
"0","123","python3.11","127.0.0.1","spin_kernel(long)","1","7","(1, 1, 1)","(1, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","nsecond","1,024"
"1","123","python3.11","127.0.0.1","kl_div_naive_forward_kernel(const float *, const float *, float *, long, long)","1","7","(256, 1, 1)","(64, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_read.sum","byte","8,589,934,592"
"1","123","python3.11","127.0.0.1","kl_div_naive_forward_kernel(const float *, const float *, float *, long, long)","1","7","(256, 1, 1)","(64, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_write.sum","Kbyte","64"
"1","123","python3.11","127.0.0.1","kl_div_naive_forward_kernel(const float *, const float *, float *, long, long)","1","7","(256, 1, 1)","(64, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","usecond","40,000"
"1","123","python3.11","127.0.0.1","kl_div_naive_forward_kernel(const float *, const float *, float *, long, long)","1","7","(256, 1, 1)","(64, 1, 1)","0","9.0","Command line profiler metrics","smsp__sass_thread_inst_executed_op_ffma_pred_on.sum","inst","1000"
"1","123","python3.11","127.0.0.1","kl_div_naive_forward_kernel(const float *, const float *, float *, long, long)","1","7","(256, 1, 1)","(64, 1, 1)","0","9.0","Command line profiler metrics","smsp__sass_thread_inst_executed_op_fadd_pred_on.sum","inst","10"
"2","123","python3.11","127.0.0.1","sum_partials_kernel(const float *, long, float, float *)","1","7","(1024, 1, 1)","(1, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_read.sum","byte","65,536"
"3","123","python3.11","127.0.0.1","spin_kernel(long)","1","7","(1, 1, 1)","(1, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_read.sum","byte","0"
"4","123","python3.11","127.0.0.1","kl_div_naive_backward_kernel(const float *, const float *, const float *, float *, long, long)","1","7","(256, 1, 1)","(64, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_read.sum","byte","100"
"5","123","python3.11","127.0.0.1","spin_kernel(long)","1","7","(1, 1, 1)","(1, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_read.sum","byte","0"
"6","123","python3.11","127.0.0.1","elementwise_kernel","1","7","(128, 1, 1)","(1, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_read.sum","byte","7"
==PROF== Disconnected from process 123
'''
LABELS = [{"implementation": "naive", "kind": "variant", "direction": "forward"},
          {"implementation": "naive", "kind": "variant", "direction": "backward"}, None]


def test_ncu_csv_parses_per_kernel_in_base_units():
    kernels = ncu.parse_ncu_csv(NCU_CSV)
    assert [k["id"] for k in kernels] == [0, 1, 2, 3, 4, 5, 6]
    naive = kernels[1]
    assert naive["dram__bytes_read.sum"] == 8 * 2**30   # thousands separators removed
    assert naive["dram__bytes_write.sum"] == 64e3        # Kbyte scaled to bytes
    assert naive["gpu__time_duration.sum"] == 40e6       # usecond scaled to ns


def test_ncu_kernels_are_attributed_between_markers():
    records = ncu.attribute(ncu.parse_ncu_csv(NCU_CSV), LABELS)
    forward, backward = records  # the kernels after the last marker (label None) are dropped
    assert forward["direction"] == "forward" and forward["launches"] == 2  # the kernel and sum_partials
    assert forward["dram_bytes_read"] == 8 * 2**30 + 65536
    assert forward["duration_ms"] == pytest.approx(40.0)
    assert forward["fp32_flops"] == 10 + 2 * 1000
    assert backward["launches"] == 1 and backward["dram_bytes_read"] == 100


@pytest.mark.parametrize("output, status", [
    ("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission", "refused"),
    ("==ERROR== LibraryNotLoaded", "refused"),
    ("Traceback (most recent call last):\nRuntimeError: boom", "failed"),
])
def test_ncu_refusals_become_a_status(output, status):
    got, message = ncu._diagnose(output, 1)
    assert got == status and message


def test_missing_ncu_is_a_status_not_an_error(monkeypatch):
    monkeypatch.setattr(ncu, "find_ncu", lambda: None)
    result = ncu.profile_problem("kl_div", (8, 300))
    assert result["status"] == "unavailable" and "ncu" in result["message"] and result["records"] == []
    assert "unavailable" in ncu.format_table(result)


def test_ncu_table_lists_each_record():
    table = ncu.format_table(fixture_section()["ncu"])
    assert "naive" in table and "8589.9" in table  # DRAM read MB of the fixture


# --- cpu tier: the plot and the CLI ---------------------------------------------------------

def test_plot_has_roofs_ridge_and_every_point():
    import matplotlib
    matplotlib.use("Agg")
    fig = roofline.plot_roofline(fixture_section())
    ax = fig.axes[0]
    assert ax.get_xscale() == ax.get_yscale() == "log"
    labels = [line.get_label() for line in ax.lines]
    assert any("read roof" in label and "measured" in label for label in labels)
    assert any(label.startswith("FP32 roof 50.0") for label in labels)
    assert any("datasheet H100 SXM" in label for label in labels)  # looked up from the device name
    texts = [t.get_text() for t in ax.texts]
    assert any(t.startswith("ridge") for t in texts)
    for impl in ("naive", "vectorized", "eager", "compile"):
        assert any(t.startswith(impl) for t in texts), impl


def test_plot_without_ceilings_falls_back_to_the_labelled_datasheet():
    section = fixture_section(with_ncu=False)
    del section["ceilings"]
    fig = roofline.plot_roofline(section)
    assert any("(datasheet FP32)" in line.get_label() for line in fig.axes[0].lines)


def test_model_only_plot_draws_without_any_record():
    fig = roofline.plot_model_only(["kl_div"])
    assert "nothing measured" in fig.axes[0].get_title()


def _write_record(results_dir, section):
    results_dir.mkdir(parents=True, exist_ok=True)
    (results_dir / "fixture.json").write_text(json.dumps({"device": section["device"],
                                                          "problems": {"kl_div": section}}))


def test_cli_roofline_writes_nonempty_pngs(tmp_path, capsys):
    _write_record(tmp_path / "results", fixture_section())
    out = tmp_path / "figures"
    assert main(["roofline", "kl_div", "--output", str(out), "--results-dir", str(tmp_path / "results")]) == 0
    for name in ("roofline_kl_div.png", "roofline_all.png"):
        png = (out / name).read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000, name


def test_cli_roofline_without_records_says_so(tmp_path, capsys):
    assert main(["roofline", "--output", str(tmp_path / "f"), "--results-dir", str(tmp_path / "none")]) == 1
    assert "no recorded results" in capsys.readouterr().err


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


# --- gpu tier: measured ceilings ------------------------------------------------------------

@pytest.mark.gpu
def test_measured_ceilings_are_plausible():
    ceilings = roofline.measure_ceilings(repeats=5)
    assert "compute_error" not in ceilings, ceilings.get("compute_error")
    for key in ("read_gbps", "copy_gbps", "fp32_fma_tflops", "mufu_ex2_tops"):
        assert math.isfinite(ceilings[key]) and ceilings[key] > 0, key
    sheet = roofline.datasheet(torch.cuda.get_device_name())
    if sheet:  # measured within sane bounds of the vendor's peaks
        assert 0.3 * sheet.memory_gbps < ceilings["read_gbps"] < 1.1 * sheet.memory_gbps
        assert 0.3 * sheet.fp32_tflops < ceilings["fp32_fma_tflops"] < 1.1 * sheet.fp32_tflops
