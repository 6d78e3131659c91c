"""The results a notebook shows, and the banner that says where each number comes from.

    section = results.load_results(spec)        # spec: a Problem; measured now on a GPU, else the record
    results.banner(section, spec)               # live or recorded, device, date, versions, sources hash

:func:`load_results` returns a :class:`losslab.records.Section` holding one shape and dtype
(``source`` "live" or "recorded"), or None when nothing is measured or recorded. Live runs go
through ``records.measure_section``; nothing here measures. Every table and chart of
``present`` takes a ``records.Section`` or None, and says there are no results for None, so a
notebook runs top to bottom either way.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch

from losslab import problems, records
from losslab import variants as recorded
from losslab.build import ROOT, knobs, ladder
from losslab.present.html import GOOD, WARN, Html, format_date, message

METADATA_KEY = "losslab"  # output metadata key under which a banner records what a notebook shows


def gpu_name() -> str | None:
    """Name of the visible CUDA device, or None without one."""
    return torch.cuda.get_device_name() if torch.cuda.is_available() else None


def shown_path(path: Path | str) -> str:
    """``path`` as a reader should see it: relative to the repository when inside it, with a final /."""
    path = Path(path).resolve()
    return (path.relative_to(ROOT) if path.is_relative_to(ROOT) else path).as_posix() + "/"


def recorded_devices(results_dir: Path | str | None = None) -> list[str]:
    """The device names of the records (``*.json`` files with a ``device`` key) under ``results_dir``
    (default ``reports/results/``), in file-name order; [] for a missing folder.

    Raises:
        ValueError: a record file is not valid JSON (the message names the file).
    """
    folder = Path(results_dir) if results_dir else records.RESULTS_DIR
    devices = []
    for path in sorted(folder.glob("*.json")):
        try:
            devices.append(json.loads(path.read_text())["device"])
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(f"{path}: not a readable record ({type(err).__name__}: {err})") from None
    return devices


def same_device(a: str, b: str) -> bool:
    """True if two device names (or their file-name slugs) name the same device."""
    return records.device_slug(a) == records.device_slug(b)


def load_results(problem: problems.Problem, *, device: str | None = None, size: str = "seed",
                 variants: list[str] | None = None, repeats: int = 20, live: bool | None = None,
                 results_dir: Path | str | None = None, ncu: bool = False,
                 checks: bool = True, taught: bool = False) -> records.Section | None:
    """One problem's results at one shape and dtype: measured now on the GPU, or else the newest record.

    Args:
        device: a device name ("NVIDIA H200") or its slug ("nvidia-h200"); None means the
            visible GPU when measuring live, else the newest record of any device.
        size: a size name of the problem ("seed", "small", ...) for a live run.
        variants: the rungs to show (default all, and the peers); a record holds what was recorded.
        repeats: timed calls per measurement in a live run.
        live: True measures now; False renders the record; None measures now when a CUDA GPU
            is visible (and is ``device``, if one is named).
        results_dir: the folder of records (default ``reports/results/``).
        ncu: a live run also profiles each kernel once with Nsight Compute.
        checks: a live run also checks every variant against float64 first (minutes at all sizes).
        taught: the teaching ladder (kernels/<problem>/ladder/, float32) in the rungs' place
            (``Section.taught``): what notebooks 01 and 02 list is what they time.

    Returns the Section (``source`` "live" or "recorded"; recorded: the seed size in float32
    when held, see ``Section.view``); None when not live and nothing is recorded for
    ``problem`` (on ``device``).

    Raises:
        RuntimeError: ``live=True`` without a CUDA GPU.
        ValueError: unknown size or variant.
    """
    if size not in problem.sizes:
        raise ValueError(f"size: {problem.name} has no size {size!r}; expected one of {', '.join(problem.sizes)}")
    for name in variants or []:
        problem.check_variant_name(name)
    here = gpu_name()
    if live is None:
        live = here is not None and (device is None or same_device(device, here))
    if live:
        if here is None:
            raise RuntimeError("live=True needs a CUDA GPU and none is visible here; "
                               "use live=None or False to render the recorded results")
        names = variants or (ladder.rungs(problem.name) if taught else None)
        measured = [recorded.ladder_variant(problem, v) for v in names] if taught else names
        section = records.measure_section(problem, size, measured, repeats=repeats, ncu=ncu, check=checks)
        return (section.taught() if taught else section).view()
    try:
        section = records.latest_section(problem, device, Path(results_dir) if results_dir else records.RESULTS_DIR)
    except LookupError:
        return None
    section = (section.taught() if taught else section).view()
    if variants:  # show the rungs asked for (and the peers), as a live run would
        section = dataclasses.replace(
            section, rows=[r for r in section.rows if r.kind == "peer" or r.implementation in variants],
            checks=[c for c in section.checks if c.variant in variants])
    return section


# --- what a shown number is ---------------------------------------------------------------------

def run_dates(section: records.Section) -> list[str]:
    """The distinct dates (UTC ISO 8601) of the runs that produced ``section``'s rows, oldest first."""
    return sorted({r.date for r in section.rows if r.date}) or ([section.date] if section.date else [])


