"""The workbook runs headless (cpu tier): every notebook executes under papermill, is
committed clean, and `build_report` produces a browsable report; and the helpers the
notebooks call (losslab.workbook) render what they promise.

The sections below are test fixtures with made-up round numbers, written only to tmp
folders to exercise the rendering; they are never written under reports/.
"""
import ast
import html
import re
from pathlib import Path

import pytest
import torch
from matplotlib.figure import Figure

REASON = "notebook tests need nbformat and papermill (pip install -r requirements.txt)"
nbformat = pytest.importorskip("nbformat", reason=REASON)
papermill = pytest.importorskip("papermill", reason=REASON)

from losslab import problems, records  # noqa: E402 (after the skips)
from losslab.measure.bench import BenchRow  # noqa: E402
from losslab.measure.check import CheckResult  # noqa: E402
from losslab.present import report, workbook  # noqa: E402

NOTEBOOKS = report.notebooks()
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def fixture_section(problem: str = "kl_div", device: str = "Fixture GPU", fresh: bool = True) -> dict:
    """A recorded section shaped like `python -m losslab bench` writes, with made-up times:
    naive 100 ms, the other rungs ~1 ms; one failing check (naive, backward, the first case)."""
    spec = problems.get(problem)
    shape = spec.sizes["seed"]
    bandwidth = {"read": 1000.0, "copy": 900.0}
    times = {**{v: 1.0 for v in spec.variants}, "naive": 100.0, "eager": 4.0, "compile": 2.0}
    rows = []
    for name, ms in times.items():
        for direction in problems.DIRECTIONS:
            cost = spec.cost(shape, direction)
            ceiling = workbook.ceiling_for(problem, shape, direction)
            gbps = cost.bytes / ms / 1e6
            rows.append(BenchRow(problem, name, "peer" if name in ("eager", "compile") else "variant", direction,
                                 shape, "float32", ms, ms, ms, 20, gbps, ceiling, gbps / bandwidth[ceiling],
                                 2**20, 1e-7))
    for row in rows:
        row.speedup = {p.implementation: p.median_ms / row.median_ms for p in rows
                       if p.kind == "peer" and p.direction == row.direction and p is not row}
    cases = ["random 3x1000", "B = 1 (one row)"]
    checks = [CheckResult(problem, v, case, (3, 1000), d, 1e-8, 1e-5, True)
              for v in spec.variants for case in cases for d in ("forward", "backward")]
    checks[1] = CheckResult(problem, "naive", cases[0], (3, 1000), "backward", 1.0, 1e-6, False, "fixture failure")
    return {"device": device, "date": "2000-01-01T00:00:00+00:00", "torch": "fixture", "cuda": "fixture",
            "kernels_sha256": records.kernels_sha256(problem) if fresh else "0" * 64, "shape": list(shape),
            "dtype": "float32", "repeats": 20, "bandwidth_gbps": bandwidth,
            "rows": [r.as_dict() for r in rows], "checks": [c.as_dict() for c in checks]}


@pytest.fixture
def recorded_dir(tmp_path) -> Path:
    """A results folder holding one fixture record for kl_div."""
    records.save_section("kl_div", fixture_section(), tmp_path)
    return tmp_path


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """`build_report` run once into a tmp folder (with whatever reports/results/ holds now)."""
    out = tmp_path_factory.mktemp("reports")
    report.build_report(out)
    return out


def outputs(nb):
    return [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]


def all_text(nb) -> str:
    return "\n".join(o.get("text", "") + "".join(o.get("data", {}).get(k, "") for k in ("text/html", "text/plain"))
                     for o in outputs(nb))


# --- the committed notebooks ------------------------------------------------------------------

def test_there_are_notebooks():
    assert any(p.name == "01_kl_div.ipynb" for p in NOTEBOOKS)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_clean(path):
    """Valid nbformat 4, no outputs, no execution counts (executed copies go to reports/)."""
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{path.name} has outputs"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_one_parameters_cell_of_literals(path):
    """Exactly one `parameters`-tagged cell, holding only `name = literal` (papermill
    replaces it; derived values belong in the next cell)."""
    nb = nbformat.read(path, as_version=4)
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1
    for statement in ast.parse(tagged[0].source).body:
        assert isinstance(statement, ast.Assign), ast.unparse(statement)
        ast.literal_eval(statement.value)


# --- executed headless, and the report ----------------------------------------------------------

@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_executes_headless(built, path):
    executed = nbformat.read(built / f"{path.stem}.ipynb", as_version=4)
    errors = [o for o in outputs(executed) if o.output_type == "error"]
    assert not errors, errors[0].get("evalue") if errors else ""
    assert (built / f"{path.stem}.html").stat().st_size > 0


