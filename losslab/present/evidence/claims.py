"""The claims notebooks 01-03 make about a ladder, each with the measured number behind it.

:func:`claims` checks each claim on a record (None where the record lacks the data): the generic
ones (:data:`GENERIC`) of every ladder, and those the loss declares in its ``claims.py``
(:func:`declared`); :func:`claims_table` shows them. A cpu-tier test asserts every claim holds on
the committed records.
"""
from __future__ import annotations

import html
import importlib
import math
from dataclasses import dataclass

from losslab import problems, records
from losslab.present.evidence.counters import NOT_RECORDED, counters, dram_over_minimum, mufu_headroom
from losslab.present.evidence.steps import MAX_WARPS_PER_SM, naive_parallelism, step, timed_row
from losslab.present.html import Html, markdown, no_results, table
from losslab.present.results import bandwidth_gbps
from losslab.records.freshness import CLAIMS_MODULE

# the claims made of every ladder (naive, shared_memory, warp_shuffle, vectorized, ...), whatever the loss
GENERIC = ("naive_parallelism", "naive_dram_minimum", "shuffle_flat", "scalar_saturates", "above_roof_below_datasheet",
           "naive_active_sms", "coalescing", "fewer_barriers")


@dataclass(frozen=True)
class Claim:
    """One claim a notebook makes about ``problem``'s ladder: ``statement`` with the measured
    number in it; ``holds`` True or False on this record, None where the record lacks the data."""

    problem: str
    key: str
    statement: str
    holds: bool | None


def _step_claim(section, key, lower, upper, direction, low, high, what) -> Claim:
    s = step(section, lower, upper, direction)
    value = f"&times;{s.speedup:.2f}" if s else "not timed"
    return Claim(section.problem, key, f"{lower} &rarr; {upper} {direction}: {value} ({what})",
                 None if s is None else low <= s.speedup <= high)


def fraction_of_ceiling(section: records.Section, row) -> float:
    """The row's floor (minimum bytes over the measured read or copy bandwidth) over its median
    time: 1.0 on the measured roof, above 1 faster than the reference kernels that set it."""
    from losslab.present.tables import floor_ms

    return floor_ms(section.spec, tuple(row.shape), row.direction, bandwidth_gbps(section), row.dtype) / row.median_ms


def _fraction_claim(section, key, rung, direction, minimum) -> Claim:
    row = timed_row(section, rung, direction)
    value = f"{fraction_of_ceiling(section, row):.0%}" if row else "not timed"
    return Claim(section.problem, key, f"{rung} {direction} reaches {value} of the measured "
                 f"{row.bandwidth if row else ''} ceiling (at least {minimum:.0%}: scalar loads already saturate it)",
                 None if row is None else fraction_of_ceiling(section, row) >= minimum)


def _naive_claims(section: records.Section) -> list[Claim]:
    naive = section.ladder[0]
    par = naive_parallelism(section, naive)
    excess = dram_over_minimum(section, naive, "forward")
    dram = (f"{naive} forward reads {excess:.4f} x the minimum bytes from DRAM (uncoalesced loads cost L1/L2 "
            "sectors and requests, not DRAM bytes)" if excess else f"{naive} forward DRAM bytes: no ncu profile")
    return [Claim(section.problem, "naive_parallelism", par.describe(),
                  None if not par.sms else par.blocks < par.sms and par.warps_per_sm <= MAX_WARPS_PER_SM / 4),
            Claim(section.problem, "naive_dram_minimum", dram, None if excess is None else excess < 1.02)]


