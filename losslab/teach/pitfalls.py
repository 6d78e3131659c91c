"""Classic mistakes in loss kernels, reproduced on purpose and run through the checker.

``python -m losslab pitfalls [--record]`` runs them here (GPU), prints what the checker saw and, with
``--record``, writes ``reports/results/pitfalls/<device>.json``. Semantic pitfalls get the loss wrong;
CUDA pitfalls are the real rung plus one wrong line (marked ``// PITFALL``). Each outcome is measured,
never assumed: the checks' errors (each pitfall in a child process, so a fault is a verdict), plus the
measurement each needs (:attr:`Pitfall.probe`). Without a GPU, notebooks show the newest record and say
where and when it was made, and :func:`simulate` runs the CPU-visible CUDA pitfalls in the CPU simulator.

One module: the pitfalls share one record, one runner and one outcome table.
"""
from __future__ import annotations

import csv
import datetime as dt
import html
import io
import json
import math
import re
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from losslab import build, problems, records
from losslab.present.html import Html
from losslab.present.html import table as html_table
from losslab.problems import cross_entropy, kl_div
from losslab.teach import custom, isolated

SOURCES = build.ROOT / "pitfalls"
KL_DIV, CROSS_ENTROPY = kl_div.PROBLEM, cross_entropy.PROBLEM  # the losses the pitfalls are in
RECORDS = records.RESULTS_DIR / "pitfalls"  # a subfolder: records.load_records reads only *.json at the top
CHECK_SIZES = ("small", "odd")
DETERMINISM_SHAPE, DETERMINISM_RUNS = (4096, 4096), 20
TIMELINE_SIZE, TIMELINE_CALLS, QUEUED_CALLS, QUEUED_MS = "small", 200, 10, 20.0
RACECHECK_SHAPE, BANK_SHAPE = (8, 1000), (4096, 4096)
# The int32 pitfall's size: the first row whose start blockIdx.x * D reaches 2^31 is 2^31 / D = 32768
# for D = 65536, so 32769 rows: 2^31 + 65536 float32 elements, 8.6 GB a tensor, 17.2 GB for p and t.
LARGE_SHAPE = (32769, 65536)
BANK_METRICS = ("l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
                "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum")
RUN_TIMEOUT_S = 300.0  # one pitfall's build import, checks and probe, in its child process
TOOL_TIMEOUT_S = 240.0  # one compute-sanitizer or ncu run, or the large-size child
PROBE_BUDGET_S = {"racecheck": 2 * TOOL_TIMEOUT_S, "bank": 2 * TOOL_TIMEOUT_S, "large": TOOL_TIMEOUT_S}


@dataclass(frozen=True)
class Pitfall:
    """One deliberate mistake: ``key`` names its source ``pitfalls/<problem>/<key>.cu`` (CUDA
    files) or its wrapper class here (``host`` pitfalls); ``mistake`` says what the wrong code
    does, ``symptom`` the symptom predicted, ``caught_by`` what catches it (the checker, the
    sanitizer, a counter); ``probe`` the extra measurement (below); ``cuda``: a CUDA
    pitfall (the real rung plus one wrong line) rather than a semantic one; ``simulated_as``:
    the exercise whose CPU-simulator diagnosis applies ("" where the simulator cannot see it).

    Semantic pitfalls get the loss wrong (a direction, a divisor, an epsilon, an index width, an
    order-dependent atomicAdd, a host sync, a shape); CUDA pitfalls break one line of a rung (a
    missing ``__syncthreads``, a misaligned float4 load, a broken tail, an int32 index past 2^31
    elements, shared-memory bank conflicts). The probes:

      determinism   the loss of 20 forwards on the same inputs: how many distinct values
      timeline      host-return vs done with GPU work queued ahead, and the host cost per call
      racecheck     ``compute-sanitizer --tool racecheck`` on one small forward (hazards found)
      bank          Nsight Compute's shared-memory bank-conflict counters, pitfall vs the rung
      large         one forward at 32769 x 65536 (2^31 + 65536 elements) vs the shipped rung,
                    in its own child (a fault is recorded as such)
    """

    key: str
    problem: problems.Problem
    title: str
    mistake: str
    symptom: str
    host: bool = False
    caught_by: str = "the checker: forward or backward error against float64"
    probe: str = ""
    cuda: bool = False
    simulated_as: str = ""

    @property
    def source(self) -> Path | None:
        return None if self.host else SOURCES / self.problem.name / f"{self.key}.cu"


