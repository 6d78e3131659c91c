"""cpu tier: the records: committed results present, fresh and passing; the freshness hash follows
every source a measurement depends on; rows below the physical floor flagged; a new run adds to a
record; malformed and mixed-device records answered clearly; the older file format refused in one line."""
import json
import os
import shutil
import subprocess
from dataclasses import replace

import pytest

from losslab import build, problems, records
from losslab.measure.bench import BenchRow
from losslab.measure.check import CheckResult

# --- the committed records --------------------------------------------------------------------------------


def test_every_problem_has_a_recorded_gpu_result():
    for problem in problems.names():
        section = records.latest_section(problem)
        assert section.rows and section.checks, f"{problem}: record without rows or checks"


@pytest.mark.parametrize("problem", problems.names())
def test_newest_record_ran_the_current_sources(problem):
    section = records.latest_section(problem)
    stale = section.stale()
    assert len(stale) == 0, (
        f"{len(stale)} of {len(section.rows) + len(section.checks)} results of the newest {problem} record "
        f"({section.device}, {section.date}) were measured on other sources than those now in the repository "
        "(kernels, bindings, host launch code, build flags or ceiling kernels changed): run "
        "scripts/gpu_suite.sh on a GPU machine and commit reports/results/")


@pytest.mark.parametrize("problem", problems.names())
def test_newest_record_passed_its_checks(problem):
    failed = [c for c in records.latest_section(problem).checks if not c.passed]
    assert not failed, failed


# --- freshness: every source that changes a measurement ----------------------------------------------------

def _copy_repository(tmp_path):
    """The sources a measurement depends on, copied: edits there leave the shared tree alone."""
    root = tmp_path / "repo"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for folder in ("kernels", "losslab", "pitfalls"):
        shutil.copytree(build.ROOT / folder, root / folder, ignore=ignore)
    return root


def _one(root, pattern: str):
    found = sorted(root.glob(pattern))
    assert found, f"no {pattern} in the repository: update this test's list of sources"
    return found[0]


# (what is edited, a glob under the repository root): one of each kind the issue names
EDITS = {
    "a kernel of the problem": "kernels/kl_div/naive.cu",
    "a shared kernel header": "kernels/common/*.cuh",
    "the binding": "losslab/build/csrc/kl_div.cpp",
    "a shared binding header": "losslab/build/csrc/*.h",
    "the host launch code of the problem": "losslab/problems/kl_div/host.py",
    "the definition of the problem": "losslab/problems/kl_div/problem.py",
    "the shared launch code": "losslab/problems/__init__.py",
    "the autograd glue": "losslab/ops.py",
    "the build code with its flags": "losslab/build/extension.py",
    "a ceiling kernel": "kernels/ceilings/stream_bandwidth.cu",
    "the ceilings binding": "losslab/build/csrc/ceilings.cpp",
}


@pytest.mark.parametrize("what", EDITS)
def test_an_edit_of_any_measured_source_makes_a_record_stale(tmp_path, what):
    root = _copy_repository(tmp_path)
    stamp = records.sources_sha256("kl_div", root)
    assert stamp == records.sources_sha256("kl_div"), "the copy hashes as the repository does"
    row = replace(_row(), sources_sha256=stamp)
    section = records.Section("kl_div", "Fixture GPU", rows=[row])
    assert section.is_fresh(root)
    path = _one(root, EDITS[what])
    path.write_bytes(path.read_bytes() + b"\n// an edit\n")
    assert not section.is_fresh(root), f"editing {what} ({path.relative_to(root)}) left the record fresh"


def test_what_the_notebooks_claim_is_no_measured_source(tmp_path):
    """A loss's claims.py states what its records should show (checked on each record); editing it
    changes no measurement, so the record stays fresh (and its claims are checked anew)."""
    root = _copy_repository(tmp_path)
    section = records.Section("kl_div", "Fixture GPU", rows=[replace(_row(), sources_sha256=records.sources_sha256(
        "kl_div", root))])
    claims = root / "losslab/problems/kl_div/claims.py"
    claims.write_text(claims.read_text() + "\n# an edit\n")
    assert section.is_fresh(root)


