"""The record files: ``reports/results/<device>.json``, one per device, one section per problem.

Reading validates (a file that is not a record, or a record of the older, pre-typed format,
raises :class:`RecordError`, one line naming it, which says to re-record an older one); writing
goes to a temporary file in the same folder that replaces the record only once it is complete,
so a full disk or a kill during a save leaves the old record as it was.
"""
from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from losslab.build import ROOT
from losslab.problems import Problem
from losslab.records.section import Section, merge, older_format_keys

RESULTS_DIR = ROOT / "reports" / "results"
SCHEMA = 2


class RecordError(ValueError):
    """A record file that cannot be read as a record (the message is one line naming the file)."""


def device_slug(name: str) -> str:
    """File-name form of a device name: 'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3'."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")



@dataclass
class Record:
    """One device's record file: ``sections`` maps a problem to its Section."""

    device: str
    sections: dict[str, Section] = field(default_factory=dict, repr=False)
    path: Path | None = None

    @property
    def date(self) -> str:
        return max((s.date for s in self.sections.values()), default="")

    def as_dict(self) -> dict:
        return {"schema": SCHEMA, "device": self.device,
                "problems": {p: s.as_dict() for p, s in sorted(self.sections.items())}}


def record_path(device: str, results_dir: Path = RESULTS_DIR) -> Path:
    return Path(results_dir) / f"{device_slug(device)}.json"


def load(path: Path | str) -> Record:
    """Read one record file (schema :data:`SCHEMA`, as :meth:`Record.as_dict` writes it).

    Raises:
        RecordError: unreadable, not JSON, not a record, or a record of the older format (schema 1:
            provenance and bandwidth per section, rows per dtype; ``section.OLDER_FORMAT_KEYS``), which
            is no longer read and must be re-recorded (one line naming the file).
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
    older = sorted({k for s in data["problems"].values() if isinstance(s, dict) for k in older_format_keys(s)})
    if older:
        raise RecordError(f"{path}: a record of the older format (sections with {', '.join(older)}), which this "
                          f"losslab no longer reads: re-record it with `python -m losslab bench "
                          f"{' '.join(sorted(data['problems']))}` on a GPU machine, or delete the file")
    empty = [p for p, s in data["problems"].items() if not isinstance(s, dict) or not s]
    if empty:
        raise RecordError(f"{path}: the section of {', '.join(map(repr, empty))} is empty: expected its rows and "
                          "checks; re-record it or remove that section")
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


def save_section(problem: Problem | str, section: Section | dict, results_dir: Path | str = RESULTS_DIR, *,
                 replace: bool = False) -> Path:
    """Add ``section`` (a Section, or its :meth:`Section.as_dict` form) to its device's record (see
    :func:`merge`), keeping the other problems'; with ``replace``, it takes the place of the
    problem's recorded section instead (a full re-record, so that no row of an older run stays
    behind). ``problem``: a Problem or the name the record gives it. Returns the record's path.

    Raises:
        RecordError: the existing record file is not a record (it is left as it is).
        ValueError: ``section`` is a dict that is not a section (or one of the older format).
    """
    problem = problem if isinstance(problem, str) else problem.name
    section = section if isinstance(section, Section) else Section.from_dict(section, problem)
    section.problem = section.problem or problem
    path = record_path(section.device, results_dir)
    record = load(path) if path.exists() else Record(section.device)
    old = record.sections.get(problem)
    record.sections[problem] = merge(old, section) if old and not replace else section
    write_json(path, record.as_dict())
    return path


def write_json(path: Path, data: object) -> None:
    """Write ``data`` as JSON to ``path`` all at once: into a temporary file in the same folder,
    flushed to disk, that then replaces ``path`` (``os.replace`` is atomic on one file system).
    A failed write (full disk, a kill) leaves the old file as it was and no temporary file.

    Raises:
        OSError: the folder cannot be created or written (the old file is untouched).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o644)  # mkstemp's file is private (0600); a record is read by everyone
        with os.fdopen(fd, "w") as out:
            out.write(json.dumps(data, indent=1, sort_keys=True) + "\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def latest_section(problem: Problem | str, device: str | None = None, results_dir: Path | str = RESULTS_DIR) -> Section:
    """The newest recorded Section of ``problem`` (a Problem or its name; on ``device``, a name or slug,
    if given).

    Raises:
        LookupError: nothing recorded for it (the message names the devices that are).
        RecordError: a record file is not a record.
    """
    problem = problem if isinstance(problem, str) else problem.name
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


def is_fresh(section: Section) -> bool:
    """True if every row and check of ``section`` was measured on today's sources (:meth:`Section.is_fresh`)."""
    return section.is_fresh()
