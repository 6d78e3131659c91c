"""The explorer (losslab.teach.explorer, notebook 04): filtering the record, measuring only what
is new, the widget re-rendering in place, a launch note that states what the kernels do (once),
the cost model in the chosen dtype, x rung below against the ladder's rung below, Liger's
near-empty backward explained, and sweeps over sizes (recorded and live)."""
import dataclasses

import pytest
import torch

from losslab import build, problems, records
from losslab.teach import explorer


def test_explorer_filters_the_record(recorded_dir):
    ex = explorer.Explorer(live=False, results_dir=recorded_dir)
    section = ex.section(explorer.Selection("kl_div", ("naive", "vectorized"), "seed"))
    assert {r.implementation for r in section.rows} == {"naive", "vectorized", "eager", "compile"}
    assert {c.variant for c in section.checks} <= {"naive", "vectorized"}
    items = ex.render(explorer.Selection("kl_div", ("vectorized",), "small"))
    assert "applies to the cost model only" in items[0].plain
    assert "128x4096" in items[1] and len(items) == 9  # note, cost model, table, chart, roofline, knobs, counters x3


def test_explorer_without_record_shows_the_model_only(results_dir):
    items = explorer.Explorer(live=False, results_dir=results_dir).render(explorer.Selection("kl_div", ("naive",),
                                                                                             "odd"))
    assert "only the cost model" in items[0].plain and len(items) == 6  # note, cost model, knobs, counters x3
    assert "No record to compare with" in items[2].plain and "no counters" in items[4].plain


def test_explorer_measures_only_what_is_new(monkeypatch):
    """Live, each (implementation, shape, dtype) is measured once: changing the selection
    measures only what it adds, and the speedups span separately measured rows."""
    import losslab.measure.ceilings
    from losslab.measure.bench import BenchRow

    calls = []

    def fake_measure(problem, size, *, variants, peers, dtypes, **kwargs):
        problem = problems.get(problem).name  # a Problem, or a knob configuration's name
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
    assert controls["repeats"].continuous_update is False
    assert box.children[-1].layout.height is None  # sized to its content, not a fixed scroll box
    launch = [w for w in walk(box) if "Launch configuration" in str(getattr(w, "value", ""))]
    assert len(launch) == 1  # once, above the outputs
    controls["sweep sizes"].value = True
    assert shown[-1].sweep is True


def test_block_sizes_are_read_from_the_kernel_files(tmp_path, monkeypatch):
    (tmp_path / "kl_div").mkdir()
    (tmp_path / "kl_div" / "naive.cu").write_text(
        "#ifndef LOSSLAB_KL_DIV_NAIVE_THREADS\n#define LOSSLAB_KL_DIV_NAIVE_THREADS 64  // threads per block: 32 64\n"
        "#endif\n")
    (tmp_path / "kl_div" / "vectorized.cu").write_text(
        "#ifndef LOSSLAB_KL_DIV_VECTORIZED_WARPS\n#define LOSSLAB_KL_DIV_VECTORIZED_WARPS 8  // rows per block: 4 8\n"
        "#endif\nconstexpr int THREADS = 32 * WARPS;\n")
    (tmp_path / "kl_div" / "fused.cu").write_text("constexpr int BLOCK = 128;\n")
    monkeypatch.setattr(build.knobs, "KERNELS", tmp_path)
    assert explorer.block_sizes("kl_div", ("naive", "vectorized", "fused", "warp_shuffle")) == {
        "naive": "64", "vectorized": "256 (32 x WARPS=8)"}
    note = explorer.launch_note("kl_div", ("naive", "fused"))
    assert "(defaults: naive 64)" in note and "fused" not in note and "custom.compile_variant" in note


@pytest.mark.parametrize("problem", problems.names())
def test_the_launch_note_names_every_rungs_block_size(problem):
    """Every shipped rung fixes its block size in its file, so the note states each one."""
    variants = problems.get(problem).variants
    assert set(explorer.block_sizes(problem, variants)) == set(variants)
    assert "nothing to choose here yet" not in explorer.launch_note(problem, variants)


# --- helpers for the tests below ----------------------------------------------------------------------

def _recorded(make_section, problem="kl_div", device="Fixture GPU") -> records.Section:
    """The fixture section: a recorded Section (no floor flags on a device without a datasheet)."""
    return make_section(problem, device)


