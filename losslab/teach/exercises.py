"""Graded exercises that follow the ladders: a skeleton to complete, a grader, a solution.

``exercises.task("coalesce")`` says what to do; ``exercises.grade("coalesce")`` compiles the skeleton as it
is now, reads its machine code, runs it on the CPU simulator (and on a GPU where there is one) and says what
is wrong. An exercise is a CUDA file under ``exercises/<problem>/`` that compiles but fails until its
``FILL ME IN`` is done; its solution is under ``exercises/solutions/<problem>/``; both define a custom
variant's launchers (``losslab.teach.custom``). One idea of a rung each: coalesce, warp_shuffle, vectorize,
fused (kl_div); logsumexp_tree, warp_max, online_softmax, vectorize_logits, fused_softmax, cluster
(cross_entropy); then one a rung above naive of each later loss, named by idea and loss (mse_block_sum...).
One module: the table of exercises, their machine-code checks and the grade that reads them change together.
"""
from __future__ import annotations

import html
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from losslab import build
from losslab.present.html import Html
from losslab.problems import (
    cosine_similarity_loss,
    cross_entropy,
    hinge_loss,
    kl_div,
    mse_loss,
    smooth_l1_loss,
    triplet_margin_loss,
)
from losslab.teach import custom, isolated
from losslab.teach.custom.evaluation import CHECK_TIMEOUT_S
from losslab.teach.simulator.diagnose import EMPTY

ROOT = build.ROOT / "exercises"
SIZES = ("small", "odd", "narrow", "scalar")  # graded sizes: aligned, odd, few rows, one element
# A global load's immediate offset, in the SASS of every toolkit and architecture seen: sm_80's
# `LDG.E.CONSTANT R14, [R8.64+0x800]` and sm_90's `LDG.E.CONSTANT R14, desc[UR8][R8.64+-0x800]`.
_LOAD_OFFSET = re.compile(r"LDG(?:\.\w+)*\s+R\d+,\s*(?:desc\[\w+\])?\[R\d+(?:\.64)?(?:\+?(-?0x[0-9a-f]+))?\]")


def _kernel_sass(sass: str, kernel: str) -> str:
    """The SASS of the functions whose mangled name contains ``kernel`` (all of it when none does)."""
    parts = re.split(r"(?=\n\s*Function : )", sass)
    mine = [p for p in parts if re.search(rf"Function : \S*{kernel}", p)]
    return "\n".join(mine) or sass


def _strided_loads(sass: str) -> bool | None:
    """Whether the row loop's unrolled loads step by a block's width: True when the loads'
    immediate offsets are multiples of 0x400 (256 floats: thread k's next element is a block
    away), False when one is 4, 8 or 12 bytes (a thread walking consecutive floats), None when
    the compiler left no offsets to read (the loop not unrolled)."""
    offsets = [int(m[1], 16) for m in _LOAD_OFFSET.finditer(_kernel_sass(sass, "forward_kernel")) if m[1]]
    if any(0 < abs(o) < 16 for o in offsets):
        return False
    return True if any(o % 0x400 == 0 for o in offsets) else None


@dataclass(frozen=True)
class SassCheck:
    """One machine-code check: ``label`` is shown; ``any_of``: opcodes of which one must appear
    (``more``: more of them than in the skeleton's own SASS, for an idea that adds instructions
    the skeleton already has some of: compilers differ in what they keep of an unfinished
    skeleton), or ``test``: a function of the SASS giving True, False or None (cannot tell);
    ``why`` explains what it shows; ``notes``: (opcode, note) shown when that opcode is found;
    ``fix``: the likely mistake and its fix when the check fails (the grade's hint)."""

    label: str
    why: str
    any_of: tuple[str, ...] = ()
    test: Callable[[str], bool | None] | None = None
    notes: tuple[tuple[str, str], ...] = ()
    more: bool = False
    fix: str = ""

    def found(self, sass: str, skeleton: str = "") -> bool | None:
        """Whether ``sass`` shows the idea; ``skeleton``: the skeleton's SASS, for a ``more`` check."""
        if self.test:
            return self.test(sass)
        if self.more:
            return sum(sass.count(op) for op in self.any_of) > sum(skeleton.count(op) for op in self.any_of)
        return any(op in sass for op in self.any_of)

    def explain(self, sass: str) -> list[str]:
        return [note for opcode, note in self.notes if opcode in sass]


