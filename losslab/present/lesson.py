"""One rung as a lesson in notebooks 01 and 02: predict, measure, write it yourself.

Before the measurement the participant stores a guess (:class:`Guess`: how many times faster the
rung is than the one below, forward and forward+backward); :func:`measure` then shows the two
rungs' times and the Nsight Compute counters that carry the rung's idea (:data:`IDEA_COUNTERS`),
from the section the notebook holds (measured now, or the record: it says which), and scores the
guess. The exercise at each rung is ``losslab.teach.exercises``'.
"""
from __future__ import annotations

import html
import math
from dataclasses import dataclass

from losslab import records
from losslab.present.evidence.counters import MEANINGS, counter_value, ncu_record
from losslab.present.evidence.steps import step
from losslab.present.html import Html, no_results, table
from losslab.present.results import measured_where

# rung -> (direction, counters): where the rung's idea shows in Nsight Compute's counts
IDEA_COUNTERS = {
    "shared_memory": ("forward", ("sectors_per_request", "grid_size", "active_sms")),
    "warp_shuffle": ("forward", ("barriers", "shuffles", "shared_instructions")),
    "vectorized": ("forward", ("load_requests", "load_sectors", "sectors_per_request")),
    "fused": ("forward_backward", ("dram_bytes", "load_requests")),
    "cluster": ("forward_backward", ("dram_bytes", "l2_read_sectors")),
}
WITHIN = 1.25  # a guess within this factor of the measurement scores "close"


@dataclass(frozen=True)
class Guess:
    """The participant's prediction for one rung before measuring: how many times faster than the
    rung below (above 1: faster; below 1: slower), ``forward`` and ``forward_backward``; None: no
    guess. Which counter will move most is the question the counters table then answers.

    Raises:
        ValueError: a factor that is not a positive number.
    """

    forward: float | None = None
    forward_backward: float | None = None

    def __post_init__(self):
        for name in ("forward", "forward_backward"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                      or not math.isfinite(value) or value <= 0):
                raise ValueError(f"{name}: expected a positive factor (x faster than the rung below), got {value!r}")


def score(guessed: float | None, measured: float) -> str:
    """One word or phrase for a guessed speed-up against the measured one."""
    if guessed is None:
        return "no guess"
    ratio = measured / guessed
    if 1 / WITHIN <= ratio <= WITHIN:
        return f"close (within {WITHIN - 1:.0%})"
    return f"the rung did {ratio:.1f}x better than you guessed" if ratio > 1 else \
        f"the rung did {1 / ratio:.1f}x worse than you guessed"


def _shown(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.2f}"


def measure(section: records.Section | None, lower: str, upper: str, guess: Guess | None = None) -> Html:
    """``upper`` against ``lower`` from ``section`` (the notebook's, at its shape and dtype): each
    direction's median ms and x rung below with the guess scored, then the counters of the idea
    (:data:`IDEA_COUNTERS`) for both rungs, each with what it counts. Says where the numbers come
    from; with no section, says that nothing is measured or recorded."""
    if section is None:
        return no_results(f"step from {lower} to {upper} to show")
    guess = guess or Guess()
    body, plain = [], [f"{lower} -> {upper}, {measured_where(section)}"]
    for direction in ("forward", "forward_backward"):
        found = step(section, lower, upper, direction)
        if found is None:
            continue
        guessed = getattr(guess, direction)
        verdict, yours = score(guessed, found.speedup), "none" if guessed is None else f"x{guessed:.2f}"
        body.append([direction, f"{found.lower_ms:.3f}", f"{found.upper_ms:.3f}", f"{found.speedup:.2f}",
                     "—" if guessed is None else f"{guessed:.2f}", html.escape(verdict)])
        plain.append(f"{direction}: {lower} {found.lower_ms:.3f} ms, {upper} {found.upper_ms:.3f} ms, "
                     f"x{found.speedup:.2f} (your guess: {yours}; {verdict})")
    timing = table(["direction", f"{html.escape(lower)} ms", f"{html.escape(upper)} ms", "x rung below",
                    "your guess", "score"], body, caption=html.escape(plain[0]))
    direction, names = IDEA_COUNTERS.get(upper, ("forward", ()))
    records_ = {rung: ncu_record(section, rung, direction) for rung in (lower, upper)}
    if not names or not any(records_.values()):
        note = "no Nsight Compute counters for these rungs in this section"
        return Html(timing + f"<p>{note}</p>", plain="\n".join([*plain, note]))
    rows = [[f"<code>{n}</code>", _shown(counter_value(records_[lower], n)), _shown(counter_value(records_[upper], n)),
             html.escape(MEANINGS.get(n, "bytes read and written in DRAM"))] for n in names]
    plain += [f"{n} ({direction}): {lower} {_shown(counter_value(records_[lower], n))}, "
              f"{upper} {_shown(counter_value(records_[upper], n))}" for n in names]
    counters = table(["counter", html.escape(lower), html.escape(upper), "what it counts"], rows,
                     caption=f"where {html.escape(upper)}'s idea shows ({direction}, Nsight Compute)", text_columns=1)
    return Html(timing + counters, plain="\n".join(plain))


def score_long_rows(section: records.Section | None, guess: Guess | None = None) -> Html:
    """The cluster rung's lesson is at long rows: its forward+backward against fused's at each
    long-row shape and dtype of the recorded sweep (``evidence.long_rows``), with
    ``guess.forward_backward`` (x fused) scored at each."""
    from losslab.present.evidence.long_rows import long_rows

    if section is None:
        return no_results("long-row sweep to score against")
    guessed = (guess or Guess()).forward_backward
    found = [r for r in long_rows(section) if r.speedup is not None]
    if not found:
        return Html("<p>no fused and cluster rows at long rows in this record</p>",
                    plain="no fused and cluster rows at long rows in this record")
    body = [[html.escape(r.label), f"{r.lower_ms:.3f}", f"{r.cluster_ms:.3f}", f"{r.speedup:.2f}",
             "—" if guessed is None else f"{guessed:.2f}", html.escape(score(guessed, r.speedup))] for r in found]
    plain = [f"{r.label}: fused {r.lower_ms:.3f} ms, cluster {r.cluster_ms:.3f} ms, x{r.speedup:.2f} "
             f"({score(guessed, r.speedup)})" for r in found]
    return Html(table(["shape", "fused ms", "cluster ms", "x fused", "your guess", "score"], body,
                      caption="forward+backward at long rows: your guess against the record"), plain="\n".join(plain))