def test_compiler_flags_are_hashed(monkeypatch):
    before = records.sources_sha256("kl_div")
    monkeypatch.setattr(build, "NVCC_FLAGS", ("-O0", "-std=c++17"))
    assert records.sources_sha256("kl_div") != before


def test_another_problems_sources_do_not_make_a_record_stale(tmp_path):
    root = _copy_repository(tmp_path)
    stamp = records.sources_sha256("kl_div", root)
    path = root / "kernels" / "cross_entropy" / "naive.cu"
    path.write_bytes(path.read_bytes() + b"\n// an edit\n")
    assert records.sources_sha256("kl_div", root) == stamp
    assert records.sources_sha256("cross_entropy", root) != records.sources_sha256("cross_entropy")


def test_the_teaching_ladder_and_the_public_operator_are_hashed(tmp_path):
    """The records time the teaching rungs and losslab.nn: their sources make a row stale."""
    root = _copy_repository(tmp_path)
    stamp = records.sources_sha256("kl_div", root)
    rung = root / "kernels" / "kl_div" / "ladder" / "naive.cu"
    rung.write_bytes(rung.read_bytes() + b"\n// an edit\n")
    assert records.sources_sha256("kl_div", root) != stamp
    stamp = records.sources_sha256("kl_div", root)
    binding = root / "losslab" / "build" / "csrc" / "kl_div_ladder.cpp"
    binding.write_bytes(binding.read_bytes() + b"\n// an edit\n")
    assert records.sources_sha256("kl_div", root) != stamp
    stamp, other = records.sources_sha256("kl_div", root), records.sources_sha256("cross_entropy", root)
    functional = root / "losslab" / "nn" / "functional.py"
    functional.write_bytes(functional.read_bytes() + b"\n# an edit\n")
    assert records.sources_sha256("kl_div", root) != stamp and records.sources_sha256("cross_entropy", root) != other
    stamp = records.sources_sha256("kl_div", root)
    ce_binding = root / "losslab" / "build" / "csrc" / "cross_entropy_ladder.cpp"
    ce_binding.write_bytes(ce_binding.read_bytes() + b"\n// an edit\n")
    assert records.sources_sha256("kl_div", root) == stamp  # another loss's ladder binding


def test_a_pitfall_kernel_edit_changes_the_pitfalls_hash(tmp_path):
    root = _copy_repository(tmp_path)
    stamp = records.pitfall_sources_sha256(root=root)
    path = _one(root, "pitfalls/kl_div/*.cu")
    path.write_bytes(path.read_bytes() + b"\n// an edit\n")
    assert records.pitfall_sources_sha256(root=root) != stamp


# --- the physical floor ----------------------------------------------------------------------------------

def _row(**changes) -> BenchRow:
    spec = problems.get("kl_div")
    row = BenchRow("kl_div", "naive", "variant", "forward", tuple(spec.sizes["seed"]), "float32", 10.0, 9.9, 10.1,
                   20, 100.0, "read", 0.1, 0, 1e-8, date="2026-01-01T00:00:00+00:00", torch="t", cuda="c",
                   sources_sha256=records.sources_sha256("kl_div"))
    return replace(row, **changes)


def test_recorded_rows_below_the_physical_floor_are_flagged_and_none_is_a_losslab_rung():
    """In every committed record, a time below the datasheet's floor is flagged with its note
    (Liger's cross_entropy backward, whose gradient its forward computed, has been), and no rung
    of the ladder is ever below it: its times are real work."""
    checked = 0
    for record in records.load_records():  # each device's record: the losses measured there
        for section in record.sections.values():
            for row in section.rows:
                if row.floor_ms is None:
                    continue
                checked += 1
                assert row.below_floor == (row.median_ms < row.floor_ms), row
                if row.below_floor:
                    assert "physical floor" in row.floor_note and "artifact" in row.floor_note, row
                    assert row.kind != "variant", row
    assert checked, "no recorded row has a physical floor"