SHUFFLE = SassCheck(
    "a warp shuffle (SHFL.BFLY or SHFL.DOWN)",
    "registers exchanged between lanes, no shared memory",
    any_of=("SHFL.BFLY", "SHFL.DOWN"),
    notes=(("SHFL.DOWN", "SHFL.DOWN (__shfl_down_sync) is fine here: only lane 0's result is used, and a shift "
                         "down leaves lane 0 complete; SHFL.BFLY (__shfl_xor_sync) leaves the sum in every lane, "
                         "which a caller that needs it everywhere (a max used by all lanes) requires"),))
STRIDED_LOADS = SassCheck(
    "loads a block's width apart (LDG offsets in multiples of 0x400)",
    "the compiler unrolls the row loop; the immediate offsets of its loads are the distance from one iteration's "
    "element to the next for one thread: 256 floats (0x400 bytes) when a thread steps over the block's other "
    "threads, 4 bytes when it walks its own run of consecutive floats (uncoalesced across lanes)", test=_strided_loads,
    fix="each thread walks its own run of consecutive elements, so at each step the lanes of a warp read addresses "
        "far apart (uncoalesced, 32 cache lines a load): thread k must start at element k and step by THREADS")
TREE_BARRIERS = SassCheck("more barriers (BAR.SYNC) than the skeleton", "one barrier a step of the tree: a thread "
                          "reads slots other threads wrote", any_of=("BAR.SYNC",), more=True,
                          fix="a __syncthreads() after each step of the tree")
FLOAT4_LOADS = SassCheck("16-byte loads (LDG.E.128)", "one instruction moves four floats", any_of=("LDG.E.128",),
                         fix="read the packs through float4 loads (load_float4, or a float4 pointer): 4-byte loads "
                             "of the same addresses move a quarter of the bytes an instruction")


def _cluster_source_check(source: str) -> list[str]:
    """The cluster exercise's mistakes that the source shows: the other CTA's part never read through
    DSMEM, or read from its own rank, and a cluster.sync() missing before or after the read."""
    from losslab.teach.simulator.build import blank_comments

    code = blank_comments(source)
    read = re.search(r"map_shared_rank\s*\(([^;]*)\)", code)
    if read is None:
        return ["the other CTA's part is never read: other = *cluster.map_shared_rank(&part, rank ^ 1) points "
                "into its shared memory"]
    if re.fullmatch(r"\s*&\s*part\s*,\s*rank\s*", read[1]):
        return ["map_shared_rank(&part, rank) is this CTA's own part: the other CTA's rank is rank ^ 1"]
    before, after = code[:read.start()].count(".sync()"), code[read.end():].count(".sync()")
    if before == 0:
        return ["the other CTA's part is read before it is written: a cluster.sync() between thread 0's store "
                "and the read"]
    if after == 0:
        return ["a CTA may exit while the other still reads its shared memory: a cluster.sync() after the read"]
    return []


@dataclass(frozen=True)
class Exercise:
    """One exercise: ``key`` names its files, ``rung`` the shipped rung it rebuilds, ``minutes``
    the time a participant typically needs, ``sass`` the machine-code checks it must pass when
    done; ``fused``: its forward writes the gradient (checked with the fused rung's autograd);
    ``cpu_check``: for an exercise the simulator cannot run (no clusters on the CPU), what the CPU
    checks instead: the source's mistakes, as messages (the kernel is graded on a GPU only)."""

    key: str
    problem: str
    rung: str
    title: str
    task: str
    minutes: int
    sass: tuple[SassCheck, ...] = ()
    fused: bool = False
    cpu_check: Callable[[str], list[str]] | None = None

    @property
    def skeleton(self) -> Path:
        return ROOT / self.problem / f"{self.key}.cu"

    @property
    def solution(self) -> Path:
        return ROOT / "solutions" / self.problem / f"{self.key}.cu"


KL_DIV, CROSS_ENTROPY = kl_div.PROBLEM.name, cross_entropy.PROBLEM.name  # the losses of the exercises
MSE_LOSS, HINGE_LOSS, SMOOTH_L1_LOSS = mse_loss.PROBLEM.name, hinge_loss.PROBLEM.name, smooth_l1_loss.PROBLEM.name
COSINE, TRIPLET = cosine_similarity_loss.PROBLEM.name, triplet_margin_loss.PROBLEM.name
# the tasks that several losses' exercises share, word for word
WARP_SUM_TASK = ("Write warp_sum: the sum of `value` over the 32 lanes of the warp, exchanged through registers "
                 "(no shared memory, no barrier). block_sum uses lane 0's result.")
