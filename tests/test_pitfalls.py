"""The pitfalls (losslab.teach.pitfalls, notebooks/06_pitfalls.ipynb): deliberately wrong kernels.

cpu tier: every pitfall has its wrong line marked, records round-trip and render, with no
record the page says so instead of inventing an outcome, and a pitfall whose child process
hung or faulted is recorded as such. compile tier: the CUDA pitfalls compile. gpu tier:
each fails the checker (or its probe) as described, each run in a child process.
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
        problems.get(p.problem)
        assert (p.source is None) == p.host
    files = {path.relative_to(pitfalls.SOURCES).with_suffix("").as_posix() for path in pitfalls.SOURCES.rglob("*.cu")}
    assert files == {f"{p.problem}/{p.key}" for p in pitfalls.PITFALLS if not p.host}  # no file left unlisted


@pytest.mark.parametrize("key", KEYS)
def test_wrong_line_is_marked(key):
    p = pitfalls.get(key)
    assert "PITFALL" in pitfalls.source_lines(key)
    if not p.host:
        assert p.source.exists() and f"{p.problem}_custom_forward(" in p.source.read_text()
    assert p.title in pitfalls.describe(key).plain


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
    outcomes = {key: {"key": key, "problem": pitfalls.get(key).problem, "checks": [check], "failed": 1,
                      "worst_forward_error": 0.5, "first_failure": "forward random 128x4096: error 0.5",
                      "probe": None} for key in KEYS}
    outcomes["atomic_add"]["probe"] = {"shape": [4096, 4096], "runs": 20, "distinct_losses": 3, "min": 1.0,
                                       "max": 1.0000001}
    outcomes["item_sync"]["probe"] = {"shape": [128, 4096], "calls": 200, "pitfall_sync_warnings": 1,
                                      "reference_sync_warnings": 0, "pitfall_host_us_per_call": 30.0,
                                      "reference_host_us_per_call": 5.0, "pitfall_wall_us_per_call": 31.0,
                                      "reference_wall_us_per_call": 8.0}
    return {"device": device, "torch": "fixture", "cuda": "fixture", "date": date, "live": False,
            "sources_sha256": pitfalls.sources_sha256(), "outcomes": outcomes}


def test_no_record_says_so():
    assert pitfalls.load_record(results_dir="/nonexistent") is None
    assert "No recorded outcome exists yet" in pitfalls.banner(None)
    assert "nothing measured" in pitfalls.outcome(None, "epsilon").plain
    assert "No recorded outcome exists yet" in pitfalls.outcome_table(None).plain


def test_record_round_trip_and_render(tmp_path):
    for rec in (fixture_record(), fixture_record("Other GPU", "1999-01-01T00:00:00+00:00")):
        (tmp_path / f"{records.device_slug(rec['device'])}.json").write_text(json.dumps(rec))
    rec = pitfalls.load_record(results_dir=tmp_path)
    assert rec["device"] == "Fixture GPU"  # the newest
    assert pitfalls.load_record("other-gpu", tmp_path)["device"] == "Other GPU"
    assert pitfalls.banner(rec).startswith("RECORDED") and "matches pitfalls/" in pitfalls.banner(rec)
    table = pitfalls.outcome_table(rec).plain
    assert "3 distinct loss value(s)" in table and "flagged 1 synchronizing call(s)" in table
    assert "1 of 1 checks failed" in pitfalls.outcome(rec, "wrong_direction").plain


def test_records_stay_out_of_the_bench_records(tmp_path):
    """Pitfall records live in a subfolder, which records.load_records does not read."""
    records.save_section("kl_div", {"device": "Fixture GPU", "date": "2000-01-01T00:00:00+00:00"}, tmp_path)
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