def test_report_never_writes_notebooks(tmp_path):
    with pytest.raises(ValueError, match="notebooks"):
        report.build_report(report.NOTEBOOKS / "out")


def test_index_links_every_notebook_and_figure(built):
    index = (built / "index.html").read_text()
    for path in NOTEBOOKS:
        assert f'href="{path.stem}.html"' in index
    for figure in (built / "figures").glob("*.png"):
        assert f'figures/{figure.name}' in index


def test_figures_are_png_images(built):
    figures = sorted((built / "figures").glob("*.png"))
    assert figures, "no figures extracted"
    assert any(f.name.startswith("01_kl_div_") for f in figures)
    for figure in figures:
        data = figure.read_bytes()
        assert data.startswith(PNG_SIGNATURE) and len(data) > 1024, figure.name


def test_index_states_what_the_notebooks_show(built):
    """With a record: its device, date and kernel hash; without one: that there is none."""
    index = (built / "index.html").read_text()
    try:
        section = records.latest_section("kl_div")
    except LookupError:
        assert "no results recorded yet" in index
    else:
        assert section["device"] in index and section["kernels_sha256"][:12] in index


def test_notebook_renders_a_record(recorded_dir, tmp_path):
    """01 on a fixture record: the banner names it as recorded, the tables and the chart appear."""
    out = tmp_path / "out.ipynb"
    papermill.execute_notebook(str(report.NOTEBOOKS / "01_kl_div.ipynb"), str(out), kernel_name=report.KERNEL_NAME,
                               parameters={"results_dir": str(recorded_dir), "live": False}, progress_bar=False)
    executed = nbformat.read(out, as_version=4)
    text = all_text(executed)
    assert "RECORDED results" in text and "Fixture GPU" in text and "2000-01-01" in text
    passed, total = map(int, re.search(r"(\d+) of (\d+) checks passed", text).groups())
    assert passed == total - 1 and "median of 20 calls" in text
    assert sum("image/png" in o.get("data", {}) for o in outputs(executed)) == 2  # chart + coalescing figure
    assert report.shown_results(executed)[0]["device"] == "Fixture GPU"


# --- workbook: results and provenance -------------------------------------------------------------

def test_no_record_gives_none_and_says_so(tmp_path):
    assert workbook.load_results("kl_div", live=False, results_dir=tmp_path) is None
    text = workbook.banner(None, "kl_div").plain
    assert "No recorded results yet for kl_div" in text
    for render in (workbook.check_table, workbook.timing_table, workbook.bandwidth_chart, workbook.measured_floor):
        assert "No results yet" in render(None)


def test_load_recorded(recorded_dir):
    section = workbook.load_results("kl_div", live=False, results_dir=recorded_dir)
    assert section["source"] == "recorded" and section["problem"] == "kl_div"
    assert section["device"] == "Fixture GPU"
    # a device by its file-name slug; an unknown device has no record
    assert workbook.load_results("kl_div", device="fixture-gpu", live=False, results_dir=recorded_dir)
    assert workbook.load_results("kl_div", device="Other GPU", live=False, results_dir=recorded_dir) is None


def test_load_recorded_keeps_the_variants_asked_for(recorded_dir):
    section = workbook.load_results("kl_div", variants=["vectorized"], live=False, results_dir=recorded_dir)
    assert {r["implementation"] for r in section["rows"]} == {"vectorized", "eager", "compile"}
    assert {c["variant"] for c in section["checks"]} == {"vectorized"}


def test_load_rejects_unknown_names():
    with pytest.raises(ValueError, match="size"):
        workbook.load_results("kl_div", size="huge", live=False)
    with pytest.raises(ValueError, match="variant"):
        workbook.load_results("kl_div", variants=["fastest"], live=False)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised without a GPU")
def test_live_without_gpu_says_why():
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        workbook.load_results("kl_div", live=True)


def test_banner_states_source_device_date_and_freshness(tmp_path):
    fresh = {**fixture_section(), "problem": "kl_div", "source": "recorded"}
    text = workbook.banner(fresh, "kl_div").plain
    assert text.startswith("RECORDED results") and "Fixture GPU" in text and "2000-01-01 00:00 UTC" in text
    assert "matches kernels/" in text and "NOT" not in text
    stale = {**fixture_section(fresh=False), "problem": "kl_div", "source": "recorded"}
    assert "does NOT match kernels/" in workbook.banner(stale, "kl_div").plain
    live = {**fresh, "source": "live"}
    assert workbook.banner(live, "kl_div").plain.startswith("LIVE results")
    # the provenance travels in the output's metadata, where the report reads it
    _, metadata = workbook.banner(fresh, "kl_div")._repr_mimebundle_()
    assert metadata[workbook.METADATA_KEY]["fresh"] is True


