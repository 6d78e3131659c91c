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
"""
from __future__ import annotations

import html
import math
from dataclasses import dataclass

import torch

from losslab import problems, records
from losslab.build import KERNELS, knobs
from losslab.present.html import Html, message, no_results, table
from losslab.present.results import as_section, bandwidth_gbps

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


def steps(section: records.Section | dict) -> list[Step]:
    """Each adjacent pair of rungs in every direction both were timed in (the section's view)."""
    section = as_section(section).view()
    times = _times(section)
    rungs = problems.get(section.problem).variants
    return [Step(lo, up, d, times[lo, d], times[up, d]) for lo, up in zip(rungs, rungs[1:], strict=False)
            for d in DIRECTIONS if (lo, d) in times and (up, d) in times]


def step(section: records.Section | dict, lower: str, upper: str, direction: str) -> Step | None:
    """The step from ``lower`` to ``upper`` in ``direction``, or None where either was not timed."""
    section = as_section(section).view()
    times = _times(section)
    if (lower, direction) in times and (upper, direction) in times:
        return Step(lower, upper, direction, times[lower, direction], times[upper, direction])
    return None


def steps_table(section: records.Section | dict | None) -> Html:
    """× rung below per step (rows) and direction (columns), from the timing rows."""
    section = as_section(section)
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


def naive_parallelism(section: records.Section | dict, rung: str | None = None) -> Parallelism:
    """The launch of ``rung`` (default the ladder's first, one thread per row) at the section's
    shape, against its device's SM count."""
    section = as_section(section).view()
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

def ncu_record(section: records.Section, implementation: str, direction: str) -> dict | None:
    """The ncu profile's record of (implementation, direction), or None."""
    ncu = section.ncu or {}
    if ncu.get("status") != "ok":
        return None
    return next((r for r in ncu.get("records", []) if (r["implementation"], r["direction"]) ==
                 (implementation, direction)), None)


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


def _counter(rec, name: str) -> float | None:
    """``name`` of an ncu record (a ``Counters`` or the dict of an older record); derived
    counters are computed where the record is a plain dict."""
    value = rec.get(name)
    if value is None and name == "sectors_per_request" and rec.get("load_requests"):
        value = (rec.get("load_sectors") or 0) / rec["load_requests"]
    return value if isinstance(value, (int, float)) else None


def counters(section: records.Section | dict) -> dict[tuple[str, str], dict[str, float]]:
    """{(rung, direction): {counter: value}} for the :data:`COUNTERS` the ncu profile holds
    (the rungs only), plus ``stall: <reason>`` for the main kernel's two largest stall reasons;
    {} where the record holds none of them (profiles made before they were counted)."""
    section = as_section(section)
    ncu = section.ncu or {}
    if ncu.get("status") != "ok":
        return {}
    out = {}
    for rec in ncu.get("records") or []:
        found = {n: v for n in COUNTERS if (v := _counter(rec, n)) is not None}
        stalls = rec.get("stalls") or {}
        found |= {f"stall: {k}": v for k, v in sorted(stalls.items(), key=lambda kv: -kv[1])[:2]}
        if rec["kind"] == "variant" and found:
            out[rec["implementation"], rec["direction"]] = found
    return out


def counters_table(section: records.Section | dict | None, direction: str = "forward",
                   rungs: tuple[str, ...] | list[str] | None = None, meanings: bool = False) -> Html:
    """The counters of :func:`counters` per rung in ``direction`` (rungs as columns, so a step
    reads left to right; ``rungs``: only those, default all), with a column saying what each
    counter means if ``meanings`` (:data:`MEANINGS`), or one line: not recorded yet."""
    section = as_section(section)
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


def dram_over_minimum(section: records.Section | dict, implementation: str, direction: str) -> float | None:
    """DRAM bytes read that ncu measured over the cost model's minimum bytes read (1.0: the
    minimum exactly); None without a profile of it at the section's shape in float32."""
    section = as_section(section).view()
    rec = ncu_record(section, implementation, direction)
    if rec is None or tuple((section.ncu or {}).get("shape", ())) != tuple(section.primary_shape or ()):
        return None
    cost = problems.get(section.problem).cost(tuple(section.primary_shape), direction)
    return rec["dram_bytes_read"] / cost.bytes_read


def mufu_headroom(section: records.Section | dict, implementation: str, direction: str = "forward") -> float | None:
    """How many times below the special-function (MUFU) ceiling the row runs: the measured MUFU
    rate's model FLOP/s (``mufu_ex2_tops`` × FLOP per transcendental) over its achieved FLOP/s.
    None without the ceiling, the row, or transcendentals in that direction."""
    section = as_section(section).view()
    tops = section.ceilings.get("mufu_ex2_tops")
    row = next((r for r in section.rows if (r.implementation, r.direction) == (implementation, direction)), None)
    if not tops or row is None:
        return None
    cost = problems.get(section.problem).cost(tuple(row.shape), direction, getattr(torch, row.dtype))
    if not cost.transcendentals:
        return None
    return tops * 1e12 * cost.flops / cost.transcendentals / (cost.flops / (row.median_ms * 1e-3))


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
              f"{best} forward runs {headroom:.1f}x below the special-function (MUFU) ceiling (less than 5x: the "
              "MUFU roof is near)" if headroom else "no MUFU ceiling recorded", None if headroom is None else
              headroom < 5),
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