def roof_claims(section: records.Section, best: str = "vectorized") -> list[Claim]:
    """The claims notebook 03 makes of any problem's ``section``, whatever its ladder: how far
    ``best``'s forward runs below the special-function (MUFU) ceiling, claimed near (less than 8x)
    or far as the loss's ``claims.py`` declares (``MUFU_ROOF``; holds None where the record has no
    MUFU ceiling or ``best`` row, or the loss declares nothing), and every row above the measured
    ceiling stays below the datasheet peak."""
    section = section.view()
    headroom = mufu_headroom(section, best, "forward")
    roof = declared(section.spec, "MUFU_ROOF", None)
    sheet = section.ceilings.get("datasheet") or {}
    limit = sheet.get("memory_gbps", 0) / (section.ceilings.get("read_gbps") or math.inf)
    fraction = {id(r): fraction_of_ceiling(section, r) for r in section.rows}
    above = [r for r in section.rows if fraction[id(r)] > 1 and not r.below_floor]
    worst = max(above, key=lambda r: fraction[id(r)], default=None)
    if headroom is None:
        mufu = f"{best} forward: no MUFU headroom (no MUFU ceiling or row recorded, or no transcendental in the model)"
    else:
        near = "less than 8x: the MUFU roof is near" if headroom < 8 else "8x or more: the MUFU roof is far"
        mufu = f"{best} forward runs {headroom:.1f}x below the special-function (MUFU) ceiling ({near})"
    return [
        Claim(section.problem, "mufu_headroom", mufu,
              None if headroom is None or roof is None else (headroom < 8) == (roof == "near")),
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
    naive, shared, shuffle, *_ = section.ladder
    active = counters(section).get((naive, "forward"), {}).get("active_sms")
    sms = section.multiprocessors
    return [Claim(section.problem, "naive_active_sms",
                  f"{naive} forward keeps {active:.0f} of {sms} SMs busy (measured)" if active is not None
                  else f"{naive}'s active SMs: {NOT_RECORDED}", None if active is None else active < sms),
            _falls(section, "coalescing", naive, shared, "sectors_per_request", "coalesced: fewer sectors per request"),
            _falls(section, "fewer_barriers", shared, shuffle, "barriers",
                   "shuffles replace the barrier-separated tree")]


def declared(problem: problems.Problem, name: str, default):
    """The constant ``name`` of ``problem``'s claims module (``losslab/problems/<loss>/claims.py``:
    what the notebooks claim of that loss, e.g. ``MUFU_ROOF``), or ``default`` where it declares none."""
    package = type(problem).__module__.rpartition(".")[0]
    module = importlib.import_module(f"{package}.{CLAIMS_MODULE.removesuffix('.py')}")
    return getattr(module, name, default)


def claim_keys(problem: problems.Problem) -> set[str]:
    """The keys of the claims :func:`claims` makes of ``problem``'s ladder: :data:`GENERIC`, its
    step claims, and ``mufu_headroom`` where its claims module declares a ``MUFU_ROOF``."""
    mufu = {"mufu_headroom"} if declared(problem, "MUFU_ROOF", None) else set()
    return set(GENERIC) | {c[0] for c in problem.step_claims} | mufu


def claims(section: records.Section) -> list[Claim]:
    """Every claim notebooks 01-03 make about ``section``'s problem, checked on its view: those of
    :func:`claim_keys` (the MUFU claim only where the loss declares one).

    Raises:
        ValueError: the section's ladder has fewer than four rungs (naive .. vectorized): an
            operators' rung table; use its teaching ladder (``Section.taught``).
    """
    section = section.view()
    if len(section.ladder) < 4:
        raise ValueError(f"section: {section.problem}'s rungs {', '.join(section.ladder)} are no teaching ladder "
                         "(naive, shared_memory, warp_shuffle, vectorized, ...); pass section.taught()")
    naive, shared, shuffle, vector, *_ = section.ladder
    out = _naive_claims(section)
    out.append(_step_claim(section, "shuffle_flat", shared, shuffle, "forward", 0.9, 1.1,
                           "within 10%: the tree's steps are a small part of a row's time at this size"))
    spec = section.spec
    rung, direction, least = spec.saturates
    out.append(_fraction_claim(section, "scalar_saturates", rung, direction, least))
    out += [_step_claim(section, key, lower, upper, direction, low, high, why)
            for key, lower, upper, direction, low, high, why in spec.step_claims]
    keys = claim_keys(spec)
    return out + [c for c in roof_claims(section, vector) if c.key in keys] + _counter_claims(section)


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


def fraction_statement(section: records.Section | None, rung: str, direction: str):
    """"<rung>'s <direction> reaches N% of the measured <read|copy> bandwidth (device)" from the
    record, as Markdown; one line saying so without a section or the row."""
    row = timed_row(section.view(), rung, direction) if section is not None else None
    if row is None:
        return markdown(f"No {rung} {direction} row recorded here.")
    return markdown(f"On {section.device}'s record `{rung}`'s {direction} reaches "
                    f"{fraction_of_ceiling(section.view(), row):.0%} of the measured {row.bandwidth} bandwidth "
                    f"({row.median_ms:.3f} ms).")
