"""The benchmark's records, ``reports/results/linear_cross_entropy/<device>.json``: where they are, how
they are read (one line naming a file that is not one) and the table and goal lines printed from them
(by the benchmark and by notebook 08, with or without a GPU)."""
from __future__ import annotations

import json
from pathlib import Path

from losslab.linear_cross_entropy.options import ELEMENT_BYTES, Options, chunk_rows
from losslab.linear_cross_entropy.peers import GIB, LABELS
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


def element_bytes(head: dict) -> int:
    """Bytes of one element of the head's dtype."""
    return ELEMENT_BYTES[head["dtype"]]


def chunks(head: dict, rows: int | None = None) -> tuple[int, int]:
    """(rows a chunk, chunks) of the head: the recorded default chunk size, or ``rows`` a chunk."""
    rows = head["chunk_rows"] if rows is None else rows
    return rows, -(-head["tokens"] // rows)


def big_chunks(head: dict) -> tuple[int, int]:
    """(rows a chunk, chunks) of the ``losslab (1 GiB chunks)`` column: ``Options(chunk_bytes=1 GiB)``'s rows."""
    return chunks(head, chunk_rows(Options(chunk_bytes=GIB), head["tokens"], head["hidden"], head["vocab"],
                                   element_bytes(head)))


def gradient_lines(record: dict) -> list[str]:
    """Two lines per head: losslab's chunks and its input gradient's error against eager beside the 1-GiB
    chunks'; then the weight gradient's error, rounded once per chunk and (for a 16-bit weight) with the
    float32 accumulator, its extra memory, and whether each of the two columns meets the memory goal and the
    error goal."""
    lines = []
    for head in record["heads"]:
        p, g = head["peers"], head.get("goals")
        ours, big, wide = p.get("losslab"), p.get("losslab_1gib"), p.get("losslab_wide")
        if not g or ours is None or ours.get("input_grad_error") is None:
            continue
        rows, count = chunks(head)
        text = (f"{head['label']} {head['dtype']}: {count} chunk(s) of {rows} rows; the input's gradient's error "
                f"against eager {ours['input_grad_error']:.1e}")
        if big is not None and big.get("input_grad_error") is not None:
            big_rows, big_count = big_chunks(head)
            text += f", in {big_count} chunk(s) of {big_rows} rows {big['input_grad_error']:.1e}"
        lines.append(text)
        text = f"  the weight's gradient, rounded after each of the {count} chunk(s): {ours['weight_grad_error']:.1e}"
        columns = {"losslab": ours}
        if element_bytes(head) == 2 and wide is not None and wide.get("weight_grad_error") is not None:
            text += (f"; with the float32 accumulator {wide['weight_grad_error']:.1e}, for "
                     f"{(wide['extra_bytes'] - ours['extra_bytes']) / GIB:.2f} GiB more")
            columns[LABELS["losslab_wide"]] = wide
        for name, peer in columns.items():
            memory = "meets" if peer["extra_bytes"] <= g["memory_limit_bytes"] else "misses"
            errors = max(peer["input_grad_error"], peer["weight_grad_error"]) <= GRAD_ERROR_LIMIT
            text += (f"; {name} {memory} the memory goal ({peer['extra_bytes'] / GIB:.2f} of "
                     f"{g['memory_limit_bytes'] / GIB:.2f} GiB) and {'meets' if errors else 'misses'} the error goal")
        lines.append(text)
    return lines
