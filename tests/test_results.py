"""cpu tier: recorded GPU results are present, fresh, and read back as written."""
import json

import pytest

from losslab import problems
from losslab import records


def test_every_problem_has_a_recorded_gpu_result():
    for problem in problems.names():
        section = records.latest_section(problem)
        assert section["rows"] and section["checks"], f"{problem}: record without rows or checks"


@pytest.mark.parametrize("problem", problems.names())
def test_newest_record_ran_the_current_kernels(problem):
    section = records.latest_section(problem)
    assert records.is_fresh(section, problem), (
        f"kernels/ changed after the newest {problem} record ({section['device']}, {section['date']}): "
        "run scripts/gpu_suite.sh on a GPU machine and commit reports/results/")


@pytest.mark.parametrize("problem", problems.names())
def test_newest_record_passed_its_checks(problem):
    failed = [c for c in records.latest_section(problem)["checks"] if not c["passed"]]
    assert not failed, failed


def test_sections_of_other_problems_survive_a_save(tmp_path):
    base = {"device": "NVIDIA Test GPU", "date": "2026-01-01T00:00:00+00:00", "kernels_sha256": "x"}
    records.save_section("a", {**base, "rows": [1]}, tmp_path)
    path = records.save_section("b", {**base, "date": "2026-01-02T00:00:00+00:00", "rows": [2]}, tmp_path)
    assert path.name == "nvidia-test-gpu.json"
    assert set(json.loads(path.read_text())["problems"]) == {"a", "b"}
    assert records.latest_section("a", results_dir=tmp_path)["rows"] == [1]
    with pytest.raises(LookupError, match="no recorded results for c"):
        records.latest_section("c", results_dir=tmp_path)


def test_kernel_hash_follows_the_sources():
    assert records.kernels_sha256("kl_div") == records.kernels_sha256("kl_div")
    assert records.kernels_sha256("kl_div") != records.kernels_sha256("no_such_problem")
