"""Measured results and the records of them: ``reports/results/<device>.json``, one file per device.

The API (typed; what ``present`` and ``teach`` read and measure through)::

    section = records.measure_section("kl_div", "seed", dtypes=("float32", "bfloat16"))  # GPU, not saved
    records.save_section("kl_div", section)       # ADDS to the device's record (merged, see merge())
    records.save_section("kl_div", section, replace=True)  # a full re-record: no older row stays
    records.combine([a, b])                       # sections measured apart in this process, as one
    section = records.latest_section("kl_div")    # newest recorded Section (device: a name or a slug)
    section.rows, section.checks                  # list[BenchRow], list[CheckResult], every size and dtype
    section.view()                                # one shape and dtype: the seed size and float32 if held
    section.sweep("bfloat16", "forward")          # list[SweepLine]: one line per implementation over sizes
    section.ncu.find("naive", "forward")          # measure.ncu.Counters: DRAM bytes, sectors per request, ...
    sweep = records.measure_sweep("cross_entropy", dtypes=("float32", "bfloat16"))  # GPU: launch-bound to LLM
    records.load_records(), records.load(path)    # list[Record], Record (device, sections)
    records.devices(), records.resolve_device("nvidia-h200")   # recorded device names
    records.sources_sha256("kl_div")              # what a measurement depends on (freshness)

One module per job: ``section`` (the Section and merging), ``files`` (reading and atomic
writing of the record files), ``freshness`` (the sources hash), ``measuring`` (making a section
on the GPU). Each row and check carries what produced it (``date``, ``torch``, ``cuda``,
``sources_sha256``), so rows from several runs live in one section; ``source`` is "live" for a
section measured now, "recorded" for one read from a file. A record of the older, pre-typed
format (schema 1: provenance and bandwidth per section, rows per dtype) is refused with a one-line
:class:`RecordError` naming the file: re-record it.
"""
from losslab.measure.bench import BenchRow, Skipped
from losslab.measure.check import CheckResult
from losslab.measure.ncu import Counters, Profile
from losslab.records.files import (
    RESULTS_DIR,
    SCHEMA,
    Record,
    RecordError,
    device_slug,
    devices,
    is_fresh,
    latest_section,
    load,
    load_records,
    record_path,
    resolve_device,
    save_section,
    write_json,
)
from losslab.records.freshness import measured_sources, pitfall_sources_sha256, sources_sha256
from losslab.records.measuring import DTYPES, measure_section, measure_sweep, run_provenance
from losslab.records.section import Section, SweepLine, SweepPoint, combine, merge

__all__ = ["RESULTS_DIR", "SCHEMA", "DTYPES", "BenchRow", "CheckResult", "Counters", "Profile", "Record",
           "RecordError", "Section", "Skipped", "SweepLine", "SweepPoint", "combine", "device_slug", "devices",
           "is_fresh", "latest_section", "load", "load_records", "measure_section", "measure_sweep",
           "measured_sources", "merge", "pitfall_sources_sha256", "record_path", "resolve_device",
           "run_provenance", "save_section", "sources_sha256", "write_json"]
