"""The pitfalls (losslab.teach.pitfalls, notebooks/06_pitfalls.ipynb): deliberately wrong kernels.

cpu tier: every pitfall has its wrong line marked (a CUDA pitfall: one line), records round-trip
and render (a pitfall missing from a record shows "not recorded yet"), with no record the page
says so instead of inventing an outcome, a pitfall whose child process hung or faulted is
recorded as such, the racecheck and ncu outputs parse, and the CPU simulator catches the
CPU-visible CUDA pitfalls. compile tier: the CUDA pitfalls compile. gpu tier: each fails the
checker (or its probe: racecheck, ncu's bank-conflict counter, the run past 2^31 elements,
the host timeline) as described, each run in a child process.
"""
import json
import math

import pytest
import torch

from losslab import build, problems, records
from losslab.__main__ import main
from losslab.teach import isolated, pitfalls

KEYS = [p.key for p in pitfalls.PITFALLS]


def test_each_pitfall_is_one_file_or_one_wrapper_of_a_known_problem():
    assert len(set(KEYS)) == len(KEYS)
    for p in pitfalls.PITFALLS:
        assert p.problem in problems.registered()
        assert (p.source is None) == p.host
    files = {path.relative_to(pitfalls.SOURCES).with_suffix("").as_posix() for path in pitfalls.SOURCES.rglob("*.cu")}
    assert files == {f"{p.problem.name}/{p.key}" for p in pitfalls.PITFALLS if not p.host}  # no file left unlisted


@pytest.mark.parametrize("key", KEYS)
def test_wrong_line_is_marked(key):
    p = pitfalls.get(key)
    assert "PITFALL" in pitfalls.source_lines(key)
    if not p.host:
        assert p.source.exists() and f"{p.problem.name}_custom_forward(" in p.source.read_text()
    assert p.title in pitfalls.describe(key).plain


@pytest.mark.parametrize("key", [p.key for p in pitfalls.PITFALLS if p.cuda])
def test_cuda_pitfall_is_one_wrong_line_with_a_prediction_and_a_catcher(key):
    p = pitfalls.get(key)
    assert pitfalls.source_lines(key).count("\n") == 0  # one marked line
    assert p.symptom and p.caught_by and not p.host


def test_the_large_shape_crosses_two_to_the_31():
    rows, cols = pitfalls.LARGE_SHAPE
    first = -(-2**31 // cols)
    assert rows * cols > 2**31 and first < rows and (first - 1) * cols < 2**31 <= first * cols


RACECHECK_OUTPUT = """========= COMPUTE-SANITIZER
========= Error: Race reported between Write access at pitfall_missing_sync_kernel+0x2c0
=========     and Read access at pitfall_missing_sync_kernel+0x340 [248 hazards]
loss 0.5
========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)
"""

_NCU_HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size",'
               '"Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')
_NCU_ROW = ('"0","1","python","h","pitfall_bank_conflicts_kernel","1","7","(256, 1, 1)","(4096, 1, 1)","0","9.0",'
            '"Command line profiler metrics","{metric}","","{value}"')
NCU_OUTPUT = "\n".join(["==PROF== Connected to process 1", "loss 0.5", _NCU_HEADER,
                        _NCU_ROW.format(metric=pitfalls.BANK_METRICS[0], value="12"),
                        _NCU_ROW.format(metric=pitfalls.BANK_METRICS[1], value="229,376")])


def test_racecheck_and_ncu_outputs_parse():
    race = pitfalls.parse_racecheck(RACECHECK_OUTPUT, "pitfall_missing_sync_kernel")
    assert race["hazards"] == 1 and race["errors"] == 1 and "Race reported" in race["first"]
    assert race["kernel_races"] == 1 and pitfalls.parse_racecheck(RACECHECK_OUTPUT, "other_kernel")["kernel_races"] == 0
    assert pitfalls.parse_racecheck("loss 0.5\n========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, "
                                    "0 warnings)")["hazards"] == 0
    values = pitfalls.parse_ncu_metrics(NCU_OUTPUT)
    assert values == {pitfalls.BANK_METRICS[0]: 12.0, pitfalls.BANK_METRICS[1]: 229376.0}
    assert pitfalls.parse_ncu_metrics("no csv here") == {}


