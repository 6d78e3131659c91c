"""The explorer (losslab.teach.explorer, notebook 04): filtering the record, measuring only what
is new, the widget re-rendering in place, and a launch note that states what the kernels do."""
import pytest

from losslab import build, problems, records
from losslab.teach import explorer


def test_explorer_filters_the_record(recorded_dir):
    ex = explorer.Explorer(live=False, results_dir=recorded_dir)
    section = ex.section(explorer.Selection("kl_div", ("naive", "vectorized"), "seed"))
    assert {r.implementation for r in section.rows} == {"naive", "vectorized", "eager", "compile"}
    assert {c.variant for c in section.checks} <= {"naive", "vectorized"}
    items = ex.render(explorer.Selection("kl_div", ("vectorized",), "small"))
    assert "applies to the cost model only" in items[0].plain and "Launch configuration" in items[0].plain
    assert "128x4096" in items[1] and len(items) == 5  # note, cost model, table, chart, roofline


def test_explorer_without_record_shows_the_model_only(results_dir):
    items = explorer.Explorer(live=False, results_dir=results_dir).render(explorer.Selection("kl_div", ("naive",),
                                                                                             "odd"))
    assert "only the cost model" in items[0].plain and len(items) == 2


def test_explorer_measures_only_what_is_new(monkeypatch):
    """Live, each (implementation, shape, dtype) is measured once: changing the selection
    measures only what it adds, and the speedups span separately measured rows."""
    import losslab.measure.ceilings
    from losslab.measure.bench import BenchRow

    calls = []

    def fake_measure(problem, size, *, variants, peers, dtypes, **kwargs):
        name = (variants or list(peers))[0]
        calls.append(name)
        ms = 2.0 if name == "eager" else 1.0
        row = BenchRow(problem, name, "peer" if peers else "variant", "forward", tuple(size), dtypes[0],
                       ms, ms, ms, 3, 1.0, "read", 0.1, 0, 0.0)
        return records.Section(problem, "Fake GPU", rows=[row], source="live")

    monkeypatch.setattr(records, "measure_section", fake_measure)
    monkeypatch.setattr(losslab.measure.ceilings, "measure_ceilings", lambda: {"read_gbps": 10.0, "copy_gbps": 10.0})
    ex = explorer.Explorer(live=True, peers=("eager",))
    ex.section(explorer.Selection("kl_div", ("naive", "vectorized"), "small"))
    ex.section(explorer.Selection("kl_div", ("vectorized", "warp_shuffle"), "small"))
    section = ex.section(explorer.Selection("kl_div", ("naive",), "small"))
    assert calls == ["naive", "vectorized", "eager", "warp_shuffle"] and ex.measurements == 4
    naive = next(r for r in section.rows if r.implementation == "naive")
    assert naive.speedup == {"eager": 2.0}
    ex.section(explorer.Selection("kl_div", ("naive",), "odd"))
    assert calls[-2:] == ["naive", "eager"]


def test_explorer_widget_rerenders_in_place(recorded_dir, monkeypatch):
    pytest.importorskip("ipywidgets")
    ex = explorer.Explorer(live=False, results_dir=recorded_dir)
    shown = []
    monkeypatch.setattr(ex, "render", lambda sel: shown.append(sel) or [])
    box = ex.widget(explorer.Selection("kl_div", ("naive",), "seed"))

    def walk(widget):
        yield widget
        for child in getattr(widget, "children", ()):
            yield from walk(child)

    controls = {getattr(w, "description", ""): w for w in walk(box)}
    controls["variants"].value = ("naive", "vectorized")
    controls["problem"].value = "cross_entropy"  # resets the variants, sizes and dtypes: one render
    assert [s.variants for s in shown] == [("naive",), ("naive", "vectorized"),
                                           problems.get("cross_entropy").variants]
    assert controls["repeats"].continuous_update is False and box.children[-1].layout.height


def test_block_sizes_are_read_from_the_kernel_files(tmp_path, monkeypatch):
    (tmp_path / "kl_div").mkdir()
    (tmp_path / "kl_div" / "naive.cu").write_text("constexpr int THREADS = 64;  // one block per row\n")
    (tmp_path / "kl_div" / "vectorized.cu").write_text("constexpr  int  THREADS =  32 * WARPS ;\n")
    (tmp_path / "kl_div" / "fused.cu").write_text("constexpr int BLOCK = 128;\n")
    monkeypatch.setattr(build, "KERNELS", tmp_path)
    assert explorer.block_sizes("kl_div", ("naive", "vectorized", "fused", "warp_shuffle")) == {
        "naive": "64", "vectorized": "32 * WARPS"}
    note = explorer.launch_note("kl_div", ("naive", "fused"))
    assert "(naive 64)" in note and "fused" not in note and "custom.compile_variant" in note


@pytest.mark.parametrize("problem", problems.names())
def test_the_launch_note_names_every_rungs_block_size(problem):
    """Every shipped rung fixes its block size in its file, so the note states each one."""
    variants = problems.get(problem).variants
    assert set(explorer.block_sizes(problem, variants)) == set(variants)
    assert "nothing to choose here yet" not in explorer.launch_note(problem, variants)