def test_banner_notes_a_size_the_record_was_not_taken_at():
    section = {**fixture_section(), "problem": "kl_div", "source": "recorded"}
    assert "applies to live runs only" in workbook.banner(section, "kl_div", "small").plain
    assert "applies to live runs only" not in workbook.banner(section, "kl_div", "seed").plain


# --- workbook: the ladder and the model ---------------------------------------------------------------

@pytest.mark.parametrize("left,right", [("naive", "shared_memory"), ("warp_shuffle", "vectorized")])
def test_side_by_side_shows_both_sources_escaped(left, right):
    page = workbook.side_by_side("kl_div", left, right)
    for variant in (left, right):
        source = workbook.kernel_source("kl_div", variant)
        assert f"kernels/kl_div/{variant}.cu" in page
        assert html.escape(source.splitlines()[0]) in page  # the header comment names the rung
    assert "#include &quot;kl_div.cuh&quot;" in page and '#include "' not in page
    assert page.index(left) < page.index(right)


def test_side_by_side_rejects_unknown_variant():
    with pytest.raises(ValueError, match="variant"):
        workbook.side_by_side("kl_div", "naive", "magic")


@pytest.mark.parametrize("problem,variant", [(p, v) for p in problems.names() for v in problems.get(p).variants])
def test_every_rung_opens_with_what_it_fixes(problem, variant):
    assert len(workbook.rung_header(problem, variant)) > 40
    assert workbook.rung_header(problem, variant) in workbook.ladder_summary(problem).plain


def test_cost_table_counts_the_bytes():
    """Forward at the seed size reads 2 x 16384 x 16384 x 4 bytes = 2 GiB."""
    table = workbook.cost_table("kl_div", (16384, 16384))
    assert "2.00 GiB" in table and "ms at 1 TB/s" in table
    measured = workbook.cost_table("kl_div", (16384, 16384), {"read": 1000.0, "copy": 900.0})
    assert "floor ms" in measured and "read 1000 GB/s" in measured


def test_floor_is_bytes_over_bandwidth():
    bandwidth = {"read": 1000.0, "copy": 500.0}
    shape = (16384, 16384)
    forward = problems.get("kl_div").cost(shape, "forward").bytes
    assert workbook.floor_ms("kl_div", shape, "forward", bandwidth) == pytest.approx(forward / 1e12 * 1e3)
    backward = problems.get("kl_div").cost(shape, "backward").bytes
    assert workbook.floor_ms("kl_div", shape, "backward", bandwidth) == pytest.approx(backward / 5e11 * 1e3)


def test_coalescing_figure_counts_lines_and_sectors():
    fig = workbook.coalescing_figure(16384)
    titles = [ax.get_title() for ax in fig.axes]
    assert "32 line(s), 32 sectors fetched: 128 of 1024 bytes used" in titles[0]
    assert "1 line(s), 4 sectors fetched: 128 of 128 bytes used" in titles[1]
    assert "4 line(s), 16 sectors fetched: 512 of 512 bytes used" in titles[2]


# --- workbook: the measurements ---------------------------------------------------------------------

@pytest.fixture
def section():
    return {**fixture_section(), "problem": "kl_div", "source": "recorded"}


def test_check_table_marks_failures(section):
    table = workbook.check_table(section)
    total = 4 * len(problems.get("kl_div").variants)  # two cases, two directions per variant
    assert f"{total - 1} of {total} checks passed" in table
    assert table.count("&#10007;") == 1 and 'title="fixture failure"' in table


def test_timing_table_has_the_columns(section):
    table = workbook.timing_table(section)
    for column in ("median ms", "p10-p90 ms", "GB/s", "of bandwidth", "extra MiB", "&times; eager",
                   "&times; compile", "&times; rung below"):
        assert column in table
    assert "100.00" in table  # shared_memory is 100x the fixture's naive


def test_bandwidth_chart_goes_log_when_naive_is_far_below(section):
    fig = workbook.bandwidth_chart(section)
    assert isinstance(fig, Figure) and len(fig.axes) == len(problems.DIRECTIONS)
    assert fig.axes[0].get_yscale() == "log" and "log scale" in fig.axes[0].get_ylabel()
    lines = {round(line.get_ydata()[0]) for line in fig.axes[0].get_lines()}
    assert lines == {1000, 900}  # the measured read and copy bandwidth


def test_bandwidth_chart_linear_without_naive(section):
    section["rows"] = [r for r in section["rows"] if r["implementation"] != "naive"]
    fig = workbook.bandwidth_chart(section)
    assert fig.axes[0].get_yscale() == "linear"