COALESCE_TASK = ("One block per row: the block's threads must share the row so that, at each step of the loop, "
                 "the 32 lanes of a warp read 32 consecutive floats, and every element is added exactly once.")
EXERCISES = (
    Exercise("coalesce", KL_DIV, "shared_memory", "Coalesce the row loop",
             "One block per row: the block's threads must share the row so that, at each step of the loop, "
             "the 32 lanes of a warp read 32 consecutive floats (one 128-byte line), and every element is "
             "added exactly once.", 10,
             (STRIDED_LOADS,)),
    Exercise("warp_shuffle", KL_DIV, "warp_shuffle", "Sum a warp with shuffles",
             WARP_SUM_TASK, 15, (SHUFFLE,)),
    Exercise("vectorize", KL_DIV, "vectorized", "Vectorize the loads, with head and tail",
             "Read the aligned middle of each row with 16-byte float4 loads and every other element exactly "
             "once, on any width and any alignment of the row.", 20,
             (FLOAT4_LOADS,)),
    Exercise("online_softmax", CROSS_ENTROPY, "warp_shuffle", "Combine two online-softmax states",
             "Write combine: the (max, sum) state of the union of two parts of a row, from each part's "
             "(max, sum of exp(x - max)), exact for any logits (1e4 included) and for an empty part "
             "(max -FLT_MAX, sum 0).", 20,
             (SassCheck("more exponentials (MUFU.EX2) than the skeleton",
                        "combine rescales each sum by an expf, on the special-function unit: the skeleton "
                        "(which already shuffles, and exponentiates in lse_add) has fewer", any_of=("MUFU.EX2",),
                        more=True, fix="combine must rescale each part's sum by exp(its max - the combined max)"),)),
    Exercise("fused", KL_DIV, "fused", "Fuse the gradient into the forward",
             "While the forward reads p and t for the loss, write dL/dp for grad_loss = 1 into "
             "grad_predictions, so the backward only scales it by grad_loss.", 15, fused=True),
    Exercise("logsumexp_tree", CROSS_ENTROPY, "shared_memory", "Merge a block's (max, sum) with a tree",
             "Write the tree in shared memory: at each step the first `stride` threads merge the state `stride` "
             "slots further into their own, a barrier between steps, until slot 0 holds the block's.", 15,
             (TREE_BARRIERS,)),
    Exercise("warp_max", CROSS_ENTROPY, "warp_shuffle", "The warp's max in every lane",
             "Write warp_max: the largest value of the warp's 32 lanes, in every lane (each lane rescales its own "
             "sum by it), through shuffles.", 10,
             (SassCheck("a butterfly shuffle (SHFL.BFLY)", "registers exchanged between lanes, the result in "
                        "every lane", any_of=("SHFL.BFLY",), more=True,
                        fix="__shfl_xor_sync (a butterfly) gives the max to every lane; a shift down leaves it in "
                            "lane 0 only"),)),
    Exercise("vectorize_logits", CROSS_ENTROPY, "vectorized", "Read the logits as float4s",
             "After the scalar head, read the row's aligned middle with 16-byte float4 loads and the rest "
             "with scalar ones, every logit exactly once.", 15,
             (replace(FLOAT4_LOADS, more=True, fix="read the packs through a float4 pointer: x + head, "
                                                       "reinterpreted"),)),
    Exercise("fused_softmax", CROSS_ENTROPY, "fused", "Write cross_entropy's gradient in the forward",
             "While the forward has the row's max and log-sum, write dL/dx = (softmax - onehot) / n_valid for "
             "grad_loss = 1, so the backward only scales it.", 10, fused=True),
    Exercise("cluster", CROSS_ENTROPY, "cluster", "Two CTAs share a row through distributed shared memory",
             "Publish each CTA's (max, sum) in its shared memory and read the other CTA's through "
             "map_shared_rank, with the cluster's barriers (graded on an sm_90 GPU only).", 15,
             cpu_check=_cluster_source_check),
    Exercise("mse_block_sum", MSE_LOSS, "shared_memory", "Add a block's sums with a tree",
             "Write block_sum's tree in shared memory: at each step the first `stride` threads add the slot "
             "`stride` further into their own, a barrier between steps, until partial[0] holds the block's sum.",
             10, (TREE_BARRIERS,)),
    Exercise("mse_warp_sum", MSE_LOSS, "warp_shuffle", "Sum a warp with shuffles",
             WARP_SUM_TASK, 10, (SHUFFLE,)),
    Exercise("mse_vectorize", MSE_LOSS, "vectorized", "Read the row as float4s, with a tail",
             "After the scalar head, read the row's aligned middle with 16-byte float4 loads and the rest with "
             "scalar ones, every element exactly once, on any width and any alignment of the row.", 15,
             (FLOAT4_LOADS,)),
    Exercise("mse_fused", MSE_LOSS, "fused", f"Write {MSE_LOSS}'s gradient in the forward",
             "While the forward reads p and t for the loss, write dL/dp = 2 (p - t) / (B D) for grad_loss = 1 "
             "into grad_predictions, so the backward only scales it by grad_loss.", 10, fused=True),
    Exercise("hinge_coalesce", HINGE_LOSS, "shared_memory", "Coalesce the row loop, rows in turn",
             "Block b takes rows b, b + gridDim.x, ...; its threads share each row so that, at each step, the 32 "
             "lanes of a warp read 32 consecutive floats, every element added exactly once.", 10, (STRIDED_LOADS,)),
    Exercise("hinge_warp_partials", HINGE_LOSS, "warp_shuffle", "A block's sum from its warps' sums",
             "Write block_sum with warp_sum: each warp's sum in one shared slot, one barrier, then the first warp "
             "sums the slots.", 10, (SHUFFLE,)),
    Exercise("hinge_vectorize", HINGE_LOSS, "vectorized", "Float4 column tiles, the targets in registers",
             "Read a tile's four targets once as a float4 and keep them for all the block's rows; read each row's "
             "four predictions as one float4, UNROLL rows in flight, every element exactly once.", 20,
             (FLOAT4_LOADS,)),
    Exercise("hinge_fused", HINGE_LOSS, "fused", f"Write {HINGE_LOSS}'s gradient in the forward",
             "While the forward holds a tile's predictions and targets, write dL/dp for grad_loss = 1 into "
             "grad_predictions, so the backward only scales it by grad_loss.", 10, fused=True),
    Exercise("smooth_l1_coalesce", SMOOTH_L1_LOSS, "shared_memory", "Coalesce the row loop",
             COALESCE_TASK, 10,
             (STRIDED_LOADS,)),
    Exercise("smooth_l1_warp_sum", SMOOTH_L1_LOSS, "warp_shuffle", "Sum a warp with shuffles",
             WARP_SUM_TASK, 10, (SHUFFLE,)),
    Exercise("smooth_l1_vectorize", SMOOTH_L1_LOSS, "vectorized", "Read the row as float4s, with a tail",
             "After the scalar head, read the row's aligned middle with 16-byte float4 loads and the rest with "
             "scalar ones, every element exactly once, on any width and any alignment of the row.", 15,
             (FLOAT4_LOADS,)),
    Exercise("smooth_l1_fused", SMOOTH_L1_LOSS, "fused", f"Write {SMOOTH_L1_LOSS}'s gradient in the forward",
             "While the forward reads p and t for the loss, write dL/dp = clamp(p - t, -1, 1) / (B D) for "
             "grad_loss = 1 into grad_predictions, so the backward only scales it by grad_loss.", 10, fused=True),
    Exercise("cosine_block_dots", COSINE, "shared_memory", "Three dot products through one tree",
             "Write block_dots' tree in shared memory: at each step the first `stride` threads add the three slots "
             "`stride` further into their own, a barrier between steps, until tree[k][0] holds the block's sum k.",
             15, (TREE_BARRIERS,)),
    Exercise("cosine_warp_dots", COSINE, "warp_shuffle", "Three dot products through shuffles",
             "In block_dots, sum each of the warp's three values (p.t, p.p, t.t) over its 32 lanes through "
             "registers, before the slots and the one barrier.", 10, (SHUFFLE,)),
    Exercise("cosine_vectorize", COSINE, "vectorized", "Read the rows as float4s, with head and tail",
             "Pass every element of the row to add() exactly once: the head and the tail one float at a time, "
             "the packs as float4s.", 15, (FLOAT4_LOADS,)),
    Exercise("cosine_fused", COSINE, "fused", f"Write {COSINE}'s gradient in the forward",
             "Once every thread has the row's three sums, write the row's dL/dp for grad_loss = 1 from the row "
             "just read, so the backward only scales it by grad_loss.", 10, fused=True),
    Exercise("triplet_block_squares", TRIPLET, "shared_memory", "Two squared distances through one tree",
             "Write block_squares' tree in shared memory: at each step the first `stride` threads add both slots "
             "`stride` further into their own, a barrier between steps, until slot 0 holds the block's sums.", 15,
             (TREE_BARRIERS,)),
    Exercise("triplet_warp_squares", TRIPLET, "warp_shuffle", "Two squared distances through shuffles",
             "In block_squares, sum each of the warp's two values (s.ap, s.an) over its 32 lanes through registers, "
             "before the slots and the one barrier.", 10, (SHUFFLE,)),
    Exercise("triplet_vectorize", TRIPLET, "vectorized", "Read the rows as float4s",
             "On a row that starts on a 16-byte boundary, share the D / 4 packs among the block's threads and read "
             "each through 16-byte loads, every element exactly once.", 10, (FLOAT4_LOADS,)),
    Exercise("triplet_fused", TRIPLET, "fused", f"Write {TRIPLET}'s gradient in the forward",
             "Once every thread has the row's two sums, give the gradient loops the coefficients of dL/da for "
             "grad_loss = 1, so the backward only scales it by grad_loss.", 10, fused=True),
)


