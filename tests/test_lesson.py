"""Each rung as a lesson (losslab.present.lesson): the stored guess, its score, the measured step and the
counters of the idea; and the teaching ladder's view of a record (Section.taught)."""
import dataclasses

import pytest

from losslab import records
from losslab.measure.ncu import Counters, Profile
from losslab.present import lesson


@pytest.mark.parametrize("bad", [0, -1.5, float("nan"), float("inf"), "2", True])
def test_a_guess_is_a_positive_factor(bad):
    with pytest.raises(ValueError, match="forward: expected a positive factor"):
        lesson.Guess(forward=bad)
    assert lesson.Guess(forward=2, forward_backward=0.5).forward == 2


def test_the_score_says_how_far_the_guess_was():
    assert lesson.score(None, 2.0) == "no guess"
    assert lesson.score(2.0, 2.2).startswith("close")
    assert lesson.score(1.0, 3.0) == "the rung did 3.0x better than you guessed"
    assert lesson.score(4.0, 2.0) == "the rung did 2.0x worse than you guessed"


def test_measure_shows_the_step_the_guess_and_the_counters_of_the_idea(make_section):
    section = make_section()  # naive 100 ms, the other rungs 1 ms
    section.ncu = Profile(status="ok", records=[
        Counters("naive", "variant", "forward", 1, load_requests=64, load_sectors=2048),
        Counters("shared_memory", "variant", "forward", 1, load_requests=64, load_sectors=256)])
    text = lesson.measure(section, "naive", "shared_memory", lesson.Guess(forward=100.0)).plain
    assert "forward: naive 100.000 ms, shared_memory 1.000 ms, x100.00 (your guess: x100.00; close" in text
    assert "forward_backward: naive 100.000 ms" in text and "your guess: none; no guess" in text
    assert "sectors_per_request (forward): naive 32.00, shared_memory 4.00" in text
    assert "recorded on Fixture GPU" in text.splitlines()[0]


def test_measure_without_counters_or_section_says_so(make_section):
    assert "no Nsight Compute counters" in lesson.measure(make_section(), "naive", "shared_memory").plain
    assert lesson.measure(None, "naive", "shared_memory").plain.startswith(
        "No results yet, so no step from naive to shared_memory to show")


def test_the_taught_view_puts_the_teaching_rows_in_the_rungs_place(make_section):
    section = make_section()
    assert section.taught() is section  # no teaching rows recorded: as it is
    teaching = [dataclasses.replace(r, implementation=f"{r.implementation} [ladder]", kind="ladder",
                                    median_ms=r.median_ms * 2)
                for r in section.rows if r.kind == "variant"]
    section.rows += teaching
    section.checks += [dataclasses.replace(c, variant=f"{c.variant} [ladder]") for c in section.checks[:2]]
    taught = section.taught()
    variants = [r for r in taught.rows if r.kind == "variant"]
    assert variants and all(not r.implementation.endswith("[ladder]") for r in variants)
    assert {r.median_ms for r in variants if r.implementation == "shared_memory"} == {2.0}  # the teaching rows
    assert {r.kind for r in taught.rows} == {"variant", "peer"}
    assert len(taught.checks) == 2 and all(not c.variant.endswith("[ladder]") for c in taught.checks)
    assert isinstance(taught, records.Section) and len(section.rows) > len(taught.rows)


def test_the_cluster_guess_is_scored_at_the_long_rows(make_section):
    from losslab.measure.bench import BenchRow

    section = make_section("cross_entropy")
    for rung, ms in (("fused", 3.0), ("cluster", 2.0)):
        section.rows.append(BenchRow("cross_entropy", rung, "variant", "forward_backward", (4096, 131072), "float32",
                                     ms, ms, ms, 20, 1.0, "copy", 0.5, 0, 1e-7))
    text = lesson.score_long_rows(section, lesson.Guess(forward_backward=1.5)).plain
    assert text == "4096 x 131072 float32: fused 3.000 ms, cluster 2.000 ms, x1.50 (close (within 25%))"
    assert "no fused and cluster rows" in lesson.score_long_rows(make_section("cross_entropy")).plain