def test_host_pitfall_lines_are_the_wrong_ones():
    assert "reshape(1)" in pitfalls.source_lines("one_element")
    assert ".item()" in pitfalls.source_lines("item_sync")
    assert pitfalls.source_lines("item_sync").count("\n") == 0  # its line only, not the other wrapper's


def test_unknown_pitfall():
    with pytest.raises(ValueError, match="pitfall"):
        pitfalls.get("off_by_one")


def fixture_record(device="Fixture GPU", date="2000-01-01T00:00:00+00:00") -> dict:
    """A record shaped like `python -m losslab pitfalls --record` writes, with made-up values
    (tmp folders only: never written under reports/)."""
    check = {"problem": "kl_div", "variant": "x", "case": "random 128x4096 float32", "shape": [128, 4096],
             "direction": "forward", "error": 0.5, "tolerance": 1e-5, "passed": False, "detail": "", "seed": 0}
    outcomes = {key: {"key": key, "problem": pitfalls.get(key).problem.name, "checks": [check], "failed": 1,
                      "worst_forward_error": 0.5, "first_failure": "forward random 128x4096: error 0.5",
                      "probe": None} for key in KEYS}
    outcomes["atomic_add"]["probe"] = {"shape": [4096, 4096], "runs": 20, "distinct_losses": 3, "min": 1.0,
                                       "max": 1.0000001}
    outcomes["item_sync"]["probe"] = {"shape": [128, 4096], "calls": 200, "pitfall_sync_warnings": 1,
                                      "reference_sync_warnings": 0, "pitfall_host_us_per_call": 30.0,
                                      "reference_host_us_per_call": 5.0, "pitfall_wall_us_per_call": 31.0,
                                      "reference_wall_us_per_call": 8.0, "queued_calls": 10, "queued_ms": 20.0,
                                      "pitfall_queued_return_ms": 20.3, "pitfall_queued_done_ms": 20.4,
                                      "reference_queued_return_ms": 0.5, "reference_queued_done_ms": 20.2}
    outcomes["missing_sync"]["probe"] = {**outcomes["atomic_add"]["probe"], "racecheck": {
        "shape": [8, 1000], "pitfall": pitfalls.parse_racecheck(RACECHECK_OUTPUT),
        "reference": pitfalls.parse_racecheck("RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)")}}
    outcomes["bank_conflicts"]["probe"] = {"shape": [4096, 4096], "pitfall": pitfalls.parse_ncu_metrics(NCU_OUTPUT),
                                           "reference": {m: 0.0 for m in pitfalls.BANK_METRICS}}
    outcomes["int32_index"]["probe"] = {"shape": [32769, 65536], "elements": 32769 * 65536,
                                        "first_wrapping_row": 32768, "gigabytes_per_tensor": 8.59,
                                        "fault": "cuda_error: an illegal memory access was encountered"}
    del outcomes["broken_tail"]  # a record made before a pitfall existed
    return {"device": device, "torch": "fixture", "cuda": "fixture", "date": date, "live": False,
            "sources_sha256": pitfalls.sources_sha256(), "outcomes": outcomes}


def test_no_record_says_so():
    assert pitfalls.load_record(results_dir="/nonexistent") is None
    assert "No recorded outcome exists yet" in pitfalls.banner(None)
    assert "Not recorded yet" in pitfalls.outcome(None, "epsilon").plain
    assert "No recorded outcome exists yet" in pitfalls.outcome_table(None).plain


def test_record_round_trip_and_render(tmp_path):
    for rec in (fixture_record(), fixture_record("Other GPU", "1999-01-01T00:00:00+00:00")):
        (tmp_path / f"{records.device_slug(rec['device'])}.json").write_text(json.dumps(rec))
    rec = pitfalls.load_record(results_dir=tmp_path)
    assert rec["device"] == "Fixture GPU"  # the newest
    assert pitfalls.load_record("other-gpu", tmp_path)["device"] == "Other GPU"
    assert pitfalls.banner(rec).startswith("RECORDED") and "matches the sources now" in pitfalls.banner(rec)
    table = pitfalls.outcome_table(rec).plain
    assert "3 distinct loss value(s)" in table and "flagged 1 synchronizing call(s)" in table
    assert "the host returns from 10 calls after 20.30 ms" in table
    assert "pitfall: 1 race report(s) on its kernel, 1 hazard(s) in the process; reference: 0 race" in table
    assert "pitfall: 229376 store / 12 load conflicts (56.0 store conflicts a row); reference: 0 store" in table
    assert "the pitfall's extra: 56.0 a row (predicted 56)" in table
    assert "row 32768 is the first to wrap): the child stopped: cuda_error: an illegal memory" in table
    assert "broken_tail: not recorded yet" in table
    assert "Not recorded yet" in pitfalls.outcome(rec, "broken_tail").plain
    assert "1 of 1 checks failed" in pitfalls.outcome(rec, "wrong_direction").plain