def test_floor_flag_follows_the_time_and_the_datasheet(results_dir):
    floor = records.Section.from_dict({"device": "NVIDIA H200", "rows": [_row().as_dict()]}, "kl_div").rows[0]
    assert floor.floor_ms == pytest.approx(2 * 4 * 16384**2 / 4800e6, rel=1e-3) and not floor.below_floor
    fast = records.Section.from_dict({"device": "NVIDIA H200", "rows": [_row(median_ms=0.01).as_dict()]}).rows[0]
    assert fast.below_floor and "0.010 ms is below the physical floor" in fast.floor_note
    unknown = records.Section.from_dict({"device": "Fixture GPU", "rows": [_row(median_ms=0.01).as_dict()]}).rows[0]
    assert unknown.floor_ms is None and not unknown.below_floor  # no datasheet: no floor claimed


# --- saving adds, never replaces ---------------------------------------------------------------------------

def test_sections_of_other_problems_survive_a_save(results_dir, make_section):
    records.save_section("kl_div", make_section("kl_div"), results_dir)
    path = records.save_section("cross_entropy", make_section("cross_entropy"), results_dir)
    assert path.name == "fixture-gpu.json"
    assert set(json.loads(path.read_text())["problems"]) == {"kl_div", "cross_entropy"}
    with pytest.raises(LookupError, match="no recorded results for kl_div on Other GPU.*recorded devices: Fixture"):
        records.latest_section("kl_div", "Other GPU", results_dir)


def test_a_run_at_another_size_or_on_fewer_variants_adds_to_the_record(results_dir, make_section):
    records.save_section("kl_div", make_section("kl_div"), results_dir)
    seed = records.latest_section("kl_div", results_dir=results_dir)
    small = tuple(problems.get("kl_div").sizes["small"])
    later = "2001-01-01T00:00:00+00:00"
    new_rows = [_row(shape=small, date=later, median_ms=0.5), _row(implementation="vectorized", date=later,
                                                                   median_ms=0.25)]
    records.save_section("kl_div", records.Section("kl_div", "Fixture GPU", rows=new_rows), results_dir)
    merged = records.latest_section("kl_div", results_dir=results_dir)
    assert set(merged.shapes) == {seed.primary_shape, small}
    assert len(merged.rows) == len(seed.rows) + 1  # the seed-size vectorized forward replaced, the small one added
    replaced = next(r for r in merged.rows if r.key == new_rows[1].key)
    assert replaced.median_ms == 0.25 and replaced.date == later
    kept = next(r for r in merged.rows if r.implementation == "eager" and r.direction == "forward")
    assert kept.speedup == next(r for r in seed.rows if r.key == kept.key).speedup  # as measured in its own run
    assert merged.view().primary_shape == seed.primary_shape  # the seed size stays what notebooks show
    assert merged.view(small).rows == [next(r for r in merged.rows if tuple(r.shape) == small)]


def test_a_failed_save_leaves_the_old_record_intact(results_dir, make_section, monkeypatch):
    path = records.save_section("kl_div", make_section("kl_div"), results_dir)
    assert path.stat().st_mode & 0o777 == 0o644, "a record is readable by everyone, as a plain write makes it"
    before = path.read_bytes()

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(records.files.os, "fsync", full_disk)  # the write fails after some bytes went out
    with pytest.raises(OSError, match="No space left"):
        records.save_section("cross_entropy", make_section("cross_entropy"), results_dir)
    assert path.read_bytes() == before, "a failed save changed the record"
    assert sorted(p.name for p in results_dir.iterdir()) == [path.name], "a failed save left a temporary file"


def test_merge_refuses_another_device():
    with pytest.raises(ValueError, match="merge: kl_div on B cannot be added to kl_div on A"):
        records.merge(records.Section("kl_div", "A"), records.Section("kl_div", "B"))


# --- reading: malformed files, the older format, several devices --------------------------------------------

@pytest.mark.parametrize("text", ['{"device": "X", "problems": {"kl_div": {"rows": [', "[]", '{"problems": {}}',
                                  '{"device": "X", "problems": {"kl_div": {"rows": [{"bogus": 1}]}}}',
                                  '{"device": "X", "problems": {"kl_div": {}}}'])  # an empty section, not skipped
