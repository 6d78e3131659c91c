"""What this machine can do for the workbook: a GPU, nvcc, Nsight Compute, cuobjdump.

    env = environment.detect()
    environment.table(env)        # the tools, found or not
    environment.notebook_map(env) # each notebook, and what it does on this machine
"""
from __future__ import annotations

import html
import subprocess
from dataclasses import dataclass
from pathlib import Path

import torch

from losslab import build, problems
from losslab.measure.ncu import find_ncu
from losslab.present.html import Html
from losslab.present.html import table as html_table
from losslab.problems import kl_div
from losslab.teach.exercises import EXERCISES


@dataclass(frozen=True)
class Environment:
    """The tools found here (None where missing): ``gpu`` the CUDA device's name, ``nvcc``,
    ``ncu`` and ``cuobjdump`` paths, ``cuda_build`` torch's CUDA version (None: CPU-only torch)."""

    gpu: str | None
    torch: str
    cuda_build: str | None
    nvcc: str | None
    nvcc_version: str | None
    ncu: str | None
    cuobjdump: str | None

    @property
    def can_compile(self) -> bool:
        """nvcc and a CUDA build of torch: kernels and custom variants build here."""
        return self.nvcc is not None and self.cuda_build is not None


def _nvcc() -> tuple[str | None, str | None]:
    try:
        path = build.nvcc_path()
    except build.BuildError:
        return None, None
    if not path.exists():
        return None, None
    out = subprocess.run([str(path), "--version"], capture_output=True, text=True).stdout
    release = [line for line in out.splitlines() if "release" in line]
    return str(path), release[0].split("release")[-1].strip() if release else None


def detect() -> Environment:
    """Look for a CUDA GPU, nvcc, ncu and cuobjdump (a few subprocess calls; no GPU needed)."""
    nvcc, version = _nvcc()
    try:
        cuobjdump = str(build.find_cuobjdump())
    except build.BuildError:
        cuobjdump = None
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return Environment(gpu, torch.__version__, torch.version.cuda, nvcc, version, find_ncu(), cuobjdump)


def _cell(value: str | None, missing: str) -> str:
    return (f'<span style="color:#060">{html.escape(value)}</span>' if value
            else f'<span style="color:#a40">{html.escape(missing)}</span>')


def table(env: Environment):
    """The tools, found or not, and what each one is for (an ``Html`` table)."""
    rows = [
        ("CUDA GPU", env.gpu, "none visible",
         "run the kernels: live measurements, the checks on the hardware (exercises are graded without one too)"),
        ("torch", f"{env.torch} (CUDA {env.cuda_build})" if env.cuda_build else None,
         f"{env.torch}, a CPU-only build", "a CUDA build compiles the kernels (cpp_extension)"),
        ("nvcc", f"{env.nvcc} (CUDA {env.nvcc_version})" if env.nvcc else None, "not found (PATH, $CUDA_HOME)",
         "compile the kernels, your own variants and the exercises"),
        ("ncu (Nsight Compute)", env.ncu, "not found", "measured DRAM traffic on the roofline (GPU only)"),
        ("cuobjdump", env.cuobjdump, "not found (pip install nvidia-cuda-cuobjdump)",
         "read the machine code (SASS) without a GPU"),
    ]
    body = [[html.escape(name), _cell(value, missing), html.escape(use)] for name, value, missing, use in rows]
    plain = "\n".join(f"{name}: {value or missing}" for name, value, missing, _ in rows)
    return Html(html_table(["tool", "here", "what it is for"], body, text_columns=3), plain=plain)


def _rungs(problem: problems.Problem) -> str:
    """``"five rungs"``: how many rungs ``problem``'s ladder has, in words (the count from its rung table)."""
    count = len(problem.variants)
    words = ("no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")
    return f"{words[count] if count < len(words) else count} rung{'s' if count != 1 else ''}"


NOTEBOOKS = (
    ("01_kl_div", f"The KL-divergence ladder: the loss, the cost model, {_rungs(kl_div.PROBLEM)} side by side, "
     "checks, timings.",
     "measures every rung live", "renders the newest recorded results"),
    ("02_cross_entropy", "The cross-entropy ladder, told the same way (ignore_index, log-sum-exp).",
     "measures every rung live", "renders the newest recorded results"),
    ("03_roofline", "Each kernel against the device's measured ceilings.",
     "measures the ceilings and the ladder live (and DRAM traffic with ncu, if asked)",
     "draws the newest record, or the datasheet roofline and the model only"),
    ("04_explorer", "Pick a problem, variants, size and dtype; tables and plots follow.",
     "measures what you pick, caching each result", "filters the recorded results; the cost model at any size"),
    ("05_your_turn", f"{len(EXERCISES)} graded exercises, one idea of a rung each (the first two losses' here, "
     "the other losses' with their ladders in 10_loss_family); your own variant.",
     "compiles, reads the SASS and checks your kernel: green when done",
     "compiles your kernel, reads its SASS and grades it on the CPU simulator (nvcc and g++)"),
    ("06_pitfalls", "Classic mistakes, each caught by the checker with its measured error.",
     "runs every pitfall live", "shows the recorded outcomes, or says none exists yet"),
    ("07_evaluate_solutions", "Judge a KernelBench-style solution (ModelNew) like a leaderboard would.",
     "evaluates solutions live", "shows what an evaluation reports; the run needs a GPU"),
    ("08_linear_cross_entropy", "The language-model head and its loss without the logits in memory.",
     "shows the newest record (scripts/linear_cross_entropy_gpu.sh measures)",
     "shows the newest record, or says none exists yet"),
    ("09_vocab_parallel", "Cross-entropy over several GPUs: the vocabulary split, one exchange of per-row statistics.",
     "shows the newest record (scripts/vocab_parallel_gpu.sh measures on two GPUs)",
     "shows the algebra and the newest record, or says none exists yet"),
    ("10_loss_family", "KernelBench's other five losses, each added by the recipe: its ladder, checks and times.",
     "shows each loss's newest record", "shows each loss's newest record, or says none exists yet"),
)


def notebook_map(env: Environment, folder: Path | None = None):
    """Each notebook: what it covers and what it does on this machine (GPU or not), marking
    those not in ``notebooks/`` yet (an ``Html`` table)."""
    folder = folder or build.ROOT / "notebooks"
    body, plain = [], []
    for name, about, with_gpu, without in NOTEBOOKS:
        here = with_gpu if env.gpu else without
        if name == "05_your_turn" and not env.gpu and not env.nvcc:
            here = "shows the tasks; compiling needs nvcc, checking needs a GPU"
        found = sorted(folder.glob(f"{name[:2]}_*.ipynb"))  # by number: the file's name may differ
        present = bool(found)
        name = found[0].stem if found else name
        label = f"<code>{name}.ipynb</code>" + ("" if present else " <i>(not written yet)</i>")
        body.append([label, html.escape(about), html.escape(here)])
        plain.append(f"{name}: {about} Here: {here}" + ("" if present else " (not written yet)"))
    head = ["notebook", "what it covers", "on this machine (" + ("GPU: " + env.gpu if env.gpu else "no GPU") + ")"]
    return Html(html_table(head, body, text_columns=3), plain="\n".join(plain))
