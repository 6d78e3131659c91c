"""Time the vocabulary-parallel cross-entropy and its linear form against their peers on several
GPUs, and measure the collectives and the copy bandwidth the goal is computed from.

    torchrun --nproc-per-node=2 -m losslab.distributed.bench [--json PATH] [--record]

Rank 0 prints a table last and writes the JSON; ``--record`` also writes
``reports/results/vocab_parallel/<device slug>-x<world>.json`` (``record``).
"""
from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from losslab.distributed import algebra, kernels, record
from losslab.distributed.collectives import all_gather
from losslab.distributed.partition import VocabPartition
from losslab.distributed.peers import loss_parallel_forward_backward, megatron_style_cross_entropy
from losslab.distributed.vocab_parallel import vocab_parallel_cross_entropy
from losslab.distributed.vocab_parallel_linear import vocab_parallel_linear_cross_entropy
from losslab.linear_cross_entropy.bench import HEADS
from losslab.measure.timing import flush_buffer
from losslab.records.files import write_json

ROWS = 8192
VOCABS = (128256, 256000)
LINEAR_HEADS = ("llama-3-8b", "gemma-2-2b")  # the linear loss's heads, as losslab.linear_cross_entropy.bench's
GiB = 2**30
REPEATS = 20
WARMUP = 5
LATENCY_CALLS = 100
BANDWIDTH_BYTES = 256 * 2**20  # collectives' large message
COPY_BYTES = 2**30


def per_call_ms(fn: Callable[[], object], flush: torch.Tensor, repeats: int = REPEATS,
                setup: Callable[[], object] | None = None) -> float:
    """This rank's median GPU ms per call: a fixed number of warm-up calls (the same on every rank,
    so collectives pair up), then per call: synchronise, a barrier (the ranks start together),
    ``setup``, flush L2, CUDA events around ``fn`` alone."""
    for _ in range(WARMUP):
        setup and setup()
        fn()
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        dist.barrier()
        setup and setup()
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def back_to_back_ms(fn: Callable[[], object], calls: int = LATENCY_CALLS) -> float:
    """ms per call of ``calls`` calls queued back to back, one event pair around them all."""
    for _ in range(WARMUP):
        fn()
    torch.cuda.synchronize()
    dist.barrier()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / calls