PITFALLS = (
    Pitfall("wrong_direction", KL_DIV, "KL computed in the wrong direction",
            "sum p * log(p / t), i.e. KL(p || t), where F.kl_div(log p, t) is KL(t || p)",
            "forward error far above 1e-5 on every random input"),
    Pitfall("batchmean_bd", KL_DIV, "batchmean divided by B * D instead of B",
            "the total divided by the number of elements (reduction='mean')",
            "forward error 1 - 1/D: the loss is D times too small"),
    Pitfall("epsilon", KL_DIV, "An epsilon added to both inputs",
            "kl_div_term(p + 1e-8, t + 1e-8)",
            "a finite loss where PyTorch gives +inf (a zero prediction), and a shifted loss elsewhere"),
    Pitfall("int32_targets", CROSS_ENTROPY, "int64 targets read as int32",
            "targets taken as const int*: row r reads half of target r / 2",
            "forward error on every random input, no error raised"),
    Pitfall("atomic_add", KL_DIV, "A float atomicAdd reduction",
            "each block atomicAdds its row's sum into the loss (order changes from run to run)",
            "the same inputs give different losses: the rerun differs, several distinct values over 20 runs",
            caught_by="the checker's rerun (same inputs, another loss) and the determinism probe",
            probe="determinism"),
    Pitfall("item_sync", KL_DIV, "A host .item() sync inside forward",
            "the wrapper checks the loss with loss.isfinite().item() after launching",
            "correct values, but the host waits for the GPU on every call: with GPU work queued ahead, "
            "the host returns only when that work is done",
            host=True, caught_by="torch.cuda.set_sync_debug_mode('warn') and the host timeline", probe="timeline"),
    Pitfall("one_element", KL_DIV, "A 1-element tensor returned instead of a 0-d tensor",
            "the wrapper returns the loss with shape (1,), as from torch.empty(1)",
            "the output shape (1,) where the reference's is ()", host=True),
    Pitfall("missing_sync", KL_DIV, "A missing __syncthreads()",
            "shared_memory's tree reads other warps' slots with no barrier after the slots are written",
            "a race: wrong losses that change from run to run (which slots are stale depends on timing)",
            caught_by="compute-sanitizer --tool racecheck (hazards on partial); the checker's rerun; the CPU "
                      "simulator (shared memory starts as NaN, and a second thread order)",
            probe="racecheck", cuda=True, simulated_as="coalesce"),
    Pitfall("misaligned_float4", KL_DIV, "A misaligned float4 load",
            "vectorized without the scalar head: float4 loads from row starts that are not 16-byte aligned",
            "the aligned 128 x 4096 passes; at 257 x 4099 row 1 starts 12 bytes past a boundary: "
            "'misaligned address', the CUDA context lost",
            caught_by="the child process: the fault is its verdict, the parent's CUDA context stays usable; the "
                      "CPU simulator names the row and line",
            cuda=True, simulated_as="vectorize"),
    Pitfall("broken_tail", KL_DIV, "A broken scalar tail",
            "vectorized with every thread running the whole tail (each tail element added 256 times)",
            "right at 128 x 4096 (no tail), wrong at 257 x 4099 and on the odd edge cases",
            caught_by="the checker at an odd width; the CPU simulator's one-hot probe names the tail",
            cuda=True, simulated_as="vectorize"),
    Pitfall("int32_index", KL_DIV, "An int32 index past 2^31 elements",
            "the row start blockIdx.x * D stored in an int",
            "every check at the usual sizes passes; at 32769 x 65536 (2^31 + 65536 elements, 17.2 GB) row 32768 "
            "starts at -2^31: an illegal address (or a wrong loss where that memory happens to be mapped)",
            caught_by="only a run past 2^31 elements (the large probe, in its own child); a review rule: "
                      "int64_t for every index into a tensor",
            probe="large", cuda=True),
    Pitfall("bank_conflicts", KL_DIV, "Shared-memory bank conflicts",
            "shared_memory's store of each thread's sum into a permuted slot, lanes 8 floats apart (4 banks)",
            "right values; each warp's store replayed 8 times: about 7 conflicts per warp and row in the "
            "st counter, 56 a row more than the shipped rung's own count (which is not zero); too few stores "
            "(one per thread per row) to move the time",
            caught_by="Nsight Compute: l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum (ld.sum for loads)",
            probe="bank", cuda=True),
)


def get(key: str) -> Pitfall:
    """The pitfall called ``key``. Raises ValueError for an unknown key."""
    for p in PITFALLS:
        if p.key == key:
            return p
    raise ValueError(f"pitfall: no pitfall {key!r}; expected one of {', '.join(p.key for p in PITFALLS)}")


