"""The benchmark's records: ``reports/results/vocab_parallel/<device slug>-x<world>.json``.

Written atomically (``records.files.write_json``), read back by the notebook chapter; each carries
its provenance and the hash of the sources it measured (:func:`sources_sha256`).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from losslab.build import CSRC, KERNELS, ROOT
from losslab.records.files import RESULTS_DIR, device_slug, write_json

FOLDER = RESULTS_DIR / "vocab_parallel"


def record_path(device: str, world: int, folder: Path = FOLDER) -> Path:
    """Where a ``world``-GPU record of ``device`` goes: ``<folder>/<device slug>-x<world>.json``."""
    return Path(folder) / f"{device_slug(device)}-x{world}.json"


def sources() -> list[Path]:
    """The files a measurement depends on: ``kernels/vocab_parallel/``, its binding and this package."""
    package = Path(__file__).resolve().parent
    return sorted([*(KERNELS / "vocab_parallel").glob("*"), CSRC / "vocab_parallel.cpp", *package.glob("*.py")])


def sources_sha256() -> str:
    """sha256 over :func:`sources` (each file's path in the repository and its bytes)."""
    digest = hashlib.sha256()
    for path in sources():
        digest.update(path.relative_to(ROOT).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def save(data: dict, folder: Path = FOLDER) -> Path:
    """Write one record (a dict with ``device`` and ``world``) atomically; returns its path."""
    path = record_path(data["device"], data["world"], folder)
    write_json(path, data)
    return path


def load_all(folder: Path | str = FOLDER) -> list[dict]:
    """Every record under ``folder``, newest first; [] when there is none (or no folder).

    Raises:
        ValueError: a file there that is not JSON with ``device``, ``world`` and ``sizes`` (one line naming it)."""
    found = []
    for path in sorted(Path(folder).glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise ValueError(f"{path}: not a vocab_parallel record ({err})") from None
        if not isinstance(data, dict) or not {"device", "world", "sizes"} <= data.keys():
            raise ValueError(f"{path}: not a vocab_parallel record (expected device, world and sizes)")
        found.append(data)
    return sorted(found, key=lambda d: d.get("date", ""), reverse=True)
