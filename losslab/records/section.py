"""A :class:`Section`: one problem's measured rows and checks on one device, and how sections merge.

A newer run replaces rows by (problem, shape, dtype, implementation, direction) and checks by
(variant, case, direction); everything else is kept, so a bench run at another size or on a
subset of variants adds to a section and never replaces it (:func:`merge`). The file format is
:meth:`Section.as_dict`'s; a section of the older, pre-typed format (provenance and bandwidth per
section, rows per dtype: :data:`OLDER_FORMAT_KEYS`) is refused, to be re-recorded.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path

import torch

from losslab import problems
from losslab.build import ladder
from losslab.measure.bench import BenchRow, Skipped, flag_physical_floor, set_speedups
from losslab.measure.check import CheckResult
from losslab.measure.ncu import Profile
from losslab.records.freshness import sources_sha256
from losslab.variants import LADDER_TAG

# what a section of the older, pre-typed format held at its top (provenance and bandwidth per section,
# rows per dtype); a section holding any of them is refused, never converted (see Section.from_dict)
OLDER_FORMAT_KEYS = ("date", "torch", "cuda", "kernels_sha256", "sources_sha256", "shape", "dtype", "repeats",
                     "bandwidth_gbps", "rows_by_dtype")


@dataclass
class Section:
    """One problem's results on one device (see the module docstring), at every size and dtype.

    Each row and check carries what produced it (``date``, ``torch``, ``cuda``,
    ``sources_sha256``), so rows from several runs live in one section; ``source`` is "live" for
    a section measured now, "recorded" for one read from a file.

    ``ceilings``: what ``ceilings.measure_ceilings`` returned in the newest run ({} if none);
    ``ncu``: the newest ``ncu.profile_problem`` result (a typed ``measure.ncu.Profile``), or None;
    ``skipped``: the (shape, dtype, implementation) a sweep or bench left out (a hopeless rung, a
    peer that cannot run there), each with its reason (:class:`Skipped`); a measured row of the same
    key removes its entry. ``rungs``: the rungs in ladder order where they are not the operators'
    (:meth:`taught` sets the teaching ladder's; not saved), () for the problem's ``variants``.
    """

    problem: str
    device: str
    multiprocessors: int = 0
    memory_bytes: int = 0
    compute_capability: str = ""
    rows: list[BenchRow] = field(default_factory=list, repr=False)
    checks: list[CheckResult] = field(default_factory=list, repr=False)
    ceilings: dict = field(default_factory=dict, repr=False)
    ncu: Profile | None = field(default=None, repr=False)
    source: str = "recorded"
    skipped: list[Skipped] = field(default_factory=list, repr=False)
    rungs: tuple[str, ...] = field(default=(), repr=False)

    def __post_init__(self):
        self.ncu = Profile.from_dict(self.ncu)

    # --- what it holds ---
    @property
    def spec(self) -> problems.Problem | None:
        """The :class:`~losslab.problems.Problem` it measured, looked up once by the name the record
        gives it (None for a problem no longer registered)."""
        return registered_problem(self.problem)

    @property
    def ladder(self) -> tuple[str, ...]:
        """The rungs in ladder order, naive first: :attr:`rungs` where set (the teaching ladder's,
        :meth:`taught`), else the problem's ``variants`` (() for a problem no longer registered)."""
        spec = self.spec
        return self.rungs or (tuple(spec.variants) if spec else ())

    @property
    def shapes(self) -> list[tuple[int, ...]]:
        """The shapes of the rows, in first-seen order."""
        return list(dict.fromkeys(tuple(r.shape) for r in self.rows))

    @property
    def dtypes(self) -> list[str]:
        """The dtypes of the rows, float32 first, then in first-seen order."""
        found = dict.fromkeys(r.dtype for r in self.rows)
        return sorted(found, key=lambda d: (d != "float32", list(found).index(d)))

    @property
    def primary_shape(self) -> tuple[int, ...] | None:
        """The shape :meth:`view` shows by default: the problem's seed size if held, else the newest rows'."""
        spec = self.spec
        seed = tuple(spec.sizes.get("seed", ())) if spec else ()
        if seed in self.shapes:
            return seed
        return tuple(max(self.rows, key=lambda r: r.date).shape) if self.rows else None

    @property
    def primary_dtype(self) -> str | None:
        return self.dtypes[0] if self.rows else None

    def select(self, shape=None, dtype: str | None = None) -> list[BenchRow]:
        """The rows at ``shape`` and ``dtype`` (default :attr:`primary_shape`, :attr:`primary_dtype`)."""
        shape = tuple(shape) if shape is not None else self.primary_shape
        dtype = dtype or self.primary_dtype
        return [r for r in self.rows if tuple(r.shape) == shape and r.dtype == dtype]

    def taught(self) -> Section:
        """The teaching ladder's view of this section: its rows, checks and ncu counters of kind
        "ladder" (``"fused [ladder]"``, kernels/<problem>/ladder/) under their rungs' names as
        variants, in place of the operators' rungs, and the ladder's rung order
        (``build.ladder.rungs``) as :attr:`ladder`, whatever the operators' rungs are; the peers
        kept, the public operator left out. What notebooks 01 and 02 show: the kernels they list
        are the ones timed. A section without teaching rows (recorded before they were) is
        returned as it is."""
        def rung(name: str) -> str:
            return name.removesuffix(LADDER_TAG).strip()

        if not any(r.kind == "ladder" for r in self.rows):
            return self
        rows = [dataclasses.replace(r, implementation=rung(r.implementation), kind="variant")
                if r.kind == "ladder" else r for r in self.rows if r.kind in ("ladder", "peer")]
        checks = [dataclasses.replace(c, variant=rung(c.variant)) for c in self.checks
                  if c.variant.endswith(LADDER_TAG)]
        ncu = self.ncu
        if ncu is not None:
            ncu = dataclasses.replace(ncu, records=[
                dataclasses.replace(c, implementation=rung(c.implementation), kind="variant")
                if c.implementation.endswith(LADDER_TAG) else c
                for c in ncu.records if c.implementation.endswith(LADDER_TAG) or c.kind == "peer"])
        return dataclasses.replace(self, rows=rows, checks=checks, ncu=ncu, rungs=ladder.rungs(self.problem))

    def view(self, shape=None, dtype: str | None = None) -> Section:
        """A copy holding only the rows at one shape and dtype (see :meth:`select`); checks, ceilings
        and ncu are kept."""
        return dataclasses.replace(self, rows=self.select(shape, dtype), checks=list(self.checks),
                                   skipped=list(self.skipped))

    def sweep(self, dtype: str = "float32", direction: str = "forward") -> list[SweepLine]:
        """The rows at ``dtype`` and ``direction`` over every recorded shape, as one
        :class:`SweepLine` per implementation (variants first, in ladder order, then the peers),
        each line's points ordered by minimum bytes: what a time- or bandwidth-against-size figure
        plots. Lines with a single shape are kept (a rung timed only at the seed size)."""
        spec = self.spec
        order = list(self.ladder)
        rows = [r for r in self.rows if r.dtype == dtype and r.direction == direction]
        names = sorted(dict.fromkeys(r.implementation for r in rows),
                       key=lambda n: (n not in order, order.index(n) if n in order else 0))
        lines = []
        for name in names:
            mine = [r for r in rows if r.implementation == name]
            points = [SweepPoint(tuple(r.shape), r.shape[0] * r.shape[1],
                                 spec.cost(tuple(r.shape), direction, getattr(torch, dtype)).bytes,
                                 r.median_ms, r.back_to_back_ms, r.host_ms, r.gbps, r.fraction_of_bandwidth,
                                 r.below_floor) for r in mine]
            lines.append(SweepLine(name, mine[0].kind, direction, dtype, sorted(points, key=lambda p: p.min_bytes)))
        return lines

    # --- provenance ---
    def _stamps(self, key: str) -> list[str]:
        return [getattr(x, key) for x in (*self.rows, *self.checks) if getattr(x, key, "")]

    @property
    def date(self) -> str:
        """The newest date of a row or check (UTC ISO 8601), "" when empty."""
        return max(self._stamps("date"), default="")

    @property
    def torch(self) -> str:
        return ", ".join(sorted(set(self._stamps("torch")))) if self.rows else ""

    @property
    def cuda(self) -> str:
        return ", ".join(sorted(set(self._stamps("cuda")))) if self.rows else ""

    @property
    def sources_sha256(self) -> str:
        """The hash the section's results were measured with: the one hash when all share it,
        else the first that differs from today's sources (so a comparison says "not fresh")."""
        hashes = list(dict.fromkeys(self._stamps("sources_sha256")))
        if len(hashes) <= 1 or self.spec is None:
            return hashes[0] if hashes else ""
        current = sources_sha256(self.problem)
        return next((h for h in hashes if h != current), current)

    def stale(self, root: Path | None = None) -> list[BenchRow | CheckResult]:
        """The rows and checks measured on other sources than those now in ``root`` (default this repository)."""
        current = sources_sha256(self.problem, root)
        return [x for x in (*self.rows, *self.checks) if x.sources_sha256 != current]

    def is_fresh(self, root: Path | None = None) -> bool:
        """True if every row and check was measured on the sources there are now (see :meth:`stale`)."""
        return not self.stale(root)

    def describe(self) -> str:
        """What the section holds, in one line: problem, device, sizes, dtypes, dates."""
        sizes = ", ".join("x".join(map(str, s)) for s in self.shapes) or "no rows"
        return (f"{self.problem} on {self.device}: {sizes}; {', '.join(self.dtypes) or '-'}; "
                f"torch {self.torch or '-'}, CUDA {self.cuda or '-'}; {self.date[:10] or 'no date'}")

    # --- file format ---
    def as_dict(self) -> dict:
        """The on-disk form (JSON-ready; ``source`` is not saved)."""
        return {"problem": self.problem, "device": self.device, "multiprocessors": self.multiprocessors,
                "memory_bytes": self.memory_bytes, "compute_capability": self.compute_capability,
                "ceilings": self.ceilings, "ncu": self.ncu.as_dict() if self.ncu else None,
                "rows": [r.as_dict() for r in self.rows], "checks": [c.as_dict() for c in self.checks],
                "skipped": [s.as_dict() for s in self.skipped]}

    @classmethod
    def from_dict(cls, data: dict, problem: str | None = None) -> Section:
        """A Section from :meth:`as_dict`'s form (``problem`` where the dict names none).

        Raises:
            ValueError: not a section (missing device, rows that are not rows), or a section of the
                older format (any of :data:`OLDER_FORMAT_KEYS`), which is no longer read: re-record it.
        """
        if not isinstance(data, dict) or "device" not in data:
            raise ValueError("a section needs at least a 'device'")
        older = older_format_keys(data)
        if older:
            raise ValueError(f"a section of the older format (with {', '.join(older)}), no longer read: re-record it")
        problem = data.get("problem") or problem or ""
        rows = [_row(r, data["device"]) for r in data.get("rows", [])]
        checks = [_from_fields(CheckResult, c, "check") for c in data.get("checks", [])]
        return cls(problem, data["device"], data.get("multiprocessors", 0), data.get("memory_bytes", 0),
                   data.get("compute_capability", ""), rows, checks, data.get("ceilings") or {}, data.get("ncu"),
                   data.get("source", "recorded"), [Skipped.from_dict(s) for s in data.get("skipped", [])])


def registered_problem(name: str) -> problems.Problem | None:
    """The registered Problem a record names (records hold names), or None for one no longer registered."""
    return problems.get(name) if name in problems.names() else None


def older_format_keys(data: dict) -> list[str]:
    """The keys of :data:`OLDER_FORMAT_KEYS` that the section dict ``data`` holds ([]: not the older format)."""
    return [k for k in OLDER_FORMAT_KEYS if k in data]


@dataclass
class SweepPoint:
    """One implementation at one shape of a sweep: ``min_bytes`` is the cost model's minimum
    traffic (the x axis of a time or bandwidth plot), times in ms (see ``BenchRow``)."""

    shape: tuple[int, int]
    elements: int
    min_bytes: int
    median_ms: float
    back_to_back_ms: float | None
    host_ms: float | None
    gbps: float
    fraction_of_bandwidth: float
    below_floor: bool = False


@dataclass
class SweepLine:
    """One implementation's points over the sizes, smallest first: one line of a sweep figure."""

    implementation: str
    kind: str  # "variant" or "peer"
    direction: str
    dtype: str
    points: list[SweepPoint] = field(default_factory=list)


def _from_fields(cls: type, data, what: str):
    """``data`` as a ``cls`` (a BenchRow or CheckResult): ``data`` itself if it is one, else built from
    the dict of its fields (others ignored, the shape a tuple). Raises ValueError naming ``what``
    for anything else, or a dict without the fields that have no default."""
    if isinstance(data, cls):
        return data
    if not isinstance(data, dict):
        raise ValueError(f"a {what} is a dict of {cls.__name__}'s fields; got {data!r:.80}")
    values = {f.name: data[f.name] for f in fields(cls) if f.name in data}
    missing = [f.name for f in fields(cls)
               if f.default is MISSING and f.default_factory is MISSING and f.name not in values]
    if missing:
        raise ValueError(f"a {what} lacks {', '.join(missing)} (a {what} holds {cls.__name__}'s fields)")
    values["shape"] = tuple(values.get("shape", ()))
    return cls(**values)


def _row(data, device: str) -> BenchRow:
    if isinstance(data, BenchRow):
        return data
    row = _from_fields(BenchRow, data, "bench row")
    spec = registered_problem(row.problem)
    if spec is not None and row.shape and row.dtype:
        flag_physical_floor(row, device, spec)  # records made before the flag existed get it too
    return row




def merge(old: Section, new: Section, *, same_process: bool = False) -> Section:
    """``old`` with ``new`` added: rows replaced by (problem, shape, dtype, implementation, direction),
    checks by (variant, case, direction), the rest kept; device properties, ceilings and ncu from
    ``new`` where it has them. Speedups stay as measured (each against the peers of its own run)
    unless ``same_process``: both were measured in this process, so they are recomputed across all.

    Raises:
        ValueError: the sections are of different problems or devices.
    """
    if (old.problem, old.device) != (new.problem, new.device):
        raise ValueError(f"merge: {new.problem} on {new.device} cannot be added to {old.problem} on {old.device}")
    rows = {r.key: r for r in old.rows} | {r.key: r for r in new.rows}
    checks = {c.key: c for c in old.checks} | {c.key: c for c in new.checks}
    skipped = {s.key: s for s in old.skipped} | {s.key: s for s in new.skipped}
    measured = {r.key[:4] for r in new.rows}
    skipped = [s for s in skipped.values() if s.key not in measured]
    merged = Section(new.problem, new.device, new.multiprocessors or old.multiprocessors,
                     new.memory_bytes or old.memory_bytes, new.compute_capability or old.compute_capability,
                     list(rows.values()), list(checks.values()), new.ceilings or old.ceilings,
                     new.ncu or old.ncu, new.source, skipped)
    if same_process:
        set_speedups(merged.rows)
    return merged


def combine(sections: Sequence[Section]) -> Section:
    """Sections measured in this process (e.g. one implementation each) as one, with speedups
    over every peer among them. Raises ValueError for no sections."""
    if not sections:
        raise ValueError("sections: expected at least one section")
    out = sections[0]
    for section in sections[1:]:
        out = merge(out, section, same_process=True)
    if len(sections) == 1:
        set_speedups(out.rows)
    return out
