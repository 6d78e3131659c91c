"""Run a GPU check in a child process with a time limit, so that a kernel that hangs or
faults gives a verdict instead of a hung notebook or a dead CUDA context.

    outcome = isolated.run("losslab.teach.exercises:checks_in_child", {"key": "vectorize", "source": src})
    print(outcome.format())   # outcome.status: one of STATUSES

The child inherits the environment and the file system: this isolates faults, not untrusted
code. How the parent and the child talk, and each status: :func:`run`.
"""
from __future__ import annotations

import importlib
import json
import os
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from losslab.child_process import run_killable

STATUSES = ("ok", "raised", "cuda_error", "timed_out", "crashed")
# What the usual CUDA faults of a hand-written kernel mean (matched in the error's text).
CUDA_HINTS = {
    "misaligned address": "a vector load (float4: 16 bytes) from an address that is not a multiple of its size: "
                          "peel the row's head with scalar loads until the address is aligned, as the vectorized "
                          "rung does (a row can start anywhere when D is odd or the tensor has a storage offset)",
    "illegal memory access": "an index outside the tensor: check the loop bounds and the tail "
                             "(compute-sanitizer --tool memcheck names the line)",
    "device-side assert": "a kernel's assert failed (an index out of range, usually)",
    "unspecified launch failure": "the kernel crashed (an out-of-bounds access or a stack overflow, usually)",
}
_REPO = Path(__file__).resolve().parents[2]


@dataclass
class Outcome:
    """What the child did: ``status`` (one of STATUSES), ``value`` (the target's JSON result when
    ``ok``), ``message`` (one line), ``detail`` (a traceback or the stderr tail), ``hint`` (what a
    CUDA error usually means), ``seconds`` (wall clock, start to verdict)."""

    status: str
    value: object = None
    message: str = ""
    detail: str = ""
    hint: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def format(self) -> str:
        """One line for the status and message, then the hint and the detail's last lines."""
        lines = [f"{self.status.replace('_', ' ')}: {self.message}" if self.message else self.status]
        if self.hint:
            lines.append(f"  what it usually means: {self.hint}")
        if self.detail and not self.ok:
            lines += ["  " + line for line in self.detail.strip().splitlines()[-12:]]
        return "\n".join(lines)


def cuda_hint(text: str) -> str:
    """The hint for a CUDA error's text, or "" when it is not one we know."""
    return next((hint for key, hint in CUDA_HINTS.items() if key in text), "")


def _is_cuda_error(err: BaseException) -> bool:
    import torch

    # the launchers report a fault as a RuntimeError with the CUDA error's text ("... misaligned address")
    text = str(err)
    return isinstance(err, getattr(torch, "AcceleratorError", ())) or "CUDA error" in text or bool(cuda_hint(text))


def _env(pythonpath: tuple[str, ...]) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(_REPO), *pythonpath, *filter(None, [os.environ.get("PYTHONPATH")])])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def run(target: str, kwargs: dict | None = None, timeout_s: float = 120.0, *,
        pythonpath: tuple[str, ...] = ()) -> Outcome:
    """Call ``target`` ("package.module:function") with ``kwargs`` (JSON) in a child process.

    The parent writes ``{"target": "module:function", "kwargs": {...}}`` to a temporary folder
    and starts ``python -m losslab.teach.isolated CONFIG`` there, in its own session; the child
    (:func:`main`) imports the target, calls it with the keyword arguments and writes
    ``{"status": "ok", "value": ...}`` (the value must be JSON) or, if it raised, the status, the
    message and the traceback. After ``timeout_s`` the child's whole process group is killed (by
    its id): a kernel in an infinite loop ends as ``timed_out``. A child that dies without
    writing (a segfault, an abort) is ``crashed``, with the tail of its stderr. A CUDA error
    (misaligned or illegal address, a device-side assert) is ``cuda_error``, with a hint.

    Args:
        timeout_s: wall-clock limit in seconds (imports and builds included); then the child's
            process group is killed and the outcome is ``timed_out``.
        pythonpath: extra folders the child imports from (the repository is always there).
    Returns an :class:`Outcome`; never raises for what the target does.

    Raises:
        ValueError: ``target`` not of the form "module:function", ``timeout_s`` not positive,
            or ``kwargs`` not JSON.
    """
    if ":" not in target:
        raise ValueError(f"target: expected 'package.module:function', got {target!r}")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s: expected a positive number of seconds, got {timeout_s!r}")
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="losslab-isolated-") as tmp:
        work = Path(tmp)
        config, result_path = work / "config.json", work / "result.json"
        try:
            config.write_text(json.dumps({"target": target, "kwargs": kwargs or {}, "result": str(result_path)}))
        except TypeError as err:
            raise ValueError(f"kwargs: expected JSON values: {err}") from None
        with open(work / "stderr.txt", "wb") as err:
            returncode = run_killable([sys.executable, "-m", "losslab.teach.isolated", str(config)], cwd=work,
                                      env=_env(pythonpath), stdout=err, stderr=err, timeout_s=timeout_s)
            timed_out = returncode is None
        stderr = (work / "stderr.txt").read_bytes().decode(errors="replace")
        try:
            result = json.loads(result_path.read_text())
        except (OSError, ValueError):
            result = None
    seconds = time.monotonic() - start
    if timed_out:
        return Outcome("timed_out", message=f"no result after {timeout_s:g} s: killed (an endless loop in a kernel, "
                       "or a launch that never returns)", detail=stderr[-4000:], seconds=seconds)
    if result is None:
        how = f"killed by signal {-returncode}" if returncode < 0 else f"exit code {returncode}"
        last = next((line for line in reversed(stderr.strip().splitlines()) if line.strip()), "")
        return Outcome("crashed", message=f"the process died ({how})" + (f": {last[:300]}" if last else ""),
                       detail=stderr[-4000:], hint=cuda_hint(stderr), seconds=seconds)
    return Outcome(result["status"], result.get("value"), result.get("message", ""), result.get("detail", ""),
                   result.get("hint", ""), seconds)


def main(argv: list[str]) -> int:
    """The child: run the configured target and write its result (see :func:`run`)."""
    config = json.loads(Path(argv[0]).read_text())
    result_path = Path(config["result"])
    try:
        module, function = config["target"].split(":")
        value = getattr(importlib.import_module(module), function)(**config["kwargs"])
        result = {"status": "ok", "value": value}
    except Exception as err:  # noqa: BLE001 - whatever the target raised is the verdict
        text = f"{type(err).__name__}: {err}".strip()
        cuda = _is_cuda_error(err)
        result = {"status": "cuda_error" if cuda else "raised", "message": text.splitlines()[0][:500],
                  "detail": traceback.format_exc()[-6000:], "hint": cuda_hint(text) if cuda else ""}
    try:
        text = json.dumps(result)
    except (TypeError, ValueError) as err:
        text = json.dumps({"status": "raised", "message": f"the result of {config['target']} is not JSON: {err}"})
    result_path.write_text(text)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # a broken CUDA context can hang at interpreter exit: the verdict is written, leave now


if __name__ == "__main__":
    main(sys.argv[1:])
