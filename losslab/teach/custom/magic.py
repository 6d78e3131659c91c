"""The Jupyter cell magic ``%%losslab_variant <problem> <name> [backward rung]``, which compiles
the cell into ``<name>``; ``%load_ext losslab.teach.custom`` adds it."""
from __future__ import annotations

import sys

from losslab import build
from losslab.teach.custom.variant import compile_variant

USAGE = "usage: %%losslab_variant <problem> <name> [backward rung]"


def losslab_variant(line: str, cell: str, namespace: dict):
    """Compile ``cell`` into the variant ``<name>`` and bind it in ``namespace``; a bad line or
    a compile error is printed (in the cell's line numbers, no traceback) and binds nothing.
    Returns the variant, or None."""
    words = line.split()
    if len(words) not in (2, 3):
        print(USAGE, file=sys.stderr)
        return None
    problem, name = words[:2]
    try:
        variant = compile_variant(problem, name, cell, backward=words[2] if len(words) == 3 else None)
    except (build.BuildError, ValueError) as err:
        print(err, file=sys.stderr)
        return None
    namespace[name] = variant
    return variant


def load_ipython_extension(ipython) -> None:
    """``%load_ext losslab.teach.custom``: registers :func:`losslab_variant` as a cell magic."""
    ipython.register_magic_function(lambda line, cell: losslab_variant(line, cell, ipython.user_ns), "cell",
                                    "losslab_variant")