def _explorer_on(section: records.Section, **kwargs) -> explorer.Explorer:
    ex = explorer.Explorer(live=False, **kwargs)
    ex._recorded[section.problem] = section
    return ex


def _at_shapes(section: records.Section, shapes) -> records.Section:
    """``section``'s rows copied to each of ``shapes``, times scaled with the elements (a sweep)."""
    seed = section.rows[0].shape
    rows = []
    for shape in shapes:
        scale = shape[0] * shape[1] / (seed[0] * seed[1])
        rows += [dataclasses.replace(r, shape=tuple(shape), median_ms=r.median_ms * scale, speedup=dict(r.speedup))
                 for r in section.rows]
    return dataclasses.replace(section, rows=rows)


def _displayed(monkeypatch) -> list:
    import IPython.display

    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda *items: shown.extend(items))
    return shown


# --- the launch note, once ------------------------------------------------------------------------------

def test_the_launch_note_is_shown_once_not_per_render(recorded_dir, monkeypatch):
    ex = explorer.Explorer(live=False, results_dir=recorded_dir)
    sel = explorer.Selection("kl_div", ("naive", "vectorized"), "seed")
    assert not any("Launch configuration" in getattr(i, "plain", "") for i in ex.render(sel))
    shown = _displayed(monkeypatch)
    ex.show(sel)
    assert sum("Launch configuration" in getattr(i, "plain", "") for i in shown) == 1
    assert "Launch configuration" in shown[0].plain


# --- the cost model follows the dtype --------------------------------------------------------------------

def test_the_cost_table_follows_the_dtype_and_the_measured_bandwidth(make_section):
    ex = _explorer_on(_recorded(make_section))
    tables = {d: ex.render(explorer.Selection("kl_div", ("vectorized",), "seed", d))[1]
              for d in ("float32", "bfloat16")}
    assert "16384x16384 bfloat16" in tables["bfloat16"] and "16384x16384 float32" in tables["float32"]
    assert "512.00 MiB" in tables["bfloat16"] and "1.00 GiB" in tables["float32"]  # one input, half the bytes
    assert "floor ms (measured bw)" in tables["bfloat16"] and "read 1000 GB/s" in tables["bfloat16"]


# --- x rung below ------------------------------------------------------------------------------------------

def _step_column(table: str, implementation: str, direction: str = "forward") -> str:
    row = next(r for r in table.split("<tr>") if f"<b>{implementation}</b>" in r and f">{direction}<" in r)
    return row.split("<td")[-1].split(">", 1)[1].split("<")[0]


def test_x_rung_below_is_the_ladders_rung_below_not_the_previous_selection(make_section):
    """vectorized (1 ms) over warp_shuffle (1 ms) is x1.00, though only naive (100 ms) is selected below it."""
    ex = _explorer_on(_recorded(make_section))
    sel = explorer.Selection("kl_div", ("naive", "vectorized"), "seed")
    table = ex.render(sel)[2]
    assert _step_column(table, "vectorized") == "1.00" and _step_column(table, "naive") == ""
    assert "warp_shuffle" not in {r.implementation for r in ex.section(sel).rows}  # looked up, not shown


def test_x_rung_below_measures_the_rung_below_live(monkeypatch):
    calls = _fake_live(monkeypatch)
    ex = explorer.Explorer(live=True, peers=("eager",))
    items = ex.render(explorer.Selection("kl_div", ("vectorized",), "small"))
    assert set(calls) == {"vectorized", "eager", "warp_shuffle"}
    assert _step_column(items[2], "vectorized") == "3.00"  # warp_shuffle 3 ms / vectorized 1 ms


# --- Liger's near-empty backward ---------------------------------------------------------------------------

def test_ligers_near_empty_backward_is_explained_where_it_appears(make_section):
    section = _recorded(make_section, "cross_entropy")
    eager = [r for r in section.rows if r.implementation == "eager"]
    liger = [dataclasses.replace(r, implementation="liger", speedup={}) for r in eager]
    backward = next(r for r in liger if r.direction == "backward")
    backward.median_ms, backward.below_floor, backward.floor_note = 0.01, True, "0.010 ms is below the physical floor"
    ex = _explorer_on(dataclasses.replace(section, rows=section.rows + liger))
    shown = [getattr(i, "plain", None) or getattr(i, "data", "")
             for i in ex.render(explorer.Selection("cross_entropy", ("fused",), "seed"))]
    note = next(p for p in shown if p.startswith("**liger backward**"))
    assert "writes the gradient in its forward" in note and "timed at 0.010 ms, below the physical floor" in note
    assert "almost nothing" not in note  # issue 26: on the H100 it timed a copy's worth of host wait
    without = _explorer_on(section).render(explorer.Selection("cross_entropy", ("fused",), "seed"))
    assert not any(str(getattr(i, "data", "")).startswith("**liger backward") for i in without)


