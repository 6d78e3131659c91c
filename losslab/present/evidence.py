"""The evidence for each step of a ladder, read from a record: what the notebooks claim about a
rung, stated once here with the numbers that support it, so that prose and data cannot part.

- :func:`steps` / :func:`steps_table`: each rung's time over the rung below's (× rung below),
  per direction, from the timing rows.
- :func:`naive_parallelism`: how many blocks and warps ``naive`` launches (its grid is
  ceil(rows / threads per block), read from the kernel file) against the device's SM count.
- :func:`counters_table`: the Nsight Compute counters of each rung and direction that the record
  holds (coalescing, parallelism, barriers and shuffles, the memory pipe, stalls); where it
  holds none, one line saying so.
- :func:`claims` / :func:`claims_table`: each claim a notebook makes, with the measured number
  and whether it holds on this record (None where the record lacks the data). A cpu-tier test
  asserts every claim holds on the committed records.
- :func:`predict` / :func:`score_prediction`: the reader's predicted times (the cost model's
  floor when they give none) against the measured ones.
- :func:`long_rows_before` / :func:`long_rows_after` / :func:`cluster_claims`: cross_entropy's
  rows too long for one SM (the sweep's 4096 x 131072 and 2048 x 262144): fused's and cluster's
  forward+backward against the read-once/write-once floor; :func:`cluster_machine_code`: the
  SASS instructions that carry cluster's idea (compiled here, no GPU needed).
"""
from __future__ import annotations

import html
import math
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from losslab import problems, records
from losslab.build import KERNELS, knobs
from losslab.present.html import Html, markdown, message, no_results, table
from losslab.present.results import bandwidth_gbps

DIRECTIONS = ("forward", "backward", "forward_backward")
MAX_WARPS_PER_SM = 64  # resident warps per SM on sm_80 and sm_90
NOT_RECORDED = ("not recorded yet: this record holds no Nsight Compute counters per rung beyond DRAM bytes; "
                "re-record with scripts/gpu_suite.sh on a GPU machine with Nsight Compute")


# --- x rung below ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Step:
    """One rung against the rung below it in one direction (times in ms, at the view's shape and dtype)."""

    lower: str
    upper: str
    direction: str
    lower_ms: float
    upper_ms: float

    @property
    def speedup(self) -> float:
        """× rung below: the lower rung's time over this rung's (above 1: faster)."""
        return self.lower_ms / self.upper_ms


def _times(section: records.Section) -> dict[tuple[str, str], float]:
    return {(r.implementation, r.direction): r.median_ms for r in section.rows if r.kind == "variant"}


def steps(section: records.Section) -> list[Step]:
    """Each adjacent pair of rungs in every direction both were timed in (the section's view)."""
    section = section.view()
    times = _times(section)
    rungs = problems.get(section.problem).variants
    return [Step(lo, up, d, times[lo, d], times[up, d]) for lo, up in zip(rungs, rungs[1:], strict=False)
            for d in DIRECTIONS if (lo, d) in times and (up, d) in times]


def step(section: records.Section, lower: str, upper: str, direction: str) -> Step | None:
    """The step from ``lower`` to ``upper`` in ``direction``, or None where either was not timed."""
    section = section.view()
    times = _times(section)
    if (lower, direction) in times and (upper, direction) in times:
        return Step(lower, upper, direction, times[lower, direction], times[upper, direction])
    return None


def steps_table(section: records.Section | None) -> Html:
    """× rung below per step (rows) and direction (columns), from the timing rows."""
    if section is None or not section.rows:
        return no_results("steps")
    found = {(s.lower, s.upper, s.direction): s for s in steps(section)}
    pairs = list(dict.fromkeys((s.lower, s.upper) for s in found.values()))
    body = [[f"<code>{lo}</code> &rarr; <code>{up}</code>"]
            + [(f"&times;{found[lo, up, d].speedup:.2f}" if (lo, up, d) in found else "") for d in DIRECTIONS]
            for lo, up in pairs]
    plain = "\n".join(f"{lo} -> {up}: " + "  ".join(f"{d} x{found[lo, up, d].speedup:.2f}"
                                                      for d in DIRECTIONS if (lo, up, d) in found)
                      for lo, up in pairs)
    return Html(table(["step", *DIRECTIONS], body, caption="&times; rung below: the lower rung's median time "
                      "over the upper's (above 1: the step paid)"), plain=plain)