def measure_collectives(world: int, flush: torch.Tensor) -> dict:
    """Latency (ms, 4 bytes per rank, back to back), the messages the losses exchange at ROWS rows,
    bus bandwidth (GB/s, a BANDWIDTH_BYTES message: all-reduce 2(W-1)/W x bytes / time, all-gather
    (W-1)/W x output bytes / time, after the NCCL tests' definition) and copy bandwidth (GB/s,
    2 x bytes / time of ``Tensor.copy_``)."""
    tiny = torch.ones(1, device="cuda")
    stats = torch.ones(ROWS, kernels.STATISTICS, device="cuda")
    rows = torch.ones(ROWS, device="cuda")
    big = torch.ones(BANDWIDTH_BYTES // 2, dtype=torch.bfloat16, device="cuda")
    piece = torch.ones(BANDWIDTH_BYTES // 2 // world, dtype=torch.bfloat16, device="cuda")
    source = torch.ones(COPY_BYTES // 4, device="cuda")
    dest = torch.empty_like(source)
    reduce_ms = per_call_ms(lambda: dist.all_reduce(big), flush, repeats=10)
    gather_ms = per_call_ms(lambda: all_gather(piece, world, None), flush, repeats=10)
    copy_ms = per_call_ms(lambda: dest.copy_(source), flush, repeats=10)

    def three_all_reduces():
        for _ in range(3):
            dist.all_reduce(rows)

    return {
        "all_gather_latency_ms": back_to_back_ms(lambda: all_gather(tiny, world, None)),
        "all_reduce_latency_ms": back_to_back_ms(lambda: dist.all_reduce(tiny)),
        "all_gather_statistics_ms": back_to_back_ms(lambda: all_gather(stats, world, None)),
        "three_all_reduces_ms": back_to_back_ms(three_all_reduces),
        "statistics_bytes_per_rank": stats.numel() * 4,
        "bandwidth_bytes": BANDWIDTH_BYTES,
        "all_reduce_bus_gbps": 2 * (world - 1) / world * BANDWIDTH_BYTES / reduce_ms / 1e6,
        "all_gather_bus_gbps": (world - 1) / world * BANDWIDTH_BYTES / gather_ms / 1e6,
        "copy_gbps": 2 * COPY_BYTES / copy_ms / 1e6,
    }


def measure_size(vocab: int, dtype: torch.dtype, world: int, rank: int, flush: torch.Tensor) -> dict:
    """Forward+backward ms per call of losslab and its peers at ROWS x ``vocab`` split evenly over
    the ranks (the last takes the remainder), and losslab's phases on this rank."""
    widths = even_widths(vocab, world)
    partition = VocabPartition(widths, rank)
    g = torch.Generator(device="cuda").manual_seed(0)
    full = torch.randn(ROWS, vocab, generator=g, device="cuda").mul_(4).to(dtype)
    target = torch.randint(0, vocab, (ROWS,), generator=g, device="cuda")
    local = full[:, partition.start:partition.start + partition.size].contiguous().requires_grad_()
    clear = lambda: setattr(local, "grad", None)  # noqa: E731
    mesh = DeviceMesh.from_group(dist.group.WORLD, "cuda")  # made once, as a training loop would
    ms = {
        "losslab": per_call_ms(lambda: vocab_parallel_cross_entropy(local, target, partition=partition).backward(),
                               flush, setup=clear),
        "megatron_style": per_call_ms(lambda: megatron_style_cross_entropy(local, target, partition).backward(),
                                      flush, setup=clear),
    }
    errors = {}
    try:  # torch's DTensor API moves between releases: a peer that cannot run is recorded as such
        ms["loss_parallel"] = per_call_ms(lambda: loss_parallel_forward_backward(local.detach(), target, partition,
                                                                                 mesh=mesh), flush)
    except Exception as err:  # every rank raises alike (same code, same inputs)
        ms["loss_parallel"] = None
        errors["loss_parallel"] = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    from losslab.nn.functional import cross_entropy  # the single-GPU floor, on the gathered logits

    whole = full.requires_grad_()
    ms["single_gpu_floor"] = per_call_ms(lambda: cross_entropy(whole, target).backward(), flush,
                                         setup=lambda: setattr(whole, "grad", None))
    stats = kernels.statistics(local.detach(), target, partition.start)
    gathered = all_gather(stats, world, None)
    row_max, row_log_sum = kernels.combine(gathered, target, vocab, -100, 0.0)[:2]
    weight = torch.full((ROWS,), 1 / ROWS, device="cuda")
    one = torch.ones((), dtype=dtype, device="cuda")

    def combine():
        _, _, losses, kept = kernels.combine(gathered, target, vocab, -100, 0.0)
        return algebra.reduce(losses, kept, target, -100, "mean")

    phases = {
        "statistics": per_call_ms(lambda: kernels.statistics(local.detach(), target, partition.start), flush),
        "all_gather": per_call_ms(lambda: all_gather(stats, world, None), flush),
        "combine": per_call_ms(combine, flush),
        "gradient": per_call_ms(lambda: kernels.gradient(local.detach(), target, row_max,
                                                         row_log_sum, weight, one, partition.start,
                                                         1.0, 0.0), flush),
    }
    return {"rows": ROWS, "vocab": vocab, "dtype": str(dtype).removeprefix("torch."), "widths": list(widths),
            "ms": ms, "phases_ms": phases, "errors": errors}


def even_widths(vocab: int, world: int) -> tuple[int, ...]:
    """The vocabulary split evenly over ``world`` ranks, the last taking the remainder."""
    return tuple(vocab // world + (vocab % world if r == world - 1 else 0) for r in range(world))


def extra_gib(fn: Callable[[], object]) -> float:
    """GiB allocated at the peak of one call of ``fn`` beyond what was allocated before it (the
    inputs): the gradients it leaves and what it holds while it runs."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / GiB


def measure_linear(name: str, world: int, rank: int, flush: torch.Tensor) -> dict:
    """Forward+backward ms per call and extra GiB of the linear loss at one of ``HEADS`` with its
    output layer split evenly over the ranks (with its default chunks, and in four chunks), against:
    this rank's logits slice made whole by one
    GEMM, then losslab's vocab_parallel_cross_entropy or the Megatron-style loss, and the three
    GEMMs alone (logits, the input's and the weight's gradients: the time floor). Every variant
    ends with the all-reduce of the input's gradient, as a tensor-parallel layer does."""
    head = HEADS[name]
    widths = even_widths(head.vocab, world)
    partition = VocabPartition(widths, rank)
    g = torch.Generator(device="cuda").manual_seed(0)
    dtype = head.dtype
    x = torch.randn(head.tokens, head.hidden, generator=g, device="cuda").to(dtype).requires_grad_()
    w = (torch.randn(partition.size, head.hidden, generator=g, device="cuda") / head.hidden ** 0.5).to(
        dtype).requires_grad_()
    target = torch.randint(0, head.vocab, (head.tokens,), generator=g, device="cuda")

    def clear():
        x.grad = w.grad = None

    def losslab(chunk_rows=None):
        return lambda: vocab_parallel_linear_cross_entropy(x, w, target, partition=partition,
                                                           chunk_rows=chunk_rows).backward()

    def logits_then(loss_fn):
        def step():
            loss_fn(x @ w.t(), target, partition=partition).backward()
            dist.all_reduce(x.grad)
        return step

    def gemms():
        with torch.no_grad():
            logits = x @ w.t()
            grad_input = logits @ w
            logits.t() @ x
            dist.all_reduce(grad_input)

    megatron = lambda logits, t, partition: megatron_style_cross_entropy(logits, t, partition)  # noqa: E731
    variants = {"losslab": losslab(), "losslab_4_chunks": losslab(-(-head.tokens // 4)),
                "logits_then_losslab": logits_then(vocab_parallel_cross_entropy),
                "logits_then_megatron_style": logits_then(megatron), "gemms": gemms}
    ms, memory = {}, {}
    for key, fn in variants.items():
        clear()
        memory[key] = extra_gib(fn)
        ms[key] = per_call_ms(fn, flush, setup=clear)
    floor_gib = (x.numel() + w.numel()) * x.element_size() / GiB  # the two gradients
    return {"head": head.label, "rows": head.tokens, "hidden": head.hidden, "vocab": head.vocab,
            "dtype": str(dtype).removeprefix("torch."), "widths": list(widths), "ms": ms, "extra_gib": memory,
            "gradients_gib": floor_gib}


def goal(size: dict, collectives: dict, element_bytes: int) -> dict:
    """The issue's goal at one size: read the widest local slice twice and write its gradient once at
    the measured copy bandwidth, plus one all-gather's latency (the 4-byte message), in ms."""
    nbytes = 3 * size["rows"] * max(size["widths"]) * element_bytes
    model_ms = nbytes / collectives["copy_gbps"] / 1e6 + collectives["all_gather_latency_ms"]
    return {"bytes": nbytes, "model_ms": model_ms, "limit_ms": record.GOAL_FACTOR * model_ms}


def slowest(per_rank: list[dict], key: str) -> dict:
    """Each entry of ``per_rank[r][key]`` as the largest over the ranks (a step waits for the slowest);
    None where a rank has None (a peer that could not run)."""
    values = {name: [r[key][name] for r in per_rank] for name in per_rank[0][key]}
    return {name: None if None in v else max(v) for name, v in values.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m losslab.distributed.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="where rank 0 writes the results (default: none)")
    parser.add_argument("--record", action="store_true", help="also write reports/results/vocab_parallel/...")
    parser.add_argument("--vocab", type=int, nargs="+", default=list(VOCABS), help="vocabulary sizes")
    parser.add_argument("--linear-heads", nargs="*", default=list(LINEAR_HEADS), choices=sorted(HEADS),
                        help="heads for the linear loss (default: %(default)s; none to skip it)")
    args = parser.parse_args(argv)
    if "LOCAL_RANK" not in os.environ or not torch.cuda.is_available():
        print("losslab.distributed.bench: launch it with torchrun on CUDA GPUs, e.g. "
              "torchrun --nproc-per-node=2 -m losslab.distributed.bench", file=sys.stderr)
        return 2
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    rank, world = dist.get_rank(), dist.get_world_size()
    flush = flush_buffer()
    dtype = torch.bfloat16
    collectives = measure_collectives(world, flush)
    sizes = [measure_size(v, dtype, world, rank, flush) for v in args.vocab]
    torch.cuda.empty_cache()
    linear = [measure_linear(name, world, rank, flush) for name in args.linear_heads]
    every = [None] * world
    dist.all_gather_object(every, {"collectives": collectives, "sizes": sizes, "linear": linear})
    dist.destroy_process_group()
    if rank != 0:
        return 0
    for i, size in enumerate(sizes):
        per_rank = [r["sizes"][i] for r in every]
        size.update(ms=slowest(per_rank, "ms"), phases_ms_per_rank=[r["phases_ms"] for r in per_rank])
        del size["phases_ms"]
    for i, head in enumerate(linear):
        per_rank = [r["linear"][i] for r in every]
        head.update(ms=slowest(per_rank, "ms"), extra_gib=slowest(per_rank, "extra_gib"))
    collectives = slowest(every, "collectives")
    collectives["copy_gbps"] = min(r["collectives"]["copy_gbps"] for r in every)
    for size in sizes:
        size["goal"] = goal(size, collectives, torch.finfo(dtype).bits // 8)
    data = {"device": torch.cuda.get_device_name(device), "world": world, "torch": torch.__version__,
            "cuda": torch.version.cuda, "nccl": ".".join(map(str, torch.cuda.nccl.version())),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "sources_sha256": record.sources_sha256(), "collectives": collectives, "sizes": sizes, "linear": linear,
            "protocol": f"median of {REPEATS} calls, each after a barrier and an L2 flush, CUDA events; "
                        f"latencies: {LATENCY_CALLS} calls back to back"}
    if args.json:
        write_json(args.json, data)
    if args.record:
        print(f"recorded {record.save(data)}")
    print(record.table(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
