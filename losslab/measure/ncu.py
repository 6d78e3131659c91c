"""Nsight Compute: DRAM traffic, and the counters that name each rung's flaw and its fix.

:func:`profile_problem` runs a child Python process (:func:`main`) under ``ncu`` that launches
each implementation's forward, backward and forward+backward once, at one shape in float32,
then parses ncu's CSV into one typed :class:`Counters` per (implementation, direction), gathered
in a :class:`Profile` (what ``records.Section.ncu`` holds). A missing or refusing ncu, or a
metric it does not know, never fails the profile: the result says so.

One module: the parent and the child it runs under ncu share the marker protocol and the metric names.
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch

from losslab import build, problems
from losslab.build import ROOT
from losslab.measure.bench import implementations
from losslab.variants import recorded_variants

__all__ = ["NCU_METRICS", "EVIDENCE_METRICS", "STALL_REASONS", "Counters", "Profile", "attribute", "find_ncu",
           "ncu_table_text", "evidence_table_text", "parse_ncu_csv", "profile_problem"]

NCU_METRICS = (  # DRAM traffic and FP32 work: the roofline's measured points
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "gpu__time_duration.sum",
    "smsp__sass_thread_inst_executed_op_fadd_pred_on.sum",
    "smsp__sass_thread_inst_executed_op_fmul_pred_on.sum",
    "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum",
)
STALL_REASONS = ("long_scoreboard", "barrier", "lg_throttle", "short_scoreboard", "mio_throttle", "wait",
                 "math_pipe_throttle", "not_selected", "no_instruction", "membar", "branch_resolving", "drain")
OPCODES_METRIC = "sass__inst_executed_per_opcode"  # instanced: one count per SASS opcode (BAR, SHFL, LDG, ...)
_STALL = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
# Counters -> (ncu metric, how the kernels combine: "sum" over them or "main": the main kernel's)
_EVIDENCE = {
    "load_requests": ("l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum", "sum"),
    "load_sectors": ("l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum", "sum"),
    "store_requests": ("l1tex__t_requests_pipe_lsu_mem_global_op_st.sum", "sum"),
    "store_sectors": ("l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum", "sum"),
    "l2_read_sectors": ("lts__t_sectors_srcunit_tex_op_read.sum", "sum"),
    "global_load_instructions": ("smsp__sass_inst_executed_op_global_ld.sum", "sum"),
    "shared_load_instructions": ("smsp__sass_inst_executed_op_shared_ld.sum", "sum"),
    "shared_store_instructions": ("smsp__sass_inst_executed_op_shared_st.sum", "sum"),
    "instructions": ("smsp__inst_executed.sum", "sum"),
    "registers_per_thread": ("launch__registers_per_thread", "main"),
    "achieved_occupancy_pct": ("sm__warps_active.avg.pct_of_peak_sustained_active", "main"),
    "memory_throughput_pct": ("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed", "main"),
    "dram_throughput_pct": ("dram__throughput.avg.pct_of_peak_sustained_elapsed", "main"),
}
_ACTIVE_CYCLES = ("sm__cycles_active.avg", "sm__cycles_active.max")
EVIDENCE_METRICS = (*(m for m, _ in _EVIDENCE.values()), *_ACTIVE_CYCLES, OPCODES_METRIC,
                    *(_STALL.format(r) for r in STALL_REASONS))
MARKER_KERNEL = "spin_kernel"
TIMEOUT_S = 480
_SCALE = {"": 1, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
_TIME_NS = {"nsecond": 1, "ns": 1, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6, "second": 1e9, "s": 1e9}
_CSV_COLUMNS = {"ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size",
                "Grid Size", "Device", "CC", "Section Name", "Metric Name", "Metric Unit", "Metric Value"}
_OPCODE_PAIR = re.compile(r"\b([A-Z][A-Z0-9_]{1,15})(?:\.[A-Z0-9_.]+)?\b\W{1,4}?([0-9][0-9,]*(?:\.[0-9]+)?)")
def find_ncu() -> str | None:
    """Path of ``ncu`` (Nsight Compute's command line) on PATH or in the CUDA toolkit, or None."""
    return build.find_tool("ncu")




def _number(text: str) -> float | None:
    """The number ``text`` starts with (thousands separators dropped), or None ("n/a", "")."""
    match = re.match(r"\s*([-+]?[0-9][0-9,]*(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?)", text or "")
    return float(match[1].replace(",", "")) if match else None


def _to_base(value: str, unit: str) -> float | None:
    """A metric value in base units: bytes, nanoseconds or a plain count; None when ncu has none."""
    number = _number(value)
    if number is None:
        return None
    unit = unit.strip()
    if unit in _TIME_NS:
        return number * _TIME_NS[unit]
    for suffix in ("byte", "B"):
        if unit.endswith(suffix):
            return number * _SCALE.get(unit[: -len(suffix)], 1)
    return number  # "inst", "" and other plain counts


def _opcodes(value: str) -> dict[str, float]:
    """Per-opcode counts from an instanced metric's value as ``--print-metric-instances details``
    prints it (pairs such as ``BAR: 72; SHFL: 40; EXIT: 8``). A kernel's counts are trusted only
    when they include ``EXIT``, which every kernel executes (:func:`has_opcodes`)."""
    return {op: float(n.replace(",", "")) for op, n in _OPCODE_PAIR.findall(value or "")}


def has_opcodes(kernel: dict) -> bool:
    """True when ``kernel`` (of :func:`parse_ncu_csv`) holds per-opcode counts that are real:
    ``EXIT`` among them (other text is never read as opcode counts)."""
    return "EXIT" in kernel.get("opcodes", {})


def _launch_size(text: str) -> int | None:
    """Threads (block) or blocks (grid) from ncu's "(x, y, z)" column; None if absent."""
    dims = [int(d) for d in re.findall(r"\d+", text or "")]
    return math.prod(dims) if dims else None


def parse_ncu_csv(text: str) -> list[dict]:
    """Per-kernel metrics from ``ncu --csv`` output (its "details" page, one row per metric).

    Lines that are not CSV (``==PROF==`` messages, the program's own output)
    are skipped. Returns one dict per profiled kernel in launch order:
    ``id``, ``name``, ``grid_size``/``block_size`` (blocks, threads per block), each metric
    name -> value in base units (bytes, ns, counts; None for "n/a"), and ``opcodes`` (SASS
    opcode -> warp instructions executed) where the per-opcode metric was collected.
    """
    lines = [line for line in text.splitlines() if line.startswith('"')]
    if not lines:
        return []
    kernels: dict[int, dict] = {}
    for row in csv.DictReader(io.StringIO("\n".join(lines))):
        if "Metric Name" not in row or not (row.get("ID") or "").strip().isdigit():
            continue
        kernel = kernels.setdefault(int(row["ID"]), {
            "id": int(row["ID"]), "name": row["Kernel Name"], "grid_size": _launch_size(row.get("Grid Size")),
            "block_size": _launch_size(row.get("Block Size"))})
        if row["Metric Name"] == OPCODES_METRIC:  # one row with every opcode, or one row per opcode
            extra = " ".join(str(v) for k, v in row.items() if k not in _CSV_COLUMNS and v)
            ops = _opcodes(row["Metric Value"]) or _opcodes(f"{extra}: {row['Metric Value']}")
            for op, count in ops.items():
                kernel.setdefault("opcodes", {})[op] = kernel.get("opcodes", {}).get(op, 0.0) + count
        kernel[row["Metric Name"]] = _to_base(row["Metric Value"], row.get("Metric Unit", ""))
    return [kernels[k] for k in sorted(kernels)]


# --- the typed result ----------------------------------------------------------------------------------

@dataclass
class Counters:
    """What Nsight Compute counted for one (implementation, direction), summed over its kernels.

    Bytes in bytes, times in ms, counts in warp-level instructions or requests unless named
    ``thread``; ``None``: ncu did not give that metric (see ``Profile.missing``). The main-kernel
    fields (``main_kernel`` and after) are of the longest kernel of the direction. ``stalls``:
    reason -> warps stalled per issued instruction (of the main kernel). ``opcodes``: SASS opcode
    -> warp instructions executed, over all kernels.

    What the counters show (sums over the direction's kernels unless said otherwise):

    - coalescing: global load requests and the 32-byte sectors they touch (``sectors_per_request``:
      4 when a warp reads 32 consecutive floats, 32 when its lanes read 32 different rows), the same
      for stores, and L2 read sectors;
    - parallelism, of the *main kernel* (the longest one): grid and block size, registers per thread,
      achieved occupancy, and ``active_sms``: the SMs that had work (SM count x mean / max active
      cycles per SM);
    - the reduction: barriers (``BAR``) and shuffles (``SHFL``) executed, from the per-opcode SASS
      counts, and shared-memory load/store instructions;
    - the memory pipe: DRAM bytes read and written, memory and DRAM throughput in % of peak;
    - warp stall reasons of the main kernel (warps stalled per issued instruction, by reason);
    - instructions executed, and instructions per DRAM byte.
    """

    implementation: str
    kind: str
    direction: str
    launches: int = 0
    kernels: list[str] = field(default_factory=list)
    dram_bytes_read: float = 0.0
    dram_bytes_written: float = 0.0
    duration_ms: float = 0.0
    fadd: float = 0.0
    fmul: float = 0.0
    ffma: float = 0.0
    fp32_flops: float = 0.0
    load_requests: float | None = None
    load_sectors: float | None = None
    store_requests: float | None = None
    store_sectors: float | None = None
    l2_read_sectors: float | None = None
    global_load_instructions: float | None = None
    shared_load_instructions: float | None = None
    shared_store_instructions: float | None = None
    instructions: float | None = None
    barriers: float | None = None
    shuffles: float | None = None
    main_kernel: str = ""
    grid_size: int | None = None
    block_size: int | None = None
    registers_per_thread: float | None = None
    achieved_occupancy_pct: float | None = None
    active_sms: float | None = None
    memory_throughput_pct: float | None = None
    dram_throughput_pct: float | None = None
    stalls: dict[str, float] = field(default_factory=dict)
    opcodes: dict[str, float] = field(default_factory=dict)

    @property
    def dram_bytes(self) -> float:
        return self.dram_bytes_read + self.dram_bytes_written

    @property
    def sectors_per_request(self) -> float | None:
        """32-byte sectors per global load request: 4 for a warp reading 128 consecutive bytes,
        up to 32 when every lane reads another line (None without both counters)."""
        if not self.load_requests or self.load_sectors is None:
            return None
        return self.load_sectors / self.load_requests

    @property
    def shared_instructions(self) -> float | None:
        parts = [self.shared_load_instructions, self.shared_store_instructions]
        return None if all(p is None for p in parts) else sum(p or 0.0 for p in parts)

    @property
    def instructions_per_byte(self) -> float | None:
        """Warp instructions executed per DRAM byte moved."""
        return self.instructions / self.dram_bytes if self.instructions is not None and self.dram_bytes else None

    def top_stalls(self, n: int = 3) -> list[tuple[str, float]]:
        """The ``n`` largest stall reasons of the main kernel, largest first."""
        return sorted(self.stalls.items(), key=lambda kv: -kv[1])[:n]

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Counters:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass
class Profile:
    """One ncu run over a problem's implementations (what ``Section.ncu`` holds).

    ``status``: "ok", "unavailable", "refused" or "failed", with ``message``; ``shape`` the
    (rows, columns) profiled, always float32; ``metrics`` the ncu metrics collected;
    ``missing``: metric -> why it is not there; ``multiprocessors`` of the device;
    ``records``: one :class:`Counters` per (implementation, direction).
    """

    status: str = "unavailable"
    message: str = ""
    shape: list[int] = field(default_factory=list)
    metrics: list[str] = field(default_factory=list)
    missing: dict[str, str] = field(default_factory=dict)
    ncu_version: str | None = None
    multiprocessors: int = 0
    records: list[Counters] = field(default_factory=list)

    def find(self, implementation: str, direction: str) -> Counters | None:
        """The counters of one (implementation, direction), or None."""
        return next((r for r in self.records if (r.implementation, r.direction) == (implementation, direction)),
                    None)

    @property
    def has_evidence(self) -> bool:
        """True when the profile holds the per-rung counters (not only DRAM bytes: older records)."""
        return any(r.load_requests is not None for r in self.records)

    def as_dict(self) -> dict:
        return {**asdict(self), "records": [r.as_dict() for r in self.records]}

    @classmethod
    def from_dict(cls, data: dict | Profile | None) -> Profile | None:
        """A Profile from its saved form (or a Profile, or None: None)."""
        if data is None or isinstance(data, Profile):
            return data
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["records"] = [r if isinstance(r, Counters) else Counters.from_dict(r) for r in data.get("records", [])]
        return cls(**values)


def _sum(kernels: list[dict], metric: str) -> float | None:
    values = [k[metric] for k in kernels if k.get(metric) is not None]
    return sum(values) if values else None


def _counters(label: dict, kernels: list[dict], multiprocessors: int) -> Counters:
    """One label's Counters from its kernels (see :class:`Counters`)."""
    out = Counters(label["implementation"], label["kind"], label["direction"], launches=len(kernels),
                   kernels=list(dict.fromkeys(k["name"] for k in kernels)))
    out.dram_bytes_read = _sum(kernels, "dram__bytes_read.sum") or 0.0
    out.dram_bytes_written = _sum(kernels, "dram__bytes_write.sum") or 0.0
    out.duration_ms = (_sum(kernels, "gpu__time_duration.sum") or 0.0) / 1e6
    for op in ("fadd", "fmul", "ffma"):
        setattr(out, op, _sum(kernels, f"smsp__sass_thread_inst_executed_op_{op}_pred_on.sum") or 0.0)
    out.fp32_flops = out.fadd + out.fmul + 2 * out.ffma
    if not kernels:
        return out
    main = max(kernels, key=lambda k: k.get("gpu__time_duration.sum") or 0.0)
    out.main_kernel, out.grid_size, out.block_size = main["name"], main.get("grid_size"), main.get("block_size")
    for name, (metric, how) in _EVIDENCE.items():
        setattr(out, name, _sum(kernels, metric) if how == "sum" else main.get(metric))
    mean, most = (main.get(m) for m in _ACTIVE_CYCLES)
    if mean is not None and most and multiprocessors:
        out.active_sms = multiprocessors * mean / most
    out.stalls = {r: main[_STALL.format(r)] for r in STALL_REASONS if main.get(_STALL.format(r)) is not None}
    with_opcodes = [k["opcodes"] for k in kernels if has_opcodes(k)]
    if with_opcodes:
        for ops in with_opcodes:
            for op, count in ops.items():
                out.opcodes[op] = out.opcodes.get(op, 0.0) + count
        out.barriers, out.shuffles = out.opcodes.get("BAR", 0.0), out.opcodes.get("SHFL", 0.0)
    return out


def attribute(kernels: list[dict], labels: list[dict | None], multiprocessors: int = 0) -> list[Counters]:
    """The kernels between consecutive marker kernels as one :class:`Counters` per label.

    ``labels[i]`` (implementation, kind, direction) names the kernels after the
    i-th marker; a None label discards its kernels. ``multiprocessors`` (the device's SM
    count) turns active cycles into ``active_sms`` (0: left None).

    The child launches a one-thread marker kernel (``torch.cuda._sleep(0)``, whose kernel is
    ATen's ``spin_kernel``, :data:`MARKER_KERNEL`) before each (implementation, direction) and
    writes the list of labels in launch order to a file; every kernel between two markers
    belongs to the label of the first. Only the profiled range (``cudaProfilerStart``/``Stop``,
    after a warm-up that builds and compiles everything) is measured.
    """
    groups: list[tuple[dict, list[dict]]] = []
    index, current = -1, None
    for kernel in kernels:
        if MARKER_KERNEL in kernel["name"]:
            index += 1
            current = None
            if index < len(labels) and labels[index] is not None:
                current = []
                groups.append((labels[index], current))
        elif current is not None:
            current.append(kernel)
    return [_counters(label, group, multiprocessors) for label, group in groups]
def _diagnose(output: str, returncode: int) -> tuple[str, str]:
    """(status, message) for an ncu run that produced no usable rows."""
    if "ERR_NVGPUCTRPERM" in output:
        return "refused", ("ncu may not read the GPU performance counters here (ERR_NVGPUCTRPERM): run as "
                           "root or with the driver option NVreg_RestrictProfilingToAdminUsers=0")
    if "LibraryNotLoaded" in output or "LIBRARY_NOT_LOADED" in output:
        return "refused", "ncu could not load a library it needs (LibraryNotLoaded); check the Nsight Compute install"
    tail = "\n".join(output.strip().splitlines()[-12:])
    return "failed", f"ncu exited with status {returncode} and profiled no kernels; its last lines:\n{tail}"



def _base(metric: str) -> str:
    return metric.split(".")[0]


def known_metrics(ncu: str) -> set[str] | None:
    """The base metric names ``ncu --query-metrics`` lists for the GPU here, or None when the
    query gives nothing usable (then nothing is left out in advance)."""
    try:
        proc = subprocess.run([ncu, "--query-metrics"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    names = set(re.findall(r"^\s*([a-z0-9_]+__[a-z0-9_]+)", proc.stdout, re.MULTILINE))
    return names if "dram__bytes_read" in names else None


# Hardware counters ``--query-metrics`` lists by base name; the others (launch attributes, SASS
# instrumentation, derived ratios and throughputs) are always asked for, and left out only after
# ncu names them in an error (see :func:`rejected_metrics`).
_QUERIED = ("dram__bytes", "l1tex__t_", "lts__t_", "sm__cycles", "sm__warps", "smsp__inst_executed")


def select_metrics(requested: tuple[str, ...], known: set[str] | None) -> tuple[list[str], dict[str, str]]:
    """(metrics to ask for, metric -> why it is left out): the hardware counters whose base name
    ``known`` lacks are left out; the rest are always asked for."""
    if known is None:
        return list(requested), {}
    keep = [m for m in requested if not m.startswith(_QUERIED) or _base(m) in known]
    return keep, {m: "not listed by `ncu --query-metrics` for this GPU" for m in requested if m not in keep}


def rejected_metrics(output: str, metrics: list[str]) -> dict[str, str]:
    """metric -> ncu's error line, for each of ``metrics`` an ``==ERROR==`` line of ``output`` names."""
    errors = [line.strip() for line in output.splitlines() if "ERROR" in line]
    found = {}
    for metric in metrics:
        line = next((e for e in errors if re.search(rf"\b{re.escape(_base(metric))}\b", e)), None)
        if line:
            found[metric] = f"ncu rejected it: {line[:200]}"
    if OPCODES_METRIC in metrics and any("print-metric-instances" in e for e in errors):
        found.setdefault(OPCODES_METRIC, "this ncu has no --print-metric-instances")
    return found


def _run_ncu(ncu: str, problem: problems.Problem, shape: tuple[int, int], variants: list[str], peers: tuple[str, ...],
             metrics: list[str], timeout_s: float) -> tuple[list[dict], list, str, int | None]:
    """One ncu run of the child: (kernels, labels, ncu's output, exit status or None on timeout)."""
    with tempfile.TemporaryDirectory() as tmp:
        labels_path = Path(tmp) / "labels.json"
        instances = ["--print-metric-instances", "details"] if OPCODES_METRIC in metrics else []
        cmd = [ncu, "--clock-control", "none", "--profile-from-start", "off", "--csv", "--print-units", "base",
               *instances, "--metrics", ",".join(metrics),
               sys.executable, "-m", "losslab.measure.ncu", problem.name, "--shape", f"{shape[0]}x{shape[1]}",
               "--variants", ",".join(variants), "--peers", ",".join(peers), "--labels", str(labels_path)]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env, cwd=ROOT)
        except subprocess.TimeoutExpired:
            return [], [], "", None
        labels = json.loads(labels_path.read_text()) if labels_path.exists() else []
    return parse_ncu_csv(proc.stdout), labels, proc.stdout + "\n" + proc.stderr, proc.returncode


def _unreported(kernels: list[dict], metrics: list[str]) -> dict[str, str]:
    """metric -> reason, for each asked-for metric that no profiled kernel has a value of."""
    work = [k for k in kernels if MARKER_KERNEL not in k["name"]]
    out = {m: "ncu reported no value for it" for m in metrics
           if m != OPCODES_METRIC and all(k.get(m) is None for k in work)}
    if OPCODES_METRIC in metrics and not any(has_opcodes(k) for k in work):
        out[OPCODES_METRIC] = "ncu's output held no per-opcode instance values (barriers, shuffles unknown)"
    return out


def profile_problem(problem: problems.Problem, shape: tuple[int, int] | None = None, variants: list[str] | None = None,
                    peers: tuple[str, ...] = ("eager", "compile"), timeout_s: int = TIMEOUT_S,
                    evidence: bool = True) -> Profile:
    """Profile each implementation of ``problem`` once per direction under Nsight Compute.

    Args:
        shape: (rows, columns), float32; default the problem's seed size (use the bench's shape,
            so the roofline can pair measured and model points).
        variants: names as the records give them (default ``variants.recorded_variants``: the rungs, the
            teaching rungs, the public operator); ``peers``: PyTorch peers to profile too.
        timeout_s: for the whole profile, retries included.
        evidence: also the per-rung counters (:data:`EVIDENCE_METRICS`); else DRAM bytes and FP32
            instructions only (:data:`NCU_METRICS`, one replay pass per kernel).
    Returns a :class:`Profile`. Never raises for a missing or refusing ncu, nor for a metric it
    does not know (that one is listed in ``missing``). Up to three runs: a run that fails naming
    metrics is repeated without them; one that fails otherwise, with :data:`NCU_METRICS` only.

    A metric this ncu or GPU does not know is left out (by ``ncu --query-metrics``, or after ncu
    names it in an error), listed in ``Profile.missing`` with the reason, and its fields are None.
    Where ``ncu`` is missing, or refuses (no permission for the performance counters:
    ERR_NVGPUCTRPERM; a library it cannot load), ``status`` and ``message`` say so.
    """
    shape = tuple(shape or problem.sizes["seed"])
    variants = list(variants or (v if isinstance(v, str) else v.name for v in recorded_variants(problem)))
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()  # hand this process's cached blocks back: the child needs the memory
    sms = torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 0
    result = Profile(shape=list(shape), metrics=list(NCU_METRICS), multiprocessors=sms)
    ncu = find_ncu()
    if ncu is None:
        result.message = "ncu (Nsight Compute) is not on PATH: no measured-traffic points"
        return result
    version = subprocess.run([ncu, "--version"], capture_output=True, text=True)
    result.ncu_version = (version.stdout.strip().splitlines() or [""])[-1]
    metrics, missing = (select_metrics(NCU_METRICS + EVIDENCE_METRICS, known_metrics(ncu)) if evidence
                        else (list(NCU_METRICS), {}))
    left, records, output, status = float(timeout_s), [], "", 0
    for _ in range(3):
        began = _now()
        kernels, labels, output, status = _run_ncu(ncu, problem, shape, variants, peers, metrics, left)
        left -= _now() - began
        records = attribute(kernels, labels, sms)
        if any(r.launches for r in records) or status is None or left <= 0:
            break
        rejected = rejected_metrics(output, [m for m in metrics if m not in NCU_METRICS])
        extras = [m for m in metrics if m not in NCU_METRICS]
        if not rejected and extras and _diagnose(output, status)[0] == "failed":
            rejected = {m: f"ncu failed with the evidence metrics (exit status {status})" for m in extras}
        if not rejected:
            break
        missing.update(rejected)
        metrics = [m for m in metrics if m not in rejected]
    result.metrics, result.missing = metrics, missing
    if status is None:
        result.status, result.message = "failed", f"ncu did not finish within {timeout_s} s"
        return result
    if not any(r.launches for r in records):
        result.status, result.message = _diagnose(output, status)
        return result
    result.missing.update(_unreported(kernels, metrics))
    result.status, result.records = "ok", records
    result.message = (f"profiled {sum(r.launches for r in records)} kernel launches with {result.ncu_version}"
                      + (f"; {len(result.missing)} metric(s) missing" if result.missing else ""))
    return result


def _now() -> float:
    return time.monotonic()


def ncu_table_text(profile: Profile | dict) -> str:
    """Fixed-width text table of an ncu profile's DRAM traffic (or its status line)."""
    profile = Profile.from_dict(profile)
    if profile.status != "ok":
        return f"ncu: {profile.status}: {profile.message}"
    lines = [f"{'direction':<16} {'implementation':<14} {'launches':>8} {'DRAM read MB':>13} "
             f"{'DRAM write MB':>14} {'ncu ms':>8} {'FP32 GFLOP':>11}"]
    for r in sorted(profile.records, key=lambda r: r.direction):
        lines.append(f"{r.direction:<16} {r.implementation:<14} {r.launches:>8} "
                     f"{r.dram_bytes_read / 1e6:>13.1f} {r.dram_bytes_written / 1e6:>14.1f} "
                     f"{r.duration_ms:>8.3f} {r.fp32_flops / 1e9:>11.3f}")
    return "\n".join(lines)


def evidence_table_text(profile: Profile | dict) -> str:
    """Fixed-width text table of the per-rung counters (``-`` where ncu gave none), then the
    missing metrics with their reasons."""
    profile = Profile.from_dict(profile)
    if profile.status != "ok":
        return f"ncu: {profile.status}: {profile.message}"
    fmt = lambda v, spec: format(v, spec) if v is not None else "-"
    scaled = lambda v: v / 1e6 if v is not None else None
    lines = [f"{'direction':<16} {'implementation':<14} {'grid':>7} {'block':>5} {'act.SMs':>7} {'occ.%':>5} "
             f"{'ld req M':>9} {'sect/req':>8} {'BAR M':>7} {'SHFL M':>7} {'shared M':>8} {'inst/B':>7}  top stalls"]
    for r in sorted(profile.records, key=lambda r: (r.direction, r.kind != "variant")):
        stalls = ", ".join(f"{k} {v:.1f}" for k, v in r.top_stalls(2))
        lines.append(f"{r.direction:<16} {r.implementation:<14} {fmt(r.grid_size, '>7')} {fmt(r.block_size, '>5')} "
                     f"{fmt(r.active_sms, '>7.1f')} {fmt(r.achieved_occupancy_pct, '>5.0f')} "
                     f"{fmt(scaled(r.load_requests), '>9.2f')} {fmt(r.sectors_per_request, '>8.1f')} "
                     f"{fmt(scaled(r.barriers), '>7.2f')} {fmt(scaled(r.shuffles), '>7.2f')} "
                     f"{fmt(scaled(r.shared_instructions), '>8.2f')} {fmt(r.instructions_per_byte, '>7.3f')}  {stalls}")
    lines += [f"missing {m}: {why}" for m, why in profile.missing.items()]
    return "\n".join(lines)


def _profile_one(name: str, kind: str, fn, inputs: tuple, grad_loss, labels: list) -> None:
    """One implementation's forward, backward and forward+backward inside the profiled range, each
    after a marker (fused's backward alone only scales the gradient its forward wrote)."""
    predictions = inputs[0].detach().clone().requires_grad_(True)
    others = inputs[1:]
    # builds, compiles and autotunes outside the profiled range
    fn(predictions.detach(), *others)
    torch.autograd.grad(fn(predictions, *others), predictions, grad_loss)
    loss = fn(predictions, *others)  # a fresh graph: fused's backward runs once per forward
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for direction, call in (("forward", lambda: fn(predictions.detach(), *others)),
                            ("backward", lambda: torch.autograd.grad(loss, predictions, grad_loss)),
                            ("forward_backward",
                             lambda: torch.autograd.grad(fn(predictions, *others), predictions, grad_loss))):
        torch.cuda._sleep(0)
        call()
        labels.append({"implementation": name, "kind": kind, "direction": direction})
    torch.cuda._sleep(0)
    labels.append(None)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def _child(problem: problems.Problem, shape: tuple[int, int], variants: list[str], peers: tuple[str, ...],
           labels_path: Path) -> None:
    """Run under ncu: one launch per (implementation, direction), each after a marker kernel."""
    inputs = problem.make_inputs(shape, seed=0, device="cuda")
    grad_loss = torch.tensor(1.0, device="cuda")  # as in training and in bench.py
    labels: list[dict | None] = []
    for name, (kind, fn) in implementations(problem, variants, peers).items():
        _profile_one(name, kind, fn, inputs, grad_loss, labels)
    labels_path.write_text(json.dumps(labels))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="child process of profile_problem (run under ncu)")
    parser.add_argument("problem")
    parser.add_argument("--shape", required=True)
    parser.add_argument("--variants", required=True)
    parser.add_argument("--peers", default="")
    parser.add_argument("--labels", required=True)
    args = parser.parse_args(argv)
    rows, _, cols = args.shape.partition("x")
    _child(problems.get(args.problem), (int(rows), int(cols)), args.variants.split(","),
           tuple(p for p in args.peers.split(",") if p), Path(args.labels))


if __name__ == "__main__":
    main()
