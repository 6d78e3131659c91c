"""One GPU run for cross_entropy's cluster rung: correctness against float64, then fused
against cluster, forward + backward, at the long-row sizes (about 2 minutes on an H100).

    TORCH_EXTENSIONS_DIR=/tmp/ext-trial python scripts/cluster_trial.py [--quick]

Prints, per check, the cluster plan (CTAs per row, bytes a CTA holds, or why fused runs
instead) and the relative errors; per timing, the median ms per call (L2 flushed), GB/s of
the read-once/write-once minimum (read the logits, write the gradient) and its fraction of
the measured copy bandwidth. The tuning sweep times the cluster rung at other
(max cluster, target slice, clusters launched) settings (cluster_tune). Exits 1 if a check fails.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's losslab, installed or not
import losslab  # noqa: E402
from losslab import build, problems  # noqa: E402
from losslab.measure import check  # noqa: E402
from losslab.measure.ceilings import measure_bandwidth  # noqa: E402
from losslab.measure.timing import flush_buffer, time_cuda  # noqa: E402
from losslab.problems import misaligned_view  # noqa: E402
from losslab.problems.cross_entropy import cluster_plan  # noqa: E402

SPEC = problems.get("cross_entropy")
DEFAULT_TUNING = (0, 0, 0)  # cluster_tune's: cluster.cu's defaults (clusters of up to 8, 64 KiB slices, its rule)
PER_ROW = 1 << 40  # as many clusters as rows: one each
SWEEP = ((8, 64 * 1024, PER_ROW), (16, 64 * 1024, 0), (8, 32 * 1024, 0))
TIMED = [((4096, 131072), torch.float32), ((2048, 262144), torch.float32),
         ((4096, 131072), torch.bfloat16), ((2048, 262144), torch.bfloat16)]


def plan_text(x: torch.Tensor) -> str:
    ctas, slice_bytes, why = cluster_plan(x)
    return f"fused: {why}" if why else f"{ctas} CTAs x {slice_bytes / 1024:.1f} KiB"


def run_checks(ext) -> bool:
    ok = True

    def report(case: str, inputs: tuple[torch.Tensor, ...]) -> None:
        nonlocal ok
        results = check.check_inputs(SPEC, "cluster", inputs, case)
        ok &= all(r.passed for r in results)
        errors = "  ".join(f"{r.direction} {r.error:.1e}{'' if r.passed else ' FAIL ' + r.detail}" for r in results)
        print(f"  {case:<44} {plan_text(inputs[0]):<34} {errors}", flush=True)

    print("checks against float64 (cluster rung):")
    for shape, dtype in [((64, 131072), torch.float32), ((64, 131072), torch.bfloat16), ((4, 100003), torch.float32),
                         ((4, 100003), torch.bfloat16), ((4, 100003), torch.float16), ((3, 262144), torch.float32),
                         ((64, 262144), torch.float32), ((257, 4099), torch.float32), ((128, 4096), torch.float32)]:
        x, t = SPEC.make_inputs(shape, seed=1, dtype=dtype)
        report(f"{shape[0]}x{shape[1]} {str(dtype)[6:]}", (x, t))
    # the edge cases on rows the cluster splits (8 CTAs of 4 KiB: small slices on purpose; two
    # clusters, so each takes several rows); an out-of-range target is tests/test_cross_entropy.py's
    # (the float64 reference would assert)
    ext.cluster_tune(8, 4096, 2)
    try:
        cases = check.cluster_edge_cases()
        wide = SPEC.make_inputs((13, 40004), seed=3)[0]
        cases["16-byte misaligned logits (fallback)"] = (misaligned_view(wide, 12, 40003),
                                                         cases["NaN in two logits"][1])
        for case, inputs in cases.items():
            report(case, inputs)
    finally:
        ext.cluster_tune(*DEFAULT_TUNING)
    return ok


def forward_backward_ms(rung: str, x: torch.Tensor, t: torch.Tensor, flush: torch.Tensor) -> float:
    """Median ms of one forward and backward of ``rung`` (grad_loss 1), L2 flushed before each."""
    fn, ones = losslab.variant("cross_entropy", rung), torch.ones((), device=x.device)
    return time_cuda(lambda: torch.autograd.grad(fn(x, t), x, ones), repeats=10, flush=flush,
                     back_to_back=False).median_ms


def run_timings(ext, sweep) -> None:
    bandwidth = measure_bandwidth()["copy"]
    print(f"\nforward + backward (grad_loss 1), median ms per call, L2 flushed; copy bandwidth {bandwidth:.0f} GB/s")
    flush = flush_buffer()
    for shape, dtype in TIMED:
        x, t = SPEC.make_inputs(shape, seed=0, dtype=dtype)
        x.requires_grad_(True)
        nbytes = 2 * x.numel() * x.element_size()  # read the logits once, write the gradient once
        settings = [("fused", None), ("cluster", DEFAULT_TUNING)] + [("cluster", s) for s in sweep]
        for rung, tuning in settings:
            if tuning:
                ext.cluster_tune(*tuning)
            ms = forward_backward_ms(rung, x, t, flush)
            label = (rung if tuning is None else "cluster (defaults)" if tuning == DEFAULT_TUNING
                     else f"cluster max {tuning[0]}, {tuning[1] // 1024} KiB"
                     + (", one per row" if tuning[2] == PER_ROW else ""))
            plan = "" if tuning is None else plan_text(x.detach())
            print(f"  {shape[0]}x{shape[1]} {str(dtype)[6:]:<9} {label:<26} {ms:7.3f} ms "
                  f"{nbytes / ms / 1e6:6.0f} GB/s {nbytes / ms / 1e6 / bandwidth:6.1%}  {plan}", flush=True)
        ext.cluster_tune(*DEFAULT_TUNING)


def tuning_arg(text: str) -> tuple[int, int, int]:
    """``--tuning``'s value: three integers, cluster_tune's arguments."""
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        values = ()
    if len(values) != 3:
        raise argparse.ArgumentTypeError(f"expected three integers MAX,SLICE_BYTES,CLUSTERS, got {text!r}")
    return values


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="time the default tuning only")
    parser.add_argument("--tuning", action="append", metavar="MAX,SLICE_BYTES,CLUSTERS", type=tuning_arg,
                        help="time this cluster_tune setting instead of the built-in sweep (repeatable)")
    args = parser.parse_args()
    print(f"device: {torch.cuda.get_device_name()} (sm_{''.join(map(str, torch.cuda.get_device_capability()))}), "
          f"torch {torch.__version__}, losslab from {losslab.__file__}", flush=True)
    ext = build.load_extension("cross_entropy")
    ok = run_checks(ext)
    run_timings(ext, [] if args.quick else args.tuning or SWEEP)
    print("\nchecks", "passed" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
