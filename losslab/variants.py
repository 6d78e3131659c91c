"""What a record holds of a problem besides the peers, by the names the records give them: its
rungs (names), its teaching rungs (``"<rung> [ladder]"``, :func:`losslab.ops.ladder_variant`) and
the public operator (``"losslab.nn"``, :func:`operator_variant`). Name lookup happens here, at the
edges (command line, notebook parameters, the ncu child)."""
from __future__ import annotations

import functools

from losslab import problems
from losslab.build import ladder
from losslab.nn import functional
from losslab.ops import LADDER_TAG, OPERATOR, Variant, ladder_variant


@functools.cache
def operator_variant(problem: str) -> Variant:
    """What a user calls for ``problem`` (``losslab.nn.functional.on_problem``: PyTorch's default
    options), named :data:`~losslab.ops.OPERATOR` in the records. Its forward writes the gradient
    when one will be needed (so it has no backward row of its own), as the fused rungs' do."""
    rung = problems.Rung(OPERATOR, dtypes=problems.HALF_AND_FLOAT, writes_grad_in_forward=True)
    return Variant(problem, OPERATOR, "operator", rung.dtypes, rung, functional.on_problem(problem))


def find_variant(problem: str, name: str) -> str | Variant:
    """A variant by the name the records give it: a rung's name (returned as it is), ``"<rung>
    [ladder]"`` or :data:`~losslab.ops.OPERATOR`.

    Raises:
        ValueError: no such variant (naming the rungs).
    """
    if name == OPERATOR:
        return operator_variant(problem)
    if name.endswith(LADDER_TAG):
        return ladder_variant(problem, name.removesuffix(LADDER_TAG).strip())
    problems.get(problem).check_variant_name(name)
    return name


def recorded_variants(problem: str) -> list[str | Variant]:
    """Its rungs (by name), its teaching rungs and its public operator."""
    taught = ladder.rungs(problem) if problem in ladder.problems_with_ladder() else ()
    return [*problems.get(problem).variants, *(ladder_variant(problem, r) for r in taught), operator_variant(problem)]