def test_a_malformed_record_is_one_line_naming_the_file(results_dir, text):
    path = results_dir / "broken.json"
    path.write_text(text)
    with pytest.raises(records.RecordError) as err:
        records.load_records(results_dir)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def _older_format(section: records.Section) -> dict:
    """``section`` as the older, pre-typed format held it: provenance, shape, repeats and bandwidth
    per section, rows without their own provenance, the other dtypes under ``rows_by_dtype``."""
    stamps = ("date", "torch", "cuda", "sources_sha256")
    rows = [{k: v for k, v in r.as_dict().items() if k not in stamps} for r in section.rows]
    bandwidth = {"read": section.ceilings["read_gbps"], "copy": section.ceilings["copy_gbps"]}
    return {"date": section.date, "torch": section.torch, "cuda": section.cuda,
            "kernels_sha256": section.sources_sha256, "shape": list(section.primary_shape), "dtype": "float32",
            "repeats": 20, "bandwidth_gbps": bandwidth,
            "rows": rows, "rows_by_dtype": {"bfloat16": [{**r, "dtype": "bfloat16"} for r in rows]},
            "checks": [{k: v for k, v in c.as_dict().items() if k not in stamps} for c in section.checks]}


@pytest.mark.parametrize("schema", [None, 2])  # the older files had no schema; one stamped 2 by hand is refused too
def test_a_record_of_the_older_format_is_refused_in_one_line(results_dir, make_section, schema):
    path = results_dir / "fixture-gpu.json"
    record = {"device": "Fixture GPU", "problems": {"kl_div": _older_format(make_section("kl_div"))}}
    path.write_text(json.dumps(record if schema is None else {**record, "schema": schema}))
    with pytest.raises(records.RecordError) as err:
        records.latest_section("kl_div", results_dir=results_dir)
    message = str(err.value)
    assert message.startswith(f"{path}: a record of the older format") and "\n" not in message
    assert "kernels_sha256" in message and "re-record it with `python -m losslab bench kl_div`" in message
    with pytest.raises(ValueError, match="older format .*bandwidth_gbps.*re-record it"):
        records.Section.from_dict({"device": "Fixture GPU", **record["problems"]["kl_div"]}, "kl_div")


def test_the_current_format_reads_back_as_written(results_dir, make_section):
    section = make_section("kl_div")
    path = records.save_section("kl_div", section, results_dir)
    assert json.loads(path.read_text())["schema"] == records.SCHEMA
    back = records.load(path).sections["kl_div"]
    assert back.rows == section.rows and back.checks == section.checks and back.ceilings == section.ceilings
    assert back.date == section.date and back.torch == "fixture" and back.is_fresh()


def test_stale_mixed_rows_read_as_not_fresh(make_section):
    section = make_section("kl_div")
    section.rows.append(_row(shape=(8, 8), sources_sha256="0" * 64))
    assert not section.is_fresh() and section.stale() == [section.rows[-1]]
    assert not records.is_fresh(section)


def test_mixed_devices_are_told_apart(results_dir, make_section):
    records.save_section("kl_div", make_section("kl_div", device="NVIDIA H100 80GB HBM3"), results_dir)
    newer = make_section("cross_entropy", device="NVIDIA H200")
    records.save_section("cross_entropy", newer, results_dir)
    assert sorted(records.devices(results_dir)) == ["NVIDIA H100 80GB HBM3", "NVIDIA H200"]
    assert records.resolve_device("nvidia-h200", results_dir) == "NVIDIA H200"
    with pytest.raises(LookupError, match=r"'NVIDIA B200'.*recorded devices: .*nvidia-h100-80gb-hbm3"):
        records.resolve_device("NVIDIA B200", results_dir)
    assert records.latest_section("kl_div", "nvidia-h100-80gb-hbm3", results_dir).device == "NVIDIA H100 80GB HBM3"
    with pytest.raises(LookupError, match="recorded devices"):
        records.latest_section("kl_div", "NVIDIA H200", results_dir)