def test_records_stay_out_of_the_bench_records(tmp_path):
    """Pitfall records live in a subfolder, which records.load_records does not read."""
    records.save_section("kl_div", records.Section("kl_div", "Fixture GPU"), tmp_path)
    (tmp_path / "pitfalls").mkdir()
    (tmp_path / "pitfalls" / "fixture-gpu.json").write_text(json.dumps(fixture_record()))
    assert len(records.load_records(tmp_path)) == 1
    assert pitfalls.RECORDS.parent == records.RESULTS_DIR


def test_a_pitfall_that_hangs_or_faults_is_recorded_as_such(monkeypatch):
    """Each pitfall runs in a child process: its hang or fault becomes its outcome."""
    calls = []

    def fake_run(target, kwargs, timeout_s):
        calls.append((target, kwargs))
        return isolated.Outcome("timed_out", message="no result after 300 s: killed")

    monkeypatch.setattr(isolated, "run", fake_run)
    outcome = pitfalls.run_isolated("epsilon")
    assert calls == [("losslab.teach.pitfalls:run", {"key": "epsilon"})]
    assert outcome["first_failure"] == "timed_out: no result after 300 s: killed" and outcome["fault"]
    assert outcome["checks"] == [] and outcome["problem"] == "kl_div"
    rec = fixture_record()
    rec["outcomes"]["epsilon"] = outcome
    assert "timed_out: no result after 300 s" in pitfalls.outcome(rec, "epsilon").plain