# --- sweeps over sizes -------------------------------------------------------------------------------------

SHAPES = ((128, 4096), (2048, 16384), (16384, 16384))


def test_a_recorded_sweep_plots_time_and_bandwidth_against_size(make_section):
    ex = _explorer_on(_at_shapes(_recorded(make_section), SHAPES))
    sel = explorer.Selection("kl_div", ("naive", "vectorized"), "seed", sweep=True)
    items = ex.render(sel)
    without = ex.render(dataclasses.replace(sel, sweep=False))
    figures = items[len(without):]
    assert len(figures) == 2 and all(hasattr(f, "axes") for f in figures)  # forward, forward_backward
    assert "forward" in figures[0].get_suptitle() and "forward_backward" in figures[1].get_suptitle()
    time_ax, fraction_ax = figures[0].axes
    labels = [line.get_label() for line in time_ax.get_lines() if not line.get_label().startswith("_")]
    assert labels == ["naive", "vectorized", "eager", "compile"]  # one line per implementation, selected only
    assert all(len(line.get_xdata()) == len(SHAPES) for line in time_ax.get_lines()[:4])
    assert {ax.get_xscale() for ax in figures[0].axes} == {"log"}  # size: every shape a tick (issue 26)
    assert [ax.get_yscale() for ax in figures[0].axes] == ["log", "linear"]  # ms, then % of bandwidth
    assert "bandwidth" in fraction_ax.get_ylabel()


def test_a_sweep_of_a_one_size_record_says_how_to_record_more(make_section):
    items = _explorer_on(_recorded(make_section)).sweep_items(
        explorer.Selection("kl_div", ("vectorized",), "seed", sweep=True))
    assert len(items) == 1 and "at one size only" in items[0].plain and "bench kl_div --sweep" in items[0].plain


def _fake_live(monkeypatch) -> list:
    """records.measure_section replaced by one that returns a made-up row per implementation
    (warp_shuffle 3 ms, eager 2 ms, the rest 1 ms) and logs the implementation it measured."""
    import losslab.measure.ceilings
    from losslab.measure.bench import BenchRow

    calls = []
    ms_of = {"warp_shuffle": 3.0, "eager": 2.0}

    def fake_measure(problem, size, *, variants, peers, dtypes, **kwargs):
        problem = problems.get(problem).name  # a Problem, or a knob configuration's name
        name = (variants or list(peers))[0]
        calls.append(name)
        ms = ms_of.get(name, 1.0)
        rows = [BenchRow(problem, name, "peer" if peers else "variant", d, tuple(size), dtypes[0], ms, ms, ms, 3,
                         1.0, "read", 0.5, 0, 0.0) for d in problems.DIRECTIONS]
        return records.Section(problem, "Fake GPU", rows=rows, ceilings={"read_gbps": 10.0, "copy_gbps": 10.0},
                               source="live")

    monkeypatch.setattr(records, "measure_section", fake_measure)
    monkeypatch.setattr(losslab.measure.ceilings, "measure_ceilings", lambda: {"read_gbps": 10.0, "copy_gbps": 10.0})
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (80 * 2**30, 80 * 2**30))
    return calls


def test_a_live_sweep_measures_each_size_once_and_skips_what_a_sweep_skips(monkeypatch):
    calls = _fake_live(monkeypatch)
    shapes = ((128, 4096), (2048, 16384), (2048, 131072))
    ex = explorer.Explorer(live=True, peers=("eager",), sweep_shapes={"kl_div": shapes})
    sel = explorer.Selection("kl_div", ("naive", "vectorized"), "small", sweep=True)
    section, skipped = ex.sweep_section(sel)
    assert sorted(section.shapes) == sorted(shapes) and calls.count("vectorized") == 3 and calls.count("naive") == 2
    assert [(s.shape, s.implementation) for s in skipped] == [((2048, 131072), "naive")]  # hopeless there
    measured = ex.measurements
    items = ex.sweep_items(sel)
    assert ex.measurements == measured  # cached
    assert "Left out of the sweep" in items[-1].plain and "2048x131072 naive" in items[-1].plain
    line = next(ln for ln in section.sweep("float32", "forward") if ln.implementation == "vectorized")
    assert [p.shape for p in line.points] == list(shapes)


