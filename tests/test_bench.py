"""The bench: rows below the physical floor flagged and explained, speedups over the peers of the same
shape, dtype and direction (cpu tier); every row of a real bench measured per call, back to back and
on the host (gpu tier)."""
from dataclasses import replace

import pytest
import torch

from losslab import problems
from losslab.measure import bench

SEED = tuple(problems.get("cross_entropy").sizes["seed"])


def _row(**changes) -> bench.BenchRow:
    row = bench.BenchRow("cross_entropy", "vectorized", "variant", "backward", SEED, "float32", 1.0, 0.9, 1.1, 20,
                         1000.0, "copy", 0.5, 0, 1e-8)
    return replace(row, **changes)


def test_a_time_below_the_physical_floor_is_flagged_with_a_reason():
    liger = bench.flag_physical_floor(_row(implementation="liger", kind="peer", median_ms=0.118), "NVIDIA H200")
    assert liger.below_floor and liger.floor_ms > 0.118
    assert liger.floor_note.startswith("0.118 ms is below the physical floor")
    honest = bench.flag_physical_floor(_row(), "NVIDIA H200")
    assert not honest.below_floor and honest.floor_note == "" and honest.floor_ms == pytest.approx(liger.floor_ms)


def test_the_text_table_marks_and_explains_a_row_below_the_floor():
    rows = [bench.flag_physical_floor(_row(implementation="liger", kind="peer", median_ms=0.118), "NVIDIA H200"),
            bench.flag_physical_floor(_row(back_to_back_ms=0.95, host_ms=0.02), "NVIDIA H200")]
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

    with pytest.raises(ValueError, match="peers: unknown peer 'numpy'; expected some of eager, compile, liger"):
        peers.check_peer_names(["eager", "numpy"])


@pytest.mark.gpu
def test_every_row_is_timed_per_call_back_to_back_and_on_the_host():
    rows = bench.bench_problem("kl_div", problems.get("kl_div").sizes["small"], ["naive", "fused"], peers=("eager",),
                               repeats=3, bandwidth={"read": 1000.0, "copy": 1000.0}, progress=False)
    assert {(r.implementation, r.direction) for r in rows} >= {("naive", "backward"), ("eager", "forward")}
    assert not any(r.implementation == "fused" and r.direction == "backward" for r in rows)
    for r in rows:
        assert r.back_to_back_ms > 0 and r.host_ms > 0 and r.median_ms > 0, r
        assert r.floor_ms is None or not r.below_floor, r.floor_note
    assert torch.cuda.is_available()