# --- naive's parallelism -----------------------------------------------------------------------------

def threads_per_block(problem: str, rung: str) -> int:
    """The default of the ``THREADS`` knob of ``kernels/<problem>/<rung>.cu`` (``build.knobs``).

    Raises:
        ValueError: the file declares no THREADS knob.
    """
    found = [k.default for k in knobs.knobs(problem, rung, KERNELS) if k.name == "THREADS"]
    if not found:
        raise ValueError(f"kernels/{problem}/{rung}.cu: no THREADS knob (LOSSLAB_<PROBLEM>_<RUNG>_THREADS)")
    return found[0]


@dataclass(frozen=True)
class Parallelism:
    """One thread per row: ``blocks`` = ceil(rows / threads) blocks of ``threads``; each block
    runs on one SM, so at most ``blocks`` of the ``sms`` SMs are busy, each with ``warps_per_sm``
    of the ``MAX_WARPS_PER_SM`` warps it could hold. ``gbps_per_sm``: the forward's minimum bytes
    over its median time, per busy SM (None without a timed forward)."""

    rows: int
    threads: int
    blocks: int
    sms: int
    gbps_per_sm: float | None

    @property
    def busy_sms(self) -> int:
        """At most one block per SM here (8 warps of the 64 an SM holds); all blocks where the
        SM count is unknown."""
        return min(self.blocks, self.sms) if self.sms else self.blocks

    @property
    def warps_per_sm(self) -> float:
        return self.blocks * self.threads / 32 / self.busy_sms

    def describe(self) -> str:
        idle = self.sms - self.busy_sms
        per_sm = f"; each busy SM moves {self.gbps_per_sm:.1f} GB/s" if self.gbps_per_sm else ""
        return (f"{self.rows} rows / {self.threads} threads per block = {self.blocks} blocks on {self.sms} SMs: "
                f"{self.busy_sms} SMs run {self.warps_per_sm:g} warps each (of {MAX_WARPS_PER_SM} they could "
                f"hold), {idle} SMs idle{per_sm}")


def naive_parallelism(section: records.Section, rung: str | None = None) -> Parallelism:
    """The launch of ``rung`` (default the ladder's first, one thread per row) at the section's
    shape, against its device's SM count."""
    section = section.view()
    rung = rung or problems.get(section.problem).variants[0]
    rows = (section.primary_shape or problems.get(section.problem).sizes["seed"])[0]
    threads = threads_per_block(section.problem, rung)
    blocks = math.ceil(rows / threads)
    forward = next((r for r in section.rows if r.implementation == rung and r.direction == "forward"), None)
    sms = section.multiprocessors or 0
    gbps = None
    if forward and sms:
        cost = problems.get(section.problem).cost(tuple(forward.shape), "forward", getattr(torch, forward.dtype))
        gbps = cost.bytes / (forward.median_ms * 1e6) / min(blocks, sms)
    return Parallelism(rows, threads, blocks, sms, gbps)


# --- Nsight Compute ----------------------------------------------------------------------------------

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


def _counter(rec: records.Counters, name: str) -> float | None:
    """``name`` of an ncu record (a field or a derived property of ``Counters``); None where it is not a number."""
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
        found = {n: v for n in COUNTERS if (v := _counter(rec, n)) is not None}
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
    rungs = [r for r in problems.get(section.problem).variants if (r, direction) in found]
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
    cost = problems.get(section.problem).cost(tuple(section.primary_shape), direction)
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
    cost = problems.get(section.problem).cost(tuple(row.shape), direction, getattr(torch, row.dtype))
    if not cost.transcendentals:
        return None
    return tops * 1e12 * cost.flops / cost.transcendentals / (cost.flops / (row.median_ms * 1e-3))


# --- work done elsewhere ----------------------------------------------------------------------------

# below this share of its minimum bytes, a direction's kernels did not do its work (Nsight Compute)
ELSEWHERE_SHARE = 0.01
# why an implementation's direction does no work of its own, where the reason is known
WHY_ELSEWHERE = {(peer, name, direction): why for name in problems.names()
                 for (peer, direction), why in problems.get(name).peer_notes.items()}


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
        cost = problems.get(row.problem).cost(tuple(row.shape), row.direction, getattr(torch, row.dtype))
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


