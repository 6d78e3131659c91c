"""What Nsight Compute counted per rung, read from a record, and the rows whose work was done elsewhere.

The counters that name a rung's flaw and its fix (:func:`counters`, :func:`counters_table`, each
with what it says: :data:`MEANINGS`), DRAM bytes over the cost model's minimum, headroom under the
MUFU ceiling, and the timed rows whose own kernels moved almost none of their bytes
(:func:`work_elsewhere`, :func:`work_elsewhere_note`).
"""
from __future__ import annotations

import html
from dataclasses import dataclass

import torch

from losslab import problems, records
from losslab.present.html import Html, markdown, message, no_results, table

NOT_RECORDED = ("not recorded yet: this record holds no Nsight Compute counters per rung beyond DRAM bytes; "
                "re-record with scripts/gpu_suite.sh on a GPU machine with Nsight Compute")


def ncu_record(section: records.Section, implementation: str, direction: str) -> records.Counters | None:
    """The ncu profile's counters of (implementation, direction), or None (no profile that ran, or no such record)."""
    if section.ncu is None or section.ncu.status != "ok":
        return None
    return section.ncu.find(implementation, direction)


# the counters that name a rung's flaw and its fix (``measure.ncu.Counters`` fields), in table order
COUNTERS = ("grid_size", "block_size", "active_sms", "achieved_occupancy_pct", "registers_per_thread",
            "load_requests", "load_sectors", "sectors_per_request", "l2_read_sectors", "barriers", "shuffles",
            "shared_instructions", "memory_throughput_pct", "dram_throughput_pct", "instructions_per_byte")
# what each counter says, one sentence each (the explorer shows them beside the values)
MEANINGS = {
    "grid_size": "blocks launched by the main kernel",
    "block_size": "threads per block of the main kernel",
    "active_sms": "SMs that ran at least one block: below the SM count, part of the GPU sat idle",
    "achieved_occupancy_pct": "resident warps per SM over the most an SM can hold, in %: the latency the SM can hide",
    "registers_per_thread": "registers each thread holds: more of them, fewer warps fit on an SM",
    "load_requests": "global load instructions issued by warps",
    "load_sectors": "32-byte sectors those loads asked L1/L2 for",
    "sectors_per_request": "sectors per load request: 4 when a warp reads 128 consecutive bytes (coalesced), "
                           "up to 32 when each lane reads its own line",
    "l2_read_sectors": "32-byte sectors read from L2",
    "barriers": "__syncthreads barriers executed (warp-level)",
    "shuffles": "warp shuffle instructions executed (register-to-register exchanges)",
    "shared_instructions": "shared-memory load and store instructions executed",
    "memory_throughput_pct": "the busiest memory unit's throughput over its peak, in %",
    "dram_throughput_pct": "DRAM throughput over its peak, in %: near 100 the kernel is bandwidth bound",
    "instructions_per_byte": "instructions executed per byte moved from DRAM: the work paid for each byte",
}
STALL_MEANING = "warps stalled for this reason per issued instruction (one of the main kernel's two largest)"


def counter_value(rec: records.Counters | None, name: str) -> float | None:
    """``name`` of an ncu record (a field or a derived property of ``Counters``); None where it is not a
    number or there is no record."""
    value = getattr(rec, name, None)
    return value if isinstance(value, (int, float)) else None


def counters(section: records.Section) -> dict[tuple[str, str], dict[str, float]]:
    """{(rung, direction): {counter: value}} for the :data:`COUNTERS` the ncu profile holds
    (the rungs only), plus ``stall: <reason>`` for the main kernel's two largest stall reasons;
    {} where the record holds none of them (profiles made before they were counted)."""
    ncu = section.ncu
    if ncu is None or ncu.status != "ok":
        return {}
    out = {}
    for rec in ncu.records or []:
        found = {n: v for n in COUNTERS if (v := counter_value(rec, n)) is not None}
        stalls = rec.stalls or {}
        found |= {f"stall: {k}": v for k, v in sorted(stalls.items(), key=lambda kv: -kv[1])[:2]}
        if rec.kind == "variant" and found:
            out[rec.implementation, rec.direction] = found
    return out


def counters_table(section: records.Section | None, direction: str = "forward",
                   rungs: tuple[str, ...] | list[str] | None = None, meanings: bool = False) -> Html:
    """The counters of :func:`counters` per rung in ``direction`` (rungs as columns, so a step
    reads left to right; ``rungs``: only those, default all), with a column saying what each
    counter means if ``meanings`` (:data:`MEANINGS`), or one line: not recorded yet."""
    if section is None:
        return no_results("counters")
    found = {k: v for k, v in counters(section).items() if k[1] == direction and (rungs is None or k[0] in rungs)}
    if not found:
        return message(NOT_RECORDED)
    rungs = [r for r in section.ladder if (r, direction) in found]
    names = list(dict.fromkeys(n for v in found.values() for n in v))

    def fmt(v) -> str:
        return "" if v is None else f"{v:.4g}"

    def meaning(n: str) -> list[str]:
        return [html.escape(MEANINGS.get(n, STALL_MEANING if n.startswith("stall: ") else ""))] if meanings else []

    body = [[html.escape(n), *meaning(n)] + [fmt(found[r, direction].get(n)) for r in rungs] for n in names]
    plain = "\n".join(f"{n}: " + "  ".join(f"{r} {fmt(found[r, direction].get(n))}" for r in rungs)
                      + (f" ({MEANINGS.get(n, STALL_MEANING)})" if meanings else "") for n in names)
    head = ["counter (Nsight Compute)", *(["what it says"] if meanings else []), *[f"<code>{r}</code>" for r in rungs]]
    return Html(table(head, body, caption=f"{direction}: counters per rung, as recorded", text_columns=len(head)
                      - len(rungs)), plain=plain)