def claims(section: records.Section | dict) -> list[Claim]:
    """Every claim notebooks 01-03 make about ``section``'s problem, checked on its view."""
    section = as_section(section).view()
    naive, shared, shuffle, vector, *_ = problems.get(section.problem).variants
    out = _naive_claims(section)
    out.append(_step_claim(section, "shuffle_flat", shared, shuffle, "forward", 0.95, 1.05,
                           "within 5%: the tree's steps are a small part of a row's time at this size"))
    if section.problem == "kl_div":
        out += [_fraction_claim(section, "scalar_saturates", shuffle, "forward", 0.95),
                _step_claim(section, "vector_flat", shuffle, vector, "forward", 0.95, 1.05, "within 5%: flat"),
                _step_claim(section, "vector_pays", shuffle, vector, "backward", 1.3, math.inf,
                            "at least x1.3: one element per thread before, one pack after")]
    elif section.problem == "cross_entropy":
        out += [_fraction_claim(section, "scalar_saturates", shuffle, "backward", 0.90),
                _step_claim(section, "vector_flat", shuffle, vector, "backward", 0.95, 1.05, "within 5%: flat"),
                _step_claim(section, "vector_pays", shuffle, vector, "forward", 1.2, math.inf,
                            "at least x1.2, with the switch to one warp per row")]
    return out + _roof_claims(section, vector) + _counter_claims(section)


def claims_table(section: records.Section | dict | None) -> Html:
    """The claims of :func:`claims` with their numbers and a mark: holds, fails, or not recorded."""
    section = as_section(section)
    if section is None:
        return no_results("claims")
    marks = {True: "&#10003; holds", False: "&#10007; fails", None: "not recorded yet"}
    found = claims(section)
    body = [[f"<code>{c.key}</code>", c.statement, marks[c.holds]] for c in found]
    plain = "\n".join(f"{c.key}: {html.unescape(c.statement)} [{html.unescape(marks[c.holds])}]" for c in found)
    return Html(table(["claim", "what the record says", ""], body, text_columns=2), plain=plain)


def naive_step_ratio(section: records.Section | dict, other: records.Section | dict) -> str:
    """Why naive -> shared_memory pays more in one problem than in another: the ratio of the two
    steps as (busy SMs of the other's naive / this one's) x (this one's shared_memory forward
    fraction of bandwidth / the other's), from the records."""
    a, b = as_section(section).view(), as_section(other).view()
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

def predict(section: records.Section | dict | None, predicted_ms: dict | float | None = None,
            direction: str = "forward") -> dict[str, float]:
    """{rung: predicted ms} in ``direction``: the reader's numbers (one float for every rung, or
    a dict per rung), else the cost model's floor (minimum bytes over the measured bandwidth).

    Raises:
        ValueError: a prediction that is not a positive number, or a rung not in the ladder.
    """
    from losslab.present.tables import floor_ms

    section = as_section(section)
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


def score_prediction(section: records.Section | dict | None, predicted: dict[str, float],
                     direction: str = "forward") -> Html:
    """Each rung's predicted against its measured time: measured / predicted and a verdict
    (within 25%, or how many times slower or faster than predicted)."""
    section = as_section(section)
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
