"""What a record holds of a problem besides the peers, by the names the records give them: its
rungs (names), its teaching rungs (``"<rung> [ladder]"``, :func:`ladder_variant`) and
the public operator (``"losslab.nn"``, :func:`operator_variant`), each of a :class:`~losslab.problems.Problem`
(looked up by name at the edges: command line, notebook parameters, the ncu child)."""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from losslab import ops, problems
from losslab.build import ladder
from losslab.nn import functional

LADDER_TAG = "[ladder]"  # a teaching rung's name in the records: "fused [ladder]"
OPERATOR = "losslab.nn"  # the public operator's name in the records


@dataclass(frozen=True, eq=False)
class Variant:
    """An implementation of a problem that measure, records and present treat as a variant but
    that is no rung of its table: a teaching rung (``kind`` "ladder", kernels/<problem>/ladder/,
    float32) or the public operator (``kind`` "operator", ``losslab.nn.functional.on_problem``).

    Called with the reference's arguments, it returns the 0-d loss. ``launch_forward`` and
    ``launch_backward`` (the problem launchers' interface, for the checks' rerun into poisoned
    buffers) are None for the public operator, whose kernels the checks reach only through it.
    """

    problem: problems.Problem
    name: str
    kind: str
    dtypes: tuple[torch.dtype, ...]
    rung: problems.Rung = field(repr=False)
    call: Callable[..., torch.Tensor] = field(repr=False)
    launch_forward: Callable | None = field(default=None, repr=False)
    launch_backward: Callable | None = field(default=None, repr=False)

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.call(*inputs)


@functools.cache
def ladder_variant(problem: problems.Problem, rung: str) -> Variant:
    """Teaching rung ``rung`` of ``problem`` (``kernels/<problem>/ladder/<rung>.cu``, float32, built
    as the ladder's own extension at the first call), through the host code and eager path of the
    production rung of the same name (a plain rung where there is none). Named ``"<rung> [ladder]"`` in the records.

    Raises:
        ValueError: ``problem`` has no teaching rung ``rung``.
    """
    taught = _taught(problem)
    if rung not in taught:
        raise ValueError(f"variant: {problem.name} has no teaching rung {rung!r}; expected one of {', '.join(taught)}")
    # a teaching rung without an operator of its name (mse_loss's lower rungs) is a plain one
    row = problem.rung(rung) if rung in problem.variants else problems.Rung(rung)
    own = dataclasses.replace(row, dtypes=problems.FLOAT32)
    built = ops.RungOps(problem, own, functools.partial(ladder.load_ladder, problem.name))
    return Variant(problem, f"{rung} {LADDER_TAG}", "ladder", own.dtypes, own,
                   ops.checked_loss(problem, own, built, strict=False), built.launch_forward, built.launch_backward)


@functools.cache
def operator_variant(problem: problems.Problem) -> Variant:
    """What a user calls for ``problem`` (``losslab.nn.functional.on_problem``: PyTorch's default
    options), named :data:`OPERATOR` in the records. Its forward writes the gradient
    when one will be needed (so it has no backward row of its own), as the fused rungs' do."""
    rung = problems.Rung(OPERATOR, dtypes=problems.HALF_AND_FLOAT, writes_grad_in_forward=True)
    return Variant(problem, OPERATOR, "operator", rung.dtypes, rung, functional.on_problem(problem.name))


def find_variant(problem: problems.Problem, name: str) -> str | Variant:
    """A variant by the name the records give it: a rung's name (returned as it is), ``"<rung>
    [ladder]"`` or :data:`OPERATOR`.

    Raises:
        ValueError: no such variant (naming the rungs).
    """
    if name == OPERATOR:
        return operator_variant(problem)
    if name.endswith(LADDER_TAG):
        return ladder_variant(problem, name.removesuffix(LADDER_TAG).strip())
    problem.check_variant_name(name)
    return name


def _taught(problem: problems.Problem) -> tuple[str, ...]:
    """Its teaching rungs' names, in ladder order (none without a teaching ladder)."""
    return tuple(ladder.rungs(problem.name)) if problem.name in ladder.problems_with_ladder() else ()


def recorded_variants(problem: problems.Problem) -> list[str | Variant]:
    """Its rungs (by name), its teaching rungs and its public operator."""
    return [*problem.variants, *(ladder_variant(problem, r) for r in _taught(problem)), operator_variant(problem)]