# --- one step on every recorded device ----------------------------------------------------------------

def step_on_devices(problem: str, lower: str, upper: str, direction: str, results_dir=None):
    """The step from ``lower`` to ``upper`` in ``direction`` on each device with a record of
    ``problem`` (its view: the seed size in float32), beside that device's measured read and copy
    bandwidth, as a Markdown list; one line saying so where no record holds the step."""
    folder = results_dir or records.RESULTS_DIR
    lines = []
    for device in records.devices(folder):
        try:
            section = records.latest_section(problem, device, folder).view()
        except LookupError:
            continue
        s = step(section, lower, upper, direction)
        if s is not None:
            bw = bandwidth_gbps(section)
            lines.append(f"- {device}: `{lower}` &rarr; `{upper}` {direction} &times;{s.speedup:.2f} "
                         f"({s.lower_ms:.3f} &rarr; {s.upper_ms:.3f} ms), measured read bandwidth "
                         f"{bw['read']:.0f} GB/s, copy {bw['copy']:.0f} GB/s")
    return markdown("\n".join(lines) or f"No record holds {problem}'s {lower} and {upper} {direction} yet.")


def fraction_statement(section: records.Section | None, rung: str, direction: str):
    """"<rung>'s <direction> reaches N% of the measured <read|copy> bandwidth (device)" from the
    record, as Markdown; one line saying so without a section or the row."""
    row = _row(section.view(), rung, direction) if section is not None else None
    if row is None:
        return markdown(f"No {rung} {direction} row recorded here.")
    return markdown(f"On {section.device}'s record `{rung}`'s {direction} reaches "
                    f"{fraction_of_ceiling(section.view(), row):.0%} of the measured {row.bandwidth} bandwidth "
                    f"({row.median_ms:.3f} ms).")


# --- the claims the notebooks make -------------------------------------------------------------------

@dataclass(frozen=True)
class Claim:
    """One claim a notebook makes about ``problem``'s ladder: ``statement`` with the measured
    number in it; ``holds`` True or False on this record, None where the record lacks the data."""

    problem: str
    key: str
    statement: str
    holds: bool | None


def _row(section: records.Section, implementation: str, direction: str):
    return next((r for r in section.rows if (r.implementation, r.direction) == (implementation, direction)), None)


def _step_claim(section, key, lower, upper, direction, low, high, what) -> Claim:
    s = step(section, lower, upper, direction)
    value = f"&times;{s.speedup:.2f}" if s else "not timed"
    return Claim(section.problem, key, f"{lower} &rarr; {upper} {direction}: {value} ({what})",
                 None if s is None else low <= s.speedup <= high)


def fraction_of_ceiling(section: records.Section, row) -> float:
    """The row's floor (minimum bytes over the measured read or copy bandwidth) over its median
    time: 1.0 on the measured roof, above 1 faster than the reference kernels that set it."""
    from losslab.present.tables import floor_ms

    return floor_ms(row.problem, tuple(row.shape), row.direction, bandwidth_gbps(section), row.dtype) / row.median_ms


def _fraction_claim(section, key, rung, direction, minimum) -> Claim:
    row = _row(section, rung, direction)
    value = f"{fraction_of_ceiling(section, row):.0%}" if row else "not timed"
    return Claim(section.problem, key, f"{rung} {direction} reaches {value} of the measured "
                 f"{row.bandwidth if row else ''} ceiling (at least {minimum:.0%}: scalar loads already saturate it)",
                 None if row is None else fraction_of_ceiling(section, row) >= minimum)


def _naive_claims(section: records.Section) -> list[Claim]:
    naive = problems.get(section.problem).variants[0]
    par = naive_parallelism(section, naive)
    excess = dram_over_minimum(section, naive, "forward")
    dram = (f"{naive} forward reads {excess:.4f} x the minimum bytes from DRAM (uncoalesced loads cost L1/L2 "
            "sectors and requests, not DRAM bytes)" if excess else f"{naive} forward DRAM bytes: no ncu profile")
    return [Claim(section.problem, "naive_parallelism", par.describe(),
                  None if not par.sms else par.blocks < par.sms and par.warps_per_sm <= MAX_WARPS_PER_SM / 4),
            Claim(section.problem, "naive_dram_minimum", dram, None if excess is None else excess < 1.02)]


