"""The roofline plot (cpu tier): points at model intensity and achieved FLOP/s (each at its own
dtype's bytes), roofs and ridge, the special-function (MUFU) roof beside them, forward + backward,
measured-traffic points only for the profiled dtype, points above the measured roof marked and
explained, points below the physical floor crossed out, one device per figure with its dates in
the title, and the CLI's PNG files. (Ceilings: test_ceilings.py; ncu: test_ncu.py.)

The sections below are test fixtures with made-up round numbers, built here to exercise the
code; they are never written under reports/.
"""
import dataclasses

import pytest

from losslab import problems, records
from losslab.__main__ import main
from losslab.measure.bench import BenchRow, flag_physical_floor
from losslab.present import roofline

SEED = (16384, 16384)
N = SEED[0] * SEED[1]


def fixture_section(with_ncu: bool = True) -> records.Section:
    """A recorded kl_div section as `python -m losslab bench kl_div` records it (made-up times)."""
    times = {"naive": 40.0, "shared_memory": 1.0, "warp_shuffle": 0.9, "vectorized": 0.8, "eager": 2.0, "compile": 0.9}
    rows = [BenchRow("kl_div", impl, "peer" if impl in ("eager", "compile") else "variant", direction, SEED,
                     "float32", median_ms=ms * scale, p10_ms=ms * scale, p90_ms=ms * scale, repeats=1, gbps=0.0,
                     bandwidth="read", fraction_of_bandwidth=0.0, peak_extra_bytes=0, error=0.0,
                     date="2000-01-01T00:00:00+00:00", torch="fixture", cuda="fixture", sources_sha256="0" * 64)
            for impl, ms in times.items() for direction, scale in (("forward", 1.0), ("backward", 1.5),
                                                                    ("forward_backward", 2.5))]
    ceilings = {"read_gbps": 3000.0, "copy_gbps": 2800.0, "fp32_fma_tflops": 50.0, "mufu_ex2_tops": 4.0,
                "datasheet": None}
    ncu = records.Profile("ok", "fixture", list(SEED), records=[
        records.Counters("naive", "variant", "forward", launches=2,
                         kernels=["kl_div_naive_forward_kernel", "sum_partials_kernel"],
                         dram_bytes_read=4.0 * 8 * N, dram_bytes_written=0.0, duration_ms=40.0)])
    return retimed(records.Section("kl_div", "NVIDIA H100 80GB HBM3", rows=rows, ceilings=ceilings,
                                   ncu=ncu if with_ncu else None))


def retimed(section: records.Section, implementation: str = "", direction: str = "", **values) -> records.Section:
    """``section`` with ``values`` set on the row of (implementation, direction) (every row where
    ``implementation`` is empty), each row flagged against the device's physical floor as a record
    read from a file is."""
    rows = [dataclasses.replace(r, **values) if not implementation or (r.implementation, r.direction) ==
            (implementation, direction) else r for r in section.rows]
    return dataclasses.replace(section, rows=[flag_physical_floor(r, section.device, section.spec) for r in rows])


# --- cpu tier: cost model -------------------------------------------------------------------

def test_kl_div_intensity_is_below_one_flop_per_byte():
    spec = problems.get("kl_div")
    forward, backward = spec.cost(SEED, "forward"), spec.cost(SEED, "backward")
    # forward: 4 FLOP per element over 2 fp32 reads (8 bytes) + the 4-byte loss
    assert forward.flops == 4 * N and forward.bytes == 8 * N + 4
    assert forward.arithmetic_intensity == pytest.approx(0.5)
    # backward: 2 FLOP per element over 2 reads + 1 write (12 bytes)
    assert backward.arithmetic_intensity == pytest.approx(2 / 12)
    assert forward.transcendentals == 2 * N


def test_points_sit_at_model_intensity_and_flops_over_time():
    pts = {(p.implementation, p.direction): p for p in roofline.points(fixture_section())}
    assert {d for _, d in pts} == {"forward", "backward", "forward_backward"}  # forward + backward drawn too
    naive = pts["naive", "forward"]
    assert naive.intensity == pytest.approx(0.5)
    assert naive.flops_per_s == pytest.approx(4 * N / 40e-3)
    # ncu saw 4x the minimum bytes: the measured point sits 4x to the left
    assert naive.measured_intensity == pytest.approx(naive.intensity / 4, rel=1e-6)
    assert pts["vectorized", "forward"].measured_intensity is None


def test_measured_points_need_the_same_shape():
    section = fixture_section()
    section.ncu.shape = [128, 4096]  # profiled at another size: bytes are not comparable
    assert all(p.measured_bytes is None for p in roofline.points(section))



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
    section = dataclasses.replace(fixture_section(with_ncu=False), ceilings={})
    fig = roofline.plot_roofline(section)
    assert any("(datasheet FP32)" in line.get_label() for line in fig.axes[0].lines)


