"""The child process of ``losslab.kernelbench.evaluate``: loads one solution file and judges its ModelNew.

    python -m losslab.kernelbench.child CONFIG.json

Run only by ``evaluate.evaluate``, in a temporary working directory with its own
TORCH_EXTENSIONS_DIR. THIS PROCESS RUNS THE SOLUTION'S CODE. It writes its findings to
``config["result"]`` as JSON after every stage, so that the parent knows how far it got
if the solution hangs or kills the process.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
import traceback
from pathlib import Path

import torch
import torch.nn as nn

from losslab import problems
from losslab.measure.bench import peak_extra_memory, time_cuda
from losslab.measure.check import GRAD_LOSS, TOLERANCES, relative_error

# KernelBench's torch.allclose tolerances (atol = rtol) per output dtype
ALLCLOSE_TOL = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 1e-2}
BUILD_FAILURE_SIGNS = ("Error building extension", "undefined symbol", "error: ")


class Reference(nn.Module):
    """KernelBench's ``Model`` for a losslab problem: forward is the problem's reference."""

    def __init__(self, problem: problems.Problem):
        super().__init__()
        self.problem = problem

    def forward(self, *inputs):
        return self.problem.reference(*inputs)


class Stop(Exception):
    """Ends the evaluation with ``status`` and ``message`` (and optional ``detail``)."""

    def __init__(self, status: str, message: str, detail: str = ""):
        super().__init__(message)
        self.status, self.message, self.detail = status, message, detail


def _describe(values) -> list[str]:
    return [f"{tuple(v.shape)} {str(v.dtype).removeprefix('torch.')}" if isinstance(v, torch.Tensor) else repr(v)[:80] for v in values]


def _is_cuda_error(err: BaseException) -> bool:
    return isinstance(err, getattr(torch, "AcceleratorError", ())) or "CUDA error" in str(err)


def _failure(stage: str, err: BaseException) -> Stop:
    """What an exception raised by the solution means for the verdict."""
    text = "".join(traceback.format_exception(err))
    if stage in ("load", "construct") and any(sign in str(err) for sign in BUILD_FAILURE_SIGNS):
        # the compiler's lines, without ninja's long command lines; paths shortened to the file name
        text = re.sub(r"^(Error building extension '[^']*'):.*$", r"\1:", str(err), count=1, flags=re.M)
        lines = [re.sub(r"\S*/(?=[^/\s]+\(\d+\))", "", line) for line in text.splitlines()
                 if "-DTORCH_EXTENSION_NAME=" not in line and not line.startswith("FAILED:")]
        first = next((l.strip() for l in lines if re.search(r"\berror\b", l)), lines[0] if lines else "")
        return Stop("compile_error", first[:300], "\n".join(lines)[:8000])
    if _is_cuda_error(err):
        return Stop("crashed", f"a CUDA error in {stage}: {str(err).splitlines()[0][:300]}", text[-8000:])
    return Stop("raised", f"{type(err).__name__} in {stage}: {str(err).splitlines()[0][:300] if str(err) else ''}",
                text[-8000:])


def _bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and a.cpu().numpy().tobytes() == b.cpu().numpy().tobytes()


def run(config: dict) -> dict:
    result: dict = {"status": "running", "stage": "start", "message": "", "detail": ""}
    out_path = Path(config["result"])

    def save(stage: str | None = None) -> None:
        if stage:
            result["stage"] = stage
        tmp = out_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(result, default=str))
        os.replace(tmp, out_path)

    device = config.get("device", "cuda")

    def call(stage, fn, *args):
        try:
            value = fn(*args)
            if device == "cuda":
                torch.cuda.synchronize()
            return value
        except Exception as err:  # noqa: BLE001 - the solution may raise anything
            raise _failure(stage, err) from err

    try:
        if device == "cuda" and not torch.cuda.is_available():
            raise Stop("no_gpu", "no CUDA GPU visible to the evaluating process")
        spec = problems.get(config["problem"])
        shape = tuple(config["shape"])
        dtype = getattr(torch, config["dtype"])
        result.update(device=torch.cuda.get_device_name() if device == "cuda" else "cpu (no timing, no memory)")
        save("load")

        module_spec = importlib.util.spec_from_file_location("solution", config["solution"])
        solution = importlib.util.module_from_spec(module_spec)
        sys.modules["solution"] = solution
        call("load", module_spec.loader.exec_module, solution)
        if not isinstance(getattr(solution, "ModelNew", None), type):
            raise Stop("raised", "the file defines no class ModelNew")
        own = {}
        for name in ("get_inputs", "get_init_inputs"):  # reported, not used: the problem's inputs are
            fn = getattr(solution, name, None)
            try:
                own[name] = _describe(fn()) if callable(fn) else None
            except Exception as err:  # noqa: BLE001
                own[name] = f"raised {type(err).__name__}: {err}"[:300]
        result["solution_inputs"] = own
        save("construct")
        model = call("construct", lambda: solution.ModelNew().to(device).eval())
        reference = Reference(spec).to(device).eval()

        save("correctness")
        tol = ALLCLOSE_TOL[dtype]
        result["trials"] = trials = []
        for trial in range(config["trials"]):
            seed = config["seed"] + trial
            inputs = spec.make_inputs(shape, seed=seed, device=device, dtype=dtype)
            with torch.no_grad():
                expected = reference(*inputs)
                got = call("forward", model, *inputs)
            record = {"trial": trial, "seed": seed}
            trials.append(record)
            if not isinstance(got, torch.Tensor):
                raise Stop("wrong_shape", f"trial {trial}: forward returned {type(got).__name__}, expected a tensor "
                           f"of shape {tuple(expected.shape)}")
            record.update(shape=list(got.shape), dtype=str(got.dtype).removeprefix("torch."))
            if got.shape != expected.shape:
                raise Stop("wrong_shape", f"trial {trial}: output shape {tuple(got.shape)}, reference "
                           f"{tuple(expected.shape)}")
            loss64, _ = spec.reference_float64(*inputs)
            got_cmp = got.detach().to(expected.dtype)
            record.update(
                value=got_cmp.double().flatten()[:1].item(), reference=expected.double().flatten()[:1].item(),
                max_abs_diff=(got_cmp.double() - expected.double()).abs().max().item(),
                allclose=bool(torch.allclose(got_cmp, expected, atol=tol, rtol=tol)),
                rel_error_fp64=relative_error(got_cmp, loss64)[0])
            save()
            if not record["allclose"]:
                raise Stop("wrong_values", f"trial {trial} (seed {seed}): got {record['value']:.8g}, reference "
                           f"{record['reference']:.8g}; |diff| {record['max_abs_diff']:.3g} exceeds "
                           f"atol + rtol * |reference| with atol = rtol = {tol:g}")

        save("backward")
        inputs = spec.make_inputs(shape, seed=config["seed"] + config["trials"], device=device, dtype=dtype)
        predictions = inputs[0].detach().clone().requires_grad_(True)
        loss = call("backward", model, predictions, *inputs[1:])
        backward = {"supported": bool(isinstance(loss, torch.Tensor) and loss.requires_grad)}
        result["backward"] = backward
        if backward["supported"]:
            call("backward", lambda: loss.backward(torch.tensor(GRAD_LOSS, device=device, dtype=loss.dtype)))
            _, grad64 = spec.reference_float64(*inputs)
            if predictions.grad is None or predictions.grad.shape != predictions.shape:
                backward.update(passed=False, detail="no gradient of predictions' shape")
            else:
                error, found = relative_error(predictions.grad, grad64 * GRAD_LOSS)
                tolerance = TOLERANCES[dtype][1]
                backward.update(rel_error=error, tolerance=tolerance, passed=error <= tolerance and not found,
                                detail=found)
            if not backward["passed"]:
                raise Stop("wrong_values", f"backward: gradient relative error {backward.get('rel_error', 'n/a')} "
                           f"against float64 exceeds {TOLERANCES[dtype][1]:g} {backward['detail']}".strip())
        del loss, predictions

        save("repeatability")
        inputs = spec.make_inputs(shape, seed=config["seed"], device=device, dtype=dtype)
        with torch.no_grad():
            runs = [call("forward", model, *inputs) for _ in range(3)]
        result["repeatable"] = all(_bitwise_equal(runs[0], r) for r in runs[1:])

        if device != "cuda":  # a dry run of the protocol (tests of the evaluator): nothing to measure
            result["status"] = "passed"
            save("done")
            return result
        save("memory")
        with torch.no_grad():
            result["memory"] = {"solution_bytes": call("forward", peak_extra_memory, lambda: model(*inputs)),
                                "eager_bytes": peak_extra_memory(lambda: reference(*inputs))}

        save("timing")
        timing = {}
        with torch.no_grad():
            flush = torch.empty(config["flush_bytes"] // 4, device="cuda")
            peers = {"solution": model, "eager": reference}
            if config["compile"]:
                try:
                    compiled = torch.compile(reference)
                    compiled(*inputs)
                    peers["compile"] = compiled
                except Exception as err:  # noqa: BLE001 - a peer failing is reported, not fatal
                    timing["compile_error"] = f"{type(err).__name__}: {err}"[:300]
            for name, fn in peers.items():
                t = call("timing", time_cuda, lambda fn=fn: fn(*inputs), config["repeats"], 3, flush)
                timing[f"{name}_ms"], timing[f"{name}_p10_ms"], timing[f"{name}_p90_ms"] = (
                    t.median_ms, t.p10_ms, t.p90_ms)
        for name in ("eager", "compile"):
            if f"{name}_ms" in timing:
                timing[f"speedup_{name}"] = timing[f"{name}_ms"] / timing["solution_ms"]
        timing["repeats"] = config["repeats"]
        result["timing"] = timing
        result["status"] = "passed"
        save("done")
    except Stop as stop:
        result.update(status=stop.status, message=stop.message, detail=stop.detail)
        save()
    return result


def main(argv: list[str]) -> int:
    config = json.loads(Path(argv[0]).read_text())
    run(config)
    sys.stdout.flush()
    # Leave without running the solution's atexit hooks or destructors: the parent has the JSON.
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
