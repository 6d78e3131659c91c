"""The evaluator's child process, piece by piece (losslab.kernelbench.child, clocks, failures), and what it talks
through (``channel``) and runs under (``supervisor``).

cpu tier: what a verbose build prints is captured, the first compiler error is found in
nvcc's and g++'s output, tensors of any dtype cross the channel bitwise and a forged message
is refused, a replaced function of torch or time is noticed, the back-to-back calls that the
parent's clock brackets synchronise after each call, the supervisor kills a process started in
a session of its own; compile tier: the same on a real nvcc failure;
gpu tier: timed calls see fresh inputs, and a stale answer in a timed call is caught.
"""
import os
import shutil
import subprocess
import sys
import time

import pytest
import torch

from losslab import problems
from losslab.kernelbench import channel, child, clocks, failures, supervisor

# nvcc's and ninja's output for a missing semicolon, as load_inline(verbose=True) prints it
# (recorded from CUDA 13.0, paths shortened; the command lines are cut)
NVCC_LOG = """\
[1/3] c++ -MMD -MF main.o.d -DTORCH_EXTENSION_NAME=kl_div -DTORCH_API_INCLUDE_EXTENSION_H -fPIC -c main.cpp
FAILED: cuda.cuda.o
/usr/local/cuda-13.0/bin/nvcc -MD -MF cuda.cuda.o.d -DTORCH_EXTENSION_NAME=kl_div -c cuda.cu -o cuda.cuda.o
/tmp/ext/kl_div/cuda.cu(6): error: expected a ";"
            void k(float* x) { x[0] = 1.0f }
                                           ^

1 error detected in the compilation of "/tmp/ext/kl_div/cuda.cu".
ninja: build stopped: subcommand failed.
"""
GCC_LOG = """\
FAILED: main.o
c++ -MMD -MF main.o.d -DTORCH_EXTENSION_NAME=kl_div -c /tmp/ext/kl_div/main.cpp -o main.o
/tmp/ext/kl_div/main.cpp:4:1: error: 'tensor' does not name a type
    4 | tensor f(torch::Tensor x);
      | ^~~~~~
ninja: build stopped: subcommand failed.
"""


def test_capture_stdout_takes_what_a_subprocess_writes_to_descriptor_1(capfd):
    """load_inline(verbose=True) runs ninja with stdout=1: the text never reaches sys.stdout."""
    captured = failures.Captured()
    with failures.capture_stdout(captured):
        subprocess.run([sys.executable, "-c", "print('from ninja')"], stdout=1, check=True)
        os.write(1, b"from this process\n")
    assert "from ninja" in captured.text and "from this process" in captured.text
    assert "from ninja" in capfd.readouterr().out  # passed on, not swallowed


def test_capture_stdout_fills_in_even_when_the_block_raises():
    captured = failures.Captured()
    with pytest.raises(RuntimeError), failures.capture_stdout(captured):
        subprocess.run([sys.executable, "-c", "print('compiler says no')"], stdout=1, check=True)
        raise RuntimeError("Error building extension 'kl_div'")
    assert "compiler says no" in captured.text


@pytest.mark.parametrize("log, message, code", [
    (NVCC_LOG, 'cuda.cu(6): error: expected a ";"', "void k(float* x) { x[0] = 1.0f }"),
    (GCC_LOG, "main.cpp:4:1: error: 'tensor' does not name a type", "tensor f(torch::Tensor x);"),
])
def test_compiler_error_is_the_first_diagnostic_with_its_line(log, message, code):
    found, detail = failures.compiler_error(log + "\nError building extension 'kl_div'")
    assert found.startswith(message) and code in found, found
    assert "-DTORCH_EXTENSION_NAME" not in detail and "/tmp/ext" not in found


def test_the_error_is_placed_in_the_solution_file():
    solution = 'import torch\nCUDA = r"""\n__global__\n    void k(float* x) { x[0] = 1.0f }\n"""\n'
    message, _ = failures.compiler_error(NVCC_LOG, solution)
    assert message.endswith("(at: void k(float* x) { x[0] = 1.0f }) [line 4 of the solution file]"), message
    message, _ = failures.compiler_error(NVCC_LOG, solution + solution)  # twice: no line is claimed
    assert "solution file" not in message


