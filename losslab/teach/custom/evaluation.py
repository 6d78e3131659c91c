"""A custom variant checked and placed on the ladder, in a child process with a time limit.

:func:`check` runs the float64 checks of a variant; :func:`evaluate` also times it beside the
shipped rungs and the PyTorch peers (``records.measure_section``). Both run in a child process
(``losslab.teach.isolated``) by default: a kernel that hangs or faults (a misaligned float4
load, an illegal address) ends as a verdict, and this process's CUDA context stays usable.
The child rebuilds the variant from its source (the build is cached: it only imports it).
"""
from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from losslab import problems
from losslab.teach import isolated

CHECK_TIMEOUT_S, EVALUATE_TIMEOUT_S = 120.0, 600.0


@dataclass
class CheckRun:
    """The checks of a variant run in a child: ``outcome`` (``isolated.Outcome``) says whether the
    child finished; ``checks`` the CheckResults when it did (None when it hung or faulted)."""

    outcome: isolated.Outcome
    checks: list | None

    @property
    def passed(self) -> bool:
        return self.checks is not None and all(c.passed for c in self.checks)

    def format(self) -> str:
        """The checks passed of run and the first failures, or the child's verdict."""
        if self.checks is None:
            return "checks did not finish: " + self.outcome.format()
        failed = [c for c in self.checks if not c.passed]
        lines = [f"checks: {len(self.checks) - len(failed)} of {len(self.checks)} passed "
                 f"({self.outcome.seconds:.0f} s in a child process)"]
        lines += [f"  FAIL {c.direction} {c.case}: error {c.error:.2e} > {c.tolerance:.0e} {c.detail}".rstrip()
                  for c in failed[:8]]
        return "\n".join(lines)

    def _repr_mimebundle_(self, include=None, exclude=None):
        color, text = "#060" if self.passed else "#b00", self.format()
        return {"text/plain": text, "text/html": f'<pre style="color:{color}">{html.escape(text)}</pre>'}


def _rebuild_arguments(variant) -> dict:
    """What a child needs to rebuild ``variant`` from its source (a ``CustomVariant``)."""
    return {"problem": variant.problem.name, "name": variant.name, "cuda_source": variant.source,
            "backward": "source" if variant.backward_from is None else variant.backward_from,
            "root": str(variant.compiled.folder.parent)}


def _check_sizes(problem: problems.Problem, sizes: Sequence[str] | None) -> list[str]:
    chosen = list(sizes) if sizes is not None else [s for s in problem.sizes if s != "seed"]
    for name in chosen:
        if name not in problem.sizes:
            raise ValueError(f"sizes: {problem.name} has no size {name!r}; expected some of "
                             f"{', '.join(problem.sizes)}")
    return chosen


def run_checks(variant, sizes: Sequence[str], edge_cases: bool = True, seed: int | None = 0) -> list:
    """The CheckResults of ``variant`` at ``sizes`` and (if ``edge_cases``) on the edge cases,
    in this process (a fault here breaks this process's CUDA context: see :func:`check`)."""
    from losslab.measure.check import check_edge_cases, check_variant

    checks = [c for s in sizes for c in check_variant(variant.problem, variant, variant.problem.sizes[s], seed=seed)]
    return checks + (check_edge_cases(variant.problem, variant) if edge_cases else [])


def checks_in_child(problem: str, name: str, cuda_source: str, backward: str | None, root: str,
                    sizes: list[str], edge_cases: bool, seed: int | None) -> list[dict]:
    """The child's side of :func:`check`: rebuild (cached) and check; the results as dicts."""
    from pathlib import Path

    from losslab.teach.custom.variant import compile_variant

    variant = compile_variant(problem, name, cuda_source, backward=backward, root=Path(root))
    return [c.as_dict() for c in run_checks(variant, sizes, edge_cases, seed)]


