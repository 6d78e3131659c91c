"""``python -m losslab.linear_cross_entropy.bench [--heads ...] [--repeats N] [--record]``: forward+backward
time (median of CUDA-event-timed steps) and extra memory (peak allocated less the inputs) of losslab's
linear cross-entropy and its peers (:mod:`.peers`) on language-model heads, in one process on the same
inputs; the table and the goal lines last; ``--record`` writes the device's record (:mod:`.results`)."""
from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from datetime import datetime, timezone

import torch

from losslab.linear_cross_entropy import results
from losslab.linear_cross_entropy.options import Options, chunk_rows
from losslab.linear_cross_entropy.peers import LABELS, peers
from losslab.records.files import write_json


@dataclass(frozen=True)
class Head:
    label: str
    tokens: int
    hidden: int
    vocab: int
    dtype: torch.dtype = torch.bfloat16


HEADS = {
    "llama-3-8b": Head("Llama-3-8B", 8192, 4096, 128256),
    "gemma-2-2b": Head("Gemma-2-2B", 8192, 2304, 256000),
    "small": Head("small", 2048, 2048, 32000),
    "small-float32": Head("small", 2048, 2048, 32000, torch.float32),
    "huge": Head("huge vocabulary", 8192, 4096, 256000),
}


def inputs(head: Head, seed: int = 0):
    """Seeded (input (N, H), linear_weight (V, H), target (N,)) on the GPU, both floats requiring grad; a
    twentieth of the targets ignored (-100), as padding is."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(head.tokens, head.hidden, device="cuda", generator=g).to(head.dtype).requires_grad_()
    w = (torch.randn(head.vocab, head.hidden, device="cuda", generator=g) / head.hidden**0.5).to(head.dtype)
    t = torch.randint(0, head.vocab, (head.tokens,), device="cuda", generator=g)
    t[::20] = -100
    return x, w.requires_grad_(), t


def step(fn, x, w, t) -> None:
    x.grad = w.grad = None
    out = fn(x, w, t)
    if out is not None:
        out.backward()


def measure(fn, x, w, t, repeats: int) -> dict:
    """{median_ms, p10_ms, p90_ms, extra_bytes}: ``repeats`` steps timed by CUDA events after two warm-up
    steps, and the peak allocated during one step less what was allocated before it (the inputs)."""
    for _ in range(2):
        step(fn, x, w, t)
    torch.cuda.synchronize()
    x.grad = w.grad = None
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    step(fn, x, w, t)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step(fn, x, w, t)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return {"median_ms": statistics.median(times), "p10_ms": times[len(times) // 10],
            "p90_ms": times[-1 - len(times) // 10], "extra_bytes": extra}


def relative_error(got: torch.Tensor | None, want: torch.Tensor) -> float | None:
    return None if got is None else float((got.float() - want.float()).norm() / want.float().norm())


def bench_head(name: str, head: Head, fns: dict, repeats: int) -> dict:
    """One head's row of the record: each peer's measurement and gradient errors against eager, and the goals."""
    import torch._dynamo

    torch._dynamo.reset()  # torch.compile compiles once for this shape
    x, w, t = inputs(head)
    measured, reference, failed = {}, None, {}
    for peer, fn in fns.items():
        graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        try:
            m = measure(fn, x, w, t, repeats)
        except Exception as err:  # a peer that fails here (out of memory, its compiler) is reported, not fatal
            if peer.startswith("losslab") and not isinstance(err, torch.cuda.OutOfMemoryError):
                raise
            lines = str(err).strip().splitlines()
            failed[peer] = f"{type(err).__name__}: {lines[0] if lines else ''}"[:300]
            print(f"{LABELS[peer]}: not measured on {head.label}: {failed[peer]}")
            x.grad = w.grad = None
            torch.cuda.empty_cache()
            continue
        if peer == "gemms":
            m["extra_bytes"] = None  # not a loss: no gradients kept
        else:
            if peer == "eager":
                reference = (x.grad.clone(), w.grad.clone())
            if reference is not None:
                m["input_grad_error"] = relative_error(x.grad, reference[0])
                m["weight_grad_error"] = relative_error(w.grad, reference[1])
        if peer == "compile":
            m["graphs_compiled"] = torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs
        measured[peer] = m
        x.grad = w.grad = None
        print(f"  {head.label} {LABELS[peer]}: {results.cell(m)}", file=sys.stderr, flush=True)
    row = {"name": name, "label": head.label, "tokens": head.tokens, "hidden": head.hidden, "vocab": head.vocab,
           "dtype": str(head.dtype).removeprefix("torch."), "peers": measured, "failed": failed,
           "chunk_rows": chunk_rows(Options(), head.tokens, head.hidden, head.vocab, w.element_size())}
    ours, floor = measured.get("losslab"), measured.get("gemms")
    if ours and floor and ours.get("input_grad_error") is not None:
        limit = w.numel() * w.element_size() + results.EXTRA_BYTES_OVER_FLOOR
        errors = (ours["input_grad_error"], ours["weight_grad_error"])
        row["goals"] = {"time_ratio": ours["median_ms"] / floor["median_ms"],
                        "time_met": ours["median_ms"] <= results.TIME_LIMIT * floor["median_ms"],
                        "extra_bytes": ours["extra_bytes"], "memory_limit_bytes": limit,
                        "memory_met": ours["extra_bytes"] <= limit, "input_grad_error": errors[0],
                        "weight_grad_error": errors[1], "grad_errors_met": max(errors) <= results.GRAD_ERROR_LIMIT}
    return row


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m losslab.linear_cross_entropy.bench", description=__doc__)
    parser.add_argument("--heads", default=",".join(HEADS),
                        help=f"comma-separated heads (default all: {', '.join(HEADS)})")
    parser.add_argument("--repeats", type=int, default=10, help="timed steps per peer (default 10)")
    parser.add_argument("--record", action="store_true",
                        help="write reports/results/linear_cross_entropy/<device>.json")
    args = parser.parse_args(argv)
    args.heads = [h.strip() for h in args.heads.split(",") if h.strip()]
    unknown = [h for h in args.heads if h not in HEADS]
    if unknown or not args.heads:
        parser.error(f"--heads: expected some of {', '.join(HEADS)}, got {', '.join(unknown) or 'none'}")
    if args.repeats < 3:
        parser.error(f"--repeats: expected an int >= 3, got {args.repeats}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if not torch.cuda.is_available():
        print("losslab.linear_cross_entropy.bench: needs a CUDA GPU (torch.cuda.is_available() is False); "
              "notebook 08 shows the records", file=sys.stderr)
        return 1
    fns, missing = peers()
    for peer, why in missing.items():
        print(f"{LABELS[peer]}: not measured: {why}")
    device = torch.cuda.get_device_name()
    record = {"schema": results.SCHEMA, "device": device, "torch": torch.__version__, "cuda": torch.version.cuda,
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "repeats": args.repeats,
              "missing": missing, "heads": [bench_head(h, HEADS[h], fns, args.repeats) for h in args.heads]}
    if args.record:
        path = results.record_path(device)
        write_json(path, record)
        print(f"recorded: {path}")
    print(f"\n{device}, torch {torch.__version__}, forward+backward, median of {args.repeats}, "
          "time / extra memory (peak allocated less the inputs)")
    print("\n".join(results.error_lines(record) + results.goal_lines(record)))
    print(results.table(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
