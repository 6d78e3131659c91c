"""× rung below, and naive's launch: each rung's time over the rung below's, read from a record.

The steps of a ladder per direction (:func:`steps`, :func:`steps_table`, one step on every
recorded device: :func:`step_on_devices`), and how many blocks and warps ``naive`` launches
against the device's SM count (:func:`naive_parallelism`, :func:`naive_step_ratio`).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch

from losslab import problems, records
from losslab.build import KERNELS, knobs, ladder
from losslab.present.html import Html, markdown, no_results, table
from losslab.present.results import bandwidth_gbps

DIRECTIONS = ("forward", "backward", "forward_backward")
MAX_WARPS_PER_SM = 64  # resident warps per SM on sm_80 and sm_90


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
    rungs = section.ladder
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


def timed_row(section: records.Section, implementation: str, direction: str):
    """The first row of ``section`` timing (implementation, direction), or None."""
    return next((r for r in section.rows if (r.implementation, r.direction) == (implementation, direction)), None)


# --- one step on every recorded device ----------------------------------------------------------------

def step_on_devices(problem: problems.Problem, lower: str, upper: str, direction: str, results_dir=None):
    """The step from ``lower`` to ``upper`` in ``direction`` on each device with a record of
    ``problem`` (the teaching ladder's view, ``Section.taught``, at the seed size in float32),
    beside that device's measured read and copy bandwidth, as a Markdown list; one line saying so
    where no record holds the step."""
    folder = results_dir or records.RESULTS_DIR
    lines = []
    for device in records.devices(folder):
        try:
            section = records.latest_section(problem, device, folder).taught().view()
        except LookupError:
            continue
        s = step(section, lower, upper, direction)
        if s is not None:
            bw = bandwidth_gbps(section)
            lines.append(f"- {device}: `{lower}` &rarr; `{upper}` {direction} &times;{s.speedup:.2f} "
                         f"({s.lower_ms:.3f} &rarr; {s.upper_ms:.3f} ms), measured read bandwidth "
                         f"{bw['read']:.0f} GB/s, copy {bw['copy']:.0f} GB/s")
    return markdown("\n".join(lines) or f"No record holds {problem.name}'s {lower} and {upper} {direction} yet.")


# --- naive's parallelism -----------------------------------------------------------------------------

# a teaching rung's block size: ``constexpr int THREADS = 256;`` (kernels/<problem>/ladder/<rung>.cu)
_TAUGHT_THREADS = re.compile(r"^constexpr int THREADS = (\d+);", re.MULTILINE)


def threads_per_block(problem: str, rung: str, *, taught: bool = False) -> int:
    """The threads per block of ``rung``: the default of the ``THREADS`` knob of the operator's
    ``kernels/<problem>/<rung>.cu`` (``build.knobs``), or with ``taught`` the ``constexpr int
    THREADS`` of the teaching rung ``kernels/<problem>/ladder/<rung>.cu``.

    Raises:
        ValueError: the file declares no THREADS (knob or constant), or does not exist.
    """
    if taught:
        path = ladder.folder(problem) / f"{rung}.cu"
        found = _TAUGHT_THREADS.findall(path.read_text()) if path.is_file() else []
        if not found:
            raise ValueError(f"{path.relative_to(KERNELS.parent)}: no 'constexpr int THREADS = <n>;'")
        return int(found[0])
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
    shape, against its device's SM count; the teaching rung's launch in a taught view
    (``Section.taught``), the operator's otherwise."""
    section = section.view()
    rung = rung or section.ladder[0]
    rows = (section.primary_shape or section.spec.sizes["seed"])[0]
    threads = threads_per_block(section.problem, rung, taught=bool(section.rungs))
    blocks = math.ceil(rows / threads)
    forward = next((r for r in section.rows if r.implementation == rung and r.direction == "forward"), None)
    sms = section.multiprocessors or 0
    gbps = None
    if forward and sms:
        cost = section.spec.cost(tuple(forward.shape), "forward", getattr(torch, forward.dtype))
        gbps = cost.bytes / (forward.median_ms * 1e6) / min(blocks, sms)
    return Parallelism(rows, threads, blocks, sms, gbps)


def naive_step_ratio(section: records.Section, other: records.Section) -> str:
    """Why naive -> shared_memory pays more in one problem than in another: the ratio of the two
    steps as (busy SMs of the other's naive / this one's) x (this one's shared_memory forward
    fraction of bandwidth / the other's), from the records."""
    a, b = section.view(), other.view()
    names = [s.ladder[:2] for s in (a, b)]
    sa, sb = step(a, *names[0], "forward"), step(b, *names[1], "forward")
    pa, pb = naive_parallelism(a), naive_parallelism(b)
    fa, fb = timed_row(a, names[0][1], "forward"), timed_row(b, names[1][1], "forward")
    if not (sa and sb and fa and fb):
        return "not timed in both records"
    return (f"{b.problem}'s step x{sb.speedup:.2f} / {a.problem}'s x{sa.speedup:.2f} = {sb.speedup / sa.speedup:.2f}; "
            f"naive's busy SMs {pa.busy_sms} / {pb.busy_sms} = {pa.busy_sms / pb.busy_sms:.2f} times "
            f"shared_memory's fraction of bandwidth {fb.fraction_of_bandwidth:.0%} / {fa.fraction_of_bandwidth:.0%} = "
            f"{fb.fraction_of_bandwidth / fa.fraction_of_bandwidth:.2f}: product "
            f"{pa.busy_sms / pb.busy_sms * fb.fraction_of_bandwidth / fa.fraction_of_bandwidth:.2f}")
