"""Run a child process under a time limit and kill its whole process group afterwards.

Shared by ``losslab.kernelbench.evaluate`` (judging a solution file) and ``losslab.teach.isolated``
(GPU checks from a notebook): a hang, a crash or a broken CUDA context stays in the child.
"""
from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import IO


def run_killable(argv: list[str], *, cwd: Path, env: dict[str, str], stdout: IO, stderr: IO,
                 timeout_s: float) -> int | None:
    """Run ``argv`` in a new session; returns its exit status, or None when it ran past ``timeout_s``
    seconds. Either way the child's whole group (ninja, nvcc, anything it started) is killed."""
    child = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
                             start_new_session=True)
    try:
        return child.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None
    finally:
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        child.wait()