def _roof_claims(section: records.Section, best: str) -> list[Claim]:
    headroom = mufu_headroom(section, best, "forward")
    sheet = section.ceilings.get("datasheet") or {}
    limit = sheet.get("memory_gbps", 0) / (section.ceilings.get("read_gbps") or math.inf)
    fraction = {id(r): fraction_of_ceiling(section, r) for r in section.rows}
    above = [r for r in section.rows if fraction[id(r)] > 1 and not r.below_floor]
    worst = max(above, key=lambda r: fraction[id(r)], default=None)
    return [
        Claim(section.problem, "mufu_headroom",
              f"{best} forward runs {headroom:.1f}x below the special-function (MUFU) ceiling (less than 8x: the "
              "MUFU roof is near)" if headroom else "no MUFU ceiling recorded", None if headroom is None else
              headroom < 8),
        Claim(section.problem, "above_roof_below_datasheet",
              (f"{len(above)} rows above the measured ceiling, the highest {worst.implementation} {worst.direction} "
               f"at {fraction[id(worst)]:.0%}, all below the datasheet peak ({limit:.0%} of it)") if worst
              else "no row above the measured ceiling",
              None if not limit else all(fraction[id(r)] < limit for r in above)),
    ]


def _falls(section, key, lower, upper, name, what) -> Claim:
    found = counters(section)
    a, b = (found.get((r, "forward"), {}).get(name) for r in (lower, upper))
    if a is None or b is None:
        return Claim(section.problem, key, f"{name}, {lower} &rarr; {upper} forward ({what}): {NOT_RECORDED}", None)
    return Claim(section.problem, key, f"{name}, {lower} &rarr; {upper} forward: {a:.4g} &rarr; {b:.4g} ({what})",
                 b < a)


def _counter_claims(section: records.Section) -> list[Claim]:
    naive, shared, shuffle, *_ = problems.get(section.problem).variants
    active = counters(section).get((naive, "forward"), {}).get("active_sms")
    sms = section.multiprocessors
    return [Claim(section.problem, "naive_active_sms",
                  f"{naive} forward keeps {active:.0f} of {sms} SMs busy (measured)" if active is not None
                  else f"{naive}'s active SMs: {NOT_RECORDED}", None if active is None else active < sms),
            _falls(section, "coalescing", naive, shared, "sectors_per_request", "coalesced: fewer sectors per request"),
            _falls(section, "fewer_barriers", shared, shuffle, "barriers",
                   "shuffles replace the barrier-separated tree")]


def claims(section: records.Section) -> list[Claim]:
    """Every claim notebooks 01-03 make about ``section``'s problem, checked on its view."""
    section = section.view()
    naive, shared, shuffle, vector, *_ = problems.get(section.problem).variants
    out = _naive_claims(section)
    out.append(_step_claim(section, "shuffle_flat", shared, shuffle, "forward", 0.95, 1.05,
                           "within 5%: the tree's steps are a small part of a row's time at this size"))
    spec = problems.get(section.problem)
    rung, direction, least = spec.saturates
    out.append(_fraction_claim(section, "scalar_saturates", rung, direction, least))
    out += [_step_claim(section, key, lower, upper, direction, low, high, why)
            for key, lower, upper, direction, low, high, why in spec.step_claims]
    return out + _roof_claims(section, vector) + _counter_claims(section)


def claims_table(section: records.Section | None, found: list[Claim] | None = None) -> Html:
    """The claims of :func:`claims` (or ``found``, e.g. :func:`cluster_claims`) with their numbers
    and a mark: holds, fails, or not recorded."""
    if section is None:
        return no_results("claims")
    marks = {True: "&#10003; holds", False: "&#10007; fails", None: "not recorded yet"}
    found = claims(section) if found is None else found
    body = [[f"<code>{c.key}</code>", c.statement, marks[c.holds]] for c in found]
    plain = "\n".join(f"{c.key}: {html.unescape(c.statement)} [{html.unescape(marks[c.holds])}]" for c in found)
    return Html(table(["claim", "what the record says", ""], body, text_columns=2), plain=plain)