def get(key: str) -> Exercise:
    """The exercise called ``key``. Raises ValueError for an unknown key."""
    for exercise in EXERCISES:
        if exercise.key == key:
            return exercise
    raise ValueError(f"exercise: no exercise {key!r}; expected one of {', '.join(e.key for e in EXERCISES)}")


_MARKER = re.compile(r"""grade\(\s*["'](\w+)["']|losslab grade\s+\S*?(\w+)\.cu""")


def find(path: str | Path) -> tuple[Exercise, bool]:
    """The exercise a file answers, and whether it is that exercise's solution file: from its
    path (``exercises/<problem>/<key>.cu`` or ``exercises/solutions/<problem>/<key>.cu``), else
    from a marker in its text (the skeleton's ``grade("<key>")`` or ``losslab grade .../<key>.cu``).

    Raises:
        ValueError: the file names no exercise.
        OSError: the file cannot be read.
    """
    path = Path(path)
    for exercise in EXERCISES:
        for solution, known in ((False, exercise.skeleton), (True, exercise.solution)):
            if path.resolve() == known.resolve():
                return exercise, solution
    keys = {e.key for e in EXERCISES}
    for match in _MARKER.finditer(path.read_text(errors="replace")):
        key = match[1] or match[2]
        if key in keys:
            return get(key), False
    raise ValueError(f"{path} is not an exercise: expected a file under exercises/<problem>/ or one that "
                     f"names its exercise (a skeleton's \"Done when\" line); exercises: {', '.join(sorted(keys))}")


