"""Nsight Compute: its CSV parsed in base units, kernels attributed between marker kernels, a
missing or refusing ncu turned into a status (cpu tier); a real profile (gpu tier).

The CSV below has the shape of ``ncu --csv --print-units base`` output with made-up values.
"""
# ruff: noqa: E501  (the CSV fixture keeps ncu's long lines verbatim)
import pytest
import torch

from losslab import problems
from losslab.measure import ncu

KL_DIV = problems.get("kl_div")

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
    assert forward.direction == "forward" and forward.launches == 2  # the kernel and sum_partials
    assert forward.dram_bytes_read == 8 * 2**30 + 65536
    assert forward.duration_ms == pytest.approx(40.0)
    assert forward.fp32_flops == 10 + 2 * 1000
    assert backward.launches == 1 and backward.dram_bytes_read == 100


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
    result = ncu.profile_problem(KL_DIV, (8, 300))
    assert result.status == "unavailable" and "ncu" in result.message and result.records == []
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
    result = ncu.profile_problem(KL_DIV, (256, 4096), ["naive", "shared_memory"], ("eager",))
    assert result.status in ("ok", "unavailable", "refused"), result.message
    if result.status == "ok":
        forward = result.find("naive", "forward")
        assert forward.dram_bytes_read > 0 and forward.launches >= 1
        assert {r.direction for r in result.records} == {"forward", "backward", "forward_backward"}
        # the evidence counters: present, or each missing one named with ncu's reason
        assert result.has_evidence, result.missing
        coalesced = result.find("shared_memory", "forward")
        assert forward.sectors_per_request > coalesced.sectors_per_request, result.missing
        assert forward.grid_size == 1 and forward.block_size == 256  # one thread per row: 256 rows, one block
        print(ncu.evidence_table_text(result))
    assert torch.cuda.is_available()


# --- the counters per rung (cpu tier) ----------------------------------------------------------------------

def _line(kid: int, name: str, metric: str, unit: str, value: str, grid: str = "(64, 1, 1)") -> str:
    return (f'"{kid}","1","python3","h","{name}","1","7","(256, 1, 1)","{grid}","0","9.0","Command line profiler '
            f'metrics","{metric}","{unit}","{value}"')


HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
          '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')
EVIDENCE_CSV = "\n".join([
    HEADER,
    _line(0, "spin_kernel(long)", "gpu__time_duration.sum", "nsecond", "1"),
    _line(1, "naive_forward", "gpu__time_duration.sum", "usecond", "4,000"),
    _line(1, "naive_forward", "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum", "", "1,000"),
    _line(1, "naive_forward", "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum", "sector", "32,000"),
    _line(1, "naive_forward", "sm__cycles_active.avg", "cycle", "500"),
    _line(1, "naive_forward", "sm__cycles_active.max", "cycle", "1,000"),
    _line(1, "naive_forward", "sm__warps_active.avg.pct_of_peak_sustained_active", "%", "12.5"),
    _line(1, "naive_forward", "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio", "", "30"),
    _line(1, "naive_forward", "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio", "", "n/a"),
    _line(1, "naive_forward", "sass__inst_executed_per_opcode", "inst", "BAR: 0; EXIT: 16; LDG: 1,000"),
    _line(1, "naive_forward", "smsp__inst_executed.sum", "inst", "5,000"),
    _line(1, "naive_forward", "dram__bytes_read.sum", "byte", "10,000"),
    _line(2, "sum_partials_kernel", "gpu__time_duration.sum", "usecond", "3", grid="(1, 1, 1)"),
    _line(2, "sum_partials_kernel", "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum", "", "8"),
    _line(2, "sum_partials_kernel", "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum", "sector", "32"),
    _line(2, "sum_partials_kernel", "sass__inst_executed_per_opcode", "inst", "BAR: 64; SHFL: 320; EXIT: 32"),
    _line(2, "sum_partials_kernel", "dram__bytes_read.sum", "byte", "0"),
    _line(3, "spin_kernel(long)", "gpu__time_duration.sum", "nsecond", "1"),
])


def test_counters_per_rung_sum_over_kernels_and_describe_the_main_kernel():
    (forward,) = ncu.attribute(ncu.parse_ncu_csv(EVIDENCE_CSV), [LABELS[0], None], multiprocessors=132)
    assert isinstance(forward, ncu.Counters) and forward.launches == 2
    assert forward.load_requests == 1008 and forward.sectors_per_request == pytest.approx(32032 / 1008)
    assert forward.main_kernel == "naive_forward" and (forward.grid_size, forward.block_size) == (64, 256)
    assert forward.active_sms == pytest.approx(66.0)  # 132 SMs x mean / max active cycles
    assert forward.achieved_occupancy_pct == 12.5
    assert forward.stalls == {"long_scoreboard": 30.0}  # "n/a" is no value, not 0
    assert forward.barriers == 64 and forward.shuffles == 320 and forward.opcodes["LDG"] == 1000
    assert forward.instructions_per_byte == pytest.approx(0.5)
    assert forward.top_stalls(1) == [("long_scoreboard", 30.0)]
    assert forward.shared_instructions is None and forward.store_requests is None  # not collected