def naive_step_ratio(section: records.Section, other: records.Section) -> str:
    """Why naive -> shared_memory pays more in one problem than in another: the ratio of the two
    steps as (busy SMs of the other's naive / this one's) x (this one's shared_memory forward
    fraction of bandwidth / the other's), from the records."""
    a, b = section.view(), other.view()
    names = [problems.get(s.problem).variants[:2] for s in (a, b)]
    sa, sb = step(a, *names[0], "forward"), step(b, *names[1], "forward")
    pa, pb = naive_parallelism(a), naive_parallelism(b)
    fa, fb = _row(a, names[0][1], "forward"), _row(b, names[1][1], "forward")
    if not (sa and sb and fa and fb):
        return "not timed in both records"
    return (f"{b.problem}'s step x{sb.speedup:.2f} / {a.problem}'s x{sa.speedup:.2f} = {sb.speedup / sa.speedup:.2f}; "
            f"naive's busy SMs {pa.busy_sms} / {pb.busy_sms} = {pa.busy_sms / pb.busy_sms:.2f} times "
            f"shared_memory's fraction of bandwidth {fb.fraction_of_bandwidth:.0%} / {fa.fraction_of_bandwidth:.0%} = "
            f"{fb.fraction_of_bandwidth / fa.fraction_of_bandwidth:.2f}: product "
            f"{pa.busy_sms / pb.busy_sms * fb.fraction_of_bandwidth / fa.fraction_of_bandwidth:.2f}")


# --- predict, then measure ---------------------------------------------------------------------------

def predict(section: records.Section | None, predicted_ms: dict | float | None = None,
            direction: str = "forward") -> dict[str, float]:
    """{rung: predicted ms} in ``direction``: the reader's numbers (one float for every rung, or
    a dict per rung), else the cost model's floor (minimum bytes over the measured bandwidth).

    Raises:
        ValueError: a prediction that is not a positive number, or a rung not in the ladder.
    """
    from losslab.present.tables import floor_ms

    if section is None or not section.rows:
        return {}
    section = section.view()
    rungs = [r for r in problems.get(section.problem).variants if _row(section, r, direction)]
    floor = floor_ms(section.problem, tuple(section.primary_shape), direction, bandwidth_gbps(section),
                     section.primary_dtype or "float32")
    given = predicted_ms if isinstance(predicted_ms, dict) else dict.fromkeys(rungs, predicted_ms)
    out = {}
    for rung in rungs:
        value = given.get(rung)
        if value is not None and (not isinstance(value, (int, float)) or value <= 0):
            raise ValueError(f"predicted_ms: {rung}: expected a positive time in ms, got {value!r}")
        out[rung] = float(value) if value is not None else floor
    unknown = set(given) - set(rungs)
    if unknown:
        raise ValueError(f"predicted_ms: {', '.join(sorted(unknown))} not timed; expected some of {', '.join(rungs)}")
    return out


def score_prediction(section: records.Section | None, predicted: dict[str, float],
                     direction: str = "forward") -> Html:
    """Each rung's predicted against its measured time: measured / predicted and a verdict
    (within 25%, or how many times slower or faster than predicted)."""
    if section is None:
        return no_results("the measured times to score against")
    section = section.view()
    body, plain = [], []
    for rung, ms in predicted.items():
        row = _row(section, rung, direction)
        if row is None:
            continue
        ratio = row.median_ms / ms
        verdict = ("within 25%" if 0.8 <= ratio <= 1.25 else
                   f"{ratio:.1f}x slower than predicted" if ratio > 1 else f"{1 / ratio:.1f}x faster than predicted")
        body.append([f"<code>{rung}</code>", f"{ms:.3f}", f"{row.median_ms:.3f}", f"{ratio:.2f}", verdict])
        plain.append(f"{rung}: predicted {ms:.3f} ms, measured {row.median_ms:.3f} ms: {verdict}")
    return Html(table(["rung", "predicted ms", "measured ms", "measured / predicted", "score"], body,
                      caption=f"{direction}: your prediction against the measurement"), plain="\n".join(plain))


# --- cluster: rows too long for one SM ---------------------------------------------------------------

