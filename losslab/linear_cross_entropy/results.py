"""The benchmark's records, ``reports/results/linear_cross_entropy/<device>.json``: where they are, how
they are read (one line naming a file that is not one) and the table and goal lines printed from them
(by the benchmark and by notebook 08, with or without a GPU)."""
from __future__ import annotations

import json
from pathlib import Path

from losslab.linear_cross_entropy.peers import LABELS
from losslab.records.files import RESULTS_DIR, RecordError, device_slug

FOLDER = RESULTS_DIR / "linear_cross_entropy"
SCHEMA = 1
TIME_LIMIT = 1.10  # the goal: forward+backward within 1.10x of the three GEMMs measured in the same run
EXTRA_BYTES_OVER_FLOOR = 256 * 2**20  # the goal: extra memory within the weight's gradient + 256 MiB
GRAD_ERROR_LIMIT = 2e-3  # the goal: ||g - g_eager|| / ||g_eager|| for the input's and the weight's gradients


def record_path(device: str, folder: Path = FOLDER) -> Path:
    """``<folder>/<device slug>.json``, e.g. ``nvidia-h100-80gb-hbm3.json``."""
    return Path(folder) / f"{device_slug(device)}.json"


def load(path: Path) -> dict:
    """One record as the benchmark wrote it.

    Raises:
        RecordError: unreadable, not JSON, or not a record of schema :data:`SCHEMA` (one line naming the file).
    """
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise RecordError(f"{path}: not a linear cross-entropy record ({err})") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("heads"), list):
        raise RecordError(f"{path}: not a linear cross-entropy record of schema {SCHEMA}; re-record it with "
                          "python -m losslab.linear_cross_entropy.bench --record")
    return data


def load_records(folder: Path = FOLDER) -> list[dict]:
    """Every record in ``folder``, sorted by device ([] when there is none)."""
    return [load(p) for p in sorted(Path(folder).glob("*.json"))]


def cell(peer: dict | None) -> str:
    """``'<median> ms / <extra> GiB'`` (time alone where no memory was measured), '-' for no measurement."""
    if peer is None:
        return "-"
    text = f"{peer['median_ms']:.1f} ms"
    if peer.get("extra_bytes") is not None:
        text += f" / {peer['extra_bytes'] / 2**30:.2f} GiB"
    return text


def columns(record: dict) -> list[str]:
    """The peers measured in ``record``, in the table's order (losslab last)."""
    measured = {name for head in record["heads"] for name in head["peers"]}
    return [name for name in LABELS if name in measured]


def table(record: dict) -> str:
    """The issue's table from ``record``: one row per head, ``median ms / extra GiB`` per peer (time alone
    for the GEMMs), as a Markdown table."""
    names = columns(record)
    lines = ["| head (N tokens, H hidden, V vocab), dtype | " + " | ".join(LABELS[n] for n in names) + " |",
             "|---" * (len(names) + 1) + "|"]
    for head in record["heads"]:
        shape = f"{head['label']} ({head['tokens']}, {head['hidden']}, {head['vocab']}), {head['dtype']}"
        lines.append(f"| {shape} | " + " | ".join(cell(head["peers"].get(n)) for n in names) + " |")
    return "\n".join(lines)


def goal_lines(record: dict) -> list[str]:
    """One line per head: losslab against the goals (time, memory, gradient errors), met or missed by how much."""
    lines = []
    for head in record["heads"]:
        g = head.get("goals")
        if not g:
            continue
        ok = lambda met: "met" if met else "MISSED"  # noqa: E731
        lines.append(
            f"{head['label']} {head['dtype']}: time {g['time_ratio']:.3f}x the GEMMs (goal {TIME_LIMIT}x: "
            f"{ok(g['time_met'])}); extra memory {g['extra_bytes'] / 2**30:.3f} GiB against "
            f"{g['memory_limit_bytes'] / 2**30:.3f} GiB ({ok(g['memory_met'])}); gradient error vs eager input "
            f"{g['input_grad_error']:.1e}, weight {g['weight_grad_error']:.1e} (goal {GRAD_ERROR_LIMIT:.0e}: "
            f"{ok(g['grad_errors_met'])}); {head['chunk_rows']} rows a chunk")
    return lines


def error_lines(record: dict) -> list[str]:
    """Each peer's gradient errors against eager per head (input / weight, relative L2), and how many graphs
    torch.compile compiled for the head's shape (1: no recompilation while timed)."""
    lines = []
    for head in record["heads"]:
        parts = [f"{LABELS[n]} {p['input_grad_error']:.1e} / {p['weight_grad_error']:.1e}"
                 for n, p in head["peers"].items() if p.get("input_grad_error") is not None]
        parts += [f"{LABELS[n]} not measured ({why})" for n, why in head.get("failed", {}).items()]
        compiled = head["peers"].get("compile", {}).get("graphs_compiled")
        if compiled is not None:
            parts.append(f"torch.compile compiled {compiled} graph(s) for this shape")
        if parts:
            lines.append(f"{head['label']} {head['dtype']} (input / weight vs eager): " + "; ".join(parts))
    return lines
