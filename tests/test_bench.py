"""The bench: rows below the physical floor flagged and explained, speedups over the peers of the same
shape, dtype and direction (cpu tier); every row of a real bench measured per call, back to back and
on the host (gpu tier)."""
from dataclasses import replace

import pytest
import torch

from losslab import problems
from losslab.measure import bench

KL_DIV, CROSS_ENTROPY = problems.get("kl_div"), problems.get("cross_entropy")

SEED = tuple(problems.get("cross_entropy").sizes["seed"])


def _row(**changes) -> bench.BenchRow:
    row = bench.BenchRow("cross_entropy", "vectorized", "variant", "backward", SEED, "float32", 1.0, 0.9, 1.1, 20,
                         1000.0, "copy", 0.5, 0, 1e-8)
    return replace(row, **changes)


def _flagged(row: bench.BenchRow) -> bench.BenchRow:
    return bench.flag_physical_floor(row, "NVIDIA H200", CROSS_ENTROPY)


def test_a_time_below_the_physical_floor_is_flagged_with_a_reason():
    liger = _flagged(_row(implementation="liger", kind="peer", median_ms=0.118))
    assert liger.below_floor and liger.floor_ms > 0.118
    assert liger.floor_note.startswith("0.118 ms is below the physical floor")
    honest = _flagged(_row())
    assert not honest.below_floor and honest.floor_note == "" and honest.floor_ms == pytest.approx(liger.floor_ms)


def test_the_text_table_marks_and_explains_a_row_below_the_floor():
    rows = [_flagged(_row(implementation="liger", kind="peer", median_ms=0.118)),
            _flagged(_row(back_to_back_ms=0.95, host_ms=0.02))]
    text = bench.bench_table_text(rows)
    assert "b2b ms" in text and "host ms" in text and "0.950" in text
    assert "   0.118! " in text and "\n! liger backward: 0.118 ms is below the physical floor" in text


def test_speedups_compare_only_rows_of_the_same_shape_dtype_and_direction():
    rows = [_row(median_ms=1.0), _row(implementation="eager", kind="peer", median_ms=3.0),
            _row(implementation="eager", kind="peer", median_ms=9.0, dtype="bfloat16"),
            _row(implementation="eager", kind="peer", median_ms=5.0, direction="forward")]
    bench.set_speedups(rows)
    assert rows[0].speedup == {"eager": 3.0}


def test_unknown_peers_are_named():
    from losslab.measure import peers

    with pytest.raises(ValueError, match="peers: unknown peer 'numpy'; expected some of eager, compile, liger, quack"):
        peers.check_peer_names(["eager", "numpy"])


@pytest.mark.gpu
def test_every_row_is_timed_per_call_back_to_back_and_on_the_host():
    rows = bench.bench_problem(KL_DIV, problems.get("kl_div").sizes["small"], ["naive", "fused"], peers=("eager",),
                               repeats=3, bandwidth={"read": 1000.0, "copy": 1000.0}, progress=False)
    assert {(r.implementation, r.direction) for r in rows} >= {("naive", "backward"), ("eager", "forward")}
    assert not any(r.implementation == "fused" and r.direction == "backward" for r in rows)
    for r in rows:
        assert r.back_to_back_ms > 0 and r.host_ms > 0 and r.median_ms > 0, r
        assert r.floor_ms is None or not r.below_floor, r.floor_note
    assert torch.cuda.is_available()


# --- the sweep (cpu tier) --------------------------------------------------------------------------------

@pytest.mark.parametrize("problem", problems.names())
def test_each_sweep_runs_from_launch_bound_rows_through_the_seed_size_to_wide_rows(problem):
    shapes = bench.SWEEP_SHAPES[problem]
    assert shapes[0][0] <= 128 and tuple(problems.get(problem).sizes["seed"]) in shapes
    assert max(c for _, c in shapes) >= 131072  # LLM-sized rows
    assert bench.SWEEP_DIRECTIONS == ("forward", "forward_backward")


def test_only_the_serial_rung_is_hopeless_and_only_on_long_rows():
    spec = problems.get("cross_entropy")
    reason = bench.hopeless_reason(CROSS_ENTROPY, spec.variants[0], (4096, 131072))
    assert reason and "131072 columns" in reason and str(bench.SERIAL_COLUMNS) in reason
    assert bench.hopeless_reason(CROSS_ENTROPY, spec.variants[0], (32768, 4096)) is None
    assert all(bench.hopeless_reason(CROSS_ENTROPY, v, (2048, 262144)) is None for v in spec.variants[1:])


def test_large_sweep_points_take_fewer_repeats_and_say_what_memory_they_need():
    assert bench.sweep_repeats(CROSS_ENTROPY, (128, 4096), torch.float32) == 20
    assert bench.sweep_repeats(CROSS_ENTROPY, (4096, 131072), torch.float32) == 10
    assert bench.sweep_repeats(CROSS_ENTROPY, (4096, 131072), torch.float32, repeats=6) == 5
    wide = bench.sweep_memory_bytes(CROSS_ENTROPY, (4096, 131072), torch.float32)
    assert 16e9 < wide < 40e9  # fits an 80 GB H100 with room; float64 reference included
    assert bench.sweep_memory_bytes(CROSS_ENTROPY, (4096, 131072), torch.bfloat16) < wide


def test_the_sweep_table_has_a_column_per_shape_and_lists_what_was_skipped():
    rows = [_row(shape=(128, 4096), direction="forward", median_ms=0.01, fraction_of_bandwidth=0.1),
            _row(shape=SEED, direction="forward", median_ms=0.2, fraction_of_bandwidth=0.9),
            _row(implementation="eager", kind="peer", shape=SEED, direction="forward", median_ms=0.4)]
    skipped = [bench.Skipped("cross_entropy", (4096, 131072), "float32", "naive", "hopeless here")]
    text = bench.sweep_table_text(rows, skipped)
    assert "128x4096" in text and "32768x4096" in text and "0.200 (90%)" in text
    eager = next(line for line in text.splitlines() if line.startswith("eager"))
    assert eager.split()[1] == "-"  # not timed at 128 rows
    assert text.endswith("skipped naive at 4096x131072 float32: hopeless here")


def test_the_sweep_table_names_a_missing_peer_once_for_all_its_shapes_and_dtypes():
    skipped = [bench.Skipped("cross_entropy", shape, dtype, "quack", "not installed")
               for dtype in ("float32", "bfloat16") for shape in ((128, 4096), SEED)]
    text = bench.sweep_table_text([_row(shape=SEED, direction="forward")], skipped)
    assert text.endswith("\nskipped quack at 128x4096, 32768x4096 float32/bfloat16: not installed")
    assert text.count("not installed") == 1