# the sweep's LLM-vocabulary shapes (measure.bench.SWEEP_SHAPES): float32 rows of 512 KiB and 1 MiB,
# far beyond the 16 KiB of a row that fused holds in registers
LONG_ROWS = ((4096, 131072), (2048, 262144))
LONG_ROW_DTYPES = ("float32", "bfloat16")
# where time alone shows the single read (above the bound of a kernel that reads the logits twice) on
# both recorded devices: float32 rows of 512 KiB. In bfloat16, and at 1 MiB float32 rows on the H200
# (62 % of its floor, 2048 clusters of 8 CTAs), cluster runs near that bound, so there time cannot tell
READ_ONCE_CASES = (((4096, 131072), "float32"),)
RERECORD = "python -m losslab bench cross_entropy --sweep --dtypes float32,bfloat16"


def split_rung(problem: str) -> tuple[str, str]:
    """(lower, upper): the rung that splits a long row over a cluster and the rung it falls back
    to, from the rung table (``Rung.falls_back_to``).

    Raises:
        ValueError: ``problem`` has no rung that falls back to another.
    """
    found = [(r.falls_back_to, r.name) for r in problems.get(problem).rungs if r.falls_back_to]
    if not found:
        raise ValueError(f"problem: {problem} has no rung that falls back to another (no cluster rung)")
    return found[0]


@dataclass(frozen=True)
class LongRow:
    """The lower rung (fused) and the cluster rung, forward+backward, at one long-row shape and
    dtype of a recorded sweep. Times in ms, None where the record holds no such row.

    ``floor_ms``: the read-once/write-once floor, the cost model's minimum bytes (logits and
    targets read once, gradient written once) at the datasheet's peak bandwidth
    (``BenchRow.floor_ms``; None for a device without datasheet figures). ``reread_bound``: the
    most of that floor a kernel that reads the logits twice can reach (minimum bytes over minimum
    bytes plus the logits once more)."""

    shape: tuple[int, int]
    dtype: str
    floor_ms: float | None
    lower_ms: float | None
    cluster_ms: float | None
    reread_bound: float

    def of_floor(self, ms: float | None) -> float | None:
        """floor_ms / ms (1.0: on the floor); None without either."""
        return None if ms is None or self.floor_ms is None else self.floor_ms / ms

    @property
    def speedup(self) -> float | None:
        """× fused: the lower rung's time over cluster's (above 1: cluster faster); None without both."""
        return None if self.lower_ms is None or self.cluster_ms is None else self.lower_ms / self.cluster_ms

    @property
    def label(self) -> str:
        return f"{self.shape[0]} x {self.shape[1]} {self.dtype}"


def long_rows(section: records.Section) -> list[LongRow]:
    """fused and cluster forward+backward at each of :data:`LONG_ROWS` in each of
    :data:`LONG_ROW_DTYPES`, read from all of ``section``'s rows (a recorded section, not its view).

    Raises:
        ValueError: ``section`` is not of cross_entropy (no cluster rung).
    """
    lower, upper = split_rung(section.problem)
    spec = problems.get(section.problem)
    found = {(tuple(r.shape), r.dtype, r.implementation): r for r in section.rows
             if r.direction == "forward_backward" and r.kind == "variant"}
    out = []
    for shape in LONG_ROWS:
        for dtype in LONG_ROW_DTYPES:
            cost = spec.cost(shape, "forward_backward", getattr(torch, dtype))
            logits = shape[0] * shape[1] * torch.finfo(getattr(torch, dtype)).bits // 8
            rows = [found.get((shape, dtype, rung)) for rung in (lower, upper)]
            floor = next((r.floor_ms for r in rows if r is not None and r.floor_ms), None)
            lower_ms, cluster_ms = (r.median_ms if r else None for r in rows)
            out.append(LongRow(shape, dtype, floor, lower_ms, cluster_ms, cost.bytes / (cost.bytes + logits)))
    return out


def _where(section: records.Section) -> str:
    if section.source == "live":
        return f"the sweep measured now on {section.device}"
    return f"{section.device}'s record ({section.date[:10] or 'undated'})"


def _pct(value: float | None) -> str:
    return "?" if value is None else f"{value:.0%}"