# --- launch knobs and the recorded counters ------------------------------------------------------------

def test_without_a_gpu_the_knobs_section_explains_and_shows_the_defaults_only(make_section):
    section = _recorded(make_section)
    sel = explorer.Selection("kl_div", ("warp_shuffle", "vectorized"), "seed",
                             knobs=[("vectorized", {"THREADS": 512})])
    text = _explorer_on(section).knobs_html(sel).plain
    assert "vectorized THREADS=256 (threads per block); vectorized UNROLL=4" in text  # the kernel files' defaults
    assert "No GPU here: nothing is built or timed" in text and "-DLOSSLAB_<PROBLEM>_<RUNG>_<KNOB>=<value>" in text
    assert "Asked for, not timed here: vectorized [THREADS=512, UNROLL=4]." in text
    assert "ran the defaults above: the record was made from these kernel files" in text  # the fixture is fresh
    assert " ms" not in text  # no time for a configuration that was not measured


def test_a_selections_knobs_are_checked_in_one_line():
    sel = explorer.Selection("kl_div", ("vectorized",), "seed", knobs=[("vectorized", {"THREADS": 100})])
    with pytest.raises(ValueError, match=r"^THREADS \(threads per block of kl_div vectorized\): 100 is not offered"):
        sel.configs()
    assert explorer.Selection("kl_div", ("vectorized",), "seed", knobs=[("vectorized", {"UNROLL": 8})] * 2).knobs \
        == (("vectorized", (("UNROLL", 8),)),) * 2


def test_live_a_configuration_is_built_then_timed_once_labelled_with_its_knobs(monkeypatch):
    import losslab.measure.ceilings
    from losslab.measure.bench import BenchRow

    built, timed = [], []
    monkeypatch.setattr(build, "load_extension", lambda problem, defines=(): built.append(defines))

    def fake_measure(problem, size, *, variants, peers, dtypes, **kwargs):
        problem = problems.get(problem).name  # a Problem, or a knob configuration's name
        name = getattr(variants[0], "name", variants[0]) if variants else peers[0]
        timed.append(name)
        ms = {"eager": 2.0, "vectorized": 1.0, "vectorized [THREADS=128, UNROLL=4]": 0.5}.get(name, 0.25)
        row = BenchRow(problem, name, "peer" if peers else "variant", "forward", tuple(size), dtypes[0],
                       ms, ms, ms, 3, 1.0, "read", 0.1, 0, 0.0)
        return records.Section(problem, "Fake GPU", rows=[row], source="live")

    monkeypatch.setattr(records, "measure_section", fake_measure)
    monkeypatch.setattr(losslab.measure.ceilings, "measure_ceilings", lambda: {"read_gbps": 10.0, "copy_gbps": 10.0})
    ex = explorer.Explorer(live=True, peers=("eager",))
    sel = explorer.Selection("kl_div", ("vectorized",), "small",
                             knobs=[("vectorized", {"THREADS": 512}), ("vectorized", {"THREADS": 128})])
    section = ex.section(sel)
    ex.section(sel)
    label = "vectorized [THREADS=512, UNROLL=4]"
    assert timed == ["vectorized", "eager", label, "vectorized [THREADS=128, UNROLL=4]"]
    assert built == [(("LOSSLAB_KL_DIV_VECTORIZED_THREADS", 512),), (("LOSSLAB_KL_DIV_VECTORIZED_THREADS", 128),)]
    row = next(r for r in section.rows if r.implementation == label)
    assert row.speedup == {"eager": 8.0}
    html = str(explorer.tables.timing_table(dataclasses.replace(section, ceilings={"read_gbps": 10.0,
                                                                                    "copy_gbps": 10.0})))
    assert html.index(">vectorized<") < html.index(label) < html.rindex("eager")  # right after its rung
    # x rung below of a configuration: against the rung's default build (4.00, 2.00), not the row above (0.50)
    assert ">4.00<" in html and ">0.50<" not in html
    assert f"Configurations timed here: {label}, vectorized [THREADS=128, UNROLL=4]." in ex.knobs_html(sel).plain


