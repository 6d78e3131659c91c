"""Recorded GPU results: JSON files under ``reports/results/``, one per device.

A record holds, per problem, one benchmark run with its provenance: device,
torch and CUDA versions, date (UTC, ISO 8601), the sha256 of the kernel
sources it ran (``kernels_sha256``), the measured bandwidth ceilings, the bench
rows and the check results. Machines without a GPU render these records; a
cpu-tier test fails when a record's kernel hash no longer matches ``kernels/``.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
from pathlib import Path

import torch

from losslab.build import KERNELS, ROOT

RESULTS_DIR = ROOT / "reports" / "results"


def kernels_sha256(problem: str) -> str:
    """sha256 over the kernel sources a problem's extension is built from
    (``kernels/common`` and ``kernels/<problem>``): each file's relative path and bytes, in path order."""
    digest = hashlib.sha256()
    for path in sorted([*(KERNELS / "common").rglob("*"), *(KERNELS / problem).rglob("*")]):
        if path.is_file():
            digest.update(path.relative_to(KERNELS).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def device_slug(name: str) -> str:
    """File-name form of a device name: 'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3'."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def provenance(problem: str) -> dict:
    """Where and when a result was measured: device, versions, date and kernel hash."""
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return {
        "device": props.name,
        "multiprocessors": props.multi_processor_count,
        "memory_bytes": props.total_memory,
        "compute_capability": f"{props.major}.{props.minor}",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "kernels_sha256": kernels_sha256(problem),
    }


def record_path(device: str, results_dir: Path = RESULTS_DIR) -> Path:
    return results_dir / f"{device_slug(device)}.json"


def save_section(problem: str, section: dict, results_dir: Path = RESULTS_DIR) -> Path:
    """Write one problem's results into its device's record, keeping the other problems'.

    ``section`` must hold the keys of :func:`provenance` (``device`` names the file).
    Returns the record's path.
    """
    path = record_path(section["device"], results_dir)
    record = json.loads(path.read_text()) if path.exists() else {"device": section["device"], "problems": {}}
    record["problems"][problem] = section
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return path


def load_records(results_dir: Path = RESULTS_DIR) -> list[dict]:
    """Every record under ``results_dir``, newest first (by the newest section's date)."""
    records = [json.loads(p.read_text()) for p in sorted(results_dir.glob("*.json"))]
    return sorted(records, key=lambda r: max(s["date"] for s in r["problems"].values()), reverse=True)


def latest_section(problem: str, device: str | None = None, results_dir: Path = RESULTS_DIR) -> dict:
    """The newest recorded section for ``problem`` (on ``device`` if given).

    Raises:
        LookupError: nothing recorded for it.
    """
    sections = [r["problems"][problem] for r in load_records(results_dir)
                if problem in r["problems"] and (device is None or r["device"] == device)]
    if not sections:
        where = f" on {device}" if device else ""
        raise LookupError(f"no recorded results for {problem}{where} under {results_dir}; "
                          f"run `python -m losslab bench {problem}` on a GPU machine")
    return max(sections, key=lambda s: s["date"])


def is_fresh(section: dict, problem: str) -> bool:
    """True if ``section`` was measured on the kernel sources now in ``kernels/``."""
    return section["kernels_sha256"] == kernels_sha256(problem)
