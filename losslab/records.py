"""Measured results and the records of them: ``reports/results/<device>.json``, one file per device.

The API (typed; what ``present`` and ``teach`` read and measure through)::

    section = records.measure_section("kl_div", "seed", dtypes=("float32", "bfloat16"))  # GPU, not saved
    records.save_section("kl_div", section)       # ADDS to the device's record (merged, see merge())
    records.save_section("kl_div", section, replace=True)  # a full re-record: no older row stays
    records.combine([a, b])                       # sections measured apart in this process, as one
    section = records.latest_section("kl_div")    # newest recorded Section (device: a name or a slug)
    section.rows, section.checks                  # list[BenchRow], list[CheckResult], every size and dtype
    section.view()                                # one shape and dtype: the seed size and float32 if held
    section.shapes, section.dtypes, section.is_fresh(), section.source  # "live" or "recorded"
    section.sweep("bfloat16", "forward")          # list[SweepLine]: one line per implementation over sizes
    section.ncu                                   # measure.ncu.Profile: per (implementation, direction)
    section.ncu.find("naive", "forward")          #   Counters: DRAM bytes, sectors per request, active SMs, ...
    sweep = records.measure_sweep("cross_entropy", dtypes=("float32", "bfloat16"))  # GPU: launch-bound to LLM
    records.load_records(), records.load(path)    # list[Record], Record (device, sections)
    records.devices(), records.resolve_device("nvidia-h200")   # recorded device names
    records.sources_sha256("kl_div")              # what a measurement depends on (freshness)
    records.pitfall_sources_sha256([module files])  # the same for a pitfalls record, pitfalls/ included

- :class:`Section`: one problem on one device: device properties, the ceilings and ncu profile
  of the newest run, and every :class:`~losslab.measure.bench.BenchRow` and
  :class:`~losslab.measure.check.CheckResult` measured. Each row and check carries what produced
  it (``date``, ``torch``, ``cuda``, ``sources_sha256``), so rows from several runs can live in
  one section. A newer run replaces rows by (problem, shape, dtype, implementation, direction)
  and checks by (variant, case, direction); everything else is kept: a bench run at another
  size or on a subset of variants adds to the record, never replaces it.
- ``source`` is "live" for a section measured now, "recorded" for one read from a file (it is
  not saved). A row below its physical floor has ``below_floor`` and a ``floor_note``.
- Legacy reading: a Section also answers the old dict keys (``section["rows"]`` = the rows of
  :meth:`Section.view` as dicts, ``"rows_by_dtype"``, ``"shape"``, ``"dtype"``, ``"bandwidth_gbps"``,
  ``"kernels_sha256"``, ...), so ``{**section, ...}`` and notebooks written against the dict
  format keep working. New code uses the attributes.
- Files written before the typed format (no ``"schema"`` key) load too; their rows get the old
  section's provenance, and their hash covers only the kernels, so they read as not fresh.
  A file that is not a record raises :class:`RecordError`, one line naming the file.

Freshness: :func:`sources_sha256` hashes everything that changes a measurement of a problem:
its kernels and ``kernels/common``, the ceiling kernels, the bindings (``losslab/build/csrc``),
the host launch code (``losslab/problems``, ``losslab/ops.py``), and the build code with its
compiler flags. A cpu-tier test fails when the newest record is not fresh.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import inspect
import json
import re
import sys
from collections.abc import Sequence
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path

import torch

from losslab import build, problems
from losslab.build import KERNELS, ROOT
from losslab.measure.bench import (
    SWEEP_DIRECTIONS,
    SWEEP_SHAPES,
    BenchRow,
    Skipped,
    bench_problem,
    flag_physical_floor,
    hopeless_reason,
    set_speedups,
    sweep_memory_bytes,
    sweep_repeats,
)
from losslab.measure.ceilings import measure_ceilings
from losslab.measure.check import CheckResult, check_problem
from losslab.measure.ncu import Counters, Profile, profile_problem
from losslab.measure.peers import PEERS, missing_peers

__all__ = ["RESULTS_DIR", "SCHEMA", "DTYPES", "BenchRow", "CheckResult", "Counters", "Profile", "Record",
           "RecordError", "Section", "Skipped", "SweepLine", "SweepPoint", "measure_sweep",
           "devices", "device_slug", "is_fresh", "latest_section", "load", "load_records", "measure_section",
           "merge", "combine", "pitfall_sources_sha256", "resolve_device", "run_provenance", "save_section",
           "sources_sha256", "measured_sources"]

RESULTS_DIR = ROOT / "reports" / "results"
SCHEMA = 2
DTYPES = ("float32", "bfloat16", "float16")  # input dtypes a bench can time


class RecordError(ValueError):
    """A record file that cannot be read as a record (the message is one line naming the file)."""


# --- freshness ---------------------------------------------------------------------------------------

def _files(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts] if folder.exists() else []


def measured_sources(problem: str, root: Path | None = None) -> list[Path]:
    """Every file a measurement of ``problem`` depends on, sorted: ``kernels/common``,
    ``kernels/<problem>`` and ``kernels/ceilings`` (the bandwidth ceilings the rows are a fraction
    of), the bindings in ``losslab/build/csrc`` (but other problems'), the host launch code in
    ``losslab/problems`` (but other problems' modules) and ``losslab/ops.py``, and the build
    module that holds the compiler flags. ``root``: the repository (default this one)."""
    root = Path(root or ROOT)
    others = set(problems.names()) - {problem}
    kernels = root / KERNELS.relative_to(ROOT)
    builder = Path(inspect.getsourcefile(inspect.unwrap(build.load_extension))).resolve().relative_to(ROOT)
    files = [*_files(kernels / "common"), *_files(kernels / problem), *_files(kernels / "ceilings")]
    files += [p for p in _files(root / build.CSRC.relative_to(ROOT)) if p.stem not in others]
    files += [p for p in _files(root / "losslab" / "problems") if p.suffix == ".py" and p.stem not in others]
    files += [root / "losslab" / "ops.py", root / builder]
    return sorted(set(files))


def _digest(files: Sequence[Path], root: Path, extra: str = "") -> str:
    digest = hashlib.sha256(extra.encode() + b"\0")
    for path in sorted(set(files)):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _flags() -> str:
    """The compiler flags of the extension build, as text (they change the machine code)."""
    return repr([getattr(build, name, None) for name in ("NVCC_FLAGS", "CXX_FLAGS")])


def sources_sha256(problem: str, root: Path | None = None) -> str:
    """sha256 over :func:`measured_sources` (each file's path relative to the repository and its
    bytes) and the compiler flags: equal only when a measurement would run the same code."""
    root = Path(root or ROOT)
    return _digest(measured_sources(problem, root), root, _flags())


def pitfall_sources_sha256(extra: Sequence[Path] = (), root: Path | None = None) -> str:
    """sha256 for a pitfalls record: every problem's :func:`measured_sources`, the pitfall kernels
    under ``pitfalls/``, the flags, and ``extra`` files inside the repository (the modules that
    build and run them)."""
    root = Path(root or ROOT)
    files = [f for p in problems.names() for f in measured_sources(p, root)] + _files(root / "pitfalls")
    files += [root / Path(e).resolve().relative_to(ROOT) for e in extra]
    return _digest(files, root, _flags())


# --- provenance ----------------------------------------------------------------------------------------

def device_slug(name: str) -> str:
    """File-name form of a device name: 'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3'."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def run_provenance(problem: str) -> dict:
    """What a measurement made now is stamped with: device (name, multiprocessors, memory_bytes,
    compute_capability) and the run (torch, cuda, date in UTC ISO 8601, sources_sha256)."""
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return {"device": props.name, "multiprocessors": props.multi_processor_count,
            "memory_bytes": props.total_memory, "compute_capability": f"{props.major}.{props.minor}",
            "torch": torch.__version__, "cuda": torch.version.cuda,
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "sources_sha256": sources_sha256(problem)}


# --- the section ---------------------------------------------------------------------------------------

_ROW_FIELDS = {f.name for f in fields(BenchRow)}
_CHECK_FIELDS = {f.name for f in fields(CheckResult)}
_ROW_REQUIRED = [f.name for f in fields(BenchRow) if f.default is MISSING and f.default_factory is MISSING]
_CHECK_REQUIRED = [f.name for f in fields(CheckResult) if f.default is MISSING and f.default_factory is MISSING]
_LEGACY_KEYS = ("problem", "device", "multiprocessors", "memory_bytes", "compute_capability", "date", "torch",
                "cuda", "kernels_sha256", "sources_sha256", "shape", "dtype", "repeats", "bandwidth_gbps", "rows",
                "rows_by_dtype", "checks", "ceilings", "ncu", "source")


@dataclass
class Section:
    """One problem's results on one device (see the module docstring).

    ``ceilings``: what ``ceilings.measure_ceilings`` returned in the newest run ({} if none);
    ``ncu``: the newest ``ncu.profile_problem`` result (a typed ``measure.ncu.Profile``), or None;
    ``skipped``: the (shape, dtype, implementation) a sweep or bench left out (a hopeless rung, a
    peer that cannot run there), each with its reason (:class:`Skipped`); a measured row of the same
    key removes its entry.
    """

    problem: str
    device: str
    multiprocessors: int = 0
    memory_bytes: int = 0
    compute_capability: str = ""
    rows: list[BenchRow] = field(default_factory=list, repr=False)
    checks: list[CheckResult] = field(default_factory=list, repr=False)
    ceilings: dict = field(default_factory=dict, repr=False)
    ncu: Profile | None = field(default=None, repr=False)
    source: str = "recorded"
    skipped: list[Skipped] = field(default_factory=list, repr=False)

    def __post_init__(self):
        self.ncu = Profile.from_dict(self.ncu)

    # --- what it holds ---
    @property
    def shapes(self) -> list[tuple[int, ...]]:
        """The shapes of the rows, in first-seen order."""
        return list(dict.fromkeys(tuple(r.shape) for r in self.rows))

    @property
    def dtypes(self) -> list[str]:
        """The dtypes of the rows, float32 first, then in first-seen order."""
        found = dict.fromkeys(r.dtype for r in self.rows)
        return sorted(found, key=lambda d: (d != "float32", list(found).index(d)))

    @property
    def primary_shape(self) -> tuple[int, ...] | None:
        """The shape :meth:`view` shows by default: the problem's seed size if held, else the newest rows'."""
        seed = tuple(problems.get(self.problem).sizes.get("seed", ())) if self.problem in problems.names() else ()
        if seed in self.shapes:
            return seed
        return tuple(max(self.rows, key=lambda r: r.date).shape) if self.rows else None

    @property
    def primary_dtype(self) -> str | None:
        return self.dtypes[0] if self.rows else None

    def select(self, shape=None, dtype: str | None = None) -> list[BenchRow]:
        """The rows at ``shape`` and ``dtype`` (default :attr:`primary_shape`, :attr:`primary_dtype`)."""
        shape = tuple(shape) if shape is not None else self.primary_shape
        dtype = dtype or self.primary_dtype
        return [r for r in self.rows if tuple(r.shape) == shape and r.dtype == dtype]

    def view(self, shape=None, dtype: str | None = None) -> Section:
        """A copy holding only the rows at one shape and dtype (see :meth:`select`); checks, ceilings
        and ncu are kept."""
        return Section(self.problem, self.device, self.multiprocessors, self.memory_bytes, self.compute_capability,
                       self.select(shape, dtype), list(self.checks), self.ceilings, self.ncu, self.source,
                       list(self.skipped))

    def sweep(self, dtype: str = "float32", direction: str = "forward") -> list[SweepLine]:
        """The rows at ``dtype`` and ``direction`` over every recorded shape, as one
        :class:`SweepLine` per implementation (variants first, in ladder order, then the peers),
        each line's points ordered by minimum bytes: what a time- or bandwidth-against-size figure
        plots. Lines with a single shape are kept (a rung timed only at the seed size)."""
        spec = problems.get(self.problem) if self.problem in problems.names() else None
        order = list(spec.variants) if spec else []
        rows = [r for r in self.rows if r.dtype == dtype and r.direction == direction]
        names = sorted(dict.fromkeys(r.implementation for r in rows),
                       key=lambda n: (n not in order, order.index(n) if n in order else 0))
        lines = []
        for name in names:
            mine = [r for r in rows if r.implementation == name]
            points = [SweepPoint(tuple(r.shape), r.shape[0] * r.shape[1],
                                 problems.get(r.problem).cost(tuple(r.shape), direction, getattr(torch, dtype)).bytes,
                                 r.median_ms, r.back_to_back_ms, r.host_ms, r.gbps, r.fraction_of_bandwidth,
                                 r.below_floor) for r in mine]
            lines.append(SweepLine(name, mine[0].kind, direction, dtype, sorted(points, key=lambda p: p.min_bytes)))
        return lines

    # --- provenance ---
    def _stamps(self, key: str) -> list[str]:
        return [getattr(x, key) for x in (*self.rows, *self.checks) if getattr(x, key, "")]

    @property
    def date(self) -> str:
        """The newest date of a row or check (UTC ISO 8601), "" when empty."""
        return max(self._stamps("date"), default="")

    @property
    def torch(self) -> str:
        return ", ".join(sorted(set(self._stamps("torch")))) if self.rows else ""

    @property
    def cuda(self) -> str:
        return ", ".join(sorted(set(self._stamps("cuda")))) if self.rows else ""

    @property
    def sources_sha256(self) -> str:
        """The hash the section's results were measured with: the one hash when all share it,
        else the first that differs from today's sources (so a comparison says "not fresh")."""
        hashes = list(dict.fromkeys(self._stamps("sources_sha256")))
        if len(hashes) <= 1 or self.problem not in problems.names():
            return hashes[0] if hashes else ""
        current = sources_sha256(self.problem)
        return next((h for h in hashes if h != current), current)

    def stale(self, root: Path | None = None) -> list[BenchRow | CheckResult]:
        """The rows and checks measured on other sources than those now in ``root`` (default this repository)."""
        current = sources_sha256(self.problem, root)
        return [x for x in (*self.rows, *self.checks) if x.sources_sha256 != current]

    def is_fresh(self, root: Path | None = None) -> bool:
        """True if every row and check was measured on the sources there are now (see :meth:`stale`)."""
        return not self.stale(root)

    def describe(self) -> str:
        """What the section holds, in one line: problem, device, sizes, dtypes, dates."""
        sizes = ", ".join("x".join(map(str, s)) for s in self.shapes) or "no rows"
        return (f"{self.problem} on {self.device}: {sizes}; {', '.join(self.dtypes) or '-'}; "
                f"torch {self.torch or '-'}, CUDA {self.cuda or '-'}; {self.date[:10] or 'no date'}")

    # --- file format ---
    def as_dict(self) -> dict:
        """The on-disk form (JSON-ready; ``source`` is not saved)."""
        return {"problem": self.problem, "device": self.device, "multiprocessors": self.multiprocessors,
                "memory_bytes": self.memory_bytes, "compute_capability": self.compute_capability,
                "ceilings": self.ceilings, "ncu": self.ncu.as_dict() if self.ncu else None,
                "rows": [r.as_dict() for r in self.rows], "checks": [c.as_dict() for c in self.checks],
                "skipped": [s.as_dict() for s in self.skipped]}

    @classmethod
    def from_dict(cls, data: dict, problem: str | None = None) -> Section:
        """A Section from :meth:`as_dict`'s form or the older dict format (see the module docstring).

        Raises:
            ValueError: not a section (missing device, rows that are not rows).
        """
        if not isinstance(data, dict) or "device" not in data:
            raise ValueError("a section needs at least a 'device'")
        problem = data.get("problem") or problem or ""
        legacy = {"date": data.get("date", ""), "torch": data.get("torch", ""), "cuda": data.get("cuda", ""),
                  "sources_sha256": data.get("sources_sha256", data.get("kernels_sha256", ""))}
        raw_rows = list(data.get("rows", [])) + [r for rs in (data.get("rows_by_dtype") or {}).values() for r in rs]
        rows = [_row(r, legacy, data["device"]) for r in raw_rows]
        checks = [_check(c, legacy) for c in data.get("checks", [])]
        ceilings = data.get("ceilings") or ({"read_gbps": data["bandwidth_gbps"]["read"],
                                             "copy_gbps": data["bandwidth_gbps"]["copy"]}
                                            if data.get("bandwidth_gbps") else {})
        return cls(problem, data["device"], data.get("multiprocessors", 0), data.get("memory_bytes", 0),
                   data.get("compute_capability", ""), rows, checks, ceilings, data.get("ncu"),
                   data.get("source", "recorded"), [Skipped.from_dict(s) for s in data.get("skipped", [])])

    # --- the older dict format, read-only ---
    def keys(self):
        return _LEGACY_KEYS

    def __getitem__(self, key: str):
        if key not in _LEGACY_KEYS:
            raise KeyError(key)
        primary = self.primary_shape
        if key == "rows":
            return [r.as_dict() for r in self.select()]
        if key == "rows_by_dtype":
            return {d: [r.as_dict() for r in self.select(primary, d)] for d in self.dtypes[1:]}
        if key == "checks":
            return [c.as_dict() for c in self.checks]
        if key == "shape":
            return list(primary) if primary else []
        if key == "dtype":
            return self.primary_dtype or "float32"
        if key == "repeats":
            return max((r.repeats for r in self.select()), default=0)
        if key == "bandwidth_gbps":
            return {"read": self.ceilings.get("read_gbps"), "copy": self.ceilings.get("copy_gbps")}
        if key == "kernels_sha256":
            return self.sources_sha256
        return getattr(self, key)

    def get(self, key: str, default=None):
        try:
            return self[key]
        except KeyError:
            return default


@dataclass
class SweepPoint:
    """One implementation at one shape of a sweep: ``min_bytes`` is the cost model's minimum
    traffic (the x axis of a time or bandwidth plot), times in ms (see ``BenchRow``)."""

    shape: tuple[int, int]
    elements: int
    min_bytes: int
    median_ms: float
    back_to_back_ms: float | None
    host_ms: float | None
    gbps: float
    fraction_of_bandwidth: float
    below_floor: bool = False


@dataclass
class SweepLine:
    """One implementation's points over the sizes, smallest first: one line of a sweep figure."""

    implementation: str
    kind: str  # "variant" or "peer"
    direction: str
    dtype: str
    points: list[SweepPoint] = field(default_factory=list)


def _row(data, legacy: dict, device: str) -> BenchRow:
    if isinstance(data, BenchRow):
        return data
    if not isinstance(data, dict):
        raise ValueError(f"a bench row is a dict of BenchRow's fields; got {data!r:.80}")
    values = {k: v for k, v in data.items() if k in _ROW_FIELDS}
    values.update({k: v for k, v in legacy.items() if not values.get(k)})
    missing = [f for f in _ROW_REQUIRED if f not in values]
    if missing:
        raise ValueError(f"a bench row lacks {', '.join(missing)} (a row holds BenchRow's fields)")
    values["shape"] = tuple(values.get("shape", ()))
    row = BenchRow(**values)
    if row.problem in problems.names() and row.shape and row.dtype:
        flag_physical_floor(row, device)  # records made before the flag existed get it too
    return row


def _check(data, legacy: dict) -> CheckResult:
    if isinstance(data, CheckResult):
        return data
    if not isinstance(data, dict):
        raise ValueError(f"a check is a dict of CheckResult's fields; got {data!r:.80}")
    values = {k: v for k, v in data.items() if k in _CHECK_FIELDS}
    missing = [f for f in _CHECK_REQUIRED if f not in values]
    if missing:
        raise ValueError(f"a check lacks {', '.join(missing)} (a check holds CheckResult's fields)")
    values.update({k: legacy[k] for k in ("date", "sources_sha256") if not values.get(k)})
    values["shape"] = tuple(values.get("shape", ()))
    return CheckResult(**values)


def merge(old: Section, new: Section, *, same_process: bool = False) -> Section:
    """``old`` with ``new`` added: rows replaced by (problem, shape, dtype, implementation, direction),
    checks by (variant, case, direction), the rest kept; device properties, ceilings and ncu from
    ``new`` where it has them. Speedups stay as measured (each against the peers of its own run)
    unless ``same_process``: both were measured in this process, so they are recomputed across all.

    Raises:
        ValueError: the sections are of different problems or devices.
    """
    if (old.problem, old.device) != (new.problem, new.device):
        raise ValueError(f"merge: {new.problem} on {new.device} cannot be added to {old.problem} on {old.device}")
    rows = {r.key: r for r in old.rows} | {r.key: r for r in new.rows}
    checks = {c.key: c for c in old.checks} | {c.key: c for c in new.checks}
    skipped = {s.key: s for s in old.skipped} | {s.key: s for s in new.skipped}
    measured = {r.key[:4] for r in new.rows}
    skipped = [s for s in skipped.values() if s.key not in measured]
    merged = Section(new.problem, new.device, new.multiprocessors or old.multiprocessors,
                     new.memory_bytes or old.memory_bytes, new.compute_capability or old.compute_capability,
                     list(rows.values()), list(checks.values()), new.ceilings or old.ceilings,
                     new.ncu or old.ncu, new.source, skipped)
    if same_process:
        set_speedups(merged.rows)
    return merged


def combine(sections: Sequence[Section]) -> Section:
    """Sections measured in this process (e.g. one implementation each) as one, with speedups
    over every peer among them. Raises ValueError for no sections."""
    if not sections:
        raise ValueError("sections: expected at least one section")
    out = sections[0]
    for section in sections[1:]:
        out = merge(out, section, same_process=True)
    if len(sections) == 1:
        set_speedups(out.rows)
    return out


# --- the record file -----------------------------------------------------------------------------------

@dataclass
class Record:
    """One device's record file: ``sections`` maps a problem to its Section. Also answers the
    older dict keys ``record["device"]`` and ``record["problems"]``."""

    device: str
    sections: dict[str, Section] = field(default_factory=dict, repr=False)
    path: Path | None = None

    @property
    def date(self) -> str:
        return max((s.date for s in self.sections.values()), default="")

    def __getitem__(self, key: str):
        return {"device": self.device, "problems": self.sections}[key]

    def as_dict(self) -> dict:
        return {"schema": SCHEMA, "device": self.device,
                "problems": {p: s.as_dict() for p, s in sorted(self.sections.items())}}


def record_path(device: str, results_dir: Path = RESULTS_DIR) -> Path:
    return Path(results_dir) / f"{device_slug(device)}.json"


def load(path: Path | str) -> Record:
    """Read one record file (this format or the older one).

    Raises:
        RecordError: unreadable, not JSON, or not a record (one line naming the file).
    """
    path = Path(path)
    expected = "the JSON `python -m losslab bench` writes ({\"device\": ..., \"problems\": {...}})"
    try:
        data = json.loads(path.read_text())
    except OSError as err:
        raise RecordError(f"{path}: cannot read the record: {err.strerror or err}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise RecordError(f"{path}: not a readable record ({err}; truncated?): expected {expected}; "
                          "re-record it or delete the file") from None
    if not isinstance(data, dict) or "device" not in data or not isinstance(data.get("problems"), dict):
        raise RecordError(f"{path}: not a record: expected {expected}")
    if data.get("schema", 1) > SCHEMA:
        raise RecordError(f"{path}: record schema {data['schema']} is newer than this losslab reads ({SCHEMA})")
    try:
        sections = {p: Section.from_dict({"device": data["device"], **s}, p) for p, s in data["problems"].items()}
    except (ValueError, TypeError, KeyError) as err:
        raise RecordError(f"{path}: malformed section: {err}") from None
    return Record(data["device"], sections, path)


def load_records(results_dir: Path | str = RESULTS_DIR) -> list[Record]:
    """Every record under ``results_dir`` (``*.json`` at its top), newest first.

    Raises:
        RecordError: a file there is not a record.
    """
    found = [load(p) for p in sorted(Path(results_dir).glob("*.json"))]
    return sorted(found, key=lambda r: r.date, reverse=True)


def devices(results_dir: Path | str = RESULTS_DIR) -> list[str]:
    """The device names with a record under ``results_dir``, newest first."""
    return [r.device for r in load_records(results_dir)]


def resolve_device(device: str, results_dir: Path | str = RESULTS_DIR) -> str:
    """The recorded device name that ``device`` (a name such as "NVIDIA H200" or a slug such as
    "nvidia-h200") refers to.

    Raises:
        LookupError: no record of it (the message names the devices recorded).
    """
    for name in devices(results_dir):
        if device_slug(name) == device_slug(device):
            return name
    known = ", ".join(f"{n!r} ({device_slug(n)})" for n in devices(results_dir)) or "none"
    raise LookupError(f"no record of device {device!r} under {results_dir}; recorded devices: {known}")


def save_section(problem: str, section: Section | dict, results_dir: Path | str = RESULTS_DIR, *,
                 replace: bool = False) -> Path:
    """Add ``section`` to its device's record (see :func:`merge`), keeping the other problems'; with
    ``replace``, it takes the place of the problem's recorded section instead (a full re-record, so
    that no row of an older run stays behind). Returns the record's path.

    Raises:
        RecordError: the existing record file is not a record (it is left as it is).
    """
    section = section if isinstance(section, Section) else Section.from_dict(section, problem)
    section.problem = section.problem or problem
    path = record_path(section.device, results_dir)
    record = load(path) if path.exists() else Record(section.device)
    old = record.sections.get(problem)
    record.sections[problem] = merge(old, section) if old and not replace else section
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record.as_dict(), indent=1, sort_keys=True) + "\n")
    return path