def dram_over_minimum(section: records.Section, implementation: str, direction: str) -> float | None:
    """DRAM bytes read that ncu measured over the cost model's minimum bytes read (1.0: the
    minimum exactly); None without a profile of it at the section's shape in float32."""
    section = section.view()
    rec = ncu_record(section, implementation, direction)
    if rec is None or tuple(section.ncu.shape) != tuple(section.primary_shape or ()):
        return None
    cost = section.spec.cost(tuple(section.primary_shape), direction)
    return rec.dram_bytes_read / cost.bytes_read


def mufu_headroom(section: records.Section, implementation: str, direction: str = "forward") -> float | None:
    """How many times below the special-function (MUFU) ceiling the row runs: the measured MUFU
    rate's model FLOP/s (``mufu_ex2_tops`` × FLOP per transcendental) over its achieved FLOP/s.
    None without the ceiling, the row, or transcendentals in that direction."""
    section = section.view()
    tops = section.ceilings.get("mufu_ex2_tops")
    row = next((r for r in section.rows if (r.implementation, r.direction) == (implementation, direction)), None)
    if not tops or row is None:
        return None
    cost = section.spec.cost(tuple(row.shape), direction, getattr(torch, row.dtype))
    if not cost.transcendentals:
        return None
    return tops * 1e12 * cost.flops / cost.transcendentals / (cost.flops / (row.median_ms * 1e-3))


# --- work done elsewhere ----------------------------------------------------------------------------

# below this share of its minimum bytes, a direction's kernels did not do its work (Nsight Compute)
ELSEWHERE_SHARE = 0.01
# why an implementation's direction does no work of its own, where the reason is known
WHY_ELSEWHERE = {(peer, spec.name, direction): why for spec in problems.registered()
                 for (peer, direction), why in spec.peer_notes.items()}


@dataclass(frozen=True)
class Elsewhere:
    """A timed (implementation, direction) whose own kernels did not do its work: Nsight Compute
    measured them moving less than :data:`ELSEWHERE_SHARE` of the direction's minimum bytes (at the
    same shape, float32), or, without a profile, the implementation is known to do it elsewhere
    (:data:`WHY_ELSEWHERE`; ``dram_bytes`` None). Times in ms, bytes in bytes."""

    implementation: str
    direction: str
    median_ms: float
    fraction_of_bandwidth: float
    bandwidth: str
    below_floor: bool
    min_bytes: int
    dram_bytes: float | None
    ncu_ms: float | None
    launches: int | None
    why: str


def work_elsewhere(section: records.Section | None) -> list[Elsewhere]:
    """The rows of ``section``'s view whose own kernels did (almost) none of their work: by the ncu
    profile where it holds the row at the view's shape in float32, else by :data:`WHY_ELSEWHERE`;
    [] without a section."""
    if section is None:
        return []
    section = section.view()
    ncu = section.ncu
    profiled = (ncu is not None and ncu.status == "ok" and section.primary_dtype == "float32"
                and tuple(ncu.shape) == tuple(section.primary_shape or ()))
    out = []
    for row in section.rows:
        rec = ncu_record(section, row.implementation, row.direction) if profiled else None
        known = WHY_ELSEWHERE.get((row.implementation, row.problem, row.direction))
        cost = section.spec.cost(tuple(row.shape), row.direction, getattr(torch, row.dtype))
        moved = None if rec is None else (rec.dram_bytes_read or 0) + (rec.dram_bytes_written or 0)
        if (moved is not None and moved < ELSEWHERE_SHARE * cost.bytes) or (moved is None and known):
            why = known or "Its work was done in another direction (as a gradient written in the forward)."
            out.append(Elsewhere(row.implementation, row.direction, row.median_ms, row.fraction_of_bandwidth,
                                 row.bandwidth, row.below_floor, cost.bytes, moved,
                                 None if rec is None else rec.duration_ms,
                                 None if rec is None else rec.launches, why))
    return out


def _bytes(n: float) -> str:
    """``n`` bytes in decimal units: 6912 -> "6.91 KB", 1.07e9 -> "1.07 GB"."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def work_elsewhere_note(section: records.Section | None):
    """One Markdown paragraph per row of :func:`work_elsewhere`: its timed ms and share of the
    bandwidth (or that it is below the physical floor), what Nsight Compute measured its kernels
    doing, and why (:data:`WHY_ELSEWHERE`); an empty Markdown where no row did its work elsewhere."""
    lines = []
    for e in work_elsewhere(section):
        timed = (f"timed at {e.median_ms:.3f} ms, " + ("below the physical floor: no result" if e.below_floor else
                 f"{e.fraction_of_bandwidth:.0%} of the measured {e.bandwidth} bandwidth by its minimum bytes"))
        if e.dram_bytes is None:
            ncu = "this record holds no Nsight Compute profile of it"
        else:
            took = f" in {e.ncu_ms:.3f} ms" if e.ncu_ms is not None else ""
            ncu = (f"Nsight Compute measured {e.launches} kernel launch{'' if e.launches == 1 else 'es'} moving "
                   f"{_bytes(e.dram_bytes)} of DRAM traffic{took}, {e.dram_bytes / e.min_bytes:.1e} of the "
                   f"{_bytes(e.min_bytes)} a {e.direction} must move")
        lines.append(f"**{e.implementation} {e.direction}** on {section.device} ({timed}): {ncu}. {e.why}")
    return markdown("\n\n".join(lines))