def test_describe_says_what_a_section_holds(make_section):
    section = make_section("kl_div")
    section.rows.append(_row(shape=(8, 8), dtype="bfloat16"))
    text = section.describe()
    assert "16384x16384, 8x8" in text and "float32, bfloat16" in text and "Fixture GPU" in text


def test_combine_recomputes_speedups_across_implementations_measured_apart():
    variant = records.Section("kl_div", "G", rows=[_row(median_ms=1.0)])
    peer = records.Section("kl_div", "G", rows=[_row(implementation="eager", kind="peer", median_ms=3.0)])
    combined = records.combine([variant, peer])
    assert next(r for r in combined.rows if r.implementation == "naive").speedup == {"eager": 3.0}


def test_check_results_merge_by_variant_case_and_direction():
    old = CheckResult("kl_div", "naive", "random 3x4", (3, 4), "forward", 1.0, 1e-5, False, "x", date="1")
    new = replace(old, error=1e-8, passed=True, detail="", date="2")
    merged = records.merge(records.Section("kl_div", "G", checks=[old]), records.Section("kl_div", "G", checks=[new]))
    assert merged.checks == [new]


def test_replace_is_a_full_re_record(results_dir, make_section):
    records.save_section("kl_div", make_section("kl_div"), results_dir)
    records.save_section("kl_div", records.Section("kl_div", "Fixture GPU", rows=[_row(shape=(8, 8))]), results_dir,
                         replace=True)
    assert records.latest_section("kl_div", results_dir=results_dir).shapes == [(8, 8)]


# --- the sweep and the ncu profile in the record -------------------------------------------------------------

def _sweep_section() -> records.Section:
    rows = [_row(implementation=impl, kind=kind, shape=shape, median_ms=ms, back_to_back_ms=ms / 2, host_ms=0.01,
                 fraction_of_bandwidth=frac)
            for impl, kind in (("eager", "peer"), ("fused", "variant"), ("naive", "variant"))
            for shape, ms, frac in (((2048, 131072), 2.0, 0.8), ((128, 4096), 0.02, 0.1))]
    rows.append(_row(implementation="fused", shape=(128, 4096), dtype="bfloat16"))
    rows.append(_row(implementation="fused", shape=(128, 4096), direction="forward_backward"))
    return records.Section("kl_div", "Fixture GPU", rows=rows)


def test_sweep_gives_one_line_per_implementation_ordered_by_size():
    lines = _sweep_section().sweep("float32", "forward")
    assert [line.implementation for line in lines] == ["naive", "fused", "eager"]  # ladder order, then peers
    fused = lines[1]
    assert fused.kind == "variant" and fused.dtype == "float32" and fused.direction == "forward"
    assert [p.shape for p in fused.points] == [(128, 4096), (2048, 131072)]
    small, wide = fused.points
    assert small.min_bytes < wide.min_bytes and wide.elements == 2048 * 131072
    assert (wide.median_ms, wide.back_to_back_ms, wide.host_ms, wide.fraction_of_bandwidth) == (2.0, 1.0, 0.01, 0.8)
    assert [line.implementation for line in _sweep_section().sweep("bfloat16")] == ["fused"]
    assert _sweep_section().sweep("float16") == []


def test_skipped_sweep_points_are_saved_and_a_later_measurement_replaces_them(results_dir):
    from losslab.measure.bench import Skipped

    skip = Skipped("kl_div", (2048, 131072), "float32", "naive", "hopeless here", date="2026-01-01")
    records.save_section("kl_div", records.Section("kl_div", "Fixture GPU", rows=[_row()], skipped=[skip]),
                         results_dir)
    back = records.latest_section("kl_div", results_dir=results_dir)
    assert back.skipped == [skip]
    records.save_section("kl_div", records.Section("kl_div", "Fixture GPU", rows=[_row(shape=(2048, 131072))]),
                         results_dir)
    assert records.latest_section("kl_div", results_dir=results_dir).skipped == []


