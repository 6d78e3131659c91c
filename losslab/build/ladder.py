"""Build a problem's teaching ladder, apart from its production rungs.

``kernels/<problem>/ladder/`` holds one small ``<rung>.cu`` per step of the lesson (one idea
each, float32 only) and ``ladder.h``, whose ``<PROBLEM>_LADDER(X)`` X-macro lists the rungs in
order. The files define the launchers ``kernels/<problem>/launchers.h`` declares, under the
production rungs' names, so they go into an extension of their own, ``losslab_<problem>_ladder``:
the binding ``losslab/build/csrc/<problem>_ladder.cpp``, ``kernels/common/*.cu``, the problem's
support files that are no rung (e.g. cross_entropy's ``valid_mean.cu``) and the ladder's files,
built as :func:`losslab.build.extension.load_extension` builds (same flags, include path,
toolkit and architectures, cached by ``torch.utils.cpp_extension``).
"""
from __future__ import annotations

import functools
import re
from pathlib import Path

from losslab.build.extension import (
    CSRC,
    KERNELS,
    BuildError,
    build,
)

LADDER = "ladder"  # the folder under kernels/<problem>/, and the binding's suffix
_ORDER = re.compile(r"^#define\s+\w+_LADDER\(X\)(.*)$", re.MULTILINE)


def support_sources(kernels: Path, problem: str) -> list[Path]:
    """The .cu files linked beside rungs that are not the production ones (the ladder's, a
    participant's): ``common/*.cu`` and the problem's files that are no production rung
    (launchers.h's ``<PROBLEM>_RUNGS`` list names those), e.g. cross_entropy's valid_mean.cu.
    ``kernels``: the kernel tree (the repository's, or the simulator's rewritten copy)."""
    launchers = (kernels / problem / "launchers.h").read_text()
    rungs_line = re.search(r"#define\s+\w+_RUNGS\(X\)(.*)", launchers)
    production = set(re.findall(r"X\((\w+)\)", rungs_line[1])) if rungs_line else set()
    own = [p for p in sorted((kernels / problem).glob("*.cu")) if p.stem not in production]
    return sorted((kernels / "common").glob("*.cu")) + own


def folder(problem: str) -> Path:
    """``kernels/<problem>/ladder``: where ``problem``'s ladder lives (it may not exist)."""
    return KERNELS / problem / LADDER


def problems_with_ladder() -> tuple[str, ...]:
    """The problems that have a ladder (a ``kernels/<problem>/ladder/ladder.h``), sorted."""
    return tuple(sorted(p.parent.parent.name for p in KERNELS.glob(f"*/{LADDER}/ladder.h")))


def rungs(problem: str) -> tuple[str, ...]:
    """``problem``'s ladder rungs in order, read from the ``<PROBLEM>_LADDER(X)`` line of its
    ``ladder.h`` (e.g. ``("naive", "shared_memory", ...)``).

    Raises:
        ValueError: ``problem`` has no ladder, or its ladder.h has no such line (or lists no rung).
    """
    header = folder(problem) / "ladder.h"
    if not header.is_file():
        raise ValueError(f"problem: {problem!r} has no teaching ladder (no {header}); "
                         f"the problems with one: {', '.join(problems_with_ladder()) or 'none'}")
    found = _ORDER.search(header.read_text())
    names = tuple(re.findall(r"X\((\w+)\)", found.group(1))) if found else ()
    if not names:
        raise ValueError(f"{header}: expected a line '#define {problem.upper()}_LADDER(X) X(first) X(second) ...'")
    return names


def source(problem: str, rung: str) -> Path:
    """The kernel file of one rung of ``problem``'s ladder: ``kernels/<problem>/ladder/<rung>.cu``.

    Raises:
        ValueError: no such ladder, or ``rung`` is not one of its rungs (naming them).
    """
    names = rungs(problem)
    if rung not in names:
        raise ValueError(f"rung: the {problem} ladder has no rung {rung!r}; its rungs: {', '.join(names)}")
    return folder(problem) / f"{rung}.cu"


def extension_name(problem: str) -> str:
    """The ladder extension's module name and build folder: ``losslab_<problem>_ladder``."""
    return f"losslab_{problem}_{LADDER}"


def sources(problem: str) -> list[Path]:
    """The files the ladder extension of ``problem`` is built from: the binding, ``kernels/common``'s
    ``.cu`` files, the problem's support ``.cu`` files that are no production rung, and one
    ``.cu`` per ladder rung (in ladder order).

    Raises:
        ValueError: no ladder (see :func:`rungs`).
        BuildError: the binding or a rung's file is missing.
    """
    files = [CSRC / f"{problem}_{LADDER}.cpp", *support_sources(KERNELS, problem)]
    files += [folder(problem) / f"{rung}.cu" for rung in rungs(problem)]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise BuildError(f"the {problem} ladder cannot be built: missing {', '.join(missing)}")
    return files


@functools.cache
def load_ladder(problem: str, verbose: bool = False):
    """Build (if needed) and import ``problem``'s ladder extension: ``<rung>_forward`` and
    ``<rung>_backward`` for each rung, with the signatures of ``kernels/<problem>/launchers.h``
    (bound through ``csrc/bind.h``: pointers, sizes and the dtype code as integers, the stream last).

    No GPU is needed to build; the architectures are the visible GPU's, else sm_80 and sm_90
    ($TORCH_CUDA_ARCH_LIST overrides), and $TORCH_EXTENSIONS_DIR moves the cache, as for
    :func:`losslab.build.extension.load_extension`.

    Raises:
        ValueError: ``problem`` has no ladder.
        BuildError: torch has no CUDA support, nvcc is missing, a source is missing, or
            compilation failed (a failed ``static_assert`` as one line naming it).
    """
    return build(extension_name(problem), f"the {problem} ladder", sources(problem), verbose=verbose)