class HostPitfall(custom.PythonVariant):
    """A wrapper mistake around a correct kernel: the shipped ``rung``'s launchers, with the
    host-side code of pitfall ``key`` around them."""

    def __init__(self, key: str, problem: problems.Problem = KL_DIV, rung: str = "warp_shuffle"):
        self.key, self.problem, self.rung = key, problem, rung
        self.name = f"pitfall_{key}"

    def launch_forward(self, inputs, out=None, needs_grad=False, grad_out=None):
        loss, saved = self.problem.launch_forward(self.rung, inputs, out=out, needs_grad=needs_grad, grad_out=grad_out)
        if self.key == "item_sync" and not loss.isfinite().item():  # PITFALL: waits for the GPU
            warnings.warn(f"{self.problem.name}: non-finite loss", stacklevel=2)
        if self.key == "one_element":
            loss = loss.reshape(1)  # PITFALL: PyTorch returns a 0-d tensor
        return loss, saved

    def launch_backward(self, saved, grad_loss, out=None):
        return self.problem.launch_backward(self.rung, saved, grad_loss.reshape(()), out=out)


def variant(key: str) -> custom.PythonVariant:
    """The wrong variant of pitfall ``key``: built from its CUDA source, or its host wrapper."""
    p = get(key)
    if p.host:
        return HostPitfall(key, p.problem)
    return custom.compile_variant(p.problem, p.key, p.source.read_text())


# --- measuring the outcomes (GPU) -----------------------------------------------------------------

def _determinism(v: custom.PythonVariant) -> dict:
    """The loss of ``DETERMINISM_RUNS`` forwards on the same inputs: how many distinct values."""
    inputs = v.problem.make_inputs(DETERMINISM_SHAPE, seed=0, device="cuda")
    with torch.no_grad():
        losses = [v(*inputs).item() for _ in range(DETERMINISM_RUNS)]
    return {"shape": list(DETERMINISM_SHAPE), "runs": DETERMINISM_RUNS, "distinct_losses": len(set(losses)),
            "min": min(losses), "max": max(losses)}