def test_opcode_counts_are_read_only_from_a_real_opcode_list():
    assert ncu._opcodes("BAR: 72; SHFL: 40; EXIT: 8") == {"BAR": 72.0, "SHFL": 40.0, "EXIT": 8.0}
    assert ncu._opcodes("(BAR=3) (EXIT=1)") == {"BAR": 3.0, "EXIT": 1.0}
    assert ncu._opcodes("12;34;56") == {}
    assert not ncu.has_opcodes({"opcodes": ncu._opcodes("CUDA 13: 5")})  # no EXIT: not an opcode list
    assert ncu.has_opcodes({"opcodes": ncu._opcodes("(BAR=3) (EXIT=1)")})


def test_opcode_counts_given_one_row_per_opcode_are_added_up():
    rows = [HEADER.replace('"Metric Value"', '"Metric Value","Instance"')]
    rows += [_line(1, "k", ncu.OPCODES_METRIC, "inst", value) + f',"{op}"'
             for op, value in (("BAR", "72"), ("EXIT", "8"), ("BAR", "8"))]
    (kernel,) = ncu.parse_ncu_csv("\n".join(rows))
    assert kernel["opcodes"] == {"BAR": 80.0, "EXIT": 8.0} and ncu.has_opcodes(kernel)


def test_profile_round_trips_and_reads_by_attribute_only():
    records = ncu.attribute(ncu.parse_ncu_csv(EVIDENCE_CSV), [LABELS[0], None], multiprocessors=132)
    profile = ncu.Profile("ok", "fixture", [64, 4096], list(ncu.NCU_METRICS), {"x.sum": "why"}, "v", 132, records)
    again = ncu.Profile.from_dict(profile.as_dict())
    assert again == profile and again.has_evidence and again.find("naive", "forward") is again.records[0]
    assert again.status == "ok" and again.records[0].dram_bytes_read == 10000
    with pytest.raises(TypeError):
        again["status"]  # no dict access: callers use attributes
    old = ncu.Profile.from_dict({"status": "ok", "shape": [1, 2], "records": [
        {"implementation": "naive", "kind": "variant", "direction": "forward", "dram_bytes_read": 5.0}]})
    assert not old.has_evidence and old.records[0].load_requests is None


def test_evidence_table_shows_dashes_for_missing_counters_and_lists_why():
    records = ncu.attribute(ncu.parse_ncu_csv(EVIDENCE_CSV), [LABELS[0], None], multiprocessors=132)
    profile = ncu.Profile("ok", "", [64, 4096], [], {"smsp__x.sum": "ncu rejected it"}, None, 132, records)
    text = ncu.evidence_table_text(profile)
    assert "naive" in text and "31.8" in text and "long_scoreboard 30.0" in text
    assert text.splitlines()[-1] == "missing smsp__x.sum: ncu rejected it"


def test_metrics_the_gpu_lacks_are_left_out_in_advance_with_a_reason():
    requested = ("dram__bytes_read.sum", "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum",
                 "launch__registers_per_thread", "sass__inst_executed_per_opcode")
    keep, missing = ncu.select_metrics(requested, {"dram__bytes_read", "sm__cycles_active"})
    assert keep == ["dram__bytes_read.sum", "launch__registers_per_thread", "sass__inst_executed_per_opcode"]
    assert list(missing) == ["l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum"] and "query-metrics" in missing[
        "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum"]
    assert ncu.select_metrics(requested, None) == (list(requested), {})  # no usable query: ask for all


def test_a_metric_ncu_rejects_is_dropped_and_the_profile_still_succeeds(monkeypatch):
    monkeypatch.setattr(ncu, "find_ncu", lambda: "echo")
    monkeypatch.setattr(ncu, "known_metrics", lambda path: None)
    bad = ncu._STALL.format("barrier")
    calls = []

    def fake_run(path, problem, shape, variants, peers, metrics, timeout_s):
        calls.append(list(metrics))
        if bad in metrics:
            return [], [], f"==ERROR== Failed to find metric {bad}\n", 1
        return ncu.parse_ncu_csv(EVIDENCE_CSV), [LABELS[0], None], "", 0

    monkeypatch.setattr(ncu, "_run_ncu", fake_run)
    profile = ncu.profile_problem(KL_DIV, (64, 4096), ["naive"], ())
    assert profile.status == "ok" and len(calls) == 2 and bad not in calls[1]
    assert profile.missing[bad].startswith("ncu rejected it: ==ERROR== Failed to find metric")
    assert "ncu reported no value" in profile.missing["lts__t_sectors_srcunit_tex_op_read.sum"]
    assert profile.records[0].load_requests == 1008 and "missing" in profile.message


def test_a_failure_naming_no_metric_falls_back_to_dram_bytes_only(monkeypatch):
    monkeypatch.setattr(ncu, "find_ncu", lambda: "echo")
    monkeypatch.setattr(ncu, "known_metrics", lambda path: None)
    calls = []

    def fake_run(path, problem, shape, variants, peers, metrics, timeout_s):
        calls.append(list(metrics))
        if len(metrics) > len(ncu.NCU_METRICS):
            return [], [], "==ERROR== something else broke\n", 1
        return ncu.parse_ncu_csv(NCU_CSV), LABELS, "", 0

    monkeypatch.setattr(ncu, "_run_ncu", fake_run)
    profile = ncu.profile_problem(KL_DIV, (64, 4096), ["naive"], ())
    assert profile.status == "ok" and calls[-1] == list(ncu.NCU_METRICS) and not profile.has_evidence
    assert all("failed with the evidence metrics" in profile.missing[m] for m in ncu.EVIDENCE_METRICS)
