"""Predict, then measure: the reader's predicted times for each rung, scored against the record."""
from __future__ import annotations

from losslab import records
from losslab.present.evidence.steps import timed_row
from losslab.present.html import Html, no_results, table
from losslab.present.results import bandwidth_gbps


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
    rungs = [r for r in section.ladder if timed_row(section, r, direction)]
    floor = floor_ms(section.spec, tuple(section.primary_shape), direction, bandwidth_gbps(section),
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
        row = timed_row(section, rung, direction)
        if row is None:
            continue
        ratio = row.median_ms / ms
        verdict = ("within 25%" if 0.8 <= ratio <= 1.25 else
                   f"{ratio:.1f}x slower than predicted" if ratio > 1 else f"{1 / ratio:.1f}x faster than predicted")
        body.append([f"<code>{rung}</code>", f"{ms:.3f}", f"{row.median_ms:.3f}", f"{ratio:.2f}", verdict])
        plain.append(f"{rung}: predicted {ms:.3f} ms, measured {row.median_ms:.3f} ms: {verdict}")
    return Html(table(["rung", "predicted ms", "measured ms", "measured / predicted", "score"], body,
                      caption=f"{direction}: your prediction against the measurement"), plain="\n".join(plain))