def measured_where(section: records.Section) -> str:
    """Where and when ``section``'s numbers were measured, in words: "recorded on NVIDIA H200 on
    2026-11-20 10:00 UTC (torch 2.11.0, CUDA 13.0)"; rows of several runs name the first and last."""
    when = "measured now" if section.source == "live" else "recorded"
    dates = [format_date(d) for d in run_dates(section)] or ["an unknown date"]
    on = dates[0] if len(dates) == 1 else f"{len(dates)} runs from {dates[0]} to {dates[-1]} (see each row's date)"
    return f"{when} on {section.device} on {on} (torch {section.torch or '?'}, CUDA {section.cuda or '?'})"


def implementation_order(section: records.Section, implementation: str) -> float:
    """Sort key: the ladder's rungs in order, each followed by its other launch configurations
    (``build.knobs``), then the peers in the order the section lists them."""
    order = list(section.ladder)
    if implementation not in order and knobs.rung_of(implementation) in order:
        return order.index(knobs.rung_of(implementation)) + 0.5
    order += [r.implementation for r in section.rows if r.implementation not in order]
    return order.index(implementation) if implementation in order else len(order)


def bandwidth_gbps(section: records.Section) -> dict[str, float]:
    """The measured read and copy bandwidth of ``section``'s device in GB/s: {"read", "copy"}."""
    return {"read": section.ceilings.get("read_gbps"), "copy": section.ceilings.get("copy_gbps")}


def source_info(section: records.Section) -> dict:
    """What a banner states (and a report lists): problem, source, device, date, versions,
    sources hash and whether it matches today's sources."""
    return {"problem": section.problem, "source": section.source, "device": section.device,
            "date": section.date, "dates": run_dates(section), "torch": section.torch, "cuda": section.cuda,
            "sources_sha256": section.sources_sha256, "fresh": section.is_fresh()}


def _missing_text(problem: problems.Problem, device: str | None, results_dir: Path | str | None) -> str:
    folder = Path(results_dir) if results_dir else records.RESULTS_DIR
    where = f" on {device}" if device else ""
    devices = recorded_devices(folder)
    found = f"records there: {', '.join(devices)}" if devices else "no records there"
    return (f"No recorded results for {problem.name}{where} under {shown_path(folder)} ({found}) and nothing measured "
            f"here: the cells below show the model and the kernels but no measurements. Run "
            f"`python -m losslab bench {problem.name}` on a GPU machine and commit the record.")


def banner(section: records.Section | None, problem: problems.Problem, size: str | None = None, *,
           device: str | None = None, results_dir: Path | str | None = None) -> Html:
    """One line saying where the numbers below come from: live or recorded, device, date(s),
    versions, shape, and whether the record was measured on today's sources.

    Without a section it names the folder looked in (``results_dir``), the ``device`` asked for
    and the devices that do have records there. ``size`` (the notebook's parameter) is mentioned
    when a record was taken at another shape. The output carries :func:`source_info` as
    metadata (key :data:`METADATA_KEY`), which ``present.report`` reads.
    """
    if section is None:
        return message(_missing_text(problem, device, results_dir),
                       metadata={METADATA_KEY: {"problem": problem.name, "source": "none"}})
    info = source_info(section)
    shape = "x".join(map(str, section.primary_shape or ()))
    head = "LIVE results" if info["source"] == "live" else "RECORDED results (not measured now)"
    text = (f"{head}: {problem.name} {shape} {section.primary_dtype}, {measured_where(section)}; "
            f"sources sha256 {info['sources_sha256'][:12]} ")
    if info["fresh"]:
        text += "matches the sources now."
    else:
        text += ("does NOT match the sources now (kernels, bindings, launch code or build flags changed since); "
                 f"rerun `python -m losslab bench {problem.name}` on a GPU and commit the record.")
    seed = tuple(problem.sizes.get(size, ())) if size else ()
    if size is not None and info["source"] == "recorded" and seed != tuple(section.primary_shape or ()):
        text += f" (The size parameter {size!r} applies to live runs only.)"
    return message(text, GOOD if info["fresh"] else WARN, metadata={METADATA_KEY: info})
