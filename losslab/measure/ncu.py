"""Measured traffic with Nsight Compute: DRAM bytes, duration and FP32 instruction counts.

``profile_problem`` runs a child Python process under ``ncu`` that launches
each implementation's forward and backward once, at the bench's shape, then
parses ncu's CSV and sums the metrics of each (implementation, direction).

Attribution: the child launches a one-thread marker kernel (``torch.cuda._sleep(0)``,
whose kernel is ATen's ``spin_kernel``) before each (implementation, direction)
and writes the list of labels in launch order to a file; every kernel between
two markers belongs to the label of the first. Only the profiled range
(``cudaProfilerStart``/``Stop``, after a warm-up that builds and compiles
everything) is measured.

Where ``ncu`` is missing, or refuses (no permission for the performance
counters: ERR_NVGPUCTRPERM; a library it cannot load), the result says so in
``status`` and ``message`` and nothing raises.
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from losslab import build, problems
from losslab.build import ROOT
from losslab.measure.bench import implementations

NCU_METRICS = (
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "gpu__time_duration.sum",
    "smsp__sass_thread_inst_executed_op_fadd_pred_on.sum",
    "smsp__sass_thread_inst_executed_op_fmul_pred_on.sum",
    "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum",
)
MARKER_KERNEL = "spin_kernel"
TIMEOUT_S = 420
_SCALE = {"": 1, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
_TIME_NS = {"nsecond": 1, "ns": 1, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6, "second": 1e9, "s": 1e9}


def find_ncu() -> str | None:
    """Path of ``ncu`` (Nsight Compute's command line) on PATH or in the CUDA toolkit, or None."""
    found = shutil.which("ncu")
    if found:
        return found
    try:
        candidate = build.find_cuda_home() / "bin" / "ncu"
    except build.BuildError:  # no toolkit either
        return None
    return str(candidate) if candidate.is_file() else None


def _to_base(value: str, unit: str) -> float:
    """A metric value in base units: bytes, nanoseconds or a plain count."""
    number = float(value.replace(",", "")) if value.strip() not in ("", "n/a") else 0.0
    unit = unit.strip()
    if unit in _TIME_NS:
        return number * _TIME_NS[unit]
    for suffix in ("byte", "B"):
        if unit.endswith(suffix):
            return number * _SCALE.get(unit[: -len(suffix)], 1)
    return number  # "inst", "" and other plain counts


def parse_ncu_csv(text: str) -> list[dict]:
    """Per-kernel metrics from ``ncu --csv`` output (its "details" page, one row per metric).

    Lines that are not CSV (``==PROF==`` messages, the program's own output)
    are skipped. Returns one dict per profiled kernel in launch order:
    ``id``, ``name`` and each metric name -> value in base units (bytes, ns, counts).
    """
    lines = [line for line in text.splitlines() if line.startswith('"')]
    if not lines:
        return []
    kernels: dict[int, dict] = {}
    for row in csv.DictReader(io.StringIO("\n".join(lines))):
        if "Metric Name" not in row or not (row.get("ID") or "").strip().isdigit():
            continue
        kernel = kernels.setdefault(int(row["ID"]), {"id": int(row["ID"]), "name": row["Kernel Name"]})
        kernel[row["Metric Name"]] = _to_base(row["Metric Value"], row.get("Metric Unit", ""))
    return [kernels[k] for k in sorted(kernels)]


def attribute(kernels: list[dict], labels: list[dict | None]) -> list[dict]:
    """Sum the kernels between consecutive marker kernels into one record per label.

    ``labels[i]`` (implementation, kind, direction) names the kernels after the
    i-th marker; a None label discards its kernels. Each record has
    ``dram_bytes_read``/``dram_bytes_written`` (bytes), ``duration_ms``, the
    ``fadd``/``fmul``/``ffma`` thread-instruction counts, ``fp32_flops``
    (fadd + fmul + 2 ffma), ``launches`` and the kernel names.
    """
    records, index, current = [], -1, None
    for kernel in kernels:
        if MARKER_KERNEL in kernel["name"]:
            index += 1
            current = None
            if index < len(labels) and labels[index] is not None:
                current = {**labels[index], "kernels": [], "launches": 0, "dram_bytes_read": 0.0,
                           "dram_bytes_written": 0.0, "duration_ms": 0.0, "fadd": 0.0, "fmul": 0.0, "ffma": 0.0}
                records.append(current)
            continue
        if current is None:
            continue
        current["launches"] += 1
        if kernel["name"] not in current["kernels"]:
            current["kernels"].append(kernel["name"])
        current["dram_bytes_read"] += kernel.get("dram__bytes_read.sum", 0.0)
        current["dram_bytes_written"] += kernel.get("dram__bytes_write.sum", 0.0)
        current["duration_ms"] += kernel.get("gpu__time_duration.sum", 0.0) / 1e6
        for op in ("fadd", "fmul", "ffma"):
            current[op] += kernel.get(f"smsp__sass_thread_inst_executed_op_{op}_pred_on.sum", 0.0)
    for record in records:
        record["fp32_flops"] = record["fadd"] + record["fmul"] + 2 * record["ffma"]
    return records


def _diagnose(output: str, returncode: int) -> tuple[str, str]:
    """(status, message) for an ncu run that produced no usable rows."""
    if "ERR_NVGPUCTRPERM" in output:
        return "refused", ("ncu may not read the GPU performance counters here (ERR_NVGPUCTRPERM): run as "
                           "root or with the driver option NVreg_RestrictProfilingToAdminUsers=0")
    if "LibraryNotLoaded" in output or "LIBRARY_NOT_LOADED" in output:
        return "refused", "ncu could not load a library it needs (LibraryNotLoaded); check the Nsight Compute install"
    tail = "\n".join(output.strip().splitlines()[-12:])
    return "failed", f"ncu exited with status {returncode} and profiled no kernels; its last lines:\n{tail}"


def profile_problem(problem: str, shape: tuple[int, int] | None = None, variants: list[str] | None = None,
                    peers: tuple[str, ...] = ("eager", "compile"), timeout_s: int = TIMEOUT_S) -> dict:
    """Profile each implementation of ``problem`` once per direction under Nsight Compute.

    Args:
        shape: (rows, columns); default the problem's seed size (use the bench's shape,
            so the roofline can pair measured and model points).
        variants: default the whole ladder; ``peers``: PyTorch peers to profile too.
    Returns a dict: ``status`` ("ok", "unavailable", "refused" or "failed"),
    ``message``, ``shape``, ``metrics``, ``ncu_version`` and ``records`` (see
    :func:`attribute`). Never raises for a missing or refusing ncu.
    """
    spec = problems.get(problem)
    shape = tuple(shape or spec.sizes["seed"])
    variants = list(variants or spec.variants)
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()  # hand this process's cached blocks back: the child needs the memory
    result = {"status": "unavailable", "message": "", "shape": list(shape), "metrics": list(NCU_METRICS),
              "ncu_version": None, "records": []}
    ncu = find_ncu()
    if ncu is None:
        result["message"] = "ncu (Nsight Compute) is not on PATH: no measured-traffic points"
        return result
    version = subprocess.run([ncu, "--version"], capture_output=True, text=True)
    result["ncu_version"] = (version.stdout.strip().splitlines() or [""])[-1]
    with tempfile.TemporaryDirectory() as tmp:
        labels_path = Path(tmp) / "labels.json"
        cmd = [ncu, "--clock-control", "none", "--profile-from-start", "off", "--csv", "--print-units", "base",
               "--metrics", ",".join(NCU_METRICS),
               sys.executable, "-m", "losslab.measure.ncu", problem, "--shape", f"{shape[0]}x{shape[1]}",
               "--variants", ",".join(variants), "--peers", ",".join(peers), "--labels", str(labels_path)]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env, cwd=ROOT)
        except subprocess.TimeoutExpired:
            result.update(status="failed", message=f"ncu did not finish within {timeout_s} s")
            return result
        output = proc.stdout + "\n" + proc.stderr
        kernels = parse_ncu_csv(proc.stdout)
        labels = json.loads(labels_path.read_text()) if labels_path.exists() else []
    records = attribute(kernels, labels)
    if not records or not any(r["launches"] for r in records):
        result["status"], result["message"] = _diagnose(output, proc.returncode)
        return result
    result.update(status="ok", message=f"profiled {sum(r['launches'] for r in records)} kernel launches "
                                       f"with {result['ncu_version']}", records=records)
    return result