def _pre(text: str) -> str:
    return f'<pre style="font-size:11px;white-space:pre;overflow-x:auto">{html.escape(text)}</pre>'


def task(key: str) -> Html:
    """The exercise's task and its skeleton's source (with its path, to open and edit)."""
    e = get(key)
    path = e.skeleton.relative_to(build.ROOT)
    plain = f"{e.title} (about {e.minutes} min)\n{e.task}\nEdit {path}:\n\n{e.skeleton.read_text()}"
    body = (f"<p><b>{html.escape(e.title)}</b> (the <code>{e.rung}</code> rung of {e.problem}; about {e.minutes} "
            f"min). {html.escape(e.task)} Edit <code>{path}</code>, then grade it: "
            f"<code>exercises.grade('{e.key}')</code> in a cell or <code>python -m losslab grade {path}</code> "
            "in a shell.</p>"
            + _pre(e.skeleton.read_text()))
    return Html(body, plain)


@dataclass
class Grade:
    """The outcome of grading one source.

    ``compiled``: nvcc accepted it (else ``compile_error`` and ``hints``, which also hold the
    fixes of failed machine-code checks); ``sass``: check label -> True, False or None (cannot
    tell; empty when cuobjdump is missing), ``sass_notes`` what the machine code shows;
    ``checks``: the GPU's CheckResults (None when they did not run, ``note`` says why);
    ``fault``: the child's verdict when the kernel hung or faulted; ``simulated``: the CPU
    simulator's verdict (None when it did not run; ``cpu`` names what gave it) and
    ``diagnosis`` its messages; ``passed``: one verdict on every machine: the machine code's
    checks and the simulator's, and on a GPU its checks too (evidence on top, never instead).
    """

    key: str
    path: str
    compiled: bool
    compile_error: str = ""
    sass: dict[str, bool | None] = field(default_factory=dict)
    checks: list | None = None
    note: str = ""
    fault: str = ""
    hints: list[str] = field(default_factory=list)
    sass_notes: list[str] = field(default_factory=list)
    simulated: bool | None = None
    diagnosis: list[str] = field(default_factory=list)
    cpu: str = "CPU simulator"  # what gave ``simulated``

    @property
    def on_gpu(self) -> bool:
        return self.checks is not None or bool(self.fault)

    @property
    def passed(self) -> bool:
        if not self.compiled or any(found is False for found in self.sass.values()) or self.simulated is False:
            return False
        if self.on_gpu:
            return self.checks is not None and all(c.passed for c in self.checks)
        return self.simulated is True

    @property
    def verdict(self) -> str:
        """GREEN, RED or not graded yet, in one line."""
        if self.passed:
            return "GREEN: done" + (" (on the GPU and the CPU simulator)" if self.on_gpu and self.simulated else
                                    "" if self.on_gpu else " (on the CPU simulator; a GPU grade also runs it "
                                                           "on the hardware)")
        return "not graded yet" if self.waiting else "RED: not yet"

    @property
    def hint(self) -> str:
        """The most specific thing to fix (or what the grade rests on), in one line."""
        if self.compile_error == EMPTY:
            return EMPTY
        if not self.compiled:
            errors = [line.strip() for line in self.compile_error.splitlines() if "error" in line] or \
                [line.strip() for line in self.compile_error.splitlines() if line.strip()]
            return next(iter(self.hints), f"does not compile: {errors[0] if errors else 'no message'}")
        missing = [label for label, found in self.sass.items() if found is False]
        if self.fault:
            return f"the kernel did not finish on the GPU: {self.fault.splitlines()[0]}"
        if self.diagnosis and (self.simulated is False or self.checks_failed or not (self.on_gpu or missing)):
            return self.diagnosis[0]
        if missing:
            return f"the machine code lacks {missing[0]}" + (f": {self.hints[0]}" if self.hints else "")
        if self.checks is not None:
            failed = [c for c in self.checks if not c.passed]
            return (f"GPU checks: {len(failed)} of {len(self.checks)} failed, first {failed[0].direction} "
                    f"{failed[0].case}" if failed else f"all {len(self.checks)} GPU checks pass")
        return self.note or "nothing ran the kernel"

    @property
    def checks_failed(self) -> bool:
        """The GPU's checks ran and one failed, or the kernel did not finish there."""
        return bool(self.fault) or (self.checks is not None and not all(c.passed for c in self.checks))

    @property
    def waiting(self) -> bool:
        """Nothing ran the kernel (no GPU and no simulator): not graded yet."""
        return self.compiled and not self.on_gpu and self.simulated is None

    def lines(self) -> list[str]:
        """The grade as lines of text."""
        out = [f"{self.key}: {self.path}"]
        if self.compile_error == EMPTY:
            return out + [f"  {EMPTY}", f"  {self.verdict}"]
        if not self.compiled:
            return out + ["  does not compile:", *("    " + line for line in self.compile_error.splitlines()),
                          *(f"  hint: {h}" for h in self.hints)]
        out.append("  compiles (nvcc)")
        for label, found in self.sass.items():
            out.append(f"  machine code shows {label}: {'yes' if found else 'cannot tell' if found is None else 'NO'}")
        out += [f"    {n}" for n in self.sass_notes]
        if self.fault:
            out.append("  GPU checks: stopped, the kernel did not finish:")
            out += ["    " + line for line in self.fault.splitlines()]
        elif self.checks is not None:
            failed = [c for c in self.checks if not c.passed]
            out.append(f"  GPU checks: {len(self.checks) - len(failed)} of {len(self.checks)} passed")
            for c in failed[:8]:
                out.append(f"    FAIL {c.direction} {c.case}: error {c.error:.2e} > {c.tolerance:.0e} "
                           f"{c.detail}".rstrip())
        elif self.note:
            out.append(f"  GPU checks: not run ({self.note})")
        if self.simulated is not None:
            head = f"what is wrong ({self.cpu})" if self.checks_failed else \
                f"{self.cpu}: {'all cases pass' if self.simulated else 'wrong'}"
            out += [f"  {head}:", *(f"    {m}" for m in self.diagnosis)]
        elif self.diagnosis:  # why the simulator could not run
            out += [f"  {m}" for m in self.diagnosis]
        return out + [f"  {self.verdict}"]

    def _repr_mimebundle_(self, include=None, exclude=None):
        text = "\n".join(self.lines())
        color = "#060" if self.passed else "#a40" if self.waiting else "#b00"
        return {"text/plain": text, "text/html": f'<pre style="color:{color}">{html.escape(text)}</pre>'}