def latest_section(problem: str, device: str | None = None, results_dir: Path | str = RESULTS_DIR) -> Section:
    """The newest recorded Section of ``problem`` (on ``device``, a name or slug, if given).

    Raises:
        LookupError: nothing recorded for it (the message names the devices that are).
        RecordError: a record file is not a record.
    """
    results_dir = Path(results_dir)
    found = [r.sections[problem] for r in load_records(results_dir)
             if problem in r.sections and (device is None or device_slug(r.device) == device_slug(device))]
    if not found:
        where = f" on {device}" if device else ""
        others = ", ".join(devices(results_dir)) if results_dir.exists() else ""
        raise LookupError(f"no recorded results for {problem}{where} under {results_dir}"
                          + (f" (recorded devices: {others})" if others else "")
                          + f"; run `python -m losslab bench {problem}` on a GPU machine")
    return max(found, key=lambda s: s.date)


def is_fresh(section: Section | dict, problem: str | None = None) -> bool:
    """True if ``section`` (a Section, or a dict in the older format) was measured on today's sources."""
    if isinstance(section, Section):
        return section.is_fresh()
    return section["kernels_sha256"] == sources_sha256(problem or section["problem"])


# --- measuring -----------------------------------------------------------------------------------------

def _shape(problem: str, size) -> tuple[int, int]:
    spec = problems.get(problem)
    if isinstance(size, str):
        if size not in spec.sizes:
            raise ValueError(f"size: {problem} has no size {size!r}; expected one of {', '.join(spec.sizes)} "
                             "or a (rows, columns) pair")
        return tuple(spec.sizes[size])
    return tuple(size)


