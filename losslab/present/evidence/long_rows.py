"""cross_entropy's rows too long for one SM, and the cluster rung that fixes them, read from a record.

At the sweep's long-row shapes (:data:`LONG_ROWS`): fused's and cluster's forward+backward
against the read-once/write-once floor (:func:`long_rows_before`, :func:`long_rows_after`), the
claims of notebook 02 about them (:func:`cluster_claims`), and the SASS instructions that carry
cluster's idea (:func:`cluster_machine_code`, compiled here, no GPU needed).
"""
from __future__ import annotations

import html
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from losslab import problems, records
from losslab.build import KERNELS
from losslab.present.evidence.claims import Claim
from losslab.present.html import Html, message, no_results, table

# the sweep's LLM-vocabulary shapes (measure.bench.SWEEP_SHAPES): float32 rows of 512 KiB and 1 MiB,
# far beyond the 16 KiB of a row that fused holds in registers
LONG_ROWS = ((4096, 131072), (2048, 262144))
LONG_ROW_DTYPES = ("float32", "bfloat16")
# where time alone shows the single read (above the bound of a kernel that reads the logits twice) on
# both recorded devices: float32 rows of 512 KiB. In bfloat16, and at 1 MiB float32 rows on the H200
# (62 % of its floor, 2048 clusters of 8 CTAs), cluster runs near that bound, so there time cannot tell
READ_ONCE_CASES = (((4096, 131072), "float32"),)
RERECORD = "python -m losslab bench cross_entropy --sweep --dtypes float32,bfloat16"


def split_rung(problem: problems.Problem) -> tuple[str, str]:
    """(lower, upper): the rung that splits a long row over a cluster and the rung it falls back
    to, from the rung table (``Rung.falls_back_to``).

    Raises:
        ValueError: ``problem`` has no rung that falls back to another.
    """
    found = [(r.falls_back_to, r.name) for r in problem.rungs if r.falls_back_to]
    if not found:
        raise ValueError(f"problem: {problem.name} has no rung that falls back to another (no cluster rung)")
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
    lower, upper = split_rung(section.spec)
    spec = section.spec
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
    lower, _ = split_rung(section.spec)
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
    lower, upper = split_rung(section.spec)
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
    lower, upper = split_rung(section.spec)
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


def cluster_machine_code(problem: problems.Problem, arch: str = "sm_90") -> Html:
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
            cubin, _ = compile_cubin(KERNELS / problem.name / f"{upper}.cu", arch, Path(tmp))
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
    caption = f"kernels/{problem.name}/{upper}.cu, float32 forward kernel, SASS for {arch} (compiled here)"
    return Html(table(["instruction", "what it carries", "first line", "count"], body, text_columns=3,
                      caption=caption), plain=plain)