def test_the_knob_controls_add_a_configuration_live_and_are_disabled_without_a_gpu(recorded_dir, monkeypatch):
    pytest.importorskip("ipywidgets")

    def controls(ex):
        shown = []
        monkeypatch.setattr(ex, "render", lambda sel: shown.append(sel) or [])
        box = ex.widget(explorer.Selection("kl_div", ("naive", "vectorized"), "seed"))
        found, todo = {}, [box]
        while todo:
            widget = todo.pop()
            found.setdefault(getattr(widget, "description", ""), widget)
            todo += list(getattr(widget, "children", ()))
        return found, shown

    found, shown = controls(explorer.Explorer(live=True))
    assert found["knobs of"].options == ("naive", "vectorized") and found["knobs of"].value == "vectorized"
    found["THREADS"].value = 512
    found["build and time"].click()
    assert shown[-1].knobs == (("vectorized", (("THREADS", 512), ("UNROLL", 4))),)
    found, _ = controls(explorer.Explorer(live=False, results_dir=recorded_dir))
    assert found["build and time"].disabled and found["THREADS"].disabled


def test_the_counters_of_the_selected_rungs_come_from_the_record_with_their_meaning(make_section):
    section = _recorded(make_section)
    section.ncu = records.Profile("ok", shape=list(section.primary_shape), records=[
        records.Counters(rung, "variant", "forward", load_requests=10.0, load_sectors=sectors, barriers=0.0)
        for rung, sectors in (("naive", 320.0), ("shared_memory", 40.0))])
    intro, forward, backward = _explorer_on(section).counters_items(
        explorer.Selection("kl_div", ("naive",), "seed"))
    assert "from the record (Fixture GPU" in intro.plain
    assert "sectors_per_request: naive 32 (sectors per load request: 4 when a warp reads 128" in forward.plain
    assert "shared_memory" not in forward.plain  # not selected
    assert "what it says" in str(forward) and "not recorded" in backward.plain.lower()


def test_a_size_the_record_holds_in_another_dtype_only_falls_back_to_the_records_size(make_section):
    """float16 recorded at the seed size only, float32 also at 'small': float16 at 'small' shows the
    seed size's float16 rows and says why, not an empty table."""
    section = make_section()
    small = tuple(problems.get("kl_div").sizes["small"])
    section.rows += [dataclasses.replace(r, shape=small, speedup=dict(r.speedup)) for r in list(section.rows)]
    section.rows += [dataclasses.replace(r, dtype="float16", speedup=dict(r.speedup)) for r in section.rows
                     if tuple(r.shape) != small and r.implementation in ("vectorized", "fused", "eager")]
    ex = _explorer_on(section)
    shown = ex.section(explorer.Selection("kl_div", ("vectorized",), "small", "float16"))
    assert {(tuple(r.shape), r.dtype) for r in shown.rows} == {(section.primary_shape, "float16")}
    assert "holds no float16 rows at the size 'small' (128x4096)" in ex.note(
        explorer.Selection("kl_div", ("vectorized",), "small", "float16"), shown).plain
    assert {tuple(r.shape) for r in ex.section(explorer.Selection("kl_div", ("vectorized",), "small")).rows} == {small}


def test_no_rung_selected_says_so_instead_of_not_recorded(make_section):
    items = _explorer_on(make_section()).render(explorer.Selection("kl_div", (), "seed"))
    text = "\n".join(getattr(i, "plain", "") for i in items)
    assert "No rung selected: the peers only." in items[0].plain
    assert "no rung selected, so no counters" in text and "not recorded" not in text.lower()


def test_the_counters_say_what_a_rung_that_writes_its_gradient_in_the_forward_runs(make_section):
    """fused's forward, run without a gradient, is vectorized's kernel, and its backward only scales
    the gradient: said once for the rungs selected that do so, and nothing for those that do not."""
    ex = _explorer_on(make_section("cross_entropy"))
    intro = ex.counters_items(explorer.Selection("cross_entropy", ("vectorized", "fused", "cluster"), "seed"))[0]
    assert "fused and cluster write the gradient in the forward" in intro.plain
    assert "vectorized's forward kernel runs" in intro.plain and intro.plain.count("scales") == 1
    plain = ex.counters_items(explorer.Selection("cross_entropy", ("naive", "vectorized"), "seed"))[0].plain
    assert "gradient" not in plain