def test_a_point_below_the_physical_floor_is_crossed_out_and_explained():
    # 3.2 GB in 1 us: far below the H100's datasheet floor
    section = retimed(fixture_section(), "vectorized", "backward", median_ms=0.001)
    pts = {(p.implementation, p.direction): p for p in roofline.points(section)}
    assert "below the physical floor" in pts["vectorized", "backward"].floor_verdict
    assert not pts["vectorized", "forward"].floor_verdict
    ax = roofline.plot_roofline(section).axes[0]
    crosses = [line for line in ax.lines if line.get_marker() == "x" and list(line.get_xdata())]
    assert len(crosses) == 1
    assert crosses[0].get_ydata()[0] == pytest.approx(pts["vectorized", "backward"].flops_per_s)
    assert any("vectorized (bwd) \u2020 below the physical floor" in t.get_text() for t in ax.texts)
    assert any("measurement artifact" in t.get_text() for t in ax.get_legend().get_texts())


def test_the_title_names_device_date_and_versions_and_one_device_only():
    section = fixture_section()
    title = roofline.plot_roofline(section).axes[0].get_title()
    assert "NVIDIA H100 80GB HBM3" in title and "2000-01-01 00:00 UTC" in title and "torch fixture" in title
    other = dataclasses.replace(fixture_section(), device="NVIDIA H200")
    with pytest.raises(ValueError, match="one device"):
        roofline.plot_roofline([section, other])


def test_model_only_plot_draws_without_any_record():
    fig = roofline.plot_model_only([problems.get("kl_div")])
    assert "nothing measured" in fig.axes[0].get_title()


def _write_record(results_dir, section):
    results_dir.mkdir(parents=True, exist_ok=True)
    records.save_section("kl_div", section, results_dir)


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


# --- the roofline tells the truth -------------------------------------------------------------------

def test_the_mufu_roof_is_drawn_per_direction_with_its_ridge():
    ax = roofline.plot_roofline(fixture_section()).axes[0]
    mufu = {line.get_label(): line for line in ax.lines if line.get_label().startswith("MUFU roof")}
    # kl_div forward: 4 FLOP per element over 2 logs, at 4.0 Top/s measured: 8 TFLOP/s
    forward = next(line for label, line in mufu.items() if "kl_div fwd:" in label)
    assert forward.get_ydata()[0] == pytest.approx(8e12)
    assert "ridge 2.7 FLOP/B" in forward.get_label()  # 8 TFLOP/s over the 3000 GB/s read roof
    assert any("fwd+bwd" in label for label in mufu)
    assert not any("bwd:" in label and "fwd+bwd" not in label for label in mufu)  # no log in the backward
    section = fixture_section()
    del section.ceilings["mufu_ex2_tops"]
    assert not [line for line in roofline.plot_roofline(section).axes[0].lines
                if line.get_label().startswith("MUFU roof")]


def test_a_point_above_the_measured_roof_is_marked_and_explained():
    # 6% above the 3000 GB/s read roof
    section = retimed(fixture_section(with_ncu=False), "vectorized", "forward", median_ms=8 * N / 3000e9 * 1e3 / 1.06)
    ax = roofline.plot_roofline(section).axes[0]
    texts = [t.get_text() for t in ax.texts]
    assert "vectorized (fwd) +6% over the read roof" in texts
    note = next(t for t in texts if t.startswith("+x% over the read roof"))
    assert "best of a large torch.sum and a two-stream read kernel" in " ".join(note.split())
    assert "datasheet peak" in note
    clean = roofline.plot_roofline(fixture_section(with_ncu=False)).axes[0]
    assert not any(t.get_text().startswith("+x%") for t in clean.texts)


def test_each_point_uses_its_own_dtypes_bytes_and_never_float32_traffic():
    section = retimed(fixture_section(), dtype="bfloat16")  # a bf16-only section: its bytes are half of float32's
    pts = {(p.implementation, p.direction): p for p in roofline.points(section)}
    assert pts["vectorized", "forward"].intensity == pytest.approx(1.0)  # 4 FLOP per 2 x 2 bytes
    assert all(p.measured_bytes is None for p in pts.values())  # ncu profiled float32 only


def test_the_roofline_notebook_draws_every_problem_by_default():
    import ast

    import nbformat

    nb = nbformat.read(roofline.records.files.ROOT / "notebooks" / "03_roofline.ipynb", as_version=4)
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    values = {t.id: ast.literal_eval(s.value) for s in ast.parse(cell.source).body for t in s.targets}
    assert values["problem_names"] is None, "None: every registered problem, a loss added later included"
    assert any("list(problems.names()) if problem_names is None" in c.source for c in nb.cells)