def check(variant, sizes: Sequence[str] | None = None, *, edge_cases: bool = True, seed: int | None = 0,
          timeout_s: float = CHECK_TIMEOUT_S) -> CheckRun:
    """Check a ``CustomVariant`` against float64 in a child process with a time limit (needs a GPU).

    Args:
        sizes: size names (default every size of the problem but the seed).
        edge_cases: also the problem's edge cases.
        seed: the inputs' seed (None: a fresh one per size).
        timeout_s: seconds before the child is killed (the cached build's import included).
    Returns a :class:`CheckRun`; a hang or a fault is its outcome, never an exception.

    Raises:
        RuntimeError: no CUDA GPU.
        ValueError: an unknown size.
    """
    from losslab.measure.check import CheckResult

    if not torch.cuda.is_available():
        raise RuntimeError("check needs a CUDA GPU and none is visible here")
    kwargs = {**_rebuild_arguments(variant), "sizes": _check_sizes(variant.problem, sizes),
              "edge_cases": edge_cases, "seed": seed}
    outcome = isolated.run("losslab.teach.custom.evaluation:checks_in_child", kwargs, timeout_s)
    checks = [CheckResult(**{**c, "shape": tuple(c["shape"])}) for c in outcome.value] if outcome.ok else None
    return CheckRun(outcome, checks)


def _measure(variant, size: str, sizes: list[str], rungs: list[str], repeats: int, edge_cases: bool,
             compile_peer: bool):
    from losslab import records

    return records.measure_section(
        variant.problem, size, variants=[*rungs, variant], peers=("eager", "compile") if compile_peer else ("eager",),
        repeats=repeats, check_variants=[variant], check_sizes=sizes, edge_cases=edge_cases, progress=False)


def evaluate_in_child(problem: str, name: str, cuda_source: str, backward: str | None, root: str, size: str,
                      sizes: list[str], rungs: list[str], repeats: int, edge_cases: bool,
                      compile_peer: bool) -> dict:
    """The child's side of :func:`evaluate`: rebuild (cached), measure; the section as a dict."""
    from pathlib import Path

    from losslab.teach.custom.variant import compile_variant

    variant = compile_variant(problem, name, cuda_source, backward=backward, root=Path(root))
    return _measure(variant, size, sizes, rungs, repeats, edge_cases, compile_peer).as_dict()


def evaluate(variant, size: str = "small", *, sizes: Sequence[str] | None = None,
             ladder: Sequence[str] | None = None, repeats: int = 20, edge_cases: bool = True,
             compile_peer: bool = False, isolate: bool = True, timeout_s: float = EVALUATE_TIMEOUT_S):
    """Check ``variant`` and time it beside the ladder and the PyTorch peers (needs a GPU).

    Args:
        variant: a ``CustomVariant`` (or, with ``isolate=False``, any variant object).
        size: the size name the bench times at.
        sizes: the size names the checks run at (default every size but the seed); the edge
            cases too if ``edge_cases``.
        ladder: the shipped rungs timed beside it (default all).
        repeats: timed calls per (implementation, direction).
        compile_peer: also time ``torch.compile`` of the reference (beside eager).
        isolate: measure in a child process killed after ``timeout_s`` seconds.
    Returns a live ``records.Section`` (checks of ``variant``; rows of ``variant``, the rungs and
    the peers) for ``present``'s tables, charts and roofline.

    Raises:
        RuntimeError: no CUDA GPU; isolated, the child hung, faulted or raised (the message is
            its verdict, with what a CUDA fault usually means).
        ValueError: unknown size or rung.
    """
    from losslab import records

    if not torch.cuda.is_available():
        raise RuntimeError("evaluate needs a CUDA GPU and none is visible here")
    spec = variant.problem
    if size not in spec.sizes:
        raise ValueError(f"size: {spec.name} has no size {size!r}; expected one of {', '.join(spec.sizes)}")
    rungs = list(spec.variants if ladder is None else ladder)
    for rung in rungs:
        spec.check_variant_name(rung)
    sizes = _check_sizes(variant.problem, sizes)
    if not isolate:
        return _measure(variant, size, sizes, rungs, repeats, edge_cases, compile_peer)
    kwargs = {**_rebuild_arguments(variant), "size": size, "sizes": sizes, "rungs": rungs, "repeats": repeats,
              "edge_cases": edge_cases, "compile_peer": compile_peer}
    outcome = isolated.run("losslab.teach.custom.evaluation:evaluate_in_child", kwargs, timeout_s)
    if not outcome.ok:
        raise RuntimeError(f"evaluating {variant.problem.name} variant {variant.name!r}: {outcome.format()}")
    section = records.Section.from_dict(outcome.value, variant.problem.name)
    section.source = "live"
    return section