def _sleep_cycles_per_ms() -> float:
    """GPU clock cycles of ``torch.cuda._sleep`` per millisecond, measured with events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    end.synchronize()
    return 10_000_000 / start.elapsed_time(end)


def _queued(fn, inputs, cycles: int) -> tuple[float, float]:
    """Milliseconds until the host returns from ``QUEUED_CALLS`` calls of ``fn`` and until they
    are done, with ``cycles`` of GPU sleep queued ahead of them."""
    torch.cuda.synchronize()
    torch.cuda._sleep(cycles)
    start = time.perf_counter()
    for _ in range(QUEUED_CALLS):
        fn(*inputs)
    returned = time.perf_counter()
    torch.cuda.synchronize()
    return (returned - start) * 1e3, (time.perf_counter() - start) * 1e3


def _timeline(v: custom.PythonVariant, reference: str = "warp_shuffle") -> dict:
    """What a sync inside forward costs, for the pitfall and the shipped ``reference``: the
    synchronizing calls torch's sync debug mode flags per forward; with ``QUEUED_MS`` of GPU
    sleep queued ahead, the milliseconds until the host returns from ``QUEUED_CALLS`` calls
    and until they are done (a sync makes the host wait for the sleep: returned ~ done); and,
    back to back with nothing queued, microseconds of host time per call (the per-call
    overhead of Python, the dispatcher and the launches) and of wall time per call."""
    from losslab.ops import variant as shipped

    spec = v.problem
    inputs = spec.make_inputs(spec.sizes[TIMELINE_SIZE], seed=0, device="cuda")
    cycles = int(QUEUED_MS * _sleep_cycles_per_ms())
    out = {"shape": list(spec.sizes[TIMELINE_SIZE]), "calls": TIMELINE_CALLS, "queued_calls": QUEUED_CALLS,
           "queued_ms": QUEUED_MS}
    for label, fn in (("pitfall", v), ("reference", shipped(v.problem, reference))):
        with torch.no_grad():
            for _ in range(5):
                fn(*inputs)  # warm-up (and builds)
            torch.cuda.synchronize()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    fn(*inputs)
                finally:
                    torch.cuda.set_sync_debug_mode("default")
            out[f"{label}_sync_warnings"] = sum("synchroniz" in str(w.message) for w in caught)
            out[f"{label}_queued_return_ms"], out[f"{label}_queued_done_ms"] = _queued(fn, inputs, cycles)
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(TIMELINE_CALLS):
                fn(*inputs)
            enqueued = time.perf_counter()
            torch.cuda.synchronize()
            done = time.perf_counter()
        out[f"{label}_host_us_per_call"] = (enqueued - start) / TIMELINE_CALLS * 1e6
        out[f"{label}_wall_us_per_call"] = (done - start) / TIMELINE_CALLS * 1e6
    return out


def launch_once(key: str | None, rows: int, cols: int, rung: str | None = None) -> float:
    """One forward of pitfall ``key`` (or of the shipped ``rung`` of kl_div, ``key`` None) on
    (rows, cols) inputs, synchronized; prints and returns the loss. What the sanitizer and
    profiler runs execute (``python -c``)."""
    from losslab.ops import variant as shipped

    fn = variant(key) if key else shipped(KL_DIV, rung)
    problem = get(key).problem if key else KL_DIV
    inputs = problem.make_inputs((rows, cols), seed=0, device="cuda")
    with torch.no_grad():
        loss = float(fn(*inputs))
    torch.cuda.synchronize()
    print(f"loss {loss!r}", flush=True)
    return loss


def _python_launch(key: str | None, shape: tuple[int, int], rung: str | None = None) -> list[str]:
    call = f"from losslab.teach import pitfalls; pitfalls.launch_once({key!r}, {shape[0]}, {shape[1]}, {rung!r})"
    return [sys.executable, "-c", call]


def _run_tool(cmd: list[str]) -> tuple[int | None, str]:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, cwd=build.ROOT)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {TOOL_TIMEOUT_S:g} s"
    return proc.returncode, proc.stdout + proc.stderr


def parse_racecheck(text: str, kernel: str = "") -> dict:
    """compute-sanitizer racecheck output -> hazards (errors, warnings) over every kernel the process
    ran, ``kernel_races``: the race reports that name ``kernel`` (PyTorch's own kernels run too),
    and the first report line."""
    races = [line for line in text.splitlines() if "Race reported" in line]
    summary = re.search(r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)", text)
    first = next((line.strip("= ").strip() for line in text.splitlines()
                  if "Race reported" in line or "hazard" in line.lower() and "SUMMARY" not in line), "")
    return {"hazards": int(summary[1]) if summary else 0, "errors": int(summary[2]) if summary else 0,
            "warnings": int(summary[3]) if summary else 0, "summary": summary[0] if summary else "", "first": first,
            "kernel_races": sum(kernel in line for line in races) if kernel else len(races)}


def _racecheck(key: str, rung: str = "shared_memory") -> dict:
    """``compute-sanitizer --tool racecheck`` on one forward of the pitfall and of the shipped rung."""
    sanitizer = build.find_tool("compute-sanitizer")
    if sanitizer is None:
        return {"tool": "compute-sanitizer racecheck", "error": "compute-sanitizer not found"}
    out = {"tool": "compute-sanitizer --tool racecheck", "shape": list(RACECHECK_SHAPE)}
    for label, kernel, args in (("pitfall", f"pitfall_{key}_kernel", (key, RACECHECK_SHAPE)),
                                ("reference", f"kl_div_{rung}_forward_kernel", (None, RACECHECK_SHAPE, rung))):
        code, text = _run_tool([sanitizer, "--tool", "racecheck", *_python_launch(*args)])
        out[label] = ({"returncode": code, "kernel": kernel, **parse_racecheck(text, kernel)} if code is not None
                      else {"error": text})
    return out


def parse_ncu_metrics(text: str, metrics: tuple[str, ...] = BANK_METRICS) -> dict[str, float]:
    """``ncu --csv`` output -> metric -> sum over the profiled kernels."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    totals: dict[str, float] = {}
    if start is None:
        return totals
    for row in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        name, value = row.get("Metric Name"), (row.get("Metric Value") or "").replace(",", "")
        if name in metrics:
            try:
                totals[name] = totals.get(name, 0.0) + float(value)
            except ValueError:
                continue
    return totals


def _bank_conflicts(key: str, rung: str = "shared_memory") -> dict:
    """Nsight Compute's shared-memory bank-conflict counters for the pitfall's forward kernel and
    the shipped rung's, at ``BANK_SHAPE``."""
    ncu = build.find_tool("ncu")
    if ncu is None:
        return {"tool": "ncu", "error": "ncu not found"}
    out = {"tool": "ncu", "shape": list(BANK_SHAPE), "metrics": list(BANK_METRICS)}
    for label, kernel, args in (("pitfall", f"pitfall_{key}_kernel", (key, BANK_SHAPE)),
                                ("reference", f"kl_div_{rung}_forward_kernel", (None, BANK_SHAPE, rung))):
        cmd = [ncu, "--csv", "--metrics", ",".join(BANK_METRICS), "--kernel-name", f"regex:{kernel}",
               "--launch-count", "1", *_python_launch(*args)]
        code, text = _run_tool(cmd)
        values = parse_ncu_metrics(text)
        out[label] = values if values else {"error": f"ncu returned {code}: {text.strip()[-400:]}"}
    return out


def large_in_child(key: str, rung: str = "warp_shuffle") -> dict:
    """The child's side of the large probe: the shipped rung's loss, then the pitfall's, at LARGE_SHAPE."""
    from losslab.ops import variant as shipped

    # Rows of probabilities made in place (2 x 8.6 GB, no temporaries): softmax would need a third tensor.
    gen = torch.Generator(device="cuda").manual_seed(0)
    inputs = tuple(torch.empty(LARGE_SHAPE, device="cuda").uniform_(0.05, 1.0, generator=gen) for _ in range(2))
    for x in inputs:
        x /= x.sum(-1, keepdim=True)
    with torch.no_grad():
        reference = float(shipped(KL_DIV, rung)(*inputs))
        torch.cuda.synchronize()
        got = float(variant(key)(*inputs))
        torch.cuda.synchronize()
    return {"reference_loss": reference, "pitfall_loss": got,
            "relative_error": abs(got - reference) / abs(reference) if reference else float("nan")}


def _large(key: str) -> dict:
    """One forward past 2^31 elements in its own child (a fault there is recorded, not fatal)."""
    rows, cols = LARGE_SHAPE
    out = {"shape": list(LARGE_SHAPE), "elements": rows * cols, "first_wrapping_row": -(-2**31 // cols),
           "gigabytes_per_tensor": rows * cols * 4 / 1e9}
    outcome = isolated.run("losslab.teach.pitfalls:large_in_child", {"key": key}, TOOL_TIMEOUT_S)
    return {**out, **outcome.value} if outcome.ok else {**out, "fault": outcome.format()}


PROBES = {"determinism": lambda key, v: _determinism(v), "timeline": lambda key, v: _timeline(v),
          "racecheck": lambda key, v: {**_determinism(v), "racecheck": _racecheck(key)},
          "bank": lambda key, v: _bank_conflicts(key), "large": lambda key, v: _large(key)}


def simulate(key: str):
    """The CPU simulator's diagnosis of a CUDA pitfall it can see (``simulated_as``): a
    ``simulator.CpuGrade``. Raises ValueError for a pitfall it cannot see (host ones, the
    int32 index, bank conflicts), ``SimulatorError`` where g++ cannot build it."""
    from losslab.teach.simulator import grade_on_cpu

    p = get(key)
    if not p.simulated_as:
        raise ValueError(f"pitfall: the CPU simulator cannot show {key!r}; it shows "
                         f"{', '.join(q.key for q in PITFALLS if q.simulated_as)}")
    grade = grade_on_cpu(p.simulated_as, p.source)
    grade.key = f"pitfall {key} (simulated as the {p.simulated_as} exercise)"
    return grade


def run(key: str, sizes: tuple[str, ...] = CHECK_SIZES, edge_cases: bool = True) -> dict:
    """Build pitfall ``key``, run the checker on it (random inputs at ``sizes``, then the edge
    cases) and its probe; return the outcome as a JSON-ready dict: key, problem, checks (the
    CheckResults as dicts), failed (count), worst_forward_error, first_failure, probe.

    Raises:
        RuntimeError: no CUDA GPU.
    """
    from losslab.measure.check import check_edge_cases, check_variant

    if not torch.cuda.is_available():
        raise RuntimeError("running the pitfalls needs a CUDA GPU and none is visible here")
    p = get(key)
    v = variant(key)
    checks = [c for s in sizes for c in check_variant(p.problem, v, p.problem.sizes[s], seed=0)]
    if edge_cases:
        checks += check_edge_cases(p.problem, v)
    failed = [c for c in checks if not c.passed]
    forward = [c.error for c in checks if c.direction == "forward"]
    probe = PROBES[p.probe](key, v) if p.probe else None
    return {"key": key, "problem": p.problem.name, "checks": [c.as_dict() for c in checks], "failed": len(failed),
            "worst_forward_error": max(forward, default=float("nan")),
            "first_failure": (f"{failed[0].direction} {failed[0].case}: error {failed[0].error:.3g}"
                              f"{' (' + failed[0].detail + ')' if failed[0].detail else ''}") if failed else "",
            "probe": probe}


def sources_sha256(root: Path | None = None) -> str:
    """sha256 of what a pitfalls record was measured with: ``records.pitfall_sources_sha256`` over
    the problems' measured sources and ``pitfalls/``, plus this module and the custom-variant
    code that builds and runs the CUDA pitfalls (``root``: a copy of the repository to hash)."""
    here = Path(__file__).resolve().parent
    return records.pitfall_sources_sha256([Path(__file__).resolve(), *sorted((here / "custom").glob("*.py"))], root)


def run_isolated(key: str, timeout_s: float | None = None) -> dict:
    """:func:`run` in a child process killed after ``timeout_s`` seconds (None: ``RUN_TIMEOUT_S``
    plus the time its probe's tools may take): a pitfall that hangs or faults gives an outcome
    with ``fault`` (the child's verdict) and no checks, instead of a hung or broken process."""
    if timeout_s is None:
        timeout_s = RUN_TIMEOUT_S + PROBE_BUDGET_S.get(get(key).probe, 0.0)
    outcome = isolated.run("losslab.teach.pitfalls:run", {"key": key}, timeout_s)
    if outcome.ok:
        return outcome.value
    return {"key": key, "problem": get(key).problem.name, "checks": [], "failed": 0,
            "worst_forward_error": float("nan"),
            "first_failure": f"{outcome.status}: {outcome.message}", "probe": None, "fault": outcome.format()}


def measure(keys: list[str] | None = None, progress: bool = True, isolate: bool = True) -> dict:
    """Run the pitfalls (default all) on this GPU, each in a child process if ``isolate``; return
    a record (not saved): device, torch, CUDA, date, the sources' sha256, ``live`` True and the
    outcome of each (see :func:`run`)."""
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    rec = {"device": props.name, "torch": torch.__version__, "cuda": torch.version.cuda,
           "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
           "sources_sha256": sources_sha256(), "live": True, "outcomes": {}}
    for key in keys or [p.key for p in PITFALLS]:
        get(key)
        if progress:
            print(f"  pitfall {key} ...", flush=True)
        rec["outcomes"][key] = run_isolated(key) if isolate else run(key)
    return rec


def record(keys: list[str] | None = None, results_dir: Path = RECORDS, progress: bool = True) -> tuple[Path, dict]:
    """:func:`measure`, written to ``<results_dir>/<device>.json``. Returns its path and the record.

    With ``keys`` (a subset), the other pitfalls' outcomes are kept from the file already there
    when it was measured with the same sources (same ``sources_sha256``), so the pitfalls can be
    recorded in several shorter runs; otherwise the file holds only the subset."""
    rec = {**measure(keys, progress), "live": False}
    path = Path(results_dir) / f"{records.device_slug(rec['device'])}.json"
    if keys and path.exists():
        old = _read_record(path)
        if old.get("sources_sha256") == rec["sources_sha256"]:
            rec["outcomes"] = {**old.get("outcomes", {}), **rec["outcomes"]}
    records.write_json(path, rec)  # whole or not at all: a failed write leaves the old record
    return path, rec


def _read_record(path: Path) -> dict:
    """One pitfalls record file. Raises records.RecordError (one line naming the file) if it is not one."""
    try:
        rec = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise records.RecordError(f"{path}: not a readable pitfalls record ({type(err).__name__}: {err}); "
                                  "re-record it with `python -m losslab pitfalls --record` or delete the file"
                                  ) from None
    if not isinstance(rec, dict) or not {"device", "date", "outcomes"} <= set(rec):
        raise records.RecordError(f"{path}: not a pitfalls record (expected device, date and outcomes); "
                                  "re-record it with `python -m losslab pitfalls --record` or delete the file")
    return rec


def load_record(device: str | None = None, results_dir: Path | str = RECORDS) -> dict | None:
    """The newest pitfalls record (of ``device``, a name or its slug, if given), or None.

    Raises:
        records.RecordError: a file there is not a pitfalls record (one line naming it).
    """
    found = [_read_record(p) for p in sorted(Path(results_dir).glob("*.json"))]
    if device:
        found = [r for r in found if records.device_slug(r["device"]) == records.device_slug(device)]
    return max(found, key=lambda r: r["date"], default=None)


# --- showing them ------------------------------------------------------------------------------------

def banner(rec: dict | None) -> str:
    """One line: where the outcomes come from, or that none exists yet."""
    if rec is None:
        return ("No recorded outcome exists yet, and no GPU is visible here: nothing below is measured. "
                "Run `python -m losslab pitfalls --record` on a GPU machine and commit "
                "reports/results/pitfalls/<device>.json.")
    source = "LIVE (measured now)" if rec.get("live") else "RECORDED (not measured now)"
    # the hash covers pitfalls/, the code that builds and runs them and every problem's measured
    # sources: a mismatch says one of them changed, not which (the record keeps one hash)
    fresh = ("matches the sources now" if rec["sources_sha256"] == sources_sha256()
             else "does NOT match the sources now: pitfalls/, the code that runs them, or the shipped kernels "
                  "and host code they build on changed since, so these outcomes come from older sources; "
                  "record again on a GPU machine (python -m losslab pitfalls --record)")
    return (f"{source} outcomes on {rec['device']}, {rec['date']} (torch {rec['torch']}, CUDA {rec['cuda']}); "
            f"sources sha256 {rec['sources_sha256'][:12]} {fresh}.")


def _determinism_text(probe: dict) -> str:
    shape = "x".join(map(str, probe["shape"]))
    head = f"{probe['runs']} forwards at {shape}: {probe['distinct_losses']} distinct loss value(s)"
    if any(math.isnan(probe[k]) for k in ("min", "max")):  # a NaN among them leaves no range to state
        return head + ", NaN among them (no finite range recorded)"
    return head + f", from {probe['min']!r} to {probe['max']!r}"


def _timeline_text(probe: dict) -> str:
    text = (f"sync debug mode flagged {probe['pitfall_sync_warnings']} synchronizing call(s) per forward "
            f"(shipped: {probe['reference_sync_warnings']})")
    if "pitfall_queued_return_ms" in probe:
        # queued_ms is the sleep requested (QUEUED_MS), not a measured length: say so, beside the measured times
        text += (f"; with {probe['queued_ms']:g} ms of GPU sleep requested ahead (its length not timed), the host "
                 f"returns from {probe['queued_calls']} calls after {probe['pitfall_queued_return_ms']:.2f} ms, "
                 f"done after {probe['pitfall_queued_done_ms']:.2f} ms (shipped: returns after "
                 f"{probe['reference_queued_return_ms']:.2f} ms, done after "
                 f"{probe['reference_queued_done_ms']:.2f} ms)")
    return text + (f"; back to back, host time {probe['pitfall_host_us_per_call']:.1f} us per call (shipped: "
                   f"{probe['reference_host_us_per_call']:.1f} us), done after {probe['pitfall_wall_us_per_call']:.1f} "
                   f"us per call (shipped: {probe['reference_wall_us_per_call']:.1f} us), {probe['calls']} calls at "
                   + "x".join(map(str, probe["shape"])))


def _racecheck_text(probe: dict) -> str:
    race = probe.get("racecheck", {})
    if "error" in race:
        return f"{_determinism_text(probe)}; racecheck: {race['error']}"
    parts = []
    for label in ("pitfall", "reference"):
        r = race.get(label, {})
        parts.append(f"{label}: {r['error']}" if "error" in r else
                     f"{label}: {r.get('kernel_races', 0)} race report(s) on its kernel, {r.get('hazards', 0)} "
                     f"hazard(s) in the process")
    first = race.get("pitfall", {}).get("first", "")
    return f"{_determinism_text(probe)}; racecheck at {'x'.join(map(str, race.get('shape', [])))}: " + \
        "; ".join(parts) + (f"; first: {first}" if first else "")


def _bank_text(probe: dict) -> str:
    if "error" in probe:
        return f"ncu: {probe['error']}"
    parts = []
    for label in ("pitfall", "reference"):
        values = probe.get(label, {})
        if "error" in values:
            parts.append(f"{label}: {values['error']}")
            continue
        ld, st = (values.get(m, float("nan")) for m in BANK_METRICS)
        per_row = st / probe["shape"][0]
        parts.append(f"{label}: {st:g} store / {ld:g} load conflicts ({per_row:.1f} store conflicts a row)")
    stores = [probe.get(label, {}).get(BANK_METRICS[1]) for label in ("pitfall", "reference")]
    if None not in stores:  # the prediction is a difference: 7 extra passes for each of a row's 8 warps
        parts.append(f"the pitfall's extra: {(stores[0] - stores[1]) / probe['shape'][0]:.1f} a row (predicted 56)")
    return f"ncu bank conflicts at {'x'.join(map(str, probe['shape']))}: " + "; ".join(parts)


def _large_text(probe: dict) -> str:
    shape = "x".join(map(str, probe["shape"]))
    head = (f"{shape} ({probe['elements']:,} elements, {probe['gigabytes_per_tensor']:.1f} GB a tensor; row "
            f"{probe['first_wrapping_row']} is the first to wrap)")
    if "fault" in probe:
        return f"{head}: the child stopped: {probe['fault'].splitlines()[0]}"
    return (f"{head}: loss {probe['pitfall_loss']!r} vs the shipped rung's {probe['reference_loss']!r} "
            f"(relative error {probe['relative_error']:.3g})")


_PROBE_TEXT = {"determinism": _determinism_text, "timeline": _timeline_text, "racecheck": _racecheck_text,
               "bank": _bank_text, "large": _large_text}


def _probe_text(key: str, probe: dict | None) -> str:
    if not probe:
        return ""
    kind = get(key).probe
    try:
        return _PROBE_TEXT[kind](probe) if kind in _PROBE_TEXT else json.dumps(probe)
    except (KeyError, TypeError, ValueError):  # a record written by another version of the probe
        return json.dumps(probe)


def outcome_table(rec: dict | None) -> str:
    """Each pitfall: the checks failed, the worst forward error, the first failure and the
    probe, from a record (or a message that there is none), as an ``Html`` table."""
    if rec is None:
        text = banner(None)
        return Html(f'<p style="color:#a40"><b>{html.escape(text)}</b></p>', plain=text)
    body, plain = [], []
    for p in PITFALLS:
        o = rec["outcomes"].get(p.key)
        if o is None:
            body.append([html.escape(p.title), "not recorded yet", "", "", ""])
            plain.append(f"{p.key}: not recorded yet (python -m losslab pitfalls --record on a GPU)")
            continue
        checks = f"{o['failed']} of {len(o['checks'])} failed" if o["checks"] else "none recorded (a fault)"
        probe = _probe_text(p.key, o.get("probe"))
        body.append([html.escape(p.title), checks, _worst(o),
                     html.escape(o["first_failure"] or "none"), html.escape(probe)])
        plain.append(f"{p.key}: {checks}; worst forward error {_worst(o)}; "
                     f"{o['first_failure'] or 'no failure'}{'; ' + probe if probe else ''}")
    caption = html.escape(banner(rec))
    return Html(html_table(["pitfall", "checks", "worst forward rel. error", "first failure", "probe"], body, caption,
                       text_columns=5), plain="\n".join([banner(rec), *plain]))


def _worst(o: dict) -> str:
    """The worst forward error of an outcome, or "-" where no forward check completed."""
    value = o["worst_forward_error"]
    return "-" if value is None or math.isnan(value) else f"{value:.3g}"


def outcome(rec: dict | None, key: str) -> str:
    """What the checker saw for pitfall ``key`` in ``rec``: checks failed of run, the worst forward
    error, the first failure, the probe; or that nothing is recorded (an ``Html``)."""
    o = (rec or {}).get("outcomes", {}).get(key)
    if o is None:
        text = ("Not recorded yet: no GPU run has measured this pitfall (python -m losslab pitfalls --record "
                "on a GPU machine records it); the symptom above is the prediction only.")
        return Html(f'<p style="color:#a40">{html.escape(text)}</p>', plain=text)
    if o["checks"]:
        lines = [f"{o['failed']} of {len(o['checks'])} checks failed; worst forward relative error {_worst(o)}",
                 f"first failure: {o['first_failure'] or 'none'}"]
    else:  # the child stopped before a check completed: its fault is the outcome, there is no error to state
        lines = [f"no check recorded: the child process faulted before it could return them ({o['first_failure']})"]
    for c in [c for c in o["checks"] if not c["passed"]][:6]:
        lines.append(f"  FAIL {c['direction']:<8} {c['case'][:50]:<50} error {c['error']:.3g}  {c['detail']}".rstrip())
    if o.get("probe"):
        lines.append("probe: " + _probe_text(key, o["probe"]))
    text = "\n".join(lines)
    return Html(f"<pre>{html.escape(text)}</pre>", plain=text)


def source_lines(key: str) -> str:
    """The pitfall's wrong code: the ``// PITFALL`` lines of its CUDA source (with line numbers),
    or of the host wrapper in this module."""
    p = get(key)
    path = p.source or Path(__file__)
    marker = "PITFALL"
    lines = path.read_text().splitlines()
    hits = [f"{path.relative_to(build.ROOT)}:{i}: {line.strip()}" for i, line in enumerate(lines, 1)
            if marker in line and (not p.host or f'"{key}"' in line or (key == "one_element" and "reshape(1)" in line))]
    return "\n".join(hits)


def describe(key: str) -> str:
    """A pitfall's title, the mistake, the symptom predicted, what catches it, and its wrong line(s)."""
    p = get(key)
    code = source_lines(key)
    body = (f"<p><b>{html.escape(p.title)}</b>: {html.escape(p.mistake)}. Predicted symptom: "
            f"{html.escape(p.symptom)}. Caught by: {html.escape(p.caught_by)}.</p>"
            f"<pre style='font-size:11px'>{html.escape(code)}</pre>")
    return Html(body, plain=f"{p.title}: {p.mistake}. Predicted symptom: {p.symptom}. Caught by: {p.caught_by}."
                            f"\n{code}")
