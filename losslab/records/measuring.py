"""Measuring a section now, on the current GPU: the one way a record's rows are made.

:func:`measure_section` checks against float64 and times at one size (every dtype asked);
:func:`measure_sweep` times from launch-bound to LLM-sized; both stamp every row with
:func:`run_provenance`. Neither saves: ``records.save_section`` does.
"""
from __future__ import annotations

import datetime as dt
import sys
from collections.abc import Sequence

import torch

from losslab import problems
from losslab import variants as recorded
from losslab.measure.bench import (
    SWEEP_DIRECTIONS,
    Skipped,
    bench_problem,
    hopeless_reason,
    sweep_memory_bytes,
    sweep_repeats,
)
from losslab.measure.ceilings import measure_ceilings
from losslab.measure.check import check_problem
from losslab.measure.ncu import profile_problem
from losslab.measure.peers import PEERS, missing_peers
from losslab.records.freshness import sources_sha256
from losslab.records.section import Section

DTYPES = ("float32", "bfloat16", "float16")  # input dtypes a bench can time


def run_provenance(problem: problems.Problem) -> dict:
    """What a measurement made now is stamped with: device (name, multiprocessors, memory_bytes,
    compute_capability) and the run (torch, cuda, date in UTC ISO 8601, sources_sha256)."""
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return {"device": props.name, "multiprocessors": props.multi_processor_count,
            "memory_bytes": props.total_memory, "compute_capability": f"{props.major}.{props.minor}",
            "torch": torch.__version__, "cuda": torch.version.cuda,
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "sources_sha256": sources_sha256(problem.name)}


def _shape(problem: problems.Problem, size) -> tuple[int, int]:
    if isinstance(size, str):
        if size not in problem.sizes:
            raise ValueError(f"size: {problem.name} has no size {size!r}; expected one of {', '.join(problem.sizes)} "
                             "or a (rows, columns) pair")
        return tuple(problem.sizes[size])
    return tuple(size)


def _missing_peers(problem: problems.Problem, peers: Sequence[str], progress: bool) -> dict[str, str]:
    """``peers.missing_peers``, each reason printed once (to stderr) when ``progress``."""
    missing = missing_peers(problem, peers)
    for peer, why in missing.items() if progress else ():
        print(f"{problem.name}: {peer} not timed: {why}", file=sys.stderr, flush=True)
    return missing


def measure_section(problem: problems.Problem | str, size="seed", variants: list | None = None, *,
                    peers: Sequence[str] = PEERS, dtypes: Sequence[str] = ("float32",), repeats: int = 20,
                    check: bool = True, check_sizes: Sequence[str] | None = None, check_variants: list | None = None,
                    edge_cases: bool = True, ceilings: dict | None = None, ncu: bool = False,
                    progress: bool = True) -> Section:
    """Measure ``problem`` (a Problem, or its name) now on the current GPU into a live Section (not saved;
    see :func:`save_section`).

    ``records.measure_section("kl_div", "seed", dtypes=("float32", "bfloat16"))``

    Args:
        size: a size name of the problem or a (rows, columns) pair: the bench's shape.
        variants: names the records give them or variant objects (default ``variants.recorded_variants``:
            the rungs, the teaching rungs, the public operator); [] times peers only.
        peers: of ``measure.peers.PEERS``; one that cannot run here (``peers.missing_peers``) is a
            :class:`Skipped` in ``section.skipped`` at each dtype, its reason printed once.
        dtypes: of :data:`DTYPES` (a dtype no variant takes is skipped unless ``variants`` is []).
        repeats: timed calls per (implementation, direction).
        check: run the float64 checks first: ``check_variants`` (default ``variants`` but the public
            operator, whose rows carry their error as a peer's do) at
            ``check_sizes`` (default all of the problem's sizes), and the edge cases if ``edge_cases``.
        ceilings: ``ceilings.measure_ceilings()`` already measured in this process (else measured now).
        ncu: also profile with Nsight Compute (last, so it cannot disturb the timings).
    Raises:
        ValueError: unknown problem, size, variant, peer or dtype; repeats < 1.
    """
    problem = problems.get(problem)
    shape = _shape(problem, size)
    for name in dtypes:
        if name not in DTYPES:
            raise ValueError(f"dtypes: unknown dtype {name!r}; expected some of {', '.join(DTYPES)}")
    if repeats < 1:
        raise ValueError(f"repeats: expected at least 1, got {repeats}")
    variants = recorded.recorded_variants(problem) if variants is None else \
        [recorded.find_variant(problem, v) if isinstance(v, str) else v for v in variants]
    ceilings = ceilings or measure_ceilings()
    bandwidth = {"read": ceilings["read_gbps"], "copy": ceilings["copy_gbps"]}
    checks = []
    if check:
        # the public operator is checked by the gpu tier against PyTorch's own semantics (tests/test_nn.py):
        # on the problem's inputs its rows carry their error, as the peers' do
        checked = check_variants if check_variants is not None else \
            [v for v in variants if getattr(v, "kind", "variant") != "operator"]
        checks = check_problem(problem, checked,
                               list(check_sizes) if check_sizes else None, edge_cases=edge_cases, progress=progress)
    timed = variants
    rows, skipped, missing = [], [], _missing_peers(problem, peers, progress)
    for name in dtypes:
        dtype = getattr(torch, name)
        if timed and not any(dtype in (problem.dtypes(v) if isinstance(v, str) else v.dtypes) for v in timed):
            continue
        rows += bench_problem(problem, shape, variants, peers=tuple(peers), repeats=repeats,
                              bandwidth=bandwidth, progress=progress, dtype=dtype, rejected=skipped)
        skipped += [Skipped(problem.name, shape, name, peer, why) for peer, why in missing.items()]
    stamp = run_provenance(problem)
    for item in (*rows, *checks, *skipped):
        for key in ("date", "torch", "cuda", "sources_sha256"):
            if hasattr(item, key):
                setattr(item, key, stamp[key])
    section = Section(problem.name, stamp["device"], stamp["multiprocessors"], stamp["memory_bytes"],
                      stamp["compute_capability"], rows, checks, ceilings, None, "live", skipped)
    if ncu:
        named = [v if isinstance(v, str) else v.name for v in timed if isinstance(v, str | recorded.Variant)]
        section.ncu = profile_problem(problem, shape, named, tuple(peers))
    return section


