"""Measured results and the records of them: ``reports/results/<device>.json``, one file per device.

The typed API ``present`` and ``teach`` read and measure through, re-exported here; e.g.
``records.latest_section("kl_div").view()``: the newest recorded Section, at the seed size in float32.
One module per job: ``section`` (the Section and merging), ``files`` (reading the record files, and
writing them atomically: :func:`save_section` adds to a record), ``freshness`` (the sources hash),
``measuring`` (making a section on the GPU: :func:`measure_section`, :func:`measure_sweep`). A record
of the older, pre-typed format is refused with a one-line :class:`RecordError`: re-record it.
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