def test_the_record_hash_follows_the_pitfall_sources_and_the_code_that_runs_them(tmp_path):
    """Editing a pitfall's kernel, or the custom-variant code that builds it, makes a record stale."""
    import shutil

    for folder in ("kernels", "pitfalls", "losslab"):
        shutil.copytree(build.ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    assert pitfalls.sources_sha256(tmp_path) == pitfalls.sources_sha256()  # the same bytes at the same paths
    for edited in ("pitfalls/kl_div/epsilon.cu", "losslab/teach/custom/building.py"):
        before = pitfalls.sources_sha256(tmp_path)
        path = tmp_path / edited
        path.write_text(path.read_text() + "\n// edited\n")
        assert pitfalls.sources_sha256(tmp_path) != before, edited


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given without a GPU")
def test_cli_without_gpu_says_why():
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        main(["pitfalls"])


def _gxx_with_sanitizers() -> bool:
    import shutil
    import subprocess

    if shutil.which("g++") is None:
        return False
    probe = subprocess.run(["g++", "-x", "c++", "-fsanitize=address,undefined", "-o", "/dev/null", "-"],
                           input="int main() { return 0; }", text=True, capture_output=True)
    return probe.returncode == 0


@pytest.mark.skipif(not _gxx_with_sanitizers(), reason="g++ with sanitizers missing: no CPU simulator")
@pytest.mark.parametrize("key, expected", [
    ("missing_sync", "a missing __syncthreads()"),
    ("misaligned_float4", "misaligned 16-byte load at row 1"),
    ("broken_tail", "wrong values on odd widths: every thread adds the whole tail"),
])
def test_the_cpu_simulator_catches_the_cpu_visible_cuda_pitfalls(key, expected):
    grade = pitfalls.simulate(key)
    assert not grade.passed and expected in "\n".join(grade.messages), grade


def test_the_simulator_says_what_it_cannot_see():
    with pytest.raises(ValueError, match="cannot show 'int32_index'"):
        pitfalls.simulate("int32_index")


@pytest.mark.compile
@pytest.mark.parametrize("key", [p.key for p in pitfalls.PITFALLS if not p.host])
def test_cuda_pitfalls_compile(key, tmp_path):
    from losslab.teach import custom

    p = pitfalls.get(key)
    custom.check_source(p.problem, p.source.read_text(), key, root=tmp_path)


# --- gpu tier: each fails as described --------------------------------------------------------------------

@pytest.fixture(scope="module")
def outcomes():
    return {}


def outcome(outcomes, key):
    if key not in outcomes:
        outcomes[key] = pitfalls.run_isolated(key)  # in a child process, as `losslab pitfalls` runs it
    assert "fault" not in outcomes[key], outcomes[key].get("fault")
    return outcomes[key]


def _failed(o, direction="forward"):
    return [c for c in o["checks"] if not c["passed"] and c["direction"] == direction]


@pytest.mark.gpu
@pytest.mark.parametrize("key", ["wrong_direction", "batchmean_bd", "int32_targets"])
def test_wrong_value_fails_every_random_forward(outcomes, key):
    o = outcome(outcomes, key)
    random = [c for c in o["checks"] if c["case"].startswith("random") and c["direction"] == "forward"]
    assert random and not any(c["passed"] for c in random)
    assert all(c["passed"] for c in o["checks"] if c["direction"] == "backward")  # the shipped backward


@pytest.mark.gpu
def test_batchmean_error_is_one_minus_one_over_d(outcomes):
    o = outcome(outcomes, "batchmean_bd")
    for c in o["checks"]:
        if c["case"].startswith("random") and c["direction"] == "forward":
            assert c["error"] == pytest.approx(1 - 1 / c["shape"][1], rel=1e-4)


@pytest.mark.gpu
def test_epsilon_hides_the_infinity(outcomes):
    o = outcome(outcomes, "epsilon")
    zero = [c for c in _failed(o) if "exact zero" in c["case"] and "predictions" in c["case"]]
    assert zero and math.isinf(zero[0]["error"])


@pytest.mark.gpu
def test_atomic_add_is_not_deterministic(outcomes):
    o = outcome(outcomes, "atomic_add")
    assert o["probe"]["distinct_losses"] > 1, o["probe"]


@pytest.mark.gpu
def test_item_sync_is_correct_but_synchronizes(outcomes):
    o = outcome(outcomes, "item_sync")
    assert o["failed"] == 0
    assert o["probe"]["pitfall_sync_warnings"] >= 1 and o["probe"]["reference_sync_warnings"] == 0


@pytest.mark.gpu
def test_one_element_fails_on_the_shape(outcomes):
    o = outcome(outcomes, "one_element")
    forward = [c for c in o["checks"] if c["direction"] == "forward"]
    assert forward and all(c["detail"] == "output shape (1,), reference ()" for c in forward)


@pytest.mark.gpu
def test_item_sync_makes_the_host_wait_for_queued_work(outcomes):
    """With GPU work queued ahead, the pitfall's host returns only when it is done; the shipped one at once."""
    probe = outcome(outcomes, "item_sync")["probe"]
    assert probe["pitfall_queued_return_ms"] > 0.8 * probe["queued_ms"], probe
    assert probe["reference_queued_return_ms"] < 0.5 * probe["queued_ms"], probe


@pytest.mark.gpu
def test_missing_sync_is_a_race_racecheck_finds(outcomes):
    o = outcome(outcomes, "missing_sync")
    race = o["probe"]["racecheck"]
    if "error" in race:
        pytest.skip(race["error"])
    assert race["pitfall"]["kernel_races"] >= 1 and race["reference"]["kernel_races"] == 0, race


@pytest.mark.gpu
def test_misaligned_float4_faults_in_the_child_and_the_parent_survives():
    o = pitfalls.run_isolated("misaligned_float4")
    said = o.get("fault", "") + " ".join(c["detail"] for c in o["checks"])
    assert "misaligned" in said, o
    assert torch.ones(4, device="cuda").sum().item() == 4.0


@pytest.mark.gpu
def test_broken_tail_fails_on_odd_widths_only(outcomes):
    o = outcome(outcomes, "broken_tail")
    forward = [c for c in o["checks"] if c["direction"] == "forward" and c["case"].startswith("random")]
    assert any(c["shape"][1] % 4 and not c["passed"] for c in forward)
    assert all(c["passed"] for c in forward if c["shape"][1] == 4096), forward


@pytest.mark.gpu
def test_int32_index_passes_the_checks_and_fails_past_two_to_the_31(outcomes):
    o = outcome(outcomes, "int32_index")
    assert o["failed"] == 0
    probe = o["probe"]
    assert "fault" in probe or probe["relative_error"] > 1e-3, probe


@pytest.mark.gpu
def test_bank_conflicts_show_in_the_ncu_counter(outcomes):
    o = outcome(outcomes, "bank_conflicts")
    assert o["failed"] == 0
    probe = o["probe"]
    if "error" in probe or "error" in probe["pitfall"]:
        pytest.skip(f"ncu: {probe}")
    store = pitfalls.BANK_METRICS[1]
    assert probe["pitfall"][store] > 4 * max(probe["reference"][store], 1.0), probe


# --- notebook 06's prose --------------------------------------------------------------------------------------

def _notebook_cells():
    nbformat = pytest.importorskip("nbformat")
    return nbformat.read(build.ROOT / "notebooks" / "06_pitfalls.ipynb", as_version=4).cells


def test_notebook_says_the_high_half_of_ignore_index_is_out_of_range():
    text = "\n".join(c.source for c in _notebook_cells())
    assert "every index is still in range" not in text.lower()
    assert "the high half of `ignore_index` (−100) is −1, **out of range**" in text


def test_notebook_explains_the_per_call_overhead_and_queues_work_for_the_sync_probe():
    section = next(c.source for c in _notebook_cells() if c.source.startswith("## 6."))
    assert "per-call overhead" in section and "torch.cuda._sleep" in section and "**Predict:**" in section


@pytest.mark.parametrize("key", [p.key for p in pitfalls.PITFALLS if p.cuda])
def test_notebook_predicts_each_cuda_pitfall_before_its_outcome(key):
    cells = _notebook_cells()
    shown = next(i for i, c in enumerate(cells) if f'pitfalls.outcome(record, "{key}")' in c.source)
    assert cells[shown - 1].cell_type == "markdown" and "**Predict:**" in cells[shown - 1].source


def test_recording_a_subset_keeps_the_others_measured_with_the_same_sources(tmp_path, monkeypatch):
    """The pitfalls can be recorded in several shorter runs (a device's per-command time limit)."""
    def fake_measure(keys, progress):
        rec = fixture_record()
        rec["outcomes"] = {k: {**rec["outcomes"][k], "first_failure": "new"} for k in keys}
        return rec

    monkeypatch.setattr(pitfalls, "measure", fake_measure)
    old = fixture_record()
    path = tmp_path / "fixture-gpu.json"
    path.write_text(json.dumps(old))
    _, rec = pitfalls.record(["epsilon"], tmp_path, progress=False)
    assert rec["outcomes"]["epsilon"]["first_failure"] == "new"
    assert rec["outcomes"]["wrong_direction"] == old["outcomes"]["wrong_direction"]
    path.write_text(json.dumps({**old, "sources_sha256": "stale"}))
    _, rec = pitfalls.record(["epsilon"], tmp_path, progress=False)
    assert list(rec["outcomes"]) == ["epsilon"]  # other sources: nothing kept


def test_a_failed_record_write_leaves_the_old_record(tmp_path, monkeypatch):
    monkeypatch.setattr(pitfalls, "measure", lambda keys, progress: fixture_record())
    path = tmp_path / "fixture-gpu.json"
    path.write_text(json.dumps(fixture_record()))
    before = path.read_bytes()

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(records.files.os, "fsync", full_disk)
    with pytest.raises(OSError, match="No space left"):
        pitfalls.record(None, tmp_path, progress=False)
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == [path.name]


@pytest.mark.parametrize("text", ["", '{"device": "X", "outc', "[]", '{"device": "X"}'])
def test_a_corrupt_pitfalls_record_is_one_line_naming_the_file(tmp_path, text):
    (tmp_path / "broken.json").write_text(text)
    with pytest.raises(records.RecordError) as err:
        pitfalls.load_record(results_dir=tmp_path)
    assert str(tmp_path / "broken.json") in str(err.value) and "\n" not in str(err.value)


def test_the_tool_runs_launch_one_forward_by_a_valid_command_line(monkeypatch):
    """What compute-sanitizer and ncu run: python -c calling launch_once (checked here without a GPU)."""
    import ast

    calls = []
    monkeypatch.setattr(pitfalls, "launch_once", lambda *a: calls.append(a))
    for args in (("missing_sync", (8, 1000)), (None, (8, 1000), "shared_memory")):
        cmd = pitfalls._python_launch(*args)
        assert cmd[1] == "-c"
        ast.parse(cmd[2])
        exec(cmd[2].split("; ", 1)[1], {"pitfalls": pitfalls})
    assert calls == [("missing_sync", 8, 1000, None), (None, 8, 1000, "shared_memory")]