def ncu_table_text(profile: dict) -> str:
    """Fixed-width text table of an ncu profile (or its status line)."""
    if profile.get("status") != "ok":
        return f"ncu: {profile.get('status')}: {profile.get('message')}"
    lines = [f"{'direction':<10} {'implementation':<14} {'launches':>8} {'DRAM read MB':>13} "
             f"{'DRAM write MB':>14} {'ncu ms':>8} {'FP32 GFLOP':>11}"]
    for r in sorted(profile["records"], key=lambda r: r["direction"]):
        lines.append(f"{r['direction']:<10} {r['implementation']:<14} {r['launches']:>8} "
                     f"{r['dram_bytes_read'] / 1e6:>13.1f} {r['dram_bytes_written'] / 1e6:>14.1f} "
                     f"{r['duration_ms']:>8.3f} {r['fp32_flops'] / 1e9:>11.3f}")
    return "\n".join(lines)


def _profile_one(name: str, kind: str, fn, inputs: tuple, grad_loss, labels: list) -> None:
    """One implementation's forward and backward inside the profiled range, each after a marker."""
    predictions = inputs[0].detach().clone().requires_grad_(True)
    others = inputs[1:]
    # builds, compiles and autotunes outside the profiled range
    fn(predictions.detach(), *others)
    torch.autograd.grad(fn(predictions, *others), predictions, grad_loss)
    loss = fn(predictions, *others)  # a fresh graph: fused's backward runs once per forward
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for direction, call in (("forward", lambda: fn(predictions.detach(), *others)),
                            ("backward", lambda: torch.autograd.grad(loss, predictions, grad_loss))):
        torch.cuda._sleep(0)
        call()
        labels.append({"implementation": name, "kind": kind, "direction": direction})
    torch.cuda._sleep(0)
    labels.append(None)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def _child(problem: str, shape: tuple[int, int], variants: list[str], peers: tuple[str, ...],
           labels_path: Path) -> None:
    """Run under ncu: one launch per (implementation, direction), each after a marker kernel."""
    inputs = problems.get(problem).make_inputs(shape, seed=0, device="cuda")
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
    _child(args.problem, (int(rows), int(cols)), args.variants.split(","),
           tuple(p for p in args.peers.split(",") if p), Path(args.labels))


if __name__ == "__main__":
    main()
