"""The benchmark's records: ``reports/results/vocab_parallel/<device slug>-x<world>.json``.

Written atomically (``records.files.write_json``), read back by the notebook chapter and shown as a
short table (:func:`table`); each carries its provenance and its sources' hash (:func:`sources_sha256`).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from losslab.build import CSRC, KERNELS, ROOT
from losslab.linear_cross_entropy.options import ELEMENT_BYTES, MiB, Options, chunk_rows
from losslab.records.files import RESULTS_DIR, device_slug, write_json

FOLDER = RESULTS_DIR / "vocab_parallel"
GOAL_FACTOR = 1.2  # the goal: within 1.2x of (3 x local slice bytes / copy bandwidth + latency)


def record_path(device: str, world: int, folder: Path = FOLDER) -> Path:
    """Where a ``world``-GPU record of ``device`` goes: ``<folder>/<device slug>-x<world>.json``."""
    return Path(folder) / f"{device_slug(device)}-x{world}.json"


def sources() -> list[Path]:
    """The files a measurement depends on: ``kernels/vocab_parallel/``, its binding and this package
    but this module (which only writes, reads and prints records)."""
    package = Path(__file__).resolve().parent
    measured = [path for path in package.glob("*.py") if path.name != Path(__file__).name]
    return sorted([*(KERNELS / "vocab_parallel").glob("*"), CSRC / "vocab_parallel.cpp", *measured])


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


def table(data: dict, linear: bool = True) -> str:
    """The short table rank 0 prints last; with ``linear``, the linear loss's rows too (:func:`linear_table`)."""
    c = data["collectives"]
    lines = [f"vocab-parallel cross-entropy, {data['world']} x {data['device']}, {data['sizes'][0]['dtype']}, "
             "forward+backward, median ms per call (slowest rank)",
             f"{'N x V':<14}{'losslab':>9}{'Megatron':>10}{'loss_par':>10}{'1-GPU':>8}{'model':>8}"
             f"{'x model':>9}{'loss_par/losslab':>18}"]
    for s in data["sizes"]:
        ms, model, peer = s["ms"], s["goal"]["model_ms"], s["ms"]["loss_parallel"]
        lines.append(f"{s['rows']}x{s['vocab']:<9}{ms['losslab']:>9.3f}{ms['megatron_style']:>10.3f}"
                     + (f"{peer:>10.3f}" if peer else f"{'failed':>10}")
                     + f"{ms['single_gpu_floor']:>8.3f}{model:>8.3f}{ms['losslab'] / model:>9.2f}"
                     + (f"{peer / ms['losslab']:>18.2f}" if peer else f"{'-':>18}"))
        lines += [f"  {name} could not run: {why}" for name, why in s.get("errors", {}).items()]
    lines.append(f"all-gather 4 B {c['all_gather_latency_ms'] * 1e3:.1f} us, statistics "
                 f"{c['all_gather_statistics_ms'] * 1e3:.1f} us; all-reduce 4 B "
                 f"{c['all_reduce_latency_ms'] * 1e3:.1f} us, three of [N] "
                 f"{c['three_all_reduces_ms'] * 1e3:.1f} us; bus GB/s all-reduce {c['all_reduce_bus_gbps']:.0f}, "
                 f"all-gather {c['all_gather_bus_gbps']:.0f}; copy {c['copy_gbps']:.0f} GB/s")
    lines.append(f"goal: losslab within {GOAL_FACTOR}x of the model (3 x local slice bytes / copy bandwidth "
                 "+ all-gather latency) and 2x faster than loss_parallel")
    if linear and data.get("linear"):
        lines += ["", *linear_table(data)]
    return "\n".join(lines)


LINEAR_COLUMNS = {"losslab": "losslab", "losslab_4_chunks": "4 chunks", "logits_then_losslab": "slice+losslab",
                  "logits_then_megatron_style": "slice+Megatron", "gemms": "3 GEMMs"}


def linear_table(data: dict) -> list[str]:
    """The linear loss's rows of :func:`table`: ms per forward+backward and extra GiB per variant."""
    heads = data["linear"]
    lines = [f"vocab-parallel linear cross-entropy, {heads[0]['dtype']}, forward+backward with the input's gradient "
             "all-reduced: median ms per call / extra GiB (slowest rank)",
             f"{'head (N, H, V)':<30}" + "".join(f"{label:>16}" for label in LINEAR_COLUMNS.values())
             + f"{'/ GEMMs':>9}"]
    for h in heads:
        label = f"{h['head']} ({h['rows']}, {h['hidden']}, {h['vocab']})"
        cells = "".join(f"{h['ms'][key]:>8.2f} /{h['extra_gib'][key]:>5.2f}" if key in h["ms"] else f"{'-':>16}"
                        for key in LINEAR_COLUMNS)
        lines.append(f"{label:<30}{cells}{h['ms']['losslab'] / h['ms']['gemms']:>9.2f}")
    lines.append("losslab: default chunks, sized as the single-GPU op sizes them (the input's gradient and one "
                 "chunk's logits within 256 MiB); 4 chunks: chunk_rows N/4; slice+losslab: this rank's logits made "
                 "whole, then vocab_parallel_cross_entropy; slice+Megatron: the same with the Megatron-style loss; "
                 "3 GEMMs: the matrix products alone; / GEMMs: losslab's time over theirs")
    for h in heads:
        (rows, count, logits), (rows_4, count_4, logits_4) = chunks_of(h).values()
        lines.append(f"  {h['head']}: losslab {count} chunks of {rows} rows ({logits / MiB:.0f} MiB of logits each); "
                     f"4 chunks: {count_4} of {rows_4} rows ({logits_4 / MiB:.0f} MiB each)")
    return lines


def chunks_of(head: dict) -> dict[str, tuple[int, int, int]]:
    """The chunks of one linear head of a record on its widest slice: {"default chunks": (rows a chunk,
    chunks, bytes of one chunk's logits), "4 chunks": (...)}, computed as the benchmark's calls size them
    (the default: ``losslab.linear_cross_entropy.options.chunk_rows``, as vocab_parallel_linear_cross_entropy)."""
    n, width, size = head["rows"], max(head["widths"]), ELEMENT_BYTES[head["dtype"]]
    found = {}
    for name, rows in (("default chunks", chunk_rows(Options(), n, head["hidden"], width, size)),
                       ("4 chunks", -(-n // 4))):
        found[name] = (rows, -(-n // rows), rows * width * size)
    return found