def measure_sweep(problem: problems.Problem | str, shapes: Sequence[tuple[int, int]] | None = None, *,
                  dtypes: Sequence[str] = ("float32", "bfloat16"), peers: Sequence[str] = PEERS,
                  directions: Sequence[str] = SWEEP_DIRECTIONS, repeats: int = 20, ceilings: dict | None = None,
                  progress: bool = True) -> Section:
    """Time ``problem`` (a Problem, or its name) over a range of shapes now on the current GPU into a live
    Section (not saved).

    At each shape and dtype: every rung with kernels for the dtype, the public operator
    (``variants.operator_variant``; the teaching rungs are timed at the seed only) and every peer, forward and
    forward+backward (``directions``), per call, back to back and on the host (no float64
    checks: ``measure_section`` and the gpu tier make those; each row still records its error
    against float64). Fewer repeats at large shapes (``bench.sweep_repeats``). A rung hopeless
    at a shape (``bench.hopeless_reason``) and a shape whose inputs would not fit in the free
    device memory are left out, each as a :class:`Skipped` with its reason in
    ``section.skipped``, as is a peer that cannot run here (its reason printed once). Plot the
    result with :meth:`Section.sweep`. The torch.compile peer compiles once per dtype and then, as
    torch.compile does by default when a shape changes, once more with dynamic shapes: the code a
    training loop of varying sizes gets.

    Args:
        shapes: (rows, columns) pairs; default ``bench.SWEEP_SHAPES[problem]``.
    Raises:
        ValueError: unknown problem, dtype or direction; repeats < 1.
    """
    problem = problems.get(problem)
    shapes = [tuple(s) for s in (shapes or problem.sweep_shapes)]
    for name in dtypes:
        if name not in DTYPES:
            raise ValueError(f"dtypes: unknown dtype {name!r}; expected some of {', '.join(DTYPES)}")
    for direction in directions:
        if direction not in problems.DIRECTIONS:
            raise ValueError(f"directions: unknown direction {direction!r}; expected some of "
                             f"{', '.join(problems.DIRECTIONS)}")
    if repeats < 1:
        raise ValueError(f"repeats: expected at least 1, got {repeats}")
    ceilings = ceilings or measure_ceilings()
    bandwidth = {"read": ceilings["read_gbps"], "copy": ceilings["copy_gbps"]}
    rows, skipped, missing = [], [], _missing_peers(problem, peers, progress)
    for name in dtypes:
        dtype = getattr(torch, name)
        for shape in shapes:
            torch.cuda.empty_cache()
            free, _ = torch.cuda.mem_get_info()
            needed = sweep_memory_bytes(problem, shape, dtype)
            if needed > free:
                skipped.append(Skipped(problem.name, shape, name, "*", f"needs about {needed / 1e9:.1f} GB of device "
                                                                  f"memory; {free / 1e9:.1f} GB are free"))
                continue
            variants = [v for v in [*problem.variants, recorded.operator_variant(problem)]
                        if dtype in (problem.dtypes(v) if isinstance(v, str) else v.dtypes)]
            for v in variants:
                if reason := hopeless_reason(problem, v, shape):
                    skipped.append(Skipped(problem.name, shape, name, v, reason))
            variants = [v for v in variants if not hopeless_reason(problem, v, shape)]
            skipped += [Skipped(problem.name, shape, name, peer, why) for peer, why in missing.items()]
            rows += bench_problem(problem, shape, variants, peers=tuple(peers),
                                  repeats=sweep_repeats(problem, shape, dtype, repeats), bandwidth=bandwidth,
                                  progress=progress, dtype=dtype, directions=tuple(directions), rejected=skipped)
    stamp = run_provenance(problem)
    for item in (*rows, *skipped):
        for key in ("date", "torch", "cuda", "sources_sha256"):
            if hasattr(item, key):
                setattr(item, key, stamp[key])
    return Section(problem.name, stamp["device"], stamp["multiprocessors"], stamp["memory_bytes"],
                   stamp["compute_capability"], rows, [], ceilings, None, "live", skipped)