def long_rows_before(section: records.Section | None) -> Html:
    """The flaw cluster fixes, from the record: per long-row shape and dtype, fused's
    forward+backward time, its fraction of the read-once/write-once floor, and the most of it a
    kernel that reads the logits twice can reach. One line where the record holds none of it."""
    if section is None:
        return no_results("long-row sweep")
    lower, _ = split_rung(section.problem)
    found = [r for r in long_rows(section) if r.lower_ms is not None]
    if not found:
        return message(f"{_where(section)} holds no {lower} forward+backward rows at "
                       f"{' or '.join(f'{a} x {b}' for a, b in LONG_ROWS)}: re-record the sweep on a GPU machine "
                       f"with `{RERECORD}`")
    lines = [f"{r.label}: {lower} forward+backward {r.lower_ms:.3f} ms, {_pct(r.of_floor(r.lower_ms))} of the "
             f"read-once/write-once floor" + (f" ({r.floor_ms:.3f} ms)" if r.floor_ms else " (no datasheet floor)")
             + f"; a kernel that reads the logits twice reaches at most {_pct(r.reread_bound)} of it" for r in found]
    body = "".join(f"<li>{html.escape(line)}</li>" for line in lines)
    return Html(f"<p>From {html.escape(_where(section))}:</p><ul>{body}</ul>",
                plain="\n".join([f"From {_where(section)}:", *lines]))


def long_rows_after(section: records.Section | None) -> Html:
    """The measured after: per long-row shape and dtype, fused's and cluster's forward+backward
    times, each one's fraction of the floor, and × fused (fused's time over cluster's). One line
    where the record holds no cluster row at these shapes (nothing else is shown)."""
    if section is None:
        return no_results("long-row sweep")
    lower, upper = split_rung(section.problem)
    found = long_rows(section)
    if not any(r.cluster_ms is not None for r in found):
        return message(f"{_where(section)} holds no {upper} rows at {' or '.join(f'{a} x {b}' for a, b in LONG_ROWS)} "
                       f"yet (it predates the rung): re-record the sweep on a GPU machine with `{RERECORD}`")

    def ms(value: float | None) -> str:
        return "not recorded" if value is None else f"{value:.3f}"

    def above(r: LongRow) -> str:
        fraction = r.of_floor(r.cluster_ms)
        return "" if fraction is None else "yes" if fraction > r.reread_bound else "no"

    body = [[html.escape(r.label), ms(r.floor_ms), ms(r.lower_ms), _pct(r.of_floor(r.lower_ms)), ms(r.cluster_ms),
             _pct(r.of_floor(r.cluster_ms)), f"&times;{r.speedup:.2f}" if r.speedup else "", _pct(r.reread_bound),
             above(r)] for r in found]
    plain = "\n".join(f"{r.label}: {lower} {ms(r.lower_ms)} ms ({_pct(r.of_floor(r.lower_ms))} of the floor), "
                      f"{upper} {ms(r.cluster_ms)} ms ({_pct(r.of_floor(r.cluster_ms))})"
                      + (f", x{r.speedup:.2f} {lower}" if r.speedup else "")
                      + (f"; above the {_pct(r.reread_bound)} of a kernel that reads twice: {above(r)}" if above(r)
                         else "") for r in found)
    head = ["shape, dtype", "floor ms", f"<code>{lower}</code> ms", "of floor", f"<code>{upper}</code> ms",
            "of floor", f"&times; {lower}", "two-read bound", f"<code>{upper}</code> above it"]
    caption = (f"forward+backward, {html.escape(_where(section))}: the floor reads the logits once and writes the "
               f"gradient once at the datasheet's peak; &times; {lower}: {lower}'s time over {upper}'s; the "
               "two-read bound: the most of the floor a kernel that reads the logits twice can reach")
    return Html(table(head, body, caption=caption), plain=plain)