def test_measure_sweep_plans_repeats_directions_and_skips_with_reasons(monkeypatch):
    import torch

    calls = []

    def fake_bench(problem, shape, variants, **kw):
        calls.append((shape, kw["dtype"], tuple(variants), kw["repeats"], kw["directions"]))
        return [_row(problem=problem, implementation=v if isinstance(v, str) else v.name, shape=shape,
                     dtype=str(kw["dtype"]).removeprefix("torch.")) for v in variants]

    monkeypatch.setattr(records.measuring, "bench_problem", fake_bench)
    monkeypatch.setattr(records.measuring.torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(records.measuring.torch.cuda, "mem_get_info", lambda: (int(30e9), int(80e9)))
    monkeypatch.setattr(records.measuring, "run_provenance", lambda problem: {
        "device": "Fixture GPU", "multiprocessors": 132, "memory_bytes": int(80e9), "compute_capability": "9.0",
        "torch": "t", "cuda": "c", "date": "2026-01-01T00:00:00+00:00", "sources_sha256": "h"})
    ceilings = {"read_gbps": 3000.0, "copy_gbps": 2800.0}
    section = records.measure_sweep("cross_entropy", [(128, 4096), (4096, 131072), (65536, 131072)],
                                    dtypes=("float32", "bfloat16"), ceilings=ceilings, progress=False)
    spec = problems.get("cross_entropy")
    first = calls[0]
    names = lambda timed: tuple(v if isinstance(v, str) else v.name for v in timed)  # noqa: E731
    assert first[0] == (128, 4096) and names(first[2]) == (*spec.variants, "losslab.nn") and first[3] == 20
    assert first[4] == ("forward", "forward_backward")
    wide = next(c for c in calls if c[0] == (4096, 131072) and c[1] == torch.float32)
    assert names(wide[2]) == (*spec.variants[1:], "losslab.nn") and wide[3] == 10  # no serial rung; fewer repeats
    assert not any(c[0] == (65536, 131072) for c in calls)  # 32 GiB of logits: does not fit in 30 GB free
    reasons = {(s.shape, s.dtype, s.implementation): s.reason for s in section.skipped}
    assert "one thread walks each row" in reasons[(4096, 131072), "float32", spec.variants[0]]
    assert "GB of device memory" in reasons[(65536, 131072), "bfloat16", "*"]
    assert all(s.date == "2026-01-01T00:00:00+00:00" for s in section.skipped)
    assert section.source == "live" and section.multiprocessors == 132
    with pytest.raises(ValueError, match="directions: unknown direction 'sideways'"):
        records.measure_sweep("kl_div", directions=("sideways",))


def test_the_ncu_profile_is_typed_in_the_record_and_read_back(results_dir):
    from losslab.measure.ncu import Counters, Profile

    counters = Counters("naive", "variant", "forward", 2, ["k"], dram_bytes_read=8.0, load_requests=10.0,
                        load_sectors=320.0, grid_size=64, active_sms=63.5, stalls={"long_scoreboard": 9.0})
    profile = Profile("ok", "fixture", [16384, 16384], ["m"], {"x": "why"}, "v", 132, [counters])
    records.save_section("kl_div", records.Section("kl_div", "Fixture GPU", rows=[_row()], ncu=profile),
                         results_dir)
    back = records.latest_section("kl_div", results_dir=results_dir).ncu
    assert isinstance(back, Profile) and back == profile
    assert back.find("naive", "forward").sectors_per_request == 32.0
    assert back.records[0].dram_bytes_read == 8.0 and not hasattr(back, "get")  # attributes, no dict access


# --- gpu tier: a live section, saved and read back ------------------------------------------------------------

@pytest.mark.gpu
def test_measure_section_stamps_rows_and_checks_and_reads_back_fresh(results_dir):
    section = records.measure_section("kl_div", "small", ["vectorized"], peers=("eager",),
                                      dtypes=("float32", "bfloat16"), repeats=3, check_sizes=["small"],
                                      edge_cases=False, progress=False)
    assert section.source == "live" and section.dtypes == ["float32", "bfloat16"]
    assert section.checks and all(c.passed for c in section.checks), section.checks
    assert section.ceilings["read_gbps"] > 0 and section.is_fresh()
    for row in section.rows:
        assert row.date and row.torch and row.sources_sha256 and row.back_to_back_ms > 0 and row.host_ms > 0, row
    records.save_section("kl_div", section, results_dir)
    back = records.latest_section("kl_div", results_dir=results_dir)
    assert back.source == "recorded" and back.rows == section.rows and back.is_fresh()


@pytest.mark.gpu
def test_a_peer_that_cannot_run_is_skipped_with_its_reason_printed_once(capsys):
    section = records.measure_section("kl_div", "small", [], peers=("eager", "quack"), dtypes=("float32", "bfloat16"),
                                      repeats=3, check=False, ceilings={"read_gbps": 1e3, "copy_gbps": 1e3})
    assert {r.implementation for r in section.rows} == {"eager"}
    assert [(s.implementation, s.dtype) for s in section.skipped] == [("quack", "float32"), ("quack", "bfloat16")]
    assert all(s.reason == "quack-kernels has no kl_div (of the losses here it has cross_entropy only)" and s.date
               for s in section.skipped)
    assert capsys.readouterr().err.count("kl_div: quack not timed: quack-kernels has no kl_div") == 1


@pytest.mark.gpu
def test_measure_sweep_times_forward_and_forward_backward_at_each_shape(results_dir):
    section = records.measure_sweep("kl_div", [(128, 4096), (64, 20000)], dtypes=("float32", "bfloat16"),
                                    peers=("eager",), repeats=3, progress=False)
    assert section.source == "live" and set(section.shapes) == {(128, 4096), (64, 20000)}
    assert {r.direction for r in section.rows} == {"forward", "forward_backward"}
    assert [(s.implementation, s.shape) for s in section.skipped] == [("naive", (64, 20000))]  # long rows
    bf16 = {line.implementation for line in section.sweep("bfloat16", "forward_backward")}
    assert bf16 == {"vectorized", "fused", "losslab.nn", "eager"}  # the rungs that take bf16, the operator, the peer
    for row in section.rows:
        assert row.back_to_back_ms > 0 and row.host_ms > 0 and row.sources_sha256 and row.repeats == 3, row
    records.save_section("kl_div", section, results_dir)
    back = records.latest_section("kl_div", results_dir=results_dir)
    assert back.skipped == section.skipped and len(back.sweep("float32")) == 7  # 5 rungs, losslab.nn, eager


@pytest.mark.parametrize("script", ["gpu_suite_parallel", "gpu_tier_parallel"])
def test_the_parallel_scripts_refuse_to_start_without_a_gpu_in_one_line(tmp_path, script):
    """scripts/gpu_suite_parallel.sh and gpu_tier_parallel.sh on a machine without a GPU (or with fewer
    GPUs than groups, or the tier's FIRST_GPU past the last): one line naming what is missing, and exit 2."""
    fake = tmp_path / "nvidia-smi"  # stands in for this machine's, whatever GPUs it has
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "OUT": str(tmp_path / "out")}

    def run(*groups):
        return subprocess.run(["bash", str(build.ROOT / "scripts" / f"{script}.sh"), *groups],
                              capture_output=True, text=True, env=env, cwd=build.ROOT, timeout=60)

    fake.write_text("#!/bin/sh\necho 'GPU 0: Fixture GPU (UUID: GPU-0)'\n")  # one GPU
    fake.chmod(0o755)
    two = run("kl_div", "cross_entropy")
    assert two.returncode == 2 and two.stderr.strip().splitlines() == [
        f"{script}: GROUP: expected 1 to 1 groups (one per GPU), got 2"], two.stderr
    if script == "gpu_tier_parallel":  # FIRST_GPU past the last GPU
        env["FIRST_GPU"] = "1"
        past = run("tests/test_nn.py")
        assert past.returncode == 2 and past.stderr.strip() == (
            f"{script}: FIRST_GPU: expected a GPU index from 0 to 0, got '1'"), past.stderr
        del env["FIRST_GPU"]
    fake.write_text("#!/bin/sh\nexit 9\n")  # no GPU
    none = run("kl_div")
    assert none.returncode == 2, none.stderr
    assert none.stderr.strip() == f"{script}: no GPU visible here (nvidia-smi -L lists none)"