def _missing_peers(problem: str, peers: Sequence[str], progress: bool) -> dict[str, str]:
    """``peers.missing_peers``, each reason printed once (to stderr) when ``progress``."""
    missing = missing_peers(problem, peers)
    for peer, why in missing.items() if progress else ():
        print(f"{problem}: {peer} not timed: {why}", file=sys.stderr, flush=True)
    return missing


def measure_section(problem: str, size="seed", variants: list | None = None, *, peers: Sequence[str] = PEERS,
                    dtypes: Sequence[str] = ("float32",), repeats: int = 20, check: bool = True,
                    check_sizes: Sequence[str] | None = None, check_variants: list | None = None,
                    edge_cases: bool = True, ceilings: dict | None = None, ncu: bool = False,
                    progress: bool = True) -> Section:
    """Measure ``problem`` now on the current GPU into a live Section (not saved; see :func:`save_section`).

    Args:
        size: a size name of the problem or a (rows, columns) pair: the bench's shape.
        variants: rung names or variant objects (default the whole ladder); [] times peers only.
        peers: of ``measure.peers.PEERS``; one that cannot run here (``peers.missing_peers``) is a
            :class:`Skipped` in ``section.skipped`` at each dtype, its reason printed once.
        dtypes: of :data:`DTYPES` (a dtype no variant takes is skipped unless ``variants`` is []).
        repeats: timed calls per (implementation, direction).
        check: run the float64 checks first: ``check_variants`` (default ``variants``) at
            ``check_sizes`` (default all of the problem's sizes), and the edge cases if ``edge_cases``.
        ceilings: ``ceilings.measure_ceilings()`` already measured in this process (else measured now).
        ncu: also profile with Nsight Compute (last, so it cannot disturb the timings).
    Raises:
        ValueError: unknown problem, size, variant, peer or dtype; repeats < 1.
    """
    spec = problems.get(problem)
    shape = _shape(problem, size)
    for name in dtypes:
        if name not in DTYPES:
            raise ValueError(f"dtypes: unknown dtype {name!r}; expected some of {', '.join(DTYPES)}")
    if repeats < 1:
        raise ValueError(f"repeats: expected at least 1, got {repeats}")
    for v in variants or []:
        if isinstance(v, str):
            spec.check_variant_name(v)
    ceilings = ceilings or measure_ceilings()
    bandwidth = {"read": ceilings["read_gbps"], "copy": ceilings["copy_gbps"]}
    checks = []
    if check:
        checks = check_problem(problem, check_variants if check_variants is not None else variants,
                               list(check_sizes) if check_sizes else None, edge_cases=edge_cases, progress=progress)
    timed = spec.variants if variants is None else variants
    rows, skipped, missing = [], [], _missing_peers(problem, peers, progress)
    for name in dtypes:
        dtype = getattr(torch, name)
        if timed and not any(dtype in (spec.dtypes(v) if isinstance(v, str) else v.dtypes) for v in timed):
            continue
        rows += bench_problem(problem, shape, variants, peers=tuple(peers), repeats=repeats,
                              bandwidth=bandwidth, progress=progress, dtype=dtype)
        skipped += [Skipped(problem, shape, name, peer, why) for peer, why in missing.items()]
    stamp = run_provenance(problem)
    for item in (*rows, *checks, *skipped):
        for key in ("date", "torch", "cuda", "sources_sha256"):
            if hasattr(item, key):
                setattr(item, key, stamp[key])
    section = Section(problem, stamp["device"], stamp["multiprocessors"], stamp["memory_bytes"],
                      stamp["compute_capability"], rows, checks, ceilings, None, "live", skipped)
    if ncu:
        section.ncu = profile_problem(problem, shape, [v for v in timed if isinstance(v, str)], tuple(peers))
    return section