class FusedVariant(custom.CustomVariant):
    """A custom variant whose forward writes dL/dp for grad_loss = 1 (the fused rung's contract:
    the forward gets a gradient buffer, the source's backward scales it in place)."""

    def launch_forward(self, inputs, out=None, needs_grad=False, grad_out=None):
        return self.problem.host.forward(self.module.custom_forward, True, *inputs, out=out, grad_out=grad_out)

    def launch_backward(self, saved, grad_loss, out=None):
        return self.problem.host.backward(self.module.custom_backward, True, saved, grad_loss, out=out)


def fused_checks_in_child(problem: str, name: str, cuda_source: str, root: str, sizes: list[str],
                          edge_cases: bool, seed: int | None) -> list[dict]:
    """The child's side of a fused exercise's checks: rebuild (cached) as a :class:`FusedVariant`."""
    from losslab.teach.custom.evaluation import run_checks

    v = custom.compile_variant(problem, name, cuda_source, root=Path(root))
    fused = FusedVariant(v.problem, v.name, v.source, v.compiled, v.module, None)
    return [c.as_dict() for c in run_checks(fused, sizes, edge_cases, seed)]


def _gpu_checks(e: Exercise, variant, sizes, edge_cases: bool, timeout_s: float) -> custom.CheckRun:
    if not e.fused:
        return custom.check(variant, sizes, edge_cases=edge_cases, seed=0, timeout_s=timeout_s)
    from losslab.measure.check import CheckResult

    kwargs = {"problem": e.problem, "name": e.key, "cuda_source": variant.source,
              "root": str(variant.compiled.folder.parent), "sizes": list(sizes), "edge_cases": edge_cases, "seed": 0}
    outcome = isolated.run("losslab.teach.exercises:fused_checks_in_child", kwargs, timeout_s)
    checks = [CheckResult(**{**c, "shape": tuple(c["shape"])}) for c in outcome.value] if outcome.ok else None
    return custom.CheckRun(outcome, checks)