def cluster_claims(section: records.Section | None) -> list[Claim]:
    """What the cluster section of notebook 02 claims, per long-row shape and dtype (all rows of
    ``section``, not its view): fused re-reads the logits (its fraction of the floor at most the
    re-read bound); cluster is faster than fused; and, in :data:`READ_ONCE_CASES`, cluster reads
    them once (its fraction of the floor above the re-read bound). None where the record lacks
    the rows or the floor; [] without a section.

    Raises:
        ValueError: ``section`` is not of cross_entropy (no cluster rung).
    """
    if section is None:
        return []
    lower, upper = split_rung(section.problem)
    out = []
    for r in long_rows(section):
        key = f"{r.shape[0]}x{r.shape[1]}_{r.dtype}"
        low, high = r.of_floor(r.lower_ms), r.of_floor(r.cluster_ms)
        missing = f"{r.label}: {{}} not recorded yet"
        out += [
            Claim(section.problem, f"{lower}_rereads_{key}",
                  missing.format(f"{lower} forward+backward or its floor") if low is None else
                  f"{r.label}: {lower} reaches {low:.0%} of the read-once/write-once floor, at most the "
                  f"{r.reread_bound:.0%} of a kernel that reads the logits twice", None if low is None else
                  low <= r.reread_bound),
            Claim(section.problem, f"{upper}_faster_{key}",
                  missing.format(f"{upper} or {lower} forward+backward") if r.speedup is None else
                  f"{r.label} forward+backward: {upper} {r.cluster_ms:.3f} ms against {lower} {r.lower_ms:.3f} ms, "
                  f"&times;{r.speedup:.2f} {lower} (above 1: faster)", None if r.speedup is None else r.speedup > 1),
        ]
        if (tuple(r.shape), r.dtype) in READ_ONCE_CASES:
            out.append(Claim(section.problem, f"{upper}_reads_once_{key}",
                             missing.format(f"{upper} forward+backward or its floor") if high is None else
                             f"{r.label}: {upper} reaches {high:.0%} of the read-once/write-once floor, above the "
                             f"{r.reread_bound:.0%} a kernel that reads the logits twice can reach",
                             None if high is None else high > r.reread_bound))
    return out


# the instructions that carry cluster's idea in its forward kernel, each with what it does
# (tests/test_compile.py requires them in the SASS)
CLUSTER_SASS = (
    ("UBLKCP.S.G", r"UBLKCP\.S\.G", "bulk copy (TMA) of a quarter of this CTA's slice, global to shared memory"),
    ("SYNCS.PHASECHK", r"SYNCS\.PHASECHK", "wait on that copy's mbarrier until its bytes have landed"),
    ("UCGABAR_ARV", r"UCGABAR_ARV", "cluster barrier, arrive: first that this CTA runs, then that its part is written"),
    ("UCGABAR_WAIT", r"UCGABAR_WAIT",
     "cluster barrier, wait: for every CTA of the row (before writing into it; before reading)"),
    ("SR_SWINHI", r"SR_SWINHI", "the base of the cluster's shared window: the other CTAs' shared memory"),
    ("ST.E.128", r"\bST\.E\.128\b",
     "its (max, sum, target's logit) stored into CTA r's shared memory (by thread r) through the window"),
    ("LDS.128", r"LDS\.128", "the slice read from shared memory, 16 bytes a thread: for the sum and the gradient"),
    ("STG.E.128", r"STG\.E\.128", "the gradient written from it, 16 bytes a thread"),
)


def cluster_machine_code(problem: str, arch: str = "sm_90") -> Html:
    """The :data:`CLUSTER_SASS` instructions in the float32 forward kernel of ``problem``'s
    cluster rung, compiled here for ``arch`` (no GPU needed): per instruction its count and its
    first line (opcode and operands). One line where nvcc or cuobjdump is missing.

    Raises:
        ValueError: ``problem`` has no cluster rung.
    """
    from losslab.build import BuildError, compile_cubin, disassemble
    from losslab.present.machine_code import NO_NVCC

    _, upper = split_rung(problem)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            cubin, _ = compile_cubin(KERNELS / problem / f"{upper}.cu", arch, Path(tmp))
            code = disassemble(cubin)
    except (BuildError, OSError):
        return message(NO_NVCC)
    kernel = next((body for name, body in code.items() if "forward_kernelIfE" in name), "")
    lines = [re.sub(r"\s+", " ", re.sub(r"/\*[^*]*\*/", "", raw)).strip().rstrip(";").strip()
             for raw in kernel.splitlines()]
    rows = []
    for opcode, pattern, meaning in CLUSTER_SASS:
        hits = [line for line in lines if re.search(pattern, line)]
        rows.append((opcode, len(hits), hits[0] if hits else "", meaning))
    body = [[f"<code>{op}</code>", html.escape(meaning), f"<code>{html.escape(first)}</code>", str(n)]
            for op, n, first, meaning in rows]
    plain = "\n".join(f"{op:15} {n:3}  {first:44}  {meaning}" for op, n, first, meaning in rows)
    return Html(table(["instruction", "what it carries", "first line", "count"], body, text_columns=3,
                      caption=f"kernels/{problem}/{upper}.cu, float32 forward kernel, SASS for {arch} (compiled here)"),
                plain=plain)