def measure_sweep(problem: str, shapes: Sequence[tuple[int, int]] | None = None, *,
                  dtypes: Sequence[str] = ("float32", "bfloat16"), peers: Sequence[str] = PEERS,
                  directions: Sequence[str] = SWEEP_DIRECTIONS, repeats: int = 20, ceilings: dict | None = None,
                  progress: bool = True) -> Section:
    """Time ``problem`` over a range of shapes now on the current GPU into a live Section (not saved).

    At each shape and dtype: every rung with kernels for the dtype and every peer, forward and
    forward+backward (``directions``), per call, back to back and on the host (no float64
    checks: ``measure_section`` and the gpu tier make those; each row still records its error
    against float64). Fewer repeats at large shapes (``bench.sweep_repeats``). A rung hopeless
    at a shape (``bench.hopeless_reason``) and a shape whose inputs would not fit in the free
    device memory are left out, each as a :class:`Skipped` with its reason in
    ``section.skipped``, as is a peer that cannot run here (its reason printed once). Plot the
    result with :meth:`Section.sweep`. The torch.compile peer compiles once per dtype and then, as
    torch.compile does by default when a shape changes, once more with dynamic shapes: the code a
    training loop of varying sizes gets.

    Args:
        shapes: (rows, columns) pairs; default ``bench.SWEEP_SHAPES[problem]``.
    Raises:
        ValueError: unknown problem, dtype or direction; repeats < 1.
    """
    spec = problems.get(problem)
    shapes = [tuple(s) for s in (shapes or SWEEP_SHAPES[problem])]
    for name in dtypes:
        if name not in DTYPES:
            raise ValueError(f"dtypes: unknown dtype {name!r}; expected some of {', '.join(DTYPES)}")
    for direction in directions:
        if direction not in problems.DIRECTIONS:
            raise ValueError(f"directions: unknown direction {direction!r}; expected some of "
                             f"{', '.join(problems.DIRECTIONS)}")
    if repeats < 1:
        raise ValueError(f"repeats: expected at least 1, got {repeats}")
    ceilings = ceilings or measure_ceilings()
    bandwidth = {"read": ceilings["read_gbps"], "copy": ceilings["copy_gbps"]}
    rows, skipped, missing = [], [], _missing_peers(problem, peers, progress)
    for name in dtypes:
        dtype = getattr(torch, name)
        for shape in shapes:
            torch.cuda.empty_cache()
            free, _ = torch.cuda.mem_get_info()
            needed = sweep_memory_bytes(problem, shape, dtype)
            if needed > free:
                skipped.append(Skipped(problem, shape, name, "*", f"needs about {needed / 1e9:.1f} GB of device "
                                                                  f"memory; {free / 1e9:.1f} GB are free"))
                continue
            variants = [v for v in spec.variants if dtype in spec.dtypes(v)]
            for v in variants:
                if reason := hopeless_reason(problem, v, shape):
                    skipped.append(Skipped(problem, shape, name, v, reason))
            variants = [v for v in variants if not hopeless_reason(problem, v, shape)]
            skipped += [Skipped(problem, shape, name, peer, why) for peer, why in missing.items()]
            rows += bench_problem(problem, shape, variants, peers=tuple(peers),
                                  repeats=sweep_repeats(problem, shape, dtype, repeats), bandwidth=bandwidth,
                                  progress=progress, dtype=dtype, directions=tuple(directions))
    stamp = run_provenance(problem)
    for item in (*rows, *skipped):
        for key in ("date", "torch", "cuda", "sources_sha256"):
            if hasattr(item, key):
                setattr(item, key, stamp[key])
    return Section(problem, stamp["device"], stamp["multiprocessors"], stamp["memory_bytes"],
                   stamp["compute_capability"], rows, [], ceilings, None, "live", skipped)