def _simulate(key: str, source: str) -> tuple[bool | None, list[str]]:
    """The CPU simulator's verdict and messages, or (None, [why not]) where it cannot run here."""
    from losslab.teach import simulator
    from losslab.teach.simulator.build import SimulatorError

    try:
        cpu = simulator.grade_on_cpu(key, source)
    except (SimulatorError, OSError) as err:
        return None, [f"the CPU simulator does not run here: {err}"]
    return cpu.passed, cpu.messages


def _read_sass(e: Exercise, compiled, result: Grade) -> list[str]:
    """Fill ``result.sass`` and its notes; returns notes of what could not be read."""
    if not e.sass:
        return []
    try:
        sass = compiled.sass()
        skeleton = custom.check_source(e.problem, e.skeleton.read_text(), e.key).sass() \
            if any(c.more for c in e.sass) else ""
    except (build.BuildError, OSError) as err:
        return [f"machine code not read: {err}"]
    for check in e.sass:
        found = check.found(sass, skeleton)
        result.sass[check.label] = found
        result.sass_notes += check.explain(sass) if found else [f"{check.label}: {check.why}"]
        result.hints += [check.fix] if found is False and check.fix else []
    return []


def grade(key: str, source: str | None = None, *, solution: bool = False, gpu: bool | None = None,
          simulate: bool = True, sizes: tuple[str, ...] = SIZES, edge_cases: bool = True,
          timeout_s: float = CHECK_TIMEOUT_S) -> Grade:
    """Grade exercise ``key``: the skeleton file as it is now (your edits), or ``source``,
    or with ``solution=True`` the solution file.

    Compiles with nvcc (a compile error gets hints for common slips), reads the machine code
    for the exercise's checks (when cuobjdump is available), runs the kernel on the CPU
    simulator (``simulate`` False: skip it) and, on a GPU (``gpu`` None: when one is visible),
    forward and backward against float64 at ``sizes`` and on the edge cases in a child process
    killed after ``timeout_s`` seconds. One verdict on every machine: what the simulator and the
    machine code reject is red on a GPU too (an answer whose numbers are right on the hardware
    by luck: a shuffle mask naming half the warp, a lost update); a GPU adds its evidence on
    top. Never raises for a wrong source: a compile error, a hang or a fault is part of the grade.

    On a GPU the checks run in a child process with a time limit (``custom.check``): a hang or a
    fault (a misaligned float4 load) is a red grade with what happened, and the notebook's CUDA
    context stays usable. The simulator (``losslab.teach.simulator``) runs the kernel on designed
    inputs and its messages say what is wrong, not only by how much ("the loss is 256x too large:
    each thread sums the whole row"). Machine-code checks (:class:`SassCheck`) explain themselves:
    which opcodes show the idea, and why an alternative is fine. An exercise the simulator cannot
    run (the cluster exercise: no clusters on the CPU) is graded on a GPU only.

    An empty source (an emptied file) is a red grade, "the file is empty".

    Raises:
        ValueError: unknown exercise.
        build.BuildError: nvcc is missing here.
    """
    from losslab.teach.simulator.diagnose import compile_hints

    e = get(key)
    path = e.solution if solution else e.skeleton
    label = "your source" if source is not None else str(path.relative_to(build.ROOT))
    source = path.read_text() if source is None else source
    if not source.strip():  # a verdict, not nvcc's ValueError for an empty source
        return Grade(key, label, False, EMPTY)
    try:
        compiled = custom.check_source(e.problem, source, e.key)
    except custom.CustomCompileError as err:
        return Grade(key, label, False, str(err), hints=compile_hints(str(err)))
    except build.BuildError as err:  # no nvcc here: nothing can be graded
        return Grade(key, label, False, f"cannot compile on this machine: {err}")
    result = Grade(key, label, True)
    notes = _read_sass(e, compiled, result)
    gpu = torch.cuda.is_available() if gpu is None else gpu
    if e.cpu_check is not None:  # the simulator cannot run it: the source's own checks
        mistakes = e.cpu_check(source)
        result.simulated, result.cpu = (False if mistakes else None), "source check (no clusters on the CPU)"
        result.diagnosis = mistakes or ["graded on a GPU only (sm_90): the CPU simulator has no thread-block clusters"]
    elif simulate:
        result.simulated, result.diagnosis = _simulate(key, source)
    if not gpu:
        result.note = "; ".join([*notes, "no CUDA GPU is visible here"])
        return result
    try:
        variant = custom.compile_variant(e.problem, e.key, source)
    except build.BuildError as err:  # the link or the binding failed after nvcc's check passed
        return Grade(key, label, False, str(err), result.sass)
    run = _gpu_checks(e, variant, sizes, edge_cases, timeout_s)
    result.checks, result.fault = run.checks, "" if run.outcome.ok else run.outcome.format()
    if result.simulated and result.checks_failed:  # not "all cases match" under "what is wrong"
        result.diagnosis = ["the CPU simulator's small cases all pass: what fails shows only on the GPU's "
                            "sizes or hardware (a race the two simulated thread orders miss, a size beyond "
                            "the simulated ones, an index that overflows)"]
    return result


def grade_in_child(key: str, source: str | None = None, solution: bool = False) -> dict:
    """:func:`grade` for :mod:`losslab.teach.isolated` (``python -m losslab grade`` runs it there, under a
    time limit): the verdict, the hint and the lines, as JSON."""
    result = grade(key, source, solution=solution)
    return {"passed": result.passed, "verdict": result.verdict, "hint": result.hint, "lines": result.lines()}