def test_a_build_failure_without_the_log_is_still_a_compile_error():
    stop = failures.failure("load", RuntimeError("Error building extension 'kl_div'"), NVCC_LOG)
    assert stop.status == "compile_error" and stop.message.startswith('cuda.cu(6): error: expected a ";"')
    stop = failures.failure("load", RuntimeError("Error building extension 'kl_div'"), "")
    assert stop.status == "compile_error" and "kl_div" in stop.message


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_tensors_of_any_dtype_cross_the_channel_bitwise(dtype):
    loss, grad = torch.tensor(1.5, dtype=dtype), torch.randn(3, 5).to(dtype).t()  # a 0-d and a transposed one
    read, write = os.pipe()
    try:
        channel.send(write, {"op": "reply", "changed": []}, [loss, grad, torch.arange(4)])
        header, (got_loss, got_grad, index) = channel.receive(read, time.monotonic() + 5, limit=1000)
    finally:
        os.close(read)
        os.close(write)
    assert header["op"] == "reply" and header["changed"] == []
    assert child.bitwise_equal(got_loss, loss) and child.bitwise_equal(got_grad, grad.contiguous())
    assert index.tolist() == [0, 1, 2, 3]
    assert not child.bitwise_equal(loss, loss + 1)
    assert not child.bitwise_equal(loss, loss.float() if dtype != torch.float32 else loss.double())


@pytest.mark.parametrize("written, error", [
    (b'{"status": "passed"}', "a header of"),  # a forged verdict, as a solution would write it
    (len(b"[1]").to_bytes(8, "little") + b"[1]", "malformed"),
    (len(b'{"tensors": [{"dtype": "float32", "shape": [100000]}]}').to_bytes(8, "little")
     + b'{"tensors": [{"dtype": "float32", "shape": [100000]}]}', "at most 1000 expected"),
])
def test_what_the_channel_never_writes_is_refused(written, error):
    read, write = os.pipe()
    try:
        os.write(write, written)
        with pytest.raises(channel.ChannelError, match=error):
            channel.receive(read, time.monotonic() + 5, limit=1000)
    finally:
        os.close(read)
        os.close(write)


def test_a_closed_or_silent_channel_is_told_apart():
    read, write = os.pipe()
    with pytest.raises(channel.ChannelTimeout):
        channel.receive(read, time.monotonic() + 0.2, limit=10)
    os.close(write)
    with pytest.raises(channel.ChannelClosed):
        channel.receive(read, time.monotonic() + 5, limit=10)
    os.close(read)


def test_a_replaced_function_is_noticed(monkeypatch):
    spec = type(problems.get("kl_div"))()  # a private instance: the test shadows its method
    before = child.watched(spec)
    assert child.replaced(before, spec) == []
    monkeypatch.setattr(torch.cuda.Event, "elapsed_time", lambda self, end: 1e-3)
    monkeypatch.setattr(time, "perf_counter", lambda: 0.0)
    monkeypatch.setattr(torch.nn.functional, "kl_div", lambda *a, **k: torch.tensor(0.0))
    monkeypatch.setattr(torch.Tensor, "log", lambda self: self)  # inherited from the C base class
    monkeypatch.setattr(problems.Problem, "reference_float64", lambda self, *inputs: None)  # the base class
    spec.reference = lambda *inputs: torch.tensor(0.0)
    assert child.replaced(before, spec) == ["problem.reference", "problem.reference_float64", "time.perf_counter",
                                            "torch.Tensor.log", "torch.cuda.Event.elapsed_time",
                                            "torch.nn.functional.kl_div"]


def test_importing_modules_is_not_tampering():
    spec = problems.get("kl_div")
    before = child.watched(spec)
    import torch.distributions  # noqa: F401
    import torch.utils.cpp_extension  # noqa: F401 - what a solution imports to build
    assert child.replaced(before, spec) == []


def test_the_childs_clocks_were_bound_before_any_solution(monkeypatch):
    synchronize = torch.cuda.synchronize
    monkeypatch.setattr(time, "perf_counter", lambda: 0.0)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    assert clocks.perf_counter() > 0 and clocks.synchronize is synchronize


def test_back_to_back_calls_synchronise_after_each_call(monkeypatch):
    """What the parent's clock brackets besides the timed call: each call, then a device-wide
    synchronisation (work left on any stream is waited for), no flush, nothing else."""
    happened = []
    monkeypatch.setattr(clocks, "synchronize", lambda: happened.append("synchronize"))
    clocks.back_to_back(lambda *inputs: happened.append(inputs), (1, 2), 3)
    assert happened == [(1, 2), "synchronize"] * 3
    happened.clear()
    clocks.back_to_back(lambda: happened.append(()), (), 0)
    assert happened == []


# --- compile tier: a real nvcc failure -------------------------------------------------------------

