"""The SASS the notebooks quote beside their prose, chosen so that the listing shows what the text
says: a rung's own kernels of one direction (not the reduction-options kernels its file also
compiles for ``losslab.nn``), every line of the instruction families asked for unless a limit is
given (and then saying how many are left out), and the load offsets the prose cites, read from
that same listing rather than typed. Compiled by ``machine_code.rung_code`` (nvcc, no GPU).
"""
from __future__ import annotations

import html
import math
import re

from losslab import problems
from losslab.present import machine_code
from losslab.present.html import Html, markdown, message

# a global load's base register and offset: "LDG.E.CONSTANT R15, desc[UR4][R4.64+-0x800]"
_LOAD = re.compile(r"LDG\S*\s+\S+\s+desc\[\w+\]\[(R\d+)\.64(?:\+(-?0x[0-9a-f]+))?\]")


LOAD_WORDS = {"LDG 4 B": "loads of 4 bytes (`LDG.E`)", "LDG 16 B": "loads of 16 bytes (`LDG.E.128`)"}


def own_kernels(problem: problems.Problem, rung: str, direction: str,
                arch: str = "sm_90") -> list[machine_code.KernelCode] | None:
    """The float32 kernels of ``direction`` that ``rung`` runs: those named after the rung, else
    (a rung that reuses the rung below's kernel, as warp_shuffle's backward does) the direction's
    kernels other than the options kernels (``<problem>_options_...``: reductions other than the
    loss's, which the notebooks do not time). None where nvcc or cuobjdump is missing."""
    kernels = machine_code.rung_code(problem, rung, arch)
    if kernels is None:
        return None
    mine = [k for k in kernels if k.direction == direction and "options" not in k.name]
    return [k for k in mine if k.name.startswith(f"{problem.name}_{rung}_")] or mine


def listing(problem: problems.Problem, rung: str, direction: str = "forward", arch: str = "sm_90",
            families: tuple[str, ...] = ("LDG 4 B", "LDG 16 B"), limit: int | None = None) -> Html:
    """The SASS lines of ``families`` in each of :func:`own_kernels`, headed by the kernel's name,
    registers, spills and how many lines of each family it holds; all of them, or the first
    ``limit`` and a line saying how many more there are."""
    kernels = own_kernels(problem, rung, direction, arch)
    if kernels is None:
        return message(machine_code.NO_NVCC)
    parts = []
    for k in kernels:
        lines = [line for line in k.lines if any(re.search(machine_code.FAMILIES[f], line) for f in families)]
        counts = ", ".join(f"{k.count(f)} {f}" for f in families)
        shown = lines if limit is None else lines[:limit]
        more = [f"... and {len(lines) - len(shown)} more"] if len(shown) < len(lines) else []
        parts.append("\n".join([f"// {k.name}: {k.registers} registers per thread, {k.spill_bytes} bytes spilled "
                                f"({arch}); {counts}", *shown, *more]))
    text = "\n\n".join(parts) or f"{rung} has no {direction} kernel of its own"
    return Html(f'<pre style="font-size:11px">{html.escape(text)}</pre>', plain=text)


def load_offsets(kernel: machine_code.KernelCode, family: str = "LDG 4 B") -> dict[str, list[int]]:
    """Base register -> the distinct byte offsets of ``family``'s loads from it, ascending."""
    found: dict[str, set[int]] = {}
    for line in kernel.lines:
        hit = _LOAD.search(line)
        if hit and re.search(machine_code.FAMILIES[family], line):
            found.setdefault(hit.group(1), set()).add(int(hit.group(2) or "0x0", 16))
    return {base: sorted(offsets) for base, offsets in found.items()}


def _hex(offset: int) -> str:
    return f"{'-' if offset < 0 else '+'}0x{abs(offset):x}"


def unrolled_loads(problem: problems.Problem, rung: str, direction: str = "forward", arch: str = "sm_90",
                   family: str = "LDG 4 B"):
    """One sentence (Markdown) on how many ``family`` loads the compiler issues from one base
    register in ``rung``'s ``direction`` kernel, at which offsets and how far apart, read from the
    listing :func:`listing` shows: "4 loads ... at -0x800, -0x400, +0x0, +0x400, 0x400 bytes apart"
    where a strided loop was unrolled, "one load per base register" where it was not."""
    kernels = own_kernels(problem, rung, direction, arch)
    if kernels is None:
        return markdown(machine_code.NO_NVCC)
    if not kernels:
        return markdown(f"`{rung}` has no {direction} kernel of its own.")
    k = kernels[0]
    offsets = load_offsets(k, family)
    most = max((len(v) for v in offsets.values()), default=0)
    loads = LOAD_WORDS.get(family, f"{family} loads")
    where = f"In `{k.name}` as compiled here ({arch}), "
    if most <= 1:
        return markdown(where + f"each of its {loads} has its own base register: one load per thread and "
                        "tensor in flight, each waiting for the loop's next address.")
    bases = [b for b, v in offsets.items() if len(v) == most]
    shown = offsets[bases[0]]
    step = math.gcd(*(b - a for a, b in zip(shown, shown[1:], strict=False)))
    names = [f"`{b}`" for b in bases]
    at = ", ".join(f"`{_hex(o)}`" for o in shown)
    if len(bases) == 1:
        who = f"base register {names[0]} feeds {most} {loads}, issued before any of them is used, at offsets {at}"
    else:
        same = len({tuple(offsets[b]) for b in bases}) == 1
        who = (f"base registers {', '.join(names[:-1])} and {names[-1]} each feed {most} {loads}, issued before any "
               f"of them is used, " + (f"each at offsets {at}" if same else f"{names[0]} at offsets {at}"))
    return markdown(where + f"{who}: 0x{step:x} = {step} bytes apart.")
