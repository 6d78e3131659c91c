"""Nsight Compute: its CSV parsed in base units, kernels attributed between marker kernels, a
missing or refusing ncu turned into a status (cpu tier); a real profile (gpu tier).

The CSV below has the shape of ``ncu --csv --print-units base`` output with made-up values.
"""
# ruff: noqa: E501  (the CSV fixture keeps ncu's long lines verbatim)
import pytest
import torch

from losslab.measure import ncu

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
    assert "unavailable" in ncu.ncu_table_text(result)


def test_ncu_table_lists_each_record():
    profile = {"status": "ok", "records": ncu.attribute(ncu.parse_ncu_csv(NCU_CSV), LABELS)}
    table = ncu.ncu_table_text(profile)
    assert "naive" in table and "8590.0" in table  # DRAM read MB of the fixture (8 GiB + 64 KiB)


# --- cpu tier: the plot and the CLI ---------------------------------------------------------


def test_one_find_ncu_serves_the_environment_page():
    from losslab.teach import environment

    assert environment.find_ncu is ncu.find_ncu


@pytest.mark.gpu
def test_profile_of_a_small_size_measures_dram_bytes_or_says_why():
    result = ncu.profile_problem("kl_div", (256, 4096), ["naive"], ("eager",))
    assert result["status"] in ("ok", "unavailable", "refused"), result["message"]
    if result["status"] == "ok":
        forward = next(r for r in result["records"] if r["implementation"] == "naive" and r["direction"] == "forward")
        assert forward["dram_bytes_read"] > 0 and forward["launches"] >= 1
    assert torch.cuda.is_available()