@pytest.mark.compile
def test_a_real_nvcc_error_is_captured_and_found(tmp_path):
    """nvcc run the way ninja runs under load_inline(verbose=True): its output on descriptor 1."""
    from losslab.build import find_cuda_home

    nvcc = shutil.which("nvcc") or str(find_cuda_home() / "bin" / "nvcc")
    source = tmp_path / "cuda.cu"
    source.write_text("// one kernel\n__global__ void k(float* x) { x[0] = 1.0f }\n")
    captured = failures.Captured()
    with failures.capture_stdout(captured):
        run = subprocess.run([nvcc, "-c", str(source), "-o", str(tmp_path / "cuda.o")],
                             stdout=1, stderr=subprocess.STDOUT, cwd=tmp_path)
    assert run.returncode != 0
    message, detail = failures.compiler_error(captured.text)
    assert message.startswith("cuda.cu(2): error: expected a \";\"") and "x[0] = 1.0f" in message, captured.text
    assert str(tmp_path) not in message


# --- gpu tier: timed calls ----------------------------------------------------------------------------

@pytest.mark.gpu
def test_timed_calls_get_fresh_inputs_and_their_outputs_are_checked():
    spec = problems.get("kl_div")
    make = lambda seed: spec.make_inputs((128, 4096), seed=seed)  # noqa: E731
    seen, answers = [], {}

    def stale(predictions, targets):  # honest on the first inputs it sees, then stale
        seen.append(predictions[0, :8].sum().item())  # rows sum to 1: look at a few elements instead
        return answers.setdefault("first", spec.reference(predictions, targets))

    buffer = torch.empty((), device="cuda")

    def one_buffer(predictions, targets):  # honest, every answer written into one buffer
        return buffer.copy_(spec.reference(predictions, targets))

    flush = torch.empty(2**20, device="cuda")
    with torch.no_grad():
        times = clocks.time_forward(stale, make, list(range(5)), flush, spec.reference)
        honest = clocks.time_forward(spec.reference, make, list(range(5)), flush, spec.reference)
        reused = clocks.time_forward(one_buffer, make, list(range(5)), flush, spec.reference)
    assert len(times["event_ms"]) == len(times["wall_ms"]) == 5
    assert times["mismatched"] == [1, 2, 3, 4]  # seed 0's answer is right only for seed 0
    assert honest["mismatched"] == [] and reused["mismatched"] == []
    assert len(set(seen)) == 5  # the warm-up's inputs and four more: fresh inputs for each timed call
    summary = clocks.summarize(honest, clocks.sync_overhead_ms(flush))
    assert 0 < summary["event_ms"] <= summary["ms"] and summary["p10_ms"] <= summary["p90_ms"]


def test_a_failure_of_the_evaluator_is_not_blamed_on_the_solution(tmp_path, monkeypatch):
    """The parent's own comparison broken: evaluator_error, with the stage, not a verdict on the solution."""
    from losslab.kernelbench import evaluate, verdict

    solution = tmp_path / "good.py"
    solution.write_text("import torch.nn as nn, torch.nn.functional as F\n\n"
                        "class ModelNew(nn.Module):\n"
                        "    def forward(self, p, t):\n"
                        "        return F.kl_div(p.log(), t, reduction='batchmean')\n")

    def broken(*args):
        raise ZeroDivisionError("the evaluator's own bug")

    monkeypatch.setattr(verdict, "relative_error", broken)
    result = evaluate.evaluate(solution, "kl_div", size=(3, 100), trials=2, device="cpu", timeout_s=120)
    assert result.status == "evaluator_error" and "in the evaluator at stage 'correctness'" in result.message
    assert "the evaluator's own bug" in result.detail


def test_the_supervisor_kills_a_process_started_in_a_session_of_its_own(tmp_path):
    """killpg of the child's group misses it (the README promised otherwise); the subreaper does not."""
    pid_file = tmp_path / "pid"
    script = ("import subprocess, sys\n"
              "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True)\n"
              f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n")
    run = supervisor.start([sys.executable, "-c", script], cwd=tmp_path, env=dict(os.environ),
                           stdout=tmp_path / "out", stderr=tmp_path / "err")
    deadline = time.monotonic() + 30
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    report = run.stop(patience_s=10)
    pid = int(pid_file.read_text())
    assert report["contained"] and report["survivors"] == [] and report["returncode"] == 0, report
    assert not os.path.exists(f"/proc/{pid}"), f"pid {pid} outlived the evaluation"


def test_the_supervisor_reports_survivors_it_cannot_kill(monkeypatch):
    monkeypatch.setattr(supervisor, "descendants", lambda pid: [os.getpid()])  # "ourselves": never dies
    monkeypatch.setattr(supervisor, "KILL_ROUNDS", 2)
    monkeypatch.setattr(supervisor.os, "kill", lambda pid, sig: None)
    assert supervisor.kill_tree() == [f"pid {os.getpid()}: " + " ".join(
        open(f"/proc/{os.getpid()}/cmdline").read().split("\0")).strip()[:120]]
