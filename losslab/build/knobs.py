"""Launch knobs: a rung's compile-time launch configuration, declared in its kernel file.

Each rung file declares its knobs at its top, one ``LOSSLAB_<PROBLEM>_<RUNG>_<KNOB>`` macro each
(:func:`knobs` shows the form); that declaration is the only list of knobs. The default build
defines none of the macros; ``-D<macro>=<value>`` (``extension.load_extension(problem,
defines=...)``) builds another configuration, whose values :func:`config` checks first.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

# The kernel sources (also ``extension.KERNELS``): losslab/kernels/ in an installed wheel, else the checkout's.
_PACKAGE = Path(__file__).resolve().parents[1]
KERNELS = _PACKAGE / "kernels" if (_PACKAGE / "kernels").is_dir() else _PACKAGE.parent / "kernels"
_DECLARATION = re.compile(r"^#ifndef (LOSSLAB_\w+)\n#define \1 (\d+)\s*//\s*(.+?):\s*([\d ]+)$", re.MULTILINE)


def macro_prefix(problem: str, rung: str) -> str:
    """``LOSSLAB_<PROBLEM>_<RUNG>_``: the start of every knob macro of one rung."""
    return f"LOSSLAB_{problem.upper()}_{rung.upper()}_"


@dataclass(frozen=True)
class Knob:
    """One knob of one rung: ``name`` (e.g. ``THREADS``), its ``default`` in the kernel file,
    ``meaning`` (e.g. "threads per block") and the ``allowed`` values."""

    problem: str
    rung: str
    name: str
    default: int
    meaning: str
    allowed: tuple[int, ...]

    @property
    def macro(self) -> str:
        return macro_prefix(self.problem, self.rung) + self.name


def knobs(problem: str, rung: str, kernels: Path | None = None) -> tuple[Knob, ...]:
    """The knobs ``kernels/<problem>/<rung>.cu`` declares, in file order; () for a file with none
    or no such file. ``kernels`` defaults to :data:`KERNELS`.

    A knob is declared as one macro, named ``LOSSLAB_<PROBLEM>_<RUNG>_<KNOB>`` (upper case), with
    its default, what it sets and the values offered here::

        #ifndef LOSSLAB_KL_DIV_VECTORIZED_THREADS
        #define LOSSLAB_KL_DIV_VECTORIZED_THREADS 256  // threads per block: 32 64 128 256 512 1024
        #endif
        constexpr int THREADS = LOSSLAB_KL_DIV_VECTORIZED_THREADS;
        static_assert(..., "LOSSLAB_KL_DIV_VECTORIZED_THREADS: a multiple of 32 from 32 to 1024 (whole warps)");

    The values offered are checked by :func:`config`; the kernel's ``static_assert`` states what
    it needs and guards any value passed to the compiler directly."""
    path = (kernels or KERNELS) / problem / f"{rung}.cu"
    if not path.is_file():
        return ()
    prefix = macro_prefix(problem, rung)
    return tuple(Knob(problem, rung, macro.removeprefix(prefix), int(default), meaning.strip(),
                      tuple(int(v) for v in allowed.split()))
                 for macro, default, meaning, allowed in _DECLARATION.findall(path.read_text())
                 if macro.startswith(prefix))


def rung_of(label: str) -> str:
    """The rung of a configuration's label (``"vectorized [THREADS=512, UNROLL=4]"`` ->
    ``"vectorized"``); any other name as it is."""
    return label.split(" [", 1)[0]


@dataclass(frozen=True)
class Config:
    """One launch configuration of a rung: every knob's value, defaults filled in."""

    problem: str
    rung: str
    values: tuple[tuple[str, int], ...]
    defaults: tuple[tuple[str, int], ...]

    @property
    def label(self) -> str:
        """``"vectorized [THREADS=512, UNROLL=4]"``; the rung's name alone when it has no knobs."""
        inner = ", ".join(f"{k}={v}" for k, v in self.values)
        return f"{self.rung} [{inner}]" if inner else self.rung

    @property
    def is_default(self) -> bool:
        return self.values == self.defaults

    @property
    def defines(self) -> tuple[tuple[str, int], ...]:
        """(macro, value) of each knob set away from its default: what the compiler is given."""
        prefix = macro_prefix(self.problem, self.rung)
        return tuple((prefix + k, v) for (k, v), (_, d) in zip(self.values, self.defaults, strict=True) if v != d)


def config(problem: str, rung: str, values: Mapping[str, int] | None = None,
           kernels: Path | None = None) -> Config:
    """The configuration of ``rung`` with ``values`` (knob name -> value) and defaults elsewhere.

    Raises:
        ValueError: a knob the rung does not declare, or a value not among the knob's allowed
            values (one line naming the knob and what it takes).
    """
    declared = {k.name: k for k in knobs(problem, rung, kernels)}
    values = dict(values or {})
    for name, value in values.items():
        knob = declared.get(name)
        if knob is None:
            raise ValueError(f"knobs: {problem} {rung} has no knob {name!r}; its knobs: "
                             + (", ".join(declared) or "none"))
        if isinstance(value, bool) or not isinstance(value, int) or value not in knob.allowed:
            raise ValueError(f"{name} ({knob.meaning} of {problem} {rung}): {value!r} is not offered; "
                             f"expected one of {', '.join(map(str, knob.allowed))}")
    return Config(problem, rung, tuple((n, values.get(n, k.default)) for n, k in declared.items()),
                  tuple((n, k.default) for n, k in declared.items()))
